"""tgsim/codecs/terngrad/cuda.py, the CuPy wrapper of the CUDA kernels, on the host harness: a
stand-in `cupy` whose kernels are the nvcc-built host library (the `builds`/`h` fixtures of
tests/conftest.py). Launch grids, argument checks, edge cases of moments, encode and decode.
Expected values are worked out by hand or with plain NumPy, never with the module under test."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

from tgsim import backend
from tgsim.codecs import packing
from tgsim.codecs.terngrad import cuda as _cuda, reference as _reference
from tgsim.rng import StreamKey

import cuda_harness as tck


def nvcc(test):
    """The marks of test_cuda_kernels.py's nvcc tests: marker `nvcc`, skipped without nvcc."""
    for mark in tck.needs_nvcc:
        test = mark(test)
    return test


@pytest.fixture
def launches(h, monkeypatch):  # noqa: F811  (h: the session fixture imported above)
    """The stand-in CuPy of test_cuda_kernels.py (kernels on the harness, strict keywords), with a
    poisoned `empty`; yields the list of (kernel, grid, block) launches."""
    backend.gpu_available()
    rec: list = []
    _cuda._reset_cache()
    cp = tck.fake_cupy(h, rec)
    plain_empty = cp.empty

    def empty(shape, dtype=float, order="C"):
        a = plain_empty(shape, dtype=dtype, order=order)
        a.reshape(-1).view(np.uint8)[...] = 0xFF
        return a

    cp.empty = empty
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(_cuda, "_address", lambda a: int(a.ctypes.data))
    yield rec
    _cuda._reset_cache()


def _same_moments(got, g):
    ref = _reference.moments(g, True)
    absmax, sigma, finite = got
    assert bool(finite) == ref.finite
    assert tck.same_float(float(absmax), ref.absmax) and tck.same_float(float(sigma), ref.sigma), (got, ref)


def _rows(shape, seed=0):
    rng = np.random.default_rng([seed, *shape])
    return (rng.standard_normal(shape) * 1e-2 + 0.25).astype(np.float32)


@pytest.mark.mutation
def test_module_constants_agree_with_the_kernel_source():
    """KERNELS names every extern "C" __global__ of terngrad.cu; ROW_THREADS is its TG_ROW_THREADS
    (tg_moments_rows is written for exactly that many threads a block); FMT_CODE's 2-bit code is
    philox.cuh's TG_FMT_2BIT and base3's any other value (the kernels read every value but
    TG_FMT_2BIT as base3). Read from the source the wrapper compiles, cuda.source()."""
    src = _cuda.source()
    assert set(_cuda.KERNELS) == set(re.findall(r'extern "C" __global__ void (\w+)\(', src))
    assert len(_cuda.KERNELS) == len(set(_cuda.KERNELS)) == 9
    assert _cuda.ROW_THREADS == int(re.search(r"#define TG_ROW_THREADS (\d+)", src).group(1))
    two_bit = int(re.search(r"#define TG_FMT_2BIT (\d+)", src).group(1))
    assert set(_cuda.FMT_CODE) == set(packing.FORMATS) and _cuda.FMT_CODE["2bit"] == two_bit
    assert _cuda.FMT_CODE["base3"] != two_bit


@pytest.mark.mutation
@nvcc
def test_sigma_is_computed_by_default(launches):
    """moments, moments_many and moments_layers default to need_sigma=True: σ as the reference's."""
    G = _rows((2, 1001), seed=1)
    m = _cuda.moments(G[0])
    assert m.sigma > 0 and m == _reference.moments(G[0], True)
    absmax, sigma, finite = _cuda.moments_many(G)
    for w in range(2):
        _same_moments((absmax[w], sigma[w], finite[w]), G[w])
    (absmax, sigma, finite), = _cuda.moments_layers([G])
    for w in range(2):
        assert sigma[w] > 0
        _same_moments((absmax[w], sigma[w], finite[w]), G[w])


@pytest.mark.mutation
@nvcc
def test_moments_many_small_shapes_and_nonfinite_rows(launches):
    """moments_many row by row equals the reference's moments of that row: one worker, one-element
    rows, and a NaN row before a finite one (the finite rows after it still get their moments)."""
    for shape in ((1, 5), (2, 1), (1, 1)):
        G = _rows(shape, seed=2)
        absmax, sigma, finite = _cuda.moments_many(G)
        for w in range(shape[0]):
            _same_moments((absmax[w], sigma[w], finite[w]), G[w])
    G = _rows((4, 7), seed=3)
    G[0, 3] = np.nan
    G[2, 0] = np.inf
    absmax, sigma, finite = _cuda.moments_many(G)
    assert finite.tolist() == [False, True, False, True]
    for w in range(4):
        _same_moments((absmax[w], sigma[w], finite[w]), G[w])
    a, s, f = _cuda.moments_many(np.zeros((3, 0), np.float32))
    assert a.tolist() == s.tolist() == [0.0] * 3 and f.tolist() == [True] * 3
    a, s, f = _cuda.moments_many(np.zeros((0, 4), np.float32))
    assert a.shape == s.shape == f.shape == (0,)


@pytest.mark.mutation
@nvcc
def test_rows_of_row_max_elements_take_one_launch_longer_ones_two_kernels(launches):
    """moments_layers' docstring: rows of AT MOST ROW_MAX (2^22) elements take the one-launch
    tg_moments_rows, longer rows moments_many's two kernels; both give the reference's moments."""
    assert _cuda.ROW_MAX == 2**22
    for n, names in ((2**22, ["tg_moments_rows"]), (2**22 + 1, ["tg_moments_lanes", "tg_moments_tree"])):
        G = _rows((1, n), seed=4)
        launches.clear()
        (absmax, sigma, finite), = _cuda.moments_layers([G], True)
        assert [name for name, _, _ in launches] == names, n
        _same_moments((absmax[0], sigma[0], finite[0]), G[0])


@pytest.mark.mutation
@nvcc
def test_one_worker_and_one_element_layers_are_in_the_one_launch(launches):
    """A step of one worker, with one-element and short layers, is still ONE tg_moments_rows launch
    (every row of at most ROW_MAX elements; only empty layers skip it)."""
    Gs = [_rows((1, 1), seed=5), _rows((1, 5), seed=6), np.zeros((1, 0), np.float32)]
    launches.clear()
    out = _cuda.moments_layers(Gs, True)
    assert [name for name, _, _ in launches] == ["tg_moments_rows"]
    for G, (absmax, sigma, finite) in zip(Gs[:2], out[:2]):
        _same_moments((absmax[0], sigma[0], finite[0]), G[0])
    assert out[2][0].tolist() == [0.0] and out[2][2].tolist() == [True]
    Gs = [_rows((2, 1), seed=7)]
    launches.clear()
    (absmax, sigma, finite), = _cuda.moments_layers(Gs, True)
    assert [name for name, _, _ in launches] == ["tg_moments_rows"]
    for w in range(2):
        _same_moments((absmax[w], sigma[w], finite[w]), Gs[0][w])


@pytest.mark.mutation
@nvcc
def test_a_step_without_workers_launches_nothing(launches):
    """moments_layers of layers with no worker rows: empty (absmax, sigma, finite) per layer, and
    no kernel launch (there is no row to give a block; a CUDA grid of 0 blocks is not a launch)."""
    out = _cuda.moments_layers([np.zeros((0, 5), np.float32), np.zeros((0, 0), np.float32)], True)
    assert launches == []
    for absmax, sigma, finite in out:
        assert absmax.shape == sigma.shape == finite.shape == (0,)


def _threads_2bit(n):       # terngrad.cu tg_encode_2bit_threads: 1 byte (4 elements) a thread
    return (n + 3) // 4


def _threads_base3(n):      # terngrad.cu tg_encode_base3_threads: 4 bytes (20 elements) a thread
    return ((n + 4) // 5 + 3) // 4


def _grid(threads):
    """One thread per logical thread of the kernel, BLOCK a block, at most MAX_GRID blocks (the
    grid-stride loops cover the rest); CUDA grid sizes are integers."""
    return (min((threads + _cuda.BLOCK - 1) // _cuda.BLOCK, _cuda.MAX_GRID),)


def _check_launch(launches, name, threads):
    assert len(launches) == 1 and launches[0][0] == name, launches
    grid = launches[0][1]
    assert all(type(x) is int for x in grid), grid
    assert grid == _grid(threads), (name, grid, threads)


@pytest.mark.mutation
@nvcc
def test_launch_grids_cover_the_kernels_logical_threads(launches):
    """Each launch's grid is integral and has exactly enough BLOCK-thread blocks for the kernel's
    logical threads (tg_encode_*_threads, one per payload byte for the decodes, the sum over rows
    for the whole-step kernels)."""
    n = 100_003
    g = _rows((n,), seed=8)
    key = StreamKey(5, 1, 2, 3)
    for fmt, threads in (("2bit", _threads_2bit(n)), ("base3", _threads_base3(n))):
        launches.clear()
        _cuda.encode(g, 0.01, float("inf"), key, fmt)
        _check_launch(launches, f"tg_encode_{fmt}", threads)
    G = np.stack([g, g[::-1].copy()])
    for fmt, threads in (("2bit", _threads_2bit(n)), ("base3", _threads_base3(n))):
        launches.clear()
        _cuda.encode_many(G, [0.01, 0.02], [np.inf, np.inf], 5, 1, [0, 1], 3, fmt)
        assert [x[0] for x in launches] == [f"tg_encode_{fmt}"] * 2
        for launch in launches:
            _check_launch([launch], f"tg_encode_{fmt}", threads)
    sizes = [n, 21, 70_001]
    Gs = [_rows((2, m), seed=9 + i) for i, m in enumerate(sizes)]
    S = np.full((2, 3), 0.01, np.float32)
    for fmt, per_row in (("2bit", _threads_2bit), ("base3", _threads_base3)):
        launches.clear()
        _cuda.encode_layers(Gs, S, [np.full(2, np.inf)] * 3, 5, 1, [0, 1], [0, 1, 2], fmt)
        _check_launch(launches, "tg_encode_rows", 2 * sum(per_row(m) for m in sizes))
    for fmt in packing.FORMATS:
        P = [tck.random_payloads(3, m, fmt, seed=i) for i, m in enumerate(sizes)]
        s = np.float32([0.5, 1.0, 2.0])
        launches.clear()
        _cuda.weighted_sum(P[0], s, n, fmt, 3)
        _check_launch(launches, "tg_weighted_sum", packing.packed_size(n, fmt))
        launches.clear()
        _cuda.sum_codes(P[0], n, fmt)
        _check_launch(launches, "tg_sum_codes", packing.packed_size(n, fmt))
        launches.clear()
        _cuda.weighted_sum_layers(P, np.stack([s] * 3, 1), sizes, fmt, 3)
        _check_launch(launches, "tg_weighted_sum_rows", sum(packing.packed_size(m, fmt) for m in sizes))
    launches.clear()
    _cuda.moments(g, True)
    assert launches[0][1] == _grid(65536) and launches[1][1:] == ((1,), (_cuda.TREE_BLOCK,))


@pytest.mark.mutation
@nvcc
@pytest.mark.parametrize("fmt", packing.FORMATS)
def test_invalid_byte_far_into_the_payloads_is_found(launches, fmt):
    """An invalid byte of worker 2 at byte 200 (flat index 2 * nbytes + 200, far beyond 127) is
    reported by every decode, in packing.check_payload's words."""
    n = 1001
    p = tck.random_payloads(3, n, fmt, seed=12)
    tck.corrupt(fmt, p, n, 2, 200, "code")
    kind = "code 0b11" if fmt == "2bit" else "byte > 242"
    msg = rf"^payload of worker 2: invalid {kind} at byte 200 \(0x{p[2, 200]:02x}\)$"
    s = np.float32([1.0, 0.5, 0.25])
    with pytest.raises(ValueError, match=msg):
        _cuda.weighted_sum(p, s, n, fmt, 1)
    with pytest.raises(ValueError, match=msg):
        _cuda.sum_codes(p, n, fmt)
    with pytest.raises(ValueError, match=msg):
        _cuda.weighted_sum_layers([p], s[:, None], [n], fmt, 1)


@pytest.mark.mutation
@nvcc
def test_worker_ids_must_be_integers_in_32_bits(launches):
    """encode_many / encode_layers: worker ids are integer counter words in [0, 2^32); a negative,
    2^32 (which uint32 would wrap to 0) or a float id is refused; 2^32 - 1 is the last valid one."""
    G = _rows((2, 21), seed=13)
    s, cb = np.float32([0.3, 0.3]), np.full(2, np.inf)
    msg = r"workers: expected integer worker ids in \[0, 2\^32\)"
    for workers in ([-1, 0], [0, 2**32], np.array([0.0, 1.0])):
        with pytest.raises(ValueError, match=msg):
            _cuda.encode_many(G, s, cb, 7, 1, workers, 4, "2bit")
        with pytest.raises(ValueError, match=msg):
            _cuda.encode_layers([G], s[:, None], [cb], 7, 1, workers, [4], "2bit")
    got = _cuda.encode_many(G, s, cb, 7, 1, [2**32 - 1, 0], 4, "2bit")
    for w, wid in enumerate((2**32 - 1, 0)):
        tck.assert_same_bits(got[w], tck.ref_encode(G[w], s[w], cb[w], StreamKey(7, 1, wid, 4), "2bit"))


@pytest.mark.mutation
@nvcc
def test_every_encode_checks_the_stream_range(launches, monkeypatch):
    """A layer longer than the Philox stream (MAX_ELEMENTS) is refused by encode, encode_many and
    encode_layers; a layer of exactly MAX_ELEMENTS is encoded (here with MAX_ELEMENTS set to 40,
    since the real 2^34 elements do not fit a unit test)."""
    monkeypatch.setattr(_cuda, "MAX_ELEMENTS", 40)
    key = StreamKey(3, 2, 1, 0)
    G41 = _rows((2, 41), seed=14)
    msg = r"stream range \[0, 41\) outside \[0, 40\)"
    with pytest.raises(ValueError, match=msg):
        _cuda.encode(G41[0], 0.3, np.inf, key, "2bit")
    with pytest.raises(ValueError, match=msg):
        _cuda.encode_many(G41, [0.3, 0.3], [np.inf, np.inf], 3, 2, [1, 2], 0, "2bit")
    with pytest.raises(ValueError, match=msg):
        _cuda.encode_layers([G41], np.full((2, 1), 0.3), [np.full(2, np.inf)], 3, 2, [1, 2], [0], "2bit")
    g40 = G41[0, :40].copy()
    tck.assert_same_bits(_cuda.encode(g40, 0.3, np.inf, key, "base3"), tck.ref_encode(g40, 0.3, np.inf, key, "base3"))


@pytest.mark.mutation
@nvcc
def test_encode_many_and_encode_layers_check_each_argument(launches):
    """Each of scalers, clip_bounds and workers of the wrong length is a ValueError by itself; so is
    a clip-bound list or a layer-id list of the wrong length."""
    G = _rows((2, 21), seed=15)
    good = dict(scalers=[0.3, 0.3], clip_bounds=[np.inf, np.inf], workers=[0, 1])
    for name, bad in (("scalers", [0.3] * 3), ("clip_bounds", [np.inf]), ("workers", [0, 1, 2])):
        args = dict(good, **{name: bad})
        with pytest.raises(ValueError, match=r"must have shape \(2,\)"):
            _cuda.encode_many(G, args["scalers"], args["clip_bounds"], 1, 1, args["workers"], 0, "2bit")
    S, cb = np.full((2, 1), 0.3), [np.full(2, np.inf)]
    with pytest.raises(ValueError, match=r"1 layers, 2 clip bound vectors, 1 layer ids"):
        _cuda.encode_layers([G], S, cb * 2, 1, 1, [0, 1], [0], "2bit")
    with pytest.raises(ValueError, match=r"1 layers, 1 clip bound vectors, 2 layer ids"):
        _cuda.encode_layers([G], S, cb, 1, 1, [0, 1], [0, 1], "2bit")


@pytest.mark.mutation
@nvcc
def test_malformed_payload_arrays_are_named_as_check_payload_names_them(launches):
    """Not a 2-D uint8 array: "payload of worker 0: expected a 1-D uint8 payload, got <dtype>
    <shape>" with worker 0's row (the whole array when it has no row), as packing.check_payload."""
    n, fmt = 10, "2bit"       # 3 bytes a payload
    cases = [(np.zeros((1, 3), np.int8), r"int8 \(3,\)"),
             (np.zeros((2, 3), np.float32), r"float32 \(3,\)"),
             (np.zeros(3, np.uint8), r"uint8 \(\)"),
             (np.zeros((0, 3), np.int8), r"int8 \(0, 3\)"),
             (np.zeros((), np.uint8), r"uint8 \(\)"),
             (np.zeros((2, 3, 1), np.uint8), r"uint8 \(3, 1\)")]
    for p, got in cases:
        for fn, args in ((_cuda.weighted_sum, ([], n, fmt, 1)), (_cuda.sum_codes, (n, fmt))):
            with pytest.raises(ValueError, match=rf"^payload of worker 0: expected a 1-D uint8 payload, got {got}$"):
                fn(p, *args)


@pytest.mark.mutation
@nvcc
def test_no_payloads_sum_to_zeros(launches):
    """No workers (an empty list, or a (0, nbytes) array of any width): the sum over no payloads is
    +0.0 everywhere (and integer zeros), also layer by layer in weighted_sum_layers (whose outputs
    were left unwritten before: the stand-in's 0xFF fill made them NaN)."""
    n = 10
    for p in ([], np.zeros((0, 3), np.uint8), np.zeros((0, 7), np.uint8)):
        out = _cuda.weighted_sum(p, [], n, "2bit", 1)
        tck.assert_same_bits(out, np.zeros(n, np.float32))
        tck.assert_same_bits(_cuda.sum_codes(p, n, "2bit"), np.zeros(n, np.int8))
    outs = _cuda.weighted_sum_layers([np.zeros((0, 3), np.uint8), np.zeros((0, 0), np.uint8)],
                                     np.zeros((0, 2), np.float32), [10, 0], "2bit", 1)
    tck.assert_same_bits(outs[0], np.zeros(10, np.float32))
    assert outs[1].shape == (0,)


@pytest.mark.mutation
@nvcc
def test_at_most_2_31_minus_1_payloads(launches):
    """2^31 payloads are refused before anything is copied (a zero-stride view stands for them)."""
    p = np.broadcast_to(np.zeros((1, 1), np.uint8), (2**31, 1))
    with pytest.raises(ValueError, match=r"^2147483648 payloads: at most 2\^31 - 1 workers$"):
        _cuda.sum_codes(p, 4, "2bit")
    p = tck.random_payloads(62, 4, "2bit", seed=16)     # many workers are fine
    tck.assert_same_bits(_cuda.sum_codes(p, 4, "2bit"), _reference.sum_codes(p, 4, "2bit"))


@pytest.mark.mutation
@nvcc
def test_device_scalers_of_another_dtype_must_hold_float32_values(launches):
    """Scalers as a device float64 array: used when every value is a float32 (NaN included), a
    ValueError otherwise; a float32 device array is used as it is."""
    n, fmt = 21, "base3"
    p = tck.random_payloads(3, n, fmt, seed=17)
    s32 = np.float32([0.5, np.nan, 3.0e38])
    with np.errstate(all="ignore"):
        ref = _reference.weighted_sum(p, s32, n, fmt, 2)
    for s in (s32.astype(np.float64), s32):
        tck.assert_same_bits(_cuda.weighted_sum(p, s, n, fmt, 2), ref)
    with pytest.raises(ValueError, match="scalers must be float32 values"):
        _cuda.weighted_sum(p, np.array([0.5, 0.1, 1.0]), n, fmt, 2)


@pytest.mark.mutation
@nvcc
@pytest.mark.parametrize("fmt", packing.FORMATS)
def test_weighted_sum_layers_one_worker_one_layer_two_layers(launches, fmt):
    """weighted_sum_layers equals the reference's weighted_sum of each layer for one worker, for a
    single layer, and for exactly two layers with different scalers."""
    for workers, sizes in ((1, [21, 5]), (3, [21]), (3, [1001, 7])):
        P = [tck.random_payloads(workers, m, fmt, seed=18 + m) for m in sizes]
        S = (np.arange(workers * len(sizes), dtype=np.float32).reshape(workers, len(sizes)) + 1) * 0.25
        got = _cuda.weighted_sum_layers(P, S, sizes, fmt, 3)
        assert len(got) == len(sizes)
        for i, m in enumerate(sizes):
            tck.assert_same_bits(got[i], _reference.weighted_sum(P[i], S[:, i], m, fmt, 3))
    assert _cuda.weighted_sum_layers([], np.zeros((2, 0), np.float32), [], fmt, 1) == []


@pytest.mark.mutation
@nvcc
def test_sum_codes_defaults_to_2bit_and_the_narrowest_dtype(launches):
    """sum_codes(payloads, n): 2-bit packing by default; int8 up to 127 workers, int16 up to 32767,
    int32 above (packing.sum_codes' rule). Every worker sends byte 0xAA = four codes +1 (2-bit: value
    code + 1 = 2 in each 2-bit field), so the sum is the worker count in each element."""
    for workers, dtype in ((127, np.int8), (128, np.int16), (32767, np.int16), (32768, np.int32)):
        p = np.full((workers, 1), 0xAA, np.uint8)
        got = _cuda.sum_codes(p, 4)
        assert got.dtype == dtype and got.tolist() == [workers] * 4, (workers, got.dtype)
    p = tck.random_payloads(5, 21, "2bit", seed=19)
    tck.assert_same_bits(_cuda.sum_codes(p, 21), _reference.sum_codes(p, 21, "2bit"))
