"""Philox4x32-10 in Numba: the words of `tgsim.rng.philox` (the array reference), bit for bit."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from tgsim.rng.philox import MAX_ELEMENTS, PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1, StreamKey

# Keep every integer in uint32/uint64: Numba turns mixed signed/unsigned 64-bit arithmetic into
# float64. The products are formed in uint64 (32x32 -> 64 bits); LLVM lowers them to vpmuludq and
# vectorizes a loop over blocks 8 (AVX-512) or 4 (AVX2) blocks per vector.
_M0 = np.uint64(PHILOX_M0)
_M1 = np.uint64(PHILOX_M1)
_W0 = np.uint32(PHILOX_W0)
_W1 = np.uint32(PHILOX_W1)
_S32 = np.uint64(32)


@njit(inline="always")
def _philox_round(c0, c1, c2, c3, k0, k1):
    # The xors are left to Numba's integer widening (uint64 holding 32-bit values): truncating them
    # to uint32 here makes LLVM shuffle between 32- and 64-bit lanes every round (2x slower).
    p0 = np.uint64(c0) * _M0
    p1 = np.uint64(c2) * _M1
    return (np.uint32(p1 >> _S32) ^ c1 ^ k0, np.uint32(p1),
            np.uint32(p0 >> _S32) ^ c3 ^ k1, np.uint32(p0))


@njit(inline="always")
def philox_block(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of counter (c0, c1, c2, c3) and key (k0, k1): a tuple of four np.uint32 words.

    Straight-line (the round loop has a constant trip count and is unrolled by LLVM), so a loop
    over blocks that calls it vectorizes across blocks (vpmuludq, 8 blocks per zmm register).
    """
    c0 = np.uint32(c0)
    c1 = np.uint32(c1)
    c2 = np.uint32(c2)
    c3 = np.uint32(c3)
    k0 = np.uint32(k0)
    k1 = np.uint32(k1)
    for _ in range(9):
        c0, c1, c2, c3 = _philox_round(c0, c1, c2, c3, k0, k1)
        k0 = np.uint32(k0 + _W0)
        k1 = np.uint32(k1 + _W1)
    c0, c1, c2, c3 = _philox_round(c0, c1, c2, c3, k0, k1)
    return np.uint32(c0), np.uint32(c1), np.uint32(c2), np.uint32(c3)


philox4x32_10 = philox_block    # the name of the array reference (tgsim.rng.philox4x32_10)


def _stream_args(key: StreamKey):
    """(c1, c2, c3, k0, k1) as np.uint32 for the tgsim stream layout (c0 = element // 4)."""
    k0, k1 = key.key
    return (np.uint32(key.layer), np.uint32(key.worker), np.uint32(key.step),
            np.uint32(k0), np.uint32(k1))


@njit(cache=True)
def _words_range(out, b0, c1, c2, c3, k0, k1):
    """out[4j + m] = word m of block b0 + j, for 0 <= j < out.size // 4.

    Indices start at 0 (callers pass slices) so that they are provably non-negative: Numba's
    negative-index wraparound would otherwise stop the vectorizer.
    """
    for j in range(out.size // 4):
        w0, w1, w2, w3 = philox_block(np.uint32(b0 + j), c1, c2, c3, k0, k1)
        out[4 * j] = w0
        out[4 * j + 1] = w1
        out[4 * j + 2] = w2
        out[4 * j + 3] = w3


_WORDS_CHUNK = 1 << 14  # blocks per parallel task


@njit(cache=True, parallel=True)
def _words_kernel(out, first_block, nblocks, c1, c2, c3, k0, k1):
    nch = (nblocks + _WORDS_CHUNK - 1) // _WORDS_CHUNK
    for ch in prange(nch):
        j0 = ch * _WORDS_CHUNK
        j1 = min(j0 + _WORDS_CHUNK, nblocks)
        _words_range(out[4 * j0:4 * j1], first_block + j0, c1, c2, c3, k0, k1)


def random_words(n: int, key: StreamKey, start: int = 0) -> np.ndarray:
    """uint32 words start..start+n-1 of the stream `key` (equals `tgsim.rng.random_words`)."""
    n, start = int(n), int(start)
    if n < 0 or start < 0 or start + n > MAX_ELEMENTS:
        raise ValueError(f"stream range [{start}, {start + n}) outside [0, {MAX_ELEMENTS})")
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    first, last = start // 4, (start + n - 1) // 4
    out = np.empty(4 * (last - first + 1), dtype=np.uint32)
    _words_kernel(out, np.int64(first), np.int64(last - first + 1), *_stream_args(key))
    off = start - 4 * first
    return out[off:off + n]

