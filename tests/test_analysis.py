"""Tests of the theory checks (`tgsim analyze unbiasedness|variance|bound|assumption1|convergence|
clipping|sharing`), each on tiny defaults, each statistical claim at a stated level alpha and seed,
and each with a positive control proving the check can fail.

Conventions: alpha is family-wise (Bonferroni inside the check) unless said otherwise; every
random quantity is keyed by the seeds given in the docstrings, so every test is deterministic.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from tgsim.analysis import (assumption1, bound, clipping, common, convergence, peers, sharing,
                            unbiased_check, variance)
from tgsim.analysis import unbiasedness as ub
from tgsim.codecs import TernGrad
from tgsim.codecs.message import Message

ALPHA = 1e-3


@pytest.fixture(autouse=True, scope="module")
def _one_numba_thread():
    with common.single_thread():
        yield


def small_shapes(n=400, seed=0, recorded=True):
    shapes = {k: common.synthetic_gradient(k, n, seed) for k in ("gaussian", "lognormal", "sparse")}
    if recorded:
        rec = common.recorded_gradients(steps=5, seed=seed, hidden=(16,), batch=8)
        shapes["mlp:fc1.w"] = rec["fc1.w"]
    return shapes


class BiasedTernGrad:
    """Positive control: keeps coordinate k with probability (1 - delta)|g_k|/s but sends ±s."""

    def __init__(self, delta):
        self.inner = TernGrad(clip="none")
        self.delta = delta

    def encode(self, layers, key, shared_scalers=None):
        s = np.float32(max(float(np.abs(np.asarray(g)).max()) for g in layers.values()))
        msg = self.inner.encode(layers, key, shared_scalers=[np.float32(s / (1 - self.delta))])
        return Message(msg.layout, np.array([s], dtype=np.float32), msg.parts)

    def decode(self, msg):
        return self.inner.decode(msg)


# ---------------------------------------------------------------------------------------------
# 1. unbiasedness
# ---------------------------------------------------------------------------------------------
def test_unbiasedness_check_passes_and_sees_clipping_bias():
    """Exact binomial test, family-wise alpha = 1e-3 (Bonferroni over coordinates), R = 400 draws,
    draw seeds 0 + 1000*shape + clip, vectors: synthetic seed 0 (n = 400) and an MLP layer recorded
    after 5 fp32 steps (seed 0). Unclipped TernGrad is unbiased; both clipped variants are rejected
    as estimators of g (positive control: the coordinates above the bound are infeasible) yet do
    exactly what they document (E = clip(g))."""
    tests, worst = unbiased_check.unbiasedness_tests(small_shapes(), R=400, alpha=ALPHA, seed=0)
    assert set(tests["test"]) == {"exact binomial"}
    none = tests[tests["clip"] == "none"]
    assert not none["reject"].any(), none
    impl = tests[tests["target"] == "implemented wrt clip(g)"]
    assert not impl["reject"].any(), impl
    clipped = tests[(tests["clip"] != "none") & (tests["target"] == "unbiased wrt g")
                    & (tests["fraction_clipped"] > 0)]
    assert len(clipped) >= 6 and clipped["reject"].all()
    assert (clipped["n_infeasible"] > 0).all()
    assert len(worst) == 5 * len(tests)


def test_unbiasedness_positive_control_biased_codec_rejected():
    """Positive control: keep probabilities p(1 - δ) with δ = 1.5 x the δ the exact test detects with
    power 0.9 at R = 600 (Gaussian, n = 400, seed 0; computed by power_curve); same test and alpha
    (1e-3), draw seed 0. Must reject. δ = 0 (the real codec) on the same vector must not."""
    g = common.synthetic_gradient("gaussian", 400, 0)
    delta = unbiased_check.power_curve({"g": g}, Rs=(600,), alpha=ALPHA)["delta_power90"].iloc[0]
    assert 0 < delta < 0.3
    res, _ = unbiased_check.unbiasedness_tests({"g": g}, R=600, alpha=ALPHA, seed=0, clips=("none",),
                                               codec_factory=lambda clip: BiasedTernGrad(1.5 * delta))
    assert res.loc[res["target"] == "unbiased wrt g", "reject"].all()
    ok, _ = unbiased_check.unbiasedness_tests({"g": g}, R=600, alpha=ALPHA, seed=0, clips=("none",))
    assert not ok["reject"].any()


def test_acceptance_region_matches_brute_force():
    """acceptance_region == {k : binomtest p-value >= alpha/n} for 30 coordinates (seed 1), R = 250."""
    rng = np.random.default_rng(1)
    p = np.concatenate([rng.random(26) ** 3, [0.0, 1.0, 1e-6, 0.5]])
    lo, hi = unbiased_check.acceptance_region(p, 250, 0.01)
    ks = np.arange(251)
    for i, pi in enumerate(p):
        pv = ub.binom_two_sided_pvalues(ks, 250, np.full(251, pi))
        acc = np.flatnonzero(pv >= 0.01 / p.size)
        assert acc.min() == lo[i] and acc.max() == hi[i], (pi, lo[i], hi[i], acc.min(), acc.max())
        assert acc.size == hi[i] - lo[i] + 1   # an interval


def test_power_is_exact_against_simulation():
    """The exact power at δ = δ_50 (power 0.5) and δ = 0 against 400 simulated count vectors
    Binomial(R, p(1-δ)) run through ternary_binomial_test (seed 2; n = 200 Gaussian coordinates,
    R = 300, alpha = 0.01). Tolerance: 4 binomial standard errors of the simulated rate. The size
    (δ = 0) is at most alpha."""
    g = common.synthetic_gradient("gaussian", 200, 3)
    p = np.abs(g.astype(np.float64)) / np.abs(g).max()
    R, alpha, sims = 300, 0.01, 400
    d50 = unbiased_check.detectable_bias(p, R, alpha, power=0.5)
    rng = np.random.default_rng(2)
    for delta in (0.0, d50):
        exact = unbiased_check.detection_power(p, R, delta, alpha)
        rej = np.mean([ub.ternary_binomial_test(p, rng.binomial(R, p * (1 - delta)), R, 1.0, alpha,
                                                hypothesis="unbiased").reject for _ in range(sims)])
        assert abs(rej - exact) <= 4 * math.sqrt(max(exact * (1 - exact), 0.01) / sims), (delta, exact, rej)
    assert unbiased_check.detection_power(p, R, 0.0, alpha) <= alpha
    assert abs(unbiased_check.detection_power(p, R, d50, alpha) - 0.5) < 1e-2


def test_detectable_bias_shrinks_like_one_over_sqrt_R():
    """δ_90 (bulk coordinates) at R = 4000 vs 1000: ratio within [0.4, 0.6] (1/sqrt(4) = 0.5)."""
    g = common.synthetic_gradient("student_t3", 500, 0)
    pc = unbiased_check.power_curve({"t": g}, Rs=(1000, 4000), alpha=ALPHA)
    d = pc["delta_power90"].to_numpy()
    assert 0.4 < d[1] / d[0] < 0.6, d
    assert (pc["delta_power90_with_max"] < pc["delta_power90"]).all()


# ---------------------------------------------------------------------------------------------
# 2. variance, peers
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def var_tables():
    shapes = small_shapes(n=300, recorded=False)
    return variance.variance_table(shapes, R=400, alpha=ALPHA, seed=0, qsgd_levels=(1, 4, 32))


def test_variance_matches_exact_formulas(var_tables):
    """CLT interval, two-sided alpha = 1e-3 per test, R = 400 draws, seed 0 (peers: rng [0, shape, 7];
    TernGrad codec: draw seeds 100*shape + clip), shapes n = 300 Gaussian/log-normal/sparse: no exact
    formula (TernGrad none/explicit/implicit incl. the clipping bias, QSGD s = 1, 4, 32, scaled sign,
    sparsification, top-k, stochastic binary, Suresh et al.'s k = 4 levels) is rejected."""
    var, _ = var_tables
    assert len(var) == 3 * (3 + 3 + 5) * 2
    assert not var["reject"].any(), var[var["reject"]]


def test_variance_positive_control_wrong_formulas_rejected():
    """Positive control, same alpha, R and seed: TernGrad's error claimed as s||g||_1 (the second
    moment: the ||g||^2 term forgotten), and QSGD's error claimed without the 1/s^2 (as f(1-f) Σ ||v||^2)
    must both be rejected on every shape."""
    shapes = small_shapes(n=300, recorded=False)

    def tern_wrong(g):
        a = np.abs(g.astype(np.float64))
        return a.max() * a.sum(), a.max() * a.sum()

    def qsgd_wrong(v):
        return peers.qsgd_error(v, 4) * 16, float(v @ v) + peers.qsgd_error(v, 4)

    var, _ = variance.variance_table(shapes, R=400, alpha=ALPHA, seed=0, clips=("none",), qsgd_levels=(4,),
                                     peer_names=("qsgd",),
                                     formulas={"terngrad[none]": tern_wrong, "qsgd[s=4]": qsgd_wrong})
    err = var[var["quantity"] == "error"]
    assert err["reject"].all(), err


def test_published_bounds_and_the_qsgd_correction(var_tables):
    """One-sided CLT 'E > bound' at alpha = 1e-3: no corrected/valid bound is exceeded; the printed
    QSGD second-moment bound min(n/s^2, sqrt(n)/s)||v||^2 is exceeded exactly where min(...) < 1
    (s = 32, n = 300: min = 0.29) and holds where min(...) >= 1 (s = 1, 4)."""
    _, bnd = var_tables
    printed = bnd[bnd["bound"] == "qsgd_printed_second_moment"]
    rest = bnd[bnd["bound"] != "qsgd_printed_second_moment"]
    assert not rest["exceeded"].any(), rest[rest["exceeded"]]
    factor = [peers.qsgd_factor(n, int(s)) for n, s in zip(printed["n"], printed["levels"])]
    assert (printed["exceeded"].to_numpy() == (np.array(factor) < 1)).all()
    assert printed["exceeded"].any() and not printed["exceeded"].all()


def test_qsgd_bound_correction_small_vector():
    """n = 16, s = 8: min(n/s^2, sqrt(n)/s) = 0.25 < 1. E||Q(v)||^2 (R = 4000 draws, seed 5) lies above
    the printed bound 0.25||v||^2 (one-sided z > z_{1-1e-3}) and below the corrected 1.25||v||^2;
    with s = 1 (min = 4) the printed bound holds. A Gaussian v (seed 6)."""
    v = np.random.default_rng(6).standard_normal(16)
    rng = np.random.default_rng(5)
    zc = st.norm.isf(ALPHA)
    for s, printed_fails in ((8, True), (1, False)):
        q = peers.qsgd(v, s, rng, 4000)
        sq = np.einsum("ij,ij->i", q, q)
        b = peers.bounds("qsgd", v, s=s)
        for name, should_fail in (("qsgd_printed_second_moment", printed_fails),
                                  ("qsgd_corrected_second_moment", False)):
            z = (sq.mean() - b[name][1]) / (sq.std(ddof=1) / math.sqrt(sq.size))
            assert (z > zc) == should_fail, (s, name, z)


@pytest.mark.parametrize("clip", ["none", "explicit", "implicit"])
def test_terngrad_moment_helpers_match_the_codec(clip):
    """common.terngrad_error == TernGrad(clip).exact_error (rel. 1e-6: σ is summed in another order)
    on a Student-t(3) vector (seed 12), and the scaler/bound agree with the codec's pass 1."""
    g = common.synthetic_gradient("student_t3", 2000, 12)
    codec = TernGrad(clip=clip)
    assert math.isclose(common.terngrad_error(g, clip)[0], codec.exact_error(g), rel_tol=1e-6)
    sc = codec.scaling({"g": g})[0]
    s, b = common.terngrad_scaling(g, clip)
    assert math.isclose(s[0], sc.scaler, rel_tol=1e-6) and (b[0] == sc.clip_bound or
                                                            math.isclose(b[0], sc.clip_bound, rel_tol=1e-6))


def test_peers_unbiased_and_formulas():
    """Unbiased peers pass a per-coordinate z-test (Bonferroni alpha = 1e-3 over 64 coordinates,
    R = 3000, seed 8; only coordinates with positive variance); the biased ones (scaled sign, top-k)
    are rejected by the same test (positive control). Sparsification probabilities sum to k and
    beat a non-optimal choice with the same budget; the scaled-sign error formula handles zeros."""
    v = np.random.default_rng(9).standard_t(3, 64)
    v[:4] = 0.0
    rng = np.random.default_rng(8)
    for name in peers.PEERS:
        q = peers.draw(name, v, rng, 3000, s=2, k=16)
        z = ub.mean_z_test(q.sum(0), (q * q).sum(0), 3000, v, ALPHA)
        if peers.is_unbiased(name):
            assert not z.reject, name
        else:
            assert z.reject or z.reject_naive, name
    p = peers.sparsification_probabilities(v, 16)
    assert math.isclose(p.sum(), 16, rel_tol=1e-9) and p.max() <= 1
    a = np.abs(v)
    p_flat = np.where(a > 0, 16 / np.count_nonzero(a), 0.0)
    nz = a > 0
    assert peers.random_sparsification_error(v, 16) < np.sum(v[nz] ** 2 * (1 / p_flat[nz] - 1))
    q = peers.scaled_sign(v)[0]
    assert math.isclose(peers.scaled_sign_error(v), float((q - v) @ (q - v)), rel_tol=1e-12)


# ---------------------------------------------------------------------------------------------
# 3. Assumption 3: envelopes
# ---------------------------------------------------------------------------------------------
def test_envelope_lp_is_valid_minimal_and_detects_wrong_fits():
    """Envelope LP on 5000 noisy points y = (1 + 3x)(1 + |N(0, 0.3)|) (seed 10): no point above it;
    it beats every other valid line through two hull points on the objective; positive controls:
    the same envelope lowered by 1 %, a 1 % smaller slope and the least-squares line all leave
    points above (violations > 0)."""
    rng = np.random.default_rng(10)
    x = 10 ** rng.uniform(-4, 1.3, 5000)
    y = (1 + 3 * x) * (1 + np.abs(0.3 * rng.standard_normal(5000)))
    f = bound.fit_envelope(x, y)
    assert f["violations"] == 0 and bound.envelope_violations(f["A"], f["B"], x, y) == 0
    xc = f["x_mid"]
    best = f["A"] + f["B"] * xc
    hull = bound._candidate_points(x, y)
    for i in hull:
        for j in hull:
            if x[j] > x[i]:
                B = (y[j] - y[i]) / (x[j] - x[i])
                A = y[i] - B * x[i]
                if A >= 0 and B >= 0 and bound.envelope_violations(A, B, x, y, rtol=1e-9) == 0:
                    assert best <= A + B * xc + 1e-9 * best
    assert bound.envelope_violations(0.99 * f["A"], f["B"], x, y) > 0 or f["A"] == 0
    assert bound.envelope_violations(f["A"], 0.99 * f["B"], x, y) > 0 or f["B"] == 0
    B_ols, A_ols = np.polyfit(x, y, 1)
    assert bound.envelope_violations(A_ols, B_ols, x, y) > 0


@pytest.fixture(scope="module")
def ls_points():
    return bound.least_squares_points(seeds=(0, 1), steps=150)


def test_bound_fits_on_least_squares(ls_points):
    """Least squares (dim 16, noise 0.5), seeds 0, 1, fp32 and TernGrad training, 150 RM steps, 4
    workers: every fitted envelope lies above all its points; pointwise ||g||^2 <= ||g||_inf||g||_1
    <= sqrt(n)||g||^2; TernGrad's envelope is above SGD's (B ratio >= 1). Positive control: the SGD
    envelope (fit on ||g||^2) is violated by the TernGrad points E||Q(g)||^2."""
    pts = ls_points
    fits = bound.fit_table(pts)
    assert (fits["violations"] == 0).all()
    w = pts[pts["layer"] == "linear.w"]
    assert (w["l2sq"] <= w["terngrad_none"] * (1 + 1e-9)).all()
    assert (w["terngrad_none"] <= math.sqrt(16) * w["l2sq"] * (1 + 1e-9)).all()
    fm = fits[fits["layer"] == "model[layerwise]"].set_index("quantity")
    assert fm.loc["terngrad_none", "mean_envelope_over_sgd"] > 1
    m = pts[pts["layer"] == "model[layerwise]"]
    assert bound.envelope_violations(fm.loc["l2sq", "A"], fm.loc["l2sq", "B"], m["dist2"], m["terngrad_none"]) > 0


def test_mlp_ratios_in_range_and_clipping_narrows_the_gap():
    """MLP on digits (hidden 16), 20 TernGrad steps, every 5: 1 <= ||g||_inf||g||_1/||g||^2 <= sqrt(n)
    per layer and worker; explicit clipping never increases the ratio (s and x both shrink)."""
    df = bound.mlp_ratios(steps=20, every=5, hidden=(16,), batch=8)
    assert (df["ratio_none"] >= 1 - 1e-9).all() and (df["ratio_none"] <= df["sqrt_n"] * (1 + 1e-9)).all()
    assert (df["ratio_explicit"] <= df["ratio_none"] * (1 + 1e-9)).all()
    assert (df.loc[df["layer"] == "fc1.w", "ratio_explicit"] < df.loc[df["layer"] == "fc1.w", "ratio_none"]).any()


# ---------------------------------------------------------------------------------------------
# 4. Assumption 1
# ---------------------------------------------------------------------------------------------
def test_assumption1_holds_on_least_squares_and_fails_on_the_toy():
    """Least squares (seed 0, fp32 and TernGrad, 60 RM steps): (w-w*)^T∇C(w) > 0 at every step and
    the normalised value >= λ_min(H) (a Rayleigh quotient). Positive control: the non-convex toy
    (seed 0) has steps with (w-w*)^T∇C(w) < 0 and Assumption 1 is reported violated."""
    df, lam = assumption1.least_squares_inner(seeds=(0,), steps=60)
    toy = assumption1.toy_inner(steps=60, seed=0)
    summ = assumption1.summarize(pd.concat([df, toy]), lam)
    ls = summ[summ["problem"] == "least_squares"]
    assert ls["assumption1_holds"].all()
    assert (ls["min_normalized"] >= ls["lambda_min_H"] * (1 - 1e-9)).all()
    t = summ[summ["problem"] == "toy_nonconvex"].iloc[0]
    assert not t["assumption1_holds"] and t["min_inner"] < 0 and t["min_cosine"] < -0.5


# ---------------------------------------------------------------------------------------------
# 5. convergence
# ---------------------------------------------------------------------------------------------
def test_convergence_rm_beats_constant_floor():
    """Least squares (dim 16, noise 0.5, cond 4, n = 32768 so no sample is reused), 4 workers x 8.
    TernGrad with Robbins-Monro γ_t = 0.5/(1 + t/50), seeds 0..5, T = 600: the decay exponent of
    E||w-w*||^2 on the tail is negative (< -0.5), and the mean final ||w-w*||^2 is below a third of
    the constant-step (γ = 0.2) floor (positive control: the constant step stalls, seeds 0..2).
    The TernGrad floor exceeds the fp32 floor, and each floor is within a factor 2 of the Lyapunov
    prediction from the noise measured at w* (200 mini-batches)."""
    prob = dict(n=32768)
    rm = convergence.rm_runs(range(6), codecs=("terngrad",), steps=600, lr=0.5, tau=50.0, **prob)
    floors, _ = convergence.floor_runs(range(3), lrs=(0.2,), steps=600, n_batches=200, **prob)
    rm_sum, fl = convergence.summarize(rm, floors, eps=(0.02,), tau=50.0)
    r = rm_sum.iloc[0]
    assert r["slope_vs_t"] < -0.5
    f = fl.set_index("codec")
    assert r["mean_final_dist2"] < f.loc["terngrad", "floor"] / 3
    assert f.loc["terngrad", "floor"] > f.loc["fp32", "floor"]
    assert ((fl["floor_over_pred"] > 0.5) & (fl["floor_over_pred"] < 2)).all(), fl
    assert (fl["V_q"] > 0).sum() == 1


def test_decay_exponent_recovers_known_slopes():
    """decay_exponent on synthetic traces c·t^-k (k = 1, 2; 5 'seeds' with multiplicative noise, seed 11)
    returns slopes within 0.05 of -k."""
    rng = np.random.default_rng(11)
    t = np.arange(0, 2001)
    for k in (1.0, 2.0):
        rows = [pd.DataFrame(dict(seed=s, step=t, dist2=(1 + t) ** -k * np.exp(0.05 * rng.standard_normal(t.size))))
                for s in range(5)]
        d = convergence.decay_exponent(pd.concat(rows), tau=0.0, n_boot=20)
        assert abs(d["slope_vs_t"] + k) < 0.05, (k, d)


# ---------------------------------------------------------------------------------------------
# 6. clipping
# ---------------------------------------------------------------------------------------------
def test_clipping_gaussian_reference_and_controls():
    """Gaussian (n = 10^6, seed 0): 1.24 % clipped, length -1.1 %, angle 2.75° (docs/THEORY.md §1), within
    0.03 %, 0.05 % and 0.05°. Controls: a uniform vector (2.5σ > max) is never clipped (zero bias); a
    Student-t(2) vector loses more length than the Gaussian."""
    ref = clipping.gaussian_reference()
    assert abs(ref["fraction_clipped"] - 0.0124) < 3e-4
    assert abs(ref["length_change"] + 0.011) < 5e-4
    assert abs(ref["angle_deg"] - 2.75) < 0.05
    u = clipping.clip_stats(np.random.default_rng(1).uniform(-1, 1, 5000))
    assert u["fraction_clipped"][0] == 0 and u["bias_rel"][0] == 0 and u["angle_deg"][0] == 0
    t2 = clipping.clip_stats(np.random.default_rng(2).standard_t(2, 100_000))
    assert t2["length_change"][0] < ref["length_change"]


def test_clipping_along_mlp_training():
    """MLP on digits (hidden 16), 10 TernGrad steps with explicit clipping, 4 workers: where elements
    are clipped the bias is > 0 and the angle > 0; bias_share in [0, 1]."""
    df = clipping.mlp_clipping(steps=10, every=5, hidden=(16,), batch=8)
    c = df[df["fraction_clipped"] > 0]
    assert len(c) > 0 and (c["bias_rel"] > 0).all() and (c["angle_deg"] > 0).all()
    assert df["bias_share"].between(0, 1 + 1e-12).all()


# ---------------------------------------------------------------------------------------------
# 7. scaler sharing
# ---------------------------------------------------------------------------------------------
def test_sharing_formula_and_positive_control():
    """8 workers, MLP on digits at init (seed 0), iid and Dirichlet(0.1) shards, 1 batch of 16 per
    worker, R = 150 draws (keys seed 0, worker w): the measured E||Q_i(g_i)-g_i||^2 with the shared
    scaler matches s||g_i||_1 - ||g_i||^2 (CLT, alpha = 1e-3 Bonferroni over the 64 tests) and the
    ratio to the unshared variance is >= 1. Positive control: the same test against the formula with
    the worker's own scaler is rejected."""
    kw = dict(seed=0, at=(0,), schemes=(("iid", None), ("dirichlet", 0.1)), batches=1, R=150, alpha=ALPHA)
    df = sharing.sharing_table(**kw)
    assert len(df) == 64 and not df["reject"].any()
    assert (df["ratio"] >= 1 - 1e-12).all() and (df["ratio"] > 1.5).any()
    bad = sharing.sharing_table(**kw, formula=lambda g, s_sh, s_own: s_own * np.abs(g).sum() - float(g @ g))
    assert bad.loc[bad["ratio"] > 2, "reject"].mean() > 0.5
    summ = sharing.summarize(df)
    assert (summ.loc[summ["layer"] == "model", "aggregate_ratio"] > 1).all()
    # the mean mode: the codec with sharing = "mean" matches var + bias^2 (part of `reject` above);
    # positive control: the MAX's formula claimed for it is rejected
    assert df["pvalue_mean"].notna().sum() == 64
    bad = sharing.sharing_table(**kw, formula_mean=lambda g, s_mean, s_sh: s_sh * np.abs(g).sum() - float(g @ g))
    assert bad.loc[bad["ratio"] > 2, "reject"].mean() > 0.5
    layers = summ[summ["layer"] != "model"]
    assert (layers["mean_over_max"] < 1).all()          # the mean's MSE is below the MAX's here


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def test_cli_registers_all_checks_and_writes_csv(tmp_path, capsys):
    """All seven checks are `tgsim analyze` subcommands; one runs end to end and writes its CSVs."""
    from tgsim.cli import build_parser, main

    p = build_parser()
    for name in ("unbiasedness", "variance", "bound", "assumption1", "convergence", "clipping", "sharing"):
        args = p.parse_args(["analyze", name, "--out", str(tmp_path)])
        assert callable(args.func)
    assert main(["analyze", "assumption1", "--seeds", "1", "--steps", "20", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "assumption1.csv").is_file() and (tmp_path / "assumption1_summary.csv").is_file()
    assert "least_squares" in capsys.readouterr().out


# the CSVs each check writes, and its `run` arguments at the full defaults (as they were before --quick)
CHECK_CSVS = {"unbiasedness": ("unbiasedness", "unbiasedness_worst", "unbiasedness_power", "unbiasedness_pooled"),
              "variance": ("variance", "variance_bounds"),
              "bound": ("bound_points", "bound_fits", "bound_mlp", "bound_mlp_summary"),
              "assumption1": ("assumption1", "assumption1_summary"),
              "convergence": ("convergence_rm", "convergence_floor", "convergence_rm_runs", "convergence_floor_runs",
                              "convergence_traces"),
              "clipping": ("clipping", "clipping_summary"),
              "sharing": ("sharing", "sharing_summary")}
FULL_KWARGS = {"unbiasedness": dict(n=3000, R=2000, alpha=1e-3, seed=0, codec=""),
               "variance": dict(n=3000, R=1000, alpha=1e-3, seed=0),
               "bound": dict(seeds=(0, 1, 2, 3), steps=800, mlp_steps=300),
               "assumption1": dict(seeds=(0, 1, 2), steps=400),
               "convergence": dict(seeds=20, floor_seeds=4, steps=2000, lr=0.5, tau=50.0),
               "clipping": dict(seed=0, steps=300, every=5),
               "sharing": dict(seed=0, R=200)}
# per check: options given explicitly, the `run` arguments they set, and quick values of the others
QUICK_OVERRIDES = {"unbiasedness": (["--R", "150"], dict(R=150), dict(n=300, recorded_steps=5)),
                   "variance": (["--n", "500"], dict(n=500), dict(R=200, recorded_steps=5)),
                   "bound": (["--steps", "50"], dict(steps=50), dict(seeds=(0,), mlp_steps=30)),
                   "assumption1": (["--seeds", "2"], dict(seeds=(0, 1)), dict(steps=50, toy_steps=50)),
                   "convergence": (["--steps", "300"], dict(steps=300), dict(seeds=3, floor_seeds=2, n=8192)),
                   "clipping": (["--every", "4"], dict(every=4), dict(steps=30)),
                   "sharing": (["--R", "70"], dict(R=70), dict(seed=0, at=(0, 20)))}


@pytest.mark.parametrize("check", list(CHECK_CSVS))
def test_quick_check_runs_end_to_end(check, tmp_path, capsys):
    """`tgsim analyze <check> --quick --out DIR` through the real parser: exit 0, every CSV of the
    check written into DIR with rows, the summary and the 'wrote ... to DIR/' line printed."""
    from tgsim.cli import main

    assert main(["analyze", check, "--quick", "--out", str(tmp_path)]) == 0
    for name in CHECK_CSVS[check]:
        assert len(pd.read_csv(tmp_path / f"{name}.csv")) > 0, name
    out = capsys.readouterr().out
    assert f"to {tmp_path}/" in out and "--quick" in out
    assert len(out.splitlines()) > 3


@pytest.fixture
def run_calls(monkeypatch):
    """Every check's `run` replaced by a recorder: the list of the keyword arguments it was called with."""
    import importlib

    from tgsim.analysis.checks_cli import CHECKS

    calls = []
    for c in CHECKS:
        mod = importlib.import_module(f"tgsim.analysis.{c.module}")
        monkeypatch.setattr(mod, "run", lambda out, **kw: calls.append(kw) or {})
    return calls


@pytest.mark.parametrize("check", list(CHECK_CSVS))
def test_quick_values_yield_to_explicit_options_and_full_defaults_stay(check, run_calls, tmp_path):
    """Without --quick `run` gets exactly the full defaults (plus the options given); with --quick its
    small values, except an option given on the command line, which wins."""
    from tgsim.cli import main

    argv, explicit, quick = QUICK_OVERRIDES[check]
    assert main(["analyze", check, "--out", str(tmp_path)]) == 0
    assert run_calls[-1] == FULL_KWARGS[check]
    assert main(["analyze", check, *argv, "--out", str(tmp_path)]) == 0
    assert run_calls[-1] == {**FULL_KWARGS[check], **explicit}
    assert main(["analyze", check, "--quick", *argv, "--out", str(tmp_path)]) == 0
    assert {k: run_calls[-1].get(k) for k in {**explicit, **quick}} == {**explicit, **quick}
