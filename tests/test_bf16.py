"""tgsim/codecs/bf16.py: options, properties, the wire bytes, the kernel choice and bits per
element. Expected values are worked out by hand or with plain NumPy, never with the module under
test."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tgsim.codecs.base import CodecProperties
from tgsim.errors import PayloadError

from fakes import _aggregate_of_three_workers, _header


@pytest.mark.mutation
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


@pytest.mark.mutation
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


@pytest.mark.mutation
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


@pytest.mark.mutation
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


@pytest.mark.mutation
def test_bf16_bits_per_element():
    """Up: 16 bits per element + the 21-byte header over n; down: 32; an empty layer costs 0 up."""
    from tgsim.codecs.bf16 import BFloat16

    assert BFloat16().link_bits(21, 3) == {"up": 24.0, "down": 32}
    assert BFloat16().link_bits(4, 3) == {"up": 58.0, "down": 32}
    assert BFloat16().link_bits(0, 3) == {"up": 0.0, "down": 32}


@pytest.mark.mutation
def test_bf16_numba_kernels_refuse_a_device_array(monkeypatch):
    """round_to_bf16 with kernels "numba" on an array that is not NumPy's (CuPy's; here any array
    whose array module is not numpy) is a ValueError saying the Numba kernel runs on NumPy arrays."""
    import types

    from tgsim.codecs import bf16

    monkeypatch.setattr(bf16, "array_module", lambda a: types.SimpleNamespace(name="not numpy"))
    with pytest.raises(ValueError, match="runs on NumPy arrays"):
        bf16.round_to_bf16(np.ones(3, np.float32), "numba")
