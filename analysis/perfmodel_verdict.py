"""Verdicts of `tgsim compare time`: the speedup of a codec over the best float baseline with a 95 %
interval over the seeds, the settings where a codec wins, and how that count moves with compute speed.

SPEEDUP of method c over float f in one setting (net, link, N, hardware), with K_s(m) the steps to the
target of method m in seed s (compare bits' bits_runs.csv) and t(m) its modeled step time:

    r_s = K_s(f) t(f) / (K_s(c) t(c))                       (paired: the same seed's data and init)
    speedup = exp(mean_s log r_s),  95 % interval = exp(mean_s log r_s -+ t_{0.975, n-1} sd_s(log r_s) / sqrt(n))

a Student-t interval of the log-ratio over the n seeds (no resampling, so no random seed of its own;
the seeds are compare bits' 0..n-1). The best float baseline of a setting is the float of least mean
time to target, mean_s K_s(f) x t(f), over fp32, fp16 and bf16 (all three must be present:
`missing_baselines`). A codec WINS a setting only when its interval's lower end is above 1; a
setting counts when any codec wins it. NaN: some seed of the method did not reach the target.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

SETTING = ["rule", "hardware", "net", "link_gbps", "workers"]


def missing_baselines(steps: pd.DataFrame, required: tuple[str, ...]) -> dict[str, list[str]]:
    """{rule: the required float baselines without a row in `steps` (rule, method)}; {} when complete."""
    out = {}
    for rule, g in steps.groupby("rule", sort=False):
        miss = [f for f in required if f not in set(g.method)]
        if miss:
            out[rule] = miss
    return out


def log_ratio_interval(k_float: dict, t_float: float, k_codec: dict, t_codec: float) -> tuple[float, float, float]:
    """(speedup, lower, upper): the geometric mean over the seeds present in both of
    r_s = k_float[s] t_float / (k_codec[s] t_codec), with its 95 % Student-t interval of the
    log-ratio (module docstring); NaN when a K is missing or not finite, lower = upper = the point
    for one seed (no interval: it never wins)."""
    from scipy import stats

    seeds = sorted(set(k_float) & set(k_codec))
    r = np.array([math.log(k_float[s] * t_float / (k_codec[s] * t_codec)) if
                  (np.isfinite(k_float[s]) and np.isfinite(k_codec[s]) and k_codec[s] > 0) else math.nan
                  for s in seeds])
    if r.size == 0 or not np.isfinite(r).all():
        return (math.nan,) * 3
    m = float(r.mean())
    if r.size == 1:
        return math.exp(m), math.nan, math.nan
    h = float(stats.t.ppf(0.975, r.size - 1) * r.std(ddof=1) / math.sqrt(r.size))
    return math.exp(m), math.exp(m - h), math.exp(m + h)


def best_float_speedups(df: pd.DataFrame, steps: pd.DataFrame, floats: tuple[str, ...]) -> pd.DataFrame:
    """df (one row per setting and method: SETTING columns present in df, method, t_step) with
    best_float (least mean K x t_step of `floats`), speedup_best, speedup_best_lo, speedup_best_hi
    (`log_ratio_interval` against that float) and win (lower end > 1) added."""
    ks = {(r.rule, r.method): r.K_seed for r in steps.itertuples()}
    kmean = {k: (np.mean(list(v.values())) if v and np.isfinite(list(v.values())).all() else math.nan)
             for k, v in ks.items()}
    key = [c for c in SETTING if c in df.columns]
    df = df.copy()
    best = {}
    for s, g in df[df.method.isin(list(floats))].groupby(key, sort=False):
        times = {r.method: kmean.get((r.rule, r.method), math.nan) * r.t_step for r in g.itertuples()}
        fin = {m: t for m, t in times.items() if np.isfinite(t)}
        best[s] = (min(fin, key=fin.get), g.set_index("method").t_step[min(fin, key=fin.get)]) if fin else (None, math.nan)
    out = []
    for r in df.itertuples(index=False):
        f, tf = best[tuple(getattr(r, c) for c in key)] if len(key) > 1 else best[getattr(r, key[0])]
        if f is None:
            out.append((None, math.nan, math.nan, math.nan))
            continue
        out.append((f, *log_ratio_interval(ks[(r.rule, f)], tf, ks[(r.rule, r.method)], r.t_step)))
    df["best_float"] = [o[0] for o in out]
    df["speedup_best"], df["speedup_best_lo"], df["speedup_best_hi"] = ([o[i] for o in out] for i in (1, 2, 3))
    df["win"] = (df.speedup_best_lo > 1) & ~df.method.isin(list(floats))
    return df


def settings_table(df: pd.DataFrame, floats: tuple[str, ...]) -> pd.DataFrame:
    """One row per setting: the best float, the best codec (the highest interval lower end; the highest
    speedup where no codec has an interval), its speedup and 95 % interval, and win (lower end > 1)."""
    key = [c for c in SETTING if c in df.columns]
    rows = []
    for s, g in df.groupby(key, sort=False):
        codecs = g[~g.method.isin(list(floats)) & g.speedup_best.notna()]
        r = dict(zip(key, s if isinstance(s, tuple) else (s,)))
        r["best_float"] = g.best_float.iloc[0]
        if len(codecs):
            c = codecs.loc[codecs.speedup_best_lo.fillna(-np.inf).idxmax()] if codecs.speedup_best_lo.notna().any() \
                else codecs.loc[codecs.speedup_best.idxmax()]
            r.update(best_codec=c.method, speedup=c.speedup_best, lo=c.speedup_best_lo, hi=c.speedup_best_hi,
                     win=bool(c.speedup_best_lo > 1))
        else:
            r.update(best_codec=None, speedup=math.nan, lo=math.nan, hi=math.nan, win=False)
        rows.append(r)
    return pd.DataFrame(rows)


def count_wins(table: pd.DataFrame, by=("rule", "hardware")) -> pd.DataFrame:
    """(settings won, settings) per `by` of a `settings_table`."""
    by = [c for c in by if c in table.columns]
    return table.groupby(by, sort=False).agg(wins=("win", "sum"), settings=("win", "size")).reset_index()


__all__ = ["SETTING", "best_float_speedups", "count_wins", "log_ratio_interval",
           "missing_baselines", "settings_table"]
