"""The pipelined exchanges' pieces (no MPI needed): the pieces tile the slot and the downlink; piece by
piece the server computes and every rank decodes the whole-message bytes and bits, and the all-gather
sums TernGrad.aggregate's bits."""

import numpy as np
import pytest

import tgsim.exchange.mpi  # noqa: F401  (imported at collection: tools/mutation.py counts module-level
import tgsim.exchange.mpi_env  # noqa: F401  lines as run at import)
from tgsim.codecs import TernGrad, packing
from tgsim.codecs.message import KIND_FLOAT, KIND_TERNARY, LayerSpec, Layout
from tgsim.exchange import InProcessExchange
from tgsim.exchange.ps_downlink import ps_decode_base, ps_downlink
from tgsim.exchange.pieces import ALIGN, HDR, PiecePlan, SenderError
from tgsim.rng import StreamKey

from fakes import _terngrad

SHAPES = {"a": (37, 13), "bias": (13,), "empty": (0,), "scalar": (), "b": (1001,), "c": (40,), "d": (3,)}


def _messages(n: int, fmt: str, seed: int = 7, shared: bool = True):
    codec = TernGrad(packing=fmt, min_size=5, float_layers=("bias",))
    rng = np.random.default_rng(seed)
    layers = [{k: (rng.standard_normal(s) * 10.0 ** rng.uniform(-3, 3, s)).astype(np.float32)
               for k, s in SHAPES.items()} for _ in range(n)]
    scalings = [codec.scaling(g) for g in layers]
    shared = InProcessExchange(n).max_scalers(np.stack([codec.local_scalers(s) for s in scalings])) if shared else None
    msgs = [codec.encode(layers[w], StreamKey(seed, 1, w), shared, scalings[w]) for w in range(n)]
    return codec, msgs


def _slots(msgs) -> np.ndarray:
    """Each worker's slot as MPIExchange sends it: [u64 length | serialized message]."""
    return np.stack([np.frombuffer(np.uint64(m.wire_bytes).tobytes() + m.to_bytes(), np.uint8) for m in msgs])


@pytest.mark.parametrize("fmt", ["2bit", "base3"])
@pytest.mark.parametrize("n", [1, 2, 3, 8, 130])
@pytest.mark.parametrize("chunk", [0, 1, 40, 41, 200, 1 << 18])
def test_pieces_give_the_whole_message_bytes_and_bits(fmt, n, chunk):
    codec, msgs = _messages(n, fmt, seed=n)
    plan = PiecePlan(msgs[0].layout, n, chunk)
    slots = _slots(msgs)
    assert slots.shape[1] == plan.slot_bytes
    # the pieces tile both buffers, in order, and cover every element once
    assert [p.up for p in plan.pieces] == list(zip([0] + [p.up[1] for p in plan.pieces[:-1]],
                                                   [p.up[1] for p in plan.pieces]))
    assert plan.pieces[-1].up[1] == plan.slot_bytes and plan.pieces[-1].down[1] == plan.down_bytes
    seen = {i: [] for i in range(len(SHAPES))}
    for p in plan.pieces:
        for i, e0, e1 in p.ranges:
            seen[i].append((e0, e1))
            assert e0 % ALIGN == 0
    for i, spec in enumerate(msgs[0].layout.layers):
        ranges = seen[i]
        assert ranges[0][0] == 0 and ranges[-1][1] == spec.size
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    if chunk > 0:
        assert all(sum(e1 - e0 for _, e0, e1 in p.ranges) <= max(ALIGN, chunk) for p in plan.pieces)
    # the server's pieces == the whole downlink; the decoded pieces == the whole decode
    whole = ps_downlink(codec, msgs, shared=True)
    down = np.zeros(plan.down_bytes, dtype=np.uint8)
    kern = codec.kernels_for(np)
    plan.check_headers(slots)
    for k, p in enumerate(plan.pieces):
        plan.downlink(k, slots, 0, msgs[0].scalers, kern, down[p.down[0]:p.down[1]])
    assert down.tobytes() == whole.tobytes()
    flat, scalers = plan.empty_mean(), np.zeros(len(SHAPES), np.float32)
    for k, p in enumerate(plan.pieces):
        plan.decode(k, down[p.down[0]:p.down[1]], flat, scalers)
    ref = ps_decode_base(msgs[0].layout, whole, n, shared=True)
    sim = InProcessExchange(n).aggregate(codec, msgs, "ps", True)[0]
    for i, spec in enumerate(msgs[0].layout.layers):
        assert flat[i].tobytes() == ref[spec.name].tobytes() == sim[spec.name].tobytes(), spec.name


def test_chunking_cuts_large_layers_and_groups_small_ones():
    _, msgs = _messages(2, "2bit")
    plan = PiecePlan(msgs[0].layout, 2, 400)
    assert len(plan.pieces) > 3
    assert max(len(p.ranges) for p in plan.pieces) > 1           # small layers share a piece
    assert len(PiecePlan(msgs[0].layout, 2, 0).pieces) == 1          # chunk 0: the whole message


def test_a_corrupt_piece_names_its_sender():
    """Positive controls: a bad header, scaler or code in a late piece is found, naming the rank."""
    codec, msgs = _messages(3, "2bit")
    plan = PiecePlan(msgs[0].layout, 3, 40)
    kern = codec.kernels_for(np)
    down = np.zeros(plan.down_bytes, dtype=np.uint8)

    def run(slots):
        plan.check_headers(slots)
        for k, p in enumerate(plan.pieces):
            plan.downlink(k, slots, 0, msgs[0].scalers, kern, down[p.down[0]:p.down[1]])

    good = _slots(msgs)
    run(good)
    bad = good.copy()
    c = msgs[0].layout.names.index("c")
    bad[2, plan.up_base[c] + 4 + 9] = 0xFF                     # layer c's last code byte (a late piece)
    with pytest.raises(SenderError, match="layer 'c': invalid code 0b11 at byte 9") as e:
        run(bad)
    assert e.value.sender == 2
    bad = good.copy()
    i = msgs[0].layout.names.index("b")
    bad[0, plan.up_base[i] + 4 + 100] = 0xFF                  # layer b's byte 100: in its third piece
    with pytest.raises(SenderError, match="layer 'b': invalid code 0b11 at byte 100 ") as e:
        run(bad)
    assert e.value.sender == 0
    bad = good.copy()
    bad[1, HDR:HDR + 4] = np.frombuffer(b"XXXX", np.uint8)
    with pytest.raises(SenderError, match="magic") as e:
        run(bad)
    assert e.value.sender == 1
    bad = good.copy()
    i = msgs[0].layout.names.index("b")
    bad[1, plan.up_base[i]:plan.up_base[i] + 4] = np.float32(msgs[0].scalers[i] * 2).reshape(1).view(np.uint8)
    with pytest.raises(SenderError, match="layer 'b' has scaler") as e:
        run(bad)
    assert e.value.sender == 1


def test_a_corrupt_downlink_piece_raises():
    codec, msgs = _messages(2, "2bit")
    plan = PiecePlan(msgs[0].layout, 2, 40)
    down = ps_downlink(codec, msgs, shared=True).copy()
    flat, scalers = plan.empty_mean(), np.zeros(len(SHAPES), np.float32)
    c = msgs[0].layout.names.index("c")
    k = next(j for j, p in enumerate(plan.pieces) if any(r[0] == c for r in p.ranges))
    p = plan.pieces[k]
    for j in range(k):
        q = plan.pieces[j]
        plan.decode(j, down[q.down[0]:q.down[1]], flat, scalers)
    with pytest.raises(ValueError, match="bytes, the plan needs"):
        plan.decode(k, down[p.down[0]:p.down[1] - 1], flat, scalers)
    down[plan.down_pos(c, 0) + 4 + 14] = 0xFF                  # 3-bit values of 7 > 2N = 4
    with pytest.raises(ValueError, match="layer 'c': downlink code sum 5 exceeds N = 2"):
        plan.decode(k, down[p.down[0]:p.down[1]], flat, scalers)
    with pytest.raises(ValueError, match="layer 'c': downlink code sum 5 exceeds N = 2"):   # the whole message
        ps_decode_base(msgs[0].layout, down, 2, shared=True)


@pytest.mark.parametrize("n", [2, 200])          # 3-bit values (the Numba pass), 9-bit values (the array path)
def test_unpack_code_sums_rejects_a_sum_beyond_n(n):
    width = packing.uint_width(n)
    ok = packing.pack_uint(np.array([0, n, 2 * n, n], dtype=np.uint32), width)
    assert np.array_equal(packing.unpack_code_sums(ok, 4, width, n, 1.0), np.array([-1, 0, 1, 0], np.float32))
    bad = packing.pack_uint(np.array([0, n, 2 * n + 1, n], dtype=np.uint32), width)
    with pytest.raises(ValueError, match=f"layer 'w': downlink code sum {n + 1} exceeds N = {n}"):
        packing.unpack_code_sums(bad, 4, width, n, 1.0, name="w")


def _aggregate_in_pieces(plan, slots, codec, shared):
    """The all-gather's receive side: piece-major rows (piece k of every rank), summed piece by piece."""
    n = slots.shape[0]
    flat, scalers = plan.empty_mean(), np.zeros((len(plan.layout.layers), n), np.float32)
    for k, p in enumerate(plan.pieces):
        rows = np.ascontiguousarray(slots[:, p.up[0]:p.up[1]])
        if k == 0:
            plan.check_headers(rows)
        plan.aggregate(k, rows, p.up[0], scalers, flat, codec.kernels_for(np), shared)
    return flat


@pytest.mark.parametrize("fmt", ["2bit", "base3"])
@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("chunk", [0, 40, 200])
@pytest.mark.parametrize("shared", [True, False])
def test_allgather_pieces_give_the_aggregate_bits(fmt, n, chunk, shared):
    codec, msgs = _messages(n, fmt, seed=n + 11, shared=shared)
    plan = PiecePlan(msgs[0].layout, n, chunk)
    flat = _aggregate_in_pieces(plan, _slots(msgs), codec, msgs[0].scalers if shared else None)
    ref = codec.aggregate(msgs, divide_by=n)
    for i, spec in enumerate(msgs[0].layout.layers):
        assert flat[i].tobytes() == ref[spec.name].reshape(-1).tobytes(), spec.name
    if not shared and n > 1:     # positive control: the workers' scalers differ, and that shows
        assert len({float(m.scalers[0]) for m in msgs}) > 1


def test_allgather_pieces_name_a_bad_sender():
    codec, msgs = _messages(3, "base3")
    plan = PiecePlan(msgs[0].layout, 3, 40)
    bad = _slots(msgs).copy()
    c = msgs[0].layout.names.index("c")
    bad[1, plan.up_base[c] + 4 + 7] = 243                     # base-3 bytes are at most 242
    with pytest.raises(SenderError, match="layer 'c': invalid byte > 242 at byte 7") as e:
        _aggregate_in_pieces(plan, bad, codec, msgs[0].scalers)
    assert e.value.sender == 1


# -- deferred encoding: the codes of a piece encoded when it is sent ---------------------------------------

@pytest.mark.parametrize("fmt", ["2bit", "base3"])
@pytest.mark.parametrize("clip", ["none", "explicit"])
@pytest.mark.parametrize("shared", [True, False])
def test_deferred_messages_give_the_eager_bits(fmt, clip, shared):
    """encode / encode_many(deferred=True): the same bytes whole (`parts`, to_bytes) and piece by
    piece (PiecePlan.fill_slot), for pieces of any size."""
    codec = TernGrad(packing=fmt, clip=clip, min_size=5, float_layers=("bias",))
    rng = np.random.default_rng(3)
    n = 3
    batch = {k: (rng.standard_normal((n, *s)) * 10.0 ** rng.uniform(-3, 3, (n, *s))).astype(np.float32)
             for k, s in SHAPES.items()}
    scal = codec.scaling_many(batch)
    local = codec.local_scalers_many(scal, n)
    sh = local.max(axis=0) if shared else None
    eager = codec.encode_many(batch, 9, 4, np.arange(n), sh, scal)
    lazy = codec.encode_many(batch, 9, 4, np.arange(n), sh, scal, deferred=True)
    one = codec.encode({k: g[1] for k, g in batch.items()}, StreamKey(9, 4, 1), sh,
                       [None if s is None else s.worker(1) for s in scal], deferred=True)
    assert type(lazy[0]).__name__ == "DeferredMessage"
    for chunk in (40, 120, 0):
        plan = PiecePlan(eager[0].layout, n, chunk)
        for w in range(n):
            slot = np.zeros(plan.slot_bytes, dtype=np.uint8)
            for k in range(len(plan.pieces)):
                plan.fill_slot(k, lazy[w], slot)
            assert slot.tobytes() == np.uint64(eager[w].wire_bytes).tobytes() + eager[w].to_bytes()
    assert one.to_bytes() == eager[1].to_bytes()
    for e, d in zip(eager, lazy):
        assert d.to_bytes() == e.to_bytes()
        assert all(np.array_equal(a, b) for a, b in zip(d.parts, e.parts))


@pytest.mark.parametrize("fmt", ["2bit", "base3"])
@pytest.mark.parametrize("n", [1, 37, 40, 41, 70_001])
@pytest.mark.parametrize("clip", [np.inf, 0.5, np.nan])
def test_encode_range_is_a_slice_of_the_whole_encode(fmt, n, clip):
    """_numba.encode_range over consecutive ranges (starts on multiples of 40) == encode of the layer."""
    from tgsim.codecs.terngrad import numba_kernels as _numba

    rng = np.random.default_rng(n)
    g = (rng.standard_normal(n) * 2).astype(np.float32)
    key, s = StreamKey(5, 7, 3, 2), float(np.abs(g).max())
    whole = _numba.encode(g, s, clip, key, fmt)
    for chunk in (40, 4000):
        got = np.concatenate([_numba.encode_range(g[e:e + chunk], e, s, clip, key, fmt) for e in range(0, n, chunk)])
        assert got.tobytes() == whole.tobytes()
    if n > 1000:      # positive control: the same elements drawn from the wrong Philox blocks differ
        assert _numba.encode_range(g[40:], 40, s, np.inf, key, fmt).tobytes() != \
            _numba.encode_range(g[40:], 0, s, np.inf, key, fmt).tobytes()


def test_encode_range_rejects_a_start_inside_a_byte():
    from tgsim.codecs.terngrad import numba_kernels as _numba

    g = np.ones(40, np.float32)
    with pytest.raises(ValueError, match="not a multiple of 4"):
        _numba.encode_range(g, 2, 1.0, np.inf, StreamKey(1, 0, 0, 0), "2bit")
    with pytest.raises(ValueError, match="not a multiple of 20"):
        _numba.encode_range(g, 8, 1.0, np.inf, StreamKey(1, 0, 0, 0), "base3")


@pytest.mark.mutation
def test_pieces_are_immutable():
    """A plan's pieces are frozen (plans are cached and shared by every exchange call)."""
    import dataclasses

    from tgsim.exchange.pieces import PiecePlan

    _, msgs = _terngrad(2, sizes=(130, 5))
    p = PiecePlan(msgs[0].layout, 2, 40).pieces[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.up = (0, 1)
    assert hash(p) == hash(PiecePlan(msgs[0].layout, 2, 40).pieces[0])


# a float32 layer of 130 values (cut into 4 pieces at chunk 40), a ternary layer and an all-zero one
FWZ_SHAPES = {"f": (130,), "w": (10, 13), "z": (50,)}


def _batch(n, seed=3):
    rng = np.random.default_rng(seed)
    batch = {k: (rng.standard_normal((n, *s)) * 3).astype(np.float32) for k, s in FWZ_SHAPES.items()}
    batch["z"][:] = 0.0
    return batch


def _fwz_messages(n, shared=True, deferred=False, seed=3):
    codec = TernGrad(float_layers=("f",))
    batch = _batch(n, seed)
    scal = codec.scaling_many(batch)
    sh = codec.local_scalers_many(scal, n).max(axis=0) if shared else None
    msgs = codec.encode_many(batch, seed, 1, np.arange(n), sh, scal, deferred=deferred)
    return codec, msgs


def _layout(*sizes_kinds, fmt="2bit"):
    return Layout(tuple(LayerSpec(f"l{i}", (n,), kind) for i, (n, kind) in enumerate(sizes_kinds)), fmt)


@pytest.mark.mutation
def test_pieces_are_filled_up_to_chunk():
    """Two ternary layers of 80 elements, chunk 120: piece 0 takes all of layer 0 and 40 elements of
    layer 1 (exactly 120), piece 1 the last 40; a piece is closed only when less than 40 = ALIGN
    elements of room are left, not with exactly 40 left."""
    plan = PiecePlan(_layout((80, KIND_TERNARY), (80, KIND_TERNARY)), 2, 120)
    assert [p.ranges for p in plan.pieces] == [((0, 0, 80), (1, 0, 40)), ((1, 40, 80),)]


@pytest.mark.mutation
def test_offsets_inside_a_float_layer_by_hand():
    """A float32 layer has no scaler: element e sits 4e bytes after the layer's start in the slot
    and in the downlink; a ternary layer's element e (e a multiple of 40) sits after its 4-byte
    scaler, at e/4 bytes (2-bit codes) and e·w/8 bytes (w-bit downlink sums, w = 2 for N = 1)."""
    plan = PiecePlan(_layout((200, KIND_FLOAT), (200, KIND_TERNARY)), 1, 40)
    assert plan.width == 2
    assert plan.up_pos(0, 40) == plan.up_base[0] + 160 and plan.down_pos(0, 40) == plan.down_base[0] + 160
    assert plan.up_pos(0, 120) == plan.up_base[0] + 480 and plan.down_pos(0, 120) == plan.down_base[0] + 480
    assert plan.up_base[1] == plan.up_base[0] + 800 and plan.down_base[1] == 800
    assert plan.up_pos(1, 40) == plan.up_base[1] + 4 + 10 and plan.down_pos(1, 40) == plan.down_base[1] + 4 + 10
    # piece k of the float layer is 40 values: 160 bytes up and down
    assert [p.up[1] - p.up[0] for p in plan.pieces[1:5]] == [160] * 4
    assert plan.pieces[0].up[0] == 0 and plan.pieces[0].up[1] == HDR + plan.header + 160


@pytest.mark.mutation
@pytest.mark.parametrize("chunk", [40, 120])
@pytest.mark.parametrize("n", [1, 3])
def test_a_float_layer_in_several_pieces_gives_the_whole_message_bits(n, chunk):
    """Chunk 40 cuts the 130-value float layer into 4 pieces, chunk 120 into 2 (the second,
    values 120..129, shares its piece with the ternary layer after it): the server's downlink,
    every rank's decode and the all-gather's sum, piece by piece, are the whole-message bytes and
    bits; the all-zero layer (scaler 0 from every sender) is valid and decodes to zeros."""
    codec, msgs = _fwz_messages(n)
    plan = PiecePlan(msgs[0].layout, n, chunk)
    assert sum(1 for p in plan.pieces for i, _, _ in p.ranges if i == 0) == {40: 4, 120: 2}[chunk]
    if chunk == 120:
        assert plan.pieces[1].ranges == ((0, 120, 130), (1, 0, 80))
    slots = _slots(msgs)
    kern = codec.kernels_for(np)
    plan.check_headers(slots)
    whole = ps_downlink(codec, msgs, shared=True)
    down = np.zeros(plan.down_bytes, dtype=np.uint8)
    for k, p in enumerate(plan.pieces):
        plan.downlink(k, slots, 0, msgs[0].scalers, kern, down[p.down[0]:p.down[1]])
    assert down.tobytes() == whole.tobytes()
    flat, scalers = plan.empty_mean(), np.zeros(len(FWZ_SHAPES), np.float32)
    for k, p in enumerate(plan.pieces):
        plan.decode(k, down[p.down[0]:p.down[1]], flat, scalers)
    ref = ps_decode_base(msgs[0].layout, whole, n, shared=True)
    for i, name in enumerate(FWZ_SHAPES):
        assert flat[i].tobytes() == ref[name].reshape(-1).tobytes(), name
    assert not flat[2].any() and scalers[2] == 0.0
    # the float layer's mean, by a plain formula: f32(Σ_w f64(g_w) / N)
    g = _batch(n)["f"].astype(np.float64)
    assert np.allclose(flat[0], (g.sum(axis=0) / n).astype(np.float32), rtol=1e-6, atol=0)
    # the all-gather, piece-major rows
    flat, sc = plan.empty_mean(), np.zeros((len(FWZ_SHAPES), n), np.float32)
    for k, p in enumerate(plan.pieces):
        plan.aggregate(k, np.ascontiguousarray(slots[:, p.up[0]:p.up[1]]), p.up[0], sc, flat, kern, None)
    agg = codec.aggregate(msgs, divide_by=n)
    for i, name in enumerate(FWZ_SHAPES):
        assert flat[i].tobytes() == agg[name].reshape(-1).tobytes(), name
    sim = InProcessExchange(n).aggregate(codec, msgs, "ps", True)[0]
    assert sim["f"].tobytes() == ref["f"].tobytes()


@pytest.mark.mutation
@pytest.mark.parametrize("chunk", [40, 120])
def test_fill_slot_of_a_float_layer_in_several_pieces(chunk):
    """fill_slot, piece by piece from deferred messages, writes each worker's whole slot: the length
    word and the eager message's bytes, also for the float layer's later pieces (4 bytes a value)."""
    _, eager = _fwz_messages(2)
    _, lazy = _fwz_messages(2, deferred=True)
    assert type(lazy[0]).__name__ == "DeferredMessage"
    plan = PiecePlan(eager[0].layout, 2, chunk)
    for w in range(2):
        slot = np.zeros(plan.slot_bytes, dtype=np.uint8)
        for k in range(len(plan.pieces)):
            plan.fill_slot(k, lazy[w], slot)
        assert slot.tobytes() == np.uint64(eager[w].wire_bytes).tobytes() + eager[w].to_bytes()


@pytest.mark.mutation
@pytest.mark.parametrize("bad", [-1.0, np.inf])
def test_an_invalid_scaler_is_refused_without_shared_scalers(bad):
    """The all-gather without shared scalers (each sender its own): a negative or infinite scaler in
    sender 1's slot is a SenderError naming rank 1 ("invalid scaler"), whatever else is right."""
    codec, msgs = _fwz_messages(3, shared=False)
    plan = PiecePlan(msgs[0].layout, 3, 40)
    slots = _slots(msgs).copy()
    at = plan.up_base[1]                       # layer "w": its scaler is the layer's first 4 bytes
    slots[1, at:at + 4] = np.float32(bad).reshape(1).view(np.uint8)
    flat, sc = plan.empty_mean(), np.zeros((len(FWZ_SHAPES), 3), np.float32)
    with pytest.raises(SenderError, match="layer 'w': invalid scaler") as e:
        for k, p in enumerate(plan.pieces):
            plan.aggregate(k, np.ascontiguousarray(slots[:, p.up[0]:p.up[1]]), p.up[0], sc, flat,
                           codec.kernels_for(np), None)
    assert e.value.sender == 1


@pytest.mark.mutation
@pytest.mark.parametrize("fmt", ["2bit", "base3"])
def test_allgather_pieces_with_the_reference_kernels(fmt):
    """Kernels without WEIGHTED_SUM_INTO_OUT (the reference module: weighted_sum takes no out=) are
    called the plain way, with the piece's element count: the all-gather's pieces still give
    TernGrad.aggregate's bits."""
    from tgsim.codecs.terngrad import reference

    codec = TernGrad(packing=fmt, kernels="reference", float_layers=("f",))
    assert not hasattr(reference, "WEIGHTED_SUM_INTO_OUT")
    batch = _batch(3)
    scal = codec.scaling_many(batch)
    msgs = codec.encode_many(batch, 5, 1, np.arange(3), None, scal)
    plan = PiecePlan(msgs[0].layout, 3, 40)
    slots = _slots(msgs)
    flat, sc = plan.empty_mean(), np.zeros((len(FWZ_SHAPES), 3), np.float32)
    for k, p in enumerate(plan.pieces):
        plan.aggregate(k, np.ascontiguousarray(slots[:, p.up[0]:p.up[1]]), p.up[0], sc, flat, reference, None)
    agg = codec.aggregate(msgs, divide_by=3)
    for i, name in enumerate(FWZ_SHAPES):
        assert flat[i].tobytes() == agg[name].reshape(-1).tobytes(), name


@pytest.mark.mutation
def test_a_bad_code_of_a_high_rank_in_a_short_piece_names_it():
    """Layer "t" has 8 elements (2 bytes of 2-bit codes) and there are 3 senders: a byte 0xFF (code
    0b11) from rank 2 is blamed on rank 2, although the piece has fewer code bytes than senders."""
    codec = TernGrad(min_size=0)
    rng = np.random.default_rng(0)
    batch = {"t": rng.standard_normal((3, 8)).astype(np.float32)}
    scal = codec.scaling_many(batch)
    sh = codec.local_scalers_many(scal, 3).max(axis=0)
    msgs = codec.encode_many(batch, 1, 1, np.arange(3), sh, scal)
    plan = PiecePlan(msgs[0].layout, 3, 40)
    slots = _slots(msgs).copy()
    slots[2, plan.up_base[0] + 4 + 1] = 0xFF
    out = np.zeros(plan.down_bytes, np.uint8)
    with pytest.raises(SenderError, match="invalid code") as e:
        plan.downlink(0, slots, 0, msgs[0].scalers, codec.kernels_for(np), out)
    assert e.value.sender == 2


@pytest.mark.mutation
@pytest.mark.parametrize("bad", [-1.0, np.inf, np.nan])
def test_a_downlink_with_an_invalid_scaler_is_refused(bad):
    """A rank decoding the downlink refuses a negative or non-finite layer scaler (ValueError naming
    the layer) instead of scaling the sums by it."""
    codec, msgs = _fwz_messages(2)
    plan = PiecePlan(msgs[0].layout, 2, 0)
    down = ps_downlink(codec, msgs, shared=True).copy()
    at = plan.down_pos(1, 0)
    down[at:at + 4] = np.float32(bad).reshape(1).view(np.uint8)
    flat, scalers = plan.empty_mean(), np.zeros(len(FWZ_SHAPES), np.float32)
    with pytest.raises(ValueError, match="layer 'w': invalid scaler"):
        plan.decode(0, down, flat, scalers)
