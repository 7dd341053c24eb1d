"""analysis/unbiasedness.py (tgsim.analysis.unbiasedness): the exact binomial, z and MSE tests by
hand, their defaults and validity rules, and the draw accumulation. Expected values are worked out
by hand or with plain NumPy, never with the module under test. (or with scipy.stats)"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
from scipy import stats as st

from tgsim.analysis import unbiasedness as ub


@pytest.mark.mutation
def test_result_reprs_leave_out_the_per_coordinate_arrays():
    """A test result prints as its summary fields and the few worst rows: the per-coordinate p-values
    and the full table (one row per coordinate, a million rows for a large layer) stay out of repr."""
    from tgsim.analysis import unbiasedness as ub

    res = ub.ternary_binomial_test(np.array([0.5, 0.25]), [1, 1], 4, 1.0)
    text = repr(res)
    assert text.startswith("BinomialTestResult(test='exact binomial'") and "worst=" in text
    assert "pvalues=" not in text and "table=" not in text
    z = repr(ub.mean_z_test([2.0], [2.0], 4, [0.5]))
    assert z.startswith("ZTestResult(") and "worst=" in z and "table=" not in z


@pytest.mark.mutation
@pytest.mark.parametrize("k, n, p, want", [
    (2, 9, 0.5000000049999997, 92 / 512),      # lower tail: P(X <= 2) + P(X >= 7), both ≈ 46/512
    (4, 5, 0.49999999166666714, 12 / 32),      # upper tail: P(X <= 1) + P(X >= 4), both ≈ 6/32
])
def test_binomial_p_value_counts_an_outcome_exactly_at_the_tolerance(k, n, p, want):
    """The two-sided p-value sums every outcome j with pmf(j) <= pmf(k) · (1 + 1e-7), ties included
    (scipy.stats.binomtest's definition). At these p, a hair off 1/2 (found by bisection on p), the
    mirror outcome n - k ties exactly in float64 (checked first, with scipy pinned in
    constraints.txt), so it is counted: the p-value is the two tails with the mirror, ≈ 2 · 46/512
    and 2 · 6/32 (p ≈ 1/2), and agrees with binomtest."""
    from tgsim.analysis import unbiasedness as ub
    from scipy import stats as st

    assert st.binom.pmf(n - k, n, p) == st.binom.pmf(k, n, p) * (1 + 1e-7)
    got = ub.binom_two_sided_pvalues(k, n, p).item()
    assert got == pytest.approx(st.binomtest(k, n, p).pvalue, rel=1e-12)
    assert got == pytest.approx(want, rel=1e-6)


@pytest.mark.mutation
@pytest.mark.parametrize("n", [1, 2, 9, 10, 41, 100])
def test_pvalues_at_exact_ties_match_scipy(n):
    """p = 1/2 (and p = 1/3 with n + 1 divisible by 3, where pmf(j) = pmf(j+1) at the mode): the
    outcomes as likely as the observed one, up to scipy's relative 1e-7, count in both tails —
    a tolerance below 1 drops the mirrored tail (p-value halves), a larger one adds outcomes."""
    for p in (0.5, 1 / 3):
        k = np.arange(n + 1)
        got = ub.binom_two_sided_pvalues(k, n, p)
        want = [st.binomtest(int(j), n, p).pvalue for j in k]
        for j in k:
            assert math.isclose(got[j], want[j], rel_tol=1e-9, abs_tol=1e-300), (j, n, p)
    # the symmetric case by hand: n = 2, k = 0 -> P(0) + P(2) = 1/2
    assert ub.binom_two_sided_pvalues(np.array([0]), 2, 0.5)[0] == pytest.approx(0.5, rel=1e-12)


@pytest.mark.mutation
@pytest.mark.parametrize("k", [-1, 6, [0, 6], [-1, 3]])
def test_counts_outside_0_n_are_rejected(k):
    """A count below 0 or above n is not a Binomial(n, p) outcome: ValueError, not a p-value."""
    with pytest.raises(ValueError, match="counts"):
        ub.binom_two_sided_pvalues(np.array(k), 5, 0.5)


@pytest.mark.mutation
@pytest.mark.parametrize("p", [-0.1, 1.5, 1.0 + 1e-12, math.nan])
def test_probabilities_outside_0_1_are_rejected(p):
    """p must lie in [0, 1] (NaN included in the rejection); p = 0 and p = 1 themselves are fine."""
    with pytest.raises(ValueError, match="probabilities"):
        ub.binom_two_sided_pvalues(np.array([1, 2]), 5, np.array([0.5, p]))
    assert list(ub.binom_two_sided_pvalues(np.array([0, 5]), 5, np.array([0.0, 1.0]))) == [1.0, 1.0]


@pytest.mark.mutation
def test_degenerate_probabilities_give_p_value_one_or_zero():
    """p = 0: the count is certainly 0, so k = 0 has p-value 1 and any k > 0 has p-value 0;
    p = 1: k = n has p-value 1, any k < n has 0 (by hand: P(outcome as unlikely as an impossible
    one) = 0). Mixed with ordinary coordinates in one call."""
    n = 7
    k = np.array([0, 1, 7, 7, 6, 0, 3])
    p = np.array([0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5])
    got = ub.binom_two_sided_pvalues(k, n, p)
    assert got[:6].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert got[6] == pytest.approx(st.binomtest(3, 7, 0.5).pvalue, rel=1e-12)


@pytest.mark.mutation
def test_ternary_binomial_test_unbiased_hypothesis_by_hand():
    """s = 1, R = 4, targets (0.5, -0.25, 0, 1, 2): p = |t|/s = (1/2, 1/4, 0, 1, infeasible). Counts
    (2, 1, 0, 4, 4) are each the mean (p-value 1) except the infeasible coordinate (p-value 0): one
    rejection, reject = True; the table has R p as expected counts and n * p-value (capped at 1) as the
    Bonferroni column; the worst row is the infeasible one."""
    t = np.array([0.5, -0.25, 0.0, 1.0, 2.0])
    res = ub.ternary_binomial_test(t, [2, 1, 0, 4, 4], 4, 1.0, 1e-3, hypothesis="unbiased")
    assert res.pvalues.tolist() == [1.0, 1.0, 1.0, 1.0, 0.0]
    assert (res.reject, res.n_rejected, res.n_infeasible, res.wrong_sign) == (True, 1, 1, 0)
    assert (res.min_pvalue, res.min_pvalue_bonferroni, res.n_tests, res.R, res.scaler) == (0.0, 0.0, 5, 4, 1.0)
    assert res.rejected.tolist() == [4]
    tab = res.table
    assert list(tab.columns) == ["coordinate", "target", "p", "expected_count", "count", "pvalue",
                                 "pvalue_bonferroni", "infeasible"]
    assert tab["p"].tolist() == [0.5, 0.25, 0.0, 1.0, 1.0]
    assert tab["expected_count"].tolist() == [2.0, 1.0, 0.0, 4.0, 4.0]
    assert tab["count"].tolist() == [2, 1, 0, 4, 4] and tab["infeasible"].tolist() == [False] * 4 + [True]
    assert tab["pvalue_bonferroni"].tolist() == [1.0, 1.0, 1.0, 1.0, 0.0]
    assert res.worst["coordinate"].tolist()[0] == 4 and len(res.worst) == 5
    assert list(res.worst.columns) == list(tab.columns) and res.worst.index.tolist() == [0, 1, 2, 3, 4]
    assert res.summary() == {
        "test": "exact binomial", "hypothesis": "unbiased", "alpha": 1e-3, "R": 4, "scaler": 1.0, "n_tests": 5,
        "reject": True, "min_pvalue": 0.0, "min_pvalue_bonferroni": 0.0, "n_rejected": 1, "n_infeasible": 1,
        "wrong_sign": 0}


@pytest.mark.mutation
def test_ternary_binomial_test_bonferroni_is_n_times_p():
    """Two coordinates, p = 1/2, R = 10: counts 1 and 5. P-value of k = 1 by hand: P(X <= 1) + P(X >= 9)
    = 2 * 11 / 1024; Bonferroni: 2 * that = 44/1024 (one coordinate alone: 22/1024, no factor). At
    alpha = 0.05 it rejects (0.043 < 0.05), at alpha = 0.04 it does not; wrong-sign codes reject on their own."""
    t = np.array([0.5, 0.5])
    res = ub.ternary_binomial_test(t, [1, 5], 10, 1.0, 0.05, hypothesis="unbiased")
    assert res.pvalues[0] == pytest.approx(22 / 1024, rel=1e-12) and res.pvalues[1] == 1.0
    assert res.table["pvalue_bonferroni"].tolist()[0] == pytest.approx(44 / 1024, rel=1e-12)
    assert res.min_pvalue_bonferroni == pytest.approx(44 / 1024, rel=1e-12)
    assert res.reject and res.n_rejected == 1 and res.rejected.tolist() == [0]
    res = ub.ternary_binomial_test(t, [1, 5], 10, 1.0, 0.04, hypothesis="unbiased")
    assert not res.reject and res.n_rejected == 0 and res.rejected.tolist() == []
    one = ub.ternary_binomial_test(t[:1], [1], 10, 1.0, 0.05, hypothesis="unbiased")
    assert one.min_pvalue_bonferroni == pytest.approx(22 / 1024, rel=1e-12)
    assert one.table["pvalue_bonferroni"].tolist()[0] == pytest.approx(22 / 1024, rel=1e-12)
    both = ub.ternary_binomial_test(t, [5, 5], 10, 1.0, 0.05, hypothesis="unbiased", wrong_sign=[0, 1])
    assert both.reject and both.n_rejected == 0 and both.wrong_sign == 1
    none = ub.ternary_binomial_test(t, [5, 5], 10, 1.0, 0.05)                   # default: no wrong sign
    assert not none.reject and none.min_pvalue == 1.0 and none.min_pvalue_bonferroni == 1.0   # 2 * 1, capped
    empty = ub.ternary_binomial_test(np.zeros(0), [], 10, 1.0)
    assert (empty.n_tests, empty.reject, empty.min_pvalue, empty.min_pvalue_bonferroni) == (0, False, 1.0, 1.0)


@pytest.mark.mutation
def test_ternary_binomial_test_implemented_rule_and_zero_scaler():
    """"implemented": p = min(ceil(2^24 |t| / s), 2^24) / 2^24: exactly 1/2 for t = 0.5, s = 1, and 1 for
    |t| = 2 > s (saturation, not infeasible). s = 0 is a valid scaler (an all-zero layer: p = 0, no
    rejection); a negative or non-finite scaler, an unknown hypothesis or a count array of another size
    is a ValueError. The default hypothesis is "implemented"."""
    res = ub.ternary_binomial_test(np.array([0.5, -2.0]), [1, 4], 4, 1.0)
    assert res.hypothesis == "implemented" and res.table["p"].tolist() == [0.5, 1.0]
    assert res.n_infeasible == 0 and res.pvalues[1] == 1.0
    assert res.pvalues[0] == pytest.approx(st.binomtest(1, 4, 0.5).pvalue, rel=1e-12)
    zero = ub.ternary_binomial_test(np.zeros(3), [0, 0, 0], 5, 0.0)
    assert not zero.reject and zero.pvalues.tolist() == [1.0] * 3 and zero.scaler == 0.0
    zero_u = ub.ternary_binomial_test(np.zeros(3), [0, 0, 0], 5, 0.0, hypothesis="unbiased")
    assert not zero_u.reject and zero_u.n_infeasible == 0
    for s in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="scaler"):
            ub.ternary_binomial_test(np.zeros(3), [0, 0, 0], 5, s)
    with pytest.raises(ValueError, match="hypothesis"):
        ub.ternary_binomial_test(np.zeros(3), [0, 0, 0], 5, 1.0, hypothesis="biased")
    with pytest.raises(ValueError, match="counts"):
        ub.ternary_binomial_test(np.zeros(3), [0, 0], 5, 1.0)


@pytest.mark.mutation
def test_results_are_frozen():
    """The module docstring promises "a small frozen result": assigning a field of CodecDraws or of
    any test result raises dataclasses.FrozenInstanceError."""
    import dataclasses

    draws = ub.accumulate_draws(np.array([0.5, -0.5]), [(np.array([1.0, 0.0]), 1.0)] * 3)
    results = [draws, ub.ternary_binomial_test(np.array([0.5]), [1], 4, 1.0),
               ub.mean_z_test([2.0], [2.0], 4, [0.5]), ub.mse_interval_test(np.arange(40.0), 19.5)]
    for res in results:
        name = dataclasses.fields(res)[1].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(res, name, 0)


@pytest.mark.mutation
def test_accumulate_draws_by_hand():
    """g = (0.5, -0.5, 0, 2), three draws with scaler 1:
    (1, 0, 0, 1), (1, -1, 1, 0), (-1, -1, -1, 1). By hand: right-sign non-zero counts (2, 2, 0, 2);
    wrong-sign ones (1, 0, 2, 0) (every non-zero output at g_i = 0 is wrong, whatever its sign);
    sums (1, -2, 0, 2), sums of squares (3, 2, 2, 2); ||Q - g||^2 per draw 1.5, 5.5, 4.5; ||Q||^2 2, 3, 4."""
    g = np.array([0.5, -0.5, 0.0, 2.0])
    vals = [[1, 0, 0, 1], [1, -1, 1, 0], [-1, -1, -1, 1]]
    d = ub.accumulate_draws(g, [(np.array(v, np.float32), 1.0) for v in vals])
    assert d.R == 3 and d.g.tolist() == g.tolist()
    assert d.right.tolist() == [2, 2, 0, 2] and d.wrong.tolist() == [1, 0, 2, 0] and d.wrong_sign == 3
    assert d.sum.tolist() == [1, -2, 0, 2] and d.sumsq.tolist() == [3, 2, 2, 2]
    assert d.sq_error.tolist() == [1.5, 5.5, 4.5] and d.sq_norm.tolist() == [2, 3, 4]
    assert d.magnitudes_ok and d.scalers.tolist() == [1.0] * 3 and d.scaler == 1.0


@pytest.mark.mutation
def test_accumulate_draws_without_scalers_and_bad_draws():
    """Plain draws (no scaler): scalers are NaN and the magnitude premise is not checked; a non-zero
    output other than ± its draw's scaler clears magnitudes_ok; draws with different scalers have no
    common scaler (ValueError); a draw of another size, or no draw at all, is a ValueError."""
    g = np.array([[0.5, -0.25]])                       # any shape: flattened
    d = ub.accumulate_draws(g, [np.array([0.3, -0.7]), np.array([0.0, 0.1])])
    assert d.R == 2 and np.isnan(d.scalers).all() and d.magnitudes_ok
    assert d.right.tolist() == [1, 1] and d.wrong.tolist() == [0, 1]
    bad = ub.accumulate_draws(g, [(np.array([1.0, 0.0]), 1.0), (np.array([0.5, 0.0]), 1.0)])
    assert not bad.magnitudes_ok
    mixed = ub.accumulate_draws(g, [(np.array([1.0, 0.0]), 1.0), (np.array([2.0, 0.0]), 2.0)])
    assert mixed.magnitudes_ok
    with pytest.raises(ValueError, match="different scalers"):
        mixed.scaler
    with pytest.raises(ValueError, match="3 values for 2"):
        ub.accumulate_draws(g, [np.zeros(3)])
    with pytest.raises(ValueError, match="no draws"):
        ub.accumulate_draws(g, [])


class _RecordingCodec:
    """A stand-in codec: records each encode call and sends ±scaler by the sign of g (scaler 2)."""

    def __init__(self):
        self.calls = []

    def encode(self, layers, key, shared_scalers=None):
        self.calls.append((dict(layers), key, shared_scalers))
        (name, g), = layers.items()
        s = 2.0 if shared_scalers is None else shared_scalers[0]
        return types.SimpleNamespace(name=name, values=np.sign(g) * s, scalers=np.array([s], np.float32))

    def decode(self, msg):
        return {msg.name: msg.values}


@pytest.mark.mutation
def test_codec_draws_keys_shared_scaler_roundtrip_and_input_precision():
    """codec_draws: draw r encodes {name: g} with StreamKey(seed, step=r, worker, layer=0) and
    shared_scalers [s] (None when no s is given), passes each message through `roundtrip` when given,
    and records each message's scaler. Statistics are of g as float32 for a float input (0.1 in
    float64 -> f32(0.1)), of g itself for an integer input."""
    from tgsim.rng import StreamKey

    codec = _RecordingCodec()
    seen = []
    g = np.array([0.1, -3.0])
    d = ub.codec_draws(codec, g, 3, seed=5, worker=2, shared_scaler=4.0, name="x",
                       roundtrip=lambda m: seen.append(m) or m)
    assert [c[1] for c in codec.calls] == [StreamKey(5, step=r, worker=2, layer=0) for r in range(3)]
    assert all(c[2] == [4.0] and list(c[0]) == ["x"] for c in codec.calls) and len(seen) == 3
    assert d.scalers.tolist() == [4.0] * 3 and d.sum.tolist() == [12.0, -12.0]
    assert d.g.tolist() == [float(np.float32(0.1)), -3.0]
    codec2 = _RecordingCodec()
    d2 = ub.codec_draws(codec2, np.array([1, -2, 0]), 2, seed=1)
    assert [c[2] for c in codec2.calls] == [None, None] and list(codec2.calls[0][0]) == ["g"]
    assert [c[1] for c in codec2.calls] == [StreamKey(1, step=r, worker=0, layer=0) for r in range(2)]
    assert d2.scalers.tolist() == [2.0, 2.0] and d2.g.tolist() == [1.0, -2.0, 0.0]


@pytest.mark.mutation
def test_mean_z_test_by_hand():
    """R = 4 draws per coordinate: (1,1,0,0), (1,1,1,1), (2,0,0,0) -> sums (2, 4, 2), sums of squares
    (2, 4, 4), means (1/2, 1, 1/2), sample variances (ddof 1) (1/3, 0, 1). Targets (-1, 1, -1.5):
    z = (3/2) / sqrt(1/12) = 5.196, 0 (zero variance and mean = target), (2) / (1/2) = 4; two-sided
    p = 2 sf(|z|); Bonferroni over 3. With bound B = 1 and min_events 4: n_eff = R var / B^2 =
    (4/3, 0, 4): coordinate 0 (4/3 < 4) and 1 (zero variance) are invalid, coordinate 2 (n_eff = 4,
    exactly the minimum) is valid. So: both 0 and 2 reject naively, only 2 counts."""
    s1, s2, t = [2.0, 4.0, 2.0], [2.0, 4.0, 4.0], [-1.0, 1.0, -1.5]
    res = ub.mean_z_test(s1, s2, 4, t, 0.1, bound=1.0, min_events=4.0)
    z = [1.5 / math.sqrt(1 / 12), 0.0, 4.0]
    tab = res.table
    assert tab["mean"].tolist() == [0.5, 1.0, 0.5]
    assert tab["var"].tolist() == pytest.approx([1 / 3, 0.0, 1.0], rel=1e-15)
    assert tab["z"].tolist() == pytest.approx(z, rel=1e-12)
    pv = [2 * st.norm.sf(abs(v)) for v in z]
    assert tab["pvalue"].tolist() == pytest.approx(pv, rel=1e-12)
    assert tab["pvalue_bonferroni"].tolist() == pytest.approx([min(3 * p, 1.0) for p in pv], rel=1e-12)
    assert tab["n_eff"].tolist() == pytest.approx([4 / 3, 0.0, 4.0], rel=1e-15)
    assert tab["valid"].tolist() == [False, False, True] and tab["reject"].tolist() == [True, False, True]
    assert res.z_critical == pytest.approx(st.norm.isf(0.1 / 6), rel=1e-12)
    assert (res.reject, res.reject_naive, res.n_rejected, res.n_rejected_invalid, res.n_invalid) == (True, True, 1, 1, 2)
    assert res.validity_checked and res.min_pvalue == pytest.approx(pv[2], rel=1e-12)
    assert res.n_tests == 3 and res.R == 4 and res.test == "normal approximation (z)"
    assert list(tab.columns) == ["coordinate", "target", "mean", "var", "z", "pvalue", "pvalue_bonferroni",
                                 "n_eff", "valid", "reject"]
    assert res.worst["coordinate"].tolist() == [0, 2, 1] and list(res.worst.columns) == list(tab.columns)
    assert set(res.summary()) == {"test", "alpha", "R", "n_tests", "z_critical", "reject", "reject_naive",
                                  "n_rejected", "n_rejected_invalid", "n_invalid", "validity_checked", "min_pvalue"}
    assert all(res.summary()[k] == getattr(res, k) for k in res.summary())
    per = ub.mean_z_test(s1, s2, 4, t, 0.1, bound=[1.0, 1.0, 1.0], min_events=4.0)   # a bound per coordinate
    assert per.table["n_eff"].tolist() == tab["n_eff"].tolist() and per.n_rejected == 1
    # an undefined z (a NaN variance) gets p-value 1 and is invalid
    nan = ub.mean_z_test([2.0], [2.0], 4, [0.0], 0.1, variance=math.nan)
    assert nan.table["pvalue"].tolist() == [1.0] and nan.n_invalid == 1 and not nan.reject_naive
    assert nan.min_pvalue == 1.0                          # no valid coordinate: nothing to reject
    # min_events above n_eff = 4: coordinate 2 becomes invalid too
    assert not ub.mean_z_test(s1, s2, 4, t, 0.1, bound=1.0, min_events=4.5).reject


@pytest.mark.mutation
def test_mean_z_test_without_bound_given_variance_and_errors():
    """Without `bound` only a zero variance is invalid (validity_checked False). A given variance
    replaces the sample variance: variance 1 for all, target 0 -> z = mean / (1/2) = (1, 2, 1). A zero
    variance with mean != target gives z = inf, p = 0 (rejected, but flagged invalid). R = 1 (no sample
    variance) and sizes that differ are ValueErrors."""
    s1, s2 = [2.0, 4.0, 2.0], [2.0, 4.0, 4.0]
    res = ub.mean_z_test(s1, s2, 4, [-1.0, 0.5, -1.5], 0.1)
    assert not res.validity_checked and res.table["valid"].tolist() == [True, False, True]
    assert (res.n_rejected, res.n_rejected_invalid, res.n_invalid) == (2, 1, 1)
    assert res.table["z"].tolist()[1] == math.inf and res.table["pvalue"].tolist()[1] == 0.0
    assert np.isnan(res.table["n_eff"]).all()
    given = ub.mean_z_test(s1, s2, 4, [0.0, 0.0, 0.0], 0.1, variance=1.0)
    assert given.table["z"].tolist() == [1.0, 2.0, 1.0] and given.table["var"].tolist() == [1.0] * 3
    assert ub.mean_z_test([1.0], [1.0], 2, [0.5]).R == 2
    with pytest.raises(ValueError, match="R >= 2"):
        ub.mean_z_test([1.0], [1.0], 1, [0.5])
    for a, b, c in (([1.0, 2.0], [1.0], [0.0]), ([1.0], [1.0, 2.0], [0.0]), ([1.0], [1.0], [0.0, 1.0])):
        with pytest.raises(ValueError, match="same size"):
            ub.mean_z_test(a, b, 4, c)


@pytest.mark.mutation
def test_mse_interval_test_by_hand():
    """x = 0..39: mean 19.5, se = sd / sqrt(40) with sd^2 = Σ (x - 19.5)^2 / 39 = 410/3; the interval
    is mean ± z_{1 - alpha/2} se; an expected value on its boundary is inside (no rejection), one float
    step outside rejects; z = (mean - expected) / se, p = 2 sf(|z|). A constant sample has se = 0: z = 0
    if it equals the expected value, else ±inf (p = 0). Fewer than 30 draws is a ValueError."""
    x = np.arange(40.0)
    se = math.sqrt(410 / 3) / math.sqrt(40)
    zc = st.norm.isf(0.01 / 2)
    res = ub.mse_interval_test(x, 18.0, 0.01)
    assert res.test == "CLT normal interval" and res.R == 40 and res.mean == 19.5 and res.expected == 18.0
    assert res.se == pytest.approx(se, rel=1e-12) and res.z == pytest.approx(1.5 / se, rel=1e-12)
    assert res.pvalue == pytest.approx(2 * st.norm.sf(1.5 / se), rel=1e-12) and not res.reject
    lo, hi = res.interval
    assert lo == pytest.approx(19.5 - zc * se, rel=1e-12) and hi == pytest.approx(19.5 + zc * se, rel=1e-12)
    assert not ub.mse_interval_test(x, lo, 0.01).reject and not ub.mse_interval_test(x, hi, 0.01).reject
    assert ub.mse_interval_test(x, np.nextafter(lo, -np.inf), 0.01).reject
    assert ub.mse_interval_test(x, np.nextafter(hi, np.inf), 0.01).reject
    assert ub.mse_interval_test(x, 21.0, 0.01).z == pytest.approx(-1.5 / se, rel=1e-12)
    assert ub.mse_interval_test(x, 19.5).interval[1] - 19.5 == pytest.approx(st.norm.isf(0.0005) * se, rel=1e-12)
    const = np.full(30, 2.0)
    same = ub.mse_interval_test(const, 2.0)
    assert (same.z, same.pvalue, same.reject, same.se) == (0.0, 1.0, False, 0.0)
    above = ub.mse_interval_test(const, 1.0)
    assert (above.z, above.pvalue, above.reject) == (math.inf, 0.0, True)
    assert ub.mse_interval_test(const, 3.0).z == -math.inf
    assert set(same.summary()) == {"test", "alpha", "R", "expected", "mean", "se", "z", "pvalue", "interval", "reject"}
    assert all(same.summary()[k] == getattr(same, k) for k in same.summary())
    with pytest.raises(ValueError, match="got 29"):
        ub.mse_interval_test(np.arange(29.0), 1.0)


@pytest.mark.mutation
def test_binomial_test_of_draws_target_scaler_and_magnitudes():
    """binomial_test_of_draws: the target defaults to g; a target of other signs than g is a
    ValueError (the counts are split by sign(g)); a given scaler replaces the draws' own; draws whose
    non-zero outputs are not ± their scaler reject whatever the counts. g = (1/2, -1/2), 4 draws, each
    coordinate non-zero in 2 of them: the mean count under p = 1/2, p-value 1, no rejection."""
    g = np.array([0.5, -0.5])
    vals = [[1, 0], [1, -1], [0, -1], [0, 0]]
    d = ub.accumulate_draws(g, [(np.array(v, np.float64), 1.0) for v in vals])
    res = ub.binomial_test_of_draws(d, hypothesis="unbiased")
    assert not res.reject and res.pvalues.tolist() == [1.0, 1.0] and res.table["target"].tolist() == [0.5, -0.5]
    assert res.alpha == 1e-3 and res.scaler == 1.0
    assert ub.binomial_test_of_draws(d, target=[0.25, -0.5], hypothesis="unbiased").table["p"].tolist() == [0.25, 0.5]
    with pytest.raises(ValueError, match="signs of g"):
        ub.binomial_test_of_draws(d, target=[0.5, 0.5])
    res2 = ub.binomial_test_of_draws(d, hypothesis="unbiased", scaler=2.0)
    assert res2.scaler == 2.0 and res2.table["p"].tolist() == [0.25, 0.25]
    off = ub.accumulate_draws(g, [(np.array(v, np.float64) * 0.5, 1.0) for v in vals])
    assert not off.magnitudes_ok and ub.binomial_test_of_draws(off, hypothesis="unbiased").reject


@pytest.mark.mutation
def test_default_alpha_and_number_of_worst_rows():
    """Documented defaults: alpha = 1e-3 for every test, the 10 smallest p-values in `worst`, and
    min_events = 10 for the z-test's validity: with R = 40 draws of variance 1/4 and B = 1, n_eff =
    R var / B^2 = 10 is valid (exactly the minimum; at alpha = 0.01 and one coordinate the Edgeworth
    bound ((z^2 - 1)/3)^2 = 3.5 is below 10), and R = 39 (n_eff = 9.75) is not."""
    n = 20
    t = np.full(n, 0.5)
    b = ub.ternary_binomial_test(t, np.full(n, 2), 4, 1.0, hypothesis="unbiased")
    assert b.alpha == 1e-3 and len(b.worst) == 10
    z = ub.mean_z_test(np.full(n, 20.0), np.full(n, 20.0), 40, t, variance=0.25)
    assert z.alpha == 1e-3 and len(z.worst) == 10
    one = ub.mean_z_test([20.0], [20.0], 40, [0.5], 0.01, variance=0.25, bound=1.0)
    assert one.z_critical == pytest.approx(st.norm.isf(0.01 / 2), rel=1e-12)     # one test: no Bonferroni factor
    assert ((one.z_critical ** 2 - 1) / 3) ** 2 < 10 and one.n_invalid == 0
    assert ub.mean_z_test([20.0], [20.0], 39, [0.5], 0.01, variance=0.25, bound=1.0).n_invalid == 1
    assert ub.mse_interval_test(np.arange(40.0), 0.0).alpha == 1e-3
    d = ub.accumulate_draws(t, [(np.full(n, 1.0), 1.0), (np.zeros(n), 1.0)])
    r = ub.binomial_test_of_draws(d)
    assert r.alpha == 1e-3 and len(r.worst) == 10 and r.hypothesis == "implemented"


@pytest.mark.mutation
def test_a_p_value_equal_to_alpha_does_not_reject():
    """Reject iff the Bonferroni-adjusted p-value is *below* alpha: with alpha set to exactly a
    coordinate's adjusted p-value, that coordinate is not rejected (binomial test: `reject`,
    `n_rejected`, `rejected`; z-test: `reject`, `n_rejected`), and with alpha one float step above it, it is."""
    t = np.array([0.5, 0.5])
    a = ub.ternary_binomial_test(t, [1, 5], 10, 1.0, 0.05, hypothesis="unbiased").table["pvalue_bonferroni"][0]
    at = ub.ternary_binomial_test(t, [1, 5], 10, 1.0, a, hypothesis="unbiased")
    assert (at.reject, at.n_rejected, at.rejected.tolist()) == (False, 0, [])
    above = ub.ternary_binomial_test(t, [1, 5], 10, 1.0, np.nextafter(a, 1.0), hypothesis="unbiased")
    assert (above.reject, above.n_rejected, above.rejected.tolist()) == (True, 1, [0])
    za = ub.mean_z_test([2.0, 2.0], [4.0, 4.0], 4, [-1.5, 0.5], 0.1).table["pvalue_bonferroni"][0]
    zat = ub.mean_z_test([2.0, 2.0], [4.0, 4.0], 4, [-1.5, 0.5], za)
    assert (zat.reject, zat.n_rejected, zat.table["reject"].tolist()) == (False, 0, [False, False])
    assert ub.mean_z_test([2.0, 2.0], [4.0, 4.0], 4, [-1.5, 0.5], np.nextafter(za, 1.0)).n_rejected == 1


@pytest.mark.mutation
@pytest.mark.parametrize("alpha", [1e-3, 1e-6])
def test_z_test_validity_threshold_is_the_edgeworth_bound(alpha):
    """Validity needs n_eff >= ((z_crit^2 - 1) / 3)^2 (the docstring's Edgeworth condition) when that
    exceeds min_events: one coordinate, bound 1, given variance v and R = 100, so n_eff = 100 v; 0.1 %
    above the bound is valid, 0.1 % below is not (z_crit = isf(alpha / 2): 10.7 at 1e-3, 59 at 1e-6)."""
    need = ((st.norm.isf(alpha / 2) ** 2 - 1) / 3) ** 2
    assert need > 1
    for factor, invalid in ((1.001, 0), (0.999, 1)):
        res = ub.mean_z_test([0.0], [0.0], 100, [0.0], alpha, variance=need * factor / 100, bound=1.0,
                             min_events=1.0)
        assert res.n_invalid == invalid, factor
