"""Sparsifying codecs: top-k ("topk", biased, deterministic) and the variance-optimal random
sparsification of Wangni et al. 2018 ("randomk", unbiased). Each sends, per worker and layer, a
set of element indices and their float32 values; the decode is zero elsewhere.

Elements per layer of n elements (flattened, C order):  k_n = 0 for n = 0, else
min(n, k if k > 0 else max(1, round(density · n)))  (Python's round: half to even), the
`[codec] k` and `density` options (tgsim.train.config.CodecConfig).

topk (Aji & Heafield 2017; Stich et al. 2018): keep the k_n largest |v_i|; among equal |v_i| at the
    threshold the lower indices are kept (the order of analysis.peers.top_k, a stable argsort of
    -|v|). Values sent: f32(v_i). Deterministic, so biased; the error is exactly
    ||Q(v) - v||^2 = Σ_{i not kept} v_i^2 (analysis.peers.top_k_error) for float16/float32 gradients.
    Cost: the threshold from a strided sample of 2^16 elements, one pass for the candidates >= it
    (`_candidates`), a partition of those (a full np.partition for layers under 2^16 elements or
    k_n > n / 4).

randomk (Wangni, Wang, Liu, Zhang 2018, "Gradient sparsification for communication-efficient
    distributed optimization"): keep probabilities p_i = min(λ |v_i|, 1) with Σ p_i = min(k_n, nnz(v))
    (`keep_probabilities`, equal to analysis.peers.sparsification_probabilities up to float64
    summation order: the p minimizing Σ v_i^2 / p_i under Σ p_i = k). λ is found from the k_n
    largest |v_i| alone (at most k_n - 1 elements saturate; `keep_scale`): with them sorted
    descending and j saturated, λ_j = (k - j) / Σ_{i >= j} a_(i); the answer is the smallest j with
    λ_j a_(j) <= 1. For nnz(v) <= k_n every nonzero element has p_i = 1.
    Draw: with w_i = word_i >> 8 the 24-bit integers of tgsim.rng.random_words(n, StreamKey(seed,
    step, worker, layer index)) (so u_i = w_i 2^-24 is tgsim.rng.uniform), element i is kept iff
    u_i < p_i, i.e. iff w_i < c_i = ceil(p_i 2^24): its keep probability is exactly
    p̃_i = c_i / 2^24 (>= p_i, within 2^-24). The value sent is f32(v_i / p̃_i), so
    E[Q_i] = p̃_i f32(v_i / p̃_i) = v_i up to the float32 rounding of the sent value (|bias| <=
    2^-24 |v_i|): dividing by the grid's probability p̃_i instead of p_i removes the 24-bit grid's
    bias, which would otherwise be up to 2^-24 / p_i relative (large for tiny p_i). Where p_i = 1
    the element is always kept (w_i < 2^24 always) and sent exactly (v_i / 1). v_i = 0 is never
    kept. The error is E||Q - v||^2 = Σ v_i^2 (1/p̃_i - 1) (analysis.peers.random_sparsification_
    error with p̃ for p; they differ by at most 2^-24 / p_i relative per element), the count of kept
    elements has mean Σ p̃_i (= k_n for nnz(v) >= k_n, up to n 2^-24) and variance Σ p̃_i (1 - p̃_i).
    Note that every kept value with p_i < 1 is ±1/λ up to the p̃ rounding: a sign and one scale
    would do; this wire sends float32 values, like topk.

Both: gradients of any float dtype; ranking and probabilities in float64 (randomk) or the gradient's
own dtype (topk, exact); values beyond float32's range are refused (ValueError, naming the layer and
worker), as are layers of 2^32 or more elements. NumPy array code on the host (a CuPy gradient is
copied to the host first). Messages hold NumPy arrays.

    mean = f32(Σ_w f64(decode_w) · (1/N)), workers in order (tgsim.codecs.ordered_mean)

Kernels ([codec] kernels): "auto" and "numba" select (topk: one candidate pass, then the exact
k-th largest among the candidates; randomk: Philox words, keep test and sent values fused, after the
reference's λ) and decode-sum (a scatter-add per element task, no dense decode per message) with the
Numba kernels of tgsim.codecs.numba_sparse on NumPy arrays, the same bytes and float32 bits as this
array code; "reference" and "cuda" run the array code (CuPy gradients always do; "numba" refuses them).

Wire: the frame of tgsim.codecs.framing (magic b"TGK1" for topk, b"TGR1" for randomk, version 1),
then, little-endian, per layer in order:

    count u32 | count indices (unsigned, width b_n bytes) | count values float32

with b_n = 1 for n <= 2^8, 2 for n <= 2^16, else 4 (byte-aligned: the smallest of uint8/16/32
holding n - 1), indices strictly increasing. Bytes of a message:

    HEADER.size (21) + Σ_layers (4 + count_l (b_l + 4))        topk: count_l = k_l, exact

from_bytes refuses (PayloadError naming the layer): a count other than k_n (topk) or above n
(randomk), indices not strictly increasing or >= n, non-finite values, a zero value (randomk: a kept
element has v_i != 0), truncated layers, bytes after the last layer.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from tgsim.codecs import options
from tgsim.codecs.base import CodecProperties, PlainCodec, layer_ids, layer_shapes, per_element_bits
from tgsim.codecs.fp32 import first_beyond_float32, first_nonfinite
from tgsim.codecs.framing import HEADER, frame, unframe
from tgsim.codecs.ordered_mean import ordered_mean
from tgsim.errors import PayloadError
from tgsim.rng import StreamKey, random_words

_TOPK_MAGIC, _RANDOMK_MAGIC, _VERSION = b"TGK1", b"TGR1", 1
_COUNT = struct.Struct("<I")
MAX_ELEMENTS = 2**32 - 1          # counts and indices are u32
F32_MAX = float(np.finfo(np.float32).max)
GRID = 2**24                      # the uniforms' grid: u = w 2^-24, w a 24-bit integer
_NUMBA_WORDS_FROM = 1 << 15       # elements from which the words come from the Numba Philox
KERNELS = ("auto", "reference", "numba", "cuda")


def _host(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def kept_elements(n: int, k: int, density: float) -> int:
    """k_n: min(n, k if k > 0 else max(1, round(density · n))), 0 for an empty layer."""
    if n == 0:
        return 0
    return min(n, k if k > 0 else max(1, round(density * n)))


def index_bytes(n: int) -> int:
    """b_n: bytes of one index of a layer of n elements (the smallest of uint8/16/32 holding n - 1)."""
    return 1 if n <= 2**8 else 2 if n <= 2**16 else 4


def message_bytes(counts: Sequence[int], sizes: Sequence[int]) -> int:
    """HEADER.size + Σ (4 + count (b_n + 4)) for layers of `sizes` elements sending `counts`."""
    return HEADER.size + sum(_COUNT.size + c * (index_bytes(n) + 4) for c, n in zip(counts, sizes))


def _words24(n: int, key: StreamKey) -> np.ndarray:
    """w_i = word_i >> 8 of tgsim.rng.random_words(n, key) (u_i = w_i 2^-24 is tgsim.rng.uniform);
    from 2^15 elements the same words from the Numba Philox."""
    if n >= _NUMBA_WORDS_FROM:
        from tgsim.rng.numba_philox import random_words as numba_words

        w = numba_words(n, key)
    else:
        w = random_words(n, key, np)
    return w >> np.uint32(8)


def _candidates(a: np.ndarray, k: int):
    """Ascending indices of a superset of the k largest a_i (all i with a_i >= t), or None (then
    the caller partitions the whole layer). t is taken from a strided sample of ~2^16 elements, a
    little below the sample's k/n quantile, so that usually #(a >= t) is a small multiple of k; the
    sample only decides the speed: the k largest are >= the k-th largest >= t whenever
    #(a >= t) >= k, which is checked."""
    n = int(a.size)
    if n < 1 << 16 or 4 * k > n:
        return None
    s = a[::n >> 16]
    m = int(s.size)
    f = m * k / n
    r = min(m, int(1.25 * f + 4.0 * math.sqrt(f) + 16))     # sample elements at or above t
    t = np.partition(s, m - r)[m - r]
    cand = np.flatnonzero(a >= t)
    return cand if cand.size >= k else None


def _top_k_of(a: np.ndarray, k: int) -> np.ndarray:
    """top_k_indices by one partition of all of `a` (0 < k < n)."""
    t = np.partition(a, a.size - k)[a.size - k]
    cand = np.flatnonzero(a >= t)
    if cand.size > k:
        eq = a[cand] == t
        room = k - int(cand.size - np.count_nonzero(eq))        # ties kept, lowest indices first
        cand = cand[~eq | (np.cumsum(eq) <= room)]
    return cand


def top_k_indices(a: np.ndarray, k: int) -> np.ndarray:
    """The indices (ascending, int64) of the k largest a_i (a = |v| >= 0, flat); ties at the
    threshold go to the lower indices: with t the k-th largest, every a_i > t and the first
    k - #(a > t) of the a_i == t. Large layers first narrow the search to `_candidates`."""
    n = int(a.size)
    if k >= n:
        return np.arange(n, dtype=np.int64)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    cand = _candidates(a, k)
    if cand is None:
        return _top_k_of(a, k)
    return cand[_top_k_of(a[cand], k)] if cand.size > k else cand


def keep_scale(a: np.ndarray, k: int) -> float:
    """λ of p_i = min(λ a_i, 1), Σ p_i = k, for 0 < k < nnz(a) (a = |v| >= 0, flat, float32 or
    float64). With the k largest a_(0) >= ... >= a_(k-1) (at most k - 1 saturate) and j of them
    saturated, λ_j = (k - j) / Σ_{i >= j} a_(i); λ is λ_j for the smallest j with λ_j a_(j) <= 1
    (the rule of analysis.peers.sparsification_probabilities). Sums in float64: the elements below
    the k largest as S - Σ(the candidates) + Σ(the candidates not among the k), S = Σ a_i (NumPy's
    pairwise sum), or directly where that difference is below 1e-6 S (cancellation)."""
    n = int(a.size)
    cand = _candidates(a, k)
    if cand is None:
        part = np.partition(a, n - k)
        top, rest = part[n - k:], float(np.sum(part[:n - k], dtype=np.float64))
    else:
        sub = np.partition(a[cand], cand.size - k)
        top = sub[cand.size - k:]
        low = float(np.sum(sub[:cand.size - k], dtype=np.float64))
        total, in_cand = float(np.sum(a, dtype=np.float64)), float(np.sum(sub, dtype=np.float64))
        rest = total - in_cand + low
        if total - in_cand < 1e-6 * total:
            others = np.ones(n, dtype=bool)
            others[cand] = False
            rest = float(np.sum(a[others], dtype=np.float64)) + low
    top = np.sort(top.astype(np.float64))[::-1]             # the k largest, descending
    tail = rest + np.cumsum(top[::-1])[::-1]               # tail[j] = Σ_{i >= j} a_(i) (rest > 0)
    lam = (k - np.arange(k)) / tail
    return float(lam[int(np.flatnonzero(lam * top <= 1.0 + 1e-12)[0])])   # exists: j = k - 1


def keep_probabilities(a: np.ndarray, k: int) -> np.ndarray:
    """p_i = min(λ a_i, 1) (float64) with Σ p_i = min(k, nnz(a)) (a = |v| >= 0, flat): the
    variance-optimal keep probabilities (analysis.peers.sparsification_probabilities, the same
    rule; float64 sums in another order)."""
    nnz = int(np.count_nonzero(a))
    k = min(int(k), nnz)
    if k <= 0:
        return np.zeros(a.size, dtype=np.float64)
    if k >= nnz:
        return (a > 0).astype(np.float64)
    p = np.multiply(a, keep_scale(a, k), dtype=np.float64)
    np.minimum(p, 1.0, out=p)
    return p


@dataclass(frozen=True)
class SparseMessage:
    magic: bytes          # b"TGK1" (topk) | b"TGR1" (randomk)
    shapes: dict          # name -> layer shape
    indices: dict         # name -> kept indices, strictly increasing, uint8/16/32 (index_bytes(n))
    values: dict          # name -> float32 values of the kept elements

    def to_bytes(self) -> bytes:
        parts = []
        for k, shape in self.shapes.items():
            n = int(np.prod(shape, dtype=np.int64))
            idx = self.indices[k]
            parts.append(_COUNT.pack(int(idx.size)))
            parts.append(np.ascontiguousarray(idx, dtype=f"<u{index_bytes(n)}").tobytes())
            parts.append(np.ascontiguousarray(self.values[k], dtype="<f4").tobytes())
        return frame(self.magic, _VERSION, self.shapes, b"".join(parts))

    @property
    def wire_bytes(self) -> int:
        return message_bytes([int(self.indices[k].size) for k in self.shapes],
                             [int(np.prod(s, dtype=np.int64)) for s in self.shapes.values()])

    @property
    def counts(self) -> dict:
        return {k: int(v.size) for k, v in self.indices.items()}


class _Sparse(PlainCodec):
    """What topk and randomk share: options, checks, the wire, decode and aggregate."""

    _magic = b""
    unbiased = False

    def __init__(self, density: float = 0.01, k: int = 0, kernels: str = "auto"):
        if isinstance(density, bool) or not isinstance(density, (int, float, np.floating, np.integer)) \
                or not (math.isfinite(density) and 0 < density <= 1):
            raise ValueError(f"{self.name} density must be a number in (0, 1], got {density!r}")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= MAX_ELEMENTS:
            raise ValueError(f"{self.name} k must be an integer in [0, 2^32) (0: use density), got {k!r}")
        if kernels not in KERNELS:
            raise ValueError(f"unknown kernels {kernels!r}; expected one of {KERNELS}")
        self.density, self.k, self.kernels = float(density), int(k), kernels

    @classmethod
    def from_config(cls, cfg):
        """The codec of a [codec] section: its Options (tgsim.codecs.options.parse) and `kernels`."""
        o = options.parse(cls, cfg)
        return cls(density=o.density, k=o.k, kernels=getattr(cfg, "kernels", "auto"))

    def __repr__(self) -> str:
        extra = "" if self.kernels == "auto" else f", kernels={self.kernels!r}"
        return f"{type(self).__name__}(density={self.density!r}, k={self.k}{extra})"

    def _numba(self, on_host: bool) -> bool:
        """Whether the Numba kernels run: kernels "auto"/"numba" on NumPy arrays."""
        if self.kernels == "numba" and not on_host:
            raise ValueError("the Numba kernels run on NumPy arrays; use kernels='cuda' or 'auto' for CuPy arrays")
        return on_host and self.kernels in ("auto", "numba")

    def kept(self, n: int) -> int:
        """k_n for a layer of n elements."""
        return kept_elements(n, self.k, self.density)

    # -- encode ---------------------------------------------------------------------------------
    def prepare_many(self, layers: Mapping) -> None:
        """NonFiniteGradientError for a NaN/Inf gradient (first worker first); ValueError for a
        layer of 2^32 or more elements, or a value beyond float32's range (naming layer and worker)."""
        err = first_nonfinite(layers)
        if err is not None:
            raise err
        for name, g in layers.items():
            n = int(np.prod(g.shape[1:], dtype=np.int64))
            if n > MAX_ELEMENTS:
                raise ValueError(f"layer {name!r}: {n} elements; {self.name} sends u32 counts and indices")
        err = first_beyond_float32(layers, f"{self.name} sends float32 values")
        if err is not None:
            raise err
        return None

    def _select(self, v: np.ndarray, key: StreamKey):
        """(indices ascending, float64 values to send) of one worker's flat layer v."""
        raise NotImplementedError

    def _select_numba(self, v: np.ndarray, key: StreamKey):
        """_select by the Numba kernels (the same indices and values)."""
        raise NotImplementedError

    def encode_many(self, layers: Mapping, seed: int, step: int, workers, shared_scalers=None, stats=None,
                    **_) -> list[SparseMessage]:
        """One message per local worker; layer i of worker workers[w] draws (randomk) from
        StreamKey(seed, step, workers[w], i), i = the layer's index `layer_ids(layers)`."""
        shapes = {k: tuple(g.shape[1:]) for k, g in layers.items()}
        ids = layer_ids(layers)
        msgs = []
        for i, worker in enumerate(workers):
            indices, values = {}, {}
            for li, (name, g) in zip(ids, layers.items()):
                select = self._select_numba if self._numba(isinstance(g, np.ndarray)) else self._select
                v = _host(g[i]).reshape(-1)
                idx, val = select(v, StreamKey(int(seed), int(step), int(worker), li))
                with np.errstate(over="ignore"):
                    val32 = val.astype(np.float32)
                if not np.isfinite(val32).all():
                    raise ValueError(f"layer {name!r}: worker {int(worker)}'s value "
                                     f"{float(val[~np.isfinite(val32)][0]):.4g} is beyond float32's range")
                idx, val32 = self._sent(idx, val32)
                indices[name] = idx.astype(f"u{index_bytes(int(v.size))}")
                values[name] = val32
            msgs.append(SparseMessage(self._magic, shapes, indices, values))
        return msgs

    # -- bytes ----------------------------------------------------------------------------------
    def _check_count(self, count: int, n: int, what: str) -> None:
        raise NotImplementedError

    def from_bytes(self, buf, like: SparseMessage) -> SparseMessage:
        """The message in `buf`, checked against the receiver's layers `like` (PayloadError names
        what is wrong and where)."""
        shapes = dict(like.shapes)
        body = unframe(buf, self._magic, _VERSION, shapes, f"{self.name} message")
        off = 0
        indices, values = {}, {}
        for k, shape in shapes.items():
            n = int(np.prod(shape, dtype=np.int64))
            what = f"{self.name} message, layer {k!r}"
            if off + _COUNT.size > len(body):
                raise PayloadError(f"{what}: truncated before its count")
            count = _COUNT.unpack_from(body, off)[0]
            off += _COUNT.size
            self._check_count(count, n, what)
            b = index_bytes(n)
            need = count * (b + 4)
            if off + need > len(body):
                raise PayloadError(f"{what}: truncated ({len(body) - off} bytes left, {count} elements need {need})")
            idx = np.frombuffer(body, dtype=f"<u{b}", count=count, offset=off).astype(f"u{b}")
            off += count * b
            val = np.frombuffer(body, dtype="<f4", count=count, offset=off).astype(np.float32)
            off += 4 * count
            if count:
                i64 = idx.astype(np.int64)
                bad = np.flatnonzero(np.diff(i64) <= 0)
                if bad.size:
                    j = int(bad[0]) + 1
                    raise PayloadError(f"{what}: index {j} is {int(i64[j])}, not above index {j - 1} "
                                       f"({int(i64[j - 1])}): indices must be strictly increasing")
                if i64[-1] >= n:
                    raise PayloadError(f"{what}: index {int(i64[-1])} is out of range for {n} elements")
                bad = ~np.isfinite(val)
                if bad.any():
                    j = int(np.argmax(bad))
                    raise PayloadError(f"{what}: value {j} is {float(val[j])!r}, not finite")
                self._check_values(val, what)
            indices[k], values[k] = idx, val
        if off != len(body):
            raise PayloadError(f"{self.name} message: {len(body) - off} bytes after the last layer")
        return SparseMessage(self._magic, shapes, indices, values)

    def _check_values(self, val: np.ndarray, what: str) -> None:
        return None

    def _sent(self, idx: np.ndarray, val32: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The (indices, float32 values) a message carries of the selected ones: all of them."""
        return idx, val32

    # -- decode and combine -------------------------------------------------------------------
    def decode(self, message: SparseMessage) -> dict:
        """float32 layers: the sent values at their indices, +0 elsewhere."""
        out = {}
        for k, shape in message.shapes.items():
            d = np.zeros(int(np.prod(shape, dtype=np.int64)), dtype=np.float32)
            d[message.indices[k]] = message.values[k]
            out[k] = d.reshape(shape)
        return out

    def aggregate(self, messages: Sequence[SparseMessage], divide_by: int | None = None) -> dict:
        if messages and self._numba(True):
            from tgsim.codecs import numba_sparse

            d = len(messages) if divide_by is None else divide_by
            return {k: numba_sparse.decode_sum([m.indices[k] for m in messages], [m.values[k] for m in messages],
                                               int(np.prod(shape, dtype=np.int64)), d).reshape(shape)
                    for k, shape in messages[0].shapes.items()}
        return ordered_mean([self.decode(m) for m in messages], len(messages) if divide_by is None else divide_by)


class TopK(_Sparse):
    """Top-k sparsification (registered as "topk"): the k_n largest |v_i| of each layer, ties to the
    lower index, sent as indices + float32 values. Deterministic, biased."""

    name = "topk"
    _magic = _TOPK_MAGIC
    properties = CodecProperties(unbiased=False, wire="own", combine="mean")

    @dataclass(frozen=True)
    class Options:
        """The [codec] keys of topk: k_n = k elements per layer, or round(density n) when k = 0."""

        density: float = options.option(0.01, "fraction of a layer's elements sent (when k = 0)", max=1.0,
                                        sweep=(0.02, 0.05, 0.1, 0.25, 0.5, 1.0))
        k: int = options.option(0, "elements sent per layer (0: use density)", min=0, max=MAX_ELEMENTS)
        compare_with_error_feedback = True    # tgsim compare runs it with error feedback (biased, memoryless)

    def _select(self, v: np.ndarray, key: StreamKey):
        if v.dtype not in (np.float32, np.float64):
            v = v.astype(np.float32)                      # float16 and others: exact in float32
        idx = top_k_indices(np.abs(v), self.kept(int(v.size)))
        return idx, v[idx]

    def _select_numba(self, v: np.ndarray, key: StreamKey):
        from tgsim.codecs import numba_sparse

        if v.dtype not in (np.float32, np.float64):
            v = v.astype(np.float32)
        return numba_sparse.top_k(v, self.kept(int(v.size)))

    def _check_count(self, count: int, n: int, what: str) -> None:
        if count != self.kept(n):
            raise PayloadError(f"{what}: {count} elements, this codec sends k = {self.kept(n)} of {n}")

    def bits_per_element(self, layers_or_shapes: Mapping) -> float:
        """8 message_bytes(k_l, n_l) / Σ_l n_l = 8 (HEADER + Σ_l (4 + k_l (b_l + 4))) / Σ_l n_l, exact."""
        sizes = [int(np.prod(s, dtype=np.int64)) for s in layer_shapes(layers_or_shapes).values()]
        return per_element_bits(message_bytes([self.kept(n) for n in sizes], sizes), layers_or_shapes)

    def link_bits(self, n: int, workers: int) -> dict:
        """Uplink bits per element of a one-layer message of n elements, exact (= the real payload):
        8 (HEADER.size + 4 + k_n (b_n + 4)) / n; downlink: the server's float32 mean (32)."""
        if n == 0:
            return {"up": 0.0, "up_max": 0.0, "down": 32}
        exact = 8 * message_bytes([self.kept(n)], [n]) / n
        return {"up": exact, "up_max": exact, "down": 32}


class RandomK(_Sparse):
    """Variance-optimal random sparsification (Wangni et al. 2018), registered as "randomk": keep v_i
    with probability p̃_i (p_i = min(λ|v_i|, 1), Σ p_i = k_n, on the 24-bit grid) and send
    f32(v_i / p̃_i). Unbiased up to the float32 rounding of the sent values."""

    name = "randomk"
    _magic = _RANDOMK_MAGIC

    @dataclass(frozen=True)
    class Options:
        """The [codec] keys of randomk: k_n = k elements per layer, or round(density n) when k = 0."""

        density: float = options.option(0.01, "fraction of a layer's elements sent (when k = 0)", max=1.0,
                                        sweep=(0.1, 0.25, 0.5, 1.0))
        k: int = options.option(0, "elements sent per layer (0: use density)", min=0, max=MAX_ELEMENTS)
    properties = CodecProperties(unbiased=True, wire="own", combine="mean")

    @staticmethod
    def _magnitudes(v: np.ndarray) -> np.ndarray:
        return np.abs(v if v.dtype in (np.float32, np.float64) else v.astype(np.float32))

    def probabilities(self, v: np.ndarray) -> np.ndarray:
        """p_i (float64) of a flat layer v."""
        return keep_probabilities(self._magnitudes(v), self.kept(int(v.size)))

    def _select(self, v: np.ndarray, key: StreamKey):
        """keep iff w_i < c_i = ceil(p_i 2^24), i.e. iff w_i < λ a_i 2^24 (= fl(λ a_i) 2^24; w_i is
        an integer < 2^24, so p_i = 1 always keeps); the value v_i / (c_i 2^-24)."""
        n = int(v.size)
        a = self._magnitudes(v)
        nnz = int(np.count_nonzero(a))
        k = min(self.kept(n), nnz)
        if k <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        if k >= nnz:                                       # p_i = 1 on every nonzero: sent exactly
            idx = np.flatnonzero(a)
            return idx, v[idx].astype(np.float64)
        x = np.multiply(a, keep_scale(a, k) * GRID, dtype=np.float64)
        idx = np.flatnonzero(_words24(n, key) < x)
        c = np.ceil(np.minimum(x[idx], float(GRID)))
        return idx, v[idx].astype(np.float64) / (c / GRID)

    def _select_numba(self, v: np.ndarray, key: StreamKey):
        """_select with the draw (words, keep test, values) in one Numba pass; λ by keep_scale."""
        n = int(v.size)
        a = self._magnitudes(v)
        nnz = int(np.count_nonzero(a))
        k = min(self.kept(n), nnz)
        if k <= 0 or k >= nnz:
            return self._select(v, key)
        from tgsim.codecs import numba_sparse

        if v.dtype not in (np.float32, np.float64):
            v = v.astype(np.float32)
        return numba_sparse.random_keep(v, a, keep_scale(a, k) * GRID, key)

    def _check_count(self, count: int, n: int, what: str) -> None:
        if count > n:
            raise PayloadError(f"{what}: {count} elements, more than the layer's {n}")

    def _sent(self, idx: np.ndarray, val32: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Kept elements whose value v_i / p̃_i rounds to float32 0 (a float64 layer's values below
        float32's smallest subnormal) are left out: they would decode to the 0 a missing element
        decodes to, and a message never carries a 0 (from_bytes refuses one)."""
        nonzero = val32 != 0
        return (idx, val32) if nonzero.all() else (idx[nonzero], val32[nonzero])

    def _check_values(self, val: np.ndarray, what: str) -> None:
        zero = val == 0
        if zero.any():
            raise PayloadError(f"{what}: value {int(np.argmax(zero))} is 0 (a kept element has v_i != 0)")

    bits_exact = False       # the count of kept elements is random

    def bits_per_element(self, layers_or_shapes: Mapping) -> float:
        """The largest message, every element kept: 8 (HEADER + Σ_l (4 + n_l (b_l + 4))) / Σ_l n_l."""
        sizes = [int(np.prod(s, dtype=np.int64)) for s in layer_shapes(layers_or_shapes).values()]
        return per_element_bits(message_bytes(sizes, sizes), layers_or_shapes)

    def link_bits(self, n: int, workers: int) -> dict:
        """Uplink bits per element of a one-layer message of n elements: "up" is the expectation
        8 (HEADER.size + 4 + k_n (b_n + 4)) / n for a layer with at least k_n nonzero elements (the
        count's mean is Σ p̃_i = k_n up to n 2^-24; fewer nonzeros send fewer); "up_max" every element
        kept. Downlink: the server's float32 mean (32)."""
        if n == 0:
            return {"up": 0.0, "up_max": 0.0, "down": 32}
        return {"up": 8 * message_bytes([self.kept(n)], [n]) / n, "up_max": 8 * message_bytes([n], [n]) / n,
                "down": 32}
