"""Philox4x32-10 (Salmon et al., SC'11, "Parallel random numbers: as easy as 1, 2, 3").

Array reference, written once for NumPy and CuPy (`xp`). The Numba kernel (`tgsim.rng.numba_philox`)
and the CUDA source (`tgsim/cuda/philox.cuh`) implement the same function and are tested against
this one and against Random123's known-answer vectors.

One round on counter (c0, c1, c2, c3) and key (k0, k1):
    hi0:lo0 = M0 * c0,  hi1:lo1 = M1 * c2          (32x32 -> 64-bit products)
    c <- (hi1 ^ c1 ^ k0,  lo1,  hi0 ^ c3 ^ k1,  lo0)
then the key is bumped, k0 += W0, k1 += W1 (mod 2^32), between rounds.

Stream layout used everywhere in tgsim: key = (seed mod 2^32, seed >> 32); counter =
(element_index // 4, layer, worker, step); element i takes word i % 4 of its block. The draw for an
element thus depends only on (seed, step, worker, layer, i): never on chunking, threads, process
layout or backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tgsim.backend import array_module

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
ROUNDS = 10
MAX_ELEMENTS = 4 * 2**32  # the block index is one 32-bit counter word

_U32 = 0xFFFFFFFF


@dataclass(frozen=True)
class StreamKey:
    """Names one random stream: (seed, step, worker, layer).

    seed is a 64-bit integer (the Philox key); step, worker and layer are 32-bit counter words.
    """

    seed: int
    step: int = 0
    worker: int = 0
    layer: int = 0

    def __post_init__(self):
        if not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be in [0, 2^64), got {self.seed}")
        for name in ("step", "worker", "layer"):
            v = getattr(self, name)
            if not 0 <= v < 2**32:
                raise ValueError(f"{name} must be in [0, 2^32), got {v}")

    @property
    def key(self) -> tuple[int, int]:
        return self.seed & _U32, (self.seed >> 32) & _U32

    def with_layer(self, layer: int) -> "StreamKey":
        return StreamKey(self.seed, self.step, self.worker, layer)


def _mulhilo(a: int, b, xp):
    """(hi, lo) 32-bit halves of the 64-bit product a*b, a a constant, b a uint32 array."""
    prod = b.astype(xp.uint64) * xp.uint64(a)
    return (prod >> xp.uint64(32)).astype(xp.uint32), (prod & xp.uint64(_U32)).astype(xp.uint32)


def philox4x32_10(counter, key: tuple[int, int]):
    """Philox4x32-10 of counter words (c0, c1, c2, c3) (uint32 arrays or ints, broadcast) and key.

    Returns four uint32 arrays (x0, x1, x2, x3).
    """
    arrays = [c for c in counter if not isinstance(c, (int, np.integer))]
    xp = array_module(arrays[0]) if arrays else np
    shape = xp.broadcast_shapes(*[xp.shape(c) for c in counter])
    c0, c1, c2, c3 = (xp.broadcast_to(xp.asarray(c, dtype=xp.uint32), shape) for c in counter)
    k0, k1 = int(key[0]) & _U32, int(key[1]) & _U32
    for r in range(ROUNDS):
        hi0, lo0 = _mulhilo(PHILOX_M0, c0, xp)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2, xp)
        c0, c1, c2, c3 = hi1 ^ c1 ^ xp.uint32(k0), lo1, hi0 ^ c3 ^ xp.uint32(k1), lo0
        if r < ROUNDS - 1:
            k0 = (k0 + PHILOX_W0) & _U32
            k1 = (k1 + PHILOX_W1) & _U32
    return c0, c1, c2, c3


def random_words(n: int, key: StreamKey, xp=np, start: int = 0):
    """uint32 words start..start+n-1 of the stream `key`: word i = philox(i//4, layer, worker, step)[i%4]."""
    if n < 0 or start < 0 or start + n > MAX_ELEMENTS:
        raise ValueError(f"stream range [{start}, {start + n}) outside [0, {MAX_ELEMENTS})")
    if n == 0:
        return xp.zeros(0, dtype=xp.uint32)
    first, last = start // 4, (start + n - 1) // 4
    blocks = xp.arange(first, last + 1, dtype=xp.uint64).astype(xp.uint32)
    x = philox4x32_10((blocks, key.layer, key.worker, key.step), key.key)
    words = xp.stack(x, axis=1).reshape(-1)
    off = start - 4 * first
    return words[off:off + n]


def uniform(n: int, key: StreamKey, xp=np, start: int = 0):
    """float64 u_i = (word_i >> 8) · 2^-24 in [0, 1): the top 24 bits of words start..start+n-1 of
    the stream `key`, exact in float32 too. P(u < x) = ceil(x · 2^24) / 2^24 for x in [0, 1], so
    a stochastic rounding that keeps v with probability x is unbiased up to 2^-24 (the resolution
    TernGrad's rule has too, docs/THEORY.md §1)."""
    w = random_words(n, key, xp, start)
    return (w >> xp.uint32(8)).astype(xp.float64) * xp.float64(2.0 ** -24)
