"""A tgsim codec from outside tgsim: stochastic rounding of float32 gradients to bfloat16.

    Q(g) = bf16 value above or below g, chosen so that E[Q(g)] = g (unbiased; 16 bits up)

On the bits of a float32 x = (sign, exponent, 23-bit mantissa), with m = `mantissa_bits` (its
option, 7 = bfloat16's mantissa) and d = 23 - m dropped bits, add a uniform integer r in [0, 2^d)
to the magnitude's bits and keep the top 9 + m bits: the magnitude rounds up with probability
(low d bits)/2^d, which is its distance to the lower value on the m-bit grid over the spacing,
hence E[Q(x)] = x exactly (the sign bit is untouched). The message holds the top 16 bits (the
lower 7 - m of them zero), so fewer mantissa bits add error at the same 16 bits per element.

The codec declares its [codec] keys as `Options` (tgsim.codecs.options); `mantissa_bits` carries
"sweep" metadata, so `tgsim compare variance` and `compare bits` sweep it as they sweep the
built-in codecs' knobs. r is drawn per element from a generator seeded by
(seed, step, worker, layer), so the simulator and every MPI rank draw the same bits.

Register it by installing this folder (`pip install ./examples/plugin_codec`: the entry point
`sr_bf16` of the group `tgsim.codecs`), or without installing by its import path,
`[codec] name = "tgsim_example_codec:StochasticBF16"` with this folder on PYTHONPATH.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tgsim.codecs import options
from tgsim.codecs.base import CodecProperties, PlainCodec, layer_shapes, per_element_bits
from tgsim.codecs.framing import HEADER, fixed_width_layers, frame, unframe
from tgsim.codecs.ordered_mean import ordered_mean
from tgsim.errors import NonFiniteGradientError

_MAGIC, _VERSION = b"XSR1", 1


def _largest(m: int) -> float:
    """The largest finite float32 with m mantissa bits: beyond it, rounding up could give Inf."""
    return float(np.uint32((0xFE << 23) | (((1 << m) - 1) << (23 - m))).view(np.float32))


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

    @dataclass(frozen=True)
    class Options:
        """The [codec] keys of sr_bf16."""

        mantissa_bits: int = options.option(7, "mantissa bits kept (7: bfloat16)", min=0, max=7, sweep=(3, 5, 7))

    def __init__(self, mantissa_bits: int = 7):
        self.mantissa_bits = int(mantissa_bits)

    @classmethod
    def from_config(cls, cfg) -> "StochasticBF16":
        """The codec of a [codec] section: its Options (tgsim.codecs.options.parse)."""
        return cls(mantissa_bits=options.parse(cls, cfg).mantissa_bits)

    def prepare_many(self, layers) -> None:
        """NonFiniteGradientError for NaN/Inf, ValueError beyond bfloat16's range, before encoding."""
        for name, g in layers.items():
            g = np.asarray(g)
            if not np.isfinite(g).all():
                raise NonFiniteGradientError(name, int((~np.isfinite(g)).sum()))
            if g.size and np.abs(g).max() > _largest(self.mantissa_bits):
                raise ValueError(f"layer {name!r}: a gradient value overflows {self.mantissa_bits} mantissa bits")
        return None

    def encode_many(self, layers, seed: int, step: int, workers, shared_scalers=None, stats=None, **_):
        """One message per local worker i (global index workers[i]); layers: name -> (W, *shape)."""
        drop = 23 - self.mantissa_bits
        out = []
        for i, w in enumerate(workers):
            msg = {}
            for li, (name, g) in enumerate(layers.items()):
                bits = np.ascontiguousarray(g[i], dtype=np.float32).view(np.uint32).astype(np.uint64)
                rng = np.random.default_rng([seed, step, int(w), li])
                r = rng.integers(0, 1 << drop, size=bits.shape, dtype=np.uint64)
                sign = bits & 0x80000000
                kept = (((bits & 0x7FFFFFFF) + r) >> drop) << drop
                msg[name] = ((sign | kept) >> 16).astype(np.uint16)
            out.append(BF16Message(msg))
        return out

    def from_bytes(self, buf, like: BF16Message) -> BF16Message:
        """The message in `buf`, checked against the receiver's layers (PayloadError names what is wrong)."""
        shapes = {k: v.shape for k, v in like.layers.items()}
        body = unframe(buf, _MAGIC, _VERSION, shapes, "sr_bf16 message")
        return BF16Message(fixed_width_layers(body, shapes, "<u2", "sr_bf16 message"))

    def bits_per_element(self, layers_or_shapes) -> float:
        """8 (HEADER + 2 Σ_l n_l) / Σ_l n_l: the frame's header and 16 bits an element."""
        n = sum(int(np.prod(s, dtype=np.int64)) for s in layer_shapes(layers_or_shapes).values())
        return per_element_bits(HEADER.size + 2 * n, layers_or_shapes)

    def decode(self, message: BF16Message) -> dict:
        return {k: (v.astype(np.uint32) << 16).view(np.float32) for k, v in message.layers.items()}

    def aggregate(self, messages, divide_by: int | None = None) -> dict:
        """f32(Σ_w f64(decode_w) / N), workers in order (tgsim.codecs.ordered_mean)."""
        return ordered_mean([self.decode(m) for m in messages], len(messages) if divide_by is None else divide_by)
