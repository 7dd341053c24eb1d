"""Per-layer statistics for the scaler and c·σ clipping, in a fixed summation order.

The scaler must have the same bits on every path (NumPy, CuPy, Numba, CUDA) and for any thread
count, so the sums are defined by an order, not left to a library:

    K      = g[0]                                   (shift, for a stable one-pass variance)
    lane j = Σ over i ≡ j (mod LANES), ascending i, of d_i = f64(g_i) - K   and of d_i * d_i
    total  = pairwise tree over the LANES partials: a <- a[:h] + a[h:], h = LANES/2, ..., 1
    mean   = K + S1/n,  var = max(S2/n - (S1/n)^2, 0),  σ = sqrt(var)    (all float64, no FMA)

A GPU runs one thread per lane (coalesced); a CPU thread owns a range of lanes and walks the rows.
absmax = max_i |g_i| is exact in any order.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tgsim.backend import array_module

LANES = 65536


class LayerMoments(NamedTuple):
    absmax: float   # max |g| (a float32 value)
    sigma: float    # population standard deviation (ddof=0), float64
    finite: bool    # every element finite


def lane_sums(g):
    """(S1, S2) lane partials of Σ(g-K) and Σ(g-K)^2 in float64, reduced by the fixed tree."""
    xp = array_module(g)
    n = g.size
    k = xp.float64(g[0]) if n else xp.float64(0.0)
    s1 = xp.zeros(LANES, dtype=xp.float64)
    s2 = xp.zeros(LANES, dtype=xp.float64)
    rows, rem = divmod(n, LANES)
    for r in range(rows):
        d = g[r * LANES:(r + 1) * LANES].astype(xp.float64) - k
        s1 += d
        s2 += d * d
    if rem:
        d = g[rows * LANES:].astype(xp.float64) - k
        s1[:rem] += d
        s2[:rem] += d * d
    h = LANES // 2
    while h >= 1:
        s1 = s1[:h] + s1[h:2 * h]
        s2 = s2[:h] + s2[h:2 * h]
        h //= 2
    return float(k), float(s1[0]), float(s2[0])


def moments_from_sums(n: int, k: float, s1: float, s2: float) -> float:
    """σ of n values from their shift k and the shifted sums s1 = Σ(g - k), s2 = Σ(g - k)^2 (float64,
    the same operations in every implementation); 0 for n = 0 or a non-positive variance."""
    if n == 0:
        return 0.0
    m1 = s1 / n
    var = s2 / n - m1 * m1
    return float(np.sqrt(var)) if var > 0.0 else 0.0


def layer_moments(g, need_sigma: bool = True) -> LayerMoments:
    """LayerMoments (absmax, σ when `need_sigma`, finiteness) of the flat float32 layer g, in the
    documented order."""
    xp = array_module(g)
    if g.size == 0:
        return LayerMoments(0.0, 0.0, True)
    finite = bool(xp.isfinite(g).all())
    if not finite:
        return LayerMoments(float("nan"), float("nan"), False)
    absmax = float(xp.abs(g).max())
    sigma = moments_from_sums(g.size, *lane_sums(g)) if need_sigma else 0.0
    return LayerMoments(absmax, sigma, True)
