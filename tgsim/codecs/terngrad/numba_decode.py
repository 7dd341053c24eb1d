"""Numba decode-and-sum of packed ternary payloads (weighted_sum, scaled_code_sum, sum_codes),
bit-identical to `tgsim.codecs.packing`'s array reference; see `tgsim.codecs.terngrad.numba_kernels`."""

from __future__ import annotations

import numpy as np
from numba import literally, njit, prange

from tgsim.codecs import packing
from tgsim.codecs.terngrad import numba_common as nc
from tgsim.codecs.terngrad.numba_common import _check_fmt, _threads

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


@njit(inline="always")
def _fields(v, k):
    """(the k field values of byte v, padded to five with 0; its invalid flag): k = 4, the 2-bit
    fields code + 1 (bits 2m..2m+1); k = 5, the base-3 digits code + 1. k is a literal at every
    call, so the branch and the callers' loops over m are resolved when compiling."""
    if k == 4:
        return (np.uint32(v & _U8_3), np.uint32((v >> _U8_2) & _U8_3), np.uint32((v >> _U8_4) & _U8_3),
                np.uint32(v >> _U8_6), np.uint32(0)), _bad2(v)
    return _trits(v), _bad3(v)


@njit(cache=True)
def _count(c, p, k):
    """c[m, j] += field m of byte p[j] (code + 1). Returns non-zero on invalid bytes."""
    literally(k)
    bad = np.uint8(0)
    for j in range(p.size):
        f, b = _fields(p[j], k)
        bad = np.uint8(bad | b)
        for m in range(k):
            c[m, j] += f[m]
    return bad


@njit(cache=True)
def _index(c, p, mult, k):
    """c[m, j] += (field m of p[j]) * mult (uint16 table index). Returns non-zero on invalid bytes."""
    literally(k)
    bad = np.uint8(0)
    for j in range(p.size):
        f, b = _fields(p[j], k)
        bad = np.uint8(bad | b)
        for m in range(k):
            c[m, j] += np.uint16(f[m]) * mult
    return bad


@njit(cache=True)
def _acc(a, p, s, k):
    """a[m, j] += f64(code m of p[j]) * s: the reference's float64 step for one more worker."""
    literally(k)
    bad = np.uint8(0)
    for j in range(p.size):
        f, b = _fields(p[j], k)
        bad = np.uint8(bad | b)
        for m in range(k):
            a[m, j] += np.float64(np.int32(f[m]) - np.int32(1)) * s
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
        bad = _count(c, p, 4) if k == 4 else _count(c, p, 5)
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
        bad = _index(c, p, mults[w], 4) if k == 4 else _index(c, p, mults[w], 5)
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
            bad = _acc(a, p, scalers[w], 4) if k == 4 else _acc(a, p, scalers[w], 5)
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
    return payloads.size < nc.SERIAL_DECODE or _threads() == 1


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
    """float32[n] equal to packing.weighted_sum(payloads, scalers, n, fmt, divide_by), validating every
    byte in the same pass.

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
    """float32[n] = f32((f64(Σ_w codes_w) * f64(scaler)) * f64(1/divide_by)) of the packed `payloads`
    (W, nbytes) in packing `fmt`, for any scaler: what sum_codes followed by packing.scale_integer_sum
    gives (the shared-scaler mean of the parameter server), in one pass without the integer sums and
    their float64 temporaries. Validates every byte like sum_codes. At most 32767 workers (the code
    counts are uint8/uint16)."""
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
    """Σ_w codes_w as integers of `dtype` (default: the smallest that holds W), (n,), from the packed
    `payloads` (W, nbytes) in packing `fmt` (equals packing.sum_codes), validating every byte in the
    same pass."""
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
