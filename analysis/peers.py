"""Peer quantizers of docs/THEORY.md §2 as small pure functions, each with its exact error formula.

Every quantizer maps a vector v (float64, 1-D) and a NumPy Generator to R draws, shape (R, n):

    qsgd(v, s, rng, R)              QSGD with s levels (one bucket = the whole vector)
    scaled_sign(v, rng, R)          (||v||_1 / n) sign(v)                      (deterministic)
    random_sparsification(v, k, rng, R)   Z_i v_i / p_i, p_i = min(λ|v_i|, 1), Σ p_i = k
    top_k(v, k, rng, R)             keep the k largest |v_i|                    (deterministic)
    stochastic_binary(v, rng, R)    v_i -> max w.p. (v_i - min)/(max - min) else min (Suresh et al.)
    suresh(v, k, rng, R)            k levels from min to max, stochastic rounding (Suresh et al. π_sk;
                                    k = 2 is stochastic binary; s is k in draw/exact_error/bounds)
    terngrad(v, rng, R)             TernGrad without clipping (reference; the checks use the codec)

`table()` lists them as `Peer`s, each naming the registered codec (class and options) it models:
`is_unbiased(name)` is that codec's declared properties.unbiased (tgsim.codecs.registry),
`is_deterministic(name)` whether it encodes the same bytes for two seeds; PEERS are their names (the
codec's registered name, or the function's own: random_sparsification = randomk, top_k = topk,
stochastic_binary = suresh with 2 levels).

Exact errors E||Q(v) - v||^2 (``*_error``) and second moments E||Q(v)||^2 (``*_second_moment``;
= ||v||^2 + error for the unbiased ones, = ||Q(v)||^2 for the deterministic ones), plus the
published bounds (``bounds(name, v, ...)`` -> {bound name: (quantity, value)}):

    QSGD (Alistarh et al. 2017, Lemma 3.1): E||Q - v||^2 <= min(n/s^2, sqrt(n)/s) ||v||^2.
        The convex theorem uses min(...)·B as the *second-moment* bound of Q(g) ("printed"); the
        correct second-moment bound is (1 + min(...))·B ("corrected"). Since E||Q||^2 >= ||v||^2,
        the printed bound fails whenever min(n/s^2, sqrt(n)/s) < 1.
    TernGrad (docs/THEORY.md §1 ordering): E||Q||^2 = ||v||_inf ||v||_1 <= sqrt(n) ||v||^2,
        error <= (sqrt(n) - 1) ||v||^2.
    top-k (Stich et al. 2018, k-contraction): ||top_k(v) - v||^2 <= (1 - k/n) ||v||^2.
    stochastic binary (Suresh et al. 2017, Lemma 2 with one vector): error <= n/4 (max - min)^2
        and <= (n/2) ||v||^2.
    scaled sign: error = ||v||^2 - ||v||_1^2 / n <= (1 - 1/n) ||v||^2 (as ||v||_1 >= ||v||_2) for v
        without zero entries; with zeros (sign(0) = 0) the exact error is
        ||v||^2 - 2 c ||v||_1 + c^2 nnz(v), c = ||v||_1 / n (``scaled_sign_error``), and the bound
        is checked against that.
    Suresh k-level (Suresh et al. 2017, Theorem 2 with one vector): error <= n/(4(k-1)^2)
        (max - min)^2 <= n/(2(k-1)^2) ||v||^2; with the randomized Hadamard rotation (Theorem 3,
        ``suresh_rotated_bound``): <= (2 ln d + 2)/(k-1)^2 ||v||^2, d the rotated (padded) length,
        in expectation over the rotation; given the rotation the error is exact
        (``suresh_rotated_error``). The codec is tgsim/codecs/suresh.py.
    random sparsification: no closed bound used (the exact formula is the claim).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import numpy as np



def _vec(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(v)):
        raise ValueError("v must be finite")
    return v


# ---------------------------------------------------------------------------------------------
# QSGD
# ---------------------------------------------------------------------------------------------
def qsgd(v, s: int, rng: np.random.Generator, R: int = 1) -> np.ndarray:
    v = _vec(v)
    norm = float(np.linalg.norm(v))
    if norm == 0:
        return np.zeros((R, v.size))
    r = s * np.abs(v) / norm
    lo = np.floor(r)
    up = rng.random((R, v.size)) < (r - lo)
    return norm * np.sign(v) * (lo + up) / s


def qsgd_error(v, s: int) -> float:
    v = _vec(v)
    norm2 = float(v @ v)
    if norm2 == 0:
        return 0.0
    r = s * np.abs(v) / math.sqrt(norm2)
    f = r - np.floor(r)
    return norm2 / s**2 * float(np.sum(f * (1 - f)))


def qsgd_factor(n: int, s: int) -> float:
    """min(n/s^2, sqrt(n)/s): QSGD's variance factor."""
    return min(n / s**2, math.sqrt(n) / s)


# ---------------------------------------------------------------------------------------------
# scaled sign, top-k (deterministic)
# ---------------------------------------------------------------------------------------------
def scaled_sign(v, rng=None, R: int = 1) -> np.ndarray:
    v = _vec(v)
    q = np.abs(v).sum() / v.size * np.sign(v)
    return np.broadcast_to(q, (R, v.size)).copy()


def scaled_sign_error(v) -> float:
    """||c sign(v) - v||^2 with c = ||v||_1 / n and sign(0) = 0:
    ||v||^2 - 2 c ||v||_1 + c^2 nnz(v), which is docs/THEORY.md's ||v||^2 - ||v||_1^2 / n only when v has no
    zero entries (sparse or ReLU gradients do)."""
    v = _vec(v)
    l1 = float(np.abs(v).sum())
    c = l1 / v.size
    return float(v @ v - 2 * c * l1 + c * c * np.count_nonzero(v))


def top_k(v, k: int, rng=None, R: int = 1) -> np.ndarray:
    v = _vec(v)
    q = np.zeros_like(v)
    if k > 0:
        idx = np.argsort(-np.abs(v), kind="stable")[:k]
        q[idx] = v[idx]
    return np.broadcast_to(q, (R, v.size)).copy()


def top_k_error(v, k: int) -> float:
    v = _vec(v)
    a2 = np.sort(v * v)[::-1]
    return float(a2[k:].sum())


# ---------------------------------------------------------------------------------------------
# random sparsification with variance-optimal probabilities (Wangni et al. 2018)
# ---------------------------------------------------------------------------------------------
def sparsification_probabilities(v, k: float) -> np.ndarray:
    """p_i = min(λ|v_i|, 1) with Σ p_i = min(k, nnz(v)): the variance-optimal keep probabilities.

    λ solves the piecewise-linear Σ min(λ a_i, 1) = k: with a sorted descending and the j largest
    saturated, λ_j = (k - j) / Σ_{i>j} a_(i); the answer is the smallest j with λ_j a_(j+1) <= 1.
    """
    v = _vec(v)
    a = np.abs(v)
    nnz = int(np.count_nonzero(a))
    k = float(min(k, nnz))
    if k <= 0:
        return np.zeros_like(a)
    if k >= nnz:
        return (a > 0).astype(np.float64)
    srt = np.sort(a)[::-1][:nnz]
    tail = np.cumsum(srt[::-1])[::-1]            # tail[j] = Σ_{i>=j} srt[i]
    j = np.arange(nnz)
    lam = (k - j) / tail
    ok = (lam * srt <= 1.0 + 1e-12) & (k - j > 0)
    jj = int(np.flatnonzero(ok)[0])
    return np.minimum(lam[jj] * a, 1.0)


def random_sparsification(v, k: float, rng: np.random.Generator, R: int = 1) -> np.ndarray:
    v = _vec(v)
    p = sparsification_probabilities(v, k)
    keep = rng.random((R, v.size)) < p
    with np.errstate(divide="ignore", invalid="ignore"):
        val = np.where(p > 0, v / p, 0.0)
    return np.where(keep, val, 0.0)


def random_sparsification_error(v, k: float) -> float:
    v = _vec(v)
    p = sparsification_probabilities(v, k)
    nz = p > 0
    return float(np.sum(v[nz] ** 2 * (1 / p[nz] - 1)))


# ---------------------------------------------------------------------------------------------
# stochastic binary (Suresh et al. 2017)
# ---------------------------------------------------------------------------------------------
def stochastic_binary(v, rng: np.random.Generator, R: int = 1) -> np.ndarray:
    v = _vec(v)
    lo, hi = float(v.min()), float(v.max())
    if hi == lo:
        return np.broadcast_to(v, (R, v.size)).copy()
    up = rng.random((R, v.size)) < (v - lo) / (hi - lo)
    return np.where(up, hi, lo)


def stochastic_binary_error(v) -> float:
    v = _vec(v)
    return float(np.sum((v.max() - v) * (v - v.min())))


# ---------------------------------------------------------------------------------------------
# stochastic k-level quantization (Suresh et al. 2017, π_sk; the rotated π_srk's error given D)
# ---------------------------------------------------------------------------------------------
def suresh_grid(v, k: int) -> tuple[float, float, np.ndarray]:
    """(min v, spacing Δ = (max - min)/(k - 1), x = (v - min)/Δ in [0, k-1]; 0 where Δ = 0)."""
    v = _vec(v)
    if k < 2:
        raise ValueError(f"suresh needs k >= 2 levels, got {k}")
    lo, hi = float(v.min()), float(v.max())
    step = (hi - lo) / (k - 1)
    x = (v - lo) / step if step > 0 else np.zeros_like(v)
    return lo, step, np.minimum(x, k - 1)


def suresh(v, k: int, rng: np.random.Generator, R: int = 1) -> np.ndarray:
    """R draws: each v_i rounded to B(r) = min + r Δ, r = floor(x_i) + 1 w.p. x_i - floor(x_i)."""
    lo, step, x = suresh_grid(v, k)
    r = np.floor(x)
    up = rng.random((R, x.size)) < (x - r)
    return lo + (r + up) * step


def suresh_error(v, k: int) -> float:
    """Σ_i (v_i - B(r_i)) (B(r_i + 1) - v_i) = Δ^2 Σ_i f_i (1 - f_i), r_i = floor(x_i), f_i = x_i - r_i:
    the exact variance of one draw (stochastic_binary_error for k = 2)."""
    _, step, x = suresh_grid(v, k)
    f = x - np.floor(x)
    return step * step * float(np.sum(f * (1 - f)))


def suresh_rotated_error(y, k: int, n: int) -> float:
    """The exact error of the n kept coordinates of R^T Q(y), given the rotation: y = R v' the
    rotated, zero-padded vector (length d, R = H D / sqrt(d)). Given D the coordinates of Q(y) - y
    are independent and every entry of R is ±1/sqrt(d), so each decoded coordinate has variance
    (1/d) Σ_j Var Q(y)_j: (n/d) suresh_error(y, k)."""
    y = _vec(y)
    return n / y.size * suresh_error(y, k)


def suresh_bound(n: int, k: int, norm2: float) -> float:
    """Theorem 2 (one vector): n/(2(k-1)^2) ||v||^2."""
    return n / (2 * (k - 1) ** 2) * norm2


def suresh_rotated_bound(d: int, k: int, norm2: float) -> float:
    """Theorem 3 (one vector, rotated length d): (2 ln d + 2)/(k-1)^2 ||v||^2, in expectation over D."""
    return (2 * math.log(d) + 2) / (k - 1) ** 2 * norm2


# ---------------------------------------------------------------------------------------------
# TernGrad (pure reference, no clipping)
# ---------------------------------------------------------------------------------------------
def terngrad(v, rng: np.random.Generator, R: int = 1) -> np.ndarray:
    v = _vec(v)
    s = float(np.abs(v).max())
    if s == 0:
        return np.zeros((R, v.size))
    keep = rng.random((R, v.size)) < np.abs(v) / s
    return np.where(keep, s * np.sign(v), 0.0)


def terngrad_error(v) -> float:
    v = _vec(v)
    return float(np.abs(v).max() * np.abs(v).sum() - v @ v)


# ---------------------------------------------------------------------------------------------
# one table of everything: each peer names the registered codec (class and options) it models
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Peer:
    """A peer quantizer: the registered codec it models, `codec` (class, options), whose declared
    properties (tgsim.codecs.registry) say whether it is unbiased, and its pure functions of (v, s, k)
    (s: levels; k: kept elements): draw(v, rng, R, s, k), error(v, s, k), bounds(v, n, ||v||^2, s, k)
    and bits(n, s, k, index bits). Its name is the codec's registered name, or `alias` where the
    function has a name of its own (a codec at other options, or the paper's name)."""

    codec: tuple
    draw: Callable
    error: Callable
    bounds: Callable
    bits: Callable
    alias: str = ""

    @property
    def name(self) -> str:
        return self.alias or self.codec[0].name


def _qsgd_bounds(v, n, nv2, s, k):
    q = qsgd_factor(n, s)
    return {"qsgd_variance": ("error", q * nv2), "qsgd_printed_second_moment": ("second_moment", q * nv2),
            "qsgd_corrected_second_moment": ("second_moment", (1 + q) * nv2)}


def _range_bounds(v, n, nv2, s, k):
    r = float(v.max() - v.min())
    return {"suresh_range": ("error", n / 4 * r**2), "suresh_norm": ("error", n / 2 * nv2)}


def _levels_bounds(v, n, nv2, s, k):
    r = float(v.max() - v.min())
    return {"suresh_k_range": ("error", n / (4 * (s - 1) ** 2) * r**2),
            "suresh_k_norm": ("error", suresh_bound(n, s, nv2))}


@functools.lru_cache(maxsize=None)
def table() -> tuple[Peer, ...]:
    """The peers, in the order of PEERS."""
    from tgsim.codecs.qsgd import QSGD
    from tgsim.codecs.sign import ScaledSign
    from tgsim.codecs.sparse import RandomK, TopK
    from tgsim.codecs.suresh import Suresh
    from tgsim.codecs.terngrad import TernGrad

    return (
        Peer((QSGD, {"bucket": 0}), lambda v, rng, R, s, k: qsgd(v, s, rng, R), lambda v, s, k: qsgd_error(v, s),
             _qsgd_bounds, lambda n, s, k, idx: 1 + math.ceil(math.log2(s + 1)) + 32 / n),
        Peer((ScaledSign, {}), lambda v, rng, R, s, k: scaled_sign(v, rng, R), lambda v, s, k: scaled_sign_error(v),
             lambda v, n, nv2, s, k: {"one_minus_1_over_n": ("error", (1 - 1 / n) * nv2)},
             lambda n, s, k, idx: 1 + 32 / n),
        Peer((RandomK, {}), lambda v, rng, R, s, k: random_sparsification(v, k, rng, R),
             lambda v, s, k: random_sparsification_error(v, k), lambda v, n, nv2, s, k: {},
             lambda n, s, k, idx: k * (idx + 1) / n + 32 / n,      # kept p<1 values are ±1/λ: one float
             alias="random_sparsification"),
        Peer((TopK, {}), lambda v, rng, R, s, k: top_k(v, int(k), rng, R), lambda v, s, k: top_k_error(v, int(k)),
             lambda v, n, nv2, s, k: {"k_contraction": ("error", (1 - k / n) * nv2)},
             lambda n, s, k, idx: k * (idx + 32) / n, alias="top_k"),
        Peer((Suresh, {"levels": 2}), lambda v, rng, R, s, k: stochastic_binary(v, rng, R),
             lambda v, s, k: stochastic_binary_error(v), _range_bounds, lambda n, s, k, idx: 1 + 64 / n,
             alias="stochastic_binary"),
        Peer((Suresh, {}), lambda v, rng, R, s, k: suresh(v, s, rng, R), lambda v, s, k: suresh_error(v, s),
             _levels_bounds, lambda n, s, k, idx: math.ceil(math.log2(s)) + 64 / n),
        Peer((TernGrad, {"clip": "none", "sharing": "none"}), lambda v, rng, R, s, k: terngrad(v, rng, R),
             lambda v, s, k: terngrad_error(v),
             lambda v, n, nv2, s, k: {"sqrt_n_second_moment": ("second_moment", math.sqrt(n) * nv2),
                                      "sqrt_n_error": ("error", (math.sqrt(n) - 1) * nv2)},
             lambda n, s, k, idx: 2 + 32 / n),
    )


def peer(name: str) -> Peer:
    """The peer called `name` (ValueError naming the peers for another)."""
    for p in table():
        if p.name == name:
            return p
    raise ValueError(f"unknown peer {name!r}; valid: {tuple(p.name for p in table())}")


def __getattr__(attr: str):
    if attr == "PEERS":     # the peers' names, from the table (the codecs' registered names)
        return tuple(p.name for p in table())
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def _k(n: int, k: float | None) -> float:
    return max(1, int(round(0.1 * n))) if k is None else k


def draw(name: str, v, rng: np.random.Generator, R: int, *, s: int = 4, k: float | None = None) -> np.ndarray:
    """R draws of peer `name` (s: QSGD levels, suresh's k levels; k: kept elements for sparsification / top-k)."""
    p = peer(name)
    return p.draw(v, rng, R, s, _k(np.size(v), k))


def exact_error(name: str, v, *, s: int = 4, k: float | None = None) -> float:
    return peer(name).error(v, s, _k(np.size(v), k))


@functools.lru_cache(maxsize=None)
def _codec(name: str):
    from tgsim.codecs import registry

    cls, opts = peer(name).codec
    return registry.make(cls.name, **opts)


def is_unbiased(name: str) -> bool:
    """The declared unbiasedness (properties.unbiased) of the registered codec the peer models."""
    return bool(_codec(name).properties.unbiased)


@functools.lru_cache(maxsize=None)
def is_deterministic(name: str) -> bool:
    """Whether the codec the peer models encodes the same bytes for two seeds (measured on a fixed
    vector, tgsim.analysis.compare_variance)."""
    from tgsim.analysis.compare_variance import _deterministic

    return _deterministic(_codec(name))


def exact_second_moment(name: str, v, *, s: int = 4, k: float | None = None) -> float:
    """E||Q(v)||^2: ||v||^2 + error (unbiased) or ||Q(v)||^2 (deterministic)."""
    v = _vec(v)
    if is_deterministic(name):
        q = draw(name, v, None, 1, s=s, k=k)[0]
        return float(q @ q)
    return float(v @ v) + exact_error(name, v, s=s, k=k)


def bounds(name: str, v, *, s: int = 4, k: float | None = None) -> dict[str, tuple[str, float]]:
    """Published bounds: {bound name: (quantity 'error' | 'second_moment', value)}."""
    v = _vec(v)
    return peer(name).bounds(v, v.size, float(v @ v), s, _k(v.size, k))


def bits_per_element(name: str, n: int, *, s: int = 4, k: float | None = None) -> float:
    """Uplink bits per element (docs/THEORY.md §2 table; 32-bit floats, ceil(log2 n)-bit indices)."""
    return peer(name).bits(n, s, _k(n, k), math.ceil(math.log2(max(n, 2))))
