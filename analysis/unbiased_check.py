"""`tgsim analyze unbiasedness`: the exact test on TernGrad over gradient shapes, and its power.

Part 1 (``unbiasedness_tests``): for every gradient shape (Gaussian, Student-t3, log-normal,
sparse, and an MLP's per-layer gradients recorded from a short fp32 run, or with ``model`` those of a
torch.nn.Module factory, named 'model:<parameter name>') and every clipping mode
(none / explicit / implicit) draw R codes through the real codec (encode -> decode,
``unbiasedness.codec_draws``) and run the exact per-coordinate binomial test
(``unbiasedness.binomial_test_of_draws``, Bonferroni over all coordinates, family-wise alpha)
against two targets:

* ``unbiased wrt g``      -- hypothesis "unbiased", target the raw gradient g: E[Q(g)] = g.
  Holds without clipping; with clipping every |g_k| above the clip bound is *infeasible* for a
  {-s, 0, s} code with that s (p-value 0): clipping is biased, and the test says so.
* ``implemented wrt clip(g)`` -- hypothesis "implemented" (the codec's documented 24-bit rule),
  target E[Q(g)] = sign(g) min(|g|, bound): the codec does exactly what it documents.

The same draws also go through the normal-approximation z-test (``unbiasedness.mean_z_test``) with
its validity flags, to show where the naive z-test raises false alarms (heavy tails).

Part 2 (``power_curve``): the smallest multiplicative bias the exact test detects. A codec whose
keep probabilities are p_i (1 - δ) instead of p_i = |g_i|/s gives counts Binomial(R, p_i (1 - δ)).
The test accepts coordinate i iff its count lies in the acceptance interval [lo_i, hi_i] of
Binomial(R, p_i) at level alpha / n (found exactly, by bisection on the monotone p-value), so

    power(δ) = 1 - Π_i P(lo_i <= Binomial(R, p_i (1 - δ)) <= hi_i)

is computed exactly (no simulation), and ``detectable_bias`` solves power(δ) = target (0.5, 0.9,
0.99) by bisection. power(0) is the test's exact size (<= alpha). Reported for R = 100 .. 10000.

Part 3 (``pooled_tests``): the pooled z-test of tgsim.analysis.pooled_bias on the same shapes and
clipping modes (R draws, the projections on g, sign(g) and sign(g) on the smallest quarter of |g|),
with the smallest relative bias each direction detects at alpha with power 0.99 (its formula;
tests/test_pooled_bias.py checks it by simulation).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as _st

from tgsim.analysis import unbiasedness as ub
from tgsim.analysis.common import clip_values, gradient_shapes, terngrad_scaling
from tgsim.analysis.pooled_bias import decoded_draws
from tgsim.codecs import TernGrad

CLIPS = ("none", "explicit", "implicit")
R_GRID = (100, 300, 1000, 3000, 10000)


# ---------------------------------------------------------------------------------------------
# exact power of the Bonferroni binomial test against a multiplicative bias
# ---------------------------------------------------------------------------------------------
def acceptance_region(p, R: int, alpha: float, n_tests: int | None = None):
    """Per coordinate, the counts [lo, hi] the exact test accepts (p-value >= alpha / n_tests)."""
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    m = p.size if n_tests is None else int(n_tests)
    thr = alpha / max(m, 1)
    lo = np.zeros(p.size, dtype=np.int64)
    hi = np.full(p.size, R, dtype=np.int64)
    zero, one = p == 0, p == 1
    hi[zero] = 0
    lo[one] = R
    mid_ = ~(zero | one)
    pp = p[mid_]
    # lower end: smallest k in [0, floor(R p)] with pv(k) >= thr (pv non-decreasing there)
    a = np.zeros(pp.size, dtype=np.int64)
    b = np.floor(R * pp).astype(np.int64)
    while np.any(a < b):
        act = a < b
        m_ = (a + b) // 2
        ok = np.ones(pp.size, dtype=bool)
        ok[act] = ub.binom_two_sided_pvalues(m_[act], R, pp[act]) >= thr
        b = np.where(act & ok, m_, b)
        a = np.where(act & ~ok, m_ + 1, a)
    lo[mid_] = a
    # upper end: largest k in [ceil(R p), R] with pv(k) >= thr (pv non-increasing there)
    a = np.ceil(R * pp).astype(np.int64)
    b = np.full(pp.size, R, dtype=np.int64)
    while np.any(a < b):
        act = a < b
        m_ = (a + b + 1) // 2
        ok = np.ones(pp.size, dtype=bool)
        ok[act] = ub.binom_two_sided_pvalues(m_[act], R, pp[act]) >= thr
        a = np.where(act & ok, m_, a)
        b = np.where(act & ~ok, m_ - 1, b)
    # the bisections assume the start of each side (floor / ceil of R p) is accepted; the mode always
    # is (p-value 1), the other neighbour of R p may not be (e.g. R p = 0.01: k = 1 is rejected)
    ceil_ok = ub.binom_two_sided_pvalues(a, R, pp) >= thr
    a = np.where(ceil_ok, a, np.floor(R * pp).astype(np.int64))
    hi[mid_] = a
    low = lo[mid_]
    floor_ok = ub.binom_two_sided_pvalues(low, R, pp) >= thr
    lo[mid_] = np.where(floor_ok, low, np.ceil(R * pp).astype(np.int64))
    return lo, hi


def detection_power(p, R: int, delta: float, alpha: float, region=None) -> float:
    """Exact P(reject) of the Bonferroni exact test when the true keep probabilities are p (1 - δ)."""
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    lo, hi = acceptance_region(p, R, alpha) if region is None else region
    q = np.clip(p * (1.0 - delta), 0.0, 1.0)
    acc = _st.binom.cdf(hi, R, q) - np.where(lo > 0, _st.binom.cdf(lo - 1, R, q), 0.0)
    acc = np.clip(acc, 0.0, 1.0)
    if np.any(acc == 0):
        return 1.0
    return float(-np.expm1(np.sum(np.log(acc))))


def detectable_bias(p, R: int, alpha: float, power: float = 0.9, region=None, tol: float = 1e-4) -> float:
    """Smallest δ in (0, 1] with power(δ) >= `power` (bisection; nan if even δ = 1 is not detected)."""
    region = acceptance_region(p, R, alpha) if region is None else region
    if detection_power(p, R, 1.0, alpha, region) < power:
        return float("nan")
    a, b = 0.0, 1.0
    while b - a > tol:
        m = 0.5 * (a + b)
        if detection_power(p, R, m, alpha, region) >= power:
            b = m
        else:
            a = m
    return b


def power_curve(shapes: dict[str, np.ndarray], Rs=R_GRID, alpha: float = 1e-3,
                powers=(0.5, 0.9, 0.99)) -> pd.DataFrame:
    """One row per (shape, R): exact size and the smallest δ detected with each target power.

    ``delta_powerXX`` is computed on the unsaturated coordinates (p_i < 1; the Bonferroni family
    is still all n coordinates): the coordinates at the scaler (p_i = 1) have the certain count R
    under H0, so *any* shrink of their probability is caught after ~1/δ draws, which says nothing
    about the bulk of the vector. ``delta_powerXX_with_max`` includes them (much smaller δ).
    """
    rows = []
    for name, g in shapes.items():
        a = np.abs(np.asarray(g, dtype=np.float64).reshape(-1))
        p = a / a.max()
        bulk = p[p < 1]
        for R in Rs:
            R = int(R)
            reg_all = acceptance_region(p, R, alpha)
            reg_bulk = acceptance_region(bulk, R, alpha, n_tests=p.size)
            row = dict(shape=name, n=p.size, n_saturated=int(p.size - bulk.size), R=R, alpha=alpha,
                       size=detection_power(p, R, 0.0, alpha, reg_all), sum_p=float(p.sum()))
            for pw in powers:
                tag = f"delta_power{int(round(100 * pw))}"
                row[tag] = detectable_bias(bulk, R, alpha, pw, reg_bulk)
                row[tag + "_with_max"] = detectable_bias(p, R, alpha, pw, reg_all)
            rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# the exact test on the codec
# ---------------------------------------------------------------------------------------------
def unbiasedness_tests(shapes: dict[str, np.ndarray], R: int = 2000, alpha: float = 1e-3, seed: int = 0,
                       clips=CLIPS, clip_factor: float = 2.5, codec_factory=None, n_worst: int = 5):
    """(tests, worst): one row per (shape, clip, target); the n_worst coordinates of each test.

    codec_factory(clip) -> codec with encode/decode (default TernGrad(clip=clip)); the positive
    controls pass a biased one.
    """
    codec_factory = codec_factory or (lambda clip: TernGrad(clip=clip, clip_factor=clip_factor))
    rows, worst = [], []
    for si, (name, g) in enumerate(shapes.items()):
        g = np.asarray(g, dtype=np.float32).reshape(-1)
        for ci, clip in enumerate(clips):
            d = ub.codec_draws(codec_factory(clip), g, R, seed=seed + 1000 * si + ci)
            s_rule, bound = terngrad_scaling(g, clip, clip_factor)
            target_clip = clip_values(g, clip, clip_factor).reshape(-1) if clip != "none" else d.g
            frac_clipped = float(np.mean(np.abs(d.g) > min(bound[0], s_rule[0]))) if clip != "none" else 0.0
            for label, target, hyp in (("unbiased wrt g", d.g, "unbiased"),
                                       ("implemented wrt clip(g)", target_clip, "implemented")):
                res = ub.binomial_test_of_draws(d, target=target, alpha=alpha, hypothesis=hyp, n_worst=n_worst)
                s = res.scaler
                pz = np.minimum(np.abs(target) / s, 1.0) if s > 0 else np.zeros_like(target)
                z = ub.mean_z_test(d.sum, d.sumsq, d.R, target, alpha, variance=s * s * pz * (1 - pz),
                                   bound=s)
                rows.append(dict(
                    shape=name, n=g.size, clip=clip, target=label, test=res.test, hypothesis=hyp,
                    alpha=alpha, R=R, scaler=s, fraction_clipped=frac_clipped, reject=res.reject,
                    min_pvalue=res.min_pvalue, min_pvalue_bonferroni=res.min_pvalue_bonferroni,
                    n_rejected=res.n_rejected, n_infeasible=res.n_infeasible, wrong_sign=res.wrong_sign,
                    worst_coordinate=int(res.worst["coordinate"].iloc[0]),
                    worst_g=float(d.g[int(res.worst["coordinate"].iloc[0])]),
                    z_test_reject_valid=z.reject, z_test_reject_naive=z.reject_naive,
                    z_test_false_alarm_candidates=z.n_rejected_invalid, z_test_n_invalid=z.n_invalid))
                w = res.worst.copy()
                w.insert(0, "target_kind", label)
                w.insert(0, "clip", clip)
                w.insert(0, "shape", name)
                w["g"] = d.g[w["coordinate"].to_numpy()]
                worst.append(w)
    return pd.DataFrame(rows), pd.concat(worst, ignore_index=True)


def pooled_tests(shapes: dict[str, np.ndarray], R: int, alpha: float = 1e-3, seed: int = 0,
                 clips=CLIPS, clip_factor: float = 2.5) -> pd.DataFrame:
    """One row per (shape, clip, direction): the pooled z-test's estimate, z, decision and the
    smallest relative bias it detects with power 0.99 (tgsim.analysis.pooled_bias)."""
    from tgsim.analysis.pooled_bias import project_draws, pooled_bias_test

    rows = []
    for si, (name, g) in enumerate(shapes.items()):
        g = np.asarray(g, dtype=np.float32).reshape(-1)
        for ci, clip in enumerate(clips):
            codec = TernGrad(clip=clip, clip_factor=clip_factor)
            proj, target, names = project_draws(
                lambda f, c: decoded_draws(codec, g, f, c, seed + 1000 * si + ci), g, R)
            res = pooled_bias_test(proj, target, names, alpha=alpha)
            for i, d in enumerate(names):
                rows.append(dict(shape=name, n=g.size, clip=clip, direction=d, R=R, alpha=alpha, power=res.power,
                                 relative_bias=float(res.relative_bias[i]), z=float(res.z[i]),
                                 min_detectable_bias=float(res.min_detectable[i]), reject=res.reject))
    return pd.DataFrame(rows)


EF_DRAWS = 64      # draws of an error-feedback row: its bias lies along the state e (|z| in the hundreds)


class _AtState:
    """An error-feedback codec at a fixed worker state e (tgsim.codecs.error_feedback): every worker
    encodes p = g + e with the inner codec, so a decoded draw is D(C(g + e)) and its mean is g + e for
    an unbiased inner codec. The protocol methods that `decoded_draws` calls."""

    def __init__(self, codec, e: np.ndarray):
        self.codec, self.e = codec, np.asarray(e, np.float32)
        self.name, self.properties = codec.name, codec.properties

    def _p(self, layers):
        from tgsim.codecs import error_feedback

        return error_feedback.compensate(layers, {k: np.broadcast_to(self.e.reshape(1, *v.shape[1:]), v.shape)
                                                  for k, v in layers.items()})

    def prepare_many(self, layers):
        return self.codec.prepare_many(self._p(layers))

    def local_scalers_many(self, stats, workers=None):
        return self.codec.local_scalers_many(stats, workers)

    def encode_many(self, layers, seed, step, workers, shared_scalers=None, stats=None, **kw):
        return self.codec.encode_many(self._p(layers), seed, step, workers, shared_scalers, stats, **kw)

    def decode(self, message):
        return self.codec.decode(message)


def _error_feedback_row(codec, g: np.ndarray, seed: int) -> dict:
    """The test of an error-feedback codec at the state e = g - D(C(g)) (one earlier step on the same
    gradient from e = 0: a state every run can reach): deterministic inner codecs exactly (D(C(g + e))
    == g or not), stochastic ones by the pooled z-test of EF_DRAWS draws on the directions g, sign(g)
    and e (the bias of an unbiased inner codec is e). bias_along_state: <mean draw - g, e> / ||e||^2
    (1: the draws' mean is g + e; nan where e = 0, as around fp32)."""
    from tgsim.analysis.pooled_bias import decoded_draws, deterministic_draw, directions, pooled_bias_test
    from tgsim.codecs import error_feedback

    first = decoded_draws(codec, g, 0, 1, seed + 5)[0].astype(np.float32)
    e = error_feedback.new_residual({"g": g[None]}, [{"g": first}])["g"][0]
    at = _AtState(codec, e)
    e64, g64 = e.astype(np.float64), g.astype(np.float64)
    ee = float(e64 @ e64)
    q = deterministic_draw(at, g, seed + 1)
    if q is not None:
        return dict(test="exact (deterministic), at state e", R=1, reject=bool(np.any(q != g64)),
                    min_detectable_bias=0.0,
                    largest_relative_error=float(np.max(np.abs(q - g64) / np.maximum(np.abs(g64), 1e-30))),
                    bias_along_state=float((q - g64) @ e64 / ee) if ee > 0 else float("nan"))
    u = directions(g)
    u["state e"] = e64
    names = tuple(u)
    dirs = np.stack([u[k] for k in names])
    proj = np.concatenate([decoded_draws(at, g, f, min(32, EF_DRAWS - f), seed + 11) @ dirs.T
                           for f in range(0, EF_DRAWS, 32)])
    res = pooled_bias_test(proj, dirs @ g64, names)
    return dict(test="pooled z-test, at state e", R=res.draws, reject=res.reject,
                min_detectable_bias=float(res.min_detectable[:2].max()),
                largest_relative_error=float(np.max(np.abs(res.relative_bias[:2]))),
                bias_along_state=float((proj[:, -1].mean() - dirs[-1] @ g64) / ee))


def error_feedback_names(names) -> tuple[str, ...]:
    """"NAME+ef" for each of `names` that error feedback can wrap (tgsim.codecs.error_feedback)."""
    import dataclasses

    from tgsim.codecs import error_feedback, registry
    from tgsim.errors import ConfigError
    from tgsim.train.config import CodecConfig

    out = []
    for name in names:
        try:
            error_feedback.ErrorFeedback(registry.make_codec(dataclasses.replace(CodecConfig(), name=name)))
        except ConfigError:
            continue
        out.append(name + error_feedback.SUFFIX)
    return tuple(out)


def check_codec_label(label: str) -> None:
    """ConfigError (one line, naming the registered codecs or the codec's keys) unless `label` reads
    NAME[key=value;...][+ef] (tgsim.analysis.common.split_label) for a codec whose Options accept them."""
    from tgsim.analysis.common import split_label
    from tgsim.codecs import options, registry
    from tgsim.errors import ConfigError

    try:
        name, opts, _, local = split_label(label)
        if local:
            raise ValueError(f"+{local} is a way of training, not a codec")
        options.parse(registry.codec_class(name), registry.default_config(name, **opts))
    except ValueError as e:
        raise ConfigError(f"--codec {label!r}: {e}") from e


def codec_table(names, n: int = 20_000, seed: int = 0) -> pd.DataFrame:
    """One row per registered codec (its default config): declared unbiasedness against the test.

    Deterministic codecs (three draws alike) are compared exactly (Q(g) == g or not); stochastic ones
    go through the pooled test (tgsim.testing.pooled_controls: R from a pilot so that 0.75 % is seen
    with power 0.99, alpha 1e-3), on a Gaussian layer of n. A codec declared biased that the layer does
    not reject is tested again on its first 400 values as a 20 x 20 matrix (a codec that compresses
    matrices only, as PowerSGD, sends a vector exactly), by the contract's z-test
    (tgsim.testing.unbiasedness_rejects, 400 draws, alpha 1e-3). `consistent`: the test's verdict is the
    declaration (unbiased and accepted, or biased and rejected). A name "NAME[key=value]" is that codec
    with those options; "NAME+ef" with error feedback, tested at one reachable worker state
    (`_error_feedback_row`)."""
    import dataclasses

    from tgsim.analysis.common import split_label
    from tgsim.analysis.pooled_bias import deterministic_draw
    from tgsim.codecs import error_feedback, registry
    from tgsim.testing import POOLED_MAX_DRAWS, pooled_controls, pooled_draws_needed
    from tgsim.train.config import CodecConfig

    g = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    rows = []
    for name in names:
        base, opts, ef, _ = split_label(name)
        codec = registry.make_codec(dataclasses.replace(CodecConfig(), name=base, options=opts))
        row = dict(codec=name, declared_unbiased=codec.properties.unbiased, n=n)
        if ef:
            codec = error_feedback.ErrorFeedback(codec)     # ConfigError for a codec it cannot wrap
            row.update(declared_unbiased=codec.properties.unbiased, **_error_feedback_row(codec, g, seed))
            row["consistent"] = row["reject"] == (not row["declared_unbiased"])
            rows.append(row)
            continue
        q = deterministic_draw(codec, g, seed + 1)
        if q is not None:
            reject = bool(np.any(q != g.astype(np.float64)))
            row.update(test="exact (deterministic)", R=1, reject=reject, min_detectable_bias=0.0,
                       largest_relative_error=float(np.max(np.abs(q - g) / np.maximum(np.abs(g), 1e-30))))
        else:
            draws = min(pooled_draws_needed(codec, g, 0.01, seed + 11)[0], POOLED_MAX_DRAWS)
            res = pooled_controls(codec, g, 0.01, seed=seed + 11, draws=draws)["codec"]
            row.update(test="pooled z-test", R=res.draws, reject=res.reject,
                       min_detectable_bias=float(res.min_detectable[:2].max()),
                       largest_relative_error=float(np.max(np.abs(res.relative_bias[:2]))))
        if not row["reject"] and not row["declared_unbiased"]:
            from tgsim.testing import unbiasedness_rejects

            row.update(test="z-test, 20 x 20 matrix", R=400, min_detectable_bias=float("nan"),
                       largest_relative_error=float("nan"),
                       reject=unbiasedness_rejects(codec, g[:400].reshape(20, 20), seed=seed + 21))
        row["consistent"] = row["reject"] == (not row["declared_unbiased"])
        rows.append(row)
    return pd.DataFrame(rows)


def run(out=None, *, n: int = 3000, R: int = 2000, alpha: float = 1e-3, seed: int = 0,
        recorded_steps: int | None = 50, Rs=R_GRID, quiet: bool = False, codec: str = "",
        model: str | None = None, data: str = "digits") -> dict[str, pd.DataFrame]:
    """Write the TernGrad shape study (unbiasedness, _worst, _power, _pooled) to `out`: the synthetic
    shapes and the per-layer gradients of tgsim's MLP, or of the torch factory `model`, on `data`; with
    `codec`, the test of that codec's declared unbiasedness (unbiasedness_codecs) instead."""
    from tgsim.analysis.common import single_thread, write_csv

    if codec:
        from tgsim.codecs import registry

        names = registry.names() + error_feedback_names(registry.names()) if codec == "all" else (codec,)
        for name in names:
            check_codec_label(name)
        with single_thread():
            table = codec_table(names, seed=seed)
        write_csv(table, out, "unbiasedness_codecs")
        if not quiet:
            print("declared unbiasedness of each codec (default config, or the options named) against the test, "
                  "Gaussian layer of "
                  f"{table['n'].iloc[0]:,}, alpha = 1e-3:")
            print(table.drop(columns="n").to_string(index=False, float_format=lambda x: f"{x:.3g}"))
            if table["codec"].str.endswith("+ef").any():
                print("NAME+ef: the codec with error feedback, tested at the worker state e = g - D(C(g)); "
                      "bias_along_state = <mean draw - g, e> / ||e||^2 (1: the mean is g + e)")
        return {"unbiasedness_codecs": table}
    with single_thread():
        shapes = gradient_shapes(n, seed, recorded_steps, model=model, data=data)
        tests, worst = unbiasedness_tests(shapes, R, alpha, seed)
        power = power_curve(shapes, Rs, alpha)
        pooled = pooled_tests(shapes, R, alpha, seed)
    for df, name in ((tests, "unbiasedness"), (worst, "unbiasedness_worst"), (power, "unbiasedness_power"),
                     (pooled, "unbiasedness_pooled")):
        write_csv(df, out, name)
    if not quiet:
        print(f"exact binomial test, Bonferroni over coordinates, family-wise alpha = {alpha}, R = {R} draws")
        t = tests.assign(min_p_bonf=tests["min_pvalue_bonferroni"].map(lambda x: f"{x:.2g}"))
        print(t[["shape", "clip", "target", "reject", "min_p_bonf", "n_rejected", "n_infeasible",
                 "z_test_reject_naive", "z_test_reject_valid"]].to_string(index=False))
        print("\nsmallest multiplicative bias δ (keep prob. p(1-δ) on the coordinates with p < 1) "
              "detected with exact power 0.9:")
        print(power.pivot(index="shape", columns="R", values="delta_power90").round(4).to_string())
        print("\n... with power 0.99:")
        print(power.pivot(index="shape", columns="R", values="delta_power99").round(4).to_string())
        print(f"\npooled z-test (projections on g, sign(g), sign(g) on the smallest quarter of |g|; Bonferroni over "
              f"the 3), alpha = {alpha}, R = {R}; min_bias: the smallest relative bias detected with power 0.99")
        pv = pooled.pivot_table(index=["shape", "clip", "reject"], columns="direction", values="min_detectable_bias",
                                sort=False)
        print(pv.map(lambda x: f"{x:.2%}").to_string())
    return {"unbiasedness": tests, "unbiasedness_worst": worst, "unbiasedness_power": power,
            "unbiasedness_pooled": pooled}
