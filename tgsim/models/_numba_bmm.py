"""Batched matmul for NumPy with the worker axis spread over the Numba threads.

out[w] = op(a[w]) @ op(b[w]) (or @ b for a shared right operand) is one BLAS gemm per worker,
called through Numba's `np.dot` (SciPy's BLAS) from a `prange` over workers. NumPy's own stacked
`matmul` makes the same per-worker gemm calls but one after another on one thread: these products
are too small (B rows) for OpenBLAS to thread them itself, so they run on one core. Timings:
docs/MEASUREMENTS.md.

Every worker's product is the same gemm call whatever N is, the thread count, or the driver
(serial loop for small work, parallel region otherwise), so worker w's bits are those of a call
with that worker alone: what the simulator and the MPI ranks rely on. Operands are passed as
C-contiguous arrays with a transpose flag (a swapaxes view of a C array is its base, transposed),
so Numba hands them to BLAS without a copy; anything else is made contiguous first.

Every call runs with the BLAS library Numba calls at one thread (tgsim.blas.pin_one_thread: set for
the call, restored after; SciPy's private bundled copy is set to one thread at import, so the check
costs one query), whatever the process set, so a product's bits do not depend on the BLAS
thread count: the parallelism is over workers, and a multi-threaded gemm may split a product
differently and round it differently (at these sizes one BLAS thread is as fast as two).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from tgsim import blas

# Work (N * M * K * P multiply-adds) below which the workers run in a serial loop on this thread:
# starting a parallel region costs more than such small products take (docs/MEASUREMENTS.md).
SERIAL_WORK = 1 << 18


@njit(cache=True)
def _product(a, b, out, w, wb, ta, tb):
    if ta:
        if tb:
            np.dot(a[w].T, b[wb].T, out[w])
        else:
            np.dot(a[w].T, b[wb], out[w])
    elif tb:
        np.dot(a[w], b[wb].T, out[w])
    else:
        np.dot(a[w], b[wb], out[w])


@njit(cache=True)
def _products_serial(a, b, out, ta, tb):
    step = 0 if b.shape[0] == 1 else 1     # a shared right operand: b[0] for every worker
    for w in range(out.shape[0]):
        _product(a, b, out, w, w * step, ta, tb)


@njit(cache=True, parallel=True)
def _products_parallel(a, b, out, ta, tb):
    step = 0 if b.shape[0] == 1 else 1
    for w in prange(out.shape[0]):
        _product(a, b, out, w, w * step, ta, tb)


def _operand(x: np.ndarray) -> tuple[np.ndarray, bool]:
    """(C-contiguous (N, r, c) array, transposed?) with x[w] == base[w] (or base[w].T).

    The form (transposed or not) is chosen from one worker's matrix x[0] alone (its strides are
    those of every worker's, whatever N is), so a worker's gemm is the same call in a batch and
    alone; only the copy, where the worker axis is not contiguous, depends on N."""
    one = x[0]
    if one.flags.c_contiguous:
        return (x if x.flags.c_contiguous else np.ascontiguousarray(x)), False
    if one.flags.f_contiguous:
        t = np.swapaxes(x, -1, -2)
        return (t if t.flags.c_contiguous else np.ascontiguousarray(t)), True
    return np.ascontiguousarray(x), False


def supported(a, b) -> bool:
    """a (N, M, K) @ b (K, P) | (1 or N, K, P), both float32 or both float64 NumPy arrays."""
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.ndim != 3 or b.ndim not in (2, 3):
        return False
    if a.dtype != b.dtype or a.dtype not in (np.float32, np.float64):
        return False
    return b.shape[-2] == a.shape[2] and (b.ndim == 2 or b.shape[0] in (1, a.shape[0]))


def matmul_workers(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """np.matmul(a, b) for a (N, M, K) and b (K, P) or (N, K, P), float32 or float64 of one dtype,
    as one gemm per worker (module docstring). out: (N, M, P) C-contiguous, written in place."""
    if not supported(a, b):
        raise ValueError(f"matmul_workers: expected (N, M, K) @ (K, P) or (N, K, P) of one float dtype, "
                         f"got {getattr(a, 'dtype', type(a))} {getattr(a, 'shape', '')} @ "
                         f"{getattr(b, 'dtype', type(b))} {getattr(b, 'shape', '')}")
    return products(a, b, out)


def products(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """matmul_workers for operands the caller has already checked with `supported`."""
    n, m, k = a.shape
    bb = b[None] if b.ndim == 2 else b
    p = bb.shape[2]
    if out is None:
        out = np.empty((n, m, p), dtype=a.dtype)
    elif out.shape != (n, m, p) or out.dtype != a.dtype or not out.flags.c_contiguous:
        raise ValueError(f"matmul_workers: out must be a C-contiguous {a.dtype} array of shape {(n, m, p)}")
    if out.size == 0:
        return out
    if k == 0:
        out.fill(0)
        return out
    av, ta = _operand(a)
    bv, tb = _operand(bb)
    before = blas.pin_one_thread()
    try:
        if n * m * k * p < SERIAL_WORK or n == 1:
            _products_serial(av, bv, out, ta, tb)
        else:
            _products_parallel(av, bv, out, ta, tb)
    finally:
        blas.restore(before)
    return out


blas.pin_private_copy()
