"""Local SGD and PQASGD ([exchange] local / every, tgsim/train/local_sgd.py) in the simulator.

p = 1 is the synchronous step bit for bit; p > 1 with fp32 is an independent NumPy local-SGD loop bit
for bit (and the textbook sequential form within float32 rounding); PQASGD with a ternary codec
trains least squares at 1/p of the synchronous payload; a killed run resumes with the uninterrupted
bits; impossible combinations are ConfigErrors that say why.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tgsim.data.batching import batch_indices
from tgsim.errors import NonFiniteGradientError
from tgsim.train import checkpoint, local_sgd
from tgsim.train.config import CodecConfig, ConfigError, from_dict
from tgsim.train.loop import build, run
from tgsim.train.schedules import learning_rate

LS = {"data": {"name": "least_squares"}, "model": {"name": "least_squares"}}
MLP = {"data": {"name": "digits"}, "model": {"name": "mlp", "options": {"hidden": [16]}}}


def config(model=LS, **sections):
    d = {"run": {"name": "l", "seed": 3, "steps": 20, "eval_every": 0, "log_every": 5, "checkpoint_every": 0},
         "workers": {"n": 4, "batch": 32},
         "codec": {"name": "fp32"},
         "exchange": {"mode": "allreduce"},
         "optimizer": {"name": "momentum"},
         "schedule": {"name": "constant", "lr": 0.1},
         **{k: dict(v) for k, v in model.items()}}
    for name, values in sections.items():
        d[name] = {**d.get(name, {}), **values}
    return from_dict(d)


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]).view(np.uint32),
                                                       np.asarray(b[k]).view(np.uint32)) for k in a)


def train(cfg, **kw):
    return run(cfg, writer=False, quiet=True, **kw)


# -- p = 1: the synchronous step ----------------------------------------------------------------------

@pytest.mark.parametrize("codec, mode, optimizer, local", [
    ("fp32", "allreduce", "sgd", "pqasgd"),
    ("fp32", "allreduce", "momentum", "pqasgd"),
    ("fp32", "allreduce", "momentum", "average"),
    ("terngrad", "ps", "momentum", "pqasgd"),        # any codec: the same calls with the same keys
])
def test_p1_is_the_synchronous_step_bit_for_bit(codec, mode, optimizer, local):
    common = dict(model=MLP, codec={"name": codec}, optimizer={"name": optimizer},
                  schedule={"name": "poly", "lr": 0.1})
    sync = train(config(**common, exchange={"mode": mode}))
    loc = train(config(**common, exchange={"mode": mode, "local": local, "every": 1}))
    assert same_bits(loc.params, sync.params)
    assert (loc.bits_up, loc.bits_down, loc.skipped) == (sync.bits_up, sync.bits_down, sync.skipped)


# -- p > 1 with fp32: local SGD ------------------------------------------------------------------------

def numpy_local_sgd(cfg, sequential: bool = False) -> dict:
    """Local SGD written out: per worker A_i = Σ g (float32, step order), replica x_s - γ A_i, at a sync
    the float64-ordered mean of the A_i and the sync optimizer (sgd or heavy ball) on it.

    sequential=True: the textbook form instead, x_i <- x_i - γ g at every local step and at a sync
    x_s <- f32(mean_i f64(x_i)) (sgd only: the same algorithm in exact arithmetic, other roundings).
    Uses only the model's per-worker gradient (one worker per call), the per-worker batch function
    and the schedule from tgsim."""
    setup = build(cfg)
    model, ds, n = setup.model, setup.dataset, cfg.workers.n
    p, steps, seed, b = cfg.exchange.every, cfg.run.steps, cfg.run.seed, cfg.workers.per_worker_batch
    beta = np.float32(cfg.optimizer.momentum)
    xs = model.init(seed)
    v = {k: np.zeros_like(a) for k, a in xs.items()}
    acc = [None] * n
    xi = [dict(xs) for _ in range(n)]
    for t in range(steps):
        lr = np.float32(learning_rate(cfg.schedule, (t // p) * p, steps))
        for i in range(n):
            idx = batch_indices(setup.shards[i], b, seed, t, i)
            if sequential:
                _, g = model.loss_and_grad(xi[i], ds.x_train[idx][None], ds.y_train[idx][None])
                xi[i] = {k: xi[i][k] - lr * g[k][0] for k in xs}
                continue
            here = xs if acc[i] is None else {k: xs[k] - lr * acc[i][k] for k in xs}
            _, g = model.loss_and_grad(here, ds.x_train[idx][None], ds.y_train[idx][None])
            acc[i] = {k: g[k][0].copy() for k in xs} if acc[i] is None else {k: acc[i][k] + g[k][0] for k in xs}
        if (t + 1) % p == 0 or t + 1 == steps:
            if sequential:
                xs = {k: (sum(x[k].astype(np.float64) for x in xi) / n).astype(np.float32) for k in xs}
                xi = [dict(xs) for _ in range(n)]
                continue
            mean = {}
            for k in xs:
                total = np.zeros(xs[k].shape, np.float64)
                for i in range(n):
                    total += acc[i][k].astype(np.float64)
                mean[k] = (total * np.float64(1.0 / n)).astype(np.float32)
            if cfg.optimizer.name == "sgd":
                xs = {k: xs[k] - lr * mean[k] for k in xs}
            else:
                v = {k: beta * v[k] + mean[k] for k in xs}
                xs = {k: xs[k] - lr * v[k] for k in xs}
            acc = [None] * n
    return xs


@pytest.mark.parametrize("model, optimizer, schedule, every", [
    (LS, "sgd", "constant", 4),
    (MLP, "momentum", "poly", 3),           # 20 steps: the last period is 2 steps; γ changes per period
])
def test_fp32_with_p_local_steps_is_numpy_local_sgd_bit_for_bit(model, optimizer, schedule, every):
    common = dict(model=model, optimizer={"name": optimizer}, schedule={"name": schedule, "lr": 0.1})
    want = numpy_local_sgd(config(**common, exchange={"local": "average", "every": every}))
    for local in ("average", "pqasgd"):
        got = train(config(**common, exchange={"local": local, "every": every}))
        assert same_bits(got.params, want), local
    sync = train(config(**common))
    assert not same_bits(sync.params, want), "local steps must change the run"


def test_local_sgd_is_the_textbook_sequential_form_up_to_rounding():
    cfg = config(model=MLP, optimizer={"name": "sgd"}, exchange={"local": "average", "every": 4})
    got = train(cfg).params
    textbook = numpy_local_sgd(cfg, sequential=True)
    assert not same_bits(got, textbook)      # other roundings ...
    for k in got:                            # ... of the same algorithm
        np.testing.assert_allclose(got[k], textbook[k], rtol=0, atol=5e-7 * float(np.abs(textbook[k]).max()))


# -- PQASGD with a ternary codec ------------------------------------------------------------------------

def test_pqasgd_ternary_trains_least_squares_at_one_pth_of_the_payload():
    common = dict(optimizer={"name": "sgd"}, run={"steps": 100}, schedule={"lr": 0.2})
    ternary = {"name": "terngrad"}
    start = build(config(**common))
    d0 = start.distance_to_optimum(start.model.init(3))
    pq = train(config(**common, codec=ternary, exchange={"mode": "ps", "local": "pqasgd", "every": 4}))
    avg = train(config(**common, exchange={"local": "average", "every": 4}))
    sync = train(config(**common, codec=ternary, exchange={"mode": "ps"}))
    assert pq.dist_opt < 0.5 * d0
    assert pq.dist_opt < 1.1 * avg.dist_opt          # quantized differences cost little against local SGD
    assert pq.bits_up == pytest.approx(sync.bits_up / 4) and pq.bits_down == pytest.approx(sync.bits_down / 4)


# -- resume, non-finite values, config ---------------------------------------------------------------------

def test_killed_run_resumes_with_the_uninterrupted_bits(tmp_path, monkeypatch):
    cfg = config(model=MLP, codec={"name": "terngrad"}, exchange={"mode": "ps", "local": "pqasgd", "every": 4},
                 run={"steps": 30, "checkpoint_every": 8})
    full = run(cfg, out=tmp_path / "full", quiet=True)
    original = local_sgd.LocalSteps.__call__

    def killed(self, setup, params, opt_state, step, *args, **kwargs):
        if step == 19:                    # mid-period (16..19), after the checkpoint at step 16
            raise KeyboardInterrupt
        return original(self, setup, params, opt_state, step, *args, **kwargs)

    monkeypatch.setattr(local_sgd.LocalSteps, "__call__", killed)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, out=tmp_path / "killed", quiet=True)
    monkeypatch.setattr(local_sgd.LocalSteps, "__call__", original)
    assert [c.name for c in checkpoint.list_checkpoints(tmp_path / "killed" / "checkpoints")][-1] == "ckpt-00000016.tgck"
    again = run(cfg, out=tmp_path / "killed", resume=True, quiet=True)
    assert again.start_step == 16 and same_bits(again.params, full.params)
    import pandas as pd

    m = pd.read_csv(tmp_path / "killed" / "metrics.csv")
    assert list(m[(m.split == "train") & (m.layer == "model")].step) == list(range(1, 31))


def test_nonfinite_local_gradient_raises_or_is_dropped_on_every_worker(monkeypatch):
    cfg = config(exchange={"local": "pqasgd", "every": 4}, run={"steps": 8})
    orig = type(build(cfg).model).loss_and_grad

    def poisoned(self, p, x, y):
        loss, grads = orig(self, p, x, y)
        if x.shape[0] == 1 and float(x[0, 0, 0]) == poison["x"]:     # worker 2's batch of step 5
            grads["linear.w"][0, 0] = np.nan
        return loss, grads

    setup = build(cfg)
    idx = batch_indices(setup.shards[2], cfg.workers.per_worker_batch, cfg.run.seed, 5, 2)
    poison = {"x": float(setup.dataset.x_train[idx][0, 0])}
    monkeypatch.setattr(type(setup.model), "loss_and_grad", poisoned)
    with pytest.raises(NonFiniteGradientError, match="linear.w.*worker 2, step 5"):
        train(cfg)
    res = train(config(exchange={"local": "pqasgd", "every": 4}, run={"steps": 8, "on_nonfinite": "skip"}))
    assert res.skipped == 1 and all(np.isfinite(v).all() for v in res.params.values())


BAD = [
    ({"exchange": {"local": "pqasgd", "every": 0}}, "every must be >= 1"),
    ({"exchange": {"local": "gossip"}}, "local must be one of"),
    ({"exchange": {"every": 4}}, "needs local = 'average'"),
    ({"codec": {"name": "terngrad"}, "exchange": {"mode": "ps", "local": "average", "every": 4}},
     "would not be used"),
    ({"exchange": {"local": "pqasgd", "every": 4}, "run": {"checkpoint_every": 10}}, "sync steps only"),
    ({"exchange": {"local": "average", "every": 2}, "optimizer": {"name": "adam"}}, "not an SGD learning rate"),
    ({"exchange": {"local": "average", "every": 2}, "optimizer": {"weight_decay": 1e-4}}, "model.options.l2"),
]
if "error_feedback" in {f.name for f in dataclasses.fields(CodecConfig)}:
    BAD.append(({"codec": {"name": "terngrad", "error_feedback": True},
                 "exchange": {"mode": "ps", "local": "pqasgd", "every": 2}}, "per-worker codec state"))


@pytest.mark.parametrize("bad, match", BAD, ids=[m for _, m in BAD])
def test_impossible_combinations_are_config_errors(bad, match):
    with pytest.raises(ConfigError, match=match):
        config(**bad)


def test_possible_combinations_pass():
    config(exchange={"local": "pqasgd", "every": 1}, optimizer={"name": "adam", "weight_decay": 1e-4})
    config(exchange={"local": "average", "every": 4}, run={"checkpoint_every": 8})
    assert not local_sgd.enabled(config()) and local_sgd.enabled(config(exchange={"local": "average"}))
