"""tgsim/codecs/terngrad/reference.py: the array reference's argument and payload checks."""

from __future__ import annotations

import numpy as np
import pytest

from tgsim.codecs.terngrad import reference


@pytest.mark.mutation
@pytest.mark.parametrize("fn", ["sum_codes", "weighted_sum"])
def test_reference_decode_refuses_an_invalid_byte_naming_the_worker(fn):
    """terngrad.reference: the array reference validates every worker's payload before decoding, as
    the Numba kernels do (a 2-bit byte 0xFF holds the invalid code 0b11)."""
    from tgsim.codecs import packing
    from tgsim.codecs.terngrad import numba_kernels, reference

    good = packing.pack(np.array([1, 0, -1, 0, 1, 1, 0, -1], dtype=np.int8), "2bit")
    payloads = np.stack([good, good.copy()])
    payloads[1, 1] = 0xFF
    args = (payloads, 8, "2bit") if fn == "sum_codes" else (payloads, np.ones(2), 8, "2bit", 2)
    for kern in (reference, numba_kernels):
        with pytest.raises(ValueError, match="worker 1"):
            getattr(kern, fn)(*args)


@pytest.mark.mutation
def test_reference_encode_many_names_the_argument_of_the_wrong_length():
    """encode_many takes one scaler and one clip bound per worker row; a list of the wrong length
    is a ValueError that starts with the argument's name ("scalers" / "clip_bounds") and gives the
    expected shape (W,) = (2,) and the one it got."""
    G = np.ones((2, 8), np.float32)
    inf = float("inf")
    with pytest.raises(ValueError, match=r"^scalers: expected shape \(2,\), got \(3,\)$"):
        reference.encode_many(G, [1.0, 1.0, 1.0], [inf, inf], 0, 0, [0, 1], 0, "2bit")
    with pytest.raises(ValueError, match=r"^clip_bounds: expected shape \(2,\), got \(1,\)$"):
        reference.encode_many(G, [1.0, 1.0], [inf], 0, 0, [0, 1], 0, "2bit")
