"""TernGrad's stochastic ternary quantizer (Wen et al. 2017, Eq. 3-5), array reference.

For one layer g with scaler s (s >= max|g| after clipping):

    b_k ~ Bernoulli(|g_k| / s),   g~_k = s * sign(g_k) * b_k           (Eq. 4-5)

The Bernoulli draw uses the top 24 bits t of the element's Philox word (`tgsim.rng`):

    b_k = 1  iff  f64(t) * f64(s) < f64(x_k) * 2^24,    x_k = min(|g_k|, clip_bound)

Both products are exact in float64 (24-bit x 24-bit mantissas), so the comparison is exact and
P(b_k = 1) = ceil(2^24 x_k / s) / 2^24 for x_k <= s. The resolution bias is therefore
0 <= E|g~_k| - x_k < 2^-24 * s, upward in magnitude, and it is the only bias (tested by counting
over all 2^24 values of t). x_k >= s saturates to b_k = 1 (the public code's implicit clipping);
that includes s = 0 with x_k > 0, which the codec never produces: its scalers are >= every x_k
and are 0 only for an all-zero layer, whose codes are then all zero (no division anywhere).

Clipping variants (clip factor c, σ = population std of the layer; σ = 0, or a bound f32(c σ) that
overflows to inf or underflows to 0, disables clipping for that layer):
  "none":     clip_bound = inf,        s = max|g|
  "explicit": clip_bound = f32(c σ),   s = max min(|g|, c σ)     (the paper, Sec. 3.3)
  "implicit": clip_bound = inf,        s = f32(c σ)              (the public TF code: |g| >= s saturate)
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np

from tgsim.backend import array_module
from tgsim.codecs.terngrad.moments import layer_moments
from tgsim.rng import StreamKey, random_words

ClipMode = Literal["none", "explicit", "implicit"]
CLIP_MODES = ("none", "explicit", "implicit")
THRESHOLD_BITS = 24
TWO24 = float(2**THRESHOLD_BITS)


class LayerScaling(NamedTuple):
    """What one worker knows about one layer before scaler sharing."""

    scaler: float       # the local scaler s_i (float32 value)
    clip_bound: float   # x = min(|g|, clip_bound); inf when not clipping explicitly
    absmax: float
    sigma: float


def scaling_from_moments(absmax: float, sigma: float, clip: ClipMode, clip_factor: float) -> LayerScaling:
    """LayerScaling (local scaler, clip bound, absmax, σ) of a layer from its moments `absmax` and
    `sigma`, for the clip mode `clip` and factor `clip_factor` (the same arithmetic on every path)."""
    inf = float("inf")
    if clip not in CLIP_MODES:
        raise ValueError(f"unknown clip mode {clip!r}; expected one of {CLIP_MODES}")
    with np.errstate(over="ignore"):
        bound = float(np.float32(clip_factor * sigma)) if clip != "none" else inf
    if not 0.0 < bound < inf:  # no clipping, sigma = 0, or f32(c·σ) out of float32's range
        return LayerScaling(absmax, inf, absmax, sigma)
    if clip == "explicit":
        return LayerScaling(min(absmax, bound), bound, absmax, sigma)
    return LayerScaling(bound, inf, absmax, sigma)  # implicit


def layer_scaling(g, clip: ClipMode = "none", clip_factor: float = 2.5) -> LayerScaling:
    """LayerScaling of the flat, finite float32 layer g: the moments pass, then scaling_from_moments
    with `clip` and `clip_factor` (reference path; ValueError on a non-finite layer)."""
    m = layer_moments(g, need_sigma=clip != "none")
    if not m.finite:
        raise ValueError("layer has non-finite values")
    return scaling_from_moments(m.absmax, m.sigma, clip, clip_factor)


def ternary_rule(t, x, s):
    """The element decision: 1 where f64(t)*f64(s) < f64(x)*2^24 (t: uint32 < 2^24, x, s: float32)."""
    xp = array_module(t)
    return t.astype(xp.float64) * xp.float64(s) < x.astype(xp.float64) * TWO24


def ternarize(g, scaler: float, key: StreamKey, clip_bound: float = float("inf")):
    """int8 codes in {-1, 0, +1} of the flat float32 layer g with the scaler `scaler`, |g| clipped at
    `clip_bound`, the draws from the stream `key` (reference; the fused kernels match it)."""
    xp = array_module(g)
    x = xp.abs(g)
    if clip_bound != float("inf"):
        x = xp.minimum(x, xp.float32(clip_bound))
    t = random_words(g.size, key, xp) >> xp.uint32(32 - THRESHOLD_BITS)
    keep = ternary_rule(t, x, np.float32(scaler))
    sign = xp.where(g > 0, xp.int8(1), xp.int8(-1))
    return xp.where(keep, sign, xp.int8(0))


def exact_nonzero_probability(x, s: float):
    """P(b = 1) = min(ceil(2^24 x / s), 2^24) / 2^24 exactly, for the documented rule (NumPy).

    s = 0: 1 where x > 0 (saturation), 0 where x = 0.
    """
    x = np.asarray(x, dtype=np.float64)
    if s == 0:
        return (x > 0).astype(np.float64)
    # smallest integer t with t*s >= x*2^24 is ceil(x*2^24/s); count of t below it, capped at 2^24
    q = np.ceil(x * TWO24 / np.float64(s))
    # guard the float division: step q down/up until the exact product comparison agrees
    q = q - ((q - 1) * np.float64(s) >= x * TWO24)
    q = q + (q * np.float64(s) < x * TWO24)
    return np.minimum(q, TWO24) / TWO24
