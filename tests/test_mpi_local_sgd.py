"""Local SGD and PQASGD over MPI: `mpiexec -n 2` gives the simulator's bits, and a killed rank's run
resumes with them (three mpiexec launches in all; helpers from tests/test_mpi.py)."""

from __future__ import annotations

import json
import textwrap

import pytest

from mpi_cases import (_DRIVER, load_params, mpiexec, needs_mpi, params_bits, params_digest, simulate, train_losses,
                       write_toml)

STEPS = 30


def case(model: str, codec: str, mode: str, local: str, every: int, **run) -> dict:
    models = {"ls": {"data": {"name": "least_squares"}, "model": {"name": "least_squares"}},
              "mlp": {"data": {"name": "digits"}, "model": {"name": "mlp", "options": {"hidden": [32]}},
                      "codec": {"min_size": 40}}}
    d = {"run": {"name": f"{model}-{local}", "seed": 3, "steps": STEPS, "eval_every": 10, "log_every": 5,
                 "checkpoint_every": 0, **run},
         "workers": {"n": 2, "batch": 16},
         "codec": {"name": codec, **({"clip": "explicit"} if codec == "terngrad" else {})},
         "exchange": {"mode": mode, "local": local, "every": every},
         "optimizer": {"name": "momentum"},
         "schedule": {"name": "constant", "lr": 0.05}}
    for sec, values in models[model].items():
        if sec == "codec" and codec != "terngrad":
            continue                                  # min_size: terngrad's option (float32 small layers)
        d[sec] = {**d.get(sec, {}), **values}
    return d


CASES = {
    "ls-average": case("ls", "fp32", "allreduce", "average", 4),
    "ls-pqasgd-ps": case("ls", "terngrad", "ps", "pqasgd", 4),
    "mlp-pqasgd-allreduce": case("mlp", "terngrad", "allreduce", "pqasgd", 3),
    "mlp-pqasgd-allgather": case("mlp", "terngrad", "allgather", "pqasgd", 4),    # last period: 2 steps
    "mlp-average": case("mlp", "fp32", "allreduce", "average", 4),
}


@needs_mpi
def test_local_modes_over_mpi_equal_the_simulator_bit_for_bit(tmp_path):
    """One mpiexec -n 2 job runs every case; each ends with the simulator's parameters on both ranks
    and the simulator's training losses (rank 0 writes the metrics), and sends payload only at syncs."""
    (tmp_path / "cases.json").write_text(json.dumps(CASES))
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    res, _ = mpiexec([(2, [str(driver), str(tmp_path / "cases.json"), str(tmp_path / "mpi")])], timeout=150)
    assert res.returncode == 0, res.stdout + res.stderr
    digests = json.loads((tmp_path / "mpi" / "digests.json").read_text())
    import pandas as pd

    for name, d in CASES.items():
        sim = simulate(d, tmp_path / "sim" / name)
        out = tmp_path / "mpi" / name
        assert params_bits(load_params(out / "params.npz")) == params_bits(sim.params), f"{name}: parameters differ"
        assert set(digests[name]) == {params_digest(sim.params)}, f"{name}: replicas differ across ranks"
        assert train_losses(out) == train_losses(tmp_path / "sim" / name), f"{name}: losses differ"
        syncs = [s for s in range(1, STEPS + 1) if s % d["exchange"]["every"] == 0 or s == STEPS]
        for where in (out, tmp_path / "sim" / name):       # payload bytes at the sync steps only
            m = pd.read_csv(where / "metrics.csv")
            m = m[(m.split == "train") & (m.layer == "model")]
            assert list(m.step[m.bits_up > 0]) == syncs, f"{name}: {where.parent.name} sends between syncs"


@needs_mpi
def test_killed_rank_mid_period_resumes_with_the_simulator_bits(tmp_path):
    d = case("mlp", "terngrad", "ps", "pqasgd", 4, checkpoint_every=8)
    cfg = write_toml(d, tmp_path / "c.toml")
    wrapper = tmp_path / "kill_wrapper.py"
    wrapper.write_text(textwrap.dedent("""
        import os, signal, sys
        from mpi4py import MPI
        from tgsim.train import local_sgd

        rank = MPI.COMM_WORLD.Get_rank()
        original = local_sgd.LocalSteps.__call__

        def call(self, setup, params, opt_state, step, *args, **kwargs):
            if rank == 1 and step == 21:           # inside the period 20..23, after the checkpoint at 16
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, setup, params, opt_state, step, *args, **kwargs)

        local_sgd.LocalSteps.__call__ = call
        from tgsim.mpi_runs.train import main
        sys.exit(main())
        """))
    out = tmp_path / "run"
    res, _ = mpiexec([(2, [str(wrapper), str(cfg), "--out", str(out), "--quiet"])], timeout=90)
    assert res.returncode != 0, res.stdout + res.stderr
    from tgsim.train import checkpoint

    assert [p.name for p in checkpoint.list_checkpoints(out / "checkpoints")][-1] == "ckpt-00000016.tgck"
    assert not (out / "params.npz").exists()
    again, _ = mpiexec([(2, ["-m", "tgsim.mpi_runs.train", "--resume", "--out", str(out), "--quiet"])], timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr
    sim = simulate(d, tmp_path / "sim")
    assert params_bits(load_params(out / "params.npz")) == params_bits(sim.params)
    assert train_losses(out) == train_losses(tmp_path / "sim"), "metrics must hold each step once, same losses"


if __name__ == "__main__":      # pragma: no cover
    pytest.main([__file__, "-q"])
