"""Fit the emulation model (`perfmodel_emulation`) to `tgsim bench exchange` rows and validate it.

    p = calibrate(rows)                                  # EmuParams fitted on these rows (one topology)
    table = validate("results/bench_exchange.csv")       # every row: predicted vs measured

`calibrate` fits every free parameter, per topology, on a SEPARATE set of rows -- by default
every N = 2 row plus the smallest size at the largest N (N = 2 alone cannot tell how CPU time
grows with the rank count) -- and `validate` reports every other row (N = 4; N = 8 at the
larger sizes) against them. On a machine with fewer cores than 4 those rows are all
oversubscribed (`oversubscribed`: the ranks share cores, which no cluster does); the
`size-ends` calibration also holds out the middle size at N = 2 (one rank per core),
predicted from the smallest and largest; the `rank-ends` calibration fits every row at the
smallest and largest N (each size then gets its own contention exponents) and predicts the
middle N. Several sweeps of the same grid can be given: their per-row medians are validated and
`sweep_spread` says how far the sweeps differ per row. With the default rows the N x P
interaction of the CPU costs (16M arrays at N = 8 cost more per element than the fair-share
o-fold) is not visible and not modelled.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from tgsim.analysis.perfmodel_emulation import (CPU_ATTR, EmuParams, cpu_shape, encode_attr, predict_components,
                                                scalers_seconds, wire_bytes_model)

if TYPE_CHECKING:
    import pandas as pd

STEP_IN_NETWORK_FIT = True    # also fit the network to t_step (CPU costs held): the ps critical path is in no component
GAMMA_MIN = 1.0       # fair share: a CPU burst of N runnable ranks on C cores takes at least o times as long
_WIRE_FIT = ("eta", "cap", "kappa", "alpha", "alpha_os", "beta_sc", "cap_root", "nu", "q_exact", "duplex", "overlap")
_LINEAR = ("kappa", "gamma", "nu", "duplex", "overlap")   # fitted as they are; every other one through its logarithm
_BOUNDS = {"eta": (0.3, 1.2), "cap": (1e7, 1e11), "kappa": (-1.0, 1.0), "alpha": (1e-7, 0.05),
           "alpha_os": (1e-7, 0.1), "beta_sc": (1e-7, 0.1), "cap_root": (1e7, 1e11), "nu": (0.0, 2.0),
           "q_exact": (1e-13, 1e-7), "duplex": (0.0, 1.0), "overlap": (0.0, 1.0)}


KEY = ["topology", "rate", "ranks", "params", "mode"]


def combine_sweeps(measured) -> "pd.DataFrame":
    """One row per (topology, rate, N, P, mode) from several sweeps of `tgsim bench exchange` (paths
    or DataFrames): the median over sweeps of every numeric column, `sweeps` = how many sweeps had
    the row, and `sweep_spread` = max / min - 1 of its t_step over the sweeps (0 for one sweep):
    the run-to-run noise of that point on this machine, beside which a model error is judged."""
    import pandas as pd

    frames = [m.copy() if isinstance(m, pd.DataFrame) else pd.read_csv(m) for m in measured]
    for i, f in enumerate(frames):
        f["_sweep"] = i
    df = pd.concat(frames, ignore_index=True)
    num = [c for c in df.columns if c not in KEY and c != "_sweep" and pd.api.types.is_numeric_dtype(df[c])]
    g = df.groupby(KEY, sort=False)
    out = g[num].median()
    out["sweeps"] = g["_sweep"].nunique()
    out["sweep_spread"] = g["t_step"].max() / g["t_step"].min() - 1.0
    return out.reset_index()


def _load(measured):
    """One bench table (several sweeps: `combine_sweeps`) with ext_load, sweeps, sweep_spread and
    quick (True in every row when any sweep was written by `tgsim bench exchange --quick`)."""
    import pandas as pd

    from tgsim.bench.exchange import QUICK_COLUMN, is_quick

    if isinstance(measured, (list, tuple)):
        if len(measured) == 1:
            return _load(measured[0])
        frames = [m.copy() if isinstance(m, pd.DataFrame) else pd.read_csv(m) for m in measured]
        quick = any(is_quick(f) for f in frames)
        df = combine_sweeps([f.drop(columns=QUICK_COLUMN, errors="ignore") for f in frames])
    else:
        df = measured.copy() if isinstance(measured, pd.DataFrame) else pd.read_csv(measured)
        quick = is_quick(df)
    df[QUICK_COLUMN] = quick
    if "ext_load" not in df:
        df["ext_load"] = 0.0
    if "sweeps" not in df:
        df["sweeps"], df["sweep_spread"] = 1, 0.0
    return df


def _to_x(name: str, v: float) -> float:
    return v if name in _LINEAR else math.log(v)


def _from_x(name: str, x: float) -> float:
    return float(x) if name in _LINEAR else float(math.exp(x))


def _fit_contention(rows, p: EmuParams) -> tuple[float, dict]:
    """(gamma, {P: cost per element}) of one CPU cost over its rows (attr, P, seconds, P x shape, n,
    ext_load): gamma on a grid from GAMMA_MIN to 3 where the rows span two or more N (else p.gamma),
    the cost per size the median of seconds / (P x shape x o ** gamma), gamma minimizing the squared
    log error."""
    import numpy as np

    best = None
    for gamma in (np.linspace(GAMMA_MIN, 3.0, 121) if len({c[4] for c in rows}) > 1 else [p.gamma]):
        q = replace(p, gamma=float(gamma), gammas={})
        cont = np.array([q.contention(n, L) for *_, n, L in rows])
        costs = {}
        for P in {c[1] for c in rows}:
            idx = [i for i, c in enumerate(rows) if c[1] == P]
            costs[P] = float(np.median([rows[i][2] / (rows[i][3] * cont[i]) for i in idx]))
        pred = np.array([costs[c[1]] * c[3] * cont[i] for i, c in enumerate(rows)])
        meas = np.array([c[2] for c in rows])
        loss = float(np.sum(np.log(pred / meas) ** 2))
        if best is None or loss < best[0] - 1e-12:
            best = (loss, float(gamma), costs)
    return best[1], best[2]


def calibrate(measured, base: EmuParams | None = None, robust: float = 0.15) -> EmuParams:
    """Fit the free parameters on the given rows (one topology; see `validate` for which rows).

    1. CPU, per cost (encode, each mode's decode): for each contention exponent gamma on a grid
       from GAMMA_MIN = 1 (fair share: N runnable ranks on C cores stretch a CPU burst at least
       o-fold; memory-bound kernels suffer more) to 3, the cost per element -- per size P, since
       16M-element arrays fault their pages in every step and cost more per element -- is the
       median over its rows of component / (P x shape(N) x o ** gamma); gamma minimizes the
       squared log error of that component over the rows (it needs two N: the N = 8 rows).
       The scalar c_* attributes hold the median over sizes (used for sizes not calibrated).
    2. Network (eta, cap, kappa, alpha, alpha_os, beta_sc, cap_root, nu, q_exact), with the CPU
       costs held: one least-squares fit of log(predicted / measured) over t_wire and t_step of
       every row and t_scalers of the TernGrad rows, with a soft-L1 loss (scale `robust`: a few
       noisy rows of a shared machine must not drag the constants) and a weak pull (weight 0.01)
       towards `base`, so a parameter the rows cannot determine (no 10 Gb/s rows: cap) stays
       where it was."""
    import numpy as np
    from scipy.optimize import least_squares

    df = _load(measured)
    p = replace(base or EmuParams(), cpu={})
    if "cores" in df and len(df):
        p.cores = float(df["cores"].median())
    rows = list(df.itertuples())
    cols = set(df.columns)

    # 1. CPU: per cost, its own contention exponent (memory-bound kernels suffer more from sharing)
    comps = []      # (attribute, P, measured seconds, P x shape, n, ext_load)
    for r in rows:
        n, P = int(r.ranks), int(r.params)
        if r.mode.startswith("tg_") and "t_encode" in cols:
            comps.append((encode_attr(r.mode), P, r.t_encode, float(P), n, r.ext_load))
        if "t_decode" in cols:
            comps.append((CPU_ATTR[r.mode], P, r.t_decode, float(P) * cpu_shape(r.mode, n), n, r.ext_load))
    comps = [c for c in comps if c[2] > 0]
    p.cpu, p.gammas = {}, {}
    for attr in sorted({c[0] for c in comps}):
        mine = [c for c in comps if c[0] == attr]
        gamma, costs = _fit_contention(mine, p)
        p.gammas[attr] = gamma
        p.cpu.update({(attr, P): v for P, v in costs.items()})
        setattr(p, attr, float(np.median(list(costs.values()))))
        for P in sorted(costs) if len(costs) > 1 else ():   # a size measured at two or more N: its own
            at = [c for c in mine if c[1] == P]                # exponent (the N x P interaction)
            if len({c[4] for c in at}) > 1:
                p.gammas[(attr, P)], cP = _fit_contention(at, p)
                p.cpu[(attr, P)] = cP[P]
    if p.gammas:
        p.gamma = float(np.median([g for k, g in p.gammas.items() if isinstance(k, str)]))
    # 2. network (with the CPU costs of step 1 in place: the server's sum is part of its t_wire)
    wrows = []
    for r in rows:
        if "t_wire" in cols and r.t_wire > 0:
            wrows.append((r, "t_wire", r.t_wire))
        if STEP_IN_NETWORK_FIT and "t_step" in cols and r.t_step > 0:
            wrows.append((r, "t_step", r.t_step))
        if "t_scalers" in cols and r.mode.startswith("tg_") and r.t_scalers > 0 and int(r.ranks) > 1:
            wrows.append((r, "t_scalers", r.t_scalers))
    x0 = np.array([_to_x(k, getattr(p, k)) for k in _WIRE_FIT])
    lo = np.array([_to_x(k, _BOUNDS[k][0]) for k in _WIRE_FIT])
    hi = np.array([_to_x(k, _BOUNDS[k][1]) for k in _WIRE_FIT])
    x0 = np.clip(x0, lo + 1e-6, hi - 1e-6)

    def resid(x):
        q = replace(p, **{k: _from_x(k, v) for k, v in zip(_WIRE_FIT, x)})
        out = []
        for r, comp, m in wrows:
            if comp == "t_scalers":
                pr = scalers_seconds(int(r.ranks), q, r.ext_load)
            else:
                pr = predict_components(r.mode, int(r.params), int(r.ranks), r.rate, r.topology, q, r.ext_load)[comp]
            out.append(math.log(max(pr, 1e-12) / m))
        return np.concatenate([np.array(out), 0.01 * (x - x0)])

    if wrows:
        fit = least_squares(resid, x0, bounds=(lo, hi), loss="soft_l1", f_scale=robust, x_scale=1.0)
        for k, v in zip(_WIRE_FIT, fit.x):
            setattr(p, k, _from_x(k, v))

    p.fitted = {"rows": int(len(df)), "ranks": sorted(int(x) for x in df["ranks"].unique()),
                "params": sorted(int(x) for x in df["params"].unique()), "cores": p.cores,
                "wire_rows": len(wrows), "cpu_rows": len(comps)}
    return p


def predict_emulation(measured, params: EmuParams):
    """Every row of a bench CSV with the model's predicted components beside the measured ones."""
    df = _load(measured)
    preds = [predict_components(r.mode, int(r.params), int(r.ranks), r.rate, r.topology, params, r.ext_load)
             for r in df.itertuples()]
    for k in ("t_wire", "t_wire_path", "t_encode", "t_scalers", "t_decode", "t_exchange", "t_step"):
        df[f"pred_{k}"] = [x[k] for x in preds]
    df["pred_wire_bytes"] = [wire_bytes_model(r.mode, int(r.params), int(r.ranks)) for r in df.itertuples()]
    return df


def default_calibration_rows(df):
    """N = 2 (every size and rate) plus the smallest size at the largest N: the separate set the
    free parameters are fitted on (N = 2 alone cannot tell how CPU time grows with the rank count)."""
    big = df["ranks"] == df["ranks"].max()
    return (df["ranks"] == df["ranks"].min()) | (big & (df["params"] == df["params"].min()))


def size_ends_calibration_rows(df):
    """The default set without its middle sizes at N = 2: those rows -- one rank per core, like a
    cluster -- are then predicted from the smallest and largest size (a held-out interpolation)."""
    ends = df["params"].isin([df["params"].min(), df["params"].max()])
    return default_calibration_rows(df) & (ends | (df["ranks"] != df["ranks"].min()))


def rank_ends_calibration_rows(df):
    """Every row at the smallest and the largest N: the middle N is then predicted (interpolated in
    N; each size's CPU costs get their own contention exponent from its two N)."""
    return df["ranks"].isin([df["ranks"].min(), df["ranks"].max()])


CALIBRATIONS = {"default": default_calibration_rows, "size-ends": size_ends_calibration_rows,
                "rank-ends": rank_ends_calibration_rows}


def validate(measured_csv, calibration=default_calibration_rows, tolerance: float = 0.20,
             min_params: int = 1_000_000):
    """Predicted against measured per-step times, every row; free parameters fitted per topology
    on the rows `calibration(df)` selects (default: N = 2, plus N = max at the smallest size) and
    marked split = "calibration"; every other row is split = "validation".

    `measured_csv`: one bench CSV (path or DataFrame), or a list of sweeps of the same grid, whose
    per-row medians are then used (`combine_sweeps`; `sweep_spread` = their max / min - 1).
    Columns: keys, oversubscribed (N > cores: the ranks share cores, unlike on a cluster), sweeps,
    sweep_spread, measured and predicted t_step (rel_error = predicted / measured - 1, within =
    |rel_error| <= tolerance) -- the headline: the bench's speedups are ratios of t_step; the same
    for t_exchange (exchange_rel_error, exchange_within) and t_wire alone (wire_rel_error,
    wire_within), the CPU components, predicted and measured speedup over fp32_native, and the
    MPICH byte model against the interface counters (wire_bytes_error), and quick (True in every row
    when a measurement came from `tgsim bench exchange --quick`: tgsim.bench.exchange.is_quick).
    `table.attrs["params"]`: {topology: EmuParams}."""
    import numpy as np
    import pandas as pd

    df = _load(measured_csv)
    df = df[df["params"] >= min_params].reset_index(drop=True)
    outs, fitted = [], {}
    for topo, grp in df.groupby("topology", sort=True):
        grp = grp.reset_index(drop=True)
        cal = np.asarray(calibration(grp), dtype=bool)
        if not cal.any():
            raise ValueError(f"{topo}: no calibration rows selected")
        p = calibrate(grp[cal])
        fitted[topo] = p
        out = predict_emulation(grp, p)
        out["split"] = np.where(cal, "calibration", "validation")
        outs.append(out)
    out = pd.concat(outs, ignore_index=True)
    for c in ("t_scalers", "t_exchange"):
        if c not in out:
            out[c] = np.nan
    out["rel_error"] = out["pred_t_step"] / out["t_step"] - 1.0
    out["within"] = out["rel_error"].abs() <= tolerance
    out["exchange_rel_error"] = out["pred_t_exchange"] / out["t_exchange"] - 1.0
    out["exchange_within"] = out["exchange_rel_error"].abs() <= tolerance
    out["wire_rel_error"] = out["pred_t_wire"] / out["t_wire"] - 1.0
    out["wire_within"] = out["wire_rel_error"].abs() <= tolerance
    key = ["topology", "rate", "ranks", "params"]
    base = out[out["mode"] == "fp32_native"].set_index(key)
    idx = pd.MultiIndex.from_frame(out[key])
    out["speedup"] = base["t_step"].reindex(idx).to_numpy() / out["t_step"]
    out["pred_speedup"] = base["pred_t_step"].reindex(idx).to_numpy() / out["pred_t_step"]
    out["wire_bytes_error"] = out["pred_wire_bytes"] / out["wire_bytes"] - 1.0
    out["oversubscribed"] = out["ranks"] > out["cores"] if "cores" in out else False
    cols = key + ["mode", "split", "oversubscribed", "sweeps", "sweep_spread", "t_step", "pred_t_step", "rel_error",
                  "within", "t_exchange", "pred_t_exchange",
                  "exchange_rel_error", "exchange_within", "t_wire", "pred_t_wire", "wire_rel_error", "wire_within",
                  "t_encode", "pred_t_encode", "t_scalers", "pred_t_scalers", "t_decode", "pred_t_decode",
                  "ext_load", "speedup", "pred_speedup", "wire_bytes", "pred_wire_bytes", "wire_bytes_error",
                  "quick"]
    out = out[cols]
    out.attrs["params"] = fitted
    return out

