"""Predicted per-step times of `tgsim bench exchange` on its emulated network, mode by mode.

    p = EmuParams()                                          # or perfmodel_fit.calibrate(bench rows)
    predict_components("tg_ps", 4_000_000, 4, "1gbit", "shared", p)   # t_step, t_wire, t_encode, ...
    wire_bytes_model("tg_ps", 4_000_000, 4)                  # bytes MPICH moves over all links, one step

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
                Alltoallv, ring Allgatherv; checked against the interface counters (the modes
                before tg_sharded_ps): `wire_bytes_error`), less the
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
    tg_sharded_ps, tg_sharded_ps_whole (the code's sharded_ps, tgsim/exchange/sharded.py, pipelined in
                pieces and whole; both modeled whole, the pieces' 8-byte headers left out): an Alltoallv of
                every rank's blocks [u64 count | shard r's 2-bit codes] (each rank sends (N-1)/N of
                its codes), the owners' sums, an Allgatherv of the blocks [u64 status | sums at
                ceil(log2(2N+1)) bits] (each rank sends its block to N-1 ranks): the additive form,
                every link busy in both directions; its CPU (c_sharded_ps: unpack, cut and pack the
                codes, sum one shard of N blocks, unpack and decode every sum) held flat in N (not
                measured in process: cpu_shape 1; the fit gives its cost per element).

`EmuParams` holds the free parameters; `perfmodel_fit` fits them to measured bench rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from tgsim.analysis.perfmodel_throughput import packed_size, uint_width

# -- bytes of one bench step: the codec's messages and MPICH's collectives --------------------------

MODES = ("fp32_exact", "fp32_native", "tg_allreduce", "tg_ps", "tg_allgather", "tg_ps_collective", "tg_ps_whole",
         "tg_allgather_whole", "tg_sharded_ps", "tg_sharded_ps_whole")
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


SHARD_HEADER = 8       # bytes: the u64 count of a sharded uplink block, the u64 status of a downlink block


def sharded_blocks(total: int, n: int, packing: str = "2bit") -> tuple[list[int], list[int]]:
    """Bytes of the sharded_ps blocks of `total` ternary elements over n ranks (tgsim/exchange/sharded.py:
    shard r = elements [r T // n, (r+1) T // n) of the layers concatenated): (up, down), up[r] = one
    sender's block of shard r (SHARD_HEADER + its packed codes), down[r] = owner r's block
    (SHARD_HEADER + ceil(c_r w / 8), w = ceil(log2(2n+1)))."""
    w = uint_width(n)
    counts = [(r + 1) * total // n - r * total // n for r in range(n)]
    return ([SHARD_HEADER + packed_size(c, packing) for c in counts],
            [SHARD_HEADER + -(-c * w // 8) for c in counts])


def mode_payloads(mode: str, sizes: Sequence[int], n: int, packing: str = "2bit") -> dict:
    """Payload buffer sizes (bytes) of one step of a bench mode: what MPIExchange hands to MPI.
    tg_sharded_ps: "alltoallv" = one sender's whole Alltoallv buffer (its block for every shard, its
    own included), "allgatherv" = the whole gathered buffer (every owner's block)."""
    P = sum(sizes)
    if mode in ("fp32_exact", "fp32_native"):
        return {"reduce": 4 * P}
    if mode == "tg_allreduce":
        return {"reduce": P * (1 if n <= 127 else 2), "scalers": 4 * len(sizes)}
    if mode in ("tg_sharded_ps", "tg_sharded_ps_whole"):    # the whole form's bytes (pieces add a header each)
        up, down = sharded_blocks(P, n, packing)
        return {"alltoallv": sum(up), "allgatherv": sum(down), "scalers": 4 * len(sizes)}
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
    alltoallv   pairwise (nbytes = one rank's whole buffer, a block per rank): every rank sends
                (n-1)/n of it and receives as much, in n-1 rounds
    allgatherv  ring (nbytes = the whole gathered buffer, a block per rank): every rank receives the
                n-1 other blocks, (n-1)/n of it, in n-1 rounds
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
    if coll in ("alltoallv", "allgatherv"):
        return (n - 1) * nbytes, (n - 1) / n * nbytes, n - 1
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
    if mode in ("tg_sharded_ps", "tg_sharded_ps_whole"):   # Alltoallv of the codes, Allgatherv of the sums
        return out + [("alltoallv", pay["alltoallv"]), ("allgatherv", pay["allgatherv"])]
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


# -- the free parameters and the predicted components ------------------------------------------


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
    c_sharded_ps: float = 8e-9        # sharded ps: unpack, cut and pack the codes, sum a shard, decode (a guess)
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


def cpu_shape(mode: str, n: int, part: str = "all") -> float:
    """CPU work of `mode`'s exchange at n ranks relative to n = 2 (part: server | decode | all, ps only)."""
    if mode.startswith("tg_ps"):
        srv, dec = _interp(_SHAPE_POINTS["ps_server"], n), _interp(_SHAPE_POINTS["ps_decode"], n)
        return {"server": srv, "decode": dec}.get(part, srv + dec)
    if mode.startswith("tg_allgather"):
        return _interp(_SHAPE_POINTS["tg_allgather"], n)
    return 1.0


CPU_ATTR = {"fp32_native": "c_fp32_native", "fp32_exact": "c_fp32_exact", "tg_allreduce": "c_ar_decode",
             "tg_ps": "c_ps_pipe", "tg_ps_collective": "c_ps", "tg_ps_whole": "c_ps", "tg_allgather": "c_ag_pipe",
             "tg_allgather_whole": "c_ag_decode", "tg_sharded_ps": "c_sharded_ps",
             "tg_sharded_ps_whole": "c_sharded_ps"}


def encode_attr(mode: str) -> str:
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
    ea = encode_attr(mode)
    enc = p.cost(ea, params) * params * p.contention(n, ext_load, ea, params) if tg else 0.0
    sc = scalers_seconds(n, p, ext_load) if tg else 0.0
    # on the step's path the scaler all-reduce costs its rounds alone: the bench's t_scalers (maximum
    # over ranks) also holds the wait for the slowest rank's encode, which t_encode (maximum) has
    sc_path = _log2(n) * p.round_latency(n, ext_load) if tg else 0.0
    terms = _wire_terms(mode, params, n, rate, topology, p, ext_load)
    parts = _collective_seconds(terms)
    wire = sum(parts)
    c = p.cost(CPU_ATTR[mode], params) * params * p.contention(n, ext_load, CPU_ATTR[mode], params)
    if mode in PIPELINED:                # pieces overlap the wire, the sums and the decode
        cpu = c * cpu_shape(mode, n)
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
        srv, dec = c * cpu_shape(mode, n, "server"), c * cpu_shape(mode, n, "decode")
        cpu = srv + dec
        up, down = parts
        seen = up + min(srv + down / max(1, n - 1), down) if mode == "tg_ps_whole" else wire
    else:
        cpu = c * cpu_shape(mode, n)
        seen = wire
    return {"t_wire": seen, "t_wire_path": wire, "t_encode": enc, "t_scalers": sc, "t_decode": cpu,
            "t_exchange": wire + cpu, "t_step": enc + sc_path + wire + cpu}
