"""The array-reference kernels (NumPy or CuPy through `xp`): what the fused kernels must equal."""

from __future__ import annotations

import numpy as np

from tgsim.backend import array_module
from tgsim.codecs import packing
from tgsim.codecs.terngrad import moments as stats, quantizer as ternary
from tgsim.rng import StreamKey


def moments(g, need_sigma: bool) -> stats.LayerMoments:
    """LayerMoments (absmax, σ when `need_sigma`, finiteness) of the flat float32 layer g:
    stats.layer_moments."""
    return stats.layer_moments(g, need_sigma)


def encode(g, scaler: float, clip_bound: float, key: StreamKey, fmt: str):
    """Packed payload in packing `fmt` of the flat float32 layer g ternarized with `scaler`, `clip_bound`
    and the stream `key` (ternary.ternarize, then packing.pack)."""
    return packing.pack(ternary.ternarize(g, scaler, key, clip_bound), fmt)


def _rows(G):
    if G.ndim != 2:
        raise ValueError(f"G: expected a 2-D array (workers, elements), got shape {G.shape}")
    if G.dtype != array_module(G).float32:
        raise ValueError(f"G: expected float32, got {G.dtype}")
    return G


def _per_worker(values, nw: int, what: str) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if v.shape != (nw,):
        raise ValueError(f"{what}: expected shape ({nw},), got {v.shape}")
    return v


def moments_many(G, need_sigma: bool):
    """(absmax, sigma, finite) NumPy arrays over the rows of G (W, n): row w is moments(G[w], need_sigma)."""
    G = _rows(G)
    nw = G.shape[0]
    absmax, sigma, finite = np.empty(nw), np.empty(nw), np.empty(nw, dtype=bool)
    for w in range(nw):
        absmax[w], sigma[w], finite[w] = moments(G[w], need_sigma)
    return absmax, sigma, finite


def encode_many(G, scalers, clip_bounds, seed: int, step: int, workers, layer: int, fmt: str):
    """uint8 (W, nbytes): row w is encode(G[w], scalers[w], clip_bounds[w],
    StreamKey(seed, step, workers[w], layer), fmt)."""
    if fmt not in packing.FORMATS:
        raise ValueError(f"unknown packing {fmt!r}; expected one of {packing.FORMATS}")
    G = _rows(G)
    xp = array_module(G)
    nw, n = G.shape
    scalers = _per_worker(scalers, nw, "scalers")
    clip_bounds = _per_worker(clip_bounds, nw, "clip_bounds")
    workers = np.asarray(workers)
    if workers.shape != (nw,):
        raise ValueError(f"workers: expected shape ({nw},), got {workers.shape}")
    out = xp.empty((nw, packing.packed_size(n, fmt)), dtype=xp.uint8)
    for w in range(nw):
        key = StreamKey(int(seed), int(step), int(workers[w]), int(layer))
        out[w] = encode(G[w], float(scalers[w]), float(clip_bounds[w]), key, fmt)
    return out


def weighted_sum(payloads, scalers, n: int, fmt: str, divide_by: int):
    """float32 (n,) of (Σ_w s_w codes_w) / divide_by from the packed `payloads` (W, nbytes) in packing
    `fmt` and their `scalers`, after checking every payload (packing.weighted_sum)."""
    for w in range(payloads.shape[0]):
        packing.check_payload(payloads[w], n, fmt, where=f"payload of worker {w}")
    return packing.weighted_sum(payloads, scalers, n, fmt, divide_by)


def sum_codes(payloads, n: int, fmt: str, dtype=None):
    """Σ_w codes_w as integers of `dtype`, (n,), from the packed `payloads` (W, nbytes) in packing `fmt`,
    after checking every payload (packing.sum_codes)."""
    for w in range(payloads.shape[0]):
        packing.check_payload(payloads[w], n, fmt, where=f"payload of worker {w}")
    return packing.sum_codes(payloads, n, fmt, dtype)
