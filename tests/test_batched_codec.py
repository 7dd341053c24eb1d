"""Batched-over-workers codec: moments_many / encode_many (every kernel module) and
TernGrad.scaling_many / encode_many give, row by row, exactly the bits of the single-worker calls.

Kernel modules: the reference (NumPy) and Numba always; the CUDA wrapper on the nvcc host harness
(a stand-in CuPy, see tests/test_cuda_kernels.py) where nvcc is installed.
The Numba kernels have several drivers (serial below a size threshold, one parallel region over
workers, or over (worker, chunk) pairs in blocks of workers); each is forced in turn.
"""

from __future__ import annotations

import sys

import numba
import numpy as np
import pytest

from tgsim.codecs import NonFiniteGradientError, TernGrad, packing
from tgsim.codecs.terngrad import moments as stats, numba_common, numba_moments, quantizer as ternary
from tgsim.codecs.terngrad import numba_kernels as _numba, reference as _reference
from tgsim.codecs.message import stacked_payloads
from tgsim.codecs.terngrad.codec import ScalingBatch, scaling_from_moments_many
from tgsim.exchange import inprocess
from tgsim.train.layer_stats import row_abs_stats
from tgsim.rng import StreamKey

WORKERS = [1, 3, 8]
SIZES = [0, 1, 5, 1000, 70000]
CLIPS = ternary.CLIP_MODES
FORMATS = packing.FORMATS
SEED = 2**40 + 12345
MODULES = {"reference": _reference, "numba": _numba}


def rows(kind: str, nw: int, n: int, seed: int = 0) -> np.ndarray:
    """(W, n) float32 test gradients: every row different; 'wide' spans denormals to 1e38, 'zeros'
    mixes +-0, denormals and normals, 'offset' has a large mean (cancellation in the σ sums)."""
    rng = np.random.default_rng([seed, nw, n, len(kind)])
    if kind == "normal":
        g = rng.standard_normal((nw, n)) * rng.uniform(0.1, 10.0, (nw, 1))
    elif kind == "wide":
        mag = 10.0 ** rng.uniform(-45.0, 38.0, (nw, n))
        g = np.where(rng.random((nw, n)) < 0.5, -mag, mag)
    elif kind == "zeros":
        g = rng.standard_normal((nw, n))
        pick = rng.integers(0, 4, (nw, n))
        g[pick == 0] = 0.0
        g[pick == 1] = -0.0
        g[pick == 2] = 1e-40
    elif kind == "offset":
        g = 1e4 + rng.standard_normal((nw, n))
    else:
        raise ValueError(kind)
    return g.astype(np.float32)


def fbits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).view(np.uint64)


def same_moments(got, want) -> bool:
    """(absmax, sigma, finite) of row w against a LayerMoments; any NaN equals any NaN."""
    a, s, f = got
    return (bool(f) == want.finite
            and (fbits(a) == fbits(want.absmax) or (np.isnan(a) and np.isnan(want.absmax)))
            and (fbits(s) == fbits(want.sigma) or (np.isnan(s) and np.isnan(want.sigma))))


@pytest.fixture(params=["serial", "parallel", "workers", "blocks"])
def numba_driver(request, monkeypatch):
    """Force one Numba driver: everything serial, everything parallel over (worker, chunk) pairs,
    one task per worker, or (worker, chunk) pairs in blocks of one worker's lane partials."""
    mode = request.param
    if mode == "serial":
        for name in ("SERIAL_MOMENTS", "SERIAL_ABSMAX", "SERIAL_ENCODE", "SERIAL_DECODE"):
            monkeypatch.setattr(numba_common, name, 1 << 62)
    else:
        if numba.get_num_threads() < 2:
            pytest.skip("needs 2 Numba threads for the parallel drivers")
        for name in ("SERIAL_MOMENTS", "SERIAL_ABSMAX", "SERIAL_ENCODE", "SERIAL_DECODE"):
            monkeypatch.setattr(numba_common, name, 0)
        monkeypatch.setattr(numba_common, "_WORKER_TASKS", 0 if mode == "workers" else 1 << 30)
        if mode == "blocks":
            monkeypatch.setattr(numba_moments, "_SCRATCH_LANES", 1)     # one worker per block
    return mode


def check_moments_many(mod, G):
    for need_sigma in (True, False):
        got = mod.moments_many(G, need_sigma)
        assert [a.shape for a in got] == [(G.shape[0],)] * 3
        assert got[0].dtype == np.float64 and got[1].dtype == np.float64 and got[2].dtype == bool
        for w in range(G.shape[0]):
            row = tuple(v[w] for v in got)
            assert same_moments(row, stats.layer_moments(G[w], need_sigma)), (w, need_sigma, row)
            assert same_moments(row, mod.moments(G[w], need_sigma)), (w, need_sigma, row)


def check_encode_many(mod, G, clip, fmt, workers=None, step=7, layer=3, scale=1.0):
    nw = G.shape[0]
    a, s, ok = mod.moments_many(G, clip != "none")
    assert ok.all()
    sc = [ternary.scaling_from_moments(a[w], s[w], clip, 2.5) for w in range(nw)]
    scalers = np.array([x.scaler for x in sc], dtype=np.float32) * np.float32(scale)
    bounds = np.array([x.clip_bound for x in sc])
    workers = np.arange(nw, dtype=np.uint32) * 5 + 2 if workers is None else np.asarray(workers)
    out = mod.encode_many(G, scalers, bounds, SEED, step, workers, layer, fmt)
    assert out.dtype == np.uint8 and out.shape == (nw, packing.packed_size(G.shape[1], fmt))
    for w in range(nw):
        key = StreamKey(SEED, step, int(workers[w]), layer)
        want = packing.pack(ternary.ternarize(G[w], float(scalers[w]), key, float(bounds[w])), fmt)
        assert np.array_equal(out[w], want), (w, clip, fmt)
        assert np.array_equal(out[w], mod.encode(G[w], float(scalers[w]), float(bounds[w]), key, fmt))
    return out


# -- kernel modules --------------------------------------------------------------------------------
@pytest.mark.parametrize("module", list(MODULES))
@pytest.mark.parametrize("nw", WORKERS)
@pytest.mark.parametrize("n", SIZES)
def test_moments_many_equals_rows(module, nw, n):
    for kind in ("normal", "wide", "zeros", "offset"):
        check_moments_many(MODULES[module], rows(kind, nw, n))


@pytest.mark.parametrize("module", list(MODULES))
@pytest.mark.parametrize("nw", WORKERS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_many_equals_rows(module, nw, n, fmt):
    for clip, kind in zip(CLIPS, ("normal", "wide", "zeros")):
        check_encode_many(MODULES[module], rows(kind, nw, n), clip, fmt)
    # shared scalers above the local ones (MAX sharing), extreme stream words
    check_encode_many(MODULES[module], rows("normal", nw, n, seed=1), "explicit", fmt,
                      workers=np.full(nw, 2**32 - 1, dtype=np.uint32), step=2**32 - 1, layer=2**32 - 1,
                      scale=1.75)


@pytest.mark.parametrize("nw", WORKERS)
@pytest.mark.parametrize("n", [1, 5, 1000, 70000, 3 * 65536 + 11])
def test_numba_drivers(numba_driver, nw, n):
    G = rows("wide", nw, n, seed=2)
    check_moments_many(_numba, G)
    check_moments_many(_numba, rows("offset", nw, n, seed=3))
    G = rows("normal", nw, n, seed=4)
    for clip in CLIPS:
        for fmt in FORMATS:
            check_encode_many(_numba, G, clip, fmt)
    # the decode kernels' drivers too
    for fmt in FORMATS:
        p = np.stack([packing.pack(np.random.default_rng([n, w]).integers(-1, 2, n).astype(np.int8), fmt)
                      for w in range(nw)])
        s = np.linspace(0.5, 1.5, nw).astype(np.float32)
        for scalers in (s, np.full(nw, s[0])):
            assert np.array_equal(_numba.weighted_sum(p, scalers, n, fmt, nw).view(np.uint32),
                                  packing.weighted_sum(p, scalers, n, fmt, nw).view(np.uint32))
        assert np.array_equal(_numba.sum_codes(p, n, fmt), packing.sum_codes(p, n, fmt))


@pytest.mark.parametrize("module", list(MODULES))
def test_non_finite_rows(module):
    mod = MODULES[module]
    G = rows("normal", 5, 70001)
    G[1, 66_000] = np.nan
    G[3, 0] = np.inf
    G[4, 5] = -np.inf
    a, s, ok = mod.moments_many(G, True)
    assert ok.tolist() == [True, False, True, False, False]
    assert np.isnan(a[[1, 3, 4]]).all() and np.isnan(s[[1, 3, 4]]).all()
    check_moments_many(mod, G)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")   # the reference's f32(1e39)
@pytest.mark.parametrize("module", list(MODULES))
@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_many_edge_scalers(module, fmt):
    """Per-row edge cases side by side: scaler 0, inf, denormal; clip bound 0, NaN, huge."""
    mod = MODULES[module]
    G = rows("zeros", 6, 1003)
    scalers = np.array([0.0, np.inf, 1e-45, 1.0, 3e38, 1.0])
    bounds = np.array([np.inf, np.inf, 0.0, np.nan, 1e39, 0.5])
    workers = np.arange(6)
    out = mod.encode_many(G, scalers, bounds, 9, 1, workers, 0, fmt)
    for w in range(6):
        want = mod.encode(G[w], scalers[w], bounds[w], StreamKey(9, 1, w, 0), fmt)
        assert np.array_equal(out[w], want), w
        assert np.array_equal(out[w], _reference.encode(G[w], scalers[w], bounds[w], StreamKey(9, 1, w, 0), fmt))


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs NUMBA_NUM_THREADS >= 2")
def test_numba_thread_count_invariance(monkeypatch):
    for name in ("SERIAL_MOMENTS", "SERIAL_ABSMAX", "SERIAL_ENCODE"):
        monkeypatch.setattr(numba_common, name, 0)
    G = rows("wide", 3, 2 * 65536 + 7)
    before = numba.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            numba.set_num_threads(threads)
            a, s, f = _numba.moments_many(G, True)
            r = [fbits(a).tobytes(), fbits(s).tobytes(), f.tobytes()]
            for fmt in FORMATS:
                r.append(_numba.encode_many(G, a, np.full(3, np.inf), 5, 6, [0, 1, 2], 7, fmt).tobytes())
            results.append(r)
    finally:
        numba.set_num_threads(before)
    assert results[0] == results[1]


@pytest.mark.parametrize("module", list(MODULES))
def test_kernel_argument_errors(module):
    mod = MODULES[module]
    G = rows("normal", 2, 10)
    with pytest.raises(ValueError, match="float32"):
        mod.moments_many(G.astype(np.float64), True)
    with pytest.raises(ValueError, match="2-D"):
        mod.moments_many(G[0], True)
    with pytest.raises(ValueError, match="unknown packing"):
        mod.encode_many(G, [1.0, 1.0], [np.inf, np.inf], 0, 0, [0, 1], 0, "1bit")
    with pytest.raises(ValueError, match="scalers"):
        mod.encode_many(G, [1.0], [np.inf, np.inf], 0, 0, [0, 1], 0, "2bit")
    with pytest.raises(ValueError, match="workers"):
        mod.encode_many(G, [1.0, 1.0], [np.inf, np.inf], 0, 0, [0], 0, "2bit")
    with pytest.raises(ValueError):
        mod.encode_many(G, [1.0, 1.0], [np.inf, np.inf], 0, 0, [0, 2**32], 0, "2bit")
    with pytest.raises(ValueError):
        mod.encode_many(G, [1.0, 1.0], [np.inf, np.inf], 2**64, 0, [0, 1], 0, "2bit")


def test_empty_batches():
    for mod in MODULES.values():
        for shape in ((0, 5), (3, 0), (0, 0)):
            G = np.zeros(shape, np.float32)
            a, s, f = mod.moments_many(G, True)
            assert a.shape == (shape[0],) and (a == 0).all() and (s == 0).all() and f.all()
            for fmt in FORMATS:
                out = mod.encode_many(G, np.ones(shape[0]), np.full(shape[0], np.inf), 0, 0,
                                      np.arange(shape[0]), 0, fmt)
                assert out.shape == (shape[0], packing.packed_size(shape[1], fmt))


# -- the codec ---------------------------------------------------------------------------------------
def batch_layers(nw: int, seed: int = 0) -> dict:
    rng = np.random.default_rng([seed, nw])
    return {"conv.w": rng.standard_normal((nw, 4, 3, 5)).astype(np.float32),
            "conv.b": rng.standard_normal((nw, 4)).astype(np.float32),
            "fc.w": (rng.standard_normal((nw, 300, 250)) * 1e-3).astype(np.float32),
            "half": rng.standard_normal((nw, 33)).astype(np.float16),
            "double": rng.standard_normal((nw, 7, 11)),
            "empty": np.zeros((nw, 0, 3), np.float32),
            "tiny": rng.standard_normal((nw, 2)).astype(np.float32)}


def worker(layers: dict, w: int) -> dict:
    return {k: v[w] for k, v in layers.items()}


@pytest.mark.parametrize("kernels", ["reference", "numba"])
@pytest.mark.parametrize("clip", CLIPS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("nw", WORKERS)
def test_codec_batched_equals_per_worker(kernels, clip, fmt, nw):
    codec = TernGrad(clip=clip, packing=fmt, kernels=kernels, min_size=3, float_layers=("conv.b",))
    layers = batch_layers(nw)
    ids = np.arange(nw) * 3 + 1
    scalings = codec.scaling_many(layers)
    local = codec.local_scalers_many(scalings)
    assert local.shape == (nw, len(layers)) and local.dtype == np.float32
    per = [codec.scaling(worker(layers, w)) for w in range(nw)]
    for w in range(nw):
        assert np.array_equal(local[w].view(np.uint32), codec.local_scalers(per[w]).view(np.uint32))
        for i, sc in enumerate(scalings):
            assert (sc is None) == (per[w][i] is None)
            if sc is not None:
                assert isinstance(sc, ScalingBatch) and sc.worker(w) == per[w][i]
    shared = local.max(axis=0)
    for sh in (None, shared, np.tile(shared * np.float32(2), (nw, 1))):
        msgs = codec.encode_many(layers, SEED, 11, ids, sh, scalings)
        again = codec.encode_many(layers, SEED, 11, ids, sh)            # scalings computed inside
        assert len(msgs) == nw
        for w in range(nw):
            s_w = None if sh is None else (sh if sh.ndim == 1 else sh[w])
            want = codec.encode(worker(layers, w), StreamKey(SEED, 11, int(ids[w])), s_w, per[w])
            assert msgs[w].to_bytes() == want.to_bytes() == again[w].to_bytes(), (w, sh is None)
            assert msgs[w].layout == want.layout
    # the parts are rows of one batch array per layer; aggregation reads it without copying
    msgs = codec.encode_many(layers, SEED, 11, ids, shared, scalings)
    i = list(layers).index("fc.w")
    base = msgs[0].parts[i].base
    assert base is not None and base.shape[0] == nw
    assert all(m.parts[i].base is base for m in msgs)
    assert stacked_payloads([m.parts[i] for m in msgs]) is base
    per_msgs = [codec.encode(worker(layers, w), StreamKey(SEED, 11, int(ids[w])), shared) for w in range(nw)]
    got, want = codec.aggregate(msgs), codec.aggregate(per_msgs)
    assert all(np.array_equal(got[k].view(np.uint8), want[k].view(np.uint8)) for k in want)


def test_scaling_from_moments_many_matches_scalar():
    absmax = np.array([0.0, 1.0, 5.0, 1e-45, 3e38, 2.0, 2.0, 1.0, 7.0])
    sigma = np.array([0.0, 0.5, 0.1, 1e-46, 2e38, 0.8, 1e-300, 1.0, np.finfo(np.float64).max])
    for clip in CLIPS:
        for factor in (2.5, 1.0, 1e-3, 3):
            got = scaling_from_moments_many(absmax, sigma, clip, factor)
            for w in range(absmax.size):
                want = ternary.scaling_from_moments(float(absmax[w]), float(sigma[w]), clip, factor)
                assert tuple(fbits(v) for v in got.worker(w)) == tuple(fbits(v) for v in want), (clip, factor, w)
    with pytest.raises(ValueError, match="clip mode"):
        scaling_from_moments_many(absmax, sigma, "sometimes", 2.5)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_names_layer_and_worker(bad):
    codec = TernGrad(clip="explicit", kernels="numba", float_layers=("conv.b",))
    layers = batch_layers(4)
    for name in ("conv.w", "conv.b", "fc.w", "double"):
        lay = {k: v.copy() for k, v in layers.items()}
        lay[name][2].reshape(-1)[1] = bad
        lay[name][3].reshape(-1)[0] = bad
        for call in (lambda: codec.scaling_many(lay), lambda: codec.encode_many(lay, 0, 0, range(4))):
            with pytest.raises(NonFiniteGradientError) as e:
                call()
            assert e.value.layer == name and repr(name) in str(e.value)
            assert e.value.worker == 2 and "worker 2" in str(e.value) and e.value.count == 1
    # the lowest failing worker wins, at its first failing layer (the per-worker calls' order)
    lay = {k: v.copy() for k, v in layers.items()}
    lay["fc.w"][1, 0, 0] = bad
    lay["conv.w"][3, 0, 0, 0] = bad
    lay["double"][1, 0, 0] = bad
    with pytest.raises(NonFiniteGradientError) as e:
        codec.scaling_many(lay)
    assert (e.value.layer, e.value.worker) == ("fc.w", 1)


def test_codec_input_errors():
    codec = TernGrad(kernels="numba")
    layers = batch_layers(3)
    with pytest.raises(TypeError, match="'bad'"):
        codec.scaling_many({**layers, "bad": np.ones((3, 4), np.int32)})
    with pytest.raises(TypeError, match="'bad'"):
        codec.encode_many({**layers, "bad": np.ones((3, 4), np.complex64)}, 0, 0, [0, 1, 2])
    big = np.ones((3, 6))
    big[1, 2] = 1e39
    with pytest.raises(ValueError, match="'big'.*worker 1") as e:
        codec.scaling_many({"a": np.ones((3, 2)), "big": big})
    assert not isinstance(e.value, NonFiniteGradientError)
    with pytest.raises(ValueError, match="'b'.*leading"):
        codec.scaling_many({"a": np.ones((3, 2), np.float32), "b": np.ones((2, 2), np.float32)})
    with pytest.raises(ValueError, match="workers"):
        codec.encode_many(layers, 0, 0, [0, 1])
    local = codec.local_scalers_many(codec.scaling_many(layers))
    low = local.max(axis=0)
    low[2] = np.nextafter(low[2], np.float32(0))
    with pytest.raises(ValueError, match=f"{list(layers)[2]!r}.*worker"):
        codec.encode_many(layers, 0, 0, [0, 1, 2], shared_scalers=low)
    with pytest.raises(ValueError, match="shared scalers"):
        codec.encode_many(layers, 0, 0, [0, 1, 2], shared_scalers=low[:-1])
    with pytest.raises(ValueError):
        codec.encode_many(layers, 0, 0, [0, 1, 2], shared_scalers=np.full_like(low, np.inf))


# -- the in-process exchange: chunked downlink and batch payloads ----------------------------------
@pytest.mark.parametrize("mode", ["ps", "allreduce", "allgather"])
def test_inprocess_exchange_matches_unchunked(mode):
    """packed_code_mean on a layer longer than its chunk equals the whole-layer computation."""
    nw, n = 5, 3 * inprocess._CHUNK + 13
    codec = TernGrad(kernels="numba")
    rng = np.random.default_rng(0)
    layers = {"w": rng.standard_normal((nw, n)).astype(np.float32), "b": rng.standard_normal((nw, 3)).astype(np.float32)}
    sc = codec.scaling_many(layers)
    shared = codec.local_scalers_many(sc).max(axis=0)
    msgs = codec.encode_many(layers, 1, 2, range(nw), shared, sc)
    mean, info = inprocess.packed_code_mean(codec, msgs, mode, True)
    width = packing.uint_width(nw)
    down = 0
    for i, name in enumerate(layers):
        p = np.stack([m.parts[i] for m in msgs])
        size = layers[name].shape[1]
        intsum = packing.sum_codes(p, size, "2bit")
        if mode == "ps":
            payload = packing.pack_uint((intsum.astype(np.int32) + nw).astype(np.uint32), width)
            intsum = packing.unpack_uint(payload, size, width).astype(np.int32) - nw
            down += 4 + payload.size
        want = packing.scale_integer_sum(intsum, float(shared[i]), nw)
        if mode == "allgather":
            want = packing.weighted_sum(p, np.full(nw, shared[i]), size, "2bit", nw)
        assert np.array_equal(mean[name].view(np.uint32), want.view(np.uint32)), (mode, name)
    if mode == "ps":
        assert info["down_payload"] == down


def test_stacked_payloads_copies_foreign_rows():
    a = np.empty((3, 4), dtype=np.uint8)          # owns its data, like encode_many's payloads
    a[:] = np.arange(12).reshape(3, 4)
    assert stacked_payloads(list(a)) is a
    got = stacked_payloads([a[0], a[2], a[1]])
    assert got is not a and np.array_equal(got, a[[0, 2, 1]])
    got = stacked_payloads([a[0].copy(), a[1], a[2]])
    assert got is not a and np.array_equal(got, a)


# -- the CUDA wrapper on the nvcc host harness (stand-in CuPy) -------------------------------------
@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    import cuda_harness as tck

    if tck.NVCC is None:
        pytest.skip("nvcc not on PATH")
    import subprocess

    so = tmp_path_factory.mktemp("tg_cuda_batched") / "libtg_host.so"
    subprocess.run([tck.NVCC, *tck.HARNESS_FLAGS, "-o", str(so), str(tck.CUDA_DIR / "host_harness.cu")],
                   check=True, capture_output=True, timeout=900)
    return tck, tck.Harness(so)


@pytest.mark.nvcc
@pytest.mark.parametrize("nw", WORKERS)
@pytest.mark.parametrize("n", [0, 1, 5, 1000, 70000])
def test_cuda_wrapper_on_host_harness(harness, monkeypatch, nw, n):
    from tgsim import backend
    from tgsim.codecs.terngrad import cuda as _cuda

    tck, h = harness
    backend.gpu_available()
    _cuda._reset_cache()
    monkeypatch.setitem(sys.modules, "cupy", tck.fake_cupy(h, []))
    try:
        G = rows("wide", nw, n, seed=8)
        check_moments_many(_cuda, G)
        G = rows("normal", nw, n, seed=9)
        for clip, fmt in zip(CLIPS, ("2bit", "base3", "2bit")):
            check_encode_many(_cuda, G, clip, fmt)
    finally:
        _cuda._reset_cache()


# -- per-layer training metrics ----------------------------------------------------------------------
def test_row_abs_stats():
    G = rows("zeros", 4, 1001)
    cb = np.array([np.inf, 0.5, 1e-41, 0.0])
    st = row_abs_stats(G, cb)
    a = np.abs(G.astype(np.float64))
    np.testing.assert_allclose(st[:, 0], a.sum(axis=1), rtol=1e-13)
    np.testing.assert_allclose(st[:, 1], (a * a).sum(axis=1), rtol=1e-13)
    assert np.array_equal(st[:, 2], (a > cb[:, None]).sum(axis=1))
    assert np.array_equal(st[:, 3], a.max(axis=1))
    assert row_abs_stats(np.zeros((3, 0), np.float32)).tolist() == [[0.0] * 4] * 3


def test_layer_stats_match_the_per_worker_formulas():
    from tgsim.train.loop import _layer_stats

    codec = TernGrad(clip="explicit", kernels="numba", float_layers=("b",))
    rng = np.random.default_rng(5)
    grads = {"w": rng.standard_normal((3, 40, 30)).astype(np.float32), "b": rng.standard_normal((3, 30)).astype(np.float32),
             "e": np.zeros((3, 0), np.float32)}
    scalings = codec.scaling_many(grads)
    shared = codec.local_scalers_many(scalings).max(axis=0)
    for sh in (shared, None):
        got = {r["layer"]: r for r in _layer_stats(grads, sh, scalings)}
        for i, (name, g) in enumerate(grads.items()):
            gs = [g[w].astype(np.float64).reshape(-1) for w in range(3)]
            r = got[name]
            absmax = [np.abs(x).max() if x.size else 0.0 for x in gs]
            np.testing.assert_allclose(r["inf_l1"], np.mean([m * np.abs(x).sum() for m, x in zip(absmax, gs)]), rtol=1e-12)
            np.testing.assert_allclose(r["l2sq"], np.mean([x @ x for x in gs]), rtol=1e-12)
            assert r["scaler"] == (float(sh[i]) if sh is not None else float(np.mean(absmax)))
            if scalings[i] is None:
                assert np.isnan(r["clip_fraction"])
            else:
                want = np.mean([(np.abs(x) > scalings[i].clip_bound[w]).mean() if x.size else 0.0
                                for w, x in enumerate(gs)])
                assert r["clip_fraction"] == want
