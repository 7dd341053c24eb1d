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
