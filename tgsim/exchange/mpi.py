"""MPI exchange (mpi4py): one worker per rank, the real wire, the in-process exchange's bits.

    ex = MPIExchange()                     # MPI.COMM_WORLD: n_workers = size, local_workers = (rank,)
    run(cfg, exchange=ex, writer=ex.rank == 0)

Every method returns, on every rank, exactly the bits `InProcessExchange` returns for the same
inputs (same gradients, scalers and keys); only the transport differs. Per step and phase one MPI
message carries all layers (the layers are concatenated into one buffer, split only into buckets of
at most `bucket_bytes`), so small layers do not each pay a latency.

Phases and wire formats
  scalers      one MAX Allreduce of the float32 per-layer scalers (all layers in one message).
  fp32 (exact) a reduce-scatter with ordered per-chunk sums: the layers' bucket is cut into N
               contiguous chunks; Alltoallv sends chunk r of every rank to rank r, which sums its
               chunk over the senders in ascending rank order in float64 -- the in-process order
               f32(Σ_w f64(g_w), ascending w, · 1/N) -- and Allgatherv returns the float32 chunks to
               all. Same bytes per rank as a ring all-reduce: 2 (N-1)/N · 4 bytes per element.
  fp32 (native, `exact=False`, for benchmarking only) MPI Allreduce(SUM) of float32: MPI picks
               the summation order, so the bits may differ from the simulator's.
  packed-code allgather   Allgather of slots [u64 length | serialized Message]: every rank parses all N
               messages and decodes their sum in rank order (`codec.aggregate`). With NumPy buffers
               it is pipelined (`pieces`): the slot in pieces of `chunk` elements (default 2^18;
               0 = one piece; < 0: one blocking Allgather, as for CuPy buffers), each piece Isent
               to every other rank (the bytes of a ring all-gather: N-1 slots out and in per
               rank), all posted at once, and piece k is summed while later pieces are on the
               wire. (Not one MPI Iallgather per piece: MPICH advances its ring only inside MPI
               calls, not during the sums, so it is no faster than the blocking Allgather.)
  packed-code allreduce   Allreduce(SUM) of the integer codes (int8 up to 127 ranks, int16 beyond,
               exact in any order), scaled once: s/N · Σ codes. Float layers take the exact fp32
               path.
  packed-code ps  rank 0 is the server: it receives every worker's slot, sums the codes, and sends the
               downlink [u64 status | per ternary layer: f32 scaler + (Σ codes + N) bit-packed at
               ceil(log2(2N+1)) bits; per float layer: f32 mean] to every worker; without shared
               scalers the downlink is the float32 mean; with `reternarize_key` it is the
               serialized Message of the mean ternarized again with that key. Every rank (the
               server too) decodes the same downlink bytes. Transport (`ps_transport`):
               "p2p" (default, what a parameter server does): point-to-point messages between the
               server and each worker -- exactly N-1 payloads each way cross the network. With
               shared scalers and no re-ternarization (NumPy buffers) the exchange is pipelined
               (`pieces`): slot and downlink are cut into pieces of `chunk` elements
               (default 2^18; 0 = one piece; < 0 = not pipelined); each worker Isends its pieces,
               the server sums and Isends piece k as soon as piece k has arrived from every
               worker, every rank decodes piece k while later pieces are on the wire, and each
               downlink piece carries its own u64 status. So a full-duplex link carries uplink and
               downlink at once instead of one after the other. Otherwise: N-1 Recv of the whole
               slots and N-1 Send of the whole downlink on the server. "collective": MPI Gather +
               Bcast, whose binomial trees forward slots through inner ranks (1.36x the payload
               bytes on a shared medium at N = 8) but spread the downlink over more links on a
               switch.
  packed-code sharded_ps  every rank serves one shard (tgsim/exchange/sharded.py; shared scalers
               only): the ternary layers' T elements, concatenated, are cut into N contiguous
               shards (shard r: elements [r T // N, (r+1) T // N)); one Alltoallv sends shard r's
               codes, packed as the codec packs them, to rank r as [u64 count | codes]; rank r sums
               them exactly in rank order and one Allgatherv returns every shard's [u64 status |
               (Σ codes + N) at w = ceil(log2(2N+1)) bits]; every rank decodes as the allreduce
               mode does. Bytes of rank r (H = 8, P(c) packed codes, Q(c) = ceil(c w / 8), c_s the
               shard sizes): sent = Σ_{s≠r} (H + P(c_s)) + (N-1)(H + Q(c_r)), received = (N-1)(H +
               P(c_r)) + Σ_{s≠r} (H + Q(c_s)): each about (N-1)/N · (2 + w) bits per element (1.6 +
               w for base-3), both summed 2 (N-1)/N · (2 + w), plus the headers. Float layers take
               the exact fp32 path. With NumPy buffers and chunk >= 0 it is pipelined
               (mpi_pipelined `_sharded_pipelined`): each shard in pieces of about `chunk`
               elements, Isent as [u64 count | codes]; the owner sums piece k as soon as it has
               arrived from everyone and Isends [u64 status | sums]; every rank decodes piece k
               while later pieces are on the wire; one header per piece each way (sharded.py).

Errors never hang the job: a malformed payload raises `PeerPayloadError` (a ValueError) naming the
sender rank -- on every rank in allgather mode (all parse the same bytes), in ps mode the server
broadcasts the error so every rank raises it, in sharded_ps mode the lowest owner that failed
does; ranks started with different configs raise `RankConfigMismatchError` on every rank, naming
the ranks that differ. Both are `CollectiveError`s: raised identically on every rank, so
`tgsim.mpi_runs.train` can exit cleanly instead of aborting. How each mode detects, encodes (the
downlink's status word) and re-raises them: tgsim/exchange/mpi_errors.py.

Bytes (`CommBytes`) are this rank's, counted from the buffers it hands to MPI: point-to-point style
collectives (Alltoallv, Gather, Allgather(v), Bcast) count what this rank's data must reach
(sent) and what arrives from other ranks (received); the server's Bcast counts N-1 copies sent.
Native reductions (Allreduce) count the ring model 2 (N-1)/N · buffer bytes, as the simulator does.
Control messages (any_true, mean_scalar, barrier, config check) are not counted.

GPU buffers, MPI process placement and the wire's length word and tags:
tgsim/exchange/mpi_transport.py. The pipelined modes: tgsim/exchange/mpi_pipelined.py (a mixin of
MPIExchange). The parameter server's downlink format: tgsim/exchange/ps_downlink.py.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tgsim.backend import array_module as _xp_of, gpu_available, to_numpy
from tgsim.codecs import packing
from tgsim.codecs.message import KIND_TERNARY, VERSION as MESSAGE_VERSION, Message
from tgsim.codecs.ordered_mean import ordered_mean_flat
from tgsim.errors import CollectiveError, PayloadError, PeerPayloadError, RankConfigMismatchError, ServerError
from tgsim.exchange import sharded
from tgsim.exchange.base import CommBytes, mean_of_scalers, own_downlink_bytes, own_wire_bytes, ring_allreduce_bytes
from tgsim.exchange.mpi_errors import (SERVER, STATUS_OK, beyond_n, blame_codes, check_scalers, config_mismatch,
                                       malformed_downlink, parse_slot, raise_if_server_failed, raise_server_failure,
                                       read_status, server_failure, write_status)
from tgsim.exchange.mpi_pipelined import PipelinedModes
from tgsim.exchange.mpi_transport import (_HDR, _TAG_PS_DOWN, _TAG_PS_UP, _U64, Staging, cuda_aware, launcher_local_size,
                                          mpi_module, node_local_rank, select_gpu, share_cores)
from tgsim.exchange.ps_downlink import (code_dtype, message_to, ps_base_downlink, ps_decode, ps_decode_base,
                                        ps_downlink, ps_downlink_size)

PS_TRANSPORTS = ("p2p", "collective")
CHUNK = 1 << 18       # elements per piece of the pipelined ps and allgather (64 KiB of 2-bit codes)


# -- the exchange -------------------------------------------------------------------------------------

class MPIExchange(PipelinedModes):
    """The `Exchange` protocol over MPI: one worker per rank (see the module docstring)."""

    def __init__(self, comm=None, exact: bool = True, bucket_bytes: int = 64 << 20, gpu: str | bool = "auto",
                 ps_transport: str = "p2p", chunk: int = CHUNK):
        own = getattr(comm, "MPI", None)     # a comm other than mpi4py's brings its constants, device and
        MPI = own if own is not None else mpi_module()    # CUDA awareness (tgsim/torch/dist_comm.py)
        self.MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.n_workers = self.size
        self.local_workers = (self.rank,)
        self.exact = bool(exact)
        if bucket_bytes < 8:
            raise ValueError(f"bucket_bytes must be >= 8, got {bucket_bytes}")
        self.bucket_bytes = int(bucket_bytes)
        if ps_transport not in PS_TRANSPORTS:
            raise ValueError(f"ps_transport must be one of {PS_TRANSPORTS}, got {ps_transport!r}")
        self.ps_transport = ps_transport
        self.chunk = int(chunk)
        self._plans: dict = {}
        if own is not None:
            self.device, self.cuda_aware = (comm.device if gpu in ("auto", True) else None), bool(comm.cuda_aware)
            local_size = launcher_local_size()           # torch.distributed: the launcher's variable
        else:
            self.device, local_size = None, launcher_local_size()
            if gpu in ("auto", True):                    # one node split (collective), for both uses
                local_rank, local_size = node_local_rank(self.comm)
                self.device = select_gpu(self.comm, local_rank)
            self.cuda_aware = cuda_aware() if gpu_available() else False   # consulted for CuPy arrays only
        self.numba_threads = share_cores(local_size)     # this rank's share of the node's cores
        self.totals = CommBytes()        # this rank's bytes over the life of the exchange
        self._pending = CommBytes()      # scaler sharing, added to the next aggregate() result
        self.staging = Staging(self.cuda_aware)

    # -- control ---------------------------------------------------------------------------------
    def barrier(self) -> None:
        self.comm.Barrier()

    def any_true(self, flag: bool) -> bool:
        buf = np.array([1 if flag else 0], dtype=np.int32)
        self.comm.Allreduce(self.MPI.IN_PLACE, [buf, self.MPI.INT32_T], op=self.MPI.MAX)
        return bool(buf[0])

    def mean_scalar(self, local_sum: float) -> float:
        """Allgather of the per-rank values, summed in rank order (the simulator's np.sum over workers)."""
        vals = np.empty(self.size, dtype=np.float64)
        self.comm.Allgather([np.array([local_sum], dtype=np.float64), self.MPI.DOUBLE], [vals, self.MPI.DOUBLE])
        return float(np.sum(vals)) / self.size

    def check_same_config(self, digest: str, shard_plan: str | None = None) -> None:
        """Allgather (config digest, codec wire version, library versions, shard plan); on any
        difference every rank raises the same RankConfigMismatchError naming the ranks that differ."""
        from tgsim import __version__ as tgsim_version

        plan = shard_plan
        mine = {"config sha256": str(digest), "tgsim": str(tgsim_version),
                "codec message version": str(MESSAGE_VERSION), "numpy": np.__version__,
                "shard plan": str(plan) if plan is not None else "-"}
        problem = config_mismatch(self.comm.allgather(mine), keys=mine)
        if problem is not None:
            raise RankConfigMismatchError(problem)

    def gather_rows(self, local: np.ndarray, root: int = 0) -> np.ndarray | None:
        """Collective: this rank's (1, M) row -> (N, M) rows in rank order on `root` (one MPI Gather;
        checkpoints of error feedback's residuals, not counted in the training bytes), None elsewhere."""
        local = np.ascontiguousarray(local)
        if local.ndim != 2 or local.shape[0] != 1:
            raise ValueError(f"MPIExchange holds one worker per rank: local rows must be (1, M), got {local.shape}")
        rows = np.empty((self.size, local.shape[1]), dtype=local.dtype) if self.rank == root else None
        self.comm.Gather(local, rows, root=root)
        return rows

    def gather_totals(self) -> list[dict]:
        """Collective: every rank's cumulative bytes, in rank order (on every rank)."""
        return self.comm.allgather({"rank": self.rank, "sent": self.totals.sent, "received": self.totals.received})

    # -- scalers and fp32 ----------------------------------------------------------------------------
    def max_scalers(self, local: np.ndarray) -> np.ndarray:
        local = np.asarray(local, dtype=np.float32)
        if local.ndim != 2 or local.shape[0] != 1:
            raise ValueError(f"MPIExchange holds one worker per rank: local scalers must be (1, L), got {local.shape}")
        out = np.ascontiguousarray(local[0]).copy()
        if out.size:
            self.comm.Allreduce(self.MPI.IN_PLACE, [out, self.MPI.FLOAT], op=self.MPI.MAX)
        b = ring_allreduce_bytes(out.nbytes, self.size)
        self._pending += CommBytes(b, b)
        return out

    def mean_scalers(self, local: np.ndarray) -> np.ndarray:
        """Allgather of every rank's (1, L) scalers, then `mean_of_scalers` in rank order (the bits of
        the in-process exchange); the bytes of an all-gather, (N-1) L floats each way."""
        local = np.asarray(local, dtype=np.float32)
        if local.ndim != 2 or local.shape[0] != 1:
            raise ValueError(f"MPIExchange holds one worker per rank: local scalers must be (1, L), got {local.shape}")
        rows = np.empty((self.size, local.shape[1]), dtype=np.float32)
        if local.size:
            self.comm.Allgather([np.ascontiguousarray(local[0]), self.MPI.FLOAT], [rows, self.MPI.FLOAT])
        b = (self.size - 1) * local[0].nbytes
        self._pending += CommBytes(b, b)
        return mean_of_scalers(rows, self.size)

    def mean_fp32(self, local_layers: Sequence[dict]) -> tuple[dict, CommBytes]:
        """f32(Σ_w f64(g_w), ascending rank w, · 1/N) per layer; `exact=False` uses MPI's Allreduce."""
        return self._mean_fp32(local_layers, self.exact)

    def mean_fp32_native(self, local_layers: Sequence[dict]) -> tuple[dict, CommBytes]:
        """BENCHMARK ONLY: MPI's own Allreduce(SUM) of float32, whatever `exact` says (not the simulator's bits)."""
        return self._mean_fp32(local_layers, exact=False)

    def _mean_fp32(self, local_layers: Sequence[dict], exact: bool) -> tuple[dict, CommBytes]:
        if len(local_layers) != 1:
            raise ValueError(f"MPIExchange holds one worker per rank, got {len(local_layers)} local workers")
        lay = local_layers[0]
        names = list(lay)
        if not names:
            return {}, CommBytes()
        xp = _xp_of(lay[names[0]])
        arrays = [xp.asarray(lay[k]) for k in names]
        wide = exact and any(a.dtype.itemsize > 4 for a in arrays)   # float64 gradients travel as float64
        wire = xp.float64 if wide else xp.float32
        flat = xp.concatenate([a.reshape(-1).astype(wire, copy=False) for a in arrays])   # one copy
        out, nbytes = self._ordered_mean_flat(flat) if exact else self._native_mean_fp32_flat(flat)
        return self._unflatten(names, arrays, out, nbytes)

    def _unflatten(self, names, arrays, out, nbytes):
        mean, off = {}, 0
        for k, a in zip(names, arrays):
            mean[k] = out[off:off + a.size].reshape(a.shape)
            off += a.size
        self.totals += nbytes
        return mean, nbytes

    def _ordered_mean_flat(self, flat):
        """Reduce-scatter with ordered per-chunk sums + Allgatherv; see the module docstring."""
        MPI, n, r = self.MPI, self.size, self.rank
        xp = _xp_of(flat)
        mtype = MPI.DOUBLE if flat.dtype == np.float64 else MPI.FLOAT
        out = xp.empty(flat.size, dtype=xp.float32)
        nbytes = CommBytes()
        step = max(n, self.bucket_bytes // flat.dtype.itemsize)
        for start in range(0, flat.size, step):
            seg = flat[start:start + step]
            m = seg.size
            bounds = [m * k // n for k in range(n + 1)]
            counts = [bounds[k + 1] - bounds[k] for k in range(n)]
            displs = bounds[:-1]
            own = counts[r]
            send = self.staging.wire(seg, "a2a-send")
            recv = self.staging.landing(n * own, seg.dtype, xp, "a2a-recv")
            self.staging.sync(xp)
            self.comm.Alltoallv([send, (counts, displs), mtype],
                                [recv, ([own] * n, [own * w for w in range(n)]), mtype])
            recv = self.staging.back(recv, xp)
            if xp is np:    # one fused pass over the n received chunks, same order and bits
                from tgsim.exchange._numba_mean import ordered_mean

                mine = ordered_mean(recv.reshape(n, own), n)
            else:
                mine = ordered_mean_flat([recv[w * own:(w + 1) * own] for w in range(n)], n)
            dest = out[start:start + m]
            res = dest if xp is np else self.staging.landing(m, np.float32, xp, "ag-recv")   # NumPy: straight into out
            send = self.staging.wire(mine, "ag-send")
            self.staging.sync(xp)
            self.comm.Allgatherv([send, MPI.FLOAT], [res, (counts, displs), MPI.FLOAT])
            if res is not dest:
                dest[...] = self.staging.back(res, xp)
            isz = seg.dtype.itemsize
            nbytes += CommBytes(isz * (m - own) + 4 * own * (n - 1), isz * own * (n - 1) + 4 * (m - own))
        return out, nbytes

    def _native_mean_fp32_flat(self, flat):
        """BENCHMARK ONLY: MPI Allreduce(SUM) of float32 (MPI's order) in place on the flat buffer, then
        one in-place float32 multiply by f32(1/N): the leanest fp32 baseline (two passes over the
        buffer besides MPI's own), so a codec is compared with a fast fp32 exchange. Its bits differ
        from the simulator's (MPI's summation order, float32 scaling)."""
        MPI, xp = self.MPI, _xp_of(flat)
        flat = flat if flat.dtype == xp.float32 else flat.astype(xp.float32)
        step = max(1, self.bucket_bytes // 4)
        for start in range(0, flat.size, step):
            view = flat[start:start + step]
            seg = self.staging.wire(view, "native")        # the view itself, or a pinned host copy of it
            self.staging.sync(xp)
            self.comm.Allreduce(MPI.IN_PLACE, [seg, MPI.FLOAT], op=MPI.SUM)
            if seg is not view:
                view[...] = self.staging.back(seg, xp)
        flat *= xp.float32(1.0 / self.size)
        b = ring_allreduce_bytes(4 * flat.size, self.size)
        return flat, CommBytes(b, b)

    # -- codecs ------------------------------------------------------------------------------------------
    def aggregate(self, codec, local_messages: Sequence, mode: str, shared: bool,
                  reternarize_key=None) -> tuple[dict, CommBytes]:
        """The mean over all ranks of their messages, by the strategy the codec's declared capabilities
        select (tgsim.codecs.base.CodecProperties: float_mean, sums_exactly, else the codec's own
        messages), with the simulator's bits."""
        if len(local_messages) != 1:
            raise ValueError(f"MPIExchange holds one worker per rank, got {len(local_messages)} local messages")
        if mode not in ("allreduce", "ps", "allgather", "sharded_ps"):
            raise ValueError(f"unknown exchange mode {mode!r}")
        props = codec.properties
        if props.float_mean:
            return self.mean_fp32(local_messages)
        if not props.sums_exactly:
            mean, nbytes = self._own_messages(codec, local_messages[0], mode)
        else:
            mean, nbytes = self._packed_codes(codec, local_messages[0], mode, shared, reternarize_key)
        nbytes += self._pending
        self._pending = CommBytes()
        self.totals += nbytes
        return mean, nbytes

    def _own_messages(self, codec, msg, mode: str) -> tuple[dict, CommBytes]:
        """A codec's own messages, exchanged whole: all-gather (every rank parses every message and
        aggregates) or a parameter server (rank 0 gathers, aggregates, broadcasts the float32 mean, or
        for combine = "majority" the vote packed 2 bits an element).
        A malformed message raises PeerPayloadError naming its sender on every rank."""
        n, root = self.size, 0
        buf = np.frombuffer(msg.to_bytes(), dtype=np.uint8)
        if mode == "allgather":
            sizes = self.comm.allgather(int(buf.size))
            recv = np.empty(sum(sizes), dtype=np.uint8)
            self.comm.Allgatherv(buf, [recv, sizes])
            mean = self._parse_and_aggregate(codec, msg, recv, sizes)
        elif mode == "ps":
            sizes = self.comm.gather(int(buf.size), root=root)
            recv = np.empty(sum(sizes), dtype=np.uint8) if self.rank == root else None
            self.comm.Gatherv(buf, [recv, sizes] if self.rank == root else None, root=root)
            mean, error = None, None
            if self.rank == root:
                try:
                    mean = self._parse_and_aggregate(codec, msg, recv, sizes)
                except PeerPayloadError as e:
                    error = str(e)
            raise_if_server_failed(self.comm, error, root=root)
            like = codec.decode(msg)
            total = sum(int(v.size) for v in like.values())
            if codec.properties.combine == "majority":    # the vote in {-1, 0, +1}: 2 bits an element
                down = packing.pack(np.concatenate([mean[k].reshape(-1) for k in like]).astype(np.int8), "2bit") \
                    if self.rank == root else np.empty(packing.packed_size(total, "2bit"), dtype=np.uint8)
                self.comm.Bcast([down, self.MPI.BYTE], root=root)
                flat = packing.unpack(down, total, "2bit").astype(np.float32)
            else:
                flat = np.concatenate([mean[k].reshape(-1) for k in like]) if self.rank == root else \
                    np.empty(total, dtype=np.float32)
                self.comm.Bcast([flat, self.MPI.FLOAT], root=root)
            mean, off = {}, 0
            for k, v in like.items():
                mean[k] = flat[off:off + v.size].reshape(v.shape)
                off += v.size
        else:
            raise ValueError(f"mode {mode!r} needs a codec whose codes sum exactly ({codec.name} sends whole messages)")
        if mode == "ps" and self.rank == root:     # the server: N-1 messages in, N-1 answers out
            return mean, CommBytes((n - 1) * own_downlink_bytes(mean, codec.properties.combine), sum(sizes) - buf.size)
        return mean, own_wire_bytes(buf.size, mean, mode, n, codec.properties.combine)

    def _parse_and_aggregate(self, codec, msg, recv: np.ndarray, sizes: Sequence[int]) -> dict:
        """codec.aggregate of the messages in `recv` (rank order), each parsed against `msg`."""
        msgs, off = [], 0
        for sender, size in enumerate(sizes):
            try:
                msgs.append(codec.from_bytes(recv[off:off + size], msg))
            except PayloadError as e:
                raise PeerPayloadError(f"rank {self.rank} received a malformed message from rank {sender}: {e}") from e
            off += size
        return codec.aggregate(msgs, divide_by=self.size)

    def _packed_codes(self, codec, msg: Message, mode: str, shared: bool, reternarize_key=None):
        """tgsim's packed-code messages ("tgm1"): integer sums, the bit-packed downlink, pipelining."""
        # pipelined where defers_encode says so, for NumPy buffers (CuPy takes the whole-message path)
        piped = self.defers_encode(mode, shared, reternarize_key is not None) and \
            all(isinstance(p, np.ndarray) for p in msg.parts)
        if mode == "sharded_ps" and self.chunk >= 0 and all(isinstance(p, np.ndarray) for p in msg.parts):
            mean, nbytes = self._sharded_pipelined(codec, msg, shared, reternarize_key)
        elif mode == "sharded_ps":
            mean, nbytes = self._sharded(codec, msg, shared, reternarize_key)
        elif mode == "ps" and piped:
            mean, nbytes = self._ps_pipelined(codec, msg)
        elif mode == "ps":
            mean, nbytes = self._ps(codec, msg, shared, reternarize_key)
        else:
            if piped:
                mean, nbytes = self._allgather_pipelined(codec, msg, shared)
            elif mode == "allgather" or not shared:
                mean, nbytes = self._allgather(codec, msg, shared)
            else:
                mean, nbytes = self._allreduce_codes(codec, msg)
            if reternarize_key is not None:   # (the config allows it with ps only) as inprocess: every
                plain = codec.downlink_codec()    # rank holds the same mean and ternarizes it the same way
                mean = plain.decode(plain.encode(mean, reternarize_key))
        return mean, nbytes

    def _serialize(self, msg: Message) -> bytes:
        """The bytes this rank puts on the wire for `msg` (a seam for fault-injection tests)."""
        return msg.to_bytes()

    def _slot(self, msg: Message) -> np.ndarray:
        """[u64 true length | payload, padded or cut to the layout's wire size]."""
        payload = self._serialize(msg)
        wire = msg.wire_bytes
        slot = np.zeros(_HDR + wire, dtype=np.uint8)
        slot[:_HDR] = np.array([len(payload)], dtype=_U64).view(np.uint8)
        body = np.frombuffer(payload, dtype=np.uint8)[:wire]
        slot[_HDR:_HDR + body.size] = body
        return slot

    def _allgather(self, codec, msg: Message, shared: bool):
        n = self.size
        slot = self._slot(msg)
        slots = np.empty((n, slot.size), dtype=np.uint8)
        self.comm.Allgather([slot, self.MPI.BYTE], [slots, self.MPI.BYTE])
        where = f"rank {self.rank}"
        msgs = [parse_slot(slots[r], msg.layout, r, where) for r in range(n)]
        if shared:
            check_scalers(msgs, msgs[0], where)     # rank 0's as the reference: every rank names the same sender
        xp = _xp_of(msg.parts[0]) if msg.parts else np
        msgs = [message_to(m, xp) for m in msgs]
        try:
            mean = codec.aggregate(msgs, divide_by=n)
        except ValueError as e:
            raise blame_codes(codec, msgs, where, e) from e
        return mean, CommBytes((n - 1) * slot.size, (n - 1) * slot.size)

    def _ps(self, codec, msg: Message, shared: bool, reternarize_key):
        n, root = self.size, 0
        slot = self._slot(msg)
        slots = np.empty((n, slot.size), dtype=np.uint8) if self.rank == root else None
        self._ps_gather(slot, slots, root)
        down_size = ps_downlink_size(msg.layout, n, shared, reternarize_key is not None)
        buf = np.zeros(_HDR + down_size, dtype=np.uint8)
        error = None
        xp = _xp_of(msg.parts[0]) if msg.parts else np
        if self.rank == root:
            try:
                msgs = [parse_slot(slots[r], msg.layout, r, SERVER) for r in range(n)]
                if shared:
                    check_scalers(msgs, msg, SERVER)
                msgs = [message_to(m, xp) for m in msgs]
                try:
                    down = ps_downlink(codec, msgs, shared, reternarize_key)
                except PeerPayloadError:
                    raise
                except ValueError as e:
                    raise blame_codes(codec, msgs, SERVER, e) from e
                if down.size != down_size:
                    raise RuntimeError(f"downlink is {down.size} bytes, expected {down_size}")
                buf[_HDR:] = down
            except Exception as e:  # noqa: BLE001  (every rank must learn about it, or they would wait)
                status, error = server_failure(e)
                write_status(buf, status)
        self._ps_bcast(buf, root)
        status = read_status(buf)
        if status != STATUS_OK:
            raise_server_failure(self.comm, status, error, root=root)
        try:
            mean = ps_decode(codec, msg.layout, buf[_HDR:], n, shared, reternarize_key is not None, xp)
        except ValueError as e:
            raise malformed_downlink(self.rank, e) from e
        if self.rank == root:
            nbytes = CommBytes((n - 1) * buf.size, (n - 1) * slot.size)
        else:
            nbytes = CommBytes(slot.size, buf.size)
        return mean, nbytes

    def _ps_gather(self, slot: np.ndarray, slots: np.ndarray | None, root: int) -> None:
        """slots[r] <- rank r's slot on the server (all slots have one size: the layout fixes it)."""
        MPI = self.MPI
        if self.ps_transport == "collective":
            self.comm.Gather([slot, MPI.BYTE], [slots, MPI.BYTE] if slots is not None else None, root=root)
        elif self.rank == root:
            slots[root] = slot
            for r in range(self.size):
                if r != root:
                    self.comm.Recv([slots[r], MPI.BYTE], source=r, tag=_TAG_PS_UP)
        else:
            self.comm.Send([slot, MPI.BYTE], dest=root, tag=_TAG_PS_UP)

    def _ps_bcast(self, buf: np.ndarray, root: int) -> None:
        """The server's downlink buffer to every worker (in place on the workers)."""
        MPI = self.MPI
        if self.ps_transport == "collective":
            self.comm.Bcast([buf, MPI.BYTE], root=root)
        elif self.rank == root:
            for r in range(self.size):
                if r != root:
                    self.comm.Send([buf, MPI.BYTE], dest=r, tag=_TAG_PS_DOWN)
        else:
            self.comm.Recv([buf, MPI.BYTE], source=root, tag=_TAG_PS_DOWN)

    def _allreduce_codes(self, codec, msg: Message):
        MPI, n = self.MPI, self.size
        dtype = code_dtype(n)
        mtype = MPI.INT8_T if dtype == np.int8 else MPI.INT16_T
        xp = _xp_of(msg.parts[0]) if msg.parts else np
        codes = sharded.ternary_codes(codec, msg, dtype, xp)
        total = codes.size
        step = max(1, self.bucket_bytes // codes.itemsize)
        for start in range(0, total, step):
            seg = self.staging.wire(xp.ascontiguousarray(codes[start:start + step]), "codes")
            self.staging.sync(xp)
            self.comm.Allreduce(MPI.IN_PLACE, [seg, mtype], op=MPI.SUM)
            codes[start:start + seg.size] = self.staging.back(seg, xp)
        b = ring_allreduce_bytes(codes.nbytes, n)
        nbytes = CommBytes(b, b)
        if total and xp is not np and int(xp.abs(codes.astype(xp.int32)).max()) > n:
            raise beyond_n(self.rank, n)     # before the collectives of the float layers' mean
        fmean, fb = self._float_layers_mean(msg, xp)
        nbytes += fb
        try:    # checks |Σ codes| <= N and scales (NumPy: one Numba pass)
            mean = sharded.decode_codes(codec.kernels_for(xp), msg.layout, codes, n, msg.scalers, fmean, xp)
        except PayloadError:
            raise beyond_n(self.rank, n) from None
        return mean, nbytes

    def _float_layers_mean(self, msg: Message, xp):
        """The float layers' mean (concatenated, float32 on the wire) and its bytes; (None, 0) without any."""
        flt = [p for s, p in zip(msg.layout.layers, msg.parts) if s.kind != KIND_TERNARY]
        if not flt:
            return None, CommBytes()
        fl = xp.concatenate([p.reshape(-1).astype(xp.float32) for p in flt])
        return self._ordered_mean_flat(fl) if self.exact else self._native_mean_fp32_flat(fl)

    def _shard_blocks(self, codes: np.ndarray, plan) -> np.ndarray:
        """The Alltoallv buffer this rank sends in sharded_ps (a seam for fault-injection tests)."""
        return sharded.uplink_blocks(codes, plan)

    def _sharded(self, codec, msg: Message, shared: bool, reternarize_key=None):
        """The sharded parameter server (tgsim/exchange/sharded.py): shard r's packed codes to rank r
        (Alltoallv), each owner's exact sums packed at ceil(log2(2N+1)) bits to all (Allgatherv)."""
        why = sharded.refusal(shared, reternarize_key is not None)
        if why is not None:
            raise ValueError(why)
        MPI, n, r = self.MPI, self.size, self.rank
        xp = _xp_of(msg.parts[0]) if msg.parts else np
        codes = to_numpy(sharded.ternary_codes(codec, msg, np.int8, xp))
        plan = sharded.shard_plan(codes.size, n, codec.packing)
        sums = codes
        if plan.total:
            send = self._shard_blocks(codes, plan)
            recv = np.empty(n * plan.up[r], dtype=np.uint8)
            self.comm.Alltoallv([send, (list(plan.up), list(plan.send_at)), MPI.BYTE],
                                [recv, ([plan.up[r]] * n, [plan.up[r] * s for s in range(n)]), MPI.BYTE])
            mine, error = sharded.owner_block(codec.kernels_for(np), recv, plan, r)
            got = np.empty(sum(plan.down), dtype=np.uint8)
            self.comm.Allgatherv([mine, MPI.BYTE], [got, (list(plan.down), list(plan.down_at)), MPI.BYTE])
            failed = sharded.first_failure(got, plan)
            if failed is not None:      # every rank: the lowest failed owner's error, broadcast by it
                raise_server_failure(self.comm, failed[1], error, root=failed[0])
            sums = sharded.gathered_sums(got, plan, r)
        fmean, nbytes = self._float_layers_mean(msg, xp)
        try:
            mean = sharded.decode_codes(codec.kernels_for(np), msg.layout, sums, n, msg.scalers,
                                        None if fmean is None else to_numpy(fmean))
        except PayloadError as e:      # (gathered_sums has checked |Σ codes| <= N: every rank alike)
            raise PeerPayloadError(f"rank {r} could not decode the sharded code sums: {e}") from e
        nbytes += plan.code_bytes(r)
        return (mean if xp is np else {k: xp.asarray(v) for k, v in mean.items()}), nbytes


__all__ = ["CollectiveError", "MPIExchange", "PeerPayloadError", "RankConfigMismatchError", "ServerError", "cuda_aware",
           "node_local_rank", "ps_base_downlink", "ps_decode", "ps_decode_base", "ps_downlink", "ps_downlink_size",
           "select_gpu"]
