"""Numba kernels for the parameter server's downlink: pack/unpack integers at `width` <= 8 bits.

Eight values of `width` bits fill exactly `width` bytes, so each group of eight is one 64-bit word
written (or read) independently: a parallel loop over blocks of groups, with no bounds test inside
a full group (the short tail is handled apart; per-element bounds tests made these kernels ~10x
slower). Same bits as the reference
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


@njit(cache=True)
def _pack_tail(intsum, offset, width, out, g0):
    """_pack_group for groups g0 .. (the short tail after the full groups); returns the bad count."""
    limit = (1 << width) - 1
    bad = 0
    for g in range(g0, (intsum.size + 7) // 8):
        bad += _pack_group(intsum, g, offset, width, limit, out, out.size)
    return bad


@njit(cache=True)
def _decode_tail(payload, n, width, table, out, g0):
    """The short tail of decode: values 8 g0 .. n-1 through `table`; returns their max value."""
    mask = np.uint64((1 << width) - 1)
    top = np.uint64(0)
    for g in range(g0, (n + 7) // 8):
        acc = _read_group(payload, g, width)
        for j in range(8):
            i = g * 8 + j
            if i < n:
                v = (acc >> np.uint64(j * width)) & mask
                top = max(top, v)
                out[i] = table[v]
    return top


@functools.lru_cache(maxsize=None)
def _full_group_kernels(width: int):
    """(pack, decode) over the full groups, compiled for one `width` (1..8): with the width a
    compile-time constant LLVM unrolls the 8-value and `width`-byte loops (2-4x faster than a
    runtime width). Numba's cache key includes the closure's constants, so each width caches apart."""
    limit = (1 << width) - 1
    mask = np.uint64(limit)

    @njit(cache=True, parallel=True)
    def pack(intsum, offset, out, full):
        """out <- pack(intsum + offset) for groups < full; returns the number of values outside
        [0, 2^width) (written as their low bits: the caller raises)."""
        blocks = (full + _BLOCK - 1) // _BLOCK
        bad = np.zeros(max(blocks, 1), dtype=np.int64)
        for b in prange(blocks):
            nb = 0
            for g in range(b * _BLOCK, min(full, (b + 1) * _BLOCK)):
                acc = np.uint64(0)
                for j in range(8):
                    v = np.int64(intsum[g * 8 + j]) + offset
                    nb += (v < 0) | (v > limit)
                    acc |= np.uint64(v & limit) << np.uint64(j * width)
                base = g * width
                for m in range(width):
                    out[base + m] = np.uint8((acc >> np.uint64(8 * m)) & np.uint64(0xFF))
            bad[b] = nb
        return bad.sum()

    @njit(cache=True, parallel=True)
    def decode(payload, table, out, full):
        """out[i] <- table[v_i] for groups < full; returns the max v_i."""
        blocks = (full + _BLOCK - 1) // _BLOCK
        vmax = np.zeros(max(blocks, 1), dtype=np.uint64)
        for b in prange(blocks):
            top = np.uint64(0)
            for g in range(b * _BLOCK, min(full, (b + 1) * _BLOCK)):
                acc = np.uint64(0)
                base = g * width
                for m in range(width):
                    acc |= np.uint64(payload[base + m]) << np.uint64(8 * m)
                for j in range(8):
                    v = (acc >> np.uint64(j * width)) & mask
                    top = max(top, v)
                    out[g * 8 + j] = table[v]
            vmax[b] = top
        return vmax.max()

    return pack, decode


def pack_offset(intsum: np.ndarray, offset: int, width: int) -> np.ndarray:
    """pack_uint(intsum + offset, width) in one pass, width <= 8 (ValueError if a value does not fit)."""
    v = np.ascontiguousarray(intsum.reshape(-1))
    out = np.empty(-(-v.size * width // 8), dtype=np.uint8)
    full = min(v.size // 8, out.size // width)
    pack, _ = _full_group_kernels(int(width))
    bad = pack(v, np.int64(offset), out, np.int64(full)) + _pack_tail(v, np.int64(offset), np.int64(width), out,
                                                                       np.int64(full))
    if bad:
        raise ValueError(f"integer sums + {offset} do not fit in {width} bits")
    return out


def decode_table(width: int, offset: int, scaler: float, divide_by: int) -> np.ndarray:
    """float32 value of every packed value v < 2^width: f32((f64(v - offset) * f64(scaler)) * (1/divide_by)),
    the exact expression of packing.scale_integer_sum, evaluated once per value instead of per element."""
    v = np.arange(1 << width, dtype=np.int64) - offset
    return ((v.astype(np.float64) * np.float64(scaler)) * np.float64(1.0 / divide_by)).astype(np.float32)


def decode_scaled(payload: np.ndarray, n: int, width: int, offset: int, scaler: float, divide_by: int):
    """(float32 mean, max packed value): scale_integer_sum(unpack_uint(payload) - offset, scaler, divide_by)."""
    payload = np.ascontiguousarray(payload)
    out = np.empty(n, dtype=np.float32)
    table = decode_table(width, offset, scaler, divide_by)
    full = min(n // 8, payload.size // width)
    _, decode = _full_group_kernels(int(width))
    top = max(int(decode(payload, table, out, np.int64(full))),
              int(_decode_tail(payload, np.int64(n), np.int64(width), table, out, np.int64(full))))
    return out, top


@njit(cache=True, parallel=True)
def _decode_codes(codes, n, table, out):
    """out[i] <- table[codes[i] + n]; returns how many codes lie outside [-n, n] (their out is table[0])."""
    size = codes.size
    blocks = (size + 8 * _BLOCK - 1) // (8 * _BLOCK)
    bad = np.zeros(max(blocks, 1), dtype=np.int64)
    for b in prange(blocks):
        nb = 0
        for i in range(b * 8 * _BLOCK, min(size, (b + 1) * 8 * _BLOCK)):
            c = np.int64(codes[i]) + n
            ok = (c >= 0) & (c <= 2 * n)
            nb += 1 - ok
            out[i] = table[c * ok]
        bad[b] = nb
    return bad.sum()


def decode_codes(codes: np.ndarray, n: int, scaler: float) -> tuple[np.ndarray, int]:
    """(packing.scale_integer_sum(codes, scaler, n) as float32, number of codes outside [-n, n]) in one
    pass: the integer all-reduce's sums of N workers' codes, through decode_table."""
    codes = np.ascontiguousarray(codes.reshape(-1))
    table = decode_table(max(1, int(2 * n).bit_length()), n, scaler, n)
    out = np.empty(codes.size, dtype=np.float32)
    bad = _decode_codes(codes, np.int64(n), table, out)
    return out, int(bad)
