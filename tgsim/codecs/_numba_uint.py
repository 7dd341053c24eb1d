"""Numba kernels for the parameter server's downlink: pack/unpack integers at `width` <= 8 bits.

Eight values of `width` bits fill exactly `width` bytes, so each group of eight is one 64-bit word
written (or read) independently: a loop over the full groups with no bounds test inside a group
(the short tail is handled apart, so the full groups need no bounds test per element), compiled
per width and left serial so that LLVM vectorizes it (see _full_group_kernels; timings in
docs/MEASUREMENTS.md). Same bits as the reference
(`packing.pack_uint_reference`, little-endian bit order), tested in tests/test_packing_uint.py.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit, prange


_BLOCK = 4096   # groups of eight values per parallel task


@njit(cache=True, inline="always")
def _read_group(payload, g, width):
    """The 64-bit word of group g: bytes g*width .. g*width+width-1, little-endian (short at the end)."""
    acc = np.uint64(0)
    base = g * width
    for m in range(width):
        if base + m < payload.size:
            acc |= np.uint64(payload[base + m]) << np.uint64(8 * m)
    return acc


@njit(cache=True, inline="always")
def _read_full_group(payload, g, width):
    """_read_group for a group that lies wholly inside the payload (no bounds test per byte)."""
    acc = np.uint64(0)
    base = g * width
    sh = np.uint64(0)
    for m in range(width):
        acc |= np.uint64(payload[base + m]) << sh
        sh += np.uint64(8)
    return acc


@njit(cache=True, parallel=True)
def _unpack(payload, n, width, out):
    full = min(n // 8, payload.size // width)     # groups whose eight values and bytes all exist
    mask = np.uint64((1 << width) - 1)
    w = np.uint64(width)
    blocks = (full + _BLOCK - 1) // _BLOCK
    for b in prange(blocks):
        for g in range(b * _BLOCK, min(full, (b + 1) * _BLOCK)):
            acc = _read_full_group(payload, g, width)
            for j in range(8):
                out[g * 8 + j] = np.uint32(acc & mask)
                acc >>= w
    for g in range(full, (n + 7) // 8):           # the short tail
        acc = _read_group(payload, g, width)
        for j in range(8):
            i = g * 8 + j
            if i < n:
                out[i] = np.uint32((acc >> np.uint64(j * width)) & mask)


def pack_uint(values: np.ndarray, width: int) -> np.ndarray:
    """The bytes of `values` (non-negative integers < 2^width, any shape, flattened) at `width` (1..8)
    bits each, little-endian bit order: uint8 (ceil(n·width/8),), the bits of
    packing.pack_uint_reference."""
    return pack_offset(np.ascontiguousarray(values.reshape(-1), dtype=np.uint32), 0, width)


def unpack_uint(payload: np.ndarray, n: int, width: int) -> np.ndarray:
    """The n uint32 values of `payload` (uint8, `width` bits each, as pack_uint wrote them): uint32 (n,)."""
    out = np.empty(n, dtype=np.uint32)
    _unpack(np.ascontiguousarray(payload), np.int64(n), np.int64(width), out)
    return out


@njit(cache=True, inline="always")
def _pack_group(intsum, g, offset, width, limit, out, nbytes):
    """Pack values 8g .. 8g+7 (those < n) into bytes g*width ..; returns 1 if one does not fit."""
    n = intsum.size
    acc = np.uint64(0)
    bad = 0
    for j in range(8):
        i = g * 8 + j
        if i < n:
            v = np.int64(intsum[i]) + offset
            if v < 0 or v > limit:
                bad = 1
                v = 0
            acc |= np.uint64(v) << np.uint64(j * width)
    base = g * width
    for m in range(width):
        if base + m < nbytes:
            out[base + m] = np.uint8((acc >> np.uint64(8 * m)) & np.uint64(0xFF))
    return bad


@njit(cache=True)
def _pack_tail(intsum, offset, width, out, g0):
    """_pack_group for groups g0 .. (the short tail after the full groups); returns the bad count."""
    limit = (1 << width) - 1
    bad = 0
    for g in range(g0, (intsum.size + 7) // 8):
        bad += _pack_group(intsum, g, offset, width, limit, out, out.size)
    return bad


@njit(cache=True, inline="always")
def _scaled(v, offset, scaler, inv):
    """f32((f64(v - offset) * scaler) * inv): packing.scale_integer_sum's expression for one value
    (scaler = f64(s), inv = f64(1 / divide_by)); the same IEEE operations, so the same bits."""
    return np.float32((np.float64(np.int64(v) - offset) * scaler) * inv)


@njit(cache=True)
def _decode_tail(payload, n, width, offset, scaler, inv, out, g0):
    """The short tail of decode: values 8 g0 .. n-1, _scaled; returns their max value."""
    mask = np.uint64((1 << width) - 1)
    top = np.uint64(0)
    for g in range(g0, (n + 7) // 8):
        acc = _read_group(payload, g, width)
        for j in range(8):
            i = g * 8 + j
            if i < n:
                v = (acc >> np.uint64(j * width)) & mask
                top = max(top, v)
                out[i] = _scaled(v, offset, scaler, inv)
    return top


@functools.lru_cache(maxsize=None)
def _full_group_kernels(width: int):
    """(pack, decode) over the full groups, compiled for one `width` (1..8): with the width a
    compile-time constant LLVM unrolls the 8-value and `width`-byte loops.
    Numba's cache key includes the closure's constants, so each width caches apart.

    Serial on purpose, and in 32-bit integers where they suffice: LLVM vectorizes these loops only
    outside a parallel region, and the decode computes each value instead of gathering it from a
    table of the 2^width values (docs/MEASUREMENTS.md)."""
    limit = (1 << width) - 1
    mask = np.uint64(limit)

    @njit(cache=True)
    def pack(intsum, offset, out, full):
        """out <- pack(intsum + offset) for groups < full; returns the number of values outside
        [0, 2^width) (written as their low bits: the caller raises). offset: int32."""
        nb = 0
        for g in range(full):
            acc = np.uint64(0)
            for j in range(8):
                v = np.int32(intsum[g * 8 + j]) + offset
                nb += (v < 0) | (v > limit)
                acc |= np.uint64(v & limit) << np.uint64(j * width)
            base = g * width
            for m in range(width):
                out[base + m] = np.uint8((acc >> np.uint64(8 * m)) & np.uint64(0xFF))
        return nb

    @njit(cache=True)
    def decode(payload, offset, scaler, inv, out, full):
        """out[i] <- _scaled(v_i) for groups < full; returns the max v_i."""
        top = np.uint64(0)
        for g in range(full):
            acc = np.uint64(0)
            base = g * width
            for m in range(width):
                acc |= np.uint64(payload[base + m]) << np.uint64(8 * m)
            for j in range(8):
                v = (acc >> np.uint64(j * width)) & mask
                top = max(top, v)
                out[g * 8 + j] = _scaled(v, offset, scaler, inv)
        return top

    return pack, decode


def pack_offset(intsum: np.ndarray, offset: int, width: int) -> np.ndarray:
    """pack_uint(intsum + offset, width) in one pass, width <= 8 (ValueError if a value does not fit)."""
    v = np.ascontiguousarray(intsum.reshape(-1))
    if v.dtype.itemsize > 2 and v.size:     # the kernel widens to int32: check wider values here
        lo, hi = int(v.min()), int(v.max())
        if lo + offset < 0 or hi + offset > (1 << width) - 1:
            raise ValueError(f"integer sums + {offset} do not fit in {width} bits")
    out = np.empty(-(-v.size * width // 8), dtype=np.uint8)
    full = min(v.size // 8, out.size // width)
    pack, _ = _full_group_kernels(int(width))
    bad = pack(v, np.int32(offset), out, np.int64(full)) + _pack_tail(v, np.int64(offset), np.int64(width), out,
                                                                       np.int64(full))
    if bad:
        raise ValueError(f"integer sums + {offset} do not fit in {width} bits")
    return out


def decode_scaled(payload: np.ndarray, n: int, width: int, offset: int, scaler: float, divide_by: int, out=None):
    """(float32 mean, max packed value): scale_integer_sum(unpack_uint(payload) - offset, scaler, divide_by)
    of the n values of `width` bits in `payload`, written into `out` (a contiguous float32 array of n
    elements) when given; the max packed value lets the caller check the range."""
    payload = np.ascontiguousarray(payload)
    out = np.empty(n, dtype=np.float32) if out is None else out
    full = min(n // 8, payload.size // width)
    _, decode = _full_group_kernels(int(width))
    args = (np.int64(offset), np.float64(scaler), np.float64(1.0 / divide_by))
    top = max(int(decode(payload, *args, out, np.int64(full))),
              int(_decode_tail(payload, np.int64(n), np.int64(width), *args, out, np.int64(full))))
    return out, top


@njit(cache=True)
def _decode_codes(codes, n, scaler, inv, out):
    """out[i] <- _scaled(c_i) (offset 0); returns how many codes c_i lie outside [-n, n] (their out
    is that of -n). Serial and computed per element, not gathered from a table of the values: LLVM
    vectorizes it."""
    bad = 0
    for i in range(codes.size):
        c = np.int64(codes[i])
        ok = (c >= -n) & (c <= n)
        bad += 1 - ok
        out[i] = _scaled(c * ok - n * (1 - ok), 0, scaler, inv)
    return bad


def decode_codes(codes: np.ndarray, n: int, scaler: float) -> tuple[np.ndarray, int]:
    """(packing.scale_integer_sum(codes, scaler, n) as float32, number of codes outside [-n, n]) in one
    pass: the integer all-reduce's sums of N workers' codes."""
    codes = np.ascontiguousarray(codes.reshape(-1))
    out = np.empty(codes.size, dtype=np.float32)
    bad = _decode_codes(codes, np.int64(n), np.float64(scaler), np.float64(1.0 / n), out)
    return out, int(bad)


@functools.lru_cache(maxsize=None)
def _segment_kernels(width: int):
    """(pack_segments, decode_segments): pack_offset and decode_scaled of many layers ("segments") in
    one call, compiled for one `width` (1..8). Segment s is values[starts[s] : starts[s] + sizes[s]],
    packed at byte out_starts[s] of one buffer; each segment goes through the one-layer kernels (the
    full groups of `_full_group_kernels`, then the short tail), so the bits are those of one call
    per segment."""
    pack, decode = _full_group_kernels(int(width))

    @njit(cache=True)
    def pack_segments(values, starts, sizes, offset, out, out_starts):
        """out[out_starts[s]:] <- pack(values of segment s + offset) for every s; returns the number of
        values outside [0, 2^width) (the caller raises)."""
        bad = 0
        for s in range(starts.size):
            v = values[starts[s]:starts[s] + sizes[s]]
            o = out[out_starts[s]:out_starts[s] + (sizes[s] * width + 7) // 8]
            full = sizes[s] // 8
            bad += pack(v, np.int32(offset), o, full) + _pack_tail(v, offset, width, o, full)
        return bad

    @njit(cache=True)
    def decode_segments(payload, starts, sizes, offset, scalers, inv, out, out_starts, tops):
        """out[out_starts[s]:] <- _scaled(v_i, offset, scalers[s], inv) of segment s's packed values
        (bytes from starts[s]); tops[s] <- its max packed value."""
        for s in range(starts.size):
            p = payload[starts[s]:starts[s] + (sizes[s] * width + 7) // 8]
            o = out[out_starts[s]:out_starts[s] + sizes[s]]
            full = sizes[s] // 8
            tops[s] = max(decode(p, offset, scalers[s], inv, o, full),
                          _decode_tail(p, sizes[s], width, offset, scalers[s], inv, o, full))

    return pack_segments, decode_segments


def pack_offset_segments(values: np.ndarray, starts: np.ndarray, sizes: np.ndarray, offset: int, width: int,
                         out: np.ndarray, out_starts: np.ndarray) -> None:
    """pack_offset(values[starts[s]:starts[s] + sizes[s]], offset, width) written at out[out_starts[s]:]
    for every segment s, in one call (int8 or int16 values; width <= 8); ValueError if a value does
    not fit, as pack_offset."""
    if values.dtype.itemsize > 2:
        raise ValueError(f"pack_offset_segments takes int8 or int16 values, got {values.dtype}")
    pack, _ = _segment_kernels(int(width))
    if pack(values, starts, sizes, np.int64(offset), out, out_starts):
        raise ValueError(f"integer sums + {offset} do not fit in {width} bits")


def decode_scaled_segments(payload: np.ndarray, starts: np.ndarray, sizes: np.ndarray, width: int, offset: int,
                           scalers: np.ndarray, divide_by: int, out: np.ndarray, out_starts: np.ndarray) -> np.ndarray:
    """decode_scaled of every segment s (sizes[s] values packed from payload[starts[s]:], scaler
    scalers[s]) into out[out_starts[s]:], in one call; returns the max packed value per segment
    (uint64), for the caller's range check."""
    _, decode = _segment_kernels(int(width))
    tops = np.empty(starts.size, dtype=np.uint64)
    decode(payload, starts, sizes, np.int64(offset), np.asarray(scalers, dtype=np.float64),
           np.float64(1.0 / divide_by), out, out_starts, tops)
    return tops
