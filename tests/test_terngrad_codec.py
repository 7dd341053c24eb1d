"""tgsim/codecs/terngrad/codec.py: construction and properties, input conversion, exact_error, the
order of errors, shared scalers and deferred encoding. Expected values are worked out by hand or
with plain NumPy, never with the module under test."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tgsim.codecs import TernGrad
from tgsim.codecs.message import KIND_FLOAT, KIND_TERNARY, Message, layer_payloads
from tgsim.codecs.terngrad import reference
from tgsim.codecs.terngrad.codec import DeferredMessage, as_float32_rows
from tgsim.rng import StreamKey


@pytest.mark.mutation
def test_encode_many_batch_holds_the_ternary_payload_array_and_none_for_float_layers():
    """encode_many's PayloadBatch: for a ternary layer the (W, nbytes) uint8 array whose rows are the
    messages' parts (ceil(12/4) = 3 bytes a worker), None for a float32 layer; layer_payloads hands
    that array back."""
    codec = TernGrad(float_layers=("b",))
    rng = np.random.default_rng(3)
    layers = {"a": rng.standard_normal((3, 12)).astype(np.float32), "b": rng.standard_normal((3, 2)).astype(np.float32)}
    msgs = codec.encode_many(layers, 5, 1, np.arange(3))
    batch = msgs[0].batch
    assert batch.arrays[1] is None
    pay = batch.arrays[0]
    assert pay is not None and pay.dtype == np.uint8 and pay.shape == (3, 3)
    for w, m in enumerate(msgs):
        assert m.batch is batch and np.shares_memory(m.parts[0], pay) and np.array_equal(m.parts[0], pay[w])
    assert layer_payloads(msgs, 0) is pay


@pytest.mark.mutation
def test_a_type_error_stops_the_pass_before_later_layers_are_read():
    """Worker 0's own layers in order: "a" fine, "b" integer (TypeError), "c" with a NaN. Worker 0's
    per-worker call stops at "b", and the batched pass raises what it would: the TypeError naming
    "b", not a NonFiniteGradientError about a later layer."""
    layers = {"a": np.ones((2, 8), np.float32), "b": np.ones((2, 8), np.int64), "c": np.ones((2, 8), np.float32)}
    layers["c"][0, 3] = np.nan
    with pytest.raises(TypeError, match=r"^layer 'b': gradient dtype int64 is not floating point"):
        TernGrad().scaling_many(layers)


class _WholeStepKernels:
    """The reference kernels plus the whole-step entry points the CUDA set offers (moments_layers,
    encode_layers, weighted_sum_layers), here plain loops over the per-layer kernels; records calls."""

    def __init__(self):
        self.calls = []
        self.moments_many, self.encode_many = reference.moments_many, reference.encode_many
        self.weighted_sum = reference.weighted_sum

    def moments_layers(self, Gs, need_sigma):
        self.calls.append(("moments", [G.shape for G in Gs]))
        return [reference.moments_many(G, need_sigma) for G in Gs]

    def encode_layers(self, Gs, scalers, clip_bounds, seed, step, workers, layers, fmt):
        self.calls.append(("encode", list(layers)))
        return [reference.encode_many(G, scalers[:, j], clip_bounds[j], seed, step, workers, layers[j], fmt)
                for j, G in enumerate(Gs)]

    def weighted_sum_layers(self, payloads, scalers, sizes, fmt, divide_by):
        self.calls.append(("sum", [np.asarray(p).shape for p in payloads]))
        return [reference.weighted_sum(np.asarray(p), scalers[:, j], sizes[j], fmt, divide_by)
                for j, p in enumerate(payloads)]


@pytest.mark.mutation
def test_whole_step_kernels_get_every_ternary_layer_in_one_call(monkeypatch):
    """A kernel set with whole-step entry points (the CUDA set) gets all ternary layers of a step in
    one call each and only those (float layer "b" travels as float32): moments of the (3, 12) and
    (3, 20) rows, encodes of layers 0 and 2, sums of their (3, 3) and (3, 5) payloads; messages and
    mean are the bits of the per-layer reference kernels. One worker with one ternary layer works too."""
    rng = np.random.default_rng(11)
    layers = {"a": rng.standard_normal((3, 12)).astype(np.float32), "b": rng.standard_normal((3, 2)).astype(np.float32),
              "c": rng.standard_normal((3, 20)).astype(np.float32)}
    codec = TernGrad(float_layers=("b",), kernels="reference")
    want_msgs = codec.encode_many(layers, 7, 1, np.arange(3))
    want = codec.aggregate(want_msgs)
    one = {"a": layers["a"][:1]}
    want_one = codec.aggregate(codec.encode_many(one, 7, 1, [0]))
    fake = _WholeStepKernels()
    monkeypatch.setattr(TernGrad, "kernels_for", lambda self, xp: fake)
    msgs = codec.encode_many(layers, 7, 1, np.arange(3))
    got = codec.aggregate(msgs)
    assert fake.calls == [("moments", [(3, 12), (3, 20)]), ("encode", [0, 2]), ("sum", [(3, 3), (3, 5)])]
    assert [m.to_bytes() for m in msgs] == [m.to_bytes() for m in want_msgs]
    assert all(np.array_equal(got[k].view(np.uint32), want[k].view(np.uint32)) for k in layers)
    got_one = codec.aggregate(codec.encode_many(one, 7, 1, [0]))
    assert np.array_equal(got_one["a"].view(np.uint32), want_one["a"].view(np.uint32))


@pytest.mark.mutation
def test_exact_error_names_its_argument_g_in_the_dtype_error():
    """exact_error(g) of an integer array: the TypeError of the float32 conversion names the layer
    "g" (the argument) and its dtype."""
    with pytest.raises(TypeError, match=r"^layer 'g': gradient dtype int64 is not floating point"):
        TernGrad().exact_error(np.arange(4, dtype=np.int64))


def _outlier(n=100, big=10.0):
    """n - 1 zeros and one `big`: σ (ddof 0) = big·sqrt((n-1))/n, easy to work out by hand."""
    g = np.zeros(n, dtype=np.float32)
    g[17] = big
    return g


@pytest.mark.mutation
@pytest.mark.parametrize("sharing, stats, unbiased", [("max", "max", True), ("mean", "mean", False),
                                                      ("none", None, True)])
def test_every_sharing_mode_is_accepted_and_declared(sharing, stats, unbiased):
    """The three documented sharing modes construct; properties.shared_stats is the mode (None for
    "none"), and only the shared mean (which clips at the mean) is declared biased."""
    codec = TernGrad(sharing=sharing)
    assert codec.properties.shared_stats == stats
    assert codec.unbiased is unbiased and codec.properties.unbiased is unbiased
    with pytest.raises(ValueError, match="sharing"):
        TernGrad(sharing="median")


@pytest.mark.mutation
def test_declared_properties_of_the_default_codec():
    """TernGrad speaks tgsim's packed-code wire (tgm1); with a shared scaler its codes sum exactly
    (the contract's allreduce test shows it: integer sums of codes == aggregate, bit for bit), and
    it says so in both places; the server may re-ternarize the downlink."""
    props = TernGrad().properties
    assert props.wire == "tgm1"
    assert props.sums_exactly is True
    assert props.server_reencodes is True
    assert TernGrad().allreduce_compatible is True


@pytest.mark.mutation
@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_clip_factor_must_be_positive_and_finite(bad):
    """c in c·σ: 0, negatives, inf and NaN are refused; any positive finite c (also c < 1) is taken."""
    with pytest.raises(ValueError, match="clip_factor"):
        TernGrad(clip_factor=bad)
    assert TernGrad(clip_factor=0.5).clip_factor == 0.5


@pytest.mark.mutation
def test_float_layers_given_as_a_list_become_a_tuple():
    """float_layers=["b"] is stored as ("b",): the codec stays hashable (its layouts are cached per
    codec) and layer "b" travels as float32."""
    codec = TernGrad(float_layers=["b"])
    assert codec.float_layers == ("b",)
    hash(codec)
    lay = codec.layout({"a": np.zeros(8, np.float32), "b": np.zeros(8, np.float32)})
    assert [s.kind for s in lay.layers] == [KIND_TERNARY, KIND_FLOAT]


@pytest.mark.mutation
def test_default_clip_factor_is_the_papers_2_5():
    """TernGrad(clip="explicit") clips at f32(2.5 σ) (c = 2.5 in every experiment of the paper):
    99 zeros and one 10 have σ = 10·sqrt(99)/100 (population), so the bound is f32(2.5 σ) < 10 and
    the local scaler is that bound."""
    g = _outlier()
    sigma = 10.0 * math.sqrt(99) / 100
    assert math.isclose(sigma, float(np.std(g.astype(np.float64))), rel_tol=1e-12)
    sc = TernGrad(clip="explicit").scaling({"g": g})[0]
    want = float(np.float32(2.5 * sigma))
    assert math.isclose(sc.clip_bound, want, rel_tol=1e-6) and math.isclose(sc.scaler, want, rel_tol=1e-6)


@pytest.mark.mutation
def test_default_min_size_keeps_no_layer_float_for_its_size():
    """min_size defaults to 0: no layer is float32 for being small, not even an empty one (its
    message part is a 4-byte scaler and no codes); min_size = 1 would make the empty layer float."""
    lay = TernGrad().layout({"e": np.zeros(0, np.float32), "one": np.zeros(1, np.float32)})
    assert [s.kind for s in lay.layers] == [KIND_TERNARY, KIND_TERNARY]
    assert lay.body_bytes() == (4 + 0) + (4 + 1)
    assert TernGrad(min_size=1).layout({"e": np.zeros(0, np.float32)}).layers[0].kind == KIND_FLOAT


@pytest.mark.mutation
def test_rows_refuse_a_worker_axis_of_the_wrong_length():
    """as_float32_rows(name, g, workers): ValueError when g's leading axis is not `workers` long;
    without `workers` any leading axis is taken, and (W, *shape) becomes (W, prod(shape))."""
    g = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    with pytest.raises(ValueError, match="leading"):
        as_float32_rows("w", g, workers=2)
    out = as_float32_rows("w", g)
    assert out.shape == (3, 4) and np.array_equal(out, np.arange(12, dtype=np.float32).reshape(3, 4))
    assert as_float32_rows("w", g, workers=3).shape == (3, 4)


@pytest.mark.mutation
def test_a_scalar_layer_round_trips():
    """A layer of shape () is one element: its rows are (W,) with no further axes (not "a missing
    worker axis"); encode/decode give back a scalar ±s or 0 with s = |g|, here g = -3 -> -3."""
    rows = as_float32_rows("s", np.array([1.0, -2.0, 0.5], np.float32))
    assert rows.shape == (3, 1)
    codec = TernGrad(kernels="reference")
    out = codec.decode(codec.encode({"s": np.float32(-3.0), "v": np.ones(4, np.float32)}, StreamKey(1)))
    assert out["s"].shape == () and float(out["s"]) == -3.0     # |g| = s: kept with probability 1
    assert np.array_equal(out["v"], np.ones(4, np.float32))


@pytest.mark.mutation
def test_exact_error_of_degenerate_layers_is_zero():
    """An empty layer and an all-zero layer (scaler 0) have no error: exactly 0.0."""
    codec = TernGrad()
    assert codec.exact_error(np.zeros(0, np.float32)) == 0.0
    assert codec.exact_error(np.zeros(5, np.float32)) == 0.0


@pytest.mark.mutation
def test_exact_error_without_clipping_by_hand():
    """s = ||g||_inf = 1, g = (1, 0.5, -0.25): s||g||_1 - ||g||_2^2 = 1.75 - 1.3125 = 0.4375."""
    g = np.array([1.0, 0.5, -0.25], np.float32)
    assert math.isclose(TernGrad().exact_error(g), 0.4375, rel_tol=1e-12)


@pytest.mark.mutation
def test_exact_error_with_implicit_clipping_by_hand():
    """Implicit clipping (public code): s = f32(2.5 σ) < 10, so the outlier 10 is sent as s with
    probability 1 (p = min(10/s, 1) = 1) and the zeros are exact: error (10 - s)^2."""
    g = _outlier()
    s = float(np.float32(2.5 * 10.0 * math.sqrt(99) / 100))
    assert s < 10.0
    assert math.isclose(TernGrad(clip="implicit").exact_error(g), (10.0 - s) ** 2, rel_tol=1e-6)


def _two_workers(a, b):
    return {"a": np.asarray(a), "b": np.asarray(b)}


@pytest.mark.mutation
def test_lowest_worker_wins_over_an_earlier_overflow_of_another():
    """Worker 1 overflows float32 in layer a (float64 1e39), worker 0 has a NaN in layer b: worker 0,
    called alone, fails first (at b), so scaling_many raises worker 0's NonFiniteGradientError for b
    (not worker 1's overflow: the loop must record it and go on to the later layers)."""
    from tgsim.errors import NonFiniteGradientError

    a = np.ones((2, 4))
    a[1, 2] = 1e39
    b = np.ones((2, 4), np.float32)
    b[0, 1] = np.nan
    with pytest.raises(NonFiniteGradientError, match="worker 0") as e:
        TernGrad().scaling_many(_two_workers(a, b))
    assert e.value.layer == "b" and e.value.worker == 0


@pytest.mark.mutation
def test_an_integer_layer_after_a_non_finite_one():
    """Layer a (float32) then layer b (int32), as worker-by-worker calls would meet them: worker 0's
    NaN in a is raised first; both workers' NaN: still worker 0's; only worker 1's NaN: worker 0
    meets the integer layer b before anything else fails, so TypeError."""
    from tgsim.errors import NonFiniteGradientError

    b = np.ones((2, 4), np.int32)
    for bad_workers, want in [((0,), 0), ((0, 1), 0), ((1,), None)]:
        a = np.ones((2, 4), np.float32)
        for w in bad_workers:
            a[w, 0] = np.inf
        if want is None:
            with pytest.raises(TypeError, match="not floating point"):
                TernGrad().scaling_many(_two_workers(a, b))
        else:
            with pytest.raises(NonFiniteGradientError) as e:
                TernGrad().scaling_many(_two_workers(a, b))
            assert e.value.layer == "a" and e.value.worker == want


@pytest.mark.mutation
def test_no_layers_means_no_workers():
    """A model without layers has no worker axis to read: W = 0, and encode_many of zero workers
    gives zero messages (W = 1 would refuse the empty worker list)."""
    codec = TernGrad()
    layout, nw = codec.layout_many({})
    assert nw == 0 and layout.layers == ()
    assert codec.encode_many({}, 1, 0, np.zeros(0, np.int64)) == []


@pytest.mark.mutation
def test_local_scalers_many_without_a_ternary_layer_has_no_rows():
    """W is read from the first ternary layer's scalers; with none and no `workers`, the result has
    no rows (0, L), not an invented worker; with workers=3, three rows of 0 (float layers)."""
    assert TernGrad.local_scalers_many([None, None]).shape == (0, 2)
    out = TernGrad.local_scalers_many([None, None], 3)
    assert out.shape == (3, 2) and not out.any()


@pytest.mark.mutation
def test_workers_must_be_w_integer_ids():
    """encode_many refuses float worker ids, and a worker list of the wrong length even when every
    layer is float32 (no kernel would notice)."""
    codec = TernGrad(kernels="reference", float_layers=("b",))
    g = {"b": np.ones((2, 3), np.float32)}
    with pytest.raises(ValueError, match="workers"):
        codec.encode_many(g, 1, 0, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="workers"):
        codec.encode_many({"w": np.ones((2, 8), np.float32)}, 1, 0, np.array([0.0, 1.0]))
    assert len(codec.encode_many(g, 1, 0, np.array([0, 1]))) == 2


@pytest.mark.mutation
def test_a_shared_mean_below_the_local_scaler_clips_at_it():
    """sharing = "mean": any finite shared s >= 0 is taken, also one below a worker's own max|g|
    (here 0.5 < 3): every element with |g| >= s is sent as ±s with probability 1, so g = (1, -1, 2,
    -3) decodes to (0.5, -0.5, 0.5, -0.5); s = 0 decodes to zeros."""
    codec = TernGrad(sharing="mean", kernels="reference")
    g = {"w": np.array([1.0, -1.0, 2.0, -3.0], np.float32)}
    out = codec.decode(codec.encode(g, StreamKey(2), shared_scalers=[0.5]))
    assert out["w"].tolist() == [0.5, -0.5, 0.5, -0.5]
    assert not codec.decode(codec.encode(g, StreamKey(2), shared_scalers=[0.0]))["w"].any()


@pytest.mark.mutation
@pytest.mark.parametrize("bad", [-1.0, np.nan, np.inf])
def test_a_shared_mean_must_be_finite_and_not_negative(bad):
    """sharing = "mean": a negative or non-finite shared scaler is refused with the mean's rule
    ("a finite value >= 0"), not the MAX rule's advice to share with MAX."""
    codec = TernGrad(sharing="mean", kernels="reference")
    g = {"v": np.ones(3, np.float32), "w": np.array([1.0, -1.0, 2.0, -3.0], np.float32)}
    with pytest.raises(ValueError, match="layer 'w'.*finite value >= 0$") as e:
        codec.encode(g, StreamKey(2), shared_scalers=[1.0, bad])
    assert "MAX" not in str(e.value)


@pytest.mark.mutation
def test_float_layers_carry_scaler_zero():
    """Message.scalers holds 0 for float32 layers (they have values, not a scaler), also when the
    shared scalers given for them are not 0."""
    codec = TernGrad(kernels="reference", float_layers=("b",))
    g = {"w": np.array([1.0, -2.0], np.float32), "b": np.array([5.0, 6.0], np.float32)}
    msg = codec.encode(g, StreamKey(3), shared_scalers=[2.0, 7.0])
    assert msg.scalers.tolist() == [2.0, 0.0]
    assert codec.decode(msg)["b"].tolist() == [5.0, 6.0]


def _deferrable():
    rng = np.random.default_rng(5)
    g = rng.standard_normal((7, 13)).astype(np.float32)
    g[0, 0] = 40.0                                     # beyond 2.5 σ: explicit clipping changes codes
    return {"w": g, "b": rng.standard_normal(6).astype(np.float32)}


@pytest.mark.mutation
def test_deferred_message_is_the_eager_message():
    """encode(deferred=True) with the Numba kernels: a DeferredMessage whose parts (computed once)
    and bytes are the eager Message's, float layer included; its element ranges [0, 40) and
    [40, 91) of the ternary layer and [2, 6) of the float layer are the eager bytes of those ranges."""
    from tgsim.codecs import packing
    from tgsim.codecs.message import Message

    codec = TernGrad(kernels="numba", clip="explicit", float_layers=("b",))
    layers, key = _deferrable(), StreamKey(4, 2, 1)
    eager = codec.encode(layers, key)
    lazy = codec.encode(layers, key, deferred=True)
    assert type(eager) is Message and isinstance(lazy, DeferredMessage)
    assert lazy.to_bytes() == eager.to_bytes()
    assert lazy.parts is lazy.parts
    codes = packing.unpack(eager.parts[0], 91, "2bit")
    first = lazy.write_range(0, 0, 40, np.empty(10, np.uint8))
    rest = lazy.write_range(0, 40, 91, np.empty(packing.packed_size(51, "2bit"), np.uint8))
    assert np.array_equal(packing.unpack(first, 40, "2bit"), codes[:40])
    assert np.array_equal(packing.unpack(rest, 51, "2bit"), codes[40:])
    vals = lazy.write_range(1, 2, 6, np.empty(16, np.uint8))
    assert vals.view(np.float32).tolist() == layers["b"][2:6].tolist()


@pytest.mark.mutation
def test_only_the_numba_kernels_defer_and_only_when_asked():
    """deferred=True gives a DeferredMessage only where the Numba kernels encode (host arrays), an
    ordinary Message with the reference kernels; encode_many defers nothing by default."""
    from tgsim.codecs.message import Message

    layers = _deferrable()
    assert type(TernGrad(kernels="reference").encode(layers, StreamKey(1), deferred=True)) is Message
    numba = TernGrad(kernels="numba")
    assert isinstance(numba.encode(layers, StreamKey(1), deferred=True), DeferredMessage)
    batch = {k: np.stack([v, v]) for k, v in layers.items()}
    assert all(type(m) is Message for m in numba.encode_many(batch, 1, 0, np.array([0, 1])))


@pytest.mark.mutation
def test_the_name_is_the_registry_key():
    """TernGrad.name (used in error messages and logs) is the name the registry builds it by."""
    from tgsim.codecs import registry

    codec = TernGrad()      # an instance: runs codec.py code, so the mutation tool selects this test
    assert registry.codec_class(codec.name) is TernGrad


WHOLE_STEP = ("moments_layers", "encode_layers", "weighted_sum_layers", "scaled_code_sum_layers")


def _step_outputs(codec, layers, nw):
    """(the scalings' arrays, every message's bytes, the aggregate) of one step of `codec`."""
    sc = codec.scaling_many(layers)
    msgs = codec.encode_many(layers, 11, 4, np.arange(nw) + 1, None, sc)
    mean = codec.aggregate(msgs, divide_by=nw)
    own = codec.aggregate([Message(m.layout, m.scalers, [np.array(p) for p in m.parts]) for m in msgs],
                          divide_by=nw)     # copied parts, no PayloadBatch: passed by address
    return ([None if s is None else np.stack(s).tobytes() for s in sc], [m.to_bytes() for m in msgs],
            {k: v.tobytes() for k, v in mean.items()}, {k: v.tobytes() for k, v in own.items()})


@pytest.mark.parametrize("nw", [1, 3])
@pytest.mark.parametrize("clip", ["none", "explicit"])
@pytest.mark.parametrize("packing", ["2bit", "base3"])
def test_numba_whole_step_equals_the_per_layer_calls(monkeypatch, nw, clip, packing):
    """TernGrad on the Numba kernels with their whole-step functions (one call a step) and without
    them (a call a layer): the same scalings, message bytes and aggregates, and for a non-finite
    gradient the same error naming the same layer and worker. Layers: empty, 1 element, a float
    layer between ternary ones, sizes around the folded σ pass."""
    from tgsim.codecs.terngrad import numba_kernels

    rng = np.random.default_rng(nw)
    shapes = {"e": (0,), "one": (1,), "conv": (8, 3, 3), "bias": (8,), "fc": (50, 47), "fc.b": (3,)}
    layers = {k: (rng.standard_normal((nw, *s)) * 0.1).astype(np.float32) for k, s in shapes.items()}
    codec = TernGrad(clip=clip, packing=packing, kernels="numba", float_layers=("bias",))
    whole = _step_outputs(codec, layers, nw)
    for w in range(nw):     # and the scalings are each worker's own pass 1
        own = codec.scaling({k: g[w] for k, g in layers.items()})
        assert [None if s is None else tuple(s) for s in own] == \
            [None if s is None else tuple(s.worker(w)) for s in codec.scaling_many(layers)]
    bad = dict(layers)
    bad["fc"] = bad["fc"].copy()
    bad["fc"][nw - 1, 3, 4] = np.nan
    bad["fc.b"] = bad["fc.b"].copy()
    bad["fc.b"][nw - 1, 0] = np.inf
    with pytest.raises(ValueError) as err_whole:
        codec.scaling_many(bad)
    for name in WHOLE_STEP:
        monkeypatch.delattr(numba_kernels, name)
    assert _step_outputs(codec, layers, nw) == whole
    with pytest.raises(ValueError) as err_layers:
        codec.scaling_many(bad)
    assert type(err_whole.value) is type(err_layers.value) and str(err_whole.value) == str(err_layers.value)
    assert "'fc'" in str(err_layers.value) and f"worker {nw - 1}" in str(err_layers.value)


def _two_scales(nw: int = 3) -> dict:
    """Two ternary layers an order of magnitude apart and a float layer, (nw, *shape)."""
    rng = np.random.default_rng(11)
    return {"w": rng.standard_normal((nw, 50)).astype(np.float32),
            "u": (6 * rng.standard_normal((nw, 4, 5))).astype(np.float32),
            "b": rng.standard_normal((nw, 4)).astype(np.float32)}


@pytest.mark.mutation
@pytest.mark.parametrize("kernels", ["reference", "numba"])
def test_model_scope_gives_every_ternary_layer_the_whole_models_scaling(kernels):
    """scope = "model": per worker one max |g| and one σ over the ternary layers concatenated (plain
    NumPy here), clipped at 2.5σ; float layers left out; the per-worker calls give the same bits.
    Control: layer by layer the two layers' scalers differ."""
    g = _two_scales()
    rows = np.concatenate([g["w"], g["u"].reshape(3, -1)], axis=1).astype(np.float64)
    bound = 2.5 * rows.std(axis=1)
    expect = np.minimum(np.abs(rows).max(axis=1), bound)
    own = TernGrad(kernels=kernels, float_layers=("b",), clip="explicit").scaling_many(g)
    assert not np.allclose(own[0].scaler, own[1].scaler, rtol=0.1)
    codec = TernGrad(kernels=kernels, float_layers=("b",), clip="explicit", scope="model")
    got = codec.scaling_many(g)
    assert got[2] is None
    for batch in got[:2]:
        np.testing.assert_allclose(batch.scaler, expect, rtol=1e-6)
        np.testing.assert_allclose(batch.clip_bound, bound, rtol=1e-6)
    msgs = codec.encode_many(g, 4, 9, np.arange(3))
    for w in range(3):
        one = {k: v[w] for k, v in g.items()}
        assert [s.scaler for s in codec.scaling(one)[:2]] == [float(got[0].scaler[w])] * 2
        assert codec.encode(one, StreamKey(4, 9, w)).to_bytes() == msgs[w].to_bytes()
        assert msgs[w].scalers.tolist() == [np.float32(expect[w]), np.float32(expect[w]), 0.0]


def test_scope_is_checked_and_kept_by_the_downlink_codec():
    with pytest.raises(ValueError, match="scope must be one of"):
        TernGrad(scope="bucket")
    assert TernGrad(scope="model").downlink_codec().scope == "model"
    assert TernGrad().scope == "layer"
