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

and per message: `msg.to_bytes()`, `codec.from_bytes(buf, like=msg)` (a PayloadError naming what
is wrong for malformed bytes), `codec.decode(msg)`, `codec.aggregate(msgs, divide_by)`.

Like tensor_encoding's stages, a codec declares its properties (`CodecProperties`), which the
exchange, the config checks and the analysis read, and every registered codec passes one contract
(tgsim.testing). Codecs register by name in tgsim.codecs.registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence, runtime_checkable


WIRES = ("float32", "tgm1", "own")
COMBINES = ("mean", "majority")
BACKENDS = ("numpy", "cupy")


@dataclass(frozen=True)
class CodecProperties:
    """What a codec promises; the exchange picks its strategy from these, never from the codec's name.

    unbiased:         E[decode(encode(g))] == g for every g (checked by the contract's exact test)
    wire:             "float32": the messages are the float32 layers (the exchange's ordered fp32
                      mean); "tgm1": tgsim's packed-code message format (tgsim.codecs.message: codes
                      the exchange can sum from the bytes, pipelined over MPI); "own": the codec's
                      own bytes, exchanged whole and combined by `codec.aggregate`
    sums_exactly:     codes of workers that share statistics sum exactly (integer all-reduce: sum
                      the codes, decode once with the number of summands)
    shared_stats:     "max" | "mean": per-layer statistics MAX-reduced, or averaged (f32 of the float64
                      sum in worker order / N), over workers before encoding (scaler sharing) when the
                      exchange asks for it; None: none
    server_reencodes: the parameter server can encode the downlink again (exchange option
                      reternarize_downlink)
    stateful:         the codec keeps per-worker state across steps (checkpointed with the run)
    combine:          how `aggregate` combines the workers' decoded messages: "mean", f32(Σ_w f64(
                      decode_w) · (1/N)) in worker order; "majority", the majority vote sign(Σ_w
                      decode_w) (0 on a tie), as signSGD's server does (Bernstein et al. 2019)
    backends:         the array backends (run.backend) whose arrays encode, decode and aggregate
                      take: "numpy", and "cupy" where they run on CuPy arrays on the device
    rounds:           communication rounds per step: 1, or R > 1 for a codec of the `MultiRound`
                      sub-protocol (its messages are float32 layers averaged by the exchange each
                      round; such a codec is stateful)
    """

    unbiased: bool
    wire: str = "own"
    sums_exactly: bool = False
    shared_stats: str | None = None
    server_reencodes: bool = False
    stateful: bool = False
    combine: str = "mean"
    backends: tuple[str, ...] = ("numpy",)
    rounds: int = 1

    def __post_init__(self):
        if self.wire not in WIRES:
            raise ValueError(f"wire must be one of {WIRES}, got {self.wire!r}")
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


class PlainCodec:
    """Base of codecs without config options and without shared statistics (fp32, fp16)."""

    name = "plain"

    @classmethod
    def from_config(cls, cfg):
        return cls()

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
