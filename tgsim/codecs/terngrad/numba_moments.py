"""Numba moments of TernGrad layers (absmax, σ, finiteness), bit-identical to
`tgsim.codecs.terngrad.moments.layer_moments`; see `tgsim.codecs.terngrad.numba_kernels` for the
order of operations."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from tgsim.codecs.terngrad.moments import LANES, LayerMoments
from tgsim.codecs.terngrad import numba_common as nc
from tgsim.codecs.terngrad.numba_common import _NO_ERRSTATE, _as_f32_flat, _as_f32_rows, _threads

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
# Smallest layer that takes the folded σ pass (_sigma_small): below it the pass's fixed cost per
# call (16 row views) outweighs the lane partials it saves (docs/MEASUREMENTS.md). The bits are the
# same either way.
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


_MID_BLOCK = 1024       # lanes per group and block of the mid-size σ pass (_sigma_mid: 128 KiB of partials)
# Layers of LANES < n <= _MID_MAX take the mid-size σ pass; longer ones amortize the LANES lane
# partials and their tree over their rows (_lanes_range). The bits are the same either way.
_MID_MAX = 4 * LANES


@njit(cache=True)
def _lane_first(ga, ba, k, s1, s2):
    """A lane partial's first row: s = 0.0 + d (the first addition to a +0.0 partial, without
    reading it). Returns the largest |g| bit pattern."""
    m = np.uint32(0)
    for j in range(ga.size):
        da = np.float64(ga[j]) - k
        s1[j] = 0.0 + da
        s2[j] = 0.0 + da * da
        va = ba[j] & _ABS
        if va > m:
            m = va
    return m


@njit(cache=True)
def _sigma_mid(g, bits, s1, s2):
    """(S1, S2, absmax bits) of a layer of n > LANES elements in the documented order, the top
    three tree levels folded in: in blocks of _MID_BLOCK j's, the lane partials of lanes j + q H
    (H = LANES/8, q = 0..7; 0.0 + d_x + d_(x+LANES) + ... in row order, as _lanes_range) are summed
    into L1/L2-resident scratch, then paired as the tree pairs them, ((p0 + p4) + (p2 + p6)) +
    ((p1 + p5) + (p3 + p7)), into s1[j], s2[j]; the other levels run on H lanes (_lane_tree). Row 0
    is full (n > LANES), so every lane holds an element. s1/s2: scratch of >= H float64."""
    n = g.size
    hb = LANES // 8
    rows = (n + LANES - 1) // LANES
    k = np.float64(g[0])
    m = np.uint32(0)
    B = _MID_BLOCK
    p1 = np.empty(8 * B, dtype=np.float64)
    p2 = np.empty(8 * B, dtype=np.float64)
    for j0 in range(0, hb, B):
        for q in range(8):
            a1 = p1[q * B:(q + 1) * B]
            a2 = p2[q * B:(q + 1) * B]
            l0 = q * hb + j0
            mr = _lane_first(g[l0:l0 + B], bits[l0:l0 + B], k, a1, a2)
            if mr > m:
                m = mr
            for r in range(1, rows):
                e0 = r * LANES + l0
                if e0 >= n:
                    break
                e1 = min(e0 + B, n)
                mr = _lane_one(g[e0:e1], bits[e0:e1], k, a1, a2)
                if mr > m:
                    m = mr
        t1 = s1[j0:j0 + B]
        t2 = s2[j0:j0 + B]
        for j in range(B):
            t1[j] = ((p1[j] + p1[4 * B + j]) + (p1[2 * B + j] + p1[6 * B + j])) + \
                ((p1[B + j] + p1[5 * B + j]) + (p1[3 * B + j] + p1[7 * B + j]))
            t2[j] = ((p2[j] + p2[4 * B + j]) + (p2[2 * B + j] + p2[6 * B + j])) + \
                ((p2[B + j] + p2[5 * B + j]) + (p2[3 * B + j] + p2[7 * B + j]))
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
    if LANES < n <= _MID_MAX:
        a, b, m = _sigma_mid(g, bits, s1, s2)
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



def serial_moments(nw: int, n: int, need_sigma: bool, threads: int | None = None) -> bool:
    """Whether moments_many of W = nw rows of n elements runs serially on the calling thread: W n
    below SERIAL_MOMENTS (SERIAL_ABSMAX without σ), or for the folded σ pass (_FOLD_MIN <= n <=
    LANES) below SERIAL_FOLD or one worker; always with one Numba thread (`threads`: the caller's
    numba.get_num_threads(), read here when None)."""
    if (_threads() if threads is None else threads) == 1:
        return True
    if need_sigma and _FOLD_MIN <= n <= LANES:   # the folded pass is ~2x cheaper per element
        return nw * n < nc.SERIAL_FOLD or nw == 1
    return nw * n < (nc.SERIAL_MOMENTS if need_sigma else nc.SERIAL_ABSMAX)


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
    serial = serial_moments(nw, n, need_sigma)
    if need_sigma:
        sums = np.empty((nw, 2), dtype=np.float64)
        fold = _FOLD_MIN <= n <= LANES
        if serial:
            _sigma_serial(G, bits, sums, mb)
        elif fold or nw >= nc._WORKER_TASKS * _threads():
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


