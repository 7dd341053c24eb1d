"""The verdict functions of tgsim.analysis.verdicts on synthetic data whose truth is known.

Each test has a positive control (the claim true by construction: confirmed), a negative control
(false by construction: not confirmed) and, where the test can fail to decide, a case with too few
seeds for the spread (inconclusive, with the seeds a decision would need). α = 0.05 throughout;
the data come from numpy's default_rng with the seed named in each test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tgsim.analysis import verdicts as V


def test_equivalence_positive_negative_and_inconclusive():
    rng = np.random.default_rng(0)
    b = 0.90 + 0.01 * rng.standard_normal(30)
    same = b + 0.001 + 0.002 * rng.standard_normal(30)          # true gap 0.1 point, margin 1 point
    far = b - 0.05 + 0.002 * rng.standard_normal(30)            # true gap -5 points
    r = V.equivalence(same, b, margin=0.01, scale=100, unit=" points")
    assert r["verdict"] == "confirmed" and r["p"] < 0.05 and -1 < r["lo"] < r["hi"] < 1, r
    assert "TOST" in r["test"] and "alpha 0.05" in r["test"] and "30 seed(s)" in r["test"]
    r = V.equivalence(far, b, margin=0.01)
    assert r["verdict"] == "not confirmed" and r["hi"] < -0.01, r
    noisy = b[:3] + 0.004 + 0.02 * rng.standard_normal(3)        # 3 seeds, 2-point spread
    r = V.equivalence(noisy, b[:3], margin=0.01)
    assert r["verdict"] == "inconclusive" and r["seeds_needed"] and r["seeds_needed"] > 3, r


def test_equivalence_seeds_needed_is_the_first_n_that_decides():
    """At the observed mean and spread, seeds_needed seeds put the TOST interval inside the margin and
    one seed fewer does not (checked with exactly that mean and spread)."""
    n = V.seeds_needed(0.002, 0.01, 0.01)
    assert n is not None
    for k, inside in ((n, True), (n - 1, False)):
        z = np.array([1.0, -1.0] * (k // 2) + [0.0] * (k % 2))
        d = 0.002 + 0.01 * z / z.std(ddof=1)
        assert (V.equivalence(d, margin=0.01)["verdict"] == "confirmed") is inside, k
    assert V.seeds_needed(0.02, 0.01, 0.01) is None                 # |diff| >= margin: no n confirms


def test_equivalence_nonfinite_runs_are_counted_not_hidden():
    a = np.array([0.9, 0.91, np.nan, 0.9])
    b = np.array([0.9, 0.9, 0.9, 0.91])
    r = V.equivalence(a, b, margin=0.05, nonfinite="drop")
    assert r["dropped"] == 1 and r["n"] == 3 and "1 non-finite" in r["test"]
    assert V.equivalence(a, b, margin=0.05, nonfinite="fail")["verdict"] == "not confirmed"


def test_welch_equivalence_controls():
    rng = np.random.default_rng(1)
    a, b = 1 + 0.1 * rng.standard_normal(40), 1 + 0.1 * rng.standard_normal(50)
    assert V.equivalence(a, b, margin=0.1, paired=False)["verdict"] == "confirmed"
    assert V.equivalence(a + 0.5, b, margin=0.1, paired=False)["verdict"] == "not confirmed"


def test_noninferiority_controls():
    rng = np.random.default_rng(2)
    b = 0.8 + 0.01 * rng.standard_normal(20)
    better = b + 0.03 + 0.003 * rng.standard_normal(20)          # better by 3 points: no loss
    assert V.noninferiority(better, b, margin=0.01)["verdict"] == "confirmed"
    assert V.equivalence(better, b, margin=0.01)["verdict"] == "not confirmed"   # but not within 1 point
    worse = b - 0.03 + 0.003 * rng.standard_normal(20)
    assert V.noninferiority(worse, b, margin=0.01)["verdict"] == "not confirmed"
    r = V.noninferiority(b[:2] - 0.005 + np.array([0.02, -0.02]), b[:2], margin=0.01)
    assert r["verdict"] == "inconclusive" and r["seeds_needed"] > 2, r


def _runs(slopes: dict, Ms=(1, 2, 4, 8, 16, 32), seeds=(0, 1, 2), noise=0.03, miss=None, rng_seed=3):
    """Synthetic K = C_seed · M^slope · exp(noise·z) per method; `miss` = (method, M): K NaN there."""
    rng = np.random.default_rng(rng_seed)
    rows = []
    for m, b in slopes.items():
        for s in seeds:
            c = 1000 * (1 + 0.2 * s)
            for M in Ms:
                k = c * M ** b * np.exp(noise * rng.standard_normal())
                rows.append(dict(method=m, workers=M, seed=s, K=np.nan if miss == (m, M) else k))
    return pd.DataFrame(rows)


def test_slope_fit_recovers_a_known_slope():
    f = V.slope_fit(*(_runs({"x": -0.7}, noise=0.01)[c] for c in ("workers", "K", "seed")))
    assert f["lo"] < -0.7 < f["hi"] and f["hi"] - f["lo"] < 0.05


def test_slopes_common_range_controls():
    """Positive: every method at slope -1 (confirmed for fp32 against -1, and for each against fp32).
    Negative: a method at slope -0.5. Common range: a method missing its target at M = 32 cuts the
    range to M <= 16 for every method, and the verdicts use that range only."""
    t = V.slopes_common_range(_runs({"fp32": -1.0, "good": -1.0, "bad": -0.5}, miss=("bad", 32)),
                              reference="fp32").set_index("method")
    assert (t.M_hi == 16).all()
    assert t.loc["fp32", "verdict"] == "confirmed" and t.loc["good", "verdict"] == "confirmed"
    assert t.loc["bad", "verdict"] == "not confirmed" and t.loc["bad", "diff_lo"] > 0.15
    assert "margin 0.15" in t.loc["good", "test"] and "M = 1..16" in t.loc["good", "test"]
    noisy = V.slopes_common_range(_runs({"fp32": -1.0, "n": -1.0}, Ms=(1, 2), seeds=(0, 1), noise=0.3), reference="fp32")
    assert set(noisy.verdict) == {"inconclusive"}


def test_a_method_that_never_reaches_the_target_does_not_empty_the_range():
    """A method that missed the target at every M (e.g. random-k at fp32's rate) gets an inconclusive
    row without a slope, after the fitted ones, and the others keep their whole range and verdicts;
    the reference missing leaves every comparison inconclusive."""
    runs = _runs({"fp32": -1.0, "good": -1.0, "never": -1.0})
    runs.loc[runs.method == "never", "K"] = np.nan
    t = V.slopes_common_range(runs, reference="fp32")
    assert list(t.method) == ["fp32", "good", "never"] and t.M_lo.iloc[0] == 1 and t.M_hi.iloc[0] == 32
    t = t.set_index("method")
    assert t.loc["good", "verdict"] == "confirmed" and t.loc["fp32", "verdict"] == "confirmed"
    assert t.loc["never", "verdict"] == "inconclusive" and np.isnan(t.loc["never", "slope"])
    assert "missed the target at M = 1 in 3 of 3 run(s)" in t.loc["never", "test"]
    runs.loc[runs.method == "fp32", "K"] = np.nan
    t = V.slopes_common_range(runs, reference="fp32").set_index("method")
    assert set(t.verdict) == {"inconclusive"} and "the reference fp32 has no slope" in t.loc["good", "test"]


@pytest.mark.parametrize("bad", ["a", "b"])
def test_paired_lengths_must_match(bad):
    with pytest.raises(ValueError):
        V.equivalence([1.0, 2.0], [1.0], margin=0.1) if bad == "a" else V.equivalence([1.0], [1, 2], margin=0.1)


def test_interval_verdict_three_outcomes():
    assert V.interval_verdict(-1.05, -0.95, -1.15, -0.85) == "confirmed"
    assert V.interval_verdict(-0.7, -0.5, -1.15, -0.85) == "not confirmed"
    assert V.interval_verdict(-1.02, -0.82, -1.15, -0.85) == "inconclusive"
    assert V.interval_verdict(-0.4, -0.3, low=-0.5) == "confirmed"
    assert V.interval_verdict(float("nan"), 1.0, 0.0, 2.0) == "inconclusive"


# The report's one rule (module docstring of tgsim.analysis.verdicts), fed small hand-made tables.

def test_a_divergence_is_the_failure_of_the_method_that_diverged():
    """fig03's case: TernGrad diverged on one seed while fp32 did not. The default rule charges it to
    TernGrad ("not confirmed"), however close the other seeds are; when fp32 diverged instead, the
    pair is left out and counted as fp32's, not TernGrad's."""
    fp32 = np.array([0.90, 0.91, 0.92, 0.90])
    tg_diverged = np.array([0.90, np.nan, 0.92, 0.90])
    r = V.equivalence(tg_diverged, fp32, margin=0.01)
    assert r["verdict"] == "not confirmed" and r["failed"] == 1, r
    assert "diverged in 1 of 4" in r["test"]
    assert V.noninferiority(tg_diverged, fp32, margin=0.01)["verdict"] == "not confirmed"
    fp32_diverged = np.array([0.90, np.nan, 0.92, 0.90])
    same = np.array([0.9001, 0.95, 0.9199, 0.9002])
    r = V.equivalence(same, fp32_diverged, margin=0.01)
    assert r["verdict"] == "confirmed" and r["ref_failed"] == 1 and r["n"] == 3, r
    assert "the reference diverged" in r["test"]


def test_identical_arms_are_equivalent_and_not_inferior():
    x = np.array([0.90, 0.91, 0.92])
    assert V.equivalence(x, x.copy(), margin=0.01)["verdict"] == "confirmed"
    assert V.noninferiority(x, x.copy(), margin=0.01)["verdict"] == "confirmed"


def test_a_missed_target_gets_no_ratio():
    """fig08's case: the reference (fp32) missed the target on every seed: no ratio is printed and the
    verdict is undecided; the method missing it is the method's failure."""
    bits, ref = np.array([1.0, 1.1, 0.9]), np.array([7.0, 7.5, 7.2])
    r = V.reached_ratio(bits, ref, [True] * 3, [False] * 3)
    assert r["verdict"] == "inconclusive" and r["text"] == "reference missed (3/3)" and np.isnan(r["ratio"]), r
    r = V.reached_ratio(bits, ref, [True, False, True], [True] * 3)
    assert r["verdict"] == "not confirmed" and r["text"] == "missed (1/3)" and np.isnan(r["ratio"]), r
    r = V.reached_ratio(bits, ref, [True] * 3, [True] * 3)            # positive control
    assert r["verdict"] == "confirmed" and abs(r["ratio"] - np.mean(bits / ref)) < 1e-12 and r["hi"] < 1, r
    r = V.reached_ratio(ref, bits, [True] * 3, [True] * 3)            # negative control: 7x more bits
    assert r["verdict"] == "not confirmed" and r["lo"] > 1, r


def test_settings_that_disagree_are_a_split():
    """fig11's case: one model refutes, the other confirms: "split", not "inconclusive"."""
    assert V.combine(["not confirmed", "confirmed"]) == "split"
    assert V.combine(["confirmed", "confirmed"]) == "confirmed"
    assert V.combine(["not confirmed", "not confirmed"]) == "not confirmed"
    assert V.combine(["confirmed", "inconclusive"]) == "split"           # they disagree: the rows say how
    assert V.combine(["not confirmed", "inconclusive"]) == "split"       # a real loss is not hidden
    assert V.combine(["confirmed", "inconclusive", "not confirmed"]) == "split"
    assert V.combine(["confirmed", "not confirmed"], every=True) == "not confirmed"     # "at every N"
    assert V.combine(["confirmed", "inconclusive"], every=True) == "inconclusive"
    assert V.combine([]) == "n/a"
    with pytest.raises(ValueError, match="not a verdict"):
        V.combine(["maybe"])
