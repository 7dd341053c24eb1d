"""Numba CPU kernels of the sparsifying codecs (tgsim.codecs.sparse): topk's selection, randomk's draw
(Philox words, keep test and sent value in one pass) and the decode-sum of sparse messages (the W
messages' scatter-add into the float32 mean), bit for bit the array reference's.

Used by tgsim.codecs.sparse on NumPy arrays when the codec's `kernels` is "auto" or "numba"; the array
code (sparse.top_k_indices, RandomK._select, ordered_mean of the dense decodes) stays the reference.
No fastmath.

* topk: the set the reference keeps is defined by the values alone: with t the k-th largest
  a_i = |v_i|, every a_i > t and the first k - #(a > t) of the a_i == t (ties to the lower indices),
  sent in ascending index order. A threshold s from a strided sample (sparse._candidates' rule) and
  one pass collect the ascending candidates a_i >= s; if there are at least k, t is the k-th
  largest candidate (np.partition of their magnitudes), else the whole layer is the candidate set.
  Float32 layers from 2^16 elements work on the magnitude bits u & 0x7FFFFFFF (ordered as the
  magnitudes): a 64-bit mask per 64 elements for the candidates, two 16-bit histograms for t.
  A last pass over the candidates keeps a > t, and a == t while room is left.
* randomk: keep_scale (λ) stays the reference's NumPy code (its float64 sums are NumPy's pairwise
  sums); then per task of _TASK elements (a multiple of 4: every task starts on a Philox block) the
  stream's words (tgsim.rng.numba_philox), x = f64(a_i) · (λ 2^24), kept iff f64(word_i >> 8) < x
  (NumPy's uint32 < float64 comparison), value f64(v_i) / (ceil(min(x, 2^24)) / 2^24). Tasks write
  their kept elements at their own offset; a serial pass compacts them in task order (ascending i).
* decode-sum: per task of _SUM_TASK elements a float64 scratch acc = 0, for each message in order
  acc[i - e0] += f64(value) over its indices in [e0, e1) (found by binary search: indices ascend),
  then out = f32(acc · (1/divide_by)). The reference adds f64(+0.0) for every element a message did
  not send, which leaves acc's bits alone (acc is never -0.0: it starts at +0.0 and x + (-x) = +0.0).

Tasks run in one parallel region from _PARALLEL_FROM elements; the bits never depend on the split.
Everything compiles lazily on first use, cache=True.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange

from tgsim.rng.numba_philox import _stream_args, _words_range
from tgsim.rng.philox import StreamKey

_TASK = 1 << 12               # elements per randomk task (a multiple of 4)
_SUM_TASK = 1 << 14           # elements per decode-sum task
_PARALLEL_FROM = 1 << 16
_SAMPLE_FROM = 1 << 16        # sparse._candidates: layers from 2^16 elements with 4k <= n
_GRID = np.float64(2.0 ** 24)


def _groups(ntasks: int) -> int:
    return max(1, min(ntasks, 4 * numba.get_num_threads()))


def _parallel(work: int, ntasks: int) -> bool:
    return work >= _PARALLEL_FROM and ntasks > 1 and numba.get_num_threads() > 1


# -- topk -------------------------------------------------------------------------------------------
@njit(cache=True)
def _keep_top(v, cand, k):
    """The k of the ascending candidate indices `cand` (a superset of the k largest |v_i|) that the
    reference keeps: |v| > t, then |v| == t from the lowest index while room is left."""
    c = cand.size
    if c == k:
        return cand.copy()
    a = np.empty(c, v.dtype)
    for p in range(c):
        a[p] = np.abs(v[cand[p]])
    t = np.partition(a, c - k)[c - k]                # the k-th largest
    room = k
    for p in range(c):
        if a[p] > t:
            room -= 1
    out = np.empty(k, np.int64)
    q = 0
    for p in range(c):
        if a[p] > t:
            out[q] = cand[p]
            q += 1
        elif a[p] == t and room > 0:
            room -= 1
            out[q] = cand[p]
            q += 1
    return out


@njit(cache=True)
def _top_k(v, k, sample_from):
    """sparse.top_k_indices(|v|, k) for 0 < k < n: ascending int64 indices."""
    n = v.size
    if n >= sample_from and 4 * k <= n:
        s = np.abs(v[::n >> 16])
        m = s.size
        f = m * k / n
        r = min(m, int(1.25 * f + 4.0 * math.sqrt(f) + 16))
        t = np.partition(s, m - r)[m - r]
        cand = np.empty(n, np.int64)
        c = 0
        for i in range(n):
            if np.abs(v[i]) >= t:
                cand[c] = i
                c += 1
        if c >= k:
            return _keep_top(v, cand[:c], k)
    return _keep_top(v, np.arange(n), k)


_ABS = np.uint32(0x7FFFFFFF)


@njit(cache=True)
def _bit_index(low):
    """j of the uint64 low = 2^j."""
    j = 0
    if low >= np.uint64(1 << 32):
        j += 32
        low >>= np.uint64(32)
    if low >= np.uint64(1 << 16):
        j += 16
        low >>= np.uint64(16)
    if low >= np.uint64(1 << 8):
        j += 8
        low >>= np.uint64(8)
    if low >= np.uint64(1 << 4):
        j += 4
        low >>= np.uint64(4)
    if low >= np.uint64(1 << 2):
        j += 2
        low >>= np.uint64(2)
    if low >= np.uint64(2):
        j += 1
    return j


@njit(cache=True)
def _candidates32(u, tb):
    """Ascending i with |v_i| >= t, from the float32 bits u (tb: the bits of t >= 0; the magnitude
    bits u & 0x7FFFFFFF order as the magnitudes do). A 64-bit mask per 64 elements (vectorized),
    then its set bits."""
    n = u.size
    cand = np.empty(n, np.int64)
    m = 0
    nw = n // 64
    for w in range(nw):
        uu = u[64 * w:64 * w + 64]
        mask = np.uint64(0)
        for j in range(64):
            mask |= np.uint64((uu[j] & _ABS) >= tb) << np.uint64(j)
        while mask:
            low = mask & (~mask + np.uint64(1))
            cand[m] = 64 * w + _bit_index(low)
            m += 1
            mask ^= low
    for i in range(64 * nw, n):
        if (u[i] & _ABS) >= tb:
            cand[m] = i
            m += 1
    return cand[:m]


@njit(cache=True)
def _kth_bits(x, k):
    """(T, room): T the k-th largest of the uint32 x < 2^31 (two 16-bit histogram passes), room =
    k - #(x > T)."""
    h = np.zeros(32768, np.int64)
    for p in range(x.size):
        h[x[p] >> np.uint32(16)] += 1
    above = 0
    hb = 32767
    while above + h[hb] < k:
        above += h[hb]
        hb -= 1
    h2 = np.zeros(65536, np.int64)
    for p in range(x.size):
        if (x[p] >> np.uint32(16)) == hb:
            h2[x[p] & np.uint32(0xFFFF)] += 1
    lb = 65535
    while above + h2[lb] < k:
        above += h2[lb]
        lb -= 1
    return np.uint32((hb << 16) | lb), k - above


@njit(cache=True)
def _top_k32(u, k):
    """_top_k for float32 layers of >= 2^16 elements, on the bits: the sample's threshold and the
    k-th largest by integer order of the magnitude bits (= the magnitudes' order)."""
    n = u.size
    cand = np.zeros(0, np.int64)
    if 4 * k <= n:
        s = u[::n >> 16] & _ABS
        m = s.size
        f = m * k / n
        r = min(m, int(1.25 * f + 4.0 * math.sqrt(f) + 16))
        cand = _candidates32(u, _kth_bits(s, r)[0])
    if cand.size < k:
        cand = np.arange(n)
    xs = np.empty(cand.size, np.uint32)
    for p in range(cand.size):
        xs[p] = u[cand[p]] & _ABS
    t, room = _kth_bits(xs, k)
    out = np.empty(k, np.int64)
    q = 0
    for p in range(cand.size):
        x = xs[p]
        if x > t:
            out[q] = cand[p]
            q += 1
        elif x == t and room > 0:
            room -= 1
            out[q] = cand[p]
            q += 1
    return out


def top_k(v: np.ndarray, k: int):
    """(indices ascending int64, values v[indices]) of the k largest |v_i| of a flat float32 or
    float64 layer, ties to the lower indices: sparse.TopK._select's."""
    n = int(v.size)
    if k >= n:
        idx = np.arange(n, dtype=np.int64)
    elif k <= 0:
        idx = np.zeros(0, dtype=np.int64)
    elif v.dtype == np.float32 and n >= _SAMPLE_FROM:
        idx = _top_k32(np.ascontiguousarray(v).view(np.uint32), np.int64(k))
    else:
        idx = _top_k(np.ascontiguousarray(v), np.int64(k), np.int64(_SAMPLE_FROM))
    return idx, v[idx]


# -- randomk ----------------------------------------------------------------------------------------
@njit(cache=True)
def _draw_task(t, v, a, s, task, key, words, idx, val, counts):
    n = v.size
    e0 = t * task
    e1 = min(n, e0 + task)
    m = e1 - e0
    c1, c2, c3, k0, k1 = key
    _words_range(words[:(m + 3) // 4 * 4], e0 // 4, c1, c2, c3, k0, k1)
    c = 0
    aa = a[e0:e1]
    vv = v[e0:e1]
    for wd in range(m // 64):                # the keep test of 64 elements as one mask (vectorized)
        ww = words[64 * wd:64 * wd + 64]
        a64 = aa[64 * wd:64 * wd + 64]
        mask = np.uint64(0)
        for j in range(64):
            mask |= np.uint64(np.float64(ww[j] >> np.uint32(8)) < np.float64(a64[j]) * s) << np.uint64(j)
        while mask:
            low = mask & (~mask + np.uint64(1))
            j = 64 * wd + _bit_index(low)
            x = np.float64(aa[j]) * s
            idx[e0 + c] = e0 + j
            val[e0 + c] = np.float64(vv[j]) / (np.ceil(min(x, _GRID)) / _GRID)
            c += 1
            mask ^= low
    for j in range(m // 64 * 64, m):
        x = np.float64(aa[j]) * s
        if np.float64(words[j] >> np.uint32(8)) < x:
            idx[e0 + c] = e0 + j
            val[e0 + c] = np.float64(vv[j]) / (np.ceil(min(x, _GRID)) / _GRID)
            c += 1
    counts[t] = c


@njit(cache=True, parallel=True)
def _draw_parallel(v, a, s, task, key, idx, val, counts, groups):
    ntasks = counts.size
    per = (ntasks + groups - 1) // groups
    for g in prange(groups):
        words = np.empty(task + 4, np.uint32)
        for t in range(g * per, min(ntasks, (g + 1) * per)):
            _draw_task(t, v, a, s, task, key, words, idx, val, counts)


@njit(cache=True)
def _draw_serial(v, a, s, task, key, idx, val, counts):
    words = np.empty(task + 4, np.uint32)
    for t in range(counts.size):
        _draw_task(t, v, a, s, task, key, words, idx, val, counts)


@njit(cache=True)
def _compact(idx, val, counts, task):
    total = 0
    for t in range(counts.size):
        total += counts[t]
    oi = np.empty(total, np.int64)
    ov = np.empty(total, np.float64)
    q = 0
    for t in range(counts.size):
        for j in range(counts[t]):
            oi[q] = idx[t * task + j]
            ov[q] = val[t * task + j]
            q += 1
    return oi, ov


def random_keep(v: np.ndarray, a: np.ndarray, scale: float, key: StreamKey):
    """(indices ascending int64, float64 values) of RandomK._select's draw for a flat layer v (float32
    or float64), a = |v| and scale = λ 2^24 (float64), drawn from the stream `key`."""
    n = int(v.size)
    ntasks = -(-n // _TASK)
    idx = np.empty(n, np.int64)
    val = np.empty(n, np.float64)
    counts = np.zeros(ntasks, np.int64)
    args = (np.ascontiguousarray(v), np.ascontiguousarray(a), np.float64(scale), np.int64(_TASK), _stream_args(key),
            idx, val, counts)
    if _parallel(n, ntasks):
        _draw_parallel(*args, np.int64(_groups(ntasks)))
    else:
        _draw_serial(*args)
    return _compact(idx, val, counts, np.int64(_TASK))


# -- decode-sum -------------------------------------------------------------------------------------
@njit(cache=True)
def _sum_task(t, idxs, vals, offs, inv, task, out, acc):
    """Task t: elements [t task, (t + 1) task) of the sum; message w's entries are
    idxs[offs[w]:offs[w + 1]], vals[offs[w]:offs[w + 1]]."""
    n = out.size
    e0 = t * task
    e1 = min(n, e0 + task)
    aa = acc[:e1 - e0]
    aa[:] = 0.0
    for w in range(offs.size - 1):
        ii = idxs[offs[w]:offs[w + 1]]
        vv = vals[offs[w]:offs[w + 1]]
        p0 = np.searchsorted(ii, e0)
        p1 = np.searchsorted(ii, e1)
        for p in range(p0, p1):
            aa[ii[p] - e0] += np.float64(vv[p])
    oo = out[e0:e1]
    for j in range(e1 - e0):
        oo[j] = np.float32(aa[j] * inv)


@njit(cache=True, parallel=True)
def _sum_parallel(idxs, vals, offs, inv, task, out, groups):
    ntasks = (out.size + task - 1) // task
    per = (ntasks + groups - 1) // groups
    for g in prange(groups):
        acc = np.empty(task, np.float64)
        for t in range(g * per, min(ntasks, (g + 1) * per)):
            _sum_task(t, idxs, vals, offs, inv, task, out, acc)


@njit(cache=True)
def _sum_serial(idxs, vals, offs, inv, task, out):
    acc = np.empty(task, np.float64)
    for t in range((out.size + task - 1) // task):
        _sum_task(t, idxs, vals, offs, inv, task, out, acc)


def decode_sum(indices, values, n: int, divide_by: int) -> np.ndarray:
    """Flat float32 (n,): f32(Σ_w f64(decode_w) · (1/divide_by)), the reference's ordered_mean of the
    sparse decodes, from each message's strictly increasing indices and float32 values."""
    out = np.empty(n, np.float32)
    if n == 0:
        return out
    ii = [np.asarray(i).reshape(-1) for i in indices]
    offs = np.zeros(len(ii) + 1, np.int64)
    np.cumsum([i.size for i in ii], out=offs[1:])
    idxs = np.empty(offs[-1], np.int64)        # the W messages' entries end to end (CSR)
    vals = np.empty(offs[-1], np.float32)
    for w, (i, v) in enumerate(zip(ii, values)):
        idxs[offs[w]:offs[w + 1]] = i
        vals[offs[w]:offs[w + 1]] = np.asarray(v, dtype=np.float32).reshape(-1)
    args = (idxs, vals, offs, np.float64(1.0 / divide_by), np.int64(_SUM_TASK), out)
    ntasks = -(-n // _SUM_TASK)
    if _parallel(n, ntasks):
        _sum_parallel(*args, np.int64(_groups(ntasks)))
    else:
        _sum_serial(*args)
    return out
