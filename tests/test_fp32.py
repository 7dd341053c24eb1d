"""tgsim/codecs/fp32.py: first_nonfinite, first_beyond_float32 and the Float32 message bytes.
Expected values are worked out by hand or with plain NumPy, never with the module under test."""

from __future__ import annotations

import numpy as np
import pytest

from tgsim.codecs.base import CodecProperties
from tgsim.errors import NonFiniteGradientError, PayloadError


F32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.mutation
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


@pytest.mark.mutation
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


@pytest.mark.mutation
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
