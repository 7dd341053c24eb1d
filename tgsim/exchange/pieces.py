"""Pipelined exchanges: a message cut into pieces, so wire, sums and decode overlap.

An exchange that waits for whole payloads before it computes anything leaves the link idle while
the CPU works and the CPU idle while the link works; a parameter server that receives every whole
payload before it sends anything back keeps each worker's link busy for up + down. Cut into K
pieces, piece k is summed (and, at the server, sent back) while piece k+1 is still on the wire, so
a full-duplex link (a switch port) is busy for about max(up, down) plus one piece. The bits are
those of the whole-message exchange (`mpi.ps_downlink` / `mpi.ps_decode_base` with shared
scalers; the codec's `aggregate` for the all-gather): the pieces are byte ranges of the same buffers.

    slot      [u64 length | message header | per layer: (f32 scaler | 2-bit/base-3 codes) or f32 values]
    downlink  per layer: (f32 scaler | (Σ codes + N) at w = ceil(log2(2N+1)) bits) or f32 mean

`PiecePlan(layout, n, chunk)` cuts the layers, in order, into pieces of about `chunk` elements
(layers are not split at element offsets that are not multiples of 40 = lcm(4, 5, 8), so each piece
starts on a byte of the 2-bit (4 codes per byte) and base-3 (5 per byte) codes and of the w-bit
downlink (8 values per w bytes)); piece k is the byte range `up[k]` of every slot and `down[k]` of
the downlink. Piece 0's uplink carries the length word and the header. The plan is a pure function
of (layout, N, chunk), so every rank computes the same one.

The functions that read slots take `rows`: uint8 (N, bytes), row r = bytes [base, base + bytes) of
rank r's slot (the server's whole slots with base 0, or one piece of the all-gather with base
up[k][0]).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tgsim.codecs import packing
from tgsim.codecs.message import KIND_TERNARY, Layout, check_header
from tgsim.errors import PayloadError

ALIGN = 40            # lcm(4, 5, 8): element offsets where every packing starts on a byte
HDR = 8               # the slot's u64 length word and the downlink's status word


class SenderError(PayloadError):
    """A worker's payload is malformed: `sender` is its rank."""

    def __init__(self, sender: int, text: str):
        super().__init__(text)
        self.sender = sender


@dataclass(frozen=True)
class Piece:
    ranges: tuple[tuple[int, int, int], ...]     # (layer index, first element, end element)
    up: tuple[int, int]                          # byte range in every slot
    down: tuple[int, int]                        # byte range in the downlink


class PiecePlan:
    """The pieces of one (layout, N, chunk); see the module docstring."""

    def __init__(self, layout: Layout, n: int, chunk: int):
        self.layout, self.n = layout, int(n)
        self.width = packing.uint_width(self.n)
        self.per_byte = packing.CODES_PER_BYTE[layout.packing]
        self.header = len(layout.header_bytes())
        up_base, down_base = [], []
        u, d = HDR + self.header, 0
        for s in layout.layers:
            up_base.append(u)
            down_base.append(d)
            u += s.body_bytes(layout.packing)
            d += 4 + -(-s.size * self.width // 8) if s.kind == KIND_TERNARY else 4 * s.size
        self.up_base, self.down_base = up_base, down_base
        self.slot_bytes, self.down_bytes = u, d
        total = sum(s.size for s in layout.layers)
        chunk = (total // ALIGN + 2) * ALIGN if chunk <= 0 else max(ALIGN, int(chunk) // ALIGN * ALIGN)
        groups = self._cut(chunk)
        ups = [0] + [self.up_pos(*g[0][:2]) for g in groups[1:]] + [self.slot_bytes]
        downs = [0] + [self.down_pos(*g[0][:2]) for g in groups[1:]] + [self.down_bytes]
        self.pieces = tuple(Piece(tuple(g), (ups[k], ups[k + 1]), (downs[k], downs[k + 1]))
                            for k, g in enumerate(groups))

    def _cut(self, chunk: int) -> list[list[tuple[int, int, int]]]:
        groups, cur, room = [], [], chunk
        for i, s in enumerate(self.layout.layers):
            e = 0
            while True:
                take = min(s.size - e, room)
                if e + take < s.size:
                    take -= take % ALIGN          # room >= ALIGN here, so take >= ALIGN
                cur.append((i, e, e + take))
                e += take
                room -= take
                if room < ALIGN:
                    groups.append(cur)
                    cur, room = [], chunk
                if e >= s.size:
                    break
        if cur or not groups:
            groups.append(cur)
        return groups

    def up_pos(self, i: int, e: int) -> int:
        """Slot offset of layer i's element e (its scaler's offset for e = 0)."""
        s = self.layout.layers[i]
        if e == 0:
            return self.up_base[i]
        return self.up_base[i] + (4 + e // self.per_byte if s.kind == KIND_TERNARY else 4 * e)

    def down_pos(self, i: int, e: int) -> int:
        """Downlink offset of layer i's element e (its scaler's offset for e = 0)."""
        s = self.layout.layers[i]
        if e == 0:
            return self.down_base[i]
        return self.down_base[i] + (4 + e * self.width // 8 if s.kind == KIND_TERNARY else 4 * e)

    # -- writing this rank's slot ---------------------------------------------------------------------
    def fill_slot(self, k: int, msg, slot: np.ndarray) -> None:
        """Piece k of `msg`'s slot into slot[up[k]] (piece 0 with the length word and the header),
        encoding only that piece's codes (`DeferredMessage.write_range`)."""
        if k == 0:
            slot[:HDR] = np.array([self.slot_bytes - HDR], dtype=np.dtype("<u8")).view(np.uint8)
            slot[HDR:HDR + self.header] = np.frombuffer(self.layout.header_bytes(), dtype=np.uint8)
        for i, e0, e1 in self.pieces[k].ranges:
            spec = self.layout.layers[i]
            at = self.up_pos(i, e0)
            if spec.kind == KIND_TERNARY:
                if e0 == 0:
                    slot[at:at + 4] = np.float32(msg.scalers[i]).reshape(1).view(np.uint8)
                    at += 4
                nb = packing.packed_size(e1 - e0, self.layout.packing)
            else:
                nb = 4 * (e1 - e0)
            msg.write_range(i, e0, e1, slot[at:at + nb])

    # -- reading the workers' slots ------------------------------------------------------------------
    def check_headers(self, rows: np.ndarray) -> None:
        """Every slot's length word and header (piece 0, base 0) against the layout (SenderError)."""
        wire = self.slot_bytes - HDR
        mine = np.frombuffer(self.layout.header_bytes(), dtype=np.uint8)
        for r in range(rows.shape[0]):
            length = int(rows[r, :HDR].view(np.dtype("<u8"))[0])
            if length != wire:
                raise SenderError(r, f"it is {length} bytes, the model's layout needs {wire}")
            head = rows[r, HDR:HDR + self.header]
            if not np.array_equal(head, mine):
                try:
                    check_header(memoryview(head), self.layout, body=self.layout.body_bytes())
                except ValueError as e:
                    raise SenderError(r, str(e)) from e
                raise SenderError(r, "message header differs from the receiver's model")

    def _layer_parts(self, k: int, rows: np.ndarray, base: int, scalers: np.ndarray, shared):
        """Yield (layer i, e0, e1, rows of its codes or float32 values) of piece k. At a ternary
        layer's first element, scalers[i] <- the N senders' scalers, checked (finite, >= 0, and, unless
        shared is None, equal to rank 0's: every rank checks against the same reference, so all name
        the same sender): SenderError names the first bad one."""
        for i, e0, e1 in self.pieces[k].ranges:
            spec = self.layout.layers[i]
            lo = self.up_pos(i, e0) - base
            if spec.kind != KIND_TERNARY:
                yield i, e0, e1, np.ascontiguousarray(rows[:, lo:lo + 4 * (e1 - e0)]).view(np.float32)
                continue
            if e0 == 0:
                got = np.ascontiguousarray(rows[:, lo:lo + 4]).view(np.float32)[:, 0]
                for r, s in enumerate(got):
                    if not (np.isfinite(s) and s >= 0):
                        raise SenderError(r, f"layer {spec.name!r}: invalid scaler {s}")
                    if shared is not None and s != got[0]:
                        raise SenderError(r, f"layer {spec.name!r} has scaler {s}, the shared scaler is {got[0]}")
                scalers[i] = got
                lo += 4
            yield i, e0, e1, rows[:, lo:lo + packing.packed_size(e1 - e0, self.layout.packing)]

    def _blame(self, codes: np.ndarray, i: int, e0: int, e1: int, err: Exception) -> ValueError:
        """After a kernel rejected layer i's codes of elements [e0, e1): the first rank whose are invalid."""
        name, fmt = self.layout.layers[i].name, self.layout.packing
        for r in range(codes.shape[0]):
            try:
                packing.check_payload(codes[r], e1 - e0, fmt, where=f"layer {name!r}", first=e0)
            except ValueError as e:
                return SenderError(r, str(e))
        return ValueError(f"could not decode the codes of layer {name!r}: {err}")

    def downlink(self, k: int, rows: np.ndarray, base: int, shared: np.ndarray, kern, out: np.ndarray) -> None:
        """The server: piece k of the downlink into `out` (its bytes) from the N slots' `rows`.

        Ternary layers: f32(shared scaler) then pack(Σ_w codes_w + N) at w bits; float layers: the
        ordered float64 mean (`mpi.ps_base_downlink`'s bytes). SenderError names a malformed slot."""
        from tgsim.exchange._numba_mean import ordered_mean

        n, piece = self.n, self.pieces[k]
        seen = np.zeros((len(self.layout.layers), n), dtype=np.float32)
        for i, e0, e1, part in self._layer_parts(k, rows, base, seen, shared):
            at = self.down_pos(i, e0) - piece.down[0]
            if part.dtype == np.float32:
                out[at:at + 4 * (e1 - e0)] = ordered_mean(part, n).view(np.uint8)
                continue
            if e0 == 0:
                out[at:at + 4] = np.float32(shared[i]).reshape(1).view(np.uint8)
                at += 4
            try:
                intsum = kern.sum_codes(part, e1 - e0, self.layout.packing)   # int8 up to 127 ranks
            except ValueError as e:
                raise self._blame(part, i, e0, e1, e) from e
            payload = packing.pack_code_sums(intsum, n, self.width)
            out[at:at + payload.size] = payload

    def aggregate(self, k: int, rows: np.ndarray, base: int, scalers: np.ndarray, flat: list[np.ndarray],
                  kern, shared=None) -> None:
        """The all-gather: flat[i][e0:e1] <- (Σ_w s_w codes_w) / N of piece k (the codec's `aggregate`
        bits: float64 over the senders in rank order), float layers the ordered mean. scalers: (L, N),
        filled at each layer's first piece; shared: the scalers every sender must carry, or None."""
        from tgsim.exchange._numba_mean import ordered_mean

        n = self.n
        for i, e0, e1, part in self._layer_parts(k, rows, base, scalers, shared):
            if part.dtype == np.float32:
                flat[i][e0:e1] = ordered_mean(part, n)
                continue
            try:
                if getattr(kern, "WEIGHTED_SUM_INTO_OUT", False):   # straight into the output (no fresh array)
                    kern.weighted_sum(part, scalers[i], e1 - e0, self.layout.packing, n, out=flat[i][e0:e1])
                else:
                    flat[i][e0:e1] = kern.weighted_sum(part, scalers[i], e1 - e0, self.layout.packing, n)
            except ValueError as e:
                raise self._blame(part, i, e0, e1, e) from e

    # -- every rank --------------------------------------------------------------------------------------
    def empty_mean(self) -> list[np.ndarray]:
        """Flat float32 outputs, one per layer, for `decode` to fill."""
        return [np.empty(s.size, dtype=np.float32) for s in self.layout.layers]

    def decode(self, k: int, buf: np.ndarray, flat: list[np.ndarray], scalers: np.ndarray) -> None:
        """Fill flat[i][e0:e1] from piece k's downlink bytes `buf` (mpi.ps_decode_base's bits);
        `scalers[i]` is layer i's downlink scaler, read at its first piece. ValueError if malformed."""
        n, piece = self.n, self.pieces[k]
        if buf.size != piece.down[1] - piece.down[0]:
            raise ValueError(f"downlink piece {k} is {buf.size} bytes, the plan needs {piece.down[1] - piece.down[0]}")
        for i, e0, e1 in piece.ranges:
            spec = self.layout.layers[i]
            at = self.down_pos(i, e0) - piece.down[0]
            if spec.kind != KIND_TERNARY:
                flat[i][e0:e1] = buf[at:at + 4 * (e1 - e0)].view(np.float32)
                continue
            if e0 == 0:
                s = float(buf[at:at + 4].copy().view(np.float32)[0])
                if not (np.isfinite(s) and s >= 0):
                    raise ValueError(f"layer {spec.name!r}: invalid scaler {s} in the downlink")
                scalers[i] = s
                at += 4
            nb = -(-(e1 - e0) * self.width // 8)
            packing.unpack_code_sums(buf[at:at + nb], e1 - e0, self.width, n, float(scalers[i]), out=flat[i][e0:e1],
                                     name=spec.name)


__all__ = ["ALIGN", "PiecePlan", "Piece", "SenderError"]
