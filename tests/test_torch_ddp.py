"""tgsim.torch.ddp: torch DDP with tgsim's comm hook ends with the simulator's parameters, bit for bit.

One mpiexec job of 2 ranks (tests/torch_ddp_driver.py) trains the example MLP on MNIST-1D through DDP
over Gloo with the hook, each rank on the simulator's batches of its worker, for TernGrad (shared
scalers, integer all-reduce of the codes, and the sharded parameter server), QSGD, top-k with error feedback (parameter server,
`gradient_as_bucket_view=True`) and rotated Suresh with error feedback, exchanged per bucket on the
hook's worker thread, and PowerSGD and TernGrad's scope = "model" (declared whole_step) in one step
at the last bucket, with a bucket cap small enough that DDP rebuilds its one bucket of step 0 into
two at step 1. The parameters after every step equal those of tgsim's simulator (checkpoints of a
2-worker run of the same config) on both ranks. Planted defects in the same job,
as positive controls: layers keyed by bucket index (fails at step 1, after the rebuild) and error
feedback without its residuals (other parameters from step 1 on). Then the checks: a misnamed hook
argument, modules that differ across ranks (the same error on every rank), NaN gradients. Without
MPI: the hook in one process on hand-made buckets of three layouts gives a 1-worker simulator's bits
(and loses them when each bucket's layers are numbered from 0: a positive control), each bucket is
exchanged before the next is handed over, NaN gradients raise or skip the step (a NaN in a later
bucket leaves the residuals of error feedback as they were), bad configs are refused. Skipped, with the reason, without
torch (the mpiexec tests without MPI).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install tgsim[torch])")

from mpi_cases import mpiexec, needs_mpi, simulate  # noqa: E402
from torch_ddp_cases import (BUCKET_CAP_MB, CODECS, DRIVER, STEPS, TERNGRAD, TOPK_EF, check_bits,  # noqa: E402
                             ddp_config, digest)

from tgsim.errors import ConfigError  # noqa: E402
from tgsim.torch import ddp as tgddp  # noqa: E402
from tgsim.train import checkpoint  # noqa: E402

CASES = {
    **{name: {"config": cfg, "steps": STEPS, "bucket_cap_mb": BUCKET_CAP_MB, "bucket_view": name == "topk-ef"}
       for name, cfg in CODECS.items()},
    "terngrad-static-graph": {"config": TERNGRAD, "steps": STEPS, "bucket_cap_mb": BUCKET_CAP_MB, "bucket_view": False,
                              "static_graph": True},
    "no-sync": {"config": TERNGRAD, "steps": 3, "bucket_cap_mb": BUCKET_CAP_MB, "bucket_view": False, "no_sync": True},
    "defect-bucket-index": {"config": TERNGRAD, "steps": 2, "bucket_cap_mb": BUCKET_CAP_MB, "bucket_view": False,
                            "defect": "bucket_index"},
    "defect-no-residual": {"config": TOPK_EF, "steps": 3, "bucket_cap_mb": BUCKET_CAP_MB, "bucket_view": True,
                           "defect": "no_residual"},
}


def _run_job(tmp: Path, cases: dict, ranks: int, checks: bool) -> SimpleNamespace:
    """One mpiexec job of the driver over the training `cases` (and, where `checks`, the misnamed,
    mismatch and NaN checks) at `ranks` ranks; its results (one entry per rank) and the simulator's
    per-step digests and final parameters of each case that has no planted defect."""
    spec = {"train": cases, **({"nan": TERNGRAD, "mismatch": TERNGRAD} if checks else {})}
    (tmp / "cases.json").write_text(json.dumps(spec))
    (tmp / "out").mkdir()
    res, _ = mpiexec([(ranks, [str(DRIVER), str(tmp / "cases.json"), str(tmp / "out")])], timeout=300)
    assert res.returncode == 0, res.report()
    results = json.loads((tmp / "out" / "results.json").read_text())
    sim, done = {}, {}
    for name, case in cases.items():
        if case.get("defect") or case.get("no_sync"):
            continue
        key = json.dumps(case["config"], sort_keys=True)
        if key not in done:
            run = simulate(case["config"], tmp / "sim" / name)
            steps = [digest(checkpoint.read(p)["params"])
                     for p in checkpoint.list_checkpoints(tmp / "sim" / name / "checkpoints")]
            assert len(steps) == STEPS and steps[-1] == digest(run.params)
            done[key] = (steps, run.params)
        sim[name] = done[key]
    return SimpleNamespace(ranks=results, sim=sim, out=tmp / "out")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The 2-rank job of CASES with the checks."""
    return _run_job(tmp_path_factory.mktemp("ddp"), CASES, 2, checks=True)


@needs_mpi
@pytest.mark.parametrize("name", list(CODECS))
def test_ddp_with_the_hook_ends_with_the_simulators_bits(job, name):
    """After every one of 5 steps, on both ranks, DDP's parameters equal the simulator's bit for bit:
    step 0 with DDP's one bucket, steps 1.. with the two buckets of its rebuild; the final
    parameters (rank 0) equal the simulator's array by array."""
    check_bits(job, name, 2)


@needs_mpi
def test_static_graph_rebuilds_at_step_2_with_the_same_bits(job):
    """DDP(static_graph=True) rebuilds its buckets at step 2, not 1: the parameters after every step
    are still the simulator's."""
    check_bits(job, "terngrad-static-graph", 2, rebuilt_at=2)


@needs_mpi
def test_no_sync_accumulation_runs_the_hook_once_per_step(job):
    """Half of each batch under `no_sync()` (accumulated in .grad, no hook), the other half with it:
    the hook runs one exchange per step (3 in 3 steps), an optimizer step after the no_sync half
    alone is refused, and both ranks end with the same parameters after every step."""
    ranks = [r["train"]["no-sync"] for r in job.ranks]
    assert all(c["error"] is None and c["hook_steps"] == 3 and len(c["digests"]) == 3 for c in ranks), ranks
    assert all("call step() once after each backward pass" in c["refused"] for c in ranks), ranks
    assert ranks[0]["digests"] == ranks[1]["digests"]
    assert ranks[0]["digests"][0] not in job.sim["terngrad"][0]      # another gradient than the simulator's


@needs_mpi
@pytest.mark.heavy
def test_four_ranks_end_with_the_simulators_bits(tmp_path):
    """The codec cases at 4 ranks (4 workers, 16 samples each): the simulator's bits after every step
    on every rank."""
    cases = {}
    for name in CODECS:
        d = json.loads(json.dumps(CASES[name]))
        d["config"]["workers"] = {"n": 4, "batch": 64}
        cases[name] = d
    job4 = _run_job(tmp_path, cases, 4, checks=False)
    for name in cases:
        check_bits(job4, name, 4)


@needs_mpi
def test_planted_defects_are_caught(job):
    """Positive controls in the same job: layers keyed by bucket index give the simulator's bits at
    step 0 and fail at step 1, after the rebuild; error feedback without its residuals leaves the
    simulator's parameters from step 1 on."""
    tern, topk = job.sim["terngrad"][0], job.sim["topk-ef"][0]
    for r in job.ranks:
        bad = r["train"]["defect-bucket-index"]
        assert bad["digests"][:1] == tern[:1]
        assert bad["digests"][1:2] != tern[1:2], "keying by bucket index went unnoticed"
        no_ef = r["train"]["defect-no-residual"]
        assert no_ef["digests"][0] == topk[0] and no_ef["digests"][1] != topk[1]


@needs_mpi
def test_misnamed_hook_mismatched_modules_and_nan_gradients(job):
    """A hook whose second argument is not `bucket`: tgsim's register names the rule (DDP says only
    KeyError 'bucket'). Rank 1's module one hidden unit wider: the same RankConfigMismatchError on both
    ranks, naming the parameter and both shapes. A NaN batch on rank 1: NonFiniteGradientError naming
    the layer, worker 1 and step 0 there, a ValueError pointing to it on rank 0."""
    mis = job.ranks[0]["misnamed"]
    assert "second argument named 'bucket'" in mis["tgsim"] and "takes (state, grads)" in mis["tgsim"]
    assert mis["ddp"] == "KeyError: 'bucket'"
    msgs = {r["mismatch"] for r in job.ranks}
    assert len(msgs) == 1, msgs
    (msg,) = msgs
    assert msg.startswith("RankConfigMismatchError:") and "(65,)" in msg and "(64,)" in msg and "'0.bias'" in msg
    nan0, nan1 = job.ranks[0]["nan"], job.ranks[1]["nan"]
    assert nan1.startswith("NonFiniteGradientError:") and "worker 1, step 0" in nan1, nan1
    assert nan0.startswith("ValueError:") and "another worker's gradient is non-finite" in nan0, nan0


# -- without MPI ---------------------------------------------------------------------------------------------

class _OneRank:
    """An exchange of `n` workers of which this process holds worker 0, its allgather of one rank."""

    def __init__(self, n=1):
        self.local_workers, self.n_workers = (0,), n
        self.comm = SimpleNamespace(allgather=lambda x: [x])


def test_a_buckets_plan_is_kept_while_its_key_holds():
    """Buckets.plan builds a bucket's layers (step order) and flat form once per key: the same key
    reuses them, another key (a rebuilt bucket) or key None (CuPy) builds again, and the flat form is
    the buffer's views (FlatLayers), so later writes to the buffer are what the codec reads."""
    from tgsim.codecs.base import FlatLayers
    from tgsim.torch.ddp_bucket import Buckets

    state = SimpleNamespace(index={"a": 0, "b": 1}, setup=SimpleNamespace(model=SimpleNamespace(
        shapes={"a": (2,), "b": (3,)})))
    buckets = Buckets(state, threaded=False)
    buf = np.arange(5, dtype=np.float32)
    builds = []

    def build():
        builds.append(1)
        return {"b": buf[2:], "a": buf[:2]}, buf

    layers, form = buckets.plan(0, ("k",), build)
    assert list(layers) == ["a", "b"] and isinstance(form, FlatLayers) and form.starts == {"a": 0, "b": 2}
    assert buckets.plan(0, ("k",), build)[1] is form and len(builds) == 1
    buf[:] = 7.0                                            # the next step's gradients, in place
    assert (form["b"] == 7.0).all()
    assert buckets.plan(0, ("other",), build)[1] is not form and len(builds) == 2
    buckets.plan(1, None, build)
    buckets.plan(1, None, build)
    assert len(builds) == 4 and 1 not in buckets.plans


def test_create_refuses_configs_the_hook_cannot_run():
    """[workers] n other than the ranks, local steps, the CuPy backend, a float64 module: ConfigError."""
    module = torch.nn.Linear(3, 2)
    cfg = {"workers": {"n": 1, "batch": 4}}
    with pytest.raises(ConfigError, match=r"\[workers\] n = 1, but 2 ranks run"):
        tgddp.TgsimHookState.create(module, cfg, exchange=_OneRank(2))
    with pytest.raises(ConfigError, match="local = 'average'"):
        tgddp.TgsimHookState.create(module, {**cfg, "exchange": {"local": "average", "every": 2}}, exchange=_OneRank())
    with pytest.raises(ConfigError, match="parameters are on cpu, so \\[run\\] backend must be .numpy., got .cupy."):
        tgddp.TgsimHookState.create(module, {**cfg, "run": {"backend": "cupy"}}, exchange=_OneRank())
    with pytest.raises(ConfigError, match="parameter 'bias' is torch.float64"):
        tgddp.TgsimHookState.create(torch.nn.Linear(3, 2).double(), cfg, exchange=_OneRank())
    with pytest.raises(ConfigError, match="config must be a dict"):
        tgddp.TgsimHookState.create(module, "demo.toml", exchange=_OneRank())


def test_the_hooks_own_exchange_skips_pipelining_for_a_one_piece_message(monkeypatch):
    """A model of at most CHUNK parameters (one piece) gets the whole-message path (chunk -1), a larger
    one the pipelined default; through create() for both transports when no exchange is given."""
    from tgsim.exchange import mpi

    assert tgddp.one_piece_chunk(mpi.CHUNK) == -1 and tgddp.one_piece_chunk(mpi.CHUNK + 1) == mpi.CHUNK
    made = []

    def fake(**kw):
        made.append(kw["chunk"])
        return _OneRank(2)          # refused right after (n = 1 config): only the chunk is checked

    monkeypatch.setattr(mpi, "MPIExchange", fake)
    monkeypatch.setattr(tgddp, "torch_exchange", fake)
    cfg = {"workers": {"n": 1, "batch": 4}}
    for module in (torch.nn.Linear(3, 2), torch.nn.Linear(600, 500)):      # 8 and 300,500 parameters
        for transport in tgddp.TRANSPORTS:
            with pytest.raises(ConfigError, match="2 ranks run"):
                tgddp.TgsimHookState.create(module, cfg, transport=transport)
    assert made == [-1, -1, mpi.CHUNK, mpi.CHUNK]


def test_parameter_mismatch_names_the_first_difference():
    a = [["0.bias", [4], "torch.float32"], ["0.weight", [4, 3], "torch.float32"]]
    assert tgddp.parameter_mismatch([a, a]) is None
    b = [["0.bias", [4], "torch.float32"], ["0.weight", [4, 5], "torch.float32"]]
    assert "parameter '0.weight' is (4, 5) torch.float32 on rank 1, (4, 3) torch.float32 on rank 0" in \
        tgddp.parameter_mismatch([a, b])
    msg = tgddp.parameter_mismatch([a, a, a[:1]])
    assert "rank 0 has ['0.weight'] that rank 2 lacks" in msg and "rank 1" not in msg


def test_register_refuses_a_misnamed_hook_before_ddp_sees_it():
    calls = []
    fake = SimpleNamespace(register_comm_hook=lambda state, hook: calls.append(hook))

    def grads_hook(state, grads):
        return None

    with pytest.raises(ValueError, match=r"'grads_hook' takes \(state, grads\)"):
        tgddp.register(fake, None, grads_hook)
    assert calls == []
    tgddp.register(fake, None)
    assert calls == [tgddp.tgsim_hook]


# -- in one process: the hook on hand-made buckets ------------------------------------------------------------

class _Bucket:
    """What DDP hands a comm hook: the parameters' gradients copied into one flat buffer, views of it."""

    def __init__(self, index: int, last: bool, params: list):
        self._index, self._last, self._params = index, last, params
        self._buffer = torch.cat([p.grad.reshape(-1) for p in params])
        sizes = [p.numel() for p in params]
        self._views = [v.view(p.shape) for v, p in zip(torch.split(self._buffer, sizes), params)]

    def index(self):
        return self._index

    def is_last(self):
        return self._last

    def parameters(self):
        return list(self._params)

    def gradients(self):
        return list(self._views)

    def buffer(self):
        return self._buffer


def _exchange_buckets(state, layout: list[list[str]]) -> list:
    """Call the hook on buckets of the parameters named in `layout` (bucket order), then copy each
    future's buffer back into the parameters' .grad, as DDP does; the futures."""
    futures, buckets = [], []
    for i, names in enumerate(layout):
        b = _Bucket(i, i == len(layout) - 1, [state.params[k] for k in names])
        buckets.append(b)
        futures.append(tgddp.tgsim_hook(state, b))
    for b, f in zip(buckets, futures):
        out = f.wait()
        assert out.data_ptr() == b.buffer().data_ptr()
        for p, v in zip(b.parameters(), b.gradients()):
            p.grad.copy_(v)
    return futures


def _one_worker(codec: dict, mode: str, **run) -> dict:
    d = json.loads(json.dumps(ddp_config(codec, mode)))
    d["workers"] = {"n": 1, "batch": 16}
    d["run"] = {**d["run"], "steps": 3, "keep_checkpoints": 3, **run}
    return d


ONE_PROCESS = [({"name": "terngrad"}, "allreduce"), ({"name": "topk", "error_feedback": True}, "ps"),
               ({"name": "qsgd"}, "ps"), ({"name": "suresh", "rotate": True, "error_feedback": True}, "allgather"),
               ({"name": "randomk", "error_feedback": True}, "ps"),
               ({"name": "terngrad", "scope": "model"}, "allreduce")]


def _one_process_run(tmp_path, codec: dict, mode: str) -> tuple:
    """A 1-worker simulator run of 3 steps and the hook in one process on hand-made buckets of three
    layouts (all layers in model order; two buckets in reverse order; one bucket per layer,
    shuffled): (the hook's digests after each step, the simulator's, its run, the state, the optimizer)."""
    from tgsim.exchange import InProcessExchange
    from tgsim.train.config import from_dict
    from tgsim.train.loop import build
    from tgsim.data import batch_indices

    d = _one_worker(codec, mode)
    run = simulate(d, tmp_path / "sim")
    sim = [digest(checkpoint.read(p)["params"]) for p in checkpoint.list_checkpoints(tmp_path / "sim" / "checkpoints")]
    cfg = from_dict(d)
    setup = build(cfg)
    module = setup.model.build(cfg.run.seed)
    state = tgddp.TgsimHookState.create(module, d, exchange=InProcessExchange(1))
    opt = tgddp.TgsimOptimizer(state)
    order = [k for k, _ in module.named_parameters()]           # model order: 0.weight, 0.bias, ...
    layouts = [[order], [order[:1:-1], order[1::-1]], [[order[i]] for i in (2, 0, 3, 1)]]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        digests = []
        for step, layout in enumerate(layouts):
            idx = batch_indices(setup.shards[0], cfg.workers.per_worker_batch, cfg.run.seed, step, 0)
            opt.zero_grad()
            x, y = torch.from_numpy(setup.dataset.x_train[idx]), torch.from_numpy(setup.dataset.y_train[idx])
            torch.nn.functional.cross_entropy(module(x), y).backward()
            _exchange_buckets(state, layout)
            opt.step()
            digests.append(tgddp.digest(module))
    finally:
        torch.set_num_threads(before)
    return digests, sim, run, state, opt


@pytest.mark.parametrize("codec,mode", ONE_PROCESS, ids=lambda v: v if isinstance(v, str) else "+".join(
    f"{k}={x}" for k, x in v.items()))
def test_in_one_process_the_hook_gives_the_simulators_bits_whatever_the_buckets(tmp_path, codec, mode):
    """One worker, the hook called on hand-made buckets of three layouts (`_one_process_run`): the
    parameters after each of 3 steps equal a 1-worker simulator run's, bit for bit: per bucket, each
    layer drawn under its index in name order whatever bucket holds it (TernGrad, QSGD, Suresh's
    rotation, random-k; error feedback's residuals per bucket), and TernGrad's scope = "model"
    (declared whole_step) in one step at the last bucket."""
    digests, sim, run, state, opt = _one_process_run(tmp_path, codec, mode)
    assert digests == sim and digests[-1] == digest(run.params)
    assert state.step == 3 and (state.codec_state is not None) == bool(codec.get("error_feedback"))
    assert state.per_bucket == (codec.get("scope") != "model")
    with pytest.raises(ValueError, match="call step\\(\\) once after each backward pass"):
        opt.step()


@pytest.mark.parametrize("codec,mode", [({"name": "qsgd"}, "ps"),
                                        ({"name": "suresh", "rotate": True, "error_feedback": True}, "allgather")])
def test_layers_renumbered_per_bucket_are_caught(tmp_path, monkeypatch, codec, mode):
    """Positive control of the test above: the hook numbering each bucket's layers from 0 (the
    layer's position in its bucket, not in the model) keeps the simulator's bits at step 0 (one
    bucket of all layers) and loses them at step 1 (two buckets)."""
    from tgsim.codecs.base import FlatLayers, IndexedLayers
    from tgsim.torch import ddp_bucket

    class Renumbered(FlatLayers):
        @classmethod
        def from_views(cls, buffer, views, ids=None):
            return FlatLayers.from_views(buffer, views, {k: i for i, k in enumerate(views)})

    monkeypatch.setattr(ddp_bucket, "FlatLayers", Renumbered)      # the host path: the bucket's buffer
    monkeypatch.setattr(ddp_bucket, "IndexedLayers", lambda layers, ids: IndexedLayers(
        layers, {k: i for i, k in enumerate(layers)}))
    digests, sim, _, state, _ = _one_process_run(tmp_path, codec, mode)
    assert state.per_bucket and digests[0] == sim[0] and digests[1] != sim[1]


def test_the_hook_hands_each_bucket_to_the_codec_as_its_buffer(tmp_path, monkeypatch):
    """Per bucket, the codec gets the bucket's layers as one FlatLayers over the bucket's own buffer
    (read in place, each layer at its offset, with its index in the model), and the bits stay the
    simulator's."""
    from tgsim.codecs.base import FlatLayers
    from tgsim.codecs.terngrad import TernGrad

    seen = []
    real = TernGrad.encode_many

    def spy(self, layers, *args, **kwargs):
        seen.append(layers)
        return real(self, layers, *args, **kwargs)

    monkeypatch.setattr(TernGrad, "encode_many", spy)
    digests, sim, _, state, _ = _one_process_run(tmp_path, {"name": "terngrad"}, "allreduce")
    assert state.per_bucket and digests == sim
    hook = [x for x in seen if isinstance(x, FlatLayers)]           # the simulator's steps: plain dicts
    assert [len(x) for x in hook] == [4, 2, 2, 1, 1, 1, 1] and len(seen) == 3 + len(hook)
    for layers in hook:
        assert layers.buffer.shape[0] == 1
        for k, v in layers.items():
            assert np.shares_memory(v, layers.buffer) and layers.ids[k] == state.index[k]


def test_the_hooks_step_draws_no_batch_and_averages_no_loss(monkeypatch):
    """The hook's trainer step has no data set: `local_batch` gives (None, None) without drawing the
    workers' batch indices (the simulator's draw, which the hook's model would ignore); its model
    sees no loss, so the step runs no loss-averaging collective (`mean_scalar`)."""
    from tgsim.data import batching
    from tgsim.exchange import InProcessExchange
    from tgsim.train.config import from_dict
    from tgsim.train.loop import build, local_batch

    d = _one_worker({"name": "terngrad"}, "ps")
    module = build(from_dict(d)).model.build(0)
    state = tgddp.TgsimHookState.create(module, d, exchange=InProcessExchange(1))
    assert local_batch(state.setup, 0) == (None, None)

    def no_draw(*args, **kwargs):
        raise AssertionError("the hook drew a batch")

    def no_mean(*args, **kwargs):
        raise AssertionError("the hook averaged a loss")

    monkeypatch.setattr(batching, "batch_indices_many", no_draw)
    monkeypatch.setattr(state.exchange, "mean_scalar", no_mean)
    x = torch.zeros(4, module[0].in_features)                  # the example MLP's input
    torch.nn.functional.cross_entropy(module(x), torch.zeros(4, dtype=torch.int64)).backward()
    _exchange_buckets(state, [list(state.params)])
    assert state.step == 1 and all(torch.isfinite(p.grad).all() for p in state.params.values())


def test_nan_gradients_raise_or_skip_the_step():
    """NaN in one layer's gradient at step 0: on_nonfinite = 'raise' gives NonFiniteGradientError naming
    the layer, worker 0 and step 0. 'skip', at step 1 after a good step (momentum nonzero): the
    buckets get zeros, state.skipped is set, TgsimOptimizer leaves the parameters as they were; step 2
    runs and moves them."""
    from tgsim.errors import NonFiniteGradientError
    from tgsim.exchange import InProcessExchange

    def fill(state, bad: bool):
        for k, p in state.params.items():
            p.grad = torch.ones_like(p) * (float("nan") if bad and k == "0.bias" else 1.0)

    module = torch.nn.Sequential(torch.nn.Linear(4, 3))
    d = _one_worker({"name": "terngrad"}, "allreduce", on_nonfinite="raise")
    state = tgddp.TgsimHookState.create(module, d, exchange=InProcessExchange(1))
    fill(state, bad=True)
    with pytest.raises(NonFiniteGradientError, match=r"layer '0\.bias'.*worker 0, step 0"):
        _exchange_buckets(state, [list(state.params)])

    state = tgddp.TgsimHookState.create(module, {**d, "run": {**d["run"], "on_nonfinite": "skip"}},
                                        exchange=InProcessExchange(1))
    opt = tgddp.TgsimOptimizer(state)
    for step, bad in enumerate((False, True, False)):
        fill(state, bad)
        before = {k: p.detach().clone() for k, p in state.params.items()}
        _exchange_buckets(state, [list(state.params)])
        opt.step()
        assert state.skipped == bad and state.step == step + 1
        moved = [not torch.equal(p, before[k]) for k, p in state.params.items()]
        if bad:
            assert all(torch.count_nonzero(p.grad) == 0 for p in state.params.values())
            assert not any(moved)
        else:
            assert all(moved)


def test_a_nan_in_a_later_bucket_skips_the_step_and_keeps_the_codec_state():
    """Random-k with error feedback, two buckets a step ([2.*] then [0.*], as DDP orders them).
    Step 0 is good (residuals nonzero). Step 1 has a NaN in the LAST bucket's 0.bias, after the first
    bucket was already exchanged: on_nonfinite = 'skip' leaves the residuals bit for bit as after step
    0 (the first bucket's new residuals are dropped), every bucket gets zeros, the parameters do not
    move; step 2 runs from the kept residuals. 'raise' names the layer, worker 0 and step 0."""
    from tgsim.errors import NonFiniteGradientError
    from tgsim.exchange import InProcessExchange

    module = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    layout = [["2.weight", "2.bias"], ["0.weight", "0.bias"]]

    def fill(state, bad: bool, step: int):
        g = torch.Generator().manual_seed(step)
        for k, p in state.params.items():
            p.grad = torch.randn(p.shape, generator=g)
            if bad and k == "0.bias":
                p.grad[1] = float("nan")

    d = _one_worker({"name": "randomk", "error_feedback": True}, "ps", on_nonfinite="skip")
    state = tgddp.TgsimHookState.create(module, d, exchange=InProcessExchange(1))
    opt = tgddp.TgsimOptimizer(state)
    assert state.per_bucket
    for step, bad in enumerate((False, True, False)):
        fill(state, bad, step)
        kept = {k: v.copy() for k, v in state.codec_state.items()}
        before = {k: p.detach().clone() for k, p in state.params.items()}
        _exchange_buckets(state, layout)
        opt.step()
        assert state.skipped == bad and state.step == step + 1
        same = [np.array_equal(state.codec_state[k], kept[k]) for k in kept]
        moved = [not torch.equal(p, before[k]) for k, p in state.params.items()]
        if bad:
            assert all(same), [k for k, ok in zip(kept, same) if not ok]
            assert all(torch.count_nonzero(p.grad) == 0 for p in state.params.values())
            assert not any(moved)
        else:
            assert not any(same) and any(moved)

    d = _one_worker({"name": "randomk", "error_feedback": True}, "ps", on_nonfinite="raise")
    state = tgddp.TgsimHookState.create(module, d, exchange=InProcessExchange(1))
    fill(state, True, 0)
    with pytest.raises(NonFiniteGradientError, match=r"layer '0\.bias'.*worker 0, step 0"):
        _exchange_buckets(state, layout)
    assert state.step == 1


class _Watched:
    """InProcessExchange(1) whose `aggregate` records the thread it runs on."""

    def __init__(self):
        from tgsim.exchange import InProcessExchange

        self.inner, self.threads = InProcessExchange(1), []

    def aggregate(self, *args, **kwargs):
        import threading

        self.threads.append(threading.current_thread())
        return self.inner.aggregate(*args, **kwargs)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


@pytest.mark.parametrize("codec,thread", [({"name": "qsgd"}, True), ({"name": "qsgd"}, False),
                                          ({"name": "terngrad", "scope": "model"}, True)])
def test_each_bucket_is_exchanged_before_the_next_is_handed_over(codec, thread):
    """Per bucket, the first bucket's exchange runs, and its future completes, before the last bucket
    is handed over: on the worker thread (thread=True), or inline in the hook (thread=False). A
    whole-step codec (TernGrad scope = 'model') exchanges nothing until the last bucket."""
    import threading
    import time

    module = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    ex = _Watched()
    state = tgddp.TgsimHookState.create(module, _one_worker(codec, "ps"), exchange=ex, thread=thread)
    assert state.per_bucket == (codec.get("scope") != "model")
    for p in state.params.values():
        p.grad = torch.ones_like(p)
    first = _Bucket(0, False, [state.params["2.weight"], state.params["2.bias"]])
    fut = tgddp.tgsim_hook(state, first)
    deadline = time.monotonic() + (20 if state.per_bucket else 1)
    while not fut.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not state.per_bucket:
        assert not fut.done() and ex.threads == []
    else:
        assert fut.done() and len(ex.threads) == 1
        assert (ex.threads[0] is threading.main_thread()) == (not thread)
        assert torch.equal(fut.wait(), first.buffer())
    last = _Bucket(1, True, [state.params["0.weight"], state.params["0.bias"]])
    tgddp.tgsim_hook(state, last).wait()
    assert fut.done() and len(ex.threads) == (2 if state.per_bucket else 1) and state.step == 1


def _steps(state, opt, module, setup, cfg, steps) -> list:
    """Run the hook in one process (one bucket per step) for `steps`; the digest after each."""
    from tgsim.data import batch_indices

    out, before = [], torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for step in steps:
            idx = batch_indices(setup.shards[0], cfg.workers.per_worker_batch, cfg.run.seed, step, 0)
            opt.zero_grad()
            x, y = torch.from_numpy(setup.dataset.x_train[idx]), torch.from_numpy(setup.dataset.y_train[idx])
            torch.nn.functional.cross_entropy(module(x), y).backward()
            _exchange_buckets(state, [list(state.params)])
            opt.step()
            out.append(tgddp.digest(module))
    finally:
        torch.set_num_threads(before)
    return out


def test_state_dicts_resume_with_the_uninterrupted_bits():
    """Top-k with error feedback and momentum, one worker in one process: 3 steps, the hook's and
    TgsimOptimizer's state_dict() and the parameters saved; a new module, hook state and optimizer
    loaded from them run steps 3 and 4 and end with the uninterrupted 5-step run's bits after each step
    (the residuals and the momentum buffer carried). A state of another config or codec is refused and
    changes nothing."""
    from tgsim.exchange import InProcessExchange
    from tgsim.train.config import from_dict
    from tgsim.train.loop import build

    d = _one_worker({"name": "topk", "error_feedback": True}, "ps", steps=5)
    cfg = from_dict(d)
    setup = build(cfg)

    def fresh():
        module = setup.model.build(cfg.run.seed)
        state = tgddp.TgsimHookState.create(module, d, exchange=InProcessExchange(1))
        return module, state, tgddp.TgsimOptimizer(state)

    module, state, opt = fresh()
    whole = _steps(state, opt, module, setup, cfg, range(5))
    module, state, opt = fresh()
    first = _steps(state, opt, module, setup, cfg, range(3))
    saved = {"params": {k: p.detach().numpy().copy() for k, p in state.params.items()},
             "hook": state.state_dict(), "opt": opt.state_dict()}
    assert first == whole[:3] and saved["hook"]["step"] == 3
    assert np.abs(saved["hook"]["codec_state"]["residual/0.weight"]).sum() > 0
    module, state, opt = fresh()
    with torch.no_grad():
        for k, p in state.params.items():
            p.copy_(torch.from_numpy(saved["params"][k]))
    with pytest.raises(ValueError, match="from the same checkpoint"):
        opt.load_state_dict(saved["opt"])                    # the hook's state first
    state.load_state_dict(saved["hook"])
    opt.load_state_dict(saved["opt"])
    assert _steps(state, opt, module, setup, cfg, range(3, 5)) == whole[3:]

    _, other, _ = fresh()
    before = {k: v.copy() for k, v in other.codec_state.items()}
    for bad, match in ((dict(saved["hook"], config="0" * 64), "another config"),
                       (dict(saved["hook"], codec_state=None), "does not match"),
                       (dict(saved["hook"], rank=1), "rank 1's"),
                       ({"step": 3}, "has no 'codec_state'")):
        with pytest.raises(ValueError, match=match):
            other.load_state_dict(bad)
        assert other.step == 0 and all(np.array_equal(before[k], other.codec_state[k]) for k in before)


_THREADS_SCRIPT = """
import tempfile, torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tgsim.exchange import InProcessExchange
from tgsim.torch.ddp import TgsimHookState, TgsimOptimizer, register
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
m = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 5))
st = TgsimHookState.create(m, {"workers": {"n": 1}, "codec": {"name": "terngrad"}, "exchange": {"mode": "ps"}},
                           exchange=InProcessExchange(1))
model = DDP(m); register(model, st); opt = TgsimOptimizer(st)
for step in range(2):
    F.cross_entropy(model(torch.randn(32, 64)), torch.randint(0, 5, (32,))).backward(); opt.step()
    print(torch.get_num_threads())
dist.destroy_process_group()
"""


def test_the_hook_leaves_torch_at_the_users_thread_count(tmp_path):
    """The issue's reproduction in a fresh process with no thread variable set (the first parallel
    Numba kernel of a process starts Numba's OpenMP layer, which set the shared OpenMP runtime, and
    so torch, to the core count): after each step torch is still at the user's one thread."""
    import os
    import subprocess
    import sys

    from mpi_launch import THREAD_VARS

    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    script = tmp_path / "threads.py"
    script.write_text(_THREADS_SCRIPT)
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["1", "1"], res.stdout


def test_the_hook_warns_when_torch_runs_at_more_than_one_thread():
    """At another thread count torch's kernels reduce in another order than the simulator's: warned."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.warns(RuntimeWarning, match=r"torch runs at 2 intra-op threads.*torch.set_num_threads\(1\)"):
            tgddp.TgsimHookState.create(torch.nn.Linear(3, 2), {"workers": {"n": 1, "batch": 4}}, exchange=_OneRank())
    finally:
        torch.set_num_threads(before)


_UNUSED_SCRIPT = """
import tempfile, torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tgsim.exchange import InProcessExchange
from tgsim.torch.ddp import TgsimHookState, TgsimOptimizer, register
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
class M(nn.Module):
    def __init__(s):
        super().__init__(); s.a = nn.Linear(8, 3); s.spare = nn.Linear(2, 2)
    def forward(s, x): return s.a(x)
m = M()
st = TgsimHookState.create(m, {"workers": {"n": 1}, "codec": {"name": "qsgd"}}, exchange=InProcessExchange(1))
model = DDP(m); register(model, st); opt = TgsimOptimizer(st)
F.cross_entropy(model(torch.randn(4, 8)), torch.zeros(4, dtype=torch.long)).backward()
try:
    opt.step()
except ValueError as e:
    print(e)
"""


def test_an_unused_parameter_without_find_unused_parameters_names_the_fix(tmp_path):
    """DDP never hands the bucket of a parameter the forward pass does not use to the hook unless
    built with find_unused_parameters=True: TgsimOptimizer.step names the parameter and that option
    (the zoo's `unused` case trains such a module with it)."""
    import subprocess
    import sys

    script = tmp_path / "unused.py"
    script.write_text(_UNUSED_SCRIPT)
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "parameter 'spare.bias' got no gradient" in res.stdout and "find_unused_parameters=True" in res.stdout, \
        res.stdout
