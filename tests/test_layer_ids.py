"""A subset of a step's layers encoded on its own (tgsim.codecs.base.IndexedLayers: each layer with its
index in the full order) gives each layer the bits it has when all layers are encoded in one call, for
every codec that does not declare `properties.whole_step`: the messages' decoded layers, and the
aggregate over workers. A plain dict keeps the positions 0, 1, ... (every existing caller). TernGrad
with scope = "model" and PowerSGD declare whole_step; the codec table of `tgsim codecs` shows it."""

from __future__ import annotations

import numpy as np
import pytest

from tgsim.codecs import error_feedback, registry
from tgsim.codecs.base import IndexedLayers, layer_ids, with_ids
from tgsim.train.config import CodecConfig

SHAPES = {"a.bias": (7,), "a.weight": (7, 30), "b.bias": (3,), "b.weight": (3, 7)}
SUBSETS = [["b.weight", "b.bias"], ["a.bias", "a.weight"]]        # DDP's buckets: the last layers first
CODECS = [("qsgd", {}), ("randomk", {}), ("suresh", {"rotate": True}), ("suresh", {}), ("terngrad", {}),
          ("terngrad", {"sharing": "none", "min_size": 10}), ("scaled_sign", {}), ("topk", {})]


def _grads(workers: int) -> dict:
    rng = np.random.default_rng(3)
    return {k: rng.standard_normal((workers, *s)).astype(np.float32) for k, s in SHAPES.items()}


def _decoded(codec, msgs) -> list[dict]:
    return [{k: np.asarray(v) for k, v in codec.decode(m).items()} for m in msgs]


def test_layer_ids_default_to_positions_and_follow_an_indexed_mapping():
    assert layer_ids({"x": 1, "y": 2}) == [0, 1]
    sub = IndexedLayers({"y": 2, "x": 1}, {"x": 5, "y": 9, "z": 0})
    assert layer_ids(sub) == [9, 5] and sub.ids == {"y": 9, "x": 5}
    assert layer_ids(with_ids({"y": 0, "x": 0}, sub)) == [9, 5]
    assert with_ids({"y": 0}, {"y": 1}) == {"y": 0} and not hasattr(with_ids({"y": 0}, {"y": 1}), "ids")


@pytest.mark.parametrize("name,options", CODECS, ids=[f"{n}{o}" for n, o in CODECS])
@pytest.mark.parametrize("ef", [False, True])
def test_a_subset_with_its_indices_has_the_whole_steps_bits(name, options, ef):
    """Two workers, the layers in two subsets (each in DDP's reverse order): every worker's decoded
    message and the aggregate of the two workers are the whole call's, layer by layer, with the
    subset's global indices; renumbered from 0 per subset, the random codecs' bits differ."""
    codec = registry.make_codec(CodecConfig(name=name, options=dict(options)))
    if ef:
        codec = error_feedback.ErrorFeedback(codec)
    assert not codec.properties.whole_step
    grads, index = _grads(2), {k: i for i, k in enumerate(SHAPES)}
    workers = np.array([0, 1], dtype=np.int64)

    def encode(layers):
        stats = codec.prepare_many(layers)
        if ef:
            state = codec.init_state({k: SHAPES[k] for k in layers}, 2)
            state = {k: v + 0.25 for k, v in state.items()}               # nonzero residuals
            return codec.encode_stateful(layers, 11, 4, workers, state, None, codec.prepare_many(
                codec.encoder_inputs(layers, state)))[0]
        return codec.encode_many(layers, 11, 4, workers, None, stats)

    whole = encode(grads)
    full_dec, full_mean = _decoded(codec, whole), codec.aggregate(whole)
    renumbered_differs = False
    for names in SUBSETS:
        sub = encode(IndexedLayers({k: grads[k] for k in names}, index))
        dec, mean = _decoded(codec, sub), codec.aggregate(sub)
        for w in range(2):
            for k in names:
                assert np.array_equal(dec[w][k], full_dec[w][k]), (k, w)
        for k in names:
            assert np.array_equal(np.asarray(mean[k]), np.asarray(full_mean[k])), k
        wrong = _decoded(codec, encode({k: grads[k] for k in names}))
        renumbered_differs |= any(not np.array_equal(wrong[w][k], full_dec[w][k]) for w in range(2) for k in names)
    random = name in ("qsgd", "randomk", "suresh", "terngrad")
    assert renumbered_differs == random


def test_suresh_bytes_round_trip_keeps_the_receivers_indices():
    """The rotation's inverse needs the layer's index, which is not on the wire: `from_bytes` takes it
    from the receiver's own message of the same layers."""
    codec = registry.make_codec(CodecConfig(name="suresh", options={"rotate": True}))
    grads, index = _grads(2), {k: i for i, k in enumerate(SHAPES)}
    sub = IndexedLayers({k: grads[k] for k in SUBSETS[0]}, index)
    m0, m1 = codec.encode_many(sub, 1, 2, np.array([0, 1]), None, codec.prepare_many(sub))
    back = codec.from_bytes(m1.to_bytes(), like=m0)
    assert back.ids == m1.ids == (3, 2)
    assert all(np.array_equal(codec.decode(back)[k], codec.decode(m1)[k]) for k in SUBSETS[0])


def test_whole_step_is_declared_and_listed():
    def make(name, **options):
        return registry.make_codec(CodecConfig(name=name, options=options))

    assert make("terngrad", scope="model").properties.whole_step
    assert not make("terngrad").properties.whole_step
    assert make("powersgd").properties.whole_step
    assert error_feedback.ErrorFeedback(make("terngrad", scope="model")).properties.whole_step
    rows = {r["codec"]: r for r in registry.describe()}
    assert rows["powersgd"]["whole_step"] is True and rows["qsgd"]["whole_step"] is False


def test_terngrads_deferred_messages_draw_under_the_subsets_indices():
    """TernGrad's deferred messages (codes encoded piece by piece as the pipelined exchange sends them)
    of a subset hold the codes of the ordinary messages of that subset, not of renumbered layers."""
    codec = registry.make_codec(CodecConfig(name="terngrad", options={"min_size": 10}))
    grads, index = _grads(2), {k: i for i, k in enumerate(SHAPES)}
    sub = IndexedLayers({k: grads[k] for k in SUBSETS[0]}, index)          # indices 3, 2
    workers = np.array([0, 1], dtype=np.int64)
    plain = codec.encode_many(sub, 3, 1, workers, None, codec.prepare_many(sub))
    deferred = codec.encode_many(sub, 3, 1, workers, None, codec.prepare_many(sub), deferred=True)
    assert type(deferred[0]).__name__ == "DeferredMessage"
    for p, d in zip(plain, deferred):
        assert p.to_bytes() == d.to_bytes()
