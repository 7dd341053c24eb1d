"""Tests that kill the mutants `tools/mutation.py` found surviving in tgsim/exchange/pieces.py
(issue 22, item 3): piece boundaries and byte offsets worked out by hand, a float32 layer cut into
several pieces, an all-zero layer (scaler 0), and malformed scalers, each against the whole-message
exchange or a value computed in the test."""

from __future__ import annotations

import numpy as np
import pytest

from tgsim.codecs import TernGrad
from tgsim.codecs.message import KIND_FLOAT, KIND_TERNARY, LayerSpec, Layout
from tgsim.exchange import InProcessExchange
from tgsim.exchange.pieces import HDR, PiecePlan, SenderError
from tgsim.exchange.ps_downlink import ps_decode_base, ps_downlink
from tgsim.rng import StreamKey

# a float32 layer of 130 values (cut into 4 pieces at chunk 40), a ternary layer and an all-zero one
SHAPES = {"f": (130,), "w": (10, 13), "z": (50,)}


def _batch(n, seed=3):
    rng = np.random.default_rng(seed)
    batch = {k: (rng.standard_normal((n, *s)) * 3).astype(np.float32) for k, s in SHAPES.items()}
    batch["z"][:] = 0.0
    return batch


def _messages(n, shared=True, deferred=False, seed=3):
    codec = TernGrad(float_layers=("f",))
    batch = _batch(n, seed)
    scal = codec.scaling_many(batch)
    sh = codec.local_scalers_many(scal, n).max(axis=0) if shared else None
    msgs = codec.encode_many(batch, seed, 1, np.arange(n), sh, scal, deferred=deferred)
    return codec, msgs


def _slots(msgs):
    """Each worker's slot: [u64 length | serialized message]."""
    return np.stack([np.frombuffer(np.uint64(m.wire_bytes).tobytes() + m.to_bytes(), np.uint8) for m in msgs])


def _layout(*sizes_kinds, fmt="2bit"):
    return Layout(tuple(LayerSpec(f"l{i}", (n,), kind) for i, (n, kind) in enumerate(sizes_kinds)), fmt)


def test_pieces_are_filled_up_to_chunk():
    """Two ternary layers of 80 elements, chunk 120: piece 0 takes all of layer 0 and 40 elements of
    layer 1 (exactly 120), piece 1 the last 40; a piece is closed only when less than 40 = ALIGN
    elements of room are left, not with exactly 40 left."""
    plan = PiecePlan(_layout((80, KIND_TERNARY), (80, KIND_TERNARY)), 2, 120)
    assert [p.ranges for p in plan.pieces] == [((0, 0, 80), (1, 0, 40)), ((1, 40, 80),)]


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


@pytest.mark.parametrize("chunk", [40, 120])
@pytest.mark.parametrize("n", [1, 3])
def test_a_float_layer_in_several_pieces_gives_the_whole_message_bits(n, chunk):
    """Chunk 40 cuts the 130-value float layer into 4 pieces, chunk 120 into 2 (the second,
    values 120..129, shares its piece with the ternary layer after it): the server's downlink,
    every rank's decode and the all-gather's sum, piece by piece, are the whole-message bytes and
    bits; the all-zero layer (scaler 0 from every sender) is valid and decodes to zeros."""
    codec, msgs = _messages(n)
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
    flat, scalers = plan.empty_mean(), np.zeros(len(SHAPES), np.float32)
    for k, p in enumerate(plan.pieces):
        plan.decode(k, down[p.down[0]:p.down[1]], flat, scalers)
    ref = ps_decode_base(msgs[0].layout, whole, n, shared=True)
    for i, name in enumerate(SHAPES):
        assert flat[i].tobytes() == ref[name].reshape(-1).tobytes(), name
    assert not flat[2].any() and scalers[2] == 0.0
    # the float layer's mean, by a plain formula: f32(Σ_w f64(g_w) / N)
    g = _batch(n)["f"].astype(np.float64)
    assert np.allclose(flat[0], (g.sum(axis=0) / n).astype(np.float32), rtol=1e-6, atol=0)
    # the all-gather, piece-major rows
    flat, sc = plan.empty_mean(), np.zeros((len(SHAPES), n), np.float32)
    for k, p in enumerate(plan.pieces):
        plan.aggregate(k, np.ascontiguousarray(slots[:, p.up[0]:p.up[1]]), p.up[0], sc, flat, kern, None)
    agg = codec.aggregate(msgs, divide_by=n)
    for i, name in enumerate(SHAPES):
        assert flat[i].tobytes() == agg[name].reshape(-1).tobytes(), name
    sim = InProcessExchange(n).aggregate(codec, msgs, "ps", True)[0]
    assert sim["f"].tobytes() == ref["f"].tobytes()


@pytest.mark.parametrize("chunk", [40, 120])
def test_fill_slot_of_a_float_layer_in_several_pieces(chunk):
    """fill_slot, piece by piece from deferred messages, writes each worker's whole slot: the length
    word and the eager message's bytes, also for the float layer's later pieces (4 bytes a value)."""
    _, eager = _messages(2)
    _, lazy = _messages(2, deferred=True)
    assert type(lazy[0]).__name__ == "DeferredMessage"
    plan = PiecePlan(eager[0].layout, 2, chunk)
    for w in range(2):
        slot = np.zeros(plan.slot_bytes, dtype=np.uint8)
        for k in range(len(plan.pieces)):
            plan.fill_slot(k, lazy[w], slot)
        assert slot.tobytes() == np.uint64(eager[w].wire_bytes).tobytes() + eager[w].to_bytes()


@pytest.mark.parametrize("bad", [-1.0, np.inf])
def test_an_invalid_scaler_is_refused_without_shared_scalers(bad):
    """The all-gather without shared scalers (each sender its own): a negative or infinite scaler in
    sender 1's slot is a SenderError naming rank 1 ("invalid scaler"), whatever else is right."""
    codec, msgs = _messages(3, shared=False)
    plan = PiecePlan(msgs[0].layout, 3, 40)
    slots = _slots(msgs).copy()
    at = plan.up_base[1]                       # layer "w": its scaler is the layer's first 4 bytes
    slots[1, at:at + 4] = np.float32(bad).reshape(1).view(np.uint8)
    flat, sc = plan.empty_mean(), np.zeros((len(SHAPES), 3), np.float32)
    with pytest.raises(SenderError, match="layer 'w': invalid scaler") as e:
        for k, p in enumerate(plan.pieces):
            plan.aggregate(k, np.ascontiguousarray(slots[:, p.up[0]:p.up[1]]), p.up[0], sc, flat,
                           codec.kernels_for(np), None)
    assert e.value.sender == 1


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
    flat, sc = plan.empty_mean(), np.zeros((len(SHAPES), 3), np.float32)
    for k, p in enumerate(plan.pieces):
        plan.aggregate(k, np.ascontiguousarray(slots[:, p.up[0]:p.up[1]]), p.up[0], sc, flat, reference, None)
    agg = codec.aggregate(msgs, divide_by=3)
    for i, name in enumerate(SHAPES):
        assert flat[i].tobytes() == agg[name].reshape(-1).tobytes(), name


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


@pytest.mark.parametrize("bad", [-1.0, np.inf, np.nan])
def test_a_downlink_with_an_invalid_scaler_is_refused(bad):
    """A rank decoding the downlink refuses a negative or non-finite layer scaler (ValueError naming
    the layer) instead of scaling the sums by it."""
    codec, msgs = _messages(2)
    plan = PiecePlan(msgs[0].layout, 2, 0)
    down = ps_downlink(codec, msgs, shared=True).copy()
    at = plan.down_pos(1, 0)
    down[at:at + 4] = np.float32(bad).reshape(1).view(np.uint8)
    flat, scalers = plan.empty_mean(), np.zeros(len(SHAPES), np.float32)
    with pytest.raises(ValueError, match="layer 'w': invalid scaler"):
        plan.decode(0, down, flat, scalers)
