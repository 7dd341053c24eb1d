"""W same-length 1-D arrays handed to a cached numba kernel as one argument, without a copy.

The decode-sum kernels read the W messages' layers one after another. They take them as an int64
array of the arrays' data addresses (`addresses`) and an empty array of their dtype (`like`);
inside the kernel `row(addrs, w, n, like)` is message w's array again, a C-contiguous view of its n
elements. Stacking them into one (W, n) array would copy W n elements per call, and a
numba.typed.List has methods that numba compiles anew in every process (cache=True does not cover
them); the address array is neither.

`addresses` returns the C-contiguous arrays it took the addresses of: the caller holds that list
until the kernel has returned, so that no array is freed while the kernel reads it.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def _voidptr(typingctx, addr):
    """The int64 `addr` as a void pointer."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return types.voidptr(types.int64), codegen


@njit(cache=True, inline="always")
def row(addrs, w, n, like):
    """Array w: the n elements of like's dtype at address addrs[w] (C-contiguous)."""
    return carray(_voidptr(addrs[w]), n, like.dtype)


def addresses(arrays, n: int, dtype=None):
    """(kept, addrs, like) for the W arrays: kept the list of their flat C-contiguous forms (of
    `dtype` where given: a cast copy), addrs int64 (W,) their data addresses, like an empty array
    of their one dtype. Raises ValueError where an array has not n elements or the dtypes differ."""
    kept = [np.ascontiguousarray(a if dtype is None else np.asarray(a, dtype=dtype)).reshape(-1) for a in arrays]
    dt = kept[0].dtype if kept else np.dtype(dtype if dtype is not None else np.float32)
    for a in kept:
        if a.size != n or a.dtype != dt:
            raise ValueError(f"expected {n} elements of {dt}, got {a.size} of {a.dtype}")
    addrs = np.array([a.ctypes.data for a in kept], np.int64)
    return kept, addrs, np.empty(0, dt)


@njit(cache=True)
def address(a) -> int:
    """The data address of the array `a` (a.ctypes.data), read in compiled code: no ctypes object
    is built."""
    return a.ctypes.data
