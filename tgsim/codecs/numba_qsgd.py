"""Numba CPU kernels of QSGD (tgsim.codecs.qsgd): encode (norms -> levels -> packed bytes) and
decode-sum (levels of W messages -> float32 mean), bit for bit the array reference's.

Used by tgsim.codecs.qsgd on NumPy arrays when the codec's `kernels` is "auto" or "numba"; the
array code (qsgd.quantize / pack_fixed / dequantize + ordered_mean) stays the reference and the
CuPy path. Every element sees exactly the reference's float64 operations in the reference's order
(no fastmath: no FMA contraction, no reassociation); only the loop structure differs:

* norms: "l2" is NumPy's pairwise float64 sum of the squares (numpy's `pairwise_sum`: blocks of at
  most 128 elements in 8 accumulators, halving splits at multiples of 8 above that, plus the
  reduction's identity 0.0) then sqrt, "max" the float64 max of |v|; then min(., f32 max), the
  nearest float32, moved one ulp up (np.nextafter) where it fell below the float64 norm.
* encode: tasks of whole buckets (about _TASK elements, a multiple of 8 elements so that every task
  starts on a byte of the payload and a Philox block); per task the norms of its buckets, then the
  stream's words of its elements (tgsim.rng.numba_philox, into a 16 KiB scratch), then
  l = floor((f64|v| · s) / f64(norm) + u) with the sign of v, then the bits. A layer of one bucket
  (bucket = 0 or >= n) first takes its norm in one pass, then quantizes in tasks of _TASK elements.
  One read of the gradient (two for a one-bucket layer), one write of the levels and the payload;
  no float64 array of the layer.
* decode-sum: per task of _TASK elements a float64 scratch acc (32 KiB), for each message in
  order acc += f64(f32(±(f64(norm_b) · |l|) / s)), then out = f32(acc · (1/N)): the reference's
  ordered_mean of the decodes.

Layers of fewer than _PARALLEL_FROM elements run serially on the calling thread; larger ones in a
parallel region over the tasks (numba.prange). The bits never depend on the split. Everything
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
_F32_MAX = np.float64(np.finfo(np.float32).max)
_F32_INF = np.float32(np.inf)
_U24 = np.float64(2.0 ** -24)
_DEPTH = 64                    # frames of the pairwise sum's stack (log2(2^64 / 128) < 64)
_S8 = np.uint32(8)


# -- norms ------------------------------------------------------------------------------------------
@njit(cache=True)
def _pairwise_leaf(v, start, n):
    """NumPy's pairwise_sum of f64(v[i])^2 for i in [start, start + n), 1 <= n <= 128 (no split)."""
    if n < 8:
        res = -0.0
        for i in range(start, start + n):
            x = np.float64(v[i])
            res += x * x
        return res
    x0 = np.float64(v[start])
    x1 = np.float64(v[start + 1])
    x2 = np.float64(v[start + 2])
    x3 = np.float64(v[start + 3])
    x4 = np.float64(v[start + 4])
    x5 = np.float64(v[start + 5])
    x6 = np.float64(v[start + 6])
    x7 = np.float64(v[start + 7])
    r0, r1, r2, r3 = x0 * x0, x1 * x1, x2 * x2, x3 * x3
    r4, r5, r6, r7 = x4 * x4, x5 * x5, x6 * x6, x7 * x7
    i = 8
    stop = n - n % 8
    while i < stop:
        j = start + i
        x0 = np.float64(v[j])
        x1 = np.float64(v[j + 1])
        x2 = np.float64(v[j + 2])
        x3 = np.float64(v[j + 3])
        x4 = np.float64(v[j + 4])
        x5 = np.float64(v[j + 5])
        x6 = np.float64(v[j + 6])
        x7 = np.float64(v[j + 7])
        r0 += x0 * x0
        r1 += x1 * x1
        r2 += x2 * x2
        r3 += x3 * x3
        r4 += x4 * x4
        r5 += x5 * x5
        r6 += x6 * x6
        r7 += x7 * x7
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        x = np.float64(v[start + i])
        res += x * x
        i += 1
    return res


@njit(inline="always")
def _split(n):
    n2 = n // 2
    return n2 - n2 % 8


@njit(cache=True)
def _pairwise_sq(v, start, n, frames, left):
    """NumPy's pairwise float64 sum of f64(v[i])^2 for i in [start, start + n), n >= 1: leaves of at
    most 128 elements, pw(s, n) = pw(s, n2) + pw(s + n2, n - n2) above, n2 = n/2 rounded down to a
    multiple of 8. Evaluated with an explicit stack (frames (depth, 3) int64: start, n, phase;
    left (depth,) float64: the left half's sum), not by recursion."""
    if n <= 128:
        return _pairwise_leaf(v, start, n)
    top = 0
    frames[0, 0] = start
    frames[0, 1] = n
    frames[0, 2] = 0
    while True:
        s0 = frames[top, 0]
        n0 = frames[top, 1]
        if n0 > 128:                      # descend into the left half
            top += 1
            frames[top, 0] = s0
            frames[top, 1] = _split(n0)
            frames[top, 2] = 0
            continue
        ret = _pairwise_leaf(v, s0, n0)
        top -= 1
        while top >= 0:                   # hand the value up
            if frames[top, 2] == 0:       # a left half: keep it, then the right half
                left[top] = ret
                frames[top, 2] = 1
                n2 = _split(frames[top, 1])
                frames[top + 1, 0] = frames[top, 0] + n2
                frames[top + 1, 1] = frames[top, 1] - n2
                frames[top + 1, 2] = 0
                top += 1
                break
            ret = left[top] + ret         # a right half: the frame's sum
            top -= 1
        if top < 0:
            return ret


@njit(cache=True)
def _bucket_norm(v, start, n, l2, frames, left):
    """The float32 norm sent for v[start:start + n]: the float64 l2 (pairwise) or max norm,
    saturated at float32's max, rounded up to float32."""
    if l2:
        n64 = np.sqrt(0.0 + _pairwise_sq(v, start, n, frames, left))
    else:
        n64 = 0.0
        for i in range(start, start + n):
            a = abs(np.float64(v[i]))
            if a > n64:
                n64 = a
    n64 = min(n64, _F32_MAX)
    n32 = np.float32(n64)
    if np.float64(n32) < n64:
        n32 = np.nextafter(n32, _F32_INF)
    return n32


# -- encode -----------------------------------------------------------------------------------------
@njit(cache=True)
def _quantize_span(v, q, words, e0, lo, hi, sf, div):
    """q[i] = ±floor((f64|v_i| · s) / div + u_i) for i in [lo, hi); words[i - e0] is word i."""
    vv = v[lo:hi]
    qq = q[lo:hi]
    ww = words[lo - e0:hi - e0]
    for j in range(hi - lo):
        x = np.float64(vv[j])
        lvl = np.floor((abs(x) * sf) / div + np.float64(ww[j] >> _S8) * _U24)
        qq[j] = -lvl if x < 0 else lvl


@njit(cache=True)
def _pack_span(q, payload, e0, e1, b):
    """The w = b + 1 bit words (sign << b) | |q_i| of q[e0:e1], most significant bit first, into
    payload from byte e0 w / 8 (e0 is a multiple of 8); the last byte of the layer zero-padded."""
    w = b + 1
    qq = q[e0:e1]
    m = e1 - e0
    out = payload[(e0 * w) // 8:]
    if w == 4:
        half = m // 2
        for j in range(half):
            c0 = np.int32(qq[2 * j])
            c1 = np.int32(qq[2 * j + 1])
            h = (abs(c0) | (8 if c0 < 0 else 0)) << 4
            out[j] = np.uint8(h | abs(c1) | (8 if c1 < 0 else 0))
        if m % 2:
            c0 = np.int32(qq[m - 1])
            out[half] = np.uint8((abs(c0) | (8 if c0 < 0 else 0)) << 4)
        return
    if w == 8:
        for j in range(m):
            c0 = np.int32(qq[j])
            out[j] = np.uint8(abs(c0) | (128 if c0 < 0 else 0))
        return
    acc = np.uint64(0)
    nacc = 0
    k = 0
    for j in range(m):
        c0 = np.int64(qq[j])
        code = np.uint64(abs(c0) | ((1 << b) if c0 < 0 else 0))
        acc = (acc << np.uint64(w)) | code
        nacc += w
        while nacc >= 8:
            nacc -= 8
            out[k] = np.uint8((acc >> np.uint64(nacc)) & np.uint64(0xFF))
            k += 1
        acc &= np.uint64((1 << nacc) - 1)
    if nacc:
        out[k] = np.uint8((acc << np.uint64(8 - nacc)) & np.uint64(0xFF))


@njit(cache=True)
def _encode_task(t, v, s, B, l2, own_norms, task, norms, q, payload, b, pack, key, words, frames, left):
    """Task t: elements [t task, (t + 1) task); words, frames, left: the caller's scratch."""
    n = v.size
    e0 = t * task
    e1 = min(n, e0 + task)
    if own_norms:                        # the task starts on a bucket; it owns the buckets it starts
        for bk in range(e0 // B, (e1 + B - 1) // B):
            lo = bk * B
            norms[bk] = _bucket_norm(v, lo, min(n, lo + B) - lo, l2, frames, left)
    c1, c2, c3, k0, k1 = key
    _words_range(words[:(e1 - e0 + 3) // 4 * 4], e0 // 4, c1, c2, c3, k0, k1)
    sf = np.float64(s)
    for bk in range(e0 // B, (e1 - 1) // B + 1):
        lo = max(e0, bk * B)
        hi = min(e1, bk * B + B)
        div = np.float64(norms[bk])
        if div == 0.0:
            div = 1.0
        _quantize_span(v, q, words, e0, lo, hi, sf, div)
    if pack:
        _pack_span(q, payload, e0, e1, b)


@njit(cache=True, parallel=True)
def _encode_tasks(v, s, B, l2, own_norms, task, norms, q, payload, b, pack, key, groups):
    """The layer's tasks, split into `groups` runs of consecutive tasks (in parallel for groups > 1),
    each with its own scratch: allocated once per run, not per task (an allocation per task costs
    page faults that took longer than the task's arithmetic)."""
    ntasks = (v.size + task - 1) // task
    per = (ntasks + groups - 1) // groups
    for g in prange(groups):
        words = np.empty(task + 4, dtype=np.uint32)
        frames = np.empty((_DEPTH, 3), dtype=np.int64)
        left = np.empty(_DEPTH, dtype=np.float64)
        for t in range(g * per, min(ntasks, (g + 1) * per)):
            _encode_task(t, v, s, B, l2, own_norms, task, norms, q, payload, b, pack, key, words, frames, left)


@njit(cache=True)
def _encode_serial(v, s, B, l2, own_norms, task, norms, q, payload, b, pack, key):
    words = np.empty(task + 4, dtype=np.uint32)
    frames = np.empty((_DEPTH, 3), dtype=np.int64)
    left = np.empty(_DEPTH, dtype=np.float64)
    for t in range((v.size + task - 1) // task):
        _encode_task(t, v, s, B, l2, own_norms, task, norms, q, payload, b, pack, key, words, frames, left)


def _groups(ntasks: int) -> int:
    """Runs of tasks for the parallel kernels: a few per thread (load balance), at most one per task."""
    return max(1, min(ntasks, 4 * numba.get_num_threads()))


def _task_size(n: int, B: int) -> int:
    """Elements per encode task: whole buckets, a multiple of 8, about _TASK."""
    if B >= n:
        return _TASK
    m = max(1, _TASK // B)
    step = 8 // np.gcd(B, 8)             # buckets whose elements make a multiple of 8
    return -(-m // step) * step * B


def encode(v: np.ndarray, key: StreamKey, s: int, bucket: int, norm: str, level_dtype, pack: bool = True):
    """(norms float32, levels q, payload uint8, nbits) of one worker's layer v (NumPy, any float dtype),
    the same bits as qsgd.quantize + qsgd.pack_fixed: s levels, norms per `bucket` elements (0: one
    bucket) of the `norm` ("l2" or "max"), the rounding draws from the stream `key`, levels of
    `level_dtype`. With pack = False the payload is empty (the caller codes the levels otherwise, e.g.
    Elias-gamma)."""
    v = np.ascontiguousarray(v).reshape(-1)
    if v.dtype not in (np.float32, np.float64):
        v = v.astype(np.float32)                       # float16 and others: exact in float32
    n = int(v.size)
    b = int(s).bit_length()
    w = b + 1
    B = bucket if 0 < bucket < n else n
    nb = 0 if n == 0 else -(-n // B)
    norms = np.empty(nb, np.float32)
    q = np.empty(n, level_dtype)
    payload = np.empty(-(-n * w // 8) if pack else 0, np.uint8)
    if n == 0:
        return norms, q, payload, 0
    own = nb > 1
    if not own:
        norms[0] = _bucket_norm(v, 0, n, norm == "l2", np.empty((_DEPTH, 3), np.int64), np.empty(_DEPTH))
    task = _task_size(n, B)
    args = (v, np.int64(s), np.int64(B), norm == "l2", own, np.int64(task), norms, q, payload, np.int64(b), pack,
            _stream_args(key))
    ntasks = -(-n // task)
    if n >= _PARALLEL_FROM and ntasks > 1 and numba.get_num_threads() > 1:
        _encode_tasks(*args, np.int64(_groups(ntasks)))
    else:
        _encode_serial(*args)
    return norms, q, payload, n * w if pack else 0


# -- decode-sum -------------------------------------------------------------------------------------
@njit(cache=True)
def _sum_task(t, qs, like, ns, s, B, inv, task, out, acc):
    """Task t: elements [t task, (t + 1) task); acc: the caller's float64 scratch (task,); message
    w's levels are row(qs, w, n, like) (qs: their addresses), its bucket norms ns[w]. (A table of a
    bucket's 2s + 1 decoded values, one look-up per element instead of a division, would not
    vectorize; the divisions do.)"""
    n = out.size
    e0 = t * task
    e1 = min(n, e0 + task)
    aa = acc[:e1 - e0]
    aa[:] = 0.0
    sf = np.float64(s)
    for w in range(qs.size):
        q = row(qs, w, n, like)
        nrm = ns[w]
        for bk in range(e0 // B, (e1 - 1) // B + 1):
            lo = max(e0, bk * B)
            hi = min(e1, bk * B + B)
            nb = np.float64(nrm[bk])
            qq = q[lo:hi]
            ab = acc[lo - e0:hi - e0]
            for j in range(hi - lo):
                lvl = qq[j]
                m = np.float32((nb * np.float64(abs(lvl))) / sf)
                ab[j] += np.float64(-m if lvl < 0 else m)
    oo = out[e0:e1]
    for j in range(e1 - e0):
        oo[j] = np.float32(aa[j] * inv)


@njit(cache=True, parallel=True)
def _sum_tasks(qs, like, ns, s, B, inv, task, out, groups):
    ntasks = (out.size + task - 1) // task
    per = (ntasks + groups - 1) // groups
    for g in prange(groups):
        acc = np.empty(task, dtype=np.float64)
        for t in range(g * per, min(ntasks, (g + 1) * per)):
            _sum_task(t, qs, like, ns, s, B, inv, task, out, acc)


@njit(cache=True)
def _sum_serial(qs, like, ns, s, B, inv, task, out):
    acc = np.empty(task, dtype=np.float64)
    for t in range((out.size + task - 1) // task):
        _sum_task(t, qs, like, ns, s, B, inv, task, out, acc)


def decode_sum(levels, norms, s: int, bucket: int, n: int, divide_by: int) -> np.ndarray:
    """f32(Σ_w f64(dequantize(norms[w], levels[w])) · (1/divide_by)), flat float32 (n,): the
    reference's ordered_mean of the decoded layers. levels: the W messages' signed levels (one
    dtype), norms: their float32 bucket norms."""
    out = np.empty(n, np.float32)
    if n == 0:
        return out
    B = bucket if 0 < bucket < n else n
    if len(levels) == 0:
        out[:] = np.float32(0.0)
        return out
    kept, qs, like = addresses(levels, n)
    ns = np.empty((len(levels), -(-n // B)), np.float32)      # row w: message w's bucket norms
    for w, nrm in enumerate(norms):
        ns[w] = np.asarray(nrm, dtype=np.float32).reshape(-1)
    args = (qs, like, ns, np.int64(s), np.int64(B), np.float64(1.0 / divide_by), np.int64(_TASK), out)
    ntasks = -(-n // _TASK)
    if len(qs) * n >= _PARALLEL_FROM and ntasks > 1 and numba.get_num_threads() > 1:
        _sum_tasks(*args, np.int64(_groups(ntasks)))
    else:
        _sum_serial(*args)
    return out
