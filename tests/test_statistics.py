"""Seeded statistical tests of TernGrad's claims (docs/THEORY.md §1 and §4).

Every test states its level alpha and its seeds. Every must-pass test has a positive control: a
biased or wrong variant that the *same* test, at the same alpha and number of draws, must reject.
A test that cannot reject anything proves nothing.

Unbiasedness uses the exact per-coordinate binomial test (tgsim.analysis.unbiasedness), Bonferroni
over all coordinates at a family-wise alpha = 0.001, keys StreamKey(seed, step=r, worker=0, layer=0)
for draws r = 0..R-1. Reference kernels throughout.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats as st

from tgsim.analysis import unbiasedness as ub
from tgsim.codecs import TernGrad
from tgsim.codecs.terngrad import quantizer as ternary
from tgsim.codecs.packing import sum_codes, unpack
from tgsim.rng import StreamKey, random_words

ALPHA = 1e-3
R = 2000
N_COORD = 3000
CODEC = TernGrad(clip="none", kernels="reference")


# ---------------------------------------------------------------------------------------------
# vectors (seeded)
# ---------------------------------------------------------------------------------------------
def _signs(rng, n):
    return np.where(rng.random(n) < 0.5, -1.0, 1.0)


def make_vector(kind: str, n: int = N_COORD) -> np.ndarray:
    rng = np.random.default_rng({"gaussian": 101, "student_t2": 102, "lognormal": 103,
                                 "spiky": 104, "wide_range": 105}[kind])
    if kind == "gaussian":
        g = rng.standard_normal(n)
    elif kind == "student_t2":
        g = rng.standard_t(2, n)
    elif kind == "lognormal":
        g = _signs(rng, n) * rng.lognormal(0.0, 2.5, n)
    elif kind == "spiky":  # a few huge entries among tiny ones
        g = 1e-3 * rng.standard_normal(n)
        idx = rng.choice(n, 5, replace=False)
        g[idx] = _signs(rng, 5) * rng.uniform(1e2, 1e3, 5)
    elif kind == "wide_range":  # magnitudes spanning 1e-30 .. 1e3
        g = _signs(rng, n) * 10.0 ** rng.uniform(-30, 3, n)
        g[:2] = [1e-30, -1e3]
    else:
        raise ValueError(kind)
    return g.astype(np.float32)


VECTORS = ("gaussian", "student_t2", "lognormal", "spiky", "wide_range")
_DRAWS: dict = {}


def draws_of(kind: str):
    """R TernGrad draws of one vector (cached per module; seed 7 + vector index)."""
    if kind not in _DRAWS:
        _DRAWS[kind] = ub.codec_draws(CODEC, make_vector(kind), R, seed=7 + VECTORS.index(kind))
    return _DRAWS[kind]


def quantizer_draws(g, R_, seed, quantize):
    """Draws of an inline quantizer ``quantize(g, key) -> (values, scaler)``."""
    return ub.accumulate_draws(g, (quantize(g, StreamKey(seed, step=r)) for r in range(R_)))


# ---------------------------------------------------------------------------------------------
# the p-value machinery itself
# ---------------------------------------------------------------------------------------------
def test_vectorized_pvalues_match_scipy_binomtest():
    """binom_two_sided_pvalues == scipy.stats.binomtest(k, n, p).pvalue on 1500 random cases (seed 3)."""
    rng = np.random.default_rng(3)
    for _ in range(1500):
        n = int(rng.integers(1, 2500))
        p = float(rng.choice([rng.random(), rng.random() ** 8, 1e-7 * rng.random(), 1 - rng.random() ** 6]))
        k = int(np.clip(rng.binomial(n, p) + rng.integers(-4, 5), 0, n))
        got = ub.binom_two_sided_pvalues(np.array([k]), n, p)[0]
        assert math.isclose(got, st.binomtest(k, n, p).pvalue, rel_tol=1e-9, abs_tol=1e-300), (k, n, p)
    # degenerate p
    assert list(ub.binom_two_sided_pvalues(np.array([0, 1, 5, 4]), 5, np.array([0, 0, 1, 1]))) == [1, 0, 1, 0]


def test_binomial_test_has_nominal_level_under_the_null():
    """Under H0 (counts drawn from the exact Binomial) the per-coordinate p-values are valid:
    P(p <= u) <= u. Checked on 200000 simulated counts at u = 0.01, 0.05 (seed 4); the tolerance is
    4 binomial standard errors of the empirical rejection rate."""
    rng = np.random.default_rng(4)
    n_c = 200_000
    p = rng.random(n_c) ** 3
    k = rng.binomial(R, p)
    pv = ub.binom_two_sided_pvalues(k, R, p)
    for u in (0.01, 0.05):
        rate = np.mean(pv <= u)
        assert rate <= u + 4 * math.sqrt(u * (1 - u) / n_c), (u, rate)


# ---------------------------------------------------------------------------------------------
# unbiasedness without clipping
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", VECTORS)
def test_unbiased_without_clipping(kind):
    """TernGrad(clip='none') is unbiased: exact binomial test, alpha = 0.001 family-wise
    (Bonferroni over 3000 coordinates), R = 2000 draws, seeds 7..11 (per vector), vector seeds 101..105.

    Both hypotheses must hold: the documented 24-bit rule (p_i = exact_nonzero_probability) and the
    ideal unbiased quantizer (p_i = |g_i|/s; the difference, < 2^-24, is invisible at R = 2000).
    No wrong-sign code may ever occur, and every non-zero output is exactly ±s with s = max|g|."""
    d = draws_of(kind)
    g = d.g
    assert d.scaler == float(np.abs(g).max())
    assert d.magnitudes_ok
    assert d.wrong_sign == 0
    for hyp in ("implemented", "unbiased"):
        res = ub.binomial_test_of_draws(d, alpha=ALPHA, hypothesis=hyp)
        assert res.test == "exact binomial"
        assert not res.reject, res.summary()
        assert res.n_infeasible == 0


def test_positive_control_scaled_probability_rejected():
    """Positive control (a): the rule with p_i multiplied by 0.9 (ternarize with s/0.9, decode with s).
    Same test, alpha = 0.001, R = 2000, Gaussian vector (seed 101), draw seed 21. Must reject, also
    without the max coordinate (whose count R is certain under H0 and would reject on its own)."""
    g = make_vector("gaussian")
    s = float(np.abs(g).max())

    def biased(g, key):
        codes = ternary.ternarize(g, np.float32(s / 0.9), key)
        return codes.astype(np.float32) * np.float32(s), s

    d = quantizer_draws(g, R, 21, biased)
    res = ub.binomial_test_of_draws(d, alpha=ALPHA, hypothesis="implemented")
    assert res.reject, res.summary()
    top = int(np.argmax(np.abs(g)))
    assert np.any(res.rejected != top)
    keep = np.arange(g.size) != top
    sub = ub.ternary_binomial_test(g[keep], d.right[keep], R, s, ALPHA, hypothesis="unbiased")
    assert sub.reject and sub.min_pvalue_bonferroni < 1e-10, sub.summary()


def test_positive_control_clipped_terngrad_on_heavy_tails_rejected():
    """Positive control (a'): TernGrad(clip='explicit') on the Student-t (df=2) vector (seed 102) is
    biased with respect to g: the test of E[g~] = g rejects (alpha = 0.001, R = 2000, draw seed 22),
    exactly at the clipped coordinates (|g_i| > c·σ: no {-s,0,s} quantizer with s = c·σ can have
    mean g_i there). Its bias is the clipping bias: the same draws pass the test of E[g~] = clip(g)."""
    g = make_vector("student_t2")
    codec = TernGrad(clip="explicit", kernels="reference")
    d = ub.codec_draws(codec, g, R, seed=22)
    res = ub.binomial_test_of_draws(d, alpha=ALPHA, hypothesis="unbiased")
    assert res.reject, res.summary()
    bound = ternary.layer_scaling(g, "explicit").clip_bound
    assert np.array_equal(res.rejected, np.flatnonzero(np.abs(g) > bound))
    clipped = np.clip(g, -np.float32(bound), np.float32(bound))
    for hyp in ("implemented", "unbiased"):
        ok = ub.binomial_test_of_draws(d, target=clipped, alpha=ALPHA, hypothesis=hyp)
        assert not ok.reject, ok.summary()


def test_positive_control_sign_codec_rejected():
    """Positive control (b1): a sign codec in ternary form, Q(g) = max|g| · sign(g) (deterministic,
    biased). alpha = 0.001, R = 2000, Gaussian (seed 101) and Student-t (seed 102) vectors."""
    for kind in ("gaussian", "student_t2"):
        g = make_vector(kind)
        s = float(np.abs(g).max())
        d = quantizer_draws(g, R, 23, lambda g, key: (np.float32(s) * np.sign(g), s))
        res = ub.binomial_test_of_draws(d, alpha=ALPHA, hypothesis="unbiased")
        assert res.reject and res.min_pvalue_bonferroni < 1e-100, res.summary()


def test_positive_control_topk_codec_rejected():
    """Positive control (b2): top-k then TernGrad (keep the 10% largest |g_i|, ternarize those with
    the TernGrad rule and s = max|g|, zero the rest; a biased sparsified ternary codec).
    alpha = 0.001, R = 2000, Gaussian (seed 101) and log-normal (seed 103) vectors, draw seed 24."""
    for kind in ("gaussian", "lognormal"):
        g = make_vector(kind)
        s = float(np.abs(g).max())
        k = g.size // 10
        kept = np.zeros(g.size, bool)
        kept[np.argsort(-np.abs(g))[:k]] = True

        def topk(g, key):
            codes = ternary.ternarize(np.where(kept, g, 0).astype(np.float32), np.float32(s), key)
            return codes.astype(np.float32) * np.float32(s), s

        d = quantizer_draws(g, R, 24, topk)
        res = ub.binomial_test_of_draws(d, alpha=ALPHA, hypothesis="unbiased")
        assert res.reject, res.summary()
        assert not np.any(kept[res.rejected]), "kept coordinates are unbiased; only dropped ones may reject"


def test_positive_control_single_wrong_sign_code_rejected():
    """Positive control (c): one single wrong-sign code in R·n = 6·10^6 outputs (TernGrad draws,
    Gaussian vector seed 101, draw seed 25, code of the largest coordinate flipped in draw 1234)
    rejects, although its count statistics are otherwise perfect: a wrong sign is impossible."""
    g = make_vector("gaussian")
    s = float(np.abs(g).max())
    top = int(np.argmax(np.abs(g)))

    def one_flip(g, key):
        codes = ternary.ternarize(g, np.float32(s), key)
        if key.step == 1234:
            codes[top] = -codes[top]
        return codes.astype(np.float32) * np.float32(s), s

    d = quantizer_draws(g, R, 25, one_flip)
    assert d.wrong_sign == 1
    res = ub.binomial_test_of_draws(d, alpha=ALPHA, hypothesis="unbiased")
    assert res.reject and res.wrong_sign == 1, res.summary()


def test_z_test_is_wrong_on_heavy_tails():
    """Why the exact test: on the log-normal vector (seed 103; most |g_i|/s are tiny) with R = 2000
    TernGrad draws (seed 9), at alpha = 0.001 family-wise:

    - the exact binomial test does not reject (the codec is unbiased, test_unbiased_without_clipping);
    - a z-test with the *true* variance |g|(s-|g|) has, computed exactly from the Binomial laws, an
      expected number of false alarms far above the promised family-wise 0.001, and in this seeded
      run it does raise false alarms, every one at a coordinate the validity rule flags;
    - a z-test with the sample variance divides by zero wherever no code was drawn (count 0): those
      coordinates give |z| = inf ("rejections") and are flagged invalid.
    On the Gaussian vector (seed 101) the z-test makes no alarm at all, valid or not."""
    d = draws_of("lognormal")
    g = d.g.astype(np.float64)
    s = d.scaler
    a = np.abs(g)
    p = a / s
    true_var = a * (s - a)

    exact = ub.binomial_test_of_draws(d, alpha=ALPHA, hypothesis="unbiased")
    assert not exact.reject

    zt = ub.mean_z_test(d.sum, d.sumsq, R, g, ALPHA, variance=true_var, bound=s)
    assert zt.test == "normal approximation (z)" and zt.validity_checked
    # exact expected number of coordinates with |z_i| > z_crit under H0 (z_i = (k_i - Rp_i)/sqrt(Rp_i(1-p_i)))
    sd = np.sqrt(R * p * (1 - p))
    hi = np.floor(R * p + zt.z_critical * sd)      # k > hi rejects
    lo = np.ceil(R * p - zt.z_critical * sd)       # k < lo rejects
    ok = sd > 0
    expected_alarms = float(np.sum(st.binom.sf(hi[ok], R, p[ok]) + st.binom.cdf(lo[ok] - 1, R, p[ok])))
    assert expected_alarms > 100 * ALPHA, expected_alarms
    assert zt.reject_naive and zt.n_rejected_invalid > 0, zt.summary()
    assert not zt.reject, zt.summary()          # no alarm at any coordinate where z is trustworthy
    assert zt.n_invalid > g.size // 2           # and most coordinates cannot be tested this way

    zs = ub.mean_z_test(d.sum, d.sumsq, R, g, ALPHA, bound=s)   # sample variance
    zero_var = (d.right == 0) & (g != 0)
    assert zero_var.sum() > 0 and zs.reject_naive and not zs.reject
    assert np.all(~zs.table["valid"].to_numpy()[zero_var])

    dg = draws_of("gaussian")
    zg = ub.mean_z_test(dg.sum, dg.sumsq, R, dg.g, ALPHA, variance=np.abs(dg.g) * (dg.scaler - np.abs(dg.g)),
                        bound=dg.scaler)
    assert not zg.reject_naive, zg.summary()


def test_z_test_positive_control():
    """The z-test is not powerless where it is valid: the p_i·0.9 variant (Gaussian, seed 101, draw
    seed 21, R = 2000, alpha = 0.001) is rejected at coordinates flagged valid."""
    g = make_vector("gaussian")
    s = float(np.abs(g).max())

    def biased(g, key):
        return ternary.ternarize(g, np.float32(s / 0.9), key).astype(np.float32) * np.float32(s), s

    d = quantizer_draws(g, R, 21, biased)
    a = np.abs(g).astype(np.float64)
    zt = ub.mean_z_test(d.sum, d.sumsq, R, g, ALPHA, variance=a * (s - a), bound=s)
    assert zt.reject and zt.n_rejected > 0, zt.summary()


# ---------------------------------------------------------------------------------------------
# the resolution bias is the only bias: all 2^24 thresholds
# ---------------------------------------------------------------------------------------------
TWO24 = 2 ** 24
_T = None


def _all_thresholds():
    global _T
    if _T is None:
        _T = np.arange(TWO24, dtype=np.uint32)
    return _T


def _count_ones(x: np.float32, s: np.float32, chunk: int = 2 ** 22) -> int:
    t = _all_thresholds()
    return sum(int(np.count_nonzero(ternary.ternary_rule(t[i:i + chunk], x, s)))
               for i in range(0, TWO24, chunk))


def _ratio_cases():
    f32 = np.float32
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    cases = []
    for s in (f32(1.0), f32(0.7), f32(3.3e-37), f32(2.5e38), f32(1e-40)):
        for r in (0.0, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, (5 + 0.3) / TWO24, (12345 + 0.5) / TWO24,
                  1 / 3, 0.5, 0.5 + 2.0 ** -24, 0.75 + 1e-9, 1 - 2.0 ** -23, 1 - 2.0 ** -24, 1.0):
            x = f32(r * float(s))
            if float(x) <= float(s):
                cases.append((x, s))
    cases += [(tiny, f32(1.0)),                                   # 1 ulp above 0
              (tiny, f32(1e-38)),
              (np.nextafter(f32(0.5), f32(0)), f32(1.0)), (np.nextafter(f32(0.5), f32(1)), f32(1.0)),
              (np.nextafter(f32(1.0), f32(0)), f32(1.0))]      # 1 - 2^-24
    return cases


@pytest.mark.slow
def test_resolution_bias_is_the_only_bias():
    """For each (x, s) case, count the ones of ternary.ternary_rule over ALL 2^24 thresholds t:
    count == exact_nonzero_probability(x, s) * 2^24 exactly, and 0 <= count/2^24 - x/s < 2^-24
    (in exact rational arithmetic). Deterministic (no sampling)."""
    cases = _ratio_cases()
    assert len(cases) >= 40
    for x, s in cases:
        count = _count_ones(x, s)
        assert count == ternary.exact_nonzero_probability(x, s) * TWO24, (x, s, count)
        gap = Fraction(count, TWO24) - Fraction(float(x)) / Fraction(float(s))
        assert 0 <= gap < Fraction(1, TWO24), (x, s, count, float(gap))
    # saturation (the public code's implicit clipping): x > s gives b = 1 for every t
    assert _count_ones(np.float32(2.0), np.float32(1.0)) == TWO24
    assert _count_ones(np.float32(0.0), np.float32(0.0)) == 0


def test_zero_scaler_rule_and_formula_agree():
    """s = 0: the rule saturates x > 0 (x >= s) and keeps x = 0 at zero; the exact probability says
    the same. (The codec gives s = 0 only to all-zero layers: see test_bad_input.) Deterministic."""
    s = np.float32(0.0)
    for x in (np.float32(1e-45), np.float32(0.0)):
        assert _count_ones(x, s) == ternary.exact_nonzero_probability(x, s) * TWO24


def test_resolution_bias_positive_control():
    """The exhaustive count detects a rule that differs by one threshold: '<=' instead of '<'
    (x = 0.5, s = 1: 2^23 + 1 ones instead of 2^23) and a 23-bit rule (t with its last bit cleared:
    x·2^24 = 12344.5 gives 12346 ones instead of 12345)."""
    t = _all_thresholds()
    x, s = np.float32(0.5), np.float32(1.0)
    le = int(np.count_nonzero(t.astype(np.float64) * float(s) <= float(x) * TWO24))
    assert le != ternary.exact_nonzero_probability(x, s) * TWO24
    x = np.float32((12344 + 0.5) / TWO24)
    t23 = (t >> 1) << 1
    c23 = int(np.count_nonzero(t23.astype(np.float64) * float(s) < float(x) * TWO24))
    assert c23 != ternary.exact_nonzero_probability(x, s) * TWO24


def test_threshold_uses_the_top_24_bits():
    """The codec's decision equals ternary_rule on the top 24 bits of the Philox word (seed 31)."""
    g = make_vector("gaussian", 4096)
    key = StreamKey(31, step=2)
    t = random_words(g.size, key) >> np.uint32(8)
    s = np.float32(np.abs(g).max())
    want = np.where(ternary.ternary_rule(t, np.abs(g), s), np.sign(g), 0)
    assert np.array_equal(ternary.ternarize(g, s, key), want.astype(np.int8))


# ---------------------------------------------------------------------------------------------
# variance
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["gaussian", "student_t2", "spiky", "wide_range"])
def test_second_moment_and_error(kind):
    """E||g~||^2 = s||g||_1 and E||g~ - g||^2 = s||g||_1 - ||g||^2 (= TernGrad.exact_error) inside a
    CLT interval at alpha = 0.001 (each), R = 2000 draws of the unbiasedness runs (seeds as there).
    The bound ||g||^2 <= s||g||_1 <= sqrt(n)||g||^2 holds. Positive controls (same draws, same alpha):
    the error formula without subtracting ||g||^2, and s||g||_2 sqrt(n) for the second moment, are rejected."""
    d = draws_of(kind)
    g = d.g
    s = float(np.abs(g).max())
    l1, l2sq = float(np.abs(g).sum()), float(g @ g)
    m2 = ub.mse_interval_test(d.sq_norm, s * l1, ALPHA)
    err = ub.mse_interval_test(d.sq_error, CODEC.exact_error(g), ALPHA)
    assert math.isclose(CODEC.exact_error(g), s * l1 - l2sq, rel_tol=1e-9)
    assert not m2.reject, m2.summary()
    assert not err.reject, err.summary()
    assert l2sq <= s * l1 <= math.sqrt(g.size) * l2sq
    if l2sq / (s * l1) > 1e-6:   # the wrong formula differs by more than float noise
        wrong = ub.mse_interval_test(d.sq_error, s * l1, ALPHA)
        assert wrong.reject, wrong.summary()
    loose = ub.mse_interval_test(d.sq_norm, s * math.sqrt(l2sq) * math.sqrt(g.size), ALPHA)
    assert loose.reject, loose.summary()


# ---------------------------------------------------------------------------------------------
# clipping on Gaussian gradients
# ---------------------------------------------------------------------------------------------
C = 2.5
N_CLIP = 10 ** 6


def _gaussian_theory(c=C):
    """Clip fraction, relative length change and angle (degrees) of clip(Z, ±c) for Z ~ N(0, 1)."""
    p = 2 * st.norm.sf(c)
    phi = st.norm.pdf(c)
    tail2 = 2 * c * phi + p                   # E[Z^2; |Z| > c]
    a = 1 - tail2 + c * c * p                 # E[min(Z^2, c^2)] = E||clip||^2 / n
    cross = 1 - p                             # E[Z clip(Z)]
    return p, 1 - math.sqrt(a), math.degrees(math.acos(cross / math.sqrt(a)))


def _clip_metrics_with_se(g64: np.ndarray, b: float, c: float = C):
    """(fraction, length change, angle in degrees) of clipping g at ±b = ±c·σ̂, with their
    asymptotic standard errors by the delta method on empirical influence functions.
    b depends on σ̂, so each influence function carries the term d(metric)/db · c · IF(σ̂); the
    derivative of the clip fraction in b needs the density at b (Gaussian, from the sample mean and σ̂)."""
    n = g64.size
    mu, sig = g64.mean(), g64.std()
    a = np.abs(g64)
    over = a > b
    if_sigma = ((g64 - mu) ** 2 - sig * sig) / (2 * sig)
    db = c * if_sigma

    f = over.mean()
    dens = (st.norm.pdf((b - mu) / sig) + st.norm.pdf((b + mu) / sig)) / sig
    if_f = over - f - dens * db

    A = np.minimum(g64 * g64, b * b)
    B = g64 * g64
    Cx = np.minimum(B, b * a)
    mA, mB, mC = A.mean(), B.mean(), Cx.mean()
    if_A = A - mA + (2 * b * f) * db
    if_B = B - mB
    if_C = Cx - mC + np.mean(a * over) * db

    length = 1 - math.sqrt(mA / mB)
    if_len = -0.5 * math.sqrt(mB / mA) * (if_A / mB - mA * if_B / mB ** 2)
    cos = mC / math.sqrt(mA * mB)
    if_cos = if_C / math.sqrt(mA * mB) - 0.5 * mC * (mA * mB) ** -1.5 * (mB * if_A + mA * if_B)
    theta = math.acos(cos)
    if_theta = -if_cos / math.sin(theta)
    se = [float(np.std(x) / math.sqrt(n)) for x in (if_f, if_len, if_theta)]
    return (f, length, math.degrees(theta)), (se[0], se[1], math.degrees(se[2]))


_CLIP_G = None


def clip_vector():
    global _CLIP_G
    if _CLIP_G is None:
        _CLIP_G = np.random.default_rng(2017).standard_normal(N_CLIP).astype(np.float32)
    return _CLIP_G


def test_clipping_gaussian_geometry():
    """Clipping at c·σ (c = 2.5, the codec's own bound f32(c·σ̂)) of n = 10^6 Gaussian values
    (seed 2017): clip fraction, length change and angle agree with the Gaussian values (1.242%,
    1.13%, 2.75°; docs/THEORY.md: 1.24%, 1.1%, 2.75°) within z_{1-α/2}·SE, α = 0.001 per metric, SE the
    delta-method standard error (estimated σ included). Positive control: the same tolerance
    rejects the paper's rough range ends (1% and 1.5% clipped, 2° and 3°)."""
    g = clip_vector()
    sc = ternary.layer_scaling(g, "explicit", C)
    g64 = g.astype(np.float64)
    assert math.isclose(sc.sigma, g64.std(), rel_tol=1e-10)
    assert sc.clip_bound == float(np.float32(C * sc.sigma))
    assert sc.scaler == sc.clip_bound  # some element is clipped, so s = c·σ

    measured, se = _clip_metrics_with_se(g64, sc.clip_bound)
    theory = _gaussian_theory()
    assert (round(100 * theory[0], 2), round(100 * theory[1], 1), round(theory[2], 2)) == (1.24, 1.1, 2.75)
    zc = st.norm.isf(ALPHA / 2)
    for name, m, t, e in zip(("fraction", "length", "angle"), measured, theory, se):
        assert abs(m - t) <= zc * e, (name, m, t, e, (m - t) / e)
    # positive control: the tolerance is tight enough to exclude values a sloppy claim would allow
    for name, m, wrong, e in (("fraction", measured[0], 0.010, se[0]), ("fraction", measured[0], 0.015, se[0]),
                              ("angle", measured[2], 2.0, se[2]), ("angle", measured[2], 3.0, se[2]),
                              ("length", measured[1], 0.010, se[1])):
        assert abs(m - wrong) > zc * e, (name, wrong)
    # codec view: every clipped element is encoded as ±s in every draw (p = 1)
    codes = ternary.ternarize(g, sc.scaler, StreamKey(5), sc.clip_bound)
    over = np.abs(g) > sc.clip_bound
    assert np.array_equal(codes[over], np.sign(g[over]).astype(np.int8))


def test_clipping_se_matches_simulation():
    """The delta-method SEs are real sampling errors: over 400 independent Gaussian vectors of
    n = 10^4 (seed 99) the standard deviation of each measured metric (fraction, length, angle)
    agrees with the average predicted SE within the chi-square interval of a 400-sample SD at
    α = 0.001 (per metric), and the mean is within z_{1-α/2} standard errors of the Gaussian value."""
    rng = np.random.default_rng(99)
    ms, ses = [], []
    for _ in range(400):
        x = rng.standard_normal(10 ** 4)
        b = float(np.float32(C * x.std()))
        m, e = _clip_metrics_with_se(x, b)
        ms.append(m)
        ses.append(e)
    ms, ses = np.array(ms), np.array(ses)
    k = len(ms) - 1
    lo, hi = math.sqrt(st.chi2.ppf(ALPHA / 2, k) / k), math.sqrt(st.chi2.isf(ALPHA / 2, k) / k)
    zc = st.norm.isf(ALPHA / 2)
    for j, (name, t) in enumerate(zip(("fraction", "length", "angle"), _gaussian_theory())):
        sd, pred = float(np.std(ms[:, j], ddof=1)), float(np.mean(ses[:, j]))
        assert lo <= sd / pred <= hi, (name, sd, pred)
        assert abs(ms[:, j].mean() - t) <= zc * sd / math.sqrt(len(ms)), name


@pytest.mark.slow
def test_explicit_clipping_bias_is_the_clipping_bias():
    """E[g~] = clip(g) for TernGrad(clip='explicit') on the n = 10^6 Gaussian vector (seed 2017),
    R = 40 draws (seed 41; 0.15 s per draw at this size), exact binomial test at α = 0.001 family-wise over 10^6 coordinates:
    against clip(g) (documented rule and ideal unbiased) it does not reject; against the raw g
    (ideal unbiased) it rejects, at exactly the clipped coordinates."""
    g = clip_vector()
    codec = TernGrad(clip="explicit", kernels="reference")
    sc = ternary.layer_scaling(g, "explicit", C)
    d = ub.codec_draws(codec, g, 40, seed=41)
    assert d.scaler == sc.scaler and d.wrong_sign == 0 and d.magnitudes_ok
    clipped = np.clip(g, -np.float32(sc.clip_bound), np.float32(sc.clip_bound))
    for hyp in ("implemented", "unbiased"):
        res = ub.binomial_test_of_draws(d, target=clipped, alpha=ALPHA, hypothesis=hyp)
        assert not res.reject, res.summary()
    raw = ub.binomial_test_of_draws(d, alpha=ALPHA, hypothesis="unbiased")
    assert raw.reject
    assert np.array_equal(raw.rejected, np.flatnonzero(np.abs(g) > sc.clip_bound))


# ---------------------------------------------------------------------------------------------
# scaler sharing
# ---------------------------------------------------------------------------------------------
def _workers(N, n=1000, seed=50):
    rng = np.random.default_rng(seed + N)
    return [{"g": (rng.standard_normal(n) * rng.uniform(0.2, 3.0)).astype(np.float32)} for _ in range(N)]


@pytest.mark.parametrize("packing", ["2bit", "base3"])
@pytest.mark.parametrize("N", [2, 8, 127])
def test_scaler_sharing_integer_sum(N, packing):
    """N workers (seed 50 + N), shared s = max_i s_i: the integer sum of the codes straight from the
    payloads equals the sum of the individually unpacked codes, lies in [-N, N] (int8), and
    aggregate(divide_by=N) == f32(f64(s) * intsum / N) bit for bit (also with * (1/N), as documented)."""
    codec = TernGrad(packing=packing, kernels="reference")
    grads = _workers(N)
    shared = np.max([codec.local_scalers(codec.scaling(l)) for l in grads], axis=0)
    msgs = [codec.encode(l, StreamKey(77, step=1, worker=w), shared_scalers=shared) for w, l in enumerate(grads)]
    n = grads[0]["g"].size
    payloads = np.stack([m.parts[0] for m in msgs])
    ints = sum_codes(payloads, n, packing)
    assert ints.dtype == np.int8
    indiv = np.sum([unpack(m.parts[0], n, packing).astype(np.int64) for m in msgs], axis=0)
    assert np.array_equal(ints.astype(np.int64), indiv)
    assert ints.min() >= -N and ints.max() <= N
    assert all(m.scalers[0] == shared[0] for m in msgs)
    s = np.float64(shared[0])
    got = codec.aggregate(msgs, divide_by=N)["g"].view(np.uint32)
    assert np.array_equal(got, (s * indiv / N).astype(np.float32).view(np.uint32))
    assert np.array_equal(got, (s * indiv * (1.0 / N)).astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("N,workers", [(2, (0, 1)), (8, tuple(range(8))), (127, (0, 126))])
def test_scaler_sharing_each_worker_unbiased(N, workers):
    """Each worker's message is unbiased under the shared scaler: exact binomial test with s shared,
    α = 0.001 family-wise per worker, R = 600 draws (keys StreamKey(60, step=r, worker=w)), worker
    vectors from seed 50 + N. Positive control (same draws count, same α): codes drawn with the
    worker's own scaler s_w < s but decoded with the shared s are rejected."""
    codec = TernGrad(kernels="reference")
    grads = _workers(N)
    local = np.array([codec.local_scalers(codec.scaling(l))[0] for l in grads])
    s = float(local.max())
    Rw = 600
    for w in workers:
        g = grads[w]["g"]
        d = ub.codec_draws(codec, g, Rw, seed=60, worker=w, shared_scaler=s)
        assert d.scaler == s
        for hyp in ("implemented", "unbiased"):
            res = ub.binomial_test_of_draws(d, alpha=ALPHA, hypothesis=hyp)
            assert not res.reject, (w, res.summary())
    w = int(np.argmin(local))
    g = grads[w]["g"]
    sw = float(local[w])
    assert sw < s * 0.9
    d = quantizer_draws(g, Rw, 61, lambda g, key: (ternary.ternarize(g, np.float32(sw), key).astype(np.float32)
                                                     * np.float32(s), s))
    res = ub.binomial_test_of_draws(d, alpha=ALPHA, hypothesis="unbiased")
    assert res.reject, res.summary()
