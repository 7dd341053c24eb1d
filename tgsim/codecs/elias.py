"""Elias-gamma coded QSGD levels: one layer's bit stream, as array code (NumPy/CuPy) and in Numba.

Element i, with level l_i in [0, s] and sign bit n_i (1 = negative, written only when l_i > 0), is

    gamma(l_i + 1)  [n_i if l_i > 0]

where gamma(x) for x >= 1, N = floor(log2 x), is N zero bits followed by x in N + 1 bits, most
significant first (that bit is the 1 which ends the zero run). Elements follow each other without
gaps, bits fill bytes most significant bit first, and the stream is padded with zero bits to a whole
byte. Element i takes 2 N_i + 1 + [l_i > 0] bits: 1 bit for level 0, 3 for level 1, at most
`max_code_bits(s)` = 2 floor(log2(s + 1)) + 2.

Decoding refuses (PayloadError, naming the element and the bit where its code starts):
a zero run longer than floor(log2(s + 1)) (no level <= s has one), a level above s, a stream that
ends inside an element's code or before the n-th element, bits left after the n-th element, and
non-zero padding bits.

Two implementations of one function each, bit for bit and error for error:
    encode_array / decode_array    array code (NumPy or CuPy): the reference; decode_array finds the
                                   code boundaries by pointer doubling (log2 n gathers over the bits)
    encode / decode                Numba (@njit(cache=True)), serial, on the host: what the codec runs
The codec runs the Numba versions, the array code being the reference they are tested against
(timings: docs/MEASUREMENTS.md).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tgsim.backend import array_module, to_numpy
from tgsim.errors import PayloadError

OK, BAD_RUN, BIG_LEVEL, TRUNCATED, EXTRA_BITS = 0, 1, 2, 3, 4


def max_run(s: int) -> int:
    """floor(log2(s + 1)): the longest zero run of a code of a level in [0, s]."""
    return int(s + 1).bit_length() - 1


def max_code_bits(s: int) -> int:
    """The longest code of a level in [0, s], sign bit included: 2 floor(log2(s + 1)) + 2 (1 if s = 0)."""
    return 2 * max_run(s) + 2 if s > 0 else 1


def code_bits(q):
    """Bits of every element's code (int64, NumPy or CuPy like q): 2 floor(log2(|q| + 1)) + 1 + [q != 0]."""
    xp = array_module(q)
    x = xp.abs(q.astype(xp.int64)) + 1
    run = xp.zeros(x.shape, dtype=xp.int64)
    j = 1
    while True:
        ge = x >= (1 << j)
        if not bool(ge.any()):
            break
        run += ge
        j += 1
    return 2 * run + 1 + (x > 1)


def _error(status: int, k: int, pos: int, n: int, nbits: int, s: int, what: str) -> PayloadError:
    if status == BAD_RUN:
        why = f"element {k}: Elias-gamma code at bit {pos} starts with more than {max_run(s)} zeros (levels <= {s})"
    elif status == BIG_LEVEL:
        why = f"element {k}: Elias-gamma code at bit {pos} gives a level above s = {s}"
    elif status == TRUNCATED:
        why = f"element {k} of {n}: the {nbits}-bit stream ends inside its code (which starts at bit {pos})"
    else:
        why = f"{nbits - pos} bits left after the last of {n} elements (which ends at bit {pos})"
    return PayloadError(f"{what}: {why}")


def check_padding(buf, nbits: int, what: str) -> None:
    """PayloadError (naming `what`) unless `buf` holds exactly ceil(nbits / 8) bytes whose bits after
    bit `nbits` are 0: the framing of every bit stream of tgsim's variable-length codes."""
    nbytes = -(-nbits // 8)
    if int(buf.size) != nbytes:
        raise PayloadError(f"{what}: {int(buf.size)} payload bytes for {nbits} bits (needs {nbytes})")
    if nbits % 8 and int(buf[nbytes - 1]) & ((1 << (8 - nbits % 8)) - 1):
        raise PayloadError(f"{what}: non-zero padding bits after bit {nbits}")


# -- array code (NumPy or CuPy) ------------------------------------------------------------------

def encode_array(q):
    """(payload uint8, nbits) of the signed levels q (any signed integer dtype, NumPy or CuPy)."""
    xp = array_module(q)
    q = q.reshape(-1)
    n = int(q.size)
    x = xp.abs(q.astype(xp.int64)) + 1
    length = code_bits(q)
    run = (length - 1 - (x > 1)) // 2
    end = xp.cumsum(length)
    nbits = int(end[-1]) if n else 0
    off = end - length
    bits = xp.zeros(nbits, dtype=xp.uint8)
    top = int(run.max()) if n else 0
    for j in range(top + 1):                       # bit j of x's N + 1 bits, most significant first
        m = run >= j
        shift = xp.where(m, run - j, 0)
        bits[(off + run + j)[m]] = ((x >> shift) & 1).astype(xp.uint8)[m]
    nz = x > 1
    bits[(off + 2 * run + 1)[nz]] = (q < 0)[nz].astype(xp.uint8)
    return xp.packbits(bits), nbits


def decode_array(buf, nbits: int, n: int, s: int, what: str = "Elias-gamma payload"):
    """The n signed levels (int32) of the stream `buf` (uint8, NumPy or CuPy) of `nbits` bits, coded for
    s levels; PayloadError naming `what` on a malformed stream.

    Every bit position p gets the code that would start there (its length, level, status); the
    starts are then the chain 0, next(0), next(next(0)), ..., found by pointer doubling: with S the
    first m starts and J the position m codes on, S <- S ++ J[S], J <- J[J].
    """
    xp = array_module(buf)
    check_padding(buf, nbits, what)
    if n == 0:
        if nbits:
            raise _error(EXTRA_BITS, 0, 0, 0, nbits, s, what)
        return xp.zeros(0, dtype=xp.int32)
    R = max_run(s)
    pad = 2 * R + 2
    bits = xp.zeros(nbits + pad, dtype=xp.int64)
    bits[:nbits] = xp.unpackbits(buf)[:nbits]
    inside = xp.zeros(nbits + pad, dtype=bool)
    inside[:nbits] = True
    p = xp.arange(nbits + 1, dtype=xp.int64)           # position nbits: the end (a sink)
    # the zero run: e = first j in [0, R] whose bit is 1 or beyond the stream; R + 1 when none
    e = xp.full(nbits + 1, R + 1, dtype=xp.int64)
    for j in range(R, -1, -1):
        stop = (bits[p + j] == 1) | ~inside[p + j]
        e = xp.where(stop, j, e)
    status = xp.zeros(nbits + 1, dtype=xp.int8)
    status[e == R + 1] = BAD_RUN
    run = xp.minimum(e, R)
    ends_in_run = (e <= R) & ~inside[xp.minimum(p + run, nbits + pad - 1)]
    x = xp.zeros(nbits + 1, dtype=xp.int64)
    for j in range(R + 1):                            # x = bits p+run .. p+2 run
        m = j <= run
        x = xp.where(m, (x << 1) | bits[xp.minimum(p + run + j, nbits + pad - 1)], x)
    length = 2 * run + 1 + (x > 1)
    status[(status == OK) & ends_in_run] = TRUNCATED
    status[(status == OK) & (p + 2 * run + 1 > nbits)] = TRUNCATED
    status[(status == OK) & (x > s + 1)] = BIG_LEVEL
    status[(status == OK) & (p + length > nbits)] = TRUNCATED
    status[nbits] = TRUNCATED                          # a start at the end: the stream ran out
    q_at = xp.where(bits[xp.minimum(p + 2 * run + 1, nbits + pad - 1)] == 1, -(x - 1), x - 1)
    nxt = xp.where(status == OK, xp.minimum(p + length, nbits), nbits)
    starts = xp.zeros(1, dtype=xp.int64)
    jump = nxt
    while int(starts.size) < n:
        starts = xp.concatenate([starts, jump[starts]])
        jump = jump[jump]
    starts = starts[:n]
    st = status[starts]
    bad = xp.nonzero(st != OK)[0]
    if int(bad.size):
        k = int(bad[0])
        raise _error(int(st[k]), k, int(starts[k]), n, nbits, s, what)
    end = int(nxt[starts[-1]])
    if end != nbits:
        raise _error(EXTRA_BITS, n, end, n, nbits, s, what)
    return q_at[starts].astype(xp.int32)


# -- Numba (host) ----------------------------------------------------------------------------------

@njit(cache=True)
def _total_bits(q):
    t = 0
    for i in range(q.size):
        x = abs(np.int64(q[i])) + 1
        run = 0
        while (x >> (run + 1)) > 0:
            run += 1
        t += 2 * run + 1 + (1 if x > 1 else 0)
    return t


@njit(cache=True)
def _encode_kernel(q, out):
    acc = np.uint64(0)
    nacc = 0
    pos = 0
    for i in range(q.size):
        v = np.int64(q[i])
        x = abs(v) + 1
        run = 0
        while (x >> (run + 1)) > 0:
            run += 1
        code = np.uint64(x)
        width = 2 * run + 1
        if x > 1:
            code = (code << np.uint64(1)) | np.uint64(1 if v < 0 else 0)
            width += 1
        acc = (acc << np.uint64(width)) | code
        nacc += width
        while nacc >= 8:
            nacc -= 8
            out[pos] = np.uint8((acc >> np.uint64(nacc)) & np.uint64(0xFF))
            pos += 1
        acc &= (np.uint64(1) << np.uint64(nacc)) - np.uint64(1)
    if nacc > 0:
        out[pos] = np.uint8((acc << np.uint64(8 - nacc)) & np.uint64(0xFF))


@njit(cache=True)
def _decode_kernel(buf, nbits, s, out):
    """Fills out (int32) and returns (status, element, bit of that element's start)."""
    R = 0
    while ((s + 1) >> (R + 1)) > 0:
        R += 1
    n = out.size
    p = 0
    for k in range(n):
        start = p
        run = 0
        while True:
            if p >= nbits:
                return TRUNCATED, k, start
            if (buf[p >> 3] >> (7 - (p & 7))) & 1:
                break
            run += 1
            p += 1
            if run > R:
                return BAD_RUN, k, start
        if p + run + 1 > nbits:
            return TRUNCATED, k, start
        x = 0
        for _ in range(run + 1):
            x = (x << 1) | ((buf[p >> 3] >> (7 - (p & 7))) & 1)
            p += 1
        if x > s + 1:
            return BIG_LEVEL, k, start
        level = x - 1
        if level > 0:
            if p >= nbits:
                return TRUNCATED, k, start
            if (buf[p >> 3] >> (7 - (p & 7))) & 1:
                level = -level
            p += 1
        out[k] = level
    if p != nbits:
        return EXTRA_BITS, n, p
    return OK, n, p


def encode(q):
    """(payload uint8, nbits) of the signed levels q (NumPy): encode_array's bits, in Numba."""
    q = np.ascontiguousarray(to_numpy(q).reshape(-1))
    nbits = int(_total_bits(q))
    out = np.zeros(-(-nbits // 8), dtype=np.uint8)
    _encode_kernel(q, out)
    return out, nbits


def decode(buf, nbits: int, n: int, s: int, what: str = "Elias-gamma payload") -> np.ndarray:
    """decode_array in Numba: the n signed levels (int32) of the `nbits`-bit stream `buf` coded for s
    levels, or decode_array's PayloadError (naming `what`)."""
    buf = np.ascontiguousarray(to_numpy(buf), dtype=np.uint8).reshape(-1)
    check_padding(buf, nbits, what)
    out = np.empty(n, dtype=np.int32)
    status, k, pos = _decode_kernel(buf, np.int64(nbits), np.int64(s), out)
    if status != OK:
        raise _error(int(status), int(k), int(pos), n, nbits, s, what)
    return out
