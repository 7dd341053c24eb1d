"""QSGD's own coding of the levels (Alistarh et al. 2017, §3.2 "Efficient coding", Theorem 3.2):
the gaps between nonzero levels, and each nonzero's sign and level, in Elias recursive (omega) codes.

Elias omega code of an integer k >= 1 (the paper's "Elias(k)"): a 0 bit ends the code; for k > 1,
k's binary digits go in front of it, then, while the length L of the digits just written is > 2
bits, L - 1 is written in front of those in the same way:

    omega(1) = 0,  omega(2) = 10 0,  omega(3) = 11 0,  omega(4) = 10 100 0,  omega(17) = 10 100 10001 0

|omega(k)| = 1 + Σ_j (floor(log2 k_j) + 1) over the chain k_0 = k, k_{j+1} = floor(log2 k_j) while
k_j > 1: about log2 k + log2 log2 k + ... + 1 bits, (1 + o(1)) log2 k + 1. Decoding starts with N = 1
and reads a bit: 0 ends the code with value N; a 1 is the first of N + 1 bits, which become the
new N.

The stream of one layer (flattened, C order) with signed levels q_i in [-s, s]: for each nonzero,
in index order i_1 < i_2 < ... < i_m,

    omega(g_j)  sign_j  omega(|q_{i_j}|)        g_1 = i_1 + 1, g_j = i_j - i_{j-1}; sign_j = 1 for
                                                q < 0 (zeros are not sent: they are the gaps)

with no terminator: the stream's bit length (sent before it) ends it; m = 0 is the empty stream.
Bits fill bytes most significant first and the last byte is zero-padded. The paper's message is
this stream plus one 32-bit float norm (per bucket here); Theorem 3.2 bounds its expected length,
for one l2-normed vector of d elements and s levels, by

    (3 + 1.5 log2(2 (s^2 + d) / (s (s + sqrt d)))) s (s + sqrt d) + 32 bits

(`theorem_3_2_bits`). Gaps run over the whole layer, across bucket boundaries.

Decoding refuses (PayloadError naming the nonzero, its element and the bit where its code starts):
a gap code whose value exceeds the layer's n elements, a nonzero at or beyond element n, a level
code whose value exceeds s, a stream that ends inside a nonzero's code, non-zero padding bits, a
byte count that does not fit the bit length.

Two implementations, bit for bit and error for error:
    encode_array / decode_array    array code (NumPy or CuPy): the reference; decode_array decodes a
                                   code at every bit position, then follows the chain of codes from
                                   bit 0 by pointer doubling
    encode / decode                Numba (@njit(cache=True)), serial, on the host: what the codec runs
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from tgsim.backend import array_module, to_numpy
from tgsim.codecs.elias import check_padding
from tgsim.errors import PayloadError

OK, GAP_BIG, BEYOND, LEVEL_BIG, TRUNCATED = 0, 1, 2, 3, 4
_GROUPS = 6                 # omega groups of a value < 2^63 (at most 5) plus one


def omega_bits(k: int) -> int:
    """|omega(k)| for an integer k >= 1."""
    bits = 1
    while k > 1:
        L = int(k).bit_length()
        bits += L
        k = L - 1
    return bits


def max_bits(n: int, s: int) -> int:
    """An upper bound on the stream of n elements with levels <= s: every element nonzero, each at
    the longest gap code (gap <= n) and level code (<= s): n (|omega(n)| + 1 + |omega(s)|)."""
    return n * (omega_bits(max(n, 1)) + 1 + omega_bits(max(s, 1))) if n else 0


def theorem_3_2_bits(d: int, s: int) -> float:
    """Alistarh et al. 2017, Theorem 3.2: the bound on the expected bits of one coded vector (the
    stream plus a 32-bit norm) of d elements at s levels with l2 norm:
    (3 + 1.5 log2(2 (s^2 + d) / (s (s + sqrt d)))) s (s + sqrt d) + 32."""
    m = s * (s + math.sqrt(d))
    return (3 + 1.5 * math.log2(2 * (s * s + d) / m)) * m + 32


def _error(status: int, k: int, pos: int, elem: int, n: int, nbits: int, s: int, what: str) -> PayloadError:
    if status == GAP_BIG:
        why = f"nonzero {k}: the gap code at bit {pos} gives a gap above the layer's {n} elements"
    elif status == BEYOND:
        why = f"nonzero {k} (code at bit {pos}) lands on element {elem}, beyond the layer's {n} elements"
    elif status == LEVEL_BIG:
        why = f"nonzero {k} (code at bit {pos}, element {elem}): its level code gives a level above s = {s}"
    else:
        why = f"nonzero {k}: the {nbits}-bit stream ends inside its code (which starts at bit {pos})"
    return PayloadError(f"{what}: {why}")


# -- array code (NumPy or CuPy) ------------------------------------------------------------------

def _omega_fields(k):
    """(values, widths), each (m, _GROUPS + 1) int64: the groups of omega(k) in stream order, then
    the closing 0 bit (width 1); unused slots come first with width 0."""
    xp = array_module(k)
    m = int(k.size)
    vals = xp.zeros((m, _GROUPS + 1), dtype=xp.int64)
    widths = xp.zeros((m, _GROUPS + 1), dtype=xp.int64)
    widths[:, _GROUPS] = 1
    cur = k.astype(xp.int64)
    for j in range(_GROUPS - 1, -1, -1):           # the last group written is the first in the code
        live = cur > 1
        L = xp.zeros(m, dtype=xp.int64)
        t = cur.copy()
        while bool((t > 0).any()):
            L += t > 0
            t >>= 1
        vals[:, j] = xp.where(live, cur, 0)
        widths[:, j] = xp.where(live, L, 0)
        cur = xp.where(live, L - 1, 1)
    return vals, widths


def encode_array(q):
    """(payload uint8, nbits) of the signed levels q (any signed integer dtype, NumPy or CuPy)."""
    xp = array_module(q)
    q = q.reshape(-1).astype(xp.int64)
    idx = xp.nonzero(q)[0].astype(xp.int64)
    m = int(idx.size)
    if m == 0:
        return xp.zeros(0, dtype=xp.uint8), 0
    gaps = idx - xp.concatenate([xp.full(1, -1, dtype=xp.int64), idx[:-1]])
    gv, gw = _omega_fields(gaps)
    lv, lw = _omega_fields(xp.abs(q[idx]))
    sign = (q[idx] < 0).astype(xp.int64)[:, None]
    vals = xp.concatenate([gv, sign, lv], axis=1).reshape(-1)
    widths = xp.concatenate([gw, xp.ones((m, 1), dtype=xp.int64), lw], axis=1).reshape(-1)
    end = xp.cumsum(widths)
    nbits = int(end[-1])
    off = end - widths
    bits = xp.zeros(nbits, dtype=xp.uint8)
    for j in range(int(widths.max())):             # bit j of each field, most significant first
        has = widths > j
        shift = xp.where(has, widths - 1 - j, 0)
        bits[(off + j)[has]] = ((vals >> shift) & 1).astype(xp.uint8)[has]
    return xp.packbits(bits), nbits


def _omega_at(window, start, nbits: int, maxval: int):
    """Decode an omega code at every bit position `start` (int64 array): (value, end, status) with
    status OK, TRUNCATED, or 1 (the value exceeds maxval). window[p]: bits p..p+63 as uint64."""
    xp = array_module(start)
    N = xp.ones(start.shape, dtype=xp.int64)
    cur = start.copy()
    status = xp.zeros(start.shape, dtype=xp.int8)
    done = xp.zeros(start.shape, dtype=bool)
    for _ in range(_GROUPS + 1):
        live = ~done & (status == OK)
        out = live & (cur >= nbits)
        status[out] = TRUNCATED
        live &= ~out
        w = window[xp.minimum(cur, nbits)]
        zero = live & ((w >> np.uint64(63)) == 0)
        done |= zero
        cur = xp.where(zero, cur + 1, cur)
        one = live & ~zero
        big = one & ((N >= 63) | ((xp.int64(1) << xp.minimum(N, 62)) > maxval))
        status[big] = 1
        one &= ~big
        short = one & (cur + N + 1 > nbits)
        status[short] = TRUNCATED
        one &= ~short
        width = xp.minimum(N + 1, 63)
        newN = (w >> (64 - width).astype(xp.uint64)).astype(xp.int64)
        cur = xp.where(one, cur + N + 1, cur)
        N = xp.where(one, newN, N)
    status[~done & (status == OK)] = 1
    status[(status == OK) & (N > maxval)] = 1
    return N, cur, status


def decode_array(buf, nbits: int, n: int, s: int, what: str = "QSGD paper-coded payload"):
    """The n signed levels (int32) of the stream `buf` (uint8, NumPy or CuPy) of `nbits` bits coded for s
    levels; PayloadError naming `what` on a malformed stream."""
    xp = array_module(buf)
    check_padding(buf, nbits, what)
    q = xp.zeros(n, dtype=xp.int32)
    if nbits == 0:
        return q
    bits = xp.zeros(nbits + 64, dtype=xp.uint64)
    bits[:nbits] = xp.unpackbits(buf)[:nbits]
    window = xp.zeros(nbits + 1, dtype=xp.uint64)
    for j in range(64):
        window |= bits[j:j + nbits + 1] << np.uint64(63 - j)
    p = xp.arange(nbits + 1, dtype=xp.int64)
    gap, c1, st_gap = _omega_at(window, p, nbits, n)
    sign_out = c1 >= nbits
    neg = (window[xp.minimum(c1, nbits)] >> np.uint64(63)) == 1
    level, c2, st_lvl = _omega_at(window, xp.minimum(c1 + 1, nbits), nbits, s)
    st_rest = xp.where(sign_out, TRUNCATED, xp.where(st_lvl == 1, LEVEL_BIG, st_lvl)).astype(xp.int8)
    st_gap = xp.where(st_gap == 1, GAP_BIG, st_gap).astype(xp.int8)
    ok = (st_gap == OK) & (st_rest == OK)
    nxt = xp.where(ok, c2, nbits)
    nxt[nbits] = nbits
    starts = xp.zeros(1, dtype=xp.int64)
    jump = nxt
    while int(starts[-1]) != nbits:               # the chain 0, nxt(0), ... up to the end (a sink)
        starts = xp.concatenate([starts, jump[starts]])
        jump = jump[jump]
    starts = starts[:int(xp.argmax(starts == nbits))]
    gaps = xp.where(st_gap[starts] == OK, gap[starts], 0)
    elem = xp.cumsum(gaps) - 1
    f_gap = st_gap[starts] != OK
    f_pos = ~f_gap & (elem >= n)
    f_rest = st_rest[starts] != OK
    bad = xp.nonzero(f_gap | f_pos | f_rest)[0]
    if int(bad.size):
        k = int(bad[0])
        st = int(st_gap[starts[k]]) if bool(f_gap[k]) else BEYOND if bool(f_pos[k]) else int(st_rest[starts[k]])
        raise _error(st, k, int(starts[k]), int(elem[k]), n, nbits, s, what)
    lv = level[starts]
    q[elem] = xp.where(neg[starts], -lv, lv).astype(xp.int32)
    return q


# -- Numba (host) ----------------------------------------------------------------------------------

@njit(inline="always")
def _omega_len(k):
    bits = 1
    while k > 1:
        L = 0
        t = k
        while t > 0:
            L += 1
            t >>= 1
        bits += L
        k = L - 1
    return bits


@njit(cache=True)
def _total_bits(q):
    t = 0
    prev = -1
    for i in range(q.size):
        v = np.int64(q[i])
        if v != 0:
            t += _omega_len(i - prev) + 1 + _omega_len(abs(v))
            prev = i
    return t


@njit(inline="always")
def _bit_length(k):
    L = 0
    while k > 0:
        L += 1
        k >>= 1
    return L


@njit(inline="always")
def _push(out, acc, nacc, pos, value, width):
    """Appends the `width` (<= 32) low bits of value to the bit accumulator acc (nacc < 8 bits
    pending) and writes its whole bytes to out from byte pos: (acc, nacc, pos)."""
    acc = (acc << np.uint64(width)) | np.uint64(value)
    nacc += width
    while nacc >= 8:
        nacc -= 8
        out[pos] = np.uint8((acc >> np.uint64(nacc)) & np.uint64(0xFF))
        pos += 1
    acc &= (np.uint64(1) << np.uint64(nacc)) - np.uint64(1)
    return acc, nacc, pos


@njit(inline="always")
def _push_omega(out, acc, nacc, pos, k, groups):
    """Appends omega(k); groups: scratch (_GROUPS,) int64 for the groups, written last first."""
    g = 0
    while k > 1:
        groups[g] = k
        g += 1
        k = _bit_length(k) - 1
    for j in range(g - 1, -1, -1):
        v = groups[j]
        L = _bit_length(v)
        if L > 32:
            acc, nacc, pos = _push(out, acc, nacc, pos, v >> 32, L - 32)
            v &= 0xFFFFFFFF
            L = 32
        acc, nacc, pos = _push(out, acc, nacc, pos, v, L)
    return _push(out, acc, nacc, pos, 0, 1)          # the closing 0 bit


@njit(cache=True)
def _encode_kernel(q, out):
    groups = np.empty(_GROUPS, dtype=np.int64)
    acc = np.uint64(0)
    nacc = 0
    pos = 0
    prev = -1
    for i in range(q.size):
        v = np.int64(q[i])
        if v != 0:
            acc, nacc, pos = _push_omega(out, acc, nacc, pos, np.int64(i - prev), groups)
            acc, nacc, pos = _push(out, acc, nacc, pos, 1 if v < 0 else 0, 1)
            acc, nacc, pos = _push_omega(out, acc, nacc, pos, abs(v), groups)
            prev = i
    if nacc > 0:
        out[pos] = np.uint8((acc << np.uint64(8 - nacc)) & np.uint64(0xFF))


@njit(inline="always")
def _get(buf, p):
    return (buf[p >> 3] >> (7 - (p & 7))) & 1


@njit(inline="always")
def _read_omega(buf, p, nbits, maxval):
    """(value, end, status) of the omega code at bit p: status OK, TRUNCATED or 1 (above maxval)."""
    N = np.int64(1)
    while True:
        if p >= nbits:
            return N, p, TRUNCATED
        if _get(buf, p) == 0:
            p += 1
            break
        if N >= 63 or (np.int64(1) << N) > maxval:
            return N, p, 1
        if p + N + 1 > nbits:
            return N, p, TRUNCATED
        v = np.int64(0)
        for _ in range(N + 1):
            v = (v << 1) | _get(buf, p)
            p += 1
        N = v
    if N > maxval:
        return N, p, 1
    return N, p, OK


@njit(cache=True)
def _decode_kernel(buf, nbits, n, s, out):
    """Fills out (int32, zeroed) and returns (status, nonzero, bit of its code, its element)."""
    p = 0
    k = 0
    elem = -1
    while p < nbits:
        start = p
        gap, p, st = _read_omega(buf, p, nbits, n)
        if st != OK:
            return (GAP_BIG if st == 1 else st), k, start, elem
        elem += gap
        if elem >= n:
            return BEYOND, k, start, elem
        if p >= nbits:
            return TRUNCATED, k, start, elem
        neg = _get(buf, p) == 1
        p += 1
        level, p, st = _read_omega(buf, p, nbits, s)
        if st != OK:
            return (LEVEL_BIG if st == 1 else st), k, start, elem
        out[elem] = -level if neg else level
        k += 1
    return OK, k, p, elem


def encode(q):
    """(payload uint8, nbits) of the signed levels q (NumPy): encode_array's bits, in Numba."""
    q = np.ascontiguousarray(to_numpy(q).reshape(-1))
    nbits = int(_total_bits(q))
    out = np.zeros(-(-nbits // 8), dtype=np.uint8)
    _encode_kernel(q, out)
    return out, nbits


def decode(buf, nbits: int, n: int, s: int, what: str = "QSGD paper-coded payload") -> np.ndarray:
    """decode_array in Numba: the n signed levels (int32) of the `nbits`-bit stream `buf` coded for s
    levels, or decode_array's PayloadError (naming `what`)."""
    buf = np.ascontiguousarray(to_numpy(buf), dtype=np.uint8).reshape(-1)
    check_padding(buf, nbits, what)
    out = np.zeros(n, dtype=np.int32)
    status, k, pos, elem = _decode_kernel(buf, np.int64(nbits), np.int64(n), np.int64(s), out)
    if status != OK:
        raise _error(int(status), int(k), int(pos), int(elem), n, nbits, s, what)
    return out


# -- expected length --------------------------------------------------------------------------------

def omega_bits_bound(x: float) -> float:
    """h(x) = 1 + log2 x + 3 log2(1 + log2 x) >= |omega(k)| for every integer k in [x, 2^63), x >= 1:
    |omega| is constant on [2^j, 2^(j+1)) and h increasing, so h(2^j) >= |omega(2^j)| for j < 63
    (tests check each j) suffices. h is concave (a sum of concave functions)."""
    lg = math.log2(x)
    return 1 + lg + 3 * math.log2(1 + lg)


def expected_stream_bits(n: int, mean_sum: float) -> float:
    """A bound on E[nbits] of the stream of n elements whose levels' expected sum E Σ|q_i| is at most
    mean_sum: with M nonzeros (gaps g_j summing to <= n, levels l_j summing to L), nbits <= F(M, L) =
    Σ_j (h(g_j) + 1 + h(l_j)) <= M (h(n / M) + 1 + h(L / M)) (Jensen, h concave); F is the
    perspective of a concave function, so jointly concave, and E F(M, L) <= F(E M, E L); F grows
    with L, and E M <= min(n, E L). Result: max over 0 < m <= min(n, mean_sum) of F(m, mean_sum),
    found by ternary search on the concave F(., mean_sum); 0 when mean_sum = 0."""
    hi = min(float(n), float(mean_sum))
    if hi <= 0:
        return 0.0

    def F(m):
        return m * (omega_bits_bound(n / m) + 1 + omega_bits_bound(mean_sum / m))

    lo = 0.0
    a, b = lo, hi
    for _ in range(200):
        m1, m2 = a + (b - a) / 3, b - (b - a) / 3
        if F(m1) < F(m2):
            a = m1
        else:
            b = m2
    return max(F(hi), F((a + b) / 2))
