"""tgsim.torch: a torch.nn.Module as a tgsim model. The model protocol's checks (bitwise per worker for
N = 1 and 3, torch at one thread inside every call, gradients against central differences in float64,
seeded init that leaves torch's global generator alone), training through tgsim's trainer (two runs
with the same bits, kill-and-resume with the bits of the uninterrupted run, the manifest's torch
lines), one mpiexec job whose runs end with the simulator's bits, and the bad inputs (a factory that
does not resolve, parameters of a wrong shape, NaN gradients, a stateful module, torch missing).
Skipped, with the reason, where torch is not installed."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install tgsim[torch])")

from fakes import central_difference_error, kill_train_step_at  # noqa: E402
from mpi_cases import cases_over_mpi_equal_the_simulator, needs_mpi  # noqa: E402

from tgsim.errors import ConfigError, NonFiniteGradientError  # noqa: E402
from tgsim.models import make_model  # noqa: E402
from tgsim.torch import TorchModel  # noqa: E402
from tgsim.train import checkpoint  # noqa: E402
from tgsim.train.config import from_dict  # noqa: E402
from tgsim.train.loop import run  # noqa: E402

RESNET = "tgsim.torch.examples:resnet"
MLP = "tgsim.torch.examples:mlp"
HERE = __name__            # the factories below, by the name this module is imported under


# -- factories of the tests ------------------------------------------------------------------------------

THREADS_SEEN: list[int] = []


class _Recording(torch.nn.Module):
    """Linear(dim -> classes) that records torch's intra-op thread count at each forward pass."""

    def __init__(self, dim, classes):
        super().__init__()
        self.fc = torch.nn.Linear(dim, classes)

    def forward(self, x):
        THREADS_SEEN.append(torch.get_num_threads())
        return self.fc(x)


def recording_net(dim, classes):
    return _Recording(dim, classes)


class _NaN(torch.nn.Module):
    """A Linear layer whose output is multiplied by NaN: every gradient is NaN."""

    def __init__(self, dim, classes):
        super().__init__()
        self.fc = torch.nn.Linear(dim, classes)

    def forward(self, x):
        return self.fc(x) * float("nan")


def nan_net(dim, classes):
    return _NaN(dim, classes)


def batchnorm_net(dim, classes):
    return torch.nn.Sequential(torch.nn.Linear(dim, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, classes))


def not_a_module(dim, classes):
    return [dim, classes]


# -- the model protocol ------------------------------------------------------------------------------------

def _data(model, n, b, seed):
    rng = np.random.default_rng([seed, 33])
    x = rng.standard_normal((n, b, *model.feature_shape))
    if model.task == "regression":
        return x, rng.standard_normal((n, b))
    return x, rng.integers(0, model.classes, (n, b)).astype(np.int64)


PROTOCOL = {
    "resnet": dict(factory=RESNET, dim=64, classes=10, kwargs={"width": 4, "blocks": 1}),
    "mlp": dict(factory=MLP, dim=40, classes=10, kwargs={"hidden": [32]}),
}


@pytest.mark.parametrize("key", list(PROTOCOL))
def test_each_worker_gets_the_bits_of_a_call_with_it_alone(key):
    """N = 3 workers at once: worker i's loss and gradients equal those of a call with x[i:i+1] (N = 1)
    bit for bit; loss (N,) float64, grads (N, *shape) float32, the layers sorted by name; the workers'
    gradients differ (each comes from its own batch)."""
    model = make_model("torch", **PROTOCOL[key])
    params = model.init(7)
    x, y = _data(model, 3, 8, seed=1)
    x = x.astype(np.float32)
    loss, grads = model.loss_and_grad(params, x, y)
    assert loss.shape == (3,) and loss.dtype == np.float64
    assert list(grads) == sorted(grads) == list(model.layer_shapes())
    for k, s in model.layer_shapes().items():
        assert grads[k].shape == (3, *s) and grads[k].dtype == np.float32
    for i in range(3):
        li, gi = model.loss_and_grad(params, x[i:i + 1], y[i:i + 1])
        assert li[0].tobytes() == loss[i].tobytes(), (key, i)
        assert all(gi[k][0].tobytes() == grads[k][i].tobytes() for k in grads), (key, i)
    assert not np.array_equal(grads[next(iter(grads))][0], grads[next(iter(grads))][1])


def test_init_is_seeded_and_leaves_torch_state_alone():
    """init(seed): float32 arrays of the module's parameters, the same for the same seed, others for
    another seed; torch's global generator and thread count are as they were."""
    model = TorchModel(factory=RESNET, dim=64, classes=10, kwargs={"width": 4, "blocks": 1})
    state, threads = torch.get_rng_state(), torch.get_num_threads()
    a, b, c = model.init(3), model.init(3), model.init(4)
    assert torch.equal(torch.get_rng_state(), state)
    x, y = _data(model, 2, 4, seed=0)
    model.loss_and_grad(a, x.astype(np.float32), y)
    assert torch.get_num_threads() == threads
    assert {k: v.shape for k, v in a.items()} == model.layer_shapes()
    assert all(v.dtype == np.float32 for v in a.values())
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["head.weight"], c["head.weight"])
    assert model.num_params == sum(v.size for v in a.values())


def test_every_call_runs_torch_at_one_thread():
    """The forward passes of loss_and_grad and evaluate see one intra-op thread, whatever the caller set."""
    model = TorchModel(factory=f"{HERE}:recording_net", dim=6, classes=3)
    params = model.init(0)
    x, y = _data(model, 2, 5, seed=2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        THREADS_SEEN.clear()
        model.loss_and_grad(params, x.astype(np.float32), y)
        model.evaluate(params, x[0].astype(np.float32), y[0])
        assert THREADS_SEEN == [1, 1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


GRAD_CASES = {
    "resnet": dict(factory=RESNET, dim=16, classes=3, kwargs={"width": 2, "blocks": 1}),
    "mlp": dict(factory=MLP, dim=5, classes=3, kwargs={"hidden": [6]}),
    "mlp_regression": dict(factory=MLP, dim=4, classes=0, task="regression", kwargs={"hidden": [5]}),
}


@pytest.mark.parametrize("key", list(GRAD_CASES))
def test_gradient_matches_central_differences_float64(key):
    """In float64, up to 8 coordinates per layer and worker: relative error of the gradient against
    (L(p + eps) - L(p - eps)) / (2 eps), eps = 1e-6, below 1e-5."""
    model = make_model("torch", **GRAD_CASES[key])
    rng = np.random.default_rng(11)
    params = {k: v.astype(np.float64) + 0.1 * rng.standard_normal(v.shape) for k, v in model.init(1).items()}
    x, y = _data(model, 2, 5, seed=3)
    loss, grads = model.loss_and_grad(params, x, y)
    assert loss.dtype == np.float64 and all(g.dtype == np.float64 for g in grads.values())
    for w in range(2):
        for name in params:
            rel = central_difference_error(model, params, x, y, grads, w, name, 8, rng)
            assert rel < 1e-5, f"{key} worker {w} {name}: relative error {rel:.2e}"


# -- through tgsim's trainer -------------------------------------------------------------------------------

def _config(**sections) -> dict:
    d = {"run": {"name": "torch", "seed": 5, "steps": 8, "eval_every": 4, "log_every": 2, "checkpoint_every": 3},
         "data": {"name": "digits"},
         "model": {"name": "torch", "options": {"factory": RESNET, "kwargs": {"width": 4, "blocks": 1}}},
         "workers": {"n": 2, "batch": 16},
         "codec": {"name": "terngrad"},
         "exchange": {"mode": "ps"},
         "optimizer": {"name": "momentum"},
         "schedule": {"name": "constant", "lr": 0.05}}
    for sec, values in sections.items():
        d[sec] = {**d[sec], **values}
    return d


def _bits(params) -> dict:
    return {k: np.ascontiguousarray(v).tobytes() for k, v in params.items()}


def test_training_repeats_bit_for_bit_and_resumes_with_the_same_bits(tmp_path, monkeypatch):
    """Two 8-step TernGrad runs of 2 workers (the ResNet example on digits) end with the same bits,
    and away from the initial parameters; a run killed at step 7 (checkpoints at 3 and 6) resumes from
    step 6 and ends with the uninterrupted run's bits. The run directory is tgsim's: config.toml with
    the torch model, the manifest's torch lines, per-layer rows in metrics.csv under torch's names."""
    cfg = from_dict(_config())
    full = run(cfg, out=tmp_path / "full", quiet=True)
    again = run(from_dict(_config()), out=tmp_path / "again", quiet=True)
    assert _bits(full.params) == _bits(again.params)
    init = make_model("torch", factory=RESNET, dim=64, classes=10, kwargs={"width": 4, "blocks": 1}).init(5)
    assert all(not np.array_equal(full.params[k], init[k]) for k in init)

    kill_train_step_at(monkeypatch, 7)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, out=tmp_path / "killed", quiet=True)
    monkeypatch.undo()
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path / "killed" / "checkpoints")] == \
        ["ckpt-00000003.tgck", "ckpt-00000006.tgck"]
    resumed = run(cfg, out=tmp_path / "killed", resume=True, quiet=True)
    assert resumed.start_step == 6 and _bits(resumed.params) == _bits(full.params)

    manifest = json.loads((tmp_path / "full" / "manifest.json").read_text())
    assert manifest["torch"]["version"] == torch.__version__ and manifest["torch"]["threads"] == 1
    assert 'factory = "tgsim.torch.examples:resnet"' in (tmp_path / "full" / "config.toml").read_text()
    import pandas as pd

    m = pd.read_csv(tmp_path / "full" / "metrics.csv")
    assert set(m[m.layer != "model"].layer) == set(init)


@needs_mpi
def test_mpi_ranks_end_with_the_simulators_bits(tmp_path):
    """One mpiexec job of 2 ranks (one worker each) through tgsim's MPI exchange: TernGrad's integer
    all-reduce of shared-scaler codes and its own scalers over the all-gather, QSGD over the parameter
    server, top-k with error feedback over the parameter server (its residuals per rank) and PowerSGD
    (rank 2, two all-reduce rounds); each ends with the simulator's parameters on every rank, bit for
    bit, and the same training losses."""
    cases_over_mpi_equal_the_simulator(tmp_path, _mpi_cases(2), ranks=2, timeout=300)


@pytest.mark.heavy
def test_four_mpi_ranks_end_with_the_simulators_bits(tmp_path):
    """The cases of the test above at 4 ranks (4 workers)."""
    cases_over_mpi_equal_the_simulator(tmp_path, _mpi_cases(4), ranks=4, timeout=300)


def _mpi_cases(n: int) -> dict:
    base = {"run": {"checkpoint_every": 0, "eval_every": 0, "steps": 6}, "workers": {"n": n, "batch": 16}}
    return {
        "terngrad-allreduce": _config(**base, exchange={"mode": "allreduce"}),
        "terngrad-own-allgather": _config(**base, codec={"name": "terngrad", "sharing": "none"},
                                          exchange={"mode": "allgather"}),
        "qsgd-ps": {**_config(**base), "codec": {"name": "qsgd"}},
        "topk-ef-ps": {**_config(**base), "codec": {"name": "topk", "error_feedback": True}},
        "powersgd-allreduce": {**_config(**base, exchange={"mode": "allreduce"}), "codec": {"name": "powersgd", "rank": 2}},
    }


# -- bad inputs --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("factory,match", [
    ("tgsim.torch.examples.resnet", "must look like 'package.module:function'"),
    ("no_such_package.nets:resnet", "cannot import module 'no_such_package.nets'"),
    ("tgsim.torch.examples:resnet50", "'tgsim.torch.examples' has no attribute 'resnet50'"),
    ("tgsim.torch.model:THREADS", "is not callable"),
])
def test_a_factory_that_does_not_resolve_is_a_clear_error(factory, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        make_model("torch", factory=factory, dim=64, classes=10)
    with pytest.raises(ConfigError, match=match):        # through the trainer: before any step
        run(from_dict(_config(model={"options": {"factory": factory}})), out=tmp_path / "r", quiet=True)


def test_bad_modules_parameters_and_arguments_are_refused():
    """A factory returning no nn.Module, a BatchNorm with running statistics, parameters of a wrong
    shape or a missing name, a wrong task and an unknown argument: ValueError naming the fault."""
    with pytest.raises(ValueError, match="returned list, not a torch.nn.Module"):
        TorchModel(factory=f"{HERE}:not_a_module", dim=4, classes=2).init(0)
    with pytest.raises(ValueError, match="BatchNorm with running statistics"):
        TorchModel(factory=f"{HERE}:batchnorm_net", dim=4, classes=2).init(0)
    model = TorchModel(factory=MLP, dim=5, classes=3, kwargs={"hidden": [4]})
    params = model.init(0)
    x, y = _data(model, 2, 3, seed=0)
    wrong = {**params, "0.weight": np.zeros((5, 4), np.float32)}
    with pytest.raises(ValueError, match=r"parameter '0.weight' has shape \(5, 4\), expected \(4, 5\)"):
        model.loss_and_grad(wrong, x, y)
    with pytest.raises(ValueError, match=r"missing \['2.bias'\]"):
        model.loss_and_grad({k: v for k, v in params.items() if k != "2.bias"}, x, y)
    with pytest.raises(ValueError, match="labels must lie in"):
        model.loss_and_grad(params, x, y + 3)
    with pytest.raises(ValueError, match="task must be one of"):
        make_model("torch", factory=MLP, dim=5, task="ranking")
    with pytest.raises(ValueError, match=r"unknown argument\(s\) widht"):
        make_model("torch", factory=MLP, dim=5, widht=3)


def test_nan_gradients_meet_tgsims_checks(tmp_path):
    """A module whose output is NaN: the trainer stops with NonFiniteGradientError naming a layer,
    worker 0 and step 0 (on_nonfinite = 'raise'), or skips every step and leaves the parameters at
    their initial bits (on_nonfinite = 'skip')."""
    opts = {"model": {"options": {"factory": f"{HERE}:nan_net"}}, "run": {"checkpoint_every": 0, "steps": 3}}
    with pytest.raises(NonFiniteGradientError, match=r"layer 'fc\.(bias|weight)'.*worker 0, step 0"):
        run(from_dict(_config(**opts)), out=tmp_path / "raise", quiet=True)
    d = _config(**opts)
    d["run"]["on_nonfinite"] = "skip"
    res = run(from_dict(d), out=tmp_path / "skip", quiet=True)
    assert res.skipped == 3
    init = TorchModel(factory=f"{HERE}:nan_net", dim=64, classes=10).init(5)
    assert _bits(res.params) == _bits(init)


def test_without_torch_tgsim_imports_and_the_torch_model_names_the_extra(monkeypatch):
    """`import tgsim` and its model, trainer and torch modules do not import torch (a fresh interpreter);
    with torch unimportable, make_model('torch', ...) is a ConfigError saying `pip install tgsim[torch]`."""
    code = ("import sys, tgsim, tgsim.models, tgsim.torch, tgsim.torch.model, tgsim.torch.examples, "
            "tgsim.train.loop, tgsim.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr + out.stdout
    monkeypatch.setitem(sys.modules, "torch", None)          # `import torch` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install tgsim\[torch\]"):
        make_model("torch", factory=MLP, dim=5, classes=3)
