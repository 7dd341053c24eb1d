"""End-to-end oracle for a whole training run: `tgsim.train.loop.run` on the built-in least-squares
task with the fp32 codec, against a plain NumPy float64 loop written here.

The loop recomputes, from the same data and the same per-worker batches, each worker's gradient of
its mean squared loss, the mean over the N workers and the optimizer step, with the formulas
written out below (nothing of tgsim's model, exchange, codec, optimizer or schedule is called). A
bit-equality test between two runs cannot see a bug both share (the learning rate applied twice, a
mean divided by N+1, a gradient of the wrong sign); this comparison does. The run is float32, so
final parameters are compared with rtol 1e-5.

Model (tgsim/models/linear.py LeastSquares): z = x·w + b, worker loss 1/(2B) Σ_b (z_b - y_b)²
(+ l2/2 ||w||², not on b), so  ∇_w = Xᵀr/B + l2 w,  ∇_b = Σr/B  with r = Xw + b - y.
"""

from __future__ import annotations

import numpy as np
import pytest

from tgsim.data import load, shard
from tgsim.data.batching import batch_indices
from tgsim.models import make_model
from tgsim.train.config import from_dict
from tgsim.train.loop import run

SEED = 5
DATA = {"name": "least_squares", "options": {"n": 48, "n_test": 16, "dim": 5, "noise": 0.1, "cond": 10.0}}


def _config(**sections):
    d = {
        "run": {"name": "oracle", "seed": SEED, "steps": 6, "eval_every": 0, "log_every": 1000},
        "data": DATA,
        "model": {"name": "least_squares"},
        "workers": {"n": 3, "batch": 16, "batch_mode": "per_worker"},
        "codec": {"name": "fp32"},
        "exchange": {"mode": "allreduce"},
        "optimizer": {"name": "sgd"},
        "schedule": {"name": "constant", "lr": 0.3},
    }
    for name, values in sections.items():
        d[name] = {**d[name], **values}
    return from_dict(d)


def _start(dim):
    """The data (float32, as the run sees it) and the run's initial parameters, in float64."""
    ds = load("least_squares", seed=SEED, **DATA["options"])
    p0 = make_model("least_squares", dim=dim).init(SEED)
    return ds, float64_params(p0)


def float64_params(p):
    return {k: np.asarray(v, dtype=np.float64) for k, v in p.items()}


def _worker_grad(w, b, x, y, l2=0.0):
    """∇ of 1/(2B) Σ (x·w + b - y)² + l2/2 ||w||², float64."""
    r = x @ w + b - y
    return x.T @ r / len(y) + l2 * w, np.array([r.sum() / len(y)])


def _assert_params_close(got, want):
    assert set(got) == set(want)
    scale = max(float(np.max(np.abs(v))) for v in want.values())
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k], dtype=np.float64), want[k], rtol=1e-5,
                                   atol=1e-6 * scale, err_msg=f"parameter {k}")


def test_fp32_sgd_run_equals_numpy_full_batch_gradient_descent(tmp_path):
    """3 workers, per-worker batch = shard size (48 samples / 3 iid shards of 16), fp32 codec, SGD
    γ = 0.3, 6 steps: every worker's batch is its whole shard (in some order), the shards are
    disjoint and cover the training set and have equal sizes, so the mean over workers of their
    mean-loss gradients is the full-data gradient Xᵀr/48, Σr/48. The run's final w, b equal
    6 steps of plain full-batch gradient descent w <- w - γ∇ computed here in float64 — without
    using tgsim's sharding or batching at all."""
    cfg = _config()
    res = run(cfg, out=tmp_path / "run", quiet=True)
    ds, p = _start(5)
    x, y = ds.x_train.astype(np.float64), ds.y_train.astype(np.float64)
    assert len(y) == 48
    w, b = p["linear.w"].copy(), p["linear.b"].copy()
    lr = 0.3
    for _ in range(cfg.run.steps):
        gw, gb = _worker_grad(w, b, x, y)       # = mean over the 3 workers of their shard gradients
        w, b = w - lr * gw, b - lr * gb
    # the run must have moved: an oracle that equals the start would prove nothing
    assert np.max(np.abs(w - p["linear.w"])) > 1e-2
    _assert_params_close(res.params, {"linear.w": w, "linear.b": b})


def test_minibatch_nesterov_poly_run_equals_numpy_loop(tmp_path):
    """4 workers with mini-batches of 4 (shards of 12: several batches per epoch), model L2 0.05,
    Nesterov momentum β = 0.8 with optimizer L2 decay λ = 0.01, poly schedule γ_t = 0.2 (1 - t/T)
    over T = 7 steps. tgsim's `shard` and `batch_indices` are used only to get the sample indices
    each worker used at each step; per-worker gradients, their mean over the 4 workers (Σ/4),
    g' = g + λw, v <- βv + g', w <- w - γ_t (g' + βv) and γ_t are all computed here in float64."""
    n_workers, batch, steps, lr0, beta, wd, l2 = 4, 4, 7, 0.2, 0.8, 0.01, 0.05
    cfg = _config(run={"steps": steps}, workers={"n": n_workers, "batch": batch},
                  model={"options": {"l2": l2}},
                  optimizer={"name": "nesterov", "momentum": beta, "weight_decay": wd},
                  schedule={"name": "poly", "lr": lr0, "power": 1.0, "end_lr": 0.0})
    res = run(cfg, out=tmp_path / "run", quiet=True)
    ds, p = _start(5)
    x, y = ds.x_train.astype(np.float64), ds.y_train.astype(np.float64)
    shards = shard(ds.y_train, n_workers, scheme="iid", seed=SEED)
    assert sorted(np.concatenate(shards).tolist()) == list(range(48))
    w, b = p["linear.w"].copy(), p["linear.b"].copy()
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    for t in range(steps):
        gws, gbs = [], []
        for k in range(n_workers):
            idx = batch_indices(shards[k], batch, SEED, t, k)
            gw, gb = _worker_grad(w, b, x[idx], y[idx], l2)
            gws.append(gw)
            gbs.append(gb)
        gw, gb = sum(gws) / n_workers, sum(gbs) / n_workers
        gw, gb = gw + wd * w, gb + wd * b               # optimizer L2 decay: every parameter
        vw, vb = beta * vw + gw, beta * vb + gb
        lr = lr0 * (1.0 - t / steps)
        w, b = w - lr * (gw + beta * vw), b - lr * (gb + beta * vb)
    assert np.max(np.abs(w - p["linear.w"])) > 1e-2
    _assert_params_close(res.params, {"linear.w": w, "linear.b": b})


@pytest.mark.parametrize("defect", ["lr_twice", "mean_over_n_plus_1", "wrong_sign"])
def test_oracle_rejects_planted_defects(tmp_path, defect):
    """Positive control for the comparison itself: the run's real parameters differ (by far more
    than the tolerance) from the oracle loop with each defect planted in the loop — γ² instead of
    γ, Σ/(N+1) instead of Σ/N, +∇ instead of -∇ — so the tests above would fail on such a run."""
    res = run(_config(), out=tmp_path / "run", quiet=True)
    ds, p = _start(5)
    x, y = ds.x_train.astype(np.float64), ds.y_train.astype(np.float64)
    w, b = p["linear.w"].copy(), p["linear.b"].copy()
    lr, n = 0.3, 3
    for _ in range(6):
        gw, gb = _worker_grad(w, b, x, y)
        if defect == "lr_twice":
            w, b = w - lr * lr * gw, b - lr * lr * gb
        elif defect == "mean_over_n_plus_1":
            w, b = w - lr * gw * n / (n + 1), b - lr * gb * n / (n + 1)
        else:
            w, b = w + lr * gw, b + lr * gb
    with pytest.raises(AssertionError):
        _assert_params_close(res.params, {"linear.w": w, "linear.b": b})
