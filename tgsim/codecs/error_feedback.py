"""Error feedback (EF) as a wrapper of any codec (`[codec] error_feedback = true`).

EF-SGD (Karimireddy et al. 2019, Alg. 2; Stich et al. 2018): each worker w keeps a residual e_w, the
part of its past gradients that its messages did not carry, and adds it to the next gradient before
encoding. tgsim keeps it in the learning-rate-free form (docs/THEORY.md §2.1), worker w at step t:

    p_w   = f32(g_w) + e_w               compensate        (e_w = 0 at step 0, float32, the layers' shapes)
    m_w   = C(p_w)                       the inner codec's message: what worker w sends
    e_w' = p_w - D(m_w)                  new residual      (D = codec.decode: what the others receive)
    x'   = optimizer(x, combine_w D(m_w), γ_t)           the exchange and optimizer as without EF

Karimireddy et al. put the learning rate before the compressor: p = γ g + e, x' = x - C(p),
e' = p - C(p). For a constant γ and a positively homogeneous C (C(γv) = γC(v): scaled sign, top-k;
the stochastic codecs with the same draws) the two forms give the same iterates in exact arithmetic,
e_paper = γ e_here. They differ when the schedule changes γ: here the residual carried into step t
is applied at γ_t (the optimizer scales the aggregate), there at the γ it was accumulated with.
tgsim takes the lr-free form because the codec runs before the optimizer (momentum and Adam act on
the aggregate, not on lr-scaled messages), as in PowerSGD's error feedback (Vogels et al. 2019,
epfml/powersgd).

Both operations are elementwise float32 per worker, so a worker's residual has the same bits in the
simulator (W workers batched) and on its MPI rank (W = 1). `compensate` and `new_residual` are the
math; `ErrorFeedback` wraps a codec (the protocol of tgsim.codecs.base, delegated to the inner codec)
and declares the property rule `ef_properties`: stateful, and biased unless the inner codec is
lossless (float_mean: D(C(p)) = p, the residual stays 0 and EF is the identity). Given a worker's
residual e, E[D(C(g + e))] = g + e for an unbiased inner codec: the message is biased for every
e != 0, which `tgsim analyze unbiasedness --codec all` shows on the rows "NAME+ef".

Invariant (the one epfml/powersgd checks): D(m_w) + e_w' == p_w up to the one float32 rounding of
e_w' = fl(p_w - D(m_w)): |D + e' - p| <= 2^-24 |p - D| per element, in exact arithmetic.

`ErrorFeedback` owns the residuals as its state (the `Stateful` protocol of tgsim.codecs.base):
`init_state` gives {"residual/<layer>": (n_local, *shape) float32 zeros} and `encode_stateful`
returns the messages of p and the new residuals; the trainer keeps that dict opaque and
checkpoints all N workers' rows as "codec_state" (`pack_rows` / `unpack_rows`: one (n, M) float32
buffer, M = Σ sizes, which the MPI exchange gathers to rank 0 in one message).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from tgsim.backend import array_module, to_numpy
from tgsim.codecs.base import CodecProperties, with_ids
from tgsim.errors import ConfigError

SUFFIX = "+ef"                 # "qsgd+ef": the name of an EF-wrapped codec (tables, error messages)
PREFIX = "residual/"           # the state key of a layer's residuals: "residual/fc1.w"


def lossless(props: CodecProperties) -> bool:
    """Whether a codec with properties `props` sends the float32 layers as they are (D(C(p)) = p), so
    that its residual is always 0."""
    return props.float_mean


def ef_properties(inner: CodecProperties) -> CodecProperties:
    """The properties of ErrorFeedback around a codec with properties `inner`: stateful (the residuals,
    checkpointed with the run) and biased (E[D(C(g + e))] = g + e != g), except around a lossless codec,
    where it is the identity."""
    return dataclasses.replace(inner, stateful=True, unbiased=inner.unbiased and lossless(inner))


def compensate(grads: Mapping, residual: Mapping) -> dict:
    """{layer: p} with p = f32(g) + e per layer (W, *shape): the input of the inner codec, from the local
    workers' gradients `grads` and their residuals `residual` (ValueError on a shape mismatch)."""
    out = {}
    for k, g in grads.items():
        xp = array_module(g)
        e = residual[k]
        if tuple(e.shape) != tuple(g.shape):
            raise ValueError(f"error feedback: layer {k!r}: residual of shape {tuple(e.shape)} for a gradient "
                             f"of shape {tuple(g.shape)}")
        out[k] = xp.asarray(g, dtype=xp.float32) + xp.asarray(e)
    return out


def new_residual(compensated: Mapping, decoded: Sequence[Mapping]) -> dict:
    """{layer: e'} with e' = p - D(C(p)) per layer, from the compensated gradients `compensated`
    {layer: (W, *shape)} and `decoded`, the decoded message of each local worker, in order."""
    out = {}
    for k, p in compensated.items():
        xp = array_module(p)
        if len(decoded) != p.shape[0]:
            raise ValueError(f"error feedback: {len(decoded)} decoded messages for {p.shape[0]} workers")
        sent = xp.stack([xp.asarray(d[k], dtype=xp.float32).reshape(p.shape[1:]) for d in decoded])
        out[k] = p - sent
    return out


def zeros(shapes: Mapping, n_local: int) -> dict:
    """The residuals at step 0: {layer: (n_local, *shape) float32 zeros} for the layers `shapes`."""
    return {k: np.zeros((n_local, *tuple(s)), np.float32) for k, s in shapes.items()}


def as_state(residual: Mapping) -> dict:
    """{layer: (n, *shape)} residuals -> the codec state {"residual/<layer>": (n, *shape)}."""
    return {PREFIX + k: v for k, v in residual.items()}


def residuals(state: Mapping) -> dict:
    """The codec state {"residual/<layer>": ...} -> the residuals {layer: (n, *shape)}."""
    return {k[len(PREFIX):]: v for k, v in state.items() if k.startswith(PREFIX)}


def pack_rows(residual: Mapping) -> np.ndarray:
    """The (n, M) float32 host array of `residual` {key: (n, *shape)}, keys in order (one buffer to gather)."""
    rows = [np.asarray(to_numpy(v), np.float32).reshape(v.shape[0], -1) for v in residual.values()]
    return np.ascontiguousarray(np.concatenate(rows, axis=1)) if rows else np.zeros((0, 0), np.float32)


def unpack_rows(rows: np.ndarray, shapes: Mapping) -> dict:
    """{layer: (n, *shape)} of the (n, M) float32 `rows` for the layers `shapes` (`pack_rows` undone;
    ValueError when M is not the layers' size)."""
    rows = np.asarray(rows, np.float32)
    out, off = {}, 0
    for k, s in shapes.items():
        size = int(np.prod(s, dtype=np.int64))
        out[k] = rows[:, off:off + size].reshape(rows.shape[0], *tuple(s)).copy()
        off += size
    if off != rows.shape[1]:
        raise ValueError(f"error feedback: {rows.shape[1]} residual values per worker, the layers hold {off}")
    return out


def local_rows(saved: Mapping, shapes: Mapping, local_workers: Sequence[int]) -> dict:
    """This process's rows of a checkpoint's residuals `saved` {layer: (N, *shape)}: {layer:
    (len(local_workers), *shape)} for the rows `local_workers`; ValueError when the layers or shapes
    differ from `shapes`."""
    if set(saved) != set(shapes):
        raise ValueError(f"error feedback: the checkpoint holds residuals of layers {sorted(saved)}, the model "
                         f"has {sorted(shapes)}")
    idx = np.asarray(local_workers, dtype=np.int64)
    out = {}
    for k, s in shapes.items():
        v = np.asarray(saved[k], np.float32)
        if v.shape[1:] != tuple(s) or v.shape[0] <= int(idx.max(initial=-1)):
            raise ValueError(f"error feedback: layer {k!r}: the checkpoint's residuals have shape {v.shape}, "
                             f"expected (N, {', '.join(map(str, s))}) with N > {int(idx.max(initial=-1))}")
        out[k] = np.ascontiguousarray(v[idx])
    return out


class ErrorFeedback:
    """A codec with error feedback: the inner codec's protocol (tgsim.codecs.base), its properties
    per `ef_properties`, its name + "+ef", and the `Stateful` protocol whose state is the residuals
    {"residual/<layer>": (n_local, *shape) float32} (module docstring). `encode_many` and `decode`
    are the inner codec's (a message of p is the inner codec's message)."""

    def __init__(self, inner):
        props = inner.properties
        if props.stateful:
            raise ConfigError(f"[codec] error_feedback: {inner.name!r} keeps its own state already; error "
                              "feedback wraps a stateless codec")
        if props.combine == "majority":
            raise ConfigError(
                f"[codec] error_feedback needs a codec whose aggregate is the mean of the decoded messages; "
                f"{inner.name!r} combines them by majority vote, a second compression that no worker's residual "
                "sees, and sends ±1 whatever the size of p = g + e, so the residual grows without bound where "
                "|g| > 1. EF-signSGD (Karimireddy et al. 2019) is name = 'scaled_sign' with error_feedback = true")
        self.inner = inner
        self.name = f"{inner.name}{SUFFIX}"
        self.properties = ef_properties(props)

    def init_state(self, shapes: Mapping, n_local: int) -> dict:
        """The residuals at step 0: {"residual/<layer>": (n_local, *shape) float32 zeros}."""
        return as_state(zeros(shapes, n_local))

    def encoder_inputs(self, layers: Mapping, state: Mapping) -> dict:
        """p = f32(g) + e per layer (W, *shape): what the inner codec encodes (with the layer indices
        of `layers` where it is an IndexedLayers)."""
        return with_ids(compensate(layers, residuals(state)), layers)

    def encode_stateful(self, layers: Mapping, seed: int, step: int, workers, state: Mapping,
                        shared_scalers=None, stats=None) -> tuple[list, dict]:
        """(the inner codec's messages m_w = C(p_w), the new state {"residual/<layer>": e_w' = p_w - D(m_w)})
        for p = `encoder_inputs(layers, state)`; `shared_scalers` and `stats` are those of p."""
        p = self.encoder_inputs(layers, state)
        msgs = self.inner.encode_many(p, seed, step, workers, shared_scalers, stats)
        return msgs, as_state(new_residual(p, [self.inner.decode(m) for m in msgs]))

    def __getattr__(self, attr):      # the protocol (prepare_many, encode_many, decode, ...) and the rest
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def __repr__(self) -> str:
        return f"ErrorFeedback({self.inner!r})"


def split_name(name: str) -> tuple[str, bool]:
    """(the registered codec's name, whether error feedback wraps it): "qsgd+ef" -> ("qsgd", True)."""
    return (name[:-len(SUFFIX)], True) if name.endswith(SUFFIX) else (name, False)
