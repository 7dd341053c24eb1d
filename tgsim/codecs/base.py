"""The codec protocol: what every gradient codec declares and provides to the trainer and exchange.

One worker's step, for the W workers local to a process (layers carry a leading worker axis):

    stats  = codec.prepare_many(layers)                      # checks (NaN/Inf, dtypes), local statistics
    local  = codec.local_scalers_many(stats, W)              # (W, L) float32, where properties.shared_stats
    shared = MAX over all workers of local                   # the exchange's max_scalers, if sharing
    msgs   = codec.encode_many(layers, seed, step, workers, shared, stats)   # one message per worker
    mean   = exchange.aggregate(codec, msgs, mode, shared is not None)      # the mean over all workers

A stateful codec (`properties.stateful`, the `Stateful` sub-protocol) gets its state passed in and
returns the new one (as optax's transformations do): the trainer holds the opaque dict of
`init_state` and checkpoints it; a codec with `properties.rounds > 1` (the `MultiRound`
sub-protocol) is driven round by round, each round's messages combined by `exchange.mean_fp32`.

`codec.bits_per_element(layers_or_shapes)`: the bits on the wire of one worker's message per gradient
element, every byte counted (headers, parameters, padding): 8 · len(msg.to_bytes()) / Σ_l n_l for
one worker's layers {name: shape or array}; exact where the message size is a function of the
shapes, else (a codec with `bits_exact = False`: sizes that depend on the values) the largest
message's. A codec of R > 1 rounds counts the bytes of all its rounds.

and per message: `msg.to_bytes()`, `codec.from_bytes(buf, like=msg)` (a PayloadError naming what
is wrong for malformed bytes), `codec.decode(msg)`, `codec.aggregate(msgs, divide_by)`.

Like tensor_encoding's stages, a codec declares its properties (`CodecProperties`), which the
exchange, the config checks and the analysis read, and every registered codec passes one contract
(tgsim.testing). Codecs register by name in tgsim.codecs.registry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence, runtime_checkable

import numpy as np


WIRES = ("float32", "tgm1", "own")
COMBINES = ("mean", "majority")
BACKENDS = ("numpy", "cupy")


@dataclass(frozen=True)
class CodecProperties:
    """What a codec promises; the exchange picks its strategy from these, never from the codec's name.

    unbiased:         E[decode(encode(g))] == g for every g (checked by the contract's exact test)
    float_mean:       the messages are the float32 layers themselves: the exchange takes their
                      ordered fp32 mean (`exchange.mean_fp32`) and never calls `aggregate`
    sums_exactly:     integer codes that sum: the messages are tgsim's packed-code messages
                      (tgsim.codecs.message.Message) and the codec implements `SummableCodes`
                      (`kernels_for(xp)`, `packing`); codes of workers that share statistics sum
                      exactly (integer all-reduce: sum the codes, decode once with the number of
                      summands)
    defers_encode:    `encode_many(..., deferred=True)` is accepted: it returns messages whose codes
                      are encoded piece by piece as the pipelined MPI exchange sends them (same bits)
    shared_stats:     "max" | "mean": per-layer statistics MAX-reduced, or averaged (f32 of the float64
                      sum in worker order / N), over workers before encoding (scaler sharing) when the
                      exchange asks for it; None: none
    server_reencodes: the parameter server can encode the downlink again (exchange option
                      reternarize_downlink): the codec implements `Reencodes`
    stateful:         the codec keeps per-worker state across steps, passed in and out (`Stateful`;
                      the trainer checkpoints it)
    combine:          how `aggregate` combines the workers' decoded messages: "mean", f32(Σ_w f64(
                      decode_w) · (1/N)) in worker order; "majority", the majority vote sign(Σ_w
                      decode_w) (0 on a tie), as signSGD's server does (Bernstein et al. 2019)
    backends:         the array backends (run.backend) whose arrays encode, decode and aggregate
                      take: "numpy", and "cupy" where they run on CuPy arrays on the device
    rounds:           communication rounds per step: 1, or R > 1 for a codec of the `MultiRound`
                      sub-protocol (its messages are float32 layers averaged by the exchange each
                      round; such a codec is stateful)
    whole_step:       a layer's message depends on the other layers of the step (one statistic over
                      all layers, rounds over all of them): the codec encodes and exchanges every
                      layer of a step in one call. False: each layer's message is a function of that
                      layer alone and its stream key StreamKey(seed, step, worker, layer index), the
                      index read from `layer_ids(layers)`, so any subset of the layers (a DDP bucket,
                      tgsim.torch.ddp) can be encoded and exchanged on its own with the same bits;
                      a stateful such codec keeps its state under keys "<kind>/<layer name>"
    multi_tensor:     prepare_many, encode_many and aggregate each run over all the layers they are
                      given in one compiled call (CPU) or kernel launch (GPU) per pass, whatever the
                      number of layers (apex's multi_tensor_apply): the layers' rows reach the kernels
                      as a table of addresses, so a `FlatLayers` (one buffer, layers at offsets: a DDP
                      bucket) is read in place. False: the codec loops over the layers, one call per
                      layer and pass (the same bits either way; `tgsim codecs` lists the property)
    wire:             derived, for display only (nothing in the exchange or trainer branches on it):
                      "float32" where float_mean, "tgm1" where sums_exactly, else "own" (the codec's
                      own bytes, exchanged whole and combined by `codec.aggregate`). A codec may still
                      pass it; it must then agree with float_mean and sums_exactly.
    """

    unbiased: bool
    wire: str | None = None
    sums_exactly: bool = False
    shared_stats: str | None = None
    server_reencodes: bool = False
    stateful: bool = False
    combine: str = "mean"
    backends: tuple[str, ...] = ("numpy",)
    rounds: int = 1
    float_mean: bool | None = None
    defers_encode: bool = False
    whole_step: bool = False
    multi_tensor: bool = False

    def __post_init__(self):
        if self.wire is not None and self.wire not in WIRES:
            raise ValueError(f"wire must be one of {WIRES}, got {self.wire!r}")
        float_mean = self.wire == "float32" if self.float_mean is None else bool(self.float_mean)
        derived = "float32" if float_mean else "tgm1" if self.sums_exactly else "own"
        if self.wire is not None and self.wire != derived:
            raise ValueError(f"wire {self.wire!r} contradicts float_mean={float_mean}, sums_exactly="
                             f"{self.sums_exactly} (which give {derived!r})")
        if float_mean and self.sums_exactly:
            raise ValueError("float_mean and sums_exactly exclude each other (float32 layers or integer codes)")
        if self.defers_encode and not self.sums_exactly:
            raise ValueError("defers_encode needs sums_exactly (deferred messages are packed-code messages)")
        object.__setattr__(self, "float_mean", float_mean)
        object.__setattr__(self, "wire", derived)
        if self.shared_stats not in (None, "max", "mean"):
            raise ValueError(f"shared_stats must be None, 'max' or 'mean', got {self.shared_stats!r}")
        if self.combine not in COMBINES:
            raise ValueError(f"combine must be one of {COMBINES}, got {self.combine!r}")
        if not self.backends or set(self.backends) - set(BACKENDS):
            raise ValueError(f"backends must be a non-empty subset of {BACKENDS}, got {self.backends!r}")
        if not isinstance(self.rounds, int) or isinstance(self.rounds, bool) or self.rounds < 1:
            raise ValueError(f"rounds must be an int >= 1, got {self.rounds!r}")
        if self.rounds > 1 and not self.stateful:
            raise ValueError("a codec with rounds > 1 is stateful (its state goes through init_state)")


class IndexedLayers(dict):
    """One worker's (or W workers') layers {name: array}, a subset of a step's layers, with each
    layer's index in the step's full layer order: `ids` {name: index}. A codec draws layer `name`'s
    random stream from StreamKey(seed, step, worker, ids[name]) (`layer_ids`), so encoding the subset
    gives each layer the bits it has when the whole step is encoded in one call."""

    def __init__(self, layers: Mapping, ids: Mapping):
        super().__init__(layers)
        self.ids = {k: int(ids[k]) for k in self}


class FlatLayers(IndexedLayers):
    """W workers' layers held in one buffer: `buffer` (W, total), each row contiguous; layer `name` is
    the elements [starts[name], starts[name] + n) of every row, n = prod(shapes[name]), shaped
    (W, *shapes[name]). As a Mapping it is {name: that view of the buffer} in the order of `starts`,
    so every codec takes it (one without `properties.multi_tensor` goes through the views layer by
    layer); `rows` {name: the layer's elements of every row as one (W, n) view}; `ids` as IndexedLayers
    ({name: index in the step's full order}; default: the positions). Layers may lie in the buffer in
    any order, with gaps (a DDP bucket's buffer)."""

    def __init__(self, buffer, starts: Mapping, shapes: Mapping, ids: Mapping | None = None):
        if getattr(buffer, "ndim", None) != 2:
            raise ValueError(f"buffer: expected a 2-D array (workers, elements), got shape {np.shape(buffer)}")
        nw, total = buffer.shape
        if total > 1 and buffer.strides[1] != buffer.itemsize:
            raise ValueError("buffer: each worker's row must be contiguous")
        views, rows = {}, {}
        for name, start in starts.items():
            shape = tuple(int(d) for d in shapes[name])
            n, start = math.prod(shape), int(start)
            if start < 0 or start + n > total:
                raise ValueError(f"layer {name!r}: elements [{start}, {start + n}) outside the buffer's {total}")
            rows[name] = buffer[:, start:start + n]
            views[name] = rows[name].reshape((nw, *shape))
        super().__init__(views, {k: i for i, k in enumerate(views)} if ids is None else ids)
        self.buffer = buffer
        self.rows = rows
        self.starts = {k: int(starts[k]) for k in views}
        self.shapes = {k: views[k].shape[1:] for k in views}

    @classmethod
    def from_views(cls, buffer, views: Mapping, ids: Mapping | None = None):
        """The FlatLayers of `views` {name: array of one worker, shaped like the layer}, each a
        contiguous range of the 1-D `buffer` (a DDP bucket's gradient views of its buffer), as one
        worker's layers (1, *shape); ValueError where a view is not such a range."""
        base, size = buffer.ctypes.data, buffer.itemsize
        starts = {}
        for name, v in views.items():
            off, rem = divmod(v.ctypes.data - base, size)
            if (buffer.ndim != 1 or v.dtype != buffer.dtype or not v.flags.c_contiguous or rem
                    or off < 0 or off + v.size > buffer.size):
                raise ValueError(f"layer {name!r} is not a contiguous range of the buffer")
            starts[name] = off
        return cls(buffer.reshape(1, -1), starts, {k: v.shape for k, v in views.items()}, ids)


def flat_layers(layers: Mapping, ids: Mapping | None = None) -> FlatLayers:
    """`layers` {name: (W, *shape) array} copied one after another, in their order, into one new
    buffer (W, Σ n_l) of their array module and common dtype: the FlatLayers of the same values (the ids of
    `layers` where it is an IndexedLayers, else `ids`, else the positions)."""
    from tgsim.backend import array_module

    arrays = list(layers.values())
    xp = array_module(arrays[0]) if arrays else np
    nw = int(arrays[0].shape[0]) if arrays else 0
    sizes = [math.prod(a.shape[1:]) for a in arrays]
    starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).tolist()
    buffer = xp.empty((nw, starts[-1]), dtype=np.result_type(*[a.dtype for a in arrays]) if arrays else np.float32)
    for a, s, n in zip(arrays, starts, sizes):
        buffer[:, s:s + n] = a.reshape(nw, n)
    ids = getattr(layers, "ids", ids)
    return FlatLayers(buffer, dict(zip(layers, starts)), {k: a.shape[1:] for k, a in layers.items()}, ids)


def layer_ids(layers: Mapping) -> list[int]:
    """The stream-key layer index of each layer of `layers`, in its iteration order: `layers.ids[name]`
    for an `IndexedLayers`, else the positions 0, 1, ..., L-1 (the layers are the whole step)."""
    ids = getattr(layers, "ids", None)
    return list(range(len(layers))) if ids is None else [ids[k] for k in layers]


def with_ids(layers: dict, like: Mapping):
    """`layers` (made from `like`, the same names) with `like`'s layer indices where `like` is an
    IndexedLayers; `layers` itself otherwise."""
    ids = getattr(like, "ids", None)
    return layers if ids is None else IndexedLayers(layers, ids)


def layer_shapes(layers_or_shapes: Mapping) -> dict[str, tuple[int, ...]]:
    """{name: shape} of one worker's layers `layers_or_shapes`, given as {name: shape (tuple or list)} or
    {name: array}."""
    return {k: tuple(int(d) for d in v) if isinstance(v, (tuple, list)) else tuple(np.shape(v))
            for k, v in layers_or_shapes.items()}


def per_element_bits(nbytes: int, layers_or_shapes: Mapping) -> float:
    """8 · nbytes / Σ_l n_l: the bits of a message of `nbytes` bytes per element of the layers
    `layers_or_shapes` ({name: shape} or {name: array}; 0.0 for layers without elements)."""
    total = sum(math.prod(s) for s in layer_shapes(layers_or_shapes).values())
    return 8.0 * nbytes / total if total else 0.0


def encode_one(codec, layers: Mapping, key, shared_scalers=None):
    """One worker's message from `codec`: its layers {name: array} (no worker axis) encoded under the
    stream key `key` (tgsim.rng.StreamKey: seed, step, worker) as `encode_many` encodes that worker,
    after `prepare_many` (its checks, its statistics), so the same bits as the worker's row of a batched
    call. shared_scalers: the per-layer shared statistics, or None for the worker's own."""
    from tgsim.backend import array_module

    rows = {k: array_module(v).asarray(v)[None] for k, v in layers.items()}
    stats = codec.prepare_many(rows)
    return codec.encode_many(rows, key.seed, key.step, np.array([key.worker], dtype=np.int64), shared_scalers,
                             stats)[0]


class PlainCodec:
    """Base of codecs without config options and without shared statistics (fp32, fp16)."""

    name = "plain"

    @classmethod
    def from_config(cls, cfg):
        return cls()

    def encode(self, layers: Mapping, key, shared_scalers=None):
        """One worker's message of its layers {name: array} under StreamKey `key` (`encode_one`)."""
        return encode_one(self, layers, key, shared_scalers)

    def local_scalers_many(self, stats, workers: int | None = None):
        raise TypeError(f"{self.name} shares no statistics (properties.shared_stats is None)")


@runtime_checkable
class Codec(Protocol):
    name: str

    @property
    def properties(self) -> CodecProperties: ...

    def prepare_many(self, layers: Mapping): ...

    def local_scalers_many(self, stats, workers: int | None = None): ...

    def encode_many(self, layers: Mapping, seed: int, step: int, workers, shared_scalers=None, stats=None): ...

    def from_bytes(self, buf, like): ...

    def decode(self, message) -> dict: ...

    def aggregate(self, messages: Sequence, divide_by: int | None = None) -> dict: ...

    def bits_per_element(self, layers_or_shapes: Mapping) -> float: ...


@runtime_checkable
class Stateful(Protocol):
    """A codec with per-worker state across steps (`properties.stateful`), passed in and out.

    init_state(shapes, n_local) -> {key: (n_local, ...) float32}: the state at step 0 of the n_local
        workers of this process, for layers {name: shape}; every array has the leading local-worker
        axis (the trainer gathers all N workers' rows for a checkpoint, "codec_state").
    encoder_inputs(layers, state) -> {name: (W, *shape)}: the layers a single-round codec encodes
        given its state (error feedback: p = g + e); `prepare_many`, the shared statistics and the
        trainer's per-layer metrics are computed on them.
    encode_stateful(layers, seed, step, workers, state, shared_scalers=None, stats=None)
        -> (messages, new_state): one message per local worker, from the gradients `layers` and the
        state; `stats` and `shared_scalers` are those of `encoder_inputs(layers, state)`. The state
        passed in is not modified.
    """

    def init_state(self, shapes: Mapping[str, tuple], n_local: int) -> dict: ...

    def encoder_inputs(self, layers: Mapping, state: Mapping) -> dict: ...

    def encode_stateful(self, layers: Mapping, seed: int, step: int, workers, state: Mapping,
                        shared_scalers=None, stats=None) -> tuple[list, dict]: ...


@runtime_checkable
class MultiRound(Protocol):
    """A codec of R = `properties.rounds` > 1 communication rounds per step (PowerSGD: 2), stateful.

        msgs, ctx = codec.start_rounds(layers, seed, step, workers, state)   # round 0
        msgs, ctx = codec.next_round(ctx, mean)                              # rounds 1 .. R-1
        aggregate, new_state = codec.finish_rounds(ctx, mean)

    msgs: per local worker a dict of float32 arrays; mean: the ordered fp32 mean over ALL workers
    of the previous round's messages (`exchange.mean_fp32`, the same bits in the simulator and over
    MPI); aggregate: the step's mean gradient {layer: shape}, the same on every worker; new_state:
    the state of `init_state`'s keys and shapes after the step. The step's bytes are the sum of the
    rounds' bytes.
    """

    def init_state(self, shapes: Mapping[str, tuple], n_local: int) -> dict: ...

    def start_rounds(self, layers: Mapping, seed: int, step: int, workers, state: Mapping) -> tuple[list, object]: ...

    def next_round(self, ctx, mean: Mapping) -> tuple[list, object]: ...

    def finish_rounds(self, ctx, mean: Mapping) -> tuple[dict, dict]: ...


@runtime_checkable
class SummableCodes(Protocol):
    """`properties.sums_exactly`: the messages are tgsim.codecs.message.Message (a layout, per-layer
    payloads `parts` and `scalers`), whose integer codes the exchange sums without decoding.

    packing:         the payloads' code packing ("2bit", ...; tgsim.codecs.packing)
    kernels_for(xp): the kernels for arrays of `xp`: `sum_codes(payloads (W, bytes), size, packing,
                     dtype)` -> Σ_w codes (int8/int16), `weighted_sum(payloads, scalers, size,
                     packing, n)` -> f32 Σ_w s_w codes_w / n, and optionally `scaled_code_sum`
    """

    packing: str

    def kernels_for(self, xp): ...


@runtime_checkable
class SingleMessageCodec(Protocol):
    """One message for one set of layers (a parameter server's downlink): `encode(layers, key)` with
    layers {name: array} and key a tgsim.rng.StreamKey -> a message (`wire_bytes`, `to_bytes()`);
    `decode(message)` -> {name: float32 array}."""

    def encode(self, layers: Mapping, key): ...

    def decode(self, message) -> dict: ...


@runtime_checkable
class Reencodes(Protocol):
    """`properties.server_reencodes`: `downlink_codec()` is the `SingleMessageCodec` the parameter
    server encodes the mean with again (exchange option reternarize_downlink)."""

    def downlink_codec(self) -> SingleMessageCodec: ...
