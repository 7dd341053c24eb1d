"""Wire packing of ternary codes and lookup-table decoding (array reference, NumPy and CuPy).

2-bit: four codes per byte, element 4j+m in bits 2m..2m+1, value code+1 (00 = -1, 01 = 0,
       10 = +1, as in the public TernGrad code); 0b11 is invalid. Pad codes are 0 (bits 01).
base-3: five trits per byte, byte = Σ_m (code_{5j+m} + 1) 3^m (3^5 = 243 <= 256, 1.6 bits per
       element); bytes > 242 are invalid. Pad trits are 0 (value 1).

Sizes: ceil(n/4) and ceil(n/5) bytes.
"""

from __future__ import annotations

import numpy as np

from tgsim.backend import array_module
from tgsim.errors import PayloadError

FORMATS = ("2bit", "base3")
CODES_PER_BYTE = {"2bit": 4, "base3": 5}
_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def packed_size(n: int, fmt: str) -> int:
    """Bytes of the payload of n ternary codes in packing `fmt`: ceil(n/4) ("2bit"), ceil(n/5) ("base3")."""
    return -(-n // CODES_PER_BYTE[fmt])


def _lut(fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(codes[256, k] int8, valid[256] bool) for one format."""
    k = CODES_PER_BYTE[fmt]
    b = np.arange(256)
    if fmt == "2bit":
        digits = (b[:, None] >> (2 * np.arange(4))) & 3
        valid = (digits != 3).all(axis=1)
    else:
        digits = (b[:, None] // (3 ** np.arange(5))) % 3
        valid = b <= 242
    codes = np.where(valid[:, None], digits - 1, 0).astype(np.int8)
    assert codes.shape == (256, k)
    return codes, valid


LUT = {f: _lut(f) for f in FORMATS}


def pack(codes, fmt: str = "2bit"):
    """uint8 payload (packed_size(n, fmt) bytes) of the n int8 `codes` in {-1, 0, 1} in packing `fmt`."""
    xp = array_module(codes)
    k = CODES_PER_BYTE[fmt]
    n = codes.size
    nb = packed_size(n, fmt)
    v = xp.ones(nb * k, dtype=xp.uint8)
    v[:n] = (codes.reshape(-1) + 1).astype(xp.uint8)
    v = v.reshape(nb, k)
    if fmt == "2bit":
        return (v[:, 0] | (v[:, 1] << 2) | (v[:, 2] << 4) | (v[:, 3] << 6)).astype(xp.uint8)
    return (v * xp.asarray(_POW3)).sum(axis=1, dtype=xp.uint8)


def check_payload(payload, n: int, fmt: str, where: str = "payload", first: int = 0) -> None:
    """ValueError (PayloadError, naming `where`) unless `payload` is exactly the packing in `fmt` of n
    valid codes (pad codes 0). `first`: the element of a longer payload this one starts at (a multiple
    of the codes per byte), for the byte and element numbers in the message."""
    xp = array_module(payload)
    nb = packed_size(n, fmt)
    if payload.dtype != xp.uint8 or payload.ndim != 1:
        raise PayloadError(f"{where}: expected a 1-D uint8 payload, got {payload.dtype} {payload.shape}")
    if payload.size != nb:
        raise PayloadError(f"{where}: {payload.size} bytes for {n} elements in {fmt}, expected {nb}")
    codes, valid = LUT[fmt]
    ok = xp.asarray(valid)[payload]
    if not bool(ok.all()):
        i = int(xp.argmin(ok))
        kind = "code 0b11" if fmt == "2bit" else "byte > 242"
        raise PayloadError(f"{where}: invalid {kind} at byte {i + first // CODES_PER_BYTE[fmt]} "
                         f"(0x{int(payload[i]):02x})")
    k = CODES_PER_BYTE[fmt]
    if nb * k > n:
        tail = xp.asarray(codes)[payload[-1]][n - (nb - 1) * k:]
        if bool((tail != 0).any()):
            raise PayloadError(f"{where}: non-zero pad codes after element {first + n}")


def unpack(payload, n: int, fmt: str = "2bit", validate: bool = True):
    """The n int8 codes of `payload` in packing `fmt`; with `validate` (default) PayloadError on invalid
    codes or a wrong length first."""
    xp = array_module(payload)
    if validate:
        check_payload(payload, n, fmt)
    codes, _ = LUT[fmt]
    return xp.asarray(codes)[payload].reshape(-1)[:n]


def sum_codes(payloads, n: int, fmt: str = "2bit", dtype=None):
    """Σ_w codes_w as integers (n,), straight from the packed payloads (LUT per byte, no float decode).

    payloads: uint8 array (W, nbytes) in packing `fmt`, n codes each. dtype defaults to int8 for
    W <= 127, else int16/int32.
    """
    xp = array_module(payloads)
    w = payloads.shape[0]
    if dtype is None:
        dtype = xp.int8 if w <= 127 else (xp.int16 if w <= 32767 else xp.int32)
    lut = xp.asarray(LUT[fmt][0]).astype(dtype)
    acc = xp.zeros(payloads.shape[1] * CODES_PER_BYTE[fmt], dtype=dtype)
    for i in range(w):
        acc += lut[payloads[i]].reshape(-1)
    return acc[:n]


def weighted_sum(payloads, scalers, n: int, fmt: str = "2bit", divide_by: int = 1):
    """float32 (n,) of (Σ_w s_w codes_w) / divide_by, from the packed `payloads` (W, nbytes) in packing
    `fmt` and the W `scalers` s_w.

    Order (every path): acc = Σ_w f64(s_w) * code_w, ascending w, in float64; out = f32(acc * (1/divide_by)).
    With one shared scaler the sum is exact, so it equals f32(f64(s) * Σ_w code_w * (1/divide_by)).
    """
    xp = array_module(payloads)
    lut = xp.asarray(LUT[fmt][0]).astype(xp.float64)
    acc = xp.zeros(payloads.shape[1] * CODES_PER_BYTE[fmt], dtype=xp.float64)
    for i in range(payloads.shape[0]):
        acc += lut[payloads[i]].reshape(-1) * xp.float64(scalers[i])
    return (acc[:n] * xp.float64(1.0 / divide_by)).astype(xp.float32)


def uint_width(workers: int) -> int:
    """Bits per element of an aggregate of N = `workers` ternary codes: ceil(log2(2N+1))."""
    return max(1, int(2 * workers).bit_length())


def pack_uint(values, width: int):
    """The bytes (uint8, ceil(n·width/8)) of `values`, non-negative integers < 2^width, at `width` bits
    each, little-endian bit order; ValueError when a value does not fit.

    NumPy arrays with width <= 8 (N <= 127 workers) take the Numba kernel; the bits are the same.
    """
    xp = array_module(values)
    v = values.reshape(-1).astype(xp.uint32)
    if v.size and int(v.max()) >> width:
        raise ValueError(f"value {int(v.max())} does not fit in {width} bits")
    if xp is np and width <= 8:
        from tgsim.codecs import _numba_uint

        return _numba_uint.pack_uint(v, width)
    return pack_uint_reference(v, width)


def pack_uint_reference(values, width: int):
    """pack_uint of `values` at `width` bits in array operations (the reference the Numba kernel is
    tested against): uint8 bytes."""
    xp = array_module(values)
    v = values.reshape(-1).astype(xp.uint32)
    bits = ((v[:, None] >> xp.arange(width, dtype=xp.uint32)) & xp.uint32(1)).astype(xp.uint8)
    return xp.packbits(bits.reshape(-1), bitorder="little")


def unpack_uint(payload, n: int, width: int):
    """The n uint32 values of `width` bits in `payload` (pack_uint undone; PayloadError on a wrong length)."""
    xp = array_module(payload)
    if payload.size != -(-n * width // 8):
        raise PayloadError(f"{payload.size} bytes cannot hold {n} values of {width} bits")
    if xp is np and width <= 8:
        from tgsim.codecs import _numba_uint

        return _numba_uint.unpack_uint(payload, n, width)
    return unpack_uint_reference(payload, n, width)


def unpack_uint_reference(payload, n: int, width: int):
    """unpack_uint of the n values of `width` bits in `payload`, in array operations (the reference)."""
    xp = array_module(payload)
    # no `count=`: cupy.unpackbits has no such argument (NumPy and CuPy both accept `bitorder`);
    # the payload holds exactly ceil(n * width / 8) bytes, so slicing drops only the pad bits.
    bits = xp.unpackbits(payload, bitorder="little")[: n * width].reshape(n, width)
    return (bits.astype(xp.uint32) << xp.arange(width, dtype=xp.uint32)).sum(axis=1, dtype=xp.uint32)


def pack_code_sums(intsum, n: int, width: int):
    """The parameter server's downlink codes: pack_uint(intsum + n, width) of N = n workers' code sums
    `intsum` in [-n, n] (ValueError if one does not fit). NumPy with width <= 8: one Numba pass, same bits."""
    xp = array_module(intsum)
    if xp is np and width <= 8:
        from tgsim.codecs import _numba_uint

        return _numba_uint.pack_offset(intsum, n, width)
    return pack_uint((intsum.astype(xp.int32) + n).astype(xp.uint32), width)


def unpack_code_sums(payload, count: int, width: int, n: int, scaler: float, out=None, name: str = ""):
    """Inverse of pack_code_sums, scaled: float32 scale_integer_sum(Σ codes, scaler, n) of the `count`
    elements of `width` bits in `payload`; ValueError (naming layer `name`) if a packed value lies
    beyond 2n, i.e. a code sum beyond N. `out`: a contiguous float32 array of `count` elements to write
    into. NumPy with width <= 8: one Numba pass."""
    xp = array_module(payload)
    if xp is np and width <= 8:
        from tgsim.codecs import _numba_uint

        flat, top = _numba_uint.decode_scaled(payload, count, width, n, scaler, n, out=out)
    else:
        raw = unpack_uint(payload, count, width)
        top = int(raw.max()) if count else 0
        flat = scale_integer_sum(raw.astype(xp.int32) - n, scaler, n)
        if out is not None:
            out[...] = flat
            flat = out
    if top > 2 * n:
        raise PayloadError(f"layer {name!r}: downlink code sum {top - n} exceeds N = {n}")
    return flat


def pack_code_sums_segments(sums: np.ndarray, n: int, width: int, out: np.ndarray, elem_at: np.ndarray,
                            sizes: np.ndarray, out_at: np.ndarray) -> None:
    """pack_code_sums of many layers in one Numba pass (NumPy, width <= 8): layer s's code sums
    sums[elem_at[s]:elem_at[s] + sizes[s]] (int8 or int16) packed into out[out_at[s]:], the bytes of
    pack_code_sums of that slice. ValueError if a value does not fit."""
    from tgsim.codecs import _numba_uint

    _numba_uint.pack_offset_segments(sums, elem_at, sizes, n, width, out, out_at)


def unpack_code_sums_segments(payload: np.ndarray, at: np.ndarray, sizes: np.ndarray, width: int, n: int,
                              scalers: np.ndarray, out: np.ndarray, out_at: np.ndarray) -> np.ndarray:
    """unpack_code_sums of many layers in one Numba pass (NumPy, width <= 8): layer s's sizes[s]
    values packed at payload[at[s]:], scaled by scalers[s], into out[out_at[s]:]; returns each
    layer's largest packed value (uint64): one beyond 2n is a code sum beyond N (the caller raises)."""
    from tgsim.codecs import _numba_uint

    return _numba_uint.decode_scaled_segments(payload, at, sizes, width, n, scalers, n, out, out_at)


def decode_code_sums(intsum, n: int, scaler: float):
    """float32 scale_integer_sum(intsum, scaler, n) of N = n workers' integer code sums, after checking
    |Σ codes| <= n (PayloadError otherwise). NumPy: one Numba pass; other arrays: the array form."""
    xp = array_module(intsum)
    if xp is np:
        from tgsim.codecs import _numba_uint

        flat, bad = _numba_uint.decode_codes(intsum, n, scaler)
    else:
        bad = bool(intsum.size) and int(xp.abs(intsum.astype(xp.int32)).max()) > n
        flat = scale_integer_sum(intsum, scaler, n)
    if bad:
        raise PayloadError(f"an integer code sum lies beyond N = {n}")
    return flat


def scale_integer_sum(intsum, scaler: float, divide_by: int):
    """f32(f64(scaler) * intsum * (1/divide_by)) of the integer code sums `intsum`: the same bits as
    weighted_sum with one shared scaler."""
    xp = array_module(intsum)
    return ((intsum.astype(xp.float64) * xp.float64(scaler)) * xp.float64(1.0 / divide_by)).astype(xp.float32)
