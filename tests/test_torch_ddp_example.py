"""examples/ddp_train.py, as a user runs it: DDP with tgsim's comm hook at 2 ranks under torchrun
(the hook's exchange over Gloo) and under mpiexec (over mpi4py), and the simulator's `tgsim run` of
the config the script wrote (examples/ on PYTHONPATH for its model factory, ddp_nets:digits_net) ends
with the same parameters, array by array (np.array_equal). The jobs run in the environment a user
has: every *THREADS* variable removed (the script sets only torch's thread count, as the README
says). `make test`: TernGrad under both launchers; QSGD and PowerSGD are heavy. Skipped, with the
reason, without torch (mpiexec's without MPI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (pip install tgsim[torch])")

from fakes import events  # noqa: E402
from mpi_cases import MPI_INSTALL, load_params, needs_mpi  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "ddp_train.py"
BIN = Path(sys.executable).parent
STEPS = 4                    # TernGrad's thread-count bug shows from step 2 on
TIMEOUT = 300


def user_env() -> dict:
    """This environment without any thread-count variable (OMP_NUM_THREADS, NUMBA_NUM_THREADS, ...),
    the checkout first on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if "THREADS" not in k.upper()}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def launch(launcher: str, codec: str, out: Path, *extra: str) -> str:
    """The script at 2 ranks under `launcher` (`extra`: more of its options); its output (the test fails
    with it on a non-zero exit)."""
    args = [str(SCRIPT), "--codec", codec, "--steps", str(STEPS), "--out", str(out), *extra]
    env = user_env()
    if launcher == "torchrun":
        cmd = [str(BIN / "torchrun"), "--nproc-per-node", "2", *args]
    else:
        cmd = [MPI_INSTALL.mpiexec, *MPI_INSTALL.flags(), "-n", "2", sys.executable, *args]
        env.update(MPI_INSTALL.env())
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{text[-4000:]}"
    return text


_SIM: dict = {}


def simulate(config: Path, out: Path) -> dict:
    """`tgsim run CONFIG` (its parameters), once per config text."""
    key = config.read_text()
    if key not in _SIM:
        env = user_env()
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "examples"), env["PYTHONPATH"]])
        proc = subprocess.run([str(BIN / "tgsim"), "run", str(config), "--out", str(out), "--quiet"], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        _SIM[key] = load_params(out / "params.npz")
    return _SIM[key]


CASES = [("torchrun", "terngrad"), ("mpiexec", "terngrad")]
HEAVY = [(launcher, codec) for codec in ("qsgd", "powersgd") for launcher in ("torchrun", "mpiexec")]


def _param(launcher: str, codec: str, heavy: bool):
    marks = ([needs_mpi] if launcher == "mpiexec" else []) + ([pytest.mark.heavy] if heavy else [])
    return pytest.param(launcher, codec, marks=marks, id=f"{launcher}-{codec}")


@pytest.mark.parametrize("launcher,codec", [_param(*c, False) for c in CASES] + [_param(*c, True) for c in HEAVY])
def test_the_example_ends_with_the_simulators_bits(tmp_path, launcher, codec):
    """After 4 steps at 2 ranks: both ranks report the same parameters, and rank 0's params.npz equals
    the simulator's (`tgsim run` of the config.toml the script wrote) on every parameter. Under torchrun,
    `--tensorboard DIR`: rank 0's events hold steps 1..4 once each, the loss and each step's bits up
    and down (the same each step: TernGrad's messages have fixed sizes)."""
    tb = ("--tensorboard", str(tmp_path / "tb")) if launcher == "torchrun" else ()
    text = launch(launcher, codec, tmp_path / "ddp", *tb)
    transport = "torch" if launcher == "torchrun" else "mpi"
    assert f"2 ranks over {transport}, {codec}, {STEPS} steps" in text and "on every rank" in text, text[-3000:]
    assert "intra-op threads" not in text, text[-3000:]       # the script's one thread: no hook warning
    got = load_params(tmp_path / "ddp" / "params.npz")
    want = simulate(tmp_path / "ddp" / "config.toml", tmp_path / "sim")
    assert sorted(got) == sorted(want) == ["conv1.bias", "conv1.weight", "conv2.bias", "conv2.weight", "head.bias",
                                           "head.weight", "norm.bias", "norm.weight"]
    differ = [k for k in want if not np.array_equal(got[k], want[k])]
    assert not differ, f"{launcher} {codec}: parameters that differ from the simulator's: {differ}"
    if tb:
        ev = events(tmp_path / "tb")
        for tag in ("train/bits_up", "train/bits_down", "train/loss", "train/lr"):
            assert [s for s, _ in ev[tag]] == list(range(1, STEPS + 1)), (tag, ev[tag])
        assert len({v for _, v in ev["train/bits_up"]}) == 1 and ev["train/bits_up"][0][1] > 0, ev["train/bits_up"]
        assert all(np.isfinite(v) for _, v in ev["train/loss"])
