"""Numba kernels for the parameter server's downlink: pack/unpack integers at `width` <= 8 bits.

Eight values of `width` bits fill exactly `width` bytes, so each group of eight is one 64-bit word
written (or read) independently: a parallel loop over blocks of groups, with no bounds test inside
a full group (the short tail is handled apart; per-element bounds tests made these kernels ~10x
slower). Same bits as the reference
(`packing.pack_uint_reference`, little-endian bit order), tested in tests/test_packing_uint.py.
"""

from __future__ import annotations

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
    return pack_offset(np.ascontiguousarray(values.reshape(-1), dtype=np.uint32), 0, width)


def unpack_uint(payload: np.ndarray, n: int, width: int) -> np.ndarray:
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


@njit(cache=True, parallel=True)
def _pack_offset(intsum, offset, width, out):
    """out <- pack(intsum + offset); returns the number of groups holding a value outside [0, 2^width).

    Full groups (eight values, `width` whole bytes) run branch-free in parallel blocks; a value
    that does not fit is counted and written as 0 (the caller raises); the short tail is scalar."""
    n = intsum.size
    nbytes = out.size
    full = min(n // 8, nbytes // width)
    limit = (1 << width) - 1
    w = np.uint64(width)
    blocks = (full + _BLOCK - 1) // _BLOCK
    bad = np.zeros(max(blocks, 1), dtype=np.int64)
    for b in prange(blocks):
        nb = 0
        for g in range(b * _BLOCK, min(full, (b + 1) * _BLOCK)):
            acc = np.uint64(0)
            sh = np.uint64(0)
            for j in range(8):
                v = np.int64(intsum[g * 8 + j]) + offset
                ok = (v >= 0) & (v <= limit)
                nb += 1 - ok
                acc |= np.uint64(v * ok) << sh
                sh += w
            base = g * width
            for m in range(width):
                out[base + m] = np.uint8(acc & np.uint64(0xFF))
                acc >>= np.uint64(8)
        bad[b] = nb
    total = bad.sum()
    for g in range(full, (n + 7) // 8):
        total += _pack_group(intsum, g, offset, width, limit, out, nbytes)
    return total


@njit(cache=True, parallel=True)
def _decode_scaled(payload, n, width, offset, scaler, inv, out):
    """out[i] <- f32((f64(v_i - offset) * scaler) * inv), v_i the i-th packed value; returns max v."""
    full = min(n // 8, payload.size // width)
    mask = np.uint64((1 << width) - 1)
    w = np.uint64(width)
    blocks = (full + _BLOCK - 1) // _BLOCK
    vmax = np.zeros(blocks + 1, dtype=np.int64)
    for b in prange(blocks):
        top = np.int64(0)
        for g in range(b * _BLOCK, min(full, (b + 1) * _BLOCK)):
            acc = _read_full_group(payload, g, width)
            for j in range(8):
                v = np.int64(acc & mask)
                acc >>= w
                top = max(top, v)
                out[g * 8 + j] = np.float32((np.float64(v - offset) * scaler) * inv)
        vmax[b] = top
    top = np.int64(0)
    for g in range(full, (n + 7) // 8):
        acc = _read_group(payload, g, width)
        for j in range(8):
            i = g * 8 + j
            if i < n:
                v = np.int64((acc >> np.uint64(j * width)) & mask)
                top = max(top, v)
                out[i] = np.float32((np.float64(v - offset) * scaler) * inv)
    vmax[blocks] = top
    return vmax.max()


def pack_offset(intsum: np.ndarray, offset: int, width: int) -> np.ndarray:
    """pack_uint(intsum + offset, width) in one pass (ValueError if a value does not fit)."""
    v = np.ascontiguousarray(intsum.reshape(-1))
    out = np.empty(-(-v.size * width // 8), dtype=np.uint8)
    if _pack_offset(v, np.int64(offset), np.int64(width), out):
        raise ValueError(f"integer sums + {offset} do not fit in {width} bits")
    return out


def decode_scaled(payload: np.ndarray, n: int, width: int, offset: int, scaler: float, divide_by: int):
    """(float32 mean, max packed value): scale_integer_sum(unpack_uint(payload) - offset, scaler, divide_by)."""
    out = np.empty(n, dtype=np.float32)
    vmax = _decode_scaled(np.ascontiguousarray(payload), np.int64(n), np.int64(width), np.int64(offset),
                          np.float64(scaler), np.float64(1.0 / divide_by), out)
    return out, int(vmax)
