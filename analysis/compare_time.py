"""`tgsim compare time`: time to a training target on 1, 10 and 100 Gb/s links and N = 8 to 512
workers, per method, counting each codec's own encode and decode.

    time to target (method, net, link, N) = K(method) x t_step(method, net, link, N)

K: the steps to the loss threshold measured by `tgsim compare bits` (its bits_runs.csv, the
MNIST-1D convnet by default: 8 workers, total batch 64; mean over the seeds, every seed must have
reached the threshold, else "not reached"), under both learning-rate rules (fp32-lr, own-lr).
K is ASSUMED to carry over to the net and to N (the model's nets are not trained here; strong
scaling at a fixed total batch is the assumption of TernGrad's Fig. 5 too). PQASGD's K counts local
steps; it exchanges every `every` steps, so its step time is ((every - 1) t_compute + t_sync) / every.

t_step: `perfmodel_throughput.iteration` (wait-free backprop, per-layer messages, the net's layers
and per-GPU compute time; nodes of 4 P100 with NVLink inside) with a `Wire` per method, built from
numbers measured in this run:
  bytes    the real payloads of the codec (registry defaults of `compare_bits.METHODS`) on a layer of
           `n_wire` elements, encoded for every N of the sweep (gradients g_w = m + e_w: a common
           Gaussian part and a worker's own, equal power), counted by the in-process exchange
           (`InProcessExchange.aggregate`) in each pattern the codec supports: ps (sharded, one
           server per node), allgather, and for TernGrad's packed codes a ring all-reduce of int8/int16
           code sums. fp32, fp16 and bf16 may also travel as a ring all-reduce of 4, 2 and 2 bytes
           per element (the optimized uncompressed baselines: NCCL reduces fp16/bf16 natively), and
           fp32 through the sharded ps, 4 bytes each way. A float-mean codec (properties.float_mean:
           PowerSGD's factors) travels as a ring all-reduce of its float32 values only.
           Multi-round codecs (properties.rounds = R > 1, PowerSGD's two): the bytes of all rounds,
           and as their messages are functions of each tensor's shape (rank-r factors of the weight
           as a matrix, vectors as float32), the bytes per element measured on the 1-D layer are
           scaled per layer of the net by bits_per_element(the layer's parameter shapes) /
           bits_per_element(the 1-D layer) (`shape_factor`, perfmodel_nets' Layer.shapes): the
           codec's own count of the bytes of its rounds on the real layers. The model sends one
           message per layer and round (no bucketing): a ring pays 2 (N-1) latencies per layer and
           round, a ps one per stage and round.
  compute  encode (prepare + encode of 8 workers' copies, per worker) and decode-and-add (the
           exchange's aggregate of 8 messages, per message) on one core of this host, seconds per
           element, on a 1-D layer (a multi-round codec: a near-square matrix, `cost_shape`)
           (`tgsim.bench.timing.time_call`, medians). `codec_cost`:
             "gpu"   (default) host seconds x TernGrad's GPU/host ratio: GPU_TERNGRAD_ENCODE, its
                     CUDA encode time per element (docs/MEASUREMENTS.md), over its host encode
                     measured here; the SAME factor for every codec (an assumption: only TernGrad's
                     kernels were timed on a GPU);
             "host"  the host seconds as measured (a CPU cluster);
             "none"  no codec cost (what such comparisons usually assume; shown to size the effect).
           Error feedback's residual update (two vector passes) is not counted.
Each method takes, at each (net, link, N), the fastest pattern it supports.

Links (`LINKS`): 1 and 10 Gb/s Ethernet (50 us per message), 100 Gb/s InfiniBand (2 us); 90 %
efficiency. Nets: AlexNet, VGG-A (mostly fully-connected weights), GoogLeNet, ResNet-50
(`perfmodel_nets`).

Outputs (`--out DIR`, default results/compare-time):
  time_wire.csv   one row per (method, N, pattern): measured bytes per element up / down / reduce
  time_codec.csv  one row per method: host encode / decode seconds per element, and as used
  time.csv        one row per (rule, net, link, N, method): `COLUMNS`; speedup_fp32 = fp32's time /
                  the method's (mean K), speedup_best = the best of fp32 / fp16 / bf16 over the
                  method's, per seed (each seed's own K), mean with a 95 % t-interval over the seeds
                  (> 1: the codec wins against every uncompressed baseline)
  time.png        speedup_best against N, one panel per (net, link), one line per method (own-lr, where
                  every method has its own rate; fp32-lr is in time.csv)
Each CSV's `codec_options`, after `method`: every option of the method's codec, defaults filled in
(tgsim.analysis.common.codec_options).

QUICK input. `compare bits --quick` (1 seed, a few steps; written to results/compare-bits unless told
otherwise) marks its rows (compare_bits.QUICK_COLUMN). Such a bits_runs.csv is refused with one line
(QuickInputError; exit 2) unless asked with --allow-quick; `compare time --quick` (a smoke test itself)
accepts it. When the input or the run is quick, every CSV has `quick` = True, and the printed tables
and the figure's title say QUICK.
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
COLUMNS = ["rule", "problem", "net", "link_gbps", "workers", "method", "codec_options", "lr", "K", "pattern", "t_step", "compute",
           "exposed_comm", "codec_seconds", "time_to_target", "speedup_fp32", "speedup_best", "speedup_best_lo",
           "speedup_best_hi", "best_float", "codec_cost", "quick"]
QUICK_MARK = "QUICK (a --quick smoke test, numbers not for reporting)"


class QuickInputError(ConfigError):
    """compare bits' output was written by --quick and --allow-quick was not given."""


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
    codes that sum exactly also ps, all-gather; other codecs ps and all-gather."""
    if codec.properties.float_mean:
        return ("allreduce",)
    return ("ps", "allgather", "allreduce") if codec.properties.sums_exactly else ("ps", "allgather")


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
    pattern); perf-model fields: up (one message), down (the server's answer), reduce (ring buffer)."""
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
            if method == baseline():      # the float32 wire is counted as a ring by the exchange; its ps: 4 B each way
                rows.append(dict(method=method, workers=N, pattern="ps", up=4.0, down=4.0, reduce=0.0, sent=4.0))
                continue
            cfg, _ = _config(method)
            codec = registry.make_codec(cfg)
            msgs, shared = _encode(codec, {"g": g}, ids)
            for pat in patterns(codec):
                _, b = InProcessExchange(N).aggregate(codec, msgs, pat, shared)
                if pat == "ps":
                    f = dict(up=b.sent / n, down=b.received / n, reduce=0.0)
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
    aggregate in ps mode), one thread; fp32 has neither (the ring adds floats on the GPU)."""
    from tgsim.analysis.common import single_thread
    from tgsim.bench.timing import time_call
    from tgsim.codecs import registry
    from tgsim.exchange import InProcessExchange

    g = np.random.default_rng(1).standard_normal((workers, n)).astype(np.float32)
    ids = np.arange(workers)
    rows = []
    with single_thread():
        for method in _bar(methods, "codec seconds", quiet):
            if method == baseline():
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


def _seed_speedups(df: pd.DataFrame, steps: pd.DataFrame) -> tuple[list, list, list]:
    """speedup over the best float per seed (the best float of that seed: its own K x t_step), as the
    mean and 95 % t-interval over seeds; NaN unless every seed of the method reached the target."""
    from tgsim.analysis.compare_bits import t_interval

    ks = {(r.rule, r.method): r.K_seed for r in steps.itertuples()}
    key = ["rule", "net", "link_gbps", "workers"]
    t_of = df.set_index(key + ["method"]).t_step
    mean, lo, hi = [], [], []
    for r in df.itertuples():
        ratios = []
        for seed, k in ks[(r.rule, r.method)].items():
            best = min(ks[(r.rule, f)].get(seed, math.nan) * t_of[(r.rule, r.net, r.link_gbps, r.workers, f)]
                       for f in floats() if (r.rule, f) in ks)
            ratios.append(best / (k * r.t_step))
        m, a, b = t_interval(ratios) if np.isfinite(ratios).all() else (math.nan,) * 3
        mean.append(m)
        lo.append(a)
        hi.append(b)
    return mean, lo, hi


def cost_scale(cost: pd.DataFrame, codec_cost: str) -> float:
    """The factor on the host's codec seconds: gpu = TernGrad's GPU encode / its host encode (NaN
    without a TernGrad row), host = 1, none = 0."""
    if codec_cost != "gpu":
        return {"host": 1.0, "none": 0.0}[codec_cost]
    from tgsim.codecs import registry

    host_tern = float(cost.set_index("method").encode_host.get(registry.DEFAULT, float("nan")))
    return GPU_TERNGRAD_ENCODE / host_tern if host_tern > 0 else float("nan")


def _wire(method: str, w: pd.DataFrame, pattern: str, enc: float, dec: float):
    """The perf model's Wire of `method` in `pattern`: the measured bytes per element (time_wire), the
    codec seconds, its rounds, and for a multi-round codec the factor from the model's layer shapes
    (`shape_factor`)."""
    from tgsim.analysis.perfmodel_throughput import Wire

    rows = w[(w.method == method) & (w.pattern == pattern)]
    per = {int(r.workers): {"up": r.up, "down": r.down, "reduce": r.reduce} for r in rows.itertuples()}
    n = int(rows.elements.iloc[0]) if "elements" in rows and len(rows) else 1 << 15
    return Wire(method, per, enc, dec, rounds=rounds(method), shape_factor=shape_factor(method, n))


def model_times(steps: pd.DataFrame, wire: pd.DataFrame, cost: pd.DataFrame, nets=NETS, links=LINKS,
                workers=WORKERS, codec_cost: str = "gpu", quiet: bool = True, quick: bool = False) -> pd.DataFrame:
    """Every (rule, net, link, N, method): the fastest supported pattern's step time, and the time to target
    (column quick: the steps or the run came from --quick)."""
    from tgsim.analysis.compare_bits import method_sections
    from tgsim.analysis.perfmodel_nets import get_net
    from tgsim.analysis.perfmodel_throughput import Cluster, Exchange, Network, iteration

    scale = cost_scale(cost, codec_cost)
    c = cost.set_index("method")
    rows = []
    for net_name in _bar(nets, "step times (per net)", quiet):
        net = get_net(net_name)
        for gbps, lat in links.items():
            cl = Cluster(f"{gbps:g} Gb/s", Network(f"{gbps:g} Gb/s", gbps * 1e9, lat), gpu="p100", gpus_per_node=4,
                         intra_bandwidth=320e9)
            for N in workers:
                best = {}
                for method in dict.fromkeys(steps.method):
                    enc, dec = scale * float(c.encode_host[method]), scale * float(c.decode_host[method])
                    sync = method_sections(method)[1]
                    every = int(sync.get("every", 1)) if sync.get("local") else 1
                    options = []
                    for pat in sorted(set(wire[wire.method == method].pattern)):
                        ex = Exchange({"ring": "ring", "ps": "ps", "allgather": "allgather"}[pat], servers=0)
                        it = iteration(net, _wire(method, wire, pat, enc, dec), N, cl, ex)
                        t = ((every - 1) * it["compute"] + it["iteration"]) / every
                        options.append((t, pat, it))
                    t, pat, it = min(options, key=lambda o: o[0])
                    best[method] = (t, pat, it, every)
                for r in steps.itertuples():
                    t, pat, it, every = best[r.method]
                    rows.append(dict(rule=r.rule, problem=r.problem, net=net_name, link_gbps=gbps, workers=N,
                                     method=r.method, lr=r.lr, K=r.K, pattern=pat, t_step=t, compute=it["compute"],
                                     exposed_comm=it["exposed_comm"] / every, codec_seconds=it["codec_seconds"] / every,
                                     time_to_target=r.K * t, codec_cost=codec_cost))
    df = pd.DataFrame(rows)
    key = ["rule", "net", "link_gbps", "workers"]
    ref = df[df.method == baseline()].set_index(key).time_to_target
    floats_ = df[df.method.isin(list(floats()))]
    best_f = floats_.loc[floats_.groupby(key).time_to_target.idxmin().dropna()].set_index(key)
    idx = pd.MultiIndex.from_frame(df[key])
    df["speedup_fp32"] = ref.reindex(idx).to_numpy() / df.time_to_target.to_numpy()
    df["speedup_best"], df["speedup_best_lo"], df["speedup_best_hi"] = _seed_speedups(df, steps)
    df["best_float"] = best_f.method.reindex(idx).to_numpy()
    df["quick"] = bool(quick)
    return with_codec_options(df)[COLUMNS]


def figure_title(rule: str, quick: bool) -> str:
    """time.png's title; it starts with QUICK_MARK when the steps or the run came from --quick."""
    return ((QUICK_MARK + "\n" if quick else "") +
            "time to the loss target relative to the best of fp32/fp16/bf16 (> 1: the codec wins)\n"
            f"steps measured ({rule}), step time modeled, codec seconds counted; a missing method did not "
            "reach the target in every seed")


def _figure(df: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    sns.set_theme(style="whitegrid", context="paper")
    rule = "own-lr" if "own-lr" in set(df.rule) else "fp32-lr"
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
        allow_quick: bool = False) -> dict[str, pd.DataFrame]:
    """Steps from `bits`/bits_runs.csv (run `compare bits` into that directory first when it is missing,
    --quick form if bits_quick); bytes and codec seconds measured here; writes the CSVs and figure.
    A --quick bits_runs.csv raises QuickInputError unless allow_quick or bits_quick (this run is --quick);
    the output is marked quick when the input or this run is."""
    from tgsim.analysis.common import write_tables

    if codec_cost not in CODEC_COSTS:
        raise ValueError(f"codec_cost must be one of {CODEC_COSTS}, got {codec_cost!r}")
    t0 = time.perf_counter()
    path = Path(bits) / "bits_runs.csv" if bits is not None else None
    if path is None or not path.exists():
        from tgsim.analysis import compare_bits as cb
        from tgsim.analysis.compare_cli import BITS_QUICK_STEPS

        kw = {}
        if bits_quick:
            from tgsim.analysis.common import quick_methods

            kw = dict(methods=tuple(dict.fromkeys([*list(floats())[:2], *quick_methods()])), seeds=(0,),
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
    methods = list(dict.fromkeys(steps.method))
    wire = measure_wire(methods, workers, n_wire, quiet=quiet)
    cost = measure_codec_cost(methods, n_cost, quiet=quiet)
    factor = cost_scale(cost, codec_cost)
    cost["encode_used"], cost["decode_used"] = cost.encode_host * factor, cost.decode_host * factor
    table = model_times(steps, wire, cost, nets, links, workers, codec_cost, quiet=quiet, quick=quick)
    res = {"time_wire": with_codec_options(wire.assign(quick=quick)),
           "time_codec": with_codec_options(cost.assign(quick=quick)), "time": table}
    seconds = time.perf_counter() - t0
    out = write_tables(out, res, lambda d: _figure(table, d / "time.png"))
    if not quiet:
        _print_summary(res, seconds, out)
    return res


def _print_summary(res: dict, seconds: float, out) -> None:
    t, cost = res["time"], res["time_codec"]
    mark = "QUICK " if t.quick.any() else ""
    if mark:
        print(QUICK_MARK)
    print(mark + "codec seconds per element (host, one core; used = " + str(t.codec_cost.iloc[0]) + "):")
    print(cost.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    for rule, d in t.groupby("rule", sort=False):
        print(f"\n{mark}{rule}: speedup of the time to target over the best of fp32 / fp16 / bf16 (> 1: the codec wins; "
              "nan: not reached)")
        piv = d.pivot_table(index=["net", "link_gbps", "workers"], columns="method", values="speedup_best",
                            dropna=False, sort=False)
        print(piv.to_string(float_format=lambda v: f"{v:.2f}"))
        wins = d[(d.speedup_best > 1) & ~d.method.isin(list(floats()))]
        print(f"{mark}{rule}: a codec beats every float baseline in {wins[['net', 'link_gbps', 'workers']].drop_duplicates().shape[0]} "
              f"of {d[['net', 'link_gbps', 'workers']].drop_duplicates().shape[0]} (net, link, N) settings")
    if out is not None:
        print(f"\nwrote {out}/time_wire.csv, time_codec.csv, time.csv, time.png ({seconds:.0f} s)")
