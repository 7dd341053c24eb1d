"""Tests that kill mutants `tools/mutation.py` found surviving in tgsim/codecs/packing.py on the
parameter server's downlink (issue 22, item 3; second pass): the integer packing at widths above 8
(N >= 128 workers, where the Numba kernels, whose groups of eight values must fit in 64 bits, may
not run), the array (CuPy) path run on NumPy arrays through a stand-in array module, and the code-sum
bounds |Σ codes| <= N at exactly N and N + 1. Expected bits come from a plain Python big-integer
packer written here; expected floats from the documented formula f32(f64(s) * c * (1/N)) in NumPy."""

from __future__ import annotations

import types

import numpy as np
import pytest

from tgsim.codecs import _numba_uint, packing
from tgsim.errors import PayloadError


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


def test_weighted_sum_defaults_are_2bit_and_no_division():
    """weighted_sum(payloads, scalers, n) with the defaults (format "2bit", divide_by 1) is Σ_w s_w
    codes_w: codes (1, 0, -1, 1, -1) at s = 0.5 and (1, 1, 0, -1, -1) at s = 2 sum to
    (2.5, 2, -0.5, -1.5, -2.5) by hand; divide_by = 2 halves it."""
    c = np.array([[1, 0, -1, 1, -1], [1, 1, 0, -1, -1]], np.int8)
    payloads = np.stack([packing.pack(row, "2bit") for row in c])
    got = packing.weighted_sum(payloads, [0.5, 2.0], 5)
    assert got.dtype == np.float32 and got.tolist() == [2.5, 2.0, -0.5, -1.5, -2.5]
    assert packing.weighted_sum(payloads, [0.5, 2.0], 5, divide_by=2).tolist() == [1.25, 1.0, -0.25, -0.75, -1.25]
