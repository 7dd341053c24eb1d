"""The BLAS behind the models' products: which library it is, one thread per call, and a description.

The models' products (tgsim.models._numba_bmm) call `np.dot` inside Numba, which calls the gemm of
the BLAS that SciPy's `scipy.linalg.cython_blas` links (a wheel's bundled OpenBLAS, or a conda or
system BLAS that NumPy may share). A multi-threaded gemm may split its work differently at 1 and
at 2 threads, and the split can change how an element's reduction is rounded (with OpenBLAS the
threshold depends on the CPU's kernel: Haswell, SkylakeX and Zen kernels differ). So every product
runs with that library at ONE thread, whatever the process set (`pin_one_thread`): a worker's bits
then do not depend on the BLAS thread count. The parallelism is over workers, on Numba's threads.

What is bitwise where (README "Reproducibility"): within one machine (one CPU model, one BLAS
build), a gradient's bits do not depend on the BLAS or Numba thread counts, nor on the number of
workers in the batch, nor on the process (simulator or MPI rank). Across CPU families they may
differ: single-threaded OpenBLAS kernels (Haswell / SkylakeX / Zen / Neoverse) accumulate in
different orders, and NumPy picks SIMD code for exp/log by CPU. `describe()` records the CPU model
and each BLAS library's kernel (threadpoolctl's `architecture`) in every run's manifest.
"""

from __future__ import annotations

import ctypes
import os
import platform
from functools import lru_cache

# Names under which BLAS libraries export single-precision gemm: SciPy's OpenBLAS wheels add the
# "scipy_" prefix; reference-BLAS-style libraries (OpenBLAS, MKL, BLIS, Accelerate) use "sgemm_".
_GEMM_SYMBOLS = ("scipy_sgemm_", "sgemm_", "sgemm")


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _library_of(address: int) -> str | None:
    """The path of the shared library that holds `address` (dladdr), or None."""
    try:
        dladdr = ctypes.CDLL(None).dladdr
    except (OSError, AttributeError):
        return None
    info = _DlInfo()
    if not dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.realpath(info.dli_fname.decode())


@lru_cache(maxsize=None)
def gemm_library() -> str | None:
    """Path of the BLAS library whose sgemm Numba's `np.dot` calls, or None if it cannot be found.

    SciPy's cython_blas wraps the gemm of the library it links; looking the gemm symbol up through
    cython_blas's own handle (dlsym searches an object and its dependencies) and asking dladdr which
    file holds it names that library, whether it is a wheel's bundled copy or one shared with NumPy.
    """
    try:
        import scipy.linalg.cython_blas as cython_blas
        handle = ctypes.CDLL(cython_blas.__file__)
    except (ImportError, OSError):
        return None
    for name in _GEMM_SYMBOLS:
        fn = getattr(handle, name, None)
        if fn is not None:
            return _library_of(ctypes.cast(fn, ctypes.c_void_p).value)
    return None


@lru_cache(maxsize=None)
def gemm_controller():
    """threadpoolctl's controller of `gemm_library()` (get/set its thread count), or None."""
    path = gemm_library()
    if path is None:
        return None
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    for lib in ThreadpoolController().lib_controllers:
        if lib.user_api == "blas" and os.path.realpath(lib.filepath) == path:
            return lib
    return None


def pin_one_thread() -> int | None:
    """Set the gemm library to one thread; returns the count to restore (None: nothing to restore)."""
    ctl = gemm_controller()
    if ctl is None:
        return None
    before = ctl.get_num_threads()
    if before == 1 or before is None:
        return None
    ctl.set_num_threads(1)
    return before


def pin_private_copy() -> None:
    """Set the gemm library to one thread for good when it is SciPy's own bundled copy (a wheel's
    scipy.libs, which nothing but SciPy calls), so that `pin_one_thread` finds it at one thread and
    costs one query per call; a BLAS shared with NumPy is left alone (pinned per call only)."""
    import scipy

    ctl, path = gemm_controller(), gemm_library()
    root = os.path.dirname(os.path.dirname(os.path.realpath(scipy.__file__)))
    if ctl is not None and path.startswith((os.path.join(root, "scipy.libs"), os.path.join(root, "scipy", ".libs"))):
        ctl.set_num_threads(1)


def restore(before: int | None) -> None:
    """Undo `pin_one_thread` (a no-op for None)."""
    if before is not None:
        gemm_controller().set_num_threads(before)


def cpu_model() -> str:
    """The CPU's model name: /proc/cpuinfo's "model name" (x86), else lscpu's "Model name" (which
    names ARM cores, e.g. Neoverse-N1), else macOS's sysctl, else platform's processor/machine."""
    import subprocess

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    for cmd, key in ((["lscpu"], "Model name:"), (["sysctl", "-n", "machdep.cpu.brand_string"], "")):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for line in out.splitlines():
            if line.startswith(key) and line[len(key):].strip():
                return line[len(key):].strip()
    return platform.processor() or platform.machine()


def describe() -> dict:
    """The machine's architecture and every BLAS library loaded (threadpoolctl: internal_api, version,
    kernel `architecture`, threading layer, threads, path), the models' gemm library marked."""
    import numpy as np  # noqa: F401  (loads NumPy's BLAS)
    try:
        import scipy.linalg.cython_blas  # noqa: F401  (loads the models' BLAS)
        from threadpoolctl import threadpool_info
        infos = threadpool_info()
    except ImportError:
        infos = []
    gemm = gemm_library()
    libs = []
    for i in infos:
        if i.get("user_api") != "blas":
            continue
        libs.append({k: i.get(k) for k in ("internal_api", "version", "architecture", "threading_layer",
                                           "num_threads", "filepath")}
                    | {"models_gemm": gemm is not None and os.path.realpath(i["filepath"]) == gemm})
    return {"machine": platform.machine(), "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"), "libraries": libs,
            "models_gemm_library": gemm, "models_gemm_pinned": gemm_controller() is not None}
