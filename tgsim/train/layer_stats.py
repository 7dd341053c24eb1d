"""Per-row |g| statistics of the workers' gradients, for the trainer's per-layer metrics (not part of
any codec's bits): one Numba pass over all rows of a layer."""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

_SERIAL = 1 << 15   # W * n below which the pass runs on the calling thread (no parallel region)
_STAT_LANES = 16    # interleaved float64 partial sums per row (vectorizes without reassociation)


@njit(cache=True)
def _row_stats(g, cb, out, w):
    """out[w] = (Σ|g|, Σ g^2, #(|g| > cb), max|g|) of one row, in float64: element i goes to
    partial i % 16 (ascending i), the partials are added in order 0..15, then the tail."""
    a1 = np.zeros(_STAT_LANES)
    a2 = np.zeros(_STAT_LANES)
    cc = np.zeros(_STAT_LANES, dtype=np.int64)
    mx = np.zeros(_STAT_LANES)
    nb = g.size // _STAT_LANES
    for b in range(nb):
        blk = g[b * _STAT_LANES:(b + 1) * _STAT_LANES]
        for k in range(_STAT_LANES):
            a = abs(np.float64(blk[k]))
            a1[k] += a
            a2[k] += a * a
            cc[k] += a > cb
            mx[k] = a if a > mx[k] else mx[k]
    l1 = 0.0
    l2 = 0.0
    c = 0
    m = 0.0
    for k in range(_STAT_LANES):
        l1 += a1[k]
        l2 += a2[k]
        c += cc[k]
        m = mx[k] if mx[k] > m else m
    for i in range(nb * _STAT_LANES, g.size):
        a = abs(np.float64(g[i]))
        l1 += a
        l2 += a * a
        c += a > cb
        m = a if a > m else m
    out[w, 0] = l1
    out[w, 1] = l2
    out[w, 2] = c
    out[w, 3] = m


@njit(cache=True)
def _row_stats_serial(G, cb, out):
    for w in range(G.shape[0]):
        _row_stats(G[w], cb[w], out, w)


@njit(cache=True, parallel=True)
def _row_stats_par(G, cb, out):
    for w in prange(G.shape[0]):
        _row_stats(G[w], cb[w], out, w)


def row_abs_stats(G: np.ndarray, clip_bounds=None) -> np.ndarray:
    """float64 (W, 4): per row of G (W, n) float32, (Σ|g|, Σ g^2, #(|g| > clip_bounds[w]), max|g|),
    in one pass. Deterministic (a fixed order of float64 additions, see
    _row_stats) but not the order of np.sum; for metrics, not for the codec's bits. NaN-free input
    assumed (a NaN is not counted above any bound and does not raise max|g|)."""
    G = np.asarray(G)
    if G.dtype != np.float32 or G.ndim != 2:
        raise ValueError(f"G: expected a 2-D float32 array (workers, elements), got {G.dtype} {G.shape}")
    G = np.ascontiguousarray(G)
    nw, n = G.shape
    if clip_bounds is None:
        cb = np.full(nw, np.inf)
    else:
        cb = np.asarray(clip_bounds, dtype=np.float64)
        if cb.shape != (nw,):
            raise ValueError(f"clip_bounds: expected shape ({nw},), got {cb.shape}")
    out = np.zeros((nw, 4), dtype=np.float64)
    if nw and n:
        serial = nw * n < _SERIAL or nw == 1 or numba.get_num_threads() == 1
        (_row_stats_serial if serial else _row_stats_par)(G, cb, out)
    return out
