"""tgsim/codecs/fp16.py: options, properties, the wire bytes, the float16 range check, the aggregate
and bits per element. Expected values are worked out by hand or with plain NumPy, never with the
module under test."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tgsim.codecs.base import CodecProperties
from tgsim.errors import NonFiniteGradientError, PayloadError

from fakes import _aggregate_of_three_workers, _header, _kernel_choice


@pytest.mark.mutation
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


@pytest.mark.mutation
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


@pytest.mark.mutation
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


@pytest.mark.mutation
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


@pytest.mark.mutation
def test_fp16_bits_per_element():
    """Up: 16 bits per element + the 21-byte header over n; down: 32; an empty layer costs 0 up."""
    from tgsim.codecs.fp16 import Float16

    assert Float16().link_bits(21, 3) == {"up": 16 + 8.0, "down": 32}
    assert Float16().link_bits(4, 3) == {"up": 16 + 42.0, "down": 32}
    assert Float16().link_bits(0, 3) == {"up": 0.0, "down": 32}
