"""Numba encoder of TernGrad: Philox words -> the exact ternary rule -> packed bytes, in one pass,
bit-identical to `packing.pack(quantizer.ternarize(...))`; see `tgsim.codecs.terngrad.numba_kernels`."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from tgsim.codecs import packing
from tgsim.codecs.terngrad import numba_common as nc
from tgsim.codecs.terngrad.numba_common import _ZERO_BYTE, _as_f32_flat, _as_f32_rows, _check_fmt, _per_worker, _threads, _worker_ids
from tgsim.rng import StreamKey
from tgsim.rng.numba_philox import philox_block
from tgsim.rng.philox import MAX_ELEMENTS

_U8 = np.uint32(8)     # t = w >> 8: the rule's 24-bit threshold (quantizer.THRESHOLD_BITS)


@njit(inline="always")
def _code1(w, gv, s_scaled, cb, clip):
    """code + 1 (0, 1, 2) of one element: the documented rule on t = w >> 8 (see module docstring).

    clip (a constant after inlining): x = np.minimum(|g|, cb) - written so that a NaN |g| stays
    NaN; cb is never NaN here - else x = |g|.
    """
    x = abs(gv)
    if clip:
        x = cb if cb < x else x
    keep = np.float64(w >> _U8) * s_scaled < np.float64(x)
    pos = gv > np.float32(0.0)
    return np.uint32(2 if pos else 0) if keep else np.uint32(1)


@njit(inline="always")
def _enc2_body(g, out, b0, s_scaled, cb, c1, c2, c3, k0, k1, clip):
    for j in range(out.size):
        w0, w1, w2, w3 = philox_block(np.uint32(b0 + j), c1, c2, c3, k0, k1)
        e = 4 * j
        v = (_code1(w0, g[e], s_scaled, cb, clip)
             | (_code1(w1, g[e + 1], s_scaled, cb, clip) << np.uint32(2))
             | (_code1(w2, g[e + 2], s_scaled, cb, clip) << np.uint32(4))
             | (_code1(w3, g[e + 3], s_scaled, cb, clip) << np.uint32(6)))
        out[j] = np.uint8(v)


@njit(cache=True)
def _enc2_range(g, out, b0, s_scaled, cb, c1, c2, c3, k0, k1):
    """out[j] = 2-bit byte of elements 4j..4j+3 of g, drawn from Philox block b0 + j (full blocks).

    One Philox block per byte, one straight-line loop body (vectorized across blocks). g and out
    are slices starting at element 4 b0 / byte b0: 0-based indices are provably non-negative, so
    Numba's wraparound check does not stop the vectorizer.
    """
    _enc2_body(g, out, b0, s_scaled, cb, c1, c2, c3, k0, k1, True)


@njit(cache=True)
def _enc2_range_noclip(g, out, b0, s_scaled, cb, c1, c2, c3, k0, k1):
    """_enc2_range for cb = +inf (no explicit clipping): skips the min."""
    _enc2_body(g, out, b0, s_scaled, cb, c1, c2, c3, k0, k1, False)


_ENC2_CHUNK = 1 << 14   # bytes (= Philox blocks) per parallel task


@njit(cache=True)
def _enc2_task(g, out, ch, nch, boff, s_scaled, cb, c1, c2, c3, k0, k1):
    """Chunk ch (of nch) of one worker's 2-bit payload; the last chunk also codes the partial last
    block (pad codes are 0, value 1). boff: the Philox block of g's first element (0 for a whole
    layer; first / 4 for the elements of a layer from element `first` on, `encode_range`)."""
    n = g.size
    nfull = n // 4
    b0 = ch * _ENC2_CHUNK
    b1 = min(b0 + _ENC2_CHUNK, nfull)
    if b1 > b0:
        if cb != np.inf:
            _enc2_range(g[4 * b0:4 * b1], out[b0:b1], boff + b0, s_scaled, cb, c1, c2, c3, k0, k1)
        else:
            _enc2_range_noclip(g[4 * b0:4 * b1], out[b0:b1], boff + b0, s_scaled, cb, c1, c2, c3, k0, k1)
    if ch == nch - 1 and nfull * 4 < n:
        w = philox_block(np.uint32(boff + nfull), c1, c2, c3, k0, k1)
        v = np.uint32(0)
        for m in range(4):
            e = 4 * nfull + m
            vm = _code1(w[m], g[e], s_scaled, cb, True) if e < n else np.uint32(1)
            v |= vm << np.uint32(2 * m)
        out[nfull] = np.uint8(v)


@njit(cache=True)
def _enc2_serial(G, out, s_scaled, cb, c1, wk, c3, k0, k1):
    nch = max(1, (G.shape[1] // 4 + _ENC2_CHUNK - 1) // _ENC2_CHUNK)
    for t in range(G.shape[0] * nch):
        w = t // nch
        _enc2_task(G[w], out[w], t - w * nch, nch, 0, s_scaled[w], cb[w], c1, wk[w], c3, k0, k1)


@njit(cache=True, parallel=True)
def _enc2_par(G, out, s_scaled, cb, c1, wk, c3, k0, k1):
    """One parallel region over (worker, chunk of _ENC2_CHUNK bytes) pairs."""
    nch = max(1, (G.shape[1] // 4 + _ENC2_CHUNK - 1) // _ENC2_CHUNK)
    for t in prange(G.shape[0] * nch):
        w = t // nch
        _enc2_task(G[w], out[w], t - w * nch, nch, 0, s_scaled[w], cb[w], c1, wk[w], c3, k0, k1)


_B3_UNITS = 1024   # 20-element units (5 Philox blocks, 4 bytes) per parallel task


@njit(cache=True)
def _enc3_range(g, out, u0, nu, s_scaled, cb, c1, c2, c3, k0, k1, words, vals):
    """Base-3 bytes of units u0..u0+nu-1 (20 elements, 5 Philox blocks, 4 bytes each): words, values,
    bytes.

    g: the elements of these units (the last unit may be short: missing elements are pad codes 0,
    value 1); out: their bytes, 4 per unit except for a layer's last unit, which keeps only the
    bytes up to ceil(n/5); words (uint32) / vals (uint8): scratch of 20 per unit.
    Three simple loops (each vectorizes) over L1/L2-resident scratch.
    """
    blk0 = 5 * u0
    for j in range(5 * nu):
        w0, w1, w2, w3 = philox_block(np.uint32(blk0 + j), c1, c2, c3, k0, k1)
        words[4 * j] = w0
        words[4 * j + 1] = w1
        words[4 * j + 2] = w2
        words[4 * j + 3] = w3
    ne = g.size
    for i in range(ne):
        vals[i] = np.uint8(_code1(words[i], g[i], s_scaled, cb, True))
    for i in range(ne, 20 * nu):
        vals[i] = np.uint8(1)
    for j in range(out.size):
        q = 5 * j
        out[j] = np.uint8(np.uint32(vals[q]) + np.uint32(3) * np.uint32(vals[q + 1])
                          + np.uint32(9) * np.uint32(vals[q + 2])
                          + np.uint32(27) * np.uint32(vals[q + 3])
                          + np.uint32(81) * np.uint32(vals[q + 4]))


@njit(cache=True)
def _enc3_task(g, out, ch, uoff, s_scaled, cb, c1, c2, c3, k0, k1, words, vals):
    """Units ch * _B3_UNITS .. of one worker's base-3 payload (out: its ceil(n/5) bytes); uoff: the
    unit of g's first element (0 for a whole layer, first / 20 for `encode_range`)."""
    n = g.size
    nunits = (n + 19) // 20
    u0 = ch * _B3_UNITS
    u1 = min(u0 + _B3_UNITS, nunits)
    _enc3_range(g[20 * u0:min(20 * u1, n)], out[4 * u0:min(4 * u1, out.size)], uoff + u0, u1 - u0,
                s_scaled, cb, c1, c2, c3, k0, k1, words, vals)


@njit(cache=True)
def _enc3_serial(G, out, s_scaled, cb, c1, wk, c3, k0, k1):
    nch = ((G.shape[1] + 19) // 20 + _B3_UNITS - 1) // _B3_UNITS
    words = np.empty(20 * _B3_UNITS, dtype=np.uint32)
    vals = np.empty(20 * _B3_UNITS, dtype=np.uint8)
    for t in range(G.shape[0] * nch):
        w = t // nch
        _enc3_task(G[w], out[w], t - w * nch, 0, s_scaled[w], cb[w], c1, wk[w], c3, k0, k1, words, vals)


@njit(cache=True, parallel=True)
def _enc3_par(G, out, s_scaled, cb, c1, wk, c3, k0, k1):
    """One parallel region over (worker, chunk of _B3_UNITS units) pairs."""
    nch = ((G.shape[1] + 19) // 20 + _B3_UNITS - 1) // _B3_UNITS
    for t in prange(G.shape[0] * nch):
        words = np.empty(20 * _B3_UNITS, dtype=np.uint32)
        vals = np.empty(20 * _B3_UNITS, dtype=np.uint8)
        w = t // nch
        _enc3_task(G[w], out[w], t - w * nch, 0, s_scaled[w], cb[w], c1, wk[w], c3, k0, k1, words, vals)


@njit(cache=True)
def _enc2_part(g, out, boff, s_scaled, cb, c1, c2, c3, k0, k1):
    nch = max(1, (g.size // 4 + _ENC2_CHUNK - 1) // _ENC2_CHUNK)
    for ch in range(nch):
        _enc2_task(g, out, ch, nch, boff, s_scaled, cb, c1, c2, c3, k0, k1)


@njit(cache=True)
def _enc3_part(g, out, uoff, s_scaled, cb, c1, c2, c3, k0, k1):
    nch = ((g.size + 19) // 20 + _B3_UNITS - 1) // _B3_UNITS
    words = np.empty(20 * _B3_UNITS, dtype=np.uint32)
    vals = np.empty(20 * _B3_UNITS, dtype=np.uint8)
    for ch in range(nch):
        _enc3_task(g, out, ch, uoff, s_scaled, cb, c1, c2, c3, k0, k1, words, vals)





def encode_many(G: np.ndarray, scalers, clip_bounds, seed: int, step: int, workers, layer: int,
                fmt: str) -> np.ndarray:
    """uint8 (W, nbytes): row w equals encode(G[w], scalers[w], clip_bounds[w],
    StreamKey(seed, step, workers[w], layer), fmt), bit for bit.

    W * n < SERIAL_ENCODE: serial on this thread; otherwise one parallel region over (worker,
    chunk) pairs.
    """
    _check_fmt(fmt)
    G = _as_f32_rows(G)
    nw, n = G.shape
    if n > MAX_ELEMENTS:
        raise ValueError(f"stream range [0, {n}) outside [0, {MAX_ELEMENTS})")
    scalers = _per_worker(scalers, nw, "scalers")
    clip_bounds = _per_worker(clip_bounds, nw, "clip_bounds")
    wk = _worker_ids(workers, nw)
    k0, k1 = StreamKey(int(seed), int(step), 0, int(layer)).key     # range checks of seed/step/layer
    nb = packing.packed_size(n, fmt)
    with np.errstate(over="ignore", invalid="ignore"):
        cb = clip_bounds.astype(np.float32)   # the reference: np.minimum(x, f32(clip_bound))
        s32 = scalers.astype(np.float32)      # the reference: ternary_rule(t, x, np.float32(scaler))
    s_scaled = s32.astype(np.float64) * np.float64(2.0 ** -24)      # exact (see the module docstring)
    out = np.empty((nw, nb), dtype=np.uint8)
    if nw and n:
        serial = nw * n < nc.SERIAL_ENCODE or _threads() == 1
        if fmt == "2bit":
            kern = _enc2_serial if serial else _enc2_par
        else:
            kern = _enc3_serial if serial else _enc3_par
        kern(G, out, s_scaled, cb, np.uint32(layer), wk, np.uint32(step), np.uint32(k0), np.uint32(k1))
    nan_cb = np.isnan(cb)
    if nan_cb.any():                          # np.minimum(x, nan) = nan: every draw rejects
        out[nan_cb] = _ZERO_BYTE[fmt]
    return out


def encode(g: np.ndarray, scaler: float, clip_bound: float, key: StreamKey, fmt: str) -> np.ndarray:
    """uint8 payload equal to packing.pack(ternary.ternarize(g, scaler, key, clip_bound), fmt)."""
    _check_fmt(fmt)
    g = _as_f32_flat(g)
    return encode_many(g.reshape(1, -1), [scaler], [clip_bound], key.seed, key.step,
                       np.array([key.worker], dtype=np.uint32), key.layer, fmt)[0]


def encode_range(g: np.ndarray, first: int, scaler: float, clip_bound: float, key: StreamKey, fmt: str,
                 out: np.ndarray | None = None) -> np.ndarray:
    """The bytes of a layer's payload that code its elements [first, first + g.size), g being those
    elements, coded with `scaler`, `clip_bound` and the stream `key` in packing `fmt`, written into
    `out` (uint8, its size in bytes) when given: equal to encode(layer, ...)[first // k : ...] (k codes
    per byte) when `first` is a multiple of 20 (a base-3 unit, 5 Philox blocks; 2-bit needs 4) and the
    range ends on such a multiple or at the layer's end (where the whole payload's pad codes are).
    Serial, on this thread: the pipelined exchanges encode piece by piece while earlier pieces are on
    the wire."""
    _check_fmt(fmt)
    step = 4 if fmt == "2bit" else 20
    if first < 0 or first % step:
        raise ValueError(f"first element {first} is not a multiple of {step} ({fmt})")
    g = _as_f32_flat(g)
    if first + g.size > MAX_ELEMENTS:
        raise ValueError(f"stream range [{first}, {first + g.size}) outside [0, {MAX_ELEMENTS})")
    k0, k1 = key.key
    nb = packing.packed_size(g.size, fmt)
    if out is None:
        out = np.empty(nb, dtype=np.uint8)
    elif out.dtype != np.uint8 or out.shape != (nb,):
        raise ValueError(f"out: expected uint8 of shape ({nb},), got {out.dtype} {out.shape}")
    with np.errstate(over="ignore", invalid="ignore"):
        cb = np.float32(clip_bound)
        s_scaled = np.float64(np.float32(scaler)) * np.float64(2.0 ** -24)
    if np.isnan(cb):                          # np.minimum(x, nan) = nan: every draw rejects
        out[:] = _ZERO_BYTE[fmt]
    elif g.size:
        args = (s_scaled, cb, np.uint32(key.layer), np.uint32(key.worker), np.uint32(key.step),
                np.uint32(k0), np.uint32(k1))
        if fmt == "2bit":
            _enc2_part(g, out, np.int64(first // 4), *args)
        else:
            _enc3_part(g, out, np.int64(first // 20), *args)
    return out


