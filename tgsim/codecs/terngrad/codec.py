"""The TernGrad codec over a model's named layers (Wen et al. 2017).

    scalings = codec.scaling(layers)                    # pass 1: moments, clip bound, local s_i
    s        = max over workers of codec.local_scalers(scalings)   # scaler sharing (MAX all-reduce)
    message  = codec.encode(layers, key, shared_scalers=s, stats=scalings)      # pass 2
    mean     = codec.aggregate(messages_of_all_workers, divide_by=N)

Batched over the W workers of one process (layers carry a leading worker axis, (W, *shape)):

    scalings = codec.scaling_many(layers)               # one ScalingBatch (arrays over W) per layer
    local    = codec.local_scalers_many(scalings)       # (W, L) float32
    messages = codec.encode_many(layers, seed, step, workers, shared_scalers=s, stats=scalings)

with exactly the bits of the per-worker calls (message w = encode of worker workers[w]'s layers
with StreamKey(seed, step, workers[w])), one kernel call per layer for all W workers.

Layer i of a message is drawn from the stream key.with_layer(i) (see tgsim.rng), i its index
`tgsim.codecs.base.layer_ids(layers)` (its position, or an IndexedLayers' index). Layers named in
`float_layers`, or with fewer than `min_size` elements, travel as float32 (the public code keeps
small layers in float, `size_to_binarize`). Option `scope = "model"` gives every ternary layer the
scaling of the whole model (its ternary layers concatenated: one max |g|, one σ, one clip bound per
worker) instead of the paper's one per layer (Sec. 3.3); the message still carries one scaler per
layer, all equal, and the codec declares `properties.whole_step` (a layer's message depends on all).

Input dtypes: float32 as is; float16 widened exactly; float64 rounded to float32 (values beyond
float32's range are an error). Integer, boolean and complex gradients raise TypeError; NaN/Inf raise
NonFiniteGradientError (a ValueError) naming the layer, before anything is encoded.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from tgsim.backend import array_module, to_numpy
from tgsim.codecs import options
from tgsim.codecs.base import CodecProperties, FlatLayers, layer_ids, layer_shapes, per_element_bits, with_ids
from tgsim.codecs.terngrad.inputs import as_float32_layer, as_float32_rows
from tgsim.codecs.terngrad.kernels import get_kernels
from tgsim.codecs.message import (KIND_FLOAT, KIND_TERNARY, LayerSpec, Layout, Message, PayloadBatch, from_bytes,
                                  layer_payloads)
from tgsim.codecs.packing import CODES_PER_BYTE, FORMATS, packed_size
from tgsim.codecs.terngrad.moments import layer_moments
from tgsim.codecs.terngrad.quantizer import CLIP_MODES, LayerScaling, scaling_from_moments

SHARING_MODES = ("max", "mean", "none")
SCOPES = ("layer", "model")
from tgsim.errors import NonFiniteGradientError
from tgsim.rng import StreamKey

class ScalingBatch(NamedTuple):
    """Pass 1 of one ternary layer for W workers: arrays over workers (float64 holding the float32
    values of `LayerScaling`); `worker(w)` is exactly what `TernGrad.scaling` gives worker w."""

    scaler: np.ndarray      # local scalers s_i
    clip_bound: np.ndarray  # inf where not clipping explicitly
    absmax: np.ndarray
    sigma: np.ndarray

    def worker(self, w: int) -> LayerScaling:
        return LayerScaling(float(self.scaler[w]), float(self.clip_bound[w]), float(self.absmax[w]),
                            float(self.sigma[w]))


def scaling_from_moments_many(absmax, sigma, clip: str, clip_factor: float) -> ScalingBatch:
    """ScalingBatch of W workers: `ternary.scaling_from_moments` elementwise over the arrays `absmax` and
    `sigma` (W,) for the clip mode `clip` and factor `clip_factor` (the same float64 operations)."""
    if clip not in CLIP_MODES:
        raise ValueError(f"unknown clip mode {clip!r}; expected one of {CLIP_MODES}")
    absmax = np.asarray(absmax, dtype=np.float64)
    sigma = np.asarray(sigma, dtype=np.float64)
    inf = np.full(absmax.shape, np.inf)
    if clip == "none":
        return ScalingBatch(absmax, inf, absmax, sigma)
    with np.errstate(over="ignore"):
        bound = (clip_factor * sigma).astype(np.float32).astype(np.float64)
    on = (bound > 0.0) & (bound < np.inf)   # else: sigma = 0, or f32(c·σ) out of float32's range
    if clip == "explicit":
        return ScalingBatch(np.where(on, np.minimum(absmax, bound), absmax), np.where(on, bound, np.inf),
                            absmax, sigma)
    return ScalingBatch(np.where(on, bound, absmax), inf, absmax, sigma)   # implicit


class DeferredMessage:
    """One worker's Message whose ternary codes are encoded when asked for: all at once (`parts`,
    `to_bytes`: what every exchange reads) or an element range at a time (`write_range`: the
    pipelined exchanges encode piece k while piece k-1 is on the wire). The bits are those of
    TernGrad.encode either way (`_numba.encode_range`: the Philox stream of the range's elements).
    Built by TernGrad.encode / encode_many(deferred=True) after every check of the inputs."""

    batch = None

    def __init__(self, layout: Layout, scalers: np.ndarray, flats: list, clip_bounds: list, key: StreamKey,
                 ids: Sequence[int] | None = None):
        self.layout, self.scalers = layout, scalers
        self._flats, self._clip, self._key = flats, clip_bounds, key
        self._ids = list(range(len(layout.layers))) if ids is None else list(ids)   # stream-key layer indices
        self._parts = None

    @property
    def parts(self) -> list:
        if self._parts is None:
            self._parts = []
            for i, spec in enumerate(self.layout.layers):
                if spec.kind == KIND_FLOAT:
                    self._parts.append(self._flats[i])
                else:
                    out = np.empty(packed_size(spec.size, self.layout.packing), dtype=np.uint8)
                    self._parts.append(self.write_range(i, 0, spec.size, out))
        return self._parts

    def write_range(self, i: int, e0: int, e1: int, out: np.ndarray) -> np.ndarray:
        """Layer i's wire bytes of elements [e0, e1) into `out` (uint8): the codes (e0 a multiple of
        20; e1 too, or the layer's end) of a ternary layer, the float32 values of a float layer."""
        from tgsim.codecs.terngrad import numba_kernels as _numba

        if self.layout.layers[i].kind == KIND_FLOAT:
            out[:] = np.ascontiguousarray(self._flats[i].reshape(-1)[e0:e1]).view(np.uint8)
            return out
        return _numba.encode_range(self._flats[i].reshape(-1)[e0:e1], e0, float(self.scalers[i]), self._clip[i],
                                   self._key.with_layer(self._ids[i]), self.layout.packing, out=out)

    to_bytes = Message.to_bytes
    wire_bytes = Message.wire_bytes


@functools.lru_cache(maxsize=64)
def _layout_cached(codec: "TernGrad", shapes: tuple) -> Layout:
    """The (immutable) Layout of `codec` for ((name, shape), ...): built once per model, not per step."""
    specs = []
    for name, shape in shapes:
        size = int(np.prod(shape, dtype=np.int64))
        float_layer = name in codec.float_layers or size < codec.min_size
        specs.append(LayerSpec(name, shape, KIND_FLOAT if float_layer else KIND_TERNARY))
    return Layout(tuple(specs), codec.packing)


def _f32_flat_rows(layers) -> list | None:
    """The (W, n) rows of every layer of a FlatLayers whose buffer is a float32 host array (its
    views: what `as_float32_rows` returns for each, without the per-layer checks, which such a
    buffer passes), else None."""
    if isinstance(layers, FlatLayers) and type(layers.buffer) is np.ndarray and layers.buffer.dtype == np.float32:
        return list(layers.rows.values())
    return None


@dataclass(frozen=True)
class TernGrad:
    """Stochastic ternary codec with per-layer max-norm scalers, optional c·σ clipping and packing."""

    clip: str = "none"              # "none" | "explicit" (paper) | "implicit" (public code)
    clip_factor: float = 2.5        # c in c·σ; 2.5 in every experiment of the paper
    packing: str = "2bit"           # "2bit" (4 codes/byte) | "base3" (5 codes/byte)
    min_size: int = 0               # layers smaller than this stay float32
    float_layers: tuple[str, ...] = field(default_factory=tuple)
    kernels: str = "auto"           # "auto" | "reference" | "numba" | "cuda"
    sharing: str = "max"            # shared scaler: "max" over workers (paper) | "mean" | "none"
    scope: str = "layer"            # one scaler per "layer" (paper, Sec. 3.3) | one for the whole "model"

    name = "terngrad"

    @dataclass(frozen=True)
    class Options:
        """The [codec] keys of terngrad (defaults: the paper's c·σ clipping with c = 2.5, 2-bit packing,
        the MAX-shared scaler)."""

        clip: str = options.option("explicit", "clip |g| at c·σ: explicit (paper), implicit (public code) or none",
                                   choices=CLIP_MODES)
        clip_factor: float = options.option(2.5, "c in c·σ (2.5 in every experiment of the paper)")
        packing: str = options.option("2bit", "2bit (4 codes/byte) or base3 (5 codes/byte)", choices=FORMATS)
        min_size: int = options.option(0, "layers with fewer elements stay float32", min=0)
        float_layers: tuple = options.option((), "names of layers that stay float32")
        sharing: str = options.option("max", "shared scaler: max over workers (paper), mean, or none (own)",
                                      choices=SHARING_MODES)
        scope: str = options.option("layer", "scaler and clip bound per layer (paper, Sec. 3.3) or one for the "
                                    "whole model (max |g| and σ over all ternary layers)", choices=SCOPES)

        def __post_init__(self):
            if not (self.clip_factor > 0 and math.isfinite(self.clip_factor)):
                raise ValueError(f"clip_factor must be a positive number, got {self.clip_factor}")

    def __post_init__(self):
        if self.clip not in CLIP_MODES:
            raise ValueError(f"clip must be one of {CLIP_MODES}, got {self.clip!r}")
        if self.packing not in FORMATS:
            raise ValueError(f"packing must be one of {FORMATS}, got {self.packing!r}")
        if self.sharing not in SHARING_MODES:
            raise ValueError(f"sharing must be one of {SHARING_MODES}, got {self.sharing!r}")
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, got {self.scope!r}")
        if not (self.clip_factor > 0 and math.isfinite(self.clip_factor)):
            raise ValueError(f"clip_factor must be a positive number, got {self.clip_factor}")
        object.__setattr__(self, "float_layers", tuple(self.float_layers))

    # -- properties the shared test base checks ---------------------------------------------
    @classmethod
    def from_config(cls, cfg) -> "TernGrad":
        """The codec of a [codec] config section: its Options (tgsim.codecs.options.parse) and `kernels`."""
        o = options.parse(cls, cfg)
        return cls(clip=o.clip, clip_factor=o.clip_factor, packing=o.packing, min_size=o.min_size,
                   float_layers=o.float_layers, kernels=getattr(cfg, "kernels", "auto"), sharing=o.sharing,
                   scope=o.scope)

    @property
    def properties(self) -> CodecProperties:
        return CodecProperties(unbiased=self.unbiased, sums_exactly=True, defers_encode=True,
                               shared_stats=None if self.sharing == "none" else self.sharing, server_reencodes=True,
                               backends=("numpy", "cupy"), whole_step=self.scope == "model",
                               multi_tensor=self.kernels != "reference")

    @property
    def unbiased(self) -> bool:
        """Without clipping, and without a shared mean scaler (which clips at the mean)."""
        return self.clip == "none" and self.sharing != "mean"

    @property
    def allreduce_compatible(self) -> bool:
        return True

    def bits_per_element(self, layers_or_shapes: Mapping) -> float:
        """8 (H + Σ_ternary (4 + ceil(n_l / c)) + Σ_float 4 n_l) / Σ_l n_l: the message's header H =
        38 + Σ_l (2 + 8 d_l) bytes (tgsim.codecs.message: fixed fields, per layer its kind and d_l
        dimensions, a CRC), per ternary layer its float32 scaler and its codes packed c = 4 (2bit) or
        5 (base3) a byte, per float layer (float_layers, min_size) its float32 values."""
        shapes = layer_shapes(layers_or_shapes)
        layout = self._layout_of(shapes)
        return per_element_bits(len(layout.header_bytes()) + layout.body_bytes(), shapes)

    def link_bits(self, n: int, workers: int) -> dict:
        """Uplink of a one-layer ternary message without its header: 2 (or 8/5) bits per element +
        32 per layer (the scaler); downlink: ceil(log2(2N+1))."""
        k = CODES_PER_BYTE[self.packing]
        up = 8 * math.ceil(n / k) / n + 32 / n if n else 0.0
        return {"up": up, "down": math.ceil(math.log2(2 * workers + 1))}

    def exact_error(self, g) -> float:
        """E||g~ - g||^2 of one layer with its own scaler (docs/THEORY.md §1).

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
        return self._layout_of({name: tuple(int(d) for d in np.shape(g)) for name, g in layers.items()})

    def _layout_of(self, shapes: Mapping) -> Layout:
        return _layout_cached(self, tuple(shapes.items()))

    def layout_many(self, layers: Mapping) -> tuple[Layout, int]:
        """(layout of one worker's layers, W) of layers with a leading worker axis (W, *shape)."""
        if isinstance(layers, FlatLayers):      # its shapes and W are known and checked
            return self._layout_of(layers.shapes), int(layers.buffer.shape[0])
        shapes, nw = {}, None
        for name, g in layers.items():
            shape = tuple(map(int, g.shape if hasattr(g, "shape") else np.shape(g)))
            if not shape:
                raise ValueError(f"layer {name!r}: expected a leading worker axis, got a scalar")
            if nw is None:
                nw = shape[0]
            elif shape[0] != nw:
                raise ValueError(f"layer {name!r}: leading (worker) axis has {shape[0]} entries, "
                                 f"expected {nw} like the layers before it")
            shapes[name] = shape[1:]
        return self._layout_of(shapes), (0 if nw is None else nw)

    def kernels_for(self, xp):
        """The kernel set (reference, Numba or CUDA module) this codec runs on arrays of `xp`."""
        return get_kernels(self.kernels, xp)

    def scaling(self, layers: Mapping) -> list[LayerScaling | None]:
        """Pass 1 per ternary layer: finiteness, moments, local scaler and clip bound (None for float layers)."""
        out, flats = [], []
        for spec, g in zip(self.layout(layers).layers, layers.values()):
            flat = as_float32_layer(spec.name, g)
            flats.append(flat)
            xp = array_module(flat)
            if spec.kind == KIND_FLOAT:
                if not bool(xp.isfinite(flat).all()):
                    raise NonFiniteGradientError(spec.name, int((~xp.isfinite(flat)).sum()))
                out.append(None)
                continue
            m = self.kernels_for(xp).moments(flat, self.clip != "none")
            if not m.finite:
                raise NonFiniteGradientError(spec.name, int((~xp.isfinite(flat)).sum()))
            out.append(scaling_from_moments(m.absmax, m.sigma, self.clip, self.clip_factor))
        if self.scope == "model":       # the batched rule on this worker's one row
            whole = self._model_scalings([f.reshape(1, -1) for f in flats], out)
            out = [None if s is None else s.worker(0) for s in whole]
        return out

    @staticmethod
    def local_scalers(scalings: Sequence[LayerScaling | None]) -> np.ndarray:
        """float32 vector of local scalers (0 for float layers): what the MAX all-reduce shares."""
        return np.array([0.0 if s is None else s.scaler for s in scalings], dtype=np.float32)

    # -- batched over workers -------------------------------------------------------------------
    def _pass1_many(self, layout: Layout, layers: Mapping, nw: int):
        """(float32 (W, n) rows per layer, ScalingBatch | None per layer); errors as the per-worker
        calls in worker order would raise them: the lowest worker's first failing layer.

        The layers are converted first, then the ternary layers' statistics computed: in one call
        for the whole step where the kernels offer `moments_layers` (Numba: one call; CUDA: one
        launch, one copy back), else layer by layer; the scalings of all finite layers at once; then
        the errors are taken in layer order as before."""
        events: dict[int, Exception] = {}    # worker -> its error at its first failing layer

        def nonfinite(spec, flat, w):
            row = flat[w]
            count = int(array_module(row).count_nonzero(~array_module(row).isfinite(row)))
            err = NonFiniteGradientError(spec.name, count, f"worker {w}")
            err.worker = w
            return err

        converted, stop = _f32_flat_rows(layers), None     # per layer: rows, or a float64 overflow
        if converted is None:
            converted = []
            for spec, g in zip(layout.layers, layers.values()):
                try:
                    converted.append(as_float32_rows(spec.name, g, nw))
                except TypeError as e:
                    stop = e                 # raised after the earlier layers' errors are known
                    break
                except ValueError as e:      # float64 overflow of worker e.worker (the lowest)
                    if getattr(e, "worker", None) is None:
                        raise
                    converted.append(e)
        moments = self._moments_of(layout, converted)
        batches = self._scalings_of(moments)
        flats, scalings = [], []
        for i, (spec, flat) in enumerate(zip(layout.layers, converted)):
            if isinstance(flat, ValueError):
                events.setdefault(flat.worker, flat)
                flats.append(None)
                scalings.append(None)
                continue
            xp = array_module(flat)
            flats.append(flat)
            if spec.kind == KIND_FLOAT:
                ok = to_numpy(xp.isfinite(flat).all(axis=1)) if flat.shape[1] else np.ones(nw, dtype=bool)
                scalings.append(None)
            else:
                scalings.append(batches.get(i))
                if i in batches:         # its rows are all finite
                    continue
                ok = moments[i][2]
            if not ok.all():
                for w in np.flatnonzero(~ok):
                    if int(w) not in events:
                        events[int(w)] = nonfinite(spec, flat, int(w))
        if stop is not None:
            if 0 in events:                  # worker 0 failed on an earlier layer first
                raise events[0] from None
            raise stop
        if events:
            raise events[min(events)]
        if self.scope == "model":
            scalings = self._model_scalings(flats, scalings)
        return flats, scalings

    def _model_scalings(self, flats: list, scalings: list) -> list:
        """scope = "model": every ternary layer gets the scaling of all ternary layers concatenated
        in layout order (W, Σ n_l): max |g| and σ over the whole model (the moments of one layer,
        tgsim.codecs.terngrad.moments), then c·σ clipping and the scaler as for one layer."""
        tern = [i for i, s in enumerate(scalings) if s is not None]
        if not tern:
            return scalings
        xp = array_module(flats[tern[0]])
        rows = xp.concatenate([flats[i] for i in tern], axis=1)
        absmax, sigma, _ = self.kernels_for(xp).moments_many(rows, self.clip != "none")
        whole = scaling_from_moments_many(absmax, sigma, self.clip, self.clip_factor)
        return [None if s is None else whole for s in scalings]

    def _whole_step(self, arrays, name: str):
        """The kernel set's whole-step function `name` (moments_layers, encode_layers,
        weighted_sum_layers) when every array runs on one kernel set that offers it (Numba, CUDA), else None."""
        if arrays and all(type(a) is np.ndarray for a in arrays):
            return getattr(self.kernels_for(np), name, None)
        kerns = {id(k): k for k in (self.kernels_for(array_module(a)) for a in arrays)}
        return getattr(next(iter(kerns.values())), name, None) if len(kerns) == 1 else None

    def _moments_of(self, layout: Layout, converted: list) -> dict:
        """{layer index: (absmax, sigma, finite)} of the converted ternary layers."""
        need_sigma = self.clip != "none"
        todo = [i for i, (spec, f) in enumerate(zip(layout.layers, converted))
                if spec.kind == KIND_TERNARY and not isinstance(f, ValueError)]
        step = self._whole_step([converted[i] for i in todo], "moments_layers")
        if step is not None:
            return dict(zip(todo, step([converted[i] for i in todo], need_sigma)))
        return {i: self.kernels_for(array_module(converted[i])).moments_many(converted[i], need_sigma)
                for i in todo}

    def _scalings_of(self, moments: dict) -> dict:
        """{layer index: ScalingBatch} of the layers in `moments` whose rows are all finite:
        scaling_from_moments_many once over the step's layers (elementwise: the bits of the
        layer-by-layer calls), cut back into layers."""
        if not moments:
            return {}
        idx = list(moments)
        lens = [len(moments[i][0]) for i in idx]
        starts = np.cumsum([0] + lens[:-1])
        finite = np.concatenate([moments[i][2] for i in idx])
        bad = np.add.reduceat(~finite, starts) if finite.size else np.zeros(len(idx), int)   # per layer
        sc, cb, am, sg = scaling_from_moments_many(np.concatenate([moments[i][0] for i in idx]),
                                                   np.concatenate([moments[i][1] for i in idx]), self.clip,
                                                   self.clip_factor)
        return {i: ScalingBatch(sc[a:a + k], cb[a:a + k], am[a:a + k], sg[a:a + k])
                for i, k, a, b in zip(idx, lens, starts.tolist(), (bad > 0).tolist()) if not b}

    def prepare_many(self, layers: Mapping) -> list[ScalingBatch | None]:
        """The protocol's pass 1 (tgsim.codecs.base): `scaling_many`."""
        return self.scaling_many(layers)

    def from_bytes(self, buf, like) -> Message:
        """The message in `buf`, parsed against the layout of the receiver's message `like`."""
        return from_bytes(buf, like.layout)

    def downlink_codec(self) -> "TernGrad":
        """The codec a parameter server re-ternarizes the mean with (reternarize_downlink): no
        clipping (the mean is already clipped), this codec's packing and float layers."""
        return TernGrad(clip="none", packing=self.packing, float_layers=self.float_layers,
                        min_size=self.min_size, kernels=self.kernels, scope=self.scope)

    def scaling_many(self, layers: Mapping) -> list[ScalingBatch | None]:
        """`scaling` for W workers at once: layers (W, *shape) -> one ScalingBatch (arrays over the
        W workers) per ternary layer, None for float layers. Same checks and errors as `scaling`;
        a non-finite gradient raises NonFiniteGradientError naming the layer and the worker (the
        lowest failing worker, at its first failing layer)."""
        layout, nw = self.layout_many(layers)
        return self._pass1_many(layout, layers, nw)[1]

    @staticmethod
    def local_scalers_many(scalings: Sequence[ScalingBatch | None], workers: int | None = None) -> np.ndarray:
        """(W, L) float32 local scalers (0 for float layers) of `scaling_many`'s result."""
        if workers is None:
            workers = next((len(s.scaler) for s in scalings if s is not None), 0)
        out = np.zeros((workers, len(scalings)), dtype=np.float32)
        tern = [i for i, s in enumerate(scalings) if s is not None]
        if tern:                            # one cast of every ternary layer's (W,) scalers
            out[:, tern] = np.array([scalings[i].scaler for i in tern], dtype=np.float64).T
        return out

    def encode_many(self, layers: Mapping, seed: int, step: int, workers, shared_scalers=None,
                    stats: Sequence[ScalingBatch | None] | None = None, deferred: bool = False) -> list[Message]:
        """One Message per worker, bit-identical to encode({k: g[w]}, StreamKey(seed, step, workers[w]),
        shared_scalers, stats of worker w) for each w; layers carry a leading worker axis (W, *shape).

        stats: `prepare_many`'s scalings (one ScalingBatch per ternary layer, None per float layer),
        or None to compute them here.
        shared_scalers: (L,) for every worker (a MAX all-reduce) or (W, L). The parts of message w
        are row w of per-layer (W, nbytes) payload arrays (float layers: row w of the float32 rows).
        deferred: `DeferredMessage`s (checks done, codes encoded when asked for), where the Numba
        kernels encode (NumPy arrays); else ordinary Messages.
        """
        layout, nw = self.layout_many(layers)
        workers = np.asarray(workers)
        if workers.shape != (nw,) or (nw and workers.dtype.kind not in "iu"):
            raise ValueError(f"workers: expected {nw} integer worker ids, got {workers.dtype} {workers.shape}")
        n_layers = len(layout.layers)
        scalings = stats
        if scalings is None:
            flats, scalings = self._pass1_many(layout, layers, nw)
        else:
            if len(scalings) != n_layers:
                raise ValueError(f"{len(scalings)} scalings for {n_layers} layers")
            flats = _f32_flat_rows(layers)
            if flats is None:
                flats = [as_float32_rows(spec.name, g, nw) for spec, g in zip(layout.layers, layers.values())]
        ternary = np.array([spec.kind == KIND_TERNARY for spec in layout.layers], dtype=bool)
        for spec, sc in zip(layout.layers, scalings):
            if (sc is None) == (spec.kind == KIND_TERNARY):
                raise ValueError(f"layer {spec.name!r}: scalings do not match the layout (float/ternary)")
        local = self.local_scalers_many(scalings, nw)
        if shared_scalers is None:
            scalers = local
        else:
            scalers = np.asarray(shared_scalers, dtype=np.float32)
            if scalers.ndim <= 1:
                scalers = scalers.reshape(-1)
                if scalers.size != n_layers:
                    raise ValueError(f"{scalers.size} shared scalers for {n_layers} layers")
                scalers = np.broadcast_to(scalers, (nw, n_layers))
            elif scalers.shape != (nw, n_layers):
                raise ValueError(f"shared scalers of shape {scalers.shape}, expected ({n_layers},) or "
                                 f"({nw}, {n_layers})")
            low = ~((scalers >= (0 if self.sharing == "mean" else local)) & np.isfinite(scalers))
            if low.any() and self.sharing == "mean":
                w, i = (int(v) for v in np.argwhere(low)[0])
                raise ValueError(f"layer {layout.layers[i].name!r}: shared scaler {scalers[w, i]} is not a "
                                 "finite value >= 0")
            if low.any():
                w, i = (int(v) for v in np.argwhere(low)[0])     # worker-major: the lowest worker first
                raise ValueError(f"layer {layout.layers[i].name!r}: shared scaler {scalers[w, i]} is not a "
                                 f"finite value >= worker {int(workers[w])}'s local scaler {local[w, i]} "
                                 "(share with MAX)")
        msg_scalers = np.where(ternary, scalers, np.float32(0)).astype(np.float32)
        # A shared mean below a worker's own scaler needs no clip bound of its own: elements with
        # x >= s are kept with probability 1 by the rule (t s < x 2^24 for every t < 2^24), which is
        # clipping at s (the same codes as min(x, s)).
        bounds = [None if sc is None else sc.clip_bound for sc in scalings]
        ids = layer_ids(layers)             # the stream keys' layer indices (positions, or an IndexedLayers')
        if deferred and self._defers(flats):
            return [DeferredMessage(layout, msg_scalers[w], [f[w] for f in flats],
                                    [None if b is None else float(b[w]) for b in bounds],
                                    StreamKey(int(seed), int(step), int(workers[w])), ids) for w in range(nw)]
        parts = list(flats)                  # float layers: the float32 rows
        tern = [i for i, spec in enumerate(layout.layers) if spec.kind == KIND_TERNARY]
        whole = self._whole_step([flats[i] for i in tern], "encode_layers")
        if whole is not None:       # the whole step in one call (Numba) or launch (CUDA)
            got = whole([flats[i] for i in tern], scalers[:, tern], [bounds[i] for i in tern], seed, step, workers,
                        [ids[i] for i in tern], self.packing)
            for i, p in zip(tern, got):
                parts[i] = p
        else:
            for i in tern:
                kern = self.kernels_for(array_module(flats[i]))
                parts[i] = kern.encode_many(flats[i], scalers[:, i], bounds[i], seed, step, workers, ids[i],
                                            self.packing)
        rows = [tuple(p) for p in parts]         # row w of each layer (iterating the first axis)
        batch = PayloadBatch([p if spec.kind == KIND_TERNARY else None for spec, p in zip(layout.layers, parts)],
                             rows)
        return [Message(layout, msg_scalers[w], [r[w] for r in rows], batch) for w in range(nw)]

    # -- pass 2 and the way back ----------------------------------------------------------------
    def encode(self, layers: Mapping, key: StreamKey, shared_scalers=None,
               stats: Sequence[LayerScaling | None] | None = None, deferred: bool = False) -> Message:
        """Message of worker key.worker: `encode_many` of that one worker (one code path, the same
        bits). shared_scalers: per-layer s (a MAX all-reduce: s >= local s_i; a mean: every worker
        clips at s). stats: `scaling(layers)` of this worker, or None to compute them. deferred: a
        `DeferredMessage` where the Numba kernels encode (see encode_many)."""
        scalings = stats
        if scalings is None:
            scalings = self.scaling(layers)      # the checks and errors of one worker's layers
        rows = with_ids({name: array_module(g).asarray(g)[None] for name, g in layers.items()}, layers)
        batch = [None if s is None else ScalingBatch(*(np.array([v], dtype=np.float64) for v in s))
                 for s in scalings]
        return self.encode_many(rows, key.seed, key.step, np.array([key.worker], dtype=np.uint32),
                                shared_scalers, batch, deferred)[0]

    def _defers(self, flats) -> bool:
        """Deferred encoding needs host arrays and the Numba kernels (`_numba.encode_range`)."""
        from tgsim.codecs.terngrad import numba_kernels as _numba

        return all(isinstance(f, np.ndarray) for f in flats) and self.kernels_for(np) is _numba

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
        tern = [i for i, spec in enumerate(layout.layers) if spec.kind == KIND_TERNARY]
        step = self._whole_step([messages[0].parts[i] for i in tern], "weighted_sum_layers")
        whole = {}
        if step is not None:        # every ternary layer in one call; errors as layer by layer
            xp = array_module(messages[0].parts[tern[0]])
            scalers = np.array([[m.scalers[i] for i in tern] for m in messages], dtype=np.float32)
            # host parts not from one encode_many call go by address, not stacked (Numba)
            rows = xp is np and getattr(messages[0], "batch", None) is None
            whole = dict(zip(tern, step([[m.parts[i] for m in messages] if rows else layer_payloads(messages, i, xp)
                                         for i in tern], scalers,
                                        [layout.layers[i].size for i in tern], self.packing, divide_by)))
        for i, spec in enumerate(layout.layers):
            parts = [m.parts[i] for m in messages]
            xp = array_module(parts[0])
            if i in whole:
                flat = whole[i]
            elif spec.kind == KIND_FLOAT:
                acc = xp.zeros(spec.size, dtype=xp.float64)
                for p in parts:
                    acc += p.reshape(-1).astype(xp.float64)
                flat = (acc * xp.float64(1.0 / divide_by)).astype(xp.float32)
            else:
                payloads = layer_payloads(messages, i, xp)
                scalers = xp.asarray(np.array([m.scalers[i] for m in messages], dtype=np.float32))
                flat = self.kernels_for(xp).weighted_sum(payloads, scalers, spec.size, self.packing, divide_by)
            out[spec.name] = flat.reshape(spec.shape)
        return out
