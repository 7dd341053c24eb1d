"""The codec over many tensors at once (tgsim.codecs.base.FlatLayers, CodecProperties.multi_tensor).

A step's layers held in one buffer at offsets (a DDP bucket; the simulator's whole step) encode,
decode and aggregate with the bits of the same layers given as separate arrays, for every codec of
the registry (those without `multi_tensor` go through the buffer's views layer by layer), every
TernGrad sharing mode and scope, error feedback, and odd layer sizes (0, 1, not a multiple of the 4
or 5 codes a byte). TernGrad's multi-tensor kernels (tgsim.codecs.terngrad.numba_layers: every layer
in one compiled call, one parallel region, rows read in place) equal its per-layer reference path.
"""

from __future__ import annotations

import numpy as np
import pytest

from tgsim.codecs import error_feedback, registry
from tgsim.codecs.base import FlatLayers, IndexedLayers, flat_layers, layer_ids
from tgsim.codecs.terngrad import TernGrad
from tgsim.codecs.terngrad import numba_decode, numba_encode, numba_layers, numba_moments
from tgsim.codecs.terngrad.inputs import as_float32_rows
from tgsim.exchange import InProcessExchange
from tgsim.train.config import CodecConfig
from tgsim.train.loop import run_rounds

W = 3
SHAPES = {"conv.weight": (4, 3, 5), "conv.bias": (1,), "fc.weight": (7, 3), "fc.bias": (5,), "big": (4099,),
          "odd": (21,), "empty": (0,)}
TERNGRAD = [{}, {"sharing": "mean"}, {"sharing": "none"}, {"scope": "model"}, {"packing": "base3"},
            {"clip": "none", "min_size": 6}]
CASES = [(name, {}) for name in registry.names() if name != "terngrad"] + [("terngrad", o) for o in TERNGRAD]


def _grads(shapes=SHAPES, workers: int = W, seed: int = 5) -> dict:
    rng = np.random.default_rng(seed)
    return {k: (rng.standard_normal((workers, *s)) * (1 + i)).astype(np.float32) for i, (k, s) in
            enumerate(shapes.items())}


def _codec(name: str, options: dict, ef: bool = False):
    codec = registry.make_codec(CodecConfig(name=name, options=dict(options)))
    return error_feedback.ErrorFeedback(codec) if ef else codec


def _step(codec, layers) -> tuple:
    """(each worker's message bytes, decoded layers, the mean over the W workers) of one step."""
    props, workers, ex = codec.properties, np.arange(W, dtype=np.int64), InProcessExchange(W)
    if props.rounds > 1:
        state = {k: v + 0.125 for k, v in codec.init_state({k: v.shape[1:] for k, v in layers.items()}, W).items()}
        mean, _, new = run_rounds(codec, ex, layers, 9, 2, workers, state)
        return [], [], {**mean, **{"state/" + k: v for k, v in new.items()}}
    state = None
    if props.stateful:
        state = {k: v + 0.25 for k, v in codec.init_state({k: v.shape[1:] for k, v in layers.items()}, W).items()}
    stats = codec.prepare_many(codec.encoder_inputs(layers, state) if state is not None else layers)
    shared = None
    if props.shared_stats is not None:
        local = codec.local_scalers_many(stats, W)
        shared = ex.max_scalers(local) if props.shared_stats == "max" else ex.mean_scalers(local)
    if state is not None:
        msgs, new = codec.encode_stateful(layers, 9, 2, workers, state, shared, stats)
    else:
        msgs, new = codec.encode_many(layers, 9, 2, workers, shared, stats), {}
    if props.float_mean:
        mean = ex.mean_fp32(msgs)[0]
        return [], [{k: np.asarray(v) for k, v in m.items()} for m in msgs], {**mean, **new}
    decoded = [{k: np.asarray(v) for k, v in codec.decode(m).items()} for m in msgs]
    mean = ex.aggregate(codec, msgs, "ps", shared is not None)[0]
    return [m.to_bytes() for m in msgs], decoded, {**mean, **new}


def _assert_same(a, b):
    assert a[0] == b[0]
    for x, y in zip(a[1], b[1]):
        assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
    assert a[2].keys() == b[2].keys()
    for k in a[2]:
        assert np.array_equal(np.asarray(a[2][k]).view(np.uint8), np.asarray(b[2][k]).view(np.uint8)), k


def _shapes_for(codec) -> dict:
    # PowerSGD compresses matrices; a 0-length layer has no rank-r factors: its shapes without one
    return {k: s for k, s in SHAPES.items() if k != "empty"} if codec.properties.rounds > 1 else SHAPES


@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}{o}" if o else n for n, o in CASES])
@pytest.mark.parametrize("ef", [False, True], ids=["plain", "ef"])
def test_one_buffer_has_the_bits_of_separate_layers(name, options, ef):
    """Every codec: the layers copied into one buffer (in a shuffled order, with gaps) give the bytes
    of every worker's message, its decode and the mean (and a stateful codec's new state) of the
    same layers as separate arrays."""
    if ef and (registry.codec_class(name).__name__ == "SignSGD" or name == "powersgd"):
        pytest.skip("error feedback refuses majority vote; PowerSGD keeps its own residuals")
    codec = _codec(name, options, ef)
    grads = _grads(_shapes_for(codec))
    names = list(grads)
    order = names[::-1]
    sizes = {k: int(np.prod(grads[k].shape[1:])) for k in names}
    starts, pos = {}, 3
    for k in order:                       # the buffer holds the layers in another order, with gaps
        starts[k] = pos
        pos += sizes[k] + 2
    buf = np.full((W, pos), np.nan, dtype=np.float32)
    for k in names:
        buf[:, starts[k]:starts[k] + sizes[k]] = grads[k].reshape(W, -1)
    flat = FlatLayers(buf, {k: starts[k] for k in names}, {k: grads[k].shape[1:] for k in names})
    assert list(flat) == names and layer_ids(flat) == list(range(len(names)))
    _assert_same(_step(codec, grads), _step(codec, flat))


@pytest.mark.parametrize("options", TERNGRAD[:3] + TERNGRAD[4:], ids=str)
def test_a_bucket_as_flat_layers_keeps_its_layer_indices(options):
    """A subset of the step's layers (a DDP bucket) in one buffer, with their indices in the full
    order: each layer's decode equals the whole step's, and numbered from 0 it differs."""
    codec = _codec("terngrad", options)
    grads = _grads()
    index = {k: i for i, k in enumerate(grads)}
    whole = _step(codec, grads)[1]
    bucket = ["odd", "fc.weight", "conv.bias"]
    sub = flat_layers(IndexedLayers({k: grads[k] for k in bucket}, index))
    assert layer_ids(sub) == [index[k] for k in bucket]
    dec = _step(codec, sub)[1]
    assert all(np.array_equal(dec[w][k], whole[w][k]) for w in range(W) for k in bucket)
    renumbered = _step(codec, flat_layers({k: grads[k] for k in bucket}))[1]
    assert any(not np.array_equal(renumbered[w][k], whole[w][k]) for w in range(W) for k in bucket)


@pytest.mark.parametrize("packing", ["2bit", "base3"])
@pytest.mark.parametrize("clip", ["explicit", "none"])
def test_terngrad_multi_tensor_kernels_equal_the_per_layer_reference(packing, clip):
    """TernGrad's Numba kernels on a FlatLayers (every layer in one call per pass, rows read in place)
    against its reference kernels layer by layer (kernels = "reference", no multi-tensor path): the
    same message bytes and mean; each layer draws its Philox words from its own stream key."""
    shapes = {"a": (1,), "b": (5,), "c": (21,), "d": (70001,), "e": (3000,), "f": (0,), "g": (4, 4)}
    grads = _grads(shapes, seed=11)
    fast = TernGrad(clip=clip, packing=packing)
    slow = TernGrad(clip=clip, packing=packing, kernels="reference")
    assert fast.properties.multi_tensor and not slow.properties.multi_tensor
    flat = flat_layers(grads)
    _assert_same(_step(slow, grads), _step(fast, flat))


def test_flat_rows_are_read_in_place():
    """A FlatLayers' layers reach TernGrad's kernels as rows of the buffer, not copies."""
    flat = flat_layers(_grads())
    for k, v in flat.items():
        rows = as_float32_rows(k, v, W)
        assert rows.size == 0 or np.shares_memory(rows, flat.buffer)


def test_one_parallel_region_over_many_layers(monkeypatch):
    """Many layers each below the per-layer parallel threshold (or of rows too short to split) run in
    one region of row tasks (moments), of (row, chunk) tasks (encode) and of (layer, chunk) tasks
    (decode) where they add up to it, with the bits of the per-layer functions."""
    import numba

    if numba.get_num_threads() < 2:
        pytest.skip("one Numba thread: every kernel runs serially")
    calls = {}
    for fn in ("_moments_rows_par", "_enc_rows_par", "_dec_par", "_moments_block"):
        real = getattr(numba_layers, fn)
        monkeypatch.setattr(numba_layers, fn, lambda *a, _r=real, _f=fn: calls.setdefault(_f, []).append(1) or _r(*a))
    rng = np.random.default_rng(2)
    sizes = [70001, 5000, 17, 1, 66000, 9000, 3, 65537, 70001, 70001]
    Gs = [rng.standard_normal((2, n)).astype(np.float32) * (i + 1) for i, n in enumerate(sizes)]
    for need_sigma in (True, False):
        got = numba_layers.moments_layers(Gs, need_sigma)
        for G, m in zip(Gs, got):
            ref = numba_moments.moments_many(G, need_sigma)
            assert all(np.array_equal(x, y) for x, y in zip(m, ref))
    assert len(calls.get("_moments_rows_par", [])) == 2 and "_moments_block" not in calls
    L = len(Gs)
    scalers = np.array([[np.abs(G).max() for G in Gs]] * 2, dtype=np.float32)
    bounds = [np.full(2, np.inf)] * L
    ids = [7 * i + 1 for i in range(L)]
    for fmt in ("2bit", "base3"):
        outs = numba_layers.encode_layers(Gs, scalers, bounds, 3, 4, np.array([5, 8]), ids, fmt)
        for i, G in enumerate(Gs):
            ref = numba_encode.encode_many(G, scalers[:, i], bounds[i], 3, 4, np.array([5, 8]), ids[i], fmt)
            assert np.array_equal(outs[i], ref), (fmt, i)
        sums = numba_layers.weighted_sum_layers(outs, scalers, sizes, fmt, 2)
        for i, n in enumerate(sizes):
            ref = numba_decode.weighted_sum(outs[i], scalers[:, i], n, fmt, 2)
            assert np.array_equal(sums[i].view(np.uint32), ref.view(np.uint32)), (fmt, i)
    assert len(calls["_enc_rows_par"]) == 2 and len(calls["_dec_par"]) == 2


def test_flat_layers_checks_and_views():
    buf = np.arange(2 * 10, dtype=np.float32).reshape(2, 10)
    f = FlatLayers(buf, {"b": 6, "a": 0}, {"b": (2, 2), "a": (3,)}, ids={"a": 4, "b": 9})
    assert list(f) == ["b", "a"] and f.ids == {"b": 9, "a": 4} and layer_ids(f) == [9, 4]
    assert np.array_equal(f["b"], buf[:, 6:10].reshape(2, 2, 2)) and np.shares_memory(f["a"], buf)
    with pytest.raises(ValueError, match="outside"):
        FlatLayers(buf, {"a": 8}, {"a": (3,)})
    with pytest.raises(ValueError, match="2-D"):
        FlatLayers(buf[0], {"a": 0}, {"a": (3,)})
    one = np.arange(12, dtype=np.float32)
    g = FlatLayers.from_views(one, {"x": one[4:10].reshape(2, 3), "y": one[:2]}, {"x": 1, "y": 0})
    assert g.starts == {"x": 4, "y": 0} and g["x"].shape == (1, 2, 3) and np.shares_memory(g["x"], one)
    with pytest.raises(ValueError, match="contiguous range"):
        FlatLayers.from_views(one, {"x": one[::2]})
    with pytest.raises(ValueError, match="contiguous range"):
        FlatLayers.from_views(one, {"x": np.zeros(3, np.float32)})


def test_nonfinite_in_a_flat_buffer_names_the_layer_and_worker():
    from tgsim.errors import NonFiniteGradientError

    grads = _grads()
    grads["fc.weight"][1, 2, 1] = np.nan
    codec = _codec("terngrad", {})
    with pytest.raises(NonFiniteGradientError) as a:
        codec.prepare_many(grads)
    with pytest.raises(NonFiniteGradientError) as b:
        codec.prepare_many(flat_layers(grads))
    assert str(a.value) == str(b.value) and "fc.weight" in str(b.value)


def test_codecs_declare_multi_tensor_and_the_table_lists_it():
    rows = {r["codec"]: r for r in registry.describe()}
    assert all("multi_tensor" in r for r in rows.values())
    assert rows["terngrad"]["multi_tensor"] is True
    assert error_feedback.ErrorFeedback(TernGrad()).properties.multi_tensor
