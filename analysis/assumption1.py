"""`tgsim analyze assumption1`: the sign of (w - w*)^T ∇C(w) along trajectories (Assumption 1).

Assumption 1 of TernGrad's Theorem 1: C has a single minimum w* and, for every ε > 0,
inf over ||w - w*||^2 > ε of (w - w*)^T ∇C(w) > 0. Along SGD trajectories we record, with the
*full-batch* gradient ∇C(w) of the training objective (computed in float64):

    inner       = (w - w*)^T ∇C(w)
    normalized  = inner / ||w - w*||^2      (for least squares = a Rayleigh quotient of the Hessian
                                             H, so >= λ_min(H) > 0: a sharp, checkable claim)
    cosine      = inner / (||w - w*|| ||∇C(w)||)

per step, and summarise per run: fraction of steps with inner > 0, min normalized, min cosine.

Problems
* least squares (convex, w* from the normal equations), trained with fp32 and TernGrad;
* control: the non-convex toy C(w) = Σ_k w_k^2/20 + 1 - cos(w_k). Its unique global minimum is
  w* = 0 (C >= 0, = 0 only there), but for |w_k| in (3.50, 5.68) the derivative w/10 + sin(w) has
  the wrong sign, and a gradient-descent trajectory started there slides into the local minimum at
  |w_k| = 5.68 (the roots of w/10 + sin w = 0): Assumption 1 fails, and the check must see inner < 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tgsim.analysis.common import FP32, TERNGRAD, least_squares_config, single_thread, trajectory, write_csv


def _row(problem, seed, codec, t, d, grad):
    d2 = float(d @ d)
    inner = float(d @ grad)
    gn = float(np.linalg.norm(grad))
    return dict(problem=problem, seed=seed, train_codec=codec, step=t, dist2=d2, inner=inner,
                normalized=inner / d2 if d2 > 0 else np.nan,
                cosine=inner / (np.sqrt(d2) * gn) if d2 > 0 and gn > 0 else np.nan)


def least_squares_inner(seeds=(0, 1, 2), codecs=(FP32, TERNGRAD), steps: int = 400, lr: float = 0.3,
                        tau: float = 50.0, every: int = 1, **problem) -> tuple[pd.DataFrame, dict]:
    """Rows per (seed, codec, step); and {seed: λ_min(H)} of the full-data Hessian."""
    rows, lam = [], {}
    for seed in seeds:
        for codec in codecs:
            cfg = least_squares_config(seed, codec=codec, steps=steps, lr=lr, schedule="robbins_monro",
                                       tau=tau, **problem)

            def rec(t, setup, params, grads, seed=seed, codec=codec):
                if t % every:
                    return
                ds = setup.dataset
                p64 = {k: np.asarray(v, np.float64) for k, v in params.items()}
                _, g = setup.model.loss_and_grad(p64, ds.x_train.astype(np.float64)[None],
                                                 ds.y_train.astype(np.float64)[None])
                names = list(setup.optimum)
                d = np.concatenate([(p64[k] - setup.optimum[k]).reshape(-1) for k in names])
                grad = np.concatenate([g[k][0].reshape(-1) for k in names])
                rows.append(_row("least_squares", seed, codec, t, d, grad))
                if seed not in lam:
                    x = ds.x_train.astype(np.float64)
                    if "linear.b" in names:
                        x = np.column_stack([x, np.ones(len(x))])
                    h = x.T @ x / len(x) + np.diag([setup.model.l2] * ds.x_train.shape[1] +
                                                   [0.0] * (x.shape[1] - ds.x_train.shape[1]))
                    lam[seed] = float(np.linalg.eigvalsh(h)[0])

            trajectory(cfg, steps, rec, need_grads=False)
    return pd.DataFrame(rows), lam


def toy_grad(w):
    return w / 10.0 + np.sin(w)


def toy_cost(w):
    return float(np.sum(w * w / 20.0 + 1.0 - np.cos(w)))


def toy_inner(w0=(4.0, 4.5, -4.2, 5.0), steps: int = 200, lr: float = 0.2, noise: float = 0.05,
              seed: int = 0) -> pd.DataFrame:
    """SGD on the non-convex toy (Gaussian gradient noise of std `noise`), from w0; w* = 0."""
    rng = np.random.default_rng([seed, 0xA551])
    w = np.asarray(w0, dtype=np.float64).copy()
    rows = []
    for t in range(steps + 1):
        rows.append(_row("toy_nonconvex", seed, "sgd", t, w.copy(), toy_grad(w)))
        w = w - lr * (toy_grad(w) + noise * rng.standard_normal(w.size))
    return pd.DataFrame(rows)


def summarize(df: pd.DataFrame, lam: dict | None = None) -> pd.DataFrame:
    out = (df.groupby(["problem", "seed", "train_codec"])
           .agg(steps=("step", "size"), fraction_positive=("inner", lambda v: float(np.mean(v > 0))),
                min_inner=("inner", "min"), min_normalized=("normalized", "min"),
                min_cosine=("cosine", "min"), final_dist2=("dist2", "last"))
           .reset_index())
    lam = lam or {}
    out["lambda_min_H"] = [lam.get(s, np.nan) if p == "least_squares" else np.nan
                           for p, s in zip(out["problem"], out["seed"])]
    out["assumption1_holds"] = out["fraction_positive"] == 1.0
    return out


def run(out=None, *, seeds=(0, 1, 2), steps: int = 400, toy_steps: int = 200, quiet: bool = False,
        **problem) -> dict[str, pd.DataFrame]:
    with single_thread():
        ls, lam = least_squares_inner(seeds, steps=steps, **problem)
    toy = pd.concat([toy_inner(steps=toy_steps, seed=s) for s in seeds], ignore_index=True)
    df = pd.concat([ls, toy], ignore_index=True)
    summ = summarize(df, lam)
    write_csv(df, out, "assumption1")
    write_csv(summ, out, "assumption1_summary")
    if not quiet:
        print("(w - w*)^T ∇C(w) along trajectories (full-batch gradient, float64):")
        print(summ.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return {"assumption1": df, "assumption1_summary": summ}
