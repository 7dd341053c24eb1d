"""The Numba kernels of sign, scaled_sign (tgsim.codecs.numba_sign), topk and randomk
(tgsim.codecs.numba_sparse), fp16 and bf16 (tgsim.codecs.numba_half) against their array reference,
bit for bit: the same message bytes (encode) and the same float32 bits (decode-sum / vote), on empty
layers, one element, sizes that are not a multiple of 8 or of the lane width, zeros, -0.0, denormals
and large values, float16/32/64 gradients, several (seed, step, worker) keys; kernels = "auto" /
"numba" take the Numba path on NumPy arrays, "reference" the array code."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from tgsim.codecs import numba_half, numba_sign, numba_sparse, sparse
from tgsim.codecs.bf16 import BFloat16
from tgsim.codecs.fp16 import Float16
from tgsim.codecs.sign import ScaledSign, SignSGD, l1_norm
from tgsim.codecs.sparse import RandomK, TopK
from tgsim.errors import PayloadError
from tgsim.rng import StreamKey

KEYS = [(0, 0, (0, 1, 2)), (2024, 7, (3, 0, 11)), (2**64 - 1, 2**32 - 1, (2**32 - 1, 5, 6))]
SIZES = [(0,), (1,), (7,), (3, 3), (513,), (1001,), (4099,), (70001,), (2, 65537)]


def _values(n: int, kind: str, rng, dtype=np.float32) -> np.ndarray:
    """(3, n) worker rows of one kind of data: Gaussian, with zeros, denormal, large, constant, ties."""
    if kind == "gauss":
        g = rng.standard_normal((3, n))
    elif kind == "zeros":                      # an all-zero row, a row with a few zeros, -0.0
        g = rng.standard_normal((3, n))
        g[0] = 0.0
        g[1, ::3] = 0.0
        g[2, ::2] = -0.0
    elif kind == "denormal":                   # float32 subnormals (and a few normals near them)
        g = rng.standard_normal((3, n)) * 1e-41
        g[1, ::5] *= 1e5
        g[2] = 1e-45                           # the scale f32(l1 / n) rounds to 0 (planes 0)
    elif kind == "large":                      # near float32's max, mixed with ordinary values
        g = rng.uniform(-1, 1, (3, n)) * 3e38
        g[2, ::2] = rng.standard_normal(g[2, ::2].shape)
    elif kind == "const":
        g = np.full((3, n), -0.75)
    elif kind == "ties":                       # few distinct magnitudes: ties everywhere
        g = rng.integers(-3, 4, (3, n)).astype(np.float64) * 0.5
    else:
        raise ValueError(kind)
    return g.astype(dtype)


KINDS = ["gauss", "zeros", "denormal", "large", "const", "ties"]


def _layers(shape, kind, rng, dtype=np.float32) -> dict:
    n = int(np.prod(shape))
    g = _values(n, kind, rng, dtype).reshape((3,) + tuple(shape))
    return {"w": g, "empty": np.zeros((3, 0), dtype), "one": g.reshape(3, -1)[:, :1].copy()}


def _same_bits(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype == np.float32 and a[k].shape == b[k].shape
        assert a[k].tobytes() == b[k].tobytes(), k


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
    assert [m.to_bytes() for m in m_ref] == [m.to_bytes() for m in m_fast]
    for msgs in (m_ref, m_fast):
        _same_bits(ref.aggregate(msgs, divide_by), fast.aggregate(msgs, divide_by))
    received = [fast.from_bytes(m.to_bytes(), m) for m in m_fast]      # planes rebuilt from the wire
    _same_bits(ref.aggregate(received, divide_by), fast.aggregate(received, divide_by))
    _same_bits(ref.aggregate(received[:2]), fast.aggregate(received[:2]))  # an even count: ties
    auto = make("auto")
    assert [m.to_bytes() for m in m_ref] == [m.to_bytes() for m in auto.encode_many(layers, seed, step, workers)]


# -- sign and scaled_sign -------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SIZES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cls", [SignSGD, ScaledSign])
def test_sign_numba_equals_reference_bytes_and_vote(cls, shape, kind):
    rng = np.random.default_rng(zlib.crc32(repr((cls.name, shape, kind)).encode()))
    for (seed, step, workers), dtype in zip(KEYS, (np.float32, np.float64, np.float16)):
        with np.errstate(over="ignore"):
            layers = _layers(shape, kind, rng, dtype)
        if not all(np.isfinite(g).all() for g in layers.values()):
            continue                           # float16 "large": infinite, refused by prepare_many alike
        _check_codec(lambda kern: cls(kernels=kern), layers, seed, step, workers)


@pytest.mark.parametrize("n", [1, 8, 9, 255, 4096, 65535, 65536, 65537, 3 * 65536 + 17, 2**20 + 3])
def test_scaled_sign_numba_scale_is_the_lane_sum(n):
    """c = f32(l1_norm / n) with l1_norm's lanes and halving tree, every lane width up to LANES and
    rows of several lane blocks (the parallel split over lanes); planes equal np.packbits'."""
    rng = np.random.default_rng(n)
    g = (rng.standard_normal((2, n)) * np.exp(rng.uniform(-20, 20, (2, n)))).astype(np.float32)
    g[1, ::7] = 0.0
    c, dense, neg, nz = numba_sign.scaled_planes(g)
    for i in range(2):
        assert c[i].tobytes() == np.float32(l1_norm(g[i]) / n).tobytes()
        assert neg[i].tobytes() == np.packbits(g[i] < 0, bitorder="little").tobytes()
        assert nz[i].tobytes() == np.packbits(g[i] != 0, bitorder="little").tobytes()
        assert bool(dense[i]) == bool((g[i] != 0).all())


@pytest.mark.parametrize("n_msgs", [1, 2, 3, 4, 7, 8, 255, 256, 300])
def test_sign_numba_vote_any_message_count(n_msgs):
    """The vote of 1..300 messages (counts past uint8), ties for even counts."""
    rng = np.random.default_rng(n_msgs)
    n = 1003
    g = rng.standard_normal((n_msgs, n)).astype(np.float32)
    g[:, :50] = np.where(np.arange(n_msgs)[:, None] % 2 == 0, 1.0, -1.0)     # exact ties where N is even
    ref, fast = SignSGD(kernels="reference"), SignSGD(kernels="numba")
    msgs = ref.encode_many({"g": g}, 1, 0, list(range(n_msgs)))
    _same_bits(ref.aggregate(msgs), fast.aggregate(msgs))


def test_sign_kernel_choice_and_repr():
    with pytest.raises(ValueError, match="unknown kernels"):
        SignSGD(kernels="fast")
    assert repr(ScaledSign()) == "ScaledSign()" and "kernels='reference'" in repr(SignSGD(kernels="reference"))


@pytest.mark.parametrize("n_msgs", [1, 2, 8, 9, 12])
@pytest.mark.parametrize("n", [4095, 4096, 70001])
def test_scaled_sign_numba_mean_table_and_loop(n_msgs, n):
    """The tabulated mean (up to 8 messages; 2^16 patterns where some layer has zeros) and the
    per-message loop (more messages, or small layers), with dense rows, rows with zeros, an all-zero
    row (planes 0) and divide_by other than the count."""
    rng = np.random.default_rng(n_msgs * 1000 + n)
    g = rng.standard_normal((n_msgs, n)).astype(np.float32) * rng.uniform(0.1, 10, (n_msgs, 1)).astype(np.float32)
    ref, fast = ScaledSign(kernels="reference"), ScaledSign(kernels="numba")
    for zeros in (False, True):
        if zeros:
            g[::2, ::3] = 0.0
            g[-1] = 0.0
        msgs = ref.encode_many({"g": g}, 1, 0, list(range(n_msgs)))
        for divide_by in (None, 5):
            _same_bits(ref.aggregate(msgs, divide_by), fast.aggregate(msgs, divide_by))


# -- topk and randomk -----------------------------------------------------------------------------------
SPARSE = [dict(density=0.01), dict(density=0.3), dict(k=1), dict(k=5), dict(density=1.0), dict(k=70000)]


@pytest.mark.parametrize("shape", SIZES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cls", [TopK, RandomK])
def test_sparse_numba_equals_reference_bytes_and_mean(cls, shape, kind):
    rng = np.random.default_rng(zlib.crc32(repr((cls.name, shape, kind)).encode()))
    for (seed, step, workers), dtype in zip(KEYS, (np.float32, np.float64, np.float16)):
        with np.errstate(over="ignore"):
            layers = _layers(shape, kind, rng, dtype)
        if not all(np.isfinite(g).all() for g in layers.values()):
            continue
        for opts in SPARSE:
            _check_codec(lambda kern: cls(**opts, kernels=kern), layers, seed, step, workers)


@pytest.mark.parametrize("n", [65535, 65536, 2**18 + 7, 2**20 + 3])
@pytest.mark.parametrize("k", [1, 100, 2621, 16384, 70000])
def test_topk_numba_large_layers_ties_and_candidates(n, k):
    """Layers from 2^16 elements take the sampled candidate pass; ties at the threshold (few distinct
    magnitudes) go to the lowest indices, and a sample that misses (candidates < k) falls back."""
    rng = np.random.default_rng(n + k)
    for v in (rng.standard_normal(n).astype(np.float32),
              (rng.integers(-40, 41, n) * 0.25).astype(np.float32),
              np.where(np.arange(n) % 1000 == 0, 5.0, 1.0).astype(np.float32),       # sample sees no 5.0
              rng.standard_normal(n)):
        if 4 * k > n:
            continue
        want = sparse.top_k_indices(np.abs(v), k)
        idx, val = numba_sparse.top_k(v, k)
        assert idx.tobytes() == want.tobytes() and val.tobytes() == v[want].tobytes()


@pytest.mark.parametrize("n", [2**15 + 1, 2**17 + 5, 2**20])
def test_randomk_numba_draw_equals_reference(n):
    """The fused draw against RandomK._select: the parallel tasks, the keep test on the 24-bit grid
    and the values v / p~; p = 1 elements (large |v|) are always kept."""
    rng = np.random.default_rng(n)
    v = (rng.standard_normal(n) * np.exp(rng.uniform(-3, 3, n))).astype(np.float32)
    v[::11] = 0.0
    for density in (0.001, 0.01, 0.2):
        codec = RandomK(density=density, kernels="reference")
        key = StreamKey(7, 3, 2, 1)
        ri, rv = codec._select(v, key)
        ni, nv = RandomK(density=density)._select_numba(v, key)
        assert ri.astype(np.int64).tobytes() == ni.tobytes() and rv.tobytes() == nv.tobytes()


@pytest.mark.parametrize("n_msgs", [1, 2, 8, 13])
def test_sparse_numba_decode_sum_overlapping_indices(n_msgs):
    """Messages that send the same elements (sums in message order), cancelling values, divide_by."""
    rng = np.random.default_rng(n_msgs)
    n = 50001
    g = rng.standard_normal((n_msgs, n)).astype(np.float32)
    g[:, :100] = 1e30 * np.where(np.arange(n_msgs)[:, None] % 2, -1, 1)        # cancelling big values
    for cls in (TopK, RandomK):
        ref, fast = cls(density=0.05, kernels="reference"), cls(density=0.05, kernels="numba")
        msgs = ref.encode_many({"g": g, "h": g[:, :7].reshape(n_msgs, 7, 1)}, 1, 0, list(range(n_msgs)))
        for divide_by in (None, 3):
            _same_bits(ref.aggregate(msgs, divide_by), fast.aggregate(msgs, divide_by))


def test_sparse_kernel_choice_and_repr():
    with pytest.raises(ValueError, match="unknown kernels"):
        TopK(kernels="fast")
    assert repr(TopK()) == "TopK(density=0.01, k=0)"
    assert repr(RandomK(k=3, kernels="reference")) == "RandomK(density=0.01, k=3, kernels='reference')"


# -- fp16 and bf16 --------------------------------------------------------------------------------------
def test_fp16_numba_cast_equals_numpy_on_every_exponent_and_tie():
    """Every sign and exponent and the top 7 significand bits (2^16 high halves), with the low bits
    that decide the rounding (exact halves, just below and above them, odd and even kept bits), and
    a random sample: the float16 bits of NumPy's astype. NaN excluded (prepare_many refuses it)."""
    hi = np.arange(2**16, dtype=np.uint32) << np.uint32(16)
    lows = np.array([0, 1, 0x0FFF, 0x1000, 0x1001, 0x2000, 0x3000, 0x5000, 0x7FFF, 0x8000, 0x9000, 0xF000, 0xFFFF],
                    np.uint32)
    rnd = np.random.default_rng(0).integers(0, 2**32, 2**21, dtype=np.uint64).astype(np.uint32)
    u = np.concatenate([(hi[:, None] | lows[None, :]).reshape(-1), rnd])
    f = u.view(np.float32)
    f = f[~np.isnan(f)]
    with np.errstate(over="ignore"):
        want = f.astype(np.float16)
    assert numba_half.to_fp16(f).view(np.uint16).tobytes() == want.view(np.uint16).tobytes()
    g = f[:3 * 99991].reshape(3, 99991)                                      # the parallel split
    with np.errstate(over="ignore"):
        assert numba_half.to_fp16(g).tobytes() == g.astype(np.float16).tobytes()


@pytest.mark.parametrize("shape", SIZES)
@pytest.mark.parametrize("kind", ["gauss", "zeros", "denormal", "const", "ties"])
@pytest.mark.parametrize("cls", [Float16, BFloat16])
def test_half_numba_equals_reference_bytes_and_mean(cls, shape, kind):
    rng = np.random.default_rng(zlib.crc32(repr((cls.name, shape, kind)).encode()))
    for (seed, step, workers), dtype in zip(KEYS, (np.float32, np.float64, np.float16)):
        layers = _layers(shape, kind, rng, dtype)
        if cls is Float16:                                  # within float16's range, with its subnormals
            layers = {k: v * np.asarray(1e4 if kind == "denormal" else 1.0, dtype) for k, v in layers.items()}
        _check_codec(lambda kern: cls(kernels=kern), layers, seed, step, workers)


@pytest.mark.parametrize("n_msgs", [1, 2, 8, 13])
def test_half_numba_decode_sum_many_messages(n_msgs):
    rng = np.random.default_rng(n_msgs)
    g = (rng.standard_normal((n_msgs, 70001)) * np.exp(rng.uniform(-8, 8, (n_msgs, 70001)))).astype(np.float32)
    g = np.clip(g, -6e4, 6e4)
    for cls in (Float16, BFloat16):
        ref, fast = cls(kernels="reference"), cls(kernels="numba")
        msgs = ref.encode_many({"g": g}, 1, 0, list(range(n_msgs)))
        for divide_by in (None, 3):
            _same_bits(ref.aggregate(msgs, divide_by), fast.aggregate(msgs, divide_by))


def test_fp16_numba_decode_sum_every_half_pattern():
    """Every float16 bit pattern (zeros, subnormals, normals, inf, NaN) through the decode-sum: the
    finite ones by the exact float32 scaling, chunks with inf/NaN by the table."""
    from tgsim.codecs.ordered_mean import ordered_mean_flat

    every = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = every[np.isfinite(every)]
    msgs = [finite, finite[::-1].copy(), np.roll(finite, 12345)]
    for divide_by in (1, 3, 7):
        assert numba_half.decode_sum(msgs, finite.size, divide_by, bf16=False).tobytes() == \
            ordered_mean_flat(msgs, divide_by).tobytes()
    with np.errstate(invalid="ignore", over="ignore"):
        msgs = [every, np.roll(every, 999)]
        got, want = numba_half.decode_sum(msgs, every.size, 2, bf16=False), ordered_mean_flat(msgs, 2)
    assert np.array_equal(got, want, equal_nan=True)
    ok = ~np.isnan(want)
    assert got[ok].tobytes() == want[ok].tobytes()


def test_decode_sums_read_strided_messages_and_zero_planes():
    """Each decode-sum given the W messages as strided views (not C-contiguous) returns the same bits
    as given contiguous copies; scaled_mean with a None nonzero plane the same bits as with a plane of
    zeros (count 1: the plane is not read)."""
    from tgsim.codecs import numba_qsgd, numba_suresh

    rng = np.random.default_rng(5)
    n, w = 70001, 5
    wide = rng.standard_normal((w, 2 * n))

    def same(fn, strided):
        assert fn(strided).tobytes() == fn([np.ascontiguousarray(a) for a in strided]).tobytes()

    same(lambda m: numba_half.decode_sum(m, n, 3, bf16=False), [np.asarray(r, np.float16)[::2] for r in wide])
    same(lambda m: numba_half.decode_sum(m, n, 3, bf16=True),
         [(np.asarray(r, np.float32).view(np.uint32) >> 16).astype(np.uint16)[1::2] for r in wide])
    levels = rng.integers(-7, 8, (w, 2 * n)).astype(np.int8)
    norms = [rng.random(-(-n // 512)).astype(np.float32) for _ in range(w)]
    same(lambda m: numba_qsgd.decode_sum(m, norms, 7, 512, n, 3), [q[::2] for q in levels])
    ranges = [np.array([-1.0 - i, 2.0 + i], np.float32) for i in range(w)]
    same(lambda m: numba_suresh.decode_sum(m, ranges, 16, n, 3), [np.abs(q[1::2]).astype(np.uint8) for q in levels])
    planes = np.packbits(wide < 0, axis=1, bitorder="little")[:, : (n + 7) // 8 * 2]
    same(lambda m: numba_sign.majority_vote(m, n), [p[::2] for p in planes])
    signs = [np.ascontiguousarray(p[::2]) for p in planes]
    zero = np.zeros((n + 7) // 8, np.uint8)
    for table_size in (n, 1000):                          # the table path and the loop path
        args = ([1] * w, [np.float32(0.5 + i) for i in range(w)], table_size, 3)
        cut = [s[: (table_size + 7) // 8] for s in signs]
        assert numba_sign.scaled_mean(cut, [None] * w, *args).tobytes() == \
            numba_sign.scaled_mean(cut, [zero[: (table_size + 7) // 8]] * w, *args).tobytes()


def test_numba_rows_addresses_refuse_other_sizes_and_dtypes():
    from tgsim.codecs._numba_rows import addresses

    a = np.arange(10, dtype=np.int8)
    kept, addrs, like = addresses([a, a[::-1]], 10)
    assert addrs.dtype == np.int64 and like.dtype == np.int8 and all(k.flags.c_contiguous for k in kept)
    assert addrs[0] == a.ctypes.data
    with pytest.raises(ValueError):
        addresses([a, a[:9]], 10)
    with pytest.raises(ValueError):
        addresses([a, a.astype(np.int16)], 10)
