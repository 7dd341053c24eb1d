"""bfloat16 cast: each element rounded to the nearest bfloat16 (16 bits up), averaged in float64.

bfloat16 keeps float32's sign and 8 exponent bits and the top 7 of its 23 fraction bits, so the
cast is integer arithmetic on the float32 bits u = bits(f32(g)) (NumPy has no bfloat16 dtype):

    b = (u + 0x7FFF + ((u >> 16) & 1)) >> 16         round to nearest, ties to even (uint32)
    Q(g) = float32 with bits b << 16                  the decode: the low 16 bits zero

Adding 0x7FFF + lsb carries into bit 16 exactly when the dropped half is above 0x8000, or equal to
it with an odd kept part; a carry out of the fraction steps the exponent, as rounding should.
Deterministic, so biased: E[Q(g)] = Q(g) != g in general. The relative error per element is
|Q(g) - g| <= 2^-8 |g| for |g| in bfloat16's normal range [2^-126, 3.39e38] (8 significant bits);
subnormals keep an absolute error of at most 2^-134 (half their spacing 2^-133). Values that would
round to inf (|f32(g)| >= 0x7F7F8000 as bits, about 3.3961e38) are refused, naming layer and
worker. Gradients of another dtype are cast to float32 first (float64 is thus rounded twice).

Kernels ([codec] kernels): "auto" and "numba" round NumPy arrays in one Numba loop, "reference" and
"cuda" with the array code (five integer passes; CuPy arrays always take it); the bits are the same.
The decode-sum of NumPy messages runs in tgsim.codecs.numba_half
(acc += f64(bits << 16 as float32) per task, ordered_mean's bits) under the same kernels setting.

    mean = f32(Σ_w f64(Q(g_w)) · (1/N)), workers in order (tgsim.codecs.ordered_mean)

Wire: its own bytes, exchanged whole (properties.wire = "own"): the frame of tgsim.codecs.framing
(magic b"TGB1", version 1), then every layer's 16-bit patterns b, little-endian uint16:
HEADER.size + 2 n bytes for n elements in all.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from tgsim.backend import array_module
from tgsim.codecs import options
from tgsim.codecs.base import CodecProperties, PlainCodec, layer_shapes, per_element_bits
from tgsim.codecs.fp32 import first_nonfinite
from tgsim.codecs.framing import HEADER, fixed_width_layers, frame, unframe
from tgsim.codecs.ordered_mean import ordered_mean

_MAGIC, _VERSION = b"TGB1", 1
_OVERFLOW_BITS = 0x7F7F8000          # the smallest float32 magnitude that rounds to bfloat16 inf
_OVERFLOW = float(np.array(_OVERFLOW_BITS, np.uint32).view(np.float32))
_BF16_MAX = float(np.array(0x7F7F0000, np.uint32).view(np.float32))      # 3.3895e38


def _host(a) -> np.ndarray:
    """A NumPy copy of a CuPy array (`.get()`), or the NumPy array itself."""
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


KERNELS = ("auto", "reference", "numba", "cuda")


def round_to_bf16_reference(g):
    """The bfloat16 bit patterns (uint16, NumPy or CuPy like `g`) of f32(g), rounded to nearest even,
    as array code (five integer passes). Finite values below the overflow bound only (prepare_many
    checks); others give meaningless bits."""
    xp = array_module(g)
    u = xp.ascontiguousarray(g, dtype=xp.float32).view(xp.uint32)
    t = u >> 16
    t &= 1
    t += u
    t += 0x7FFF
    t >>= 16
    return t.astype(xp.uint16)


def _round_bits(u, out):
    """The same rounding as one loop over the uint32 bits `u` into uint16 `out` (compiled by Numba)."""
    one, half, sh = np.uint32(1), np.uint32(0x7FFF), np.uint32(16)
    for i in range(u.size):
        x = u[i]
        out[i] = np.uint16((x + half + ((x >> sh) & one)) >> sh)


@functools.lru_cache(maxsize=1)
def _numba_kernel():
    """_round_bits compiled on first use (serial: LLVM vectorizes it; Numba is imported only then)."""
    from numba import njit

    return njit(cache=True)(_round_bits)


def round_to_bf16(g, kernels: str = "auto"):
    """The bfloat16 bits (uint16, g's shape) of the gradient `g` rounded to nearest even, the bits of
    round_to_bf16_reference. `kernels`: "auto" and "numba" run one Numba pass on NumPy arrays,
    "reference" and "cuda" the array code (CuPy arrays: always the array code; "numba" refuses them)."""
    xp = array_module(g)
    if xp is not np or kernels in ("reference", "cuda"):
        if kernels == "numba":
            raise ValueError("the Numba kernel runs on NumPy arrays; use kernels='cuda' or 'auto' for CuPy arrays")
        return round_to_bf16_reference(g)
    g32 = np.ascontiguousarray(g, dtype=np.float32)
    out = np.empty(g32.shape, np.uint16)
    _numba_kernel()(g32.reshape(-1).view(np.uint32), out.reshape(-1))
    return out


def from_bf16_bits(b):
    """float32 values (low 16 bits zero) of bfloat16 bit patterns `b` (uint16)."""
    xp = array_module(b)
    u = b.astype(xp.uint32)
    u <<= 16
    return u.view(xp.float32)


@dataclass(frozen=True)
class BFloat16Message:
    layers: dict          # name -> uint16 array of bfloat16 bit patterns, the worker's layer shapes

    def to_bytes(self) -> bytes:
        body = b"".join(np.ascontiguousarray(_host(v), dtype="<u2").tobytes() for v in self.layers.values())
        return frame(_MAGIC, _VERSION, {k: tuple(v.shape) for k, v in self.layers.items()}, body)

    @property
    def wire_bytes(self) -> int:
        return HEADER.size + 2 * sum(int(v.size) for v in self.layers.values())


class BFloat16(PlainCodec):
    """The bfloat16 cast codec (registered as "bf16")."""

    name = "bf16"
    properties = CodecProperties(unbiased=False, wire="own")

    @dataclass(frozen=True)
    class Options:
        """No [codec] keys besides name, kernels and error_feedback."""

    def __init__(self, kernels: str = "auto"):
        if kernels not in KERNELS:
            raise ValueError(f"unknown kernels {kernels!r}; expected one of {KERNELS}")
        self.kernels = kernels

    @classmethod
    def from_config(cls, cfg) -> "BFloat16":
        """The codec of a [codec] section: no options (tgsim.codecs.options.parse checks) and `kernels`."""
        options.parse(cls, cfg)
        return cls(kernels=getattr(cfg, "kernels", "auto"))

    def prepare_many(self, layers: Mapping) -> None:
        """NonFiniteGradientError for a NaN/Inf gradient (first worker first); ValueError for a value
        that would round to bfloat16 inf (|f32(g)| >= 3.3961e38), naming the layer and the worker."""
        err = first_nonfinite(layers)
        if err is not None:
            raise err
        for name, g in layers.items():
            if g.size == 0:
                continue
            xp = array_module(g)
            with np.errstate(over="ignore"):        # float64 beyond float32's range: inf, refused below
                big = xp.abs(xp.asarray(g, dtype=xp.float32)).reshape(g.shape[0], -1).max(axis=1)
            over = _host(big >= _OVERFLOW)
            if over.any():
                w = int(np.argmax(over))
                raise ValueError(f"layer {name!r}: gradient value {float(_host(big)[w]):.5g} of worker {w} "
                                 f"overflows bfloat16 (it would round to inf; max {_BF16_MAX:.5g})")
        return None

    def encode_many(self, layers: Mapping, seed: int, step: int, workers, shared_scalers=None, stats=None,
                    **_) -> list[BFloat16Message]:
        """One message per local worker: the rounded bit patterns of its layers (one pass per layer)."""
        bits = {k: round_to_bf16(g, self.kernels) for k, g in layers.items()}
        return [BFloat16Message({k: b[i] for k, b in bits.items()}) for i in range(len(workers))]

    def from_bytes(self, buf, like: BFloat16Message) -> BFloat16Message:
        """The message in `buf`, checked against the receiver's layers `like` (PayloadError names what)."""
        shapes = {k: tuple(v.shape) for k, v in like.layers.items()}
        body = unframe(buf, _MAGIC, _VERSION, shapes, "bf16 message")
        return BFloat16Message(fixed_width_layers(body, shapes, "<u2", "bf16 message"))

    def decode(self, message: BFloat16Message) -> dict:
        return {k: from_bf16_bits(v) for k, v in message.layers.items()}

    def aggregate(self, messages: Sequence[BFloat16Message], divide_by: int | None = None) -> dict:
        host = messages and all(isinstance(v, np.ndarray) for v in messages[0].layers.values())
        if host and self.kernels in ("auto", "numba"):
            from tgsim.codecs import numba_half

            d = len(messages) if divide_by is None else divide_by
            return {k: numba_half.decode_sum([m.layers[k] for m in messages], int(v.size), d,
                                             bf16=True).reshape(v.shape)
                    for k, v in messages[0].layers.items()}
        return ordered_mean([self.decode(m) for m in messages], len(messages) if divide_by is None else divide_by)

    def bits_per_element(self, layers_or_shapes: Mapping) -> float:
        """8 (HEADER + 2 Σ_l n_l) / Σ_l n_l: the frame's header and 2 bytes an element."""
        n = sum(int(np.prod(s, dtype=np.int64)) for s in layer_shapes(layers_or_shapes).values())
        return per_element_bits(HEADER.size + 2 * n, layers_or_shapes)

    def link_bits(self, n: int, workers: int) -> dict:
        """Uplink 16 bits per element (+ the header over n); downlink: the server's float32 mean."""
        return {"up": 16 + 8 * HEADER.size / n if n else 0.0, "down": 32}
