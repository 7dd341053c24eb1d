"""tgsim/codecs/qsgd.py: sizes and bits per element, from_bytes, options, the uniform draws and the
aggregate. Expected values are worked out by hand or with plain NumPy, never with the module under
test."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tgsim.codecs.base import CodecProperties
from tgsim.codecs.qsgd import QSGD, unpack_fixed
from tgsim.errors import PayloadError

from fakes import numba_philox_calls


@pytest.mark.mutation
def test_qsgd_elias_bits_per_element_is_the_documented_bound():
    """bits_per_element, coding "elias", worked out from its docstring: overhead bytes = frame header
    21 (<4sBIIQ) + parameters 10 (<IIBB) + 4 per bucket norm + 8 (the u64 bit length); "up_max" = every
    element at the longest code 2 floor(log2(s+1)) + 2 = 8 bits (s = 7); "up" = (8 overhead + 7 +
    Σ_buckets [B + min(B, L) + 2 B log2(1 + L/B)]) / n with L = s sqrt(B) ("l2") or s B ("max"), capped
    at up_max. n = 100: one bucket (bucket 0), or buckets of 30, 30, 30, 10 (bucket 30)."""
    from tgsim.codecs.qsgd import QSGD

    def want(n, sizes, mean_l):
        over = 21 + 10 + 4 * len(sizes) + 8
        up_max = 8 * (over + -(-n * 8 // 8)) / n
        e = sum(B + min(B, mean_l(B)) + 2 * B * np.log2(1 + mean_l(B) / B) for B in sizes)
        return min((8 * over + 7 + e) / n, up_max), up_max

    for bucket, sizes in ((0, [100]), (30, [30, 30, 30, 10])):
        for norm, mean_l in (("l2", lambda B: 7 * np.sqrt(B)), ("max", lambda B: 7 * B)):
            got = QSGD(levels=7, bucket=bucket, norm=norm, coding="elias").link_bits(100, 4)
            up, up_max = want(100, sizes, mean_l)
            assert got["up"] == pytest.approx(up, rel=1e-12), (bucket, norm)
            assert got["up_max"] == pytest.approx(up_max, rel=1e-12) and got["down"] == 32
    # l2, one bucket: 170 + 200 log2(1.7) = 323.1 expected bits -> 6.741 < up_max 11.44
    assert QSGD(levels=7, bucket=0, coding="elias").link_bits(100, 4)["up"] == pytest.approx(6.741, abs=1e-3)
    assert QSGD(coding="elias").link_bits(0, 4) == {"up": 0.0, "up_max": 0.0, "down": 32}
    # s = 1: longest code 2 floor(log2 2) + 2 = 4 bits; 3 elements need 12 bits -> 2 whole bytes
    assert QSGD(levels=1, bucket=0, coding="elias").link_bits(3, 4)["up_max"] == 8 * (21 + 10 + 4 + 8 + 2) / 3


def _qsgd_msg(codec, layers):
    return codec.encode_many({k: np.asarray(v, np.float32)[None] for k, v in layers.items()}, 3, 1, [0])[0]


@pytest.mark.mutation
@pytest.mark.parametrize("coding", ["fixed", "elias"])
def test_qsgd_from_bytes_accepts_messages_that_end_exactly(coding):
    """from_bytes reads a message whose body ends exactly where its last part ends: no layers at all
    (the body is the 10 parameter bytes), an empty last layer (elias: its 8-byte bit length is the last
    thing in the body; no norms, no payload), and an elias layer of max-norm buckets of equal |v_i|,
    every level s and so every code at its longest, 2 floor(log2(8)) + 2 = 8 bits for s = 7: nbits =
    8 n exactly, the most a layer of n elements may declare. Each decodes to the sender's values."""
    from tgsim.codecs.qsgd import QSGD

    codec = QSGD(levels=7, bucket=4, norm="max", coding=coding)
    empty = _qsgd_msg(codec, {})
    assert codec.from_bytes(empty.to_bytes(), empty).shapes == {}
    v = np.where(np.arange(10) % 2, 1.5, -1.5)
    m = _qsgd_msg(codec, {"a": v, "z": np.zeros(0)})
    if coding == "elias":
        assert m.nbits["a"] == 8 * 10
    got = codec.from_bytes(m.to_bytes(), m)
    assert codec.decode(got)["a"].tolist() == codec.decode(m)["a"].tolist() == v.astype(np.float32).tolist()
    assert got.norms["z"].size == 0 and codec.decode(got)["z"].size == 0


@pytest.mark.mutation
def test_qsgd_from_bytes_refuses_a_level_in_any_zero_bucket():
    """Buckets of 8 in a layer of 20: elements 8..15 are zero, so bucket 1's norm is 0. A level 1 put on
    element 9 (fixed coding, s = 5: 4-bit words, most significant first, so element 9 is the low nibble
    of byte 4) is a PayloadError naming element 9, like one in bucket 0 would be."""
    import dataclasses

    from tgsim.codecs.qsgd import QSGD
    from tgsim.errors import PayloadError

    codec = QSGD(levels=5, bucket=8, coding="fixed")
    v = np.linspace(1.0, 2.0, 20)
    v[8:16] = 0.0
    m = _qsgd_msg(codec, {"g": v})
    assert m.norms["g"][1] == 0 and m.norms["g"][0] > 0 and m.norms["g"][2] > 0
    pay = m.payload["g"].copy()
    assert pay[4] & 0x0F == 0
    pay[4] |= 0x01
    bad = dataclasses.replace(m, payload={"g": pay})
    with pytest.raises(PayloadError, match="element 9 has level 1 in a bucket of norm 0"):
        codec.from_bytes(bad.to_bytes(), m)


@pytest.mark.mutation
def test_qsgd_unknown_norm_or_coding_ids_are_payload_errors():
    """A message whose parameter bytes carry a norm or coding id this codec does not know (2, 3) is a
    PayloadError that shows the raw id, not an IndexError from looking the id up."""
    import dataclasses

    from tgsim.codecs.qsgd import QSGD
    from tgsim.errors import PayloadError

    codec = QSGD(levels=5, bucket=8, coding="fixed")
    m = _qsgd_msg(codec, {"g": np.ones(4)})
    with pytest.raises(PayloadError, match="norm=2"):
        codec.from_bytes(dataclasses.replace(m, params=(5, 8, 2, 0)).to_bytes(), m)
    with pytest.raises(PayloadError, match="coding=3"):
        codec.from_bytes(dataclasses.replace(m, params=(5, 8, 0, 3)).to_bytes(), m)


@pytest.mark.mutation
def test_qsgd_elias_body_cut_before_a_bit_length_is_a_payload_error():
    """coding "elias": a body that ends inside the parameters' following 8-byte bit length (here 3
    bytes of it) is a PayloadError saying so, not a struct.error from reading past the end."""
    from tgsim.codecs.framing import HEADER, frame
    from tgsim.codecs.qsgd import PARAMS, QSGD
    from tgsim.errors import PayloadError

    codec = QSGD(levels=7, bucket=4, coding="elias")
    m = _qsgd_msg(codec, {"g": np.ones(5)})
    body = m.to_bytes()[HEADER.size:]
    with pytest.raises(PayloadError, match="truncated before its bit length"):
        codec.from_bytes(frame(b"TGQ1", 1, m.shapes, body[:PARAMS.size + 3]), m)


@pytest.mark.mutation
@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_qsgd_aggregate_default_divides_by_the_message_count(kernels):
    """aggregate(messages) = f32(Σ_w f64(decode_w) · (1/N)), N = the number of messages by default
    (documented mean), workers in order; divide_by replaces N; one message is its own decode."""
    from tgsim.codecs.qsgd import QSGD

    codec = QSGD(levels=3, bucket=4, kernels=kernels)
    g = np.random.default_rng(5).standard_normal((3, 2, 5)).astype(np.float32)
    msgs = codec.encode_many({"w": g}, 9, 2, [0, 1, 2])
    dec = [np.asarray(codec.decode(m)["w"], np.float64) for m in msgs]
    acc = dec[0] + dec[1] + dec[2]
    assert codec.aggregate(msgs)["w"].tolist() == (acc * (1.0 / 3)).astype(np.float32).tolist()
    assert codec.aggregate(msgs, divide_by=4)["w"].tolist() == (acc * (1.0 / 4)).astype(np.float32).tolist()
    one = codec.aggregate(msgs[:1])["w"]
    assert one.shape == (2, 5) and one.tolist() == dec[0].astype(np.float32).tolist()


@pytest.mark.mutation
def test_qsgd_fixed_bits_per_element_dict():
    """coding "fixed": "up" = "up_max" = 8 (21 + 10 + 4 ceil(n/B) + ceil(n (b+1)/8)) / n, b = 3 for s = 7:
    n = 100, B = 30: 8 (31 + 16 + 50) / 100 = 7.76; "down" is the server's float32 mean, 32 bits; an
    empty layer costs 0."""
    from tgsim.codecs.qsgd import QSGD

    assert QSGD(levels=7, bucket=30, coding="fixed").link_bits(100, 4) == {"up": 7.76, "up_max": 7.76,
                                                                                 "down": 32}
    assert QSGD(coding="fixed").link_bits(0, 4) == {"up": 0.0, "up_max": 0.0, "down": 32}


@pytest.mark.mutation
def test_qsgd_option_ranges_and_level_dtype():
    """levels in [1, 2^16 - 1] (65535 is accepted, 65536 and 0 are ValueErrors); every documented
    kernels option and both norms construct; level_dtype is the smallest signed integer type holding
    ±s: int8 up to 127, int16 up to 32767, int32 beyond."""
    from tgsim.codecs import qsgd

    assert qsgd.QSGD(levels=65535).levels == 65535
    for bad in (0, 65536):
        with pytest.raises(ValueError, match="levels"):
            qsgd.QSGD(levels=bad)
    for k in ("auto", "reference", "numba", "cuda"):
        assert qsgd.QSGD(kernels=k).kernels == k
    assert qsgd.QSGD(norm="max").norm == "max" and qsgd.QSGD(norm="l2").norm == "l2"
    for s, dt in ((1, np.int8), (127, np.int8), (128, np.int16), (32767, np.int16), (32768, np.int32),
                  (65535, np.int32)):
        assert qsgd.level_dtype(s) is dt, s
        assert np.iinfo(dt).max >= s and -np.iinfo(dt).max - 1 <= -s


@pytest.mark.mutation
def test_qsgd_uniforms_from_2_15_elements_come_from_the_numba_philox(monkeypatch):
    """_uniform: the same 24-bit uniforms as tgsim.rng.uniform at any length, drawn by the Numba Philox
    on the host from 2^15 = 32768 elements on (documented), by the reference below that."""
    from tgsim.codecs import qsgd
    from tgsim.rng import StreamKey, uniform

    calls = numba_philox_calls(monkeypatch)
    key = StreamKey(4, 1, 2, 3)
    for n, numba in ((32767, False), (32768, True)):
        calls.clear()
        got = qsgd._uniform(n, key, np)
        assert got.tolist() == uniform(n, key).tolist()
        assert calls == ([n] if numba else []), n


@pytest.mark.mutation
def test_qsgd_zero_bucket_quantizes_to_zero_without_nan():
    """x_i = 0 where norm_b = 0 (documented): the array quantizer on a layer whose middle bucket is all
    zeros gives levels 0 there with no 0/0 (run under errstate raise) and decodes to exact zeros; the
    other buckets keep their signs."""
    from tgsim.codecs import qsgd
    from tgsim.rng import StreamKey

    v = np.array([1.0, -2.0, 0.0, 0.0, 0.0, 0.0, 3.0, -0.5], np.float32)
    with np.errstate(all="raise"):
        norms, q = qsgd.quantize(v, StreamKey(1, 2, 3, 0), 4, 2, "l2")
        out = qsgd.dequantize(norms, q, 4, 2)
    assert norms.tolist()[1:3] == [0.0, 0.0] and q[2:6].tolist() == [0, 0, 0, 0] and out[2:6].tolist() == [0.0] * 4
    assert np.all(np.sign(q[[0, 1, 6, 7]]) * np.sign(v[[0, 1, 6, 7]]) >= 0)


@pytest.mark.mutation
def test_qsgd_identity_defaults_and_integer_options():
    """QSGD is registered as "qsgd", declares itself unbiased with its own wire format and a mean
    combine; defaults s = 7 levels, buckets of 512, l2 norms, paper coding, kernels "auto"; levels and
    bucket must be integers (NumPy integers too), not bools or floats, levels >= 1 (1 itself is fine);
    its messages are frozen."""
    import dataclasses

    from tgsim.codecs.qsgd import QSGD

    assert QSGD.name == "qsgd" and QSGD().name == "qsgd"
    assert QSGD.properties == CodecProperties(unbiased=True, wire="own", combine="mean")
    c = QSGD()
    assert (c.levels, c.bucket, c.norm, c.coding, c.kernels) == (7, 512, "l2", "paper", "auto")
    assert QSGD(levels=1).levels == 1 and QSGD(levels=np.int64(3), bucket=np.int32(0)).bucket == 0
    for bad in (True, 7.0, 2.5):
        with pytest.raises(ValueError, match="levels"):
            QSGD(levels=bad)
    for bad in (False, 8.0):
        with pytest.raises(ValueError, match="bucket"):
            QSGD(bucket=bad)
    m = _qsgd_msg(c, {"g": np.ones(3)})
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.params = (1, 1, 0, 0)


@pytest.mark.mutation
def test_qsgd_bucket_range_from_config_and_kernel_choice():
    """bucket in [0, 2^32) (a u32 on the wire): 2^32 - 1 is accepted, 2^32 and -1 are ValueErrors.
    from_config takes kernels from the config when it has the field, else "auto". _numba (which
    kernels run): "auto" and "numba" on NumPy arrays; "reference" and "cuda" never; "numba" on a
    non-NumPy (CuPy) array is a ValueError, "auto" there quietly takes the array code."""
    import types

    from tgsim.codecs.qsgd import QSGD

    assert QSGD(bucket=2**32 - 1).bucket == 2**32 - 1
    for bad in (2**32, -1):
        with pytest.raises(ValueError, match="bucket"):
            QSGD(bucket=bad)
    cfg = types.SimpleNamespace(options=dict(levels=3, bucket=16, norm="max", coding="elias"))
    c = QSGD.from_config(cfg)
    assert (c.levels, c.bucket, c.norm, c.coding, c.kernels) == (3, 16, "max", "elias", "auto")
    assert QSGD.from_config(types.SimpleNamespace(**vars(cfg), kernels="reference")).kernels == "reference"
    assert [QSGD(kernels=k)._numba(True) for k in ("auto", "numba", "reference", "cuda")] == [True, True, False, False]
    assert [QSGD(kernels=k)._numba(False) for k in ("auto", "reference", "cuda")] == [False, False, False]
    with pytest.raises(ValueError, match="NumPy arrays"):
        QSGD(kernels="numba")._numba(False)


@pytest.mark.mutation
def test_qsgd_repr_shows_kernels_only_when_not_auto():
    """repr(QSGD(...)) is the constructor call: kernels appears only when it is not the default "auto"."""
    assert repr(QSGD(levels=3, bucket=16, norm="max", coding="elias")) == \
        "QSGD(levels=3, bucket=16, norm='max', coding='elias')"
    assert repr(QSGD(levels=3, bucket=16, kernels="reference")) == \
        "QSGD(levels=3, bucket=16, norm='l2', coding='paper', kernels='reference')"


@pytest.mark.mutation
def test_qsgd_prepare_refuses_a_float64_value_beyond_float32_saying_why():
    """A float64 gradient of 1e39 (> float32's max 3.4e38) cannot be sent as float32 norms: ValueError
    naming the layer and worker, ending with the reason "qsgd sends float32 norms"."""
    g = np.zeros((2, 3), np.float64)
    g[1, 2] = 1e39
    with pytest.raises(ValueError, match=r"^layer 'w': .* of worker 1 .*; qsgd sends float32 norms$"):
        QSGD().prepare_many({"w": g})


@pytest.mark.mutation
def test_qsgd_from_bytes_names_the_qsgd_message():
    """3 bytes are shorter than any framed message: the PayloadError starts with "qsgd message"."""
    codec = QSGD()
    like = codec.encode_many({"w": np.ones((1, 4), np.float32)}, 0, 0, [0])[0]
    with pytest.raises(PayloadError, match=r"^qsgd message truncated: 3 bytes"):
        codec.from_bytes(b"abc", like)


@pytest.mark.mutation
def test_unpack_fixed_default_label_is_qsgd_payload():
    """s = 1: levels in [0, 1] take b = 1 bit plus a sign bit, w = 2; 5 elements need ceil(10/8) = 2
    bytes, so 1 byte is a PayloadError labelled "qsgd payload" by default."""
    with pytest.raises(PayloadError, match=r"^qsgd payload: 1 payload bytes, 5 elements of 2 bits need 2$"):
        unpack_fixed(np.zeros(1, np.uint8), 5, 1)
