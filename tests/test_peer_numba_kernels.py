"""The Numba kernels of the peer codecs (tgsim.codecs.numba_qsgd, numba_suresh) against their array
reference, bit for bit: the same message bytes (encode) and the same float32 bits (decode-sum), on
empty layers, one element, sizes that are not a multiple of the packing or bucket widths, zeros,
denormals and large values, for several (seed, step, worker) keys; kernels = "auto" / "numba" take
the Numba path on NumPy arrays, "reference" the array code."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from tgsim.codecs import numba_qsgd, numba_suresh, qsgd
from tgsim.codecs.ordered_mean import ordered_mean_flat
from tgsim.codecs.qsgd import QSGD
from tgsim.codecs.suresh import Suresh
from tgsim.rng import StreamKey, uniform

from fakes import EDGE_LAYER, EDGE_SEED, EDGE_STEP, EDGE_WORDS

KEYS = [(0, 0, (0, 1, 2)), (2024, 7, (3, 0, 11)), (2**64 - 1, 2**32 - 1, (2**32 - 1, 5, 6))]
SIZES = [(0,), (1,), (7,), (3, 3), (513,), (1001,), (4099,), (70001,)]


def _values(n: int, kind: str, rng, dtype=np.float32) -> np.ndarray:
    """(3, n) worker copies of one kind of data: Gaussian, with zeros, denormal, large, constant."""
    if kind == "gauss":
        g = rng.standard_normal((3, n))
    elif kind == "zeros":                      # all-zero rows, a row with a few zeros, -0.0
        g = rng.standard_normal((3, n))
        g[0] = 0.0
        g[1, ::3] = 0.0
        g[2, ::2] = -0.0
    elif kind == "denormal":                   # float32 subnormals (and a few normals near them)
        g = rng.standard_normal((3, n)) * 1e-41
        g[1, ::5] *= 1e5
    elif kind == "large":                      # near float32's max, mixed with ordinary values
        g = rng.uniform(-1, 1, (3, n)) * 3e38
        g[2, ::2] = rng.standard_normal(g[2, ::2].shape)
    elif kind == "const":
        g = np.full((3, n), -0.75)
    else:
        raise ValueError(kind)
    return g.astype(dtype)


def _layers(shape, kind, rng, dtype=np.float32) -> dict:
    n = int(np.prod(shape))
    g = _values(n, kind, rng, dtype).reshape((3,) + tuple(shape))
    return {"w": g, "empty": np.zeros((3, 0), dtype), "one": g.reshape(3, -1)[:, :1].copy()}


def _same_messages(a, b) -> None:
    assert [m.to_bytes() for m in a] == [m.to_bytes() for m in b]
    for ma, mb in zip(a, b):
        for k in ma.levels:
            assert ma.levels[k].dtype == mb.levels[k].dtype
            assert ma.levels[k].tobytes() == mb.levels[k].tobytes()


def _same_bits(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype == np.float32 and a[k].shape == b[k].shape
        assert a[k].tobytes() == b[k].tobytes(), k


@np.errstate(over="ignore")     # the reference decode of a rotated "large" layer overflows float32 alike
def _check_codec(make, layers, seed, step, workers, divide_by=3):
    ref, fast = make("reference"), make("numba")
    try:
        m_ref = ref.encode_many(layers, seed, step, workers)
    except ValueError as e:                    # refused: the Numba path refuses with the same words
        with pytest.raises(ValueError) as got:
            fast.encode_many(layers, seed, step, workers)
        assert str(got.value) == str(e)
        return
    m_fast = fast.encode_many(layers, seed, step, workers)
    _same_messages(m_ref, m_fast)
    _same_bits(ref.aggregate(m_ref, divide_by), fast.aggregate(m_ref, divide_by))
    received = [fast.from_bytes(m.to_bytes(), m) for m in m_fast]          # levels rebuilt from the wire
    _same_bits(ref.aggregate(received, divide_by), fast.aggregate(received, divide_by))
    auto = make("auto")
    _same_messages(m_ref, auto.encode_many(layers, seed, step, workers))


# -- qsgd -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SIZES)
@pytest.mark.parametrize("kind", ["gauss", "zeros", "denormal", "large", "const"])
def test_qsgd_numba_equals_reference_bytes_and_mean(shape, kind):
    rng = np.random.default_rng(zlib.crc32(repr((shape, kind)).encode()))
    layers = _layers(shape, kind, rng)
    for (seed, step, workers), (levels, bucket, norm) in zip(KEYS, [(7, 512, "l2"), (3, 0, "max"), (300, 7, "l2")]):
        _check_codec(lambda kern: QSGD(levels=levels, bucket=bucket, norm=norm, coding="fixed", kernels=kern), layers,
                     seed, step, workers)


@pytest.mark.parametrize("levels", [1, 2, 7, 15, 127, 128, 255, 1000, 65535])
@pytest.mark.parametrize("bucket", [0, 1, 3, 8, 512, 1000, 10**6])
def test_qsgd_numba_every_word_width_and_bucket(levels, bucket):
    """Word widths 2..17 bits (the w = 4 and w = 8 fast paths and the general bit loop), buckets
    shorter and longer than a task, a layer of one bucket; both norms; float16/32/64 gradients."""
    rng = np.random.default_rng(levels * 7919 + bucket)
    n = 9001
    for dtype, norm in ((np.float32, "l2"), (np.float64, "max"), (np.float16, "l2")):
        v = (rng.standard_normal(n) * 3).astype(dtype)
        key = StreamKey(11, 2, 5, 3)
        norms, q = qsgd.quantize(v, key, levels, bucket, norm)
        payload, nbits = qsgd.pack_fixed(q, levels)
        got = numba_qsgd.encode(v, key, levels, bucket, norm, qsgd.level_dtype(levels))
        assert got[0].tobytes() == norms.tobytes()
        assert got[1].dtype == q.dtype and got[1].tobytes() == q.tobytes()
        assert got[2].tobytes() == payload.tobytes() and got[3] == nbits
        decoded = [qsgd.dequantize(norms, q, levels, bucket)] * 2
        _same_bits({"g": ordered_mean_flat(decoded, 2)},
                   {"g": numba_qsgd.decode_sum([q, q], [norms, norms], levels, bucket, n, 2)})


def test_qsgd_numba_rounds_exact_integers_like_the_reference():
    """l = floor(x + u) where x + u is an integer exactly, and one float64 step either side: s = 7,
    "max" norm 7 (the last element; x = |v| 7 / 7 = |v| exactly), float64 layers v_i = ±(k - u_i)
    for k = 1..7 (k - u_i: at most 27 significant bits, exact; no step above 7, which would move the
    norm), and v = 0 (x + u = 0 where u = 0),
    on the streams whose first words have the smallest (t = 0, 1) and largest (2^24 - 2, 2^24 - 1)
    24-bit draws (fakes.EDGE_WORDS): the Numba levels are the reference's, bit for bit."""
    n = 8
    for places in EDGE_WORDS.values():
        for w, m in places:
            key = StreamKey(EDGE_SEED, EDGE_STEP, w, EDGE_LAYER)
            u = uniform(n, key)
            rows = [np.zeros(n)]
            for k in range(1, 8):
                tie = k - u
                rows += [tie, np.nextafter(tie, 0)] + ([np.nextafter(tie, 8)] if k < 7 else [])   # |v| <= 7
            for v in rows:
                v = np.where(np.arange(n) % 2, -v, v)
                v[n - 1] = 7.0
                norms, q = qsgd.quantize(v, key, 7, 0, "max")
                got = numba_qsgd.encode(v, key, 7, 0, "max", qsgd.level_dtype(7))
                assert got[0].tobytes() == norms.tobytes() and norms[0] == 7.0
                assert got[1].tobytes() == q.tobytes(), (w, m, v, q, got[1])
    # by hand: x = 7 - u at u = 1 - 2^-24 (the largest draw, element 0 of worker EDGE_WORDS[2^24 - 1][0])
    # gives x + u = 7: level 7; one step below, 6
    w, m = EDGE_WORDS[2**24 - 1][0]
    v = np.array([7 - (1 - 2.0**-24), np.nextafter(7 - (1 - 2.0**-24), 0), 0, 7.0])
    got = numba_qsgd.encode(v, StreamKey(EDGE_SEED, EDGE_STEP, w, EDGE_LAYER), 7, 0, "max", np.int8)
    assert m == 0 and got[1][0] == 7


def test_qsgd_numba_large_whole_layer_norm_is_numpys_pairwise_sum():
    """A one-bucket layer of 2^20 + 5 elements: the l2 norm is NumPy's pairwise sum (many levels of
    the split), and the parallel tasks give the serial bits."""
    rng = np.random.default_rng(3)
    v = rng.standard_normal(2**20 + 5).astype(np.float32)
    key = StreamKey(5, 1, 2, 0)
    norms, q = qsgd.quantize(v, key, 7, 0, "l2")
    got = numba_qsgd.encode(v, key, 7, 0, "l2", np.int8)
    assert got[0].tobytes() == norms.tobytes() and got[1].tobytes() == q.tobytes()
    assert got[2].tobytes() == qsgd.pack_fixed(q, 7)[0].tobytes()


def test_qsgd_numba_elias_coding_and_kernel_choice():
    rng = np.random.default_rng(4)
    layers = _layers((2, 999), "gauss", rng)
    _check_codec(lambda kern: QSGD(levels=15, bucket=64, coding="elias", kernels=kern), layers, 9, 1, [0, 1, 2])
    with pytest.raises(ValueError, match="unknown kernels"):
        QSGD(kernels="fast")
    assert "kernels='reference'" in repr(QSGD(kernels="reference")) and "kernels" not in repr(QSGD())


# -- suresh -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SIZES)
@pytest.mark.parametrize("kind", ["gauss", "zeros", "denormal", "large", "const"])
@pytest.mark.parametrize("rotate", [False, True])
def test_suresh_numba_equals_reference_bytes_and_mean(shape, kind, rotate):
    rng = np.random.default_rng(zlib.crc32(repr((shape, kind, rotate)).encode()))
    layers = _layers(shape, kind, rng)
    for (seed, step, workers), levels in zip(KEYS, (7, 2, 300)):
        _check_codec(lambda kern: Suresh(levels=levels, rotate=rotate, kernels=kern), layers, seed, step, workers)


@pytest.mark.parametrize("levels", [2, 3, 7, 8, 16, 17, 255, 256, 257, 4096, 65536])
def test_suresh_numba_every_code_width(levels):
    """Code widths 1..16 bits (the 8-bit fast path and the general little-endian bit loop),
    float16/32/64 gradients, with and without rotation."""
    rng = np.random.default_rng(levels)
    for dtype, rotate in ((np.float32, False), (np.float64, True), (np.float16, False), (np.float32, True)):
        layers = {"g": (rng.standard_normal((2, 3001)) * 2).astype(dtype)}
        _check_codec(lambda kern: Suresh(levels=levels, rotate=rotate, kernels=kern), layers, 3, 4, [1, 8], 2)


def test_suresh_numba_refuses_out_of_range_like_the_reference():
    g = {"g": np.array([[1e300, 1.0]], np.float64)}
    for kern in ("reference", "numba"):
        with pytest.raises(ValueError, match="layer 'g' of worker 0: suresh sends float32 ranges"):
            Suresh(kernels=kern).encode_many(g, 1, 0, [0])


def test_suresh_numba_fwht_and_rotation_equal_the_reference():
    from tgsim.codecs import suresh

    rng = np.random.default_rng(5)
    for n in (1, 2, 3, 100, 4096, 5000):
        v = rng.standard_normal(n).astype(np.float32)
        key = StreamKey(8, 1, 2, 3)
        d = suresh.padded_size(n)
        assert numba_suresh.rotate(v, key, d, 1.0 / np.sqrt(d)).tobytes() == suresh.rotate(v, key).tobytes()
        y = rng.standard_normal(d)
        z = y.copy()
        numba_suresh._fwht(z)
        assert z.tobytes() == suresh.fwht(y).tobytes()
