"""The parameter server's downlink for packed-code ("tgm1") messages: the one definition of its bytes.

    [per ternary layer: f32 scaler + (Σ codes + N) bit-packed at ceil(log2(2N+1)) bits;
     per float layer: f32 mean]                          shared scalers
    [per layer: f32 mean]                                own scalers (the server decodes each message)
    [the serialized Message of the mean ternarized again] reternarize_key (codec.downlink_codec())

Pure functions shared by the server and the workers (tgsim/exchange/mpi.py), the pipelined
exchange (tgsim/exchange/pieces.py cuts the same bytes into pieces) and the in-process exchange's
byte count (`ps_downlink_size`). Over MPI each downlink is preceded by a u64 status word
(tgsim/exchange/mpi_errors.py).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tgsim.backend import array_module as _xp_of, to_numpy
from tgsim.codecs import packing
from tgsim.codecs.message import KIND_TERNARY, Layout, Message, from_bytes
from tgsim.codecs.ordered_mean import ordered_mean_flat
from tgsim.errors import PayloadError


def _f32_bytes(x) -> np.ndarray:
    return np.ascontiguousarray(to_numpy(x), dtype=np.float32).reshape(-1).view(np.uint8)


def code_dtype(n: int):
    if n > 32767:
        raise ValueError(f"the integer all-reduce of ternary codes supports up to 32767 ranks, got {n}")
    return np.int8 if n <= 127 else np.int16


def message_to(msg: Message, xp) -> Message:
    if xp is np:
        return msg
    return Message(msg.layout, msg.scalers, [xp.asarray(p) for p in msg.parts])


def ps_downlink_size(layout: Layout, n: int, shared: bool, reternarize: bool) -> int:
    """Bytes of the server's downlink payload (without the status word); known to every rank."""
    if reternarize:
        return len(layout.header_bytes()) + layout.body_bytes()
    if not shared:
        return sum(4 * s.size for s in layout.layers)
    width = packing.uint_width(n)
    return sum(4 + -(-s.size * width // 8) if s.kind == KIND_TERNARY else 4 * s.size for s in layout.layers)


def ps_base_downlink(codec, messages: Sequence[Message], shared: bool) -> np.ndarray:
    """The server's downlink bytes before any re-ternarization."""
    n = len(messages)
    layout = messages[0].layout
    xp = _xp_of(messages[0].parts[0]) if messages[0].parts else np
    if not shared:
        mean = codec.aggregate(messages, divide_by=n)
        chunks = [_f32_bytes(mean[s.name]) for s in layout.layers]
    else:
        width = packing.uint_width(n)
        kern = codec.kernels_for(xp)
        tern = [i for i, spec in enumerate(layout.layers) if spec.kind == KIND_TERNARY]
        sums = {}
        if xp is np and tern and hasattr(kern, "sum_codes_layers"):     # every layer in one call, parts by address
            sums = dict(zip(tern, kern.sum_codes_layers([[m.parts[i] for m in messages] for i in tern],
                                                        [layout.layers[i].size for i in tern], codec.packing,
                                                        code_dtype(n))))
        chunks = []
        for i, spec in enumerate(layout.layers):
            parts = [m.parts[i] for m in messages]
            if spec.kind != KIND_TERNARY:
                chunks.append(_f32_bytes(ordered_mean_flat(parts, n)))
                continue
            intsum = sums[i] if i in sums else kern.sum_codes(xp.stack(parts), spec.size, codec.packing, code_dtype(n))
            payload = packing.pack_code_sums(intsum, n, width)
            chunks.append(np.float32(messages[0].scalers[i]).reshape(1).view(np.uint8))
            chunks.append(to_numpy(payload).astype(np.uint8, copy=False))
    return np.concatenate(chunks) if chunks else np.zeros(0, np.uint8)


def ps_decode_base(layout: Layout, buf: np.ndarray, n: int, shared: bool, xp=np) -> dict:
    """Mean per layer from a base downlink (PayloadError if it is malformed)."""
    buf = np.asarray(buf, dtype=np.uint8).reshape(-1)
    mean, off = {}, 0
    width = packing.uint_width(n)
    for spec in layout.layers:
        if spec.kind != KIND_TERNARY or not shared:
            nb = 4 * spec.size
            if buf.size < off + nb:
                raise PayloadError(f"downlink is {buf.size} bytes, too short for layer {spec.name!r}")
            mean[spec.name] = xp.asarray(buf[off:off + nb].copy().view(np.float32).reshape(spec.shape))
            off += nb
            continue
        s = float(buf[off:off + 4].copy().view(np.float32)[0])
        if not (np.isfinite(s) and s >= 0):
            raise PayloadError(f"layer {spec.name!r}: invalid scaler {s} in the downlink")
        nb = -(-spec.size * width // 8)
        if buf.size < off + 4 + nb:
            raise PayloadError(f"downlink is {buf.size} bytes, too short for layer {spec.name!r}")
        flat = packing.unpack_code_sums(xp.asarray(buf[off + 4:off + 4 + nb]), spec.size, width, n, s, name=spec.name)
        mean[spec.name] = flat.reshape(spec.shape)
        off += 4 + nb
    if off != buf.size:
        raise PayloadError(f"downlink is {buf.size} bytes, the layout needs {off}")
    return mean


def ps_downlink(codec, messages: Sequence[Message], shared: bool, reternarize_key=None) -> np.ndarray:
    """The server's complete downlink bytes for `messages` (all N, in rank order)."""
    base = ps_base_downlink(codec, messages, shared)
    if reternarize_key is None:
        return base
    layout = messages[0].layout
    xp = _xp_of(messages[0].parts[0]) if messages[0].parts else np
    mean = ps_decode_base(layout, base, len(messages), shared, xp)
    msg = codec.downlink_codec().encode(mean, reternarize_key)
    return np.frombuffer(msg.to_bytes(), dtype=np.uint8)


def ps_decode(codec, layout: Layout, buf: np.ndarray, n: int, shared: bool, reternarize: bool,
              xp=np) -> dict:
    """Mean per layer from the server's downlink (what every rank applies)."""
    if not reternarize:
        return ps_decode_base(layout, buf, n, shared, xp)
    msg = message_to(from_bytes(memoryview(np.ascontiguousarray(buf, dtype=np.uint8)), layout), xp)
    return codec.downlink_codec().decode(msg)
