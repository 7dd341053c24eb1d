"""Numba CPU kernels of the Suresh et al. quantizer (tgsim.codecs.suresh): the range, the levels and
their packed bits (encode), the randomized Hadamard rotation and its inverse, and decode-sum (the
W messages' levels -> the float32 mean), bit for bit the array reference's.

Used by tgsim.codecs.suresh on NumPy arrays when the codec's `kernels` is "auto" or "numba"; the
array code (suresh.rotate / quantize / dequantize / unrotate, packing.pack_uint, ordered_mean)
stays the reference and the CuPy path. Each element sees the reference's float64 operations in the
reference's order (no fastmath: no FMA contraction, no reassociation):

* range: suresh.outward_range itself (NumPy's min and max, vectorized; exact in any order).
* levels: tasks of _TASK elements (a multiple of 8, so every task starts on a Philox block and a
  byte of the payload); per task the stream's words [e0, e1) (tgsim.rng.numba_philox, into a 16 KiB
  scratch), l = min(floor((f64(y) - f64(lo)) / Δ + u), k - 1), then the task's levels packed at b
  bits each, little-endian bit order (packing.pack_uint's layout; for b < 8 eight levels make one
  uint64 written as b bytes). No float64 array of the layer
  for rotate = false: the gradient is read twice (range, levels), the levels and payload written.
* rotation: x = (f64(v) or 0 past n) · (1 - 2 (word & 1)), the fast Walsh-Hadamard transform in
  place (the butterflies of suresh.fwht, a + b and a - b; the stages below _FWHT_BLOCK elements run
  block by block, which changes the order of independent butterflies, not their operands), then
  · 1/sqrt(d). The rotated values are a float64 array of d elements, as in the reference.
* decode-sum: rotate = false, per task a float64 scratch acc (32 KiB), for each message in order
  acc += f64(f32(f64(l) · Δ_w + f64(lo_w))), then out = f32(acc · (1/N)); rotate = true, per message
  z = f64(l) · Δ + f64(lo) (float64, d), fwht, then acc += f64(f32((z · 1/sqrt(d)) · sign)) on the
  first n entries (acc float64 (n,)).

Layers of fewer than _PARALLEL_FROM elements run serially on the calling thread, larger ones in a
parallel region over runs of tasks (numba.prange); the bits never depend on the split. Everything
compiles lazily on first use, with cache=True so later processes load the machine code from disk.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from tgsim.codecs._numba_rows import addresses, row

from tgsim.rng.numba_philox import _stream_args, _words_range
from tgsim.rng.philox import StreamKey

_TASK = 1 << 12                # elements per task (a multiple of 8)
_PARALLEL_FROM = 1 << 16       # elements (encode) or workers x elements (decode-sum) from which tasks run in parallel
_FWHT_BLOCK = 1 << 11          # FWHT stages below this many elements run block by block (L1-resident)
_U24 = np.float64(2.0 ** -24)
_S8 = np.uint32(8)
SIGN_BLOCK = np.int64(2**33 // 4)   # the Philox block of word SIGN_OFFSET = 2^33 (suresh.SIGN_OFFSET)


def _groups(ntasks: int) -> int:
    """Runs of tasks for the parallel kernels: a few per thread (load balance), at most one per task."""
    return max(1, min(ntasks, 4 * numba.get_num_threads()))


def _parallel(work: int, ntasks: int) -> bool:
    return work >= _PARALLEL_FROM and ntasks > 1 and numba.get_num_threads() > 1


# -- levels and bits --------------------------------------------------------------------------------
@njit(cache=True)
def _level_task(t, y, lo, step, top, b, task, levels, payload, key, words):
    n = y.size
    e0 = t * task
    e1 = min(n, e0 + task)
    m = e1 - e0
    c1, c2, c3, k0, k1 = key
    _words_range(words[:(m + 3) // 4 * 4], e0 // 4, c1, c2, c3, k0, k1)
    yy = y[e0:e1]
    ll = levels[e0:e1]
    for j in range(m):
        x = np.floor((np.float64(yy[j]) - lo) / step + np.float64(words[j] >> _S8) * _U24)
        ll[j] = min(x, top)
    out = payload[(e0 * b) // 8:]
    if b == 8:
        for j in range(m):
            out[j] = np.uint8(ll[j])
        return
    j0 = 0
    if b < 8:                             # eight levels fill b bytes: one uint64 per group of eight
        bw = np.uint64(b)
        for gi in range(m // 8):
            acc = np.uint64(0)
            for j in range(8):
                acc |= np.uint64(ll[8 * gi + j]) << (bw * np.uint64(j))
            for j in range(b):
                out[gi * b + j] = np.uint8((acc >> np.uint64(8 * j)) & np.uint64(0xFF))
        j0 = m // 8 * 8
        out = out[j0 // 8 * b:]
    acc = np.uint64(0)
    nacc = 0
    k = 0
    for j in range(j0, m):
        acc |= np.uint64(ll[j]) << np.uint64(nacc)
        nacc += b
        while nacc >= 8:
            out[k] = np.uint8(acc & np.uint64(0xFF))
            acc >>= np.uint64(8)
            nacc -= 8
            k += 1
    if nacc:
        out[k] = np.uint8(acc & np.uint64(0xFF))


@njit(cache=True, parallel=True)
def _level_tasks(y, lo, step, top, b, task, levels, payload, key, groups):
    ntasks = (y.size + task - 1) // task
    per = (ntasks + groups - 1) // groups
    for g in prange(groups):
        words = np.empty(task + 4, dtype=np.uint32)
        for t in range(g * per, min(ntasks, (g + 1) * per)):
            _level_task(t, y, lo, step, top, b, task, levels, payload, key, words)


@njit(cache=True)
def _level_serial(y, lo, step, top, b, task, levels, payload, key):
    words = np.empty(task + 4, dtype=np.uint32)
    for t in range((y.size + task - 1) // task):
        _level_task(t, y, lo, step, top, b, task, levels, payload, key, words)


def levels_and_payload(y: np.ndarray, key: StreamKey, k: int, lo: float, step: float):
    """(levels uint8/uint16 (m,), payload uint8) of the m values y (float32 or float64, flat, m >= 1)
    for k levels, the range's float64 lo and spacing Δ = step > 0, the draws from the stream `key`:
    suresh.quantize's levels and packing.pack_uint(levels, ceil(log2 k))'s bytes."""
    m = int(y.size)
    b = (int(k) - 1).bit_length()
    levels = np.empty(m, np.uint8 if k <= 256 else np.uint16)
    payload = np.empty(-(-m * b // 8), np.uint8)
    args = (y, np.float64(lo), np.float64(step), np.float64(k - 1), np.int64(b), np.int64(_TASK), levels, payload,
            _stream_args(key))
    ntasks = -(-m // _TASK)
    if _parallel(m, ntasks):
        _level_tasks(*args, np.int64(_groups(ntasks)))
    else:
        _level_serial(*args)
    return levels, payload


# -- rotation ---------------------------------------------------------------------------------------
@njit(cache=True)
def _fwht(y):
    """suresh.fwht in place on float64 y (length d, a power of two): the same butterflies
    (a, b) -> (a + b, a - b) per stage h = 1, 2, 4, ...; the stages with 2h <= _FWHT_BLOCK run
    one block of _FWHT_BLOCK elements at a time (every butterfly still reads the previous stage's
    values of its pair, so the bits are the reference's)."""
    d = y.size
    blk = min(d, _FWHT_BLOCK)
    for base in range(0, d, blk):
        h = 1
        while h < blk:
            for s0 in range(base, base + blk, 2 * h):
                for j in range(s0, s0 + h):
                    a = y[j]
                    c = y[j + h]
                    y[j] = a + c
                    y[j + h] = a - c
            h *= 2
    h = blk
    while h < d:
        for s0 in range(0, d, 2 * h):
            for j in range(s0, s0 + h):
                a = y[j]
                c = y[j + h]
                y[j] = a + c
                y[j + h] = a - c
        h *= 2


@njit(cache=True)
def _signs_into(words, d, key):
    """words[:d] = the words [2^33, 2^33 + d) of the stream (d a power of two; words holds >= 4)."""
    c1, c2, c3, k0, k1 = key
    _words_range(words[:max(4, d)], SIGN_BLOCK, c1, c2, c3, k0, k1)


@njit(cache=True)
def _rotate(v, d, scale, key, y, words):
    _signs_into(words, d, key)
    n = v.size
    for i in range(d):
        sgn = 1.0 - 2.0 * np.float64(words[i] & np.uint32(1))
        y[i] = (np.float64(v[i]) if i < n else 0.0) * sgn
    _fwht(y)
    for i in range(d):
        y[i] *= scale


def rotate(v: np.ndarray, key: StreamKey, d: int, scale: float) -> np.ndarray:
    """suresh.rotate's y = H D v' / sqrt(d) of the layer v (float64 (d,), d = padded_size(n) >= 1, D's
    signs from the stream `key`, scale = 1/sqrt(d) as the reference computes it)."""
    v = np.ascontiguousarray(v).reshape(-1)
    if v.dtype not in (np.float32, np.float64):
        v = v.astype(np.float32)                       # float16 and others: exact in float32
    y = np.empty(d, np.float64)
    _rotate(v, np.int64(d), np.float64(scale), _stream_args(key), y, np.empty(max(4, d), np.uint32))
    return y


# -- decode-sum -------------------------------------------------------------------------------------
@njit(cache=True)
def _sum_task(t, ls, like, steps, los, inv, task, out, acc):
    """Task t: elements [t task, (t + 1) task); message w's levels are row(ls, w, n, like)
    (ls: their addresses)."""
    n = out.size
    e0 = t * task
    e1 = min(n, e0 + task)
    aa = acc[:e1 - e0]
    aa[:] = 0.0
    for w in range(ls.size):
        ll = row(ls, w, n, like)[e0:e1]
        st = steps[w]
        lo = los[w]
        for j in range(e1 - e0):
            aa[j] += np.float64(np.float32(np.float64(ll[j]) * st + lo))
    oo = out[e0:e1]
    for j in range(e1 - e0):
        oo[j] = np.float32(aa[j] * inv)


@njit(cache=True, parallel=True)
def _sum_tasks(ls, like, steps, los, inv, task, out, groups):
    ntasks = (out.size + task - 1) // task
    per = (ntasks + groups - 1) // groups
    for g in prange(groups):
        acc = np.empty(task, dtype=np.float64)
        for t in range(g * per, min(ntasks, (g + 1) * per)):
            _sum_task(t, ls, like, steps, los, inv, task, out, acc)


@njit(cache=True)
def _sum_serial(ls, like, steps, los, inv, task, out):
    acc = np.empty(task, dtype=np.float64)
    for t in range((out.size + task - 1) // task):
        _sum_task(t, ls, like, steps, los, inv, task, out, acc)


@njit(cache=True)
def _sum_rotated(ls, like, d, steps, los, keys, scale, inv, out):
    """The rotated decode-sum: message w's d levels are row(ls, w, d, like) (ls: their addresses)."""
    n = out.size
    acc = np.zeros(n, dtype=np.float64)
    z = np.empty(d, dtype=np.float64)
    words = np.empty(max(4, d), dtype=np.uint32)
    for w in range(ls.size):
        ll = row(ls, w, d, like)
        st = steps[w]
        lo = los[w]
        for i in range(d):
            z[i] = np.float64(ll[i]) * st + lo
        _fwht(z)
        key = (keys[w, 0], keys[w, 1], keys[w, 2], keys[w, 3], keys[w, 4])
        _signs_into(words, d, key)
        for i in range(n):
            sgn = 1.0 - 2.0 * np.float64(words[i] & np.uint32(1))
            acc[i] += np.float64(np.float32((z[i] * scale) * sgn))
    for i in range(n):
        out[i] = np.float32(acc[i] * inv)


def decode_sum(levels, ranges, k: int, n: int, divide_by: int, keys=None, scale: float = 1.0) -> np.ndarray:
    """f32(Σ_w f64(decode_w) · (1/divide_by)), flat float32 (n,): the reference's ordered_mean of
    suresh's decoded layers. levels: the W messages' levels of k levels (one dtype; m = n, or d with
    rotation); ranges: their float32 [lo, hi]; keys (rotate only): the W StreamKeys of the layer, and
    scale = 1/sqrt(d) as the reference computes it."""
    out = np.empty(n, np.float32)
    if n == 0 or not len(levels):
        out[:] = np.float32(0.0)
        return out
    m = n if keys is None else int(np.asarray(levels[0]).size)       # d with rotation
    kept, ls, like = addresses(levels, m)
    los = np.array([float(r[0]) for r in ranges], np.float64)
    steps = np.array([(float(r[1]) - float(r[0])) / (k - 1) for r in ranges], np.float64)
    inv = np.float64(1.0 / divide_by)
    if keys is not None:
        kw = np.array([_stream_args(key) for key in keys], dtype=np.uint32).reshape(len(keys), 5)
        _sum_rotated(ls, like, np.int64(m), steps, los, kw, np.float64(scale), inv, out)
        return out
    args = (ls, like, steps, los, inv, np.int64(_TASK), out)
    ntasks = -(-n // _TASK)
    if _parallel(len(ls) * n, ntasks):
        _sum_tasks(*args, np.int64(_groups(ntasks)))
    else:
        _sum_serial(*args)
    return out
