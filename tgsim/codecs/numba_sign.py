"""Numba CPU kernels of the sign codecs (tgsim.codecs.sign): the packed sign (and nonzero) planes and
the scale of scaled_sign (encode), the majority vote of sign and the float32 mean of scaled_sign
(decode-sum), bit for bit the array reference's.

Used by tgsim.codecs.sign on NumPy arrays when the codec's `kernels` is "auto" or "numba"; the array
code (sign._pack_rows, sign.l1_norm, sign's decode and ordered_mean) stays the reference and the
CuPy path. No fastmath: every float64 addition is the reference's, in the reference's order.

* sign planes: bit j % 8 of byte j // 8 is f32(v_j) < 0 (np.packbits, bit order little; -0.0 is
  not < 0), the nonzero plane f32(v_j) != 0, padding bits zero.
* l1 norm (scaled_sign): sign.l1_norm's lanes: lane j of the width w = min(LANES, 2^ceil(log2 n))
  sums f64|v_i| over i ≡ j (mod w) in ascending i, then the halving tree acc[j] += acc[j + h]
  (h = w/2, w/4, ..., 1: the reference's acc[:h] + acc[h:2h]); c = f32(sum / n). One pass reads the
  row and writes both planes while it adds the lanes. Large rows split the LANES lanes into chunks
  of _LANE_CHUNK, one per parallel task: every lane is still summed by one task in ascending i,
  so the bits do not depend on the split (a layer of W >= 2 workers runs its rows in parallel instead,
  one row per thread).
* majority vote (sign): per element the count of set sign bits over the N messages (exact), then
  +1.0 where 2 count < N, -1.0 where 2 count > N, +0.0 on a tie.
* mean (scaled_sign): per task a float64 scratch acc, for each message in order acc += f64(±c_w)
  (0 where the nonzero plane says g = 0; nothing for a layer sent as c = 0, whose decode is +0 and
  whose addition changes no bit), then out = f32(acc · (1/divide_by)).

Layers of fewer than _PARALLEL_FROM elements (x messages, for decode-sum) run serially on the
calling thread. Everything compiles lazily on first use, cache=True.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from tgsim.codecs._numba_rows import addresses, row

LANES = 65536                 # sign.LANES
_LANE_CHUNK = 1 << 12         # lanes per parallel task of the scaled_sign encode (a multiple of 64)
_TASK_BYTES = 1 << 11         # bytes of a plane per task of the sign encode and the decode-sums
_PARALLEL_FROM = 1 << 16


def _parallel(work: int) -> bool:
    return work >= _PARALLEL_FROM and numba.get_num_threads() > 1


def _rows(g) -> np.ndarray:
    """Layer (W, *shape) -> contiguous (W, n) float32 or float64 (other dtypes cast to float32, exactly)."""
    rows = np.ascontiguousarray(g).reshape(g.shape[0], -1)
    if rows.dtype not in (np.float32, np.float64):
        rows = rows.astype(np.float32)
    return rows


# -- sign planes --------------------------------------------------------------------------------------
@njit(cache=True)
def _word_bits(vv, m):
    """(neg, nz) bits of the m <= 64 values vv[:m] as uint64 (bit j: f32(vv[j]) < 0 / != 0)."""
    neg = np.uint64(0)
    nz = np.uint64(0)
    for j in range(m):
        x = np.float32(vv[j])
        neg |= np.uint64(x < np.float32(0.0)) << np.uint64(j)
        nz |= np.uint64(x != np.float32(0.0)) << np.uint64(j)
    return neg, nz


@njit(cache=True)
def _neg_words(v, w0, w1, out):
    """out[w] for w in [w0, w1): the sign bits (f32(v) < 0) of elements 64w .. 64w + 63 (< v.size)."""
    n = v.size
    wfull = min(w1, n // 64)
    for w in range(w0, wfull):
        vv = v[64 * w:64 * w + 64]
        acc = np.uint64(0)
        for j in range(64):                  # a constant trip count: vectorized
            acc |= np.uint64(np.float32(vv[j]) < np.float32(0.0)) << np.uint64(j)
        out[w] = acc
    for w in range(max(w0, wfull), w1):
        out[w] = _word_bits(v[64 * w:], n - 64 * w)[0]


@njit(cache=True, parallel=True)
def _neg_rows_parallel(rows, out, task):
    w, nw = out.shape
    per = (nw + task - 1) // task
    for t in prange(w * per):
        r = t // per
        w0 = (t % per) * task
        _neg_words(rows[r], w0, min(nw, w0 + task), out[r])


@njit(cache=True)
def _neg_rows_serial(rows, out):
    for r in range(out.shape[0]):
        _neg_words(rows[r], 0, out.shape[1], out[r])


def _plane_rows(w: int, n: int):
    """((W, ceil(n/64)) uint64 words, their (W, ceil(n/8)) uint8 view): the words' little-endian bytes
    are np.packbits(bitorder="little")'s (bit j of word k: element 64k + j)."""
    words = np.zeros((w, -(-n // 64)), np.uint64)
    return words, words.view(np.uint8)[:, :(n + 7) // 8]


def sign_planes(g) -> np.ndarray:
    """(W, ceil(n/8)) uint8: sign._pack_rows(_as_rows(g) < 0) of a NumPy layer (W, *shape)."""
    rows = _rows(g)
    words, out = _plane_rows(*rows.shape)
    if out.size == 0:
        return out
    if _parallel(rows.size):
        _neg_rows_parallel(rows, words, np.int64(_TASK_BYTES // 8))
    else:
        _neg_rows_serial(rows, words)
    return out


# -- scaled_sign encode ---------------------------------------------------------------------------------
@njit(cache=True)
def _lanes(v, width, j0, j1, acc, neg, nz):
    """Lanes [j0, j1) of one row (j0, j1 multiples of 64, or the row is one lane block of width <= 64):
    acc[j] += f64|f32(v_i)| for i ≡ j (mod width), i ascending, and the uint64 words of the sign and
    nonzero bits of those i (a word holds no other lane's bits). True if none of them is 0."""
    n = v.size
    dense = True
    r0 = 0
    while r0 + j0 < n:
        e0 = r0 + j0
        e1 = min(r0 + j1, n)
        for wd in range(e0 // 64, (e1 + 63) // 64):
            e = 64 * wd
            m = min(64, e1 - e)
            vv = v[e:e + m]
            aa = acc[e - r0:e - r0 + m]
            if m == 64:
                nb_ = np.uint64(0)
                zb = np.uint64(0)
                for j in range(64):
                    x = np.float32(vv[j])
                    aa[j] += np.float64(np.abs(x))
                    nb_ |= np.uint64(x < np.float32(0.0)) << np.uint64(j)
                    zb |= np.uint64(x != np.float32(0.0)) << np.uint64(j)
                dense &= zb == np.uint64(0xFFFFFFFFFFFFFFFF)
            else:
                for j in range(m):
                    aa[j] += np.float64(np.abs(np.float32(vv[j])))
                nb_, zb = _word_bits(vv, m)
                dense &= zb == (np.uint64(1) << np.uint64(m)) - np.uint64(1)
            neg[wd] = nb_
            nz[wd] = zb
        r0 += width
    return dense


@njit(cache=True)
def _tree(acc):
    h = acc.size // 2
    while h >= 1:
        for j in range(h):
            acc[j] = acc[j] + acc[j + h]
        h //= 2
    return acc[0]


@njit(cache=True, parallel=True)
def _scaled_row_parallel(v, width, chunk, acc, neg, nz, dense):
    """One row of >= 2 lane chunks, the chunks in parallel (a layer of one worker)."""
    for c in prange(width // chunk):
        dense[c] = _lanes(v, width, c * chunk, (c + 1) * chunk, acc, neg, nz)
    ok = True
    for c in range(width // chunk):
        ok &= dense[c]
    return np.float32(_tree(acc) / np.float64(v.size)), ok


@njit(cache=True)
def _scaled_row(v, width, neg, nz):
    acc = np.zeros(width, np.float64)
    ok = _lanes(v, width, 0, width, acc, neg, nz)
    return np.float32(_tree(acc) / np.float64(v.size)), ok


@njit(cache=True, parallel=True)
def _scaled_rows_parallel(rows, width, neg, nz, scales, dense):
    """Rows in parallel, each on one thread (one parallel region for the layer)."""
    for r in prange(rows.shape[0]):
        scales[r], dense[r] = _scaled_row(rows[r], width, neg[r], nz[r])


@njit(cache=True)
def _scaled_rows_serial(rows, width, neg, nz, scales, dense):
    for r in range(rows.shape[0]):
        scales[r], dense[r] = _scaled_row(rows[r], width, neg[r], nz[r])


def scaled_planes(g):
    """(c (W,) float32, dense (W,) bool, neg (W, nb) uint8, nz (W, nb) uint8) of a non-empty NumPy
    layer (W, *shape): c = f32(sign.l1_norm(row) / n), dense = no element is 0, and the packed sign
    (f32(g) < 0) and nonzero (f32(g) != 0) planes."""
    rows = _rows(g)
    w, n = rows.shape
    width = min(LANES, 1 << (n - 1).bit_length())
    neg_w, neg = _plane_rows(w, n)
    nz_w, nz = _plane_rows(w, n)
    scales = np.zeros(w, np.float32)
    dense = np.zeros(w, bool)
    if w == 1 and _parallel(n) and width % _LANE_CHUNK == 0:
        acc = np.zeros(width, np.float64)
        flags = np.empty(width // _LANE_CHUNK, np.bool_)
        scales[0], dense[0] = _scaled_row_parallel(rows[0], np.int64(width), np.int64(_LANE_CHUNK), acc, neg_w[0],
                                                   nz_w[0], flags)
    elif w > 1 and _parallel(rows.size):
        _scaled_rows_parallel(rows, np.int64(width), neg_w, nz_w, scales, dense)
    else:
        _scaled_rows_serial(rows, np.int64(width), neg_w, nz_w, scales, dense)
    return scales, dense, neg, nz


# -- decode-sums ----------------------------------------------------------------------------------------
_SPREAD = np.array([sum(((b >> j) & 1) << (8 * j) for j in range(8)) for b in range(256)], np.uint64)  # bit j -> byte j
_TABLE_MAX = 8               # messages up to which the mean is one table look-up per element


_BYTE = np.empty(0, np.uint8)   # the planes' dtype, for row()


def _addresses(planes, n: int):
    """(kept, addrs): the flat uint8 planes of ceil(n/8) bytes and their int64 data addresses, a
    None plane given as the address of one plane of zeros (kept holds every array addressed)."""
    zero = np.zeros((n + 7) // 8, np.uint8)
    kept, addrs, _ = addresses([zero if p is None else p for p in planes], zero.size, np.uint8)
    return kept, addrs


@njit(cache=True)
def _vote_task(b0, b1, planes, out, cnt, spread):
    """Elements 8 b0 .. 8 b1 (< n): the counts of set sign bits, eight uint8 counters in a uint64 per
    byte (N < 256: no carry between them), then the vote. planes: the N planes' addresses (plane w is
    row(planes, w, ceil(n/8), _BYTE))."""
    n = out.size
    nm = len(planes)
    cc = cnt[:b1 - b0]
    cc[:] = 0
    for w in range(nm):
        p = row(planes, w, (n + 7) // 8, _BYTE)[b0:b1]
        for b in range(b1 - b0):
            cc[b] += spread[p[b]]
    c8 = cnt.view(np.uint8)
    e0 = 8 * b0
    oo = out[e0:min(n, 8 * b1)]
    for j in range(oo.size):
        twice = np.int32(2) * np.int32(c8[j])
        oo[j] = np.float32(1.0) if twice < nm else (np.float32(-1.0) if twice > nm else np.float32(0.0))


@njit(cache=True)
def _vote_task_wide(b0, b1, planes, out, cnt):
    """_vote_task for N >= 256 messages: int32 counters."""
    n = out.size
    nm = len(planes)
    e0 = 8 * b0
    m = min(n, 8 * b1) - e0
    cc = cnt[:m]
    cc[:] = 0
    for w in range(nm):
        p = row(planes, w, (n + 7) // 8, _BYTE)[b0:b1]
        for j in range(m):
            cc[j] += np.int32((p[j >> 3] >> np.uint8(j & 7)) & np.uint8(1))
    oo = out[e0:e0 + m]
    for j in range(m):
        twice = np.int32(2) * cc[j]
        oo[j] = np.float32(1.0) if twice < nm else (np.float32(-1.0) if twice > nm else np.float32(0.0))


@njit(cache=True)
def _vote_range(t0, t1, planes, out, task, spread):
    nb = (out.size + 7) // 8
    if len(planes) < 256:
        cnt = np.empty(task, np.uint64)
        for t in range(t0, t1):
            _vote_task(t * task, min(nb, (t + 1) * task), planes, out, cnt, spread)
    else:
        cnt32 = np.empty(8 * task, np.int32)
        for t in range(t0, t1):
            _vote_task_wide(t * task, min(nb, (t + 1) * task), planes, out, cnt32)


@njit(cache=True, parallel=True)
def _vote_parallel(planes, out, task, groups, spread):
    ntasks = ((out.size + 7) // 8 + task - 1) // task
    per = (ntasks + groups - 1) // groups
    for g in prange(groups):
        _vote_range(g * per, min(ntasks, (g + 1) * per), planes, out, task, spread)


def majority_vote(planes, n: int) -> np.ndarray:
    """Flat float32 (n,): sign.SignSGD.aggregate's vote of the N packed sign planes (N >= 1)."""
    out = np.empty(n, np.float32)
    if n == 0:
        return out
    kept, ps = _addresses(planes, n)                 # kept: the planes ps addresses
    ntasks = -(-((n + 7) // 8) // _TASK_BYTES)
    if _parallel(n * len(ps)) and ntasks > 1:
        _vote_parallel(ps, out, np.int64(_TASK_BYTES), np.int64(min(ntasks, 4 * numba.get_num_threads())), _SPREAD)
    else:
        _vote_range(0, ntasks, ps, out, np.int64(_TASK_BYTES), _SPREAD)
    return out


@njit(cache=True)
def _transpose8(x):
    """The 8x8 bit matrix x (bit 8r + c) transposed (bit 8c + r)."""
    t = (x ^ (x >> np.uint64(7))) & np.uint64(0x00AA00AA00AA00AA)
    x = x ^ t ^ (t << np.uint64(7))
    t = (x ^ (x >> np.uint64(14))) & np.uint64(0x0000CCCC0000CCCC)
    x = x ^ t ^ (t << np.uint64(14))
    t = (x ^ (x >> np.uint64(28))) & np.uint64(0x00000000F0F0F0F0)
    return x ^ t ^ (t << np.uint64(28))


@njit(cache=True)
def _mean_table(counts, scales, inv, wide):
    """f32(acc · inv) for every pattern of the N <= 8 messages' bits, acc = the reference's float64
    sum in message order: index bit w = message w's sign bit (and, `wide`, bit 8 + w its nonzero
    bit; else every message with planes 1 counts as nonzero)."""
    size = 65536 if wide else 256
    table = np.empty(size, np.float32)
    for idx in range(size):
        acc = 0.0
        for w in range(len(counts)):
            if counts[w] == 0:
                continue
            nonzero = (idx >> (8 + w)) & 1 if wide and counts[w] == 2 else 1
            if nonzero:
                acc += -scales[w] if (idx >> w) & 1 else scales[w]
        table[idx] = np.float32(acc * inv)
    return table


@njit(cache=True)
def _mean_table_task(b0, b1, signs, nonzero, table, wide, out, s8, z8):
    """Elements 8 b0 .. 8 b1 (< n) of the mean of N <= 8 messages: the N bytes at each byte position
    (copied side by side into s8 / z8, byte 8b + w: message w) transposed into one pattern per
    element, then table[pattern]. signs, nonzero: the planes' addresses (see _vote_task)."""
    n = out.size
    nm = len(signs)
    m = b1 - b0
    s8[:8 * m] = 0
    z8[:8 * m] = 0
    for w in range(nm):
        sw = row(signs, w, (n + 7) // 8, _BYTE)[b0:b1]
        for b in range(m):
            s8[8 * b + w] = sw[b]
        if wide:
            zw = row(nonzero, w, (n + 7) // 8, _BYTE)[b0:b1]
            for b in range(m):
                z8[8 * b + w] = zw[b]
    xs = s8.view(np.uint64)
    xz = z8.view(np.uint64)
    for b in range(m):
        ys = _transpose8(xs[b])
        yz = _transpose8(xz[b])
        e = 8 * (b0 + b)
        oo = out[e:min(n, e + 8)]
        for j in range(oo.size):
            idx = (ys >> np.uint64(8 * j)) & np.uint64(0xFF)
            if wide:
                idx |= ((yz >> np.uint64(8 * j)) & np.uint64(0xFF)) << np.uint64(8)
            oo[j] = table[idx]


@njit(cache=True)
def _mean_loop_range(b0, b1, signs, nonzero, counts, scales, inv, out, acc):
    """Elements 8 b0 .. 8 b1 (< n) of the mean of any number of messages: acc += ±c_w in order."""
    n = out.size
    e0 = 8 * b0
    m = min(n, 8 * b1) - e0
    aa = acc[:m]
    aa[:] = 0.0
    for w in range(len(signs)):
        if counts[w] == 0:
            continue
        c = scales[w]
        s = row(signs, w, (n + 7) // 8, _BYTE)[b0:b1]
        z = row(nonzero, w, (n + 7) // 8, _BYTE)[b0:b1]
        for j in range(m):
            sh = np.uint8(j & 7)
            if counts[w] == 1 or (z[j >> 3] >> sh) & np.uint8(1):
                aa[j] += -c if (s[j >> 3] >> sh) & np.uint8(1) else c
    oo = out[e0:e0 + m]
    for j in range(m):
        oo[j] = np.float32(aa[j] * inv)


@njit(cache=True)
def _mean_range(t0, t1, signs, nonzero, counts, scales, inv, out, task, table, wide):
    nb = (out.size + 7) // 8
    if table.size:
        s8 = np.empty(8 * task, np.uint8)
        z8 = np.empty(8 * task, np.uint8)
        for t in range(t0, t1):
            _mean_table_task(t * task, min(nb, (t + 1) * task), signs, nonzero, table, wide, out, s8, z8)
        return
    acc = np.empty(8 * task, np.float64)
    for t in range(t0, t1):
        _mean_loop_range(t * task, min(nb, (t + 1) * task), signs, nonzero, counts, scales, inv, out, acc)


@njit(cache=True, parallel=True)
def _mean_parallel(signs, nonzero, counts, scales, inv, out, task, table, wide, groups):
    ntasks = ((out.size + 7) // 8 + task - 1) // task
    per = (ntasks + groups - 1) // groups
    for g in prange(groups):
        _mean_range(g * per, min(ntasks, (g + 1) * per), signs, nonzero, counts, scales, inv, out, task, table, wide)


def scaled_mean(signs, nonzero, counts, scales, n: int, divide_by: int) -> np.ndarray:
    """Flat float32 (n,): f32(Σ_w f64(decode_w) · (1/divide_by)), the reference's ordered_mean of
    ScaledSign.decode, from each message's sign plane (`signs`), nonzero plane (`nonzero`, or None),
    plane count (`counts`: 0, 1, 2) and float32 scale (`scales`) of the layer. Up to _TABLE_MAX
    messages and from 2^12 elements (2^16 where a layer has zeros: a table of 2^16 patterns) the
    float32 result of every bit pattern is tabulated first, each entry summed in the reference's order."""
    out = np.empty(n, np.float32)
    if n == 0:
        return out
    nm = len(signs)
    counts = np.asarray(counts, np.int64)
    scales = np.asarray(scales, np.float32).astype(np.float64)
    inv = np.float64(1.0 / divide_by)
    wide = bool((counts == 2).any())
    table = np.zeros(0, np.float32)
    if nm <= _TABLE_MAX and n >= (1 << 16 if wide else 1 << 12):
        table = _mean_table(counts, scales, inv, wide)
    kept_s, ps = _addresses(signs, n)               # kept_*: the planes ps, pz address
    kept_z, pz = _addresses(nonzero, n)
    args = (ps, pz, counts, scales, inv, out, np.int64(_TASK_BYTES), table, wide)
    ntasks = -(-((n + 7) // 8) // _TASK_BYTES)
    if _parallel(n * nm) and ntasks > 1:
        _mean_parallel(*args, np.int64(min(ntasks, 4 * numba.get_num_threads())))
    else:
        _mean_range(0, ntasks, *args)
    return out
