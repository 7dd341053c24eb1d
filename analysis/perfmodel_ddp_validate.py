"""The DDP step model's collectives (`perfmodel_ddp`) against `tgsim bench exchange` measurements on
emulated links (tc in a private namespace, MPI over TCP; switch topology: every rank its own shaped
link, so a rank is a node of one GPU in the model), and its buckets and overlap against PyTorch DDP
over Gloo (`tgsim bench torch`).

    python -m tgsim.analysis.perfmodel_ddp_validate [results/bench_exchange.csv] [--latency 50e-6]
        [--torch results/bench_torch.csv]

Predicted, per bench row of `MODES` (P gradient elements in one message: the MPI exchange's 64 MiB
buckets hold the bench's whole gradient; N ranks; a link of the row's rate, `latency` per hop,
efficiency 0.9 as compare time's links, and the emulated link's token bucket, `tbf_saving`; a bench
mode is the exchange's mode with a "tg_" prefix: tg_ps = the exchange's "ps", rank 0's server, is
compared with the pattern "ps", never with the sharded server):
  fp32_native    the all-reduce of 4P bytes: the faster of ring and tree (`perfmodel_ddp.collective`)
  tg_allreduce   the scaler all-reduce (one float per bench layer) + the all-reduce of the int8 code
                 sums, P bytes (2P beyond 127 ranks), + the message header (`message_header_bytes`)
  tg_ps          the code's ps (`perfmodel_ddp` pattern "ps", `rank0_ps`): the scaler all-reduce + rank
                 0's ONE server, whose link takes N-1 slots in (`mode_payloads`' "gather": the length
                 word, the message header and the 2-bit codes) and sends N-1 downlinks out (its "bcast":
                 the status words and the sums at ceil(log2(2N+1)) bits), pipelined in
                 `perfmodel_emulation.pieces(P)` pieces on the full-duplex link
  tg_ps_whole    the same server not pipelined (one piece: in, then out)
  tg_sharded_ps  the code's sharded_ps (pattern "sharded_ps", `perfmodel_ddp.sharded_ps`): the scaler
                 all-reduce + an Alltoallv of the 2-bit codes, then an Allgatherv of the sums, every
                 link carrying (N-1)/N of each buffer (`perfmodel_emulation.sharded_blocks`, headers
                 included); a row whose mode is "sharded_ps" (the exchange's own name) is read as it
  other modes    left out (tg_allgather, tg_ps_collective's MPICH trees, fp32_exact: not modeled here)
Token bucket: netem.sh shapes with tc's tbf, whose bucket (`perfmodel_emulation.tbf_burst`: max(256
KiB, rate / 8000 bytes)) lets its bytes through at once when it is full, so a collective starting on a
rested link takes min(tokens, its bytes on the link) x 8 / (efficiency x rate) less; the bucket
refills at the rate while the link is idle (between the bench's steps: full again). Once per step:
on the first collective (tg_sharded_ps: the Alltoallv; the Allgatherv follows at once), on the
larger direction of the pipelined server's link (in and out have buckets of their own and run
together), on both directions of the whole-message server (in, then out).
against the bench's t_wire (the time inside MPI collectives, the minimum over ranks); ratio =
predicted / measured, within = |ratio - 1| <= 0.20. The model has no term for the host's CPU work
(the bench's encode and decode: the GPU's in the modeled cluster), so t_exchange and t_step are
shown beside it, not predicted. The shared topology (every byte through one shaped loopback) is not
a DDP cluster and is left out.

Scope (both tables). The model predicts the time a shaped link takes; on the emulation the host's
CPU also takes time (TCP on the loopback, copies, the reduction), and on a small host it can take
longer than the link. `host` is that time measured: the same point (mode or variant, N, P) on the
loopback unshaped (rate "none"), where the link is not the limit. A shaped row is a test of the
link model ("link") only when host <= HOST_SHARE x pred, HOST_SHARE = TOLERANCE / (1 - TOLERANCE)
= 0.25: were the host's time added to the link's (no overlap), a perfect link model would still
be within TOLERANCE of the measurement. Otherwise the row is `HOST_BOUND` (shown with its ratio,
not counted); without an unshaped row (host nan) a shaped row is "link". Unshaped rows themselves
are `OUT_OF_SCOPE`.

DDP over Gloo (`validate_ddp`, rows of `tgsim bench torch` of `DDP_MODES`, the `local` row of the same
rate as reference): measured = t_backward - t_backward(local), what DDP adds to the module's own
backward pass. Predicted = the exposed communication of the bench's ResNet (`bench_resnet_tensors`
of the row's width and input shape, its dim and channels columns, digits' 64 and 1 where a row
has none: its parameter tensors, checked against the row's params) with
  buckets   DDP's rebuilt buckets (`ddp_buckets`): the tensors in reverse forward order (the order
            their gradients become ready), a bucket closed as soon as it holds >= its cap of bytes:
            FIRST_BUCKET_MB (1 MiB, DDP's first-bucket cap) for the first, bucket_mb (DDP's
            bucket_cap_mb, 25) for the rest; 4 bytes per element (ddp_fp16: 2)
  overlap   bucket b is ready when the backward pass has done the MACs of its tensors and of every
            tensor after them (share x the measured t_backward(local)); its ring all-reduce starts at
            max(ready_b, the previous bucket's end) and runs alone on the link, less the token
            bucket's saving (Token bucket, above: tokens refill while the link idles between buckets);
            exposed = the last bucket's end - t_backward(local). One bucket: no overlap (it is ready at
            the end).
            pred_serial (every bucket after the backward pass) is shown beside it
  link      the row's rate shared by the N ranks (every rank's bytes cross the one shaped loopback,
            the shared topology): a ring all-reduce (`ring_allreduce`, N nodes of one GPU) on a Link
            of rate / N, `latency` per hop, efficiency 0.9
The model has no term for the CPU work of DDP and Gloo (copying gradients into buckets, the
reduction, the fp16 casts, TCP on the loopback): unshaped rows (rate none) are CPU-bound, not
link-bound, and are marked out of scope (scope column, no prediction); they give `host` (above)
for the shaped rows of the same variant: the backward-pass increase measured unshaped.
"""

from __future__ import annotations

import argparse
import math

import pandas as pd

from tgsim.analysis.perfmodel_ddp import (MIB, DDPExchange, Link, collective, rank0_ps, ring_allreduce,
                                          scaler_allreduce, sharded_ps)
from tgsim.analysis.perfmodel_emulation import (bench_layer_sizes, message_header_bytes, mode_payloads, pieces,
                                                tbf_burst)

MODES = ("fp32_native", "tg_allreduce", "tg_ps", "tg_ps_whole", "tg_sharded_ps", "tg_sharded_ps_whole")
ALIASES = {"sharded_ps": "tg_sharded_ps"}     # the exchange's own mode name -> the bench's
# tg_sharded_ps is pipelined in pieces (the owners' sums overlap the wire) and tg_sharded_ps_whole is
# not; both get the whole form's wire time, one Alltoallv then one Allgatherv (an upper bound for the
# pipelined one, whose bench t_wire counts only the waits: compare it on t_exchange)
TOLERANCE = 0.20
DDP_MODES = {"ddp_allreduce": 4, "ddp_fp16": 2}    # variant -> bytes per gradient element on the wire
DDP_REFERENCE = "local"
FIRST_BUCKET_MB = 1.0
OUT_OF_SCOPE = "out: unshaped (CPU-bound)"
HOST_BOUND = "out: host-bound"
HOST_SHARE = TOLERANCE / (1 - TOLERANCE)
UNSHAPED = "none"


def scope_of(pred: float, host: float) -> str:
    """"link" when the host's measured time (nan: not measured) is at most HOST_SHARE x the predicted
    link time, else HOST_BOUND (module docstring, Scope)."""
    return HOST_BOUND if host > HOST_SHARE * pred else "link"


def rate_bits(rate: str) -> float:
    """'1gbit' -> 1e9 bits/s (tc's k/m/g prefixes)."""
    r = rate.lower().removesuffix("bit")
    return float(r[:-1]) * {"k": 1e3, "m": 1e6, "g": 1e9}[r[-1]] if r[-1] in "kmg" else float(r)


def tbf_saving(link_bytes: float, tokens: float, link: Link) -> float:
    """Seconds a full-enough tbf bucket of `tokens` bytes saves a transfer of `link_bytes` through the
    link: min(tokens, link_bytes) x 8 / (efficiency x bandwidth)."""
    return link.seconds(min(max(tokens, 0.0), max(link_bytes, 0.0)))


def predict_wire(mode: str, params: int, ranks: int, link: Link, tbf: bool = True) -> float:
    """Seconds of the collectives of one bench step (module docstring), ranks = nodes of one GPU; tbf:
    the step's first collective starts with a full token bucket (`tbf_saving` on its bytes per link).
    `mode`: a bench mode of MODES, or an exchange mode of ALIASES."""
    mode = ALIASES.get(mode, mode)
    ex = DDPExchange("allreduce")
    burst = tbf_burst(link.bandwidth) if tbf else 0.0
    layers = len(bench_layer_sizes(params))
    if mode in ("tg_ps", "tg_ps_whole"):        # rank 0's server: N-1 slots in, N-1 downlinks out
        pay = mode_payloads(mode, bench_layer_sizes(params), ranks)
        k = pieces(params) if mode == "tg_ps" else 1
        up, down = pay["gather"], pay["bcast"]
        t = rank0_ps(up, down, ranks, 1, link, link, pieces=k)
        moved = [(ranks - 1) * max(up, down)] if k > 1 else [(ranks - 1) * up, (ranks - 1) * down]
        return scaler_allreduce(layers, ranks, 1, link, link) + t - sum(tbf_saving(b, burst, link) for b in moved)
    if mode in ("tg_sharded_ps", "tg_sharded_ps_whole"):    # Alltoallv of the codes, then Allgatherv of the sums
        pay = mode_payloads("tg_sharded_ps", bench_layer_sizes(params), ranks)
        t = sharded_ps(pay["alltoallv"], pay["allgatherv"], ranks, 1, link, link)
        return scaler_allreduce(layers, ranks, 1, link, link) + t - \
            tbf_saving((ranks - 1) / ranks * pay["alltoallv"], burst, link)
    if mode == "fp32_native":
        S = 4.0 * params
        t = collective(ex, {"reduce": S}, ranks, 1, link, link)[0]
        return t - tbf_saving(2 * (ranks - 1) / ranks * S, burst, link)
    if mode == "tg_allreduce":
        width = 1 if ranks <= 127 else 2
        S = width * params + message_header_bytes(layers)
        t, _ = collective(ex, {"reduce": S}, ranks, 1, link, link)
        return scaler_allreduce(layers, ranks, 1, link, link) + t - tbf_saving(2 * (ranks - 1) / ranks * S, burst, link)
    raise ValueError(f"no prediction for mode {mode!r}; modeled: {MODES}")


def validate(rows: pd.DataFrame, latency: float = 50e-6, efficiency: float = 0.9, tbf: bool = True) -> pd.DataFrame:
    """One row per shaped switch-topology bench row of `MODES` (a mode of ALIASES read as its bench
    name): pred_wire, t_wire, host (t_wire of the same mode, N and P unshaped; nan without such a row),
    ratio, scope (`scope_of`), within (|ratio - 1| <= TOLERANCE and scope "link"), and the measured
    t_exchange and t_step beside them."""
    rows = rows.assign(mode=rows["mode"].replace(ALIASES))
    d = rows[(rows.topology == "switch") & rows["mode"].isin(MODES)].copy()
    unshaped = d.rate.astype(str).str.lower() == UNSHAPED
    host = d[unshaped].groupby(["mode", "ranks", "params"]).t_wire.median()
    d = d[~unshaped].copy()
    d["pred_wire"] = [predict_wire(r.mode, int(r.params), int(r.ranks),
                                   Link(r.rate, rate_bits(r.rate), latency, efficiency), tbf) for r in d.itertuples()]
    d["host"] = [float(host.get((r.mode, r.ranks, r.params), math.nan)) for r in d.itertuples()]
    d["scope"] = [scope_of(p, h) for p, h in zip(d.pred_wire, d.host)]
    d["ratio"] = d.pred_wire / d.t_wire
    d["within"] = ((d.ratio - 1).abs() <= TOLERANCE) & (d.scope == "link")
    return d[["rate", "ranks", "params", "mode", "pred_wire", "t_wire", "host", "ratio", "within", "scope",
              "t_exchange", "t_step"]]


def bench_resnet_tensors(width: int, dim: int = 64, classes: int = 10, blocks: int = 2,
                         channels: int = 1) -> list[tuple[int, int]]:
    """(elements, forward MACs per example) of every parameter tensor of `tgsim.torch.examples.resnet`
    (dim, classes, width, blocks, channels) in registration (forward) order: a k x k conv c_in -> c_out
    has k^2 c_in c_out elements and as many MACs per output pixel (3 x 3 convs padded, output side =
    ceil(side / stride)); GroupNorm scale and shift and the head's bias count no MACs; the head
    2 width -> classes after the global mean."""
    side = math.isqrt(dim // channels)
    out: list[tuple[int, int]] = []

    def conv(cin, cout, k, s):
        out.append((k * k * cin * cout, k * k * cin * cout * s * s))

    def norm(c):
        out.extend([(c, 0), (c, 0)])

    def block(cin, cout, stride, s):
        s = -(-s // stride)
        conv(cin, cout, 3, s), norm(cout), conv(cout, cout, 3, s), norm(cout)
        if stride != 1 or cin != cout:
            conv(cin, cout, 1, s), norm(cout)
        return s

    conv(channels, width, 3, side), norm(width)
    s = side
    for _ in range(blocks):
        s = block(width, width, 1, s)
    s = block(width, 2 * width, 2, s)
    for _ in range(blocks - 1):
        s = block(2 * width, 2 * width, 1, s)
    out.extend([(2 * width * classes, 2 * width * classes), (classes, 0)])
    return out


def ddp_buckets(tensors: list[tuple[int, int]], bucket_mb: float = 25.0,
                first_mb: float = FIRST_BUCKET_MB) -> list[tuple[int, float]]:
    """DDP's rebuilt buckets of (elements, MACs) tensors given in forward order: (elements, share of the
    backward MACs done when the bucket is ready) per bucket, in the order they are sent. The tensors
    are taken last first; a bucket closes as soon as it holds >= its cap of float32 bytes (first_mb
    MiB for the first bucket, bucket_mb MiB after)."""
    if bucket_mb <= 0 or first_mb <= 0:
        raise ValueError(f"bucket caps must be > 0 MiB, got bucket_mb={bucket_mb}, first_mb={first_mb}")
    total = sum(m for _, m in tensors) or 1
    out, n, done, cap = [], 0, 0.0, first_mb
    for elements, macs in reversed(tensors):
        n, done = n + elements, done + macs / total
        if 4 * n >= cap * MIB:
            out.append((n, done))
            n, cap = 0, bucket_mb
    if n:
        out.append((n, 1.0))
    return out


def exposed_comm(bks: list[tuple[int, float]], backward: float, nbytes: int, ranks: int, link: Link,
                 overlap: bool = True, burst: float = 0.0) -> float:
    """Seconds the backward pass ends later than `backward` (module docstring, overlap): buckets (elements,
    ready share) all-reduced as rings of nbytes per element on `link` (one rank's share of a shared
    link of bandwidth ranks x link.bandwidth), one at a time, each from max(ready share x backward,
    the previous end); overlap=False: every bucket after the backward pass. burst: the shared link's
    tbf bucket in bytes, full at the start, refilled at ranks x link.bandwidth / 8 bytes/s while the
    link idles; a ring moving B = ranks x 2 (ranks-1)/ranks x S bytes through it takes min(tokens, B)
    bytes' time at the full rate less (`tbf_saving`)."""
    end, tokens = 0.0, burst
    whole = Link(link.name, link.bandwidth * ranks, link.latency, link.efficiency)
    for elements, ready in bks:
        start = max(ready * backward if overlap else backward, end)
        S = nbytes * elements
        tokens = min(burst, tokens + (start - end) * whole.bandwidth / 8.0)
        moved = 2 * (ranks - 1) * S
        saved = tbf_saving(moved, tokens, whole)
        tokens -= min(tokens, moved)
        end = start + ring_allreduce(S, ranks, 1, link, link) - saved
    return max(end, backward) - backward


def validate_ddp(rows: pd.DataFrame, latency: float = 50e-6, efficiency: float = 0.9,
                 bucket_mb: float = 25.0, tbf: bool = True) -> pd.DataFrame:
    """One row per `tgsim bench torch` row of `DDP_MODES`: measured (t_backward - t_backward of the
    same rate's `local` row), pred (the exposed communication, module docstring), pred_serial (no
    overlap), buckets, host (the same variant's measured increase unshaped; nan without that row),
    ratio = pred / measured, scope (OUT_OF_SCOPE for unshaped rows: no prediction; else `scope_of`),
    within = |ratio - 1| <= TOLERANCE and scope "link". ValueError on missing columns, a rate
    without its local row, or params that are not the bench ResNet's of that width."""
    need = {"rate", "variant", "ranks", "params", "width", "t_backward"}
    if not need <= set(rows.columns):
        raise ValueError(f"not a `tgsim bench torch` CSV: missing columns {sorted(need - set(rows.columns))}")
    local = rows[rows.variant == DDP_REFERENCE].set_index("rate").t_backward
    unshaped = rows[(rows.rate.astype(str).str.lower() == UNSHAPED) & rows.variant.isin(list(DDP_MODES))]
    host = {(r.variant, int(r.ranks), int(r.params)): float(r.t_backward) - float(local[r.rate])
            for r in unshaped.itertuples() if r.rate in local.index}
    out = []
    for r in rows[rows.variant.isin(list(DDP_MODES))].itertuples():
        if r.rate not in local.index:
            raise ValueError(f"rate {r.rate!r}: no {DDP_REFERENCE!r} row to measure the backward pass against "
                             f"(run tgsim bench torch with --variants {DDP_REFERENCE},{r.variant})")
        dim, channels = (int(getattr(r, "dim", 64)), int(getattr(r, "channels", 1)))
        tensors = bench_resnet_tensors(int(r.width), dim=dim, channels=channels)
        if sum(e for e, _ in tensors) != int(r.params):
            raise ValueError(f"row {r.rate} {r.variant}: params {int(r.params)} are not the bench ResNet's of width "
                             f"{int(r.width)} on {channels} x {dim // channels} pixels ({sum(e for e, _ in tensors)})")
        bwd, ranks = float(local[r.rate]), int(r.ranks)
        bks = ddp_buckets(tensors, bucket_mb)
        row = dict(rate=r.rate, variant=r.variant, ranks=ranks, params=int(r.params), buckets=len(bks),
                   t_backward_local=bwd, measured=float(r.t_backward) - bwd)
        if str(r.rate).lower() == UNSHAPED:
            row.update(pred=math.nan, pred_serial=math.nan, host=math.nan, scope=OUT_OF_SCOPE)
        else:
            link = Link(f"{r.rate} / {ranks}", rate_bits(r.rate) / ranks, latency, efficiency)
            nb = DDP_MODES[r.variant]
            burst = tbf_burst(rate_bits(r.rate)) if tbf else 0.0
            pred = exposed_comm(bks, bwd, nb, ranks, link, burst=burst)
            h = host.get((r.variant, ranks, int(r.params)), math.nan)
            row.update(pred=pred, pred_serial=exposed_comm(bks, bwd, nb, ranks, link, overlap=False, burst=burst),
                       host=h,
                       scope=scope_of(pred, h))
        out.append(row)
    cols = ["rate", "variant", "ranks", "params", "buckets", "t_backward_local", "measured", "pred", "pred_serial",
            "host", "ratio", "within", "scope"]
    if not out:
        return pd.DataFrame(columns=cols)
    d = pd.DataFrame(out)
    d["ratio"] = d.pred / d.measured
    d["within"] = ((d.ratio - 1).abs() <= TOLERANCE) & (d.scope == "link")
    return d[cols]


def print_ddp(path: str, latency: float = 50e-6, file=None) -> pd.DataFrame:
    """Read a `tgsim bench torch` CSV, print `validate_ddp`'s table and its count of in-scope rows
    within TOLERANCE (QUICK first when the CSV says quick); returns the table."""
    rows = pd.read_csv(path)
    if "quick" in rows and rows.quick.astype(bool).any():
        print(f"QUICK {path}: rows of tgsim bench torch --quick: numbers not for reporting", file=file)
    v = validate_ddp(rows, latency)
    with pd.option_context("display.width", 200):
        print(v.to_string(index=False, float_format=lambda x: f"{x:.4g}"), file=file)
    inside = v[v.scope == "link"]
    print(f"DDP over Gloo ({path}): {int(inside.within.sum())} of {len(inside)} link-bound rows within "
          f"{TOLERANCE:.0%} of the measured backward-pass increase; {int((v.scope == HOST_BOUND).sum())} host-bound "
          f"rows and {int((v.scope == OUT_OF_SCOPE).sum())} unshaped rows out of scope", file=file)
    return v


def main(argv=None) -> int:
    """Print the table(s) and the points with >= 1M elements within 20 %."""
    ap = argparse.ArgumentParser(prog="python -m tgsim.analysis.perfmodel_ddp_validate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="?", help="a `tgsim bench exchange` CSV")
    ap.add_argument("--torch", help="a `tgsim bench torch` CSV (variants local, ddp_allreduce, ddp_fp16)")
    ap.add_argument("--latency", type=float, default=50e-6, help="seconds per hop (default %(default)s)")
    args = ap.parse_args(argv)
    if not (args.csv or args.torch):
        ap.error("give a `tgsim bench exchange` CSV, --torch CSV, or both")
    if args.csv:
        rows = pd.read_csv(args.csv)
        if "quick" in rows and rows.quick.astype(bool).any():
            print(f"{args.csv}: QUICK rows (tgsim bench exchange --quick): numbers not for reporting")
        v = validate(rows, args.latency)
        with pd.option_context("display.width", 200):
            print(v.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
        big = v[(v.params >= 1_000_000) & (v.scope == "link")]
        print(f"link-bound points with >= 1M elements within {TOLERANCE:.0%} of the measured t_wire: "
              f"{int(big.within.sum())} of {len(big)}; {int((v.scope == HOST_BOUND).sum())} shaped points "
              f"host-bound, out of scope")
    if args.torch:
        print_ddp(args.torch, args.latency)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
