"""The pipelined exchanges of packed-code messages over MPI: the message in pieces (tgsim/exchange/pieces.py),
or, in sharded_ps, each shard in pieces (tgsim/exchange/sharded.py, `ShardPieces`).

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
from tgsim.errors import PeerPayloadError
from tgsim.exchange import sharded
from tgsim.exchange.mpi_errors import (SERVER, STATUS_OK, malformed, malformed_downlink, raise_server_failure,
                                       read_status, server_failure, write_status)
from tgsim.exchange.mpi_transport import _HDR, _TAG_AG, _TAG_PS_DOWN, _TAG_PS_UP, _TAG_SHARD_DOWN, _TAG_SHARD_UP
from tgsim.exchange.pieces import PiecePlan, SenderError


class PipelinedModes:
    """`defers_encode`, the pipelined all-gather, parameter server and sharded parameter server."""

    def defers_encode(self, mode: str, shared: bool, reternarize: bool) -> bool:
        """True where this exchange takes a NumPy message in pieces (`aggregate` dispatches on it), so
        a `DeferredMessage` (codec.encode_many(deferred=True)) is encoded piece by piece while
        earlier pieces are on the wire; elsewhere a deferred message is encoded whole on this
        thread, so the caller should not ask for one. Never for "sharded_ps": it is pipelined in pieces
        of the shards (`_sharded_pipelined`), but every rank unpacks its whole message's codes first."""
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

    def _shard_piece(self, codes: np.ndarray, sp, s: int, k: int, out: np.ndarray) -> None:
        """Piece k of shard s of this rank's codes into `out`, as sent (a seam for fault-injection tests)."""
        sharded.fill_up_piece(codes, sp, s, k, out)

    def _sharded_pipelined(self, codec, msg: Message, shared: bool, reternarize_key=None):
        """The sharded parameter server in pieces (tgsim/exchange/sharded.py, pipelined): every rank
        posts its Irecvs (the N-1 senders' pieces of its shard, the N-1 owners' downlink pieces), then
        packs and Isends piece k of every other shard to its owner, k = 0, 1, ...; as owner it checks,
        sums and packs piece k of its shard once it has arrived from everyone, Isends it with its u64
        status word to the N-1 others, and every rank decodes sums piece k of every owner as it
        arrives. An owner that failed still receives and sends every piece (marked with its status):
        every request completes, then every rank raises the lowest failed owner's error. Bytes: those
        of the buffers posted (`ShardPieces.code_bytes`), plus the float layers' reduce-scatter."""
        why = sharded.refusal(shared, reternarize_key is not None)
        if why is not None:
            raise ValueError(why)
        MPI, n, r = self.MPI, self.size, self.rank
        layout = msg.layout
        codes = sharded.ternary_codes(codec, msg, np.int8, np)
        sp = sharded.shard_pieces(codes.size, n, codec.packing, self.chunk)
        spans = sharded.ternary_spans(layout)
        flat = {i: np.empty(layout.layers[i].size, dtype=np.float32) for i, _, _ in spans[1]}
        sent = received = 0
        failed: dict[int, int] = {}          # owner -> the first status other than STATUS_OK it sent
        error, local_error = None, None      # this owner's failure text; a downlink this rank cannot decode
        if sp.total:
            kern = codec.kernels_for(np)
            peers = [s for s in range(n) if s != r]
            pieces = [sp.pieces(s) for s in range(n)]
            rows = [np.empty((n, sp.up[r][k]), dtype=np.uint8) for k in range(pieces[r])]
            got = np.empty(sp.down_bytes, dtype=np.uint8)     # every owner's downlink pieces (own too)
            down = [[got[sp.down_at[s][k]:sp.down_at[s][k] + sp.down[s][k]] for k in range(pieces[s])]
                    for s in range(n)]
            ups = [[self.comm.Irecv([rows[k][s], MPI.BYTE], source=s, tag=_TAG_SHARD_UP) for s in peers]
                   for k in range(pieces[r])]
            downs = {s: [self.comm.Irecv([down[s][k], MPI.BYTE], source=s, tag=_TAG_SHARD_DOWN)
                         for k in range(pieces[s])] for s in peers}
            received = (n - 1) * sum(sp.up[r]) + sum(sum(sp.down[s]) for s in peers)
            send = np.empty(sp.up_bytes, dtype=np.uint8)
            sends = []
            for k in range(max(pieces)):
                for s in range(n):
                    if k >= pieces[s]:
                        continue
                    if s == r:                  # its own codes: straight into its row of the owner's piece
                        self._shard_piece(codes, sp, s, k, rows[k][r])
                        continue
                    piece = send[sp.up_at[s][k]:sp.up_at[s][k] + sp.up[s][k]]
                    self._shard_piece(codes, sp, s, k, piece)
                    sends.append(self.comm.Isend([piece, MPI.BYTE], dest=s, tag=_TAG_SHARD_UP))
                    sent += piece.size

            def decode(s: int, k: int) -> None:
                nonlocal local_error
                buf = down[s][k]
                status = read_status(buf)
                if status != STATUS_OK:
                    failed.setdefault(s, status)
                if failed or local_error is not None:      # the exchange fails: decode no further
                    return
                try:
                    sums = sharded.piece_sums(buf[_HDR:], sp, s, k, r)
                    sharded.scale_piece(sums, sp.piece(s, k)[0], spans, n, msg.scalers, flat)
                except PeerPayloadError as e:
                    local_error = e

            status_mine = STATUS_OK
            for k in range(max(pieces)):
                if k < pieces[r]:               # the owner's piece k: sum, pack, send, decode
                    self._waitall(ups[k])
                    out = down[r][k]
                    if status_mine == STATUS_OK:
                        text = sharded.owner_piece(kern, rows[k], sp, r, k, out)
                        if text is not None:
                            status_mine, error = read_status(out), text
                    else:
                        out[:] = 0
                        write_status(out, status_mine)
                    sends += [self.comm.Isend([out, MPI.BYTE], dest=s, tag=_TAG_SHARD_DOWN) for s in peers]
                    sent += (n - 1) * out.size
                    decode(r, k)
                for s in peers:                 # the other owners' piece k, as it arrives
                    if k < pieces[s]:
                        self._waitall(downs[s][k:k + 1])
                        decode(s, k)
            self._waitall(sends)
        if failed:                              # every rank: the lowest failed owner's error, broadcast by it
            root = min(failed)
            raise_server_failure(self.comm, failed[root], error if root == r else None, root=root)
        if local_error is not None:
            raise local_error
        fmean, nbytes = self._float_layers_mean(msg, np)
        mean, foff = {}, 0
        for i, spec in enumerate(layout.layers):
            if i in flat:
                mean[spec.name] = flat[i].reshape(spec.shape)
            else:
                mean[spec.name] = fmean[foff:foff + spec.size].reshape(spec.shape)
                foff += spec.size
        nbytes += CommBytes(sent, received)
        return mean, nbytes

    def _waitall(self, requests: list) -> None:
        """Wait for nonblocking transfers (a seam: the benchmark times the wire here)."""
        self.MPI.Request.Waitall(requests)
