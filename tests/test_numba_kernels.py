"""The fused Numba kernels (tgsim.codecs.terngrad.numba_kernels) against the array reference, bit for bit."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import njit

from tgsim.codecs import packing
from tgsim.codecs.terngrad import moments as stats, numba_common, quantizer as ternary
from tgsim.codecs.terngrad import numba_kernels as nk, reference as ref_kernels
from tgsim.rng import StreamKey, random_words

from fakes import EDGE_LAYER, EDGE_SEED, EDGE_STEP, EDGE_WORDS, KINDS, edge_threshold_rows, grad

SIZES = [0, 1, 3, 4, 5, 19, 20, 21, 65535, 65536, 65537, 200_003]
CLIPS = ["none", "explicit", "implicit"]
FORMATS = ["2bit", "base3"]
KEYS = [
    StreamKey(seed=0),
    StreamKey(seed=2**40 + 12345, step=7, worker=3, layer=11),
    StreamKey(seed=2**64 - 1, step=2**32 - 1, worker=2**32 - 1, layer=2**32 - 1),
]
MAX_THREADS = numba.config.NUMBA_NUM_THREADS


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(a.view(np.uint8), b.view(np.uint8)))


def same_bits_nan(a, b) -> bool:
    """same_bits, except that any NaN equals any NaN: IEEE 754 leaves the sign and payload of a NaN
    produced from NaN operands unspecified (x86 returns the first operand's, and compilers may
    swap commutative operands), so they differ between NumPy builds too."""
    a, b = np.asarray(a), np.asarray(b)
    na, nb_ = np.isnan(a), np.isnan(b)
    return bool(np.array_equal(na, nb_)) and same_bits(np.where(na, 0, a), np.where(nb_, 0, b))


def moments_bits(m: stats.LayerMoments):
    return (np.float64(m.absmax).view(np.uint64), np.float64(m.sigma).view(np.uint64), m.finite)


def ref_encode(g, scaling, key, fmt):
    return packing.pack(ternary.ternarize(g, scaling.scaler, key, scaling.clip_bound), fmt)


# -- Philox ------------------------------------------------------------------------------------
@njit
def _philox_from_njit(c, k):
    return nk.philox_block(c[0], c[1], c[2], c[3], k[0], k[1])


@pytest.mark.parametrize("counter, key, expected", [
    # Random123 known-answer vectors (kat_vectors, philox4x32 10 rounds)
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_block_known_answers(counter, key, expected):
    got = _philox_from_njit(np.array(counter, dtype=np.uint32), np.array(key, dtype=np.uint32))
    assert tuple(int(w) for w in got) == expected
    assert str(_philox_from_njit.nopython_signatures[0].return_type) == "UniTuple(uint32 x 4)"


@pytest.mark.parametrize("n", SIZES + [1 << 18])
@pytest.mark.parametrize("key", KEYS)
def test_random_words(n, key):
    assert same_bits(nk.random_words(n, key), random_words(n, key))


@pytest.mark.parametrize("start, n", [(1, 10), (3, 5), (65537, 70001), (4 * 2**32 - 9, 9)])
def test_random_words_offset(start, n):
    key = KEYS[1]
    assert same_bits(nk.random_words(n, key, start=start), random_words(n, key, start=start))


def test_random_words_range_checked():
    with pytest.raises(ValueError):
        nk.random_words(10, KEYS[0], start=4 * 2**32 - 5)


# -- moments -------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", SIZES + [4 * 65536 + 17, 9 * 65536 + 70000])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("need_sigma", [False, True])
def test_moments(n, kind, need_sigma):
    g = grad(kind, n)
    assert moments_bits(nk.moments(g, need_sigma)) == moments_bits(stats.layer_moments(g, need_sigma))


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("pos", [0, 1, 65536, 200_002])
@pytest.mark.parametrize("need_sigma", [False, True])
def test_moments_non_finite(bad, pos, need_sigma):
    g = grad("normal", 200_003)
    g[pos] = bad
    m = nk.moments(g, need_sigma)
    assert not m.finite and np.isnan(m.absmax) and np.isnan(m.sigma)
    assert moments_bits(m) == moments_bits(stats.layer_moments(g, need_sigma))


def test_moments_offset_mean():
    """A large common offset (K = g[0] shift) and constant layers."""
    g = (np.random.default_rng(3).standard_normal(300_001) * 1e-3 + 1e4).astype(np.float32)
    assert moments_bits(nk.moments(g, True)) == moments_bits(stats.layer_moments(g, True))
    c = np.full(70_000, -2.5, dtype=np.float32)
    assert moments_bits(nk.moments(c, True)) == moments_bits(stats.layer_moments(c, True))


@pytest.mark.parametrize("n", [65537, 65536 + 1023, 65536 + 1025, 100_000, 2 * 65536, 2 * 65536 + 1, 4 * 65536])
@pytest.mark.parametrize("kind", KINDS)
def test_moments_of_mid_size_rows_per_task(n, kind):
    """Rows of LANES < n <= 4 LANES in one task each (numba_moments._sigma_worker: the lane partials
    in blocks with the top three tree levels folded in, _sigma_mid): the reference's lane sums, bit for
    bit."""
    from tgsim.codecs.terngrad.numba_moments import _sigma_serial

    rng = np.random.default_rng(n)      # exponents over 2^-40..2^40: float64 sums whose order shows
    G = np.stack([grad(kind, n), (grad("normal", n) * 3 + 1e3).astype(np.float32),
                  np.ldexp(rng.standard_normal(n), rng.integers(-40, 40, n)).astype(np.float32)])
    sums, mb = np.empty((3, 2)), np.empty(3, dtype=np.uint32)
    _sigma_serial(G, G.view(np.uint32), sums, mb)
    for w in range(3):
        assert mb[w:w + 1].view(np.float32)[0] == np.abs(G[w]).max()
        _, s1, s2 = stats.lane_sums(G[w])            # the sums themselves, not only σ
        assert np.array([s1, s2]).view(np.uint64).tolist() == sums[w].view(np.uint64).tolist()


# -- encode --------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("clip", CLIPS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_encode(n, kind, clip, fmt):
    g = grad(kind, n)
    m = stats.layer_moments(g, True)
    sc = ternary.scaling_from_moments(m.absmax, m.sigma, clip, 2.5)
    key = KEYS[(n + len(kind)) % len(KEYS)]
    got = nk.encode(g, sc.scaler, sc.clip_bound, key, fmt)
    assert got.dtype == np.uint8 and got.size == packing.packed_size(n, fmt)
    assert same_bits(got, ref_encode(g, sc, key, fmt))


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_keys(key, fmt):
    g = grad("normal", 65537, seed=1)
    for clip in CLIPS:
        m = stats.layer_moments(g, True)
        sc = ternary.scaling_from_moments(m.absmax, m.sigma, clip, 1.5)
        assert same_bits(nk.encode(g, sc.scaler, sc.clip_bound, key, fmt), ref_encode(g, sc, key, fmt))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scaler, clip_bound", [
    (0.0, np.inf),                  # all-zero layer: s = 0 -> zero codes (here on a non-zero layer too)
    (1e-45, np.inf), (3.0e38, np.inf), (np.inf, np.inf), (np.nan, np.inf), (-1.0, np.inf),
    (0.5, 0.25), (0.5, 0.0), (0.5, -np.inf), (0.5, np.nan), (0.5, 1e300), (0.1, 0.1000000001),
])
def test_encode_edge_scalers(fmt, scaler, clip_bound):
    key = KEYS[1]
    for kind in ("normal", "zeros", "allzero"):
        g = grad(kind, 1237)
        g[:4] = [np.inf, -np.inf, np.nan, 0.5]
        ref = packing.pack(ternary.ternarize(g, scaler, key, clip_bound), fmt)
        assert same_bits(nk.encode(g, scaler, clip_bound, key, fmt), ref), kind


# s = 1 and 2^-30: every boundary t s / 2^24 is a float32 (ties); 0.3: a scaler whose boundaries round;
# the largest float32 and the smallest subnormal: the ends of the scaler's range.
@pytest.mark.parametrize("scaler", [1.0, 2.0**-30, 0.3, 3.4028235e38, 1e-45])
@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_at_the_edge_thresholds(scaler, fmt):
    """The kernel's rule where the reference's exact comparison f64(t) f64(s) < f64(x) 2^24 is
    decided by one unit: x at the boundary t s / 2^24 of its word and one float32 step either side,
    x = s (|g| = s) and around it, for the smallest (t = 0, 1) and largest (t = 2^24 - 2, 2^24 - 1)
    thresholds (fakes.edge_threshold_rows), explicitly clipped or not, serial (n = 5: the full-block
    and the partial-block byte) and parallel (W n >= SERIAL_ENCODE), against the reference, bit for bit."""
    s = np.float32(scaler)
    for n in (5, 413):
        G, workers = edge_threshold_rows(s, n)
        for cb in (np.inf, s):
            args = ([s] * len(G), [cb] * len(G), EDGE_SEED, EDGE_STEP, workers, EDGE_LAYER, fmt)
            assert same_bits(nk.encode_many(G, *args), ref_kernels.encode_many(G, *args)), (n, cb)
    # the rule by hand at the last threshold word t = 2^24 - 1 with s = 1 (element 0 of the worker):
    # x = t / 2^24 ties (t s < x 2^24 is false: code 0); x = s keeps (code +1)
    if scaler == 1.0:
        w = EDGE_WORDS[2**24 - 1][0][0]
        assert EDGE_WORDS[2**24 - 1][0][1] == 0
        g = np.array([[(2**24 - 1) / 2**24, 0, 0, 0], [1.0, 0, 0, 0]], dtype=np.float32)
        codes = packing.unpack(nk.encode_many(g, [1.0, 1.0], [np.inf] * 2, EDGE_SEED, EDGE_STEP, [w, w],
                                              EDGE_LAYER, "2bit").reshape(-1), 8, "2bit")
        assert codes[0] == 0 and codes[4] == 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_all_zero_layer_gives_zero_codes(fmt):
    g = grad("allzero", 65537)
    m = nk.moments(g, True)
    assert m.absmax == 0.0 and m.sigma == 0.0 and m.finite
    for clip in CLIPS:
        sc = ternary.scaling_from_moments(m.absmax, m.sigma, clip, 2.5)
        p = nk.encode(g, sc.scaler, sc.clip_bound, KEYS[1], fmt)
        assert not packing.unpack(p, g.size, fmt).any()


def test_encode_non_contiguous_input():
    g = grad("normal", 40_001)[::2]
    sc = ternary.scaling_from_moments(float(np.abs(g).max()), 0.0, "none", 2.5)
    for fmt in FORMATS:
        assert same_bits(nk.encode(g, sc.scaler, sc.clip_bound, KEYS[2], fmt),
                         ref_encode(np.ascontiguousarray(g), sc, KEYS[2], fmt))


# -- weighted_sum / sum_codes ------------------------------------------------------------------------
def payloads_for(n: int, fmt: str, workers: int, seed: int = 0):
    """(W, nbytes) payloads of W workers encoding different layers with their own keys."""
    out = []
    for w in range(workers):
        g = grad("normal" if w % 3 else "zeros", n, seed=seed + w)
        m = stats.layer_moments(g, True)
        sc = ternary.scaling_from_moments(m.absmax, m.sigma, "explicit" if w % 2 else "none", 2.0)
        out.append(ref_encode(g, sc, StreamKey(seed=99 + seed, step=1, worker=w, layer=2), fmt))
    return np.stack(out) if out else np.zeros((0, packing.packed_size(n, fmt)), dtype=np.uint8)


def scaler_set(kind: str, workers: int) -> np.ndarray:
    rng = np.random.default_rng(workers)
    if kind == "shared":        # TernGrad's MAX-shared scaler: the exact integer-count path
        return np.full(workers, 0.0123, dtype=np.float32)
    if kind == "distinct":
        return rng.uniform(1e-3, 10.0, workers).astype(np.float32)
    if kind == "extreme":       # huge spread, a zero, a denormal, a negative
        s = (10.0 ** rng.uniform(-40, 38, workers)).astype(np.float32)
        s[:: 3] = 0.0
        if workers > 1:
            s[1] = -2.5
        if workers > 2:
            s[2] = 1e-45
        return s
    if kind == "nonfinite":
        s = np.full(workers, 0.75, dtype=np.float32)
        s[-1] = np.inf
        if workers > 1:
            s[0] = np.nan
        return s
    raise ValueError(kind)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("workers", [1, 3, 8])
def test_weighted_sum(n, fmt, workers):
    payloads = payloads_for(n, fmt, workers)
    for kind in ("shared", "distinct"):
        s = scaler_set(kind, workers)
        for divide_by in (1, workers, 3):
            got = nk.weighted_sum(payloads, s, n, fmt, divide_by)
            assert same_bits(got, packing.weighted_sum(payloads, s, n, fmt, divide_by)), (kind, divide_by)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("workers", [1, 2, 8, 9, 13])
@pytest.mark.parametrize("kind", ["shared", "distinct", "extreme", "nonfinite"])
@pytest.mark.parametrize("n", [21, 65537])
def test_weighted_sum_scalers(fmt, workers, kind, n):
    payloads = payloads_for(n, fmt, workers, seed=5)
    s = scaler_set(kind, workers)
    with np.errstate(all="ignore"):
        ref = packing.weighted_sum(payloads, s, n, fmt, workers)
    got = nk.weighted_sum(payloads, s, n, fmt, workers)
    assert same_bits_nan(got, ref) if kind == "nonfinite" else same_bits(got, ref)


def test_weighted_sum_out_and_no_workers():
    n = 1001
    p = payloads_for(n, "2bit", 4)
    s = scaler_set("shared", 4)
    out = np.full(n, np.nan, dtype=np.float32)
    assert nk.weighted_sum(p, s, n, "2bit", 4, out=out) is out
    assert same_bits(out, packing.weighted_sum(p, s, n, "2bit", 4))
    with pytest.raises(ValueError):
        nk.weighted_sum(p, s, n, "2bit", 4, out=np.empty(n, dtype=np.float64))
    empty = np.zeros((0, packing.packed_size(n, "2bit")), dtype=np.uint8)
    z = np.zeros(0, dtype=np.float32)
    assert same_bits(nk.weighted_sum(empty, z, n, "2bit", 1), packing.weighted_sum(empty, z, n, "2bit", 1))
    assert same_bits(nk.sum_codes(empty, n, "2bit"), packing.sum_codes(empty, n, "2bit"))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("workers", [1, 5, 8])
def test_sum_codes(n, fmt, workers):
    payloads = payloads_for(n, fmt, workers, seed=2)
    for dtype in (None, np.int16, np.uint8):       # int8 by default; wider; wrapping unsigned
        assert same_bits(nk.sum_codes(payloads, n, fmt, dtype), packing.sum_codes(payloads, n, fmt, dtype))


def test_sum_codes_many_workers():
    n = 999
    payloads = np.tile(payloads_for(n, "2bit", 3), (50, 1))       # 150 workers: int16 counts
    assert same_bits(nk.sum_codes(payloads, n, "2bit"), packing.sum_codes(payloads, n, "2bit"))
    s = scaler_set("shared", 150)
    assert same_bits(nk.weighted_sum(payloads, s, n, "2bit", 150),
                     packing.weighted_sum(payloads, s, n, "2bit", 150))


# -- thread-count invariance ------------------------------------------------------------------------
@pytest.mark.skipif(MAX_THREADS < 2, reason="needs NUMBA_NUM_THREADS >= 2")
def test_thread_count_invariance(monkeypatch):
    for name in ("SERIAL_MOMENTS", "SERIAL_ABSMAX", "SERIAL_ENCODE", "SERIAL_DECODE"):   # parallel drivers
        monkeypatch.setattr(numba_common, name, 0)
    n = 5 * 65536 + 77
    g = grad("wide", n)
    payloads = payloads_for(n, "2bit", 8)
    payloads3 = payloads_for(n, "base3", 3)
    results = []
    before = numba.get_num_threads()
    try:
        for threads in (1, 2):
            numba.set_num_threads(threads)
            r = [moments_bits(nk.moments(g, True)), moments_bits(nk.moments(g, False))]
            for clip in ("none", "explicit"):
                m = nk.moments(g, True)
                sc = ternary.scaling_from_moments(m.absmax, m.sigma, clip, 2.5)
                for fmt in FORMATS:
                    r.append(nk.encode(g, sc.scaler, sc.clip_bound, KEYS[1], fmt).tobytes())
            for kind in ("shared", "distinct"):
                r.append(nk.weighted_sum(payloads, scaler_set(kind, 8), n, "2bit", 8).tobytes())
            r.append(nk.weighted_sum(payloads3, scaler_set("distinct", 3), n, "base3", 3).tobytes())
            r.append(nk.sum_codes(payloads, n, "2bit").tobytes())
            r.append(nk.random_words(n, KEYS[2]).tobytes())
            results.append(r)
    finally:
        numba.set_num_threads(before)
    assert results[0] == results[1]


# -- validation ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", ["weighted_sum", "sum_codes"])
def test_invalid_2bit_byte_names_worker_and_byte(fn):
    n = 20_000
    p = payloads_for(n, "2bit", 6)
    p[3, 1234] = 0xFF
    p[5, 7] = 0b11000000          # a later worker: the lowest worker is reported
    call = (lambda q: nk.weighted_sum(q, scaler_set("shared", 6), n, "2bit", 6)) if fn == "weighted_sum" \
        else (lambda q: nk.sum_codes(q, n, "2bit"))
    with pytest.raises(ValueError, match=r"worker 3: invalid code 0b11 at byte 1234 \(0xff\)"):
        call(p)
    p[3, 1234] = 0x55
    p[3, 4000] = 0b00110000       # one bad pair in the middle of a byte
    p[3, 4001] = 0xC0
    with pytest.raises(ValueError, match=r"worker 3: invalid code 0b11 at byte 4000 \(0x30\)"):
        call(p)


@pytest.mark.parametrize("fn", ["weighted_sum", "sum_codes"])
def test_invalid_base3_byte(fn):
    n = 10_001
    p = payloads_for(n, "base3", 3)
    p[1, 1999] = 243
    p[2, 5] = 255
    with pytest.raises(ValueError, match=r"worker 1: invalid byte > 242 at byte 1999 \(0xf3\)"):
        if fn == "weighted_sum":
            nk.weighted_sum(p, scaler_set("distinct", 3), n, "base3", 3)
        else:
            nk.sum_codes(p, n, "base3")


@pytest.mark.parametrize("fmt, n", [("2bit", 4001), ("2bit", 4003), ("base3", 5001), ("base3", 5004)])
def test_nonzero_pad_codes(fmt, n):
    p = payloads_for(n, fmt, 4)
    k = packing.CODES_PER_BYTE[fmt]
    nb = p.shape[1]
    codes = packing.LUT[fmt][0][p[2, -1]].copy()
    codes[n - (nb - 1) * k] = 1                   # first pad code -> +1
    if fmt == "2bit":
        p[2, -1] = sum(int(c + 1) << (2 * m) for m, c in enumerate(codes))
    else:
        p[2, -1] = sum(int(c + 1) * 3 ** m for m, c in enumerate(codes))
    with pytest.raises(ValueError, match=r"worker 2: non-zero pad codes .*byte %d" % (nb - 1)):
        nk.weighted_sum(p, scaler_set("distinct", 4), n, fmt, 4)
    with pytest.raises(ValueError, match=r"worker 2: non-zero pad codes"):
        nk.sum_codes(p, n, fmt)


def test_wrong_shapes():
    n = 1000
    p = payloads_for(n, "2bit", 3)
    s = scaler_set("shared", 3)
    with pytest.raises(ValueError, match="bytes per worker"):
        nk.weighted_sum(p[:, :-1], s, n, "2bit", 3)
    with pytest.raises(ValueError, match="bytes per worker"):
        nk.sum_codes(p, n + 4, "2bit")
    with pytest.raises(ValueError, match="bytes per worker"):
        nk.weighted_sum(p, s, n, "base3", 3)
    with pytest.raises(ValueError, match="2-D uint8"):
        nk.weighted_sum(p[0], s[:1], n, "2bit", 1)
    with pytest.raises(ValueError, match="2-D uint8"):
        nk.sum_codes(p.astype(np.int16), n, "2bit")
    with pytest.raises(ValueError, match="scalers"):
        nk.weighted_sum(p, s[:2], n, "2bit", 3)
    with pytest.raises(ValueError, match="packing"):
        nk.weighted_sum(p, s, n, "3bit", 3)
    with pytest.raises(ValueError, match="packing"):
        nk.encode(np.zeros(4, np.float32), 1.0, np.inf, KEYS[0], "1bit")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("workers", [2, 8, 9])
@pytest.mark.parametrize("kind", ["shared", "distinct"])
def test_all_bytes_invalid(fmt, workers, kind):
    """Every byte invalid (0xff): the decoders must stay in bounds and report worker 0, byte 0."""
    n = 50_000
    p = np.full((workers, packing.packed_size(n, fmt)), 0xFF, dtype=np.uint8)
    with pytest.raises(ValueError, match=r"payload of worker 0: invalid .* at byte 0 \(0xff\)"):
        nk.weighted_sum(p, scaler_set(kind, workers), n, fmt, workers)
    with pytest.raises(ValueError, match=r"payload of worker 0: invalid .* at byte 0 \(0xff\)"):
        nk.sum_codes(p, n, fmt)
