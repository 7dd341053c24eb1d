"""tgsim/codecs/suresh.py: the rotation, the range and spacing, the wire bytes, from_bytes and the
Numba kernels. Expected values are worked out by hand or with plain NumPy, never with the module
under test."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

import tgsim.codecs.suresh  # noqa: F401  (imported at collection: tools/mutation.py traces import-time lines)
from tgsim.codecs.base import CodecProperties
from tgsim.errors import PayloadError

from fakes import _header, _kernel_choice


@pytest.mark.mutation
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
    got = Suresh.from_config(types.SimpleNamespace(options=dict(levels=3, rotate=True)))
    assert (got.levels, got.rotate, got.kernels) == (3, True, "auto")
    assert Suresh.from_config(types.SimpleNamespace(options=dict(levels=3, rotate=False), kernels="cuda")).kernels == "cuda"
    assert repr(Suresh()) == "Suresh(levels=7, rotate=False)"
    assert repr(Suresh(levels=4, rotate=True, kernels="numba")) == "Suresh(levels=4, rotate=True, kernels='numba')"
    assert _kernel_choice(Suresh) == ([True, True, False, False], [False, False, False])
    with pytest.raises(TypeError, match="shares no statistics"):
        Suresh().local_scalers_many({}, 2)


@pytest.mark.mutation
def test_suresh_sizes_by_hand():
    """code_bits(k) = ceil(log2 k): 2 -> 1, 3 -> 2, 4 -> 2, 5 -> 3, 256 -> 8, 257 -> 9, 65536 -> 16;
    padded_size(n) = 2^ceil(log2 n): 0 -> 0, 1 -> 1, 2 -> 2, 3 -> 4, 1025 -> 2048; quantized_size is n,
    or d when rotating."""
    from tgsim.codecs.suresh import Suresh, code_bits, padded_size

    assert [code_bits(k) for k in (2, 3, 4, 5, 256, 257, 65536)] == [1, 2, 2, 3, 8, 9, 16]
    assert [padded_size(n) for n in (0, 1, 2, 3, 1025)] == [0, 1, 2, 4, 2048]
    assert Suresh().quantized_size(5) == 5 and Suresh(rotate=True).quantized_size(5) == 8


@pytest.mark.mutation
@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_suresh_bytes_by_hand(kernels):
    """k = 5 (3 bits), no rotation, v = [0, 1, 2, 3, 4] (lo = 0, hi = 4, Δ = 1: every x_i an integer, so
    l_i = i whatever the uniforms): header b"TGU1", version 1, 2 layers; body k u32 = 5, rotate u8 = 0;
    layer v: lo, hi float32, then levels 0..4 in 3 bits, level i at bits 3i.. (LSB first): bits 3
    (l_1), 7 (l_2 = 0b010), 9, 10 (l_3), 14 (l_4 = 0b100) set -> 0x88, 0x46 (1 padding bit); empty layer e:
    nothing. Decode gives v back; the mean of it and a copy divided by 4 is v / 2."""
    from tgsim.codecs.suresh import Suresh

    codec = Suresh(levels=5, kernels=kernels)
    v = np.arange(5, dtype=np.float32)
    m = codec.encode_many({"v": v[None], "e": np.zeros((1, 0), np.float32)}, 3, 1, [0])[0]
    raw = m.to_bytes()
    assert _header(raw)[:3] == (b"TGU1", 1, 2)
    assert raw[21:] == b"\x05\x00\x00\x00\x00" + np.array([0, 4], "<f4").tobytes() + b"\x88\x46"
    assert m.wire_bytes == len(raw) == 21 + 5 + 8 + 2
    back = codec.from_bytes(raw, m)
    assert back.levels["v"].tolist() == [0, 1, 2, 3, 4] and back.ranges["e"].size == 0
    assert codec.decode(back)["v"].tolist() == [0, 1, 2, 3, 4] and codec.decode(back)["e"].shape == (0,)
    assert codec.aggregate([back, m], divide_by=4)["v"].tolist() == [0, 0.5, 1, 1.5, 2]
    assert codec.aggregate([m])["v"].tolist() == [0, 1, 2, 3, 4]


@pytest.mark.mutation
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


F32_MAX = float(np.finfo(np.float32).max)


HEADER_SIZE = 21                      # framing: "<4sBIIQ" = 4 + 1 + 4 + 4 + 8


def _suresh(**kw):
    from tgsim.codecs.suresh import Suresh

    return Suresh(**kw)


@pytest.mark.mutation
def test_fwht_of_a_0d_array_is_the_value():
    """A 0-d array is a length-1 transform (d = 1, H = [1]): fwht returns the value itself."""
    from tgsim.codecs.suresh import fwht

    out = fwht(np.array(3.5))
    assert float(out) == 3.5


@pytest.mark.mutation
def test_outward_range_float32_limit_is_inclusive_and_checks_the_negative_side():
    """max(-lo, hi) == float32's max is still sendable (only beyond it is refused); a minimum below
    -float32's max is refused even when the maximum is small."""
    from tgsim.codecs.suresh import outward_range

    lo, hi = outward_range(np.array([-F32_MAX, F32_MAX]))
    assert (float(lo), float(hi)) == (-F32_MAX, F32_MAX)
    with pytest.raises(ValueError, match="beyond float32"):
        outward_range(np.array([-1e39, 0.0]))


@pytest.mark.mutation
def test_outward_range_turns_negative_zero_into_positive_zero():
    """-0.0 as min or max goes out as +0.0 (sign bit clear)."""
    from tgsim.codecs.suresh import outward_range

    lo, _ = outward_range(np.array([-0.0, 1.0]))
    assert float(lo) == 0.0 and not np.signbit(lo)
    _, hi = outward_range(np.array([-1.0, -0.0]))
    assert float(hi) == 0.0 and not np.signbit(hi)


@pytest.mark.mutation
def test_spacing_is_the_range_over_k_minus_one():
    """Δ = (hi - lo) / (k - 1): lo = -1, hi = 3, k = 5 gives 1.0; lo = 2, hi = 4, k = 3 gives 1.0."""
    from tgsim.codecs.suresh import spacing

    assert spacing(np.float32(-1.0), np.float32(3.0), 5) == 1.0
    assert spacing(np.float32(2.0), np.float32(4.0), 3) == 1.0


@pytest.mark.mutation
def test_suresh_message_is_frozen():
    """SureshMessage (from encode_many) is a frozen dataclass: assigning a field raises
    FrozenInstanceError."""
    (msg,) = _suresh(levels=7, kernels="reference").encode_many({"w": np.ones((1, 2), np.float32)}, seed=0,
                                                                 step=0, workers=[0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.key = (1, 2, 3)


@pytest.mark.mutation
def test_rotated_bytes_carry_the_stream_key():
    """rotate = true: after the header and k u32 | rotate u8 come seed u64 | step u32 | worker u32
    (struct "<QII" by hand), the byte count equals wire_bytes, and from_bytes reads the key back."""
    codec = _suresh(levels=7, rotate=True, kernels="reference")
    g = np.arange(6, dtype=np.float32).reshape(1, 6) - 2.5
    (msg,) = codec.encode_many({"w": g}, seed=11, step=3, workers=[5])
    buf = msg.to_bytes()
    assert len(buf) == msg.wire_bytes
    assert buf[HEADER_SIZE:HEADER_SIZE + 5] == struct.pack("<IB", 7, 1)
    assert buf[HEADER_SIZE + 5:HEADER_SIZE + 21] == struct.pack("<QII", 11, 3, 5)
    back = codec.from_bytes(buf, msg)
    assert back.key == (11, 3, 5)


@pytest.mark.mutation
def test_numba_rotated_encode_decodes_back_to_the_input():
    """kernels = "numba", rotate, k = 2^16: the decode (reference) is the input up to Δ ~ range /
    65535 per coordinate; a wrong rotation scale (not 1/sqrt(d), d = 4) would scale the ranges and
    the decode by 2 or 4."""
    v = np.array([[1.0, -2.0, 0.5]], np.float32)
    enc = _suresh(levels=65536, rotate=True, kernels="numba")
    (msg,) = enc.encode_many({"w": v}, seed=1, step=2, workers=[0])
    out = _suresh(levels=65536, rotate=True, kernels="reference").decode(msg)["w"]
    np.testing.assert_allclose(out, v[0], atol=1e-3)


@pytest.mark.mutation
def test_numba_float64_range_is_rounded_outward_from_float64():
    """kernels = "numba", float64 gradient [0.1, 1.0]: lo is 0.1 rounded down to float32, i.e. the
    float32 below f32(0.1) (f32(0.1) = 0.10000000149 > 0.1), not f32(0.1) itself."""
    v = np.array([[0.1, 1.0]], np.float64)
    (msg,) = _suresh(levels=7, kernels="numba").encode_many({"w": v}, seed=0, step=0, workers=[0])
    lo, hi = msg.ranges["w"]
    assert lo == np.nextafter(np.float32(0.1), np.float32(-np.inf))
    assert float(lo) < 0.1 and hi == np.float32(1.0)


@pytest.mark.mutation
@pytest.mark.parametrize("k, dtype", [(256, np.uint8), (257, np.uint16)])
def test_numba_constant_layer_level_dtype(k, dtype):
    """A constant layer through the Numba encoder: levels are all 0, uint8 for k <= 256, uint16
    above (as the array code's quantize)."""
    v = np.full((1, 4), 2.0, np.float32)
    (msg,) = _suresh(levels=k, kernels="numba").encode_many({"w": v}, seed=0, step=0, workers=[0])
    assert msg.levels["w"].dtype == dtype
    assert not msg.levels["w"].any()


@pytest.mark.mutation
def test_numba_constant_layer_payload_length():
    """Constant layer, n = 3, k = 8 (b = 3): 9 bits -> ceil(9 / 8) = 2 zero bytes; the bytes read
    back."""
    codec = _suresh(levels=8, kernels="numba")
    v = np.full((1, 3), -1.5, np.float32)
    (msg,) = codec.encode_many({"w": v}, seed=0, step=0, workers=[0])
    assert msg.payload["w"].tolist() == [0, 0]
    buf = msg.to_bytes()
    assert len(buf) == HEADER_SIZE + 5 + 8 + 2
    back = codec.from_bytes(buf, msg)
    assert back.levels["w"].tolist() == [0, 0, 0]


@pytest.mark.mutation
@pytest.mark.parametrize("k, dtype", [(256, np.uint8), (257, np.uint16)])
def test_from_bytes_level_dtype(k, dtype):
    """from_bytes gives levels uint8 for k <= 256, uint16 above."""
    codec = _suresh(levels=k, kernels="reference")
    v = np.array([[0.0, 1.0, 2.0]], np.float32)
    (msg,) = codec.encode_many({"w": v}, seed=0, step=0, workers=[0])
    back = codec.from_bytes(msg.to_bytes(), msg)
    assert back.levels["w"].dtype == dtype


def _one_layer_buf(k, shape, lo, hi, payload):
    """The wire bytes of a one-layer unrotated message, the payload given by hand."""
    from tgsim.codecs.suresh import SureshMessage

    msg = SureshMessage((k, 0), None, {"w": shape}, {"w": np.array([lo, hi], np.float32)},
                        {"w": np.zeros(int(np.prod(shape)), np.uint8)}, {"w": np.array(payload, np.uint8)})
    return msg, msg.to_bytes()


@pytest.mark.mutation
def test_from_bytes_refuses_level_k():
    """k = 7 (b = 3), levels [0, 7]: byte 7 << 3 = 56; 7 > k - 1 = 6 is refused, naming element 1."""
    msg, buf = _one_layer_buf(7, (2,), 0.0, 1.0, [56])
    with pytest.raises(PayloadError, match=r"element 1 has level 7 > k - 1 = 6"):
        _suresh(levels=7, kernels="reference").from_bytes(buf, msg)


@pytest.mark.mutation
def test_from_bytes_names_the_first_nonzero_level_where_lo_equals_hi():
    """k = 8 (b = 3), lo = hi = 1, levels [0, 0, 3]: level 3 in bits 6..8 -> bytes [192, 0]; the
    error names element 2 with level 3."""
    msg, buf = _one_layer_buf(8, (3,), 1.0, 1.0, [192, 0])
    with pytest.raises(PayloadError, match=r"element 2 has level 3 where lo = hi"):
        _suresh(levels=8, kernels="reference").from_bytes(buf, msg)


@pytest.mark.mutation
def test_from_bytes_empty_layer_is_empty():
    """An empty layer has no bytes: from_bytes gives size-0 range, levels and payload, and the
    message's wire_bytes is the buffer's length."""
    codec = _suresh(levels=7, kernels="reference")
    layers = {"e": np.zeros((1, 0), np.float32), "a": np.array([[1.0, 2.0]], np.float32)}
    (msg,) = codec.encode_many(layers, seed=0, step=0, workers=[0])
    buf = msg.to_bytes()
    back = codec.from_bytes(buf, msg)
    assert back.ranges["e"].size == 0 and back.levels["e"].size == 0 and back.payload["e"].size == 0
    assert back.wire_bytes == len(buf)


@pytest.mark.mutation
def test_bits_per_element_dicts():
    """n = 0: {"up": 0, "up_max": 0, "down": 32}. n = 5, k = 7, no rotation: 21 + 5 + 8 + ceil(15 / 8)
    = 36 bytes -> 288 / 5 = 57.6 bits, "up" = "up_max", "down" 32."""
    codec = _suresh(levels=7)
    assert codec.link_bits(0, 4) == {"up": 0.0, "up_max": 0.0, "down": 32}
    assert codec.link_bits(5, 4) == {"up": 57.6, "up_max": 57.6, "down": 32}
