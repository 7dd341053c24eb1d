"""The array-reference kernels (NumPy or CuPy through `xp`): what the fused kernels must equal."""

from __future__ import annotations

from tgsim.codecs import packing, stats, ternary
from tgsim.rng import StreamKey


def moments(g, need_sigma: bool) -> stats.LayerMoments:
    return stats.layer_moments(g, need_sigma)


def encode(g, scaler: float, clip_bound: float, key: StreamKey, fmt: str):
    return packing.pack(ternary.ternarize(g, scaler, key, clip_bound), fmt)


def weighted_sum(payloads, scalers, n: int, fmt: str, divide_by: int):
    for w in range(payloads.shape[0]):
        packing.check_payload(payloads[w], n, fmt, where=f"payload of worker {w}")
    return packing.weighted_sum(payloads, scalers, n, fmt, divide_by)


def sum_codes(payloads, n: int, fmt: str, dtype=None):
    for w in range(payloads.shape[0]):
        packing.check_payload(payloads[w], n, fmt, where=f"payload of worker {w}")
    return packing.sum_codes(payloads, n, fmt, dtype)
