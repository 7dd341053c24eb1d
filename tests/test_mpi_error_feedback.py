"""Error feedback over MPI: `mpiexec -n 2` gives the simulator's bits (parameters, losses, and the
checkpointed residuals of every worker, gathered to rank 0), and a killed job resumes with them.
Three MPI launches in all; the helpers are tests/test_mpi.py's."""

from __future__ import annotations

import textwrap

import numpy as np

from mpi_cases import (cases_over_mpi_equal_the_simulator, load_params, mpiexec, needs_mpi, params_bits, simulate,
                       train_losses, write_toml)
from tgsim.train import checkpoint

BASE = {
    "run": {"name": "ef", "seed": 5, "steps": 40, "eval_every": 0, "log_every": 10, "checkpoint_every": 20},
    "data": {"name": "digits"},
    "model": {"name": "mlp", "options": {"hidden": [16]}},
    "workers": {"n": 2, "batch": 32},
    "codec": {"name": "terngrad", "error_feedback": True, "min_size": 20},   # the biases travel as float32
    "exchange": {"mode": "allreduce"},
    "optimizer": {"name": "momentum"},
    "schedule": {"name": "constant", "lr": 0.05},
}
CASES = {
    "terngrad-allreduce": {},                                   # integer all-reduce under the shared max scaler
    "terngrad-ps": {"exchange": {"mode": "ps"}},                # would encode deferred (pipelined) without EF
    "terngrad-allgather-mean": {"codec": {"sharing": "mean"}, "exchange": {"mode": "allgather"}},
    "scaled_sign-allgather": {"codec": {"name": "scaled_sign"}, "exchange": {"mode": "allgather"}},
    "topk-ps": {"codec": {"name": "topk", "density": 0.1}, "exchange": {"mode": "ps"}},
}


def case(**sections) -> dict:
    d = {k: dict(v) for k, v in BASE.items()}
    for sec, values in sections.items():
        d[sec] = {**d[sec], **values}
    if d["codec"]["name"] != "terngrad":
        del d["codec"]["min_size"]          # a TernGrad option: other codecs refuse it
    return d


def residual_bits(out, step: int) -> dict:
    state = checkpoint.read(out / "checkpoints" / f"ckpt-{step:08d}.tgck")
    return {k: np.ascontiguousarray(v).tobytes() for k, v in checkpoint.flatten(state["codec_state"]).items()}


@needs_mpi
def test_error_feedback_over_mpi_equals_the_simulator(tmp_path):
    """One mpiexec -n 2 job, 40 steps of each case: every rank ends with the simulator's parameters,
    the same training losses, and rank 0's checkpoints at steps 20 and 40 hold both workers' residuals
    with the simulator's bits."""
    cases = {name: case(**extra) for name, extra in CASES.items()}
    for name, mpi_out, sim_out in cases_over_mpi_equal_the_simulator(tmp_path, cases, 2, timeout=120):
        for step in (20, 40):
            assert residual_bits(mpi_out, step) == residual_bits(sim_out, step), (name, step)
        rows = checkpoint.read(mpi_out / "checkpoints" / "ckpt-00000040.tgck")["codec_state"]["residual"]["fc1.w"]
        assert rows.shape[0] == 2 and not np.array_equal(rows[0], rows[1]), "each worker's own residual"


@needs_mpi
def test_killed_rank_resumes_with_the_residuals_and_the_uninterrupted_bits(tmp_path):
    """mpiexec -n 2 (`python -m tgsim.mpi_runs.train`), rank 1 SIGKILLed at step 27: the job ends, its last
    checkpoint is step 20; `--resume` continues from it, each rank taking its own rows of the
    residuals, and ends with the uninterrupted simulator run's parameters and losses."""
    d = case(exchange={"mode": "ps"}, run={"checkpoint_every": 10})
    cfg = write_toml(d, tmp_path / "c.toml")
    wrapper = tmp_path / "kill_wrapper.py"
    wrapper.write_text(textwrap.dedent("""
        import os, signal, sys
        from mpi4py import MPI
        import tgsim.train.loop as loop

        rank = MPI.COMM_WORLD.Get_rank()
        original = loop.train_step

        def train_step(setup, params, opt_state, step, *args, **kwargs):
            if rank == 1 and step == 27:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(setup, params, opt_state, step, *args, **kwargs)

        loop.train_step = train_step
        from tgsim.mpi_runs.train import main
        sys.exit(main())
        """))
    out = tmp_path / "run"
    res, took = mpiexec([(2, [str(wrapper), str(cfg), "--out", str(out), "--quiet"])], timeout=90,
                        TGSIM_MPI_ERROR_GRACE=2)
    assert res.returncode != 0, res.stdout + res.stderr
    assert [p.name for p in checkpoint.list_checkpoints(out / "checkpoints")][-1] == "ckpt-00000020.tgck"
    assert not (out / "params.npz").exists()

    again, _ = mpiexec([(2, ["-m", "tgsim.mpi_runs.train", "--resume", "--out", str(out), "--quiet"])], timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr
    sim = simulate(d, tmp_path / "sim")
    assert params_bits(load_params(out / "params.npz")) == params_bits(sim.params)
    assert train_losses(out) == train_losses(tmp_path / "sim"), "metrics must hold each step once, same losses"
    assert residual_bits(out, 40) == residual_bits(tmp_path / "sim", 40)
