"""Which implementation of the codec kernels runs: reference (xp), Numba (CPU), CUDA (CuPy).

All three compute the same bits for the same inputs and key; the choice only changes speed.
"""

from __future__ import annotations

import functools
import importlib
import types

import numpy as np

KERNEL_NAMES = ("auto", "reference", "numba", "cuda")
_MODULES = {"reference": "reference", "numba": "numba_kernels", "cuda": "cuda"}


@functools.lru_cache(maxsize=None)
def get_kernels(name: str, xp=np) -> types.ModuleType:
    """The kernel module for kernel set `name` ("auto", "reference", "numba", "cuda") and arrays of
    module `xp`, with moments/encode (and their batched-over-workers forms moments_many/encode_many)
    and weighted_sum/sum_codes; ValueError for an unknown name or a set that cannot take xp's arrays."""
    if name not in KERNEL_NAMES:
        raise ValueError(f"unknown kernels {name!r}; expected one of {KERNEL_NAMES}")
    on_gpu = xp is not np
    if name == "auto":
        name = "cuda" if on_gpu else "numba"
    if name == "numba" and on_gpu:
        raise ValueError("the Numba kernels run on NumPy arrays; use kernels='cuda' for CuPy arrays")
    if name == "cuda" and not on_gpu:
        raise ValueError("the CUDA kernels run on CuPy arrays; use kernels='numba' for NumPy arrays")
    return importlib.import_module(f"tgsim.codecs.terngrad.{_MODULES[name]}")
