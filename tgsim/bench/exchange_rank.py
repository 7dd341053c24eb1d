"""Per-step EXCHANGE time of fp32 and TernGrad over MPI, on synthetic gradients (no model compute).

    mpiexec -n N python -m tgsim.bench.exchange_rank --params 1e6,4e6,16e6 --out results/bench_raw.csv
    bash tgsim/bench/netem.sh --topology shared --rate 1gbit --ranks 4 -- --params 4e6 --out X.csv  # shaped

Usually started by `netem.sh` (package data of tgsim.bench: a private network namespace with a shaped
link, MPI forced onto TCP); `tgsim bench exchange` (tgsim.bench.exchange) drives the sweep and derives
speedups and byte ratios.

Each rank holds one synthetic gradient of P parameters split into AlexNet-shaped layers (5 conv + 3
fully-connected weight tensors and their biases, in AlexNet's proportions, so most bytes sit in two
large FC layers). Modes, each through `tgsim.exchange.mpi.MPIExchange` (the code the trainer runs):

  fp32_exact    ex.mean_fp32 with exact=True: Alltoallv + ordered float64 sums + Allgatherv
  fp32_native   ex.mean_fp32_native: MPI's own Allreduce(SUM) of float32 (the honest fp32 baseline)
  tg_allreduce  TernGrad, shared scalers, Allreduce(SUM) of int8 codes
  tg_ps         TernGrad, shared scalers, parameter server on rank 0 (point-to-point, MPIExchange's
                default): the slots and the packed sums cut into pieces of 2^18 elements (64 KiB of
                2-bit codes), the server sums and sends piece k while piece k+1 arrives
                (tgsim.exchange.pieces)
  tg_ps_whole   the same server not pipelined: every whole slot in, then the whole sum out (not in
                the default set)
  tg_allgather_whole  the all-gather not pipelined: one blocking MPI Allgather, then the sum (what CuPy
                buffers take; not in the default set)
  tg_ps_collective  the same server through MPI Gather + Bcast (MPICH's trees; not in the default set)
  tg_allgather  TernGrad, shared scalers, all-gather of the packed messages: pieces of 2^18 elements
                Isent to every other rank, piece k summed while later pieces arrive (MPIExchange's
                default for NumPy buffers)
  tg_sharded_ps TernGrad, shared scalers, the sharded parameter server (MPIExchange mode "sharded_ps",
                tgsim/exchange/sharded.py): every rank owns a contiguous 1/N of the T ternary elements
                (every layer of the bench is ternary: T = P); shard r's 2-bit codes go to rank r, the
                owner sums them and returns its sums packed at ceil(log2(2N+1)) bits to every rank.
                MPIExchange's default for NumPy buffers: pipelined, each shard in pieces of about
                `chunk` elements (Isend/Irecv, one u64 header per piece each way; mpi_pipelined
                `_sharded_pipelined`); bytes of rank r: sharded.shard_pieces(T, N, "2bit",
                chunk).code_bytes(r) + the scaler all-reduce
  tg_sharded_ps_whole  the same server not pipelined: one Alltoallv of the shards' blocks, the sums,
                one Allgatherv (what CuPy buffers take; not in the default set); bytes of rank r:
                sharded.shard_plan(T, N, "2bit").code_bytes(r) + the scaler all-reduce (equal to
                the pipelined count while every shard fits in one piece, T <= N chunk)

A TernGrad step is: pass 1 (codec.scaling) -> MAX all-reduce of the scalers (ex.max_scalers) ->
encode -> ex.terngrad (wire + server sum + decode). Steps of the modes are interleaved
(step i of every mode, then step i + 1: tgsim.bench.timing.rounds), so slow drifts of a shared
machine's load hit all modes alike. `--warmup` untimed rounds come first; with `--budget`, the last
of them is timed and sets the number of timed rounds.

Timing, per step and rank, with a Barrier before the step starts:
  t_step     the whole step (encode + scaler sharing + exchange + decode)
  t_encode   codec.scaling + codec.encode (TernGrad only); in the pipelined modes (tg_ps,
             tg_allgather) the codes are encoded piece by piece inside the exchange, as the trainer
             does over MPI (`DeferredMessage`), so that part of the encode is in t_exchange
  t_scalers  ex.max_scalers (one small Allreduce; absorbs waiting for the slowest rank's pass 1)
  t_exchange ex.terngrad / ex.mean_fp32*
  t_wire     time inside MPI collectives and waits for nonblocking transfers during t_exchange (a
             timing subclass of the communicator)
  t_decode   t_exchange - t_wire on the same rank: slot building, parsing, server sums, unpacking
The row holds, per component, the median over steps of the MAXIMUM over ranks (a synchronous step
ends when its last rank is done), except t_wire: the MINIMUM over ranks (the rank that entered the
collectives last waited least, so its time is closest to the pure transfer; in ps mode the workers'
Bcast also waits for the server's sums) -- t_wire_max is the maximum. t_step_min / t_step_max: the
fastest / slowest step.

Machine load: `ext_load` = runnable tasks that are not this job's ranks (/proc/loadavg's running
count minus N, sampled on rank 0 at the start and end of every timed step, mean): the benchmark
shares its cores with whatever else runs, and the CPU parts of a step slow down with it.

Bytes: `payload_total` = Σ over ranks of the bytes each rank sent (MPIExchange's CommBytes, counted
from the payloads: ring model for Allreduce, N-1 copies for the server's Bcast, the scaler Allreduce
included); `payload_max_link` = max over ranks of max(sent, received) (the busiest link of a switch);
`payload_sent_by_rank` / `payload_received_by_rank` = every rank's bytes, rank order, joined by ";"
(in ps mode, less the scaler all-reduce, rank 0's are N-1 times a worker's; in sharded_ps they are
`ShardPieces.code_bytes` -- `ShardPlan.code_bytes` not pipelined -- + the scaler all-reduce);
`payload_scalers` = the scaler all-reduce's bytes per rank and direction (ring model 2 (N-1)/N x
the float32 scalers, one per layer; 0 for the fp32 modes), included in every TernGrad mode's sent
and received; `chunk` = MPIExchange.chunk during the mode's steps (-1 in the _whole modes: not pipelined).
`wire_bytes` = bytes the kernel actually moved per step on the counted interface (/proc/self/net/dev
tx_bytes): `--count-scope node` reads one shared interface on rank 0 (lo of the shared topology);
`--count-scope rank` sums every rank's own interface (eth0 of the switch topology). It includes
TCP/IP and MPI headers, the per-step Barriers, and MPICH's actual collective algorithms (a binomial
Gather forwards slots through inner ranks, so it moves more than the payload count).
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from tgsim.bench.timing import rounds

MODES = ("fp32_exact", "fp32_native", "tg_allreduce", "tg_ps", "tg_allgather", "tg_ps_collective", "tg_ps_whole",
         "tg_allgather_whole", "tg_sharded_ps", "tg_sharded_ps_whole")
DEFAULT_MODES = MODES[:5] + ("tg_sharded_ps",)

# AlexNet (Krizhevsky et al. 2012, single-tower): weight and bias sizes per layer.
_ALEXNET = [("conv1", 34_848, 96), ("conv2", 307_200, 256), ("conv3", 884_736, 384),
            ("conv4", 663_552, 384), ("conv5", 442_368, 256), ("fc6", 37_748_736, 4096),
            ("fc7", 16_777_216, 4096), ("fc8", 4_096_000, 1000)]


def layer_sizes(params: int) -> list[tuple[str, int]]:
    """AlexNet's 16 tensors scaled to `params` elements in total (each at least 16 elements)."""
    total = sum(w + b for _, w, b in _ALEXNET)
    out = []
    for name, w, b in _ALEXNET:
        out.append((f"{name}.w", max(16, round(w * params / total))))
        out.append((f"{name}.b", max(16, round(b * params / total))))
    big = max(range(len(out)), key=lambda i: out[i][1])
    diff = params - sum(s for _, s in out)
    out[big] = (out[big][0], out[big][1] + diff)
    return out


def synthetic_gradient(params: int, rank: int, seed: int = 0) -> dict:
    """Float32 layers: Gaussian with a per-layer scale (like real gradients, layers differ in size)."""
    rng = np.random.default_rng([seed, rank])
    out = {}
    for i, (name, size) in enumerate(layer_sizes(params)):
        scale = np.float32(10.0 ** (-2 - (i % 4) * 0.5))
        out[name] = (rng.standard_normal(size, dtype=np.float32) * scale)
    return out


def _timed_comm_class(MPI):
    class TimedComm(MPI.Intracomm):
        """COMM_WORLD whose collectives add their wall time to `self.wire` (seconds)."""

        wire = 0.0

        def _t(self, fn, *a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.wire += time.perf_counter() - t0

        def Allreduce(self, *a, **k):
            return self._t(super().Allreduce, *a, **k)

        def Allgather(self, *a, **k):
            return self._t(super().Allgather, *a, **k)

        def Allgatherv(self, *a, **k):
            return self._t(super().Allgatherv, *a, **k)

        def Alltoallv(self, *a, **k):
            return self._t(super().Alltoallv, *a, **k)

        def Gather(self, *a, **k):
            return self._t(super().Gather, *a, **k)

        def Bcast(self, *a, **k):
            return self._t(super().Bcast, *a, **k)

        def Send(self, *a, **k):
            return self._t(super().Send, *a, **k)

        def Recv(self, *a, **k):
            return self._t(super().Recv, *a, **k)

    return TimedComm


def iface_tx_bytes(iface: str) -> int:
    """tx_bytes of `iface` in this process's network namespace (/proc/self/net/dev is per-netns)."""
    with open("/proc/self/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == iface:
                return int(rest.split()[8])
    raise RuntimeError(f"interface {iface!r} not found in /proc/self/net/dev")


def runnable_tasks() -> int:
    """Runnable tasks on the machine now (/proc/loadavg, 4th field "R/T"); -1 where unavailable."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return -1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mpiexec -n N python -m tgsim.bench.exchange_rank", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", default="1e6,4e6,16e6", help="comma-separated gradient sizes (elements)")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated subset of {','.join(MODES)}")
    p.add_argument("--steps", type=int, default=5, help="timed steps per mode and size")
    p.add_argument("--chunk", type=int, default=None,
                   help="elements per piece of the pipelined ps and allgather (default: MPIExchange's)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per mode and size (JIT, first touch)")
    p.add_argument("--budget", type=float, default=60.0,
                   help="seconds per size: if one warm-up round of all modes is slow, time fewer steps "
                        "(at least --min-steps); 0 = always --steps")
    p.add_argument("--min-steps", type=int, default=3)
    p.add_argument("--out", required=True, help="CSV to append rows to (rank 0 writes)")
    p.add_argument("--topology", default="none", help="label: shared | switch | none")
    p.add_argument("--rate", default="none", help="label: the shaped line rate, e.g. 1gbit")
    p.add_argument("--count-iface", default="lo", help="interface whose tx_bytes count the wire bytes")
    p.add_argument("--count-scope", choices=["node", "rank", "off"], default="node",
                   help="node: rank 0 reads one shared interface; rank: sum of every rank's own")
    p.add_argument("--bucket-mb", type=float, default=64.0, help="MPIExchange bucket size (MiB)")
    p.add_argument("--seed", type=int, default=0)
    return p


def _one_step(mode, ex, codec, grads, step, rank, comm):
    """Run one step of `mode`; returns (timings dict, CommBytes); the dict's "scaler_bytes" = the bytes
    of the scaler all-reduce included in the CommBytes (TernGrad modes only)."""
    from tgsim.exchange.base import ring_allreduce_bytes
    from tgsim.rng import StreamKey

    t = {}
    comm.wire = 0.0
    t0 = time.perf_counter()
    if mode == "fp32_exact":
        te = time.perf_counter()
        _, nb = ex.mean_fp32([grads])
        t["exchange"] = time.perf_counter() - te
        t["encode"] = t["scalers"] = 0.0
    elif mode == "fp32_native":
        te = time.perf_counter()
        _, nb = ex.mean_fp32_native([grads])
        t["exchange"] = time.perf_counter() - te
        t["encode"] = t["scalers"] = 0.0
    else:
        sc = codec.scaling(grads)
        local = codec.local_scalers(sc)[None, :]
        ta = time.perf_counter()
        shared = ex.max_scalers(local)
        tb = time.perf_counter()
        t["scaler_bytes"] = ring_allreduce_bytes(local[0].nbytes, comm.Get_size())   # as ex.max_scalers counts
        comm.wire = 0.0                      # the scaler Allreduce is `scalers`, not `wire`
        base = mode[3:].removesuffix("_collective").removesuffix("_whole")
        chunk = ex.chunk
        if mode == "tg_ps_collective":
            ex.ps_transport = "collective"
        elif mode.endswith("_whole"):
            ex.chunk = -1                    # not pipelined: whole-message Send/Recv, blocking Allgather
        try:
            msg = codec.encode(grads, StreamKey(1, step, rank), shared, sc,
                               deferred=ex.defers_encode(base, True, False))
            tc = time.perf_counter()
            _, nb = ex.aggregate(codec, [msg], base, True)
        finally:
            ex.ps_transport, ex.chunk = "p2p", chunk
        td = time.perf_counter()
        t["encode"] = (ta - t0) + (tc - tb)
        t["scalers"] = tb - ta
        t["exchange"] = td - tc
    t["step"] = time.perf_counter() - t0
    t["wire"] = comm.wire
    t["decode"] = max(0.0, t["exchange"] - t["wire"])
    return t, nb


COMPONENTS = ("step", "encode", "scalers", "exchange", "wire", "decode")


class _ModeSteps:
    """One step of `mode` per call, a variant of tgsim.bench.timing.rounds: step = the call's index
    (its round), a Barrier on each side, the interface counter read outside them, the run queue
    (rank 0) read just around the step. From call `warmup` on it records the step's COMPONENTS, the
    counted wire bytes and the external load; `last_bytes` = (sent, received) of the last call."""

    def __init__(self, mode, ex, codec, grads, comm, read_counter, warmup: int):
        self.mode, self.ex, self.codec, self.grads, self.comm = mode, ex, codec, grads, comm
        self.read_counter, self.warmup = read_counter, warmup
        self.calls, self.components, self.wire_bytes, self.load, self.last_bytes = 0, [], 0, [], None
        self.scaler_bytes = 0.0

    def __call__(self) -> None:
        comm, rank, n = self.comm, self.comm.Get_rank(), self.comm.Get_size()
        step, self.calls = self.calls, self.calls + 1
        c0 = self.read_counter()
        comm.Barrier()
        r0 = runnable_tasks() if rank == 0 else 0
        t, nb = _one_step(self.mode, self.ex, self.codec, self.grads, step, rank, comm)
        r1 = runnable_tasks() if rank == 0 else 0
        comm.Barrier()
        c1 = self.read_counter()
        if step >= self.warmup:
            self.components.append([t[k] for k in COMPONENTS])
            self.wire_bytes += c1 - c0
            if rank == 0 and r0 >= 0 and r1 >= 0:     # our n ranks are runnable (busy-polling MPI)
                self.load += [max(0, r0 - n), max(0, r1 - n)]
        self.last_bytes = (nb.sent, nb.received)
        self.scaler_bytes = float(t.get("scaler_bytes", 0.0))


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from mpi4py import MPI

    from tgsim.codecs.terngrad import TernGrad
    from tgsim.exchange.mpi import MPIExchange

    TimedComm = _timed_comm_class(MPI)
    comm = TimedComm(MPI.COMM_WORLD)
    rank, n = comm.Get_rank(), comm.Get_size()
    ex = MPIExchange(comm, exact=True, bucket_bytes=int(args.bucket_mb * 2**20), gpu=False)
    if args.chunk is not None:
        ex.chunk = args.chunk
    wait = ex._waitall                 # the pipelined server's nonblocking transfers count as wire too
    ex._waitall = lambda requests: comm._t(wait, requests)
    codec = TernGrad()               # 2-bit packing, no clipping, every layer ternary (min_size 0)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"unknown modes {bad}; choose from {MODES}")
    sizes = [int(float(s)) for s in args.params.split(",") if s]

    def read_counter() -> int:
        if args.count_scope == "off":
            return 0
        if args.count_scope == "node":
            return iface_tx_bytes(args.count_iface) if rank == 0 else 0
        return iface_tx_bytes(args.count_iface)

    rows = []
    for params in sizes:
        grads = synthetic_gradient(params, rank, args.seed)
        steppers = {m: _ModeSteps(m, ex, codec, grads, comm, read_counter, args.warmup) for m in modes}
        steps = args.steps
        if args.warmup > 0 and args.budget > 0:       # fewer timed steps where a round is slow
            last_warmup = rounds(steppers, 1, warmup=args.warmup - 1)
            t_round = comm.bcast(sum(float(t.seconds.sum()) for t in last_warmup.values()), root=0)
            steps = int(min(args.steps, max(args.min_steps, args.budget // max(t_round, 1e-9))))
            rounds(steppers, steps, warmup=0)
        else:
            rounds(steppers, steps, warmup=args.warmup)
        for mode, stepper in steppers.items():
            mine = np.asarray(stepper.components, dtype=np.float64)        # (steps, components)
            allr = comm.gather(mine, root=0)
            sent_recv = comm.gather(stepper.last_bytes, root=0)
            wb = comm.reduce(stepper.wire_bytes, op=MPI.SUM, root=0)
            if rank != 0:
                continue
            arr = np.stack(allr)                                          # (ranks, steps, comps)
            worst = arr.max(axis=0)                                       # (steps, comps)
            med = np.median(worst, axis=0)
            iw = COMPONENTS.index("wire")
            wire_min = np.median(arr[:, :, iw].min(axis=0))               # the rank that waited least
            sent = np.array([s for s, _ in sent_recv], dtype=np.float64)
            recv = np.array([r for _, r in sent_recv], dtype=np.float64)
            row = {"topology": args.topology, "rate": args.rate, "ranks": n, "params": params,
                   "layers": len(grads), "mode": mode, "steps": steps,
                   "chunk": -1 if mode.endswith("_whole") else ex.chunk}
            for k, v in zip(COMPONENTS, med):
                row[f"t_{k}"] = float(v)
            row["t_wire_max"], row["t_wire"] = row["t_wire"], float(wire_min)
            row["t_step_min"] = float(worst[:, 0].min())
            row["t_step_max"] = float(worst[:, 0].max())
            row["payload_total"] = float(sent.sum())
            row["payload_max_link"] = float(np.maximum(sent, recv).max())
            row["payload_rank0_sent"] = float(sent[0])
            row["payload_rank0_received"] = float(recv[0])
            row["payload_sent_by_rank"] = ";".join(f"{v:.15g}" for v in sent)
            row["payload_received_by_rank"] = ";".join(f"{v:.15g}" for v in recv)
            row["payload_scalers"] = stepper.scaler_bytes
            row["wire_bytes"] = float(wb) / steps if args.count_scope != "off" else float("nan")
            row["count_iface"] = args.count_iface if args.count_scope != "off" else ""
            row["cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
            row["ext_load"] = float(np.mean(stepper.load)) if stepper.load else float("nan")
            row["loadavg"] = os.getloadavg()[0]
            row["host"] = platform.node()
            row["time"] = time.strftime("%Y-%m-%dT%H:%M:%S")
            rows.append(row)
            print(f"[bench] {args.topology} {args.rate} N={n} P={params:.3g} {mode:13s} "
                  f"step {row['t_step']*1e3:9.2f} ms  wire {row['t_wire']*1e3:9.2f} ms  "
                  f"encode {row['t_encode']*1e3:7.2f} ms  decode {row['t_decode']*1e3:7.2f} ms  "
                  f"payload {row['payload_total']/1e6:8.2f} MB  on wire {row['wire_bytes']/1e6:8.2f} MB",
                  flush=True)
        del grads, steppers
    if rank == 0 and rows:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        new = not out.exists() or out.stat().st_size == 0
        with open(out, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            if new:
                w.writeheader()
            w.writerows(rows)
    comm.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
