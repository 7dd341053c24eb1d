"""Counter-based random numbers (Philox4x32-10) keyed by (seed, step, worker, layer)."""

from tgsim.rng.philox import (
    PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1, StreamKey, philox4x32_10, random_words, uniform,
)

__all__ = ["PHILOX_M0", "PHILOX_M1", "PHILOX_W0", "PHILOX_W1", "StreamKey", "philox4x32_10",
           "random_words", "uniform"]
