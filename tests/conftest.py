"""Fixtures shared by several test files (plain helpers and stand-ins are in tests/fakes.py and
tests/cuda_harness.py).

* `builds` (session): nvcc builds tgsim/cuda/host_harness.cu into libtg_host.so and the wrapper's
  module source (tgsim.codecs.terngrad.cuda.source()) into PTX, with the options CuPy applies;
  skipped without nvcc.
* `h` (session): the built harness, loaded (cuda_harness.Harness).
* `batched_builds` (module): nvcc builds tgsim/cuda/batched_harness.cu and the PTX of batched.cu;
  `fake_cp`: tgsim.models.cuda_ops on the stand-in cuda_harness.FakeCupy over that harness.

`pytest_collection_modifyitems` moves the files of LONG_FIRST to the front, each file's tests in
their order: under `make test` (pytest-xdist, whole files per worker) the longest files start
first instead of leaving one worker alone with them at the end. It also skips the tests marked
`heavy` (the larger forms of cases `make test` runs in a smaller form) unless TGSIM_SLOW is set, as
`make test-slow` does.

With TGSIM_CPU_LOG=FILE, each test appends one line to FILE: its node id, the CPU seconds it used
in this process and in the child processes it waited for (MPI ranks, CLI runs, figure scripts),
and its wall seconds. Under `make test` the wall time of a test depends on what the other worker
runs beside it; the CPU seconds do not, and their sum over 2 cores bounds the suite's wall time.
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import time
import types

import pytest

import cupy_api
from tgsim.codecs.terngrad import cuda as _cuda
from tgsim.models import cuda_ops

from cuda_harness import CUDA_DIR, HARNESS_FLAGS, NVCC, FakeCupy, Harness


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


@pytest.fixture(scope="module")
def batched_builds(tmp_path_factory):
    """libtgb_host.so (tgsim/cuda/batched_harness.cu) and the PTX of batched.cu, built by nvcc."""
    d = tmp_path_factory.mktemp("tgb_cuda")
    so, ptx = d / "libtgb_host.so", d / "batched.ptx"
    cmds = [[NVCC, *HARNESS_FLAGS, "-o", str(so), str(CUDA_DIR / "batched_harness.cu")],
            [NVCC, "--ptx", *cupy_api.effective_options(cuda_ops.NVRTC_OPTIONS), "-o", str(ptx),
             str(CUDA_DIR / "batched.cu")]]
    for c in cmds:
        r = subprocess.run(c, capture_output=True, text=True, timeout=600)
        if r.returncode:
            raise RuntimeError(f"build failed: {' '.join(c)}\n{r.stdout}\n{r.stderr}")
    return types.SimpleNamespace(lib=ctypes.CDLL(str(so)), ptx=ptx.read_text())


@pytest.fixture
def fake_cp(batched_builds, monkeypatch):
    """tgsim.models.cuda_ops on a stand-in `cupy` (cuda_harness.FakeCupy) whose kernels run on the
    batched harness; the launches are recorded in `fake_cp._launches`."""
    launches: list = []
    cp = FakeCupy(batched_builds.lib, launches)
    cuda_ops._reset_cache()
    monkeypatch.setattr(cuda_ops, "_cp", lambda: cp)
    yield cp
    cuda_ops._reset_cache()


# the files whose tests take longest in all (`make test PYTEST_ADDOPTS=--durations=0`), longest first
LONG_FIRST = ("test_figures_report.py", "test_mpi.py", "test_wheel.py", "test_figures.py", "test_mpi_openmpi.py",
              "test_readme_commands.py", "test_compare.py", "test_analysis.py", "test_peer_numba_kernels.py",
              "test_numba_kernels.py", "test_peer_numba_kernels_more.py", "test_run_health.py")


HEAVY_SKIP = pytest.mark.skip(reason="heavy: the larger form of a case make test runs smaller; `make test-slow` runs it")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))     # stable: order kept within
    if not os.environ.get("TGSIM_SLOW"):
        for item in items:
            if item.get_closest_marker("heavy") is not None:
                item.add_marker(HEAVY_SKIP)


def _cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    log = os.environ.get("TGSIM_CPU_LOG")
    if not log:
        yield
        return
    cpu, wall = _cpu_seconds(), time.monotonic()
    yield
    with open(log, "a") as f:
        f.write(f"{item.nodeid}\t{_cpu_seconds() - cpu:.2f}\t{time.monotonic() - wall:.2f}\n")
