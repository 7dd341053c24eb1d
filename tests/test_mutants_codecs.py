"""Tests that kill the mutants `tools/mutation.py` found surviving in tgsim/codecs (one per finding)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from tgsim.codecs.framing import HEADER, frame, layout_crc, unframe
from tgsim.codecs.ordered_mean import ordered_mean_flat
from tgsim.errors import PayloadError


def test_layout_crc_is_the_documented_text():
    """framing: the crc32 is over "name:d0xd1" of every layer joined by ";" (the wire format pins
    it: another separator makes every receiver refuse the sender's messages)."""
    shapes = {"w": (7, 13), "b": (5,), "s": ()}
    assert layout_crc(shapes) == zlib.crc32(b"w:7x13;b:5;s:")


def test_a_frame_of_no_layers_is_exactly_a_header():
    """framing: a message of zero layers is the header alone, and is not refused as truncated."""
    buf = frame(b"TEST", 1, {}, b"")
    assert len(buf) == HEADER.size
    assert bytes(unframe(buf, b"TEST", 1, {}, "test message")) == b""


def test_same_size_other_layout_is_refused_by_its_crc():
    """framing: one layer of 4 named "a" against a receiver's "b" (same count, same body length):
    only the crc differs, and that alone refuses it."""
    buf = frame(b"TEST", 1, {"a": (4,)}, bytes(8))
    with pytest.raises(PayloadError, match="layout"):
        unframe(buf, b"TEST", 1, {"b": (4,)}, "test message")


def test_ordered_mean_of_no_parts_is_empty():
    """ordered_mean: no parts give an empty float32 array (not one element)."""
    out = ordered_mean_flat([], 3)
    assert out.dtype == np.float32 and out.size == 0


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
