"""Batch-invariant products and row sums on CuPy arrays (kernels: tgsim/cuda/batched.cu).

    bmm(a, b)        a (N, M, K) @ b (K, P) or (N, K, P) -> (N, M, P)
    sum_middle(x)    x (O, R, P) -> (O, P), the sum over R

Each output element is one fixed-order loop: out[n,m,p] = Σ_k a[n,m,k]·b[n,k,p] with k ascending
from +0.0, out[o,p] = x[o,0,p] + x[o,1,p] + ... (R ascending), every product and sum rounded to
the element type (no FMA). So worker n's rows have the same bits in a launch over any number of
workers (cupy.matmul and CuPy's reductions pick their blocking from the whole shape, so there a
worker's bits in a batch can differ from its bits alone). float32 and float64.

The kernels are compiled once per process with cupy.RawModule (NVRTC, -fmad=false; CuPy appends
-ftz=true, which flushes float32 denormal products and sums: the same in every batch size). CuPy
is imported only inside functions; tests/test_cuda_batched.py runs the kernel bodies on the CPU
(nvcc host build) and this wrapper against a stand-in CuPy, and on a GPU against the NumPy loop.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tgsim.backend import RawKernels

CUDA_FILE = Path(__file__).resolve().parents[1] / "cuda" / "batched.cu"
NVRTC_OPTIONS = ("-fmad=false", "-prec-div=true", "-prec-sqrt=true")
KERNELS = ("tgb_bmm_f32", "tgb_bmm_f64", "tgb_sum_middle_f32", "tgb_sum_middle_f64")
SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
BLOCK = 256
MAX_GRID = 1 << 16          # the grid-stride loops cover the rest


def _cp():
    import cupy  # noqa: PLC0415  (optional dependency, imported lazily)
    return cupy


_KERNELS = RawKernels(lambda: CUDA_FILE.read_text(), NVRTC_OPTIONS, lambda: _cp(), BLOCK, MAX_GRID)
_reset_cache = _KERNELS.reset          # forget the compiled module (tests swap the array module)
_launch = _KERNELS.launch


def _suffix(*arrays) -> str:
    dtypes = {np.dtype(a.dtype) for a in arrays}
    if len(dtypes) != 1 or next(iter(dtypes)) not in SUFFIX:
        raise TypeError(f"batch-invariant kernels take float32 or float64 operands of one dtype, got "
                        f"{sorted(str(d) for d in dtypes)}")
    return SUFFIX[dtypes.pop()]


def _element_strides(a) -> tuple[int, ...] | None:
    """`a`'s strides in elements, or None where one is negative or not a whole element."""
    size = a.dtype.itemsize
    if any(s < 0 or s % size for s in a.strides):
        return None
    return tuple(s // size for s in a.strides)


def bmm(a, b):
    """(N, M, K) @ (K, P) or (N, K, P) -> new C-contiguous (N, M, P), fixed order per element.

    Views (a swapaxes, a transpose) are read in place through their strides."""
    cp = _cp()
    suf = _suffix(a, b)
    if a.ndim != 3 or b.ndim not in (2, 3):
        raise ValueError(f"bmm: a must be (N, M, K) and b (K, P) or (N, K, P), got {a.shape} and {b.shape}")
    n, m, k = a.shape
    if b.shape[-2] != k or (b.ndim == 3 and b.shape[0] != n):
        raise ValueError(f"bmm: shapes {a.shape} and {b.shape} do not multiply")
    sa = _element_strides(a)
    if sa is None:
        a, sa = cp.ascontiguousarray(a), (m * k, k, 1)
    sb = _element_strides(b)
    if sb is None:
        b = cp.ascontiguousarray(b)
        sb = _element_strides(b)
    p = b.shape[-1]
    b_n, b_k, b_p = (0, *sb) if b.ndim == 2 else sb
    out = cp.empty((n, m, p), dtype=a.dtype)
    i64 = np.int64
    _launch(f"tgb_bmm_{suf}", n * m * p,
            (a, b, out, i64(n), i64(m), i64(k), i64(p), i64(sa[0]), i64(sa[1]), i64(sa[2]),
             i64(b_n), i64(b_k), i64(b_p)))
    return out


def sum_middle(x):
    """(O, R, P) -> new (O, P): out[o, p] = x[o,0,p] + ... + x[o,R-1,p], in that order (+0.0 for R = 0)."""
    cp = _cp()
    suf = _suffix(x)
    if x.ndim != 3:
        raise ValueError(f"sum_middle: x must be (O, R, P), got {x.shape}")
    x = cp.ascontiguousarray(x)
    o, r, p = x.shape
    out = cp.empty((o, p), dtype=x.dtype)
    i64 = np.int64
    _launch(f"tgb_sum_middle_{suf}", o * p, (x, out, i64(o), i64(r), i64(p)))
    return out


def sum_axis(x, axis: int):
    """x.sum(axis=axis) with `sum_middle`'s fixed order (the other axes flattened around it)."""
    axis = axis % x.ndim
    shape = tuple(x.shape)
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return sum_middle(x.reshape(outer, shape[axis], inner)).reshape(shape[:axis] + shape[axis + 1:])
