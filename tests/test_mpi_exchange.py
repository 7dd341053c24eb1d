"""tgsim/exchange/mpi.py and mpi_pipelined.py: MPIExchange driven in-process by the fake
communicator of tests/fakes.py (one thread per rank): control messages, scalers, the fp32 mean,
packed codes, own-wire codecs, the pipelined parameter server (tests/test_mpi_exchange_errors.py:
malformed payloads and failures). The MPI exchange is held to the in-process exchange's bits, its
documented contract. Expected values are worked out by hand or with plain NumPy, never with the
module under test."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import tgsim.exchange.mpi  # noqa: F401  (imported at collection: tools/mutation.py counts module-level
import tgsim.exchange.mpi_env  # noqa: F401  lines as run at import)
from tgsim.exchange.base import CommBytes
from tgsim.exchange.inprocess import InProcessExchange

from fakes import FAKE_MPI, FakeComm, _aggregate_on_ranks, _World, _terngrad, ok, run_ranks, same_bits


@pytest.mark.mutation
def test_mpi_control_messages(monkeypatch):
    """any_true: True on every rank when one rank's flag is; mean_scalar: (1 + 2 + 6) / 3 = 3 on
    every rank; gather_rows: the (1, M) rows stacked in rank order on the root only, (2, M) refused;
    gather_totals: every rank's (rank, sent, received); barrier meets every rank. The root of
    gather_rows is rank 0 unless told."""
    def fn(ex):
        one = ex.any_true(ex.rank == 1)
        none = ex.any_true(False)
        m = ex.mean_scalar([1.0, 2.0, 6.0][ex.rank])
        rows = ex.gather_rows(np.full((1, 2), ex.rank + 10, np.int64), root=1)
        at0 = ex.gather_rows(np.full((1, 1), ex.rank, np.int64))
        with pytest.raises(ValueError, match="one worker per rank"):
            ex.gather_rows(np.zeros((2, 2)))
        ex.totals = CommBytes(ex.rank, 2 * ex.rank)
        ex.barrier()
        return one, none, m, rows, ex.gather_totals(), (ex.n_workers, ex.local_workers), at0

    world = _World(3)
    res = ok(run_ranks(3, fn, monkeypatch, world=world))
    assert sorted(r for r, m in world.log if m == "Barrier") == [0, 1, 2]
    for r, (one, none, m, rows, totals, who, at0) in enumerate(res):
        assert one is True and none is False and m == 3.0 and who == (3, (r,))
        assert (at0.tolist() == [[0], [1], [2]]) if r == 0 else at0 is None
        assert totals == [{"rank": k, "sent": k, "received": 2 * k} for k in range(3)]
        if r == 1:
            assert rows.tolist() == [[10, 10], [11, 11], [12, 12]]
        else:
            assert rows is None


@pytest.mark.mutation
def test_mpi_constructor_checks_and_defaults(monkeypatch):
    """bucket_bytes below 8 and an unknown ps_transport are refused; the defaults: exact, 64 MiB
    buckets, p2p, chunk 2^18 elements, nothing counted yet; without a GPU the exchange does not
    take MPI as CUDA-aware (whatever the probe would say)."""
    import tgsim.exchange.mpi as mpi_mod

    monkeypatch.setattr(mpi_mod, "mpi_module", lambda: FAKE_MPI)
    comm = FakeComm(_World(1), 0)
    with pytest.raises(ValueError, match="bucket_bytes"):
        mpi_mod.MPIExchange(comm=comm, gpu=False, bucket_bytes=7)
    mpi_mod.MPIExchange(comm=comm, gpu=False, bucket_bytes=8)
    with pytest.raises(ValueError, match="ps_transport"):
        mpi_mod.MPIExchange(comm=comm, gpu=False, ps_transport="tree")
    monkeypatch.setattr(mpi_mod, "gpu_available", lambda: False)
    monkeypatch.setattr(mpi_mod, "cuda_aware", lambda: True)
    ex = mpi_mod.MPIExchange(comm=comm, gpu=False)
    assert ex.cuda_aware is False and ex.staging.cuda_aware is False    # no GPU: no CUDA-aware claim
    assert (ex.exact, ex.bucket_bytes, ex.ps_transport, ex.chunk) == (True, 64 << 20, "p2p", 1 << 18)
    assert (ex.totals.sent, ex.totals.received, ex._pending.sent, ex.device) == (0.0, 0.0, 0.0, None)
    assert mpi_mod.PS_TRANSPORTS == ("p2p", "collective") and mpi_mod.CHUNK == 262144


@pytest.mark.mutation
def test_mpi_scalers_and_their_pending_bytes(monkeypatch):
    """max_scalers: the elementwise MAX over 3 ranks; mean_scalers: (Σ rows) / 3; both count their
    bytes into the next aggregate: the MAX all-reduce of 2 floats as a ring, 2 (2/3) 8 = 32/3, the
    mean's all-gather (N-1) 8 = 16 each way. (2, L) scalers are refused; L = 0 sends nothing."""
    from tgsim.codecs.fp16 import Float16

    rows = np.array([[1.0, 5.0], [4.0, 2.0], [1.0, 2.0]], np.float32)

    def fn(ex):
        mx = ex.max_scalers(rows[ex.rank:ex.rank + 1])
        mean = ex.mean_scalers(rows[ex.rank:ex.rank + 1])
        for bad in (np.zeros((2, 2)), np.zeros(2)):
            with pytest.raises(ValueError, match="one worker per rank"):
                ex.max_scalers(bad)
            with pytest.raises(ValueError, match="one worker per rank"):
                ex.mean_scalers(bad)
        empty = ex.max_scalers(np.zeros((1, 0))), ex.mean_scalers(np.zeros((1, 0)))
        pending = (ex._pending.sent, ex._pending.received)
        codec = Float16()
        msg = codec.encode_many({"w": np.full((1, 3), ex.rank, np.float32)}, 1, 0, np.array([ex.rank]))[0]
        _, b = ex.aggregate(codec, [msg], "allgather", False)
        return mx, mean, empty, pending, (b.sent, b.received), msg.wire_bytes, (ex._pending.sent, ex.totals.sent)

    for mx, mean, empty, pending, b, wire, after in ok(run_ranks(3, fn, monkeypatch)):
        assert mx.tolist() == [4.0, 5.0] and mean.tolist() == [2.0, 3.0] and mean.dtype == np.float32
        assert empty[0].size == 0 and empty[1].size == 0
        assert pending == pytest.approx((32 / 3 + 16, 32 / 3 + 16), rel=1e-12)
        assert b == pytest.approx((2 * wire + 32 / 3 + 16,) * 2, rel=1e-12)
        assert after[0] == 0.0 and after[1] == pytest.approx(b[0], rel=1e-12)


@pytest.mark.mutation
@pytest.mark.parametrize("bucket", [64 << 20, 8])
def test_mpi_exact_fp32_mean_and_its_bytes(monkeypatch, bucket):
    """N = 3, 10 float32 elements (layers of 6 and 4): the mean is the in-process exchange's bits;
    the reduce-scatter cuts 10 into 3 + 3 + 4: rank 0 sends 4 x 7 + 4 x 3 x 2 = 52 bytes and receives
    4 x 3 x 2 + 4 x 7 = 52, rank 2 (4 elements of its own) 4 x 6 + 4 x 4 x 2 = 56 each way. In buckets
    of 8 bytes (max(N, 2) = 3 elements: 3 + 3 + 3 + 1) every element is still summed once. float64
    gradients travel as float64 (8 bytes an element on the reduce-scatter)."""
    rng = np.random.default_rng(5)
    g = [{"a": (rng.standard_normal((2, 3)) * 1e3).astype(np.float32),
          "b": rng.standard_normal(4).astype(np.float32)} for _ in range(3)]
    want, _ = InProcessExchange(3).mean_fp32(g)

    def fn(ex):
        mean, b = ex.mean_fp32([g[ex.rank]])
        with pytest.raises(ValueError, match="one worker per rank"):
            ex.mean_fp32(g[:2])
        empty = ex.mean_fp32([{}])
        wide, wb = ex.mean_fp32([{k: v.astype(np.float64) for k, v in g[ex.rank].items()}])
        return mean, (b.sent, b.received), empty, wide, (wb.sent, wb.received), (ex.totals.sent, ex.totals.received)

    res = ok(run_ranks(3, fn, monkeypatch, bucket_bytes=bucket))
    for r, (mean, b, empty, wide, wb, totals) in enumerate(res):
        assert same_bits(mean, want) and mean["a"].shape == (2, 3)
        assert empty[0] == {} and (empty[1].sent, empty[1].received) == (0.0, 0.0)
        ref64 = {k: (sum(x[k].astype(np.float64) for x in g) * (1.0 / 3)).astype(np.float32) for k in want}
        assert same_bits(wide, ref64)
        if bucket > 100:
            assert b == ((52, 52) if r < 2 else (56, 56))
            # rank 0 of float64: 8 x 7 + 4 x 3 x 2 = 80 sent, 8 x 3 x 2 + 4 x 7 = 76 received
            assert wb == ((80, 76) if r < 2 else (8 * 6 + 4 * 4 * 2, 8 * 4 * 2 + 4 * 6))
        else:     # 3 buckets of 3 (one element each rank) and one of 1 (rank 2's)
            own = [3, 3, 4][r]
            assert b == (4 * (10 - own) + 4 * own * 2, 4 * own * 2 + 4 * (10 - own))
        assert totals == (b[0] + wb[0], b[1] + wb[1])


@pytest.mark.mutation
def test_mpi_native_fp32_mean(monkeypatch):
    """exact=False (benchmark only): MPI's float32 sum (the fake sums in rank order) times f32(1/3),
    in float32; bytes: the ring, 2 (2/3) 4 x 7 = 112/3 each way. mean_fp32_native ignores `exact`."""
    g = [{"a": np.array([1.0, 2.0, 3.0, 1e8], np.float32), "b": np.array([7.0, 1.0, 0.5], np.float32)},
         {"a": np.array([2.0, 2.0, -3.0, 1.0], np.float32), "b": np.array([7.0, 1.0, 0.25], np.float32)},
         {"a": np.array([3.0, 5.0, 0.0, -1e8], np.float32), "b": np.array([7.0, 1.0, 0.25], np.float32)}]
    third = np.float32(1.0 / 3)
    want = {k: ((g[0][k] + g[1][k]) + g[2][k]) * third for k in ("a", "b")}
    assert want["a"][3] == 0.0     # 1e8 + 1 rounds to 1e8 in float32: the order shows

    def fn(ex):
        m1, b = ex.mean_fp32([g[ex.rank]])
        m2, _ = ex.mean_fp32_native([{k: v.astype(np.float64) for k, v in g[ex.rank].items()}])
        return m1, m2, (b.sent, b.received)

    for m1, m2, b in ok(run_ranks(3, fn, monkeypatch, exact=False, bucket_bytes=8)):
        assert same_bits(m1, want) and same_bits(m2, want)
        assert b == pytest.approx((112 / 3, 112 / 3), rel=1e-12)


@pytest.mark.mutation
def test_mpi_allreduce_of_codes_bits_and_bytes(monkeypatch):
    """N = 3, ternary w (13) and float b (5): the in-process bits; this rank's bytes: the int8 code
    sums as a ring, 2 (2/3) 13 = 52/3, plus the float layer's reduce-scatter of 5 = 1 + 2 + 2
    elements: rank 0 4 x 4 + 4 x 1 x 2 = 24, ranks 1, 2 4 x 3 + 4 x 2 x 2 = 28 (each way)."""
    codec, msgs = _terngrad(3)
    want, _ = InProcessExchange(3).aggregate(codec, msgs, "allreduce", True)
    for chunk in (-1, 1 << 18):
        for r, (mean, b) in enumerate(_aggregate_on_ranks(monkeypatch, 3, codec, msgs, "allreduce", True,
                                                          chunk=chunk, bucket_bytes=8)):
            assert same_bits(mean, want)
            assert b == pytest.approx((52 / 3 + (24 if r == 0 else 28),) * 2, rel=1e-12)


@pytest.mark.mutation
def test_mpi_allreduce_of_codes_only_ternary_or_only_float(monkeypatch):
    """A message with no float layer (w only) and one with no ternary layer (b only: min_size above
    its size): both give the in-process bits."""
    from tgsim.codecs import TernGrad
    from tgsim.rng import StreamKey

    rng = np.random.default_rng(1)
    for layers_of in (lambda: {"w": rng.standard_normal(130).astype(np.float32)},
                      lambda: {"b": rng.standard_normal(7).astype(np.float32)}):
        codec = TernGrad(clip="none", min_size=10)
        layers = [layers_of() for _ in range(2)]
        sc = [codec.scaling(g) for g in layers]
        s = InProcessExchange(2).max_scalers(np.stack([codec.local_scalers(x) for x in sc]))
        msgs = [codec.encode(g, StreamKey(1, 0, w), s, sc[w]) for w, g in enumerate(layers)]
        want, _ = InProcessExchange(2).aggregate(codec, msgs, "allreduce", True)
        for mean, _ in _aggregate_on_ranks(monkeypatch, 2, codec, msgs, "allreduce", True):
            assert same_bits(mean, want)


@pytest.mark.mutation
@pytest.mark.parametrize("chunk", [-1, 0, 40, 1 << 18])
@pytest.mark.parametrize("shared", [True, False])
def test_mpi_allgather_bits_and_bytes(monkeypatch, chunk, shared):
    """All-gather (and allreduce without sharing, which is one): the in-process bits; N-1 slots of
    [u64 length | message] each way. Layers w (130, ternary: pieces of 40 cut it) and b (5)."""
    codec, msgs = _terngrad(3, shared=shared, sizes=(130, 5))
    slot = 8 + msgs[0].wire_bytes
    for mode in ("allgather",) if shared else ("allgather", "allreduce"):
        want, _ = InProcessExchange(3).aggregate(codec, msgs, "allgather", shared)
        for mean, b in _aggregate_on_ranks(monkeypatch, 3, codec, msgs, mode, shared, chunk=chunk):
            assert same_bits(mean, want)
            assert b == (2 * slot, 2 * slot)


@pytest.mark.mutation
def test_mpi_allgather_with_deferred_messages(monkeypatch):
    """Deferred messages (encoded piece by piece as they are sent) give the bits of whole ones."""
    from tgsim.codecs import TernGrad

    codec = TernGrad(clip="none", min_size=10)
    rng = np.random.default_rng(3)
    layers = {"w": rng.standard_normal((3, 130)).astype(np.float32), "b": rng.standard_normal((3, 5)).astype(np.float32)}
    whole = codec.encode_many(layers, 1, 0, np.arange(3))
    lazy = codec.encode_many(layers, 1, 0, np.arange(3), deferred=True)
    assert hasattr(lazy[0], "write_range")
    want, _ = InProcessExchange(3).aggregate(codec, whole, "allgather", False)
    for mean, b in _aggregate_on_ranks(monkeypatch, 3, codec, lazy, "allgather", False, chunk=40):
        assert same_bits(mean, want) and b == (2 * (8 + whole[0].wire_bytes),) * 2
    sc = np.max(np.stack([m.scalers for m in whole]), axis=0)
    whole = codec.encode_many(layers, 1, 0, np.arange(3), sc)
    lazy = codec.encode_many(layers, 1, 0, np.arange(3), sc, deferred=True)
    want, _ = InProcessExchange(3).aggregate(codec, whole, "ps", True)
    res = _aggregate_on_ranks(monkeypatch, 3, codec, lazy, "ps", True, chunk=40)
    for mean, _ in res:
        assert same_bits(mean, want)


@pytest.mark.mutation
@pytest.mark.parametrize("chunk", [0, 40, 1 << 18])
def test_mpi_pipelined_ps_bits_and_bytes(monkeypatch, chunk):
    """The pipelined parameter server (p2p, shared scalers): the in-process bits. N = 3: downlink
    w = ceil(log2 7) = 3 bits; layers w (130) and b (5): 4 + ceil(130 x 3 / 8) + 20 = 73 bytes, plus
    a u64 status per piece (1 piece at chunk 0 and 2^18; at chunk 40, w in 40 + 40 + 40 + 10, whose
    piece closes with 30 < 40 elements of room left, then b alone: 5 pieces). The server sends
    N-1 downlinks and receives N-1 slots; a worker sends its slot and receives one downlink."""
    codec, msgs = _terngrad(3, sizes=(130, 5))
    want, _ = InProcessExchange(3).aggregate(codec, msgs, "ps", True)
    slot = 8 + msgs[0].wire_bytes
    down = 73 + 8 * (5 if chunk == 40 else 1)
    for r, (mean, b) in enumerate(_aggregate_on_ranks(monkeypatch, 3, codec, msgs, "ps", True, chunk=chunk)):
        assert same_bits(mean, want)
        assert b == ((2 * down, 2 * slot) if r == 0 else (slot, down))


@pytest.mark.mutation
@pytest.mark.parametrize("transport, chunk, shared, rekey", [
    ("collective", 1 << 18, True, None), ("p2p", -1, True, None), ("p2p", 1 << 18, False, None),
    ("p2p", 1 << 18, True, 9), ("collective", 0, False, 9)])
def test_mpi_whole_message_ps_bits_and_bytes(monkeypatch, transport, chunk, shared, rekey):
    """The parameter server on whole messages (collective transport, chunk < 0, no sharing, or a
    re-ternarized downlink): the in-process bits; the server sends N-1 downlinks of [u64 status |
    ps_downlink_size] and receives N-1 slots. Downlink sizes by hand (N = 3, w 130, b 5): shared
    4 + ceil(390 / 8) + 20 = 73; own scalers the float32 mean 4 x 135 = 540; re-ternarized the
    re-encoded message."""
    from tgsim.rng import StreamKey

    codec, msgs = _terngrad(3, shared=shared, sizes=(130, 5))
    key = None if rekey is None else StreamKey(rekey, 0, 3)
    want, info = InProcessExchange(3).aggregate(codec, msgs, "ps", shared, key)
    slot = 8 + msgs[0].wire_bytes
    if key is None:
        down = 8 + (73 if shared else 540)
    else:
        down = 8 + codec.downlink_codec().encode(want, key).wire_bytes
    res = _aggregate_on_ranks(monkeypatch, 3, codec, msgs, "ps", shared, key, chunk=chunk, ps_transport=transport)
    for r, (mean, b) in enumerate(res):
        assert same_bits(mean, want)
        assert b == ((2 * down, 2 * slot) if r == 0 else (slot, down))


@pytest.mark.mutation
def test_mpi_reternarize_outside_ps_is_applied_on_every_rank(monkeypatch):
    """A re-ternarization key with the all-gather or the all-reduce: every rank re-encodes the same
    mean with the key, as the in-process exchange does."""
    from tgsim.rng import StreamKey

    codec, msgs = _terngrad(2)
    key = StreamKey(4, 0, 2)
    for mode in ("allgather", "allreduce"):
        want, _ = InProcessExchange(2).aggregate(codec, msgs, mode, True, key)
        plain, _ = InProcessExchange(2).aggregate(codec, msgs, mode, True)
        assert not same_bits(want, plain)
        for mean, _ in _aggregate_on_ranks(monkeypatch, 2, codec, msgs, mode, True, key):
            assert same_bits(mean, want)


@pytest.mark.mutation
def test_mpi_aggregate_refuses_bad_calls(monkeypatch):
    """Two local messages, an unknown mode, an own-wire codec in allreduce: ValueError."""
    from tgsim.codecs.fp16 import Float16

    codec, msgs = _terngrad(2)

    def fn(ex):
        errs = []
        for args in (([msgs[0], msgs[1]], "ps"), ([msgs[0]], "ring")):
            with pytest.raises(ValueError) as e:
                ex.aggregate(codec, *args, True)
            errs.append(str(e.value))
        f = Float16()
        m = f.encode_many({"w": np.zeros((1, 3), np.float32)}, 1, 0, np.array([ex.rank]))
        with pytest.raises(ValueError, match="codes sum exactly"):
            ex.aggregate(f, m, "allreduce", False)
        return errs

    for errs in ok(run_ranks(2, fn, monkeypatch)):
        assert "2 local messages" in errs[0] and "unknown exchange mode 'ring'" in errs[1]


@pytest.mark.mutation
def test_mpi_fp32_codec_travels_as_the_exact_mean(monkeypatch):
    """The fp32 codec (wire "float32") through aggregate: the exact mean's bits and bytes."""
    from tgsim.codecs.fp32 import Float32

    fp = Float32()
    layers = {"w": np.random.default_rng(3).standard_normal((3, 10)).astype(np.float32)}
    msgs = fp.encode_many(layers, 1, 0, np.arange(3))
    want, _ = InProcessExchange(3).aggregate(fp, msgs, "allreduce", False)
    for r, (mean, b) in enumerate(_aggregate_on_ranks(monkeypatch, 3, fp, msgs, "allreduce", False)):
        assert same_bits(mean, want) and b == ((52, 52) if r < 2 else (56, 56))


@pytest.mark.mutation
@pytest.mark.parametrize("name", ["fp16", "sign"])
def test_mpi_own_messages_bits_and_bytes(monkeypatch, name):
    """fp16 (mean) and signSGD (majority vote): the in-process bits in allgather and ps. Bytes,
    N = 3, layers of 6 and 3 elements: allgather N-1 messages each way; ps, a worker: its message up,
    the float32 mean down (36 bytes) or the vote at 2 bits (ceil(9 / 4) = 3 bytes); the server N-1
    of those down and N-1 messages in; the server's broadcast buffer is that downlink."""
    from tgsim.codecs import registry
    from tgsim.train.config import CodecConfig

    codec = registry.make_codec(CodecConfig(name=name))
    rng = np.random.default_rng(8)
    layers = {"w": rng.standard_normal((3, 2, 3)).astype(np.float32), "v": rng.standard_normal((3, 3)).astype(np.float32)}
    msgs = codec.encode_many(layers, 1, 0, np.arange(3))
    wire = msgs[0].wire_bytes
    down = 36 if name == "fp16" else 3
    for mode in ("allgather", "ps"):
        want, _ = InProcessExchange(3).aggregate(codec, msgs, mode, False)
        world = _World(3)
        res = _aggregate_on_ranks(monkeypatch, 3, codec, msgs, mode, False, world=world)
        if mode == "ps":    # the broadcast buffer is the counted downlink
            assert sorted(world.bcast_bytes) == [(r, down) for r in range(3)]
        for r, (mean, b) in enumerate(res):
            assert same_bits(mean, want) and mean["w"].shape == (2, 3)
            if mode == "allgather":
                assert b == (2 * wire, 2 * wire)
            else:
                assert b == ((2 * down, 2 * wire) if r == 0 else (wire, down))


@pytest.mark.mutation
def test_mpi_gpu_selection_runs_the_node_split_on_every_rank(monkeypatch):
    """gpu="auto" (the default) or True: select_gpu's node split runs on every rank (it is
    collective), and without a GPU no device is chosen; gpu=False skips it."""
    import tgsim.exchange.mpi_transport as mt

    monkeypatch.setattr(mt, "mpi_module", lambda: FAKE_MPI)
    monkeypatch.setattr(mt, "gpu_available", lambda: False)
    for gpu, splits in (("default", 2), ("auto", 2), (True, 2), (False, 0)):
        world = _World(2)
        res = ok(run_ranks(2, lambda ex: ex.device, monkeypatch, world=world, gpu=gpu))
        assert res == [None, None] and [m for _, m in world.log].count("Split_type") == splits


@pytest.mark.mutation
def test_mpi_single_layer_messages_and_the_ps_transports(monkeypatch):
    """Messages of one ternary layer (no second part to look at) in the whole-message all-gather and
    parameter server: the in-process bits. The transports: "collective" gathers the slots with MPI
    Gather and sends the downlink with Bcast; "p2p" uses Send/Recv between the server and each
    worker (N-1 = 2 each way) and neither collective."""
    from tgsim.codecs import TernGrad
    from tgsim.rng import StreamKey

    codec = TernGrad(clip="none", min_size=10)
    rng = np.random.default_rng(4)
    layers = [{"w": rng.standard_normal(50).astype(np.float32)} for _ in range(3)]
    sc = [codec.scaling(g) for g in layers]
    s = InProcessExchange(3).max_scalers(np.stack([codec.local_scalers(x) for x in sc]))
    msgs = [codec.encode(g, StreamKey(1, 0, w), s, sc[w]) for w, g in enumerate(layers)]
    for mode in ("allgather", "ps"):
        want, _ = InProcessExchange(3).aggregate(codec, msgs, mode, True)
        for transport in ("collective", "p2p"):
            world = _World(3)
            for mean, _ in _aggregate_on_ranks(monkeypatch, 3, codec, msgs, mode, True, chunk=-1,
                                               ps_transport=transport, world=world):
                assert same_bits(mean, want)
            calls = collections.Counter(m for _, m in world.log)
            if mode == "ps" and transport == "collective":
                assert calls["Gather"] == 3 and calls["Bcast"] == 3 and calls["Send"] == calls["Recv"] == 0
            elif mode == "ps":
                assert calls["Gather"] == calls["Bcast"] == 0 and calls["Send"] == 4 and calls["Recv"] == 4


@pytest.mark.mutation
def test_mpi_allreduce_of_codes_with_several_layers_of_each_kind(monkeypatch):
    """Layers a (ternary 20), b (float 5), c (ternary 30), d (float 3): the code sums of both ternary
    layers share one buffer, the float layers one mean; each lands in its own layer (the in-process
    bits), N = 3."""
    from tgsim.codecs import TernGrad
    from tgsim.rng import StreamKey

    codec = TernGrad(clip="none", min_size=10)
    rng = np.random.default_rng(6)
    sizes = {"a": 20, "b": 5, "c": 30, "d": 3}
    layers = [{k: rng.standard_normal(v).astype(np.float32) for k, v in sizes.items()} for _ in range(3)]
    sc = [codec.scaling(g) for g in layers]
    s = InProcessExchange(3).max_scalers(np.stack([codec.local_scalers(x) for x in sc]))
    msgs = [codec.encode(g, StreamKey(1, 0, w), s, sc[w]) for w, g in enumerate(layers)]
    assert [sp.kind for sp in msgs[0].layout.layers][0] != [sp.kind for sp in msgs[0].layout.layers][1]
    want, _ = InProcessExchange(3).aggregate(codec, msgs, "allreduce", True)
    for mean, _ in _aggregate_on_ranks(monkeypatch, 3, codec, msgs, "allreduce", True):
        assert same_bits(mean, want)


@pytest.mark.mutation
def test_defers_encode_says_where_messages_go_in_pieces(monkeypatch):
    """defers_encode (mpi_pipelined.py): chunk < 0 never; otherwise the all-gather, the all-reduce
    without sharing (an all-gather), and the p2p parameter server with shared scalers and no
    re-ternarization; not the all-reduce of shared codes, the collective server, an unshared or a
    re-ternarizing server. chunk 0 (one piece) is still pipelined."""
    def table(ex):
        return {(m, s, r): ex.defers_encode(m, s, r) for m in ("allgather", "allreduce", "ps")
                for s in (True, False) for r in (True, False)}

    for chunk in (0, 40):
        got = ok(run_ranks(1, table, monkeypatch, chunk=chunk))[0]
        assert {k for k, v in got.items() if v} == {("allgather", True, True), ("allgather", True, False),
                                                    ("allgather", False, True), ("allgather", False, False),
                                                    ("allreduce", False, True), ("allreduce", False, False),
                                                    ("ps", True, False)}
    assert not any(ok(run_ranks(1, table, monkeypatch, chunk=-1))[0].values())
    assert not any(ok(run_ranks(1, table, monkeypatch, chunk=0, ps_transport="collective"))[0][("ps", s, r)]
                   for s in (True, False) for r in (True, False))


def test_mpi_code_sums_in_one_call_equal_the_per_layer_calls(monkeypatch):
    """The Numba kernels' whole-step code sums and decode (sum_codes_layers, decode_code_sums_layers)
    and the per-layer sum_codes / decode_code_sums give the same bits in the all-reduce and in the
    whole-message parameter server's downlink, N = 3, ternary layers of 1, 40 and 3001 elements
    around a float layer, both packings."""
    from tgsim.codecs import TernGrad
    from tgsim.codecs.terngrad import numba_kernels
    from tgsim.rng import StreamKey

    rng = np.random.default_rng(8)
    sizes = {"a": 1, "w": 40, "b": 5, "c": 3001}
    for packing in ("2bit", "base3"):
        codec = TernGrad(clip="none", kernels="numba", packing=packing, float_layers=("b",))
        layers = [{k: rng.standard_normal(v).astype(np.float32) for k, v in sizes.items()} for _ in range(3)]
        sc = [codec.scaling(g) for g in layers]
        s = InProcessExchange(3).max_scalers(np.stack([codec.local_scalers(x) for x in sc]))
        msgs = [codec.encode(g, StreamKey(1, 0, w), s, sc[w]) for w, g in enumerate(layers)]
        def means():
            return [m for mode, kw in (("allreduce", {}), ("ps", {"ps_transport": "collective"}))
                    for m, _ in _aggregate_on_ranks(monkeypatch, 3, codec, msgs, mode, True, **kw)]

        whole = means()
        with monkeypatch.context() as m:
            m.delattr(numba_kernels, "sum_codes_layers")
            m.delattr(numba_kernels, "decode_code_sums_layers")
            layer = means()
        assert len(whole) == 6 and all(same_bits(a, b) for a, b in zip(whole, layer))
