"""A zoo of user-style torch models (tests/torch_zoo.py): one rule for what a model may hold, the same in
the simulator, over MPI and in the DDP hook (tgsim/torch/model.py, "What a module may hold").

Supported (a 2-conv + LayerNorm net, frozen parameters, an unused layer, tied weights, constant
buffers, BatchNorm without running statistics, an embedding + causal attention model on int64 token
ids), each with another codec, three with weight decay (momentum, Nesterov, Adam: a decay applied twice,
once in TgsimOptimizer, fails them): after every step, on every rank, the parameters of DDP with tgsim's
hook equal the simulator's (`tgsim run`'s checkpoints), over mpi4py (mpiexec) and over Gloo launched
by torchrun; `mpiexec ... tgsim.mpi_runs.train` ends with the simulator's parameters; frozen
parameters are neither trained nor sent. Refused (BatchNorm with running statistics, nn.Dropout,
F.dropout, torch.randn_like, a buffer changed in forward): the simulator, the MPI trainer's code
path and the hook each refuse before any update with one line naming the module or what it did.
The jobs run with no thread variable in their environment, torch set to one thread as the README
says; the hook must leave torch at that one thread. 2 ranks in `make test`, 4 in `make test-slow`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install tgsim[torch])")

from mpi_cases import load_params, mpiexec, needs_mpi, params_bits, simulate  # noqa: E402
from mpi_launch import THREAD_VARS  # noqa: E402
from torch_ddp_cases import digest  # noqa: E402
from torch_zoo import REFUSED, SUPPORTED, ZOO, case_config  # noqa: E402

from tgsim.train import checkpoint  # noqa: E402
from tgsim.train.config import from_dict  # noqa: E402

DRIVER = Path(__file__).resolve().parent / "torch_zoo_driver.py"


def _user_env() -> dict:
    """This environment without the thread variables a user would not set."""
    return {k: v for k, v in os.environ.items() if k not in THREAD_VARS}


def _simulate_all(tmp: Path, workers: int) -> dict:
    """{case: (per-step digests, final params)} of the simulator, for every supported case."""
    sim = {}
    for name in SUPPORTED:
        d = case_config(name, workers)
        run = simulate(d, tmp / "sim" / name)
        steps = [digest(checkpoint.read(p)["params"]) for p in checkpoint.list_checkpoints(tmp / "sim" / name / "checkpoints")]
        assert len(steps) == d["run"]["steps"] and steps[-1] == digest(run.params)
        sim[name] = (steps, run.params)
    return sim


def _ranks(out: Path, transport: str, ranks: int) -> list[dict]:
    found = [json.loads((out / f"{transport}-rank-{r}.json").read_text()) for r in range(ranks)]
    assert [r["rank"] for r in found] == list(range(ranks))
    return found


def _jobs(tmp: Path, ranks: int, torchrun: bool) -> SimpleNamespace:
    out = tmp / "out"
    out.mkdir()
    job, _ = mpiexec([(ranks, [str(DRIVER), str(out)])], timeout=600)
    assert job.returncode == 0, job.report()
    res = SimpleNamespace(mpi=_ranks(out, "mpi", ranks), out=out, sim=_simulate_all(tmp, ranks), torch=None)
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun and exe is not None:
        tr = tmp / "torchrun"
        tr.mkdir()
        p = subprocess.run([exe, "--standalone", "--nproc-per-node", str(ranks), str(DRIVER), str(tr),
                            "--transport", "torch"], capture_output=True, text=True, timeout=600,
                           env={**_user_env(), "GLOO_SOCKET_IFNAME": "lo"})
        assert p.returncode == 0, p.stderr[-3000:]
        res.torch = _ranks(tr, "torch", ranks)
    return res


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return _jobs(tmp_path_factory.mktemp("zoo"), 2, torchrun=True)


def _check_hook(ranks: list[dict], sim: dict, name: str) -> None:
    steps = sim[name][0]
    for r in ranks:
        case = r["hook"][name]
        assert case["error"] is None, (r["rank"], case["error"])
        assert case["threads"] == 1, f"rank {r['rank']}: torch left at {case['threads']} threads"
        assert case["digests"] == steps, f"rank {r['rank']}, {r['transport']}: first step that differs: " + \
            str(next((i for i, (a, b) in enumerate(zip(case["digests"], steps)) if a != b), None))
    assert steps[0] != steps[-1]                       # the parameters move


@needs_mpi
@pytest.mark.parametrize("name", SUPPORTED)
def test_supported_models_end_with_the_simulators_bits_everywhere(zoo, name):
    """The hook over mpi4py and over torchrun's Gloo group: the simulator's parameters after every
    step on both ranks; the MPI trainer: the simulator's final parameters."""
    _check_hook(zoo.mpi, zoo.sim, name)
    if zoo.torch is None:
        pytest.skip("torchrun is not installed beside this interpreter")
    _check_hook(zoo.torch, zoo.sim, name)
    assert params_bits(load_params(zoo.out / f"{name}-mpi" / "params.npz")) == params_bits(zoo.sim[name][1])


@needs_mpi
@pytest.mark.parametrize("name", REFUSED)
def test_refused_models_are_refused_by_the_hook_before_any_update(zoo, name):
    """Every rank's hook raises the refusal (one line) and leaves the module's parameters as built."""
    why = ZOO[name][1]
    for r in zoo.mpi + (zoo.torch or []):
        case = r["hook"][name]
        assert case["error"] is not None and why in case["error"], (r["rank"], case["error"])
        assert "\n" not in case["error"] and case["unchanged"] and case["digests"] == []


@pytest.mark.parametrize("name", REFUSED)
def test_refused_models_are_refused_by_the_simulator(tmp_path, name, capsys):
    """`tgsim run` (whose `run` each MPI rank's trainer runs too) refuses before anything is
    written: exit 2, one line naming what to change, no results directory."""
    from mpi_cases import write_toml

    from tgsim.cli import main

    cfg = write_toml(case_config(name), tmp_path / "c.toml")
    assert main(["run", str(cfg), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert ZOO[name][1] in err and "\n" not in err, err
    assert not (tmp_path / "r").exists()


def test_frozen_parameters_are_neither_trained_nor_sent(tmp_path):
    """The frozen projection and bias are not layers (not sent, not counted in bits) and stay at the
    values the factory builds under the run's seed; the bits per step are the trained layers' alone."""
    d = case_config("frozen")
    cfg = from_dict(d)
    from tgsim.train.loop import build

    model = build(cfg).model
    assert sorted(model.layer_shapes()) == ["head.weight"]
    module = model.build(cfg.run.seed)
    assert not module.proj.weight.requires_grad
    run = simulate(d, tmp_path / "r")
    assert sorted(run.params) == ["head.weight"]
    skeleton, _ = model._skeleton
    assert torch.equal(skeleton.proj.weight, module.proj.weight)      # the run seed's constants
    d2 = case_config("conv_ln")
    assert run.bits_up < simulate(d2, tmp_path / "c").bits_up


def test_token_ids_reach_the_module_as_integers():
    """A torch data factory's int64 token ids stay int64 in the data set and in the module's input."""
    from tgsim.train.loop import build

    setup = build(from_dict(case_config("tiny_gpt")))
    assert setup.dataset.x_train.dtype == np.int64
    seen = []
    module, _ = setup.model._skeleton
    handle = module.register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
    try:
        params = setup.model.init(3)
        x = setup.dataset.x_train[:8][None]
        setup.model.loss_and_grad(params, x, setup.dataset.y_train[:8][None])
    finally:
        handle.remove()
    assert seen == [torch.int64]


@needs_mpi
@pytest.mark.heavy
def test_four_ranks_end_with_the_simulators_bits(tmp_path):
    """The zoo at 4 ranks (4 workers of 16 samples): the hook over mpi4py and the MPI trainer."""
    res = _jobs(tmp_path, 4, torchrun=False)
    for name in SUPPORTED:
        _check_hook(res.mpi, res.sim, name)
        assert params_bits(load_params(res.out / f"{name}-mpi" / "params.npz")) == params_bits(res.sim[name][1])
