"""The parameter server's exchange cut into pieces, so uplink, server sum, downlink and decode overlap.

A parameter server that waits for every whole payload before it sends anything back keeps each
worker's link busy for up + down; cut into K pieces, piece k's downlink leaves while piece k+1's
uplink is still arriving, and a full-duplex link (a switch port) is busy for about max(up, down)
plus one piece. The bits are those of the whole-message exchange (`mpi.ps_downlink`,
`mpi.ps_decode_base`, shared scalers): the pieces are byte ranges of the same two buffers.

    slot      [u64 length | message header | per layer: (f32 scaler | 2-bit/base-3 codes) or f32 values]
    downlink  per layer: (f32 scaler | (Σ codes + N) at w = ceil(log2(2N+1)) bits) or f32 mean

`PSPlan(layout, n, chunk)` cuts the layers, in order, into pieces of about `chunk` elements (layers
are not split at element offsets that are not multiples of 40 = lcm(4, 5, 8), so each piece starts
on a byte of the 2-bit (4 codes per byte) and base-3 (5 per byte) codes and of the w-bit downlink
(8 values per w bytes)); piece k is the byte range `up[k]` of every slot and `down[k]` of the
downlink. Piece 0's uplink carries the length word and the header. The plan is a pure function of
(layout, N, chunk), so every rank computes the same one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tgsim.codecs import packing
from tgsim.codecs.message import KIND_TERNARY, Layout, check_header

ALIGN = 40            # lcm(4, 5, 8): element offsets where every packing starts on a byte
HDR = 8               # the slot's u64 length word (mpi._HDR)


class SenderError(ValueError):
    """A worker's payload is malformed: `sender` is its rank."""

    def __init__(self, sender: int, text: str):
        super().__init__(text)
        self.sender = sender


@dataclass(frozen=True)
class Piece:
    ranges: tuple[tuple[int, int, int], ...]     # (layer index, first element, end element)
    up: tuple[int, int]                          # byte range in every slot
    down: tuple[int, int]                        # byte range in the downlink


class PSPlan:
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

    # -- the server ------------------------------------------------------------------------------------
    def check_headers(self, slots: np.ndarray) -> None:
        """Every slot's length word and header (piece 0) against the layout (SenderError)."""
        wire = self.slot_bytes - HDR
        mine = np.frombuffer(self.layout.header_bytes(), dtype=np.uint8)
        for r in range(slots.shape[0]):
            length = int(slots[r, :HDR].view(np.dtype("<u8"))[0])
            if length != wire:
                raise SenderError(r, f"it is {length} bytes, the model's layout needs {wire}")
            head = slots[r, HDR:HDR + self.header]
            if not np.array_equal(head, mine):
                try:
                    check_header(memoryview(head), self.layout, body=self.layout.body_bytes())
                except ValueError as e:
                    raise SenderError(r, str(e)) from e
                raise SenderError(r, "message header differs from the receiver's model")

    def downlink(self, k: int, slots: np.ndarray, scalers: np.ndarray, kern, out: np.ndarray) -> None:
        """Piece k of the downlink into `out` (its bytes) from the N slots (rows in rank order).

        Ternary layers: f32(shared scaler) then pack(Σ_w codes_w + N) at w bits; float layers: the
        ordered float64 mean (`mpi.ps_base_downlink`'s bytes). SenderError names a malformed slot."""
        from tgsim.codecs import _numba_uint
        from tgsim.exchange._numba_mean import ordered_mean

        n, fmt, piece = self.n, self.layout.packing, self.pieces[k]
        code_dtype = np.int8 if n <= 127 else np.int16
        for i, e0, e1 in piece.ranges:
            spec = self.layout.layers[i]
            at = self.down_pos(i, e0) - piece.down[0]
            lo = self.up_pos(i, e0)
            if spec.kind != KIND_TERNARY:
                rows = np.ascontiguousarray(slots[:, lo:lo + 4 * (e1 - e0)]).view(np.float32)
                out[at:at + 4 * (e1 - e0)] = ordered_mean(rows, n).view(np.uint8)
                continue
            if e0 == 0:
                self._check_scalers(slots, i, float(scalers[i]))
                out[at:at + 4] = np.float32(scalers[i]).reshape(1).view(np.uint8)
                at, lo = at + 4, lo + 4
            sub = slots[:, lo:lo + packing.packed_size(e1 - e0, fmt)]
            try:
                intsum = kern.sum_codes(sub, e1 - e0, fmt, code_dtype)
            except ValueError as e:
                raise self._blame(slots, i, e1, e) from e
            if self.width <= 8:
                payload = _numba_uint.pack_offset(intsum, n, self.width)
            else:
                payload = packing.pack_uint((intsum.astype(np.int32) + n).astype(np.uint32), self.width)
            out[at:at + payload.size] = payload

    def _check_scalers(self, slots: np.ndarray, i: int, shared: float) -> None:
        spec = self.layout.layers[i]
        base = self.up_base[i]
        got = np.ascontiguousarray(slots[:, base:base + 4]).view(np.float32)[:, 0]
        for r, s in enumerate(got):
            if not (np.isfinite(s) and s >= 0):
                raise SenderError(r, f"layer {spec.name!r}: invalid scaler {s}")
            if s != np.float32(shared):
                raise SenderError(r, f"layer {spec.name!r} has scaler {s}, the shared scaler is {shared}")

    def _blame(self, slots: np.ndarray, i: int, e1: int, err: Exception) -> ValueError:
        """The first rank whose codes of layer i up to element e1 (all arrived) are invalid."""
        name, fmt = self.layout.layers[i].name, self.layout.packing
        lo = self.up_base[i] + 4
        for r in range(slots.shape[0]):
            try:
                packing.check_payload(slots[r, lo:lo + packing.packed_size(e1, fmt)], e1, fmt, where=f"layer {name!r}")
            except ValueError as e:
                return SenderError(r, str(e))
        return ValueError(f"could not sum the codes of layer {name!r}: {err}")

    # -- every rank --------------------------------------------------------------------------------------
    def empty_mean(self) -> list[np.ndarray]:
        """Flat float32 outputs, one per layer, for `decode` to fill."""
        return [np.empty(s.size, dtype=np.float32) for s in self.layout.layers]

    def decode(self, k: int, buf: np.ndarray, flat: list[np.ndarray], scalers: np.ndarray) -> None:
        """Fill flat[i][e0:e1] from piece k's downlink bytes `buf` (mpi.ps_decode_base's bits);
        `scalers[i]` is layer i's downlink scaler, read at its first piece. ValueError if malformed."""
        from tgsim.codecs import _numba_uint

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
            if self.width <= 8:
                _, top = _numba_uint.decode_scaled(buf[at:at + nb], e1 - e0, self.width, n, float(scalers[i]), n,
                                                   out=flat[i][e0:e1])
            else:
                raw = packing.unpack_uint(buf[at:at + nb], e1 - e0, self.width)
                top = int(raw.max()) if e1 > e0 else 0
                flat[i][e0:e1] = packing.scale_integer_sum(raw.astype(np.int32) - n, float(scalers[i]), n)
            if top > 2 * n:
                raise ValueError(f"layer {spec.name!r}: downlink code sum {top - n} exceeds N = {n}")


__all__ = ["ALIGN", "PSPlan", "Piece", "SenderError"]
