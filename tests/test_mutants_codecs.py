"""Tests that kill the mutants `tools/mutation.py` found surviving in tgsim/codecs (one per finding)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from tgsim.codecs.framing import HEADER, frame, layout_crc, unframe
from tgsim.codecs.ordered_mean import ordered_mean_flat
from tgsim.errors import PayloadError


def test_layout_crc_is_the_documented_text():
    """framing: the crc32 is over "name:d0xd1" of every layer joined by ";" (the wire format pins
    it: another separator makes every receiver refuse the sender's messages)."""
    shapes = {"w": (7, 13), "b": (5,), "s": ()}
    assert layout_crc(shapes) == zlib.crc32(b"w:7x13;b:5;s:")


def test_a_frame_of_no_layers_is_exactly_a_header():
    """framing: a message of zero layers is the header alone, and is not refused as truncated."""
    buf = frame(b"TEST", 1, {}, b"")
    assert len(buf) == HEADER.size
    assert bytes(unframe(buf, b"TEST", 1, {}, "test message")) == b""


def test_same_size_other_layout_is_refused_by_its_crc():
    """framing: one layer of 4 named "a" against a receiver's "b" (same count, same body length):
    only the crc differs, and that alone refuses it."""
    buf = frame(b"TEST", 1, {"a": (4,)}, bytes(8))
    with pytest.raises(PayloadError, match="layout"):
        unframe(buf, b"TEST", 1, {"b": (4,)}, "test message")


def test_ordered_mean_of_no_parts_is_empty():
    """ordered_mean: no parts give an empty float32 array (not one element)."""
    out = ordered_mean_flat([], 3)
    assert out.dtype == np.float32 and out.size == 0


@pytest.mark.parametrize("fn", ["sum_codes", "weighted_sum"])
def test_reference_decode_refuses_an_invalid_byte_naming_the_worker(fn):
    """terngrad.reference: the array reference validates every worker's payload before decoding, as
    the Numba kernels do (a 2-bit byte 0xFF holds the invalid code 0b11)."""
    from tgsim.codecs import packing
    from tgsim.codecs.terngrad import numba_kernels, reference

    good = packing.pack(np.array([1, 0, -1, 0, 1, 1, 0, -1], dtype=np.int8), "2bit")
    payloads = np.stack([good, good.copy()])
    payloads[1, 1] = 0xFF
    args = (payloads, 8, "2bit") if fn == "sum_codes" else (payloads, np.ones(2), 8, "2bit", 2)
    for kern in (reference, numba_kernels):
        with pytest.raises(ValueError, match="worker 1"):
            getattr(kern, fn)(*args)


def test_quantizer_constants_are_the_documented_rule():
    """quantizer: the clipping modes and the 24-bit threshold of docs/THEORY.md §1.3 (t = word >> 8,
    kept when t s < x 2^24): a 25-bit rule would still be unbiased but would change every code."""
    from tgsim.codecs.terngrad import quantizer

    assert quantizer.CLIP_MODES == ("none", "explicit", "implicit")
    assert quantizer.THRESHOLD_BITS == 24 and quantizer.TWO24 == 16_777_216.0
    # x = 3 / 2^24 of s = 1: thresholds t = 0, 1, 2 keep it (t s < x 2^24), so P = 3 / 2^24
    t = np.array([0, 1, 2, 3, 2**24 - 1], dtype=np.uint32)
    x = np.full(5, np.float32(3 / 2**24))
    assert quantizer.ternary_rule(t, x, np.float32(1.0)).tolist() == [True, True, True, False, False]
    assert quantizer.exact_nonzero_probability(x[:1], 1.0)[0] == 3 / 2**24


def test_layer_scaling_defaults_and_no_sigma_without_clipping():
    """quantizer.layer_scaling: defaults clip = "none", c = 2.5; without clipping σ is not computed
    (0.0) and the scaler is max|g|; with explicit clipping at 2.5σ the bound is f32(2.5 σ)."""
    from tgsim.codecs.terngrad import quantizer

    g = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    none = quantizer.layer_scaling(g)
    assert none == quantizer.layer_scaling(g, "none", 2.5)
    assert none.sigma == 0.0 and none.scaler == float(np.abs(g).max()) and none.clip_bound == float("inf")
    exp = quantizer.layer_scaling(g, "explicit")
    assert exp.clip_bound == float(np.float32(2.5 * exp.sigma)) and exp.sigma > 0
    assert exp == quantizer.layer_scaling(g, "explicit", 2.5)


def test_lane_count_is_the_cuda_kernels_and_empty_edges():
    """moments: LANES is the CUDA header's TG_LANES (the CPU and GPU sums share the lane order);
    an empty layer's lane sums are (0, 0, 0) and σ of no elements is 0; layer_moments computes σ by
    default."""
    import re
    from pathlib import Path

    from tgsim.codecs.terngrad import moments

    header = (Path(moments.__file__).resolve().parents[2] / "cuda" / "philox.cuh").read_text()
    assert int(re.search(r"#define TG_LANES (\d+)", header).group(1)) == moments.LANES == 65536
    assert moments.lane_sums(np.zeros(0, np.float32)) == (0.0, 0.0, 0.0)
    assert moments.moments_from_sums(0, 0.0, 0.0, 0.0) == 0.0
    g = np.arange(10, dtype=np.float32)
    assert moments.layer_moments(g).sigma == pytest.approx(np.std(np.arange(10.0)), rel=1e-15)


# -- tgsim/codecs/message.py: the TGM1 header (tools/mutation.py: 104 of 126 killed before these) --

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


def test_tgm1_header_of_no_layers_is_the_fixed_part_and_crc():
    """message.parse_header: a header of zero layers is exactly the fixed part + crc and parses."""
    from tgsim.codecs.message import _FIXED, parse_header

    buf, _ = _tgm1_header()
    fixed = list(_FIXED.unpack_from(buf, 0))
    fixed[6] = 0
    head = _with_crc(_FIXED.pack(*fixed))
    assert len(head) == _FIXED.size + 4
    assert parse_header(head)[2] == len(head)


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


def test_tgm1_codes_of_a_float_layer_is_a_value_error():
    """message.TernaryMessage.codes: a layer that travels as float32 has values, not codes."""
    from tgsim.codecs import TernGrad
    from tgsim.rng import StreamKey

    layers = {"w": np.ones((2, 3), np.float32), "f": np.ones(2, np.float32)}
    msg = TernGrad(float_layers=("f",)).encode(layers, StreamKey(1, 2, 3))
    assert msg.codes("w").dtype == np.int8
    with pytest.raises(ValueError, match="travels as float32"):
        msg.codes("f")


# -- tgsim/codecs/packing.py (tools/mutation.py: 113 of 171 killed; import-time lines run only a sample) --

def _codes_of_byte(b: int, fmt: str) -> list[int] | None:
    """The format's rule written out per byte: 2bit, 4 codes of 2 bits, low bits first, code c stored
    as c + 1 (0b11 invalid); base3, 5 base-3 digits, least significant first (bytes > 242 invalid)."""
    if fmt == "2bit":
        d = [(b >> (2 * i)) & 3 for i in range(4)]
        return None if 3 in d else [x - 1 for x in d]
    if b > 242:
        return None
    return [(b // 3 ** i) % 3 - 1 for i in range(5)]


@pytest.mark.parametrize("fmt", ["2bit", "base3"])
def test_packing_tables_and_reference_pack_are_the_format(fmt):
    """packing: the decode table, its validity mask, `pack` (reference, NumPy) and `unpack` of every
    byte equal the format written out per byte; the default format is 2bit."""
    from tgsim.codecs import packing

    codes, valid = packing.LUT[fmt]
    for b in range(256):
        want = _codes_of_byte(b, fmt)
        assert bool(valid[b]) == (want is not None), b
        if want is not None:
            assert codes[b].tolist() == want, b
            got = packing.pack(np.array(want, np.int8), fmt)
            assert got.dtype == np.uint8 and got.tolist() == [b], b
            assert packing.unpack(np.array([b], np.uint8), len(want), fmt).tolist() == want
        else:
            with pytest.raises(PayloadError, match="code 0b11" if fmt == "2bit" else "byte > 242"):
                packing.unpack(np.array([b], np.uint8), packing.CODES_PER_BYTE[fmt], fmt)
    assert packing.pack(np.array([1, -1, 0], np.int8)).tolist() == packing.pack(np.array([1, -1, 0], np.int8),
                                                                                    "2bit").tolist()


def test_packing_payload_must_be_1d_uint8_and_pads_zero():
    """packing.check_payload: a 2-D uint8 payload or a 1-D int8 one is refused, each alone; a pad
    code other than 0 after the last element is refused."""
    from tgsim.codecs import packing

    good = packing.pack(np.array([1, 0, -1, 1, 0], np.int8))            # 2 bytes, 3 pad codes
    for bad in (good.reshape(1, 2), good.astype(np.int8)):
        with pytest.raises(PayloadError, match="expected a 1-D uint8 payload"):
            packing.check_payload(bad, 5, "2bit")
    padded = good.copy()
    padded[-1] = (padded[-1] & ~np.uint8(0b1100)) | np.uint8(0b10 << 2)  # element 5's code: +1
    with pytest.raises(PayloadError, match="non-zero pad codes after element 5"):
        packing.unpack(padded, 5, "2bit")


@pytest.mark.parametrize("workers, dtype", [(127, np.int8), (128, np.int16), (32767, np.int16), (32768, np.int32)])
def test_sum_codes_integer_width_follows_the_workers(workers, dtype):
    """packing.sum_codes: int8 up to 127 workers, int16 up to 32767, int32 beyond, and the sum exact
    (every worker +1: the sum is the worker count)."""
    from tgsim.codecs import packing

    one = packing.pack(np.ones(4, np.int8))
    s = packing.sum_codes(np.repeat(one[None, :], workers, axis=0), 4)
    assert s.dtype == dtype and s.tolist() == [workers] * 4


def test_codec_properties_backends_must_be_a_nonempty_subset():
    """CodecProperties.backends: ("numpy",) by default; each of ("numpy",), ("cupy",) and both is
    accepted; an empty tuple, or a name outside ("numpy", "cupy"), is a ValueError naming the field."""
    from tgsim.codecs.base import CodecProperties

    assert CodecProperties(unbiased=True).backends == ("numpy",)
    for ok in (("numpy",), ("cupy",), ("numpy", "cupy")):
        assert CodecProperties(unbiased=True, backends=ok).backends == ok
    for bad in ((), ("torch",), ("numpy", "jax")):
        with pytest.raises(ValueError, match=r"^backends must be a non-empty subset of \('numpy', 'cupy'\)"):
            CodecProperties(unbiased=True, backends=bad)
