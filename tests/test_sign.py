"""tgsim/codecs/sign.py: signSGD and scaled sign, their wire bytes, the l1 norm, the majority vote
and bits per element. Expected values are worked out by hand or with plain NumPy, never with the
module under test."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tgsim.codecs.base import CodecProperties
from tgsim.errors import PayloadError

from fakes import _header, _kernel_choice


@pytest.mark.mutation
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


@pytest.mark.mutation
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


@pytest.mark.mutation
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


@pytest.mark.mutation
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


@pytest.mark.mutation
def test_sign_reference_vote_count_holds_65536_messages():
    """2^16 workers all negative: the count needs more than 16 bits (uint32); the vote is -1, not the
    +1 a wrapped uint16 count of 0 would give."""
    from tgsim.codecs.sign import SignMessage, SignSGD

    msg = SignMessage({"g": (1,)}, {"g": np.array([1], np.uint8)})
    assert SignSGD(kernels="reference").aggregate([msg] * 2**16)["g"].tolist() == [-1.0]


@pytest.mark.mutation
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


@pytest.mark.mutation
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


@pytest.mark.mutation
def test_scaled_sign_bits_per_element():
    """Up, one layer: 8 (21 + 5 + planes ceil(n/8)) / n with 1 plane, or 2 with zeros; n = 10: 8 (26 +
    2) / 10 = 22.4 and 8 (26 + 4) / 10 = 24; sign: 8 (21 + 2) / 10 = 18.4, down 2; empty: 0."""
    from tgsim.codecs.sign import ScaledSign, SignSGD

    assert ScaledSign().link_bits(10, 3) == {"up": 22.4, "down": 32}
    assert ScaledSign().link_bits(10, 3, with_zeros=True) == {"up": 24.0, "down": 32}
    assert ScaledSign().link_bits(0, 3) == {"up": 0.0, "down": 32}
    assert SignSGD().link_bits(10, 3) == {"up": 18.4, "down": 2}
    assert SignSGD().link_bits(0, 3) == {"up": 0.0, "down": 2}
