"""Numba CPU kernels of the 16-bit cast codecs: fp16's cast of float32 gradients (round to nearest
even, NumPy's float32 -> float16 conversion bit for bit) and the decode-sum of fp16 and bf16 messages
(the W messages' 16-bit patterns -> the float32 mean), the array reference's bits.

Used by tgsim.codecs.fp16 and tgsim.codecs.bf16 on NumPy arrays when the codec's `kernels` is "auto"
or "numba" (bf16's encode is tgsim.codecs.bf16's own Numba loop); the array code (ndarray.astype,
ordered_mean of the decodes) stays the reference. No fastmath.

* fp16 cast: NumPy's npy_floatbits_to_halfbits on the float32 bits: overflow to a signed inf, NaN
  kept quiet with its top payload bits, subnormal halves by shifting the significand (113 - exp)
  places, round half to even by adding 0x1000 unless the dropped bits are exactly the half and the
  kept last bit is even. float64 gradients (NumPy rounds them once, from float64) and other dtypes
  take ndarray.astype.
* decode-sum: per task of _TASK elements a float64 scratch acc = 0, for each message in order
  acc += f64(decode) (fp16: f64(the float32 of bits (sign << 16) | (magnitude << 13)) · 2^112, exact
  for every finite half, subnormals included; a chunk holding an inf or NaN reads a table of the
  65536 float16 values as float64 instead; bf16: the float32 of bits << 16), then
  out = f32(acc · (1/divide_by)): ordered_mean's operations.

Tasks run in one parallel region from _PARALLEL_FROM elements (x messages); the bits never depend on
the split. Everything compiles lazily on first use, cache=True.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from tgsim.codecs._numba_rows import addresses, row

_TASK = 1 << 14
_PARALLEL_FROM = 1 << 16
_TWO112 = np.float64(2.0 ** 112)
_F16_TO_F64 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)


def _groups(ntasks: int) -> int:
    return max(1, min(ntasks, 4 * numba.get_num_threads()))


def _parallel(work: int, ntasks: int) -> bool:
    return work >= _PARALLEL_FROM and ntasks > 1 and numba.get_num_threads() > 1


# -- fp16 cast --------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _half_bits(f):
    """NumPy's npy_floatbits_to_halfbits: the float16 bits (uint32 < 2^16) of float32 bits f. Every
    case is computed and one selected (no branch: the loop over elements vectorizes)."""
    h_sgn = (f & np.uint32(0x80000000)) >> np.uint32(16)
    f_exp = f & np.uint32(0x7F800000)
    f_sig = f & np.uint32(0x007FFFFF)
    # normal halves: round half to even by adding 0x1000 unless the dropped bits are exactly a half
    # over an even kept bit (a carry into the exponent is the right result, up to inf)
    add = np.uint32(0x1000) if (f_sig & np.uint32(0x3FFF)) != np.uint32(0x1000) else np.uint32(0)
    normal = ((f_exp - np.uint32(0x38000000)) >> np.uint32(13)) + ((f_sig + add) >> np.uint32(13))
    # subnormal halves: the significand shifted 113 - exp places (the shift clamped for the lanes
    # that take another case), then the same rounding, checking the bits the shift dropped too
    e = np.int32(f_exp >> np.uint32(23))
    sig = (np.uint32(0x00800000) + f_sig) >> np.uint32(min(max(113 - e, 0), 31))
    exact_half = ((sig & np.uint32(0x3FFF)) == np.uint32(0x1000)) & ((f & np.uint32(0x7FF)) == np.uint32(0))
    sub = (sig + (np.uint32(0) if exact_half else np.uint32(0x1000))) >> np.uint32(13)
    # NaN (kept a NaN with its top payload bits), inf and overflow
    nan = np.uint32(0x7C00) + (f_sig >> np.uint32(13))
    nan = nan + np.uint32(1) if nan == np.uint32(0x7C00) else nan
    big = nan if (f_exp == np.uint32(0x7F800000)) & (f_sig != np.uint32(0)) else np.uint32(0x7C00)
    r = normal
    r = sub if f_exp <= np.uint32(0x38000000) else r
    r = np.uint32(0) if f_exp < np.uint32(0x33000000) else r
    r = big if f_exp >= np.uint32(0x47800000) else r
    return (h_sgn + r) & np.uint32(0xFFFF)


@njit(cache=True)
def _cast_range(u, out, e0, e1):
    uu = u[e0:e1]                           # indices from 0: no negative-index wraparound, vectorized
    oo = out[e0:e1]
    for i in range(uu.size):
        oo[i] = np.uint16(_half_bits(uu[i]))


@njit(cache=True, parallel=True)
def _cast_parallel(u, out, task, groups):
    n = u.size
    ntasks = (n + task - 1) // task
    per = (ntasks + groups - 1) // groups
    for g in prange(groups):
        _cast_range(u, out, min(n, g * per * task), min(n, (g + 1) * per * task))


def to_fp16(g: np.ndarray) -> np.ndarray:
    """g.astype(np.float16) of a NumPy array (same shape): float32 by the Numba cast, other dtypes by
    NumPy."""
    if g.dtype != np.float32:
        return g.astype(np.float16)
    u = np.ascontiguousarray(g).reshape(-1).view(np.uint32)
    out = np.empty(u.size, np.uint16)
    ntasks = -(-u.size // _TASK)
    if _parallel(u.size, ntasks):
        _cast_parallel(u, out, np.int64(_TASK), np.int64(_groups(ntasks)))
    else:
        _cast_range(u, out, 0, u.size)
    return out.view(np.float16).reshape(g.shape)


# -- decode-sums ------------------------------------------------------------------------------------
@njit(cache=True)
def _sum_task(t, bits, like, bf16, table, inv, task, out, acc, scratch):
    """Task t: elements [t task, (t + 1) task); message w's 16-bit patterns are
    row(bits, w, n, like) (bits: their addresses)."""
    n = out.size
    e0 = t * task
    e1 = min(n, e0 + task)
    m = e1 - e0
    aa = acc[:m]
    aa[:] = 0.0
    ss = scratch[:m]
    ff = ss.view(np.float32)
    for w in range(bits.size):
        bb = row(bits, w, n, like)[e0:e1]
        if bf16:
            for j in range(m):
                ss[j] = np.uint32(bb[j]) << np.uint32(16)
            for j in range(m):
                aa[j] += np.float64(ff[j])
        else:
            special = np.uint32(0)                   # inf or NaN among the chunk's values
            for j in range(m):
                special |= np.uint32((np.uint32(bb[j]) & np.uint32(0x7C00)) == np.uint32(0x7C00))
            if special:
                for j in range(m):
                    aa[j] += table[bb[j]]
            else:                                    # finite: the float32 with the half's bits << 13,
                for j in range(m):                   # times 2^112 (exact, subnormal halves included)
                    h = np.uint32(bb[j])
                    ss[j] = ((h & np.uint32(0x8000)) << np.uint32(16)) | ((h & np.uint32(0x7FFF)) << np.uint32(13))
                for j in range(m):
                    aa[j] += np.float64(ff[j]) * _TWO112
    oo = out[e0:e1]
    for j in range(m):
        oo[j] = np.float32(aa[j] * inv)


@njit(cache=True, parallel=True)
def _sum_parallel(bits, like, bf16, table, inv, task, out, groups):
    ntasks = (out.size + task - 1) // task
    per = (ntasks + groups - 1) // groups
    for g in prange(groups):
        acc = np.empty(task, np.float64)
        scratch = np.empty(task, np.uint32)
        for t in range(g * per, min(ntasks, (g + 1) * per)):
            _sum_task(t, bits, like, bf16, table, inv, task, out, acc, scratch)


@njit(cache=True)
def _sum_serial(bits, like, bf16, table, inv, task, out):
    acc = np.empty(task, np.float64)
    scratch = np.empty(task, np.uint32)
    for t in range((out.size + task - 1) // task):
        _sum_task(t, bits, like, bf16, table, inv, task, out, acc, scratch)


def decode_sum(layers, n: int, divide_by: int, bf16: bool) -> np.ndarray:
    """Flat float32 (n,): f32(Σ_w f64(decode_w) · (1/divide_by)) of the W messages' layers (float16
    arrays for fp16, uint16 bfloat16 patterns for bf16), the reference's ordered_mean."""
    out = np.empty(n, np.float32)
    if n == 0:
        return out
    kept, bits, like = addresses([np.ascontiguousarray(v).reshape(-1).view(np.uint16) for v in layers], n)
    args = (bits, like, bool(bf16), _F16_TO_F64, np.float64(1.0 / divide_by), np.int64(_TASK), out)
    ntasks = -(-n // _TASK)
    if _parallel(n * len(bits), ntasks):
        _sum_parallel(*args, np.int64(_groups(ntasks)))
    else:
        _sum_serial(*args)
    return out
