"""tgsim/codecs/terngrad/kernels.py: which kernel set get_kernels picks for each name and array
module, and the pairs it refuses."""

from __future__ import annotations

import types

import numpy as np
import pytest

from tgsim.codecs.terngrad import cuda as _cuda, kernels, numba_kernels, reference as _reference


def _array_module(name: str = "cupy") -> types.ModuleType:
    """Any array module other than NumPy: get_kernels only asks `xp is not np`."""
    return types.ModuleType(name)


@pytest.mark.mutation
def test_get_kernels_picks_the_module_for_each_name_and_array_module():
    """The module docstring's table: "reference" runs on any array module; "numba" is the CPU set
    (numba_kernels), "cuda" the CuPy one (cuda); "auto" is numba for NumPy arrays and cuda otherwise."""
    xp = _array_module()
    kernels.get_kernels.cache_clear()
    try:
        assert kernels.KERNEL_NAMES == ("auto", "reference", "numba", "cuda")
        assert kernels.get_kernels("reference") is _reference
        assert kernels.get_kernels("reference", np) is _reference
        assert kernels.get_kernels("reference", xp) is _reference
        assert kernels.get_kernels("numba", np) is numba_kernels
        assert kernels.get_kernels("auto", np) is numba_kernels
        assert kernels.get_kernels("auto") is numba_kernels
        assert kernels.get_kernels("cuda", xp) is _cuda
        assert kernels.get_kernels("auto", xp) is _cuda
    finally:
        kernels.get_kernels.cache_clear()


@pytest.mark.mutation
def test_get_kernels_refuses_the_wrong_pairs():
    """A Numba set for device arrays, a CUDA set for NumPy arrays and unknown names are ValueErrors
    that name the way out."""
    xp = _array_module()
    with pytest.raises(ValueError, match=r"Numba kernels run on NumPy arrays; use kernels='cuda'"):
        kernels.get_kernels("numba", xp)
    with pytest.raises(ValueError, match=r"CUDA kernels run on CuPy arrays; use kernels='numba'"):
        kernels.get_kernels("cuda", np)
    with pytest.raises(ValueError, match=r"CUDA kernels run on CuPy arrays"):
        kernels.get_kernels("cuda")
    for bad in ("Numba", "gpu", ""):
        with pytest.raises(ValueError, match=r"unknown kernels"):
            kernels.get_kernels(bad, np)
