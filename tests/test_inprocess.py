"""tgsim/exchange/inprocess.py: the in-process exchange's byte accounting, code sums and
gather_rows. Expected values are worked out by hand or with plain NumPy, never with the module under
test."""

from __future__ import annotations

import numpy as np
import pytest

import tgsim.exchange.mpi  # noqa: F401  (imported at collection: tools/mutation.py counts module-level
import tgsim.exchange.mpi_env  # noqa: F401  lines as run at import)
from tgsim.exchange.inprocess import InProcessExchange

from fakes import _messages


@pytest.mark.mutation
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


@pytest.mark.mutation
def test_packed_code_bytes_beyond_127_workers():
    """N = 128: the code sums no longer fit int8; the all-reduce carries int16 (2 x 13 bytes + 20
    float bytes: 2 (127/128) 46), and the ps downlink packs Σ codes + N at ceil(log2 257) = 9 bits."""
    codec, ex, msgs = _messages(128)
    scal = 2 * 127 / 128 * 8
    _, b = ex.aggregate(codec, msgs, "allreduce", True)
    assert b.sent == pytest.approx(2 * 127 / 128 * 46 + scal, rel=1e-12)
    _, b = ex.aggregate(codec, msgs, "ps", True)
    assert b.received == pytest.approx(4 + -(-13 * 9 // 8) + 20 + scal, rel=1e-12)


@pytest.mark.mutation
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


@pytest.mark.mutation
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
    rk = registry.make_codec(CodecConfig(name="randomk", options={"density": 0.3}))
    big = {"w": np.random.default_rng(4).standard_normal((4, 400)).astype(np.float32)}
    msgs = rk.encode_many(big, 1, 0, np.arange(4))
    sizes = [m.wire_bytes for m in msgs]
    assert len(set(sizes)) > 1
    _, b = ex4.aggregate(rk, msgs, "allgather", False)
    assert b.sent == pytest.approx(3 * sum(sizes) / 4, rel=1e-12)


@pytest.mark.mutation
def test_in_process_gather_rows_and_one_worker():
    """gather_rows returns the N rows as they are and refuses another count; with one worker the fp32
    mean is the worker's own layers and nothing crosses a wire, and an own-wire codec (fp16) sends
    and receives nothing in the all-gather."""
    from tgsim.codecs.fp16 import Float16

    rows = np.arange(6).reshape(3, 2)
    assert InProcessExchange(3).gather_rows(rows).tolist() == rows.tolist()
    with pytest.raises(ValueError, match="2 rows for 3 workers"):
        InProcessExchange(3).gather_rows(rows[:2])
    one = InProcessExchange(1)
    g = {"w": np.array([1.5, -2.0, 3.25], np.float32)}
    mean, b = one.mean_fp32([g])
    assert mean["w"].tolist() == [1.5, -2.0, 3.25] and (b.sent, b.received) == (0.0, 0.0)
    codec = Float16()
    msgs = codec.encode_many({"w": g["w"][None]}, 1, 0, np.arange(1))
    mean, b = one.aggregate(codec, msgs, "allgather", False)
    assert mean["w"].tolist() == [1.5, -2.0, 3.25] and (b.sent, b.received) == (0, 0)


@pytest.mark.mutation
def test_in_process_code_sums_of_128_workers_need_int16():
    """128 workers whose element 0 is each one's largest (so its code is +1 with probability 1 under
    the shared MAX scaler 1.0): Σ codes = 128, which int8 cannot hold; the mean of element 0 is
    1.0 x 128 / 128 = 1.0 in every mode, with the reference kernels (int sums, then scaled) as with
    the fused Numba ones."""
    from tgsim.codecs import TernGrad
    from tgsim.rng import StreamKey

    n = 128
    g = {"w": np.array([1.0] + [0.0] * 12, np.float32), "b": np.zeros(5, np.float32)}
    for kernels in ("reference", "numba"):
        codec = TernGrad(clip="none", kernels=kernels, min_size=10)
        sc = codec.scaling(g)
        s = InProcessExchange(n).max_scalers(np.stack([codec.local_scalers(sc)] * n))
        msgs = [codec.encode(g, StreamKey(1, 0, w), s, sc) for w in range(n)]
        for mode in ("allreduce", "ps", "allgather", "sharded_ps"):
            mean, _ = InProcessExchange(n).aggregate(codec, msgs, mode, True)
            assert mean["w"].tolist() == [1.0] + [0.0] * 12, (kernels, mode)


@pytest.mark.mutation
def test_in_process_two_variable_size_messages_count_their_mean():
    """Two randomk messages of different sizes a and b: the all-gather counts (a + b) / 2 each way
    per worker (N-1 = 1 message of the mean worker's size), and the ps the same up."""
    from tgsim.codecs import registry
    from tgsim.train.config import CodecConfig

    rk = registry.make_codec(CodecConfig(name="randomk", options={"density": 0.3}))
    for seed in range(20):
        big = {"w": np.random.default_rng(seed).standard_normal((2, 400)).astype(np.float32)}
        msgs = rk.encode_many(big, seed, 0, np.arange(2))
        a, b = (m.wire_bytes for m in msgs)
        if a != b:
            break
    assert a != b
    _, got = InProcessExchange(2).aggregate(rk, msgs, "allgather", False)
    assert (got.sent, got.received) == ((a + b) / 2, (a + b) / 2)
    _, got = InProcessExchange(2).aggregate(rk, msgs, "ps", False)
    assert got.sent == (a + b) / 2 and got.received == 4 * 400


@pytest.mark.mutation
def test_integer_sum_modes_refuse_more_than_32767_workers():
    """allreduce and ps sum the codes as int16 above 127 workers: at N = 32768 a layer of +1 codes
    summed to -32768 and the mean came out -1 (found by the mutation run). They now raise the MPI
    all-reduce's ValueError (its limit too); at N = 32767 the mean is exact, and allgather, which
    sums in float64, still takes 32768."""
    from tgsim.codecs.terngrad.codec import TernGrad
    from tgsim.exchange import InProcessExchange

    codec = TernGrad(clip="none", min_size=1)
    for n in (32767, 32768):
        g = {"w": np.tile(np.array([1.0, 0.0], np.float32), (n, 1))}
        msgs = codec.encode_many(g, 0, 0, np.arange(n), shared_scalers=np.float32([1.0]))
        ex = InProcessExchange(n)
        assert ex.aggregate(codec, msgs, "allgather", True)[0]["w"].tolist() == [1.0, 0.0]
        for mode in ("allreduce", "ps"):
            if n <= 32767:
                assert ex.aggregate(codec, msgs, mode, True)[0]["w"].tolist() == [1.0, 0.0]
            else:
                with pytest.raises(ValueError, match="up to 32767 ranks, got 32768"):
                    ex.aggregate(codec, msgs, mode, True)


@pytest.mark.parametrize("packing", ["2bit", "base3"])
def test_shared_code_sums_in_one_call_equal_the_per_layer_sums(monkeypatch, packing):
    """The shared-scaler mean of packed_code_mean through scaled_code_sum_layers (the Numba kernels'
    one call for every ternary layer) and through scaled_code_sum layer by layer: the same bits, for
    the messages of one encode_many call and for messages without its PayloadBatch."""
    from tgsim.codecs import TernGrad
    from tgsim.codecs.message import Message
    from tgsim.codecs.terngrad import numba_kernels
    from tgsim.exchange.inprocess import packed_code_mean

    rng = np.random.default_rng(4)
    shapes = {"a": (1,), "w": (13, 7), "b": (5,), "c": (4000,)}
    layers = {k: rng.standard_normal((3, *s)).astype(np.float32) for k, s in shapes.items()}
    codec = TernGrad(clip="none", packing=packing, kernels="numba", float_layers=("b",))
    sc = codec.scaling_many(layers)
    shared = np.max(codec.local_scalers_many(sc), axis=0)
    msgs = codec.encode_many(layers, 2, 3, np.arange(3), shared, sc)
    loose = [Message(m.layout, m.scalers, [np.array(p) for p in m.parts]) for m in msgs]

    def means():
        return [{k: v.tobytes() for k, v in packed_code_mean(codec, ms, "ps", True)[0].items()} for ms in (msgs, loose)]

    whole = means()
    monkeypatch.delattr(numba_kernels, "scaled_code_sum_layers")
    assert means() == whole and whole[0] == whole[1]
