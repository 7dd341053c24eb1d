"""Train a torch model with DistributedDataParallel and tgsim's comm hook, one worker per rank, and
end with the parameters tgsim's simulator computes for the same config, bit for bit.

    torchrun --nproc-per-node 2 examples/ddp_train.py --codec terngrad --steps 100 --out results/ddp
    mpiexec -n 2 python examples/ddp_train.py --codec terngrad --steps 100 --out results/ddp

Under torchrun (it sets RANK and MASTER_ADDR) tgsim's exchange runs over the Gloo process group DDP
uses (transport="torch"); under mpiexec over mpi4py (transport="mpi"), the process group only
starting DDP (a file store in a temporary directory rank 0 makes, or --store on a shared disk).
Every rank trains worker `rank` of the simulator: the module the factory builds under torch seed
[run] seed, the data set and shards of the config, the batches `tgsim.data.batch_indices(shard, B,
seed, step, rank)`, cross-entropy, TgsimOptimizer. OUT gets params.npz (rank 0's parameters) and
config.toml (the config this ran); the simulator's run of that config gives the same parameters:

    PYTHONPATH=examples tgsim run results/ddp/config.toml --out results/ddp-sim   # params.npz: the same bits

The model is examples/ddp_nets.py's (a user's module: two convolutions, a LayerNorm, a linear head),
on scikit-learn's digits. Nothing but torch's thread count is set here (one intra-op thread: the
simulator's per-worker bits).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import tomli_w
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_nets import digits_net
from tgsim.data import batch_indices, load, shard
from tgsim.torch import ddp as tgddp
from tgsim.train.config import from_dict, to_dict

FACTORY = "ddp_nets:digits_net"             # what the simulator imports (examples/ on PYTHONPATH)
# --codec -> ([codec], [exchange]) of the config
CODECS = {"terngrad": ({"name": "terngrad"}, {"mode": "ps"}),
          "qsgd": ({"name": "qsgd"}, {"mode": "ps"}),
          "powersgd": ({"name": "powersgd", "rank": 2}, {"mode": "allreduce"})}


def config(codec: str, steps: int, ranks: int, batch: int, width: int, seed: int, lr: float) -> dict:
    """The tgsim config of this run: `ranks` workers of `batch` samples each."""
    c, ex = CODECS[codec]
    return {"run": {"name": f"ddp-{codec}", "seed": seed, "steps": steps, "eval_every": 0},
            "data": {"name": "digits"},
            "model": {"name": "torch", "options": {"factory": FACTORY, "kwargs": {"width": width}}},
            "workers": {"n": ranks, "batch": batch, "batch_mode": "per_worker"},
            "codec": dict(c), "exchange": dict(ex),
            "optimizer": {"name": "momentum"}, "schedule": {"name": "constant", "lr": lr}}


def start(store: str | None) -> tuple[int, int, str, str | None]:
    """Start the Gloo process group: (rank, ranks, the hook's transport, a temporary store directory
    for rank 0 to remove at the end, or None)."""
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:       # torchrun (env://)
        dist.init_process_group("gloo")
        return dist.get_rank(), dist.get_world_size(), "torch", None
    from mpi4py import MPI                                          # mpiexec

    comm = MPI.COMM_WORLD
    rank, ranks = comm.Get_rank(), comm.Get_size()
    tmp = tempfile.mkdtemp(prefix="ddp-train-") if rank == 0 and not store else None
    store = comm.bcast(store or tmp, root=0)
    dist.init_process_group("gloo", init_method=f"file://{Path(store).resolve() / 'store'}", rank=rank,
                            world_size=ranks)
    return rank, ranks, "mpi", tmp


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--codec", default="terngrad", choices=sorted(CODECS))
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--width", type=int, default=8, help="the model's channels")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/ddp-digits", help="directory for params.npz and config.toml")
    p.add_argument("--store", help="(mpiexec) a directory for the process group's file store")
    p.add_argument("--tensorboard", metavar="DIR", help="rank 0 writes each step's bits up and down, skipped "
                   "flag, loss and rate as TensorBoard events into DIR (needs tgsim[tensorboard])")
    a = p.parse_args(argv)

    torch.set_num_threads(1)                 # the simulator's per-worker bits: one intra-op thread
    rank, ranks, transport, tmp = start(a.store)
    d = config(a.codec, a.steps, ranks, a.batch, a.width, a.seed, a.lr)
    cfg = from_dict(d)

    # the simulator's data: its data set, shards and worker `rank`'s batches
    data = load(cfg.data.name, seed=cfg.run.seed, **cfg.data.options)
    shards = shard(data.y_train, cfg.workers.n, scheme=cfg.data.sharding, alpha=cfg.data.alpha, seed=cfg.run.seed)
    # the simulator's initial parameters: the factory under torch seed [run] seed
    torch.manual_seed(cfg.run.seed)
    module = digits_net(dim=data.x_train.shape[1], classes=data.n_classes, width=a.width)

    state = tgddp.TgsimHookState.create(module, d, transport=transport)
    model = DDP(module)
    tgddp.register(model, state)
    opt = tgddp.TgsimOptimizer(state)
    log = None
    if a.tensorboard and rank == 0:
        from tgsim.train.tensorboard import HookLog
        log = HookLog(a.tensorboard, state)
    b = cfg.workers.per_worker_batch
    for step in range(cfg.run.steps):
        idx = batch_indices(shards[rank], b, cfg.run.seed, step, rank)
        x, y = torch.from_numpy(data.x_train[idx]), torch.from_numpy(data.y_train[idx])
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()                      # the hook: encode, exchange, decode
        opt.step()
        if log is not None:
            log.step(state, loss=loss.item(), lr=cfg.schedule.lr)
        if rank == 0 and (step + 1) % max(1, cfg.run.steps // 5) == 0:
            print(f"step {step + 1}/{cfg.run.steps}: loss {loss.item():.4f} (rank 0's batch)", flush=True)

    digests = [None] * ranks
    dist.all_gather_object(digests, tgddp.digest(module))
    if rank == 0:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / "params.npz", **{k: v.detach().numpy() for k, v in tgddp.named_parameters(module).items()})
        (out / "config.toml").write_text(tomli_w.dumps(to_dict(cfg)))
        same = len(set(digests)) == 1
        print(f"{ranks} ranks over {transport}, {a.codec}, {cfg.run.steps} steps: parameters sha256 {digests[0]}"
              + (" on every rank" if same else f"; RANKS DIFFER: {digests}"))
        print(f"wrote {out / 'params.npz'} and {out / 'config.toml'}; the simulator's run: "
              f"PYTHONPATH=examples tgsim run {out / 'config.toml'}")
    if log is not None:
        log.close()
    dist.barrier()
    del model, opt, state            # DDP and the hook's state hold the process group: free them first,
    gc.collect()                     # not at interpreter exit, where a Gloo thread may still be joinable
    dist.destroy_process_group()
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if len(set(digests)) == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
