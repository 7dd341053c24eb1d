"""`tgsim compare time`: time to a training target on 1, 10 and 100 Gb/s links and N = 8 to 512
GPUs, per method, against the best of the fp32, fp16 and bf16 all-reduce, with a 95 % interval.

    time to target (method, net, link, N, hardware) = K(method) x t_step(method, net, link, N, hardware)

K: the steps to the loss threshold measured by `tgsim compare bits` (its bits_runs.csv, the
MNIST-1D convnet by default: 8 workers, total batch 64), per seed, under both learning-rate rules
(fp32-lr, own-lr). fp32, fp16 and bf16 must all have rows (else `MissingBaselineError`, exit 2).
SCALING: K is ASSUMED to carry over to the model's net and N. scaling="weak" (default): the per-GPU
batch is the net's (`perfmodel_nets`), so the total batch grows with N (weak scaling; K was measured
at one total batch, 64). scaling="strong": the total batch is fixed at its value at N = 8 (the
workers K was measured with), per-GPU batch = net batch x 8 / N (at least 1), compute time linear in
it. Neither makes the convnet's K the K of the paper's nets: that transfer is the model's largest
assumption. PQASGD's K counts local steps; its step time is ((every - 1) t_compute + t_sync) / every.

t_step: `perfmodel_ddp.ddp_step` (DDP/NCCL: 25 MiB buckets overlapped with the backward pass,
node-aware ring / tree all-reduce, all-gather, and two parameter servers, each the code's exchange
mode of that name: "ps", rank 0 the one server (its link carries N-1 uplinks in and N-1 downlinks
out, so its time grows linearly with N; --dedicated-servers M: M servers of their own instead), and
"sharded_ps", one shard per worker (Alltoallv of the codes, Allgatherv of the sums: about (N-1)/N
(2 + w) bits an element each way, flat in N); codec seconds on the critical path; TernGrad's scaler
all-reduce before each bucket's encode) with a `Wire` per method, from numbers measured in this run:
  bytes    the real payloads of the codec (registry defaults of `compare_bits.METHODS`) on a layer of
           `n_wire` elements, encoded for every N (gradients g_w = m + e_w: a common Gaussian part and
           a worker's own, equal power), counted by the in-process exchange in each pattern the codec
           supports: ps, allgather, and for packed codes that sum exactly an all-reduce of int8/int16
           code sums and, with shared scalers, sharded_ps, whose up / down are the ps's whole message
           and whole answer (the model charges (N-1)/N of each; its `sent` column is the real mode's
           count, block headers included). fp32, fp16 and bf16 travel as an all-reduce of 4, 2, 2
           bytes per element (NCCL reduces them natively), fp32 also as sharded_ps, 4 bytes each way
           (the exchange's fp32 mean in every mode, exact: an Alltoallv and an Allgatherv of float32;
           never rank 0's server); fp16 and bf16, codecs, also in ps and all-gather. A float-mean codec
           (PowerSGD) travels as an all-reduce of its float32 values. A multi-round codec's bytes are
           scaled per bucket by its bits per element on the bucket's parameter shapes (`shape_factor`)
           and it pays the latencies once per round.
  codec    encode (per worker) and decode-and-add (per message) seconds per element of each codec,
           measured here on one host core (`measure_codec_cost`). `codec_cost`:
             "gpu"   (default) a GPU figure where that codec was timed on a GPU (TernGrad, default
                     options: docs/MEASUREMENTS.md, H100, `GPU_TERNGRAD`), with its per-call floor;
                     every other codec its own HOST time (labelled "host" in time_codec.csv and
                     time.csv's cost_source): no codec's ratio is applied to another;
             "host"  every codec its host time;  "none"  no codec cost.
           fp32/fp16/bf16: no codec cost (the cast is one GPU memory pass, not counted).
Each method takes, at each setting, the fastest pattern it supports; time.csv's `pattern`, `algorithm`
and `server` ("rank 0", "sharded over the workers", "M dedicated", "none") say which, and
time_patterns.csv holds every pattern's step, so rank 0's ps and the sharded server show side by side.

Hardware (`perfmodel_ddp.HARDWARE`): "p100-fp32" (4 per node, NVLink) and "h100-amp" (8 per node,
NVLink 4, x12 compute): both by default; "host-cpu" (`HOST`, `hardware_row`): speed 1, one device per
node, for a net whose compute time was measured on this machine. Links (`LINKS`: each rate's assumed
latency per message): 1 and 10 Gb/s Ethernet, 100 Gb/s InfiniBand; 90 % efficiency. Nets: AlexNet, VGG-A, GoogLeNet, ResNet-50; `net_files`
(--net-file) adds nets described by JSON files (`perfmodel_nets.net_from_file`: a model's real
parameter shapes and its forward + backward seconds measured on this machine), e.g. the torch models
that compare bits trains as "resnet" and "transformer", with their K (--problem).

Verdict (`perfmodel_verdict`): per setting the speedup over the best float with a 95 % t-interval of
the per-seed log-ratio; a codec wins only when the interval's lower end is above 1.

Outputs (`--out DIR`, default results/compare-time):
  time_wire.csv   one row per (method, N, pattern): measured bytes per element up / down / reduce, and
                  sent: the bytes per element one worker sends (in-process count)
  time_codec.csv  one row per method: host encode / decode seconds per element, what is used, source
  time.csv        one row per (rule, hardware, net, link, N, method): `COLUMNS`
  time_settings.csv  one row per (rule, hardware, net, link, N): best float, best codec, interval, win
  time_patterns.csv  one row per (hardware, net, link, N, method, pattern): its step time and server
  speedup_sensitivity.csv  wins per (rule, hardware) at compute speed x0.25, x0.5, x1, x2, x4
  time.png        speedup_best against N, one panel per (net, link), the first hardware row, own-lr
Each CSV's `codec_options`, after `method`: every option of the method's codec, defaults filled in.

QUICK input. `compare bits --quick` (1 seed, a few steps) marks its rows (compare_bits.QUICK_COLUMN).
Such a bits_runs.csv is refused with one line (QuickInputError; exit 2) unless asked with
--allow-quick; `compare time --quick` (a smoke test itself) accepts it. When the input or the run is
quick, every CSV has `quick` = True, and the printed tables and the figure's title say QUICK.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from tgsim.analysis.common import baseline, with_codec_options
from tgsim.errors import ConfigError

DEFAULT_OUT = "results/compare-time"
GPU_TERNGRAD_ENCODE = 0.6e-3 / (64 * 2 ** 20)   # s per element: H100, CUDA codec, 64M-element layer
# TernGrad's CUDA codec on one H100 (docs/MEASUREMENTS.md, "The GPU run"): encode per element from the
# 64M rows (0.515-0.638 ms), with the 0.29 ms the 1M and 16M rows take as a per-call floor; decode-and-
# add per message = the aggregate of 8 messages / 8 (1.355 ms at 64M; 0.474 ms at 1M as the floor)
GPU_TERNGRAD = dict(encode=GPU_TERNGRAD_ENCODE, encode_floor=0.29e-3, decode=1.355e-3 / 8 / (64 * 2 ** 20),
                    decode_floor=0.474e-3 / 8)
@functools.lru_cache(maxsize=None)
def floats() -> dict[str, int]:
    """The registered float formats, which may travel as a ring all-reduce of their bytes per element
    (NCCL reduces fp32, fp16 and bf16 natively): codecs without options of their own that combine by
    the mean, encode the same bytes for every seed and send 16 or 32 bits per element (measured on a
    2^12-element layer, the frame header aside). {name: bytes per element}, the baseline first."""
    from tgsim.analysis.compare_variance import payload_bits, spec
    from tgsim.codecs import options, registry

    out = {baseline(): 4}
    g = {"g": np.linspace(-1.0, 1.0, 1 << 12, dtype=np.float32)[None]}
    for name in registry.names():
        if name in out or options.keys(registry.codec_class(name)):
            continue
        sp = spec(name)
        if sp.na or not sp.deterministic:
            continue
        bits = payload_bits(registry.make(name), g)
        if round(bits) in (16, 32) and abs(bits - round(bits)) < 0.1:
            out[name] = round(bits) // 8
    return out
NETS = ("alexnet", "vgg_a", "googlenet", "resnet50")
WORKERS = (8, 16, 32, 64, 128, 256, 512)
LINKS = {1: 50e-6, 10: 50e-6, 100: 2e-6}       # Gb/s -> latency per message (s)
CODEC_COSTS = ("gpu", "host", "none")
HARDWARE_ROWS = ("p100-fp32", "h100-amp")
HOST = "host-cpu"          # the hardware row of a net measured on this machine (`hardware_row`)
SCALINGS = ("weak", "strong")
K_WORKERS = 8                                  # compare bits' workers (the convnet's K)
SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0)            # compute-speed factors of speedup_sensitivity.csv
COLUMNS = ["rule", "problem", "hardware", "net", "link_gbps", "workers", "method", "codec_options", "lr", "K",
           "scaling", "batch", "pattern", "algorithm", "server", "t_step", "compute", "exposed_comm", "codec_seconds",
           "cost_source", "time_to_target", "speedup_fp32", "speedup_best", "speedup_best_lo", "speedup_best_hi",
           "best_float", "win", "codec_cost", "bucket_mb", "quick"]
PATTERN_COLUMNS = ["hardware", "net", "link_gbps", "workers", "method", "pattern", "algorithm", "server", "t_step",
                   "exposed_comm", "codec_seconds"]
QUICK_MARK = "QUICK (a --quick smoke test, numbers not for reporting)"


class QuickInputError(ConfigError):
    """compare bits' output was written by --quick and --allow-quick was not given."""


class MissingBaselineError(ConfigError):
    """compare bits' output lacks one of the float baselines fp32, fp16, bf16."""


def check_baselines(steps: pd.DataFrame, path="bits_runs.csv") -> None:
    """MissingBaselineError (one line) unless every rule of `steps` has a row of every float format
    (`floats()`: fp32, fp16 and bf16)."""
    from tgsim.analysis.perfmodel_verdict import missing_baselines

    required = tuple(floats())
    miss = missing_baselines(steps, required)
    if miss:
        what = "; ".join(f"{rule}: {', '.join(m)}" for rule, m in miss.items())
        raise MissingBaselineError(f"{path} has no steps for the float baseline(s) {what}: every speedup is taken "
                                   f"against the best of {', '.join(required)}; rerun compare bits with "
                                   f"--methods including {','.join(required)}")


def read_bits_runs(path, allow_quick: bool = False) -> tuple[pd.DataFrame, bool]:
    """(compare bits' bits_runs.csv, whether it was written by --quick); QuickInputError (one line) for a
    --quick one unless allow_quick. A CSV without the column (an older tgsim) counts as not quick."""
    from tgsim.analysis.compare_bits import QUICK_COLUMN

    runs = pd.read_csv(path)
    quick = bool(QUICK_COLUMN in runs and runs[QUICK_COLUMN].astype(bool).any())
    if quick and not allow_quick:
        seeds = runs.seed.nunique() if "seed" in runs else "?"
        steps = ", ".join(f"{p} {int(s)}" for p, s in runs.groupby("problem").steps.max().items()) \
            if {"problem", "steps"} <= set(runs.columns) else "?"
        raise QuickInputError(f"{path} was written by `tgsim compare bits --quick` ({seeds} seed(s), steps {steps}: "
                              "a smoke test); rerun compare bits without --quick, or pass --allow-quick to use it "
                              "(the output is then marked QUICK)")
    return runs, quick


def _config(method: str):
    from tgsim.analysis.compare_bits import method_sections
    from tgsim.train.config import codec_section as to_codec_config

    codec_section, exchange_section = method_sections(method)     # a registered codec and its options
    section = dict(codec_section)
    section.pop("error_feedback", None)          # the residual does not change the bytes on the wire
    return to_codec_config(section), exchange_section


def _encode(codec, layers: dict, ids):
    """(every worker's message, whether the scalers were shared): tgsim.bench.codecs_all's encode."""
    from tgsim.bench.codecs_all import _steps

    return _steps(codec, layers, ids)(), codec.properties.shared_stats is not None


def patterns(codec) -> tuple[str, ...]:
    """The exchange patterns the codec's messages can travel in: a float-mean codec (properties.float_mean)
    only a ring all-reduce of its float32 values (what the exchange runs for it in every mode); packed
    codes that sum exactly ps (rank 0), all-gather, the all-reduce of code sums and, with shared scalers
    (tgsim/exchange/sharded.py needs one scaler per layer), sharded_ps; other codecs ps and all-gather."""
    props = codec.properties
    if props.float_mean:
        return ("allreduce",)
    if not props.sums_exactly:
        return ("ps", "allgather")
    return ("ps", "sharded_ps", "allgather", "allreduce") if props.shared_stats is not None else \
        ("ps", "allgather", "allreduce")


@functools.lru_cache(maxsize=None)
def _codec(method: str):
    """The codec of a method label (its options; error feedback aside: it does not change the bytes)."""
    from tgsim.codecs import registry

    return registry.make_codec(_config(method)[0])


def rounds(method: str) -> int:
    """Communication rounds per step of the method's codec (properties.rounds)."""
    return int(getattr(_codec(method).properties, "rounds", 1))


def cost_shape(method: str, n: int) -> tuple[int, ...]:
    """The layer the codec seconds are measured on: (n,) for a one-round codec; for a multi-round one
    (whose work is on the layer as a matrix: PowerSGD's products with its rank-r factors) the matrix
    (2^floor(log2(n) / 2), n / that) of n elements."""
    if rounds(method) == 1:
        return (n,)
    rows = 1 << (max(n, 1).bit_length() - 1) // 2
    return (rows, n // rows)


def shape_factor(method: str, n: int):
    """None for a one-round codec; for a multi-round one (whose bytes are its factors' sizes, a function
    of each tensor's shape) the Wire's shape_factor: shapes -> bits_per_element of a layer of those
    parameter shapes over bits_per_element of the 1-D layer of n elements that `measure_wire` encodes."""
    if rounds(method) == 1:
        return None
    codec = _codec(method)
    base = codec.bits_per_element({"g": (int(n),)})
    return lambda shapes: codec.bits_per_element({str(i): tuple(s) for i, s in enumerate(shapes)}) / base


def _bar(items, desc: str, quiet: bool):
    from tqdm import tqdm

    return tqdm(items, desc=desc, disable=quiet or None, leave=False)


def measure_wire(methods, workers=WORKERS, n: int = 1 << 15, seed: int = 0, quiet: bool = True) -> pd.DataFrame:
    """Bytes per element one worker sends/receives per exchange, from real payloads, per (method, N,
    pattern); perf-model fields: up (one message), down (the server's answer), reduce (ring buffer);
    sent: what one worker sends (the in-process exchange's count). sharded_ps: up / down = the ps's
    whole message and answer (`perfmodel_ddp.sharded_ps` charges (N-1)/N of each), sent = the real
    mode's count (`tgsim.exchange.sharded`: codes to N-1 owners and this owner's sums to N-1 ranks,
    8-byte block headers included; per element at this layer's n: the headers, 2 (N-1) x 8 bytes per
    exchange, are not per element and are left out of up / down)."""
    from tgsim.codecs import registry
    from tgsim.exchange import InProcessExchange

    rng = np.random.default_rng(seed)
    common = rng.standard_normal(n).astype(np.float32)
    rows = []
    for N in _bar(workers, "wire bytes (per N)", quiet):
        g = (common + rng.standard_normal((N, n)).astype(np.float32)) / np.float32(math.sqrt(2.0))
        ids = np.arange(N)
        for method in methods:
            if method in floats():
                rows.append(dict(method=method, workers=N, pattern="ring", up=0.0, down=0.0,
                                 reduce=float(floats()[method]), sent=2 * (N - 1) / N * floats()[method]))
            if method == baseline():      # fp32 in any mode: MPIExchange.mean_fp32, whose exact path is an
                # Alltoallv + Allgatherv of float32 (the sharded server's collectives, 4 B each way), not rank 0's ps
                rows.append(dict(method=method, workers=N, pattern="sharded_ps", up=4.0, down=4.0, reduce=0.0,
                                 sent=(N - 1) / N * 8.0))
                continue
            cfg, _ = _config(method)
            codec = registry.make_codec(cfg)
            msgs, shared = _encode(codec, {"g": g}, ids)
            ps_bytes = None
            for pat in patterns(codec):
                _, b = InProcessExchange(N).aggregate(codec, msgs, pat, shared)
                if pat == "ps":
                    f = dict(up=b.sent / n, down=b.received / n, reduce=0.0)
                    ps_bytes = f
                elif pat == "sharded_ps":
                    f = dict(ps_bytes)
                elif pat == "allgather":
                    f = dict(up=b.sent / (N - 1) / n, down=0.0, reduce=0.0)
                else:
                    f = dict(up=0.0, down=0.0, reduce=b.sent / (2 * (N - 1) / N) / n)
                rows.append(dict(method=method, workers=N, pattern="ring" if pat == "allreduce" else pat,
                                 sent=b.sent / n, **f))
    return pd.DataFrame(rows).assign(elements=int(n))


def measure_codec_cost(methods, n: int = 1 << 20, workers: int = 8, repeats: int = 3,
                       quiet: bool = True) -> pd.DataFrame:
    """Host seconds per element: encode (per worker) and decode-and-add (per message, the exchange's
    aggregate in ps mode), one thread; the float baselines have neither (NCCL reduces them on the GPU;
    a cast is one memory pass there, not NumPy's software conversion)."""
    from tgsim.analysis.common import single_thread
    from tgsim.bench.timing import time_call
    from tgsim.codecs import registry
    from tgsim.exchange import InProcessExchange

    g = np.random.default_rng(1).standard_normal((workers, n)).astype(np.float32)
    ids = np.arange(workers)
    rows = []
    with single_thread():
        for method in _bar(methods, "codec seconds", quiet):
            if method in floats():
                rows.append(dict(method=method, encode_host=0.0, decode_host=0.0))
                continue
            cfg, _ = _config(method)
            codec = registry.make_codec(cfg)
            layer = {"g": g.reshape(workers, *cost_shape(method, n))}
            te = time_call(lambda: _encode(codec, layer, ids), repeats)
            msgs, shared = te.result
            ex = InProcessExchange(workers)
            ta = time_call(lambda: ex.aggregate(codec, msgs, patterns(codec)[0], shared), repeats)
            rows.append(dict(method=method, encode_host=te.median / workers / n, decode_host=ta.median / workers / n))
    return pd.DataFrame(rows)


def steps_to_target(bits_runs: pd.DataFrame, problem: str = "convnet") -> pd.DataFrame:
    """(rule, method) -> K: mean steps to the threshold over the seeds (NaN unless every seed reached
    it), and the steps of each seed ({seed: K})."""
    d = bits_runs[bits_runs.problem == problem]
    rows = []
    for (rule, method), g in d.groupby(["rule", "method"], sort=False):
        K = float(g.K.mean()) if g.K.notna().all() else float("nan")
        rows.append(dict(rule=rule, problem=problem, method=method, lr=float(g.lr.iloc[0]), K=K,
                         K_seed=dict(zip(g.seed.astype(int), g.K.astype(float)))))
    return pd.DataFrame(rows)


def codec_costs(cost: pd.DataFrame, codec_cost: str = "gpu") -> dict:
    """{method: perfmodel_ddp.CodecCost} from time_codec's host seconds per element: "gpu" = the GPU
    measurement where that codec has one (the default TernGrad: `GPU_TERNGRAD`, source "gpu (H100)"),
    else its host seconds (source "host"); "host" = every codec's host seconds; "none" = zero. The
    float baselines cost nothing (source "none")."""
    from tgsim.analysis.perfmodel_ddp import CodecCost
    from tgsim.codecs import registry

    if codec_cost not in CODEC_COSTS:
        raise ValueError(f"codec_cost must be one of {CODEC_COSTS}, got {codec_cost!r}")
    out = {}
    for r in cost.itertuples():
        if r.method in floats() or codec_cost == "none":
            out[r.method] = CodecCost(source="none")
        elif codec_cost == "gpu" and r.method == registry.DEFAULT:
            out[r.method] = CodecCost(**GPU_TERNGRAD, source="gpu (H100)")
        else:
            out[r.method] = CodecCost(float(r.encode_host), float(r.decode_host), source="host")
    return out


def _wire(method: str, w: pd.DataFrame, pattern: str, enc: float = 0.0, dec: float = 0.0):
    """The perf model's Wire of `method` in `pattern`: the measured bytes per element (time_wire), the
    codec seconds per element, its rounds, and for a multi-round codec the factor from the model's
    layer shapes (`shape_factor`)."""
    from tgsim.analysis.perfmodel_throughput import Wire

    rows = w[(w.method == method) & (w.pattern == pattern)]
    per = {int(r.workers): {"up": r.up, "down": r.down, "reduce": r.reduce} for r in rows.itertuples()}
    n = int(rows.elements.iloc[0]) if "elements" in rows and len(rows) else 1 << 15
    return Wire(method, per, enc, dec, rounds=rounds(method), shape_factor=shape_factor(method, n))


def _shared_stats(method: str) -> bool:
    """Whether the method's codec all-reduces statistics before it encodes (properties.shared_stats)."""
    return method not in floats() and _codec(method).properties.shared_stats is not None


def hardware_row(name: str):
    """perfmodel_ddp.HARDWARE[name], or for HOST ("host-cpu") the row of a net whose compute time was
    measured on this machine (a net file): speed 1 (the measured seconds as they are), one device per
    node (every message crosses the network link; the intra-node link is never used). ValueError
    naming the valid rows otherwise."""
    from tgsim.analysis.perfmodel_ddp import HARDWARE, Hardware, Link

    if name == HOST:
        return Hardware("this host's CPU (measured), one device per node", 1.0, 1,
                        Link("none (one device per node)", 1e12, 0.0, 1.0), "float32",
                        "compute seconds measured on this machine (net file)")
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware row {name!r}; valid: {', '.join([*HARDWARE, HOST])}")
    return HARDWARE[name]


def resolve_nets(nets=NETS, net_files=()) -> list:
    """perfmodel_nets.Net objects: every name of `nets` (get_net), then every JSON file of `net_files`
    (perfmodel_nets.net_from_file: a model's real parameter shapes and measured compute time)."""
    from tgsim.analysis.perfmodel_nets import get_net, net_from_file

    return [n if not isinstance(n, str) else get_net(n) for n in nets] + [net_from_file(f) for f in net_files]


def per_gpu_batch(net, N: int, scaling: str = "weak") -> int:
    """weak: the net's per-GPU batch; strong: the total batch at N = K_WORKERS kept, net batch x
    K_WORKERS / N (at least 1)."""
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    return net.batch if scaling == "weak" else max(1, round(net.batch * K_WORKERS / N))


def model_times(steps: pd.DataFrame, wire: pd.DataFrame, cost: pd.DataFrame, nets=NETS, links=LINKS,
                workers=WORKERS, codec_cost: str = "gpu", quiet: bool = True, quick: bool = False,
                hardware=HARDWARE_ROWS, bucket_mb: float = 25.0, dedicated_servers: int = 0,
                scaling: str = "weak", compute_speed: float = 1.0, pattern_rows: list | None = None) -> pd.DataFrame:
    """Every (rule, hardware, net, link, N, method): the fastest supported pattern's step time
    (`perfmodel_ddp.ddp_step`), which pattern and server that is, the time to target, and the speedup
    over the best float with its 95 % interval and win (`perfmodel_verdict.best_float_speedups`);
    column quick: the steps or the run came from --quick. pattern_rows: a list that receives one dict
    per (hardware, net, link, N, method, pattern) evaluated (`PATTERN_COLUMNS`), fastest or not."""
    from tgsim.analysis.compare_bits import method_sections
    from tgsim.analysis.perfmodel_ddp import DDPExchange, Link, ddp_step
    from tgsim.analysis.perfmodel_verdict import best_float_speedups

    costs = codec_costs(cost, codec_cost)
    methods = list(dict.fromkeys(steps.method))
    exchanges = {"ring": DDPExchange("allreduce", bucket_mb=bucket_mb),
                 "ps": DDPExchange("ps", servers=dedicated_servers, bucket_mb=bucket_mb),
                 "sharded_ps": DDPExchange("sharded_ps", bucket_mb=bucket_mb),
                 "allgather": DDPExchange("allgather", bucket_mb=bucket_mb)}
    wires = {(m, p): _wire(m, wire, p) for m in methods for p in sorted(set(wire[wire.method == m].pattern))}
    rows = []
    nets = resolve_nets(nets)
    for hw_name in hardware:
        hw = hardware_row(hw_name)
        for net in _bar(nets, f"step times ({hw_name})", quiet):
            net_name = net.name
            for gbps, lat in links.items():
                link = Link(f"{gbps:g} Gb/s", gbps * 1e9, lat)
                for N in workers:
                    batch = per_gpu_batch(net, N, scaling)
                    best = {}
                    for method in methods:
                        sync = method_sections(method)[1]
                        every = int(sync.get("every", 1)) if sync.get("local") else 1
                        options = []
                        for (m, pat), w in wires.items():
                            if m != method:
                                continue
                            it = ddp_step(net, w, N, hw, link, exchanges[pat], costs[method], _shared_stats(method),
                                          batch=batch, compute_speed=compute_speed)
                            t = ((every - 1) * it["compute"] + it["iteration"]) / every
                            options.append((t, pat, it))
                            if pattern_rows is not None:
                                pattern_rows.append(dict(hardware=hw_name, net=net_name, link_gbps=gbps, workers=N,
                                                         method=method, pattern=pat, algorithm=it["algorithms"],
                                                         server=exchanges[pat].server, t_step=t,
                                                         exposed_comm=it["exposed_comm"] / every,
                                                         codec_seconds=it["codec_seconds"] / every))
                        best[method] = (*min(options, key=lambda o: o[0]), every)
                    for r in steps.itertuples():
                        t, pat, it, every = best[r.method]
                        rows.append(dict(rule=r.rule, problem=r.problem, hardware=hw_name, net=net_name,
                                         link_gbps=gbps, workers=N, method=r.method, lr=r.lr, K=r.K,
                                         scaling=scaling, batch=batch, pattern=pat, algorithm=it["algorithms"],
                                         server=exchanges[pat].server, t_step=t, compute=it["compute"],
                                         exposed_comm=it["exposed_comm"] / every,
                                         codec_seconds=it["codec_seconds"] / every,
                                         cost_source=costs[r.method].source, time_to_target=r.K * t,
                                         codec_cost=codec_cost, bucket_mb=bucket_mb))
    df = pd.DataFrame(rows)
    key = ["rule", "hardware", "net", "link_gbps", "workers"]
    ref = df[df.method == baseline()].set_index(key).time_to_target
    df["speedup_fp32"] = ref.reindex(pd.MultiIndex.from_frame(df[key])).to_numpy() / df.time_to_target.to_numpy()
    df = best_float_speedups(df, steps, tuple(floats()))
    df["quick"] = bool(quick)
    return with_codec_options(df)[COLUMNS]


def sensitivity(steps, wire, cost, speeds=SPEEDS, **kw) -> pd.DataFrame:
    """Settings won (`perfmodel_verdict.count_wins`) per (rule, hardware) at each compute-speed factor:
    columns rule, hardware, compute_speed, wins, settings."""
    from tgsim.analysis.perfmodel_verdict import count_wins, settings_table

    out = []
    for f in speeds:
        t = settings_table(model_times(steps, wire, cost, compute_speed=f, **kw), tuple(floats()))
        out.append(count_wins(t).assign(compute_speed=f))
    return pd.concat(out, ignore_index=True)[["rule", "hardware", "compute_speed", "wins", "settings"]]


def figure_title(rule: str, quick: bool) -> str:
    """time.png's title; it starts with QUICK_MARK when the steps or the run came from --quick."""
    return ((QUICK_MARK + "\n" if quick else "") +
            "time to the loss target relative to the best of fp32/fp16/bf16 (> 1: the codec wins)\n"
            f"steps measured ({rule}), step time modeled (DDP buckets, node-aware all-reduce), codec seconds "
            "counted; a missing method did not reach the target in every seed")


def _figure(df: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    sns.set_theme(style="whitegrid", context="paper")
    rule = "own-lr" if "own-lr" in set(df.rule) else "fp32-lr"
    df = df[df.hardware == df.hardware.iloc[0]]
    d = df[(df.rule == rule) & ~df.method.isin(list(floats())) & df.speedup_best.notna()]
    order = list(dict.fromkeys(d.method))
    nets, links = list(dict.fromkeys(df.net)), list(dict.fromkeys(df.link_gbps))
    fig, axes = plt.subplots(len(nets), len(links), figsize=(3.6 * len(links), 2.8 * len(nets)), squeeze=False,
                             sharex=True)
    for i, net in enumerate(nets):
        for j, gbps in enumerate(links):
            ax = axes[i, j]
            sub = d[(d.net == net) & (d.link_gbps == gbps)]
            if len(sub):
                sns.lineplot(data=sub, x="workers", y="speedup_best", hue="method", hue_order=order, marker="o",
                             ax=ax, legend=(i == 0 and j == len(links) - 1))
            ax.axhline(1.0, color="k", ls=":")
            ax.set(xscale="log", yscale="log", title=f"{net}, {gbps:g} Gb/s", xlabel="workers N",
                   ylabel="speedup over best float" if j == 0 else "")
            ns = sorted(set(df.workers))
            ax.set_xticks(ns, [str(n) for n in ns])
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            lo, hi = ax.get_ylim()
            ax.yaxis.set_minor_formatter(FormatStrFormatter("%.1f") if hi / lo < 2.5 else NullFormatter())
    if axes[0, -1].get_legend() is not None:
        sns.move_legend(axes[0, -1], "upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, title="method")
    quick = bool(df.quick.any())
    fig.suptitle(figure_title(rule, quick), fontsize=9, color="tab:red" if quick else None)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(out=DEFAULT_OUT, *, bits: str | Path | None = "results/compare-bits", bits_quick: bool = False,
        problem: str = "convnet", nets=NETS, workers=WORKERS, links=LINKS, codec_cost: str = "gpu",
        n_wire: int = 1 << 15, n_cost: int = 1 << 20, jobs: int = 1, quiet: bool = False,
        allow_quick: bool = False, hardware=HARDWARE_ROWS, bucket_mb: float = 25.0, dedicated_servers: int = 0,
        scaling: str = "weak", speeds=SPEEDS, net_files=()) -> dict[str, pd.DataFrame]:
    """Steps from `bits`/bits_runs.csv (run `compare bits` into that directory first when it is missing,
    --quick form if bits_quick); bytes and codec seconds measured here; writes the CSVs and figure.
    A --quick bits_runs.csv raises QuickInputError unless allow_quick or bits_quick (this run is --quick);
    one without fp32, fp16 or bf16 steps raises MissingBaselineError. The output is marked quick when
    the input or this run is. Returns {time_wire, time_codec, time, time_settings, time_patterns,
    speedup_sensitivity}."""
    from tgsim.analysis.common import write_tables
    from tgsim.analysis.perfmodel_verdict import settings_table

    if codec_cost not in CODEC_COSTS:
        raise ValueError(f"codec_cost must be one of {CODEC_COSTS}, got {codec_cost!r}")
    nets = resolve_nets(nets, net_files)        # a bad name or net file fails before any training
    for h in hardware:
        hardware_row(h)
    t0 = time.perf_counter()
    path = Path(bits) / "bits_runs.csv" if bits is not None else None
    if path is None or not path.exists():
        from tgsim.analysis import compare_bits as cb
        from tgsim.analysis.compare_cli import BITS_QUICK_STEPS

        kw = {}
        if bits_quick:
            from tgsim.analysis.common import quick_methods

            kw = dict(methods=tuple(dict.fromkeys([*list(floats())[:3], *quick_methods()])), seeds=(0,),
                      lr_grid=(0.05, 0.1),
                      problems=tuple(dataclasses.replace(p, steps=BITS_QUICK_STEPS[p.name]) for p in cb.PROBLEMS.values()
                                     if p.name == problem))
        if not quiet:
            print(f"no {path}: running tgsim compare bits{' --quick' if bits_quick else ''} first")
        runs = cb.run(bits, jobs=jobs, quiet=quiet, quick=bits_quick, **kw)["bits_runs"]
        quick = bool(bits_quick)
    else:
        runs, quick = read_bits_runs(path, allow_quick=allow_quick or bits_quick)
        quick = quick or bool(bits_quick)
        if quick and not quiet:
            print(f"{QUICK_MARK}: steps from {path}" + (" (--allow-quick)" if allow_quick else ""))
    steps = steps_to_target(runs, problem)
    check_baselines(steps, path)
    methods = list(dict.fromkeys(steps.method))
    wire = measure_wire(methods, workers, n_wire, quiet=quiet)
    cost = measure_codec_cost(methods, n_cost, quiet=quiet)
    used = codec_costs(cost, codec_cost)
    cost["encode_used"] = [used[m].encode for m in cost.method]
    cost["decode_used"] = [used[m].decode for m in cost.method]
    cost["cost_source"] = [used[m].source for m in cost.method]
    kw = dict(nets=nets, links=links, workers=workers, codec_cost=codec_cost, hardware=hardware, bucket_mb=bucket_mb,
              dedicated_servers=dedicated_servers, scaling=scaling)
    by_pattern = []
    table = model_times(steps, wire, cost, quiet=quiet, quick=quick, pattern_rows=by_pattern, **kw)
    settings = settings_table(table, tuple(floats())).assign(quick=quick)
    sens = sensitivity(steps, wire, cost, speeds, **kw).assign(quick=quick)
    res = {"time_wire": with_codec_options(wire.assign(quick=quick)),
           "time_codec": with_codec_options(cost.assign(quick=quick)), "time": table, "time_settings": settings,
           "time_patterns": with_codec_options(pd.DataFrame(by_pattern, columns=PATTERN_COLUMNS)
                                               .assign(quick=quick)),
           "speedup_sensitivity": sens}
    seconds = time.perf_counter() - t0
    out = write_tables(out, res, lambda d: _figure(table, d / "time.png"))
    if not quiet:
        _print_summary(res, seconds, out)
    return res


def _fmt_interval(r, pattern: str = "") -> str:
    """The best codec, its speedup and interval, the pattern it travels in (`pattern`), WIN."""
    if r.best_codec is None or not np.isfinite(r.speedup):
        return "no codec reached the target in every seed"
    ci = f"[{r.lo:.2f}, {r.hi:.2f}]" if np.isfinite(r.lo) else "[no interval: one seed]"
    via = f" via {pattern:<10s}" if pattern else ""
    return f"{r.best_codec:<16s} {r.speedup:5.2f} {ci}{via}{'  WIN' if r.win else ''}"


def server_lines(patterns: pd.DataFrame, method: str | None = None) -> list[str]:
    """For `method` (default: the registry's default codec, else the first with both servers), per
    hardware, the step time (ms) of rank 0's ps and of the sharded server at each N, on the first net
    and the slowest link (time_patterns rows): [] when no method has both."""
    from tgsim.codecs import registry

    both = patterns.groupby("method").pattern.agg(lambda p: {"ps", "sharded_ps"} <= set(p))
    have = list(both[both].index)
    if not have:
        return []
    method = method if method in have else (registry.DEFAULT if registry.DEFAULT in have else have[0])
    d = patterns[(patterns.method == method) & patterns.pattern.isin(["ps", "sharded_ps"])]
    net, gbps = d.net.iloc[0], d.link_gbps.min()
    out = []
    for hw, h in d[(d.net == net) & (d.link_gbps == gbps)].groupby("hardware", sort=False):
        p = h.pivot_table(index="pattern", columns="workers", values="t_step")
        ps = ", ".join(f"{1e3 * v:.4g}" for v in p.loc["ps"])
        sh = ", ".join(f"{1e3 * v:.4g}" for v in p.loc["sharded_ps"])
        ns = ", ".join(str(n) for n in p.columns)
        server = h[h.pattern == "ps"].server.iloc[0]
        out.append(f"  {hw}, {net}, {gbps:g} Gb/s, N = {ns}: ps ({server}) {ps} ms; sharded_ps {sh} ms")
    return [f"{method}'s step by parameter server (time_patterns.csv; ps = the code's ps mode, one server; "
            "sharded_ps = one shard per worker):"] + out


def _print_summary(res: dict, seconds: float, out) -> None:
    """Codec seconds and their sources; per (rule, hardware) and setting, the best codec against the best
    float with its 95 % interval, and the count of settings won; the sensitivity to compute speed."""
    t, cost, st, sens = res["time"], res["time_codec"], res["time_settings"], res["speedup_sensitivity"]
    via = t.set_index(["rule", "hardware", "net", "link_gbps", "workers", "method"]).pattern.to_dict()
    mark = "QUICK " if t.quick.any() else ""
    if mark:
        print(QUICK_MARK)
    print(mark + f"codec seconds per element (measured on one host core; used with --codec-cost "
          f"{t.codec_cost.iloc[0]}, source per method):")
    print(cost.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"scaling: {t.scaling.iloc[0]} (per-GPU batch {'fixed' if t.scaling.iloc[0] == 'weak' else 'shrinking with N'})"
          f"; buckets {t.bucket_mb.iloc[0]:g} MiB; K from the convnet at total batch 64, assumed to carry over")
    for (rule, hw), d in st.groupby(["rule", "hardware"], sort=False):
        print(f"\n{mark}{rule}, {hw}: best codec against the best of fp32 / fp16 / bf16, speedup of the time to "
              "target [95 % t-interval of the per-seed log-ratio]; WIN: lower end > 1")
        for r in d.itertuples():
            pat = via.get((rule, hw, r.net, r.link_gbps, r.workers, r.best_codec), "")
            print(f"  {r.net:<10s} {r.link_gbps:>4g} Gb/s  N = {r.workers:<4d} vs {r.best_float:<5s} "
                  f"{_fmt_interval(r, pat)}")
        print(f"{mark}{rule}, {hw}: a codec's 95 % interval is above 1 in {int(d.win.sum())} of {len(d)} "
              "(net, link, N) settings")
    lines = server_lines(res["time_patterns"]) if "time_patterns" in res else []
    if lines:
        print("\n" + mark + "\n".join(lines))
    print(f"\n{mark}settings won against compute speed (x the hardware row's):")
    print(sens.pivot_table(index=["rule", "hardware"], columns="compute_speed", values="wins", sort=False)
          .astype(int).to_string())
    if out is not None:
        print(f"\nwrote {out}/time_wire.csv, time_codec.csv, time.csv, time_settings.csv, time_patterns.csv, "
              f"speedup_sensitivity.csv, time.png ({seconds:.0f} s)")
