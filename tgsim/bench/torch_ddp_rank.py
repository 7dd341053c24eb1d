"""One rank of `tgsim bench torch`: DDP over Gloo on the CPU, each variant's training step timed in
interleaved rounds, the medians written by rank 0 as one CSV row per variant.

    mpiexec -n N python -m tgsim.bench.torch_ddp_rank --store DIR --out RAW.csv [--variants ...]
        [--steps S] [--warmup W] [--batch B] [--width C] [--input digits|cifar10] [--rate none|1gbit|...]
        [--model package.module:function [--input-shape 1,8,8] [--classes K]]

Every variant trains its own copy of the example ResNet (`tgsim.torch.examples.resnet`, 10 classes;
the same initial parameters on every rank) with torch.optim.SGD (lr 0.05, the same optimizer
arithmetic for every variant), each rank on its own B images per step (a NumPy generator keyed by
(seed, step, rank)). The images (`INPUTS`): "digits", scikit-learn's digits (one 8 x 8 channel);
"cifar10", tensors of CIFAR-10's shape (three 32 x 32 channels) drawn from N(0, 1) by the same
generator (nothing downloaded: the arithmetic of a convolutional network does not depend on the
pixel values): 16 times the digits' pixels, so about 16 times the backward work for nearly the same
parameters (only the stem takes three channels).
Your own model (`--model package.module:function`, the factory form of a config's [model] options):
the module `tgsim.models.make_model("torch", factory=..., dim=..., classes=..., feature_shape=...)`
builds under torch seed SEED (the factory receives dim, classes and feature_shape where its
signature names them), instead of the ResNet; its inputs are tensors of `--input-shape` (default:
the --input's flat vector, as tgsim's data sets give digits) drawn from N(0, 1) and labels uniform in
[0, --classes), by the same generator.
Variants (`VARIANTS`):

  local          the module alone, no DDP (no communication): the backward pass's own time
  ddp_allreduce  DDP's default: Gloo all-reduce of each float32 bucket (no hook)
  ddp_fp16       DDP with torch's `default_hooks.fp16_compress_hook` (float16 all-reduce)
  tgsim_*        DDP with tgsim's comm hook (`tgsim.torch.ddp`), the codec and exchange of `TGSIM`:
                 the hook's own exchange runs over mpi4py's COMM_WORLD

A round runs every variant once, in an order rotated by one each round (no variant always first),
each step after an MPI barrier: t_forward (zero_grad, forward, loss), t_backward (loss.backward(),
which for DDP includes waiting for its communication), t_optimizer (SGD step), t_step their sum;
t_hook the seconds spent inside the tgsim hook's calls of the step (handing each bucket over, and at
the last one the step's encode, exchange and decode that the hook's worker thread had not finished,
or the whole tgsim step for a whole-step codec: tgsim.torch.ddp), nan for the others; t_comm the
seconds inside the exchange's mpi4py calls (`TimedComm`: the transfers and the waits for the other
ranks), made on the hook's worker thread where it exchanges per bucket: with one DDP bucket (the
default cap and a model under 1 MiB) a part of t_hook, with several partly overlapping the backward
pass. Per round every rank's numbers are gathered; a
round's t_forward, t_backward and t_optimizer are the max over ranks (the step ends for all when
the slowest rank ends), its t_hook the min over ranks (the hook's exchange is a collective: a rank
that reaches it first also waits there for the others' backward passes; the last to arrive waits
for no one), t_hook_codec the max over ranks of t_hook - t_comm (the hook's own computing: checks,
encode, decode, copies; the parameter server's rank does the most), t_hook_comm the min over ranks
of t_comm. The row holds the median over the timed rounds, the min and max of t_step, t_backward
and t_hook (their spread), and bits per step per rank: for tgsim counted (8 x the hook's sent
bytes, mean and max over ranks); for DDP's own a model, bits x P x 2 (N - 1) / N (ring
all-reduce: a rank sends 2 (N - 1) / N of the buffer; bits 32 for float32, 16 for fp16), marked
bits_source.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

import numpy as np

SEED = 0
CLASSES = 10
# input name -> (features, channels) of the ResNet's flat images; DIGITS the default
INPUTS = {"digits": (64, 1), "cifar10": (3 * 32 * 32, 3)}
DIGITS = "digits"
LR = 0.05
# name -> ([codec], [exchange]) of the tgsim hook's config: the default TernGrad config (rank 0's
# parameter server), TernGrad's integer all-reduce of the codes, the sharded parameter server, and
# float32 through the hook as a control
TGSIM = {
    "tgsim_terngrad": ({"name": "terngrad"}, {}),
    "tgsim_terngrad_allreduce": ({"name": "terngrad"}, {"mode": "allreduce"}),
    "tgsim_terngrad_sharded": ({"name": "terngrad"}, {"mode": "sharded_ps"}),
    "tgsim_fp32": ({"name": "fp32"}, {}),
}
VARIANTS = ("local", "ddp_allreduce", "ddp_fp16", *TGSIM)
RESNET = "tgsim.torch.examples:resnet"
COLUMNS = ["rate", "variant", "model", "ranks", "params", "batch", "width", "input", "dim", "channels", "steps",
           "t_step", "t_forward", "t_backward", "t_optimizer", "t_hook", "t_step_min", "t_step_max", "t_hook_min",
           "t_hook_max", "t_hook_codec", "t_hook_comm", "t_backward_min", "t_backward_max", "bits_per_step", "bits_per_step_max",
           "bits_source", "loadavg", "cores"]


def hook_config(variant: str, ranks: int, batch: int, width: int, image: str = DIGITS,
                model: dict | None = None) -> dict:
    """The tgsim config of a tgsim_* variant (the hook reads [run], [workers], [codec], [exchange]);
    `model`: the [model] options of a user's model (`model_options`), else the ResNet's."""
    codec, exchange = TGSIM[variant]
    dim, channels = INPUTS[image]
    options = model or {"factory": RESNET, "kwargs": {"width": width, "dim": dim, "channels": channels}}
    return {"run": {"name": "bench-torch", "seed": SEED, "steps": 1_000_000},
            "data": {"name": "digits"},
            "model": {"name": "torch", "options": dict(options)},
            "workers": {"n": ranks, "batch": batch, "batch_mode": "per_worker"},
            "codec": dict(codec), "exchange": dict(exchange),
            "optimizer": {"name": "sgd"}, "schedule": {"name": "constant", "lr": LR}}


def parse_shape(text: str) -> tuple[int, ...]:
    """"1,8,8" -> (1, 8, 8); ValueError unless it is positive integers separated by commas."""
    try:
        shape = tuple(int(d) for d in str(text).replace("x", ",").split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise ValueError(f"an input shape is positive integers separated by commas (1,8,8), got {text!r}")
    return shape


def model_options(spec: str, shape: tuple, classes: int) -> dict:
    """The [model] options (and make_model's arguments) of a user's model `spec` on samples of `shape`."""
    return {"factory": spec, "dim": int(np.prod(shape)), "classes": int(classes), "feature_shape": tuple(shape)}


def build_model(options: dict):
    """The user's module: TorchModel's build from its factory under torch seed SEED (the same on every
    rank); ValueError for a factory that does not resolve or a module tgsim cannot train."""
    from tgsim.models import make_model

    return make_model("torch", **options).build(SEED)


def digits():
    """scikit-learn's digits as float32 (pixels / 16) and int64 labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)


class Variant:
    """One variant's module, DDP wrapper, optimizer and per-step timings of this rank."""

    def __init__(self, name: str, torch, ranks: int, batch: int, width: int, image: str = DIGITS,
                 model: dict | None = None):
        from torch.nn.parallel import DistributedDataParallel as DDP

        from tgsim.torch import ddp as tgddp
        from tgsim.torch.examples import resnet

        self.name, self.torch = name, torch
        torch.manual_seed(SEED)
        dim, channels = INPUTS[image]
        module = build_model(model) if model else resnet(dim, CLASSES, width=width, channels=channels)
        self.params = sum(p.numel() for p in module.parameters())
        self.state = None
        self.hook_seconds = self.comm_seconds = 0.0
        if name == "local":
            self.model = module
        else:
            if name.startswith("tgsim_"):
                self.state = tgddp.TgsimHookState.create(module, hook_config(name, ranks, batch, width, image,
                                                                             model))
                self.state.exchange.comm = TimedComm(self.state.exchange.comm, self)
            self.model = DDP(module)
            if name == "ddp_fp16":
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

                self.model.register_comm_hook(None, default_hooks.fp16_compress_hook)
            elif self.state is not None:
                tgddp.register(self.model, self.state, self._timed_hook())
        self.opt = torch.optim.SGD(module.parameters(), lr=LR)
        self.rows: list[tuple] = []

    def _timed_hook(self):
        from tgsim.torch import ddp as tgddp

        def hook(state, bucket):
            t0 = time.perf_counter()
            try:
                return tgddp.tgsim_hook(state, bucket)
            finally:
                self.hook_seconds += time.perf_counter() - t0

        return hook

    def step(self, x, y) -> tuple:
        """One training step; (t_forward, t_backward, t_optimizer, t_hook, bytes sent by the hook, t_comm)."""
        torch = self.torch
        sent0 = self.state.sent if self.state is not None else 0.0
        self.hook_seconds = self.comm_seconds = 0.0
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        self.opt.step()
        t3 = time.perf_counter()
        hook = self.hook_seconds if self.state is not None else float("nan")
        sent = (self.state.sent - sent0) if self.state is not None else float("nan")
        comm = self.comm_seconds if self.state is not None else float("nan")
        return t1 - t0, t2 - t1, t3 - t2, hook, sent, comm


class TimedComm:
    """An mpi4py communicator whose method calls add their seconds to `owner.comm_seconds` (every
    other attribute passes through): what the hook's exchange spends in MPI, waits included."""

    def __init__(self, comm, owner):
        self._comm, self._owner = comm, owner

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if not callable(attr):
            return attr

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self._owner.comm_seconds += time.perf_counter() - t0

        return timed


def model_bits(variant: str, params: int, ranks: int) -> float:
    """Bits one rank sends per step under DDP's own all-reduce, as a ring: bits x P x 2 (N - 1) / N."""
    bits = {"ddp_allreduce": 32, "ddp_fp16": 16}.get(variant)
    if bits is None:
        return 0.0 if variant == "local" else float("nan")
    return float(bits * params * 2 * (ranks - 1) / ranks)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tgsim.bench.torch_ddp_rank", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", required=True, help="a directory for the process group's file store")
    p.add_argument("--out", required=True, help="raw CSV (rank 0 appends one row per variant)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--steps", type=int, default=20, help="timed rounds")
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds first (DDP rebuilds its buckets at step 1)")
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--width", type=int, default=16, help="the ResNet's width")
    p.add_argument("--input", default=DIGITS, choices=sorted(INPUTS), help="the images (module docstring)")
    p.add_argument("--model", help="package.module:function: your model instead of the ResNet (module docstring)")
    p.add_argument("--input-shape", help="(--model) one sample's shape, e.g. 1,8,8 (default: the --input's flat "
                   "vector)")
    p.add_argument("--classes", type=int, default=CLASSES, help="(--model) the number of classes")
    p.add_argument("--rate", default="none", help="the shaping of the loopback (a label for the rows)")
    a = p.parse_args(argv)
    variants = [v for v in a.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        p.error(f"unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}")

    model = None
    if a.model:
        shape = parse_shape(a.input_shape) if a.input_shape else (INPUTS[a.input][0],)
        model = model_options(a.model, shape, a.classes)
    elif a.input_shape:
        p.error("--input-shape is for --model (the ResNet takes --input)")

    from mpi4py import MPI

    import torch
    import torch.distributed as dist

    from tgsim.bench import timing

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = Path(a.store) / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    x_all, y_all = digits()
    dim, channels = INPUTS[a.input]
    runs = [Variant(v, torch, size, a.batch, a.width, a.input, model) for v in variants]
    if model:
        dim, channels = model["dim"], (model["feature_shape"][0] if len(model["feature_shape"]) > 1 else 1)
    times = {v.name: [] for v in runs}
    for r in range(a.warmup + a.steps):
        rng = np.random.default_rng([SEED, r, rank])
        if model:
            x = torch.from_numpy(rng.standard_normal((a.batch, *model["feature_shape"]), dtype=np.float32))
            y = torch.from_numpy(rng.integers(0, model["classes"], a.batch))
        elif a.input == DIGITS:
            idx = rng.choice(len(x_all), a.batch, replace=False)
            x, y = torch.from_numpy(x_all[idx]), torch.from_numpy(y_all[idx])
        else:
            x = torch.from_numpy(rng.standard_normal((a.batch, dim), dtype=np.float32))
            y = torch.from_numpy(rng.integers(0, CLASSES, a.batch))
        k = r % len(runs)
        for v in runs[k:] + runs[:k]:
            comm.Barrier()
            got = v.step(x, y)
            if r >= a.warmup:
                times[v.name].append(got)
    everyone = comm.gather(times, root=0)
    load = timing.load_average()
    if rank == 0:
        rows = []
        for v in runs:
            t = np.array([e[v.name] for e in everyone], dtype=np.float64)    # (ranks, steps, 6)
            fwd, bwd, opt = t[:, :, :3].max(axis=0).T                         # per round: the slowest rank
            hook = t[:, :, 3].min(axis=0)                                     # the rank that waited least
            codec = (t[:, :, 3] - t[:, :, 5]).max(axis=0)                     # the busiest rank's own work
            comm = t[:, :, 5].min(axis=0)
            step = fwd + bwd + opt
            sent = t[:, :, 4]
            counted = v.state is not None
            bits = 8 * sent.mean() if counted else model_bits(v.name, v.params, size)
            bits_max = 8 * sent.mean(axis=1).max() if counted else bits
            rows.append({"rate": a.rate, "variant": v.name, "model": a.model or RESNET, "ranks": size,
                         "params": v.params, "batch": a.batch, "width": "" if model else a.width,
                         "input": "x".join(map(str, model["feature_shape"])) if model else a.input, "dim": dim,
                         "channels": channels, "steps": a.steps,
                         "t_step": np.median(step),
                         "t_forward": np.median(fwd), "t_backward": np.median(bwd), "t_optimizer": np.median(opt),
                         "t_hook": np.median(hook), "t_step_min": step.min(), "t_step_max": step.max(),
                         "t_hook_min": np.min(hook), "t_hook_max": np.max(hook),
                         "t_hook_codec": np.median(codec), "t_hook_comm": np.median(comm), "t_backward_min": bwd.min(),
                         "t_backward_max": bwd.max(), "bits_per_step": bits, "bits_per_step_max": bits_max,
                         "bits_source": "counted" if counted else "model", "loadavg": load,
                         "cores": timing.core_count()})
        out = Path(a.out)
        new = not out.exists()
        with out.open("a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            if new:
                w.writeheader()
            w.writerows(rows)
        print(f"[bench torch] rate={a.rate} N={size}: {len(rows)} variants x {a.steps} rounds -> {out}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)
