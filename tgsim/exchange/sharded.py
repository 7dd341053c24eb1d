"""The sharded parameter server ("sharded_ps"): every rank serves one shard of the ternary codes.

For packed-code messages whose codes sum exactly, under one shared scaler per ternary layer:

  shards   the T elements of the ternary layers, concatenated in layer order, are cut into N
           contiguous shards at element boundaries: shard r = elements [r T // N, (r+1) T // N)
           (c_r elements; a shard may cross layer boundaries, and is empty when T < N).
  uplink   every rank unpacks its own codes (int8, `ternary_codes`) and sends shard r's codes,
           packed in the codec's packing (2 bits, or 1.6 for base-3: P(c) = packed_size(c)
           bytes), to rank r: one Alltoallv of blocks [u64 element count | packed codes].
  owner    rank r checks every sender's block (a wrong count or an invalid code: a
           PeerPayloadError naming the sender), sums the N senders' codes exactly, in ascending
           rank order, into int8 (int16 beyond 127 ranks), and packs Σ codes + N at
           w = ceil(log2(2N+1)) bits (packing.pack_code_sums): its block [u64 status | packed
           sums], Q(c_r) = ceil(c_r w / 8) bytes after the status word.
  downlink one Allgatherv of every owner's block; after a status other than STATUS_OK every rank
           raises the lowest such owner's error (tgsim/exchange/mpi_errors.py); else every rank
           unpacks the sums and decodes each layer as the integer all-reduce does
           (`decode_codes`: f32((f64(Σ codes) · f64(s)) · f64(1/N)), the simulator's bits).

Float layers of the message take the exact fp32 reduce-scatter (MPIExchange._ordered_mean_flat).

Bytes of rank r (`ShardPlan.code_bytes`, `sharded_bytes`; H = 8, the u64 word of each block):
    sent      Σ_{s != r} (H + P(c_s))  +  (N-1) (H + Q(c_r))
    received  (N-1) (H + P(c_r))       +  Σ_{s != r} (H + Q(c_s))
With c_s about T/N, per ternary element: sent = (N-1)/N · 2 bits of codes to the other owners +
(N-1)/N · w bits of this owner's sums to N-1 ranks, received = (N-1)/N · 2 + (N-1)/N · w alike; so
each of sent and received is about (N-1)/N · (2 + w) bits per element (1.6 + w with base-3), the
two summed 2 (N-1)/N · (2 + w), plus 2 (N-1) headers of H bytes each way. (N = 2: 0.5 · (2 + 3) =
2.5 bits each way; N = 3: 2/3 · (2 + 3) = 3.33.) The float layers add the reduce-scatter's bytes
(`reduce_scatter_bytes`).

Pipelined (MPIExchange with NumPy buffers and chunk >= 0: tgsim/exchange/mpi_pipelined.py
`_sharded_pipelined`; CuPy buffers and chunk < 0 take the blocking Alltoallv + Allgatherv above):
  pieces   `ShardPieces` (`shard_pieces(total, n, fmt, chunk)`, cached): with A = lcm(codes per
           byte, 8) = 8 for 2-bit and 40 for base-3, and L = max(A, chunk - chunk mod A) elements
           (chunk <= 0: L = the whole shard), piece k of shard r is elements
           [b_r + k L, min(b_r + (k+1) L, b_{r+1})), k = 0 .. K_r - 1, K_r = max(1, ceil(c_r / L))
           (an empty shard has one empty piece). A multiple of A elements fills whole bytes both in
           the codec's packing (4 or 5 codes a byte) and at any width w (8 values in w bytes), so a
           piece packs on its own, at the byte where it starts in the whole shard's packing:
           Σ_k P(c_rk) = P(c_r) and Σ_k Q(c_rk) = Q(c_r).
  uplink   piece k of shard r on the wire: [u64 c_rk | its c_rk codes packed], Isent to owner r
           (tag _TAG_SHARD_UP) in piece order, piece k of every shard before piece k+1.
  owner    as soon as piece k has arrived from every sender, owner r checks it (count, codes: a
           PeerPayloadError naming the sender), sums the N senders' codes in ascending rank order
           and Isends [u64 status | Σ + N packed at w bits] to the N-1 others (_TAG_SHARD_DOWN);
           after a failure it still receives every piece and sends every piece, zeros marked with
           its status, so every transfer completes.
  decode   every rank (the owner too, from the bytes it sent) decodes sums piece k of every owner
           as it arrives (`piece_sums`, `scale_piece`: the bits of `decode_codes`); after any status
           other than STATUS_OK every rank raises the lowest failed owner's error, as above.
  bytes    of rank r (`ShardPieces.code_bytes`; a header of H bytes on every piece each way):
    sent      Σ_{s != r} (K_s H + P(c_s))  +  (N-1) (K_r H + Q(c_r))
    received  (N-1) (K_r H + P(c_r))       +  Σ_{s != r} (K_s H + Q(c_s))
           With K_s = 1 for every s (every shard within one piece, as at the default chunk of
           2^18 elements up to N 2^18 ternary elements; chunk <= 0) these are the blocking path's
           bytes above.

Pure functions: MPIExchange (tgsim/exchange/mpi.py) runs them over MPI; the in-process exchange
counts a rank's bytes with `sharded_bytes`, at MPIExchange's default chunk (`DEFAULT_CHUNK`), so it
reports rank 0's numbers of the pipelined exchange (those of the blocking one, over CuPy buffers or
with chunk < 0, differ only where a shard has more than one piece).
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass

import numpy as np

from tgsim.backend import to_numpy
from tgsim.codecs import packing
from tgsim.codecs.message import KIND_TERNARY, Layout, Message
from tgsim.exchange.base import CommBytes
from tgsim.exchange.mpi_errors import STATUS_OK, malformed, read_status, server_failure, write_status
from tgsim.exchange.ps_downlink import code_dtype

MODE = "sharded_ps"
HDR = 8               # the u64 element count of an uplink block, the u64 status of a downlink block
_U64 = np.dtype("<u8")
BUCKET_BYTES = 64 << 20      # MPIExchange's default bucket of the fp32 reduce-scatter
DEFAULT_CHUNK = 1 << 18      # MPIExchange's default chunk (elements per piece; tgsim/exchange/mpi.py CHUNK)


def refusal(shared: bool, reternarize: bool) -> str | None:
    """The one-line reason a sharded exchange cannot run (None when it can)."""
    if not shared:
        return (f'[exchange] mode = "{MODE}" needs share_scalers = true and a codec that shares its scalers '
                '([codec] sharing = "max" or "mean"): each owner sums codes under one scaler per layer')
    if reternarize:
        return f"[exchange] reternarize_downlink needs mode = 'ps' (mode = \"{MODE}\" sends the exact sums)"
    return None


def shard_bounds(total: int, n: int) -> tuple[int, ...]:
    """(b_0, ..., b_N): shard r is elements [b_r, b_{r+1}), b_r = r · total // n."""
    return tuple(r * int(total) // int(n) for r in range(int(n) + 1))


@dataclass(frozen=True)
class ShardPlan:
    """Shards, block sizes and byte offsets of T = `total` ternary elements over N = `n` ranks in
    packing `fmt`: `up[r]` bytes of every uplink block of shard r (H + P(c_r)), `down[r]` bytes of
    owner r's downlink block (H + Q(c_r)); `send_at` the offsets of the blocks in a sender's
    Alltoallv buffer (shard order), `down_at` those in the Allgatherv buffer (owner order)."""

    n: int
    fmt: str
    total: int
    width: int
    bounds: tuple
    up: tuple
    down: tuple
    send_at: tuple
    down_at: tuple

    def count(self, r: int) -> int:
        return self.bounds[r + 1] - self.bounds[r]

    def code_bytes(self, rank: int) -> CommBytes:
        """This rank's bytes of the ternary codes (module docstring): the blocks to the other owners
        and its own downlink block to N-1 ranks; the N-1 blocks of its shard and N-1 downlink blocks."""
        return shard_pieces(self.total, self.n, self.fmt, 0).code_bytes(rank)     # one piece per shard


@functools.lru_cache(maxsize=64)
def shard_plan(total: int, n: int, fmt: str) -> ShardPlan:
    """The ShardPlan of (total, n, fmt), built once."""
    bounds = shard_bounds(total, n)
    width = packing.uint_width(n)
    counts = [bounds[r + 1] - bounds[r] for r in range(n)]
    up = tuple(HDR + packing.packed_size(c, fmt) for c in counts)
    down = tuple(HDR + -(-c * width // 8) for c in counts)
    at = lambda sizes: tuple(int(v) for v in np.concatenate([[0], np.cumsum(sizes)[:-1]]))   # noqa: E731
    return ShardPlan(int(n), fmt, int(total), width, bounds, up, down, at(up), at(down))


def piece_align(fmt: str) -> int:
    """A = lcm(codes per byte of `fmt`, 8): 8 for 2-bit, 40 for base-3 (module docstring, pieces)."""
    return math.lcm(packing.CODES_PER_BYTE[fmt], 8)


def piece_length(chunk: int, fmt: str) -> int:
    """L, the elements of a full piece: max(A, chunk - chunk mod A) for chunk > 0, else 0 (one piece
    per shard)."""
    if chunk <= 0:
        return 0
    a = piece_align(fmt)
    return max(a, int(chunk) - int(chunk) % a)


@dataclass(frozen=True)
class ShardPieces:
    """The pieces of the pipelined sharded exchange of T = `total` ternary elements over N = `n` ranks
    in packing `fmt`, `chunk` as MPIExchange's (module docstring, pieces): `length` L (0: whole
    shards); `cuts[r]` the element bounds of shard r's K_r pieces (K_r + 1 values, from b_r to
    b_{r+1}); `up[r][k]` / `down[r][k]` the bytes of piece k of shard r on the wire, uplink
    [u64 count | packed codes] (H + P(c_rk)) and downlink [u64 status | packed sums] (H + Q(c_rk));
    `up_at[r][k]` its offset in a sender's uplink buffer (shard-major, `up_bytes` in all),
    `down_at[r][k]` in the buffer of every owner's downlink pieces (owner-major, `down_bytes`)."""

    n: int
    fmt: str
    total: int
    chunk: int
    width: int
    length: int
    bounds: tuple
    cuts: tuple
    up: tuple
    down: tuple
    up_at: tuple
    down_at: tuple
    up_bytes: int
    down_bytes: int

    def pieces(self, r: int) -> int:
        """K_r, the pieces of shard r."""
        return len(self.cuts[r]) - 1

    def piece(self, r: int, k: int) -> tuple[int, int]:
        """[a, b): the elements of piece k of shard r."""
        return self.cuts[r][k], self.cuts[r][k + 1]

    @property
    def send_at(self) -> tuple:
        """The offset of shard r's first piece in a sender's uplink buffer (ShardPlan.send_at's role)."""
        return tuple(at[0] for at in self.up_at)

    def code_bytes(self, rank: int) -> CommBytes:
        """This rank's bytes of the ternary codes (module docstring, bytes): every piece of the other
        shards and N-1 copies of each of its own downlink pieces out; N-1 copies of each piece of its
        shard and every piece of the other owners' downlinks in."""
        if self.total == 0:
            return CommBytes()
        n = self.n
        up = [sum(u) for u in self.up]
        down = [sum(d) for d in self.down]
        return CommBytes(sum(up) - up[rank] + (n - 1) * down[rank], (n - 1) * up[rank] + sum(down) - down[rank])


@functools.lru_cache(maxsize=64)
def shard_pieces(total: int, n: int, fmt: str, chunk: int) -> ShardPieces:
    """The ShardPieces of (total, n, fmt, chunk), built once."""
    bounds = shard_bounds(total, n)
    width = packing.uint_width(n)
    length = piece_length(chunk, fmt)
    cuts = []
    for r in range(n):
        a, b = bounds[r], bounds[r + 1]
        step = length if length else max(1, b - a)
        cuts.append(tuple(range(a, b, step)) + (b,) if b > a else (a, b))
    up = tuple(tuple(HDR + packing.packed_size(c[k + 1] - c[k], fmt) for k in range(len(c) - 1)) for c in cuts)
    down = tuple(tuple(HDR + -(-(c[k + 1] - c[k]) * width // 8) for k in range(len(c) - 1)) for c in cuts)

    def offsets(sizes):
        flat = np.concatenate([[0], np.cumsum([v for row in sizes for v in row])]).astype(np.int64)
        out, i = [], 0
        for row in sizes:
            out.append(tuple(int(v) for v in flat[i:i + len(row)]))
            i += len(row)
        return tuple(out), int(flat[-1])

    up_at, up_bytes = offsets(up)
    down_at, down_bytes = offsets(down)
    return ShardPieces(int(n), fmt, int(total), int(chunk), width, length, bounds, tuple(cuts), up, down,
                       up_at, down_at, up_bytes, down_bytes)


def reduce_scatter_bytes(m: int, n: int, rank: int, itemsize: int = 4, bucket_bytes: int = BUCKET_BYTES) -> CommBytes:
    """Rank `rank`'s bytes in MPIExchange's exact fp32 mean of m elements of `itemsize` bytes: per
    bucket of max(N, bucket_bytes // itemsize) elements cut into N chunks (own: this rank's), it
    sends itemsize (m_b - own) + 4 own (N-1) and receives itemsize own (N-1) + 4 (m_b - own)."""
    out = CommBytes()
    step = max(n, bucket_bytes // itemsize)
    for start in range(0, m, step):
        mb = min(step, m - start)
        own = (rank + 1) * mb // n - rank * mb // n
        out += CommBytes(itemsize * (mb - own) + 4 * own * (n - 1), itemsize * own * (n - 1) + 4 * (mb - own))
    return out


def sharded_bytes(layout: Layout, n: int, rank: int, fmt: str, bucket_bytes: int = BUCKET_BYTES,
                  chunk: int = DEFAULT_CHUNK) -> CommBytes:
    """Rank `rank`'s bytes of one sharded exchange of a message of `layout` (scaler sharing not
    included): the ternary codes' in pieces of `chunk` (`ShardPieces.code_bytes`; chunk <= 0: the
    blocking exchange's, `ShardPlan.code_bytes`) plus the float layers' exact fp32 mean
    (`reduce_scatter_bytes`, float32 on the wire)."""
    tern = sum(s.size for s in layout.layers if s.kind == KIND_TERNARY)
    flt = sum(s.size for s in layout.layers if s.kind != KIND_TERNARY)
    out = shard_pieces(tern, n, fmt, int(chunk)).code_bytes(rank)
    out += reduce_scatter_bytes(flt, n, rank, 4, bucket_bytes)
    return out


# -- the codes ---------------------------------------------------------------------------------------

def ternary_codes(codec, msg: Message, dtype, xp=np):
    """The int codes (`dtype`) of `msg`'s ternary layers concatenated in layer order, unpacked by the
    codec's kernels for `xp` (Numba: every layer in one sum_codes_layers call of one message)."""
    kern = codec.kernels_for(xp)
    layers = msg.layout.layers
    tern = [i for i, s in enumerate(layers) if s.kind == KIND_TERNARY]
    codes = xp.empty(sum(layers[i].size for i in tern), dtype=dtype)
    if xp is np and hasattr(kern, "sum_codes_layers"):
        kern.sum_codes_layers([[msg.parts[i]] for i in tern], [layers[i].size for i in tern], codec.packing,
                              dtype, out=codes)
        return codes
    off = 0
    for i in tern:
        size = layers[i].size
        codes[off:off + size] = kern.sum_codes(xp.stack([msg.parts[i]]), size, codec.packing, dtype)
        off += size
    return codes


def decode_codes(kern, layout: Layout, codes, n: int, scalers, fmean=None, xp=np) -> dict:
    """Mean per layer from the ternary layers' integer code sums `codes` (layer order) and the float
    layers' means `fmean` (concatenated): f32((f64(Σ codes) · f64(s)) · f64(1/N)) per element
    (Numba's decode_code_sums_layers in one call on NumPy, else packing.decode_code_sums per layer);
    PayloadError when a sum lies beyond ±N."""
    layers = layout.layers
    tern = [i for i, s in enumerate(layers) if s.kind == KIND_TERNARY]
    decoded = {}
    if xp is np and hasattr(kern, "decode_code_sums_layers") and tern:
        decoded = dict(zip(tern, kern.decode_code_sums_layers(codes, [layers[i].size for i in tern], n,
                                                              [scalers[i] for i in tern])))
    mean, off, foff = {}, 0, 0
    for i, spec in enumerate(layers):
        if spec.kind == KIND_TERNARY:
            flat = decoded[i] if i in decoded else \
                packing.decode_code_sums(codes[off:off + spec.size], n, float(scalers[i]))
            mean[spec.name] = flat.reshape(spec.shape)
            off += spec.size
        else:
            mean[spec.name] = fmean[foff:foff + spec.size].reshape(spec.shape)
            foff += spec.size
    return mean


# -- the blocks on the wire --------------------------------------------------------------------------

def uplink_blocks(codes: np.ndarray, plan: ShardPlan) -> np.ndarray:
    """A sender's Alltoallv buffer: per shard r, in order, [u64 c_r | c_r codes packed in plan.fmt]."""
    buf = np.empty(sum(plan.up), dtype=np.uint8)
    codes = to_numpy(codes)
    for r in range(plan.n):
        at, a, b = plan.send_at[r], plan.bounds[r], plan.bounds[r + 1]
        buf[at:at + HDR] = np.array([b - a], dtype=_U64).view(np.uint8)
        buf[at + HDR:at + plan.up[r]] = packing.pack(np.ascontiguousarray(codes[a:b]), plan.fmt)
    return buf


def _owner_sums(kern, blocks: np.ndarray, c: int, fmt: str, rank: int, what: str, noun: str, codes_at: str):
    """Owner `rank`'s exact sums (code_dtype(N), ascending rank order, by the host kernels `kern`) of
    the N senders' `blocks` (uint8 (N, H + P(c)), row s = [u64 count | c codes] of sender s);
    PeerPayloadError naming the first sender whose count is not c ("its {what} holds ..., the
    {noun} has c") or whose codes are invalid (packing.check_payload's text at `codes_at`)."""
    n = blocks.shape[0]
    where = f"rank {rank} (the owner of shard {rank})"
    for s in range(n):
        got = int(blocks[s, :HDR].view(_U64)[0])
        if got != c:
            raise malformed(where, s, f"its {what} holds {got} elements, the {noun} has {c}")
    bodies = np.ascontiguousarray(blocks[:, HDR:])
    dtype = code_dtype(n)
    if c == 0:
        return np.zeros(0, dtype=dtype)
    try:
        return kern.sum_codes(bodies, c, fmt, dtype)
    except ValueError as e:     # name the first sender whose codes are invalid
        for s in range(n):
            try:
                packing.check_payload(bodies[s], c, fmt, where=codes_at)
            except ValueError as bad:
                raise malformed(where, s, bad) from e
        raise


def _owner_out(out: np.ndarray, sums, n: int, width: int, rank: int) -> str | None:
    """out <- [u64 STATUS_OK | pack_code_sums(sums, N, w)] (`sums`: the int sums, or the exception
    that stopped them); on any failure [u64 status | zeros], and the error's text is returned."""
    try:
        if isinstance(sums, Exception):
            raise sums
        out[HDR:] = packing.pack_code_sums(sums, n, width)
        write_status(out, STATUS_OK)
        return None
    except Exception as e:  # noqa: BLE001  (every rank must learn about it, or they would wait)
        status, text = server_failure(e, f"rank {rank} (the owner of shard {rank})")
        out[:] = 0
        write_status(out, status)
        return text


def _sums_or_error(*args):
    try:
        return _owner_sums(*args)
    except Exception as e:  # noqa: BLE001  (turned into the status word by _owner_out)
        return e


def owner_block(kern, recv: np.ndarray, plan: ShardPlan, rank: int) -> tuple[np.ndarray, str | None]:
    """Owner `rank`'s downlink block from the N blocks of its shard in `recv` (sender order):
    [u64 STATUS_OK | packing.pack_code_sums(Σ codes, N, w)], the codes summed in ascending rank order
    by the host kernels `kern` (which check every byte). On a malformed block (wrong count, invalid
    code: the first such sender is named) or another failure: [u64 status | zeros] and the error's
    text (else None)."""
    n, c = plan.n, plan.count(rank)
    out = np.zeros(plan.down[rank], dtype=np.uint8)
    first = plan.bounds[rank]
    sums = _sums_or_error(kern, recv.reshape(n, plan.up[rank]), c, plan.fmt, rank, f"block of shard {rank}",
                          "shard", f"shard {rank} (elements {first}..{first + c - 1})")
    return out, _owner_out(out, sums, n, plan.width, rank)


def fill_up_piece(codes: np.ndarray, sp: ShardPieces, s: int, k: int, out: np.ndarray) -> None:
    """out (sp.up[s][k] bytes) <- piece k of shard s of this rank's `codes`: [u64 c | c codes packed]."""
    a, b = sp.piece(s, k)
    out[:HDR] = np.array([b - a], dtype=_U64).view(np.uint8)
    out[HDR:] = packing.pack(np.ascontiguousarray(codes[a:b]), sp.fmt)


def owner_piece(kern, rows: np.ndarray, sp: ShardPieces, rank: int, k: int, out: np.ndarray) -> str | None:
    """Owner `rank`'s downlink piece k into `out` (sp.down[rank][k] bytes) from the N senders' piece k
    of its shard, `rows` (uint8 (N, sp.up[rank][k]), sender order): as `owner_block`, [u64 STATUS_OK |
    pack_code_sums(Σ codes, N, w)], or [u64 status | zeros] and the error's text (else None)."""
    a, b = sp.piece(rank, k)
    sums = _sums_or_error(kern, rows, b - a, sp.fmt, rank, f"piece {k} of shard {rank}", "piece",
                          f"shard {rank} piece {k} (elements {a}..{b - 1})")
    return _owner_out(out, sums, sp.n, sp.width, rank)


def first_failure(got: np.ndarray, plan: ShardPlan) -> tuple[int, int] | None:
    """(owner, status) of the lowest owner whose downlink block in `got` does not say STATUS_OK, or None."""
    for r in range(plan.n):
        status = read_status(got[plan.down_at[r]:plan.down_at[r] + HDR])
        if status != STATUS_OK:
            return r, status
    return None


def gathered_sums(got: np.ndarray, plan: ShardPlan, rank: int) -> np.ndarray:
    """The T integer code sums (code_dtype(N)) of every owner's block in `got` (all STATUS_OK);
    PeerPayloadError naming the owner when a packed value lies beyond 2N."""
    codes = np.empty(plan.total, dtype=code_dtype(plan.n))
    for r in range(plan.n):
        if plan.count(r):
            at = plan.down_at[r] + HDR
            codes[plan.bounds[r]:plan.bounds[r + 1]] = _unpack_sums(
                got[at:plan.down_at[r] + plan.down[r]], plan.count(r), plan.n, plan.width, rank, r, f"shard {r}'s")
    return codes


def _unpack_sums(buf: np.ndarray, c: int, n: int, width: int, rank: int, owner: int, what: str) -> np.ndarray:
    """The c integer code sums (code_dtype(N)) packed as Σ + N at `width` bits in `buf`;
    PeerPayloadError naming `owner` ("{what} code sum ... exceeds N") when a value lies beyond 2N."""
    vals = packing.unpack_uint(buf, c, width)
    top = int(vals.max())
    if top > 2 * n:
        raise malformed(f"rank {rank}", owner, f"{what} code sum {top - n} exceeds N = {n}")
    return (vals.astype(np.int32) - n).astype(code_dtype(n))



def piece_sums(buf: np.ndarray, sp: ShardPieces, owner: int, k: int, rank: int) -> np.ndarray:
    """The integer code sums (code_dtype(N)) in downlink piece k of `owner` (`buf`: its bytes after the
    status word); PeerPayloadError naming the owner when a packed value lies beyond 2N."""
    a, b = sp.piece(owner, k)
    if b == a:
        return np.zeros(0, dtype=code_dtype(sp.n))
    return _unpack_sums(buf, b - a, sp.n, sp.width, rank, owner, f"shard {owner}'s piece {k}:")


def ternary_spans(layout: Layout) -> tuple[list, list]:
    """([first element of each ternary layer in the concatenated codes], [(layer index, first, end)])."""
    spans, off = [], 0
    for i, spec in enumerate(layout.layers):
        if spec.kind == KIND_TERNARY:
            spans.append((i, off, off + spec.size))
            off += spec.size
    return [sp[1] for sp in spans], spans


def scale_piece(sums: np.ndarray, a: int, spans, n: int, scalers, flat: dict) -> None:
    """flat[i][e0:e1] <- the means of elements [a, a + sums.size) of the concatenated ternary layers,
    layer by layer (packing.decode_code_sums: f32((f64(Σ codes) · f64(s_i)) · f64(1/N)), the bits
    of `decode_codes`); `spans`: `ternary_spans(layout)`."""
    starts, rows = spans
    b = a + sums.size
    j = max(0, bisect.bisect_right(starts, a) - 1)
    while j < len(rows) and rows[j][1] < b:
        i, first, end = rows[j]
        lo, hi = max(a, first), min(b, end)
        if hi > lo:
            flat[i][lo - first:hi - first] = packing.decode_code_sums(sums[lo - a:hi - a], n, float(scalers[i]))
        j += 1


__all__ = ["BUCKET_BYTES", "DEFAULT_CHUNK", "HDR", "MODE", "ShardPieces", "ShardPlan", "decode_codes",
           "fill_up_piece", "first_failure", "gathered_sums", "owner_block", "owner_piece", "piece_align",
           "piece_length", "piece_sums", "reduce_scatter_bytes", "refusal", "scale_piece", "shard_bounds",
           "shard_pieces", "shard_plan", "sharded_bytes", "ternary_codes", "ternary_spans", "uplink_blocks"]
