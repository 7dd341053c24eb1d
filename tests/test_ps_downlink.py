"""tgsim/exchange/ps_downlink.py: the parameter server's downlink format, its decode and its
refusals. Expected values are worked out by hand or with plain NumPy, never with the module under
test."""

from __future__ import annotations

import types

import numpy as np
import pytest

import tgsim.exchange.mpi  # noqa: F401  (imported at collection: tools/mutation.py counts module-level
import tgsim.exchange.mpi_env  # noqa: F401  lines as run at import)

from fakes import _messages, _terngrad, same_bits


@pytest.mark.mutation
def test_code_dtype_boundaries():
    """int8 sums up to 127 ranks, int16 up to 32767, refused beyond."""
    from tgsim.exchange.ps_downlink import code_dtype

    assert code_dtype(127) is np.int8 and code_dtype(128) is np.int16 and code_dtype(32767) is np.int16
    with pytest.raises(ValueError, match="32767"):
        code_dtype(32768)


@pytest.mark.mutation
def test_downlink_decode_refuses_what_is_malformed_and_takes_a_zero_scaler():
    """ps_decode_base on the real downlink of 4 workers: round trip to the in-process ps mean; a
    negative or NaN scaler, a buffer cut inside either layer or extended raise PayloadError (a cut
    float layer raised NumPy's ValueError before); a zero scaler (an all-zero layer) is valid and
    decodes to zeros."""
    from tgsim.errors import PayloadError
    from tgsim.exchange.ps_downlink import ps_decode_base, ps_downlink

    codec, ex, msgs = _messages(4)
    down = ps_downlink(codec, msgs, True)
    layout = msgs[0].layout
    mean = ps_decode_base(layout, down, 4, True)
    want, _ = ex.aggregate(codec, msgs, "ps", True)
    assert all(np.array_equal(mean[k], want[k]) for k in want)
    from tgsim.codecs.message import KIND_TERNARY

    i = [s.kind for s in layout.layers].index(KIND_TERNARY)
    off = sum(4 * s.size for s in layout.layers[:i])          # the float layers before it, if any
    for bad in (-1.0, float("nan")):
        b = down.copy()
        b[off:off + 4] = np.array([bad], np.float32).view(np.uint8)
        with pytest.raises(PayloadError, match="invalid scaler"):
            ps_decode_base(layout, b, 4, True)
    for cut in (1, 21):                       # into the last (float) layer, into the ternary one
        with pytest.raises(PayloadError, match="too short"):
            ps_decode_base(layout, down[:-cut], 4, True)
    with pytest.raises(PayloadError, match="the layout needs"):
        ps_decode_base(layout, np.concatenate([down, np.zeros(1, np.uint8)]), 4, True)
    b = down.copy()
    b[off:off + 4] = np.array([0.0], np.float32).view(np.uint8)
    assert not np.any(ps_decode_base(layout, b, 4, True)[layout.layers[i].name])


@pytest.mark.mutation
def test_message_to_numpy_is_the_message_itself_and_moves_parts_otherwise():
    """message_to(msg, np) is msg (no copy); for another array module every part goes through its
    asarray (here a stand-in module that tags the arrays)."""
    from tgsim.exchange.ps_downlink import message_to

    _, msgs = _terngrad(2)
    assert message_to(msgs[0], np) is msgs[0]
    tagged = []
    xp = types.SimpleNamespace(asarray=lambda p: tagged.append(p) or np.array(p, copy=True))
    moved = message_to(msgs[0], xp)
    assert moved is not msgs[0] and len(tagged) == len(msgs[0].parts) == 2
    assert all(a is b for a, b in zip(tagged, msgs[0].parts))
    assert moved.layout is msgs[0].layout and np.array_equal(moved.scalers, msgs[0].scalers)


@pytest.mark.mutation
def test_downlink_cut_inside_the_ternary_layer_names_that_layer():
    """N = 4 (w = ceil(log2 9) = 4 bits): layer w's downlink is 4 + ceil(13 x 4 / 8) = 11 bytes,
    then b's 20. Cut to 10 bytes, the decoder stops at w ("too short for layer 'w'"), not later;
    cut to 11 + 19 = 30, at b."""
    from tgsim.errors import PayloadError
    from tgsim.exchange.ps_downlink import ps_decode_base, ps_downlink

    codec, msgs = _terngrad(4)
    down = ps_downlink(codec, msgs, True)
    assert down.size == 31
    with pytest.raises(PayloadError, match=r"^downlink is 10 bytes, too short for layer 'w'$"):
        ps_decode_base(msgs[0].layout, down[:10], 4, True)
    with pytest.raises(PayloadError, match=r"^downlink is 30 bytes, too short for layer 'b'$"):
        ps_decode_base(msgs[0].layout, down[:30], 4, True)


@pytest.mark.mutation
def test_downlink_of_one_worker_with_one_layer():
    """N = 1, a single ternary layer: the base downlink is [f32 scaler | (codes + 1) at
    ceil(log2 3) = 2 bits] and decodes to the worker's own decoded message; re-ternarized, it is the
    downlink codec's message of that mean, byte for byte."""
    from tgsim.codecs import TernGrad
    from tgsim.exchange.ps_downlink import ps_base_downlink, ps_decode, ps_downlink
    from tgsim.rng import StreamKey

    codec = TernGrad(clip="none", min_size=10)
    g = {"w": np.random.default_rng(2).standard_normal(13).astype(np.float32)}
    msg = codec.encode(g, StreamKey(1, 0, 0))
    base = ps_base_downlink(codec, [msg], True)
    codes = msg.codes("w").astype(np.int64) + 1          # in {0, 1, 2}: 2 bits each, little end first
    packed = np.zeros(4, np.uint8)
    for e, c in enumerate(codes):
        packed[e * 2 // 8] |= np.uint8(c << (e * 2 % 8))
    assert base.tobytes() == np.float32(msg.scalers[0]).tobytes() + packed.tobytes()
    key = StreamKey(5, 0, 1)
    own = codec.decode(msg)
    want = codec.downlink_codec().encode(own, key)
    down = ps_downlink(codec, [msg], True, key)
    assert down.tobytes() == want.to_bytes()
    assert same_bits(ps_decode(codec, msg.layout, down, 1, True, True), codec.downlink_codec().decode(want))
    unshared = ps_base_downlink(codec, [msg], False)
    assert unshared.tobytes() == own["w"].astype(np.float32).tobytes()


@pytest.mark.mutation
def test_downlink_of_a_model_without_layers_is_empty():
    """A layout with no layers: the downlink (and its size) is 0 bytes, and it decodes to {}."""
    from tgsim.codecs import TernGrad
    from tgsim.codecs.message import Layout, Message
    from tgsim.exchange.ps_downlink import ps_decode_base, ps_downlink, ps_downlink_size

    layout = Layout(())
    msgs = [Message(layout, np.zeros(0, np.float32), []) for _ in range(2)]
    codec = TernGrad()
    for shared in (True, False):
        down = ps_downlink(codec, msgs, shared)
        assert down.dtype == np.uint8 and down.size == 0 == ps_downlink_size(layout, 2, shared, False)
        assert ps_decode_base(layout, down, 2, shared) == {}


@pytest.mark.mutation
@pytest.mark.parametrize("n", [1, 2, 3, 5, 20, 127])
def test_downlink_of_many_layers_in_one_pass_has_each_layers_bytes(monkeypatch, n):
    """Seven ternary layers of 8 to 100 elements (tails of 0, 1, 2, 7, 0, 1 and 4 values after the
    groups of eight) around two float layers, N workers with shared scalers: the downlink is, layer
    by layer, [f32 scaler | pack_uint_reference(sum of the codes + N, w bits)] or the float layer's
    mean, with the codes read from the messages and packed by the reference; it decodes to the
    in-process parameter server's mean, bit for bit; the packing and the decode are one call each
    over all layers (w <= 8); an all-ones byte in layer t3's sums is named ("layer 't3': ...")."""
    from tgsim.codecs import TernGrad, packing
    from tgsim.codecs.message import KIND_TERNARY
    from tgsim.errors import PayloadError
    from tgsim.exchange import InProcessExchange
    from tgsim.exchange.ps_downlink import ps_decode_base, ps_downlink
    from tgsim.rng import StreamKey

    sizes = {"f0": 3, "t1": 8, "t2": 9, "t3": 10, "f4": 5, "t5": 15, "t6": 16, "t7": 17, "t8": 100}
    codec = TernGrad(clip="none", min_size=8)
    rng = np.random.default_rng(n)
    layers = [{k: rng.standard_normal(s).astype(np.float32) for k, s in sizes.items()} for _ in range(n)]
    ex = InProcessExchange(n)
    sc = [codec.scaling(g) for g in layers]
    shared = ex.max_scalers(np.stack([codec.local_scalers(s) for s in sc]))
    msgs = [codec.encode(g, StreamKey(3, 0, w), shared, sc[w]) for w, g in enumerate(layers)]
    calls = []
    for name in ("pack_code_sums_segments", "unpack_code_sums_segments"):
        real = getattr(packing, name)
        monkeypatch.setattr(packing, name, lambda *a, _r=real, _n=name: (calls.append(_n), _r(*a))[1])
    down = ps_downlink(codec, msgs, True)
    want, _ = ex.aggregate(codec, msgs, "ps", True)
    width = packing.uint_width(n)
    off, at = 0, {}
    for i, spec in enumerate(msgs[0].layout.layers):
        if spec.kind == KIND_TERNARY:
            total = sum(m.codes(spec.name).astype(np.int64) for m in msgs) + n
            body = packing.pack_uint_reference(total.astype(np.uint32), width)
            expect = np.float32(msgs[0].scalers[i]).tobytes() + body.tobytes()
            at[spec.name] = off + 4
        else:
            expect = want[spec.name].astype(np.float32).tobytes()
        assert down[off:off + len(expect)].tobytes() == expect, spec.name
        off += len(expect)
    assert off == down.size and [s.kind == KIND_TERNARY for s in msgs[0].layout.layers] == [
        k.startswith("t") for k in sizes]
    mean = ps_decode_base(msgs[0].layout, down, n, True)
    assert list(mean) == list(sizes) and same_bits(mean, want)
    assert calls == ["pack_code_sums_segments", "unpack_code_sums_segments"]
    bad = down.copy()
    bad[at["t3"]] = 0xFF
    with pytest.raises(PayloadError, match=r"^layer 't3': downlink code sum \d+ exceeds N = " + str(n) + "$"):
        ps_decode_base(msgs[0].layout, bad, n, True)


@pytest.mark.parametrize("n", [128, 200])
def test_downlink_of_128_and_200_workers_with_a_float_layer_first(monkeypatch, n):
    """N >= 128: code sums of ceil(log2(2N+1)) = 9 bits, not the one-pass path: the Numba kernels sum
    every ternary layer in one call (numba_kernels.sum_codes_layers, recorded) and the sums are packed
    layer by layer. With a float layer first (so a ternary layer's index is not its position among
    the ternary layers) and ternary layers of different sizes around a second float layer: the
    downlink is, layer by layer, [f32 scaler | pack_uint_reference(Σ codes + N, 9 bits)] with the codes
    read from the messages, or the float layer's in-process ps mean; it decodes to that mean, bit for bit."""
    from tgsim.codecs import TernGrad, packing
    from tgsim.codecs.message import KIND_TERNARY
    from tgsim.codecs.terngrad import numba_kernels
    from tgsim.exchange import InProcessExchange
    from tgsim.exchange.ps_downlink import ps_decode_base, ps_downlink
    from tgsim.rng import StreamKey

    sizes = {"f0": 3, "t1": 9, "t2": 17, "f3": 5, "t4": 100}
    codec = TernGrad(clip="none", min_size=8, kernels="numba")
    rng = np.random.default_rng(n)
    layers = [{k: rng.standard_normal(s).astype(np.float32) for k, s in sizes.items()} for _ in range(n)]
    ex = InProcessExchange(n)
    sc = [codec.scaling(g) for g in layers]
    shared = ex.max_scalers(np.stack([codec.local_scalers(s) for s in sc]))
    msgs = [codec.encode(g, StreamKey(3, 0, w), shared, sc[w]) for w, g in enumerate(layers)]
    assert [s.kind == KIND_TERNARY for s in msgs[0].layout.layers] == [k.startswith("t") for k in sizes]
    calls = []
    real = numba_kernels.sum_codes_layers
    monkeypatch.setattr(numba_kernels, "sum_codes_layers", lambda *a, **k: (calls.append(len(a[0])), real(*a, **k))[1])
    down = ps_downlink(codec, msgs, True)
    assert calls == [3]                                   # the three ternary layers in one compiled call
    want, _ = ex.aggregate(codec, msgs, "ps", True)
    width = 9                                             # 2N + 1 = 257 (N = 128), 401 (N = 200) < 2^9
    off = 0
    for i, spec in enumerate(msgs[0].layout.layers):
        if spec.kind == KIND_TERNARY:
            total = sum(m.codes(spec.name).astype(np.int64) for m in msgs) + n
            assert total.min() >= 0 and total.max() <= 2 * n
            body = packing.pack_uint_reference(total.astype(np.uint32), width)
            assert body.size == -(-spec.size * width // 8)
            expect = np.float32(msgs[0].scalers[i]).tobytes() + body.tobytes()
        else:
            expect = want[spec.name].astype(np.float32).tobytes()
        assert down[off:off + len(expect)].tobytes() == expect, spec.name
        off += len(expect)
    assert off == down.size
    mean = ps_decode_base(msgs[0].layout, down, n, True)
    assert list(mean) == list(sizes) and same_bits(mean, want)
