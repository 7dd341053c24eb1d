"""Tests that kill the mutants `tools/mutation.py` found surviving in tgsim/exchange (second round):
the in-process exchange's byte accounting, the parameter server's downlink format, the pieces, the
MPI errors, and the MPI exchange itself (tgsim/exchange/mpi.py, mpi_pipelined.py, mpi_transport.py)
driven in-process by a fake communicator: one thread per rank, collectives that meet at a barrier
and point-to-point messages matched in posting order, as MPI matches them. Expected values are worked
out by hand or with plain NumPy; the MPI exchange is also held to the in-process exchange's bits,
which is its documented contract (tgsim/exchange/mpi.py)."""

from __future__ import annotations

import collections
import copy
import threading
import types

import numpy as np
import pytest

import tgsim.exchange.mpi  # noqa: F401  (imported at collection: tools/mutation.py counts its
import tgsim.exchange.mpi_env  # noqa: F401  module-level lines as run at import, as for the others)
from tgsim.exchange.base import CommBytes
from tgsim.exchange.inprocess import InProcessExchange

TIMEOUT = 20.0      # seconds a fake rank waits for the others before it gives up


# -- a fake MPI: one thread per rank ------------------------------------------------------------------

class _Type:
    """A fake MPI datatype: the NumPy dtype of the elements it describes."""

    def __init__(self, name, dtype):
        self.name, self.dtype = name, np.dtype(dtype)

    def __repr__(self):
        return self.name


class _Request:
    def __init__(self, world, buf=None):
        self.world, self.buf, self.done, self.waited = world, buf, buf is None, False
        world.requests.append(self)

    def fill(self, data):
        flat = _flat(self.buf)
        if data.size > flat.size:
            raise RuntimeError(f"message of {data.size} elements truncated into {flat.size}")
        flat[:data.size] = data
        self.done = True

    def Wait(self):
        self.waited = True
        w = self.world
        with w.cond:
            if not w.cond.wait_for(lambda: self.done or w.broken, TIMEOUT) or not self.done:
                raise TimeoutError("fake MPI: a receive was never matched")


def _waitall(requests):
    for r in requests:
        r.Wait()


FAKE_MPI = types.SimpleNamespace(
    IN_PLACE=object(), BYTE=_Type("BYTE", np.uint8), FLOAT=_Type("FLOAT", np.float32),
    DOUBLE=_Type("DOUBLE", np.float64), INT8_T=_Type("INT8_T", np.int8), INT16_T=_Type("INT16_T", np.int16),
    INT32_T=_Type("INT32_T", np.int32), MAX="MAX", SUM="SUM", COMM_TYPE_SHARED="SHARED",
    Request=types.SimpleNamespace(Waitall=_waitall))


def _flat(buf):
    assert buf.flags.c_contiguous, "fake MPI: buffers must be contiguous"
    return buf.reshape(-1)


def _spec(spec):
    """(array, counts, displs, type) of an mpi4py buffer spec: arr, [arr, T], [arr, sizes],
    [arr, (counts, displs), T]."""
    if spec is None:
        return None, None, None, None
    if isinstance(spec, np.ndarray):
        return spec, None, None, None
    arr, counts, displs, typ = spec[0], None, None, None
    for x in spec[1:]:
        if isinstance(x, _Type):
            typ = x
        elif isinstance(x, tuple) and len(x) == 2 and not isinstance(x[0], int):
            counts, displs = list(x[0]), list(x[1])
        else:
            counts = list(x)
    if typ is not None and arr.dtype != typ.dtype:     # real MPI would read the bytes as another type
        raise TypeError(f"fake MPI: a {arr.dtype} buffer sent as {typ}")
    if counts is not None and displs is None:
        displs = [int(v) for v in np.concatenate([[0], np.cumsum(counts)[:-1]])]
    if counts is not None and len(counts) != len(displs):      # mpi4py: "expecting N items"
        raise ValueError(f"fake MPI: {len(counts)} counts, {len(displs)} displacements")
    return arr, counts, displs, typ


class _World:
    def __init__(self, n, tamper=None):
        self.n, self.tamper = n, tamper      # tamper(key, data) -> data: a fault on the wire
        self.barrier = threading.Barrier(n, timeout=TIMEOUT)
        self.slots = [None] * n
        self.cond = threading.Condition()
        self.mail = collections.defaultdict(collections.deque)
        self.posted = collections.defaultdict(collections.deque)
        self.broken = False
        self.log = []            # (rank, method) of every call, for the tests that count transfers
        self.bcast_bytes = []    # (rank, bytes) of every Bcast buffer
        self.requests = []       # every nonblocking request: MPI wants each one completed (waited)

    def everyone(self, rank, value):
        self.slots[rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out

    def _match(self, key):
        while self.mail[key] and self.posted[key]:
            self.posted[key].popleft().fill(self.mail[key].popleft())
        self.cond.notify_all()

    def deliver(self, key, data):
        if self.tamper is not None:
            data = self.tamper(key, data)
        with self.cond:
            self.mail[key].append(data)
            self._match(key)

    def post(self, key, req):
        with self.cond:
            self.posted[key].append(req)
            self._match(key)

    def abort(self):
        self.broken = True
        self.barrier.abort()
        with self.cond:
            self.cond.notify_all()


class FakeComm:
    """The mpi4py calls MPIExchange makes, between the threads of one `_World`."""

    def __init__(self, world, rank):
        self.w, self.rank = world, rank

    def _log(self, name):
        self.w.log.append((self.rank, name))

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.w.n

    def Barrier(self):
        self._log("Barrier")
        self.w.everyone(self.rank, None)

    def allgather(self, obj):
        self._log("allgather")
        return self.w.everyone(self.rank, copy.deepcopy(obj))

    def gather(self, obj, root=0):
        self._log("gather")
        got = self.w.everyone(self.rank, copy.deepcopy(obj))
        return got if self.rank == root else None

    def bcast(self, obj, root=0):
        self._log("bcast")
        return copy.deepcopy(self.w.everyone(self.rank, obj)[root])

    def Allreduce(self, send, recv, op):
        self._log("Allreduce")
        assert send is FAKE_MPI.IN_PLACE
        arr = _spec(recv)[0]
        rows = self.w.everyone(self.rank, _flat(arr).copy())
        acc = rows[0].copy()
        for r in rows[1:]:                        # rank order, in the buffer's own type
            acc = np.maximum(acc, r) if op == "MAX" else (acc + r).astype(arr.dtype)
        _flat(arr)[:] = acc

    def Allgather(self, send, recv):
        self._log("Allgather")
        s, r = _spec(send)[0], _spec(recv)[0]
        rows = self.w.everyone(self.rank, _flat(s).copy())
        _flat(r)[:] = np.concatenate(rows)

    def Allgatherv(self, send, recv):
        self._log("Allgatherv")
        s = _spec(send)[0]
        r, counts, displs, _ = _spec(recv)
        assert len(counts) == self.w.n
        rows = self.w.everyone(self.rank, _flat(s).copy())
        for k, row in enumerate(rows):
            assert row.size == counts[k]
            _flat(r)[displs[k]:displs[k] + counts[k]] = row

    def Alltoallv(self, send, recv):
        self._log("Alltoallv")
        s, sc, sd, _ = _spec(send)
        r, rc, rd, _ = _spec(recv)
        assert len(sc) == len(rc) == self.w.n
        everyone = self.w.everyone(self.rank, (_flat(s).copy(), sc, sd))
        for src, (buf, c, d) in enumerate(everyone):
            chunk = buf[d[self.rank]:d[self.rank] + c[self.rank]]
            assert chunk.size == rc[src]
            _flat(r)[rd[src]:rd[src] + rc[src]] = chunk

    def Gather(self, send, recv, root=0):
        self._log("Gather")
        s = _spec(send)[0]
        rows = self.w.everyone(self.rank, _flat(s).copy())
        if self.rank == root:
            _flat(_spec(recv)[0])[:] = np.concatenate(rows)

    def Gatherv(self, send, recv, root=0):
        self._log("Gatherv")
        rows = self.w.everyone(self.rank, _flat(_spec(send)[0]).copy())
        if self.rank == root:
            r, counts, displs, _ = _spec(recv)
            for k, row in enumerate(rows):
                assert row.size == counts[k]
                _flat(r)[displs[k]:displs[k] + counts[k]] = row

    def Bcast(self, buf, root=0):
        self._log("Bcast")
        arr = _spec(buf)[0]
        self.w.bcast_bytes.append((self.rank, arr.nbytes))
        rows = self.w.everyone(self.rank, _flat(arr).copy() if self.rank == root else None)
        if self.rank != root:
            _flat(arr)[:] = rows[root]

    def Split_type(self, kind, key):
        self._log("Split_type")
        assert kind == FAKE_MPI.COMM_TYPE_SHARED and key == self.rank
        return types.SimpleNamespace(Get_rank=lambda: self.rank, Get_size=lambda: self.w.n, Free=lambda: None)

    def Isend(self, buf, dest, tag):
        self._log("Isend")
        self.w.deliver((self.rank, dest, tag), _flat(_spec(buf)[0]).copy())
        return _Request(self.w)

    def Send(self, buf, dest, tag):
        self._log("Send")
        self.Isend(buf, dest, tag).Wait()     # blocking: complete on return

    def Irecv(self, buf, source, tag):
        self._log("Irecv")
        req = _Request(self.w, _spec(buf)[0])
        self.w.post((source, self.rank, tag), req)
        return req

    def Recv(self, buf, source, tag):
        self._log("Recv")
        self.Irecv(buf, source, tag).Wait()


def run_ranks(n, fn, monkeypatch, world=None, **kw):
    """fn(exchange) on N threads, each with an MPIExchange(comm=FakeComm(rank), gpu=False, **kw);
    the results in rank order (an exception a rank raised stands in for its result)."""
    import tgsim.exchange.mpi as mpi_mod

    kw.setdefault("gpu", False)
    if kw["gpu"] == "default":      # MPIExchange's own default
        del kw["gpu"]

    monkeypatch.setattr(mpi_mod, "mpi_module", lambda: FAKE_MPI)
    world = world or _World(n)
    out = [None] * n

    def body(rank):
        try:
            ex = mpi_mod.MPIExchange(comm=FakeComm(world, rank), **kw)
            out[rank] = fn(ex)
        except BaseException as e:  # noqa: BLE001
            out[rank] = e
            from tgsim.errors import CollectiveError

            if not isinstance(e, (ValueError, CollectiveError)):   # raised on every rank alike
                world.abort()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * TIMEOUT)
        assert not t.is_alive(), "fake MPI: a rank never returned"
    return out


def ok(results):
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def same_bits(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(np.asarray(a[k]).dtype == np.asarray(b[k]).dtype and np.array_equal(
        np.asarray(a[k]).view(np.uint8), np.asarray(b[k]).view(np.uint8)) for k in a)


# -- the codec inputs -------------------------------------------------------------------------------

def _terngrad(n, shared=True, sizes=(13, 5), seed=0, packing="2bit"):
    """N workers' TernGrad messages: layer w (sizes[0], ternary) and b (sizes[1], float; min_size 10)."""
    from tgsim.codecs import TernGrad
    from tgsim.rng import StreamKey

    codec = TernGrad(clip="none", min_size=10, packing=packing)
    rng = np.random.default_rng(seed)
    layers = [{"w": rng.standard_normal(sizes[0]).astype(np.float32),
               "b": rng.standard_normal(sizes[1]).astype(np.float32)} for _ in range(n)]
    sc = [codec.scaling(g) for g in layers]
    s = InProcessExchange(n).max_scalers(np.stack([codec.local_scalers(x) for x in sc])) if shared else None
    return codec, [codec.encode(g, StreamKey(1, 0, w), s, sc[w]) for w, g in enumerate(layers)]


# -- MPIExchange: control messages, scalers, fp32 (tgsim/exchange/mpi.py) -----------------------------

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


# -- MPIExchange.aggregate: packed codes (mpi.py, mpi_pipelined.py) -------------------------------------

def _aggregate_on_ranks(monkeypatch, n, codec, msgs, mode, shared, key=None, **kw):
    def fn(ex):
        mean, b = ex.aggregate(codec, [msgs[ex.rank]], mode, shared, key)
        return mean, (b.sent, b.received)
    return ok(run_ranks(n, fn, monkeypatch, **kw))


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


def test_mpi_fp32_codec_travels_as_the_exact_mean(monkeypatch):
    """The fp32 codec (wire "float32") through aggregate: the exact mean's bits and bytes."""
    from tgsim.codecs.fp32 import Float32

    fp = Float32()
    layers = {"w": np.random.default_rng(3).standard_normal((3, 10)).astype(np.float32)}
    msgs = fp.encode_many(layers, 1, 0, np.arange(3))
    want, _ = InProcessExchange(3).aggregate(fp, msgs, "allreduce", False)
    for r, (mean, b) in enumerate(_aggregate_on_ranks(monkeypatch, 3, fp, msgs, "allreduce", False)):
        assert same_bits(mean, want) and b == ((52, 52) if r < 2 else (56, 56))


# -- MPIExchange.aggregate: codecs with their own messages ----------------------------------------------

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


# -- MPIExchange: malformed payloads raise the same error on every rank ---------------------------------

def _corrupt_rank(monkeypatch, rank, how):
    """Rank `rank` puts how(bytes) on the wire instead of its message's bytes (the _serialize seam)."""
    from tgsim.exchange.mpi import MPIExchange

    monkeypatch.setattr(MPIExchange, "_serialize",
                        lambda self, msg: how(msg.to_bytes()) if self.rank == rank else msg.to_bytes())


def _bad_code(msg):
    """A function that sets the first code byte of the ternary layer w (after the header and its
    f32 scaler) to 0xff: four 2-bit codes 0b11, which no valid message has."""
    at = len(msg.layout.header_bytes()) + 4

    def how(b):
        b = bytearray(b)
        b[at] = 0xFF
        return bytes(b)
    return how


def _errors(results):
    from tgsim.errors import PeerPayloadError, ServerError

    assert all(isinstance(r, (PeerPayloadError, ServerError)) for r in results), results
    return [(type(r).__name__, str(r)) for r in results]


@pytest.mark.parametrize("chunk", [-1, 0, 40])
def test_mpi_allgather_names_the_sender_of_a_short_slot_on_every_rank(monkeypatch, chunk):
    """Rank 1's slot says it is one byte short: every rank raises PeerPayloadError naming rank 1
    (each names itself as the receiver), in one piece or in several; every nonblocking send and
    receive was completed first (the communicator stays in step)."""
    codec, msgs = _terngrad(3, sizes=(130, 5))
    _corrupt_rank(monkeypatch, 1, lambda b: b[:-1])
    world = _World(3)
    res = _errors(run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "allgather", True),
                            monkeypatch, chunk=chunk, world=world))
    assert all(r.waited for r in world.requests) and len(world.requests) == (0 if chunk < 0 else
                                                                              (2 + 2) * 3 * (1 if chunk == 0 else 5))
    for r, (kind, text) in enumerate(res):
        assert kind == "PeerPayloadError"
        assert text.startswith(f"rank {r} received a malformed payload from rank 1: ")
        assert f"{msgs[0].wire_bytes - 1} bytes" in text


@pytest.mark.parametrize("chunk", [-1, 40])
def test_mpi_allgather_names_the_sender_of_invalid_codes(monkeypatch, chunk):
    """Rank 2's ternary codes contain 0b11: every rank names rank 2 and the layer."""
    codec, msgs = _terngrad(3, sizes=(130, 5))
    _corrupt_rank(monkeypatch, 2, _bad_code(msgs[0]))
    res = _errors(run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "allgather", True),
                            monkeypatch, chunk=chunk))
    for r, (kind, text) in enumerate(res):
        assert kind == "PeerPayloadError" and text.startswith(f"rank {r} received a malformed payload from rank 2")
        assert "layer 'w'" in text and "0b11" in text


@pytest.mark.parametrize("chunk", [-1, 40])
def test_mpi_allgather_names_a_sender_whose_scaler_is_not_the_shared_one(monkeypatch, chunk):
    """With shared scalers, rank 1's message carries another scaler for w: every rank names rank 1
    (each checks the slots against rank 0's, so rank 1 does not name rank 0 from its own point of
    view). The same messages without sharing aggregate (each with its own scaler)."""
    from tgsim.rng import StreamKey

    codec, msgs = _terngrad(3, sizes=(130, 5))
    g = {"w": np.full(130, 0.5, np.float32), "b": np.zeros(5, np.float32)}
    msgs[1] = codec.encode(g, StreamKey(1, 0, 1), msgs[0].scalers * 2, codec.scaling(g))
    res = _errors(run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "allgather", True),
                            monkeypatch, chunk=chunk))
    for r, (kind, text) in enumerate(res):
        assert text.startswith(f"rank {r} received a malformed payload from rank 1") and "layer 'w'" in text
    want, _ = InProcessExchange(3).aggregate(codec, msgs, "allgather", False)
    for mean, _ in _aggregate_on_ranks(monkeypatch, 3, codec, msgs, "allgather", False, chunk=chunk):
        assert same_bits(mean, want)


@pytest.mark.parametrize("transport, chunk", [("p2p", 40), ("p2p", 0), ("p2p", -1), ("collective", 0)])
@pytest.mark.parametrize("fault", ["short", "codes"])
def test_mpi_ps_server_reports_a_malformed_slot_to_every_rank(monkeypatch, transport, chunk, fault):
    """The server finds rank 1's slot short or its codes invalid: the status word tells every rank,
    which all raise the server's PeerPayloadError naming rank 1; every nonblocking transfer was
    completed first."""
    codec, msgs = _terngrad(3, sizes=(130, 5))
    _corrupt_rank(monkeypatch, 1, (lambda b: b[:-1]) if fault == "short" else _bad_code(msgs[0]))
    world = _World(3)
    res = _errors(run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "ps", True), monkeypatch,
                            chunk=chunk, ps_transport=transport, world=world))
    assert all(r.waited for r in world.requests)     # every piece still went both ways
    assert len(set(res)) == 1
    kind, text = res[0]
    assert kind == "PeerPayloadError"
    assert text.startswith("the parameter server (rank 0) received a malformed payload from rank 1")


def test_mpi_ps_server_failure_is_a_server_error_on_every_rank(monkeypatch):
    """Anything else failing at the server (here the downlink builder) is a ServerError with the
    same text on every rank."""
    import tgsim.exchange.mpi as mpi_mod

    codec, msgs = _terngrad(3)

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(mpi_mod, "ps_downlink", boom)
    res = _errors(run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "ps", True), monkeypatch,
                            chunk=-1))
    assert set(res) == {("ServerError", "the parameter server (rank 0) failed: RuntimeError: boom")}


# -- tgsim/exchange/mpi_transport.py: CUDA-aware probe, node-local rank, host staging -------------------

class _Fn:
    """A fake C function of a fake libmpi: records restype/argtypes and its calls."""

    def __init__(self, body):
        self.body, self.calls = body, []

    def __call__(self, *args):
        self.calls.append(args)
        return self.body(*args)


def _fake_ctypes(monkeypatch, symbols=None, fail=False):
    import ctypes

    import tgsim.exchange.mpi_transport as mt

    opened = []

    def cdll(path):
        opened.append(path)
        if fail:
            raise OSError("no such library")
        return types.SimpleNamespace(**(symbols or {}))

    monkeypatch.setattr(mt, "ctypes", types.SimpleNamespace(CDLL=cdll, c_int=ctypes.c_int, POINTER=ctypes.POINTER,
                                                            byref=lambda x: x))
    monkeypatch.setattr(mt, "mpi_module", lambda: types.SimpleNamespace(__file__="/fake/MPI.so"))
    return opened


@pytest.mark.parametrize("value, want", [("1", True), (" True ", True), ("yes", True), ("0", False),
                                         ("FALSE", False), ("no", False)])
def test_cuda_aware_override(monkeypatch, value, want):
    """TGSIM_MPI_CUDA_AWARE=1/true/yes or 0/false/no (any case, spaces around) decides without a probe."""
    import tgsim.exchange.mpi_transport as mt

    opened = _fake_ctypes(monkeypatch, fail=True)
    monkeypatch.setenv("TGSIM_MPI_CUDA_AWARE", value)
    assert mt.cuda_aware() is want and opened == []


def test_cuda_aware_probes(monkeypatch):
    """Without the override: no library -> False; MPIX_Query_cuda_support's answer (0 or 1) when it
    exists; else MPIX_GPU_query_support(0 = CUDA, &flag): True only when it returns 0 (success) and
    sets the flag; neither symbol -> False. The library opened is mpi4py.MPI's file."""
    import tgsim.exchange.mpi_transport as mt

    monkeypatch.delenv("TGSIM_MPI_CUDA_AWARE", raising=False)
    monkeypatch.setenv("TGSIM_MPI_CUDA_AWARE", "maybe")      # neither yes nor no: probe
    _fake_ctypes(monkeypatch, fail=True)
    assert mt.cuda_aware() is False
    for answer in (0, 1):
        q = _Fn(lambda a=answer: a)
        opened = _fake_ctypes(monkeypatch, {"MPIX_Query_cuda_support": q,
                                            "MPIX_GPU_query_support": _Fn(lambda *a: 1 / 0)})
        assert mt.cuda_aware() is bool(answer) and opened == ["/fake/MPI.so"] and q.calls == [()]
        assert q.restype is not None and q.argtypes == []

    def gpu_query(rc, flag_value):
        def body(kind, flag):
            assert kind == 0
            flag.value = flag_value
            return rc
        return _Fn(body)

    for rc, flag, want in ((0, 1, True), (0, 0, False), (1, 1, False)):
        fn = gpu_query(rc, flag)
        _fake_ctypes(monkeypatch, {"MPIX_GPU_query_support": fn})
        assert mt.cuda_aware() is want and len(fn.calls) == 1 and len(fn.argtypes) == 2
    _fake_ctypes(monkeypatch, {})
    assert mt.cuda_aware() is False


def test_node_local_rank_and_select_gpu_without_a_gpu(monkeypatch):
    """node_local_rank splits by shared memory with key = the rank, returns the split's (rank, size)
    and frees it; select_gpu runs the split (it is collective) and gives None without a GPU."""
    import tgsim.exchange.mpi_transport as mt

    calls = []

    class Local:
        def Get_rank(self):
            return 1

        def Get_size(self):
            return 2

        def Free(self):
            calls.append("free")

    class Comm:
        def Get_rank(self):
            return 5

        def Split_type(self, kind, key):
            calls.append((kind, key))
            return Local()

    monkeypatch.setattr(mt, "mpi_module", lambda: FAKE_MPI)
    assert mt.node_local_rank(Comm()) == (1, 2) and calls == [("SHARED", 5), "free"]
    monkeypatch.setattr(mt, "gpu_available", lambda: False)
    assert mt.select_gpu(Comm()) is None and calls[-2:] == [("SHARED", 5), "free"]


def test_staging_of_host_arrays():
    """NumPy buffers pass as they are: wire() a contiguous array with the same values (a copy only
    of a strided view), landing() an empty host array, back() the buffer itself; sync is a no-op."""
    from tgsim.exchange.mpi_transport import _HDR, _TAG_AG, _TAG_PS_DOWN, _TAG_PS_UP, _U64, Staging

    st = Staging(cuda_aware=1)
    assert st.cuda_aware is True and Staging(0).cuda_aware is False
    a = np.arange(10, dtype=np.float32)
    assert st.wire(a, "k") is a
    w = st.wire(a[::2], "k")
    assert w.flags.c_contiguous and w.tolist() == [0, 2, 4, 6, 8]
    land = st.landing(3, np.int16, np, "k")
    assert land.shape == (3,) and land.dtype == np.int16
    assert st.back(a, np) is a
    st.sync(np)
    assert (_HDR, _U64, len({_TAG_PS_UP, _TAG_PS_DOWN, _TAG_AG})) == (8, np.dtype("<u8"), 3)


@pytest.mark.parametrize("chunk", [-1, 40])
def test_mpi_ps_worker_that_cannot_decode_the_downlink(monkeypatch, chunk):
    """The downlink to rank 2 is damaged on the wire (w's f32 scaler, right after the u64 status,
    becomes NaN; in pieces, piece 1 also carries a code sum beyond N) while its status says OK:
    rank 2 raises PeerPayloadError for a malformed downlink from rank 0, the first fault found (it
    decodes no further); ranks 0 and 1 get the in-process bits."""
    from tgsim.exchange.mpi_transport import _TAG_PS_DOWN

    codec, msgs = _terngrad(3, sizes=(130, 5))
    want, _ = InProcessExchange(3).aggregate(codec, msgs, "ps", True)

    seen = []

    def tamper(key, data):
        if key != (0, 2, _TAG_PS_DOWN):
            return data
        seen.append(data.size)
        data = data.copy()
        if len(seen) == 1:      # piece 0 (or the whole downlink): w's scaler
            data[8:12] = np.array([np.nan], np.float32).view(np.uint8)
        elif len(seen) == 2:    # piece 1 (w[40:80] at 3 bits): a packed value 7 > 2N, also malformed
            data[8] = 0xFF
        return data

    res = run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "ps", True), monkeypatch,
                    world=_World(3, tamper), chunk=chunk)
    assert same_bits(res[0][0], want) and same_bits(res[1][0], want)
    kind, text = _errors([res[2]])[0]
    assert kind == "PeerPayloadError" and text.startswith("rank 2 received a malformed downlink from rank 0: ")
    assert "invalid scaler nan" in text
    assert len(seen) == (1 if chunk < 0 else 5)


def test_mpi_pipelined_ps_server_failing_to_encode_its_own_piece(monkeypatch):
    """Deferred messages: the server's own piece 1 fails to encode; it still takes every piece and
    answers every piece with the error status, and every rank raises the same ServerError."""
    from tgsim.codecs import TernGrad
    from tgsim.exchange.pieces import PiecePlan

    codec = TernGrad(clip="none", min_size=10)
    rng = np.random.default_rng(3)
    layers = {"w": rng.standard_normal((3, 130)).astype(np.float32), "b": rng.standard_normal((3, 5)).astype(np.float32)}
    sc = np.max(np.stack([m.scalers for m in codec.encode_many(layers, 1, 0, np.arange(3))]), axis=0)
    lazy = codec.encode_many(layers, 1, 0, np.arange(3), sc, deferred=True)
    fill = PiecePlan.fill_slot

    def failing(self, k, msg, slot):
        if msg is lazy[0] and k == 1:
            raise RuntimeError("encode failed")
        return fill(self, k, msg, slot)

    monkeypatch.setattr(PiecePlan, "fill_slot", failing)
    world = _World(3)
    res = _errors(run_ranks(3, lambda ex: ex.aggregate(codec, [lazy[ex.rank]], "ps", True), monkeypatch,
                            world=world, chunk=40))
    assert set(res) == {("ServerError", "the parameter server (rank 0) failed: RuntimeError: encode failed")}
    # 5 pieces (w: 40 + 40 + 40 + 10, then b): each worker sends 5, the server answers 5 to each
    assert sum(1 for r, m in world.log if r == 0 and m == "Isend") == 2 * 5
    assert sum(1 for r, m in world.log if r == 1 and m == "Isend") == 5


# -- tgsim/exchange/mpi_errors.py ---------------------------------------------------------------------

def test_server_failure_text_is_broadcast_from_rank_0_by_default():
    """raise_server_failure and raise_if_server_failed broadcast the server's text from rank 0 (the
    parameter server) unless told another root."""
    from tgsim.errors import PeerPayloadError, ServerError
    from tgsim.exchange import mpi_errors as me

    class Comm:
        roots = []

        def bcast(self, obj, root):
            self.roots.append(root)
            return "words"

    comm = Comm()
    with pytest.raises(ServerError, match="^words$"):
        me.raise_server_failure(comm, me.STATUS_SERVER, None)
    with pytest.raises(PeerPayloadError, match="^words$"):
        me.raise_if_server_failed(comm, None)
    with pytest.raises(PeerPayloadError):
        me.raise_if_server_failed(comm, None, root=2)
    assert comm.roots == [0, 0, 2]


# -- tgsim/exchange/inprocess.py --------------------------------------------------------------------

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
        for mode in ("allreduce", "ps", "allgather"):
            mean, _ = InProcessExchange(n).aggregate(codec, msgs, mode, True)
            assert mean["w"].tolist() == [1.0] + [0.0] * 12, (kernels, mode)


# -- tgsim/exchange/ps_downlink.py ---------------------------------------------------------------------

def test_message_to_numpy_is_the_message_itself_and_moves_parts_otherwise():
    """message_to(msg, np) is msg (no copy); for another array module every part goes through its
    asarray (here a stand-in module that tags the arrays)."""
    from tgsim.exchange.ps_downlink import message_to

    _, msgs = _terngrad(2)
    assert message_to(msgs[0], np) is msgs[0]
    tagged = []
    xp = types.SimpleNamespace(asarray=lambda p: tagged.append(p) or np.array(p, copy=True))
    moved = message_to(msgs[0], xp)
    assert moved is not msgs[0] and len(tagged) == len(msgs[0].parts) == 2
    assert all(a is b for a, b in zip(tagged, msgs[0].parts))
    assert moved.layout is msgs[0].layout and np.array_equal(moved.scalers, msgs[0].scalers)


def test_downlink_cut_inside_the_ternary_layer_names_that_layer():
    """N = 4 (w = ceil(log2 9) = 4 bits): layer w's downlink is 4 + ceil(13 x 4 / 8) = 11 bytes,
    then b's 20. Cut to 10 bytes, the decoder stops at w ("too short for layer 'w'"), not later;
    cut to 11 + 19 = 30, at b."""
    from tgsim.errors import PayloadError
    from tgsim.exchange.ps_downlink import ps_decode_base, ps_downlink

    codec, msgs = _terngrad(4)
    down = ps_downlink(codec, msgs, True)
    assert down.size == 31
    with pytest.raises(PayloadError, match=r"^downlink is 10 bytes, too short for layer 'w'$"):
        ps_decode_base(msgs[0].layout, down[:10], 4, True)
    with pytest.raises(PayloadError, match=r"^downlink is 30 bytes, too short for layer 'b'$"):
        ps_decode_base(msgs[0].layout, down[:30], 4, True)


def test_downlink_of_one_worker_with_one_layer():
    """N = 1, a single ternary layer: the base downlink is [f32 scaler | (codes + 1) at
    ceil(log2 3) = 2 bits] and decodes to the worker's own decoded message; re-ternarized, it is the
    downlink codec's message of that mean, byte for byte."""
    from tgsim.codecs import TernGrad
    from tgsim.exchange.ps_downlink import ps_base_downlink, ps_decode, ps_downlink
    from tgsim.rng import StreamKey

    codec = TernGrad(clip="none", min_size=10)
    g = {"w": np.random.default_rng(2).standard_normal(13).astype(np.float32)}
    msg = codec.encode(g, StreamKey(1, 0, 0))
    base = ps_base_downlink(codec, [msg], True)
    codes = msg.codes("w").astype(np.int64) + 1          # in {0, 1, 2}: 2 bits each, little end first
    packed = np.zeros(4, np.uint8)
    for e, c in enumerate(codes):
        packed[e * 2 // 8] |= np.uint8(c << (e * 2 % 8))
    assert base.tobytes() == np.float32(msg.scalers[0]).tobytes() + packed.tobytes()
    key = StreamKey(5, 0, 1)
    own = codec.decode(msg)
    want = codec.downlink_codec().encode(own, key)
    down = ps_downlink(codec, [msg], True, key)
    assert down.tobytes() == want.to_bytes()
    assert same_bits(ps_decode(codec, msg.layout, down, 1, True, True), codec.downlink_codec().decode(want))
    unshared = ps_base_downlink(codec, [msg], False)
    assert unshared.tobytes() == own["w"].astype(np.float32).tobytes()


def test_downlink_of_a_model_without_layers_is_empty():
    """A layout with no layers: the downlink (and its size) is 0 bytes, and it decodes to {}."""
    from tgsim.codecs import TernGrad
    from tgsim.codecs.message import Layout, Message
    from tgsim.exchange.ps_downlink import ps_decode_base, ps_downlink, ps_downlink_size

    layout = Layout(())
    msgs = [Message(layout, np.zeros(0, np.float32), []) for _ in range(2)]
    codec = TernGrad()
    for shared in (True, False):
        down = ps_downlink(codec, msgs, shared)
        assert down.dtype == np.uint8 and down.size == 0 == ps_downlink_size(layout, 2, shared, False)
        assert ps_decode_base(layout, down, 2, shared) == {}


# -- tgsim/exchange/pieces.py ------------------------------------------------------------------------

def test_pieces_are_immutable():
    """A plan's pieces are frozen (plans are cached and shared by every exchange call)."""
    import dataclasses

    from tgsim.exchange.pieces import PiecePlan

    _, msgs = _terngrad(2, sizes=(130, 5))
    p = PiecePlan(msgs[0].layout, 2, 40).pieces[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.up = (0, 1)
    assert hash(p) == hash(PiecePlan(msgs[0].layout, 2, 40).pieces[0])


# -- tgsim/exchange/mpi_env.py: load_mpi and mpi_or_exit with a stand-in mpi4py ------------------------

class _FakeMPI:
    THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 10, 11, 12, 13

    def __init__(self, version="MPICH Version:      5.0.2\n", initialized=False, size=4):
        self.version, self.initialized, self.calls = version, initialized, []
        self.COMM_WORLD = types.SimpleNamespace(Get_size=lambda: size)

    def Get_library_version(self):
        return self.version

    def Is_initialized(self):
        return self.initialized

    def Init(self):
        self.calls.append(("Init",))

    def Init_thread(self, level):
        self.calls.append(("Init_thread", level))


def _fake_mpi4py(monkeypatch, mpi, preloaded=False, rc=None, fail=None):
    """sys.modules["mpi4py"] -> a stand-in whose `MPI` is `mpi` (or whose import raises `fail`);
    records rc.initialize at the moment MPI is imported."""
    import sys

    seen = []

    class Pkg(types.ModuleType):
        def __getattr__(self, name):
            if name != "MPI":
                raise AttributeError(name)
            seen.append((self.rc.initialize, getattr(self.rc, "finalize", None)))
            if fail is not None:
                raise fail
            return mpi

    pkg = Pkg("mpi4py")
    pkg.rc = rc or types.SimpleNamespace(initialize=True, thread_level="multiple")
    monkeypatch.setitem(sys.modules, "mpi4py", pkg)
    if preloaded:
        monkeypatch.setitem(sys.modules, "mpi4py.MPI", mpi)
    else:
        monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    return pkg, seen


HYDRA4 = {"HYDI_CONTROL_FD": "7", "PMI_SIZE": "4"}
OMPI4 = {"OMPI_COMM_WORLD_SIZE": "4"}


@pytest.mark.parametrize("level, want", [("multiple", 13), ("Serialized", 12), ("funneled", 11),
                                         ("single", 10), ("odd", 13)])
def test_load_mpi_initializes_after_the_check_at_mpi4pys_level(monkeypatch, level, want):
    """A fresh import: mpi4py is told not to initialize (rc.initialize False while MPI is imported,
    finalize True), rc.initialize is restored to True afterwards, and MPI is initialized with
    Init_thread at rc.thread_level (unknown names: MULTIPLE)."""
    from tgsim.exchange import mpi_env as me

    mpi = _FakeMPI()
    pkg, seen = _fake_mpi4py(monkeypatch, mpi, rc=types.SimpleNamespace(initialize=True, thread_level=level))
    assert me.load_mpi("prog", environ=HYDRA4) is mpi
    assert seen == [(False, True)] and pkg.rc.initialize is True
    assert mpi.calls == [("Init_thread", want)]


@pytest.mark.parametrize("threads", [False, "no"])
def test_load_mpi_plain_init_when_mpi4py_wants_no_threads(monkeypatch, threads):
    """rc.threads False (or "no"): plain MPI_Init."""
    from tgsim.exchange import mpi_env as me

    mpi = _FakeMPI()
    _fake_mpi4py(monkeypatch, mpi, rc=types.SimpleNamespace(initialize=True, threads=threads, thread_level="single"))
    me.load_mpi("prog", environ=HYDRA4)
    assert mpi.calls == [("Init",)]


def test_load_mpi_checks_before_init_and_skips_init_when_initialized(monkeypatch):
    """Open MPI's launcher with MPICH loaded: MPIEnvironmentError before MPI_Init (never called). An
    MPI imported and initialized already (a wrapper did it): rc is left alone, no Init, and only the
    after-init check runs (here: no launcher and one rank, refused)."""
    from tgsim.exchange import mpi_env as me

    mpi = _FakeMPI()
    _fake_mpi4py(monkeypatch, mpi)
    with pytest.raises(me.MPIEnvironmentError, match="mpiexec and mpi4py come from different MPIs"):
        me.load_mpi("prog", environ=OMPI4)
    assert mpi.calls == []
    done = _FakeMPI(initialized=True, size=1)
    pkg, seen = _fake_mpi4py(monkeypatch, done, preloaded=True,
                             rc=types.SimpleNamespace(initialize="untouched", thread_level="single"))
    with pytest.raises(me.MPIEnvironmentError, match="started without mpiexec"):
        me.load_mpi("prog", environ={})
    assert done.calls == [] and pkg.rc.initialize == "untouched" and seen == [("untouched", None)]
    assert me.load_mpi("prog", environ={"TGSIM_MPI_CHECK": "0"}) is done


@pytest.mark.parametrize("err", [ImportError("libmpi.so.12: cannot open"), RuntimeError("x\nlast line"),
                                 OSError("")])
def test_load_mpi_without_a_loadable_library(monkeypatch, err):
    """mpi4py.MPI failing to import: one MPIEnvironmentError quoting the error's last line (or its type
    when it has no text); rc.initialize is restored even then."""
    from tgsim.exchange import mpi_env as me

    pkg, _ = _fake_mpi4py(monkeypatch, None, fail=err)
    with pytest.raises(me.MPIEnvironmentError) as e:
        me.load_mpi("prog", environ=HYDRA4)
    last = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
    assert str(e.value).startswith(f"mpi4py found no MPI library it can load ({last}); pip install")
    assert pkg.rc.initialize is True


def test_mpi_or_exit_writes_one_line_and_exits_2(monkeypatch, capfd):
    """mpi_or_exit: load_mpi's MPI when it works; on MPIEnvironmentError `PROG: message` as one line
    on stderr (ending with the hint that TGSIM_MPI_CHECK=0 skips the check) and exit status 2."""
    from tgsim.exchange import mpi_env as me

    mpi = _FakeMPI()
    _fake_mpi4py(monkeypatch, mpi)
    monkeypatch.setattr(me.os, "environ", dict(HYDRA4))
    assert me.mpi_or_exit("prog") is mpi
    monkeypatch.setattr(me.os, "environ", dict(OMPI4))
    with pytest.raises(SystemExit) as e:
        me.mpi_or_exit("prog")
    assert e.value.code == 2
    err = capfd.readouterr().err
    assert err.startswith("prog: this rank was started by Open MPI's mpiexec") and err.count("\n") == 1
    assert err.endswith(" (TGSIM_MPI_CHECK=0 skips this check)\n")


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


def test_mpi_own_message_malformed_at_the_server(monkeypatch):
    """ps with an own-wire codec (fp16): rank 1's message arrives one byte short; the server's error
    reaches every rank as the same PeerPayloadError naming rank 1."""
    from tgsim.codecs.fp16 import Float16

    codec = Float16()
    msgs = codec.encode_many({"w": np.ones((2, 4), np.float32)}, 1, 0, np.arange(2))

    class Short(type(msgs[1])):
        def to_bytes(self):
            return super().to_bytes()[:-1]

    bad = copy.copy(msgs[1])
    object.__setattr__(bad, "__class__", Short)
    res = _errors(run_ranks(2, lambda ex: ex.aggregate(codec, [[msgs[0], bad][ex.rank]], "ps", False), monkeypatch))
    assert len(set(res)) == 1 and res[0][0] == "PeerPayloadError"
    assert res[0][1].startswith("rank 0 received a malformed message from rank 1: ")


def test_mpi_ps_server_downlink_of_the_wrong_size_is_a_server_error(monkeypatch):
    """A downlink one byte shorter than ps_downlink_size (N = 2: ceil(log2 5) = 3 bits; w 13 and b 5:
    4 + ceil(13 x 3 / 8) + 20 = 29 bytes) is the server's own failure: ServerError on every rank."""
    import tgsim.exchange.mpi as mpi_mod

    codec, msgs = _terngrad(2)
    real = mpi_mod.ps_downlink
    monkeypatch.setattr(mpi_mod, "ps_downlink", lambda *a, **k: real(*a, **k)[:-1])
    res = _errors(run_ranks(2, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "ps", True), monkeypatch, chunk=-1))
    assert set(res) == {("ServerError", "the parameter server (rank 0) failed: RuntimeError: downlink is 28 "
                                        "bytes, expected 29")}


def test_in_process_two_variable_size_messages_count_their_mean():
    """Two randomk messages of different sizes a and b: the all-gather counts (a + b) / 2 each way
    per worker (N-1 = 1 message of the mean worker's size), and the ps the same up."""
    from tgsim.codecs import registry
    from tgsim.train.config import CodecConfig

    rk = registry.make_codec(CodecConfig(name="randomk", density=0.3))
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


def test_mpi_check_same_config_names_each_entry():
    """The entries every rank compares, by name: a rank 2 that differs in config digest, tgsim
    version, message version and NumPy is named for each; a rank without a shard plan shows "-"."""
    from tgsim.errors import RankConfigMismatchError
    from test_mpi_errors import ConfigComm
    from tgsim.exchange.mpi import MPIExchange

    ex = object.__new__(MPIExchange)
    ex.size = 3
    keys = ("config sha256", "tgsim", "codec message version", "numpy")
    ex.comm = ConfigComm({k: "other" for k in keys})
    with pytest.raises(RankConfigMismatchError) as e:
        ex.check_same_config("d1")
    for k in keys:
        assert f"{k} differs from rank 0's on rank 2 (ranks 0-1: " in str(e.value)
    ex.comm = ConfigComm({"shard plan": "p"})
    with pytest.raises(RankConfigMismatchError, match=r"shard plan differs from rank 0's on rank 2 \(ranks 0-1: -; "
                                                       r"rank 2: p\)"):
        ex.check_same_config("d1")


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


@pytest.mark.parametrize("transport, chunk", [("collective", 0), ("p2p", -1), ("p2p", 40)])
def test_mpi_ps_server_names_a_sender_whose_scaler_is_not_the_shared_one(monkeypatch, transport, chunk):
    """The parameter server checks every slot's scalers against its own (shared) ones: rank 2's
    message with another scaler for w is named on every rank."""
    from tgsim.rng import StreamKey

    codec, msgs = _terngrad(3, sizes=(130, 5))
    g = {"w": np.full(130, 0.5, np.float32), "b": np.zeros(5, np.float32)}
    msgs[2] = codec.encode(g, StreamKey(1, 0, 2), msgs[0].scalers * 2, codec.scaling(g))
    res = _errors(run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "ps", True), monkeypatch,
                            chunk=chunk, ps_transport=transport))
    assert len(set(res)) == 1
    assert res[0][1].startswith("the parameter server (rank 0) received a malformed payload from rank 2: ")
    assert "layer 'w'" in res[0][1]


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


# -- mpi_transport.py's device paths, with a stand-in for CuPy (no GPU needed) ---------------------------

class _DevArray:
    """A stand-in CuPy array: host values behind .get() / .set()."""

    def __init__(self, values):
        self.values = np.array(values)
        self.shape, self.dtype, self.size = self.values.shape, self.values.dtype, self.values.size
        self.set_calls = 0

    def get(self, out):
        out[...] = self.values

    def set(self, buf):
        self.set_calls += 1
        self.values[...] = buf


def _fake_cupy(log):
    stream = types.SimpleNamespace(synchronize=lambda: log.append("sync"))
    cuda = types.SimpleNamespace(
        get_current_stream=lambda: stream,
        alloc_pinned_memory=lambda nbytes: log.append(("pinned", nbytes)) or bytearray(nbytes),
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 2),
        Device=lambda dev: types.SimpleNamespace(use=lambda: log.append(("use", dev))))
    return types.SimpleNamespace(cuda=cuda, ascontiguousarray=lambda a: a,
                                 empty=lambda shape, dtype: _DevArray(np.zeros(shape, dtype)))


def _with_fake_cupy(monkeypatch):
    import tgsim.exchange.mpi_transport as mt

    log = []
    cp = _fake_cupy(log)
    monkeypatch.setattr(mt, "get_xp", lambda name: cp if name == "cupy" else pytest.fail(name))
    monkeypatch.setattr(mt, "_xp_of", lambda a: cp if isinstance(a, _DevArray) else np)
    return mt, cp, log


def test_select_gpu_takes_node_local_rank_mod_device_count(monkeypatch):
    """With a GPU: node-local rank 5 of 2 devices -> device 1, made current, and returned."""
    mt, cp, log = _with_fake_cupy(monkeypatch)
    monkeypatch.setattr(mt, "gpu_available", lambda: True)
    monkeypatch.setattr(mt, "node_local_rank", lambda comm: (5, 8))
    assert mt.select_gpu(object()) == 1 and log == [("use", 1)]


def test_pinned_host_buffers_are_reused_per_key(monkeypatch):
    """pinned_array: one pinned allocation per key, reused while big enough (and shared by views of
    fewer elements), replaced when too small; at least one byte even for 0 elements."""
    mt, cp, log = _with_fake_cupy(monkeypatch)
    st = mt.Staging(cuda_aware=False)
    a = st.pinned_array("k", 4, np.float32)
    assert a.shape == (4,) and a.dtype == np.float32 and log == [("pinned", 16)]
    b = st.pinned_array("k", 2, np.float64)          # 16 bytes: the same memory
    assert b.shape == (2,) and np.shares_memory(a, b) and len(log) == 1
    c = st.pinned_array("k", 5, np.float32)          # 20 > 16 bytes: a new buffer
    assert c.shape == (5,) and log[-1] == ("pinned", 20) and not np.shares_memory(a, c)
    st.pinned_array("k", 5, np.float32)
    assert len(log) == 2                             # exactly big enough: kept
    st.pinned_array("other", 1, np.float32)
    assert log[-1] == ("pinned", 4)                  # another key, another buffer
    z = st.pinned_array("zero", 0, np.float32)
    assert z.size == 0 and log[-1] == ("pinned", 1)


def test_device_arrays_through_staging(monkeypatch):
    """A device array: with CUDA-aware MPI handed over as it is (wire) and received into a device
    array (landing); without, copied into pinned host memory after a stream sync, and a received
    host buffer copied back to a new device array (back); sync synchronizes the current stream."""
    mt, cp, log = _with_fake_cupy(monkeypatch)
    dev = _DevArray(np.arange(3, dtype=np.float32))
    aware = mt.Staging(cuda_aware=True)
    assert aware.wire(dev, "k") is dev and log == []
    assert isinstance(aware.landing(3, np.float32, cp, "k"), _DevArray)
    assert aware.back(dev, cp) is dev                # a device buffer stays
    plain = mt.Staging(cuda_aware=False)
    host = plain.wire(dev, "k")
    assert isinstance(host, np.ndarray) and host.tolist() == [0, 1, 2] and log == [("pinned", 12), "sync"]
    land = plain.landing(3, np.float32, cp, "r")
    assert isinstance(land, np.ndarray) and log[-1] == ("pinned", 12)
    land[...] = [7, 8, 9]
    back = plain.back(land, cp)
    assert isinstance(back, _DevArray) and back.set_calls == 1 and back.values.tolist() == [7, 8, 9]
    assert log[-1] == "sync"
    mt.Staging.sync(cp)
    assert log[-1] == "sync" and log.count("sync") == 3


# -- mpi_env.py: the launcher's variables, one at a time -------------------------------------------------

@pytest.mark.parametrize("env, want", [
    ({"I_MPI_HYDRA_TOPOLIB": "hwloc", "PMI_SIZE": "4"}, ("mpich", 4, "PMI_SIZE=4", "")),     # Intel MPI's Hydra
    ({"HYDI_CONTROL_FD": "7"}, ("mpich", 0, "PMI_SIZE=?", "")),                             # size not said: 0
    ({"SLURM_STEP_NUM_TASKS": "3"}, ("srun", 3, "SLURM_STEP_NUM_TASKS=3", "")),
    ({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "5"}, ("srun", 5, "SLURM_STEP_NUM_TASKS=5", "")),
    ({"SLURM_STEP_ID": "0"}, ("srun", 0, "SLURM_STEP_NUM_TASKS=?", "")),
    ({"SLURM_STEP_NUM_TASKS": "8(x2)", "PMI_FD": "3"}, ("srun", 8, "SLURM_STEP_NUM_TASKS=8(x2)", "pmi2")),
    ({"SLURM_STEP_NUM_TASKS": "2", "PMI_SIZE": "2"}, ("srun", 2, "SLURM_STEP_NUM_TASKS=2", "pmi2")),
    ({"PMI_SIZE": "6"}, ("pmi", 6, "PMI_SIZE=6", "")),
    ({"PMIX_RANK": "1"}, ("pmi", 0, "PMIX_RANK=1", "")),
    ({"PMI_RANK": "2"}, ("pmi", 0, "PMI_RANK=2", "")),
    ({"PALS_RANKID": "3"}, ("pmi", 0, "PALS_RANKID=3", "")),
    ({"ALPS_APP_PE": "4"}, ("pmi", 0, "ALPS_APP_PE=4", "")),
    ({"MPI_LOCALNRANKS": "2"}, ("pmi", 0, "MPI_LOCALNRANKS=2", "")),
])
def test_launcher_from_each_variable_alone(env, want):
    """Each variable a launcher sets, alone: the kind, the size it says (0 when it says none or
    something that is not a number; Slurm's "8(x2)" is 8), the evidence and srun's PMI plugin."""
    from tgsim.exchange import mpi_env as me

    who = me.launcher(env)
    assert (who.kind, who.size, who.evidence, who.pmi) == want


def test_launcher_records_are_frozen_and_srun_defaults_to_no_plugin():
    """A Launcher is immutable; built without `pmi`, an srun launcher has no --mpi plugin."""
    import dataclasses

    from tgsim.exchange import mpi_env as me

    who = me.Launcher("srun", 2, "E")
    assert who.pmi == "" and who.describe() == "srun (E, no --mpi plugin)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        who.size = 3


def test_library_name_without_a_comma_and_of_an_unknown_library():
    """"Open MPI v5.0.3" (no comma after the version) is "Open MPI 5.0.3"; an unknown library's
    first line is cut at 60 characters."""
    from tgsim.exchange import mpi_env as me

    assert me.library_name("Open MPI v5.0.3") == "Open MPI 5.0.3"
    assert me.library_name("Q" * 70 + "\nsecond") == "Q" * 60


@pytest.mark.parametrize("off", ["0", "no", "false", "off", " OFF "])
def test_every_off_value_skips_both_checks(off):
    """TGSIM_MPI_CHECK=0/no/false/off (any case, spaces around) skips the checks before and after
    MPI_Init that would otherwise refuse these environments."""
    from tgsim.exchange import mpi_env as me

    mismatch = ({"OMPI_COMM_WORLD_SIZE": "4"}, "MPICH Version:      5.0.2\n")
    with pytest.raises(me.MPIEnvironmentError):
        me.check_before_init(*mismatch)
    me.check_before_init({**mismatch[0], "TGSIM_MPI_CHECK": off}, mismatch[1])
    me.check_after_init({"TGSIM_MPI_CHECK": off}, "MPICH", 1)
    me.check_after_init({"PMI_SIZE": "2", "TGSIM_MPI_CHECK": off}, "MPICH", 1)


def test_two_processes_seen_as_one_rank_each_is_refused():
    """A launcher that started 2 processes while MPI sees one rank in each: refused (1 process with 1
    rank is a launch of one)."""
    from tgsim.exchange import mpi_env as me

    with pytest.raises(me.MPIEnvironmentError, match="started 2 processes but MPICH 5.0.2 sees 1 rank"):
        me.check_after_init({"PMI_SIZE": "2"}, "MPICH Version:      5.0.2\n", 1)
    me.check_after_init({"PMI_SIZE": "1"}, "MPICH Version:      5.0.2\n", 1)



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
