"""MPI transport: the mpi4py module, CUDA-aware MPI detection, GPU selection, device buffers.

GPU: CuPy arrays are handed to MPI as device buffers when the MPI library is CUDA-aware
(`cuda_aware()`: MPIX_Query_cuda_support / MPIX_GPU_query_support, overridable with
TGSIM_MPI_CUDA_AWARE=0|1), otherwise staged through pinned host buffers. Serialized messages
(allgather, ps) are host bytes either way (Message.to_bytes); decoded results return to the device of
the local message. Each rank selects GPU (node-local rank mod device count) when a GPU is present.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from tgsim.backend import array_module as _xp_of, get_xp, gpu_available
from tgsim.exchange.pieces import HDR

# the words on the wire around the payloads (the status values: tgsim/exchange/mpi_errors.py)
_U64 = np.dtype("<u8")
_HDR = HDR        # slot prefix / downlink status: one little-endian u64
_TAG_PS_UP, _TAG_PS_DOWN = 7101, 7102   # point-to-point parameter-server messages
_TAG_AG = 7103                          # point-to-point pieces of the pipelined all-gather
_TAG_SHARD_UP, _TAG_SHARD_DOWN = 7104, 7105   # pieces of the pipelined sharded_ps (codes, sums)


def mpi_module():
    from mpi4py import MPI  # noqa: PLC0415  (the `mpi` extra)

    return MPI


def cuda_aware() -> bool:
    """True if the MPI library under mpi4py accepts CUDA device buffers.

    TGSIM_MPI_CUDA_AWARE=1/0 overrides the probe (some Open MPI + UCX builds under-report).
    Probe: MPIX_Query_cuda_support() (Open MPI, MPICH >= 4) or MPIX_GPU_query_support(CUDA=0, &flag)
    (MPICH), looked up in libmpi through mpi4py's extension module; False when neither exists.
    """
    env = os.environ.get("TGSIM_MPI_CUDA_AWARE", "").strip().lower()
    if env in ("1", "true", "yes"):
        return True
    if env in ("0", "false", "no"):
        return False
    MPI = mpi_module()
    try:
        lib = ctypes.CDLL(MPI.__file__)
    except OSError:
        return False
    fn = getattr(lib, "MPIX_Query_cuda_support", None)
    if fn is not None:
        fn.restype, fn.argtypes = ctypes.c_int, []
        return bool(fn())
    fn = getattr(lib, "MPIX_GPU_query_support", None)
    if fn is not None:
        flag = ctypes.c_int(0)
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        return fn(0, ctypes.byref(flag)) == 0 and bool(flag.value)   # 0 = MPIX_GPU_SUPPORT_CUDA
    return False


def node_local_rank(comm) -> tuple[int, int]:
    """(rank, size) of this process among the ranks on its node (COMM_TYPE_SHARED split)."""
    MPI = mpi_module()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")   # torchrun, Open MPI, MPICH


def launcher_local_size() -> int:
    """How many ranks share this node by the launcher's variable (LOCAL_SIZE_VARS: torchrun, Open
    MPI, MPICH), else 1; an mpi4py comm's own answer is `node_local_rank` (a collective)."""
    for var in LOCAL_SIZE_VARS:
        try:
            return max(1, int(os.environ[var]))
        except (KeyError, ValueError):
            continue
    return 1


def share_cores(local_size: int, environ=None) -> int | None:
    """Give this rank Numba threads for its share of the node: the cores this process may use
    (`os.sched_getaffinity`) divided among the node's `local_size` ranks, at least 1, at most Numba's
    pool; without it every rank starts one thread per core, and the ranks' threads spin on too few
    cores (measured: README, "Your PyTorch model", Threads). Leaves Numba alone
    (returns None) where the user set NUMBA_NUM_THREADS; else returns the count set. The bits do not
    depend on it (every kernel's result is independent of its thread count)."""
    environ = os.environ if environ is None else environ
    if environ.get("NUMBA_NUM_THREADS"):
        return None
    import numba

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    n = max(1, min(int(numba.config.NUMBA_NUM_THREADS), cores // max(1, int(local_size))))
    numba.set_num_threads(n)
    return n


def select_gpu(comm, local: int | None = None) -> int | None:
    """Make GPU (node-local rank mod device count) current; None when there is no GPU.

    Collective over `comm` (the node split runs on every rank, with or without a GPU) unless the
    node-local rank `local` is given."""
    if local is None:
        local, _ = node_local_rank(comm)
    if not gpu_available():
        return None
    cp = get_xp("cupy")
    dev = local % cp.cuda.runtime.getDeviceCount()
    cp.cuda.Device(dev).use()
    return dev


class Staging:
    """Buffers MPI can read and write for NumPy or CuPy arrays: a host array as it is, a device array
    as it is with CUDA-aware MPI, else a copy through reusable pinned host memory (one per key)."""

    def __init__(self, cuda_aware: bool):
        self.cuda_aware = bool(cuda_aware)
        self._pinned: dict[str, tuple] = {}

    @staticmethod
    def sync(xp) -> None:
        if xp is not np:
            xp.cuda.get_current_stream().synchronize()

    def pinned_array(self, key: str, count: int, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = max(1, count * dtype.itemsize)
        have = self._pinned.get(key)
        if have is None or have[1] < nbytes:
            mem = get_xp("cupy").cuda.alloc_pinned_memory(nbytes)
            have = (mem, nbytes)
            self._pinned[key] = have
        return np.frombuffer(have[0], dtype=dtype, count=count)

    def wire(self, arr, key: str):
        """`arr` as a buffer MPI can read: itself (host, or device with CUDA-aware MPI) or a pinned copy."""
        if isinstance(arr, np.ndarray):
            return np.ascontiguousarray(arr)
        xp = _xp_of(arr)
        arr = xp.ascontiguousarray(arr)
        if self.cuda_aware:
            return arr
        host = self.pinned_array(key, arr.size, arr.dtype)
        arr.get(out=host)
        self.sync(xp)
        return host

    def landing(self, count: int, dtype, xp, key: str):
        """A receive buffer: host for NumPy, device with CUDA-aware MPI, else pinned host memory."""
        if xp is np:
            return np.empty(count, dtype=dtype)
        if self.cuda_aware:
            return xp.empty(count, dtype=dtype)
        return self.pinned_array(key, count, dtype)

    def back(self, buf, xp):
        """A received buffer as an array of module `xp` (copied off the reusable pinned buffer)."""
        if xp is np or not isinstance(buf, np.ndarray):
            return buf
        dev = xp.empty(buf.shape, dtype=buf.dtype)
        dev.set(buf)
        self.sync(xp)
        return dev
