"""Array-module selection: the one place that imports CuPy.

Every numerical function in tgsim takes arrays and asks `array_module(x)` for the module (`xp`) to
use, so NumPy and CuPy run the same lines.
"""

from __future__ import annotations

import functools
import types

import numpy as np


@functools.lru_cache(maxsize=1)
def _cupy() -> types.ModuleType | None:
    try:
        import cupy  # noqa: PLC0415  (optional extra)
    except Exception:  # ImportError, or a CUDA runtime that fails to load
        return None
    return cupy


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    cp = _cupy()
    if cp is None:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def get_xp(name: str = "numpy") -> types.ModuleType:
    """Return the array module called `name` ("numpy" or "cupy")."""
    if name == "numpy":
        return np
    if name == "cupy":
        if not gpu_available():
            raise RuntimeError("backend 'cupy' requested but no CUDA device/CuPy is available; "
                               "on a machine with a GPU, install the 'gpu-cuda12' or 'gpu-cuda13' extra (the "
                               "CUDA major version `nvidia-smi` shows; README, \"On a GPU\")")
        return _cupy()
    raise ValueError(f"unknown backend {name!r}; expected 'numpy' or 'cupy'")


class RawKernels:
    """The __global__ functions of one CUDA source on CuPy: compiled once per process with
    cupy.RawModule(code=source(), options=options) at the first use of a kernel (CuPy also keeps the
    binary in its disk cache), launched as grid-stride loops.

    source, cupy: callables returning the source text and the cupy module, called at first use (so
    tests can swap the module; `reset` forgets what was compiled)."""

    def __init__(self, source, options, cupy, block: int = 256, max_grid: int = 1 << 16):
        self._source, self._cupy = source, cupy
        self.options, self.block, self.max_grid = tuple(options), int(block), int(max_grid)
        self._module, self._kernels = None, {}

    def kernel(self, name: str):
        """The compiled kernel `name` (the module is compiled on the first call)."""
        k = self._kernels.get(name)
        if k is None:
            if self._module is None:
                cp = self._cupy()
                self._module = cp.RawModule(code=self._source(), options=self.options)
            k = self._kernels[name] = self._module.get_function(name)
        return k

    def reset(self) -> None:
        self._module, self._kernels = None, {}

    def launch(self, name: str, threads: int, args: tuple) -> None:
        """`threads` logical threads: min(ceil(threads / block), max_grid) blocks of `block` threads
        (the kernels' grid-stride loops cover the rest); nothing for threads <= 0."""
        if threads <= 0:
            return
        grid = min(-(-threads // self.block), self.max_grid)
        self.kernel(name)((grid,), (self.block,), args)


def array_module(x) -> types.ModuleType:
    """NumPy or CuPy, whichever owns `x` (cupy.get_array_module without importing CuPy eagerly)."""
    if isinstance(x, np.ndarray) or np.isscalar(x):
        return np
    cp = _cupy()
    if cp is not None and isinstance(x, cp.ndarray):
        return cp
    return np


def is_cupy(xp: types.ModuleType) -> bool:
    return xp is not np


def to_numpy(x) -> np.ndarray:
    """Host copy of `x` (no copy for a NumPy array)."""
    if isinstance(x, np.ndarray):
        return x
    get = getattr(x, "get", None)
    return np.asarray(get() if get is not None else x)
