"""mpi4py's Comm calls that tgsim's MPI exchange makes, over torch.distributed's default process group,
so `MPIExchange` runs wherever torch.distributed runs (torchrun, any launcher), without mpi4py.

    import torch.distributed as dist
    from tgsim.exchange.mpi import MPIExchange
    from tgsim.torch.dist_comm import TorchDistComm

    dist.init_process_group("gloo")                    # or "nccl", or "cpu:gloo,cuda:nccl"
    ex = MPIExchange(comm=TorchDistComm())             # tgsim's MPI exchange, same bits, torch's wire

MPIExchange takes the comm's `MPI` attribute (`TorchDistComm.MPI`, the namespace below) in place of
mpi4py's module: the datatypes, the reduction ops SUM / MAX / MIN / PROD, IN_PLACE and
`Request.Waitall`; and the comm's `device` and `cuda_aware` in place of its own GPU probe.

Buffers
-------
Buffer arguments take mpi4py's forms: an array, [array, datatype], [array, counts] and [array,
(counts, displacements), datatype] (counts and displacements in datatype elements, displacements
packed by default). An array must be C-contiguous. The datatype reinterprets the array's bytes, as
MPI does. NumPy arrays travel as `torch.from_numpy` views of their bytes (no copy; a read-only array
too, which torch then only reads); CuPy arrays as `torch.from_dlpack` views (torch's current stream
waits for CuPy's current stream; after each call the stream is synchronized, so the buffer holds the
result when the call returns, as with MPI). Host arrays go over a group that carries CPU tensors
(the default group when its backend has a CPU side, else a Gloo group made at construction); device
arrays over the default group (NCCL), on torch's current CUDA device (set it, e.g.
`torch.cuda.set_device(local_rank)`, before constructing the comm; it becomes CuPy's current device).

Calls (what MPIExchange, its pipelined modes and its error paths use)
  Get_rank, Get_size, Barrier
  Allreduce     all_reduce in place (a separate send buffer is first copied into the receive buffer).
                Reduction dtypes Gloo and NCCL lack, by an exact reinterpretation: int16 and uint16
                are summed / compared as int32, uint32 as int64, and cast back (modular, as the
                integer sums of the narrow type); uint64 sums as int64 (two's complement: the same
                bits modulo 2^64); uint64 MAX / MIN is refused.
  Allgather     all_gather into views of the receive buffer's rank blocks (equal counts).
  Allgatherv    the counts are known on every rank (MPI's rule); equal packed counts as Allgather,
                else each rank's block padded with zeros to the largest count, all_gather of the
                padded blocks, each block's first count bytes copied to its displacement.
  Alltoallv     all_to_all_single with the byte counts as split sizes (blocks packed first where
                the displacements are not).
  Gather        gather into views of the root's rank blocks.
  Gatherv       point to point: every other rank sends its block to the root, which receives each
                into its displacement (only the root knows the counts, MPI's rule).
  Bcast         broadcast.
  Send, Recv, Isend, Irecv (tags as given; requests with Wait, MPI.Request.Waitall)
  allgather, bcast, gather   pickled objects: all_gather_object, broadcast_object_list, gather_object.
Any other mpi4py Comm call raises NotImplementedError naming it; a datatype or op from elsewhere
(mpi4py's own) raises TypeError naming the call.
"""

from __future__ import annotations

import warnings

import numpy as np

from tgsim.backend import array_module as _xp_of, get_xp, gpu_available
from tgsim.torch.model import import_torch

_TAG_GATHERV = 7201     # point-to-point messages of Gatherv (MPIExchange's own: 7101..7105, mpi_transport.py)


# -- the MPI namespace ------------------------------------------------------------------------------------

class Datatype:
    """An MPI datatype: its name and the NumPy dtype whose bytes it reads."""

    def __init__(self, name: str, dtype):
        self.name, self.dtype = name, np.dtype(dtype)

    def __repr__(self) -> str:
        return f"TorchDistComm.MPI.{self.name}"


class Op:
    """An MPI reduction op and the name of torch.distributed's ReduceOp it maps to."""

    def __init__(self, name: str, torch_name: str):
        self.name, self.torch_name = name, torch_name

    def __repr__(self) -> str:
        return f"TorchDistComm.MPI.{self.name}"


class Request:
    """A pending Isend / Irecv: `Wait()` blocks until the transfer is done (CUDA: and synchronized)."""

    def __init__(self, work, tensor):
        self._work, self._tensor = work, tensor      # the tensor stays alive while the transfer runs

    def Wait(self, status=None) -> None:  # noqa: N802  (mpi4py's name)
        if self._work is not None:
            self._work.wait()
            _synchronize(self._tensor)
            self._work = None

    @staticmethod
    def Waitall(requests, statuses=None) -> None:  # noqa: N802
        """Wait for every request, in list order."""
        for r in requests:
            r.Wait()


class _InPlace:
    def __repr__(self) -> str:
        return "TorchDistComm.MPI.IN_PLACE"


class _MPINamespace:
    """The constants MPIExchange reads from mpi4py's MPI module."""

    IN_PLACE = _InPlace()
    SUM, MAX, MIN, PROD = Op("SUM", "SUM"), Op("MAX", "MAX"), Op("MIN", "MIN"), Op("PROD", "PRODUCT")
    BYTE, CHAR = Datatype("BYTE", np.uint8), Datatype("CHAR", np.int8)
    INT8_T, UINT8_T = Datatype("INT8_T", np.int8), Datatype("UINT8_T", np.uint8)
    INT16_T, UINT16_T = Datatype("INT16_T", np.int16), Datatype("UINT16_T", np.uint16)
    INT32_T, UINT32_T = Datatype("INT32_T", np.int32), Datatype("UINT32_T", np.uint32)
    INT64_T, UINT64_T = Datatype("INT64_T", np.int64), Datatype("UINT64_T", np.uint64)
    INT, LONG = Datatype("INT", np.int32), Datatype("LONG", np.int64)
    FLOAT, DOUBLE = Datatype("FLOAT", np.float32), Datatype("DOUBLE", np.float64)
    Request = Request

    def __getattr__(self, name):
        raise AttributeError(f"TorchDistComm.MPI has no {name!r}: the adapter over torch.distributed defines only "
                             "the constants MPIExchange uses (datatypes, SUM/MAX/MIN/PROD, IN_PLACE, Request)")


MPI = _MPINamespace()

# dtypes both Gloo and NCCL reduce natively; the others by the exact reinterpretations of the docstring
_NATIVE = {np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.int64, np.float16, np.float32, np.float64)}
_WIDER = {np.dtype(np.int16): np.int32, np.dtype(np.uint16): np.int32, np.dtype(np.uint32): np.int64}

# mpi4py Comm calls this adapter does not provide: NotImplementedError naming them (others: AttributeError)
_MPI4PY_LOWER = {"allreduce", "alltoall", "reduce", "scatter", "send", "recv", "isend", "irecv", "sendrecv",
                 "scan", "exscan", "probe", "iprobe", "reduce_scatter", "ibcast", "ibarrier", "issend", "ssend",
                 "mprobe", "improbe"}


# -- buffers ------------------------------------------------------------------------------------------------

def _synchronize(tensor) -> None:
    """Block until torch's current CUDA stream has finished (the result is in the buffer), for CUDA
    tensors; nothing for CPU tensors."""
    if tensor is not None and tensor.is_cuda:
        import_torch().cuda.current_stream().synchronize()


def _is_array(x) -> bool:
    return isinstance(x, np.ndarray) or hasattr(x, "__cuda_array_interface__") or hasattr(x, "__dlpack__")


def _seq(x) -> bool:
    return isinstance(x, (list, tuple)) or (isinstance(x, np.ndarray) and x.ndim == 1)


class _Buf:
    """A parsed buffer argument: `flat`, the array's contiguous 1-D view in its datatype; `counts` and
    `displs` (datatype elements) when given."""

    def __init__(self, spec, call: str, what: str = ""):
        what = f"{what} buffer" if what else "buffer"
        counts = dtype = None
        if _is_array(spec):
            arr = spec
        elif isinstance(spec, (list, tuple)) and len(spec) in (2, 3) and _is_array(spec[0]):
            arr, rest = spec[0], list(spec[1:])
            if rest and isinstance(rest[-1], Datatype):
                dtype = rest.pop().dtype
            elif rest and not (_seq(rest[-1]) or isinstance(rest[-1], (int, np.integer))):
                raise TypeError(f"TorchDistComm.{call}: the {what}'s datatype is {rest[-1]!r}; use "
                                "TorchDistComm.MPI's datatypes (mpi4py's are not torch.distributed's)")
            if rest:
                counts = rest[0]
        else:
            raise TypeError(f"TorchDistComm.{call}: the {what} must be an array, [array, datatype] or "
                            f"[array, counts(, displacements), datatype], got {type(spec).__name__}")
        if not arr.flags.c_contiguous:
            raise ValueError(f"TorchDistComm.{call}: the {what} is not C-contiguous")
        flat = arr.reshape(-1)
        if dtype is not None and flat.dtype != dtype:
            raw = flat.view(np.uint8) if flat.dtype != np.uint8 else flat
            if raw.size % dtype.itemsize:
                raise ValueError(f"TorchDistComm.{call}: the {what}'s {raw.size} bytes are not a whole "
                                 f"number of {dtype} elements")
            flat = raw.view(dtype)
        self.flat, self.displs = flat, None
        if isinstance(counts, (int, np.integer)):
            self.counts = int(counts)
        elif counts is not None and len(counts) == 2 and all(_seq(c) for c in counts):
            self.counts, self.displs = [int(c) for c in counts[0]], [int(d) for d in counts[1]]
        elif counts is not None:
            self.counts = [int(c) for c in counts]
        else:
            self.counts = None

    @property
    def itemsize(self) -> int:
        return self.flat.dtype.itemsize

    @property
    def bytes(self):
        """The buffer's bytes (a view)."""
        return self.flat.view(np.uint8) if self.flat.dtype != np.uint8 else self.flat

    def blocks(self, n: int, call: str) -> tuple[list[int], list[int]]:
        """(byte counts, byte displacements) of n per-rank blocks (displacements packed by default)."""
        if not isinstance(self.counts, list) or len(self.counts) != n:
            raise ValueError(f"TorchDistComm.{call}: {n} counts needed (one per rank), got {self.counts!r}")
        counts = self.counts
        displs = self.displs if self.displs is not None else list(np.cumsum([0] + counts[:-1]))
        if len(displs) != n:
            raise ValueError(f"TorchDistComm.{call}: {n} displacements needed, got {len(displs)}")
        isz = self.itemsize
        cb, db = [int(c) * isz for c in counts], [int(d) * isz for d in displs]
        if any(c < 0 for c in cb) or any(d < 0 or d + c > self.bytes.size for d, c in zip(db, cb)):
            raise ValueError(f"TorchDistComm.{call}: the counts and displacements {counts}, {displs} leave the "
                             f"buffer of {self.flat.size} elements")
        return cb, db


def _packed(counts: list[int], displs: list[int]) -> bool:
    return all(d == sum(counts[:i]) for i, d in enumerate(displs))


# -- the comm -------------------------------------------------------------------------------------------------

class TorchDistComm:
    """The mpi4py Comm calls of MPIExchange over torch.distributed's default process group (module
    docstring). The process group must be initialized first (collective: every rank constructs it,
    since a Gloo group for host buffers may be made here).

    Attributes: MPI (the constants' namespace); device (the CUDA device index whose CuPy arrays it
    takes, made CuPy's current device; None without a CUDA backend); cuda_aware (whether device
    arrays go straight to the default group: its CUDA backend is not Gloo)."""

    MPI = MPI

    def __init__(self):
        torch = import_torch()
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("TorchDistComm: torch.distributed's default process group is not initialized "
                               "(call torch.distributed.init_process_group first, on every rank)")
        self._torch, self._dist = torch, dist
        self._rank, self._size = dist.get_rank(), dist.get_world_size()
        config = str(dist.get_backend_config()).lower()         # e.g. "cpu:gloo,cuda:nccl"
        devices = dict(part.split(":", 1) for part in config.split(",") if ":" in part)
        host = devices.get("cpu", config if ":" not in config else "")
        self._host_group = None if host not in ("", "nccl") else dist.new_group(backend="gloo")
        cuda = devices.get("cuda", "")
        self.cuda_aware = bool(cuda) and cuda != "gloo" and torch.cuda.is_available()
        self.device = None
        if self.cuda_aware:
            self.device = torch.cuda.current_device()
            if gpu_available():
                get_xp("cupy").cuda.Device(self.device).use()

    def __getattr__(self, name):
        if name[:1].isupper() or name in _MPI4PY_LOWER:
            raise NotImplementedError(f"TorchDistComm.{name}: mpi4py's Comm.{name} is not implemented over "
                                      "torch.distributed (tgsim/torch/dist_comm.py lists the calls it has)")
        raise AttributeError(name)

    # -- helpers -------------------------------------------------------------------------------------
    def _tensor(self, arr):
        """A torch tensor sharing `arr`'s memory (NumPy: from_numpy; CuPy: from_dlpack)."""
        if isinstance(arr, np.ndarray):
            with warnings.catch_warnings():          # a read-only send buffer: torch only reads it
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                return self._torch.from_numpy(arr)
        return self._torch.from_dlpack(arr)

    def _group(self, *tensors):
        """The process group for these tensors: the default (CUDA) or the host group (CPU)."""
        cuda = {t.is_cuda for t in tensors if t is not None}
        if len(cuda) > 1:
            raise ValueError("TorchDistComm: a call mixes host and device buffers")
        if cuda == {True} and not self.cuda_aware:
            raise ValueError("TorchDistComm: device buffers need a CUDA backend other than Gloo (NCCL); stage "
                             "them through host memory (MPIExchange does, with cuda_aware False)")
        return None if cuda == {True} else self._host_group

    def _done(self, *tensors) -> None:
        for t in tensors:
            if t is not None and t.is_cuda:
                _synchronize(t)
                return

    def _op(self, op, call: str):
        if not isinstance(op, Op):
            raise TypeError(f"TorchDistComm.{call}: op {op!r} is not one of TorchDistComm.MPI's (SUM, MAX, MIN, "
                            "PROD)")
        return getattr(self._dist.ReduceOp, op.torch_name)

    # -- control ----------------------------------------------------------------------------------------
    def Get_rank(self) -> int:  # noqa: N802  (mpi4py's names)
        return self._rank

    def Get_size(self) -> int:  # noqa: N802
        return self._size

    def Barrier(self) -> None:  # noqa: N802
        self._dist.barrier(group=self._host_group)

    # -- reductions ---------------------------------------------------------------------------------------
    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM) -> None:  # noqa: N802
        """recvbuf <- op over all ranks of sendbuf (IN_PLACE: of recvbuf), element by element."""
        call = "Allreduce"
        rop = self._op(op, call)
        recv = _Buf(recvbuf, call, "receive")
        flat = recv.flat[:recv.counts] if isinstance(recv.counts, int) else recv.flat
        if sendbuf is not MPI.IN_PLACE:
            send = _Buf(sendbuf, call, "send")
            src = send.flat[:flat.size]
            if src.size != flat.size or src.dtype != flat.dtype:
                raise ValueError(f"TorchDistComm.{call}: send buffer ({src.size} {src.dtype}) and receive buffer "
                                 f"({flat.size} {flat.dtype}) differ")
            flat[...] = src
        if flat.size == 0:
            return
        dt = flat.dtype
        if dt in _NATIVE:
            t = self._tensor(flat)
            self._dist.all_reduce(t, op=rop, group=self._group(t))
            self._done(t)
        elif dt in _WIDER:
            wide = flat.astype(_WIDER[dt])
            t = self._tensor(wide)
            self._dist.all_reduce(t, op=rop, group=self._group(t))
            self._done(t)
            flat[...] = wide.astype(dt)          # modular, as the narrow type's sums
        elif dt == np.uint64 and op is MPI.SUM:
            t = self._tensor(flat.view(np.int64))     # two's complement: the same bits modulo 2^64
            self._dist.all_reduce(t, op=rop, group=self._group(t))
            self._done(t)
        else:
            raise TypeError(f"TorchDistComm.{call}: {op.name} of {dt} has no exact form over torch.distributed")

    # -- gathers ------------------------------------------------------------------------------------------
    def Allgather(self, sendbuf, recvbuf) -> None:  # noqa: N802
        """recvbuf's rank-r block <- rank r's sendbuf (equal sizes)."""
        call, n = "Allgather", self._size
        send, recv = _Buf(sendbuf, call, "send").bytes, _Buf(recvbuf, call, "receive").bytes
        s = send.size
        if recv.size != n * s:
            raise ValueError(f"TorchDistComm.{call}: the receive buffer holds {recv.size} bytes, {n} x {s} needed")
        if s == 0:
            return
        outs = [self._tensor(recv[r * s:(r + 1) * s]) for r in range(n)]
        t = self._tensor(send)
        self._dist.all_gather(outs, t, group=self._group(t, *outs))
        self._done(t)

    def Allgatherv(self, sendbuf, recvbuf) -> None:  # noqa: N802
        """recvbuf[displs[r]:displs[r] + counts[r]] <- rank r's sendbuf (module docstring: padded)."""
        call, n = "Allgatherv", self._size
        rb = _Buf(recvbuf, call, "receive")
        counts, displs = rb.blocks(n, call)
        send, recv = _Buf(sendbuf, call, "send").bytes, rb.bytes
        if send.size != counts[self._rank]:
            raise ValueError(f"TorchDistComm.{call}: rank {self._rank} sends {send.size} bytes, its count says "
                             f"{counts[self._rank]}")
        m = max(counts)
        if m == 0:
            return
        xp = _xp_of(recv)
        if len(set(counts)) == 1 and _packed(counts, displs):
            self.Allgather(send, recv[displs[0]:displs[0] + n * m])
            return
        pad = xp.zeros(m, dtype=np.uint8)
        pad[:send.size] = send
        got = xp.empty(n * m, dtype=np.uint8)
        self.Allgather(pad, got)
        for r in range(n):
            recv[displs[r]:displs[r] + counts[r]] = got[r * m:r * m + counts[r]]

    def Gather(self, sendbuf, recvbuf, root: int = 0) -> None:  # noqa: N802
        """On `root`: recvbuf's rank-r block <- rank r's sendbuf (equal sizes); recvbuf is ignored elsewhere."""
        call, n = "Gather", self._size
        send = _Buf(sendbuf, call, "send").bytes
        s = send.size
        t = self._tensor(send)
        outs = None
        if self._rank == root:
            recv = _Buf(recvbuf, call, "receive").bytes
            if recv.size != n * s:
                raise ValueError(f"TorchDistComm.{call}: the receive buffer holds {recv.size} bytes, {n} x {s} "
                                 "needed")
            outs = [self._tensor(recv[r * s:(r + 1) * s]) for r in range(n)]
        if s == 0:
            return
        self._dist.gather(t, gather_list=outs, dst=root, group=self._group(t, *(outs or [])))
        self._done(t)

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:  # noqa: N802
        """On `root`: recvbuf[displs[r]:displs[r] + counts[r]] <- rank r's sendbuf, point to point."""
        call, n = "Gatherv", self._size
        send = _Buf(sendbuf, call, "send").bytes
        if self._rank != root:
            if send.size:
                self.Send(send, dest=root, tag=_TAG_GATHERV)
            return
        rb = _Buf(recvbuf, call, "receive")
        counts, displs = rb.blocks(n, call)
        recv = rb.bytes
        if send.size != counts[root]:
            raise ValueError(f"TorchDistComm.{call}: the root sends {send.size} bytes, its count says {counts[root]}")
        reqs = [self.Irecv(recv[displs[r]:displs[r] + counts[r]], source=r, tag=_TAG_GATHERV)
                for r in range(n) if r != root and counts[r]]
        recv[displs[root]:displs[root] + counts[root]] = send
        Request.Waitall(reqs)

    def Alltoallv(self, sendbuf, recvbuf) -> None:  # noqa: N802
        """Rank r's recvbuf block s <- rank s's sendbuf block r (counts and displacements per rank)."""
        call, n = "Alltoallv", self._size
        sb, rb = _Buf(sendbuf, call, "send"), _Buf(recvbuf, call, "receive")
        sc, sd = sb.blocks(n, call)
        rc, rd = rb.blocks(n, call)
        send, recv = sb.bytes, rb.bytes
        xp = _xp_of(recv)
        src = send[:sum(sc)] if _packed(sc, sd) else xp.concatenate([send[d:d + c] for c, d in zip(sc, sd)])
        dst = recv[:sum(rc)] if _packed(rc, rd) else xp.empty(sum(rc), dtype=np.uint8)
        ti, to = self._tensor(src), self._tensor(dst)
        self._dist.all_to_all_single(to, ti, output_split_sizes=rc, input_split_sizes=sc, group=self._group(ti, to))
        self._done(to)
        if not _packed(rc, rd):
            off = 0
            for c, d in zip(rc, rd):
                recv[d:d + c] = dst[off:off + c]
                off += c

    def Bcast(self, buf, root: int = 0) -> None:  # noqa: N802
        """buf <- root's buf on every rank."""
        b = _Buf(buf, "Bcast")
        flat = b.flat[:b.counts] if isinstance(b.counts, int) else b.flat
        data = flat.view(np.uint8) if flat.dtype != np.uint8 else flat
        if data.size == 0:
            return
        t = self._tensor(data)
        self._dist.broadcast(t, src=root, group=self._group(t))
        self._done(t)

    # -- point to point -----------------------------------------------------------------------------------
    def _p2p(self, buf, peer, tag: int, call: str):
        if not isinstance(peer, (int, np.integer)) or not 0 <= int(peer) < self._size or int(peer) == self._rank:
            raise ValueError(f"TorchDistComm.{call}: peer {peer!r} must be another rank in 0..{self._size - 1} "
                             "(no wildcards)")
        b = _Buf(buf, call)
        flat = b.flat[:b.counts] if isinstance(b.counts, int) else b.flat
        t = self._tensor(flat.view(np.uint8) if flat.dtype != np.uint8 else flat)
        return t, int(peer), int(tag)

    def Send(self, buf, dest: int, tag: int = 0) -> None:  # noqa: N802
        t, peer, tag = self._p2p(buf, dest, tag, "Send")
        self._dist.send(t, dst=peer, group=self._group(t), tag=tag)
        self._done(t)

    def Recv(self, buf, source: int, tag: int = 0, status=None) -> None:  # noqa: N802
        t, peer, tag = self._p2p(buf, source, tag, "Recv")
        self._dist.recv(t, src=peer, group=self._group(t), tag=tag)
        self._done(t)

    def Isend(self, buf, dest: int, tag: int = 0) -> Request:  # noqa: N802
        t, peer, tag = self._p2p(buf, dest, tag, "Isend")
        return Request(self._dist.isend(t, dst=peer, group=self._group(t), tag=tag), t)

    def Irecv(self, buf, source: int, tag: int = 0) -> Request:  # noqa: N802
        t, peer, tag = self._p2p(buf, source, tag, "Irecv")
        return Request(self._dist.irecv(t, src=peer, group=self._group(t), tag=tag), t)

    # -- pickled objects ------------------------------------------------------------------------------------
    def allgather(self, obj) -> list:
        """Every rank's object, in rank order."""
        out = [None] * self._size
        self._dist.all_gather_object(out, obj, group=self._host_group)
        return out

    def bcast(self, obj, root: int = 0):
        """Root's object on every rank."""
        box = [obj]
        self._dist.broadcast_object_list(box, src=root, group=self._host_group)
        return box[0]

    def gather(self, obj, root: int = 0):
        """Every rank's object in rank order on `root`, None elsewhere."""
        out = [None] * self._size if self._rank == root else None
        self._dist.gather_object(obj, out, dst=root, group=self._host_group)
        return out


__all__ = ["MPI", "Datatype", "Op", "Request", "TorchDistComm"]
