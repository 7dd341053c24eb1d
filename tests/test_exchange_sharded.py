"""The sharded parameter server, exchange mode "sharded_ps" (tgsim/exchange/sharded.py, MPIExchange._sharded):
every rank serves one contiguous shard of the ternary codes.

Without MPI (the fake communicator of tests/fakes.py, one thread per rank): every rank's mean has the
bits of the in-process exchange's allreduce and ps modes (2-bit and base-3, MAX and mean sharing,
shards that cross layer boundaries, empty shards, float layers, N = 2, 3, 4); each rank's bytes are
the formula worked out here by hand; a malformed block from rank 1 raises the same PeerPayloadError
naming rank 1 on every rank; own scalers, re-ternarization and codecs whose codes do not sum are
refused in one line (config and exchange). Pipelined (`ShardPieces`, MPIExchange._sharded_pipelined):
the plan by hand (pieces of L = max(A, chunk - chunk mod A) elements, A = 8 for 2-bit and 40 for
base-3); at one piece, pieces inside a layer, a chunk beyond the shards, empty shards and chunks that
are no multiple of A, every rank's mean has the blocking path's bits and its bytes the formula with a
header per piece; a malformed piece (or block) from rank 1 names rank 1 on every rank, every request
completed; a downlink piece damaged on the wire names its owner. Over Gloo (torch.distributed, `mpiexec -n 3` of
tests/torch_ddp_driver.py): the means and bytes over mpi4py. Over MPI (`mpiexec -n 2` and `-n 3`, one job each):
training (MAX and mean sharing, base-3, error feedback) ends with the simulator's parameters, losses
and, on rank 0, bits per step; the aggregate's means and per-rank bytes, and the malformed block
from rank 1, over real MPI, whole (chunk -1) and in pieces of 8 elements. Expected values are
worked out by hand or with plain NumPy.
"""

from __future__ import annotations

import csv
import inspect
import json
import math
import textwrap

import numpy as np
import pytest

import tgsim.exchange.mpi  # noqa: F401  (imported at collection, as the other exchange tests do)
from tgsim.errors import ConfigError, PeerPayloadError
from tgsim.exchange import sharded
from tgsim.exchange.inprocess import InProcessExchange

from fakes import _aggregate_on_ranks, ok, run_ranks, same_bits
from mpi_cases import needs_mpi


# -- inputs and the hand formula -------------------------------------------------------------------------

def sharded_inputs(n: int) -> list:
    """[(name, codec, messages of the N workers, local scalers (N, L), sharing)]: TernGrad layers l0..
    (ternary unless < min_size) under the MAX or mean shared scaler, both packings; the same on every
    rank (no randomness but these seeds). Layouts: ternary 23 + 17 + 41 around a float layer of 5
    (shards cross layers) and one ternary layer of 2 (fewer elements than ranks at N = 3: empty shards)."""
    import numpy as np

    from tgsim.codecs import TernGrad
    from tgsim.exchange.inprocess import InProcessExchange
    from tgsim.rng import StreamKey

    out = []
    for fmt in ("2bit", "base3"):
        for sharing in ("max", "mean"):
            for sizes, min_size in (((23, 5, 17, 41), 10), ((2,), 0)):
                codec = TernGrad(clip="none", min_size=min_size, packing=fmt, sharing=sharing)
                rng = np.random.default_rng(len(sizes) + 7 * n)
                layers = [{f"l{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(sizes)}
                          for _ in range(n)]
                sc = [codec.scaling(g) for g in layers]
                local = np.stack([codec.local_scalers(x) for x in sc])
                ex = InProcessExchange(n)
                s = ex.max_scalers(local) if sharing == "max" else ex.mean_scalers(local)
                msgs = [codec.encode(g, StreamKey(1, 0, w), s, sc[w]) for w, g in enumerate(layers)]
                out.append((f"{fmt}-{sharing}-{len(sizes)}", codec, msgs, local, sharing))
    return out


def hand_pieces(c: int, fmt: str, chunk: int) -> list:
    """The element counts of a shard of c elements in pieces: chunk <= 0, or an empty shard, one
    piece; else pieces of L = max(A, chunk rounded down to a multiple of A), A = 8 (2-bit) or 40
    (base-3), and the rest."""
    a = 8 if fmt == "2bit" else 40
    if chunk <= 0 or c == 0:
        return [c]
    big = max(a, chunk // a * a)
    return [big] * (c // big) + ([c % big] if c % big else [])


def formula_bytes(tern: int, floats: int, n: int, r: int, fmt: str, chunk: int = 0) -> tuple[int, int]:
    """Rank r's (sent, received) by hand: shard s has c_s = (s+1) T // N - s T // N elements, cut into
    pieces (`hand_pieces`; chunk <= 0: one, the blocking exchange's blocks); an uplink piece of c
    elements is 8 + ceil(c / (4 or 5)) bytes, a downlink piece 8 + ceil(c w / 8), w = ceil(log2(2N+1));
    sent = the pieces of the other shards + N-1 copies of this owner's downlink pieces, received =
    N-1 copies of its shard's pieces + the other owners' downlink pieces; the float layers'
    reduce-scatter: 4 (F - own) + 4 own (N-1) sent, 4 own (N-1) + 4 (F - own) received (own = this
    rank's chunk)."""
    w = math.ceil(math.log2(2 * n + 1))
    per = 4 if fmt == "2bit" else 5
    c = [(s + 1) * tern // n - s * tern // n for s in range(n)]
    up = [sum(8 + math.ceil(x / per) for x in hand_pieces(cs, fmt, chunk)) for cs in c]
    down = [sum(8 + math.ceil(x * w / 8) for x in hand_pieces(cs, fmt, chunk)) for cs in c]
    sent = sum(up[s] for s in range(n) if s != r) + (n - 1) * down[r] if tern else 0
    recv = (n - 1) * up[r] + sum(down[s] for s in range(n) if s != r) if tern else 0
    own = (r + 1) * floats // n - r * floats // n
    return sent + 4 * (floats - own) + 4 * own * (n - 1), recv + 4 * own * (n - 1) + 4 * (floats - own)


def _tern_float(layout) -> tuple[int, int]:
    from tgsim.codecs.message import KIND_TERNARY

    t = sum(s.size for s in layout.layers if s.kind == KIND_TERNARY)
    return t, sum(s.size for s in layout.layers) - t


def _scaler_ring_bytes(n_layers: int, n: int) -> float:
    return 2.0 * (n - 1) / n * 4 * n_layers


# -- pure functions ----------------------------------------------------------------------------------------

def test_shard_plan_of_13_elements_over_3_ranks_by_hand():
    """T = 13, N = 3: shards [0, 4), [4, 8), [8, 13); 2-bit blocks 8 + 1, 8 + 1, 8 + 2 bytes; sums at
    w = 3 bits: 8 + 2 bytes each; rank 0 sends 9 + 10 + 2 x 10 = 39 and receives 2 x 9 + 10 + 10 = 38,
    rank 2 sends 9 + 9 + 2 x 10 = 38 and receives 2 x 10 + 10 + 10 = 40. T = 0: nothing."""
    plan = sharded.shard_plan(13, 3, "2bit")
    assert plan.bounds == (0, 4, 8, 13) and plan.width == 3
    assert plan.up == (9, 9, 10) and plan.down == (10, 10, 10)
    assert plan.send_at == (0, 9, 18) and plan.down_at == (0, 10, 20)
    got = [(plan.code_bytes(r).sent, plan.code_bytes(r).received) for r in range(3)]
    assert got == [(39, 38), (39, 38), (38, 40)]
    assert [formula_bytes(13, 0, 3, r, "2bit") for r in range(3)] == got
    b = sharded.shard_plan(0, 3, "2bit").code_bytes(1)
    assert (b.sent, b.received) == (0, 0)
    assert sharded.shard_bounds(2, 3) == (0, 0, 1, 2)
    # N = 200: int16 sums, w = ceil(log2(401)) = 9 bits
    assert sharded.shard_plan(400, 200, "base3").width == 9


def test_owner_sums_exactly_and_names_the_sender_of_a_bad_block():
    """owner_block of three senders' blocks of a 6-element shard: the packed sums are
    pack_code_sums(Σ codes, 3, 3) of the hand sums; a block whose count is 5, or whose codes hold 0b11,
    gives STATUS_PAYLOAD and a text naming that sender."""
    from tgsim.codecs import packing
    from tgsim.codecs.terngrad import numba_kernels

    codes = np.array([[1, 0, -1, 1, 1, 0], [1, 1, -1, 0, -1, 0], [0, 1, -1, 1, 1, 1]], np.int8)
    plan3 = sharded.shard_plan(18, 3, "2bit")     # 3 senders, shard 1 of 6 elements
    blocks = np.concatenate([np.concatenate([np.array([6], "<u8").view(np.uint8), packing.pack(c, "2bit")])
                             for c in codes])
    out, err = sharded.owner_block(numba_kernels, blocks, plan3, 1)
    assert err is None and int(out[:8].view("<u8")[0]) == 0
    want = np.array([2, 2, -3, 2, 1, 1], np.int8)
    assert np.array_equal(out[8:], packing.pack_uint((want.astype(np.int32) + 3).astype(np.uint32), 3))
    bad = blocks.copy()
    bad[plan3.up[1] * 1 + 8] = 0xFF
    out, err = sharded.owner_block(numba_kernels, bad, plan3, 1)
    assert int(out[:8].view("<u8")[0]) == 1 and not out[8:].any()
    assert err.startswith("rank 1 (the owner of shard 1) received a malformed payload from rank 1: shard 1") \
        and "0b11" in err
    bad = blocks.copy()
    bad[2 * plan3.up[1]] = 5
    _, err = sharded.owner_block(numba_kernels, bad, plan3, 1)
    assert "from rank 2: its block of shard 1 holds 5 elements, the shard has 6" in err
    assert plan3.count(1) == 6


def test_gathered_sums_beyond_n_name_the_owner():
    """A downlink block whose packed value is beyond 2N (here 7 at N = 2): PeerPayloadError naming
    the owner of that shard."""
    from tgsim.codecs import packing

    plan = sharded.shard_plan(4, 2, "2bit")
    got = np.zeros(sum(plan.down), np.uint8)
    got[plan.down_at[1] + 8:] = packing.pack_uint(np.array([2, 7], np.uint32), 3)
    got[8:plan.down[0]] = packing.pack_uint(np.array([0, 4], np.uint32), 3)
    with pytest.raises(PeerPayloadError, match="rank 0 received a malformed payload from rank 1: shard 1's code sum 5"):
        sharded.gathered_sums(got, plan, 0)
    got[plan.down_at[1] + 8:] = packing.pack_uint(np.array([2, 3], np.uint32), 3)
    assert sharded.gathered_sums(got, plan, 0).tolist() == [-2, 2, 0, 1]


def test_shard_pieces_of_130_elements_over_3_ranks_by_hand():
    """T = 130, N = 3, 2-bit, chunk 13 -> L = 8 (13 rounded down to a multiple of A = 8): shards of
    43, 43, 44 elements in pieces of 8 x 5 + 3 (shard 2: + 4); an uplink piece of 8 elements is
    8 + 2 bytes, of 3 or 4 elements 8 + 1: 5 x 10 + 9 = 59 bytes a shard; a downlink piece (w = 3)
    of 8 elements 8 + 3, of 3 or 4 elements 8 + 2: 5 x 11 + 10 = 65. Rank 0 sends 2 x 59 + 2 x 65 =
    248 and receives 2 x 59 + 2 x 65 = 248: the blocking 88 and 88 (blocks of 8 + 11 up, 8 + 17 down)
    plus 8 bytes for each of the 2 x 5 + 2 x 5 extra pieces each way. Codes and sums of the pieces fill
    the bytes of the whole shard's: 11 = 5 x 2 + 1, 17 = 5 x 3 + 2."""
    sp = sharded.shard_pieces(130, 3, "2bit", 13)
    assert sp.length == 8 and sp.width == 3 and [sp.pieces(r) for r in range(3)] == [6, 6, 6]
    assert sp.cuts[0] == (0, 8, 16, 24, 32, 40, 43) and sp.cuts[2] == (86, 94, 102, 110, 118, 126, 130)
    assert sp.piece(1, 5) == (83, 86)
    assert sp.up[0] == (10,) * 5 + (9,) and sp.down[2] == (11,) * 5 + (10,)
    assert sp.up_at[0] == (0, 10, 20, 30, 40, 50) and sp.send_at == (0, 59, 118) and sp.up_bytes == 177
    assert sp.down_at[1][0] == 65 and sp.down_bytes == 195
    got = [(sp.code_bytes(r).sent, sp.code_bytes(r).received) for r in range(3)]
    assert got == [(248, 248)] * 3 == [formula_bytes(130, 0, 3, r, "2bit", 13) for r in range(3)]
    whole = sharded.shard_plan(130, 3, "2bit")
    assert [(whole.code_bytes(r).sent, whole.code_bytes(r).received) for r in range(3)] == [(88, 88)] * 3
    # the rounding: down to a multiple of A (8 for 2-bit, 40 for base-3), at least A; <= 0: whole shards
    assert [sharded.piece_length(c, "2bit") for c in (1, 8, 13, 17, 1 << 18, 0, -1)] == [8, 8, 8, 16, 1 << 18, 0, 0]
    assert [sharded.piece_length(c, "base3") for c in (1, 39, 40, 100, 1 << 18)] == [40, 40, 40, 80, 262120]
    # T = 2 over 3 ranks: shard 0 is empty and still one (empty) piece of 8 + 0 bytes each way
    tiny = sharded.shard_pieces(2, 3, "base3", 8)
    assert tiny.cuts == ((0, 0), (0, 1), (1, 2)) and tiny.up[0] == (8,) and tiny.down[0] == (8,)
    assert sharded.shard_pieces(0, 3, "2bit", 8).code_bytes(1).sent == 0
    from tgsim.exchange.mpi import CHUNK

    assert sharded.DEFAULT_CHUNK == CHUNK


@pytest.mark.parametrize("fmt", ["2bit", "base3"])
def test_pieces_tile_the_shards_and_their_bytes_are_the_formulas(fmt):
    """For T, N and chunks around the boundaries: the pieces tile each shard in order, every piece but
    the last of a shard has L elements and starts a multiple of A after the shard's first element, the
    pieces' packed codes and sums add up to the whole shard's bytes, the offsets are the running sums
    of the sizes, and each rank's bytes are `formula_bytes` (chunk <= 0: the blocking ShardPlan's)."""
    from tgsim.codecs import packing

    a = 8 if fmt == "2bit" else 40
    for total, n in ((0, 2), (1, 2), (7, 4), (81, 2), (130, 3), (1000, 5), (4099, 3)):
        whole = sharded.shard_plan(total, n, fmt)
        for chunk in (-1, 0, 1, a - 1, a, a + 1, 3 * a + 2, 999, 1 << 18):
            sp = sharded.shard_pieces(total, n, fmt, chunk)
            at_up = at_down = 0
            for r in range(n):
                cuts = sp.cuts[r]
                assert cuts[0] == whole.bounds[r] and cuts[-1] == whole.bounds[r + 1]
                sizes = np.diff(cuts).tolist()
                assert sizes == hand_pieces(whole.count(r), fmt, chunk), (total, n, chunk, r)
                assert all((c - cuts[0]) % a == 0 for c in cuts[:-1])
                assert sum(u - 8 for u in sp.up[r]) == packing.packed_size(whole.count(r), fmt)
                assert sum(d - 8 for d in sp.down[r]) == -(-whole.count(r) * sp.width // 8)
                for k in range(sp.pieces(r)):
                    assert (sp.up_at[r][k], sp.down_at[r][k]) == (at_up, at_down)
                    at_up, at_down = at_up + sp.up[r][k], at_down + sp.down[r][k]
                b = sp.code_bytes(r)
                assert (b.sent, b.received) == formula_bytes(total, 0, n, r, fmt, chunk), (total, n, chunk, r)
                if chunk <= 0:
                    assert (b.sent, b.received) == (whole.code_bytes(r).sent, whole.code_bytes(r).received)
            assert (at_up, at_down) == (sp.up_bytes, sp.down_bytes)


# -- MPIExchange over the fake communicator ------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 4])
def test_sharded_ps_bits_and_bytes_on_fake_ranks(monkeypatch, n):
    """Every case of `sharded_inputs`: every rank's mean has the in-process exchange's bits (the
    allreduce and ps modes' too); rank r's bytes are `formula_bytes` plus the pending scaler bytes
    of the MAX all-reduce (ring) or the mean's all-gather; the in-process bytes are rank 0's."""
    for name, codec, msgs, local, sharing in sharded_inputs(n):
        want, wb = InProcessExchange(n).aggregate(codec, msgs, "sharded_ps", True)
        for mode in ("allreduce", "ps"):
            assert same_bits(want, InProcessExchange(n).aggregate(codec, msgs, mode, True)[0]), (name, mode)

        def fn(ex):
            (ex.max_scalers if sharing == "max" else ex.mean_scalers)(local[ex.rank:ex.rank + 1])
            mean, b = ex.aggregate(codec, [msgs[ex.rank]], "sharded_ps", True)
            return mean, (b.sent, b.received)

        tern, flt = _tern_float(msgs[0].layout)
        n_layers = len(msgs[0].layout.layers)
        scal = _scaler_ring_bytes(n_layers, n) if sharing == "max" else (n - 1) * 4 * n_layers
        for r, (mean, b) in enumerate(ok(run_ranks(n, fn, monkeypatch))):
            assert same_bits(mean, want), (name, r)
            sent, recv = formula_bytes(tern, flt, n, r, codec.packing)
            assert b == pytest.approx((sent + scal, recv + scal), abs=1e-9), (name, r)
            if r == 0:   # the in-process count has the ring model of the scalers
                ring = _scaler_ring_bytes(n_layers, n)
                assert (wb.sent - ring, wb.received - ring) == pytest.approx((sent, recv), abs=1e-9), name


def test_sharded_ps_float_and_fp32_paths(monkeypatch):
    """fp32 in sharded_ps: the exact fp32 mean (the in-process bits and bytes of mean_fp32); a
    message of float layers only sends no code blocks (its bytes are the reduce-scatter's)."""
    from tgsim.codecs import TernGrad
    from tgsim.codecs.fp32 import Float32
    from tgsim.rng import StreamKey

    rng = np.random.default_rng(2)
    layers = [{"a": rng.standard_normal(7).astype(np.float32)} for _ in range(3)]
    codec = Float32()
    msgs = codec.encode_many({"a": np.stack([g["a"] for g in layers])}, 1, 0, np.arange(3))
    want, _ = InProcessExchange(3).aggregate(codec, msgs, "sharded_ps", True)
    assert same_bits(want, InProcessExchange(3).mean_fp32(layers)[0])
    for mean, _ in ok(run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "sharded_ps", True),
                                monkeypatch)):
        assert same_bits(mean, want)
    tg = TernGrad(clip="none", min_size=100)
    tmsgs = [tg.encode(g, StreamKey(1, 0, w), np.zeros(1, np.float32), tg.scaling(g)) for w, g in enumerate(layers)]
    res = ok(run_ranks(3, lambda ex: ex.aggregate(tg, [tmsgs[ex.rank]], "sharded_ps", True), monkeypatch))
    for r, (mean, b) in enumerate(res):
        assert same_bits(mean, want) and (b.sent, b.received) == formula_bytes(0, 7, 3, r, "2bit")


CHUNKS = [0, 1, 8, 13, 50, 1 << 18]    # one piece; A; pieces inside layers; rounded down; beyond the shards


def _more_inputs(n: int) -> list:
    """`sharded_inputs`' form, larger: one ternary layer of 130 and a float layer of 5 (MAX sharing),
    so base-3 shards have several pieces of 40 too."""
    from fakes import _terngrad

    out = []
    for fmt in ("2bit", "base3"):
        codec, msgs = _terngrad(n, sizes=(130, 5), packing=fmt)
        local = np.zeros((n, 2), np.float32)    # (scalers already shared: the MAX of zeros changes nothing)
        out.append((f"{fmt}-130", codec, msgs, local, "max"))
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_pipelined_sharded_ps_has_the_blocking_bits_and_the_formulas_bytes(monkeypatch, n):
    """Every case of `sharded_inputs` and `_more_inputs`, in pieces of every chunk of CHUNKS: every
    rank's mean has the blocking path's (chunk = -1) bits and the in-process bits; rank r's bytes are
    `formula_bytes` with that chunk's pieces (a header each) plus the scalers' bytes."""
    for name, codec, msgs, local, sharing in sharded_inputs(n) + _more_inputs(n):
        want, _ = InProcessExchange(n).aggregate(codec, msgs, "sharded_ps", True)
        tern, flt = _tern_float(msgs[0].layout)
        n_layers = len(msgs[0].layout.layers)
        scal = _scaler_ring_bytes(n_layers, n) if sharing == "max" else (n - 1) * 4 * n_layers

        def fn(ex):
            (ex.max_scalers if sharing == "max" else ex.mean_scalers)(local[ex.rank:ex.rank + 1])
            mean, b = ex.aggregate(codec, [msgs[ex.rank]], "sharded_ps", True)
            return mean, (b.sent, b.received)

        blocking = ok(run_ranks(n, fn, monkeypatch, chunk=-1))
        for chunk in CHUNKS:
            for r, (mean, b) in enumerate(ok(run_ranks(n, fn, monkeypatch, chunk=chunk))):
                assert same_bits(mean, blocking[r][0]) and same_bits(mean, want), (name, chunk, r)
                sent, recv = formula_bytes(tern, flt, n, r, codec.packing, chunk)
                assert b == pytest.approx((sent + scal, recv + scal), abs=1e-9), (name, chunk, r)


def test_in_process_bytes_are_rank_0s_at_the_default_chunk_with_several_pieces(monkeypatch):
    """N = 2, one ternary layer of 2^19 + 80 elements (shards of 2^18 + 40: two pieces each at the
    default chunk) and a float layer: rank 0's bytes over the fake communicator at MPIExchange's
    default chunk are the in-process exchange's (both less the scalers' ring), one header more each
    way per extra piece than the blocking path's; all three means have the same bits. Every
    nonblocking request was completed: 4 (N-1) Σ K_s = 16 of them."""
    from fakes import _World, _terngrad

    big = (1 << 19) + 80
    codec, msgs = _terngrad(2, sizes=(big, 5))
    want, wb = InProcessExchange(2).aggregate(codec, msgs, "sharded_ps", True)
    ring = _scaler_ring_bytes(2, 2)
    world = _World(2)
    piped = _aggregate_on_ranks(monkeypatch, 2, codec, msgs, "sharded_ps", True, world=world)
    assert all(r.waited for r in world.requests) and len(world.requests) == 4 * 1 * 4
    whole = _aggregate_on_ranks(monkeypatch, 2, codec, msgs, "sharded_ps", True, chunk=-1)
    assert sharded.shard_pieces(big, 2, "2bit", sharded.DEFAULT_CHUNK).cuts[0] == (0, 1 << 18, (1 << 18) + 40)
    assert piped[0][1] == (wb.sent - ring, wb.received - ring) == formula_bytes(big, 5, 2, 0, "2bit", 1 << 18)
    assert piped[0][1] == (whole[0][1][0] + 16, whole[0][1][1] + 16)
    for mean, _ in piped + whole:
        assert same_bits(mean, want)


def test_a_downlink_piece_damaged_on_the_wire_names_its_owner(monkeypatch):
    """Ternary layers only, N = 3, pieces of 8: piece 1 of owner 1's sums reaches rank 2 with a packed
    value 7 > 2N (its status says OK): rank 2 raises PeerPayloadError naming rank 1 and its piece, after
    every transfer completed; ranks 0 and 1 get the in-process bits."""
    from fakes import _World
    from tgsim.codecs import TernGrad
    from tgsim.exchange.mpi_transport import _TAG_SHARD_DOWN
    from tgsim.rng import StreamKey

    codec = TernGrad(clip="none", min_size=0)
    rng = np.random.default_rng(3)
    layers = [{"w": rng.standard_normal(130).astype(np.float32), "v": rng.standard_normal(20).astype(np.float32)}
              for _ in range(3)]
    sc = [codec.scaling(g) for g in layers]
    s = InProcessExchange(3).max_scalers(np.stack([codec.local_scalers(x) for x in sc]))
    msgs = [codec.encode(g, StreamKey(1, 0, w), s, sc[w]) for w, g in enumerate(layers)]
    want, _ = InProcessExchange(3).aggregate(codec, msgs, "sharded_ps", True)
    seen = []

    def tamper(key, data):
        if key != (1, 2, _TAG_SHARD_DOWN):
            return data
        seen.append(data.size)
        if len(seen) == 2:
            data = data.copy()
            data[8] = 0xFF
        return data

    world = _World(3, tamper)
    res = run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "sharded_ps", True), monkeypatch,
                    world=world, chunk=8)
    assert same_bits(res[0][0], want) and same_bits(res[1][0], want)
    assert isinstance(res[2], PeerPayloadError), res[2]
    assert str(res[2]) == "rank 2 received a malformed payload from rank 1: shard 1's piece 1: code sum 4 exceeds N = 3"
    assert len(seen) == 7 and all(r.waited for r in world.requests)     # shard 1: elements 50..99


def _corrupt_shard_blocks(monkeypatch, rank: int, shard, what: str, piece: int = 1):
    """Rank `rank` damages what it sends of shard `shard` (None: of every shard): the first code byte
    set to 0xff (invalid in both packings), or the count one too high; in the blocking path its
    Alltoallv block (the _shard_blocks seam), in pieces piece `piece` (the _shard_piece seam; the
    shard's last piece where it has fewer)."""
    from tgsim.exchange.mpi import MPIExchange

    original, original_piece = MPIExchange._shard_blocks, MPIExchange._shard_piece

    def damage(buf, at):
        if what == "code":
            buf[at + sharded.HDR] = 0xFF
        else:
            buf[at] += 1

    def damaged(self, codes, plan):
        buf = original(self, codes, plan).copy()
        if self.rank == rank:
            for s in (range(plan.n) if shard is None else [shard]):
                damage(buf, plan.send_at[s])
        return buf

    def damaged_piece(self, codes, sp, s, k, out):
        original_piece(self, codes, sp, s, k, out)
        if self.rank == rank and (shard is None or s == shard) and k == min(piece, sp.pieces(s) - 1):
            damage(out, 0)
    monkeypatch.setattr(MPIExchange, "_shard_blocks", damaged)
    monkeypatch.setattr(MPIExchange, "_shard_piece", damaged_piece)


@pytest.mark.parametrize("chunk", [-1, 8])
@pytest.mark.parametrize("fmt", ["2bit", "base3"])
@pytest.mark.parametrize("shard, what, owner", [(2, "code", 2), (None, "code", 0), (1, "count", 1)])
def test_a_malformed_block_from_rank_1_raises_on_every_rank(monkeypatch, chunk, fmt, shard, what, owner):
    """Rank 1's block of one shard (or of every shard) is malformed, whole (chunk -1) or in its piece 1
    (pieces of 8 elements, 40 in base-3; the shards of T = 130 hold 43, 43 and 44 elements): every
    rank raises the same PeerPayloadError, that of the lowest owner that found it, naming rank 1 and
    the piece; no rank waits (the fake ranks give up after their timeout and the test fails if one
    never returns), and in pieces every nonblocking request was completed (4 (N-1) Σ K_s of them)."""
    from fakes import _terngrad, _World

    codec, msgs = _terngrad(3, sizes=(130, 5), packing=fmt)
    _corrupt_shard_blocks(monkeypatch, 1, shard, what)
    world = _World(3)
    res = run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "sharded_ps", True), monkeypatch,
                    chunk=chunk, world=world)
    assert all(isinstance(e, PeerPayloadError) for e in res), res
    assert len({str(e) for e in res}) == 1
    text = str(res[0])
    assert text.startswith(f"rank {owner} (the owner of shard {owner}) received a malformed payload from rank 1: ")
    pieces = [hand_pieces(c, fmt, chunk) for c in (43, 43, 44)]
    assert all(r.waited for r in world.requests)
    assert len(world.requests) == (0 if chunk < 0 else 4 * 2 * sum(len(p) for p in pieces))
    if chunk < 0:
        assert ("invalid" in text) if what == "code" else ("holds 44 elements, the shard has 43" in text)
        return
    first = (0, 43, 86)[owner] + pieces[owner][0]
    size = pieces[owner][1]
    if what == "code":
        assert f"shard {owner} piece 1 (elements {first}..{first + size - 1}): invalid" in text
    else:
        assert f"its piece 1 of shard {owner} holds {size + 1} elements, the piece has {size}" in text


@pytest.mark.parametrize("chunk", [-1, 0])
def test_an_owner_that_fails_otherwise_is_a_server_error_on_every_rank(monkeypatch, chunk):
    """Every owner's packing fails (whole, or in one piece): every rank raises rank 0's ServerError."""
    from tgsim.errors import ServerError
    from fakes import _terngrad

    codec, msgs = _terngrad(2)

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(sharded.packing, "pack_code_sums", boom)
    res = run_ranks(2, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "sharded_ps", True), monkeypatch,
                    chunk=chunk)
    assert [type(e) for e in res] == [ServerError] * 2
    assert {str(e) for e in res} == {"rank 0 (the owner of shard 0) failed: RuntimeError: boom"}


def test_the_exchange_refuses_own_scalers_reternarization_and_whole_messages(monkeypatch):
    """ValueError in one line on every rank: unshared scalers (naming share_scalers and the sharing),
    a re-ternarization key, a codec whose messages travel whole; the in-process exchange alike;
    defers_encode is False for sharded_ps whatever the other arguments."""
    from tgsim.codecs import registry
    from tgsim.rng import StreamKey
    from tgsim.train.config import CodecConfig

    from fakes import _terngrad

    codec, msgs = _terngrad(2, shared=False)
    for shared, key, says in ((False, None, 'mode = "sharded_ps" needs share_scalers = true'),
                              (True, StreamKey(1, 2, 3), "reternarize_downlink needs mode = 'ps'")):
        res = run_ranks(2, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "sharded_ps", shared, key), monkeypatch)
        assert all(type(e) is ValueError and says in str(e) and "\n" not in str(e) for e in res), res
        with pytest.raises(ValueError, match=says.replace("(", r"\(")):
            InProcessExchange(2).aggregate(codec, msgs, "sharded_ps", shared, key)
    c16 = registry.make_codec(CodecConfig(name="fp16"))
    m16 = c16.encode_many({"w": np.ones((2, 3), np.float32)}, 1, 0, np.arange(2))
    res = run_ranks(2, lambda ex: ex.aggregate(c16, [m16[ex.rank]], "sharded_ps", False), monkeypatch)
    assert all(isinstance(e, ValueError) and "needs a codec whose codes sum exactly" in str(e) for e in res), res
    with pytest.raises(ValueError, match="needs a codec whose codes sum exactly"):
        InProcessExchange(2).aggregate(c16, m16, "sharded_ps", False)
    table = ok(run_ranks(1, lambda ex: [ex.defers_encode("sharded_ps", s, r) for s in (True, False)
                                        for r in (True, False)], monkeypatch, chunk=0))[0]
    assert table == [False] * 4


@pytest.mark.parametrize("codec, exchange, says", [
    ({"name": "terngrad", "sharing": "none"}, {}, 'mode = "sharded_ps" needs share_scalers = true'),
    ({"name": "terngrad"}, {"share_scalers": False}, 'mode = "sharded_ps" needs share_scalers = true'),
    ({"name": "terngrad"}, {"reternarize_downlink": True}, "reternarize_downlink needs mode = 'ps'"),
    ({"name": "qsgd"}, {}, 'mode = "sharded_ps" needs a codec whose codes sum exactly'),
])
def test_config_refuses_in_one_line(codec, exchange, says):
    from tgsim.train.config import EXCHANGE_MODES, from_dict

    with pytest.raises(ConfigError) as e:
        from_dict({"codec": codec, "exchange": {"mode": "sharded_ps", **exchange}})
    assert says in str(e.value) and "\n" not in str(e.value)
    assert "sharded_ps" in EXCHANGE_MODES
    from_dict({"codec": {"name": "fp32"}, "exchange": {"mode": "sharded_ps"}})          # fp32: its exact mean
    from_dict({"codec": {"name": "terngrad", "sharing": "mean"}, "exchange": {"mode": "sharded_ps"}})


# -- over MPI -------------------------------------------------------------------------------------------------

_DRIVER_BODY = """
import hashlib, json, sys, traceback
import numpy as np
from mpi4py import MPI
from tgsim.errors import PeerPayloadError
from tgsim.exchange import sharded
from tgsim.exchange.mpi import MPIExchange
from tgsim.train.config import from_dict
from tgsim.train.loop import run

ex = MPIExchange()
try:
    cases, out = json.loads(open(sys.argv[1]).read()), sys.argv[2]
    digests = {}
    for name, d in cases.items():                       # training, as tests/mpi_cases.py's driver
        res = run(from_dict(d), out=f"{out}/{name}", quiet=True, exchange=ex, writer=ex.rank == 0)
        h = hashlib.sha256(b"".join(np.ascontiguousarray(res.params[k]).tobytes()
                                    for k in sorted(res.params))).hexdigest()
        digests[name] = ex.comm.gather(h, root=0)
    means, nbytes = {}, {}
    for chunk in CHUNKS:                                # the aggregate alone: whole, in pieces of 8
        ex.chunk = chunk
        for name, codec, msgs, local, sharing in sharded_inputs(ex.size):
            (ex.max_scalers if sharing == "max" else ex.mean_scalers)(local[ex.rank:ex.rank + 1])
            mean, b = ex.aggregate(codec, [msgs[ex.rank]], "sharded_ps", True)
            means.update({f"{chunk}|{name}|{k}": v for k, v in mean.items()})
            nbytes[f"{chunk}|{name}"] = [b.sent, b.received]
    np.savez(f"{out}/rank{ex.rank}.npz", **means)
    original, original_piece = MPIExchange._shard_blocks, MPIExchange._shard_piece
    def damaged(self, codes, plan):                    # rank 1's codes of the last shard: 0xff
        buf = original(self, codes, plan).copy()
        if self.rank == 1:
            buf[plan.send_at[plan.n - 1] + sharded.HDR] = 0xFF
        return buf
    def damaged_piece(self, codes, sp, s, k, out):     # in pieces: its piece 1 of the last shard
        original_piece(self, codes, sp, s, k, out)
        if self.rank == 1 and s == sp.n - 1 and k == 1:
            out[sharded.HDR] = 0xFF
    MPIExchange._shard_blocks, MPIExchange._shard_piece = damaged, damaged_piece
    name, codec, msgs, local, sharing = sharded_inputs(ex.size)[0]
    faults = {}
    for chunk in CHUNKS:
        ex.chunk = chunk
        try:
            ex.aggregate(codec, [msgs[ex.rank]], "sharded_ps", True)
            faults[chunk] = None
        except PeerPayloadError as e:
            faults[chunk] = str(e)
    json.dump({"digests": digests, "bytes": nbytes, "faults": faults}, open(f"{out}/rank{ex.rank}.json", "w"))
except Exception:
    traceback.print_exc()
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(1)
"""


def _training_cases(n: int) -> dict:
    """Least squares under the MAX and the mean scaler and with base-3 packing, the MLP (float biases)
    with error feedback: 20 steps each, N workers."""
    from mpi_cases import config_dict

    base = {"run": {"steps": 20, "eval_every": 0}, "workers": {"n": n, "batch": 12 * n},
            "exchange": {"mode": "sharded_ps"}}
    return {"ls-max": config_dict("ls", "ps", **base),
            "ls-mean": config_dict("ls", "ps", **base, codec={"sharing": "mean"}),
            "ls-base3": config_dict("ls", "ps", **base, codec={"packing": "base3"}),
            "mlp-ef": config_dict("mlp", "ps", **base, codec={"min_size": 40, "error_feedback": True})}


def _bits_per_step(out) -> list:
    with open(out / "metrics.csv", newline="") as f:
        return [(r["bits_up"], r["bits_down"]) for r in csv.DictReader(f)
                if r["split"] == "train" and r["layer"] == "model"]


MPI_CHUNKS = [-1, 8]     # the aggregates over MPI: whole, and in pieces of 8 elements (several a shard)


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_sharded_ps_over_mpi_equals_the_simulator(tmp_path, n):
    """One `mpiexec -n N` job: each training case ends on every rank with the simulator's parameters,
    bit for bit, and the same training losses; rank 0's bits per step equal the simulator's (MAX
    sharing: both count the scalers as a ring; the mean's all-gather is counted as such over MPI).
    Then the aggregate of every `sharded_inputs` case, whole and in pieces of 8 elements (MPI_CHUNKS;
    the training runs at the default chunk, one piece a shard): each rank's mean has the in-process
    bits, its bytes the formula with that chunk's pieces; and rank 1's invalid codes of the last
    shard (in pieces: of its piece 1) make every rank raise the same PeerPayloadError naming rank 1
    (a hang fails the job's timeout)."""
    from mpi_cases import load_params, mpiexec, params_bits, params_digest, simulate, train_losses
    from fakes import one_numba_thread

    cases = _training_cases(n)
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    driver = tmp_path / "driver.py"
    head = f"import numpy as np\nCHUNKS = {MPI_CHUNKS}\n"
    driver.write_text(head + textwrap.dedent(inspect.getsource(sharded_inputs)) + _DRIVER_BODY)
    res, _ = mpiexec([(n, [str(driver), str(tmp_path / "cases.json"), str(tmp_path / "mpi")])], timeout=300)
    assert res.returncode == 0, res.report()
    ranks = [json.loads((tmp_path / "mpi" / f"rank{r}.json").read_text()) for r in range(n)]
    for name, d in cases.items():
        sim = simulate(d, tmp_path / "sim" / name)
        mpi_out = tmp_path / "mpi" / name
        assert params_bits(load_params(mpi_out / "params.npz")) == params_bits(sim.params), name
        assert set(ranks[0]["digests"][name]) == {params_digest(sim.params)}, f"{name}: replicas differ"
        assert train_losses(mpi_out) == train_losses(tmp_path / "sim" / name), name
        if name != "ls-mean" or n == 2:      # N = 2: the mean's all-gather and the ring count alike
            assert _bits_per_step(mpi_out) == _bits_per_step(tmp_path / "sim" / name), name
    with one_numba_thread():
        inputs = sharded_inputs(n)
    for r in range(n):
        with np.load(tmp_path / "mpi" / f"rank{r}.npz") as z:
            got = {k: z[k] for k in z.files}
        for chunk in MPI_CHUNKS:
            for name, codec, msgs, local, sharing in inputs:
                want, wb = InProcessExchange(n).aggregate(codec, msgs, "sharded_ps", True)
                assert all(np.array_equal(want[k].view(np.uint8), got[f"{chunk}|{name}|{k}"].view(np.uint8))
                           for k in want), (r, chunk, name)
                tern, flt = _tern_float(msgs[0].layout)
                n_layers = len(msgs[0].layout.layers)
                scal = _scaler_ring_bytes(n_layers, n) if sharing == "max" else (n - 1) * 4 * n_layers
                sent, recv = formula_bytes(tern, flt, n, r, codec.packing, chunk)
                assert ranks[r]["bytes"][f"{chunk}|{name}"] == pytest.approx([sent + scal, recv + scal], abs=1e-9), \
                    (r, chunk, name)
                if r == 0 and sharing == "max" and chunk < 0:   # one piece a shard at the default chunk too
                    assert ranks[0]["bytes"][f"{chunk}|{name}"] == pytest.approx([wb.sent, wb.received], abs=1e-9)
    t = (n - 1) * 81 // n        # the first case's last shard starts at element t (T = 81)
    for chunk in MPI_CHUNKS:
        faults = {x["faults"][str(chunk)] for x in ranks}
        assert len(faults) == 1, (chunk, faults)
        fault = faults.pop()
        assert fault is not None and fault.startswith(
            f"rank {n - 1} (the owner of shard {n - 1}) received a malformed payload from rank 1: "), fault
        if chunk > 0:
            assert f"shard {n - 1} piece 1 (elements {t + 8}..{t + 15}): invalid code 0b11" in fault, fault


def test_128_fake_ranks_sum_into_int16_and_pack_at_9_bits(monkeypatch):
    """N = 128 (int16 sums, w = ceil(log2(257)) = 9 bits, the packing outside Numba's w <= 8): element
    0 of every worker is its largest, so its code is +1 under the shared MAX scaler 1.0 and Σ codes =
    128; every rank's mean is the in-process one, element 0 = 1.0."""
    from tgsim.codecs import TernGrad
    from tgsim.rng import StreamKey

    n = 128
    g = {"w": np.array([1.0] + [0.0] * 12, np.float32), "b": np.zeros(5, np.float32)}
    codec = TernGrad(clip="none", min_size=10)
    sc = codec.scaling(g)
    s = InProcessExchange(n).max_scalers(np.stack([codec.local_scalers(sc)] * n))
    msgs = [codec.encode(g, StreamKey(1, 0, w), s, sc) for w in range(n)]
    want, _ = InProcessExchange(n).aggregate(codec, msgs, "sharded_ps", True)
    assert want["w"].tolist() == [1.0] + [0.0] * 12 and sharded.shard_plan(13, n, "2bit").width == 9
    for mean, _ in ok(run_ranks(n, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "sharded_ps", True),
                                monkeypatch)):
        assert same_bits(mean, want)


# -- over torch.distributed (Gloo) at 3 ranks -----------------------------------------------------------

@needs_mpi
def test_gloo_transport_at_three_ranks_gives_mpi4pys_results(tmp_path):
    """`mpiexec -n 3` of tests/torch_ddp_driver.py --transport torch with only the sharded checks of
    tests/dist_comm_cases.py: MPIExchange over TorchDistComm (Gloo's Alltoallv and Allgatherv) returns
    on every rank the means, bit for bit, and the bytes it returns over mpi4py (whose bits equal the
    simulator's: the MPI tests above); 2 ranks: tests/test_torch_dist_comm.py."""
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install tgsim[torch])")
    from mpi_cases import mpiexec
    from torch_ddp_cases import DRIVER

    names = ["terngrad-sharded_ps", "terngrad-sharded_ps-pieces", "terngrad-sharded_ps-base3"]
    (tmp_path / "cases.json").write_text(json.dumps({"train": {}, "exchanges": names}))
    (tmp_path / "out").mkdir()
    res, _ = mpiexec([(3, [str(DRIVER), str(tmp_path / "cases.json"), str(tmp_path / "out"), "--transport", "torch"])],
                     timeout=180)
    assert res.returncode == 0, res.report()
    ranks = json.loads((tmp_path / "out" / "results.json").read_text())
    assert len(ranks) == 3
    for r in ranks:
        assert r["exchange"] == {name: "ok" for name in names}, (r["rank"], r["exchange"])
