"""The TernGrad codec over a model's named layers (Wen et al. 2017).

    scalings = codec.scaling(layers)                    # pass 1: moments, clip bound, local s_i
    s        = max over workers of codec.local_scalers(scalings)   # scaler sharing (MAX all-reduce)
    message  = codec.encode(layers, key, shared_scalers=s, scalings=scalings)   # pass 2
    mean     = codec.aggregate(messages_of_all_workers, divide_by=N)

Layer i of a message is drawn from the stream key.with_layer(i) (see tgsim.rng). Layers named in
`float_layers`, or with fewer than `min_size` elements, travel as float32 (the public code keeps
small layers in float, `size_to_binarize`).

Input dtypes: float32 as is; float16 widened exactly; float64 rounded to float32 (values beyond
float32's range are an error). Integer, boolean and complex gradients raise TypeError; NaN/Inf raise
NonFiniteGradientError (a ValueError) naming the layer, before anything is encoded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from tgsim.backend import array_module
from tgsim.codecs.base import NonFiniteGradientError
from tgsim.codecs.kernels import get_kernels
from tgsim.codecs.message import KIND_FLOAT, KIND_TERNARY, LayerSpec, Layout, Message
from tgsim.codecs.packing import CODES_PER_BYTE, FORMATS
from tgsim.codecs.stats import layer_moments
from tgsim.codecs.ternary import CLIP_MODES, LayerScaling, scaling_from_moments
from tgsim.rng import StreamKey

_F32_MAX = float(np.finfo(np.float32).max)


def as_float32_layer(name: str, g):
    """Flat, contiguous float32 view/copy of one layer's gradient, or TypeError/ValueError."""
    xp = array_module(g)
    g = xp.asarray(g)
    if g.dtype.kind != "f":
        raise TypeError(f"layer {name!r}: gradient dtype {g.dtype} is not floating point "
                        "(expected float16, float32 or float64)")
    if g.dtype.itemsize > 4 and g.size:  # float64, longdouble: rounding to float32 may overflow
        big = xp.abs(g[xp.isfinite(g)]).max() if bool(xp.isfinite(g).any()) else 0.0
        if float(big) > _F32_MAX:
            raise ValueError(f"layer {name!r}: {g.dtype} gradient value {float(big):.3g} overflows float32")
    return xp.ascontiguousarray(g, dtype=xp.float32).reshape(-1)


@dataclass(frozen=True)
class TernGrad:
    """Stochastic ternary codec with per-layer max-norm scalers, optional c·σ clipping and packing."""

    clip: str = "none"              # "none" | "explicit" (paper) | "implicit" (public code)
    clip_factor: float = 2.5        # c in c·σ; 2.5 in every experiment of the paper
    packing: str = "2bit"           # "2bit" (4 codes/byte) | "base3" (5 codes/byte)
    min_size: int = 0               # layers smaller than this stay float32
    float_layers: tuple[str, ...] = field(default_factory=tuple)
    kernels: str = "auto"           # "auto" | "reference" | "numba" | "cuda"

    name = "terngrad"

    def __post_init__(self):
        if self.clip not in CLIP_MODES:
            raise ValueError(f"clip must be one of {CLIP_MODES}, got {self.clip!r}")
        if self.packing not in FORMATS:
            raise ValueError(f"packing must be one of {FORMATS}, got {self.packing!r}")
        if not (self.clip_factor > 0 and math.isfinite(self.clip_factor)):
            raise ValueError(f"clip_factor must be a positive number, got {self.clip_factor}")
        object.__setattr__(self, "float_layers", tuple(self.float_layers))

    # -- properties the shared test base checks ---------------------------------------------
    @property
    def unbiased(self) -> bool:
        return self.clip == "none"

    @property
    def allreduce_compatible(self) -> bool:
        return True

    def bits_per_element(self, n: int, workers: int) -> dict:
        """Uplink: 2 (or 8/5) bits per element + 32 per layer; downlink: ceil(log2(2N+1))."""
        k = CODES_PER_BYTE[self.packing]
        up = 8 * math.ceil(n / k) / n + 32 / n if n else 0.0
        return {"up": up, "down": math.ceil(math.log2(2 * workers + 1))}

    def exact_error(self, g) -> float:
        """E||g~ - g||^2 of one layer with its own scaler (THEORY §1).

        Per element, with x = min(|g|, bound) and p = min(x/s, 1) (resolution bias neglected):
            E(g~ - g)^2 = p (s - |g|)^2 + (1 - p) g^2,
        which without clipping (p = |g|/s) sums to s||g||_1 - ||g||_2^2, s = ||g||_inf.
        """
        flat = as_float32_layer("g", np.asarray(g))
        if flat.size == 0:
            return 0.0
        sc = scaling_from_moments(*layer_moments(flat, self.clip != "none")[:2], self.clip, self.clip_factor)
        a = np.abs(flat.astype(np.float64))
        if sc.scaler == 0.0:
            return 0.0
        p = np.minimum(np.minimum(a, sc.clip_bound) / sc.scaler, 1.0)
        return float(np.sum(p * (sc.scaler - a) ** 2 + (1.0 - p) * a * a))

    # -- layout and pass 1 --------------------------------------------------------------------
    def layout(self, layers: Mapping) -> Layout:
        specs = []
        for name, g in layers.items():
            shape = tuple(int(d) for d in np.shape(g))
            size = int(np.prod(shape, dtype=np.int64))
            float_layer = name in self.float_layers or size < self.min_size
            specs.append(LayerSpec(name, shape, KIND_FLOAT if float_layer else KIND_TERNARY))
        return Layout(tuple(specs), self.packing)

    def _kernels(self, xp):
        return get_kernels(self.kernels, xp)

    def scaling(self, layers: Mapping) -> list[LayerScaling | None]:
        """Pass 1 per ternary layer: finiteness, moments, local scaler and clip bound (None for float layers)."""
        out = []
        for spec, g in zip(self.layout(layers).layers, layers.values()):
            flat = as_float32_layer(spec.name, g)
            xp = array_module(flat)
            if spec.kind == KIND_FLOAT:
                if not bool(xp.isfinite(flat).all()):
                    raise NonFiniteGradientError(spec.name, int((~xp.isfinite(flat)).sum()))
                out.append(None)
                continue
            m = self._kernels(xp).moments(flat, self.clip != "none")
            if not m.finite:
                raise NonFiniteGradientError(spec.name, int((~xp.isfinite(flat)).sum()))
            out.append(scaling_from_moments(m.absmax, m.sigma, self.clip, self.clip_factor))
        return out

    @staticmethod
    def local_scalers(scalings: Sequence[LayerScaling | None]) -> np.ndarray:
        """float32 vector of local scalers (0 for float layers): what the MAX all-reduce shares."""
        return np.array([0.0 if s is None else s.scaler for s in scalings], dtype=np.float32)

    # -- pass 2 and the way back ----------------------------------------------------------------
    def encode(self, layers: Mapping, key: StreamKey, shared_scalers=None,
               scalings: Sequence[LayerScaling | None] | None = None) -> Message:
        """Message of one worker. shared_scalers: per-layer s >= local s_i (from a MAX all-reduce)."""
        layout = self.layout(layers)
        if scalings is None:
            scalings = self.scaling(layers)
        local = self.local_scalers(scalings)
        if shared_scalers is None:
            scalers = local
        else:
            scalers = np.asarray(shared_scalers, dtype=np.float32).reshape(-1)
            if scalers.shape != local.shape:
                raise ValueError(f"{scalers.size} shared scalers for {local.size} layers")
            low = np.flatnonzero(~((scalers >= local) & np.isfinite(scalers)))
            if low.size:
                i = int(low[0])
                raise ValueError(f"layer {layout.layers[i].name!r}: shared scaler {scalers[i]} is not a finite "
                                 f"value >= this worker's local scaler {local[i]} (share with MAX)")
        parts = []
        for i, (spec, g, sc) in enumerate(zip(layout.layers, layers.values(), scalings)):
            flat = as_float32_layer(spec.name, g)
            if spec.kind == KIND_FLOAT:
                parts.append(flat)
                continue
            kern = self._kernels(array_module(flat))
            parts.append(kern.encode(flat, float(scalers[i]), sc.clip_bound, key.with_layer(i), self.packing))
        scalers = np.where([s.kind == KIND_TERNARY for s in layout.layers], scalers, 0).astype(np.float32)
        return Message(layout, scalers, parts)

    def decode(self, message: Message) -> dict:
        """Float32 gradient s·codes of one message, shaped like the layers."""
        return self.aggregate([message], divide_by=1)

    def aggregate(self, messages: Sequence[Message], divide_by: int | None = None) -> dict:
        """(Σ_w decode(message_w)) / divide_by per layer, straight from the packed payloads.

        Order: float64 accumulation over workers in list order, then f32(acc * (1/divide_by)); with a
        shared scaler the ternary sum is exact, so any order gives the same bits.
        """
        if not messages:
            raise ValueError("aggregate needs at least one message")
        layout = messages[0].layout
        for w, m in enumerate(messages):
            if m.layout != layout:
                raise ValueError(f"message of worker {w} has a different layout")
        divide_by = len(messages) if divide_by is None else divide_by
        out = {}
        for i, spec in enumerate(layout.layers):
            parts = [m.parts[i] for m in messages]
            xp = array_module(parts[0])
            if spec.kind == KIND_FLOAT:
                acc = xp.zeros(spec.size, dtype=xp.float64)
                for p in parts:
                    acc += p.reshape(-1).astype(xp.float64)
                flat = (acc * xp.float64(1.0 / divide_by)).astype(xp.float32)
            else:
                payloads = xp.stack(parts)
                scalers = xp.asarray(np.array([m.scalers[i] for m in messages], dtype=np.float32))
                flat = self._kernels(xp).weighted_sum(payloads, scalers, spec.size, self.packing, divide_by)
            out[spec.name] = flat.reshape(spec.shape)
        return out
