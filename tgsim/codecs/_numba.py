"""Fused, multi-threaded Numba CPU kernels of the TernGrad codec, bit-identical to the array reference.

Same entry points as `tgsim.codecs._reference` (moments, encode, their batched-over-workers forms
moments_many and encode_many, weighted_sum, sum_codes), for NumPy arrays. Every kernel computes
exactly the reference's operations in the reference's order
(`tgsim.rng.philox`, `tgsim.codecs.stats`, `tgsim.codecs.ternary`, `tgsim.codecs.packing`); only the
loop structure differs:

* moments: one parallel pass. absmax and finiteness come from the largest |g| bit pattern (an
  integer max: the ordering of non-negative IEEE floats is the ordering of their bits, inf is
  0x7f800000 and every NaN is above it). The σ sums follow the documented lane order: LANES lanes,
  lane j sums d_i = f64(g_i) - K over i ≡ j (mod LANES) in ascending i; each thread owns fixed
  ranges of lanes and walks the rows, so the bits do not depend on the thread count; then the
  fixed pairwise tree and the float64 operations of `stats.moments_from_sums` (elementwise over
  workers in NumPy: the same IEEE operations). No fastmath anywhere (no FMA contraction, no
  reassociation). Layers of _FOLD_MIN..LANES elements hold one element per lane (0.0 + d_i), so
  the top three non-empty tree levels are computed straight from g, eight elements at a time, in
  the tree's order (_sigma_small), and only the remaining levels run on an array of partials: no
  n-sized float64 scratch, about half the time of the unfolded pass.
* batched over workers: moments_many / encode_many take the W workers' copies of one layer, G (W, n),
  and run one pass over all of them: serially on the calling thread when W * n is small (a parallel
  region costs more to start than such a pass), else one parallel region over (worker, chunk)
  pairs (or over workers, when there are many). The single-worker functions are the W = 1 case.
* encode: Philox4x32-10 block -> four words -> the exact ternary rule -> code -> packed byte, in one
  parallel pass. The rule f64(t)*f64(s) < f64(x)*2^24 is evaluated as f64(t)*(f64(s)*2^-24) <
  f64(x): both sides are the reference's exact products scaled by the same power of two (t*s has
  at most 48 significant bits, and |t*s*2^-24| >= 2^-173 is far from the float64 subnormal
  range), so every comparison - including inf/NaN/zero cases - has the same outcome.
* weighted_sum / sum_codes: one parallel pass over the payloads in chunks of bytes; per chunk the
  bytes of every worker are decoded into SoA scratch (contiguous, byte/word-wide SIMD), validated
  on the way (2-bit: a 0b11 pair; base-3: > 242), and the chunk's float32/int results written.
  Three exact routes to the reference's float64 sum acc = (((0 + c_0 s_0) + c_1 s_1) + ...):
    - one shared scaler s (TernGrad's MAX-shared scaler: finite, > 0, a float32 value): every
      partial sum is j*s for a small integer j, exactly representable, so acc = f64(Σ codes) * s;
      only the integer code counts are accumulated (uint8 lanes for <= 127 workers);
    - per-worker scalers: the first (up to) 8 workers' codes form a base-3 index into a table of
      the reference's partial sums for all 3^8 code tuples (computed with the reference's own
      float64 operations), and any further workers are added in float64 in ascending order.
  out = f32(acc * (1/divide_by)) as in the reference. (NaN results are NaN, but the sign/payload
  of a NaN made from NaN operands is not specified by IEEE 754 nor reproducible across builds.)

Everything compiles lazily on the first call (`cache=True` keeps the machine code on disk).
"""

from __future__ import annotations

import contextlib

import numba
import numpy as np
from numba import njit, prange

from tgsim.codecs import packing
from tgsim.codecs.stats import LANES, LayerMoments
from tgsim.rng import PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1, StreamKey
from tgsim.rng.philox import MAX_ELEMENTS

__all__ = ["moments", "encode", "moments_many", "encode_many", "weighted_sum", "sum_codes", "scaled_code_sum",
           "row_abs_stats", "philox_block", "philox4x32_10", "random_words"]

# ---------------------------------------------------------------------------------------------
# Philox4x32-10
# ---------------------------------------------------------------------------------------------
# Keep every integer in uint32/uint64: Numba turns mixed signed/unsigned 64-bit arithmetic into
# float64. The products are formed in uint64 (32x32 -> 64 bits); LLVM lowers them to vpmuludq and
# vectorizes a loop over blocks 8 (AVX-512) or 4 (AVX2) blocks per vector.
_M0 = np.uint64(PHILOX_M0)
_M1 = np.uint64(PHILOX_M1)
_W0 = np.uint32(PHILOX_W0)
_W1 = np.uint32(PHILOX_W1)
_S32 = np.uint64(32)
_U8 = np.uint32(8)


@njit(inline="always")
def _philox_round(c0, c1, c2, c3, k0, k1):
    # The xors are left to Numba's integer widening (uint64 holding 32-bit values): truncating them
    # to uint32 here makes LLVM shuffle between 32- and 64-bit lanes every round (2x slower).
    p0 = np.uint64(c0) * _M0
    p1 = np.uint64(c2) * _M1
    return (np.uint32(p1 >> _S32) ^ c1 ^ k0, np.uint32(p1),
            np.uint32(p0 >> _S32) ^ c3 ^ k1, np.uint32(p0))


@njit(inline="always")
def philox_block(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of counter (c0, c1, c2, c3) and key (k0, k1): a tuple of four np.uint32 words.

    Straight-line (the round loop has a constant trip count and is unrolled by LLVM), so a loop
    over blocks that calls it vectorizes across blocks (vpmuludq, 8 blocks per zmm register).
    """
    c0 = np.uint32(c0)
    c1 = np.uint32(c1)
    c2 = np.uint32(c2)
    c3 = np.uint32(c3)
    k0 = np.uint32(k0)
    k1 = np.uint32(k1)
    for _ in range(9):
        c0, c1, c2, c3 = _philox_round(c0, c1, c2, c3, k0, k1)
        k0 = np.uint32(k0 + _W0)
        k1 = np.uint32(k1 + _W1)
    c0, c1, c2, c3 = _philox_round(c0, c1, c2, c3, k0, k1)
    return np.uint32(c0), np.uint32(c1), np.uint32(c2), np.uint32(c3)


philox4x32_10 = philox_block    # the name of the array reference (tgsim.rng.philox4x32_10)


def _stream_args(key: StreamKey):
    """(c1, c2, c3, k0, k1) as np.uint32 for the tgsim stream layout (c0 = element // 4)."""
    k0, k1 = key.key
    return (np.uint32(key.layer), np.uint32(key.worker), np.uint32(key.step),
            np.uint32(k0), np.uint32(k1))


@njit(cache=True)
def _words_range(out, b0, c1, c2, c3, k0, k1):
    """out[4j + m] = word m of block b0 + j, for 0 <= j < out.size // 4.

    Indices start at 0 (callers pass slices) so that they are provably non-negative: Numba's
    negative-index wraparound would otherwise stop the vectorizer.
    """
    for j in range(out.size // 4):
        w0, w1, w2, w3 = philox_block(np.uint32(b0 + j), c1, c2, c3, k0, k1)
        out[4 * j] = w0
        out[4 * j + 1] = w1
        out[4 * j + 2] = w2
        out[4 * j + 3] = w3


_WORDS_CHUNK = 1 << 14  # blocks per parallel task


@njit(cache=True, parallel=True)
def _words_kernel(out, first_block, nblocks, c1, c2, c3, k0, k1):
    nch = (nblocks + _WORDS_CHUNK - 1) // _WORDS_CHUNK
    for ch in prange(nch):
        j0 = ch * _WORDS_CHUNK
        j1 = min(j0 + _WORDS_CHUNK, nblocks)
        _words_range(out[4 * j0:4 * j1], first_block + j0, c1, c2, c3, k0, k1)


def random_words(n: int, key: StreamKey, start: int = 0) -> np.ndarray:
    """uint32 words start..start+n-1 of the stream `key` (equals `tgsim.rng.random_words`)."""
    n, start = int(n), int(start)
    if n < 0 or start < 0 or start + n > MAX_ELEMENTS:
        raise ValueError(f"stream range [{start}, {start + n}) outside [0, {MAX_ELEMENTS})")
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    first, last = start // 4, (start + n - 1) // 4
    out = np.empty(4 * (last - first + 1), dtype=np.uint32)
    _words_kernel(out, np.int64(first), np.int64(last - first + 1), *_stream_args(key))
    off = start - 4 * first
    return out[off:off + n]


# ---------------------------------------------------------------------------------------------
# moments
# ---------------------------------------------------------------------------------------------
# Every kernel below works on W workers' layers at once, G (W, n), and is built from per-(worker,
# chunk) task functions: a serial driver runs the tasks in a loop (small layers: no parallel region
# at all), a parallel driver runs them as one parallel region over (worker, chunk) pairs, or over
# workers when there are many. A task's arithmetic does not depend on the driver or the thread
# count, so every driver gives the bits of the single-worker reference.
_ABS = np.uint32(0x7FFFFFFF)
_INF_BITS = 0x7F800000
_MAX_CHUNK = 1 << 16            # elements per task of the absmax-only pass
_LANE_CHUNK = 2048              # lanes per task of the σ pass (2 x 16 KiB of partials, L1-resident)
_SCRATCH_LANES = 1 << 18        # lane partials held at once by the (worker, lane chunk) σ pass (4 MiB)
# Work below which a kernel runs serially on the calling thread (no parallel region): W * n
# elements (moments, encode), W * nbytes payload bytes (weighted_sum, sum_codes). Measured on the
# 2-core development machine, idle (serial vs parallel, best of 40, tgsim.bench.sim's shapes):
#   σ pass    16K elements 12 vs 22 us, 65K 44 vs 23 us     -> parallel from 2^15
#   absmax    65K elements  8 vs 10 us, 262K 32 vs 18 us    -> parallel from 2^17
#   encode    16K elements 11 vs 12 us, 65K 40 vs 24 us     -> parallel from 2^15
#   sum_codes 20K bytes 3 vs 4 us, 131K 17 vs 16 us, 524K 33 vs 18 us -> parallel from 2^17
# On a machine whose cores are busy with other processes a parallel region can instead wait
# 20-35 ms (median, load average 8 on 2 cores) for its worker thread to be scheduled, like any
# multithreaded library there; run with NUMBA_NUM_THREADS=1 on such a machine: every kernel then
# takes its serial path (the bits are the same either way).
SERIAL_MOMENTS = 1 << 15
# The folded σ pass (layers of _FOLD_MIN..LANES elements, _sigma_small), same machine, min of 200,
# serial vs one task per worker: W=8 n=2560 10 vs 7 us, W=2 n=10240 8 vs 8, W=2 n=32768 14 vs 9,
# W=32 n=65536 440 vs 217; one worker n=65536: serial 29 us, a one-task region 48 us, the (worker,
# lane chunk) region of the unfolded pass 81 us -> parallel over workers from W*n = 2^14 and W >= 2.
SERIAL_FOLD = 1 << 14
SERIAL_ABSMAX = 1 << 17
SERIAL_ENCODE = 1 << 15
SERIAL_DECODE = 1 << 17
_WORKER_TASKS = 4               # W >= this x threads: one task per worker (fewer regions, no scratch)


@njit(cache=True)
def _absbits_max(bits):
    m = np.uint32(0)
    for i in range(bits.size):
        v = bits[i] & _ABS
        if v > m:
            m = v
    return m


@njit(cache=True)
def _absmax_serial(bits, mb):
    for w in range(bits.shape[0]):
        mb[w] = _absbits_max(bits[w])


@njit(cache=True, parallel=True)
def _absmax_par(bits, part):
    """part[w, c] = largest |g| bit pattern of chunk c of worker w: one region over (w, c)."""
    nw, n = bits.shape
    nch = part.shape[1]
    for t in prange(nw * nch):
        w = t // nch
        c = t - w * nch
        i0 = c * _MAX_CHUNK
        part[w, c] = _absbits_max(bits[w][i0:min(i0 + _MAX_CHUNK, n)])


@njit(cache=True)
def _lane_quad(g, bits, a, k, s1, s2):
    """Rows a, a+LANES, a+2 LANES, a+3 LANES (cnt = len(s1) lanes from offset a) into the partials:
    s <- (((s + d_r) + d_r+1) + d_r+2) + d_r+3, the same additions in the same order as one row at
    a time, with a quarter of the traffic on the partials. Returns the largest |g| bit pattern."""
    ga = g[a:a + s1.size]
    gb = g[a + LANES:a + LANES + s1.size]
    gc = g[a + 2 * LANES:a + 2 * LANES + s1.size]
    gd = g[a + 3 * LANES:a + 3 * LANES + s1.size]
    ba = bits[a:a + s1.size]
    bb = bits[a + LANES:a + LANES + s1.size]
    bc = bits[a + 2 * LANES:a + 2 * LANES + s1.size]
    bd = bits[a + 3 * LANES:a + 3 * LANES + s1.size]
    m = np.uint32(0)
    for j in range(s1.size):
        da = np.float64(ga[j]) - k
        db = np.float64(gb[j]) - k
        dc = np.float64(gc[j]) - k
        dd = np.float64(gd[j]) - k
        s1[j] = (((s1[j] + da) + db) + dc) + dd
        s2[j] = (((s2[j] + da * da) + db * db) + dc * dc) + dd * dd
        v = max(max(ba[j] & _ABS, bb[j] & _ABS), max(bc[j] & _ABS, bd[j] & _ABS))
        if v > m:
            m = v
    return m


@njit(cache=True)
def _lane_one(ga, ba, k, s1, s2):
    """One row (of ga.size <= len(s1) lanes) into the lane partials."""
    m = np.uint32(0)
    for j in range(ga.size):
        da = np.float64(ga[j]) - k
        s1[j] = s1[j] + da
        s2[j] = s2[j] + da * da
        va = ba[j] & _ABS
        if va > m:
            m = va
    return m


@njit(cache=True)
def _lanes_range(g, bits, l0, l1, s1, s2):
    """Lane partials of lanes l0..l1-1 of one layer g (n >= 1, l1 <= min(n, LANES)) into s1[l0:l1]
    and s2[l0:l1], _LANE_CHUNK lanes at a time (the partials stay in L1 while the rows stream by).
    Returns the largest |g| bit pattern of those lanes' elements."""
    n = g.size
    k = np.float64(g[0])
    rows = n // LANES
    rem = n - rows * LANES
    m = np.uint32(0)
    for c0 in range(l0, l1, _LANE_CHUNK):
        c1 = min(c0 + _LANE_CHUNK, l1)
        a1 = s1[c0:c1]
        a2 = s2[c0:c1]
        a1[:] = 0.0
        a2[:] = 0.0
        r = 0
        while r + 4 <= rows:
            mr = _lane_quad(g, bits, r * LANES + c0, k, a1, a2)
            if mr > m:
                m = mr
            r += 4
        while r < rows:
            a = r * LANES
            mr = _lane_one(g[a + c0:a + c1], bits[a + c0:a + c1], k, a1, a2)
            if mr > m:
                m = mr
            r += 1
        if rem > c0:   # the partial last row covers lanes 0..rem-1
            a = rows * LANES
            e1 = min(c1, rem)
            mr = _lane_one(g[a + c0:a + e1], bits[a + c0:a + e1], k, a1, a2)
            if mr > m:
                m = mr
    return m


@njit(cache=True)
def _lane_tree(s1, s2, nl):
    """The fixed pairwise tree a <- a[:h] + a[h:2h], h = LANES/2 .. 1, over the nl live lanes.

    Only the nl = min(n, LANES) lanes that hold elements are computed. The others are +0.0 in the
    reference, and adding +0.0 is exact identity for every lane partial: a partial starts at +0.0
    and x + y is -0.0 only when both are -0.0, so no partial is ever -0.0. The tree therefore
    skips every a[j] + a[j + h] whose a[j + h] is such a zero lane: O(n), not O(LANES), work for
    small layers, with the reference's bits. Result in s1[0], s2[0].
    """
    h = LANES // 2
    live = nl
    while h >= 1:
        for j in range(live - h):          # j + h < live; empty when live <= h
            s1[j] = s1[j] + s1[j + h]
            s2[j] = s2[j] + s2[j + h]
        live = min(live, h)
        h //= 2


_FOLD_ROWS = 8      # tree levels folded straight from g for layers of <= LANES elements (2^3 rows)
# Smallest layer that takes the folded σ pass (_sigma_small): below it a fixed cost of ~0.3 us per
# call (16 row views) outweighs the lane partials it saves (measured, serial, W = 32: n = 1024
# 19 vs 22 us, 2048 33 vs 28 us, 65536 1461 vs 447 us). The bits are the same either way.
_FOLD_MIN = 2048


@njit(cache=True)
def _fold8(x0, x1, x2, x3, x4, x5, x6, x7, b0, b1, b2, b3, b4, b5, b6, b7,
           k0, k1, k2, k3, k4, k5, k6, k7, t1, t2):
    """t[j] = the top three tree levels over the 8 lanes x_r[j] (r = 0..7), from the elements:
    lane r holds 0.0 + (f64(x_r[j]) - k_r) (and 0.0 + d*d), the levels pair r with r + 4, then
    r + 2, then r + 1: ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)). A lane without an element
    is a +0.0 partial in the reference; it is passed as a float32 zero with k_r = 0, which gives
    0.0 + (0.0 - 0.0) = +0.0 exactly. Returns the largest |x| bit pattern (b_r: the bits of x_r)."""
    m = np.uint32(0)
    for j in range(t1.size):
        d0 = np.float64(x0[j]) - k0
        d1 = np.float64(x1[j]) - k1
        d2 = np.float64(x2[j]) - k2
        d3 = np.float64(x3[j]) - k3
        d4 = np.float64(x4[j]) - k4
        d5 = np.float64(x5[j]) - k5
        d6 = np.float64(x6[j]) - k6
        d7 = np.float64(x7[j]) - k7
        t1[j] = (((0.0 + d0) + (0.0 + d4)) + ((0.0 + d2) + (0.0 + d6))) + \
            (((0.0 + d1) + (0.0 + d5)) + ((0.0 + d3) + (0.0 + d7)))
        t2[j] = (((0.0 + d0 * d0) + (0.0 + d4 * d4)) + ((0.0 + d2 * d2) + (0.0 + d6 * d6))) + \
            (((0.0 + d1 * d1) + (0.0 + d5 * d5)) + ((0.0 + d3 * d3) + (0.0 + d7 * d7)))
        v = max(max(max(b0[j] & _ABS, b1[j] & _ABS), max(b2[j] & _ABS, b3[j] & _ABS)),
                max(max(b4[j] & _ABS, b5[j] & _ABS), max(b6[j] & _ABS, b7[j] & _ABS)))
        if v > m:
            m = v
    return m


@njit(cache=True)
def _fold_cols(g, bits, zf, zb, k, hb, c0, c1, t1, t2):
    """_fold8 of columns c0..c1-1 (lane = r * hb + c): rows whose lane is past the layer's end
    read the zeros zf/zb with shift 0 (callers split the columns so that this is per row)."""
    n = g.size
    m = c1 - c0
    x0, b0, k0 = g[c0:c1], bits[c0:c1], k
    x1, b1, k1 = (g[hb + c0:hb + c1], bits[hb + c0:hb + c1], k) if hb + c1 <= n else (zf[:m], zb[:m], 0.0)
    x2, b2, k2 = (g[2 * hb + c0:2 * hb + c1], bits[2 * hb + c0:2 * hb + c1], k) if 2 * hb + c1 <= n \
        else (zf[:m], zb[:m], 0.0)
    x3, b3, k3 = (g[3 * hb + c0:3 * hb + c1], bits[3 * hb + c0:3 * hb + c1], k) if 3 * hb + c1 <= n \
        else (zf[:m], zb[:m], 0.0)
    x4, b4, k4 = (g[4 * hb + c0:4 * hb + c1], bits[4 * hb + c0:4 * hb + c1], k) if 4 * hb + c1 <= n \
        else (zf[:m], zb[:m], 0.0)
    x5, b5, k5 = (g[5 * hb + c0:5 * hb + c1], bits[5 * hb + c0:5 * hb + c1], k) if 5 * hb + c1 <= n \
        else (zf[:m], zb[:m], 0.0)
    x6, b6, k6 = (g[6 * hb + c0:6 * hb + c1], bits[6 * hb + c0:6 * hb + c1], k) if 6 * hb + c1 <= n \
        else (zf[:m], zb[:m], 0.0)
    x7, b7, k7 = (g[7 * hb + c0:7 * hb + c1], bits[7 * hb + c0:7 * hb + c1], k) if 7 * hb + c1 <= n \
        else (zf[:m], zb[:m], 0.0)
    return _fold8(x0, x1, x2, x3, x4, x5, x6, x7, b0, b1, b2, b3, b4, b5, b6, b7,
                  k0, k1, k2, k3, k4, k5, k6, k7, t1[c0:c1], t2[c0:c1])


@njit(cache=True)
def _fold_cols_count(n):
    """hb: the power of two with 4 hb < n <= 8 hb (n > 4)."""
    hb = 1
    while 8 * hb < n:
        hb *= 2
    return hb


@njit(cache=True)
def _sigma_small(g, bits, s1, s2, zf, zb):
    """(S1, S2, absmax bits) of a layer of 8 < n <= LANES elements (one element per lane), the
    documented tree without lane partials: with H the power of two in [n, 2n), every level above
    H/2 is empty, and the three levels H/2, H/4, H/8 pair rows of hb = H/8 lanes (_fold8), read
    straight from g; the remaining levels run on the hb results (_lane_tree). s1/s2: scratch of
    >= hb float64; zf/zb: float32/uint32 zeros of >= hb."""
    n = g.size
    hb = _fold_cols_count(n)
    k = np.float64(g[0])
    # columns c < cut have one more row than the columns after it (the last row is partial)
    rows = (n + hb - 1) // hb
    cut = n - (rows - 1) * hb
    m = _fold_cols(g, bits, zf, zb, k, hb, 0, cut, s1, s2)
    if cut < hb:
        m2 = _fold_cols(g, bits, zf, zb, k, hb, cut, hb, s1, s2)
        if m2 > m:
            m = m2
    _lane_tree(s1, s2, hb)
    return s1[0], s2[0], m


@njit(cache=True)
def _fold_zeros(n):
    """The float32 zeros _sigma_small reads for lanes past the end (one element when unused)."""
    return np.zeros(_fold_cols_count(n) if _FOLD_MIN <= n <= LANES else 1, dtype=np.float32)


@njit(cache=True)
def _sigma_worker(g, bits, s1, s2, sums, w, zf):
    """Everything for worker w (one task): lanes, tree, sums[w] = (S1, S2); returns the absmax bits.
    s1/s2: scratch of min(n, LANES) lanes; zf: _fold_zeros(n)."""
    n = g.size
    if _FOLD_MIN <= n <= LANES:
        a, b, m = _sigma_small(g, bits, s1, s2, zf, zf.view(np.uint32))
        sums[w, 0] = a
        sums[w, 1] = b
        return m
    nl = min(n, LANES)
    m = _lanes_range(g, bits, 0, nl, s1, s2)
    _lane_tree(s1, s2, nl)
    sums[w, 0] = s1[0]
    sums[w, 1] = s2[0]
    return m


@njit(cache=True)
def _sigma_serial(G, bits, sums, mb):
    nl = min(G.shape[1], LANES)
    s1 = np.empty(nl, dtype=np.float64)
    s2 = np.empty(nl, dtype=np.float64)
    zf = _fold_zeros(G.shape[1])
    for w in range(G.shape[0]):
        mb[w] = _sigma_worker(G[w], bits[w], s1, s2, sums, w, zf)


@njit(cache=True, parallel=True)
def _sigma_workers(G, bits, sums, mb):
    """One task per worker (many workers): one parallel region, per-task scratch of min(n, LANES) lanes."""
    nl = min(G.shape[1], LANES)
    zf = _fold_zeros(G.shape[1])
    for w in prange(G.shape[0]):
        s1 = np.empty(nl, dtype=np.float64)
        s2 = np.empty(nl, dtype=np.float64)
        mb[w] = _sigma_worker(G[w], bits[w], s1, s2, sums, w, zf)


@njit(cache=True, parallel=True)
def _sigma_chunks(G, bits, w0, s1, s2, part, sums, mb):
    """Workers w0 .. w0 + len(s1) - 1 (few workers, large layers): one parallel region over
    (worker, lane chunk) pairs into s1/s2 (workers x live lanes), then the trees (serial: O(LANES))."""
    wb, nl = s1.shape
    nlc = part.shape[1]
    for t in prange(wb * nlc):
        i = t // nlc
        l0 = (t - i * nlc) * _LANE_CHUNK
        part[i, t - i * nlc] = _lanes_range(G[w0 + i], bits[w0 + i], l0, min(l0 + _LANE_CHUNK, nl),
                                            s1[i], s2[i])
    for i in range(wb):
        _lane_tree(s1[i], s2[i], nl)
        sums[w0 + i, 0] = s1[i, 0]
        sums[w0 + i, 1] = s2[i, 0]
        m = np.uint32(0)
        for c in range(nlc):
            if part[i, c] > m:
                m = part[i, c]
        mb[w0 + i] = m


def _as_f32_flat(g, what="g") -> np.ndarray:
    g = np.asarray(g)
    if g.dtype != np.float32:
        raise ValueError(f"{what}: expected float32, got {g.dtype}")
    return np.ascontiguousarray(g.reshape(-1))


def _as_f32_rows(G, what="G") -> np.ndarray:
    G = np.asarray(G)
    if G.dtype != np.float32:
        raise ValueError(f"{what}: expected float32, got {G.dtype}")
    if G.ndim != 2:
        raise ValueError(f"{what}: expected a 2-D array (workers, elements), got shape {G.shape}")
    return np.ascontiguousarray(G)


def _threads() -> int:
    return numba.get_num_threads()


_NO_ERRSTATE = contextlib.nullcontext()


def moments_many(G: np.ndarray, need_sigma: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(absmax, sigma, finite), arrays over the W rows of G (W, n) float32: row w has the bits of
    `moments(G[w], need_sigma)` (non-finite rows: nan, nan, False; n = 0: 0, 0, True).

    W * n < SERIAL_MOMENTS (SERIAL_ABSMAX without σ): one serial pass on this thread. Otherwise one
    parallel region, over
    workers when W >= 4 x threads, else over (worker, chunk) pairs (the σ pass in blocks of
    workers whose lane partials fit in _SCRATCH_LANES). The σ pass of layers of _FOLD_MIN..LANES
    elements (folded, _sigma_small) is serial for one worker or W * n < SERIAL_FOLD, else one
    region over workers.
    """
    G = _as_f32_rows(G)
    nw, n = G.shape
    absmax = np.zeros(nw, dtype=np.float64)
    sigma = np.zeros(nw, dtype=np.float64)
    if nw == 0 or n == 0:
        return absmax, sigma, np.ones(nw, dtype=bool)
    bits = G.view(np.uint32)
    mb = np.empty(nw, dtype=np.uint32)
    serial = nw * n < (SERIAL_MOMENTS if need_sigma else SERIAL_ABSMAX) or _threads() == 1
    if need_sigma:
        sums = np.empty((nw, 2), dtype=np.float64)
        fold = _FOLD_MIN <= n <= LANES
        if fold:    # the folded pass is ~2x cheaper per element than the lane partials
            serial = nw * n < SERIAL_FOLD or nw == 1 or _threads() == 1
        if serial:
            _sigma_serial(G, bits, sums, mb)
        elif fold or nw >= _WORKER_TASKS * _threads():
            _sigma_workers(G, bits, sums, mb)
        else:
            nl = min(n, LANES)
            wb = max(1, min(nw, _SCRATCH_LANES // nl))
            s1 = np.empty((wb, nl), dtype=np.float64)
            s2 = np.empty((wb, nl), dtype=np.float64)
            part = np.empty((wb, -(-nl // _LANE_CHUNK)), dtype=np.uint32)
            for w0 in range(0, nw, wb):
                k = min(wb, nw - w0)
                _sigma_chunks(G, bits, np.int64(w0), s1[:k], s2[:k], part[:k], sums, mb)
    elif serial:
        _absmax_serial(bits, mb)
    else:
        part = np.empty((nw, -(-n // _MAX_CHUNK)), dtype=np.uint32)
        _absmax_par(bits, part)
        mb = part.max(axis=1)
    finite = mb < _INF_BITS
    absmax = mb.view(np.float32).astype(np.float64)     # exact: a float32 value, or inf/nan where not finite
    all_finite = bool(finite.all())
    if need_sigma:
        # stats.moments_from_sums, elementwise (the same IEEE float64 operations, no FMA); with
        # finite rows no operation can overflow or be invalid (|S1| < 2^130 n, S2 < 2^257 n)
        m1 = sums[:, 0] / n
        with np.errstate(invalid="ignore", over="ignore") if not all_finite else _NO_ERRSTATE:
            var = sums[:, 1] / n - m1 * m1
            sigma = np.sqrt(np.where(var > 0.0, var, 0.0))
    if not all_finite:
        absmax[~finite] = np.nan
        sigma[~finite] = np.nan
    return absmax, sigma, finite


def moments(g: np.ndarray, need_sigma: bool) -> LayerMoments:
    """Same bits as `stats.layer_moments(g, need_sigma)` (moments_many of one row)."""
    g = _as_f32_flat(g)
    a, s, f = moments_many(g.reshape(1, -1), need_sigma)
    return LayerMoments(float(a[0]), float(s[0]), bool(f[0]))


# ---------------------------------------------------------------------------------------------
# per-row |g| statistics (training metrics; not part of the codec's bits)
# ---------------------------------------------------------------------------------------------
_STAT_LANES = 16    # interleaved float64 partial sums per row (vectorizes without reassociation)


@njit(cache=True)
def _row_stats(g, cb, out, w):
    """out[w] = (Σ|g|, Σ g^2, #(|g| > cb), max|g|) of one row, in float64: element i goes to
    partial i % 16 (ascending i), the partials are added in order 0..15, then the tail."""
    a1 = np.zeros(_STAT_LANES)
    a2 = np.zeros(_STAT_LANES)
    cc = np.zeros(_STAT_LANES, dtype=np.int64)
    mx = np.zeros(_STAT_LANES)
    nb = g.size // _STAT_LANES
    for b in range(nb):
        blk = g[b * _STAT_LANES:(b + 1) * _STAT_LANES]
        for k in range(_STAT_LANES):
            a = abs(np.float64(blk[k]))
            a1[k] += a
            a2[k] += a * a
            cc[k] += a > cb
            mx[k] = a if a > mx[k] else mx[k]
    l1 = 0.0
    l2 = 0.0
    c = 0
    m = 0.0
    for k in range(_STAT_LANES):
        l1 += a1[k]
        l2 += a2[k]
        c += cc[k]
        m = mx[k] if mx[k] > m else m
    for i in range(nb * _STAT_LANES, g.size):
        a = abs(np.float64(g[i]))
        l1 += a
        l2 += a * a
        c += a > cb
        m = a if a > m else m
    out[w, 0] = l1
    out[w, 1] = l2
    out[w, 2] = c
    out[w, 3] = m


@njit(cache=True)
def _row_stats_serial(G, cb, out):
    for w in range(G.shape[0]):
        _row_stats(G[w], cb[w], out, w)


@njit(cache=True, parallel=True)
def _row_stats_par(G, cb, out):
    for w in prange(G.shape[0]):
        _row_stats(G[w], cb[w], out, w)


def row_abs_stats(G: np.ndarray, clip_bounds=None) -> np.ndarray:
    """float64 (W, 4): per row of G (W, n) float32, (Σ|g|, Σ g^2, #(|g| > clip_bounds[w]), max|g|),
    in one pass (0.3 ns per element). Deterministic (a fixed order of float64 additions, see
    _row_stats) but not the order of np.sum; for metrics, not for the codec's bits. NaN-free input
    assumed (a NaN is not counted above any bound and does not raise max|g|)."""
    G = _as_f32_rows(G)
    nw, n = G.shape
    cb = np.full(nw, np.inf) if clip_bounds is None else _per_worker(clip_bounds, nw, "clip_bounds")
    out = np.zeros((nw, 4), dtype=np.float64)
    if nw and n:
        serial = nw * n < SERIAL_MOMENTS or nw == 1 or _threads() == 1
        (_row_stats_serial if serial else _row_stats_par)(G, cb, out)
    return out


# ---------------------------------------------------------------------------------------------
# encode
# ---------------------------------------------------------------------------------------------
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


_ZERO_BYTE = {"2bit": 0b01010101, "base3": 1 + 3 + 9 + 27 + 81}


def _check_fmt(fmt: str) -> None:
    if fmt not in packing.FORMATS:
        raise ValueError(f"unknown packing {fmt!r}; expected one of {packing.FORMATS}")


def _per_worker(values, nw: int, what: str) -> np.ndarray:
    """float64 (W,) of per-worker numbers (float32 inputs are exact in float64)."""
    v = np.asarray(values)
    if v.shape != (nw,):
        raise ValueError(f"{what}: expected shape ({nw},), got {v.shape}")
    if v.dtype.kind not in "fiu":
        raise ValueError(f"{what}: expected real numbers, got {v.dtype}")
    return v.astype(np.float64)


def _worker_ids(workers, nw: int) -> np.ndarray:
    wk = np.asarray(workers)
    if wk.shape != (nw,):
        raise ValueError(f"workers: expected shape ({nw},), got {wk.shape}")
    if nw and wk.dtype.kind not in "iu":
        raise ValueError(f"workers: expected integer worker ids, got {wk.dtype}")
    if nw and (int(wk.min()) < 0 or int(wk.max()) >= 2**32):
        raise ValueError(f"worker ids must be in [0, 2^32), got [{int(wk.min())}, {int(wk.max())}]")
    return np.ascontiguousarray(wk, dtype=np.uint32)


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
        serial = nw * n < SERIAL_ENCODE or _threads() == 1
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
    elements: equal to encode(layer, ...)[first // k : ...] (k codes per byte) when `first` is a
    multiple of 20 (a base-3 unit, 5 Philox blocks; 2-bit needs 4) and the range ends on such a
    multiple or at the layer's end (where the whole payload's pad codes are). Serial, on this
    thread: the pipelined exchanges encode piece by piece while earlier pieces are on the wire."""
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


# ---------------------------------------------------------------------------------------------
# weighted_sum / sum_codes
# ---------------------------------------------------------------------------------------------
_DEC_CHUNK = 2048   # payload bytes per parallel task (scratch of 8-10 K elements: L1/L2-resident)
_TABLE_WORKERS = 8  # the first (up to) 8 workers' codes index a table of 3^8 exact partial sums
_U8_1 = np.uint8(1)
_U8_2 = np.uint8(2)
_U8_3 = np.uint8(3)
_U8_4 = np.uint8(4)
_U8_6 = np.uint8(6)
_U8_55 = np.uint8(0x55)
_U8_242 = np.uint8(242)
_U3 = np.uint32(3)

# Decoding works on SoA scratch rows c[m, j] = (something of) field m of byte j, so that every
# inner loop is contiguous and byte/word-wide SIMD; the interleave to element order k j + m happens
# once, in the output loop. Every decoding loop also ORs a validity flag over its bytes (2-bit: a
# 0b11 pair; base-3: > 242), so validation costs no extra pass.


@njit(inline="always")
def _bad2(v):
    return np.uint8(v & (v >> _U8_1) & _U8_55)


@njit(inline="always")
def _bad3(v):
    return np.uint8(v > _U8_242)


@njit(inline="always")
def _trits(v):
    """The five base-3 digits of byte v (division by 3 compiles to a multiply-shift)."""
    v = np.uint32(v)
    q1 = v // _U3
    q2 = q1 // _U3
    q3 = q2 // _U3
    q4 = q3 // _U3
    return v - _U3 * q1, q1 - _U3 * q2, q2 - _U3 * q3, q3 - _U3 * q4, q4


@njit(cache=True)
def _first_bad(p, k):
    for j in range(p.size):
        if (_bad2(p[j]) if k == 4 else _bad3(p[j])) != 0:
            return j
    return -1


@njit(cache=True)
def _count2(c, p):
    """c[m, j] += field m of 2-bit byte p[j] (value = code + 1). Returns non-zero on invalid bytes."""
    c0 = c[0]
    c1 = c[1]
    c2 = c[2]
    c3 = c[3]
    bad = np.uint8(0)
    for j in range(p.size):
        v = p[j]
        bad = np.uint8(bad | _bad2(v))
        c0[j] += v & _U8_3
        c1[j] += (v >> _U8_2) & _U8_3
        c2[j] += (v >> _U8_4) & _U8_3
        c3[j] += v >> _U8_6
    return bad


@njit(cache=True)
def _count3(c, p):
    """c[m, j] += trit m of base-3 byte p[j]. Returns non-zero on invalid bytes."""
    c0 = c[0]
    c1 = c[1]
    c2 = c[2]
    c3 = c[3]
    c4 = c[4]
    bad = np.uint8(0)
    for j in range(p.size):
        v = p[j]
        bad = np.uint8(bad | _bad3(v))
        d0, d1, d2, d3, d4 = _trits(v)
        c0[j] += d0
        c1[j] += d1
        c2[j] += d2
        c3[j] += d3
        c4[j] += d4
    return bad


@njit(cache=True)
def _index2(c, p, mult):
    """c[m, j] += (field m of p[j]) * mult (uint16 table index). Returns non-zero on invalid bytes."""
    c0 = c[0]
    c1 = c[1]
    c2 = c[2]
    c3 = c[3]
    bad = np.uint8(0)
    for j in range(p.size):
        v = p[j]
        bad = np.uint8(bad | _bad2(v))
        c0[j] += np.uint16(v & _U8_3) * mult
        c1[j] += np.uint16((v >> _U8_2) & _U8_3) * mult
        c2[j] += np.uint16((v >> _U8_4) & _U8_3) * mult
        c3[j] += np.uint16(v >> _U8_6) * mult
    return bad


@njit(cache=True)
def _index3(c, p, mult):
    c0 = c[0]
    c1 = c[1]
    c2 = c[2]
    c3 = c[3]
    c4 = c[4]
    bad = np.uint8(0)
    for j in range(p.size):
        v = p[j]
        bad = np.uint8(bad | _bad3(v))
        d0, d1, d2, d3, d4 = _trits(v)
        c0[j] += np.uint16(d0) * mult
        c1[j] += np.uint16(d1) * mult
        c2[j] += np.uint16(d2) * mult
        c3[j] += np.uint16(d3) * mult
        c4[j] += np.uint16(d4) * mult
    return bad


@njit(cache=True)
def _acc2(a, p, s):
    """a[m, j] += f64(code m of p[j]) * s: the reference's float64 step for one more worker."""
    a0 = a[0]
    a1 = a[1]
    a2 = a[2]
    a3 = a[3]
    bad = np.uint8(0)
    for j in range(p.size):
        v = p[j]
        bad = np.uint8(bad | _bad2(v))
        a0[j] += np.float64(np.int32(v & _U8_3) - np.int32(1)) * s
        a1[j] += np.float64(np.int32((v >> _U8_2) & _U8_3) - np.int32(1)) * s
        a2[j] += np.float64(np.int32((v >> _U8_4) & _U8_3) - np.int32(1)) * s
        a3[j] += np.float64(np.int32(v >> _U8_6) - np.int32(1)) * s
    return bad


@njit(cache=True)
def _acc3(a, p, s):
    bad = np.uint8(0)
    for j in range(p.size):
        v = p[j]
        bad = np.uint8(bad | _bad3(v))
        d0, d1, d2, d3, d4 = _trits(v)
        a[0, j] += np.float64(np.int32(d0) - np.int32(1)) * s
        a[1, j] += np.float64(np.int32(d1) - np.int32(1)) * s
        a[2, j] += np.float64(np.int32(d2) - np.int32(1)) * s
        a[3, j] += np.float64(np.int32(d3) - np.int32(1)) * s
        a[4, j] += np.float64(np.int32(d4) - np.int32(1)) * s
    return bad


@njit(inline="always")
def _note_bad(bad, w, p, j0, k, bad_w, bad_j, ch):
    """Record the first invalid byte of the lowest worker of task ch (workers come in ascending order)."""
    if bad != 0 and bad_w[ch] < 0:
        bad_w[ch] = w
        bad_j[ch] = j0 + _first_bad(p, k)


@njit(cache=True)
def _count_task(c, payloads, j0, j1, k, bad_w, bad_j, ch):
    for w in range(payloads.shape[0]):
        p = payloads[w, j0:j1]
        bad = _count2(c, p) if k == 4 else _count3(c, p)
        _note_bad(bad, w, p, j0, k, bad_w, bad_j, ch)


@njit(cache=True)
def _map_out(out, c, k, f):
    """out[k j + m] = f[c[m, j]] (f: the float32 result for each count / table index)."""
    nfull = out.size // k
    if k == 4:
        c0 = c[0]
        c1 = c[1]
        c2 = c[2]
        c3 = c[3]
        for j in range(nfull):
            out[4 * j] = f[c0[j]]
            out[4 * j + 1] = f[c1[j]]
            out[4 * j + 2] = f[c2[j]]
            out[4 * j + 3] = f[c3[j]]
    else:
        for j in range(nfull):
            for m in range(5):
                out[5 * j + m] = f[c[m, j]]
    for e in range(k * nfull, out.size):
        out[e] = f[c[e - k * nfull, nfull]]


@njit(cache=True)
def _uniform_out(out, c, k, nw, s, inv):
    """out[k j + m] = f32((f64(Σ codes) * s) * inv) with Σ codes = c[m, j] - nw."""
    nfull = out.size // k
    if k == 4:
        c0 = c[0]
        c1 = c[1]
        c2 = c[2]
        c3 = c[3]
        for j in range(nfull):
            out[4 * j] = np.float32((np.float64(np.int32(c0[j]) - nw) * s) * inv)
            out[4 * j + 1] = np.float32((np.float64(np.int32(c1[j]) - nw) * s) * inv)
            out[4 * j + 2] = np.float32((np.float64(np.int32(c2[j]) - nw) * s) * inv)
            out[4 * j + 3] = np.float32((np.float64(np.int32(c3[j]) - nw) * s) * inv)
    else:
        for j in range(nfull):
            for m in range(5):
                out[5 * j + m] = np.float32((np.float64(np.int32(c[m, j]) - nw) * s) * inv)
    for e in range(k * nfull, out.size):
        out[e] = np.float32((np.float64(np.int32(c[e - k * nfull, nfull]) - nw) * s) * inv)


@njit(cache=True)
def _scale_out(out, a, k, inv):
    """out[k j + m] = f32(a[m, j] * inv)."""
    nfull = out.size // k
    for j in range(nfull):
        for m in range(k):
            out[k * j + m] = np.float32(a[m, j] * inv)
    for e in range(k * nfull, out.size):
        out[e] = np.float32(a[e - k * nfull, nfull] * inv)


@njit(cache=True)
def _int_out(out, c, k, nw):
    """out[k j + m] = c[m, j] - nw (Σ codes), cast to out's dtype (wrapping like the reference)."""
    nfull = out.size // k
    if k == 4:
        c0 = c[0]
        c1 = c[1]
        c2 = c[2]
        c3 = c[3]
        for j in range(nfull):
            out[4 * j] = np.int32(c0[j]) - nw
            out[4 * j + 1] = np.int32(c1[j]) - nw
            out[4 * j + 2] = np.int32(c2[j]) - nw
            out[4 * j + 3] = np.int32(c3[j]) - nw
    else:
        for j in range(nfull):
            for m in range(5):
                out[5 * j + m] = np.int32(c[m, j]) - nw
    for e in range(k * nfull, out.size):
        out[e] = np.int32(c[e - k * nfull, nfull]) - nw


@njit(cache=True)
def _wsum_uniform_task(ch, payloads, n, k, s, inv, out, bad_w, bad_j, count_dtype):
    """Bytes ch * _DEC_CHUNK .. of every worker, one shared scaler s: out = f32((f64(Σ_w code_w) * s) * inv)."""
    nw, nbytes = payloads.shape
    j0 = ch * _DEC_CHUNK
    j1 = min(j0 + _DEC_CHUNK, nbytes)
    c = np.zeros((k, j1 - j0), dtype=count_dtype.dtype)
    _count_task(c, payloads, j0, j1, k, bad_w, bad_j, ch)
    _uniform_out(out[j0 * k:min(j1 * k, n)], c, k, np.int32(nw), s, inv)


@njit(cache=True, parallel=True)
def _wsum_uniform_kernel(payloads, n, k, s, inv, out, bad_w, bad_j, count_dtype):
    """One shared scaler s (see _is_uniform): one parallel region over chunks of bytes."""
    for ch in prange(bad_w.size):
        _wsum_uniform_task(ch, payloads, n, k, s, inv, out, bad_w, bad_j, count_dtype)


@njit(cache=True)
def _wsum_uniform_serial(payloads, n, k, s, inv, out, bad_w, bad_j, count_dtype):
    for ch in range(bad_w.size):
        _wsum_uniform_task(ch, payloads, n, k, s, inv, out, bad_w, bad_j, count_dtype)


@njit(cache=True)
def _wsum_table_task(ch, payloads, scalers, n, k, mults, table, f, inv, out, bad_w, bad_j):
    """Any scalers. The first nt = len(mults) workers' codes form a base-3 index into `table`, their
    exact reference partial sums (or, when nt == all workers, `f`: the final float32 values); the
    remaining workers are added in float64 one at a time, in ascending order, as the reference does.
    """
    nw, nbytes = payloads.shape
    nt = mults.size
    j0 = ch * _DEC_CHUNK
    j1 = min(j0 + _DEC_CHUNK, nbytes)
    c = np.zeros((k, j1 - j0), dtype=np.uint16)
    for w in range(nt):
        p = payloads[w, j0:j1]
        bad = _index2(c, p, mults[w]) if k == 4 else _index3(c, p, mults[w])
        _note_bad(bad, w, p, j0, k, bad_w, bad_j, ch)
    o = out[j0 * k:min(j1 * k, n)]
    if nt == nw:
        _map_out(o, c, k, f)
    else:
        a = np.empty((k, j1 - j0), dtype=np.float64)
        for m in range(k):
            for j in range(j1 - j0):
                a[m, j] = table[c[m, j]]
        for w in range(nt, nw):
            p = payloads[w, j0:j1]
            bad = _acc2(a, p, scalers[w]) if k == 4 else _acc3(a, p, scalers[w])
            _note_bad(bad, w, p, j0, k, bad_w, bad_j, ch)
        _scale_out(o, a, k, inv)


@njit(cache=True, parallel=True)
def _wsum_table_kernel(payloads, scalers, n, k, mults, table, f, inv, out, bad_w, bad_j):
    for ch in prange(bad_w.size):
        _wsum_table_task(ch, payloads, scalers, n, k, mults, table, f, inv, out, bad_w, bad_j)


@njit(cache=True)
def _wsum_table_serial(payloads, scalers, n, k, mults, table, f, inv, out, bad_w, bad_j):
    for ch in range(bad_w.size):
        _wsum_table_task(ch, payloads, scalers, n, k, mults, table, f, inv, out, bad_w, bad_j)


@njit(cache=True)
def _isum_task(ch, payloads, n, k, out, bad_w, bad_j, count_dtype):
    nw, nbytes = payloads.shape
    j0 = ch * _DEC_CHUNK
    j1 = min(j0 + _DEC_CHUNK, nbytes)
    c = np.zeros((k, j1 - j0), dtype=count_dtype.dtype)
    _count_task(c, payloads, j0, j1, k, bad_w, bad_j, ch)
    _int_out(out[j0 * k:min(j1 * k, n)], c, k, np.int32(nw))


@njit(cache=True, parallel=True)
def _isum_kernel(payloads, n, k, out, bad_w, bad_j, count_dtype):
    for ch in prange(bad_w.size):
        _isum_task(ch, payloads, n, k, out, bad_w, bad_j, count_dtype)


@njit(cache=True)
def _isum_serial(payloads, n, k, out, bad_w, bad_j, count_dtype):
    for ch in range(bad_w.size):
        _isum_task(ch, payloads, n, k, out, bad_w, bad_j, count_dtype)


def _serial_decode(payloads: np.ndarray) -> bool:
    """Decode W x nbytes payload bytes on this thread (no parallel region) below SERIAL_DECODE."""
    return payloads.size < SERIAL_DECODE or _threads() == 1


def _partial_sums(scalers: np.ndarray, nt: int) -> np.ndarray:
    """float64[3^nt]: the reference's acc after workers 0..nt-1 for every code tuple, tuple index
    Σ_w (code_w + 1) 3^w (same float64 operations in the same order as packing.weighted_sum)."""
    idx = np.arange(3 ** nt)
    acc = np.zeros(3 ** nt, dtype=np.float64)
    with np.errstate(all="ignore"):       # 0 * inf = nan, as in the reference
        for w in range(nt):
            code = ((idx // 3 ** w) % 3 - 1).astype(np.float64)
            acc += code * np.float64(scalers[w])
    return acc


def _count_dtype(nw: int) -> np.ndarray:
    """Witness array for the per-element count of values (code + 1) <= 2 nw."""
    return np.zeros(0, dtype=np.uint8 if nw <= 127 else (np.uint16 if nw <= 32767 else np.int64))


def _check_payloads(payloads, n: int, fmt: str) -> tuple[np.ndarray, int]:
    """Shape/dtype/length checks (before any kernel); returns (C-contiguous payloads, nbytes)."""
    _check_fmt(fmt)
    if int(n) != n or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    payloads = np.asarray(payloads)
    nb = packing.packed_size(int(n), fmt)
    if payloads.dtype != np.uint8 or payloads.ndim != 2:
        raise ValueError(f"payloads: expected a 2-D uint8 array (workers, bytes), got "
                         f"{payloads.dtype} {payloads.shape}")
    if payloads.shape[1] != nb:
        raise ValueError(f"payloads: {payloads.shape[1]} bytes per worker for {n} elements in {fmt}, "
                         f"expected {nb}")
    return np.ascontiguousarray(payloads), nb


def _raise_invalid(payloads, n: int, fmt: str, bad_w: np.ndarray, bad_j: np.ndarray) -> None:
    """ValueError for the lowest worker with an invalid byte or non-zero pad codes, like
    `packing.check_payload` run on worker 0, 1, ... (invalid bytes before pad codes per worker)."""
    nw, nb = payloads.shape
    hit = bad_w >= 0
    w_bad = int(bad_w[hit].min()) if hit.any() else nw
    k = packing.CODES_PER_BYTE[fmt]
    w_pad = nw
    if nb * k > n and nw:
        codes, valid = packing.LUT[fmt]
        last = payloads[:, -1]
        pad = (codes[last][:, n - (nb - 1) * k:] != 0).any(axis=1) & valid[last]
        if pad.any():
            w_pad = int(np.argmax(pad))
    if w_bad < nw and w_bad <= w_pad:
        j = int(bad_j[hit & (bad_w == w_bad)].min())
        kind = "code 0b11" if fmt == "2bit" else "byte > 242"
        raise ValueError(f"payload of worker {w_bad}: invalid {kind} at byte {j} "
                         f"(0x{int(payloads[w_bad, j]):02x})")
    if w_pad < nw:
        raise ValueError(f"payload of worker {w_pad}: non-zero pad codes after element {n} "
                         f"at byte {nb - 1} (0x{int(payloads[w_pad, -1]):02x})")


def _is_uniform(scalers: np.ndarray, nw: int) -> bool:
    """True when the reference's float64 sum is exactly f64(Σ codes) * s for one shared s.

    With s finite, > 0 and at most 24 significant bits (a float32 value), every partial sum of the
    reference is j*s for an integer |j| <= nw, exactly representable (<= 24 + 16 bits), so no
    addition rounds. (s <= 0 or inf/NaN would differ in signed zeros or NaNs.)
    """
    if nw == 0 or nw > 32767:
        return False
    s = scalers[0]
    if not (np.isfinite(s) and s > 0.0 and s <= np.finfo(np.float32).max):
        return False
    if np.float64(np.float32(s)) != s:
        return False
    return bool((scalers == s).all())


WEIGHTED_SUM_INTO_OUT = True     # weighted_sum takes out= (the pipelined all-gather writes in place)


def weighted_sum(payloads: np.ndarray, scalers: np.ndarray, n: int, fmt: str, divide_by: int,
                 *, out: np.ndarray | None = None) -> np.ndarray:
    """float32[n] equal to packing.weighted_sum(...), validating every byte in the same pass.

    One parallel pass over the payloads; per element either (one shared scaler) a count of codes
    mapped to its float32 result, or (any scalers) a base-3 index of the first 8 workers' codes into
    a table of the reference's exact partial sums, then the remaining workers in float64.
    out: optional preallocated C-contiguous float32[n] to write into (and return); saves the page
    faults of a fresh result array.
    """
    payloads, nb = _check_payloads(payloads, n, fmt)
    n = int(n)
    nw = payloads.shape[0]
    scalers = np.asarray(scalers)
    if scalers.shape != (nw,):
        raise ValueError(f"scalers: expected shape ({nw},), got {scalers.shape}")
    scalers = scalers.astype(np.float64)      # xp.float64(scalers[i]) of the reference
    inv = np.float64(1.0 / divide_by)
    if out is None:
        out = np.empty(n, dtype=np.float32)
    elif out.dtype != np.float32 or out.shape != (n,) or not out.flags.c_contiguous:
        raise ValueError(f"out: expected a C-contiguous float32 array of shape ({n},)")
    nch = -(-nb // _DEC_CHUNK)
    bad_w = np.full(nch, -1, dtype=np.int64)
    bad_j = np.full(nch, -1, dtype=np.int64)
    k = np.int64(packing.CODES_PER_BYTE[fmt])
    if nb == 0:
        pass
    elif nw == 0:
        out[:] = np.float32(0.0 * inv)
    elif _is_uniform(scalers, nw):
        kern = _wsum_uniform_serial if _serial_decode(payloads) else _wsum_uniform_kernel
        kern(payloads, np.int64(n), k, scalers[0], inv, out, bad_w, bad_j, _count_dtype(nw))
    else:
        nt = min(nw, _TABLE_WORKERS)
        table = _partial_sums(scalers, nt)
        with np.errstate(all="ignore"):
            f = (table * inv).astype(np.float32)
        # An invalid byte decodes to a field value 3 (and raises after the pass); pad the tables so
        # that its index, up to Σ_w 3 * 3^w, still reads inside them.
        pad = 3 * (3 ** nt - 1) // 2 + 1 - table.size
        table = np.concatenate([table, np.zeros(pad)])
        f = np.concatenate([f, np.zeros(pad, dtype=np.float32)])
        mults = (3 ** np.arange(nt)).astype(np.uint16)
        kern = _wsum_table_serial if _serial_decode(payloads) else _wsum_table_kernel
        kern(payloads, scalers, np.int64(n), k, mults, table, f, inv, out, bad_w, bad_j)
    _raise_invalid(payloads, n, fmt, bad_w, bad_j)
    return out


def scaled_code_sum(payloads: np.ndarray, n: int, fmt: str, scaler, divide_by: int) -> np.ndarray:
    """float32[n] = f32((f64(Σ_w codes_w) * f64(scaler)) * f64(1/divide_by)) for any scaler: what
    sum_codes followed by packing.scale_integer_sum gives (the shared-scaler mean of the parameter
    server), in one pass without the integer sums and their float64 temporaries. Validates every
    byte like sum_codes. At most 32767 workers (the code counts are uint8/uint16)."""
    payloads, nb = _check_payloads(payloads, n, fmt)
    n = int(n)
    nw = payloads.shape[0]
    if nw > 32767:
        raise ValueError(f"scaled_code_sum: {nw} workers, at most 32767")
    out = np.empty(n, dtype=np.float32)
    nch = -(-nb // _DEC_CHUNK)
    bad_w = np.full(nch, -1, dtype=np.int64)
    bad_j = np.full(nch, -1, dtype=np.int64)
    s = np.float64(scaler)
    inv = np.float64(1.0 / divide_by)
    if nb:
        if nw == 0:
            out[:] = np.float32((np.float64(0.0) * s) * inv)
        else:
            kern = _wsum_uniform_serial if _serial_decode(payloads) else _wsum_uniform_kernel
            kern(payloads, np.int64(n), np.int64(packing.CODES_PER_BYTE[fmt]), s, inv, out, bad_w, bad_j,
                 _count_dtype(nw))
    _raise_invalid(payloads, n, fmt, bad_w, bad_j)
    return out


def sum_codes(payloads: np.ndarray, n: int, fmt: str, dtype=None) -> np.ndarray:
    """Σ_w codes_w as integers (equals packing.sum_codes), validating every byte in the same pass."""
    payloads, nb = _check_payloads(payloads, n, fmt)
    n = int(n)
    nw = payloads.shape[0]
    if dtype is None:
        dtype = np.int8 if nw <= 127 else (np.int16 if nw <= 32767 else np.int32)
    out = np.empty(n, dtype=dtype)
    nch = -(-nb // _DEC_CHUNK)
    bad_w = np.full(nch, -1, dtype=np.int64)
    bad_j = np.full(nch, -1, dtype=np.int64)
    if nb:
        if nw == 0:
            out[:] = 0
        else:
            kern = _isum_serial if _serial_decode(payloads) else _isum_kernel
            kern(payloads, np.int64(n), np.int64(packing.CODES_PER_BYTE[fmt]), out, bad_w, bad_j,
                 _count_dtype(nw))
    _raise_invalid(payloads, n, fmt, bad_w, bad_j)
    return out
