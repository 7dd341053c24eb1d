"""The script every rank of tests/test_torch_ddp.py's mpiexec job runs: torch DDP over Gloo with tgsim's
comm hook (tgsim.torch.ddp), one case after another, results in OUT/results.json (rank 0).

    mpiexec -n 2 python tests/torch_ddp_driver.py CASES.json OUT [--transport torch]

CASES.json: {"train": {name: {"config": tgsim config dict, "steps": k, "bucket_cap_mb": c,
"bucket_view": bool, "static_graph": bool, "no_sync": bool, "defect": null | "bucket_index" |
"no_residual"}}, and optionally "mismatch"
and "nan": a config dict each, for the checks below. Per training case: the sha256 of the
parameters (name order) after every step on every rank, the bucket count of every step, whether the
hook runs per bucket and, per step, whether its exchange was entered before DDP handed over the last
bucket ("early": per bucket, the last bucket's handover waits up to 30 s for it), the final
parameters (rank 0, OUT/NAME.npz).
Each rank trains worker `rank` of the simulator: the module TorchModel builds from the config's
factory and seed, the batches `tgsim.data.batch_indices(shard, B, seed, step, rank)`, cross-entropy.
With "no_sync", each step's first half batch runs under `model.no_sync()` (accumulated in .grad,
no hook), the second half with the hook; at step 0 an optimizer step between them must be refused
(its message in "refused"). The planted defects (positive controls of the test): "bucket_index"
keys the layers by (bucket index, position) with the names of the first step's buckets;
"no_residual" zeroes error feedback's residuals after every step. Then the checks: a hook with a
misnamed argument (tgsim's register and DDP's own message), ranks whose modules differ (rank 1 one
hidden unit wider), NaN gradients (the exception each rank's backward pass raises).
A case whose config says [run] backend = "cupy" runs on the GPU: the module on GPU `rank % GPUs`,
the batches moved there (tests/test_torch_gpu.py). With `--transport torch` the hook's exchange runs over the Gloo process group DDP uses
(`TgsimHookState.create(..., transport="torch")`, tgsim/torch/dist_comm.py) instead of mpi4py, and
CASES.json may hold "exchanges": [names], only those MPIExchange checks of dist_comm_cases, or
"comm": true: every TorchDistComm call, and MPIExchange over it, against mpi4py's
on the same inputs, and the GPU test's checks on NumPy buffers (tests/dist_comm_cases.py), results
under "comm", "exchange" and "device".
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
import threading
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

from tgsim.data import batch_indices
from tgsim.torch import ddp as tgddp
from tgsim.train.config import from_dict
from tgsim.train.loop import build


class BucketIndexState(tgddp.TgsimHookState):
    """Planted defect: layers keyed by (bucket index, position), named as in the first step's buckets."""

    def bucket_grads(self, bucket):
        if not hasattr(self, "by_index"):
            self.by_index = {}
        return {self.by_index.setdefault((bucket.index(), i), self.name_of(p)): g
                for i, (p, g) in enumerate(zip(bucket.parameters(), bucket.gradients()))}


DEFECTS = {None: tgddp.TgsimHookState, "bucket_index": BucketIndexState, "no_residual": tgddp.TgsimHookState}


TRANSPORT = "torch" if sys.argv[3:5] == ["--transport", "torch"] else "mpi"


def train_case(case: dict, rank: int, out: Path, name: str) -> dict:
    d = case["config"]
    cfg = from_dict(d)
    setup = build(cfg)                                   # the simulator's data set, shards and TorchModel
    module = setup.model.build(cfg.run.seed)
    device = torch.device("cpu")
    if cfg.run.backend == "cupy":                        # the GPU form: the module on this rank's GPU
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        module = module.to(device)
    state = DEFECTS[case.get("defect")].create(module, d, transport=TRANSPORT)
    model = DDP(module, bucket_cap_mb=case["bucket_cap_mb"], gradient_as_bucket_view=case["bucket_view"],
                static_graph=case.get("static_graph", False))
    buckets: list[int] = []
    early: list[bool] = []                   # per step: an exchange entered before the last bucket came
    entered = threading.Event()
    aggregate = state.exchange.aggregate

    def watched(*args, **kwargs):
        entered.set()
        return aggregate(*args, **kwargs)

    state.exchange.aggregate = watched

    def hook(state, bucket):
        if bucket.is_last():
            buckets.append(bucket.index() + 1)
            early.append(entered.wait(30) if state.per_bucket and bucket.index() > 0 else entered.is_set())
        fut = tgddp.tgsim_hook(state, bucket)
        if bucket.is_last():
            entered.clear()
            if case.get("defect") == "no_residual":          # planted defect: the residuals zeroed every step
                for v in state.codec_state.values():
                    v[...] = 0
        return fut

    tgddp.register(model, state, hook)
    opt = tgddp.TgsimOptimizer(state)
    b = cfg.workers.per_worker_batch
    digests, error, refused = [], None, None
    for step in range(case["steps"]):
        idx = batch_indices(setup.shards[rank], b, cfg.run.seed, step, rank)
        x = torch.from_numpy(setup.dataset.x_train[idx]).to(device)
        y = torch.from_numpy(setup.dataset.y_train[idx]).to(device)
        opt.zero_grad()
        try:
            if case.get("no_sync"):
                with model.no_sync():                    # the first half accumulates in .grad, no hook
                    torch.nn.functional.cross_entropy(model(x[: b // 2]), y[: b // 2]).backward()
                if step == 0:
                    try:
                        opt.step()
                        refused = None
                    except ValueError as e:
                        refused = str(e)
                x, y = x[b // 2:], y[b // 2:]
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        except Exception as e:  # noqa: BLE001  (a planted defect may stop the case)
            error = f"step {step}: {type(e).__name__}: {e}"
            break
        digests.append(tgddp.digest(module))
    if rank == 0:
        np.savez(out / f"{name}.npz", **{k: p.detach().cpu().numpy() for k, p in tgddp.named_parameters(module).items()})
    threaded = state.per_bucket and state.buckets.pool is not None
    return {"digests": digests, "buckets": buckets, "early": early, "per_bucket": state.per_bucket,
            "threaded": threaded, "sent": state.sent, "error": error, "hook_steps": state.step,
            "refused": refused, "comm": type(state.exchange.comm).__module__}


def misnamed(d: dict) -> dict:
    module = build(from_dict(d)).model.build(0)
    state = tgddp.TgsimHookState.create(module, d, transport=TRANSPORT)
    model = DDP(module)

    def bad_hook(state, grads):
        return tgddp.tgsim_hook(state, grads)

    msgs = {}
    for how, call in (("tgsim", lambda: tgddp.register(model, state, bad_hook)),
                      ("ddp", lambda: model.register_comm_hook(state, bad_hook))):
        try:
            call()
            msgs[how] = None
        except Exception as e:  # noqa: BLE001
            msgs[how] = f"{type(e).__name__}: {e}"
    return msgs


def mismatch(d: dict, rank: int) -> str | None:
    """Rank 1's module one hidden unit wider than rank 0's, under the same config."""
    model = build(from_dict(d)).model
    kwargs = dict(model.kwargs, hidden=[h + (rank == 1) for h in model.kwargs["hidden"]])
    module = dataclasses.replace(model, kwargs=kwargs).build(0)
    try:
        tgddp.TgsimHookState.create(module, d, transport=TRANSPORT)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


def nan_case(d: dict, rank: int) -> str | None:
    cfg = from_dict(d)
    module = build(cfg).model.build(0)
    state = tgddp.TgsimHookState.create(module, d, transport=TRANSPORT)
    model = DDP(module)
    tgddp.register(model, state)
    x = torch.full((4, 40), float("nan") if rank == 1 else 0.0)
    try:
        torch.nn.functional.cross_entropy(model(x), torch.zeros(4, dtype=torch.int64)).backward()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


def main() -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    out = Path(sys.argv[2])
    cases = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    if sys.platform == "linux":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")     # Gloo over loopback, whatever the hostname says
    dist.init_process_group("gloo", init_method=f"file://{out / 'store'}", rank=rank, world_size=size)
    res = {"train": {}, "rank": rank}
    for name, case in cases["train"].items():
        res["train"][name] = train_case(case, rank, out, name)
    if "mismatch" in cases:
        res["misnamed"] = misnamed(cases["mismatch"])
        res["mismatch"] = mismatch(cases["mismatch"], rank)
    if "nan" in cases:
        res["nan"] = nan_case(cases["nan"], rank)
    if cases.get("comm"):
        from dist_comm_cases import comm_checks, device_checks, exchange_checks

        res["comm"] = comm_checks(comm)
        res["exchange"] = exchange_checks(comm)
        res["device"] = device_checks(np)
    elif cases.get("exchanges"):        # only these MPIExchange checks (e.g. at 3 ranks)
        from dist_comm_cases import exchange_checks

        res["exchange"] = exchange_checks(comm, only=cases["exchanges"])
    everyone = comm.gather(res, root=0)
    if rank == 0:
        (out / "results.json").write_text(json.dumps(everyone))
    gc.collect()    # the cases' DDP modules sit in reference cycles that hold the process group: freed here,
    dist.destroy_process_group()    # not at interpreter exit, where the process sometimes aborted
                                    # ("terminate called without an active exception")


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
