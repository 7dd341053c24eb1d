"""tgsim/codecs/framing.py: the layout crc, frames of no layers, and a layout refused by its crc."""

from __future__ import annotations

import zlib

import pytest

from tgsim.codecs.framing import HEADER, frame, layout_crc, unframe
from tgsim.errors import PayloadError


@pytest.mark.mutation
def test_layout_crc_is_the_documented_text():
    """framing: the crc32 is over "name:d0xd1" of every layer joined by ";" (the wire format pins
    it: another separator makes every receiver refuse the sender's messages)."""
    shapes = {"w": (7, 13), "b": (5,), "s": ()}
    assert layout_crc(shapes) == zlib.crc32(b"w:7x13;b:5;s:")


@pytest.mark.mutation
def test_a_frame_of_no_layers_is_exactly_a_header():
    """framing: a message of zero layers is the header alone, and is not refused as truncated."""
    buf = frame(b"TEST", 1, {}, b"")
    assert len(buf) == HEADER.size
    assert bytes(unframe(buf, b"TEST", 1, {}, "test message")) == b""


@pytest.mark.mutation
def test_same_size_other_layout_is_refused_by_its_crc():
    """framing: one layer of 4 named "a" against a receiver's "b" (same count, same body length):
    only the crc differs, and that alone refuses it."""
    buf = frame(b"TEST", 1, {"a": (4,)}, bytes(8))
    with pytest.raises(PayloadError, match="layout"):
        unframe(buf, b"TEST", 1, {"b": (4,)}, "test message")
