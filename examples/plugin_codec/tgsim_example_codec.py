"""A tgsim codec from outside tgsim: stochastic rounding of float32 gradients to bfloat16.

    Q(g) = bf16 value above or below g, chosen so that E[Q(g)] = g (unbiased; 16 bits up)

On the bits of a float32 x = (sign, exponent, 23-bit mantissa), add a uniform integer r in
[0, 2^16) to the magnitude's bits and keep the top 16 bits: the magnitude rounds up with probability
(low 16 bits)/2^16, which is its distance to the lower bfloat16 value over the spacing, hence
E[Q(x)] = x exactly (the sign bit is untouched). r is drawn per element from a generator seeded by
(seed, step, worker, layer), so the simulator and every MPI rank draw the same bits.

Register it by installing this folder (`pip install ./examples/plugin_codec`: the entry point
`sr_bf16` of the group `tgsim.codecs`), or without installing by its import path,
`[codec] name = "tgsim_example_codec:StochasticBF16"` with this folder on PYTHONPATH.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tgsim.codecs.base import CodecProperties, PlainCodec
from tgsim.codecs.framing import HEADER, fixed_width_layers, frame, unframe
from tgsim.codecs.ordered_mean import ordered_mean
from tgsim.errors import NonFiniteGradientError

_MAGIC, _VERSION = b"XSR1", 1
_BF16_MAX = float(np.uint32(0x7F7F0000).view(np.float32))   # beyond it, rounding up could give Inf


@dataclass(frozen=True)
class BF16Message:
    layers: dict          # name -> uint16 array: the bfloat16 bits, shaped like the layer

    def to_bytes(self) -> bytes:
        body = b"".join(np.ascontiguousarray(v, dtype="<u2").tobytes() for v in self.layers.values())
        return frame(_MAGIC, _VERSION, {k: v.shape for k, v in self.layers.items()}, body)

    @property
    def wire_bytes(self) -> int:
        return HEADER.size + 2 * sum(v.size for v in self.layers.values())


class StochasticBF16(PlainCodec):
    """Unbiased stochastic rounding to bfloat16 (the plugin `sr_bf16`)."""

    name = "sr_bf16"
    properties = CodecProperties(unbiased=True, wire="own")

    def prepare_many(self, layers) -> None:
        """NonFiniteGradientError for NaN/Inf, ValueError beyond bfloat16's range, before encoding."""
        for name, g in layers.items():
            g = np.asarray(g)
            if not np.isfinite(g).all():
                raise NonFiniteGradientError(name, int((~np.isfinite(g)).sum()))
            if g.size and np.abs(g).max() > _BF16_MAX:
                raise ValueError(f"layer {name!r}: a gradient value overflows bfloat16")
        return None

    def encode_many(self, layers, seed: int, step: int, workers, shared_scalers=None, stats=None, **_):
        """One message per local worker i (global index workers[i]); layers: name -> (W, *shape)."""
        out = []
        for i, w in enumerate(workers):
            msg = {}
            for li, (name, g) in enumerate(layers.items()):
                bits = np.ascontiguousarray(g[i], dtype=np.float32).view(np.uint32).astype(np.uint64)
                rng = np.random.default_rng([seed, step, int(w), li])
                r = rng.integers(0, 1 << 16, size=bits.shape, dtype=np.uint64)
                sign = bits & 0x80000000
                msg[name] = ((sign | ((bits & 0x7FFFFFFF) + r)) >> 16).astype(np.uint16)
            out.append(BF16Message(msg))
        return out

    def from_bytes(self, buf, like: BF16Message) -> BF16Message:
        """The message in `buf`, checked against the receiver's layers (PayloadError names what is wrong)."""
        shapes = {k: v.shape for k, v in like.layers.items()}
        body = unframe(buf, _MAGIC, _VERSION, shapes, "sr_bf16 message")
        return BF16Message(fixed_width_layers(body, shapes, "<u2", "sr_bf16 message"))

    def decode(self, message: BF16Message) -> dict:
        return {k: (v.astype(np.uint32) << 16).view(np.float32) for k, v in message.layers.items()}

    def aggregate(self, messages, divide_by: int | None = None) -> dict:
        """f32(Σ_w f64(decode_w) / N), workers in order (tgsim.codecs.ordered_mean)."""
        return ordered_mean([self.decode(m) for m in messages], len(messages) if divide_by is None else divide_by)
