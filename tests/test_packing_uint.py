"""The parameter server's downlink packing: Numba kernel == array reference, bit for bit."""

import numpy as np
import pytest

from tgsim.codecs import packing


@pytest.mark.parametrize("width", [1, 2, 3, 5, 7, 8, 9, 12])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1001, 70_003])
def test_pack_unpack_uint_match_reference(width, n):
    rng = np.random.default_rng(width * 1000 + n)
    v = rng.integers(0, 2**width, n).astype(np.uint32)
    ref = packing.pack_uint_reference(v, width)
    fast = packing.pack_uint(v, width)
    assert fast.dtype == np.uint8 and np.array_equal(fast, ref)
    assert np.array_equal(packing.unpack_uint(ref, n, width), v)
    assert np.array_equal(packing.unpack_uint_reference(ref, n, width), v)


def test_pack_uint_rejects_values_too_wide_and_wrong_lengths():
    with pytest.raises(ValueError, match="does not fit"):
        packing.pack_uint(np.array([0, 32], np.uint32), 5)
    with pytest.raises(ValueError, match="cannot hold"):
        packing.unpack_uint(np.zeros(3, np.uint8), 5, 5)


@pytest.mark.parametrize("workers", [1, 2, 5, 8, 127])
@pytest.mark.parametrize("n", [0, 1, 9, 70_003])
def test_fused_downlink_kernels_match_reference(workers, n):
    """pack_offset == pack_uint(intsum + N) and decode_scaled == scale_integer_sum(unpack - N), bit for bit."""
    from tgsim.codecs import _numba_uint

    rng = np.random.default_rng(workers * 7 + n)
    intsum = rng.integers(-workers, workers + 1, n).astype(np.int8)
    width = packing.uint_width(workers)
    ref = packing.pack_uint_reference((intsum.astype(np.int32) + workers).astype(np.uint32), width)
    assert np.array_equal(_numba_uint.pack_offset(intsum, workers, width), ref)
    s = np.float32(rng.random() * 3)
    out, top = _numba_uint.decode_scaled(ref, n, width, workers, float(s), workers)
    expect = packing.scale_integer_sum(intsum.astype(np.int32), float(s), workers)
    assert np.array_equal(out.view(np.uint32), expect.view(np.uint32))
    assert top == (int(intsum.max()) + workers if n else 0)
    if n:
        with pytest.raises(ValueError, match="do not fit"):
            _numba_uint.pack_offset(np.full(n, 2**width, np.int16), 0, width)


@pytest.mark.parametrize("where", [0, 33_000, 70_001])          # first block, a later block, the tail
@pytest.mark.parametrize("bad", [-1, 17])
def test_pack_offset_finds_one_value_that_does_not_fit_anywhere(where, bad):
    """One value outside [0, 2^width) among 70,003 -- in a full group of any block or in the short
    tail, below 0 or above the top -- is reported (the kernel's branch-free count must see it)."""
    from tgsim.codecs import _numba_uint

    v = np.full(70_003, 3, np.int16)
    v[where] = bad - 8                                                # offset 8, width 4: [0, 15]
    with pytest.raises(ValueError, match="do not fit"):
        _numba_uint.pack_offset(v, 8, 4)
    v[where] = 7                                                      # 15: the top value fits
    assert np.array_equal(_numba_uint.pack_offset(v, 8, 4),
                          packing.pack_uint_reference((v.astype(np.int32) + 8).astype(np.uint32), 4))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.uint64])
def test_pack_offset_rejects_wide_values_that_would_wrap_in_32_bits(dtype):
    """The kernel widens values to int32; a wider value that would wrap to one that fits (2^32 + 3,
    2^32 - 1 with offset 8) must still be rejected, and in-range wide values pack as the reference."""
    from tgsim.codecs import _numba_uint

    v = np.full(1001, 3, dtype)
    want = packing.pack_uint_reference((v.astype(np.int64) + 8).astype(np.uint32), 4)
    assert np.array_equal(_numba_uint.pack_offset(v, 8, 4), want)
    for wrapping in (2**32 + 3, 2**32 - 1):
        if wrapping > np.iinfo(dtype).max:
            continue
        v[500] = wrapping
        with pytest.raises(ValueError, match="do not fit"):
            _numba_uint.pack_offset(v, 8, 4)


@pytest.mark.parametrize("workers", [1, 3, 8, 127, 128, 300])
def test_decode_codes_equals_scale_integer_sum_and_counts_codes_beyond_n(workers):
    """The integer all-reduce's decode == packing.scale_integer_sum bit for bit (int8 up to
    127 workers, int16 beyond), and every code sum outside [-N, N] is counted (positive control)."""
    from tgsim.codecs import _numba_uint

    rng = np.random.default_rng(workers)
    dtype = np.int8 if workers <= 127 else np.int16
    codes = rng.integers(-workers, workers + 1, 70_001).astype(dtype)
    s = float(np.float32(rng.random() * 5))
    out, bad = _numba_uint.decode_codes(codes, workers, s)
    assert bad == 0
    assert np.array_equal(out.view(np.uint32), packing.scale_integer_sum(codes, s, workers).view(np.uint32))
    if workers < 127:
        codes[[5, 40_000, 70_000]] = [workers + 1, -workers - 1, 127]
        assert _numba_uint.decode_codes(codes, workers, s)[1] == 3
