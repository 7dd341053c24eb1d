"""Tests that kill the mutants `tools/mutation.py` found surviving in tgsim/exchange: the byte
accounting and the scaler mean of tgsim/exchange/base.py, against numbers worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from tgsim.exchange.base import CommBytes, mean_of_scalers, own_wire_bytes, ring_allreduce_bytes
from tgsim.exchange.inprocess import InProcessExchange


def test_comm_bytes_start_at_zero_and_add():
    """CommBytes() is (0, 0); += adds sent to sent and received to received."""
    b = CommBytes()
    assert (b.sent, b.received) == (0.0, 0.0)
    b += CommBytes(3, 5)
    b += CommBytes(10, 20)
    assert (b.sent, b.received) == (13, 25)


@pytest.mark.parametrize("workers, want", [(1, 0.0), (2, 100.0), (4, 150.0), (8, 175.0)])
def test_ring_allreduce_bytes_by_hand(workers, want):
    """2 (N-1)/N x 100 bytes: N = 2 -> 100, 4 -> 150, 8 -> 175; one worker sends nothing."""
    assert ring_allreduce_bytes(100, workers) == want


def test_own_wire_bytes_by_hand():
    """allgather: N-1 messages out and in (4 workers, 30-byte messages: 90, 90); ps: one message up,
    the float32 mean down (layers of 6 and 2 elements: 32 bytes); allreduce: refused."""
    mean = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(2, np.float32)}
    ag = own_wire_bytes(30, mean, "allgather", 4)
    assert (ag.sent, ag.received) == (90, 90)
    ps = own_wire_bytes(30, mean, "ps", 4)
    assert (ps.sent, ps.received) == (30, 32)
    with pytest.raises(ValueError, match="allreduce"):
        own_wire_bytes(30, mean, "allreduce", 4)
    vote = own_wire_bytes(30, mean, "ps", 4, "majority")      # signSGD's vote: 8 elements in 2 bytes
    assert (vote.sent, vote.received) == (30, 2)


def test_mean_of_scalers_by_hand():
    """(1 + 2 + 6) / 3 = 3 and (0.5 + 0.5 + 2) / 3 = 1, in float32; one row divided by 2 is halved."""
    rows = np.array([[1, 0.5], [2, 0.5], [6, 2]], dtype=np.float32)
    out = mean_of_scalers(rows, 3)
    assert out.dtype == np.float32 and out.tolist() == [3.0, 1.0]
    assert mean_of_scalers(np.array([[4.0]], np.float32), 2).tolist() == [2.0]
    assert InProcessExchange(3).mean_scalers(rows).tolist() == [3.0, 1.0]


# -- the in-process exchange's byte accounting, by hand --------------------------------------------
def _messages(n, shared=True):
    """N workers, one ternary layer of 13 and one float layer of 5 (min_size 10)."""
    from tgsim.codecs import TernGrad
    from tgsim.rng import StreamKey

    codec = TernGrad(clip="none", kernels="reference", min_size=10)
    rng = np.random.default_rng(0)
    layers = [{"w": rng.standard_normal(13).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32)}
              for _ in range(n)]
    ex = InProcessExchange(n)
    sc = [codec.scaling(g) for g in layers]
    shared_s = ex.max_scalers(np.stack([codec.local_scalers(s) for s in sc])) if shared else None
    return codec, ex, [codec.encode(g, StreamKey(1, 0, w), shared_s, sc[w]) for w, g in enumerate(layers)]


def test_packed_code_bytes_by_hand():
    """N = 4, layers w (13, ternary) and b (5, float): the scaler all-reduce is a ring of 2 floats,
    2 (3/4) 8 = 12 bytes each way; allgather: 3 messages each way; allreduce: the ring of the int8
    code sums (13 bytes) and the float layer (20): 2 (3/4) 33 = 49.5; ps: the worker's message up,
    down 4 + ceil(13 x 4 bits / 8) + 20 = 31 bytes (width ceil(log2 9) = 4); unshared ps: the float32
    mean, 72 bytes, and no scaler all-reduce; reternarized: the re-encoded message's bytes."""
    codec, ex, msgs = _messages(4)
    wire = len(msgs[0].to_bytes())
    _, b = ex.aggregate(codec, msgs, "allgather", True)
    assert (b.sent, b.received) == (3 * wire + 12, 3 * wire + 12)
    _, b = ex.aggregate(codec, msgs, "allreduce", True)
    assert (b.sent, b.received) == (49.5 + 12, 49.5 + 12)
    _, b = ex.aggregate(codec, msgs, "ps", True)
    assert (b.sent, b.received) == (wire + 12, 31 + 12)
    from tgsim.rng import StreamKey

    mean, b = ex.aggregate(codec, msgs, "ps", True, StreamKey(1, 0, 4))
    down = codec.downlink_codec().encode(mean, StreamKey(1, 0, 4)).wire_bytes
    assert b.received == down + 12 and down != 31
    codec, ex, msgs = _messages(4, shared=False)
    _, b = ex.aggregate(codec, msgs, "ps", False)
    assert (b.sent, b.received) == (len(msgs[0].to_bytes()), 72)


def test_packed_code_bytes_beyond_127_workers():
    """N = 128: the code sums no longer fit int8; the all-reduce carries int16 (2 x 13 bytes + 20
    float bytes: 2 (127/128) 46), and the ps downlink packs Σ codes + N at ceil(log2 257) = 9 bits."""
    codec, ex, msgs = _messages(128)
    scal = 2 * 127 / 128 * 8
    _, b = ex.aggregate(codec, msgs, "allreduce", True)
    assert b.sent == pytest.approx(2 * 127 / 128 * 46 + scal, rel=1e-12)
    _, b = ex.aggregate(codec, msgs, "ps", True)
    assert b.received == pytest.approx(4 + -(-13 * 9 // 8) + 20 + scal, rel=1e-12)


def test_in_process_scalar_mean_and_own_wire_bytes():
    """mean_scalar: the local sum over N; own-wire codecs (fp16): allgather N-1 messages each way,
    ps the message up and the float32 mean down."""
    from tgsim.codecs.fp16 import Float16

    ex = InProcessExchange(4)
    assert ex.mean_scalar(10.0) == 2.5
    codec = Float16()
    layers = {"w": np.random.default_rng(2).standard_normal((4, 13)).astype(np.float32)}
    msgs = codec.encode_many(layers, 1, 0, np.arange(4))
    wire = msgs[0].wire_bytes
    _, b = ex.aggregate(codec, msgs, "allgather", False)
    assert (b.sent, b.received) == (3 * wire, 3 * wire)
    _, b = ex.aggregate(codec, msgs, "ps", False)
    assert (b.sent, b.received) == (wire, 4 * 13)


def test_bytes_at_127_workers_fp32_and_variable_size_messages():
    """N = 127 is the last int8 all-reduce (1 byte a code sum: 2 (126/127) 33 + the scaler ring);
    fp32 travels as the ring all-reduce of its float32 layers (2 (3/4) 4 x 13 = 78); messages of
    different sizes (randomk) count the mean worker's size."""
    from tgsim.codecs import registry
    from tgsim.codecs.fp32 import Float32
    from tgsim.train.config import CodecConfig

    codec, ex, msgs = _messages(127)
    _, b = ex.aggregate(codec, msgs, "allreduce", True)
    assert b.sent == pytest.approx(2 * 126 / 127 * 33 + 2 * 126 / 127 * 8, rel=1e-12)
    ex4 = InProcessExchange(4)
    layers = {"w": np.random.default_rng(3).standard_normal((4, 13)).astype(np.float32)}
    fp = Float32()
    _, b = ex4.aggregate(fp, fp.encode_many(layers, 1, 0, np.arange(4)), "allreduce", False)
    assert (b.sent, b.received) == (78.0, 78.0)
    rk = registry.make_codec(CodecConfig(name="randomk", density=0.3))
    big = {"w": np.random.default_rng(4).standard_normal((4, 400)).astype(np.float32)}
    msgs = rk.encode_many(big, 1, 0, np.arange(4))
    sizes = [m.wire_bytes for m in msgs]
    assert len(set(sizes)) > 1
    _, b = ex4.aggregate(rk, msgs, "allgather", False)
    assert b.sent == pytest.approx(3 * sum(sizes) / 4, rel=1e-12)


# -- the parameter server's downlink format (tgsim/exchange/ps_downlink.py) -------------------------
def test_code_dtype_boundaries():
    """int8 sums up to 127 ranks, int16 up to 32767, refused beyond."""
    from tgsim.exchange.ps_downlink import code_dtype

    assert code_dtype(127) is np.int8 and code_dtype(128) is np.int16 and code_dtype(32767) is np.int16
    with pytest.raises(ValueError, match="32767"):
        code_dtype(32768)


def test_downlink_decode_refuses_what_is_malformed_and_takes_a_zero_scaler():
    """ps_decode_base on the real downlink of 4 workers: round trip to the in-process ps mean; a
    negative or NaN scaler, a buffer cut inside either layer or extended raise PayloadError (a cut
    float layer raised NumPy's ValueError before); a zero scaler (an all-zero layer) is valid and
    decodes to zeros."""
    from tgsim.errors import PayloadError
    from tgsim.exchange.ps_downlink import ps_decode_base, ps_downlink

    codec, ex, msgs = _messages(4)
    down = ps_downlink(codec, msgs, True)
    layout = msgs[0].layout
    mean = ps_decode_base(layout, down, 4, True)
    want, _ = ex.aggregate(codec, msgs, "ps", True)
    assert all(np.array_equal(mean[k], want[k]) for k in want)
    from tgsim.codecs.message import KIND_TERNARY

    i = [s.kind for s in layout.layers].index(KIND_TERNARY)
    off = sum(4 * s.size for s in layout.layers[:i])          # the float layers before it, if any
    for bad in (-1.0, float("nan")):
        b = down.copy()
        b[off:off + 4] = np.array([bad], np.float32).view(np.uint8)
        with pytest.raises(PayloadError, match="invalid scaler"):
            ps_decode_base(layout, b, 4, True)
    for cut in (1, 21):                       # into the last (float) layer, into the ternary one
        with pytest.raises(PayloadError, match="too short"):
            ps_decode_base(layout, down[:-cut], 4, True)
    with pytest.raises(PayloadError, match="the layout needs"):
        ps_decode_base(layout, np.concatenate([down, np.zeros(1, np.uint8)]), 4, True)
    b = down.copy()
    b[off:off + 4] = np.array([0.0], np.float32).view(np.uint8)
    assert not np.any(ps_decode_base(layout, b, 4, True)[layout.layers[i].name])
