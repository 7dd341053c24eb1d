"""`tgsim analyze bound`: Assumption 3 (gradient bound) measured along SGD trajectories.

Standard SGD needs E||g||^2 <= A + B ||w - w*||^2; TernGrad needs the stronger
E||Q(g)||^2 = E[s ||g||_1] <= A + B ||w - w*||^2 (s = ||g||_inf without clipping).

Least squares with a known w* (``Setup.optimum``), several seeds, trained with fp32 and with
TernGrad (Robbins-Monro steps, so the trajectories sweep ||w - w*||^2 from its initial value down
to the noise floor). Before every step, for every worker i and layer (linear.w, linear.b) and for
the whole model, the per-worker mini-batch gradient g_i gives one point (x, y) with
x = ||w - w*||^2 and y one of

    l2sq               ||g_i||^2                                   (the SGD bound)
    terngrad_none      E||Q(g_i)||^2 = ||g_i||_inf ||g_i||_1         (TernGrad, own scaler)
    terngrad_explicit  s Σ min(|g_ik|, cσ), s = max min(|g_ik|, cσ)  (the paper's clipping)
    terngrad_implicit  s Σ min(|g_ik|, s),  s = cσ                   (the public code's)
    terngrad_shared    s_max ||g_i||_1, s_max = max over workers of ||g_j||_inf (scaler sharing)

(all computed with the codec's scaler rule, ``common.terngrad_second_moment``). For the whole
model, ``model[layerwise]`` sums the per-layer values (one scaler per layer) and ``model[global]``
uses one scaler for all parameters. Each point is one realisation, so an envelope above all points
bounds the expectation too.

Envelope fit (``fit_envelope``): the linear program

    minimise  A + B·x_c   s.t.  A + B x_i >= y_i for all i,  A, B >= 0,

i.e. the envelope with the smallest mean value over the observed range [x_min, x_max] of
||w - w*||^2, *each decade weighted equally* (objective "log_range", the default):
x_c = (x_max - x_min) / ln(x_max / x_min), the logarithmic mean, is the mean of x under the
log-uniform weight on the range. Trajectories sweep ||w - w*||^2 over many decades and spend most
steps near the floor: a uniform weight on [x_min, x_max] ("range", x_c = midpoint) is dominated by
the few first steps and returns the useless B = 0, A = max y; the mean over the points ("points",
x_c = mean x_i) nearly ignores the steps far from w*. Only the points on the upper hull of the Pareto set can be active, so the LP runs
on those; the fit is then verified on every point (``envelope_violations``) and A is raised by any
rounding-level violation, so the returned envelope lies above every point. Also reported: the two
extreme envelopes A0 = max y (B = 0) and B0 = max y/x (A = 0).

Non-convex models: an MLP on digits, per layer, the ratio E||Q(g)||^2 / ||g||^2
(= ||g||_inf ||g||_1 / ||g||_2^2 without clipping, in [1, sqrt(n)]) over training, with and without
clipping, layer-wise and global (``mlp_ratios``). ``model`` = "package.module:function" measures a
torch.nn.Module built by that factory instead (its layers: the module's parameter names), on the
data set ``data`` (``common.network_section``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import linprog

from tgsim.analysis.common import (FP32, TERNGRAD, least_squares_config, mlp_digits_config, network_label,
                                   single_thread, terngrad_second_moment, trajectory, write_csv)

QUANTITIES = ("l2sq", "terngrad_none", "terngrad_explicit", "terngrad_implicit", "terngrad_shared")


# ---------------------------------------------------------------------------------------------
# the envelope LP
# ---------------------------------------------------------------------------------------------
def _candidate_points(x, y):
    """Indices of the points that can be active: Pareto set (no point with smaller x and larger y)
    and, of those, the upper convex hull."""
    order = np.lexsort((-y, x))              # by x ascending, larger y first among ties
    xs, ys = x[order], y[order]
    run = np.maximum.accumulate(ys)
    keep = np.ones(xs.size, dtype=bool)
    keep[1:] = ys[1:] > run[:-1]             # strictly above every point with smaller or equal x
    idx = order[keep]
    px, py = x[idx], y[idx]
    hull: list[int] = []                     # upper hull, monotone chain (x ascending)
    for j in range(px.size):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            cross = (px[b] - px[a]) * (py[j] - py[a]) - (py[b] - py[a]) * (px[j] - px[a])
            if cross >= 0:
                hull.pop()
            else:
                break
        hull.append(j)
    return idx[np.array(hull, dtype=np.int64)]


def envelope_violations(A: float, B: float, x, y, rtol: float = 1e-12) -> int:
    """Number of points strictly above the envelope A + B x (beyond a relative rounding tolerance)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    env = A + B * x
    return int(np.sum(y > env * (1 + rtol) + 1e-300))


def objective_point(x, objective: str = "log_range") -> float:
    """x_c of the LP objective A + B x_c (see module docstring)."""
    x = np.asarray(x, dtype=np.float64)
    lo, hi = float(x.min()), float(x.max())
    if objective == "range":
        return 0.5 * (lo + hi)
    if objective == "points":
        return float(x.mean())
    if objective == "log_range":
        if lo > 0 and hi > lo:
            return (hi - lo) / np.log(hi / lo)
        return float(x.mean()) if lo <= 0 and hi > 0 else hi
    raise ValueError(f"unknown objective {objective!r}: log_range | range | points")


def fit_envelope(x, y, objective: str = "log_range") -> dict:
    """Smallest envelope A + B x >= y (see module docstring); dict with A, B and diagnostics."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.size == 0:
        raise ValueError("no points")
    if np.any(x < 0) or np.any(y < 0):
        raise ValueError("x and y must be >= 0")
    x_mid = objective_point(x, objective)
    cand = _candidate_points(x, y)
    cx, cy = x[cand], y[cand]
    xs = max(float(cx.max()), 1e-300)
    ys = max(float(cy.max()), 1e-300)
    res = linprog(c=[1.0, x_mid / xs], A_ub=-np.column_stack([np.ones(cx.size), cx / xs]), b_ub=-cy / ys,
                  bounds=[(0, None), (0, None)], method="highs")
    if res.status != 0:
        raise RuntimeError(f"envelope LP failed: {res.message}")
    A, B = float(res.x[0]) * ys, float(res.x[1]) * ys / xs
    slack = float(np.max(y - (A + B * x)))
    if slack > 0:   # rounding of the scaled LP: lift the envelope onto the highest point
        A += slack * (1 + 1e-12)
    pos = x > 0
    return dict(A=A, B=B, x_mid=x_mid, objective=A + B * x_mid, n_points=int(x.size),
                n_candidates=int(cand.size), x_min=float(x.min()), x_max=float(x.max()),
                violations=envelope_violations(A, B, x, y),
                A0=float(y.max()), B0=float(np.max(y[pos] / x[pos])) if pos.any() else float("nan"))


# ---------------------------------------------------------------------------------------------
# points along least-squares trajectories
# ---------------------------------------------------------------------------------------------
def _layer_quantities(g: np.ndarray, clip_factor: float) -> dict[str, np.ndarray]:
    """Per-worker (rows) values of every quantity for one layer (or a concatenation)."""
    g64 = g.astype(np.float64)
    s_own = np.abs(g64).max(axis=1)
    return {
        "l2sq": np.einsum("ij,ij->i", g64, g64),
        "terngrad_none": terngrad_second_moment(g, "none"),
        "terngrad_explicit": terngrad_second_moment(g, "explicit", clip_factor),
        "terngrad_implicit": terngrad_second_moment(g, "implicit", clip_factor),
        "terngrad_shared": s_own.max() * np.abs(g64).sum(axis=1),
    }


def step_points(grads: dict, clip_factor: float = 2.5) -> list[dict]:
    """Rows {layer, worker, quantities...} of one step's per-worker gradients (worker axis first)."""
    names = list(grads)
    flat = {k: np.asarray(v, dtype=np.float32).reshape(v.shape[0], -1) for k, v in grads.items()}
    n_w = flat[names[0]].shape[0]
    per = {k: _layer_quantities(flat[k], clip_factor) for k in names}
    glob = _layer_quantities(np.concatenate([flat[k] for k in names], axis=1), clip_factor)
    rows = []
    for i in range(n_w):
        for k in names:
            rows.append(dict(layer=k, worker=i, **{q: float(per[k][q][i]) for q in QUANTITIES}))
        rows.append(dict(layer="model[layerwise]", worker=i,
                         **{q: float(sum(per[k][q][i] for k in names)) for q in QUANTITIES}))
        rows.append(dict(layer="model[global]", worker=i, **{q: float(glob[q][i]) for q in QUANTITIES}))
    return rows


def squared_distance(params: dict, optimum: dict) -> float:
    return float(sum(np.sum((np.asarray(params[k], np.float64) - v) ** 2) for k, v in optimum.items()))


def least_squares_points(seeds=(0, 1, 2, 3), codecs=(FP32, TERNGRAD), steps: int = 800,
                         every: int = 1, lr: float = 0.3, tau: float = 50.0, clip_factor: float = 2.5,
                         **problem) -> pd.DataFrame:
    """Tidy points: seed, train_codec, step, dist2, layer, worker, one column per quantity."""
    rows = []
    for seed in seeds:
        for codec in codecs:
            cfg = least_squares_config(seed, codec=codec, clip="none", steps=steps, lr=lr,
                                       schedule="robbins_monro", tau=tau, **problem)

            def rec(t, setup, params, grads, seed=seed, codec=codec):
                if t % every:
                    return
                d2 = squared_distance(params, setup.optimum)
                for r in step_points(grads, clip_factor):
                    rows.append(dict(seed=seed, train_codec=codec, step=t, dist2=d2, **r))

            trajectory(cfg, steps, rec)
    return pd.DataFrame(rows)


def fit_table(points: pd.DataFrame, by=("layer",)) -> pd.DataFrame:
    """One envelope per (group, quantity); gap columns relative to the SGD bound (l2sq)."""
    rows = []
    for key, grp in points.groupby(list(by), sort=False):
        key = key if isinstance(key, tuple) else (key,)
        x = grp["dist2"].to_numpy()
        fits = {q: fit_envelope(x, grp[q].to_numpy()) for q in QUANTITIES}
        for q in QUANTITIES:
            f = fits[q]
            ratio = grp[q].to_numpy() / grp["l2sq"].to_numpy()
            rows.append(dict(zip(by, key), quantity=q, A=f["A"], B=f["B"], A0=f["A0"], B0=f["B0"],
                             x_mid=f["x_mid"], mean_envelope=f["objective"], violations=f["violations"],
                             n_points=f["n_points"], n_candidates=f["n_candidates"],
                             A_over_sgd=f["A"] / fits["l2sq"]["A"] if fits["l2sq"]["A"] > 0 else np.nan,
                             B_over_sgd=f["B"] / fits["l2sq"]["B"] if fits["l2sq"]["B"] > 0 else np.nan,
                             mean_envelope_over_sgd=f["objective"] / fits["l2sq"]["objective"],
                             median_ratio_to_l2sq=float(np.median(ratio)), max_ratio_to_l2sq=float(np.max(ratio))))
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# non-convex: MLP on digits
# ---------------------------------------------------------------------------------------------
def mlp_ratios(seed: int = 0, steps: int = 300, every: int = 10, codec: str = TERNGRAD,
               clip: str = "explicit", clip_factor: float = 2.5, **kw) -> pd.DataFrame:
    """Per (step, layer, worker): E||Q(g)||^2 / ||g||^2 for clip none/explicit/implicit, and sqrt(n)."""
    cfg = mlp_digits_config(seed, codec=codec, clip=clip, steps=steps, **kw)
    rows = []

    def rec(t, setup, params, grads):
        if t % every:
            return
        n_el = {k: int(np.prod(v.shape[1:])) for k, v in grads.items()}
        n_el["model[layerwise]"] = n_el["model[global]"] = sum(n_el.values())
        for r in step_points(grads, clip_factor):
            l2 = r["l2sq"]
            rows.append(dict(step=t, layer=r["layer"], worker=r["worker"], n=n_el[r["layer"]], l2sq=l2,
                             ratio_none=r["terngrad_none"] / l2, ratio_explicit=r["terngrad_explicit"] / l2,
                             ratio_implicit=r["terngrad_implicit"] / l2, ratio_shared=r["terngrad_shared"] / l2,
                             sqrt_n=float(np.sqrt(n_el[r["layer"]]))))

    trajectory(cfg, steps, rec)
    return pd.DataFrame(rows)


def run(out=None, *, seeds=(0, 1, 2, 3), steps: int = 800, mlp_steps: int = 300, quiet: bool = False,
        model: str | None = None, data: str = "digits", **problem) -> dict[str, pd.DataFrame]:
    """Write bound_points, bound_fits (least squares) and bound_mlp, bound_mlp_summary (the per-layer
    ratios of the network: tgsim's MLP, or the torch factory `model`, on `data`) to `out`."""
    with single_thread():
        pts = least_squares_points(seeds, steps=steps, **problem)
        fits = fit_table(pts, by=("layer",))
        fits_codec = fit_table(pts, by=("train_codec", "layer"))
        mlp = mlp_ratios(steps=mlp_steps, model=model, data=data)
    fits_all = pd.concat([fits.assign(train_codec="pooled"), fits_codec], ignore_index=True)
    mlp_summary = (mlp.assign(phase=np.where(mlp["step"] < mlp_steps / 2, "first half", "second half"))
                   .groupby(["layer", "phase"])
                   .agg(n=("n", "first"), sqrt_n=("sqrt_n", "first"), ratio_none=("ratio_none", "median"),
                        ratio_explicit=("ratio_explicit", "median"), ratio_implicit=("ratio_implicit", "median"),
                        ratio_shared=("ratio_shared", "median"), ratio_none_max=("ratio_none", "max"))
                   .reset_index())
    write_csv(pts, out, "bound_points")
    write_csv(fits_all, out, "bound_fits")
    write_csv(mlp, out, "bound_mlp")
    write_csv(mlp_summary, out, "bound_mlp_summary")
    if not quiet:
        print(f"least squares, {len(seeds)} seeds x (fp32, terngrad), {steps} Robbins-Monro steps, "
              f"{pts['worker'].nunique()} workers: {len(pts) // pts['layer'].nunique()} points per layer")
        print("envelopes A + B||w-w*||^2 above every point (LP: minimal mean over the observed range):")
        show = fits[["layer", "quantity", "A", "B", "A_over_sgd", "B_over_sgd", "mean_envelope_over_sgd",
                     "median_ratio_to_l2sq", "violations"]]
        print(show.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print(f"\n{network_label(model, data)} (TernGrad, explicit clipping), median E||Q||^2/||g||^2 per layer:")
        print(mlp_summary.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return {"bound_points": pts, "bound_fits": fits_all, "bound_mlp": mlp, "bound_mlp_summary": mlp_summary}
