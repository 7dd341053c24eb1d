"""fp16 cast: each element rounded to the nearest float16 (16 bits up), averaged in float64.

    Q(g) = f16(g)  (round to nearest even; deterministic, so biased: E[Q(g)] = Q(g) != g in general)
    mean = f32(Σ_w f64(Q(g_w)) · (1/N)), workers in order (tgsim.codecs.ordered_mean)

The relative error per element is at most 2^-11 for |g| in float16's normal range [2^-14, 65504];
smaller values lose precision (subnormals, then 0); larger ones would overflow and are refused.

Kernels ([codec] kernels): "auto" and "numba" cast float32 NumPy gradients and decode-sum the
messages with the Numba kernels of tgsim.codecs.numba_half (NumPy's float32 -> float16 rounding on
the bits; the mean through a table of the 65536 float16 values as float64), the same bytes and
float32 bits as this array code; "reference" and "cuda" run the array code ("numba" refuses CuPy).

Wire: its own bytes, exchanged whole (properties.wire = "own"): the frame of tgsim.codecs.framing
(magic b"TGF1", version 1), then every layer's float16 values, little-endian.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from tgsim.codecs import options
from tgsim.codecs.base import CodecProperties, PlainCodec, layer_shapes, per_element_bits
from tgsim.codecs.fp32 import first_nonfinite
from tgsim.codecs.framing import HEADER, fixed_width_layers, frame, unframe
from tgsim.codecs.ordered_mean import ordered_mean

_MAGIC, _VERSION = b"TGF1", 1
_F16_MAX = float(np.finfo(np.float16).max)
KERNELS = ("auto", "reference", "numba", "cuda")


@dataclass(frozen=True)
class Float16Message:
    layers: dict          # name -> float16 array, the worker's layer shapes

    def to_bytes(self) -> bytes:
        body = b"".join(np.ascontiguousarray(v, dtype="<f2").tobytes() for v in self.layers.values())
        return frame(_MAGIC, _VERSION, {k: np.shape(v) for k, v in self.layers.items()}, body)

    @property
    def wire_bytes(self) -> int:
        return HEADER.size + 2 * sum(int(np.size(v)) for v in self.layers.values())


class Float16(PlainCodec):
    """The fp16 cast codec (registered as "fp16")."""

    name = "fp16"
    properties = CodecProperties(unbiased=False, wire="own")

    @dataclass(frozen=True)
    class Options:
        """No [codec] keys besides name, kernels and error_feedback."""

    def __init__(self, kernels: str = "auto"):
        if kernels not in KERNELS:
            raise ValueError(f"unknown kernels {kernels!r}; expected one of {KERNELS}")
        self.kernels = kernels

    @classmethod
    def from_config(cls, cfg) -> "Float16":
        """The codec of a [codec] section: no options (tgsim.codecs.options.parse checks) and `kernels`."""
        options.parse(cls, cfg)
        return cls(kernels=getattr(cfg, "kernels", "auto"))

    def _numba(self, on_host: bool) -> bool:
        """Whether the Numba kernels run: kernels "auto"/"numba" on NumPy arrays."""
        if self.kernels == "numba" and not on_host:
            raise ValueError("the Numba kernels run on NumPy arrays; use kernels='cuda' or 'auto' for CuPy arrays")
        return on_host and self.kernels in ("auto", "numba")

    def prepare_many(self, layers: Mapping) -> None:
        """NonFiniteGradientError for a NaN/Inf gradient (first worker first); ValueError for a value
        beyond float16's range (65504), naming the layer and the worker."""
        err = first_nonfinite(layers)
        if err is not None:
            raise err
        for name, g in layers.items():
            big = np.abs(np.asarray(g)).reshape(np.shape(g)[0], -1).max(axis=1, initial=0.0)
            if (big > _F16_MAX).any():
                w = int(np.argmax(big > _F16_MAX))
                raise ValueError(f"layer {name!r}: gradient value {float(big[w]):.4g} of worker {w} overflows "
                                 f"float16 (max {_F16_MAX:g})")
        return None

    def encode_many(self, layers: Mapping, seed: int, step: int, workers, shared_scalers=None, stats=None,
                    **_) -> list[Float16Message]:
        if all(self._numba(isinstance(g, np.ndarray)) for g in layers.values()):
            from tgsim.codecs import numba_half

            cast = {k: numba_half.to_fp16(g) for k, g in layers.items()}
            return [Float16Message({k: c[i] for k, c in cast.items()}) for i in range(len(workers))]
        return [Float16Message({k: np.asarray(g[i]).astype(np.float16) for k, g in layers.items()})
                for i in range(len(workers))]

    def from_bytes(self, buf, like: Float16Message) -> Float16Message:
        """The message in `buf`, checked against the receiver's layers `like` (PayloadError names what)."""
        shapes = {k: np.shape(v) for k, v in like.layers.items()}
        body = unframe(buf, _MAGIC, _VERSION, shapes, "fp16 message")
        return Float16Message(fixed_width_layers(body, shapes, "<f2", "fp16 message"))

    def decode(self, message: Float16Message) -> dict:
        return {k: v.astype(np.float32) for k, v in message.layers.items()}

    def aggregate(self, messages: Sequence[Float16Message], divide_by: int | None = None) -> dict:
        if messages and self._numba(True):
            from tgsim.codecs import numba_half

            d = len(messages) if divide_by is None else divide_by
            return {k: numba_half.decode_sum([np.asarray(m.layers[k], dtype=np.float16) for m in messages],
                                             int(np.size(v)), d, bf16=False).reshape(np.shape(v))
                    for k, v in messages[0].layers.items()}
        return ordered_mean([m.layers for m in messages], len(messages) if divide_by is None else divide_by)

    def bits_per_element(self, layers_or_shapes: Mapping) -> float:
        """8 (HEADER + 2 Σ_l n_l) / Σ_l n_l: the frame's header and 2 bytes an element."""
        n = sum(int(np.prod(s, dtype=np.int64)) for s in layer_shapes(layers_or_shapes).values())
        return per_element_bits(HEADER.size + 2 * n, layers_or_shapes)

    def link_bits(self, n: int, workers: int) -> dict:
        """Uplink 16 bits per element (+ the header); downlink: the float32 mean of the server."""
        return {"up": 16 + 8 * HEADER.size / n if n else 0.0, "down": 32}
