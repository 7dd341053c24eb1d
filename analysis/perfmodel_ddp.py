"""Step time of synchronous data-parallel training as PyTorch DDP over NCCL runs it: gradient buckets
overlapped with the backward pass, node-aware collectives, codec seconds on the critical path.

    step = ddp_step(net, wire, gpus=64, hw=HARDWARE["p100-fp32"], network=Link("10 Gb/s", 10e9, 50e-6),
                    exchange=DDPExchange("allreduce"))          # dict: iteration, compute, exposed_comm, ...

BUCKETS. The gradient is cut into buckets of `bucket_mb` MiB of float32 gradient (DDP's
bucket_cap_mb, 25 by default), filled with whole layers in the order their gradients become ready
(the last layer first); a layer larger than a bucket is a bucket of its own. bucket_mb = 0: one
bucket per layer (the per-layer messages of `perfmodel_throughput`). Every method uses the same
buckets; a codec encodes a bucket (its layers' parameter shapes, for a shape-dependent codec).

TIMELINE of one step (one GPU; forward F, backward W split over the layers by forward MACs):
  ready_b     = F + W x (share of the backward done when bucket b's last layer is) + sum of the
                encode seconds of the buckets before b (a codec's kernels take the GPU: the backward
                waits for them; a codec cannot overlap with the computation it follows)
  scaler_b    a codec that shares statistics (properties.shared_stats: TernGrad's per-layer max)
              first all-reduces one float per layer of the bucket: on the communication stream,
              start max(ready_b, stream free), and the encode waits for it (latency + dependency)
  encode_b    start max(ready_b or scaler end, previous encode end), `CodecCost.encode_seconds`
  exchange_b  start max(encode end, stream free), one collective (below); the stream is then busy
  decode_b    after the exchange; ends the bucket
  step        = max(F + W + sum encode + sum decode, last bucket's end); exposed = step - (F + W)
overlap=False: step = F + W + the sum over buckets of scaler + encode + exchange + decode.

COLLECTIVES (S bytes per GPU, G GPUs, g per node, n = ceil(G/g) nodes; a network link of bandwidth
B, latency a per hop, efficiency eta; an intra-node NVLink-class link B_i, a_i; NCCL's tuning model
counts hops the same way, its inter-node steps at the network's latency, the rest at the
intra-node one):
  ring all-reduce   2(G-1)/G S / (eta B) + 2(n-1) a + 2(G-n) a_i          (B_i, a_i alone when n = 1)
  tree all-reduce   2 S / (eta B) + 2 (ceil(log2 n) a + (min(G, g) - 1) a_i): reduce up and broadcast
                    down a (double) binary tree of nodes, a chain inside each; the two phases are not
                    credited with pipelining. allreduce = the faster of ring and tree, per message
  all-gather        (G-1) S / (eta B) + (n-1) a + (G-n) a_i: grows with G (every message reaches all)
  Parameter servers, two distinct patterns, each the code's exchange mode of the same name (S_up: one
  worker's whole message, S_down: the server's whole answer, the sums at w = ceil(log2(2G+1)) bits):
  sharded_ps        tgsim/exchange/sharded.py: every rank owns 1/G of the elements; one Alltoallv takes
                    each rank's codes of shard r to rank r, the owner sums them exactly, one Allgatherv
                    returns every owner's sums to all. Per NIC, out and in at once (full duplex: the
                    larger), the two collectives one after the other; a node's g GPUs share its NIC
                    (their shards on other nodes' NICs; one shard per node gives the same NIC bytes):
                    push = max(g S_up (n-1)/n, (G-g) S_up / n) / (eta B) + a, pull likewise with S_down
                    (one GPU per node: (G-1)/G (S_up + S_down) through each link, each way; flat in G)
  ps                the code's mode "ps": ONE server, rank 0, itself a worker. Its link takes the G-g
                    uplinks of the other nodes in and sends as many downlinks out (the g-1 of its own
                    node on the intra-node link, in parallel: the slower of the two links counts):
                    in = (G-g) S_up / (eta B), out = (G-g) S_down / (eta B)     (n = 1: (G-1) S, intra)
                    pipelined in K pieces of 2^18 elements (tgsim.exchange.pieces: piece k's sums leave
                    while piece k+1 arrives) on the full-duplex link:
                    ps = max(in, out) + min(in, out) / K + 2 a   (K = 1, a whole message: in + out + 2 a)
                    the busiest link carries G-1 messages: the step grows linearly with G
  ps, M dedicated servers (`servers` > 0; no mode of the code): their own NICs, charged:
                    push = max(g S_up, G S_up / M) / (eta B) + a, pull likewise
A multi-round codec (Wire.rounds = R) pays the latency terms R times. Decoding (`_decode`, cost.decode
per element and message): a ring decodes its summed buffer once, an all-gather G-1 messages; ps: the
server decodes-and-adds all G messages of n elements (G n), then every rank the answer (n);
sharded_ps: each owner G pieces of n/G, then the answer; M dedicated servers: G pieces of n/M.

HARDWARE (`HARDWARE`): compute = the net's P100 fp32 time (`perfmodel_nets`) / speed; a row names
its GPUs per node and its NVLink-class link; `speed` may be scaled (`compute_speed`) for the
sensitivity table. The numbers and their sources are in docs/THEORY.md §6.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tgsim.analysis.perfmodel_emulation import CHUNK
from tgsim.analysis.perfmodel_nets import Net, get_net
from tgsim.analysis.perfmodel_throughput import Wire

MIB = 1 << 20
PATTERNS = ("allreduce", "ring", "tree", "ps", "sharded_ps", "allgather")


@dataclass(frozen=True)
class Link:
    """One direction of a link: bandwidth (bits/s), latency per hop or message (s), efficiency."""
    name: str
    bandwidth: float
    latency: float
    efficiency: float = 0.9

    def seconds(self, nbytes: float) -> float:
        """8 nbytes / (efficiency x bandwidth)."""
        return 8.0 * nbytes / (self.efficiency * self.bandwidth)


@dataclass(frozen=True)
class Hardware:
    """A node type: compute speed relative to the P100-class fp32 row, GPUs per node, the link inside."""
    name: str
    speed: float
    gpus_per_node: int
    intra: Link
    precision: str
    source: str


HARDWARE = {
    "p100-fp32": Hardware("P100-class, fp32", 1.0, 4, Link("NVLink 1 (P100 SXM2)", 320e9, 1e-6, 1.0), "float32",
                          "perfmodel_nets: convnet-benchmarks Titan X fp32 times x 6.6/10.6 peak TFLOP/s"),
    "h100-amp": Hardware("H100-class, AMP (bf16/fp16 compute)", 12.0, 8, Link("NVLink 4 (H100 SXM)", 3.6e12, 1e-6, 1.0),
                         "amp", "x12 the P100 fp32 row: published per-GPU ResNet-50 training rates, about 3,000 "
                                "images/s on an H100 with AMP against about 250 on a P100 in fp32 (an assumption)"),
}


@dataclass(frozen=True)
class CodecCost:
    """Seconds of a codec's encode (one worker's bucket) and decode-and-add (one message) on n elements:
    max(floor, per_element x n); `source` says where the numbers were measured ("host", "gpu", "none")."""
    encode: float = 0.0
    decode: float = 0.0
    encode_floor: float = 0.0
    decode_floor: float = 0.0
    source: str = "none"

    def encode_seconds(self, n: int) -> float:
        return max(self.encode_floor, self.encode * n) if self.encode or self.encode_floor else 0.0

    def decode_seconds(self, n: int) -> float:
        return max(self.decode_floor, self.decode * n) if self.decode or self.decode_floor else 0.0


@dataclass(frozen=True)
class DDPExchange:
    """pattern: "allreduce" (ring or tree, the faster), "ring", "tree", "allgather", and the two parameter
    servers (module docstring): "ps" = the code's ps mode, rank 0 the one server (servers = 0), or M > 0
    dedicated servers (`servers` = M); "sharded_ps" = the code's sharded_ps mode, one shard per worker
    (servers must be 0). bucket_mb: MiB of float32 gradient per bucket (0: one per layer); overlap:
    buckets leave during the backward pass."""
    pattern: str = "allreduce"
    servers: int = 0
    bucket_mb: float = 25.0
    overlap: bool = True

    def __post_init__(self):
        if self.pattern not in PATTERNS:
            raise ValueError(f"unknown pattern {self.pattern!r}; valid: {', '.join(PATTERNS)}")
        if self.servers < 0 or self.bucket_mb < 0:
            raise ValueError("servers and bucket_mb must be >= 0")
        if self.servers and self.pattern != "ps":
            raise ValueError(f"servers = {self.servers} applies to pattern 'ps' (dedicated servers), not "
                             f"{self.pattern!r}")

    @property
    def server(self) -> str:
        """Which parameter server the pattern assumes: "rank 0", "sharded over the workers",
        "M dedicated", or "none" (all-reduce, all-gather)."""
        if self.pattern == "ps":
            return f"{self.servers} dedicated" if self.servers else "rank 0"
        return "sharded over the workers" if self.pattern == "sharded_ps" else "none"


@dataclass(frozen=True)
class Bucket:
    """Layers sent together: elements, parameter shapes, layer count, and the share of the backward
    pass done when its last-ready layer's gradient is."""
    elements: int
    shapes: tuple
    layers: int
    ready: float


def buckets(net: Net, bucket_mb: float = 25.0) -> list[Bucket]:
    """The net's layers, last first, cut into buckets of at most bucket_mb MiB of float32 gradient
    (a bucket closes when the next layer would overflow it; a layer larger than the cap is alone)."""
    cap = bucket_mb * MIB / 4.0
    total = sum(l.macs for l in net.layers) or 1
    out, cur, done = [], [], 0.0

    def close():
        out.append(Bucket(sum(l.params for l in cur), tuple(s for l in cur for s in l.shapes), len(cur), done))

    for layer in reversed(net.layers):
        if cur and (bucket_mb == 0 or sum(l.params for l in cur) + layer.params > cap):
            close()
            cur = []
        cur.append(layer)
        done += layer.macs / total
    if cur:
        close()
    return out


def _nodes(G: int, g: int) -> int:
    return -(-G // g)


def ring_allreduce(S: float, G: int, g: int, net: Link, intra: Link, rounds: int = 1) -> float:
    """2(G-1)/G S over the bottleneck link + 2(n-1) network and 2(G-n) intra-node hop latencies."""
    if G <= 1:
        return 0.0
    n = _nodes(G, g)
    link = net if n > 1 else intra
    lat = 2 * (n - 1) * net.latency + 2 * (G - n) * intra.latency
    return link.seconds(2 * (G - 1) / G * S) + rounds * lat


def tree_allreduce(S: float, G: int, g: int, net: Link, intra: Link, rounds: int = 1) -> float:
    """2 S over the bottleneck link + 2 (ceil(log2 n) network + (min(G, g) - 1) intra-node) latencies."""
    if G <= 1:
        return 0.0
    n = _nodes(G, g)
    link = net if n > 1 else intra
    lat = 2 * (math.ceil(math.log2(n)) * net.latency + (min(G, g) - 1) * intra.latency)
    return link.seconds(2 * S) + rounds * lat


def allgather(S: float, G: int, g: int, net: Link, intra: Link, rounds: int = 1) -> float:
    """(G-1) S over the bottleneck link + (n-1) network and (G-n) intra-node hop latencies."""
    if G <= 1:
        return 0.0
    n = _nodes(G, g)
    link = net if n > 1 else intra
    return link.seconds((G - 1) * S) + rounds * ((n - 1) * net.latency + (G - n) * intra.latency)


def sharded_ps(up: float, down: float, G: int, g: int, net: Link, intra: Link, rounds: int = 1) -> float:
    """The code's sharded_ps (module docstring): an Alltoallv of the codes, then an Allgatherv of the
    owners' sums (up, down: one worker's whole message and the whole answer, bytes), each NIC full
    duplex; one shard per node on its NIC (per GPU on the intra-node link when G fits one node)."""
    if G <= 1:
        return 0.0
    n = _nodes(G, g)
    M, link, gl = (n, net, g) if n > 1 else (G, intra, 1)
    push = max(gl * up * (M - 1) / M, (G - gl) * up / M)
    pull = max(gl * down * (M - 1) / M, (G - gl) * down / M)
    return link.seconds(push) + link.seconds(pull) + rounds * 2 * link.latency


def rank0_ps(up: float, down: float, G: int, g: int, net: Link, intra: Link, rounds: int = 1,
             pieces: int = 1) -> float:
    """The code's ps (module docstring): rank 0 takes the G-1 others' uplinks (up bytes each) in and
    sends G-1 downlinks (down bytes) out on its full-duplex link(s), pipelined in `pieces` pieces:
    max(in, out) + min(in, out) / pieces + 2 latencies (pieces = 1: in + out)."""
    if G <= 1:
        return 0.0
    n = _nodes(G, g)
    if n > 1:       # the other nodes' G - g through rank 0's NIC, its node's g - 1 over the intra link
        t_in = max(net.seconds((G - g) * up), intra.seconds((g - 1) * up))
        t_out = max(net.seconds((G - g) * down), intra.seconds((g - 1) * down))
        lat = net.latency
    else:
        t_in, t_out, lat = intra.seconds((G - 1) * up), intra.seconds((G - 1) * down), intra.latency
    k = max(1, int(pieces))
    return max(t_in, t_out) + min(t_in, t_out) / k + rounds * 2 * lat


def parameter_server(up: float, down: float, G: int, g: int, net: Link, intra: Link, servers: int = 0,
                     rounds: int = 1, pieces: int = 1) -> float:
    """Pattern "ps" of one message (up, down bytes per worker): servers = 0, rank 0's single server
    (`rank0_ps`, the code's ps mode); M > 0 dedicated servers on NICs of their own. (The server sharded
    over the workers is `sharded_ps`.)"""
    if G <= 1:
        return 0.0
    if not servers:
        return rank0_ps(up, down, G, g, net, intra, rounds, pieces)
    M, gl = servers, min(G, g)
    push = max(gl * up, G * up / M)
    pull = max(gl * down, G * down / M)
    return net.seconds(push) + net.seconds(pull) + rounds * 2 * net.latency


def pieces_of(elements: int) -> int:
    """Pieces of the code's pipelined ps for a message of `elements` (tgsim.exchange.mpi.CHUNK each)."""
    return max(1, -(-int(elements) // CHUNK))


def collective(ex: DDPExchange, b: dict, G: int, g: int, net: Link, intra: Link, rounds: int = 1,
               pieces: int = 1) -> tuple[float, str]:
    """(seconds, the algorithm used) of one bucket's exchange; b = the Wire's bytes of the bucket;
    pieces: of the pipelined rank-0 ps (`pieces_of` the bucket's elements). Algorithms: "ring", "tree",
    "allgather", "ps(rank 0)", "ps(M dedicated servers)", "sharded_ps"."""
    if ex.pattern in ("allreduce", "ring", "tree"):
        opts = {"ring": ring_allreduce(b["reduce"], G, g, net, intra, rounds),
                "tree": tree_allreduce(b["reduce"], G, g, net, intra, rounds)}
        algo = min(opts, key=opts.get) if ex.pattern == "allreduce" else ex.pattern
        return opts[algo], algo
    if ex.pattern == "allgather":
        return allgather(b["up"], G, g, net, intra, rounds), "allgather"
    if ex.pattern == "sharded_ps":
        return sharded_ps(b["up"], b["down"], G, g, net, intra, rounds), "sharded_ps"
    return parameter_server(b["up"], b["down"], G, g, net, intra, ex.servers, rounds, pieces), \
        f"ps({ex.servers} dedicated servers)" if ex.servers else "ps(rank 0)"


def scaler_allreduce(layers: int, G: int, g: int, net: Link, intra: Link) -> float:
    """One float per layer, all-reduced (max) before the encode: the faster of ring and tree."""
    S = 4.0 * layers
    return min(ring_allreduce(S, G, g, net, intra), tree_allreduce(S, G, g, net, intra))


def _decode(wire: Wire, cost: CodecCost, n: int, G: int, ex: DDPExchange, nodes: int) -> float:
    """Decode seconds of one bucket: the messages `Wire.decode_seconds` counts, each costed by `cost`."""
    if not (cost.decode or cost.decode_floor):
        return 0.0
    if ex.pattern in ("ps", "sharded_ps"):       # the server(s) add G messages' shares, every rank the answer
        M = G if ex.pattern == "sharded_ps" else (ex.servers or 1)
        return G * cost.decode_seconds(-(-n // M)) + cost.decode_seconds(n)
    return cost.decode_seconds(n) * ((G - 1) if ex.pattern == "allgather" else 1)


def compute_seconds(net: Net, hw: Hardware, batch: int | None = None, compute_speed: float = 1.0) -> float:
    """Forward + backward seconds of one per-GPU batch: the net's P100 fp32 time / (hw.speed x compute_speed)."""
    return net.compute_seconds("p100", batch) / (hw.speed * compute_speed)


def ddp_step(net: Net | str, wire: Wire, gpus: int, hw: Hardware, network: Link, exchange: DDPExchange | None = None,
             cost: CodecCost | None = None, shared_stats: bool = False, batch: int | None = None,
             compute_speed: float = 1.0) -> dict:
    """One step (see the module docstring). Returns seconds: iteration, compute, forward, backward,
    exposed_comm (iteration - compute), codec_seconds (encode + decode), comm (the exchanges and
    scaler all-reduces), latency (their latency terms alone); buckets, algorithms (the collectives used)."""
    net = get_net(net) if isinstance(net, str) else net
    ex = exchange or DDPExchange()
    cost = cost or CodecCost()
    compute = compute_seconds(net, hw, batch, compute_speed)
    fwd = net.fwd_frac * compute
    bwd = compute - fwd
    g, G = hw.gpus_per_node, gpus
    nodes = _nodes(G, g)
    bks = buckets(net, ex.bucket_mb)
    zero_lat = (Link(network.name, network.bandwidth, 0.0, network.efficiency),
                Link(hw.intra.name, hw.intra.bandwidth, 0.0, hw.intra.efficiency))
    enc_total = dec_total = comm_total = lat_total = 0.0
    stream = enc_free = last_end = 0.0
    algos = set()
    serial = fwd + bwd
    for bk in bks:
        if G == 1:
            break
        ready = fwd + bwd * bk.ready + enc_total
        nbytes = wire.layer_bytes(bk.elements, G, bk.shapes)
        k = pieces_of(bk.elements)
        t_x, algo = collective(ex, nbytes, G, g, network, hw.intra, wire.rounds, k)
        t_x0, _ = collective(ex, nbytes, G, g, *zero_lat, wire.rounds, k)
        t_s = scaler_allreduce(bk.layers, G, g, network, hw.intra) if shared_stats else 0.0
        t_s0 = scaler_allreduce(bk.layers, G, g, *zero_lat) if shared_stats else 0.0
        enc = cost.encode_seconds(bk.elements)
        dec = _decode(wire, cost, bk.elements, G, ex, nodes)
        algos.add(algo)
        enc_total, dec_total = enc_total + enc, dec_total + dec
        comm_total += t_x + t_s
        lat_total += (t_x - t_x0) + (t_s - t_s0)
        if not ex.overlap:
            serial += t_s + enc + t_x + dec
            continue
        if t_s:
            stream = max(ready, stream) + t_s
            ready = stream
        e_end = max(ready, enc_free) + enc
        enc_free = e_end
        stream = max(e_end, stream) + t_x
        last_end = max(last_end, stream + dec)
    if G == 1:
        it = compute
    elif ex.overlap:
        it = max(fwd + bwd + enc_total + dec_total, last_end)
    else:
        it = serial
    return {"net": net.name, "codec": wire.name, "gpus": G, "compute": compute, "forward": fwd, "backward": bwd,
            "iteration": it, "exposed_comm": it - compute, "codec_seconds": enc_total + dec_total,
            "comm": comm_total, "latency": lat_total, "buckets": len(bks),
            "algorithms": ",".join(sorted(algos))}


__all__ = ["CodecCost", "DDPExchange", "HARDWARE", "Hardware", "Link", "Bucket", "PATTERNS", "allgather", "buckets",
           "collective", "compute_seconds", "ddp_step", "parameter_server", "pieces_of", "rank0_ps",
           "ring_allreduce", "scaler_allreduce", "sharded_ps", "tree_allreduce"]
