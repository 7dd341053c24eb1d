"""The pipelined exchanges of packed-code messages over MPI: the message in pieces (tgsim/exchange/pieces.py).

Each piece is encoded just before it is sent (a `DeferredMessage`), and summed or decoded while the
later pieces are on the wire; the bits are those of the whole-message exchange. A mixin of
`MPIExchange` (tgsim/exchange/mpi.py), which provides comm, rank, size, chunk, ps_transport and
the slot helpers `_slot` / `_plans`. Errors are raised on every rank alike, by the rules of
tgsim/exchange/mpi_errors.py (each downlink piece carries the status word).
"""

from __future__ import annotations

import numpy as np

from tgsim.codecs.message import Layout, Message
from tgsim.exchange.base import CommBytes
from tgsim.exchange.mpi_errors import (SERVER, STATUS_OK, malformed, malformed_downlink, raise_server_failure,
                                       read_status, server_failure, write_status)
from tgsim.exchange.mpi_transport import _HDR, _TAG_AG, _TAG_PS_DOWN, _TAG_PS_UP
from tgsim.exchange.pieces import PiecePlan, SenderError


class PipelinedModes:
    """`defers_encode`, the pipelined all-gather and the pipelined parameter server."""

    def defers_encode(self, mode: str, shared: bool, reternarize: bool) -> bool:
        """True where this exchange takes a NumPy message in pieces (`aggregate` dispatches on it), so
        a `DeferredMessage` (codec.encode_many(deferred=True)) is encoded piece by piece while
        earlier pieces are on the wire; elsewhere a deferred message is encoded whole on this
        thread, so the caller should not ask for one. Never for "sharded_ps" (not pipelined: every rank
        unpacks its whole message's codes before the one Alltoallv)."""
        if self.chunk < 0 or mode == "sharded_ps":
            return False
        if mode == "ps":
            return shared and not reternarize and self.ps_transport == "p2p"
        return mode == "allgather" or (mode == "allreduce" and not shared)

    def _plan(self, layout: Layout) -> PiecePlan:
        key = (layout, self.size, self.chunk)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = PiecePlan(layout, self.size, self.chunk)
        return plan

    def _allgather_pipelined(self, codec, msg: Message, shared: bool):
        """The all-gather in pieces (`pieces`): every piece of this rank's slot Isent to every other
        rank and Irecvs for theirs, all posted at once, into a piece-major buffer (piece k: N rows of
        its bytes); every rank sums piece k (`PiecePlan.aggregate`, the codec's aggregate bits) while
        later pieces are on the wire. All ranks parse the same bytes, so a malformed payload raises
        the same error on every rank, after every piece has arrived."""
        MPI, n = self.MPI, self.size
        plan = self._plan(msg.layout)
        deferred = hasattr(msg, "write_range")          # encode each piece just before it is sent
        slot = np.empty(plan.slot_bytes, dtype=np.uint8) if deferred else self._slot(msg)
        got = np.empty(n * plan.slot_bytes, dtype=np.uint8)
        blocks = [got[n * p.up[0]:n * p.up[1]].reshape(n, p.up[1] - p.up[0]) for p in plan.pieces]
        peers = [r for r in range(n) if r != self.rank]
        reqs = [[self.comm.Irecv([rows[r], MPI.BYTE], source=r, tag=_TAG_AG) for r in peers] for rows in blocks]
        sends = []
        for k, p in enumerate(plan.pieces):
            if deferred:
                plan.fill_slot(k, msg, slot)
            blocks[k][self.rank] = slot[p.up[0]:p.up[1]]
            sends += [self.comm.Isend([slot[p.up[0]:p.up[1]], MPI.BYTE], dest=r, tag=_TAG_AG) for r in peers]
        flat = plan.empty_mean()
        scalers = np.zeros((len(msg.layout.layers), n), dtype=np.float32)
        kern = codec.kernels_for(np)
        error = None
        for k, p in enumerate(plan.pieces):
            self._waitall(reqs[k])
            if error is not None:
                continue
            try:
                if k == 0:
                    plan.check_headers(blocks[0])
                plan.aggregate(k, blocks[k], p.up[0], scalers, flat, kern, msg.scalers if shared else None)
            except SenderError as e:
                error = malformed(f"rank {self.rank}", e.sender, e)
        self._waitall(sends)
        if error is not None:
            raise error
        mean = {s.name: f.reshape(s.shape) for s, f in zip(msg.layout.layers, flat)}
        return mean, CommBytes((n - 1) * slot.size, (n - 1) * slot.size)

    def _ps_pipelined(self, codec, msg: Message):
        """The parameter server in pieces (`pieces`): every worker Isends its slot's pieces and has
        Irecvs posted for the downlink's; the server sums and sends piece k as soon as piece k has
        arrived from every worker, and every rank decodes piece k while later pieces are on the wire.
        Downlink piece k on the wire: [u64 status | piece bytes]. After an error the server still
        receives every piece and sends every piece, marked with the error status, then broadcasts the
        text: every rank raises the same error, and the communicator stays in step."""
        MPI, n, root = self.MPI, self.size, 0
        plan = self._plan(msg.layout)
        pieces = plan.pieces
        deferred = hasattr(msg, "write_range")          # encode each piece just before it is sent
        slot = np.empty(plan.slot_bytes, dtype=np.uint8) if deferred else self._slot(msg)
        wire = np.zeros(_HDR * len(pieces) + plan.down_bytes, dtype=np.uint8)
        at = [_HDR * k + p.down[0] for k, p in enumerate(pieces)]      # status word of piece k
        ends = [_HDR * (k + 1) + p.down[1] for k, p in enumerate(pieces)]
        flat, scalers = plan.empty_mean(), np.zeros(len(msg.layout.layers), dtype=np.float32)
        error, status_seen, local_error = None, STATUS_OK, None
        if self.rank == root:
            slots = np.empty((n, slot.size), dtype=np.uint8)
            if not deferred:
                slots[root] = slot
            ups = [[self.comm.Irecv([slots[r, p.up[0]:p.up[1]], MPI.BYTE], source=r, tag=_TAG_PS_UP)
                    for r in range(n) if r != root] for p in pieces]
            sends = []
            kern = codec.kernels_for(np)
            for k in range(len(pieces)):
                if deferred and error is None:   # the server's own piece, while the workers' arrive
                    try:
                        plan.fill_slot(k, msg, slots[root])
                    except Exception as e:  # noqa: BLE001  (reported below, like any server failure)
                        status_seen, error = server_failure(e, SERVER)
                self._waitall(ups[k])
                status = status_seen
                if error is None:
                    try:
                        if k == 0:
                            plan.check_headers(slots)
                        plan.downlink(k, slots, 0, msg.scalers, kern, wire[at[k] + _HDR:ends[k]])
                        plan.decode(k, wire[at[k] + _HDR:ends[k]], flat, scalers)
                    except Exception as e:  # noqa: BLE001  (every rank must learn about it, or they would wait)
                        status_seen, error = server_failure(e, SERVER)
                    status = status_seen
                write_status(wire[at[k]:at[k] + _HDR], status)
                sends += [self.comm.Isend([wire[at[k]:ends[k]], MPI.BYTE], dest=r, tag=_TAG_PS_DOWN)
                          for r in range(n) if r != root]
            self._waitall(sends)
        else:
            downs = [self.comm.Irecv([wire[at[k]:ends[k]], MPI.BYTE], source=root, tag=_TAG_PS_DOWN)
                     for k in range(len(pieces))]
            sends = []
            for k, p in enumerate(pieces):
                if deferred:
                    plan.fill_slot(k, msg, slot)
                sends.append(self.comm.Isend([slot[p.up[0]:p.up[1]], MPI.BYTE], dest=root, tag=_TAG_PS_UP))
            for k in range(len(pieces)):
                self._waitall(downs[k:k + 1])
                status = read_status(wire[at[k]:at[k] + _HDR])
                if status != STATUS_OK:
                    status_seen = status
                elif status_seen == STATUS_OK and local_error is None:
                    try:
                        plan.decode(k, wire[at[k] + _HDR:ends[k]], flat, scalers)
                    except ValueError as e:
                        local_error = e
            self._waitall(sends)
        if status_seen != STATUS_OK:
            raise_server_failure(self.comm, status_seen, error, root=root)
        if local_error is not None:
            raise malformed_downlink(self.rank, local_error) from local_error
        mean = {s.name: f.reshape(s.shape) for s, f in zip(msg.layout.layers, flat)}
        if self.rank == root:
            return mean, CommBytes((n - 1) * wire.size, (n - 1) * slot.size)
        return mean, CommBytes(slot.size, wire.size)

    def _waitall(self, requests: list) -> None:
        """Wait for nonblocking transfers (a seam: the benchmark times the wire here)."""
        self.MPI.Request.Waitall(requests)
