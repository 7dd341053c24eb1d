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
