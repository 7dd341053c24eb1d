"""Tests that kill mutants `tools/mutation.py` found surviving in the peer codecs' modules
tgsim/codecs/fp32.py, registry.py, fp16.py, bf16.py, sign.py, sparse.py, suresh.py and elias.py
(issue 22, item 3; tests/test_mutants_peers.py has those of error_feedback.py and qsgd.py).
Expected values are worked out by hand (in the docstrings) or computed here with plain NumPy, not
with the module's own helpers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tgsim.codecs.base import CodecProperties
from tgsim.errors import NonFiniteGradientError, PayloadError

F32_MAX = float(np.finfo(np.float32).max)


# -- fp32.py ----------------------------------------------------------------------------------------

def test_fp32_first_nonfinite_earliest_worker_then_earliest_layer():
    """first_nonfinite: the lowest worker index with a NaN/Inf wins; among layers bad at that same
    worker the first layer in order wins; a later all-finite layer changes nothing; the count is that
    worker's non-finite values in that layer; all finite gives None."""
    from tgsim.codecs.fp32 import first_nonfinite

    a = np.zeros((3, 2, 2), np.float32)
    a[1, 0, 1] = np.nan
    a[1, 1, 0] = np.inf                                    # layer a: worker 1, 2 values
    b = np.zeros((3, 4), np.float32)
    b[2, 3] = -np.inf                                      # layer b: worker 2
    c = np.zeros((3, 5), np.float32)                       # all finite
    err = first_nonfinite({"a": a, "b": b, "c": c})
    assert isinstance(err, NonFiniteGradientError)
    assert (err.layer, err.worker, err.count, err.where) == ("a", 1, 2, "worker 1")
    b[1, 0] = np.nan                                       # b bad at worker 1 too: a still comes first
    err = first_nonfinite({"a": a, "b": b, "c": c})
    assert (err.layer, err.worker, err.count) == ("a", 1, 2)
    b[0, 0] = np.nan                                       # b bad at worker 0: b wins
    err = first_nonfinite({"a": a, "b": b, "c": c})
    assert (err.layer, err.worker, err.count) == ("b", 0, 1)
    assert first_nonfinite({"c": c, "d": np.ones((2, 1, 3))}) is None


def test_fp32_first_beyond_float32_skips_narrow_and_empty_layers():
    """first_beyond_float32: float16/float32 layers and empty layers are skipped; a float64 layer
    whose |value| exceeds f32 max (strictly: exactly f32 max is fine) is a ValueError naming the
    layer and the first such worker, even after a float32 and an empty float64 layer."""
    from tgsim.codecs.fp32 import first_beyond_float32

    narrow = np.full((2, 3), 1.0, np.float32)
    empty = np.zeros((2, 0), np.float64)
    edge = np.full((3, 2, 2), F32_MAX, np.float64)         # exactly float32's max: representable
    edge[0] *= -1
    assert first_beyond_float32({"n": narrow, "e": empty, "edge": edge}, "x") is None
    big = edge.copy()
    big[2, 1, 1] = -2.0 * F32_MAX
    big[1, 0, 0] = 1e300
    err = first_beyond_float32({"n": narrow, "e": empty, "big": big}, "it sends float32")
    assert isinstance(err, ValueError)
    msg = str(err)
    assert "layer 'big'" in msg and "of worker 1 " in msg and "1e+300" in msg and msg.endswith("it sends float32")


def test_fp32_message_bytes_and_from_bytes_layer_order():
    """Float32Message: wire_bytes = 4 bytes per element; to_bytes is the layers' little-endian float32
    one after the other; from_bytes reads them back in the `like` message's layer order and shapes
    (a buffer of another length is a PayloadError); aggregate's default divisor is the message
    count, divide_by replaces it."""
    from tgsim.codecs.fp32 import Float32, Float32Message

    codec = Float32()
    assert codec.name == Float32.name == "fp32"
    assert Float32.properties == CodecProperties(unbiased=True, wire="float32", backends=("numpy", "cupy"))
    a = np.array([[1.0, -2.0, 0.5]], np.float32)
    b = np.arange(4, dtype=np.float64).reshape(1, 2, 2) + 10
    m = codec.encode_many({"a": a, "b": b}, 0, 0, [0])[0]
    assert m.wire_bytes == 4 * 7
    raw = m.to_bytes()
    assert raw == np.array([1.0, -2.0, 0.5, 10, 11, 12, 13], "<f4").tobytes()
    back = codec.from_bytes(raw, m)
    assert list(back) == ["a", "b"]
    assert back["a"].tolist() == [1.0, -2.0, 0.5] and back["b"].tolist() == [[10.0, 11.0], [12.0, 13.0]]
    assert back["b"].dtype == np.float32 and isinstance(back, Float32Message)
    with pytest.raises(PayloadError):
        codec.from_bytes(raw + b"\0\0\0\0", m)
    with pytest.raises(PayloadError):
        codec.from_bytes(raw[:-4], m)
    m2 = Float32Message({"a": np.array([3.0, 0.0, 1.5], np.float32), "b": np.zeros((2, 2), np.float32)})
    assert codec.aggregate([m, m2])["a"].tolist() == [2.0, -1.0, 1.0]
    assert codec.aggregate([m, m2], divide_by=4)["a"].tolist() == [1.0, -0.5, 0.5]


# -- registry.py ------------------------------------------------------------------------------------

def test_registry_names_classes_and_describe():
    """The registered names, in the documented order, each naming a class whose own `name` is the
    registered name (what configs, the CLI and MPI runs rely on); DEFAULT is terngrad, the config's
    default; describe() gives one row per name with its "module:Class"; an unknown name is a
    ValueError."""
    from tgsim.codecs import registry
    from tgsim.train.config import CodecConfig

    want = ("fp32", "terngrad", "fp16", "bf16", "sign", "scaled_sign", "qsgd", "suresh", "topk", "randomk")
    assert registry.names() == want
    assert registry.DEFAULT == "terngrad" == CodecConfig().name
    assert registry.CODECS == {
        "fp32": "tgsim.codecs.fp32:Float32", "terngrad": "tgsim.codecs.terngrad:TernGrad",
        "fp16": "tgsim.codecs.fp16:Float16", "bf16": "tgsim.codecs.bf16:BFloat16",
        "sign": "tgsim.codecs.sign:SignSGD", "scaled_sign": "tgsim.codecs.sign:ScaledSign",
        "qsgd": "tgsim.codecs.qsgd:QSGD", "suresh": "tgsim.codecs.suresh:Suresh",
        "topk": "tgsim.codecs.sparse:TopK", "randomk": "tgsim.codecs.sparse:RandomK"}
    for name in want:
        assert registry.codec_class(name).name == name
    rows = registry.describe(CodecConfig())
    assert [(r["codec"], r["class"]) for r in rows] == [(n, registry.CODECS[n]) for n in want]
    with pytest.raises(ValueError, match="unknown codec"):
        registry.codec_class("nosuch")


# -- helpers ----------------------------------------------------------------------------------------

def _header(raw: bytes) -> tuple:
    """(magic, version, n_layers, crc, body bytes) of a framed message: "<4sBIIQ", 21 bytes."""
    import struct

    return struct.unpack("<4sBIIQ", raw[:21])


def _kernel_choice(cls, **kw):
    """[_numba(True) for auto, numba, reference, cuda], [_numba(False) for auto, reference, cuda],
    and whether kernels="numba" refuses a non-NumPy array (ValueError)."""
    on = [cls(kernels=k, **kw)._numba(True) for k in ("auto", "numba", "reference", "cuda")]
    off = [cls(kernels=k, **kw)._numba(False) for k in ("auto", "reference", "cuda")]
    with pytest.raises(ValueError, match="NumPy arrays"):
        cls(kernels="numba", **kw)._numba(False)
    return on, off


# -- fp16.py ----------------------------------------------------------------------------------------

def test_fp16_options_properties_and_frozen_message():
    """Float16: registered as "fp16", biased, its own wire; every documented kernels option
    constructs ("bogus" is a ValueError); from_config reads `kernels` or defaults to "auto"; the Numba
    kernels run for "auto"/"numba" on NumPy arrays only; messages are frozen."""
    import types

    from tgsim.codecs.fp16 import Float16

    assert Float16.name == "fp16"
    assert Float16.properties == CodecProperties(unbiased=False, wire="own")
    for k in ("auto", "reference", "numba", "cuda"):
        assert Float16(kernels=k).kernels == k
    assert Float16().kernels == "auto"
    with pytest.raises(ValueError, match="unknown kernels"):
        Float16(kernels="bogus")
    assert Float16.from_config(types.SimpleNamespace()).kernels == "auto"
    assert Float16.from_config(types.SimpleNamespace(kernels="reference")).kernels == "reference"
    assert _kernel_choice(Float16) == ([True, True, False, False], [False, False, False])
    m = Float16().encode_many({"g": np.ones((1, 2), np.float32)}, 0, 0, [0])[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.layers = {}


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_fp16_bytes_by_hand(kernels):
    """The wire: header (magic b"TGF1", version 1, 2 layers, body 2 n bytes) then each layer's
    float16, little-endian: 1.0 = 0x3C00, -2.0 = 0xC000, 0.5 = 0x3800, 65504 = 0x7BFF, 0 = 0x0000;
    wire_bytes = 21 + 2 n; from_bytes gives the values back (a wrong length is a PayloadError that
    names the fp16 message)."""
    from tgsim.codecs.fp16 import Float16

    codec = Float16(kernels=kernels)
    a = np.array([[1.0, -2.0, 0.5]], np.float32)
    b = np.array([[[65504.0], [0.0]]], np.float32)
    m = codec.encode_many({"a": a, "b": b}, 0, 0, [0])[0]
    raw = m.to_bytes()
    assert _header(raw)[:3] == (b"TGF1", 1, 2) and _header(raw)[4] == 10
    assert raw[21:] == bytes([0x00, 0x3C, 0x00, 0xC0, 0x00, 0x38, 0xFF, 0x7B, 0x00, 0x00])
    assert m.wire_bytes == len(raw) == 21 + 2 * 5
    back = codec.from_bytes(raw, m)
    assert back.layers["a"].tolist() == [1.0, -2.0, 0.5] and back.layers["b"].tolist() == [[65504.0], [0.0]]
    assert back.layers["a"].dtype == np.float16
    with pytest.raises(PayloadError, match="fp16 message"):
        codec.from_bytes(raw[:-2], m)
    bad = bytearray(raw)
    bad[4] = 2                                                   # version 2
    with pytest.raises(PayloadError, match="fp16 message version 2"):
        codec.from_bytes(bytes(bad), m)
    body = raw[21:][:6]
    with pytest.raises(PayloadError, match="fp16 message body is 6 bytes, the layers need 10"):
        codec.from_bytes(raw[:13] + len(body).to_bytes(8, "little") + body, m)


def test_fp16_refuses_values_beyond_65504_naming_the_worker():
    """prepare_many: 65504 (float16's max) itself is fine, 65520 (rounds to inf) is a ValueError
    naming the layer and the first worker beyond it; empty layers pass; NaN is a
    NonFiniteGradientError."""
    from tgsim.codecs.fp16 import Float16

    codec = Float16()
    ok = np.array([[65504.0, -65504.0], [1.0, 2.0], [-65504.0, 0.0]], np.float32)
    assert codec.prepare_many({"e": np.zeros((3, 0), np.float32), "g": ok}) is None
    bad = ok.copy()
    bad[2, 1] = -65520.0
    bad[1, 0] = 70000.0
    with pytest.raises(ValueError, match="layer 'g': gradient value 7e\\+04 of worker 1 overflows"):
        codec.prepare_many({"e": np.zeros((3, 0), np.float32), "g": bad})
    with pytest.raises(NonFiniteGradientError):
        codec.prepare_many({"g": np.array([[np.nan]], np.float32)})


@pytest.mark.parametrize("kernels", ["auto", "numba", "reference", "cuda"])
def test_fp16_aggregate_mean_and_divide_by(kernels, monkeypatch):
    """aggregate: f32(Σ_w f64(f16 values) · (1/N)), N = the message count unless divide_by is given;
    one message alone is its own decode. By hand: 1, 3, 0.5 -> mean 1.5; with divide_by = 6, 0.75.
    The Numba cast and decode-sum run for "auto"/"numba" only (counted calls)."""
    from tgsim.codecs import numba_half
    from tgsim.codecs.fp16 import Float16

    calls = []
    real_cast, real_sum = numba_half.to_fp16, numba_half.decode_sum
    monkeypatch.setattr(numba_half, "to_fp16", lambda *a, **k: (calls.append("cast"), real_cast(*a, **k))[1])
    monkeypatch.setattr(numba_half, "decode_sum", lambda *a, **k: (calls.append("sum"), real_sum(*a, **k))[1])
    codec = Float16(kernels=kernels)
    _aggregate_of_three_workers(codec)
    assert calls == (["cast", "sum", "sum", "sum"] if kernels in ("auto", "numba") else [])


def test_fp16_bits_per_element():
    """Up: 16 bits per element + the 21-byte header over n; down: 32; an empty layer costs 0 up."""
    from tgsim.codecs.fp16 import Float16

    assert Float16().bits_per_element(21, 3) == {"up": 16 + 8.0, "down": 32}
    assert Float16().bits_per_element(4, 3) == {"up": 16 + 42.0, "down": 32}
    assert Float16().bits_per_element(0, 3) == {"up": 0.0, "down": 32}


# -- bf16.py ----------------------------------------------------------------------------------------

def test_bf16_options_properties_host_copy_and_frozen_message():
    """BFloat16: registered as "bf16", biased, its own wire; kernels default "auto", the four
    documented options construct, "bogus" is a ValueError; _host returns a NumPy array as it is and
    calls `.get()` on a device array (anything not an ndarray that has it, as CuPy's); messages are
    frozen."""
    from tgsim.codecs import bf16

    assert bf16.BFloat16.name == "bf16" and bf16.BFloat16().kernels == "auto"
    assert bf16.BFloat16.properties == CodecProperties(unbiased=False, wire="own")
    for k in ("auto", "reference", "numba", "cuda"):
        assert bf16.BFloat16(kernels=k).kernels == k
    with pytest.raises(ValueError, match="unknown kernels"):
        bf16.BFloat16(kernels="bogus")

    class Device:
        def get(self):
            return np.array([7, 8], np.uint16)

    a = np.array([1, 2], np.uint16)
    assert bf16._host(a) is a and bf16._host(Device()).tolist() == [7, 8]
    # a 0-d layer: each worker's bits are a NumPy scalar (no .get()): 1.5 -> 0x3FC0, -2 -> 0xC000
    m0, m1 = bf16.BFloat16().encode_many({"s": np.array([1.5, -2.0], np.float32)}, 0, 0, [0, 1])
    assert m0.to_bytes()[21:] == b"\xc0\x3f" and m1.to_bytes()[21:] == b"\x00\xc0"
    m = bf16.BFloat16().encode_many({"g": np.ones((1, 2), np.float32)}, 0, 0, [0])[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.layers = {}


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_bf16_bytes_by_hand(kernels):
    """The wire: header (magic b"TGB1", version 1, body 2 n bytes), then the bfloat16 patterns,
    little-endian: 1.0 -> 0x3F80, -2.0 -> 0xC000, 1 + 2^-8 (0x3F808000, a tie, even kept part) ->
    0x3F80, 1 + 3 2^-8 (0x3F818000, odd) -> 0x3F82; wire_bytes = 21 + 2 n; from_bytes gives the
    patterns back (PayloadError naming the bf16 message for a wrong length or version)."""
    import struct

    from tgsim.codecs.bf16 import BFloat16

    codec = BFloat16(kernels=kernels)
    g = np.array([[1.0, -2.0, 1 + 2.0**-8, 1 + 3 * 2.0**-8]], np.float32)
    m = codec.encode_many({"g": g}, 0, 0, [0])[0]
    raw = m.to_bytes()
    assert _header(raw)[:3] == (b"TGB1", 1, 1) and _header(raw)[4] == 8
    assert raw[21:] == bytes([0x80, 0x3F, 0x00, 0xC0, 0x80, 0x3F, 0x82, 0x3F])
    assert m.wire_bytes == len(raw) == 29
    back = codec.from_bytes(raw, m)
    assert back.layers["g"].tolist() == [0x3F80, 0xC000, 0x3F80, 0x3F82]
    assert codec.decode(back)["g"].tolist() == [1.0, -2.0, 1.0, 1 + 2.0**-6]
    with pytest.raises(PayloadError, match="bf16 message version 2"):
        codec.from_bytes(raw[:4] + b"\x02" + raw[5:], m)
    with pytest.raises(PayloadError, match="bf16 message body is 6 bytes"):
        codec.from_bytes(raw[:13] + struct.pack("<Q", 6) + raw[21:27], m)


def test_bf16_prepare_many_skips_empty_layers_and_names_the_first_worker():
    """prepare_many: an empty layer before the others is skipped (not the end of the checks); the
    smallest magnitude that rounds to inf, bits 0x7F7F8000, is refused (>=), in worker 2 while
    worker 0 holds 0x7F7F7FFF (rounds to max finite): the message names worker 2."""
    from tgsim.codecs.bf16 import BFloat16

    just_ok = float(np.array(0x7F7F7FFF, np.uint32).view(np.float32))
    inf_tie = float(np.array(0x7F7F8000, np.uint32).view(np.float32))
    w = np.zeros((3, 2, 2), np.float32)
    w[0, 1, 1] = -just_ok
    assert BFloat16().prepare_many({"e": np.zeros((3, 0), np.float32), "w": w}) is None
    w[2, 0, 1] = inf_tie
    with pytest.raises(ValueError, match="layer 'w': .* of worker 2 overflows"):
        BFloat16().prepare_many({"e": np.zeros((3, 0), np.float32), "w": w})


@pytest.mark.parametrize("kernels", ["auto", "numba", "reference", "cuda"])
def test_bf16_kernel_choice_and_aggregate(kernels, monkeypatch):
    """"auto"/"numba" run the Numba rounding pass and decode-sum on NumPy arrays, "reference"/"cuda"
    the array code (observed by counting calls); either way the mean is f32(Σ_w f64(Q(g_w)) · (1/N))
    with N the message count, or divide_by; one message is its own decode. By hand: Q(1) = 1,
    Q(3) = 3, Q(0.5) = 0.5 -> 1.5 (divide_by 6: 0.75); -2, 0.25, 0 -> -1.75 / N."""
    from tgsim.codecs import bf16, numba_half

    calls = []
    real_kernel, real_sum = bf16._numba_kernel, numba_half.decode_sum
    monkeypatch.setattr(bf16, "_numba_kernel", lambda: (calls.append("round"), real_kernel())[1])
    monkeypatch.setattr(numba_half, "decode_sum", lambda *a, **k: (calls.append("sum"), real_sum(*a, **k))[1])
    codec = bf16.BFloat16(kernels=kernels)
    _aggregate_of_three_workers(codec)
    numba = kernels in ("auto", "numba")
    assert calls == (["round", "sum", "sum", "sum"] if numba else [])


def test_bf16_bits_per_element():
    """Up: 16 bits per element + the 21-byte header over n; down: 32; an empty layer costs 0 up."""
    from tgsim.codecs.bf16 import BFloat16

    assert BFloat16().bits_per_element(21, 3) == {"up": 24.0, "down": 32}
    assert BFloat16().bits_per_element(4, 3) == {"up": 58.0, "down": 32}
    assert BFloat16().bits_per_element(0, 3) == {"up": 0.0, "down": 32}


# -- sign.py ----------------------------------------------------------------------------------------

def test_sign_options_repr_host_and_properties():
    """SignSGD / ScaledSign: names "sign" / "scaled_sign", biased, own wire, combine "majority" /
    "mean"; the four kernels options construct ("bogus" is a ValueError), from_config reads
    `kernels` or defaults to "auto"; repr shows kernels only when not "auto"; the Numba kernels run
    for "auto"/"numba" on NumPy arrays only; _host calls `.get()` on a device array."""
    import types

    from tgsim.codecs import sign

    assert sign.SignSGD.name == "sign" and sign.ScaledSign.name == "scaled_sign"
    assert sign.SignSGD.properties == CodecProperties(unbiased=False, wire="own", combine="majority")
    assert sign.ScaledSign.properties == CodecProperties(unbiased=False, wire="own", combine="mean")
    for k in ("auto", "reference", "numba", "cuda"):
        assert sign.SignSGD(kernels=k).kernels == k
    with pytest.raises(ValueError, match="unknown kernels"):
        sign.ScaledSign(kernels="bogus")
    assert sign.ScaledSign.from_config(types.SimpleNamespace()).kernels == "auto"
    assert sign.SignSGD.from_config(types.SimpleNamespace(kernels="cuda")).kernels == "cuda"
    assert repr(sign.SignSGD()) == "SignSGD()"
    assert repr(sign.ScaledSign(kernels="reference")) == "ScaledSign(kernels='reference')"
    assert _kernel_choice(sign.SignSGD) == ([True, True, False, False], [False, False, False])

    class Device:
        def get(self):
            return np.array([3], np.uint8)

    a = np.array([1], np.uint8)
    assert sign._host(a) is a and sign._host(Device()).tolist() == [3]


def test_sign_l1_norm_lanes_by_hand():
    """l1_norm: Σ|v_i| in 65536 lanes then a halving tree; with integer values every sum is exact, so
    it equals the plain sum: n = 65540 ones with v[65536] = -1000 (the first element past the lanes,
    in lane 0's second row) -> 66539; 3 elements (width 4, one lane left 0) -> 6; 1 element -> its |v|;
    empty -> 0."""
    from tgsim.codecs.sign import l1_norm

    v = np.ones(65540, np.float32)
    v[65536] = -1000.0
    assert l1_norm(v) == 66539.0
    assert l1_norm(np.array([1.0, -2.0, 3.0], np.float32)) == 6.0
    assert l1_norm(np.array([-2.5], np.float32)) == 2.5 and l1_norm(np.zeros(0, np.float32)) == 0.0
    w = np.arange(1, 70001, dtype=np.float32)
    assert l1_norm(w) == 70000 * 70001 / 2


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_sign_bytes_decode_and_vote_by_hand(kernels):
    """sign: g = [-1, 2, 0, -0.0, -3, 5, 6, -7, 8] (n = 9; -0.0 and 0 are not < 0): sign bits
    1,0,0,0,1,0,0,1 | 0 -> bytes 0x91 0x00 (bit j of byte j // 8, little bit order); a second layer
    of 3 elements [-1, -1, 1] -> 0x03. Header: b"TGS1", version 1, 2 layers, body 3 bytes;
    wire_bytes 24. Decode ±1. Vote of three workers (this one, its negation, all +): +1 where two
    or more are +; of two workers (this one and its negation): 0 everywhere (ties)."""
    from tgsim.codecs.sign import SignSGD

    codec = SignSGD(kernels=kernels)
    g = np.array([[-1, 2, 0, -0.0, -3, 5, 6, -7, 8]], np.float32)
    h = np.array([[[-1.0], [-1.0], [1.0]]], np.float32)
    m = codec.encode_many({"g": g, "h": h}, 0, 0, [0])[0]
    raw = m.to_bytes()
    assert _header(raw)[:3] == (b"TGS1", 1, 2) and _header(raw)[4] == 3
    assert raw[21:] == bytes([0x91, 0x00, 0x03]) and m.wire_bytes == len(raw) == 24
    back = codec.from_bytes(raw, m)
    assert back.signs["g"].tolist() == [0x91, 0x00] and back.signs["h"].tolist() == [0x03]
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.signs = {}
    with pytest.raises(PayloadError, match="sign message version 2"):
        codec.from_bytes(raw[:4] + b"\x02" + raw[5:], m)
    with pytest.raises(PayloadError, match="sign message body is 2 bytes, the layers need 3"):
        codec.from_bytes(raw[:13] + (2).to_bytes(8, "little") + raw[21:23], m)
    assert codec.decode(back)["g"].tolist() == [-1, 1, 1, 1, -1, 1, 1, -1, 1]
    assert codec.decode(back)["h"].tolist() == [[-1.0], [-1.0], [1.0]]
    three = codec.encode_many({"g": np.concatenate([g, -g, np.ones_like(g)]), "h": np.concatenate([h, -h, h])},
                              0, 0, [0, 1, 2])
    vote = codec.aggregate(three)
    assert vote["g"].tolist() == [1, 1, 1, 1, 1, 1, 1, 1, 1]      # -0 and 0 encode +: -g of them is -0/0 -> +
    assert vote["h"].tolist() == [[-1.0], [-1.0], [1.0]]
    two = codec.aggregate(three[:1] + [three[1]])
    assert two["h"].tolist() == [[0.0], [0.0], [0.0]] and two["g"].tolist() == [0, 0, 1, 1, 0, 0, 0, 0, 0]
    assert codec.aggregate(three[:1])["g"].tolist() == [-1, 1, 1, 1, -1, 1, 1, -1, 1]


@pytest.mark.parametrize("n_msgs", [255, 256, 257])
def test_sign_reference_vote_counts_do_not_wrap(n_msgs):
    """The array vote counts negatives in an unsigned integer sized by the message count: with every
    one of 255, 256 or 257 workers negative the vote is -1 (a uint8 count would wrap to 0 at 256 and
    vote +1); with one fewer negative than half, +1; exactly half (even N), 0."""
    from tgsim.codecs.sign import SignSGD

    codec = SignSGD(kernels="reference")
    g = -np.ones((n_msgs, 3), np.float32)
    half = n_msgs // 2
    g[:, 1] = np.where(np.arange(n_msgs) < half, -1.0, 1.0)           # 2 half <= N: +1 (or a tie)
    g[:, 2] = np.where(np.arange(n_msgs) < half + 1, -1.0, 1.0)       # 2 (half + 1) > N: -1
    msgs = codec.encode_many({"g": g}, 0, 0, list(range(n_msgs)))
    want = [-1.0, 0.0 if n_msgs % 2 == 0 else 1.0, -1.0]
    assert codec.aggregate(msgs)["g"].tolist() == want


def test_sign_reference_vote_count_holds_65536_messages():
    """2^16 workers all negative: the count needs more than 16 bits (uint32); the vote is -1, not the
    +1 a wrapped uint16 count of 0 would give."""
    from tgsim.codecs.sign import SignMessage, SignSGD

    msg = SignMessage({"g": (1,)}, {"g": np.array([1], np.uint8)})
    assert SignSGD(kernels="reference").aggregate([msg] * 2**16)["g"].tolist() == [-1.0]


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_scaled_sign_bytes_by_hand(kernels, monkeypatch):
    """scaled_sign: a = [1, -3, 0, 2] -> c = 6/4 = 1.5, a zero element so 2 planes: signs 0b0010,
    nonzero 0b1011; b = [[0.5, -0.5]] -> c = 0.5, 1 plane, signs 0b10; z = 0 -> c = 0, no plane;
    e (empty) -> c = 0. Body: scales f32 [1.5, 0.5, 0, 0], planes [2, 1, 0, 0], then 0x02 0x0B 0x02;
    wire_bytes = 21 + 5·4 + 3 = 44. Decode: c·sign, 0 where g == 0; the mean of it and its negation
    is 0, of it alone (divide_by 2) half. The mean runs in the Numba kernel (once per layer) for
    "auto" on NumPy messages, whose absent planes are None, and never for "reference"."""
    from tgsim.codecs import numba_sign
    from tgsim.codecs.sign import ScaledSign

    calls = []
    real = numba_sign.scaled_mean
    monkeypatch.setattr(numba_sign, "scaled_mean", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    codec = ScaledSign(kernels=kernels)
    layers = {"a": np.array([[1.0, -3.0, 0.0, 2.0]], np.float32), "b": np.array([[[0.5, -0.5]]], np.float32),
              "z": np.zeros((1, 3), np.float32), "e": np.zeros((1, 0), np.float32)}
    m = codec.encode_many(layers, 0, 0, [0])[0]
    raw = m.to_bytes()
    assert _header(raw)[:3] == (b"TGC1", 1, 4)
    assert raw[21:] == np.array([1.5, 0.5, 0, 0], "<f4").tobytes() + bytes([2, 1, 0, 0, 0x02, 0x0B, 0x02])
    assert m.wire_bytes == len(raw) == 44
    back = codec.from_bytes(raw, m)
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.scales = None
    with pytest.raises(PayloadError, match="scaled_sign message version 2"):
        codec.from_bytes(raw[:4] + b"\x02" + raw[5:], m)
    dec = codec.decode(back)
    assert dec["a"].tolist() == [1.5, -1.5, 0.0, 1.5] and dec["b"].tolist() == [[0.5, -0.5]]
    assert dec["z"].tolist() == [0.0, 0.0, 0.0] and dec["e"].shape == (0,)
    neg = codec.encode_many({k: -v for k, v in layers.items()}, 0, 0, [0])[0]
    assert codec.aggregate([m, neg])["a"].tolist() == [0.0] * 4
    assert codec.aggregate([back], divide_by=2)["a"].tolist() == [0.75, -0.75, 0.0, 0.75]
    assert codec.aggregate([back])["b"].tolist() == [[0.5, -0.5]]
    assert len(calls) == (12 if kernels == "auto" else 0)


def test_scaled_sign_from_bytes_checks_each_field():
    """from_bytes of a 2-layer message (a: 4 elements with a zero, planes 2; b: 9 elements, planes 1)
    refuses: a body shorter than the 5 L scale/plane bytes, a scale of -0.0 with no planes, an empty
    layer with a scale and a plane, one byte too many or too few, padding bits after b's 9 elements,
    and reads b's plane at the right offset."""
    import struct

    from tgsim.codecs.sign import ScaledSign

    codec = ScaledSign(kernels="reference")
    a = np.array([[1.0, -3.0, 0.0, 2.0]], np.float32)
    b = np.array([[-1, 2, 3, -4, 5, 6, 7, 8, -9]], np.float32)
    m = codec.encode_many({"a": a, "b": b}, 0, 0, [0])[0]
    raw = m.to_bytes()
    body = raw[21:]
    assert body[8:10] == bytes([2, 1]) and body[10:] == bytes([0x02, 0x0B, 0x09, 0x01])

    def framed(new_body):
        return raw[:13] + struct.pack("<Q", len(new_body)) + new_body

    assert codec.decode(codec.from_bytes(framed(body), m))["b"].tolist() == [-5, 5, 5, -5, 5, 5, 5, 5, -5]
    for cut in (9, 10):
        with pytest.raises(PayloadError, match="shorter than its 2 scales" if cut == 9 else "plane counts need"):
            codec.from_bytes(framed(body[:cut]), m)
    with pytest.raises(PayloadError, match="plane counts need 14"):
        codec.from_bytes(framed(body + b"\0"), m)
    with pytest.raises(PayloadError, match="padding bits"):
        codec.from_bytes(framed(body[:-1] + b"\x03"), m)
    zero = codec.encode_many({"a": np.zeros((1, 4), np.float32), "b": b}, 0, 0, [0])[0]
    zb = zero.to_bytes()[21:]
    assert zb[:4] == bytes(4) and zb[8] == 0
    with pytest.raises(PayloadError, match="not a finite value >= \\+0"):
        codec.from_bytes(framed(np.float32(-0.0).tobytes() + zb[4:]), zero)
    e = codec.encode_many({"e": np.zeros((1, 0), np.float32)}, 0, 0, [0])[0]
    er = e.to_bytes()
    assert er[21:] == bytes(5)
    bad = er[:21] + np.float32(1).tobytes() + bytes([1])
    with pytest.raises(PayloadError, match="with 1 bit planes for 0 elements"):
        codec.from_bytes(bad, e)


def test_scaled_sign_bits_per_element():
    """Up, one layer: 8 (21 + 5 + planes ceil(n/8)) / n with 1 plane, or 2 with zeros; n = 10: 8 (26 +
    2) / 10 = 22.4 and 8 (26 + 4) / 10 = 24; sign: 8 (21 + 2) / 10 = 18.4, down 2; empty: 0."""
    from tgsim.codecs.sign import ScaledSign, SignSGD

    assert ScaledSign().bits_per_element(10, 3) == {"up": 22.4, "down": 32}
    assert ScaledSign().bits_per_element(10, 3, with_zeros=True) == {"up": 24.0, "down": 32}
    assert ScaledSign().bits_per_element(0, 3) == {"up": 0.0, "down": 32}
    assert SignSGD().bits_per_element(10, 3) == {"up": 18.4, "down": 2}
    assert SignSGD().bits_per_element(0, 3) == {"up": 0.0, "down": 2}


def test_bf16_numba_kernels_refuse_a_device_array(monkeypatch):
    """round_to_bf16 with kernels "numba" on an array that is not NumPy's (CuPy's; here any array
    whose array module is not numpy) is a ValueError saying the Numba kernel runs on NumPy arrays."""
    import types

    from tgsim.codecs import bf16

    monkeypatch.setattr(bf16, "array_module", lambda a: types.SimpleNamespace(name="not numpy"))
    with pytest.raises(ValueError, match="runs on NumPy arrays"):
        bf16.round_to_bf16(np.ones(3, np.float32), "numba")


# -- suresh.py --------------------------------------------------------------------------------------

def test_suresh_options_repr_and_kernel_choice():
    """Suresh: registered as "suresh", unbiased, own wire, mean; defaults k = 7, no rotation, kernels
    "auto"; levels an integer in [2, 2^16] (NumPy integers too; bools and floats refused), rotate a
    bool (NumPy's too; 1 refused), the four kernels options; from_config reads levels and rotate and
    kernels (default "auto"); repr; the Numba kernels for "auto"/"numba" on NumPy arrays only; it
    shares no statistics (TypeError)."""
    import types

    from tgsim.codecs.suresh import Suresh

    assert Suresh.name == "suresh"
    assert Suresh.properties == CodecProperties(unbiased=True, wire="own", combine="mean")
    c = Suresh()
    assert (c.levels, c.rotate, c.kernels) == (7, False, "auto")
    assert Suresh(levels=2).levels == 2 and Suresh(levels=2**16).levels == 65536
    assert Suresh(levels=np.int64(3)).levels == 3 and Suresh(rotate=np.bool_(True)).rotate is True
    for bad in (1, 65537, True, 7.0):
        with pytest.raises(ValueError, match="levels"):
            Suresh(levels=bad)
    with pytest.raises(ValueError, match="rotate"):
        Suresh(rotate=1)
    for k in ("auto", "reference", "numba", "cuda"):
        assert Suresh(kernels=k).kernels == k
    with pytest.raises(ValueError, match="unknown kernels"):
        Suresh(kernels="bogus")
    got = Suresh.from_config(types.SimpleNamespace(levels=3, rotate=True))
    assert (got.levels, got.rotate, got.kernels) == (3, True, "auto")
    assert Suresh.from_config(types.SimpleNamespace(levels=3, rotate=False, kernels="cuda")).kernels == "cuda"
    assert repr(Suresh()) == "Suresh(levels=7, rotate=False)"
    assert repr(Suresh(levels=4, rotate=True, kernels="numba")) == "Suresh(levels=4, rotate=True, kernels='numba')"
    assert _kernel_choice(Suresh) == ([True, True, False, False], [False, False, False])
    with pytest.raises(TypeError, match="shares no statistics"):
        Suresh().local_scalers_many({}, 2)


def test_suresh_sizes_by_hand():
    """code_bits(k) = ceil(log2 k): 2 -> 1, 3 -> 2, 4 -> 2, 5 -> 3, 256 -> 8, 257 -> 9, 65536 -> 16;
    padded_size(n) = 2^ceil(log2 n): 0 -> 0, 1 -> 1, 2 -> 2, 3 -> 4, 1025 -> 2048; quantized_size is n,
    or d when rotating."""
    from tgsim.codecs.suresh import Suresh, code_bits, padded_size

    assert [code_bits(k) for k in (2, 3, 4, 5, 256, 257, 65536)] == [1, 2, 2, 3, 8, 9, 16]
    assert [padded_size(n) for n in (0, 1, 2, 3, 1025)] == [0, 1, 2, 4, 2048]
    assert Suresh().quantized_size(5) == 5 and Suresh(rotate=True).quantized_size(5) == 8


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_suresh_bytes_by_hand(kernels):
    """k = 5 (3 bits), no rotation, v = [0, 1, 2, 3, 4] (lo = 0, hi = 4, Δ = 1: every x_i an integer, so
    l_i = i whatever the uniforms): header b"TGS1", version 1, 2 layers; body k u32 = 5, rotate u8 = 0;
    layer v: lo, hi float32, then levels 0..4 in 3 bits, level i at bits 3i.. (LSB first): bits 3
    (l_1), 7 (l_2 = 0b010), 9, 10 (l_3), 14 (l_4 = 0b100) set -> 0x88, 0x46 (1 padding bit); empty layer e:
    nothing. Decode gives v back; the mean of it and a copy divided by 4 is v / 2."""
    from tgsim.codecs.suresh import Suresh

    codec = Suresh(levels=5, kernels=kernels)
    v = np.arange(5, dtype=np.float32)
    m = codec.encode_many({"v": v[None], "e": np.zeros((1, 0), np.float32)}, 3, 1, [0])[0]
    raw = m.to_bytes()
    assert _header(raw)[:3] == (b"TGS1", 1, 2)
    assert raw[21:] == b"\x05\x00\x00\x00\x00" + np.array([0, 4], "<f4").tobytes() + b"\x88\x46"
    assert m.wire_bytes == len(raw) == 21 + 5 + 8 + 2
    back = codec.from_bytes(raw, m)
    assert back.levels["v"].tolist() == [0, 1, 2, 3, 4] and back.ranges["e"].size == 0
    assert codec.decode(back)["v"].tolist() == [0, 1, 2, 3, 4] and codec.decode(back)["e"].shape == (0,)
    assert codec.aggregate([back, m], divide_by=4)["v"].tolist() == [0, 0.5, 1, 1.5, 2]
    assert codec.aggregate([m])["v"].tolist() == [0, 1, 2, 3, 4]


# -- sparse.py --------------------------------------------------------------------------------------

def test_sparse_sizes_and_keep_probabilities_by_hand():
    """index_bytes: 1 up to 2^8 elements, 2 up to 2^16, else 4; message_bytes([2, 1], [4, 300]) =
    21 + (4 + 2 (1 + 4)) + (4 + 1 (2 + 4)) = 45. keep_probabilities (p_i = min(λ a_i, 1), Σ p_i = k):
    a = [4, 1, 1, 2], k = 2: λ = 2 / 8 (4 λ = 1 saturates exactly) -> [1, .25, .25, .5]; a = [10, 1, 1],
    k = 2: λ_0 = 2/12 gives 10 λ_0 > 1, so λ = 1 / (1 + 1) -> [1, .5, .5]; k >= nnz: 1 on the nonzeros;
    k = 0: all 0; k = nnz: exactly 1 on the nonzeros."""
    from tgsim.codecs import sparse

    assert [sparse.index_bytes(n) for n in (1, 256, 257, 65536, 65537)] == [1, 1, 2, 2, 4]
    assert sparse.message_bytes([2, 1], [4, 300]) == 45
    assert sparse.keep_probabilities(np.array([4.0, 1, 1, 2]), 2).tolist() == [1.0, 0.25, 0.25, 0.5]
    assert sparse.keep_scale(np.array([4.0, 1, 1, 2]), 2) == 0.25
    assert sparse.keep_probabilities(np.array([10.0, 1, 1]), 2).tolist() == [1.0, 0.5, 0.5]
    assert sparse.keep_probabilities(np.array([0.0, 3, 0, 1]), 2).tolist() == [0.0, 1.0, 0.0, 1.0]
    assert sparse.keep_probabilities(np.array([0.0, 3, 0, 1]), 5).tolist() == [0.0, 1.0, 0.0, 1.0]
    # k = nnz: exactly 1.0 on the nonzeros (not min(λ a, 1) with λ = 1/49, where (1/49)·49 < 1 in float64)
    assert sparse.keep_probabilities(np.array([0.0, 49.0, 98.0]), 2).tolist() == [0.0, 1.0, 1.0]
    assert sparse.keep_probabilities(np.array([2.0, 3]), 0).tolist() == [0.0, 0.0]


def test_sparse_options_properties_and_kernel_choice():
    """TopK / RandomK: registered as "topk" / "randomk", biased / unbiased, own wire, mean; defaults
    density 0.01, k 0, kernels "auto"; density 1 and k = 2^32 - 1 are accepted (NumPy numbers too);
    from_config reads density, k and kernels (default "auto"); the Numba kernels for "auto"/"numba"
    on NumPy arrays only."""
    import types

    from tgsim.codecs.sparse import RandomK, TopK

    assert TopK.name == "topk" and RandomK.name == "randomk"
    assert TopK.properties == CodecProperties(unbiased=False, wire="own", combine="mean")
    assert RandomK.properties == CodecProperties(unbiased=True, wire="own", combine="mean")
    c = TopK()
    assert (c.density, c.k, c.kernels) == (0.01, 0, "auto")
    assert TopK(density=1).density == 1.0 and RandomK(k=2**32 - 1).k == 2**32 - 1
    assert TopK(density=np.float32(0.5)).density == 0.5 and TopK(k=np.int64(4)).k == 4
    for k in ("auto", "reference", "numba", "cuda"):
        assert RandomK(kernels=k).kernels == k
    got = RandomK.from_config(types.SimpleNamespace(density=0.25, k=3))
    assert (got.density, got.k, got.kernels) == (0.25, 3, "auto")
    assert TopK.from_config(types.SimpleNamespace(density=0.5, k=0, kernels="cuda")).kernels == "cuda"
    assert _kernel_choice(TopK) == ([True, True, False, False], [False, False, False])


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_topk_bytes_by_hand(kernels, monkeypatch):
    """topk, k = 2: v = [0.5, -3, 1, 2] keeps indices 1, 3 (|v| 3 and 2), values -3, 2; a layer of 300
    elements w (2-byte indices) keeps 299 and 7 (|v| 9, 8). Body per layer: count u32 | indices |
    float32 values; header b"TGK1", version 1, 2 layers. The decode is 0 elsewhere; the mean of the
    message with a zero layer's message is half of it, of it alone (divide_by 4) a quarter; the mean
    runs in the Numba decode-sum (once per layer) for "auto" only."""
    from tgsim.codecs import numba_sparse
    from tgsim.codecs.sparse import TopK

    calls = []
    real = numba_sparse.decode_sum
    monkeypatch.setattr(numba_sparse, "decode_sum", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    codec = TopK(k=2, kernels=kernels)
    v = np.array([[0.5, -3.0, 1.0, 2.0]], np.float32)
    w = np.zeros((1, 300), np.float32)
    w[0, 299], w[0, 7] = -9.0, 8.0
    m = codec.encode_many({"v": v, "w": w}, 1, 0, [0])[0]
    raw = m.to_bytes()
    assert _header(raw)[:3] == (b"TGK1", 1, 2)
    want = (b"\x02\x00\x00\x00" + bytes([1, 3]) + np.array([-3, 2], "<f4").tobytes()
            + b"\x02\x00\x00\x00" + np.array([7, 299], "<u2").tobytes() + np.array([8, -9], "<f4").tobytes())
    assert raw[21:] == want and m.wire_bytes == len(raw) == 21 + 14 + 16
    back = codec.from_bytes(raw, m)
    assert back.indices["w"].tolist() == [7, 299] and back.values["v"].tolist() == [-3.0, 2.0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.values = {}
    assert codec.decode(back)["v"].tolist() == [0.0, -3.0, 0.0, 2.0]
    z = codec.encode_many({"v": np.zeros((1, 4), np.float32), "w": np.zeros((1, 300), np.float32)}, 1, 0, [0])[0]
    assert codec.aggregate([back, z])["v"].tolist() == [0.0, -1.5, 0.0, 1.0]
    assert codec.aggregate([back], divide_by=4)["w"][[7, 299]].tolist() == [2.0, -2.25]
    assert len(calls) == (4 if kernels == "auto" else 0)


def test_sparse_bits_per_element():
    """n = 10, k = 2: 8 (21 + 4 + 2 (1 + 4)) / 10 = 28 ("up" for both; topk's "up_max" too); randomk's
    "up_max" keeps all 10: 8 (21 + 4 + 10 · 5) / 10 = 60; down 32; an empty layer costs 0."""
    from tgsim.codecs.sparse import RandomK, TopK

    assert TopK(k=2).bits_per_element(10, 3) == {"up": 28.0, "up_max": 28.0, "down": 32}
    assert RandomK(k=2).bits_per_element(10, 3) == {"up": 28.0, "up_max": 60.0, "down": 32}
    for cls in (TopK, RandomK):
        assert cls(k=2).bits_per_element(0, 3) == {"up": 0.0, "up_max": 0.0, "down": 32}


def _lambda_oracle(a: np.ndarray, k: int) -> float:
    """λ by the rule of the docstring, on the whole sorted array: with a_(0) >= a_(1) >= ... and
    λ_j = (k - j) / Σ_{i >= j} a_(i), the first j with λ_j a_(j) <= 1."""
    s = np.sort(a.astype(np.float64))[::-1]
    tail = np.cumsum(s[::-1])[::-1]
    for j in range(k):
        lam = (k - j) / tail[j]
        if lam * s[j] <= 1.0 + 1e-12:
            return float(lam)
    raise AssertionError("no j")


def test_sparse_keep_scale_of_large_layers_equals_a_sorted_oracle():
    """keep_scale on layers of 2^17 elements (the candidate shortcut: n >= 2^16 and 4 k <= n) equals
    the rule computed on the fully sorted layer (relative 1e-9), and Σ min(λ a_i, 1) = k: |N(0,1)|
    with k = 1000; a layer whose mass is almost all in 30 values of 1000 (the rest below 1e-9, so the
    elements outside the candidates sum to less than 1e-6 of the total: the direct-sum branch),
    k = 20 (λ ~ 20 / 30435: none saturates) and k = 40 (the 30 large values saturate, p = 1, and the
    other 10 are spread over the small ones); top_k_indices there are the k largest (a stable
    argsort of -a); k = 0 gives no index."""
    from tgsim.codecs import sparse

    n = 1 << 17
    normal = np.abs(np.random.default_rng(1).standard_normal(n))
    spiky = np.random.default_rng(2).random(n) * 1e-9
    spiky[np.random.default_rng(3).choice(n, 30, replace=False)] = 1000.0 + np.arange(30)
    for a, k in ((normal, 1000), (spiky, 20), (spiky, 40)):
        lam = sparse.keep_scale(a, k)
        assert lam == pytest.approx(_lambda_oracle(a, k), rel=1e-9), k
        assert np.minimum(lam * a, 1.0).sum() == pytest.approx(k, rel=1e-9)
        got = sparse.top_k_indices(a, k)
        assert got.tolist() == sorted(np.argsort(-a, kind="stable")[:k].tolist())
    assert sparse.top_k_indices(np.ones(3), 0).tolist() == []


@pytest.mark.parametrize("kernels", ["reference", "auto"])
def test_randomk_draw_by_hand(kernels):
    """randomk, n = 200, k = 20, key (seed 7, step 3, worker 5, layer 0): with λ from the sorted
    rule, x_i = λ |v_i| 2^24 and w_i = tgsim.rng.random_words(n, key) >> 8, element i is kept iff
    w_i < x_i, and sent as f32(v_i / (ceil(min(x_i, 2^24)) / 2^24)); the message's bytes read back."""
    from tgsim.codecs.sparse import RandomK
    from tgsim.rng import StreamKey, random_words

    v = np.random.default_rng(4).standard_normal(200).astype(np.float32)
    a = np.abs(v).astype(np.float64)
    x = a * (_lambda_oracle(a, 20) * 2.0**24)
    w = random_words(200, StreamKey(7, 3, 5, 0), np) >> np.uint32(8)
    idx = np.flatnonzero(w < x)
    want = (v[idx].astype(np.float64) / (np.ceil(np.minimum(x[idx], 2.0**24)) / 2.0**24)).astype(np.float32)
    codec = RandomK(k=20, kernels=kernels)
    m = codec.encode_many({"g": v[None]}, 7, 3, [5])[0]
    assert m.indices["g"].tolist() == idx.tolist() and m.values["g"].tolist() == want.tolist()
    assert 5 <= idx.size <= 40
    back = codec.from_bytes(m.to_bytes(), m)
    assert back.values["g"].tolist() == want.tolist()


def test_sparse_words_from_2_15_elements_come_from_the_numba_philox(monkeypatch):
    """_words24: w_i = word_i >> 8 of tgsim.rng.random_words at any length, drawn by the Numba Philox
    from 2^15 = 32768 elements on (documented), by the reference below that."""
    from test_mutants_peers import numba_philox_calls
    from tgsim.codecs import sparse
    from tgsim.rng import StreamKey, random_words

    calls = numba_philox_calls(monkeypatch)
    key = StreamKey(4, 1, 2, 3)
    for n, numba in ((32767, False), (32768, True)):
        calls.clear()
        got = sparse._words24(n, key)
        assert got.tolist() == (random_words(n, key, np) >> np.uint32(8)).tolist()
        assert calls == ([n] if numba else []), n


def test_sparse_scalar_layers_and_k_range():
    """A 0-d layer (gradients (W,)): each worker's value is a NumPy scalar, encoded as one element
    (topk k = 1 keeps it); k = 2^32 - 1 is the largest k accepted, 2^32 is a ValueError; _host
    returns a NumPy array as it is and calls `.get()` on a device (CuPy) array."""
    from tgsim.codecs import sparse
    from tgsim.codecs.sparse import RandomK, TopK

    class Device:
        def get(self):
            return np.array([4.0, 5.0])

    a = np.ones(2)
    assert sparse._host(a) is a and sparse._host(Device()).tolist() == [4.0, 5.0]

    for kernels in ("auto", "reference"):
        m0, m1 = TopK(k=1, kernels=kernels).encode_many({"s": np.array([1.5, -2.0], np.float32)}, 0, 0, [0, 1])
        assert m0.values["s"].tolist() == [1.5] and m1.values["s"].tolist() == [-2.0]
        assert m1.indices["s"].tolist() == [0]
    for cls in (TopK, RandomK):
        assert cls(k=2**32 - 1).k == 2**32 - 1
        with pytest.raises(ValueError, match="k must be"):
            cls(k=2**32)


@pytest.mark.parametrize("kernels", ["reference", "auto"])
def test_randomk_keeps_only_words_below_the_threshold(kernels, monkeypatch):
    """Keep iff w_i < x_i (strictly): v of 8 multiples of 2^-24 summing to k = 2 with max 1, so
    λ = 2 / 2 = 1 exactly and x_i = v_i 2^24 are integers; v_0 = w_0 2^-24 puts x_0 = w_0 on the
    boundary: element 0 is not kept, element 1 (x = 2^24) always is, every kept value is
    v_i / (x_i / 2^24) = 1. With k = 1 (and more nonzeros) "auto" draws in the Numba kernel."""
    from tgsim.codecs import numba_sparse
    from tgsim.codecs.sparse import RandomK
    from tgsim.rng import StreamKey, random_words

    calls = []
    real = numba_sparse.random_keep
    monkeypatch.setattr(numba_sparse, "random_keep", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    w = (random_words(8, StreamKey(1, 2, 0, 0), np) >> np.uint32(8)).astype(np.int64)
    assert 0 < w[0] < 2**24 - 6
    a = np.zeros(8)
    a[0], a[1] = w[0] / 2**24, 1.0
    rest = 2**24 - w[0]                                   # (1 - a_0) in units of 2^-24, split in 6
    parts = [rest // 6] * 5 + [rest - 5 * (rest // 6)]
    a[2:] = np.array(parts) / 2**24
    assert a.sum() == 2.0 and a.max() == 1.0
    want = np.flatnonzero(w < a * 2**24)
    assert 0 not in want and 1 in want
    codec = RandomK(k=2, kernels=kernels)
    m = codec.encode_many({"g": a.astype(np.float32)[None]}, 1, 2, [0])[0]
    assert m.indices["g"].tolist() == want.tolist() and m.values["g"].tolist() == [1.0] * want.size
    RandomK(k=1, kernels=kernels).encode_many({"g": a.astype(np.float32)[None]}, 1, 2, [0])
    assert len(calls) == (2 if kernels == "auto" else 0)


def test_suresh_rotation_signs_are_words_from_2_33(monkeypatch):
    """rotate(v, key) = H D v' / sqrt(d) with D = diag(1 - 2 (word_j & 1)), word_j the words
    [2^33, 2^33 + d) of the layer's stream (documented), H scipy's Sylvester-Hadamard matrix: v of 5
    elements, d = 8. The host's words come from the Numba Philox from 256 words on (documented), from
    the reference below that, equal either way."""
    import scipy.linalg

    from tgsim.codecs import suresh
    from tgsim.rng import StreamKey, numba_philox, random_words

    key = StreamKey(9, 4, 2, 1)
    v = np.array([1.0, -2.0, 0.5, 3.0, -1.5])
    d_signs = 1.0 - 2.0 * (random_words(8, key, np, 2**33) & np.uint32(1)).astype(np.float64)
    want = scipy.linalg.hadamard(8) @ (d_signs * np.concatenate([v, np.zeros(3)])) / np.sqrt(8)
    assert np.allclose(suresh.rotate(v, key), want, rtol=0, atol=1e-12)
    calls = []
    real = numba_philox.random_words
    monkeypatch.setattr(numba_philox, "random_words", lambda n, k, *a: (calls.append(n), real(n, k, *a))[1])
    for n, numba in ((255, False), (256, True)):
        calls.clear()
        assert suresh._words(n, key, np).tolist() == random_words(n, key, np).tolist()
        assert calls == ([n] if numba else []), n


def _aggregate_of_three_workers(codec):
    """Three workers' (1, 2) layers, every value exact in fp16 and bf16: the mean (Σ in float64, then
    f32(acc · (1/divide_by))), the sum over 6, and one message decoded as itself."""
    g = np.array([[[1.0, -2.0]], [[3.0, 0.25]], [[0.5, 0.0]]], np.float32)
    msgs = codec.encode_many({"w": g}, 0, 0, [0, 1, 2])
    assert codec.aggregate(msgs)["w"].tolist() == [[1.5, np.float32(-1.75 * (1.0 / 3))]]
    assert codec.aggregate(msgs, divide_by=6)["w"].tolist() == [[0.75, np.float32(-1.75 * (1.0 / 6))]]
    one = codec.aggregate(msgs[:1])["w"]
    assert one.shape == (1, 2) and one.tolist() == [[1.0, -2.0]]
