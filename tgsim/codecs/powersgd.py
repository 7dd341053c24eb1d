"""PowerSGD: rank-r compression by one step of power iteration, with error feedback and warm start.

Vogels, Karimireddy, Jaggi (NeurIPS 2019), "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization": the rank-r compression and aggregation of their Algorithm 1, the previous
step's Q as the start of this step's power iteration (warm start), inside the error feedback of
their Algorithm 2; the compressor of PyTorch DDP's `powerSGD_hook`.

Each layer of shape (s_0, s_1, ...) is the matrix M_w of n = s_0 rows and m = s_1 s_2 ... columns
(C order). It is compressed at rank r_l = min(rank, n, m) where it has two or more dimensions and

    min_compression_rate · r_l (n + m) < n m                        (the `compressed_rank` rule)

(what r_l (n + m) floats save over n m). A vector is sent as float32 and averaged, as the paper's
Algorithm 1 aggregates biases uncompressed; so is a matrix too small to gain, as PyTorch's hook does
with its min_compression_rate. Per step, per compressed layer, worker w:

    Δ_w  = M_w + e_w                     error feedback (e_w = 0 at step 0)
    P_w  = Δ_w Q ;  P = mean_w P_w        round 1: the ordered fp32 mean
    P̂    = orthogonalize(P)             Gram-Schmidt (`orthogonalize`)
    Q_w  = Δ_wᵀ P̂ ;  Q = mean_w Q_w      round 2: the ordered fp32 mean
    aggregate = P̂ Qᵀ                     the step's update direction, the same on every worker
    e_w' = Δ_w - P̂ Q_wᵀ                  what worker w's share did not carry
    warm start: the next step's Q is this Q

Float32 layers (float32 copies of the gradients) are sent as they are in round 1 next to the P_w
and averaged there. Invariant (per worker, per compressed layer): P̂ Q_wᵀ + e_w' == Δ_w up to the one
float32 rounding of e_w' = fl(Δ_w - P̂ Q_wᵀ) (at most 2^-24 |Δ_w - P̂ Q_wᵀ| per element).

Q's start: a column of the warm-start Q that is exactly zero (every column at step 0, where the
state holds zeros; every column at every step with warm_start = false; a column zeroed by
`orthogonalize` for a rank-deficient P) is drawn standard normal, float32, from the stream key
(seed, step, worker 2^32 - 1, layer index) of tgsim.rng: no worker has that index, and every worker
draws the same Q without communicating. The normals are Box-Muller of tgsim.rng.uniform's 24-bit
uniforms: z = sqrt(-2 ln(1 - u_i)) cos(2π u_{k+i}), i < k = m r (`standard_normal`).

Fixed order: every product is float64 of the float32 operands, summed in an order fixed by the
shapes alone (`project`, `back_project`: NumPy's sum along one axis of the elementwise products, no
BLAS), rounded once to float32, one worker at a time. So a worker's P_w, Q_w and e_w' have the same
bits whether its process holds 1 or N workers (an MPI rank or the simulator), and P̂, the aggregate
and the new Q (functions of the all-worker means) are the same on every worker.

State (`init_state`, every array with the leading local-worker axis, float32, for the trainer's
checkpoint): "residual/<layer>" (W, *shape), e_w; "q/<layer>" (W, m, r_l), the warm-start Q (the
same rows on every worker). Compressed layers only.

Driver (tgsim.codecs.base.MultiRound; `properties.rounds` = 2; `properties.whole_step`: the rounds
run over all layers of a step at once, Q drawn under each layer's position among them):

    msgs, ctx = codec.start_rounds(layers, seed, step, workers, state)  # {"p/<l>": P_w, "<l>": f32(g_w)}
    msgs, ctx = codec.next_round(ctx, mean)                             # {"q/<l>": Q_w}
    aggregate, new_state = codec.finish_rounds(ctx, mean)

Bytes per worker and step (`bits_per_element`, both rounds): Σ_compressed 4 r_l (n + m) +
Σ_float32 4 n_l; each round's messages are raw float32 (no header), combined by the exchange's
ordered fp32 mean (`properties.float_mean`).

One-step view (`encode_many`, `decode`, `aggregate`, for the codec contract and `tgsim analyze
unbiasedness`, which take one message per worker): one step of the algorithm above from the zero state
(e_w = 0, Q drawn from the key) among the workers given, the two rounds averaged in process (the
ordered fp32 mean over those workers). Worker w's message is {"p/<l>": P̂, "q/<l>": Q_w, "<l>":
f32(g_w)}, as many float32 values as it sends in its two rounds; decode gives P̂ Q_wᵀ per
compressed layer, and `aggregate` the ordered mean of the decodes (which is P̂ Qᵀ up to float32
rounding). Declared biased: E[P̂ P̂ᵀ Δ] != Δ for a matrix of rank above r.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from tgsim.backend import array_module
from tgsim.codecs import options
from tgsim.codecs.base import CodecProperties, encode_one
from tgsim.codecs.fp32 import Float32Message, first_beyond_float32, first_nonfinite
from tgsim.codecs.ordered_mean import ordered_mean
from tgsim.errors import PayloadError
from tgsim.rng import StreamKey, uniform

DRAW_WORKER = 2**32 - 1        # the worker word of Q's stream key: no worker has it, all draw alike
DEPENDENT = 2.0**-16           # a column of P whose part orthogonal to the earlier ones is below
                               # this fraction of its norm is dependent on them (P̂'s column: zero)


# -- the math, one worker at a time -----------------------------------------------------------------

def _f32(a):
    """`a` as a float32 array of its own module (no copy when it is one already)."""
    return array_module(a).asarray(a, dtype=array_module(a).float32)


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """(n, m) = (s_0, s_1 s_2 ...) of a layer of shape (s_0, s_1, ...): its matrix M (C order)."""
    shape = tuple(int(s) for s in shape)
    return (shape[0], int(np.prod(shape[1:], dtype=np.int64))) if shape else (1, 1)


def compressed_rank(shape: Sequence[int], rank: int, min_compression_rate: float) -> int:
    """r_l = min(rank, n, m) for a layer of `shape` with two or more dimensions ((n, m) its matrix_shape)
    and min_compression_rate · r_l (n + m) < n m; 0 (sent as float32) otherwise."""
    if len(shape) < 2:
        return 0
    n, m = matrix_shape(shape)
    r = min(int(rank), n, m)
    return r if r > 0 and min_compression_rate * r * (n + m) < n * m else 0


def standard_normal(rows: int, cols: int, key: StreamKey, xp=np):
    """(rows, cols) float32 standard normals, C order: Box-Muller of the k = rows·cols pairs of
    24-bit uniforms u of tgsim.rng.uniform(2k, key): z_i = sqrt(-2 ln(1 - u_i)) cos(2π u_{k+i})."""
    k = int(rows) * int(cols)
    u = uniform(2 * k, key, xp)
    z = xp.sqrt(-2.0 * xp.log(1.0 - u[:k])) * xp.cos(2.0 * math.pi * u[k:])
    return z.astype(xp.float32).reshape(rows, cols)


def start_q(q, key: StreamKey, warm_start: bool = True):
    """This step's Q (m, r) float32: the warm-start `q` (None: zeros) with every column that is
    exactly zero replaced by that column of `standard_normal(m, r, key)`; all columns drawn when
    not `warm_start`."""
    xp = array_module(q)
    q = xp.asarray(q, dtype=xp.float32)
    dead = ~xp.any(q != 0, axis=0) if warm_start else xp.ones(q.shape[1], dtype=bool)
    if not bool(xp.any(dead)):
        return q
    fresh = standard_normal(q.shape[0], q.shape[1], key, xp)
    return xp.where(dead[None, :], fresh, q)


def project(delta, q):
    """P = Δ Q of Δ = `delta` (n, m) and Q = `q` (m, r) -> (n, r) float32: P_ij = f32(Σ_k f64(Δ_ik)
    f64(Q_kj)), each sum NumPy's sum along the contiguous axis of the float64 products (an order fixed
    by m alone)."""
    xp = array_module(delta)
    d = xp.asarray(delta, dtype=xp.float64)
    q = xp.asarray(q, dtype=xp.float64)
    out = xp.empty((d.shape[0], q.shape[1]), dtype=xp.float32)
    for j in range(q.shape[1]):
        out[:, j] = (d * q[:, j][None, :]).sum(axis=1).astype(xp.float32)
    return out


def back_project(delta, p_hat):
    """Q = Δᵀ P̂ of Δ = `delta` (n, m) and P̂ = `p_hat` (n, r) -> (m, r) float32: Q_kj = f32(Σ_i
    f64(Δ_ik) f64(P̂_ij)), each sum NumPy's sum over axis 0 of the float64 products (an order fixed by
    n alone)."""
    xp = array_module(delta)
    d = xp.asarray(delta, dtype=xp.float64)
    p = xp.asarray(p_hat, dtype=xp.float64)
    out = xp.empty((d.shape[1], p.shape[1]), dtype=xp.float32)
    for j in range(p.shape[1]):
        out[:, j] = (d * p[:, j][:, None]).sum(axis=0).astype(xp.float32)
    return out


def low_rank(p_hat, q):
    """P̂ Qᵀ of P̂ = `p_hat` (n, r) and Q = `q` (m, r) -> (n, m) float32: f32(Σ_j f64(P̂_ij) f64(Q_kj)),
    j in order."""
    xp = array_module(p_hat)
    p = xp.asarray(p_hat, dtype=xp.float64)
    q = xp.asarray(q, dtype=xp.float64)
    acc = xp.zeros((p.shape[0], q.shape[0]), dtype=xp.float64)
    for j in range(p.shape[1]):
        acc += p[:, j][:, None] * q[:, j][None, :]
    return acc.astype(xp.float32)


def orthogonalize(p):
    """P̂: the columns of P (n, r) made orthonormal by modified Gram-Schmidt in float64, left to
    right, rounded once to float32 (Algorithm 1's ORTHOGONALIZE): v = p_j - Σ_{i<j} <p̂_i, v> p̂_i (v updated after
    each i), p̂_j = v / ||v||, or 0 where ||v|| <= DEPENDENT ||p_j|| (p_j is, to rounding, in the span
    of the earlier columns: a rank-deficient P). Deterministic: the same P gives the same bits."""
    xp = array_module(p)
    a = xp.asarray(p, dtype=xp.float64)
    out = xp.zeros_like(a)
    for j in range(a.shape[1]):
        v = a[:, j].copy()
        size = float(xp.sqrt(xp.sum(v * v)))
        for i in range(j):
            v -= xp.sum(out[:, i] * v) * out[:, i]
        norm = float(xp.sqrt(xp.sum(v * v)))
        if norm > DEPENDENT * size:
            out[:, j] = v / norm
    return out.astype(xp.float32)


# -- messages ---------------------------------------------------------------------------------------

class PowerSGDMessage(Float32Message):
    """One worker's float32 arrays (a dict key -> array; raw little-endian float32 on the wire, in
    key order), and `shapes`, the layers' shapes (name -> shape) that decode reshapes to."""

    def __init__(self, arrays=(), shapes=None):
        super().__init__(arrays)
        self.shapes = dict(shapes or {})


@dataclass
class Rounds:
    """What a step keeps between its rounds: the next round (1 or 2), the number W of local
    workers, the layers' plan {name: (index, shape, r_l)}, Δ_w per compressed layer (W, n, m), the
    step's Q, P̂, the float32 layers' means and, after round 2, the workers' Q_w."""

    round: int
    workers: int
    plan: dict
    deltas: dict
    q: dict
    p_hat: dict = field(default_factory=dict)
    dense: dict = field(default_factory=dict)
    q_local: dict = field(default_factory=dict)


class PowerSGD:
    """PowerSGD, rank r, error feedback and warm start (module docstring); stateful, two rounds."""

    name = "powersgd"

    @dataclass(frozen=True)
    class Options:
        rank: int = options.option(2, "r: the rank of each compressed layer's approximation P̂ Qᵀ",
                                   min=1, sweep=(1, 2, 4))
        min_compression_rate: float = options.option(
            2.0, "a layer (n x m) is compressed only where rate · r (n + m) < n m, else sent as float32", min=1.0)
        warm_start: bool = options.option(True, "start each step's power iteration from the previous step's Q")

    properties = CodecProperties(unbiased=False, float_mean=True, stateful=True, rounds=2, whole_step=True)

    def __init__(self, rank: int = 2, min_compression_rate: float = 2.0, warm_start: bool = True):
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
            raise ValueError(f"powersgd rank must be an integer >= 1, got {rank!r}")
        if isinstance(min_compression_rate, bool) or not isinstance(min_compression_rate, (int, float)) \
                or not (math.isfinite(min_compression_rate) and min_compression_rate >= 1):
            raise ValueError(f"powersgd min_compression_rate must be a number >= 1, got {min_compression_rate!r}")
        self.rank = int(rank)
        self.min_compression_rate = float(min_compression_rate)
        self.warm_start = bool(warm_start)

    @classmethod
    def from_config(cls, cfg):
        o = options.parse(cls, cfg)
        return cls(rank=o.rank, min_compression_rate=o.min_compression_rate, warm_start=o.warm_start)

    def __repr__(self) -> str:
        return (f"PowerSGD(rank={self.rank}, min_compression_rate={self.min_compression_rate}, "
                f"warm_start={self.warm_start})")

    # -- layers, state, bits -------------------------------------------------------------------------
    def plan(self, shapes: Mapping) -> dict:
        """{name: (layer index, shape, r_l)} for layers {name: shape}, r_l = 0 for float32 layers."""
        return {k: (i, tuple(int(x) for x in s), compressed_rank(s, self.rank, self.min_compression_rate))
                for i, (k, s) in enumerate(shapes.items())}

    def init_state(self, shapes: Mapping, n_local: int) -> dict:
        """The state at step 0 of n_local workers: {"residual/<l>": zeros (n_local, *shape),
        "q/<l>": zeros (n_local, m, r_l)} float32, for the compressed layers in order."""
        state = {}
        for k, (_, shape, r) in self.plan(shapes).items():
            if r:
                state[f"residual/{k}"] = np.zeros((n_local, *shape), np.float32)
                state[f"q/{k}"] = np.zeros((n_local, matrix_shape(shape)[1], r), np.float32)
        return state

    def bits_per_element(self, layers_or_shapes: Mapping) -> float:
        """Bits one worker sends per gradient element and step, both rounds: 8 · (Σ_compressed
        4 r_l (n + m) + Σ_float32 4 n_l) / Σ n_l, for layers {name: shape or array of that shape}."""
        shapes = {k: tuple(v) if isinstance(v, (tuple, list)) else tuple(np.shape(v))
                  for k, v in layers_or_shapes.items()}
        total = sent = 0
        for k, (_, shape, r) in self.plan(shapes).items():
            n, m = matrix_shape(shape)
            size = int(np.prod(shape, dtype=np.int64))
            total += size
            sent += 4 * r * (n + m) if r else 4 * size
        return 8.0 * sent / total if total else 0.0

    # -- checks ---------------------------------------------------------------------------------------
    def prepare_many(self, layers: Mapping) -> None:
        """Raise NonFiniteGradientError for the first worker with a NaN/Inf gradient, and ValueError
        for a value beyond float32's range; no statistics."""
        err = first_nonfinite(layers) or first_beyond_float32(layers, "powersgd computes in float32")
        if err is not None:
            raise err
        return None

    def local_scalers_many(self, stats, workers: int | None = None):
        raise TypeError("powersgd shares no statistics (properties.shared_stats is None)")

    # -- the rounds ------------------------------------------------------------------------------------
    def start_rounds(self, layers: Mapping, seed: int, step: int, workers, state: Mapping):
        """Round 1: per local worker {"p/<l>": P_w = Δ_w Q (n, r_l), "<l>": f32(g_w) for float32
        layers}, layers in order; Δ_w = f32(g_w) + e_w, Q = `start_q` of the state's warm start.
        layers: {name: (W, *shape)}; state: `init_state`'s keys. Returns (messages, context)."""
        plan = self.plan({k: v.shape[1:] for k, v in layers.items()})
        n_local = len(workers)
        deltas, qs = {}, {}
        msgs = [PowerSGDMessage() for _ in range(n_local)]
        for k, (i, shape, r) in plan.items():
            g = layers[k]
            xp = array_module(g)
            if g.shape[0] != n_local:
                raise ValueError(f"powersgd: layer {k!r} holds {g.shape[0]} workers' gradients, {n_local} workers given")
            if not r:
                for w in range(n_local):
                    msgs[w][k] = _f32(g[w])
                continue
            n, m = matrix_shape(shape)
            e = xp.asarray(state[f"residual/{k}"], dtype=xp.float32)
            q_prev = xp.asarray(state[f"q/{k}"], dtype=xp.float32)
            if tuple(e.shape) != (n_local, *shape) or tuple(q_prev.shape) != (n_local, m, r):
                raise ValueError(f"powersgd: layer {k!r}: state of shapes {tuple(e.shape)}, {tuple(q_prev.shape)}; "
                                 f"expected {(n_local, *shape)}, {(n_local, m, r)}")
            q = start_q(q_prev[0], StreamKey(int(seed), int(step), DRAW_WORKER, i), self.warm_start)
            d = (xp.asarray(g, dtype=xp.float32) + e).reshape(n_local, n, m)
            deltas[k], qs[k] = d, q
            for w in range(n_local):
                msgs[w][f"p/{k}"] = project(d[w], q)
        return msgs, Rounds(1, n_local, plan, deltas, qs)

    def next_round(self, ctx: Rounds, mean: Mapping):
        """Round 2, from round 1's mean over all workers: P̂ = orthogonalize(P), per local worker
        {"q/<l>": Q_w = Δ_wᵀ P̂ (m, r_l)}. Returns (messages, context)."""
        if ctx.round != 1:
            raise ValueError(f"powersgd: next_round after round {ctx.round}; it follows start_rounds once")
        n_local = ctx.workers
        msgs = [PowerSGDMessage() for _ in range(n_local)]
        for k, (_, shape, r) in ctx.plan.items():
            if not r:
                ctx.dense[k] = mean[k]
                continue
            ctx.p_hat[k] = p_hat = orthogonalize(mean[f"p/{k}"])
            ctx.q_local[k] = [back_project(d, p_hat) for d in ctx.deltas[k]]
            for w in range(n_local):
                msgs[w][f"q/{k}"] = ctx.q_local[k][w]
        ctx.round = 2
        return msgs, ctx

    def finish_rounds(self, ctx: Rounds, mean: Mapping):
        """From round 2's mean Q over all workers: (aggregate {layer: P̂ Qᵀ, or the float32 layer's
        mean, in its shape}, new state {"residual/<l>": Δ_w - P̂ Q_wᵀ, "q/<l>": Q on every row})."""
        if ctx.round != 2:
            raise ValueError(f"powersgd: finish_rounds after round {ctx.round}; it follows next_round")
        aggregate, state = {}, {}
        for k, (_, shape, r) in ctx.plan.items():
            if not r:
                aggregate[k] = ctx.dense[k].reshape(shape)
                continue
            xp = array_module(ctx.deltas[k])
            q = xp.asarray(mean[f"q/{k}"], dtype=xp.float32)
            aggregate[k] = low_rank(ctx.p_hat[k], q).reshape(shape)
            d = ctx.deltas[k]
            sent = xp.stack([low_rank(ctx.p_hat[k], qw) for qw in ctx.q_local[k]])
            state[f"residual/{k}"] = (d - sent).reshape(d.shape[0], *shape)
            state[f"q/{k}"] = xp.ascontiguousarray(xp.broadcast_to(q, (d.shape[0], *q.shape)))
        ctx.round = 3
        return aggregate, state

    # -- the one-step view (module docstring) ----------------------------------------------------------
    def encode_many(self, layers: Mapping, seed: int, step: int, workers, shared_scalers=None, stats=None,
                    **_) -> list[PowerSGDMessage]:
        """One step from the zero state among the workers given (the rounds averaged in process):
        per worker {"p/<l>": P̂, "q/<l>": Q_w, "<l>": f32(g_w)} (module docstring, "One-step view")."""
        n_local = len(workers)
        shapes = {k: tuple(v.shape[1:]) for k, v in layers.items()}
        state = self.init_state(shapes, n_local)
        msgs, ctx = self.start_rounds(layers, seed, step, workers, state)
        msgs, ctx = self.next_round(ctx, ordered_mean(msgs, n_local) if msgs[0] else {})
        out = [PowerSGDMessage(shapes=shapes) for _ in range(n_local)]
        for k, (_, shape, r) in ctx.plan.items():
            for w in range(n_local):
                if r:
                    out[w][f"p/{k}"] = ctx.p_hat[k]
                    out[w][f"q/{k}"] = ctx.q_local[k][w]
                else:
                    out[w][k] = _f32(layers[k][w])
        return out

    def encode(self, layers: Mapping, key, shared_scalers=None) -> PowerSGDMessage:
        """One worker's message of its layers {name: array} (no worker axis) under StreamKey `key`:
        `encode_many` of that worker alone from the zero state (P̂ = orth(M Q), Q_w = Mᵀ P̂), so
        decode gives its rank-r approximation P̂ Q_wᵀ (tgsim.codecs.base.encode_one)."""
        return encode_one(self, layers, key, shared_scalers)

    def from_bytes(self, buf, like: PowerSGDMessage) -> PowerSGDMessage:
        """The float32 arrays shaped like `like`'s from their concatenated little-endian bytes
        (PayloadError for a length other than like's, or a non-finite value)."""
        buf = bytes(buf)
        want = like.wire_bytes
        if len(buf) != want:
            raise PayloadError(f"powersgd message is {len(buf)} bytes, its arrays need {want}")
        data = np.frombuffer(buf, dtype="<f4")
        if not np.isfinite(data).all():
            raise PayloadError(f"powersgd message holds {int((~np.isfinite(data)).sum())} non-finite values")
        out, off = PowerSGDMessage(shapes=getattr(like, "shapes", {})), 0
        for k, v in like.items():
            size = int(np.size(v))
            out[k] = data[off:off + size].reshape(np.shape(v)).astype(np.float32)
            off += size
        return out

    def decode(self, message: PowerSGDMessage) -> dict:
        """{layer: P̂ Q_wᵀ in its shape (compressed), or the float32 layer}, layers in order."""
        out = {}
        for k, shape in message.shapes.items():
            if f"p/{k}" in message:
                out[k] = low_rank(message[f"p/{k}"], message[f"q/{k}"]).reshape(shape)
            else:
                out[k] = _f32(message[k]).reshape(shape)
        return out

    def aggregate(self, messages: Sequence[PowerSGDMessage], divide_by: int | None = None) -> dict:
        """f32(Σ_w f64(decode_w) · (1/N)), workers in order (tgsim.codecs.ordered_mean)."""
        return ordered_mean([self.decode(m) for m in messages], len(messages) if divide_by is None else divide_by)
