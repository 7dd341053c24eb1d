"""Numba kernel for the exact fp32 exchange's ordered mean (NumPy arrays).

    out[i] = f32((Σ_w f64(rows[w, i]), ascending w, from +0.0) · f64(1/divide_by))

the order of `inprocess.mean_of_layers` and `mpi._ordered_sum_mean` (an accumulator that starts at
+0.0 and adds the workers one after another), in one pass instead of a float64 temporary per worker.
Rows may be float32 or float64. Tested bit for bit against the NumPy order in tests/test_mpi_kernels.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_CHUNK = 16384


@njit(cache=True, parallel=True)
def _ordered_mean(rows, inv, out):
    w_count, m = rows.shape
    chunks = (m + _CHUNK - 1) // _CHUNK
    for c in prange(chunks):
        for i in range(c * _CHUNK, min(m, (c + 1) * _CHUNK)):
            acc = 0.0
            for w in range(w_count):
                acc += np.float64(rows[w, i])
            out[i] = np.float32(acc * inv)


def ordered_mean(rows: np.ndarray, divide_by: int) -> np.ndarray:
    """float32[m] from rows (W, m) float32/float64: the ordered float64 sum over W, times 1/divide_by."""
    rows = np.ascontiguousarray(rows)
    if rows.ndim != 2 or rows.dtype not in (np.float32, np.float64):
        raise ValueError(f"expected (workers, elements) float32/float64 rows, got {rows.dtype}{rows.shape}")
    out = np.empty(rows.shape[1], dtype=np.float32)
    _ordered_mean(rows, np.float64(1.0 / divide_by), out)
    return out
