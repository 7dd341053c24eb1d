"""Statistical tests of a codec's first and second moments (docs/THEORY.md §4).

Three tests, each returning a small frozen result with the decision, the numbers behind it and the
name of the test that was used:

``ternary_binomial_test``
    The exact test for ternary codecs. For a fixed input g and scaler s, over R independent draws
    (different stream keys), the number of non-zero codes of coordinate i is *exactly*
    Binomial(R, p_i). Two hypotheses:

    * ``"implemented"``: p_i = ternary.exact_nonzero_probability(|g_i|, s), the documented 24-bit rule
      (including its < 2^-24 resolution bias and the saturation |g_i| >= s -> p_i = 1);
    * ``"unbiased"``: p_i = |g_i| / s, the ideal unbiased quantizer E[g~] = g. A coordinate with
      |g_i| > s cannot be reproduced by any {-s, 0, +s} quantizer: it is *infeasible* and gets
      p-value 0.

    Two-sided exact p-values (the "minlike" definition of scipy.stats.binomtest, vectorized),
    Bonferroni over all n coordinates at family-wise level alpha. A code whose sign differs from
    sign(g_i) (or any non-zero code where g_i == 0) is impossible under both hypotheses and rejects
    on its own.

``mean_z_test``
    The generic normal-approximation (z) test of per-coordinate means, for codecs without a known
    code distribution. It says that it used the normal approximation, and flags coordinates where
    that approximation is not trustworthy at the Bonferroni level (see its docstring): on heavy-tailed
    inputs most |g_i|/s are tiny, the count of non-zero codes is nearly Poisson with a small mean, and
    a z-test raises false alarms there.

``mse_interval_test``
    A CLT interval for the mean of a per-draw statistic (e.g. ||Q(g) - g||^2 or ||Q(g)||^2) against
    a formula value. Each draw's statistic is a sum over n independent coordinates and the R draws
    are i.i.d., so the normal interval is appropriate for R in the hundreds or more.

Helpers ``codec_draws`` / ``accumulate_draws`` run a codec R times on one vector and keep the
sufficient statistics (sign-split counts of non-zero outputs, per-coordinate sums and sums of
squares, per-draw squared error and squared norm).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Literal

import numpy as np
import pandas as pd
from scipy import stats as _st

from tgsim.codecs.terngrad.quantizer import exact_nonzero_probability
from tgsim.rng import StreamKey

Hypothesis = Literal["implemented", "unbiased"]
_RERR = 1 + 1e-7  # scipy.stats.binomtest's relative tolerance for "as likely as the observation"

__all__ = [
    "BinomialTestResult", "CodecDraws", "MSEIntervalResult", "ZTestResult",
    "accumulate_draws", "binom_two_sided_pvalues", "binomial_test_of_draws", "codec_draws",
    "mean_z_test", "mse_interval_test", "ternary_binomial_test",
]


# ---------------------------------------------------------------------------------------------
# exact two-sided binomial p-values, vectorized
# ---------------------------------------------------------------------------------------------
def binom_two_sided_pvalues(k, n: int, p) -> np.ndarray:
    """Two-sided exact binomial p-values, element-wise, for counts k of Binomial(n, p).

    Same definition as ``scipy.stats.binomtest(k, n, p).pvalue`` ("minlike"): the probability of
    every outcome j with pmf(j) <= pmf(k) * (1 + 1e-7). The other tail's boundary is found by a
    vectorized bisection (the pmf is monotone on each side of the mode), so 10^6 coordinates cost a
    few dozen vectorized pmf evaluations. p = 0 or 1: 1 if k is the certain outcome, else 0.
    """
    k = np.asarray(k, dtype=np.int64)
    p = np.broadcast_to(np.asarray(p, dtype=np.float64), k.shape)
    n = int(n)
    if np.any((k < 0) | (k > n)):
        raise ValueError("counts must lie in [0, n]")
    if np.any(~((p >= 0) & (p <= 1))):
        raise ValueError("probabilities must lie in [0, 1]")
    out = np.ones(k.shape, dtype=np.float64)
    flat_out = out.reshape(-1)
    kf, pf = k.reshape(-1), p.reshape(-1)

    degenerate = (pf == 0) | (pf == 1)
    certain = np.where(pf == 1, n, 0)
    flat_out[degenerate] = np.where(kf[degenerate] == certain[degenerate], 1.0, 0.0)

    mean = n * pf
    lower = ~degenerate & (kf < mean)
    upper = ~degenerate & (kf > mean)
    # k == mean exactly: p-value 1 (already set)

    if lower.any():
        kk, pp = kf[lower], pf[lower]
        thr = _st.binom.pmf(kk, n, pp) * _RERR
        # smallest j in [ceil(mean), n + 1] with pmf(j) <= thr (pmf(n + 1) := 0); pmf non-increasing there
        lo = np.ceil(n * pp).astype(np.int64)
        hi = np.full_like(lo, n + 1)
        while np.any(lo < hi):
            mid = (lo + hi) // 2
            ok = np.where(mid <= n, _st.binom.pmf(np.minimum(mid, n), n, pp), 0.0) <= thr
            active = lo < hi
            hi = np.where(active & ok, mid, hi)
            lo = np.where(active & ~ok, mid + 1, lo)
        flat_out[lower] = _st.binom.cdf(kk, n, pp) + _st.binom.sf(lo - 1, n, pp)
    if upper.any():
        kk, pp = kf[upper], pf[upper]
        thr = _st.binom.pmf(kk, n, pp) * _RERR
        # largest j in [-1, floor(mean)] with pmf(j) <= thr (pmf(-1) := 0); pmf non-decreasing there
        lo = np.full(kk.shape, -1, dtype=np.int64)
        hi = np.floor(n * pp).astype(np.int64)
        while np.any(lo < hi):
            mid = (lo + hi + 1) // 2
            ok = _st.binom.pmf(mid, n, pp) <= thr
            active = lo < hi
            lo = np.where(active & ok, mid, lo)
            hi = np.where(active & ~ok, mid - 1, hi)
        flat_out[upper] = np.where(lo >= 0, _st.binom.cdf(lo, n, pp), 0.0) + _st.binom.sf(kk - 1, n, pp)
    np.minimum(out, 1.0, out=out)
    return out


# ---------------------------------------------------------------------------------------------
# draws
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CodecDraws:
    """Sufficient statistics of R draws Q_r(g) of one codec on one vector g (flattened, float64)."""

    g: np.ndarray            # the input, flattened, as the codec saw it (float32 values in float64)
    R: int
    scalers: np.ndarray      # per-draw scaler (max |Q_r(g)|) where the codec has one, else NaN
    right: np.ndarray        # per coordinate: draws with Q_i != 0 and sign(Q_i) == sign(g_i)
    wrong: np.ndarray        # per coordinate: draws with Q_i != 0 and sign(Q_i) != sign(g_i)
    sum: np.ndarray          # Σ_r Q_r,i
    sumsq: np.ndarray        # Σ_r Q_r,i^2
    sq_error: np.ndarray     # per draw ||Q_r(g) - g||^2 (float64)
    sq_norm: np.ndarray      # per draw ||Q_r(g)||^2
    magnitudes_ok: bool      # every non-zero output equals ± its draw's scaler

    @property
    def scaler(self) -> float:
        """The common scaler of all draws (ValueError if the draws used different scalers)."""
        s = np.unique(self.scalers)
        if s.size != 1:
            raise ValueError(f"draws used {s.size} different scalers; the binomial test needs one")
        return float(s[0])

    @property
    def wrong_sign(self) -> int:
        return int(self.wrong.sum())


def accumulate_draws(g, draws: Iterable) -> CodecDraws:
    """Statistics of an iterable of draws, each ``values`` or ``(values, scaler)`` (any shape of g)."""
    g64 = np.asarray(g, dtype=np.float64).reshape(-1)
    n = g64.size
    gpos, gneg = g64 > 0, g64 < 0
    right = np.zeros(n, dtype=np.int64)
    wrong = np.zeros(n, dtype=np.int64)
    s1 = np.zeros(n)
    s2 = np.zeros(n)
    err, norm, scalers = [], [], []
    mags_ok = True
    for d in draws:
        if isinstance(d, tuple):
            v, s = d
        else:
            v, s = d, float("nan")
        v = np.asarray(v, dtype=np.float64).reshape(-1)
        if v.size != n:
            raise ValueError(f"draw has {v.size} values for {n} coordinates")
        nz = v != 0
        agree = np.where(v > 0, gpos, gneg)  # only read where v != 0
        right += nz & agree
        wrong += nz & ~agree
        s1 += v
        s2 += v * v
        d_ = v - g64
        err.append(float(d_ @ d_))
        norm.append(float(v @ v))
        scalers.append(float(s))
        if np.isfinite(s):
            mags_ok &= bool(np.all(np.abs(v[nz]) == s))
    R = len(err)
    if R == 0:
        raise ValueError("no draws")
    return CodecDraws(g64, R, np.array(scalers), right, wrong, s1, s2, np.array(err), np.array(norm),
                      mags_ok)


def codec_draws(codec, g, R: int, seed: int, *, worker: int = 0, shared_scaler=None,
                name: str = "g", roundtrip: Callable | None = None) -> CodecDraws:
    """Run ``codec`` R times on the single layer g with keys StreamKey(seed, step=r, worker, 0).

    Each draw goes encode -> (optional ``roundtrip(message)``, e.g. through bytes) -> decode, so the
    statistics are those of what a receiver sees. The scaler of each draw is the message's.
    """
    shared = None if shared_scaler is None else [shared_scaler]

    def gen():
        for r in range(R):
            msg = codec.encode({name: g}, StreamKey(seed, step=r, worker=worker, layer=0),
                               shared_scalers=shared)
            if roundtrip is not None:
                msg = roundtrip(msg)
            yield codec.decode(msg)[name], float(msg.scalers[0])

    x = np.asarray(g)
    x32 = x.astype(np.float32) if x.dtype.kind == "f" else x
    return accumulate_draws(x32, gen())


# ---------------------------------------------------------------------------------------------
# the exact binomial test
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BinomialTestResult:
    test: str                    # "exact binomial"
    hypothesis: str              # "implemented" | "unbiased"
    alpha: float                 # family-wise level
    R: int
    scaler: float
    n_tests: int                 # Bonferroni family size (all coordinates)
    reject: bool
    min_pvalue: float
    min_pvalue_bonferroni: float
    n_rejected: int              # coordinates with Bonferroni-adjusted p < alpha
    n_infeasible: int            # "unbiased": coordinates with |target| > s (p-value 0)
    wrong_sign: int              # impossible codes (must be 0)
    worst: pd.DataFrame          # the smallest p-values, one row per coordinate
    pvalues: np.ndarray = field(repr=False)
    table: pd.DataFrame = field(repr=False)

    @property
    def rejected(self) -> np.ndarray:
        """Indices of the coordinates rejected at the family-wise level."""
        return np.flatnonzero(self.table["pvalue_bonferroni"].to_numpy() < self.alpha)

    def summary(self) -> dict:
        return {k: getattr(self, k) for k in (
            "test", "hypothesis", "alpha", "R", "scaler", "n_tests", "reject", "min_pvalue",
            "min_pvalue_bonferroni", "n_rejected", "n_infeasible", "wrong_sign")}


def ternary_binomial_test(target, counts, R: int, scaler: float, alpha: float = 1e-3, *,
                          wrong_sign=0, hypothesis: Hypothesis = "implemented",
                          n_worst: int = 10) -> BinomialTestResult:
    """Exact per-coordinate binomial test of a {-s, 0, +s} codec against ``target``.

    target:     the claimed mean E[Q(g)] (g itself for an unbiased codec, clip(g) for a clipped one).
    counts:     per coordinate, the number of the R draws with a non-zero code of sign(target_i).
    scaler:     the (common) scaler s of the draws.
    wrong_sign: count (or per-coordinate counts) of non-zero codes with the other sign; any rejects.
    hypothesis: "implemented" -> p_i = exact_nonzero_probability(f32 |target_i|, s);
                "unbiased"    -> p_i = |target_i| / s (coordinates with |target_i| > s are infeasible).

    Reject iff some Bonferroni-adjusted p-value (n * p_i) is below alpha, or a wrong-sign code occurred.
    """
    if hypothesis not in ("implemented", "unbiased"):
        raise ValueError(f"hypothesis must be 'implemented' or 'unbiased', got {hypothesis!r}")
    t = np.asarray(target).reshape(-1)
    k = np.asarray(counts, dtype=np.int64).reshape(-1)
    if k.shape != t.shape:
        raise ValueError(f"{k.size} counts for {t.size} coordinates")
    s = float(scaler)
    if not (np.isfinite(s) and s >= 0):
        raise ValueError(f"scaler must be finite and >= 0, got {s}")
    if hypothesis == "implemented":
        x = np.abs(t.astype(np.float32))
        p = exact_nonzero_probability(x, np.float32(s))
        infeasible = np.zeros(t.size, dtype=bool)
    else:
        x = np.abs(t.astype(np.float64))
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.where(x == 0, 0.0, x / s if s > 0 else np.inf)
        infeasible = p > 1
        p = np.where(infeasible, 1.0, p)
    pv = binom_two_sided_pvalues(k, R, p)
    pv[infeasible] = 0.0
    m = max(t.size, 1)
    adj = np.minimum(pv * m, 1.0)
    wrong = int(np.sum(wrong_sign))
    table = pd.DataFrame({
        "coordinate": np.arange(t.size), "target": t.astype(np.float64), "p": p,
        "expected_count": R * p, "count": k, "pvalue": pv, "pvalue_bonferroni": adj,
        "infeasible": infeasible,
    })
    worst = table.nsmallest(n_worst, "pvalue", keep="first").reset_index(drop=True)
    n_rej = int(np.sum(adj < alpha))
    min_p = float(pv.min()) if pv.size else 1.0
    return BinomialTestResult(
        test="exact binomial", hypothesis=hypothesis, alpha=alpha, R=int(R), scaler=s,
        n_tests=t.size, reject=bool(n_rej > 0 or wrong > 0), min_pvalue=min_p,
        min_pvalue_bonferroni=float(min(min_p * m, 1.0)), n_rejected=n_rej,
        n_infeasible=int(infeasible.sum()), wrong_sign=wrong, worst=worst, pvalues=pv, table=table)


def binomial_test_of_draws(draws: CodecDraws, target=None, alpha: float = 1e-3, *,
                           hypothesis: Hypothesis = "implemented", scaler: float | None = None,
                           n_worst: int = 10) -> BinomialTestResult:
    """``ternary_binomial_test`` on the counts of ``draws`` (target defaults to the input g).

    Also rejects when some non-zero output was not ± its draw's scaler (the test's premise)."""
    target = draws.g if target is None else np.asarray(target).reshape(-1)
    if not np.array_equal(np.sign(np.asarray(target, dtype=np.float64)), np.sign(draws.g)):
        raise ValueError("the counts are split by sign(g): target must have the signs of g "
                         "(as clip(g) has)")
    s = draws.scaler if scaler is None else float(scaler)
    res = ternary_binomial_test(target, draws.right, draws.R, s, alpha, wrong_sign=draws.wrong,
                                hypothesis=hypothesis, n_worst=n_worst)
    if not draws.magnitudes_ok:
        res = replace(res, reject=True)
    return res


# ---------------------------------------------------------------------------------------------
# the normal-approximation test
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ZTestResult:
    test: str                    # "normal approximation (z)"
    alpha: float
    R: int
    n_tests: int
    z_critical: float            # two-sided Bonferroni critical value
    reject: bool                 # some *valid* coordinate rejects
    reject_naive: bool           # some coordinate rejects, ignoring the validity flags
    n_rejected: int              # valid coordinates rejected
    n_rejected_invalid: int      # rejections at coordinates flagged invalid (likely false alarms)
    n_invalid: int
    validity_checked: bool       # False when no `bound` was given (only zero variance is flagged)
    min_pvalue: float            # over valid coordinates
    worst: pd.DataFrame
    table: pd.DataFrame = field(repr=False)

    def summary(self) -> dict:
        return {k: getattr(self, k) for k in (
            "test", "alpha", "R", "n_tests", "z_critical", "reject", "reject_naive", "n_rejected",
            "n_rejected_invalid", "n_invalid", "validity_checked", "min_pvalue")}


def mean_z_test(samples_sum, samples_sumsq, R: int, target, alpha: float = 1e-3, *,
                variance=None, bound=None, min_events: float = 10.0,
                n_worst: int = 10) -> ZTestResult:
    """Per-coordinate z-test of E[Q_i] = target_i from the sums of R draws, Bonferroni at alpha.

    z_i = (mean_i - target_i) / sqrt(var_i / R), var_i the sample variance (ddof=1) or the given
    ``variance`` (e.g. the formula |g_i|(s - |g_i|) for TernGrad); two-sided normal p-values.

    Validity. The normal approximation is only trustworthy where the sum of the R draws is close
    to normal *at the Bonferroni tail* z_crit. With ``bound`` B >= max |Q_i - E Q_i| (e.g. s for a
    ternary codec), the skewness of the sum is at most 1/sqrt(n_eff), n_eff = R var_i / B^2 (for a
    scaled Bernoulli(p), n_eff = R p (1 - p): the expected number of rare outcomes). The first
    Edgeworth term then changes the tail probability by a relative (z^2 - 1) / (6 sqrt(n_eff)); a
    coordinate is flagged invalid unless that is <= 1/2, i.e. n_eff >= ((z_crit^2 - 1) / 3)^2, and
    n_eff >= ``min_events``. A zero or non-finite variance is always invalid (z undefined).
    Without ``bound`` only the zero-variance case is detected (``validity_checked`` = False).

    ``reject`` uses the valid coordinates only; ``reject_naive`` is what a z-test that ignores the
    flags would say, and ``n_rejected_invalid`` counts its (likely false) alarms.
    """
    s1 = np.asarray(samples_sum, dtype=np.float64).reshape(-1)
    s2 = np.asarray(samples_sumsq, dtype=np.float64).reshape(-1)
    t = np.asarray(target, dtype=np.float64).reshape(-1)
    if not (s1.shape == s2.shape == t.shape):
        raise ValueError("sums, sums of squares and target must have the same size")
    if R < 2:
        raise ValueError("the z-test needs R >= 2 draws")
    mean = s1 / R
    if variance is None:
        var = np.maximum(s2 - s1 * s1 / R, 0.0) / (R - 1)
    else:
        var = np.broadcast_to(np.asarray(variance, dtype=np.float64).reshape(-1), t.shape)
    m = max(t.size, 1)
    z_crit = float(_st.norm.isf(alpha / (2 * m)))
    with np.errstate(divide="ignore", invalid="ignore"):
        se = np.sqrt(var / R)
        z = (mean - t) / se
        z = np.where((se == 0) & (mean == t), 0.0, z)
    pv = 2 * _st.norm.sf(np.abs(z))
    pv = np.where(np.isnan(pv), 1.0, pv)
    invalid = ~(np.isfinite(var) & (var > 0))
    n_eff = np.full(t.shape, np.nan)
    if bound is not None:
        b = np.broadcast_to(np.asarray(bound, dtype=np.float64).reshape(-1), t.shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            n_eff = R * var / (b * b)
        need = max(min_events, ((z_crit ** 2 - 1) / 3) ** 2)
        invalid |= ~(n_eff >= need)
    adj = np.minimum(pv * m, 1.0)
    rej = adj < alpha
    table = pd.DataFrame({
        "coordinate": np.arange(t.size), "target": t, "mean": mean, "var": var, "z": z,
        "pvalue": pv, "pvalue_bonferroni": adj, "n_eff": n_eff, "valid": ~invalid, "reject": rej,
    })
    worst = table.nsmallest(n_worst, "pvalue", keep="first").reset_index(drop=True)
    valid_p = pv[~invalid]
    return ZTestResult(
        test="normal approximation (z)", alpha=alpha, R=int(R), n_tests=t.size, z_critical=z_crit,
        reject=bool(np.any(rej & ~invalid)), reject_naive=bool(np.any(rej)),
        n_rejected=int(np.sum(rej & ~invalid)), n_rejected_invalid=int(np.sum(rej & invalid)),
        n_invalid=int(invalid.sum()), validity_checked=bound is not None,
        min_pvalue=float(valid_p.min()) if valid_p.size else 1.0, worst=worst, table=table)


# ---------------------------------------------------------------------------------------------
# CLT interval for the mean of a per-draw statistic
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MSEIntervalResult:
    test: str                    # "CLT normal interval"
    alpha: float
    R: int
    expected: float
    mean: float
    se: float
    z: float
    pvalue: float
    interval: tuple[float, float]  # mean ± z_{1-alpha/2} se
    reject: bool                 # expected outside the interval

    def summary(self) -> dict:
        return {k: getattr(self, k) for k in (
            "test", "alpha", "R", "expected", "mean", "se", "z", "pvalue", "interval", "reject")}


def mse_interval_test(values_per_draw, expected: float, alpha: float = 1e-3) -> MSEIntervalResult:
    """Two-sided CLT test of E[X] = expected from R i.i.d. per-draw values X_r, at level alpha."""
    x = np.asarray(values_per_draw, dtype=np.float64).reshape(-1)
    R = x.size
    if R < 30:
        raise ValueError(f"the CLT interval needs a few dozen draws at least, got {R}")
    mean = float(x.mean())
    se = float(x.std(ddof=1) / np.sqrt(R))
    zc = float(_st.norm.isf(alpha / 2))
    expected = float(expected)
    if se == 0:
        z = 0.0 if mean == expected else float(np.copysign(np.inf, mean - expected))
    else:
        z = (mean - expected) / se
    pv = float(2 * _st.norm.sf(abs(z)))
    lo, hi = mean - zc * se, mean + zc * se
    return MSEIntervalResult("CLT normal interval", alpha, R, expected, mean, se, float(z), pv,
                             (lo, hi), bool(not (lo <= expected <= hi)))
