"""Stand-ins shared by several test files (a plain module: `from fakes import FakeComm`).

* A fake MPI: `FAKE_MPI` (the mpi4py names tgsim.exchange uses), `FakeComm` (one communicator per
  rank of a `_World`; collectives meet at a barrier, point-to-point messages are matched in posting
  order, as MPI matches them), `run_ranks` (an MPIExchange per rank on one thread each), `ok`.
* `ConfigComm`: a communicator whose ranks report fixed config entries (MPIExchange.check_same_config).
* `numba_philox_calls`: records the lengths the Numba Philox draws, so a test can see which path ran.
* `_aggregate_on_ranks`: one aggregate call on N fake ranks, with the in-process exchange's result.
* Codec inputs used by several files: `_terngrad`, `_messages` (TernGrad messages of N workers),
  `_header`, `_kernel_choice`, `_aggregate_of_three_workers`, `same_bits`; `header_length` (the
  length of a TGM1 header); `KINDS` and `grad(kind, n, seed)`: float32 test layers (normal, wide
  dynamic range with denormals, zeros of both signs, all zero).
* Torch model factories that cannot train (`fakes:raising_net`, `fakes:batchnorm_net`, `fakes:small_net`
  with a `width` argument to misspell): the model check before a run directory is created.
* `EDGE_WORDS` (with `EDGE_SEED`, `EDGE_STEP`, `EDGE_LAYER`): streams whose first block holds the
  smallest and largest 24-bit thresholds; `edge_threshold_rows`: TernGrad layers at the rule's exact
  boundaries on them (tests/test_numba_kernels.py, test_cuda_kernels.py, test_peer_numba_kernels.py).
* `check_sharing_sweep`: the assertions on a quick sharing sweep's CSVs and PNG (the sweep scripts run
  in tests/test_figures.py and, inside fig03, in tests/test_figures_report.py).
* `events(logdir)`: {tag: [(step, value)]} of the TensorBoard scalars under a folder, read back with
  the tensorboard package's EventAccumulator (test_tensorboard.py, test_torch_ddp_example.py).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import threading
import types

import numpy as np
import pytest

from tgsim.codecs.message import _FIXED
from tgsim.exchange.inprocess import InProcessExchange


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


TIMEOUT = 20.0      # seconds a fake rank waits for the others before it gives up


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


def _aggregate_on_ranks(monkeypatch, n, codec, msgs, mode, shared, key=None, **kw):
    def fn(ex):
        mean, b = ex.aggregate(codec, [msgs[ex.rank]], mode, shared, key)
        return mean, (b.sent, b.received)
    return ok(run_ranks(n, fn, monkeypatch, **kw))


def numba_philox_calls(monkeypatch) -> list:
    """The lengths tgsim.rng.numba_philox.random_words is called with from now on (it still draws)."""
    from tgsim.rng import numba_philox

    calls = []
    real = numba_philox.random_words
    monkeypatch.setattr(numba_philox, "random_words", lambda n, key, *a: (calls.append(n), real(n, key, *a))[1])
    return calls


def _header(raw: bytes) -> tuple:
    """(magic, version, n_layers, crc, body bytes) of a framed message: "<4sBIIQ", 21 bytes."""
    import struct

    return struct.unpack("<4sBIIQ", raw[:21])


def _kernel_choice(cls, **kw):
    """[_numba(True) for auto, numba, reference, cuda], [_numba(False) for auto, reference, cuda],
    and whether kernels="numba" refuses a non-NumPy array (ValueError)."""
    on = [cls(kernels=k, **kw)._numba(True) for k in ("auto", "numba", "reference", "cuda")]
    off = [cls(kernels=k, **kw)._numba(False) for k in ("auto", "reference", "cuda")]
    with pytest.raises(ValueError, match="NumPy arrays"):
        cls(kernels="numba", **kw)._numba(False)
    return on, off


def _aggregate_of_three_workers(codec):
    """Three workers' (1, 2) layers, every value exact in fp16 and bf16: the mean (Σ in float64, then
    f32(acc · (1/divide_by))), the sum over 6, and one message decoded as itself."""
    g = np.array([[[1.0, -2.0]], [[3.0, 0.25]], [[0.5, 0.0]]], np.float32)
    msgs = codec.encode_many({"w": g}, 0, 0, [0, 1, 2])
    assert codec.aggregate(msgs)["w"].tolist() == [[1.5, np.float32(-1.75 * (1.0 / 3))]]
    assert codec.aggregate(msgs, divide_by=6)["w"].tolist() == [[0.75, np.float32(-1.75 * (1.0 / 6))]]
    one = codec.aggregate(msgs[:1])["w"]
    assert one.shape == (1, 2) and one.tolist() == [[1.0, -2.0]]


class ConfigComm:
    """A 3-rank communicator for check_same_config: ranks 0 and 1 send this rank's dict, rank 2 the
    same dict updated with `other`."""

    def __init__(self, other):
        self.other = other

    def allgather(self, mine):
        return [mine, dict(mine), dict(mine, **self.other)]


def header_length(buf: bytes) -> int:
    """The length of a TGM1 message's header: the fixed part, each layer's record, the crc32."""
    n_layers = _FIXED.unpack_from(buf, 0)[6]
    off = _FIXED.size
    for _ in range(n_layers):
        ndim = buf[off + 1]
        off += 2 + 8 * ndim
    return off + 4


# float32 test layers of the Numba kernel tests (tests/test_numba_kernels.py, test_batched_step.py)
KINDS = ["normal", "wide", "zeros", "allzero"]


def grad(kind: str, n: int, seed: int = 0) -> np.ndarray:
    """float32 test layers: normal; huge dynamic range with denormals; mixed exact/negative zeros."""
    rng = np.random.default_rng(seed * 1000 + n)
    if kind == "normal":
        return rng.standard_normal(n, dtype=np.float32)
    if kind == "wide":      # |g| from 1e-45 (denormal) to 1e38, both signs
        mag = 10.0 ** rng.uniform(-45.0, 38.0, n)
        return (np.where(rng.random(n) < 0.5, -mag, mag)).astype(np.float32)
    if kind == "zeros":     # exact zeros, negative zeros, denormals and normals
        g = rng.standard_normal(n).astype(np.float32)
        pick = rng.integers(0, 4, n)
        g[pick == 0] = 0.0
        g[pick == 1] = -0.0
        g[pick == 2] = (rng.integers(1, 2**23, (pick == 2).sum()).astype(np.uint32)
                        | np.uint32(rng.integers(0, 2) << 31)).view(np.float32)
        return g
    if kind == "allzero":
        g = np.zeros(n, dtype=np.float32)
        g[::3] = -0.0
        return g
    raise ValueError(kind)


# -- the least-squares training run of the peer codecs' tests (test_peer_qsgd.py, test_peer_sparse.py) --
LS = {"run": {"name": "qsgd-ls", "seed": 3, "steps": 50, "eval_every": 0, "log_every": 10},
      "data": {"name": "least_squares"}, "model": {"name": "least_squares"},
      "workers": {"n": 4, "batch": 32}, "exchange": {"mode": "ps"},
      "optimizer": {"name": "momentum"}, "schedule": {"name": "constant", "lr": 0.05}}


def train_loss_curve(out) -> np.ndarray:
    """The training loss per logged step (metrics.csv of run directory `out`, layer "model"), by step."""
    import pandas as pd

    m = pd.read_csv(out / "metrics.csv")
    return m[(m["split"] == "train") & (m["layer"] == "model")].sort_values("step")["loss"].to_numpy()


@contextlib.contextmanager
def one_numba_thread():
    """Numba with one thread inside the block, as the MPI ranks run: the bits do not depend on it, but
    small kernels run faster without a thread team on a loaded machine."""
    import numba

    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(threads)


def check_sharing_sweep(out, stem: str, rows: int, keys: list[str], stdout: str) -> None:
    """Asserts what a quick sharing sweep (papers_figures/terngrad_sharing_regimes.py,
    terngrad_workers_scaling.py) wrote under `out`: `rows` runs of seed 0 with accuracies in [0, 1];
    TernGrad's bits per step under a tenth of fp32's; every shared scaler's ratio_max >= 1 and fp32's
    NaN; a summary whose first columns are `keys` with gap_to_fp32 exactly 0 on fp32's rows; the CSVs
    and PNG non-empty and named on `stdout`."""
    import pandas as pd

    df = pd.read_csv(out / f"{stem}.csv")
    assert len(df) == rows and (df.seed == 0).all() and df.test_accuracy.between(0, 1).all()
    tern = df[df.variant != "fp32"]
    per_step = df.bits_up_per_worker / df.steps
    assert (per_step[tern.index] * 10 < per_step[df.variant == "fp32"].min()).all()
    shared = tern[~tern.variant.str.contains("none")]
    assert (shared.ratio_max >= 1).all() and df[df.variant == "fp32"].ratio_max.isna().all()
    assert df.quick.all()
    summary = pd.read_csv(out / f"{stem}_summary.csv")
    assert len(summary) == rows and list(summary.columns[:len(keys)]) == keys
    assert (summary[summary.variant == "fp32"].gap_to_fp32 == 0).all()
    for name in (f"{stem}.csv", f"{stem}_summary.csv", f"{stem}.png"):
        assert (out / name).stat().st_size > 0 and f"wrote {out / name}" in stdout


def central_difference_error(model, params: dict, x, y, grads: dict, worker: int, name: str, coords: int,
                             rng, eps: float = 1e-6) -> float:
    """Relative error ||fd - an|| / max(||fd||, ||an||, 1e-8) of the model's gradient of layer `name`
    for `worker` (grads[name][worker], from loss_and_grad on x, y) against central differences
    (L(p + eps) - L(p - eps)) / (2 eps) of that worker's loss alone, at `coords` coordinates drawn
    without replacement by `rng` (float64 params)."""
    xi, yi = x[worker:worker + 1], y[worker:worker + 1]
    p = params[name]
    fd, an = [], []
    for j in rng.choice(p.size, size=min(p.size, coords), replace=False):
        idx = np.unravel_index(j, p.shape)
        plus = {k: v.copy() for k, v in params.items()}
        minus = {k: v.copy() for k, v in params.items()}
        plus[name][idx] += eps
        minus[name][idx] -= eps
        fd.append((model.loss_and_grad(plus, xi, yi)[0][0] - model.loss_and_grad(minus, xi, yi)[0][0]) / (2 * eps))
        an.append(grads[name][worker][idx])
    fd, an = np.array(fd), np.array(an)
    return float(np.linalg.norm(fd - an) / max(np.linalg.norm(fd), np.linalg.norm(an), 1e-8))


def kill_train_step_at(monkeypatch, kill_step: int) -> None:
    """Make tgsim.train.loop.train_step raise KeyboardInterrupt("killed") when it reaches `kill_step`
    (a run killed there, after its last checkpoint); `monkeypatch.undo()` restores it."""
    from tgsim.train import loop as loop_mod

    original = loop_mod.train_step

    def dying(setup, params, opt_state, step, *args, **kwargs):
        if step == kill_step:
            raise KeyboardInterrupt("killed")
        return original(setup, params, opt_state, step, *args, **kwargs)

    monkeypatch.setattr(loop_mod, "train_step", dying)


# -- the TernGrad rule at the edge thresholds (tests/test_numba_kernels.py, tests/test_cuda_kernels.py) --
# Block 0 of the stream (seed EDGE_SEED, step EDGE_STEP, worker w, layer EDGE_LAYER) holds, at element m,
# a word whose threshold t = word >> 8 is extreme: EDGE_WORDS[t] lists such (w, m). The pairs were found
# once by a search over worker ids with the array reference (tgsim.rng.philox4x32_10); edge_threshold_rows
# re-checks every one with tgsim.rng.random_words, so a wrong entry fails instead of testing nothing.
EDGE_SEED, EDGE_STEP, EDGE_LAYER = 0x5EED, 7, 3
EDGE_WORDS = {0: [(7647436, 0), (6681196, 3)], 1: [(1560084, 1)],
              2**24 - 2: [(7729194, 0)], 2**24 - 1: [(2765619, 0), (10766704, 3)]}


def _around(v: np.float32) -> list:
    """v and the float32 values one step below (not below 0) and above it (not inf)."""
    with np.errstate(over="ignore"):
        out = [v, np.nextafter(v, np.float32(0)), np.nextafter(v, np.float32(np.inf))]
    return [x for x in out if np.isfinite(x)]


def edge_threshold_rows(scaler: float, n: int) -> tuple:
    """(G, workers): float32 rows (W, n >= 4) for the stream key (EDGE_SEED, EDGE_STEP, workers[r],
    EDGE_LAYER) and the float32 scaler s = `scaler`. Each row puts one x (with either sign) at the
    element m of its worker's block 0 whose threshold t is extreme (EDGE_WORDS: the smallest words
    t = 0, 1 and the largest t = 2^24 - 2, 2^24 - 1): x at the rule's exact boundary f32(t s / 2^24)
    and one float32 step either side, x = s (|g| = s) and one step either side, 0 and the smallest
    subnormal. Every other element sits at (or one step above) the boundary of its own random word."""
    from tgsim.rng import StreamKey, random_words

    s = np.float32(scaler)
    rows, workers = [], []
    for t, places in EDGE_WORDS.items():
        for w, m in places:
            key = StreamKey(EDGE_SEED, EDGE_STEP, w, EDGE_LAYER)
            tw = (random_words(n, key) >> np.uint32(8)).astype(np.float64)
            assert tw[m] == t, (t, w, m)
            with np.errstate(under="ignore", over="ignore"):
                base = (tw * np.float64(s) * 2.0**-24).astype(np.float32)
            base[1::2] = np.nextafter(base[1::2], np.float32(np.inf))
            base[::3] *= -1
            with np.errstate(under="ignore"):
                edge = np.float32(np.float64(t) * np.float64(s) * 2.0**-24)
            cands = _around(edge) + _around(s) + [np.float32(0), np.float32(1e-45)]
            for x in cands:
                for sign in (1, -1):
                    g = base.copy()
                    g[m] = np.float32(sign) * np.float32(x)
                    rows.append(g)
                    workers.append(w)
    return np.array(rows, dtype=np.float32), np.array(workers, dtype=np.uint32)


def small_net(dim, classes, width=4):
    """A torch MLP (dim -> width -> classes) taking a `width` argument (a test misspells it)."""
    import torch

    return torch.nn.Sequential(torch.nn.Linear(dim, width), torch.nn.ReLU(), torch.nn.Linear(width, classes))


def raising_net(dim, classes):
    """A torch module whose forward raises (a user's bug), with a two-line message."""
    import torch

    class Raising(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(dim, classes)

        def forward(self, x):
            raise RuntimeError("forward exploded\non purpose")

    return Raising()


def batchnorm_net(dim, classes):
    """A torch module with BatchNorm running statistics (refused: state outside the parameters)."""
    import torch

    return torch.nn.Sequential(torch.nn.Linear(dim, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, classes))


def events(logdir) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of the scalars in the event files under `logdir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
