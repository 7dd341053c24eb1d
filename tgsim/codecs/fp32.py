"""The identity codec: float32 gradients as they are, the baseline every compressed codec is measured
against. Its messages are the worker's float32 layers; the exchange combines them with its ordered
fp32 mean f32(Σ_w f64(g_w) · (1/N)), workers in ascending order (`properties.wire = "float32"`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from tgsim.codecs import options
from tgsim.codecs.base import CodecProperties, PlainCodec, per_element_bits
from tgsim.errors import NonFiniteGradientError, PayloadError


def first_nonfinite(layers: Mapping) -> NonFiniteGradientError | None:
    """The error for the first non-finite gradient, workers in order (then layers in order), or None;
    `.worker` is the local worker's index. layers: name -> (W, *shape)."""
    first = None
    for name, g in layers.items():
        ok = np.isfinite(g).reshape(g.shape[0], -1).all(axis=1)
        if not ok.all() and (first is None or int(np.argmin(ok)) < first[0]):
            first = (int(np.argmin(ok)), name)
    if first is None:
        return None
    w, name = first
    err = NonFiniteGradientError(name, int((~np.isfinite(layers[name][w])).sum()), f"worker {w}")
    err.worker = w
    return err


def _as_float32(v):
    """`v` as a float32 array of its own module (no copy when it is one already)."""
    from tgsim.backend import array_module

    xp = array_module(v)
    return xp.asarray(v, dtype=xp.float32)


def first_beyond_float32(layers: Mapping, sends: str) -> ValueError | None:
    """The error for the first worker's value beyond float32's range in a wider-than-float32 layer
    (layers in order), naming the layer, the worker and what the codec sends as float32; or None."""
    from tgsim.backend import array_module, to_numpy

    f32_max = float(np.finfo(np.float32).max)
    for name, g in layers.items():
        if g.dtype in (np.float16, np.float32) or g.size == 0:
            continue
        xp = array_module(g)
        big = to_numpy(xp.abs(g).reshape(g.shape[0], -1).max(axis=1))
        if (big > f32_max).any():
            w = int(np.argmax(big > f32_max))
            return ValueError(f"layer {name!r}: gradient value {float(big[w]):.4g} of worker {w} is beyond "
                              f"float32's range (max {f32_max:.4g}); {sends}")
    return None


def _elements(layers_or_shapes: Mapping) -> int:
    """Σ_l n_l of one worker's layers {name: shape or array}."""
    from tgsim.codecs.base import layer_shapes

    return sum(int(np.prod(s, dtype=np.int64)) for s in layer_shapes(layers_or_shapes).values())


class Float32Message(dict):
    """One worker's float32 layers (a dict name -> array), with the protocol's bytes."""

    def to_bytes(self) -> bytes:
        return b"".join(np.ascontiguousarray(v, dtype="<f4").tobytes() for v in self.values())

    @property
    def wire_bytes(self) -> int:
        return sum(4 * int(np.size(v)) for v in self.values())


class Float32(PlainCodec):
    """fp32: no compression, 32 bits per element each way."""

    name = "fp32"
    properties = CodecProperties(unbiased=True, wire="float32", backends=("numpy", "cupy"))

    @dataclass(frozen=True)
    class Options:
        """No [codec] keys besides name, kernels and error_feedback."""

    @classmethod
    def from_config(cls, cfg) -> "Float32":
        """The codec of a [codec] section: no options (tgsim.codecs.options.parse checks)."""
        options.parse(cls, cfg)
        return cls()

    def prepare_many(self, layers: Mapping) -> None:
        """Raise NonFiniteGradientError for the first worker with a NaN/Inf gradient; no statistics."""
        err = first_nonfinite(layers)
        if err is not None:
            raise err
        return None

    def encode_many(self, layers: Mapping, seed: int, step: int, workers, shared_scalers=None, stats=None,
                    **_) -> list[Float32Message]:
        """One message per local worker: its layers as float32 (views where they are float32 already),
        arrays of the gradients' own module (CuPy gradients stay on the device)."""
        return [Float32Message({k: _as_float32(g[i]) for k, g in layers.items()}) for i in range(len(workers))]

    def bits_per_element(self, layers_or_shapes: Mapping) -> float:
        """32: the message is the float32 values, 4 bytes an element, no header (0.0 without elements)."""
        return per_element_bits(4 * _elements(layers_or_shapes), layers_or_shapes)

    def from_bytes(self, buf, like: Float32Message) -> Float32Message:
        """float32 layers shaped like `like` from their concatenated bytes (PayloadError on a wrong size)."""
        buf = bytes(buf)
        want = like.wire_bytes
        if len(buf) != want:
            raise PayloadError(f"fp32 message is {len(buf)} bytes, the layers need {want}")
        data = np.frombuffer(buf, dtype="<f4")
        out, off = Float32Message(), 0
        for k, v in like.items():
            out[k] = data[off:off + np.size(v)].reshape(np.shape(v)).astype(np.float32)
            off += np.size(v)
        return out

    def decode(self, message: dict) -> dict:
        return {k: _as_float32(v) for k, v in message.items()}

    def aggregate(self, messages: Sequence[dict], divide_by: int | None = None) -> dict:
        from tgsim.codecs.ordered_mean import ordered_mean

        return ordered_mean(messages, len(messages) if divide_by is None else divide_by)
