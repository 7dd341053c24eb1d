"""The one fp32 reduction every path uses: f32(Σ_w f64(g_w) · (1/N)), workers in list order.

Float64 accumulation of float32 values in a fixed order, then one multiplication by the float64
1/N and one rounding to float32: the simulator, the MPI ranks and every codec that decodes to
float32 and averages (fp32, fp16, TernGrad's float layers) get the same bits.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tgsim.backend import array_module


def ordered_mean_flat(parts: Sequence, divide_by: int):
    """f32(Σ_w f64(parts[w]) · (1/divide_by)) of same-size arrays (NumPy or CuPy), flattened, w in order."""
    xp = array_module(parts[0]) if parts else np
    acc = xp.zeros(parts[0].size if parts else 0, dtype=xp.float64)
    for p in parts:
        acc += p.reshape(-1).astype(xp.float64)
    return (acc * xp.float64(1.0 / divide_by)).astype(xp.float32)


def ordered_mean(layers: Sequence[dict], divide_by: int) -> dict:
    """{name: f32(Σ_w f64(layers[w][name]) · (1/divide_by))}, w in list order (`ordered_mean_flat` per layer)."""
    return {name: ordered_mean_flat([_as_array(lay[name]) for lay in layers], divide_by).reshape(tuple(np.shape(first)))
            for name, first in layers[0].items()}


def _as_array(v):
    """`v` as an array of its own module (a CuPy array stays on the device; lists become NumPy)."""
    return array_module(v).asarray(v)
