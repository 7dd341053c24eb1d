"""Numba kernels for the parameter server's downlink: pack/unpack integers at `width` <= 8 bits.

Eight values of `width` bits fill exactly `width` bytes, so each group of eight is one 64-bit word
written (or read) independently: a parallel loop over groups. Same bits as the reference
(`packing.pack_uint_reference`, little-endian bit order), tested in tests/test_packing_uint.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True)
def _pack(values, width, out):
    n = values.size
    nbytes = out.size
    groups = (n + 7) // 8
    for g in prange(groups):
        acc = np.uint64(0)
        for j in range(8):
            i = g * 8 + j
            if i < n:
                acc |= np.uint64(values[i]) << np.uint64(j * width)
        base = g * width
        for m in range(width):
            if base + m < nbytes:
                out[base + m] = np.uint8((acc >> np.uint64(8 * m)) & np.uint64(0xFF))


@njit(cache=True, parallel=True)
def _unpack(payload, n, width, out):
    nbytes = payload.size
    groups = (n + 7) // 8
    mask = np.uint64((1 << width) - 1)
    for g in prange(groups):
        acc = np.uint64(0)
        base = g * width
        for m in range(width):
            if base + m < nbytes:
                acc |= np.uint64(payload[base + m]) << np.uint64(8 * m)
        for j in range(8):
            i = g * 8 + j
            if i < n:
                out[i] = np.uint32((acc >> np.uint64(j * width)) & mask)


def pack_uint(values: np.ndarray, width: int) -> np.ndarray:
    v = np.ascontiguousarray(values.reshape(-1), dtype=np.uint32)
    out = np.empty(-(-v.size * width // 8), dtype=np.uint8)
    _pack(v, np.int64(width), out)
    return out


def unpack_uint(payload: np.ndarray, n: int, width: int) -> np.ndarray:
    out = np.empty(n, dtype=np.uint32)
    _unpack(np.ascontiguousarray(payload), np.int64(n), np.int64(width), out)
    return out
