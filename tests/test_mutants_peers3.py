"""Tests that kill mutants `tools/mutation.py` found surviving in tgsim/codecs/suresh.py (issue 22,
item 3; the run of /tmp/mutZ-suresh): fwht of a 0-d array, outward_range's float32 limit, its
negative side and its -0.0 -> +0.0, spacing, the frozen message, the stream key on the wire, the
Numba encoder's rotation scale, float64 ranges and constant layers, from_bytes's level dtype, level
and lo = hi checks and empty layers, and bits_per_element's keys. Survivors no test can see are
explained in /tmp/mutation-report-suresh.md. Expected values are worked out by hand (in the
docstrings) or with plain NumPy/struct, not with suresh's own helpers."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

import tgsim.codecs.suresh  # noqa: F401  (imported at the top: tools/mutation.py traces import-time lines)
from tgsim.errors import PayloadError

F32_MAX = float(np.finfo(np.float32).max)
HEADER_SIZE = 21                      # framing: "<4sBIIQ" = 4 + 1 + 4 + 4 + 8


def _suresh(**kw):
    from tgsim.codecs.suresh import Suresh

    return Suresh(**kw)


def test_fwht_of_a_0d_array_is_the_value():
    """A 0-d array is a length-1 transform (d = 1, H = [1]): fwht returns the value itself."""
    from tgsim.codecs.suresh import fwht

    out = fwht(np.array(3.5))
    assert float(out) == 3.5


def test_outward_range_float32_limit_is_inclusive_and_checks_the_negative_side():
    """max(-lo, hi) == float32's max is still sendable (only beyond it is refused); a minimum below
    -float32's max is refused even when the maximum is small."""
    from tgsim.codecs.suresh import outward_range

    lo, hi = outward_range(np.array([-F32_MAX, F32_MAX]))
    assert (float(lo), float(hi)) == (-F32_MAX, F32_MAX)
    with pytest.raises(ValueError, match="beyond float32"):
        outward_range(np.array([-1e39, 0.0]))


def test_outward_range_turns_negative_zero_into_positive_zero():
    """-0.0 as min or max goes out as +0.0 (sign bit clear)."""
    from tgsim.codecs.suresh import outward_range

    lo, _ = outward_range(np.array([-0.0, 1.0]))
    assert float(lo) == 0.0 and not np.signbit(lo)
    _, hi = outward_range(np.array([-1.0, -0.0]))
    assert float(hi) == 0.0 and not np.signbit(hi)


def test_spacing_is_the_range_over_k_minus_one():
    """Δ = (hi - lo) / (k - 1): lo = -1, hi = 3, k = 5 gives 1.0; lo = 2, hi = 4, k = 3 gives 1.0."""
    from tgsim.codecs.suresh import spacing

    assert spacing(np.float32(-1.0), np.float32(3.0), 5) == 1.0
    assert spacing(np.float32(2.0), np.float32(4.0), 3) == 1.0


def test_suresh_message_is_frozen():
    """SureshMessage (from encode_many) is a frozen dataclass: assigning a field raises
    FrozenInstanceError."""
    (msg,) = _suresh(levels=7, kernels="reference").encode_many({"w": np.ones((1, 2), np.float32)}, seed=0,
                                                                 step=0, workers=[0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.key = (1, 2, 3)


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


def test_numba_rotated_encode_decodes_back_to_the_input():
    """kernels = "numba", rotate, k = 2^16: the decode (reference) is the input up to Δ ~ range /
    65535 per coordinate; a wrong rotation scale (not 1/sqrt(d), d = 4) would scale the ranges and
    the decode by 2 or 4."""
    v = np.array([[1.0, -2.0, 0.5]], np.float32)
    enc = _suresh(levels=65536, rotate=True, kernels="numba")
    (msg,) = enc.encode_many({"w": v}, seed=1, step=2, workers=[0])
    out = _suresh(levels=65536, rotate=True, kernels="reference").decode(msg)["w"]
    np.testing.assert_allclose(out, v[0], atol=1e-3)


def test_numba_float64_range_is_rounded_outward_from_float64():
    """kernels = "numba", float64 gradient [0.1, 1.0]: lo is 0.1 rounded down to float32, i.e. the
    float32 below f32(0.1) (f32(0.1) = 0.10000000149 > 0.1), not f32(0.1) itself."""
    v = np.array([[0.1, 1.0]], np.float64)
    (msg,) = _suresh(levels=7, kernels="numba").encode_many({"w": v}, seed=0, step=0, workers=[0])
    lo, hi = msg.ranges["w"]
    assert lo == np.nextafter(np.float32(0.1), np.float32(-np.inf))
    assert float(lo) < 0.1 and hi == np.float32(1.0)


@pytest.mark.parametrize("k, dtype", [(256, np.uint8), (257, np.uint16)])
def test_numba_constant_layer_level_dtype(k, dtype):
    """A constant layer through the Numba encoder: levels are all 0, uint8 for k <= 256, uint16
    above (as the array code's quantize)."""
    v = np.full((1, 4), 2.0, np.float32)
    (msg,) = _suresh(levels=k, kernels="numba").encode_many({"w": v}, seed=0, step=0, workers=[0])
    assert msg.levels["w"].dtype == dtype
    assert not msg.levels["w"].any()


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


def test_from_bytes_refuses_level_k():
    """k = 7 (b = 3), levels [0, 7]: byte 7 << 3 = 56; 7 > k - 1 = 6 is refused, naming element 1."""
    msg, buf = _one_layer_buf(7, (2,), 0.0, 1.0, [56])
    with pytest.raises(PayloadError, match=r"element 1 has level 7 > k - 1 = 6"):
        _suresh(levels=7, kernels="reference").from_bytes(buf, msg)


def test_from_bytes_names_the_first_nonzero_level_where_lo_equals_hi():
    """k = 8 (b = 3), lo = hi = 1, levels [0, 0, 3]: level 3 in bits 6..8 -> bytes [192, 0]; the
    error names element 2 with level 3."""
    msg, buf = _one_layer_buf(8, (3,), 1.0, 1.0, [192, 0])
    with pytest.raises(PayloadError, match=r"element 2 has level 3 where lo = hi"):
        _suresh(levels=8, kernels="reference").from_bytes(buf, msg)


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


def test_bits_per_element_dicts():
    """n = 0: {"up": 0, "up_max": 0, "down": 32}. n = 5, k = 7, no rotation: 21 + 5 + 8 + ceil(15 / 8)
    = 36 bytes -> 288 / 5 = 57.6 bits, "up" = "up_max", "down" 32."""
    codec = _suresh(levels=7)
    assert codec.bits_per_element(0, 4) == {"up": 0.0, "up_max": 0.0, "down": 32}
    assert codec.bits_per_element(5, 4) == {"up": 57.6, "up_max": 57.6, "down": 32}
