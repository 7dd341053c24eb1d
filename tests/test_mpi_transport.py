"""tgsim/exchange/mpi_transport.py: the CUDA-aware probe, the node-local rank and GPU choice, host
and device staging (with stand-ins for ctypes and CuPy). Expected values are worked out by hand or
with plain NumPy, never with the module under test."""

from __future__ import annotations

import types

import numpy as np
import pytest


import tgsim.exchange.mpi  # noqa: F401  (imported at collection: tools/mutation.py counts module-level
import tgsim.exchange.mpi_env  # noqa: F401  lines as run at import)
from fakes import FAKE_MPI


class _Fn:
    """A fake C function of a fake libmpi: records restype/argtypes and its calls."""

    def __init__(self, body):
        self.body, self.calls = body, []

    def __call__(self, *args):
        self.calls.append(args)
        return self.body(*args)


def _fake_ctypes(monkeypatch, symbols=None, fail=False):
    import ctypes

    import tgsim.exchange.mpi_transport as mt

    opened = []

    def cdll(path):
        opened.append(path)
        if fail:
            raise OSError("no such library")
        return types.SimpleNamespace(**(symbols or {}))

    monkeypatch.setattr(mt, "ctypes", types.SimpleNamespace(CDLL=cdll, c_int=ctypes.c_int, POINTER=ctypes.POINTER,
                                                            byref=lambda x: x))
    monkeypatch.setattr(mt, "mpi_module", lambda: types.SimpleNamespace(__file__="/fake/MPI.so"))
    return opened


@pytest.mark.mutation
@pytest.mark.parametrize("value, want", [("1", True), (" True ", True), ("yes", True), ("0", False),
                                         ("FALSE", False), ("no", False)])
def test_cuda_aware_override(monkeypatch, value, want):
    """TGSIM_MPI_CUDA_AWARE=1/true/yes or 0/false/no (any case, spaces around) decides without a probe."""
    import tgsim.exchange.mpi_transport as mt

    opened = _fake_ctypes(monkeypatch, fail=True)
    monkeypatch.setenv("TGSIM_MPI_CUDA_AWARE", value)
    assert mt.cuda_aware() is want and opened == []


@pytest.mark.mutation
def test_cuda_aware_probes(monkeypatch):
    """Without the override: no library -> False; MPIX_Query_cuda_support's answer (0 or 1) when it
    exists; else MPIX_GPU_query_support(0 = CUDA, &flag): True only when it returns 0 (success) and
    sets the flag; neither symbol -> False. The library opened is mpi4py.MPI's file."""
    import tgsim.exchange.mpi_transport as mt

    monkeypatch.delenv("TGSIM_MPI_CUDA_AWARE", raising=False)
    monkeypatch.setenv("TGSIM_MPI_CUDA_AWARE", "maybe")      # neither yes nor no: probe
    _fake_ctypes(monkeypatch, fail=True)
    assert mt.cuda_aware() is False
    for answer in (0, 1):
        q = _Fn(lambda a=answer: a)
        opened = _fake_ctypes(monkeypatch, {"MPIX_Query_cuda_support": q,
                                            "MPIX_GPU_query_support": _Fn(lambda *a: 1 / 0)})
        assert mt.cuda_aware() is bool(answer) and opened == ["/fake/MPI.so"] and q.calls == [()]
        assert q.restype is not None and q.argtypes == []

    def gpu_query(rc, flag_value):
        def body(kind, flag):
            assert kind == 0
            flag.value = flag_value
            return rc
        return _Fn(body)

    for rc, flag, want in ((0, 1, True), (0, 0, False), (1, 1, False)):
        fn = gpu_query(rc, flag)
        _fake_ctypes(monkeypatch, {"MPIX_GPU_query_support": fn})
        assert mt.cuda_aware() is want and len(fn.calls) == 1 and len(fn.argtypes) == 2
    _fake_ctypes(monkeypatch, {})
    assert mt.cuda_aware() is False


@pytest.mark.mutation
def test_node_local_rank_and_select_gpu_without_a_gpu(monkeypatch):
    """node_local_rank splits by shared memory with key = the rank, returns the split's (rank, size)
    and frees it; select_gpu runs the split (it is collective) and gives None without a GPU."""
    import tgsim.exchange.mpi_transport as mt

    calls = []

    class Local:
        def Get_rank(self):
            return 1

        def Get_size(self):
            return 2

        def Free(self):
            calls.append("free")

    class Comm:
        def Get_rank(self):
            return 5

        def Split_type(self, kind, key):
            calls.append((kind, key))
            return Local()

    monkeypatch.setattr(mt, "mpi_module", lambda: FAKE_MPI)
    assert mt.node_local_rank(Comm()) == (1, 2) and calls == [("SHARED", 5), "free"]
    monkeypatch.setattr(mt, "gpu_available", lambda: False)
    assert mt.select_gpu(Comm()) is None and calls[-2:] == [("SHARED", 5), "free"]


@pytest.mark.mutation
def test_staging_of_host_arrays():
    """NumPy buffers pass as they are: wire() a contiguous array with the same values (a copy only
    of a strided view), landing() an empty host array, back() the buffer itself; sync is a no-op."""
    from tgsim.exchange.mpi_transport import _HDR, _TAG_AG, _TAG_PS_DOWN, _TAG_PS_UP, _U64, Staging

    st = Staging(cuda_aware=1)
    assert st.cuda_aware is True and Staging(0).cuda_aware is False
    a = np.arange(10, dtype=np.float32)
    assert st.wire(a, "k") is a
    w = st.wire(a[::2], "k")
    assert w.flags.c_contiguous and w.tolist() == [0, 2, 4, 6, 8]
    land = st.landing(3, np.int16, np, "k")
    assert land.shape == (3,) and land.dtype == np.int16
    assert st.back(a, np) is a
    st.sync(np)
    assert (_HDR, _U64, len({_TAG_PS_UP, _TAG_PS_DOWN, _TAG_AG})) == (8, np.dtype("<u8"), 3)


class _DevArray:
    """A stand-in CuPy array: host values behind .get() / .set()."""

    def __init__(self, values):
        self.values = np.array(values)
        self.shape, self.dtype, self.size = self.values.shape, self.values.dtype, self.values.size
        self.set_calls = 0

    def get(self, out):
        out[...] = self.values

    def set(self, buf):
        self.set_calls += 1
        self.values[...] = buf


def _fake_cupy(log):
    stream = types.SimpleNamespace(synchronize=lambda: log.append("sync"))
    cuda = types.SimpleNamespace(
        get_current_stream=lambda: stream,
        alloc_pinned_memory=lambda nbytes: log.append(("pinned", nbytes)) or bytearray(nbytes),
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 2),
        Device=lambda dev: types.SimpleNamespace(use=lambda: log.append(("use", dev))))
    return types.SimpleNamespace(cuda=cuda, ascontiguousarray=lambda a: a,
                                 empty=lambda shape, dtype: _DevArray(np.zeros(shape, dtype)))


def _with_fake_cupy(monkeypatch):
    import tgsim.exchange.mpi_transport as mt

    log = []
    cp = _fake_cupy(log)
    monkeypatch.setattr(mt, "get_xp", lambda name: cp if name == "cupy" else pytest.fail(name))
    monkeypatch.setattr(mt, "_xp_of", lambda a: cp if isinstance(a, _DevArray) else np)
    return mt, cp, log


@pytest.mark.mutation
def test_select_gpu_takes_node_local_rank_mod_device_count(monkeypatch):
    """With a GPU: node-local rank 5 of 2 devices -> device 1, made current, and returned."""
    mt, cp, log = _with_fake_cupy(monkeypatch)
    monkeypatch.setattr(mt, "gpu_available", lambda: True)
    monkeypatch.setattr(mt, "node_local_rank", lambda comm: (5, 8))
    assert mt.select_gpu(object()) == 1 and log == [("use", 1)]


@pytest.mark.mutation
def test_pinned_host_buffers_are_reused_per_key(monkeypatch):
    """pinned_array: one pinned allocation per key, reused while big enough (and shared by views of
    fewer elements), replaced when too small; at least one byte even for 0 elements."""
    mt, cp, log = _with_fake_cupy(monkeypatch)
    st = mt.Staging(cuda_aware=False)
    a = st.pinned_array("k", 4, np.float32)
    assert a.shape == (4,) and a.dtype == np.float32 and log == [("pinned", 16)]
    b = st.pinned_array("k", 2, np.float64)          # 16 bytes: the same memory
    assert b.shape == (2,) and np.shares_memory(a, b) and len(log) == 1
    c = st.pinned_array("k", 5, np.float32)          # 20 > 16 bytes: a new buffer
    assert c.shape == (5,) and log[-1] == ("pinned", 20) and not np.shares_memory(a, c)
    st.pinned_array("k", 5, np.float32)
    assert len(log) == 2                             # exactly big enough: kept
    st.pinned_array("other", 1, np.float32)
    assert log[-1] == ("pinned", 4)                  # another key, another buffer
    z = st.pinned_array("zero", 0, np.float32)
    assert z.size == 0 and log[-1] == ("pinned", 1)


@pytest.mark.mutation
def test_device_arrays_through_staging(monkeypatch):
    """A device array: with CUDA-aware MPI handed over as it is (wire) and received into a device
    array (landing); without, copied into pinned host memory after a stream sync, and a received
    host buffer copied back to a new device array (back); sync synchronizes the current stream."""
    mt, cp, log = _with_fake_cupy(monkeypatch)
    dev = _DevArray(np.arange(3, dtype=np.float32))
    aware = mt.Staging(cuda_aware=True)
    assert aware.wire(dev, "k") is dev and log == []
    assert isinstance(aware.landing(3, np.float32, cp, "k"), _DevArray)
    assert aware.back(dev, cp) is dev                # a device buffer stays
    plain = mt.Staging(cuda_aware=False)
    host = plain.wire(dev, "k")
    assert isinstance(host, np.ndarray) and host.tolist() == [0, 1, 2] and log == [("pinned", 12), "sync"]
    land = plain.landing(3, np.float32, cp, "r")
    assert isinstance(land, np.ndarray) and log[-1] == ("pinned", 12)
    land[...] = [7, 8, 9]
    back = plain.back(land, cp)
    assert isinstance(back, _DevArray) and back.set_calls == 1 and back.values.tolist() == [7, 8, 9]
    assert log[-1] == "sync"
    mt.Staging.sync(cp)
    assert log[-1] == "sync" and log.count("sync") == 3


def test_each_rank_gets_its_share_of_the_nodes_cores(monkeypatch):
    """share_cores: the cores this process may use divided among the node's ranks (at least 1, at
    most Numba's pool), set through numba.set_num_threads; nothing where NUMBA_NUM_THREADS is set."""
    import numba

    from tgsim.exchange import mpi_transport

    calls = []
    monkeypatch.setattr(numba, "set_num_threads", calls.append)
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 8)
    monkeypatch.setattr(mpi_transport.os, "sched_getaffinity", lambda pid: set(range(8)))
    assert [mpi_transport.share_cores(k, environ={}) for k in (1, 2, 3, 4, 16)] == [8, 4, 2, 2, 1]
    assert calls == [8, 4, 2, 2, 1]
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 2)       # never more than Numba's pool
    assert mpi_transport.share_cores(1, environ={}) == 2
    assert mpi_transport.share_cores(2, environ={"NUMBA_NUM_THREADS": "8"}) is None and calls[-1] == 2


def test_the_nodes_rank_count_comes_from_the_comm_or_the_launcher(monkeypatch):
    """Without an mpi4py comm (torch.distributed's has no node split) torchrun's LOCAL_WORLD_SIZE,
    Open MPI's or MPICH's variable; none: 1."""
    from tgsim.exchange.mpi_transport import LOCAL_SIZE_VARS, launcher_local_size

    for var in LOCAL_SIZE_VARS:
        monkeypatch.delenv(var, raising=False)
    assert launcher_local_size() == 1
    monkeypatch.setenv("MPI_LOCALNRANKS", "3")
    assert launcher_local_size() == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert launcher_local_size() == 4
