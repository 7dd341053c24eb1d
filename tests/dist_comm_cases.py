"""The checks tests/test_torch_dist_comm.py runs inside tests/torch_ddp_driver.py's mpiexec job (2 ranks,
Gloo initialised): each TorchDistComm call, and MPIExchange over it, against mpi4py's COMM_WORLD on
the same inputs. Every check returns "ok" when the outputs (arrays by their bytes and dtype, objects
by their repr) are the same, else a short account of the difference or of the exception.

CALLS and EXCHANGES name the checks (the test parametrizes over them); ERRORS the misuses whose
messages it checks. `device_checks` runs the calls on CuPy buffers over NCCL (`device_worker`, the
GPU test) and, in the same job as the rest, on NumPy buffers over Gloo.
"""

from __future__ import annotations

import numpy as np

from fakes import _terngrad

# (name, dtype, MPI type name, op name)
ALLREDUCES = [("int8-sum", np.int8, "INT8_T", "SUM"), ("int16-sum", np.int16, "INT16_T", "SUM"),
              ("uint16-sum", np.uint16, "UINT16_T", "SUM"), ("int32-max", np.int32, "INT32_T", "MAX"),
              ("float32-max", np.float32, "FLOAT", "MAX"), ("float32-sum", np.float32, "FLOAT", "SUM"),
              ("float64-sum", np.float64, "DOUBLE", "SUM"), ("uint64-sum", np.uint64, "UINT64_T", "SUM")]
CALLS = [f"Allreduce-{a[0]}" for a in ALLREDUCES] + [
    "Allreduce-send-recv", "Allgather", "Allgatherv-bytes", "Allgatherv-counts-displs", "Allgatherv-zero-count",
    "Allgatherv-gaps", "Alltoallv-7", "Alltoallv-1", "Gather-root0", "Gather-root1", "Gatherv-root0",
    "Gatherv-root1", "Bcast-float",
    "Bcast-bytes-root1", "Send-Recv", "Isend-Irecv-in-order", "allgather", "bcast", "gather", "Barrier"]
EXCHANGES = ["any_true", "mean_scalar", "gather_rows", "check_same_config", "max_scalers", "mean_scalers",
             "fp32-mean", "terngrad-allreduce", "terngrad-allgather-pieces", "terngrad-own-allgather-whole",
             "terngrad-ps-pieces", "terngrad-ps-whole", "terngrad-ps-collective", "terngrad-sharded_ps",
             "terngrad-sharded_ps-pieces", "terngrad-sharded_ps-base3", "fp16-allgather", "fp16-ps", "sign-ps"]
ERRORS = ["Split_type", "uint64-max", "mpi4py-datatype", "mpi4py-op", "noncontiguous"]


def _bits(x):
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        return (str(x.dtype), x.shape, x.tobytes())
    if isinstance(x, dict):
        return {k: _bits(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_bits(v) for v in x]
    return repr(x)


def _compare(fn, mpi_comm, mpi, torch_comm, tmpi) -> str:
    try:    # torch first: a buffer it fails to fill cannot hold mpi4py's result from memory np.empty reuses
        got = fn(torch_comm, tmpi)
        want = fn(mpi_comm, mpi)
    except Exception as e:  # noqa: BLE001  (reported to the test)
        return f"{type(e).__name__}: {e}"[:400]
    if _bits(want) == _bits(got):
        return "ok"
    return f"differs: mpi4py {want!r} torch {got!r}"[:400]


def _filled(shape, dtype):
    """A receive buffer of 0x5A bytes (not what any call writes)."""
    dtype = np.dtype(dtype)
    return np.full(int(np.prod(shape)) * dtype.itemsize, 0x5A, np.uint8).view(dtype).reshape(shape)


def _calls(rank: int, size: int) -> dict:
    """name -> fn(comm, MPI) returning the call's outputs, inputs fixed per rank."""
    rng = np.random.default_rng(100 + rank)
    calls = {}
    for name, dt, tname, opname in ALLREDUCES:
        if np.dtype(dt).kind == "f":
            data = rng.standard_normal(5).astype(dt)
        elif dt == np.uint64:
            data = np.array([2**64 - 1 - rank, 2**63 + 5, 7, 0, 2**40 * (rank + 1)], dtype=np.uint64)   # wraps
        else:
            info = np.iinfo(dt)
            data = rng.integers(info.min // 2, info.max // 2, 5).astype(dt)

        def fn(c, M, data=data, tname=tname, opname=opname):
            buf = data.copy()
            c.Allreduce(M.IN_PLACE, [buf, getattr(M, tname)], op=getattr(M, opname))
            return buf
        calls[f"Allreduce-{name}"] = fn
    send = rng.standard_normal(4).astype(np.float32)

    def send_recv(c, M):
        out = _filled(4, np.float32)
        c.Allreduce([send, M.FLOAT], [out, M.FLOAT], op=M.SUM)
        return out
    calls["Allreduce-send-recv"] = send_recv

    def allgather(c, M):
        rows = _filled((size, 4), np.float32)
        c.Allgather([send, M.FLOAT], [rows, M.FLOAT])
        return rows
    calls["Allgather"] = allgather
    mine = rng.integers(0, 256, 3 + 5 * rank).astype(np.uint8)

    def allgatherv_bytes(c, M):
        sizes = [3 + 5 * r for r in range(size)]
        recv = _filled(sum(sizes), np.uint8)
        c.Allgatherv(mine, [recv, sizes])
        return recv
    calls["Allgatherv-bytes"] = allgatherv_bytes

    def allgatherv_v(counts, displs, total):
        def fn(c, M):
            part = np.arange(counts[rank], dtype=np.float32) + np.float32(10 * rank + 1)
            recv = np.zeros(total, np.float32)
            c.Allgatherv([part, M.FLOAT], [recv, (counts, displs), M.FLOAT])
            return recv
        return fn
    calls["Allgatherv-counts-displs"] = allgatherv_v([1, 2], [0, 1], 3)
    calls["Allgatherv-zero-count"] = allgatherv_v([0, 1], [0, 0], 1)
    calls["Allgatherv-gaps"] = allgatherv_v([2, 2], [5, 1], 8)         # blocks out of rank order, gaps

    def alltoallv(m):
        seg = rng.standard_normal(m).astype(np.float32)

        def fn(c, M):
            bounds = [m * k // size for k in range(size + 1)]
            counts = [bounds[k + 1] - bounds[k] for k in range(size)]
            own = counts[rank]
            recv = _filled(size * own, np.float32)
            c.Alltoallv([seg, (counts, bounds[:-1]), M.FLOAT], [recv, ([own] * size, [own * w for w in range(size)]),
                                                                 M.FLOAT])
            return recv
        return fn
    calls["Alltoallv-7"], calls["Alltoallv-1"] = alltoallv(7), alltoallv(1)
    row = np.full((1, 3), rank + 10, np.int64)

    def gather(root):
        def fn(c, M):
            rows = _filled((size, 3), np.int64) if rank == root else None
            c.Gather(row, rows, root=root)
            return rows
        return fn
    calls["Gather-root0"], calls["Gather-root1"] = gather(0), gather(1)

    def gatherv(root):
        def fn(c, M):
            sizes = c.gather(int(mine.size), root=root)
            recv = _filled(sum(sizes), np.uint8) if rank == root else None
            c.Gatherv(mine, [recv, sizes] if rank == root else None, root=root)
            return recv
        return fn
    calls["Gatherv-root0"], calls["Gatherv-root1"] = gatherv(0), gatherv(1)

    def bcast_float(c, M):
        buf = send.copy()
        c.Bcast([buf, M.FLOAT], root=0)
        return buf
    calls["Bcast-float"] = bcast_float

    def bcast_bytes(c, M):
        buf = np.full(9, rank, np.uint8)
        c.Bcast([buf, M.BYTE], root=1)
        return buf
    calls["Bcast-bytes-root1"] = bcast_bytes

    def send_recv_p2p(c, M):
        buf = np.full(6, rank + 1, np.uint8)
        if rank == 0:
            c.Send([buf, M.BYTE], dest=1, tag=11)
            c.Recv([buf, M.BYTE], source=1, tag=12)
        elif rank == 1:
            got = _filled(6, np.uint8)
            c.Recv([got, M.BYTE], source=0, tag=11)
            c.Send([got * 3, M.BYTE], dest=0, tag=12)
            buf = got
        return buf
    calls["Send-Recv"] = send_recv_p2p

    def isend_irecv(c, M):
        pieces = [np.full(4, 7 * k + rank, np.uint8) for k in range(3)]
        got = np.zeros((3, 4), np.uint8)
        peer = 1 - rank
        reqs = [c.Irecv([got[k], M.BYTE], source=peer, tag=13) for k in range(3)]   # one tag: posting order
        reqs += [c.Isend([p, M.BYTE], dest=peer, tag=13) for p in pieces]
        M.Request.Waitall(reqs)
        return got
    calls["Isend-Irecv-in-order"] = isend_irecv
    calls["allgather"] = lambda c, M: c.allgather({"rank": rank, "x": [1.5, rank]})
    calls["bcast"] = lambda c, M: c.bcast({"from": rank} if rank == 1 else None, root=1)
    calls["gather"] = lambda c, M: c.gather(("r", rank), root=0)
    calls["Barrier"] = lambda c, M: c.Barrier()
    return calls


def comm_checks(mpi_comm) -> dict:
    """{call name: "ok" or what differs} for CALLS, and {"errors": {name: message}} for ERRORS."""
    from mpi4py import MPI

    from tgsim.torch.dist_comm import TorchDistComm

    tc = TorchDistComm()
    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    out = {name: _compare(fn, mpi_comm, MPI, tc, tc.MPI) for name, fn in _calls(rank, size).items()}
    errors = {}
    misuses = {
        "Split_type": lambda: tc.Split_type(0, key=rank),
        "uint64-max": lambda: tc.Allreduce(tc.MPI.IN_PLACE, [np.zeros(2, np.uint64), tc.MPI.UINT64_T], op=tc.MPI.MAX),
        "mpi4py-datatype": lambda: tc.Allreduce(tc.MPI.IN_PLACE, [np.zeros(2, np.float32), MPI.FLOAT], op=tc.MPI.SUM),
        "mpi4py-op": lambda: tc.Allreduce(tc.MPI.IN_PLACE, [np.zeros(2, np.float32), tc.MPI.FLOAT], op=MPI.SUM),
        "noncontiguous": lambda: tc.Bcast(np.zeros((3, 2), np.float32)[:, 0], root=0),
    }
    for name, call in misuses.items():
        try:
            call()
            errors[name] = None
        except Exception as e:  # noqa: BLE001
            errors[name] = f"{type(e).__name__}: {e}"
    out["errors"] = errors
    return out


def exchange_checks(mpi_comm, only=None) -> dict:
    """{name: "ok" or what differs} for EXCHANGES (or the names in `only`): MPIExchange's results
    (means, bytes) over mpi4py and over TorchDistComm on the same messages (this rank's of the
    communicator's workers)."""
    from mpi4py import MPI

    from tgsim.codecs import registry
    from tgsim.exchange.mpi import MPIExchange
    from tgsim.torch.dist_comm import TorchDistComm
    from tgsim.train.config import CodecConfig

    tc = TorchDistComm()
    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()

    def ex(c, **kw):
        return MPIExchange(comm=c, gpu=False, **kw)

    def agg(codec, msgs, mode, shared, **kw):
        def fn(c, M):
            mean, b = ex(c, **kw).aggregate(codec, [msgs[rank]], mode, shared)
            return mean, (b.sent, b.received)
        return fn
    rng = np.random.default_rng(7)
    layers = {"w": rng.standard_normal((size, 2, 3)).astype(np.float32),
              "v": rng.standard_normal((size, 5)).astype(np.float32)}
    codec, shared_msgs = _terngrad(size, shared=True, sizes=(13, 5))
    _, own_msgs = _terngrad(size, shared=False, sizes=(13, 5))
    checks = {
        "any_true": lambda c, M: (ex(c).any_true(rank == 1), ex(c).any_true(False)),
        "mean_scalar": lambda c, M: ex(c).mean_scalar([0.1, 2.7][rank]),
        "gather_rows": lambda c, M: ex(c).gather_rows(np.full((1, 2), rank + 3, np.int16)),
        "check_same_config": lambda c, M: ex(c).check_same_config("abc"),
        "max_scalers": lambda c, M: ex(c).max_scalers(np.array([[0.5 + rank, 2.0 - rank]], np.float32)),
        "mean_scalers": lambda c, M: ex(c).mean_scalers(np.array([[0.3 + rank, 1.7]], np.float32)),
        "fp32-mean": lambda c, M: ex(c).mean_fp32([{k: v[rank] for k, v in layers.items()}])[0],
        "terngrad-allreduce": agg(codec, shared_msgs, "allreduce", True),
        "terngrad-allgather-pieces": agg(codec, shared_msgs, "allgather", True, chunk=4),
        "terngrad-own-allgather-whole": agg(codec, own_msgs, "allgather", False, chunk=-1),
        "terngrad-ps-pieces": agg(codec, shared_msgs, "ps", True, chunk=4),
        "terngrad-ps-whole": agg(codec, shared_msgs, "ps", True, chunk=-1),
        "terngrad-ps-collective": agg(codec, shared_msgs, "ps", True, ps_transport="collective"),
        "terngrad-sharded_ps": agg(codec, shared_msgs, "sharded_ps", True),
        "terngrad-sharded_ps-pieces": agg(codec, shared_msgs, "sharded_ps", True, chunk=8),
        "terngrad-sharded_ps-base3": agg(*_terngrad(size, shared=True, sizes=(29, 5), packing="base3"),
                                         "sharded_ps", True),
    }
    for name, mode in (("fp16-allgather", "allgather"), ("fp16-ps", "ps"), ("sign-ps", "ps")):
        c16 = registry.make_codec(CodecConfig(name=name.split("-")[0]))
        checks[name] = agg(c16, c16.encode_many(layers, 1, 0, np.arange(size)), mode, False)
    return {name: _compare(fn, mpi_comm, MPI, tc, tc.MPI) for name, fn in checks.items()
            if only is None or name in only}


# -- NCCL with CuPy buffers (tests/test_torch_dist_comm.py's gpu test) --------------------------------------

def device_worker(rank: int, world: int, store: str, out: str) -> None:
    """One rank of the GPU check, started by torch.multiprocessing.spawn: the process group over NCCL,
    this rank on GPU `rank`, `device_checks` on CuPy buffers; {name: "ok" or what differs} in
    OUT/device-RANK.json."""
    import json
    import os

    import cupy
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")      # the comm's Gloo group for host buffers
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        res = device_checks(cupy)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out, f"device-{rank}.json"), "w") as f:
        json.dump(res, f)


def device_checks(xp) -> dict:
    """Every TorchDistComm call on buffers of module `xp` (CuPy over NCCL; NumPy over Gloo, as the
    CPU job runs it) against the result plain NumPy computes from every rank's inputs, host buffers
    (over the comm's host group), and MPIExchange's TernGrad all-reduce of `xp` messages against
    InProcessExchange's bits: {name: "ok" or what differs}, "error" for an exception."""
    import torch.distributed as dist

    from tgsim.exchange.inprocess import InProcessExchange
    from tgsim.exchange.mpi import MPIExchange
    from tgsim.torch.dist_comm import TorchDistComm

    rank, world = dist.get_rank(), dist.get_world_size()
    res = {}
    try:
        tc = TorchDistComm()
        M = tc.MPI
        res["cuda_aware"] = "ok" if tc.cuda_aware == (xp is not np) else f"cuda_aware {tc.cuda_aware}"
        def inputs(r):
            g = np.random.default_rng(200 + r)
            return {"i8": g.integers(-60, 60, 9).astype(np.int8), "i16": g.integers(-900, 900, 9).astype(np.int16),
                    "f32": g.standard_normal(9).astype(np.float32),
                    "bytes": g.integers(0, 256, 2 + 3 * r).astype(np.uint8)}
        ins = [inputs(r) for r in range(world)]
        me = ins[rank]

        def check(name, got, want):
            got = got.get() if hasattr(got, "get") else np.asarray(got)
            res[name] = "ok" if got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8)) \
                else f"differs: {got!r} vs {want!r}"[:300]

        for name, key, tname, op, want in (
                ("Allreduce-int8-sum", "i8", "INT8_T", M.SUM, sum(i["i8"] for i in ins).astype(np.int8)),
                ("Allreduce-int16-sum", "i16", "INT16_T", M.SUM,
                 sum(i["i16"].astype(np.int32) for i in ins).astype(np.int16)),
                ("Allreduce-float32-max", "f32", "FLOAT", M.MAX, np.max([i["f32"] for i in ins], axis=0))):
            buf = xp.array(me[key])
            tc.Allreduce(M.IN_PLACE, [buf, getattr(M, tname)], op=op)
            check(name, buf, want)
        rows = xp.empty((world, 9), np.float32)
        tc.Allgather([xp.array(me["f32"]), M.FLOAT], [rows, M.FLOAT])
        check("Allgather", rows, np.stack([i["f32"] for i in ins]))
        sizes = [i["bytes"].size for i in ins]
        recv = xp.empty(sum(sizes), np.uint8)
        tc.Allgatherv(xp.array(me["bytes"]), [recv, sizes])
        check("Allgatherv-padded", recv, np.concatenate([i["bytes"] for i in ins]))
        m = 9
        bounds = [m * k // world for k in range(world + 1)]
        counts = [bounds[k + 1] - bounds[k] for k in range(world)]
        own = counts[rank]
        got = xp.empty(world * own, np.float32)
        tc.Alltoallv([xp.array(me["f32"]), (counts, bounds[:-1]), M.FLOAT],
                     [got, ([own] * world, [own * w for w in range(world)]), M.FLOAT])
        check("Alltoallv", got, np.concatenate([i["f32"][bounds[rank]:bounds[rank + 1]] for i in ins]))
        buf = xp.array(me["f32"])
        tc.Bcast([buf, M.FLOAT], root=world - 1)
        check("Bcast", buf, ins[-1]["f32"])
        if world > 1:
            got = xp.zeros(9, np.float32)
            peer = (rank + 1) % world
            reqs = [tc.Irecv([got, M.FLOAT], source=(rank - 1) % world, tag=5),
                    tc.Isend([xp.array(me["f32"]), M.FLOAT], dest=peer, tag=5)]
            M.Request.Waitall(reqs)
            check("Isend-Irecv", got, ins[(rank - 1) % world]["f32"])
        host = np.empty((world, 9), np.int8) if rank == 0 else None
        tc.Gather(me["i8"], host, root=0)
        if rank == 0:
            check("Gather-host", host, np.stack([i["i8"] for i in ins]))
        res["allgather-object"] = "ok" if tc.allgather(rank) == list(range(world)) else "differs"
        codec, msgs = _terngrad(world, shared=True, sizes=(13, 5))
        want, _ = InProcessExchange(world).aggregate(codec, msgs, "allreduce", True)
        dev = msgs[rank]
        if xp is not np:
            from tgsim.exchange.ps_downlink import message_to

            dev = message_to(dev, xp)
        mean, _ = MPIExchange(comm=tc).aggregate(codec, [dev], "allreduce", True)
        for k in want:
            check(f"MPIExchange-terngrad-{k}", mean[k], np.asarray(want[k]))
    except Exception as e:  # noqa: BLE001  (reported to the test)
        res["error"] = f"{type(e).__name__}: {e}"
    return res


# -- under torchrun, without mpi4py ------------------------------------------------------------------------------

def torchrun_main(case_json: str) -> None:
    """Every rank of `torchrun --standalone --nproc-per-node N tests/dist_comm_cases.py CASE.json`:
    mpi4py made unimportable, the Gloo group from torchrun's environment, DDP with the hook over
    transport "torch" on the simulator's batches of worker `rank` for the case's steps; prints one
    JSON line {"rank", "digests": the parameters' sha256 after every step}."""
    import json
    import os
    import sys

    sys.modules["mpi4py"] = None                       # any import of mpi4py now fails
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tgsim.data import batch_indices
    from tgsim.torch import ddp as tgddp
    from tgsim.train.config import from_dict
    from tgsim.train.loop import build

    case = json.loads(open(case_json).read())
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo")
    rank, d = dist.get_rank(), case["config"]
    cfg = from_dict(d)
    setup = build(cfg)
    module = setup.model.build(cfg.run.seed)
    state = tgddp.TgsimHookState.create(module, d, transport="torch")
    model = DDP(module, bucket_cap_mb=case["bucket_cap_mb"], gradient_as_bucket_view=case["bucket_view"])
    tgddp.register(model, state)
    opt = tgddp.TgsimOptimizer(state)
    b, digests = cfg.workers.per_worker_batch, []
    for step in range(case["steps"]):
        idx = batch_indices(setup.shards[rank], b, cfg.run.seed, step, rank)
        opt.zero_grad()
        x, y = torch.from_numpy(setup.dataset.x_train[idx]), torch.from_numpy(setup.dataset.y_train[idx])
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        digests.append(tgddp.digest(module))
    print(json.dumps({"rank": rank, "digests": digests}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    import sys

    torchrun_main(sys.argv[1])
