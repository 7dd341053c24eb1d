"""Fixtures shared by several test files (plain helpers and stand-ins are in tests/fakes.py and
tests/cuda_harness.py).

* `builds` (session): nvcc builds tgsim/cuda/host_harness.cu into libtg_host.so and the wrapper's
  module source (tgsim.codecs.terngrad.cuda.source()) into PTX, with the options CuPy applies;
  skipped without nvcc.
* `h` (session): the built harness, loaded (cuda_harness.Harness).
"""

from __future__ import annotations

import subprocess
import types

import pytest

import cupy_api
from tgsim.codecs.terngrad import cuda as _cuda

from cuda_harness import CUDA_DIR, HARNESS_FLAGS, NVCC, Harness


@pytest.fixture(scope="session")
def builds(tmp_path_factory):
    """libtg_host.so and the PTX of the wrapper's module source, built concurrently (2 nvcc runs)."""
    if NVCC is None:
        pytest.skip("nvcc not on PATH")
    d = tmp_path_factory.mktemp("tg_cuda")
    so, mod_src, ptx = d / "libtg_host.so", d / "terngrad_module.cu", d / "terngrad_module.ptx"
    mod_src.write_text(_cuda.source())
    cmds = [
        [NVCC, *HARNESS_FLAGS, "-o", str(so), str(CUDA_DIR / "host_harness.cu")],
        [NVCC, "--ptx", *cupy_api.effective_options(_cuda.NVRTC_OPTIONS), "-o", str(ptx), str(mod_src)],
    ]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds]
    for p, c in zip(procs, cmds):
        out, err = p.communicate(timeout=600)
        if p.returncode:
            raise RuntimeError(f"build failed ({p.returncode}): {' '.join(c)}\n{out}\n{err}")
    return types.SimpleNamespace(so=so, ptx=ptx.read_text(), cmds=cmds)


@pytest.fixture(scope="session")
def h(builds):
    return Harness(builds.so)
