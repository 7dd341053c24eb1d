"""The wire format of one worker's encoded gradient.

    header  (little-endian)
      magic        4s   b"TGM1"
      version      u8   1
      codec        u8   1 = terngrad
      packing      u8   0 = 2bit, 1 = base3
      scaler_dtype u8   1 = float32
      layout_id    u32  crc32 of the layer names, kinds and shapes (same model on both ends)
      n_layers     u32
      body_bytes   u64
      per layer:   kind u8 (0 = ternary, 1 = float32), ndim u8, ndim x u64 dims
      header_crc   u32  crc32 of every header byte before it
    body, per layer in order
      ternary:     scaler f32, then packed codes (ceil(n/4) or ceil(n/5) bytes)
      float32:     n x f32

Anything truncated, extended, or not matching the receiver's layout raises ValueError naming the
field. The body is not checksummed (that is the transport's job); its length and every code are checked.
"""

from __future__ import annotations

import functools
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from tgsim.codecs.packing import FORMATS, packed_size
from tgsim.errors import PayloadError

MAGIC = b"TGM1"
VERSION = 1
CODEC_IDS = {"terngrad": 1}
KIND_TERNARY, KIND_FLOAT = 0, 1
_FIXED = struct.Struct("<4sBBBBIIQ")


@dataclass(frozen=True)
class LayerSpec:
    name: str
    shape: tuple[int, ...]
    kind: int  # KIND_TERNARY or KIND_FLOAT

    @functools.cached_property
    def size(self) -> int:     # cached: read several times per layer and step (the spec is immutable)
        return int(np.prod(self.shape, dtype=np.int64))

    def body_bytes(self, fmt: str) -> int:
        if self.kind == KIND_FLOAT:
            return 4 * self.size
        return 4 + packed_size(self.size, fmt)


@dataclass(frozen=True)
class Layout:
    layers: tuple[LayerSpec, ...]
    packing: str = "2bit"

    @functools.cached_property
    def layout_id(self) -> int:
        text = "|".join(f"{s.name}:{s.kind}:{'x'.join(map(str, s.shape))}" for s in self.layers)
        return zlib.crc32(text.encode())

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.layers)

    def body_bytes(self) -> int:
        return self._body_bytes

    @functools.cached_property
    def _body_bytes(self) -> int:
        return sum(s.body_bytes(self.packing) for s in self.layers)

    @functools.cached_property
    def _body_plan(self) -> tuple:
        """(ternary layer indices, their scalers' byte offsets in the body as (T, 4) byte indices,
        [(offset, bytes) of each layer's part]): where `from_bytes` finds each layer."""
        tern, scaler_at, parts, pos = [], [], [], 0
        for i, spec in enumerate(self.layers):
            if spec.kind == KIND_TERNARY:
                tern.append(i)
                scaler_at.append(pos)
                pos += 4
                nb = packed_size(spec.size, self.packing)
            else:
                nb = 4 * spec.size
            parts.append((pos, nb))
            pos += nb
        at = np.asarray(scaler_at, dtype=np.int64).reshape(-1, 1) + np.arange(4)
        return np.asarray(tern, dtype=np.int64), at, tuple(parts)

    def header_bytes(self) -> bytes:
        return self._header

    @functools.cached_property
    def _header(self) -> bytes:    # the layout is immutable: built once, not per message and step
        head = _FIXED.pack(MAGIC, VERSION, CODEC_IDS["terngrad"], FORMATS.index(self.packing), 1,
                           self.layout_id, len(self.layers), self.body_bytes())
        for s in self.layers:
            head += struct.pack(f"<BB{len(s.shape)}Q", s.kind, len(s.shape), *s.shape)
        return head + struct.pack("<I", zlib.crc32(head))


@dataclass
class Message:
    """One worker's encoded layers: scalers (float32, 0 for float layers) and per-layer parts
    (packed uint8 codes for ternary layers, float32 values for float layers). Arrays may live on
    the host or the device; `to_bytes` copies to the host."""

    layout: Layout
    scalers: np.ndarray
    parts: list
    # the PayloadBatch these parts are rows of (TernGrad.encode_many), else None; not on the wire
    batch: object = field(default=None, repr=False, compare=False)

    def codes(self, layer) -> np.ndarray:
        """The ternary codes {-1, 0, +1} (int8, shaped like the layer) of `layer` (its name or index);
        the decoded values are codes * scaler (`codec.decode`). ValueError for a float32 layer."""
        i = layer if isinstance(layer, int) else [s.name for s in self.layout.layers].index(layer)
        spec = self.layout.layers[i]
        if spec.kind != KIND_TERNARY:
            raise ValueError(f"layer {spec.name!r} travels as float32: it has values, not codes")
        from tgsim.codecs.packing import unpack

        return unpack(self.parts[i], spec.size, self.layout.packing).reshape(spec.shape)

    def to_bytes(self) -> bytes:
        from tgsim.backend import to_numpy

        chunks = [self.layout.header_bytes()]
        for spec, s, part in zip(self.layout.layers, self.scalers, self.parts):
            if spec.kind == KIND_TERNARY:
                chunks.append(np.float32(s).tobytes())
            chunks.append(to_numpy(part).tobytes())
        return b"".join(chunks)

    @property
    def wire_bytes(self) -> int:
        return len(self.layout.header_bytes()) + self.layout.body_bytes()


class PayloadBatch:
    """The per-layer batch arrays of one `encode_many` call (ternary layers: (W, nbytes) uint8, else
    None) and their row views in worker order, which the messages' parts start out as. Messages
    refer to it (Message.batch), so that `layer_payloads` can hand the batch array to the kernels
    after identity checks instead of comparing every row's address."""

    __slots__ = ("arrays", "rows")

    def __init__(self, arrays, rows):
        self.arrays = arrays
        self.rows = rows


def layer_payloads(messages, i: int, xp=np):
    """(W, nbytes) payloads of ternary layer i of `messages`: without a copy when the messages are,
    in order, those of one `encode_many` call with that layer's part unchanged; else
    `stacked_payloads` of the parts."""
    batch = getattr(messages[0], "batch", None)
    if batch is not None and batch.arrays[i] is not None:
        rows = batch.rows[i]
        if len(rows) == len(messages) and all(m.parts[i] is r for m, r in zip(messages, rows)):
            shape = batch.arrays[i].shape[1:]
            if all(r.shape == shape for r in rows):     # a view's shape can be reassigned in place
                return batch.arrays[i]
    return stacked_payloads([m.parts[i] for m in messages], xp)


def stacked_payloads(parts, xp=np):
    """(W, nbytes) payloads of the W messages' `parts` (uint8 rows, arrays of `xp`): the batch array that
    `encode_many`'s messages are consecutive rows of, else a stacked copy."""
    base = getattr(parts[0], "base", None)
    if xp is np and isinstance(base, np.ndarray) and base.ndim == 2 and base.shape[0] == len(parts) \
            and base.dtype == np.uint8 and base.flags.c_contiguous:
        start, row = base.ctypes.data, base.strides[0]
        if all(isinstance(p, np.ndarray) and p.base is base and p.shape == base.shape[1:]
               and p.ctypes.data == start + w * row for w, p in enumerate(parts)):
            return base
    return xp.stack(parts)


def parse_header(buf: bytes | memoryview) -> tuple[Layout | None, tuple, int]:
    """(fields, layer kinds/shapes, header length) of the serialized message `buf`; PayloadError if malformed."""
    buf = memoryview(buf)
    if len(buf) < _FIXED.size + 4:
        raise PayloadError(f"message truncated: {len(buf)} bytes, shorter than the fixed header")
    magic, version, codec, packing, sdtype, layout_id, n_layers, body = _FIXED.unpack_from(buf, 0)
    if magic != MAGIC:
        raise PayloadError(f"not a tgsim message (magic {bytes(magic)!r})")
    if version != VERSION:
        raise PayloadError(f"message version {version}, this tgsim reads version {VERSION}")
    if codec not in CODEC_IDS.values() or packing >= len(FORMATS) or sdtype != 1:
        raise PayloadError(f"unknown codec/packing/scaler dtype ids ({codec}, {packing}, {sdtype})")
    off = _FIXED.size
    specs = []
    for i in range(n_layers):
        if off + 2 > len(buf):
            raise PayloadError(f"message truncated in the header at layer {i}")
        kind, ndim = struct.unpack_from("<BB", buf, off)
        if kind not in (KIND_TERNARY, KIND_FLOAT):
            raise PayloadError(f"header: layer {i} has unknown kind {kind}")
        if off + 2 + 8 * ndim + 4 > len(buf):
            raise PayloadError(f"message truncated in the header at layer {i}")
        shape = struct.unpack_from(f"<{ndim}Q", buf, off + 2)
        specs.append((kind, tuple(shape)))
        off += 2 + 8 * ndim
    (crc,) = struct.unpack_from("<I", buf, off)
    if crc != zlib.crc32(buf[:off]):
        raise PayloadError("header checksum mismatch (corrupt or truncated header)")
    fields = dict(packing=FORMATS[packing], layout_id=layout_id, body=body)
    return fields, tuple(specs), off + 4


def check_header(buf: bytes | memoryview, layout: Layout, body: int | None = None) -> int:
    """Check a message's header against the receiver's layout (ValueError on mismatch) and return its
    length; `body` is the number of bytes after the header (None: the rest of `buf`). A header equal,
    byte for byte, to the layout's own is that layout's (its checksum included): only the body's
    length is checked then; any other is parsed and compared field by field."""
    mine_head = layout.header_bytes()
    if len(buf) >= len(mine_head) and memoryview(buf)[:len(mine_head)] == mine_head:
        body_len = len(buf) - len(mine_head) if body is None else body
        if body_len == layout.body_bytes():
            return len(mine_head)
    fields, specs, off = parse_header(buf)
    if fields["packing"] != layout.packing:
        raise PayloadError(f"message packed as {fields['packing']}, receiver expects {layout.packing}")
    mine = tuple((s.kind, s.shape) for s in layout.layers)
    if fields["layout_id"] != layout.layout_id or specs != mine:
        raise PayloadError("message layout (layer kinds/shapes/names) differs from the receiver's model")
    body = len(buf) - off if body is None else body
    if body != fields["body"] or fields["body"] != layout.body_bytes():
        raise PayloadError(f"message body is {body} bytes, header says {fields['body']}, "
                         f"layout needs {layout.body_bytes()}")
    return off


def from_bytes(buf: bytes | memoryview, layout: Layout) -> Message:
    """The Message parsed from `buf` after checking it against the receiver's `layout` (PayloadError on
    a mismatch or a malformed payload)."""
    off = check_header(buf, layout)
    data = np.frombuffer(buf, dtype=np.uint8, offset=off)
    tern, scaler_at, where = layout._body_plan
    scalers = np.zeros(len(layout.layers), dtype=np.float32)
    scalers[tern] = data[scaler_at].view(np.float32).reshape(-1)
    ok = np.isfinite(scalers) & (scalers >= 0)
    if not ok.all():
        i = int(np.argmin(ok))
        raise PayloadError(f"layer {layout.layers[i].name!r}: invalid scaler {scalers[i]}")
    parts = []
    for spec, (pos, nb) in zip(layout.layers, where):
        part = data[pos:pos + nb]
        parts.append(part if spec.kind == KIND_TERNARY else part.view(np.float32).reshape(spec.shape))
    return Message(layout, scalers, parts)
