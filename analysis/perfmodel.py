"""Performance model of synchronous data-parallel training with a gradient codec (TernGrad Fig. 5).

Two uses, one set of byte formulas:

1. Training throughput (the shape of TernGrad Fig. 5)
       df = fig5()                                   # tidy: net, cluster, gpus, codec, throughput, ...
       df = throughput_table(["alexnet"], gpus=[1, 8, 64], clusters=["ethernet"], exchange=Exchange("ring"))
       gain_table(df)                                # TernGrad / fp32 throughput per (net, cluster, gpus)
   One iteration of a worker (one GPU): forward F, then backward layer by layer from the LAST layer;
   layer l's gradient is ready when the backward pass has gone through it (backward time split in
   proportion to the layers' forward MACs, `perfmodel_nets`). With `overlap=True` (wait-free
   backprop) its message is encoded and sent as soon as it is ready, in that order, while backward
   continues; the exchange is a two-stage pipeline (uplink, downlink: full-duplex links of a switch)
   or one stage (a shared medium, or an all-reduce that uses both directions at once). The iteration
   ends when the last layer's aggregate has arrived: F + max(backward, exchange end). With
   overlap=False: F + backward + every message in turn. Throughput = gpus x batch / iteration.

   Exchange patterns (`Exchange.pattern`), for a message of S bytes per worker, G workers (GPUs),
   g GPUs per node sharing one NIC of bandwidth B (bits/s) at efficiency eta, latency a per message:
     ps         M dedicated server shards, each on its own NIC; every layer is split evenly across
                them (servers=0: M = number of worker nodes, a PS that grows with the cluster). Uplink max(g*S_up, G*S_up/M) / (eta B) + a; downlink the same with S_down.
                TernGrad: S_up = 2-bit codes + 4-byte scaler; S_down = ceil(log2(2G+1)) bits per
                element + scaler (the server's exact sum, docs/THEORY.md §1), or 2 bits with
                downlink="reternarize"; fp32: 4 bytes per element both ways.
     ring       flat ring all-reduce over the G GPUs: 2(G-1)/G * S / (eta B) + 2(G-1) a, on the NIC when
                the GPUs span nodes, on the intra-node link (PCIe / NVLink) when they fit in one node.
                TernGrad: S = 1 byte per element (int8 sum of codes; int16 beyond 127 workers).
     allgather  ring all-gather of every worker's packed message: (G-1) * S / (eta B) + (G-1) a.
   On a shared medium (`Network.medium == "shared"`: one segment/hub, or the emulation's shaped
   loopback) every byte of every worker crosses the one medium: ps G(S_up + S_down), ring 2(G-1)S,
   allgather G(G-1)S, divided by eta B.

   Clusters (`CLUSTERS`, the two of Fig. 5 as the paper describes them): "ethernet" = 1 Gb/s
   Ethernet, nodes of 4 GTX 1080 on a PCIe switch; "infiniband" = 100 Gb/s InfiniBand, nodes of 4
   P100 with NVLink. Latencies 50 us (TCP over Ethernet) and 2 us (IB verbs) per message, efficiency
   0.9 (protocol headers and flow control): ASSUMPTIONS, change them per call.
   Default exchange: `Exchange("ps", servers=1)` -- docs/THEORY.md §1's single parameter server; pass
   servers=M for a sharded one. The per-GPU compute time and batch come from `perfmodel_nets`.

2. The emulated network of `tgsim bench exchange` (Part A), for validation
       table = validate("results/bench_exchange.csv")       # every row: predicted vs measured
       validation_summary(table)                             # share within 20%, per topology/rate/mode
   `predict_components` predicts one bench row (topology, rate, N, P, mode), each component as
   the bench measures it (o = max(1, (N + L) / cores): N busy-polling ranks plus L other runnable
   tasks, the bench's `ext_load`, on `cores` cores):
       t_step    = t_encode + log2(N) x round latency + wire + t_decode   (wire: the step's
                   critical path; the bench's components are maxima over ranks, and its t_scalers
                   also holds the wait for the slowest rank's encode, which t_encode already has,
                   so on the step's path the scaler all-reduce costs its rounds alone)
       wire      = sum over the step's collectives of the bytes MPICH really moves
                   (`mpich_collective_bytes`: Rabenseifner all-reduce, binomial Gather, binomial or
                   scatter+allgather Bcast by MPICH's thresholds, ring Allgather, pairwise
                   Alltoallv; checked against the interface counters: `wire_bytes_error`), less the
                   tbf bucket (netem.sh's burst), / (eta x rate) -- the TOTAL over all links on the
                   shared medium, the busiest link on the switch -- but at least total / cap(N)
                   (the CPU-bound TCP stack, all ranks together) and, where one process moves a
                   link's bytes alone (the server's Send/Recv, a tree's root), link bytes x o ** nu
                   / cap_root; plus rounds x (alpha + alpha_os (o - 1)); fp32_exact's Alltoallv +
                   Allgatherv pay q_exact x bytes x (o - 1) more.
       t_scalers = log2(N) (alpha + beta_sc (o - 1))   (the scaler all-reduce: recursive doubling,
                   each round waits for the partner's time slice; nothing overlaps that wait)
       t_encode, t_decode = cost per element (at that P) x P x shape(N) x o ** gamma(cost)
                   (gamma(cost, P) where the calibration rows hold P at two or more N);
                   shape(N): in-process one-core timings of the ps server, ps decode and allgather
                   aggregate (`SHAPE_SOURCE`), 1 for the others. The pipelined modes encode their
                   codes inside the exchange, so their t_encode is pass 1 alone (its own cost,
                   c_pass1).
       pipelined modes (tg_ps, tg_allgather: K = ceil(P / 2^18) pieces): wire, sums and decode
                   overlap, so exchange = max(W, C) + (1 - overlap) min(W, C) + (W + C) / K (one
                   piece through the pipeline; overlap, fitted, is the share of the shorter one
                   hidden), C = the CPU of t_decode (which there includes encoding the codes,
                   piece by piece) plus, for the server, the time its one process spends moving
                   its link's bytes (link bytes x o ** nu / cap_root: the process that sums is the
                   one that sends, so that part cannot hide behind the sums), t_wire = exchange -
                   the CPU of t_decode; W is the links' part: for the server max(up, down) +
                   duplex x min(up, down) on the switch (full-duplex links; duplex, fitted, is what
                   TCP's acks and the shared CPU take back) and up + down on the shared medium.
                   tg_allgather_whole: the additive form below.
                   tg_ps_whole / tg_ps_collective (one piece): wire = all slots in + all downlinks
                   out, and the server's sum (in t_decode) lies between them; the bench's t_wire
                   (minimum over ranks) is the first worker's (slots, sum, its downlink) or the
                   server's, whichever is shorter.
   `calibrate` fits every free parameter, per topology, on a SEPARATE set of rows -- by default
   every N = 2 row plus the smallest size at the largest N (N = 2 alone cannot tell how CPU time
   grows with the rank count) -- and `validate` reports every other row (N = 4; N = 8 at the
   larger sizes) against them. On a machine with fewer cores than 4 those rows are all
   oversubscribed (`oversubscribed`: the ranks share cores, which no cluster does); the
   `size-ends` calibration also holds out the middle size at N = 2 (one rank per core),
   predicted from the smallest and largest; the `rank-ends` calibration fits every row at the
   smallest and largest N (each size then gets its own contention exponents) and predicts the
   middle N. Several sweeps of the same grid can be given: their
   per-row medians are validated and `sweep_spread` says how far the sweeps differ per row. With
   the default rows the N x P interaction of the CPU costs (16M arrays at N = 8 cost more per
   element than the fair-share o-fold) is not visible and not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

from tgsim.analysis.perfmodel_nets import Net, get_net

GBIT = 1e9

# -- 1. bytes on the wire (the codec's own formulas) ------------------------------------------------


def packed_size(n: int, packing: str = "2bit") -> int:
    return -(-n // {"2bit": 4, "base3": 5}[packing])


def uint_width(workers: int) -> int:
    """Bits per element of the server's sum of N ternary codes: ceil(log2(2N+1))."""
    return max(1, int(2 * workers).bit_length())


def layer_bytes(codec: str, n: int, workers: int, packing: str = "2bit", downlink: str = "sum") -> dict:
    """Bytes of one layer of n elements, per worker, for every exchange pattern.

    up        what one worker pushes (ps) -- also one worker's message in an all-gather
    down      what one worker pulls from the server (ps)
    reduce    the buffer of an all-reduce (fp32: float32; terngrad: int8 codes, int16 beyond 127)
    """
    if codec == "fp32":
        return {"up": 4 * n, "down": 4 * n, "reduce": 4 * n}
    if codec != "terngrad":
        raise ValueError(f"unknown codec {codec!r}")
    up = 4 + packed_size(n, packing)
    if downlink == "sum":
        down = 4 + -(-n * uint_width(workers) // 8)
    elif downlink == "reternarize":
        down = up
    else:
        raise ValueError(f"downlink must be 'sum' or 'reternarize', got {downlink!r}")
    return {"up": up, "down": down, "reduce": n * (1 if workers <= 127 else 2)}


# -- 2. networks, clusters, exchange ----------------------------------------------------------------

@dataclass(frozen=True)
class Network:
    name: str
    bandwidth: float            # bits/s of one link (NIC) or of the shared medium
    latency: float              # seconds per message (per collective step)
    efficiency: float = 0.9     # achievable fraction of the line rate
    medium: str = "switch"      # "switch" (full-duplex links, non-blocking) | "shared" (one medium)

    def seconds(self, nbytes: float) -> float:
        return 8.0 * nbytes / (self.efficiency * self.bandwidth)


@dataclass(frozen=True)
class Cluster:
    name: str
    network: Network
    gpu: str                    # key of perfmodel_nets.GPU_TFLOPS
    gpus_per_node: int = 4
    intra_bandwidth: float = 80e9     # bits/s inside a node (PCIe 3.0 x16 ~ 10 GB/s)


CLUSTERS = {
    "ethernet": Cluster("1 Gb/s Ethernet, 4 x GTX 1080 per node", Network("1 Gb/s Ethernet", 1 * GBIT, 50e-6),
                        gpu="gtx1080", gpus_per_node=4, intra_bandwidth=80e9),
    "infiniband": Cluster("100 Gb/s InfiniBand, 4 x P100 (NVLink) per node",
                          Network("100 Gb/s InfiniBand", 100 * GBIT, 2e-6), gpu="p100", gpus_per_node=4,
                          intra_bandwidth=320e9),
}


@dataclass(frozen=True)
class Exchange:
    pattern: str = "ps"         # "ps" | "ring" | "allgather"
    servers: int = 1            # ps: dedicated server shards; 0 = one per worker node (scales with N)
    overlap: bool = True        # send each layer as soon as its gradient is ready
    downlink: str = "sum"       # terngrad ps: "sum" (ceil(log2(2N+1)) bits) | "reternarize" (2 bits)
    packing: str = "2bit"
    codec_seconds_per_element: float = 2e-11    # GPU encode/decode (memory-bound; ~0.1 ms per 5M elements)

    def __post_init__(self):
        if self.pattern not in ("ps", "ring", "allgather"):
            raise ValueError(f"unknown exchange pattern {self.pattern!r}")
        if self.servers < 0:
            raise ValueError("servers must be >= 0 (0 = one shard per node)")


def message_seconds(codec: str, n: int, gpus: int, cluster: Cluster, ex: Exchange) -> tuple[float, float]:
    """(uplink-stage, downlink-stage) seconds of one layer's exchange; a one-stage pattern returns (t, 0)."""
    net = cluster.network
    g = min(gpus, cluster.gpus_per_node)
    nodes = -(-gpus // cluster.gpus_per_node)
    b = layer_bytes(codec, n, gpus, ex.packing, ex.downlink)
    intra = Network("intra-node", cluster.intra_bandwidth, 1e-6, 1.0)
    if net.medium == "shared":
        if ex.pattern == "ps":
            return net.seconds(gpus * b["up"]) + net.latency, net.seconds(gpus * b["down"]) + net.latency
        if ex.pattern == "ring":
            return net.seconds(2 * (gpus - 1) * b["reduce"]) + 2 * (gpus - 1) * net.latency, 0.0
        return net.seconds(gpus * (gpus - 1) * b["up"]) + (gpus - 1) * net.latency, 0.0
    if ex.pattern == "ps":
        m = ex.servers or nodes
        up = max(net.seconds(g * b["up"]), net.seconds(gpus * b["up"] / m)) + net.latency
        down = max(net.seconds(g * b["down"]), net.seconds(gpus * b["down"] / m)) + net.latency
        return up, down
    link = net if nodes > 1 else intra
    if ex.pattern == "ring":
        return link.seconds(2 * (gpus - 1) / gpus * b["reduce"]) + 2 * (gpus - 1) * link.latency, 0.0
    return link.seconds((gpus - 1) * b["up"]) + (gpus - 1) * link.latency, 0.0


def iteration(net: Net | str, codec: str, gpus: int, cluster: Cluster | str = "ethernet",
              exchange: Exchange | None = None, batch: int | None = None) -> dict:
    """One synchronous iteration: compute, exchange, overlap; returns times (s) and throughput."""
    net = get_net(net) if isinstance(net, str) else net
    cluster = CLUSTERS[cluster] if isinstance(cluster, str) else cluster
    ex = exchange or Exchange()
    b = net.batch if batch is None else batch
    compute = net.compute_seconds(cluster.gpu, b)
    fwd = net.fwd_frac * compute
    bwd = compute - fwd
    total_macs = sum(l.macs for l in net.layers) or 1
    t_bwd, t_up_free, t_down_free = 0.0, 0.0, 0.0
    comm_total = 0.0
    shared = cluster.network.medium == "shared"
    for layer in reversed(net.layers):          # backward: the last layer's gradient is ready first
        t_bwd += bwd * layer.macs / total_macs
        if gpus == 1:
            continue
        enc = ex.codec_seconds_per_element * layer.params if codec == "terngrad" else 0.0
        up, down = message_seconds(codec, layer.params, gpus, cluster, ex)
        if shared:                               # one medium: uplink and downlink share it
            up, down = up + down, 0.0
        comm_total += up + down + enc
        ready = (t_bwd if ex.overlap else bwd) + enc
        start = max(ready, t_up_free)
        t_up_free = start + up
        t_down_free = max(t_up_free, t_down_free) + down
    if gpus == 1:
        it, exposed = compute, 0.0
    elif ex.overlap:
        end = max(bwd, t_up_free, t_down_free)
        it, exposed = fwd + end, end - bwd
    else:
        it, exposed = compute + comm_total, comm_total
    return {"net": net.name, "codec": codec, "gpus": gpus, "batch": b, "compute": compute, "forward": fwd,
            "backward": bwd, "comm": comm_total, "exposed_comm": exposed, "iteration": it,
            "throughput": gpus * b / it, "unit": net.unit}


def throughput_table(nets: Sequence[str] = ("alexnet", "googlenet", "vgg_a"),
                     gpus: Iterable[int] = tuple(2 ** k for k in range(10)),
                     clusters: Sequence[str] = ("ethernet", "infiniband"), codecs: Sequence[str] = ("fp32", "terngrad"),
                     exchange: Exchange | None = None, batch: int | None = None):
    """Tidy DataFrame: one row per (net, cluster, gpus, codec)."""
    import pandas as pd

    rows = []
    for name in nets:
        net = get_net(name)
        for c in clusters:
            cl = CLUSTERS[c] if isinstance(c, str) else c
            for g in gpus:
                for codec in codecs:
                    r = iteration(net, codec, int(g), cl, exchange, batch)
                    r.update(cluster=c if isinstance(c, str) else cl.name, bandwidth=cl.network.bandwidth,
                             fc_fraction=net.fc_fraction, params=net.params)
                    rows.append(r)
    return pd.DataFrame(rows)


def gain_table(df):
    """TernGrad throughput / fp32 throughput per (net, cluster, gpus) of a `throughput_table`."""
    key = ["net", "cluster", "gpus"]
    p = df.pivot_table(index=key, columns="codec", values="throughput").reset_index()
    p["gain"] = p["terngrad"] / p["fp32"]
    extra = df.drop_duplicates(key)[key + ["fc_fraction", "bandwidth"]]
    return p.merge(extra, on=key)


def fig5(nets: Sequence[str] = ("alexnet", "googlenet", "vgg_a"), exchange: Exchange | None = None):
    """The data of TernGrad Fig. 5: throughput against 1..512 GPUs, fp32 vs TernGrad, both clusters."""
    return throughput_table(nets, tuple(2 ** k for k in range(10)), ("ethernet", "infiniband"),
                            ("fp32", "terngrad"), exchange)


# -- Fig. 5's qualitative claims, as checks any model function can be put through -----------------
# `model(net, codec, gpus, cluster, exchange) -> dict with "throughput"` (`iteration` is the real one);
# the tests pass deliberately wrong models too (positive controls: they must FAIL these checks).

FIG5_NETS = ("alexnet", "googlenet", "vgg_a")


def _gains(model, nets, gpus, clusters, exchange) -> "dict":
    out = {}
    for name in nets:
        net = get_net(name)
        for c in clusters:
            cl = CLUSTERS[c] if isinstance(c, str) else c
            for g in gpus:
                t = model(net, "terngrad", g, cl, exchange)["throughput"]
                f = model(net, "fp32", g, cl, exchange)["throughput"]
                out[(name, cl.name, g)] = t / f
    return out


def claim_gain_grows_with_workers(model=None, nets=FIG5_NETS, exchange: Exchange | None = None,
                                  gpus=tuple(2 ** k for k in range(1, 10)), margin: float = 1.5) -> tuple[bool, dict]:
    """On InfiniBand (where the exchange turns from hidden to dominant inside 2..512 GPUs) TernGrad's
    gain over fp32 rises with N: it is non-decreasing (1% slack) from N = 2 up to its peak, the peak
    is at N >= 8, and the peak gain is >= `margin` x the gain at N = 2; on 1 Gb/s Ethernet the
    exchange already dominates at N = 2, so there the claim is only gain(2) >= 3 for every net.

    With the exact-sum downlink (default, ceil(log2(2N+1)) bits) the gain FALLS after its peak as the
    downlink widens (AlexNet, 1 Gb/s: about x13 at 2 GPUs, x4.6 at 512); with the 2-bit downlink
    (`Exchange("ps", downlink="reternarize")`) it never falls (checked in the tests)."""
    model = model or iteration
    ex = exchange or Exchange("ps")
    gains = _gains(model, nets, gpus, ("ethernet", "infiniband"), ex)
    ok = True
    ib, eth = CLUSTERS["infiniband"].name, CLUSTERS["ethernet"].name
    for name in nets:
        seq = [gains[(name, ib, g)] for g in gpus]
        peak = max(range(len(seq)), key=lambda i: seq[i])
        ok &= all(b >= 0.99 * a for a, b in zip(seq[:peak + 1], seq[1:peak + 1]))
        ok &= gpus[peak] >= 8 and seq[peak] >= margin * seq[0]
        ok &= gains[(name, eth, gpus[0])] >= 3.0
    return bool(ok), gains


def claim_gain_grows_as_bandwidth_falls(model=None, nets=FIG5_NETS, bandwidths=(1e9, 10e9, 100e9),
                                        gpus=(8, 32, 128), exchange: Exchange | None = None,
                                        margin: float = 1.5) -> tuple[bool, dict]:
    """Same nodes (4 P100 each), only the link differs: at every N the gain is non-increasing as the
    bandwidth grows (1% slack), and at N = 8 the gain at the lowest bandwidth is >= `margin` x the
    gain at the highest, for every net."""
    model = model or iteration
    ex = exchange or Exchange("ps")
    clusters = [Cluster(f"{b / 1e9:g} Gb/s", Network(f"{b / 1e9:g} Gb/s", b, 10e-6), gpu="p100", gpus_per_node=4)
                for b in bandwidths]
    gains = _gains(model, nets, gpus, clusters, ex)
    ok = True
    for name in nets:
        for g in gpus:
            seq = [gains[(name, c.name, g)] for c in clusters]
            ok &= all(b <= 1.01 * a for a, b in zip(seq, seq[1:]))
        ok &= gains[(name, clusters[0].name, gpus[0])] >= margin * gains[(name, clusters[-1].name, gpus[0])]
    return bool(ok), gains


def claim_gain_grows_with_fc_weights(model=None, clusters=("ethernet", "infiniband"), gpus=(8, 64, 512),
                                     exchange: Exchange | None = None, margin: float = 1.2) -> tuple[bool, dict]:
    """AlexNet (96% of its weights fully-connected) and VGG-A (93%) gain at least `margin` x what
    GoogLeNet (15%) and ResNet-50 (8%) gain, on both clusters at every N. (The model sees FC weights
    only through their bytes per unit of compute and the layer order: FC layers come last in the
    forward pass, so their large messages leave first and pipeline badly with the rest.)"""
    model = model or iteration
    ex = exchange or Exchange("ps")
    gains = _gains(model, ("alexnet", "vgg_a", "googlenet", "resnet50"), gpus, clusters, ex)
    ok = True
    for c in clusters:
        cn = (CLUSTERS[c] if isinstance(c, str) else c).name
        for g in gpus:
            for fc in ("alexnet", "vgg_a"):
                for conv in ("googlenet", "resnet50"):
                    ok &= gains[(fc, cn, g)] >= margin * gains[(conv, cn, g)]
    return bool(ok), gains


# -- 3. the emulated network (validation against `tgsim bench exchange`) --------------------------

MODES = ("fp32_exact", "fp32_native", "tg_allreduce", "tg_ps", "tg_allgather", "tg_ps_collective", "tg_ps_whole",
         "tg_allgather_whole")
PIPELINED = ("tg_ps", "tg_allgather")   # in pieces: wire, sums and decode overlap (tgsim.exchange.pieces)
CHUNK = 1 << 18         # elements per piece (tgsim.exchange.mpi.CHUNK)
_ALEXNET = [(34_848, 96), (307_200, 256), (884_736, 384), (663_552, 384), (442_368, 256), (37_748_736, 4096),
            (16_777_216, 4096), (4_096_000, 1000)]


def bench_layer_sizes(params: int) -> list[int]:
    """The layer sizes tgsim.bench.exchange_rank uses (AlexNet's 16 tensors scaled to `params`)."""
    total = sum(w + b for w, b in _ALEXNET)
    out = []
    for w, b in _ALEXNET:
        out += [max(16, round(w * params / total)), max(16, round(b * params / total))]
    big = max(range(len(out)), key=lambda i: out[i])
    out[big] += params - sum(out)
    return out


def message_header_bytes(n_layers: int, ndim: int = 1) -> int:
    """tgsim.codecs.message header: 24 fixed bytes + (2 + 8 ndim) per layer + a 4-byte CRC."""
    return 24 + n_layers * (2 + 8 * ndim) + 4


def mode_payloads(mode: str, sizes: Sequence[int], n: int, packing: str = "2bit") -> dict:
    """Payload buffer sizes (bytes) of one step of a bench mode: what MPIExchange hands to MPI."""
    P = sum(sizes)
    if mode in ("fp32_exact", "fp32_native"):
        return {"reduce": 4 * P}
    if mode == "tg_allreduce":
        return {"reduce": P * (1 if n <= 127 else 2), "scalers": 4 * len(sizes)}
    slot = 8 + message_header_bytes(len(sizes)) + sum(4 + packed_size(s, packing) for s in sizes)
    if mode in ("tg_allgather", "tg_allgather_whole"):
        return {"gather": slot, "scalers": 4 * len(sizes)}
    if mode in ("tg_ps", "tg_ps_collective", "tg_ps_whole"):
        w = uint_width(n)
        status = 8 * pieces(P) if mode == "tg_ps" else 8       # one u64 status word per downlink piece
        return {"gather": slot, "bcast": status + sum(4 + -(-s * w // 8) for s in sizes), "scalers": 4 * len(sizes)}
    raise ValueError(f"unknown mode {mode!r}")


def pieces(params: int, chunk: int = CHUNK) -> int:
    """Pieces of a pipelined exchange (about; `pieces.PiecePlan` also cuts at layer ends)."""
    return max(1, -(-int(params) // chunk))


def _log2(n: int) -> int:
    return max(0, (n - 1).bit_length())


def mpich_collective_bytes(coll: str, nbytes: float, n: int) -> tuple[float, float, int]:
    """(total bytes over all links, bytes on the critical path of one link, rounds) of one collective
    as MPICH 5 runs it by default for large messages (checked against interface counters).

    allreduce   reduce-scatter + allgather (Rabenseifner): every rank sends 2 (n-1)/n S
    alltoall_ag Alltoallv (pairwise) + Allgatherv (ring) of the exact fp32 path: same bytes
    allgather   ring / recursive doubling: every rank receives (n-1) S  (S = one rank's block)
    gather      binomial tree: n/2 log2(n) blocks cross links; the root receives n-1 blocks
    bcast       binomial below 8 ranks or 12 KiB (n-1 copies; root sends log2(n) of them), else
                scatter + allgather: S (log2(n)/2 + (n-1)) in total, 2 (n-1)/n S on the busiest link
    p2p         the parameter server's n-1 Send (or Recv) one after another on the root: n-1 blocks,
                all through the root's link
    """
    if n <= 1:
        return 0.0, 0.0, 0
    if coll in ("allreduce", "alltoall_ag"):
        return 2.0 * (n - 1) * nbytes, 2.0 * (n - 1) / n * nbytes, 2 * _log2(n) if coll == "allreduce" else 2 * (n - 1)
    if coll == "allgather":
        return n * (n - 1) * nbytes, (n - 1) * nbytes, n - 1
    if coll == "gather":
        return n / 2 * math.log2(n) * nbytes if n & (n - 1) == 0 else (n - 1) * nbytes * 1.5, (n - 1) * nbytes, _log2(n)
    if coll == "p2p":
        return (n - 1) * nbytes, (n - 1) * nbytes, n - 1
    if coll == "bcast":
        if n < 8 or nbytes < 12288:
            return (n - 1) * nbytes, _log2(n) * nbytes, _log2(n)
        return nbytes * (math.log2(n) / 2 + (n - 1)), 2.0 * (n - 1) / n * nbytes, _log2(n) + n - 1
    raise ValueError(f"unknown collective {coll!r}")


def mode_collectives(mode: str, sizes: Sequence[int], n: int) -> list[tuple[str, float]]:
    """The collectives of one bench step, in order, with their per-rank buffer sizes."""
    pay = mode_payloads(mode, sizes, n)
    if mode == "fp32_exact":
        return [("alltoall_ag", pay["reduce"])]
    if mode == "fp32_native":
        return [("allreduce", pay["reduce"])]
    out = [("allreduce", pay["scalers"])]
    if mode == "tg_allreduce":
        return out + [("allreduce", pay["reduce"])]
    if mode in ("tg_allgather", "tg_allgather_whole"):   # pipelined: p2p pieces, a ring's bytes
        return out + [("allgather", pay["gather"])]
    if mode in ("tg_ps", "tg_ps_whole"):   # MPIExchange's default: point-to-point (ps_transport="p2p")
        return out + [("p2p", pay["gather"]), ("p2p", pay["bcast"])]
    return out + [("gather", pay["gather"]), ("bcast", pay["bcast"])]


def wire_bytes_model(mode: str, params: int, n: int) -> float:
    """Bytes MPICH moves over all links in one step of `mode` (compare with the bench's wire_bytes)."""
    return sum(mpich_collective_bytes(c, b, n)[0] for c, b in mode_collectives(mode, bench_layer_sizes(params), n))


def _exchange_collectives(mode: str, sizes: Sequence[int], n: int) -> list[tuple[str, float]]:
    """`mode_collectives` without the TernGrad scaler all-reduce (the bench times that one apart, as
    t_scalers; it is not inside t_wire)."""
    out = mode_collectives(mode, sizes, n)
    return out[1:] if mode.startswith("tg_") else out


@dataclass
class EmuParams:
    """Free parameters of the emulation model (seconds, bytes/s, seconds per element or byte).

    o = max(1, (N + L) / cores) is the oversubscription: N ranks (all runnable: MPICH busy-polls
    while it waits) plus L other runnable tasks (the bench's `ext_load`) on `cores` cores."""

    eta: float = 0.97                 # fraction of the tbf rate TCP reaches
    cap: float = 1.2e9                # aggregate bytes/s the CPU-bound TCP stack moves at N = 2 (all links together)
    kappa: float = 0.3                # ... and cap x (N / 2) ** kappa at N ranks
    alpha: float = 2e-4               # seconds per collective round without oversubscription
    alpha_os: float = 1e-4            # + seconds per round per unit of (o - 1): waiting for the peer's time slice
    beta_sc: float = 1e-3             # scaler all-reduce: + seconds per round per unit of (o - 1)
    cap_root: float = 1.5e9           # bytes/s ONE process (the server, a tree's root) moves alone ...
    nu: float = 1.0                   # ... and cap_root / o ** nu when it shares the cores with busy-polling ranks
    gamma: float = 1.0                # contention exponent: CPU time x o ** gamma (per CPU cost: `gammas`)
    duplex: float = 0.3               # pipelined server on a switch: max(up, down) + duplex x min(up, down)
    overlap: float = 0.5              # ... and the share of min(wire, CPU) hidden behind the other
    q_exact: float = 1e-9             # s per byte per unit of (o - 1): fp32_exact's Alltoallv + ring Allgatherv
    c_encode: float = 2.5e-9          # codec.scaling + encode, per element
    c_pass1: float = 1e-9             # codec.scaling + the input checks alone: the pipelined modes' t_encode
    c_fp32_native: float = 1.5e-8     # flatten + float64 scaling of the native path, per element
    c_fp32_exact: float = 1.5e-8      # flatten + ordered float64 sums, per element
    c_ar_decode: float = 8e-9         # int8 unpack + float64 scaling, per element
    c_ps: float = 6e-9                # server sum + pack + unpack, per element, x shape(N)
    c_ag_decode: float = 2e-9         # slots + parse + weighted sum, per element, x shape(N)
    c_ps_pipe: float = 9e-9           # pipelined server: c_ps's work + encoding the codes piece by piece
    c_ag_pipe: float = 5e-9           # pipelined all-gather: c_ag_decode's work + encoding the codes
    cores: float = 2.0                # CPU cores the ranks share
    cpu: dict = field(default_factory=dict)   # {(c_* attribute, P): seconds per element} fitted per size
    gammas: dict = field(default_factory=dict)  # {c_* attribute: contention exponent}, else gamma
    fitted: dict = field(default_factory=dict)

    def cost(self, attr: str, params: int) -> float:
        """Seconds per element of CPU cost `attr` at size `params`: the value fitted at that size,
        else log-log interpolation between the fitted sizes (clamped), else the scalar attribute."""
        pts = sorted((P, v) for (a, P), v in self.cpu.items() if a == attr)
        if not pts:
            return getattr(self, attr)
        for P, v in pts:
            if P == params:
                return v
        if params <= pts[0][0]:
            return pts[0][1]
        if params >= pts[-1][0]:
            return pts[-1][1]
        (p0, v0), (p1, v1) = max(x for x in pts if x[0] < params), min(x for x in pts if x[0] > params)
        f = math.log(params / p0) / math.log(p1 / p0)
        return float(math.exp(math.log(v0) + f * (math.log(v1) - math.log(v0))))

    def cap_n(self, n: int) -> float:
        """Aggregate bytes/s of the CPU-bound TCP stack with n ranks."""
        return self.cap * max(1.0, n / 2.0) ** self.kappa

    def rate(self, rate_bits: float, n: int = 2) -> float:
        """Bytes/s of one link: the tbf rate at efficiency eta, capped by what the CPU can push."""
        return min(self.eta * rate_bits / 8.0, self.cap_n(n))

    def oversub(self, n: int, ext_load: float = 0.0) -> float:
        load = 0.0 if ext_load != ext_load else max(0.0, float(ext_load))
        return max(1.0, (n + load) / self.cores)

    def contention(self, n: int, ext_load: float = 0.0, attr: str | None = None, params: int | None = None) -> float:
        """Slow-down of CPU work with n busy-polling ranks and `ext_load` other runnable tasks: o ** gamma,
        gamma of cost `attr` at size `params` where fitted there, else of `attr`, else the common one."""
        g = self.gammas.get((attr, params), self.gammas.get(attr, self.gamma))
        return self.oversub(n, ext_load) ** g

    def round_latency(self, n: int, ext_load: float = 0.0) -> float:
        """Seconds per collective round: alpha, plus waiting for the peer's turn on an oversubscribed CPU."""
        return self.alpha + self.alpha_os * (self.oversub(n, ext_load) - 1.0)


STEP_IN_NETWORK_FIT = True    # also fit the network to t_step (CPU costs held): the ps critical path is in no component
GAMMA_MIN = 1.0       # fair share: a CPU burst of N runnable ranks on C cores takes at least o times as long
_WIRE_FIT = ("eta", "cap", "kappa", "alpha", "alpha_os", "beta_sc", "cap_root", "nu", "q_exact", "duplex", "overlap")
_LINEAR = ("kappa", "gamma", "nu", "duplex", "overlap")   # fitted as they are; every other one through its logarithm
_BOUNDS = {"eta": (0.3, 1.2), "cap": (1e7, 1e11), "kappa": (-1.0, 1.0), "alpha": (1e-7, 0.05),
           "alpha_os": (1e-7, 0.1), "beta_sc": (1e-7, 0.1), "cap_root": (1e7, 1e11), "nu": (0.0, 2.0),
           "q_exact": (1e-13, 1e-7), "duplex": (0.0, 1.0), "overlap": (0.0, 1.0)}


def _rate_bits(rate: str) -> float:
    r = str(rate).strip().lower()
    for suffix, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if r.endswith(suffix):
            return float(r[: -len(suffix)]) * mult
    return float("inf")


# CPU work per element of each mode as a function of N, relative to N = 2: in-process timings of the
# real code paths on one core (P = 4M, NUMBA_NUM_THREADS=1, best of 5; see SHAPE_SOURCE). The
# parameter server's work is split into the server's own part (parse N slots, sum N code arrays,
# pack the sum: grows with N) and the decode every rank does (unpack + scale: the width grows);
# the two add up to 1 at N = 2. Beyond the last point: linear in N.
SHAPE_SOURCE = ("P = 4M, one core: ps server (parse + sum + pack) 5.08 / 5.58 / 6.93 ms, ps decode 4.74 / 7.02 / "
                "7.29 ms, allgather parse + aggregate 1.70 / 2.04 / 2.98 ms at N = 2 / 4 / 8")
_SHAPE_POINTS = {"ps_server": {2: 0.517, 4: 0.568, 8: 0.706}, "ps_decode": {2: 0.483, 4: 0.715, 8: 0.742},
                 "tg_allgather": {2: 1.0, 4: 1.20, 8: 1.75}}


def _interp(pts: dict, n: int) -> float:
    ks = sorted(pts)
    if n in pts:
        return float(pts[n])
    if n <= ks[0]:
        return float(pts[ks[0]])
    if n >= ks[-1]:
        a, b = ks[-2], ks[-1]
        return float(pts[b] + (pts[b] - pts[a]) * (n - b) / (b - a))
    lo = max(k for k in ks if k < n)
    hi = min(k for k in ks if k > n)
    return float(pts[lo] + (pts[hi] - pts[lo]) * (n - lo) / (hi - lo))


def _cpu_shape(mode: str, n: int, part: str = "all") -> float:
    """CPU work of `mode`'s exchange at n ranks relative to n = 2 (part: server | decode | all, ps only)."""
    if mode.startswith("tg_ps"):
        srv, dec = _interp(_SHAPE_POINTS["ps_server"], n), _interp(_SHAPE_POINTS["ps_decode"], n)
        return {"server": srv, "decode": dec}.get(part, srv + dec)
    if mode.startswith("tg_allgather"):
        return _interp(_SHAPE_POINTS["tg_allgather"], n)
    return 1.0


_CPU_ATTR = {"fp32_native": "c_fp32_native", "fp32_exact": "c_fp32_exact", "tg_allreduce": "c_ar_decode",
             "tg_ps": "c_ps_pipe", "tg_ps_collective": "c_ps", "tg_ps_whole": "c_ps", "tg_allgather": "c_ag_pipe",
             "tg_allgather_whole": "c_ag_decode"}


def _encode_attr(mode: str) -> str:
    """The CPU cost of a TernGrad mode's t_encode: the pipelined modes encode their codes piece by
    piece inside the exchange (a `DeferredMessage`), so their t_encode is pass 1 alone."""
    return "c_pass1" if mode in PIPELINED else "c_encode"


def tbf_burst(rate_bits: float) -> float:
    """The tbf bucket of tgsim/bench/netem.sh: max(256 KiB, 1 ms at the rate) bytes."""
    return max(262144.0, rate_bits / 8.0 * 1e-3) if rate_bits < float("inf") else 0.0


def _wire_terms(mode: str, params: int, n: int, rate: str, topology: str, p: EmuParams,
                ext_load: float = 0.0) -> list[tuple[float, float, float]]:
    """Per exchange collective of the step (scalers excluded), in order: (link, root, latency)
    seconds. link: the bytes through the shaped link(s) and the CPU-bound TCP stack of all ranks;
    root: where one process moves every byte of its link (the server's Send/Recv, a tree's root),
    link bytes x o ** nu / cap_root -- CPU time of that one process, else 0; latency: rounds x
    the per-round latency."""
    bits = _rate_bits(rate)
    R = p.eta * bits / 8.0
    burst = tbf_burst(bits)         # the bucket refills between collectives: its bytes pass at once
    cap = p.cap_n(n)
    o = p.oversub(n, ext_load)
    a = p.round_latency(n, ext_load)
    out = []
    for coll, b in _exchange_collectives(mode, bench_layer_sizes(params), n):
        total, crit, rounds = mpich_collective_bytes(coll, b, n)
        if topology == "shared":
            t = max(max(0.0, total - burst) / R, total / cap)
        else:                                   # n links in parallel, but the CPUs move all their bytes
            t = max(max(0.0, crit - burst) / R, total / cap)
        if coll == "alltoall_ag":               # the exact path: every pair at once, under oversubscription
            t += total * p.q_exact * (o - 1.0)
        root = 0.0
        if coll in ("p2p", "gather") or (coll == "bcast" and (n < 8 or b < 12288)):
            root = crit * o ** p.nu / p.cap_root
        out.append((t, root, rounds * a))
    return out


def _collective_seconds(terms) -> list[float]:
    """Seconds of each collective from its `_wire_terms`: the slower of its link and its root, plus
    its latency."""
    return [max(t, root) + lat for t, root, lat in terms]


def predict_wire(mode: str, params: int, n: int, rate: str, topology: str, p: EmuParams,
                 ext_load: float = 0.0) -> float:
    """Seconds inside the step's exchange collectives, on the critical path (scalers excluded)."""
    return sum(_collective_seconds(_wire_terms(mode, params, n, rate, topology, p, ext_load)))


def scalers_seconds(n: int, p: EmuParams, ext_load: float = 0.0) -> float:
    """The scaler MAX all-reduce (t_scalers): log2(n) rounds of recursive doubling, each waiting
    for the partner's turn on the oversubscribed cores (beta_sc per unit of o - 1). Unlike a large
    collective, whose transfer keeps every rank busy, nothing overlaps this wait."""
    if n <= 1:
        return 0.0
    return _log2(n) * (p.alpha + p.beta_sc * (p.oversub(n, ext_load) - 1.0))


def predict_components(mode: str, params: int, n: int, rate: str, topology: str, p: EmuParams,
                       ext_load: float = 0.0) -> dict:
    """Predicted components (seconds) of one bench row, each as the bench reports it.

    t_step = t_encode + log2(N) rounds + wire + t_decode, where wire is the step's critical path
    through the collectives (t_scalers, predicted as the bench reports it, also holds a wait the
    step's path does not have: see the module docstring). For the whole-message parameter server
    that path is: every slot into the server, the server's sum (S, inside t_decode), every downlink
    out, the last worker's decode. The bench's t_wire is the minimum over ranks: for the
    point-to-point server that is the first worker's (all slots, S, its own downlink) or the
    server's (all slots, all downlinks), whichever is shorter. The pipelined server (tg_ps)
    overlaps them: see the module docstring."""
    tg = mode.startswith("tg_")
    ea = _encode_attr(mode)
    enc = p.cost(ea, params) * params * p.contention(n, ext_load, ea, params) if tg else 0.0
    sc = scalers_seconds(n, p, ext_load) if tg else 0.0
    # on the step's path the scaler all-reduce costs its rounds alone: the bench's t_scalers (maximum
    # over ranks) also holds the wait for the slowest rank's encode, which t_encode (maximum) has
    sc_path = _log2(n) * p.round_latency(n, ext_load) if tg else 0.0
    terms = _wire_terms(mode, params, n, rate, topology, p, ext_load)
    parts = _collective_seconds(terms)
    wire = sum(parts)
    c = p.cost(_CPU_ATTR[mode], params) * params * p.contention(n, ext_load, _CPU_ATTR[mode], params)
    if mode in PIPELINED:                # pieces overlap the wire, the sums and the decode
        cpu = c * _cpu_shape(mode, n)
        link = [t + lat for t, _, lat in terms]
        if mode == "tg_ps":
            up, down = link
            link_path = max(up, down) + p.duplex * min(up, down) if topology == "switch" else up + down
        else:
            link_path = sum(link)
        root = sum(r for _, r, _ in terms)   # the server moves its bytes on its own CPU, not beside it
        busy = cpu + root
        exch = max(link_path, busy) + (1.0 - p.overlap) * min(link_path, busy) + (link_path + busy) / pieces(params)
        return {"t_wire": max(exch - cpu, 0.0), "t_wire_path": max(link_path, root), "t_encode": enc,
                "t_scalers": sc, "t_decode": cpu, "t_exchange": exch, "t_step": enc + sc_path + exch}
    if mode.startswith("tg_ps"):
        srv, dec = c * _cpu_shape(mode, n, "server"), c * _cpu_shape(mode, n, "decode")
        cpu = srv + dec
        up, down = parts
        seen = up + min(srv + down / max(1, n - 1), down) if mode == "tg_ps_whole" else wire
    else:
        cpu = c * _cpu_shape(mode, n)
        seen = wire
    return {"t_wire": seen, "t_wire_path": wire, "t_encode": enc, "t_scalers": sc, "t_decode": cpu,
            "t_exchange": wire + cpu, "t_step": enc + sc_path + wire + cpu}


KEY = ["topology", "rate", "ranks", "params", "mode"]


def combine_sweeps(measured) -> "pd.DataFrame":
    """One row per (topology, rate, N, P, mode) from several sweeps of `tgsim bench exchange` (paths
    or DataFrames): the median over sweeps of every numeric column, `sweeps` = how many sweeps had
    the row, and `sweep_spread` = max / min - 1 of its t_step over the sweeps (0 for one sweep):
    the run-to-run noise of that point on this machine, beside which a model error is judged."""
    import pandas as pd

    frames = [m.copy() if isinstance(m, pd.DataFrame) else pd.read_csv(m) for m in measured]
    for i, f in enumerate(frames):
        f["_sweep"] = i
    df = pd.concat(frames, ignore_index=True)
    num = [c for c in df.columns if c not in KEY and c != "_sweep" and pd.api.types.is_numeric_dtype(df[c])]
    g = df.groupby(KEY, sort=False)
    out = g[num].median()
    out["sweeps"] = g["_sweep"].nunique()
    out["sweep_spread"] = g["t_step"].max() / g["t_step"].min() - 1.0
    return out.reset_index()


def _load(measured):
    import pandas as pd

    if isinstance(measured, (list, tuple)):
        df = combine_sweeps(measured) if len(measured) > 1 else _load(measured[0])
    else:
        df = measured.copy() if isinstance(measured, pd.DataFrame) else pd.read_csv(measured)
    if "ext_load" not in df:
        df["ext_load"] = 0.0
    if "sweeps" not in df:
        df["sweeps"], df["sweep_spread"] = 1, 0.0
    return df


def _to_x(name: str, v: float) -> float:
    return v if name in _LINEAR else math.log(v)


def _from_x(name: str, x: float) -> float:
    return float(x) if name in _LINEAR else float(math.exp(x))


def _fit_contention(rows, p: EmuParams) -> tuple[float, dict]:
    """(gamma, {P: cost per element}) of one CPU cost over its rows (attr, P, seconds, P x shape, n,
    ext_load): gamma on a grid from GAMMA_MIN to 3 where the rows span two or more N (else p.gamma),
    the cost per size the median of seconds / (P x shape x o ** gamma), gamma minimizing the squared
    log error."""
    import numpy as np

    best = None
    for gamma in (np.linspace(GAMMA_MIN, 3.0, 121) if len({c[4] for c in rows}) > 1 else [p.gamma]):
        q = replace(p, gamma=float(gamma), gammas={})
        cont = np.array([q.contention(n, L) for *_, n, L in rows])
        costs = {}
        for P in {c[1] for c in rows}:
            idx = [i for i, c in enumerate(rows) if c[1] == P]
            costs[P] = float(np.median([rows[i][2] / (rows[i][3] * cont[i]) for i in idx]))
        pred = np.array([costs[c[1]] * c[3] * cont[i] for i, c in enumerate(rows)])
        meas = np.array([c[2] for c in rows])
        loss = float(np.sum(np.log(pred / meas) ** 2))
        if best is None or loss < best[0] - 1e-12:
            best = (loss, float(gamma), costs)
    return best[1], best[2]


def calibrate(measured, base: EmuParams | None = None, robust: float = 0.15) -> EmuParams:
    """Fit the free parameters on the given rows (one topology; see `validate` for which rows).

    1. CPU, per cost (encode, each mode's decode): for each contention exponent gamma on a grid
       from GAMMA_MIN = 1 (fair share: N runnable ranks on C cores stretch a CPU burst at least
       o-fold; memory-bound kernels suffer more) to 3, the cost per element -- per size P, since
       16M-element arrays fault their pages in every step and cost more per element -- is the
       median over its rows of component / (P x shape(N) x o ** gamma); gamma minimizes the
       squared log error of that component over the rows (it needs two N: the N = 8 rows).
       The scalar c_* attributes hold the median over sizes (used for sizes not calibrated).
    2. Network (eta, cap, kappa, alpha, alpha_os, beta_sc, cap_root, nu, q_exact), with the CPU
       costs held: one least-squares fit of log(predicted / measured) over t_wire and t_step of
       every row and t_scalers of the TernGrad rows, with a soft-L1 loss (scale `robust`: a few
       noisy rows of a shared machine must not drag the constants) and a weak pull (weight 0.01)
       towards `base`, so a parameter the rows cannot determine (no 10 Gb/s rows: cap) stays
       where it was."""
    import numpy as np
    from scipy.optimize import least_squares

    df = _load(measured)
    p = replace(base or EmuParams(), cpu={})
    if "cores" in df and len(df):
        p.cores = float(df["cores"].median())
    rows = list(df.itertuples())
    cols = set(df.columns)

    # 1. CPU: per cost, its own contention exponent (memory-bound kernels suffer more from sharing)
    comps = []      # (attribute, P, measured seconds, P x shape, n, ext_load)
    for r in rows:
        n, P = int(r.ranks), int(r.params)
        if r.mode.startswith("tg_") and "t_encode" in cols:
            comps.append((_encode_attr(r.mode), P, r.t_encode, float(P), n, r.ext_load))
        if "t_decode" in cols:
            comps.append((_CPU_ATTR[r.mode], P, r.t_decode, float(P) * _cpu_shape(r.mode, n), n, r.ext_load))
    comps = [c for c in comps if c[2] > 0]
    p.cpu, p.gammas = {}, {}
    for attr in sorted({c[0] for c in comps}):
        mine = [c for c in comps if c[0] == attr]
        gamma, costs = _fit_contention(mine, p)
        p.gammas[attr] = gamma
        p.cpu.update({(attr, P): v for P, v in costs.items()})
        setattr(p, attr, float(np.median(list(costs.values()))))
        for P in sorted(costs) if len(costs) > 1 else ():   # a size measured at two or more N: its own
            at = [c for c in mine if c[1] == P]                # exponent (the N x P interaction)
            if len({c[4] for c in at}) > 1:
                p.gammas[(attr, P)], cP = _fit_contention(at, p)
                p.cpu[(attr, P)] = cP[P]
    if p.gammas:
        p.gamma = float(np.median([g for k, g in p.gammas.items() if isinstance(k, str)]))
    # 2. network (with the CPU costs of step 1 in place: the server's sum is part of its t_wire)
    wrows = []
    for r in rows:
        if "t_wire" in cols and r.t_wire > 0:
            wrows.append((r, "t_wire", r.t_wire))
        if STEP_IN_NETWORK_FIT and "t_step" in cols and r.t_step > 0:
            wrows.append((r, "t_step", r.t_step))
        if "t_scalers" in cols and r.mode.startswith("tg_") and r.t_scalers > 0 and int(r.ranks) > 1:
            wrows.append((r, "t_scalers", r.t_scalers))
    x0 = np.array([_to_x(k, getattr(p, k)) for k in _WIRE_FIT])
    lo = np.array([_to_x(k, _BOUNDS[k][0]) for k in _WIRE_FIT])
    hi = np.array([_to_x(k, _BOUNDS[k][1]) for k in _WIRE_FIT])
    x0 = np.clip(x0, lo + 1e-6, hi - 1e-6)

    def resid(x):
        q = replace(p, **{k: _from_x(k, v) for k, v in zip(_WIRE_FIT, x)})
        out = []
        for r, comp, m in wrows:
            if comp == "t_scalers":
                pr = scalers_seconds(int(r.ranks), q, r.ext_load)
            else:
                pr = predict_components(r.mode, int(r.params), int(r.ranks), r.rate, r.topology, q, r.ext_load)[comp]
            out.append(math.log(max(pr, 1e-12) / m))
        return np.concatenate([np.array(out), 0.01 * (x - x0)])

    if wrows:
        fit = least_squares(resid, x0, bounds=(lo, hi), loss="soft_l1", f_scale=robust, x_scale=1.0)
        for k, v in zip(_WIRE_FIT, fit.x):
            setattr(p, k, _from_x(k, v))

    p.fitted = {"rows": int(len(df)), "ranks": sorted(int(x) for x in df["ranks"].unique()),
                "params": sorted(int(x) for x in df["params"].unique()), "cores": p.cores,
                "wire_rows": len(wrows), "cpu_rows": len(comps)}
    return p


def predict_emulation(measured, params: EmuParams):
    """Every row of a bench CSV with the model's predicted components beside the measured ones."""
    df = _load(measured)
    preds = [predict_components(r.mode, int(r.params), int(r.ranks), r.rate, r.topology, params, r.ext_load)
             for r in df.itertuples()]
    for k in ("t_wire", "t_wire_path", "t_encode", "t_scalers", "t_decode", "t_exchange", "t_step"):
        df[f"pred_{k}"] = [x[k] for x in preds]
    df["pred_wire_bytes"] = [wire_bytes_model(r.mode, int(r.params), int(r.ranks)) for r in df.itertuples()]
    return df


def default_calibration_rows(df):
    """N = 2 (every size and rate) plus the smallest size at the largest N: the separate set the
    free parameters are fitted on (N = 2 alone cannot tell how CPU time grows with the rank count)."""
    big = df["ranks"] == df["ranks"].max()
    return (df["ranks"] == df["ranks"].min()) | (big & (df["params"] == df["params"].min()))


def size_ends_calibration_rows(df):
    """The default set without its middle sizes at N = 2: those rows -- one rank per core, like a
    cluster -- are then predicted from the smallest and largest size (a held-out interpolation)."""
    ends = df["params"].isin([df["params"].min(), df["params"].max()])
    return default_calibration_rows(df) & (ends | (df["ranks"] != df["ranks"].min()))


def rank_ends_calibration_rows(df):
    """Every row at the smallest and the largest N: the middle N is then predicted (interpolated in
    N; each size's CPU costs get their own contention exponent from its two N)."""
    return df["ranks"].isin([df["ranks"].min(), df["ranks"].max()])


CALIBRATIONS = {"default": default_calibration_rows, "size-ends": size_ends_calibration_rows,
                "rank-ends": rank_ends_calibration_rows}


def validate(measured_csv, calibration=default_calibration_rows, tolerance: float = 0.20,
             min_params: int = 1_000_000):
    """Predicted against measured per-step times, every row; free parameters fitted per topology
    on the rows `calibration(df)` selects (default: N = 2, plus N = max at the smallest size) and
    marked split = "calibration"; every other row is split = "validation".

    `measured_csv`: one bench CSV (path or DataFrame), or a list of sweeps of the same grid, whose
    per-row medians are then used (`combine_sweeps`; `sweep_spread` = their max / min - 1).
    Columns: keys, oversubscribed (N > cores: the ranks share cores, unlike on a cluster), sweeps,
    sweep_spread, measured and predicted t_step (rel_error = predicted / measured - 1, within =
    |rel_error| <= tolerance) -- the headline: the bench's speedups are ratios of t_step; the same
    for t_exchange (exchange_rel_error, exchange_within) and t_wire alone (wire_rel_error,
    wire_within), the CPU components, predicted and measured speedup over fp32_native, and the
    MPICH byte model against the interface counters (wire_bytes_error).
    `table.attrs["params"]`: {topology: EmuParams}."""
    import numpy as np
    import pandas as pd

    df = _load(measured_csv)
    df = df[df["params"] >= min_params].reset_index(drop=True)
    outs, fitted = [], {}
    for topo, grp in df.groupby("topology", sort=True):
        grp = grp.reset_index(drop=True)
        cal = np.asarray(calibration(grp), dtype=bool)
        if not cal.any():
            raise ValueError(f"{topo}: no calibration rows selected")
        p = calibrate(grp[cal])
        fitted[topo] = p
        out = predict_emulation(grp, p)
        out["split"] = np.where(cal, "calibration", "validation")
        outs.append(out)
    out = pd.concat(outs, ignore_index=True)
    for c in ("t_scalers", "t_exchange"):
        if c not in out:
            out[c] = np.nan
    out["rel_error"] = out["pred_t_step"] / out["t_step"] - 1.0
    out["within"] = out["rel_error"].abs() <= tolerance
    out["exchange_rel_error"] = out["pred_t_exchange"] / out["t_exchange"] - 1.0
    out["exchange_within"] = out["exchange_rel_error"].abs() <= tolerance
    out["wire_rel_error"] = out["pred_t_wire"] / out["t_wire"] - 1.0
    out["wire_within"] = out["wire_rel_error"].abs() <= tolerance
    key = ["topology", "rate", "ranks", "params"]
    base = out[out["mode"] == "fp32_native"].set_index(key)
    idx = pd.MultiIndex.from_frame(out[key])
    out["speedup"] = base["t_step"].reindex(idx).to_numpy() / out["t_step"]
    out["pred_speedup"] = base["pred_t_step"].reindex(idx).to_numpy() / out["pred_t_step"]
    out["wire_bytes_error"] = out["pred_wire_bytes"] / out["wire_bytes"] - 1.0
    out["oversubscribed"] = out["ranks"] > out["cores"] if "cores" in out else False
    cols = key + ["mode", "split", "oversubscribed", "sweeps", "sweep_spread", "t_step", "pred_t_step", "rel_error",
                  "within", "t_exchange", "pred_t_exchange",
                  "exchange_rel_error", "exchange_within", "t_wire", "pred_t_wire", "wire_rel_error", "wire_within",
                  "t_encode", "pred_t_encode", "t_scalers", "pred_t_scalers", "t_decode", "pred_t_decode",
                  "ext_load", "speedup", "pred_speedup", "wire_bytes", "pred_wire_bytes", "wire_bytes_error"]
    out = out[cols]
    out.attrs["params"] = fitted
    return out


def validation_summary(table):
    """Share of validation rows within tolerance, per topology, rate and mode (step, exchange, wire)."""
    v = table[table["split"] == "validation"]
    return v.groupby(["topology", "rate", "mode"]).agg(rows=("within", "size"), step_within=("within", "mean"),
                                                       exchange_within=("exchange_within", "mean"),
                                                       wire_within=("wire_within", "mean"),
                                                       median_abs_error=("rel_error", lambda x: x.abs().median()))


def describe_params(p: EmuParams, name: str = "") -> str:
    """The fitted parameters, readable: network constants, then per CPU cost its exponent and its
    ns per element at each calibrated size."""
    net = (f"eta {p.eta:.3f}, cap {p.cap / 1e9:.2f} GB/s x (N/2)^{p.kappa:.2f}, cap_root {p.cap_root / 1e9:.2f} GB/s / "
           f"o^{p.nu:.2f}, alpha {p.alpha * 1e6:.0f} us + {p.alpha_os * 1e6:.0f} us x (o-1) per round, "
           f"beta_sc {p.beta_sc * 1e3:.2f} ms x (o-1), q_exact {p.q_exact * 1e12:.1f} ps/B x (o-1), cores {p.cores:g}")
    cpu = []
    for attr in sorted({a for a, _ in p.cpu}):
        sizes = ", ".join(f"{P / 1e6:g}M {v * 1e9:.2f}"
                          + (f" (gamma {p.gammas[(a, P)]:.2f})" if (a, P) in p.gammas else "")
                          for (a, P), v in sorted(p.cpu.items()) if a == attr)
        cpu.append(f"    {attr:14s} gamma {p.gammas.get(attr, p.gamma):.3f}  ns/element: {sizes}")
    return "\n".join([f"{name}: {net}"] + cpu)


def worst_rows(table, k: int = 10, split: str = "validation"):
    """The k rows of `split` with the largest |rel_error| of t_step."""
    v = table[table["split"] == split]
    v = v.reindex(v["rel_error"].abs().sort_values(ascending=False).index)
    return v.head(k)[["topology", "rate", "ranks", "params", "mode", "t_step", "pred_t_step", "rel_error",
                      "t_wire", "pred_t_wire", "t_decode", "pred_t_decode"]]


CLI_OUT = "results/analysis"              # = tgsim.analysis.common.DEFAULT_OUT, as every `tgsim analyze` check
BENCH_CSV = "results/bench_exchange.csv"  # `tgsim bench exchange`'s default --out
FIG5_NAME, VALIDATION_NAME = "perfmodel_fig5", "perfmodel_validation"
FIG5_QUICK_NETS = "alexnet"


def _out_arguments(p, name: str, quick_help: str) -> None:
    """--out DIR (name.csv is written inside it) and --quick, as every `tgsim analyze` check has them."""
    p.add_argument("--out", default=CLI_OUT, help=f"directory for {name}.csv (default %(default)s)")
    p.add_argument("--quick", action="store_true", help=quick_help)


def _fig5_arguments(f) -> None:
    """The arguments of `fig5` (python -m ... fig5, tgsim analyze perfmodel-fig5)."""
    _out_arguments(f, FIG5_NAME, f"small parameters: --nets {FIG5_QUICK_NETS}")
    f.add_argument("--pattern", default="ps", choices=["ps", "ring", "allgather"])
    f.add_argument("--servers", type=int, default=1)
    f.add_argument("--downlink", default="sum", choices=["sum", "reternarize"])
    f.add_argument("--nets", default=None,
                   help=f"comma list (default {','.join(FIG5_NETS)}; --quick {FIG5_QUICK_NETS})")
    f.set_defaults(func=_run_fig5, prog=f.prog)


def _validate_arguments(v) -> None:
    """The arguments of `validate` (python -m ... validate, tgsim analyze perfmodel-validate)."""
    v.add_argument("csv", nargs="*", default=[BENCH_CSV],
                   help="one bench CSV, or several sweeps of the same grid (their per-row medians are used)")
    v.add_argument("--calibration", default="default", choices=sorted(CALIBRATIONS),
                   help="rows to fit on: default = N = 2 + the smallest size at the largest N; size-ends = the "
                        "same without the middle sizes at N = 2; rank-ends = every row at the smallest and "
                        "largest N (the rows left out are predicted)")
    _out_arguments(v, VALIDATION_NAME, "the same run: its time is set by the CSV (the grid of `tgsim bench exchange "
                                      "--quick`, N = 2, 4 and 1M, 4M, takes about a second; the default "
                                      "calibration fits N = 2 and 1M at N = 4 and validates 4M at N = 4)")
    v.set_defaults(func=_run_validate, prog=v.prog)


def _bad_out(args, name: str) -> bool:
    """True (after one line on stderr) when --out names a .csv file instead of a directory."""
    import sys

    if not str(args.out).lower().endswith(".csv"):
        return False
    print(f"{args.prog}: --out takes a directory ({name}.csv is written inside it), got {args.out}", file=sys.stderr)
    return True


def _write(df, out: str, name: str, t0: float) -> None:
    """df -> out/name.csv (directory created), and the line that says so."""
    import time
    from pathlib import Path

    Path(out).mkdir(parents=True, exist_ok=True)
    df.to_csv(Path(out) / f"{name}.csv", index=False)
    print(f"\nwrote {name}.csv to {out}/ ({time.perf_counter() - t0:.1f} s)")


def _run_fig5(args) -> int:
    """Throughput vs GPUs, fp32 vs TernGrad, both clusters: print the gains, write perfmodel_fig5.csv."""
    import time

    import pandas as pd

    if _bad_out(args, FIG5_NAME):
        return 2
    t0 = time.perf_counter()
    nets = args.nets or (FIG5_QUICK_NETS if args.quick else ",".join(FIG5_NETS))
    df = fig5(tuple(nets.split(",")), Exchange(args.pattern, servers=args.servers, downlink=args.downlink))
    g = gain_table(df)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(g.pivot_table(index=["cluster", "net"], columns="gpus", values="gain").round(2))
    _write(df.merge(g[["net", "cluster", "gpus", "gain"]], on=["net", "cluster", "gpus"]), args.out, FIG5_NAME, t0)
    return 0


def _missing_measurements(args) -> bool:
    """True (after one line on stderr naming the missing file and the command that makes it) when a
    measurement CSV does not exist."""
    import sys
    from pathlib import Path

    missing = [c for c in args.csv if not Path(c).is_file()]
    if not missing:
        return False
    make = " ".join(["tgsim bench exchange"] + ([] if missing[0] == BENCH_CSV else ["--out", missing[0]]))
    print(f"{args.prog}: no measurements at {', '.join(missing)}: make them with `{make}` "
          f"(needs root; --quick: about a minute)", file=sys.stderr)
    return True


def _print_validation(out) -> None:
    """The fitted parameters, the share of rows within 20% (per topology, rate, mode) and the worst rows."""
    import pandas as pd

    for topo, p in out.attrs["params"].items():
        print(describe_params(p, topo))
    with pd.option_context("display.width", 200, "display.max_rows", 500, "display.max_columns", 30):
        print(validation_summary(out).round(2))
        v = out[out["split"] == "validation"]
        print(f"validation rows within 20%: t_step {v['within'].mean():.0%} ({int(v['within'].sum())}/{len(v)}), "
              f"t_exchange {v['exchange_within'].mean():.0%}, t_wire {v['wire_within'].mean():.0%}; "
              f"calibration rows (t_step): {out.loc[out['split'] == 'calibration', 'within'].mean():.0%}")
        print(v.groupby(["topology", "rate"])["within"].mean().round(2).to_string())
        for flag, part in v.groupby("oversubscribed"):
            print(f"  {'oversubscribed (N > cores)' if flag else 'one rank per core'}: t_step within 20% "
                  f"in {int(part['within'].sum())}/{len(part)} rows")
        if int(out["sweeps"].max()) > 1:
            noisy = v["sweep_spread"] > 0.20
            print(f"  medians of {int(out['sweeps'].max())} sweeps; {int(noisy.sum())}/{len(v)} validation rows "
                  f"differ by > 20% between sweeps; of the rows that do not, "
                  f"{int(v.loc[~noisy, 'within'].sum())}/{int((~noisy).sum())} are within 20%")
        print("worst validation rows:")
        print(worst_rows(out).round(4).to_string(index=False))


def _run_validate(args) -> int:
    """Calibrate on the measurements, print the validation, write perfmodel_validation.csv; exit 2
    (one line on stderr) when the CSV is missing or the calibration leaves no row to validate."""
    import sys
    import time

    if _bad_out(args, VALIDATION_NAME) or _missing_measurements(args):
        return 2
    t0 = time.perf_counter()
    out = validate(args.csv, calibration=CALIBRATIONS[args.calibration])
    if not (out["split"] == "validation").any():
        print(f"{args.prog}: calibration {args.calibration!r} fits every row of this grid (N = "
              f"{', '.join(str(n) for n in sorted(set(out['ranks'])))}): nothing is left to validate; "
              f"use --calibration default", file=sys.stderr)
        return 2
    _print_validation(out)
    _write(out, args.out, VALIDATION_NAME, t0)
    return 0


def register_cli(sub) -> None:
    """Add `perfmodel-fig5` and `perfmodel-validate` to an argparse subparsers object (for
    analysis/cli.py: `register_cli(sub)` inside `add_subcommands`); they run what `main`'s fig5 and
    validate run."""
    _fig5_arguments(sub.add_parser("perfmodel-fig5", help="TernGrad Fig. 5: throughput vs GPUs, fp32 vs TernGrad "
                                                         "(perfmodel_fig5.csv)"))
    _validate_arguments(sub.add_parser("perfmodel-validate", help="performance model vs `tgsim bench exchange` "
                                                                  "measurements (perfmodel_validation.csv)"))


def main(argv=None) -> int:
    """python -m tgsim.analysis.perfmodel fig5 [--out DIR] [--quick] | validate [CSV ...] [--out DIR] [--quick]"""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tgsim.analysis.perfmodel", description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    _fig5_arguments(sub.add_parser("fig5", help="throughput vs GPUs, fp32 vs TernGrad, both clusters (tidy CSV)"))
    _validate_arguments(sub.add_parser("validate", help="predicted vs measured exchange times of `tgsim bench "
                                                        "exchange`"))
    args = ap.parse_args(argv)
    return args.func(args)



__all__ = ["CLUSTERS", "FIG5_NETS", "claim_gain_grows_as_bandwidth_falls", "claim_gain_grows_with_fc_weights",
           "claim_gain_grows_with_workers", "Cluster", "EmuParams", "Exchange", "MODES", "Network", "bench_layer_sizes", "calibrate",
           "fig5", "gain_table", "iteration", "layer_bytes", "message_header_bytes", "message_seconds",
           "mode_collectives", "mode_payloads", "mpich_collective_bytes", "predict_components", "predict_emulation",
           "predict_wire", "throughput_table", "uint_width", "validate", "validation_summary", "wire_bytes_model",
           "default_calibration_rows", "size_ends_calibration_rows", "rank_ends_calibration_rows", "CALIBRATIONS",
           "combine_sweeps", "describe_params", "main", "register_cli", "worst_rows"]


if __name__ == "__main__":
    raise SystemExit(main())
