"""The frame of a codec with its own wire (properties.wire = "own"): a fixed header that names the
codec's format and the model's layout, then the codec's body.

    magic 4s | version u8 | n_layers u32 | layout crc32 u32 | body_bytes u64 | body   (little-endian)

The layout crc32 is over "name:d0xd1...;" of every layer in order, so a message from a model with
other layer names or shapes is refused before its body is read. `unframe` checks everything the
header states and returns the body; the codec checks what its body holds.
"""

from __future__ import annotations

import struct
import zlib
from typing import Mapping

import numpy as np

from tgsim.errors import PayloadError

HEADER = struct.Struct("<4sBIIQ")


def layout_crc(shapes: Mapping) -> int:
    """crc32 of the layer names and shapes, in order."""
    text = ";".join(f"{k}:{'x'.join(map(str, s))}" for k, s in shapes.items())
    return zlib.crc32(text.encode())


def frame(magic: bytes, version: int, shapes: Mapping, body: bytes) -> bytes:
    """Header (magic `magic`, `version`, the layout of `shapes` (name -> shape)) + `body`: the bytes of a
    message."""
    return HEADER.pack(magic, version, len(shapes), layout_crc(shapes), len(body)) + body


def unframe(buf, magic: bytes, version: int, shapes: Mapping, what: str) -> memoryview:
    """The body of the framed message `buf`, after checking its magic, version, layout and length against
    `magic`, `version` and the receiver's `shapes`; PayloadError naming `what` (e.g. "fp16 message")
    and what is wrong."""
    buf = memoryview(bytes(buf))
    if len(buf) < HEADER.size:
        raise PayloadError(f"{what} truncated: {len(buf)} bytes, shorter than its header")
    got_magic, got_version, n_layers, crc, body = HEADER.unpack_from(buf)
    if got_magic != magic:
        raise PayloadError(f"not an {what} (magic {got_magic!r})")
    if got_version != version:
        raise PayloadError(f"{what} version {got_version}, this tgsim reads version {version}")
    if n_layers != len(shapes) or crc != layout_crc(shapes):
        raise PayloadError(f"{what} layout (layer names/shapes) differs from the receiver's model")
    if len(buf) != HEADER.size + body:
        raise PayloadError(f"{what} body is {len(buf) - HEADER.size} bytes, header says {body}")
    return buf[HEADER.size:]


def fixed_width_layers(body, shapes: Mapping, dtype: str, what: str) -> dict:
    """name -> array (native byte order, shaped like the layer) of a `body` holding every layer of `shapes`
    as `dtype` (e.g. "<f2"), layers in order; PayloadError naming `what` when its length is not theirs."""
    dt = np.dtype(dtype)
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes.values()]
    if len(body) != dt.itemsize * sum(sizes):
        raise PayloadError(f"{what} body is {len(body)} bytes, the layers need {dt.itemsize * sum(sizes)}")
    values = np.frombuffer(body, dtype=dt)
    out, off = {}, 0
    for (k, s), n in zip(shapes.items(), sizes):
        out[k] = values[off:off + n].astype(dt.newbyteorder("=")).reshape(s)
        off += n
    return out
