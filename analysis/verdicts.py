"""Verdicts of the figures' claims from stated statistical tests, with three outcomes.

Every function returns a dict with `verdict` one of "confirmed", "not confirmed", "inconclusive",
the numbers it was decided on, and `test`: one line naming the test, its margin, α and the number
of seeds, which the claims table prints beside the verdict.

`equivalence(a, b, margin, alpha)`: "a is within `margin` of b" by two one-sided t-tests (TOST,
Schuirmann 1987) on the per-seed differences d_i = a_i - b_i (paired by seed) or on the two
samples (Welch). With d̄ the mean difference, se its standard error and t* = t_{1-α, dof}, the
(1 - 2α) interval is [d̄ - t* se, d̄ + t* se]:

    inside (-margin, margin)          -> "confirmed"      (both one-sided tests reject at α)
    entirely outside [-margin, margin] -> "not confirmed"  (the difference exceeds the margin at α)
    otherwise                          -> "inconclusive", with `seeds_needed`: the smallest n with
                                          t_{1-α, n-1} s/√n < margin - |d̄| at the observed mean d̄ and
                                          spread s (None when |d̄| >= margin: no n would confirm).

`noninferiority(a, b, margin, alpha)`: "a loses at most `margin` against b" (one-sided): the lower
end of the same interval above -margin confirms, its upper end below -margin refutes.

`slope_fit(M, K, seed, alpha)`: the slope β of log K = α_seed + β log M (one intercept per seed,
least squares) with its (1 - α) t-interval. `slopes_common_range(runs, ...)`: every method's slope
over one common range of M (the M at which every method reached the target on every seed, up to
`M_max`; a method that missed it at the smallest M on some seed has no slope there: its row says so,
"inconclusive", and it does not shorten the others' range), and per method its difference to the reference method's slope with the interval of the
difference; "keeps the linear speedup" is `equivalence` of the two slopes within `margin` (a
difference of two independent estimates: se = √(se_a² + se_b²), dof the smaller of the two).

Non-finite values (a diverged run) are never dropped silently. `equivalence` and `noninferiority`
take `nonfinite=`:
    "attribute" (the default, the report's one rule): a divergence belongs to the method that
                diverged. A non-finite value in `a` (the claimed method) is a's failure: verdict
                "not confirmed", `failed` counts them. A non-finite value in `b` only (the
                reference) is b's own failure: that pair is left out and counted in `ref_failed`,
                never charged to `a`.
    "drop"      count them in `dropped` and leave the pair out, whichever side diverged;
    "fail"      verdict "not confirmed" when either side diverged.

The report's other rules, shared by every figure (`papers_figures/`):
- `reached_ratio(a_bits, b_bits, a_reached, b_reached, bound)`: "a needs fewer bits than b to reach
  the target". A seed where `a` missed the target is a's failure ("not confirmed", "missed (k/n)");
  where only `b` missed, there is no ratio ("inconclusive", "reference missed (k/n)"); no ratio is
  ever printed for a run that did not reach the target.
- `linear_range(runs, reference)`: the largest prefix of M over which the reference (fp32) speeds
  up linearly; `keeps_speedup(runs, method, reference, Ms)`: a method's slope against the
  reference's over that range (one-sided: a steeper slope is no loss of speedup).
- `combine(verdicts)`: the summary of one claim judged per model or setting: the common verdict
  when all agree, "split" when they disagree (any two different verdicts);
  `combine(verdicts, every=True)` for a claim worded "at every N": any refuted
  setting refutes it; `combine(verdicts, best="inconclusive")` for a claim no test here can
  confirm (a sentence with no tolerance, "does not incur any accuracy loss": at best
  "inconclusive"): a "not confirmed" on any setting is the summary, never "split", since no
  setting can weigh against it. `tally(verdicts, labels)` says what happened, setting by setting
  ("not confirmed on 2 of 4 (convnet, transformer); inconclusive on 2 of 4 (...)").
  A setting may also be "conditional" (the test passed, but a condition of the claim's own rule was
  not checked here): it is a weaker "confirmed", so "conditional" among "confirmed" settings makes
  the summary "conditional" (never "confirmed", never "split"); beside "not confirmed" or
  "inconclusive" it is as "confirmed" would be ("split"; with `every=True`: "not confirmed" or
  "inconclusive"); under `best="inconclusive"` it is an error, as "confirmed" is.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

VERDICTS = ("confirmed", "not confirmed", "inconclusive")
SUMMARY_VERDICTS = VERDICTS + ("split",)
# a passed test whose rule has a condition not checked here (the figures' claims tables); `combine` takes it
PASSED = ("confirmed", "conditional")
NONFINITE = ("attribute", "drop", "fail")


def _t(q: float, dof: float) -> float:
    from scipy import stats

    return float(stats.t.ppf(q, dof))


def _clean(a, b, paired: bool, nonfinite: str):
    """(a, b kept, dropped, failed, ref_failed): the finite values by the `nonfinite` rule (module docstring)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64) if b is not None else np.zeros_like(a)
    if paired and a.shape != b.shape:
        raise ValueError(f"paired samples differ in length: {a.shape} vs {b.shape}")
    if nonfinite not in NONFINITE:
        raise ValueError(f"nonfinite must be one of {NONFINITE}, not {nonfinite!r}")
    ka, kb = np.isfinite(a), np.isfinite(b)
    failed, ref_failed = int((~ka).sum()), int((ka & ~kb).sum() if paired else (~kb).sum())
    if paired:
        keep = ka & kb
        return a[keep], b[keep], int((~keep).sum()), failed, ref_failed
    return a[ka], b[kb], int((~ka).sum() + (~kb).sum()), failed, ref_failed


def _failure(out: dict, test: str, failed: int, n_all: int) -> dict:
    """The verdict of a claim whose method diverged in `failed` of `n_all` runs (nonfinite="attribute")."""
    return dict(out, verdict="not confirmed", lo=float("nan"), hi=float("nan"), p=float("nan"), seeds_needed=None,
                test=test + f" (the method diverged in {failed} of {n_all} run(s): its failure)")


def _interval(a, b, paired: bool, alpha: float):
    """(mean difference, standard error, dof, sd of the differences, n) of a - b."""
    if paired:
        d = a - b
        n = d.size
        if n < 2:
            return (float(d.mean()) if n else float("nan")), float("nan"), 0, float("nan"), n
        sd = float(d.std(ddof=1))
        return float(d.mean()), sd / math.sqrt(n), n - 1, sd, n
    na, nb = a.size, b.size
    if na < 2 or nb < 2:
        diff = float(a.mean() - b.mean()) if na and nb else float("nan")
        return diff, float("nan"), 0, float("nan"), min(na, nb)
    va, vb = a.var(ddof=1) / na, b.var(ddof=1) / nb
    se = math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1)) if va + vb > 0 else na + nb - 2
    sd = math.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2)      # per-seed spread, for the seeds-needed estimate
    return float(a.mean() - b.mean()), se, dof, sd, min(na, nb)


def seeds_needed(diff: float, sd: float, margin: float, alpha: float = 0.05, paired: bool = True,
                 limit: int = 100000) -> int | None:
    """The smallest n (seeds; per sample when not paired) with t_{1-α, dof} s_n < margin - |diff|, where
    s_n = sd/√n paired and sd·√(2/n) for two samples of n (dof n-1, resp. 2n-2): the seeds a TOST at the
    observed mean `diff` and spread `sd` would need to confirm equivalence. None when |diff| >= margin or
    no n <= limit does."""
    return _n_for_room(margin - abs(diff), sd, alpha, paired, limit)


def _n_for_room(room: float, sd: float, alpha: float, paired: bool, limit: int = 100000) -> int | None:
    """The smallest n with t_{1-α, dof} s_n < room (see `seeds_needed`); None when room <= 0 or no n <= limit."""
    if not (room > 0) or not math.isfinite(sd):
        return None
    if sd == 0:
        return 2
    from scipy import stats

    n = np.arange(2, limit + 1, dtype=np.float64)
    s_n = sd / np.sqrt(n) if paired else sd * np.sqrt(2.0 / n)
    ok = np.flatnonzero(stats.t.ppf(1 - alpha, n - 1 if paired else 2 * n - 2) * s_n < room)
    return int(n[ok[0]]) if ok.size else None


def _describe(name, margin, alpha, n, dropped, unit, extra="", nonfinite="drop", ref_failed=0):
    parts = [f"{name}, margin {margin:g}{unit}, alpha {alpha:g}, {n} seed(s)"]
    if nonfinite == "attribute":
        if ref_failed:
            parts.append(f"{ref_failed} pair(s) left out: the reference diverged (its own failure)")
    elif dropped:
        parts.append(f"{dropped} non-finite value(s) left out")
    return "; ".join(parts) + extra


def equivalence(a, b=None, *, margin: float, alpha: float = 0.05, paired: bool = True, nonfinite: str = "attribute",
                scale: float = 1.0, unit: str = "") -> dict:
    """TOST of "mean(a) - mean(b) lies within ±margin" (see the module docstring). `b` None: a itself
    against 0. `scale` multiplies the reported differences (e.g. 100 for accuracy points); `margin` is
    in the data's own units. Returns verdict, diff, lo, hi (the 1 - 2α interval), p (the larger of the
    two one-sided p-values), n, dropped, failed (non-finite values of a), ref_failed (pairs left out
    for b's own divergence), sd, seeds_needed, test."""
    from scipy import stats

    n_all = np.asarray(a).size
    a, b, dropped, failed, ref_failed = _clean(a, b, paired, nonfinite)
    diff, se, dof, sd, n = _interval(a, b, paired, alpha)
    out = dict(diff=diff * scale, n=n, dropped=dropped, failed=failed, ref_failed=ref_failed, sd=sd * scale,
               margin=margin * scale, alpha=alpha)
    test = _describe("TOST equivalence (paired t)" if paired else "TOST equivalence (Welch t)", margin * scale,
                     alpha, n, dropped, unit, nonfinite=nonfinite, ref_failed=ref_failed)
    if failed and nonfinite == "attribute":
        return _failure(out, test, failed, n_all)
    if dropped and nonfinite == "fail":
        return dict(out, verdict="not confirmed", lo=float("nan"), hi=float("nan"), p=float("nan"), seeds_needed=None,
                    test=test + " (a non-finite run counts as a failure)")
    if not (dof >= 1) or not math.isfinite(se):
        return dict(out, verdict="inconclusive", lo=float("nan"), hi=float("nan"), p=float("nan"),
                    seeds_needed=seeds_needed(diff, sd, margin, alpha, paired) if math.isfinite(sd) else None,
                    test=test + " (fewer than 2 usable seeds)")
    h = _t(1 - alpha, dof) * se
    lo, hi = diff - h, diff + h
    if se > 0:
        p = max(float(stats.t.sf((diff + margin) / se, dof)), float(stats.t.cdf((diff - margin) / se, dof)))
    else:
        p = 0.0 if abs(diff) < margin else 1.0
    if -margin < lo and hi < margin:
        v = "confirmed"
    elif lo >= margin or hi <= -margin:
        v = "not confirmed"
    else:
        v = "inconclusive"
    need = seeds_needed(diff, sd, margin, alpha, paired) if v == "inconclusive" else None
    return dict(out, verdict=v, lo=lo * scale, hi=hi * scale, p=p, seeds_needed=need, test=test)


def noninferiority(a, b=None, *, margin: float, alpha: float = 0.05, paired: bool = True, nonfinite: str = "attribute",
                   scale: float = 1.0, unit: str = "") -> dict:
    """One-sided test of "mean(a) >= mean(b) - margin": the (1 - 2α) interval's lower end above
    -margin confirms, its upper end below -margin refutes, else inconclusive (with `seeds_needed`
    at the observed mean and spread: the smallest n with t_{1-α} s_n < diff + margin). Same results
    as `equivalence`."""
    n_all = np.asarray(a).size
    a, b, dropped, failed, ref_failed = _clean(a, b, paired, nonfinite)
    diff, se, dof, sd, n = _interval(a, b, paired, alpha)
    out = dict(diff=diff * scale, n=n, dropped=dropped, failed=failed, ref_failed=ref_failed, sd=sd * scale,
               margin=margin * scale, alpha=alpha, p=float("nan"))
    test = _describe("one-sided non-inferiority t-test" + (" (paired)" if paired else " (Welch)"), margin * scale,
                     alpha, n, dropped, unit, nonfinite=nonfinite, ref_failed=ref_failed)
    if failed and nonfinite == "attribute":
        return _failure(out, test, failed, n_all)
    if dropped and nonfinite == "fail":
        return dict(out, verdict="not confirmed", lo=float("nan"), hi=float("nan"), seeds_needed=None,
                    test=test + " (a non-finite run counts as a failure)")
    if not (dof >= 1) or not math.isfinite(se):
        return dict(out, verdict="inconclusive", lo=float("nan"), hi=float("nan"), seeds_needed=None,
                    test=test + " (fewer than 2 usable seeds)")
    h = _t(1 - alpha, dof) * se
    lo, hi = diff - h, diff + h
    v = "confirmed" if lo > -margin else "not confirmed" if hi < -margin else "inconclusive"
    need = _n_for_room(diff + margin, sd, alpha, paired) if v == "inconclusive" else None
    return dict(out, verdict=v, lo=lo * scale, hi=hi * scale, seeds_needed=need, test=test)


def slope_fit(M, K, seed, alpha: float = 0.05) -> dict:
    """Slope β of log K = α_seed + β log M (least squares, one intercept per seed; finite K only) with
    its (1 - α) t-interval: slope, lo, hi, se, dof, points."""
    d = pd.DataFrame({"x": np.log(np.asarray(M, np.float64)), "y": np.log(np.asarray(K, np.float64)),
                      "seed": np.asarray(seed)})
    d = d[np.isfinite(d.y)]
    d = d[d.groupby("seed").x.transform("nunique") >= 2]
    nan = float("nan")
    out = dict(slope=nan, lo=nan, hi=nan, se=nan, dof=0, points=len(d))
    if len(d) < 2:
        return out
    x = d.x - d.groupby("seed").x.transform("mean")
    y = d.y - d.groupby("seed").y.transform("mean")
    sxx = float((x * x).sum())
    beta = float((x * y).sum()) / sxx
    dof = len(d) - d.seed.nunique() - 1
    if dof < 1:
        return dict(out, slope=beta)
    se = math.sqrt(float(((y - beta * x) ** 2).sum()) / dof / sxx)
    h = _t(1 - alpha / 2, dof) * se
    return dict(out, slope=beta, lo=beta - h, hi=beta + h, se=se, dof=dof)


def common_range(runs: pd.DataFrame, M_max: float | None = None) -> list:
    """The worker counts M (ascending, <= M_max) up to the first M at which some method missed the
    target on some seed (K non-finite): one range every method reached on every seed."""
    ok = runs.assign(fin=np.isfinite(runs.K.astype(float))).groupby("workers").fin.all()
    Ms = []
    for M, good in ok.sort_index().items():
        if (M_max is not None and M > M_max) or not good:
            break
        Ms.append(M)
    return Ms


def slopes_common_range(runs: pd.DataFrame, *, reference: str, M_max: float | None = None,
                        margin: float = 0.15, alpha: float = 0.05) -> pd.DataFrame:
    """Per method of `runs` (columns method, workers, seed, K): the slope over the common range
    (`common_range`), its (1 - α) interval, the difference to `reference`'s slope with the (1 - 2α)
    interval of the difference, and the TOST verdict of |difference| < margin (`verdict`); for the
    reference itself the TOST of |slope + 1| < margin (linear speedup). A method that missed the
    target at the smallest M on some seed gets slope NaN and "inconclusive" (no range to fit), and
    is left out of the common range; so is every comparison when the reference is such a method.
    Columns: method, M_lo, M_hi, slope, lo, hi, diff, diff_lo, diff_hi, verdict, test."""
    M0 = runs.workers.min()
    at0 = runs[runs.workers == M0].assign(fin=lambda d: np.isfinite(d.K.astype(float))).groupby("method").fin.all()
    missed = [m for m in dict.fromkeys(runs.method) if not at0.get(m, False)]
    Ms = common_range(runs[~runs.method.isin(missed)], M_max)
    r = runs[runs.workers.isin(Ms) & ~runs.method.isin(missed)]
    fits = {m: slope_fit(g.workers, g.K, g.seed, alpha) for m, g in r.groupby("method", sort=False)}
    ref = fits.get(reference)
    rows = []
    for m, f in fits.items():
        if ref is None and m != reference:
            rows.append(dict(method=m, M_lo=min(Ms), M_hi=max(Ms), slope=f["slope"], lo=f["lo"], hi=f["hi"],
                             diff=float("nan"), diff_lo=float("nan"), diff_hi=float("nan"), verdict="inconclusive",
                             test=f"no comparison: the reference {reference} has no slope"))
            continue
        if m == reference:
            d, se, dof = f["slope"] + 1.0, f["se"], f["dof"]
            what = "slope + 1"
        else:
            d, se, dof = f["slope"] - ref["slope"], math.hypot(f["se"], ref["se"]), min(f["dof"], ref["dof"])
            what = f"slope - {reference}'s"
        if dof >= 1 and math.isfinite(se):
            h = _t(1 - alpha, dof) * se
            lo, hi = d - h, d + h
            v = ("confirmed" if -margin < lo and hi < margin else
                 "not confirmed" if lo >= margin or hi <= -margin else "inconclusive")
        else:
            lo = hi = float("nan")
            v = "inconclusive"
        seeds = r[r.method == m].seed.nunique()
        rows.append(dict(method=m, M_lo=min(Ms) if Ms else float("nan"), M_hi=max(Ms) if Ms else float("nan"),
                         slope=f["slope"], lo=f["lo"], hi=f["hi"], diff=d, diff_lo=lo, diff_hi=hi, verdict=v,
                         test=f"TOST on {what} over M = {min(Ms) if Ms else '-'}..{max(Ms) if Ms else '-'} "
                              f"(log-log least squares, one intercept per seed), margin {margin:g}, "
                              f"alpha {alpha:g}, {seeds} seed(s)"))
    for m in missed:                       # after the fitted ones: row 0 holds the common range
        at = runs[(runs.method == m) & (runs.workers == M0)]
        n_miss = int((~np.isfinite(at.K.astype(float))).sum())
        rows.append(dict(method=m, M_lo=float("nan"), M_hi=float("nan"), slope=float("nan"), lo=float("nan"),
                         hi=float("nan"), diff=float("nan"), diff_lo=float("nan"), diff_hi=float("nan"),
                         verdict="inconclusive", test=f"no slope: missed the target at M = {M0:g} in {n_miss} "
                                                      f"of {len(at)} run(s)"))
    return pd.DataFrame(rows)


def interval_verdict(lo: float, hi: float, low: float = -math.inf, high: float = math.inf) -> str:
    """An interval [lo, hi] against the claimed region (low, high): inside it "confirmed", disjoint from
    it "not confirmed", overlapping its edge "inconclusive" (a NaN end: "inconclusive")."""
    if not (math.isfinite(lo) or lo == -math.inf) or not (math.isfinite(hi) or hi == math.inf):
        return "inconclusive"
    if low < lo and hi < high:
        return "confirmed"
    if hi <= low or lo >= high:
        return "not confirmed"
    return "inconclusive"


def combine(verdicts, every: bool = False, best: str = "confirmed") -> str:
    """One claim's summary over its per-model (or per-setting) verdicts (module docstring): the
    common verdict when all agree; "split" when any two differ (the per-setting verdicts, printed
    beside it, say how). `every=True` (a claim worded "at every N"): any "not confirmed" refutes it, all
    "confirmed" confirm it, else "inconclusive". `best="inconclusive"` (a claim that no test can
    confirm, e.g. "no accuracy loss" at margin 0): any "not confirmed" is the summary, else
    "inconclusive"; a "confirmed" (or "conditional") among such verdicts is a caller's error
    (ValueError). "conditional" (a passed test, a condition of the rule unchecked) with only
    "confirmed" beside it gives "conditional", under either `every`: the summary is no stronger than
    its weakest passed setting. No verdicts: "n/a"."""
    if best not in ("confirmed", "inconclusive"):
        raise ValueError(f"best must be 'confirmed' or 'inconclusive', not {best!r}")
    v = [x for x in verdicts if x != "n/a"]
    if not v:
        return "n/a"
    bad = [x for x in v if x not in VERDICTS + ("conditional",)]
    if bad:
        raise ValueError(f"not a verdict: {bad[0]!r}")
    if best == "inconclusive":
        passed = [x for x in v if x in PASSED]
        if passed:
            raise ValueError(f"a claim that can at best be inconclusive got a {passed[0]!r} verdict")
        return "not confirmed" if "not confirmed" in v else "inconclusive"
    if all(x == v[0] for x in v):
        return v[0]
    if set(v) <= set(PASSED):      # every setting passed, some with a condition unchecked
        return "conditional"
    if every:
        return "not confirmed" if "not confirmed" in v else "inconclusive"
    return "split"


def tally(verdicts, labels=None, words: dict | None = None) -> str:
    """What the per-setting `verdicts` say, verdict by verdict in the order first seen: "not confirmed on
    2 of 4 (convnet, transformer); inconclusive on 2 of 4 (logistic, resnet)"; `labels` (one per
    verdict) are named in brackets, "n/a" verdicts left out; `words` renames a verdict (e.g. {"not
    confirmed": "loss shown"}). "" for no verdicts."""
    v = list(verdicts)
    labels = list(labels) if labels is not None else [None] * len(v)
    if len(labels) != len(v):
        raise ValueError("verdicts and labels differ in length")
    pairs = [(x, lab) for x, lab in zip(v, labels) if x != "n/a"]
    n = len(pairs)
    parts = []
    for x in dict.fromkeys(x for x, _ in pairs):
        names = [str(lab) for y, lab in pairs if y == x and lab is not None]
        k = sum(1 for y, _ in pairs if y == x)
        parts.append(f"{(words or {}).get(x, x)} on {k} of {n}" + (f" ({', '.join(names)})" if names else ""))
    return "; ".join(parts)


def missed(k: int, n: int, who: str = "") -> str:
    """The text a run set that missed its target gets instead of a ratio: "missed (k/n)"."""
    return f"{who + ' ' if who else ''}missed ({k}/{n})"


def reached_ratio(a_bits, b_bits, a_reached, b_reached, *, bound: float = 1.0, alpha: float = 0.05) -> dict:
    """"a needs under `bound` times b's bits to reach the target", per seed (paired): the one-sided
    t-test of mean(a_bits / b_bits) < bound (the (1 - 2α) interval's upper end below `bound`
    confirms, its lower end at or above `bound` refutes) when every seed of both reached the target.
    A seed where a missed is a's failure: "not confirmed" and `text` "missed (k/n)", no ratio; where
    only b missed, no ratio exists: "inconclusive", `text` "reference missed (k/n)". Returns verdict,
    text (what the row prints), ratio, lo, hi (NaN unless every seed reached), n, a_missed, b_missed,
    test."""
    a_bits, b_bits = np.asarray(a_bits, np.float64), np.asarray(b_bits, np.float64)
    ra, rb = np.asarray(a_reached, bool), np.asarray(b_reached, bool)
    n = a_bits.size
    if not (b_bits.size == ra.size == rb.size == n):
        raise ValueError("a_bits, b_bits, a_reached and b_reached differ in length")
    nan = float("nan")
    out = dict(n=n, a_missed=int((~ra).sum()), b_missed=int((~rb).sum()), ratio=nan, lo=nan, hi=nan, alpha=alpha,
               test=f"one-sided t-test of the mean per-seed ratio < {bound:g}, alpha {alpha:g}, {n} seed(s); a seed "
                    "where the method missed the target is its failure, one where only the reference missed leaves "
                    "no ratio")
    if n == 0:
        return dict(out, verdict="n/a", text="no runs")
    if out["a_missed"]:
        return dict(out, verdict="not confirmed", text=missed(out["a_missed"], n))
    if out["b_missed"]:
        return dict(out, verdict="inconclusive", text=missed(out["b_missed"], n, "reference"))
    x = a_bits / b_bits
    r = noninferiority(bound - x, margin=0.0, alpha=alpha)
    hw = (r["hi"] - r["lo"]) / 2 if math.isfinite(r["lo"]) else nan
    ratio = float(x.mean())
    return dict(out, verdict=r["verdict"], ratio=ratio, lo=ratio - hw, hi=ratio + hw,
                text=f"{ratio:.3g} [{ratio - hw:.3g}, {ratio + hw:.3g}]" if math.isfinite(hw) else f"{ratio:.3g}")


def linear_range(runs: pd.DataFrame, reference: str, *, margin: float = 0.15, alpha: float = 0.05,
                 min_points: int = 3, two_sided: bool = False) -> dict:
    """Where `reference` (fp32) speeds up linearly: the largest prefix M_1 < ... < M_j of the worker
    counts of `runs` (columns method, workers, seed, K), j >= min_points, over which `reference`
    reached ε on every seed and its slope β (log K = α_seed + β log M, least squares, one intercept
    per seed; tgsim.analysis.verdicts.slopes_common_range) passes, with d = β + 1 and [d_lo, d_hi] its
    (1 - 2α) interval:
      two_sided False  d_hi < +margin: the speedup is at least linear up to the margin (not
                       flattened; K falling faster than 1/M also passes);
      two_sided True   -margin < d_lo and d_hi < +margin: the TOST of β against -1.
    Per prefix both are kept: `verdict` (the rule's: "confirmed" as above, "not confirmed" when
    d_lo >= margin (or, two-sided, d_hi <= -margin), else "inconclusive") and `tost` (the TOST's).
    Returns dict(Ms: the prefix, [] when none passes; M_lo, M_hi, slope, lo, hi (the (1 - α)
    interval of β), diff, diff_lo, diff_hi, verdict, tost, of that prefix, or of the shortest
    (min_points M) when none passes; verdict "inconclusive" and NaN when fewer than min_points M were
    reached; test: the rule and the prefix's fit; prefixes: one row per prefix tried)."""
    ref = runs[runs.method == reference]
    Ms = common_range(ref) if len(ref) else []
    nan = float("nan")
    rows = []
    for j in range(min_points, len(Ms) + 1):
        r = slopes_common_range(ref, reference=reference, M_max=Ms[j - 1], margin=margin, alpha=alpha).iloc[0]
        if two_sided:
            v = r.verdict
        else:
            v = "confirmed" if r.diff_hi < margin else "not confirmed" if r.diff_lo >= margin else "inconclusive"
        rows.append(dict(M_lo=Ms[0], M_hi=Ms[j - 1], points=j, slope=r.slope, lo=r.lo, hi=r.hi, diff=r["diff"],
                         diff_lo=r.diff_lo, diff_hi=r.diff_hi, verdict=v, tost=r.verdict, fit=r.test))
    prefixes = pd.DataFrame(rows, columns=["M_lo", "M_hi", "points", "slope", "lo", "hi", "diff", "diff_lo",
                                           "diff_hi", "verdict", "tost", "fit"])
    passes = (f"the TOST of {reference}'s slope against -1 confirms (margin {margin:g}, alpha {alpha:g})"
              if two_sided else
              f"the upper end of the {1 - 2 * alpha:.0%} interval of {reference}'s slope + 1 lies below +{margin:g} "
              f"(alpha {alpha:g}: speedup at least linear, up to the margin)")
    rule = (f"the largest prefix of M (at least {min_points} values, {reference} reaching ε on every seed) over "
            f"which {passes}")
    ok = prefixes[prefixes.verdict == "confirmed"]
    if len(ok):
        best = ok.iloc[-1]
        return dict(best.drop(["points", "fit"]).to_dict(), Ms=list(Ms[:int(best.points)]), prefixes=prefixes,
                    test=f"{rule}: {best.fit}")
    if not len(prefixes):
        return dict(Ms=[], M_lo=nan, M_hi=nan, slope=nan, lo=nan, hi=nan, diff=nan, diff_lo=nan, diff_hi=nan,
                    verdict="inconclusive", tost="inconclusive", prefixes=prefixes,
                    test=f"{rule}: {reference} reached ε on every seed at {len(Ms)} M only")
    first = prefixes.iloc[0]
    return dict(first.drop(["points", "fit"]).to_dict(), Ms=[], prefixes=prefixes,
                test=f"{rule}: none passes; the shortest prefix's {first.fit}")


def keeps_speedup(runs: pd.DataFrame, method: str, reference: str, Ms, *, margin: float = 0.15,
                  alpha: float = 0.05, min_points: int = 3) -> dict:
    """Whether `method` keeps `reference`'s speedup over the worker counts Ms (a `linear_range`):
    its slope β_m and β_ref fitted over the M of Ms up to the first at which either missed ε on some
    seed (tgsim.analysis.verdicts.slopes_common_range of the pair), and the one-sided
    non-inferiority test of d = β_m - β_ref < margin: "confirmed" when the upper end of the
    (1 - 2α) interval of d lies below +margin, "not confirmed" when its lower end is at or above
    +margin, else "inconclusive" (a steeper slope than the reference's is no loss of speedup).
    Fewer than min_points such M, or a method that missed ε at the smallest M: "inconclusive".
    Returns dict(method, M_lo, M_hi, points, slope, lo, hi, diff, diff_lo, diff_hi, verdict, test)."""
    nan = float("nan")
    base = dict(method=method, M_lo=nan, M_hi=nan, points=0, slope=nan, lo=nan, hi=nan, diff=nan, diff_lo=nan,
                diff_hi=nan)
    pair = runs[runs.method.isin([method, reference]) & runs.workers.isin(list(Ms))]
    if not len(Ms) or not (pair.method == method).any():
        return dict(base, verdict="inconclusive", test=f"no runs of {method} over M = {list(Ms)}")
    r = slopes_common_range(pair, reference=reference, M_max=max(Ms), margin=margin, alpha=alpha)
    r = r[r.method == method].iloc[0]
    out = dict(base, **{k: r[k] for k in ("M_lo", "M_hi", "slope", "lo", "hi", "diff", "diff_lo", "diff_hi")})
    if not math.isfinite(r.slope):
        return dict(out, verdict="inconclusive", test=r.test)
    fitted = sorted(m for m in set(pair.workers) if r.M_lo <= m <= r.M_hi)
    out["points"] = len(fitted)
    seeds = pair[pair.method == method].seed.nunique()
    test = (f"one-sided non-inferiority t-test of slope - {reference}'s < {margin:g} over M = {r.M_lo:g}..{r.M_hi:g} "
            f"(log-log least squares, one intercept per seed; the {1 - 2 * alpha:.0%} interval's upper end below "
            f"+{margin:g}), alpha {alpha:g}, {seeds} seed(s)")
    if len(fitted) < min_points:
        return dict(out, verdict="inconclusive",
                    test=test + f"; not decided: both reached ε on every seed at {len(fitted)} M of the range only")
    v = "confirmed" if r.diff_hi < margin else "not confirmed" if r.diff_lo >= margin else "inconclusive"
    return dict(out, verdict=v, test=test)
