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
