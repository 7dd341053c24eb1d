"""`tgsim analyze convergence`: Robbins-Monro steps converge, constant steps stall at a noise floor.

Problem: strongly convex least squares WITH label noise (the mini-batch gradient does not vanish at
w*), small (dim 16 + intercept, condition number 4), N = 4 workers x 8 samples, plain SGD, through
the real trainer. The default training set (n = 65536) is larger than the T·N·B samples a run
draws, so every sample is fresh: the i.i.d. stochastic-approximation setting of the theorem. With a
small n the trainer's epoch permutations (random reshuffling) make the fp32 gradient noise cancel
over each epoch, and fp32 converges faster than 1/t (slope ≈ -1.8 measured with n = 1024) and
sits below the i.i.d. floor; the quantizer's noise is i.i.d. whatever n is. Runs go through ``tgsim.train.loop.build`` + ``train_step``. Each seed is its own run (its own
data set, w*, initialisation, batches and codec keys).

Robbins-Monro (``rm``): γ_t = γ0 / (1 + t/τ), >= 20 seeds, fp32 and TernGrad (no clipping). Reported:
* the fraction of runs with relative distance ||w_T - w*|| / ||w*|| < ε at T;
* the decay exponent of E||w_t - w*||^2 (mean over seeds): least-squares slope of
  log E||w_t - w*||^2 on log t over the tail t in [T/10, T] ("slope_vs_t"), and on log(t + τ)
  ("slope_vs_t_plus_tau", since γ_t ∝ 1/(t + τ)); a seed bootstrap gives a 95 % interval. For
  γ0 τ λ_min(H) > 1/2 the theory for SGD on a strongly convex quadratic gives E||w_t - w*||^2 ~ 1/t,
  i.e. slope -1 (the defaults have γ0 τ λ_min ≈ 6).

Constant steps (``floor``): γ in a few values, fp32 and TernGrad; the floor is the mean of
||w - w*||^2 over the last half of training and over seeds. Compared with
* the noise at w* (Monte Carlo over many mini-batches at w* exactly): the fp32 mini-batch variance
  V_fp32 = E||ĝ - ∇C(w*)||^2 of the averaged gradient ĝ, and the quantizer's variance
  s||g_i||_1 - ||g_i||^2 per worker (with the MAX-shared scaler s, as trained; and with the own
  scaler), which adds V_q = (1/N^2) Σ_i E[s||g_i||_1 - ||g_i||^2] to the averaged gradient;
* the floor predicted by the linearised recursion e_{t+1} = (I - γH) e_t - γ ξ_t with noise
  covariance Σ = Σ_fp32 + Σ_q measured at w*: the stationary covariance P solves the discrete
  Lyapunov equation P = (I - γH) P (I - γH)^T + γ^2 Σ, floor_pred = tr P (≈ γ tr(H^{-1} Σ)/2 for
  small γ). The noise of least squares grows with ||w - w*|| (multiplicative noise), so the
  prediction is a lower-order approximation; ``floor_over_pred`` says how close it is.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.linalg import solve_discrete_lyapunov

from tgsim.analysis.bound import squared_distance
from tgsim.analysis.common import FP32, TERNGRAD, least_squares_config, single_thread, trajectory, write_csv

EPS = (0.05, 0.02, 0.01, 0.005)


def _run_distances(cfg, steps: int):
    out = np.empty(steps + 1)
    info = {}

    def rec(t, setup, params, grads):
        out[t] = squared_distance(params, setup.optimum)
        info["setup"] = setup

    trajectory(cfg, steps, rec, need_grads=False)
    setup = info["setup"]
    norm2 = float(sum(np.sum(v * v) for v in setup.optimum.values()))
    return out, norm2, setup


def rm_runs(seeds=range(20), codecs=(FP32, TERNGRAD), steps: int = 2000, lr: float = 0.5,
            tau: float = 50.0, **problem) -> pd.DataFrame:
    """||w_t - w*||^2 for t = 0..T per (codec, seed) under Robbins-Monro steps (long format)."""
    rows = []
    for codec in codecs:
        for seed in seeds:
            cfg = least_squares_config(seed, codec=codec, clip="none", steps=steps, lr=lr,
                                       schedule="robbins_monro", tau=tau, **problem)
            d, norm2, _ = _run_distances(cfg, steps)
            rows.append(pd.DataFrame(dict(schedule="robbins_monro", lr=lr, tau=tau, codec=codec, seed=seed,
                                          step=np.arange(steps + 1), dist2=d, opt_norm2=norm2)))
    return pd.concat(rows, ignore_index=True)


def decay_exponent(df: pd.DataFrame, tau: float, tail: float = 0.1, n_boot: int = 200,
                   seed: int = 0) -> dict:
    """Tail slopes of log E||w_t - w*||^2 (mean over seeds) on log t and on log(t + τ), with a
    95 % seed-bootstrap interval of the first."""
    T = int(df["step"].max())
    piv = df.pivot(index="step", columns="seed", values="dist2")
    t = piv.index.to_numpy().astype(np.float64)
    sel = t >= max(1.0, tail * T)
    mat = piv.to_numpy()[sel]
    tt = t[sel]

    def slopes(m):
        y = np.log(m.mean(axis=1))
        return (float(np.polyfit(np.log(tt), y, 1)[0]), float(np.polyfit(np.log(tt + tau), y, 1)[0]))

    s_t, s_tt = slopes(mat)
    rng = np.random.default_rng(seed)
    boot = [slopes(mat[:, rng.integers(0, mat.shape[1], mat.shape[1])])[0] for _ in range(n_boot)]
    lo, hi = np.quantile(boot, [0.025, 0.975]) if n_boot else (np.nan, np.nan)
    return dict(slope_vs_t=s_t, slope_vs_t_plus_tau=s_tt, slope_ci_low=float(lo), slope_ci_high=float(hi),
                tail_from=int(tt[0]), tail_to=int(tt[-1]))


def noise_at_optimum(setup, n_batches: int = 400) -> dict:
    """Σ_fp32, Σ_q (diagonal, MAX-shared scaler) and scalar variances at w*, over n_batches steps."""
    from tgsim.train.loop import local_batch

    names = list(setup.optimum)
    p64 = {k: np.asarray(v, np.float64) for k, v in setup.optimum.items()}
    n_w = setup.cfg.workers.n
    dim = sum(v.size for v in p64.values())
    s_fp = np.zeros((dim, dim))
    q_diag = np.zeros(dim)
    q_shared = q_own = 0.0
    for t in range(n_batches):
        x, y = local_batch(setup, t)
        _, g = setup.model.loss_and_grad(p64, x.astype(np.float64), y.astype(np.float64))
        # float32 gradients, as the codec sees them
        layers = {k: g[k].astype(np.float32).astype(np.float64).reshape(n_w, -1) for k in names}
        gw = np.concatenate([layers[k] for k in names], axis=1)            # (N, dim)
        gbar = gw.mean(axis=0)
        s_fp += np.outer(gbar, gbar)
        off = 0
        for k in names:
            a = np.abs(layers[k])
            s_loc = a.max(axis=1)                                           # own scalers
            s_sh = s_loc.max()
            q_diag[off:off + a.shape[1]] += (a * (s_sh - a)).sum(axis=0) / n_w**2
            q_shared += float(np.sum(s_sh * a.sum(axis=1) - (a * a).sum(axis=1))) / n_w
            q_own += float(np.sum(s_loc * a.sum(axis=1) - (a * a).sum(axis=1))) / n_w
            off += a.shape[1]
    s_fp /= n_batches
    q_diag /= n_batches
    ds = setup.dataset
    xh = ds.x_train.astype(np.float64)
    if "linear.b" in names:
        xh = np.column_stack([xh, np.ones(len(xh))])
    h = xh.T @ xh / len(xh)
    if setup.model.l2:
        h += np.diag([setup.model.l2] * ds.x_train.shape[1] + [0.0] * (xh.shape[1] - ds.x_train.shape[1]))
    return dict(sigma_fp32=s_fp, sigma_q=np.diag(q_diag), hessian=h, V_fp32=float(np.trace(s_fp)),
                V_q=float(q_diag.sum()), quantizer_var_per_worker_shared=q_shared / n_batches,
                quantizer_var_per_worker_own=q_own / n_batches, lambda_min=float(np.linalg.eigvalsh(h)[0]))


def predicted_floor(hessian, sigma, lr: float) -> float:
    """tr P, P = (I - γH) P (I - γH)^T + γ^2 Σ (stationary covariance of the linearised recursion)."""
    a = np.eye(hessian.shape[0]) - lr * hessian
    return float(np.trace(solve_discrete_lyapunov(a, lr * lr * sigma)))


def floor_runs(seeds=range(4), codecs=(FP32, TERNGRAD), lrs=(0.05, 0.1, 0.2), steps: int = 2000,
               last: float = 0.5, n_batches: int = 400, **problem) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-run floors with predictions, per-step traces)."""
    rows, traces, noise = [], [], {}
    for codec in codecs:
        for lr in lrs:
            for seed in seeds:
                cfg = least_squares_config(seed, codec=codec, clip="none", steps=steps, lr=lr,
                                           schedule="constant", **problem)
                d, norm2, setup = _run_distances(cfg, steps)
                if seed not in noise:
                    noise[seed] = noise_at_optimum(setup, n_batches)
                nz = noise[seed]
                sigma = nz["sigma_fp32"] + (nz["sigma_q"] if codec == TERNGRAD else 0.0)
                start = int(round((1 - last) * steps))
                rows.append(dict(codec=codec, lr=lr, seed=seed, steps=steps, floor=float(d[start:].mean()),
                                 floor_pred=predicted_floor(nz["hessian"], sigma, lr), opt_norm2=norm2,
                                 V_fp32=nz["V_fp32"], V_q=nz["V_q"] if codec == TERNGRAD else 0.0,
                                 quantizer_var_per_worker_shared=nz["quantizer_var_per_worker_shared"],
                                 quantizer_var_per_worker_own=nz["quantizer_var_per_worker_own"],
                                 lambda_min=nz["lambda_min"], final_dist2=float(d[-1])))
                traces.append(pd.DataFrame(dict(schedule="constant", lr=lr, codec=codec, seed=seed,
                                                step=np.arange(steps + 1), dist2=d, opt_norm2=norm2)))
    return pd.DataFrame(rows), pd.concat(traces, ignore_index=True)


def _below(rel, eps) -> dict:
    return {f"below_eps_{e:g}": float(np.mean(np.asarray(rel) < e)) for e in eps}


def summarize(rm: pd.DataFrame, floors: pd.DataFrame, eps=EPS, tau: float = 50.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(RM summary per codec, constant-step floors per (codec, lr)); ``below_eps_E`` = fraction of
    runs with ||w_T - w*|| / ||w*|| < E at the last step."""
    eps = tuple(np.atleast_1d(eps))
    T = int(rm["step"].max())
    rm_rows = []
    for codec, grp in rm.groupby("codec", sort=False):
        end = grp[grp["step"] == T]
        rel = np.sqrt(end["dist2"] / end["opt_norm2"])
        rm_rows.append(dict(codec=codec, seeds=int(end["seed"].nunique()), T=T, lr0=float(grp["lr"].iloc[0]),
                            tau=tau, **_below(rel, eps), mean_final_dist2=float(end["dist2"].mean()),
                            median_final_rel=float(np.median(rel)), max_final_rel=float(rel.max()),
                            **decay_exponent(grp, tau)))
    fl = (floors.groupby(["codec", "lr"], sort=False)
          .agg(seeds=("seed", "size"), floor=("floor", "mean"), floor_se=("floor", lambda v: v.std(ddof=1) / np.sqrt(len(v))),
               floor_pred=("floor_pred", "mean"), V_fp32=("V_fp32", "mean"), V_q=("V_q", "mean"),
               quantizer_var_per_worker_shared=("quantizer_var_per_worker_shared", "mean"),
               quantizer_var_per_worker_own=("quantizer_var_per_worker_own", "mean"),
               final_dist2=("final_dist2", "mean"))
          .reset_index())
    fl["floor_over_pred"] = fl["floor"] / fl["floor_pred"]
    fl["floor_over_lr_V"] = fl["floor"] / (fl["lr"] * (fl["V_fp32"] + fl["V_q"]))
    fp = fl[fl["codec"] == FP32].set_index("lr")["floor"]
    fl["floor_over_fp32"] = [f / fp.get(lr, np.nan) for f, lr in zip(fl["floor"], fl["lr"])]
    below = []
    for c, lr in zip(fl["codec"], fl["lr"]):
        f = floors[(floors["codec"] == c) & (floors["lr"] == lr)]
        below.append(_below(np.sqrt(f["final_dist2"] / f["opt_norm2"]), eps))
    fl = pd.concat([fl, pd.DataFrame(below)], axis=1)
    return pd.DataFrame(rm_rows), fl


def run(out=None, *, seeds: int = 20, floor_seeds: int = 4, steps: int = 2000, lr: float = 0.5,
        tau: float = 50.0, lrs=(0.05, 0.1, 0.2), eps=EPS, n: int = 65536, quiet: bool = False,
        **problem) -> dict[str, pd.DataFrame]:
    problem["n"] = n
    with single_thread():
        rm = rm_runs(range(seeds), steps=steps, lr=lr, tau=tau, **problem)
        floors, traces = floor_runs(range(floor_seeds), lrs=lrs, steps=steps, **problem)
    rm_sum, fl_sum = summarize(rm, floors, eps, tau)
    # traces: keep every step of the RM mean and the constant-step means (tidy, small)
    mean_traces = (pd.concat([rm, traces], ignore_index=True)
                   .groupby(["schedule", "codec", "lr", "step"], sort=False)["dist2"].mean().reset_index())
    write_csv(rm, out, "convergence_rm_runs")
    write_csv(mean_traces, out, "convergence_traces")
    write_csv(rm_sum, out, "convergence_rm")
    write_csv(floors, out, "convergence_floor_runs")
    write_csv(fl_sum, out, "convergence_floor")
    if not quiet:
        print(f"Robbins-Monro γ_t = {lr}/(1 + t/{tau}), {seeds} seeds, T = {steps}, n = {n} samples "
              f"(below_eps_E: fraction of runs with ||w_T-w*||/||w*|| < E):")
        print(rm_sum.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print(f"\nconstant steps, {floor_seeds} seeds, floor = mean ||w-w*||^2 over the last half:")
        print(fl_sum[["codec", "lr", "floor", "floor_se", "floor_pred", "floor_over_pred", "floor_over_fp32", "V_fp32",
                      "V_q", "quantizer_var_per_worker_shared", "quantizer_var_per_worker_own"]
                     + [c for c in fl_sum.columns if c.startswith("below_eps")]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return {"convergence_rm": rm_sum, "convergence_floor": fl_sum, "convergence_rm_runs": rm,
            "convergence_floor_runs": floors, "convergence_traces": mean_traces}
