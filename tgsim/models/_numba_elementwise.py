"""ReLU and its backward as single Numba passes for NumPy float arrays (bit-identical to the NumPy forms).

relu:          out = z where z > 0 or z is NaN, else +0.0   (np.maximum(z, 0): the NaN itself, and
               +0.0 for -0.0, as NumPy's SIMD loop returns the second operand for equal zeros)
keep_positive: out = d where pre > 0, else +0.0             (np.where(pre > 0, d, 0))

One serial pass replaces NumPy's NaN-propagating maximum loop (relu) and the comparison, mask and
AND passes of base.keep_where (keep_positive). Serial on purpose: a parallel region costs more to
start than these passes take at the models' sizes (timings: docs/MEASUREMENTS.md).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _relu(z, out):
    for i in range(z.size):
        v = z[i]
        out[i] = v if (v > 0 or v != v) else 0.0


@njit(cache=True)
def _keep_positive(pre, d, out):
    for i in range(d.size):
        out[i] = d[i] if pre[i] > 0 else 0.0


def _plain(*arrays) -> bool:
    """C-contiguous NumPy float32/float64 arrays of one dtype and one shape."""
    a0 = arrays[0]
    return all(isinstance(a, np.ndarray) and a.flags.c_contiguous and a.dtype == a0.dtype
               and a.shape == a0.shape for a in arrays) and a0.dtype in (np.float32, np.float64)


def relu(z: np.ndarray) -> np.ndarray | None:
    """np.maximum(z, 0) bit for bit, or None where z is not a plain float array (module docstring)."""
    if not _plain(z):
        return None
    out = np.empty_like(z)
    _relu(z.reshape(-1), out.reshape(-1))
    return out


def keep_positive(pre: np.ndarray, d: np.ndarray) -> np.ndarray | None:
    """np.where(pre > 0, d, 0) bit for bit, or None where pre, d are not plain float arrays alike."""
    if not _plain(pre, d):
        return None
    out = np.empty_like(d)
    _keep_positive(pre.reshape(-1), d.reshape(-1), out.reshape(-1))
    return out
