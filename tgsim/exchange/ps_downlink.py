"""The parameter server's downlink for packed-code ("tgm1") messages: the one definition of its bytes.

    [per ternary layer: f32 scaler + (Σ codes + N) bit-packed at ceil(log2(2N+1)) bits;
     per float layer: f32 mean]                          shared scalers
    [per layer: f32 mean]                                own scalers (the server decodes each message)
    [the serialized Message of the mean ternarized again] reternarize_key (codec.downlink_codec())

With shared scalers on NumPy (w <= 8 bits, up to 127 workers) every ternary layer's sums are packed,
and decoded, in one Numba call over all layers (packing.pack_code_sums_segments,
unpack_code_sums_segments), at offsets worked out once per layout; the bytes are those of one
pack_code_sums per layer. A malformed downlink is decoded layer by layer, which names the layer.

Pure functions shared by the server and the workers (tgsim/exchange/mpi.py), the pipelined
exchange (tgsim/exchange/pieces.py cuts the same bytes into pieces) and the in-process exchange's
byte count (`ps_downlink_size`). Over MPI each downlink is preceded by a u64 status word
(tgsim/exchange/mpi_errors.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Plan:
    """Where each layer lies in a shared-scaler base downlink of N workers (width bits per code sum):
    the ternary layers' indices `tern`, their scalers' byte offsets (`scaler_at`: (T, 4) byte indices),
    their packed sums' offsets `payload_at` and element counts `sizes`, the offsets `elem_at` of
    their elements in the ternary layers concatenated; the float layers as (index, byte offset);
    `total` bytes."""

    tern: np.ndarray
    scaler_at: np.ndarray
    payload_at: np.ndarray
    sizes: np.ndarray
    elem_at: np.ndarray
    floats: tuple
    total: int


@functools.lru_cache(maxsize=64)
def _plan(layout: Layout, width: int) -> _Plan:
    """The layout's _Plan at `width` (built once per layout and width)."""
    tern, scaler_at, payload_at, sizes, floats, off = [], [], [], [], [], 0
    for i, spec in enumerate(layout.layers):
        if spec.kind == KIND_TERNARY:
            tern.append(i)
            scaler_at.append(off)
            payload_at.append(off + 4)
            sizes.append(spec.size)
            off += 4 + -(-spec.size * width // 8)
        else:
            floats.append((i, off))
            off += 4 * spec.size
    sizes_a = np.asarray(sizes, dtype=np.int64)
    return _Plan(np.asarray(tern, dtype=np.int64), np.asarray(scaler_at, dtype=np.int64)[:, None] + np.arange(4),
                 np.asarray(payload_at, dtype=np.int64), sizes_a,
                 np.concatenate([[0], np.cumsum(sizes_a)[:-1]]).astype(np.int64), tuple(floats), off)


def _one_pass(xp, n: int) -> bool:
    """Whether the shared-scaler downlink of n workers packs and decodes every layer in one Numba call."""
    return xp is np and packing.uint_width(n) <= 8


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
            payloads = [[m.parts[i] for m in messages] for i in tern]
            sizes = [layout.layers[i].size for i in tern]
            if _one_pass(xp, n):      # the sums one after another in one array, then packed in one call
                flat = np.empty(sum(sizes), dtype=code_dtype(n))
                kern.sum_codes_layers(payloads, sizes, codec.packing, code_dtype(n), out=flat)
                return _pack_base(layout, messages, flat, n, width)
            sums = dict(zip(tern, kern.sum_codes_layers(payloads, sizes, codec.packing, code_dtype(n))))
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


def _pack_base(layout: Layout, messages: Sequence[Message], sums, n: int, width: int) -> np.ndarray:
    """The shared-scaler base downlink with every ternary layer's code sums (`sums`: all of them, one
    layer after another in layer order) packed in one Numba call (packing.pack_code_sums' bits per
    layer) and the scalers placed by index."""
    plan = _plan(layout, width)
    buf = np.empty(plan.total, dtype=np.uint8)
    packing.pack_code_sums_segments(sums, n, width, buf, plan.elem_at, plan.sizes, plan.payload_at)
    scalers = np.asarray(messages[0].scalers)[plan.tern].astype(np.float32)
    buf[plan.scaler_at] = scalers.view(np.uint8).reshape(-1, 4)
    for i, off in plan.floats:
        mean = _f32_bytes(ordered_mean_flat([m.parts[i] for m in messages], n))
        buf[off:off + mean.size] = mean
    return buf


def _decode_base_one_pass(layout: Layout, plan: _Plan, buf: np.ndarray, n: int, width: int) -> dict | None:
    """ps_decode_base of a NumPy downlink of the plan's size with every ternary layer decoded in one
    Numba call; None when a layer is malformed (the caller's per-layer pass names it)."""
    scalers = buf[plan.scaler_at].view(np.float32).reshape(-1)
    if not bool(np.all(np.isfinite(scalers) & (scalers >= 0))):
        return None
    flat = np.empty(int(plan.sizes.sum()), dtype=np.float32)
    tops = packing.unpack_code_sums_segments(buf, plan.payload_at, plan.sizes, width, n, scalers, flat, plan.elem_at)
    if tops.size and int(tops.max()) > 2 * n:
        return None
    mean = {}
    floats = dict(plan.floats)
    t = 0
    for i, spec in enumerate(layout.layers):
        if i in floats:
            off = floats[i]
            mean[spec.name] = buf[off:off + 4 * spec.size].copy().view(np.float32).reshape(spec.shape)
        else:
            at = int(plan.elem_at[t])
            mean[spec.name] = flat[at:at + spec.size].reshape(spec.shape)
            t += 1
    return mean


def ps_decode_base(layout: Layout, buf: np.ndarray, n: int, shared: bool, xp=np) -> dict:
    """Mean per layer from a base downlink (PayloadError if it is malformed)."""
    buf = np.asarray(buf, dtype=np.uint8).reshape(-1)
    width = packing.uint_width(n)
    if shared and _one_pass(xp, n):
        plan = _plan(layout, width)
        mean = _decode_base_one_pass(layout, plan, buf, n, width) if buf.size == plan.total else None
        if mean is not None:
            return mean
    mean, off = {}, 0
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
