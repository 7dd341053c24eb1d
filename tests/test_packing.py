"""tgsim/codecs/packing.py: the code tables, pack/unpack, payload checks, code sums of any width and
weighted_sum. Expected values are worked out by hand or with plain NumPy, never with the module
under test."""

from __future__ import annotations

import types

import numpy as np
import pytest

from tgsim.codecs import _numba_uint, packing
from tgsim.errors import PayloadError


def _codes_of_byte(b: int, fmt: str) -> list[int] | None:
    """The format's rule written out per byte: 2bit, 4 codes of 2 bits, low bits first, code c stored
    as c + 1 (0b11 invalid); base3, 5 base-3 digits, least significant first (bytes > 242 invalid)."""
    if fmt == "2bit":
        d = [(b >> (2 * i)) & 3 for i in range(4)]
        return None if 3 in d else [x - 1 for x in d]
    if b > 242:
        return None
    return [(b // 3 ** i) % 3 - 1 for i in range(5)]


@pytest.mark.mutation
@pytest.mark.parametrize("fmt", ["2bit", "base3"])
def test_packing_tables_and_reference_pack_are_the_format(fmt):
    """packing: the decode table, its validity mask, `pack` (reference, NumPy) and `unpack` of every
    byte equal the format written out per byte; the default format is 2bit."""
    from tgsim.codecs import packing

    codes, valid = packing.LUT[fmt]
    for b in range(256):
        want = _codes_of_byte(b, fmt)
        assert bool(valid[b]) == (want is not None), b
        if want is not None:
            assert codes[b].tolist() == want, b
            got = packing.pack(np.array(want, np.int8), fmt)
            assert got.dtype == np.uint8 and got.tolist() == [b], b
            assert packing.unpack(np.array([b], np.uint8), len(want), fmt).tolist() == want
        else:
            with pytest.raises(PayloadError, match="code 0b11" if fmt == "2bit" else "byte > 242"):
                packing.unpack(np.array([b], np.uint8), packing.CODES_PER_BYTE[fmt], fmt)
    assert packing.pack(np.array([1, -1, 0], np.int8)).tolist() == packing.pack(np.array([1, -1, 0], np.int8),
                                                                                    "2bit").tolist()


@pytest.mark.mutation
def test_packing_payload_must_be_1d_uint8_and_pads_zero():
    """packing.check_payload: a 2-D uint8 payload or a 1-D int8 one is refused, each alone; a pad
    code other than 0 after the last element is refused."""
    from tgsim.codecs import packing

    good = packing.pack(np.array([1, 0, -1, 1, 0], np.int8))            # 2 bytes, 3 pad codes
    for bad in (good.reshape(1, 2), good.astype(np.int8)):
        with pytest.raises(PayloadError, match="expected a 1-D uint8 payload"):
            packing.check_payload(bad, 5, "2bit")
    padded = good.copy()
    padded[-1] = (padded[-1] & ~np.uint8(0b1100)) | np.uint8(0b10 << 2)  # element 5's code: +1
    with pytest.raises(PayloadError, match="non-zero pad codes after element 5"):
        packing.unpack(padded, 5, "2bit")


@pytest.mark.mutation
@pytest.mark.parametrize("workers, dtype", [(127, np.int8), (128, np.int16), (32767, np.int16), (32768, np.int32)])
def test_sum_codes_integer_width_follows_the_workers(workers, dtype):
    """packing.sum_codes: int8 up to 127 workers, int16 up to 32767, int32 beyond, and the sum exact
    (every worker +1: the sum is the worker count)."""
    from tgsim.codecs import packing

    one = packing.pack(np.ones(4, np.int8))
    s = packing.sum_codes(np.repeat(one[None, :], workers, axis=0), 4)
    assert s.dtype == dtype and s.tolist() == [workers] * 4


def _pack_bits(values, width: int) -> np.ndarray:
    """Little-endian bit order by hand: value i occupies bits i*width .. i*width+width-1 of the stream,
    stream bit 8j+b is bit b of byte j; ceil(n*width/8) bytes, zero padding."""
    total = 0
    for i, v in enumerate(values):
        assert 0 <= int(v) < 1 << width
        total |= int(v) << (i * width)
    return np.frombuffer(total.to_bytes(-(-len(values) * width // 8), "little"), np.uint8)


def _scaled(codes, scaler: float, n: int) -> np.ndarray:
    """The documented decode of integer code sums: f32((f64(c) * f64(s)) * f64(1/n))."""
    return ((np.asarray(codes, np.float64) * np.float64(scaler)) * np.float64(1.0 / n)).astype(np.float32)


class _StandIn(types.ModuleType):
    """An array module that is not `numpy` but forwards to it: packing takes its array (CuPy) path."""

    def __getattr__(self, name):
        return getattr(np, name)


@pytest.fixture
def array_path(monkeypatch):
    """packing's array_module answers the stand-in for every array, as it answers cupy for CuPy arrays."""
    fake = _StandIn("standin_xp")
    monkeypatch.setattr(packing, "array_module", lambda x: fake)
    return fake


@pytest.mark.mutation
@pytest.mark.parametrize("width", [9, 10, 12])
def test_pack_uint_above_8_bits_is_the_bit_stream(width):
    """N >= 128 workers need 9+ bits: pack_uint must give the little-endian bit stream (values up to
    2^width - 1, 19 values: two full groups of eight and a tail) and unpack_uint must invert it."""
    rng = np.random.default_rng(width)
    v = rng.integers(0, 2**width, 19).astype(np.uint32)
    v[:3] = [2**width - 1, 0, 2**width - 1]
    want = _pack_bits(v, width)
    got = packing.pack_uint(v, width)
    assert got.dtype == np.uint8 and got.tolist() == want.tolist()
    assert packing.unpack_uint(want, 19, width).tolist() == v.tolist()


@pytest.mark.mutation
@pytest.mark.parametrize("n", [128, 200])
def test_code_sums_of_128_or_more_workers_round_trip(n):
    """Width ceil(log2(2N+1)) = 9 for N = 128 and 200: pack_code_sums(Σ codes) is pack_bits(Σ codes + N)
    and unpack_code_sums gives the documented float32 mean, including Σ = -N and Σ = +N (packed 0 and
    2N: both valid, the upper bound is inclusive)."""
    width = packing.uint_width(n)
    assert width == 9
    intsum = np.array([-n, n, 0, 1, -1, n - 1, 3, -5, 17, 100, -100], np.int16)
    payload = packing.pack_code_sums(intsum, n, width)
    assert payload.tolist() == _pack_bits(intsum.astype(np.int64) + n, width).tolist()
    s = 0.3125
    got = packing.unpack_code_sums(payload, intsum.size, width, n, s, name="w")
    assert got.dtype == np.float32 and got.tolist() == _scaled(intsum, s, n).tolist()


@pytest.fixture
def numba_calls(monkeypatch):
    """The names of the _numba_uint kernels called (each still runs)."""
    calls = []
    for name in ("pack_uint", "unpack_uint", "pack_offset", "decode_scaled", "decode_codes"):
        real = getattr(_numba_uint, name)
        monkeypatch.setattr(_numba_uint, name, lambda *a, _r=real, _n=name, **k: (calls.append(_n), _r(*a, **k))[1])
    return calls


@pytest.mark.mutation
def test_numpy_arrays_up_to_8_bits_take_the_numba_kernels(numba_calls):
    """Documented dispatch (pack_uint, unpack_uint, pack_code_sums, unpack_code_sums: "NumPy with width
    <= 8: one Numba pass"; decode_code_sums: "NumPy: one Numba pass"): at width 8 (N = 127, the widest
    such case) each call reaches its _numba_uint kernel, and at width 9 none does (the 64-bit groups
    of eight values hold 8 bits each at most)."""
    calls = numba_calls
    for n, width in ((127, 8), (128, 9)):
        calls.clear()
        intsum = np.array([-n, 0, n, 5], np.int16)
        v = (intsum + n).astype(np.uint32)
        pay = packing.pack_uint(v, width)
        assert packing.unpack_uint(pay, 4, width).tolist() == v.tolist()
        before = len(calls)
        pay2 = packing.pack_code_sums(intsum, n, width)
        assert calls[before:] == (["pack_offset"] if width == 8 else []), calls   # one pass, not via pack_uint
        assert pay2.tolist() == pay.tolist() == _pack_bits(v, width).tolist()
        assert packing.unpack_code_sums(pay2, 4, width, n, 1.0).tolist() == _scaled(intsum, 1.0, n).tolist()
        if width == 8:
            # pack_uint goes through pack_offset itself
            assert {"pack_uint", "unpack_uint", "pack_offset", "decode_scaled"} <= set(calls), calls
        else:
            assert calls == [], calls
    calls.clear()
    assert packing.decode_code_sums(np.array([1, -1], np.int16), 3, 3.0).tolist() == [1.0, -1.0]
    assert calls == ["decode_codes"]


@pytest.mark.mutation
@pytest.mark.parametrize("n", [3, 128])
def test_array_path_packs_and_decodes_code_sums(array_path, numba_calls, n):
    """The CuPy path (here on NumPy arrays via a stand-in module): pack_code_sums is pack_bits(Σ + N),
    unpack_code_sums decodes Σ = packed - N to the documented float32 mean, also when writing into a
    given `out` (which it returns), and decode_code_sums decodes integer sums the same way; no Numba
    kernel runs (they take NumPy arrays only)."""
    width = packing.uint_width(n)
    intsum = np.array([-n, n, 0, 1, -1, 2, -2, n - 1, 1 - n], np.int16)
    payload = packing.pack_code_sums(intsum, n, width)
    assert payload.tolist() == _pack_bits(intsum.astype(np.int64) + n, width).tolist()
    s = 1.75
    want = _scaled(intsum, s, n)
    assert packing.unpack_code_sums(payload, intsum.size, width, n, s).tolist() == want.tolist()
    out = np.full(intsum.size, np.nan, np.float32)
    got = packing.unpack_code_sums(payload, intsum.size, width, n, s, out=out)
    assert got is out and out.tolist() == want.tolist()
    assert packing.decode_code_sums(intsum, n, s).tolist() == want.tolist()
    assert packing.decode_code_sums(np.zeros(0, np.int16), n, s).size == 0
    assert packing.pack_uint(np.array([1, 2], np.uint32), 2).tolist() == _pack_bits([1, 2], 2).tolist()
    assert packing.unpack_uint(_pack_bits([1, 2], 2), 2, 2).tolist() == [1, 2]
    assert numba_calls == []


@pytest.mark.mutation
@pytest.mark.parametrize("path", ["numpy", "array"])
@pytest.mark.parametrize("n", [3, 128])
def test_a_code_sum_beyond_n_is_refused_and_n_itself_is_not(request, path, n):
    """A downlink value 2N + 1 (code sum N + 1) is a PayloadError naming the layer; 2N (code sum N) is
    valid. decode_code_sums: |Σ| = N is valid, N + 1 or -(N + 1) is a PayloadError."""
    if path == "array":
        request.getfixturevalue("array_path")
    width = packing.uint_width(n)
    ok = _pack_bits([2 * n, 0, n], width)
    assert packing.unpack_code_sums(ok, 3, width, n, 2.0).tolist() == _scaled([n, -n, 0], 2.0, n).tolist()
    bad = _pack_bits([0, 2 * n + 1, n], width)
    with pytest.raises(PayloadError, match="'lay'"):
        packing.unpack_code_sums(bad, 3, width, n, 2.0, name="lay")
    assert packing.decode_code_sums(np.array([n, -n, 0], np.int16), n, 2.0).tolist() == \
        _scaled([n, -n, 0], 2.0, n).tolist()
    for v in (n + 1, -n - 1):
        with pytest.raises(PayloadError, match="beyond N"):
            packing.decode_code_sums(np.array([0, v, 1], np.int16), n, 2.0)


@pytest.mark.mutation
def test_weighted_sum_defaults_are_2bit_and_no_division():
    """weighted_sum(payloads, scalers, n) with the defaults (format "2bit", divide_by 1) is Σ_w s_w
    codes_w: codes (1, 0, -1, 1, -1) at s = 0.5 and (1, 1, 0, -1, -1) at s = 2 sum to
    (2.5, 2, -0.5, -1.5, -2.5) by hand; divide_by = 2 halves it."""
    c = np.array([[1, 0, -1, 1, -1], [1, 1, 0, -1, -1]], np.int8)
    payloads = np.stack([packing.pack(row, "2bit") for row in c])
    got = packing.weighted_sum(payloads, [0.5, 2.0], 5)
    assert got.dtype == np.float32 and got.tolist() == [2.5, 2.0, -0.5, -1.5, -2.5]
    assert packing.weighted_sum(payloads, [0.5, 2.0], 5, divide_by=2).tolist() == [1.25, 1.0, -0.25, -0.75, -1.25]


@pytest.mark.mutation
def test_invalid_bytes_decode_to_no_codes():
    """The lookup tables decode an invalid byte (2bit: a 0b11 pair; base3: a byte > 242) to four or
    five zero codes, so a sum of codes read without validation never adds a code nobody sent."""
    codes, valid = packing.LUT["2bit"]
    assert not valid[0xFF] and codes[0xFF].tolist() == [0, 0, 0, 0]
    assert not valid[0b00000011] and codes[0b00000011].tolist() == [0, 0, 0, 0]
    codes3, valid3 = packing.LUT["base3"]
    assert not valid3[243:].any() and not codes3[243:].any()
    assert packing.sum_codes(np.array([[0xFF], [0xAA]], np.uint8), 4).tolist() == [1, 1, 1, 1]


@pytest.mark.mutation
def test_check_payload_names_the_invalid_code_kind_and_the_default_where():
    """The error of an invalid byte says which rule it breaks ("code 0b11" for 2bit, "byte > 242" for
    base3), at which byte, in hex; without `where` the message starts with "payload"."""
    with pytest.raises(PayloadError, match=r"^payload: invalid code 0b11 at byte 1 \(0xc1\)$"):
        packing.check_payload(np.array([0x55, 0xC1], np.uint8), 8, "2bit")
    with pytest.raises(PayloadError, match=r"^payload: invalid byte > 242 at byte 0 \(0xfa\)$"):
        packing.check_payload(np.array([250], np.uint8), 5, "base3")
    with pytest.raises(PayloadError, match=r"^payload: expected a 1-D uint8 payload"):
        packing.check_payload(np.zeros(2, np.int8), 8, "2bit")


@pytest.mark.mutation
def test_unpack_reads_2bit_by_default():
    """unpack(payload, n) without a format is the 2-bit packing: 0b10_01_00_10 = 0x92 holds the codes
    +1, -1, 0, +1 (element m in bits 2m..2m+1, value code + 1)."""
    assert packing.unpack(np.array([0x92], np.uint8), 4).tolist() == [1, -1, 0, 1]


@pytest.mark.mutation
def test_unpack_code_sums_names_an_unnamed_layer_as_empty():
    """N = 1 worker: width ceil(log2 3) = 2 bits, packed values Σcodes + 1 in [0, 2]; a packed 3
    (0b11, code sum 2) exceeds N = 1. Without a layer name the error names layer ''."""
    with pytest.raises(PayloadError, match=r"^layer '': downlink code sum 2 exceeds N = 1$"):
        packing.unpack_code_sums(np.array([0b11], np.uint8), 1, 2, 1, 1.0)
