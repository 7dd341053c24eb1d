"""tgsim/codecs/message.py: the TGM1 header, Layout and LayerSpec, Message.codes and layer_payloads.
Expected values are worked out by hand or with plain NumPy, never with the module under test."""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest

from tgsim.codecs.message import (KIND_FLOAT, KIND_TERNARY, LayerSpec, Layout, Message, PayloadBatch,
                                  layer_payloads)
from tgsim.errors import PayloadError


def _tgm1_header():
    """A TernGrad message's bytes (a 2-D and a 1-D ternary layer, one float layer) and its header length."""
    from tgsim.codecs import TernGrad
    from tgsim.codecs.message import parse_header
    from tgsim.rng import StreamKey

    rng = np.random.default_rng(5)
    layers = {"w": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32),
              "f": rng.standard_normal(2).astype(np.float32)}
    buf = TernGrad(float_layers=("f",)).encode(layers, StreamKey(1, 2, 3)).to_bytes()
    return bytes(buf), parse_header(buf)[2]


def _with_crc(head: bytes) -> bytes:
    return head + zlib.crc32(head).to_bytes(4, "little")


@pytest.mark.mutation
def test_tgm1_header_pins_its_ids():
    """message: the wire ids are part of the format (another tgsim reads them): codec terngrad = 1,
    kind 0 = ternary and 1 = float32, packing "2bit" = 0, scaler dtype 1 (float32), version 1."""
    from tgsim.codecs.message import _FIXED, CODEC_IDS, KIND_FLOAT, KIND_TERNARY, VERSION

    buf, _ = _tgm1_header()
    magic, version, codec, packing, sdtype, _, n_layers, _ = _FIXED.unpack_from(buf, 0)
    assert (magic, version, codec, packing, sdtype, n_layers) == (b"TGM1", 1, 1, 0, 1, 3)
    assert (CODEC_IDS, KIND_TERNARY, KIND_FLOAT, VERSION) == ({"terngrad": 1}, 0, 1, 1)
    kinds = [buf[_FIXED.size], buf[_FIXED.size + 2 + 16], buf[_FIXED.size + 2 + 16 + 2 + 8]]
    assert kinds == [0, 0, 1]          # w (3, 5), b (4,), f (2,) as float


@pytest.mark.mutation
def test_tgm1_every_truncated_header_is_a_payload_error_naming_where():
    """message.parse_header: every prefix shorter than the header is a PayloadError (never a
    struct.error), "shorter than the fixed header" below the fixed part + crc, "truncated in the
    header at layer i" after it; the whole header parses."""
    from tgsim.codecs.message import _FIXED, parse_header

    buf, end = _tgm1_header()
    for k in range(end):
        with pytest.raises(PayloadError) as e:
            parse_header(buf[:k])
        if k < _FIXED.size + 4:
            assert "shorter than the fixed header" in str(e.value), k
        else:
            assert "truncated in the header at layer" in str(e.value) or "checksum" in str(e.value), (k, str(e.value))
    assert parse_header(buf[:end])[2] == end


@pytest.mark.mutation
def test_tgm1_header_of_no_layers_is_the_fixed_part_and_crc():
    """message.parse_header: a header of zero layers is exactly the fixed part + crc and parses."""
    from tgsim.codecs.message import _FIXED, parse_header

    buf, _ = _tgm1_header()
    fixed = list(_FIXED.unpack_from(buf, 0))
    fixed[6] = 0
    head = _with_crc(_FIXED.pack(*fixed))
    assert len(head) == _FIXED.size + 4
    assert parse_header(head)[2] == len(head)


@pytest.mark.mutation
@pytest.mark.parametrize("field, value, what", [(2, 99, "codec"), (3, None, "packing"), (4, 2, "scaler dtype")])
def test_tgm1_each_unknown_id_alone_is_refused(field, value, what):
    """message.parse_header: an unknown codec id, packing id (= the number of formats) or scaler
    dtype, each alone in a header with a valid crc, is a PayloadError naming the ids."""
    from tgsim.codecs.message import _FIXED, parse_header
    from tgsim.codecs.packing import FORMATS

    buf, end = _tgm1_header()
    fixed = list(_FIXED.unpack_from(buf, 0))
    fixed[field] = len(FORMATS) if value is None else value
    head = _with_crc(_FIXED.pack(*fixed) + buf[_FIXED.size:end - 4])
    with pytest.raises(PayloadError, match="unknown codec/packing/scaler dtype ids"):
        parse_header(head)


@pytest.mark.mutation
def test_tgm1_codes_of_a_float_layer_is_a_value_error():
    """message.TernaryMessage.codes: a layer that travels as float32 has values, not codes."""
    from tgsim.codecs import TernGrad
    from tgsim.rng import StreamKey

    layers = {"w": np.ones((2, 3), np.float32), "f": np.ones(2, np.float32)}
    msg = TernGrad(float_layers=("f",)).encode(layers, StreamKey(1, 2, 3))
    assert msg.codes("w").dtype == np.int8
    with pytest.raises(ValueError, match="travels as float32"):
        msg.codes("f")


def _codes_2bit(codes):
    """2-bit packing by hand (module docstring): element 4j+m in bits 2m..2m+1, value code + 1,
    pad codes 0 (bits 01)."""
    codes = list(codes) + [0] * (-len(codes) % 4)
    return np.array([sum((codes[4 * j + m] + 1) << (2 * m) for m in range(4))
                     for j in range(len(codes) // 4)], dtype=np.uint8)


@pytest.mark.mutation
def test_layer_specs_and_layouts_are_immutable_and_hashable():
    """A Layout caches its header bytes (built once per model), so it and its LayerSpecs are frozen:
    assigning a field raises FrozenInstanceError, and equal specs hash alike."""
    spec = LayerSpec("w", (2, 3), KIND_TERNARY)
    lay = Layout((spec,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.kind = KIND_FLOAT
    with pytest.raises(dataclasses.FrozenInstanceError):
        lay.packing = "base3"
    assert hash(spec) == hash(LayerSpec("w", (2, 3), KIND_TERNARY))
    assert hash(lay) == hash(Layout((LayerSpec("w", (2, 3), KIND_TERNARY),)))


@pytest.mark.mutation
def test_layout_packs_2bit_by_default_and_says_so_in_its_header():
    """Layout's default packing is "2bit": the header's packing byte (offset 6, after the 4-byte magic,
    the version and the codec id) is 0 = 2bit; a ternary layer of 10 elements takes a scaler and
    ceil(10/4) = 3 bytes of codes."""
    lay = Layout((LayerSpec("w", (10,), KIND_TERNARY),))
    assert lay.packing == "2bit"
    head = lay.header_bytes()
    assert head[:4] == b"TGM1" and head[4] == 1 and head[5] == 1 and head[6] == 0
    assert lay.body_bytes() == 4 + 3


def _message_pair():
    """Two workers' messages of one ternary layer of 6 codes and one float layer of 2 values."""
    lay = Layout((LayerSpec("t", (2, 3), KIND_TERNARY), LayerSpec("f", (2,), KIND_FLOAT)))
    codes = [[1, 0, -1, -1, 0, 1], [0, 0, 1, 1, -1, 0]]
    arr = np.stack([_codes_2bit(c) for c in codes])
    floats = np.array([[0.5, -0.25], [1.5, 2.0]], np.float32)
    rows = [tuple(arr), tuple(floats)]
    batch = PayloadBatch([arr, None], rows)
    msgs = [Message(lay, np.array([2.0, 0.0], np.float32), [rows[0][w], rows[1][w]], batch) for w in range(2)]
    return msgs, codes, arr, floats


@pytest.mark.mutation
def test_message_codes_of_a_ternary_layer_and_refusal_for_a_float_layer():
    """Message.codes gives a ternary layer's codes in {-1, 0, +1}, shaped like the layer, by name or
    index; a float32 layer has values, not codes: ValueError naming it."""
    msgs, codes, _, _ = _message_pair()
    want = np.array(codes[1], dtype=np.int8).reshape(2, 3)
    got = msgs[1].codes("t")
    assert got.dtype == np.int8 and np.array_equal(got, want)
    assert np.array_equal(msgs[1].codes(0), want)
    with pytest.raises(ValueError, match="'f' travels as float32"):
        msgs[1].codes("f")


@pytest.mark.mutation
def test_the_batch_is_no_part_of_a_messages_value():
    """Message.batch is bookkeeping, not on the wire: a message equals the same layout, scalers and
    parts without a batch, and its repr does not print the batch."""
    msgs, _, _, _ = _message_pair()
    m = msgs[0]
    assert m == dataclasses.replace(m, batch=None)
    assert "batch" not in repr(m) and "PayloadBatch" not in repr(m)


@pytest.mark.mutation
def test_layer_payloads_hands_back_the_batch_array_itself():
    """The messages of one encode_many call, in order and unchanged: layer_payloads returns the
    batch's (W, nbytes) array itself, without a copy, also when that array is a view into a wider
    buffer (its rows' .base is then not the array)."""
    wide = np.zeros((3, 5), np.uint8)
    arr = wide[:, :4]                       # (3, 4): 16 codes per worker, 4 bytes each
    for w in range(3):
        arr[w] = _codes_2bit([w - 1] * 16)  # worker 0: all -1, 1: all 0, 2: all +1
    rows = [tuple(arr[w] for w in range(3))]
    lay = Layout((LayerSpec("t", (16,), KIND_TERNARY),))
    msgs = [Message(lay, np.array([1.0], np.float32), [rows[0][w]], PayloadBatch([arr], rows)) for w in range(3)]
    assert layer_payloads(msgs, 0) is arr
    assert arr.tolist() == [[0x00] * 4, [0x55] * 4, [0xAA] * 4]


@pytest.mark.mutation
def test_layer_payloads_reads_replaced_parts_not_the_batch():
    """When every message's part was replaced (new arrays, other codes), the batch is stale:
    layer_payloads returns the stacked new parts."""
    msgs, _, arr, _ = _message_pair()
    new = [_codes_2bit([1] * 6), _codes_2bit([-1] * 6)]
    for m, p in zip(msgs, new):
        m.parts[0] = p
    got = layer_payloads(msgs, 0)
    assert got is not arr and np.array_equal(got, np.stack(new))


@pytest.mark.mutation
def test_layer_payloads_stacks_rows_whose_shape_was_reassigned():
    """A row view's shape can be reassigned in place: then the parts no longer look like the batch's
    rows and layer_payloads stacks them as they are, (W, 1, nbytes) here, not the (W, nbytes) batch."""
    msgs, _, arr, _ = _message_pair()
    for m in msgs:
        m.parts[0].shape = (1, arr.shape[1])
    got = layer_payloads(msgs, 0)
    assert got.shape == (2, 1, arr.shape[1]) and np.array_equal(got[:, 0], arr)


@pytest.mark.mutation
def test_a_header_equal_to_the_layouts_own_skips_the_parse_but_not_the_checks(monkeypatch):
    """message.from_bytes: a message whose header is the receiver layout's own bytes is read without
    parsing the header (parse_header not called), its scalers and parts at the offsets worked out by
    hand; a body one byte short or long, a header differing in one shape byte, or a negative scaler
    in layer b (then also a NaN in w: w is named) are still refused, naming the problem."""
    from tgsim.codecs import TernGrad, message
    from tgsim.rng import StreamKey

    rng = np.random.default_rng(5)
    layers = {"w": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32),
              "f": rng.standard_normal(2).astype(np.float32)}
    msg = TernGrad(float_layers=("f",)).encode(layers, StreamKey(1, 2, 3))
    buf = msg.to_bytes()
    head = len(msg.layout.header_bytes())
    parsed = []
    real = message.parse_header
    monkeypatch.setattr(message, "parse_header", lambda b: (parsed.append(1), real(b))[1])
    got = message.from_bytes(buf, msg.layout)
    assert not parsed
    body = np.frombuffer(buf, np.uint8, offset=head)
    # w: scaler at 0, ceil(15 / 4) = 4 bytes at 4; b: scaler at 8, 1 byte at 12; f: 8 bytes at 13
    assert got.scalers.tobytes() == body[0:4].tobytes() + body[8:12].tobytes() + bytes(4)
    assert [p.tobytes() for p in got.parts] == [body[4:8].tobytes(), body[12:13].tobytes(), body[13:21].tobytes()]
    assert body.size == 21 and got.parts[2].dtype == np.float32 and got.parts[2].shape == (2,)
    for bad in (buf[:-1], buf + b"\0"):
        with pytest.raises(PayloadError, match="message body is"):
            message.from_bytes(bad, msg.layout)
    assert parsed
    other = bytearray(buf)
    other[message._FIXED.size + 2] ^= 1                  # w's first dimension
    with pytest.raises(PayloadError, match="checksum"):
        message.from_bytes(bytes(other), msg.layout)
    neg = bytearray(buf)
    neg[head + 8:head + 12] = np.float32(-1.0).tobytes()
    with pytest.raises(PayloadError, match=r"^layer 'b': invalid scaler -1\.0$"):
        message.from_bytes(bytes(neg), msg.layout)
    neg[head:head + 4] = np.float32("nan").tobytes()   # w's too: the first layer in order is named
    with pytest.raises(PayloadError, match=r"^layer 'w': invalid scaler nan$"):
        message.from_bytes(bytes(neg), msg.layout)


def test_a_header_equal_to_the_layouts_own_but_its_checksum_is_refused():
    """The fast path takes a header only when it is the layout's own bytes, checksum included: the
    receiver layout's own message with any one bit of its header_crc (the header's last 4 bytes)
    flipped, the body untouched, is refused naming the checksum (check_header and from_bytes)."""
    from tgsim.codecs import TernGrad, message
    from tgsim.rng import StreamKey

    rng = np.random.default_rng(6)
    layers = {"w": rng.standard_normal((3, 5)).astype(np.float32), "f": rng.standard_normal(2).astype(np.float32)}
    msg = TernGrad(float_layers=("f",)).encode(layers, StreamKey(1, 2, 3))
    buf = msg.to_bytes()
    head = len(msg.layout.header_bytes())
    # fixed part 4 + 4 x 1 + 4 + 4 + 8 = 24 bytes; w: 2 + 2 x 8, f: 2 + 8; then the u32 crc
    assert head == 24 + 18 + 10 + 4
    assert buf[head - 4:head] == zlib.crc32(buf[:head - 4]).to_bytes(4, "little")
    assert message.check_header(buf, msg.layout) == head
    for byte in range(head - 4, head):
        for bit in (0, 7):
            bad = bytearray(buf)
            bad[byte] ^= 1 << bit
            with pytest.raises(PayloadError, match="header checksum mismatch"):
                message.check_header(bytes(bad), msg.layout)
            with pytest.raises(PayloadError, match="header checksum mismatch"):
                message.from_bytes(bytes(bad), msg.layout)
