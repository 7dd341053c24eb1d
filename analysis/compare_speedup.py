"""`tgsim compare speedup`: iterations to a fixed suboptimality against the worker count M, per method,
and against the compression ratio at a fixed M (Jiang & Agrawal 2018: does sparsity or quantization
cost the linear speedup?).

Learning rates, two rules side by side (column "rule"), from the grid `LR_GRID` of γ0 (0.0625,
0.125, 0.25, 0.5), tuned on a validation split (20 % of the training rows held out:
`data.options.validation`): every (method, γ0) trains `tune_steps` (300) iterations at M =
`tune_M` (the fixed M of the compression sweep, 16), seed `TUNE_SEED` (100, not a reported seed);
score = the validation loss then (diverged: +inf); rows in speedup_lr_grid.csv.
  fp32-lr  the paper's rule: fp32's best γ0 for every method;
  own-lr   each method's own best γ0 (runs shared with fp32-lr where the two are equal).
The compression sweep runs under fp32-lr only (a per-knob grid is not run).

Problem: least squares with a known optimum (model and data "least_squares", `Setup.optimum` = w*,
the training-set minimiser from the normal equations), f(w) = 1/(2n) ||X w - y||^2, rows x = z * s
with the spectrum s_i^2 from 1 to 1/cond (the Hessian H = E[x x^T]), labels y = x.w_true + σ e.
M workers, each with its own fixed per-worker batch b (`batch_mode = "per_worker"`): the total batch
M b grows with M, the linear-speedup regime. Plain SGD, Robbins-Monro rate γ_t = γ0 / (1 + t/τ), the
same rule for every M (γ0 from the grid above). Defaults (`Problem`): d = 64,
cond = 1, σ = 6, b = 64, γ0 = 0.25 (without a grid), τ = 16, ε = 0.02, n = 2^18 rows. Batches are drawn without
replacement within each worker's shard; once a run passes an epoch the noise of the epoch's batches
cancels at w* (random reshuffling) and K drops faster than 1/M, so n is chosen with K M b <= n
(one epoch at most) where the speedup is linear.

Why this regime is noise-dominated. Near w* the averaged gradient is H (w - w*) + ξ with
Cov ξ ≈ σ^2 H / (M b). With γ_t = a / (t + τ), a = γ0 τ, and a μ > 1/2 (μ = 1/cond the smallest
eigenvalue of H), the classical asymptotics of SGD on a quadratic give

    E ||w_t - w*||^2 ≈ a^2 σ^2 / ((2 a μ' - 1) M b t)      summed over the eigen-directions μ'

so the iterations to reach E||w - w*||^2 / ||w*||^2 = ε^2 are K_ε ∝ 1 / (M ε^2): log K_ε against
log M has slope -1 (linear speedup) as long as K_ε is much longer than the deterministic transient
~ log(1/ε) / (γ0 μ). When M is large enough that K_ε reaches the transient, the curve flattens:
that M is where the speedup stops being linear. A compressor Q with E||Q(g) - g||^2 <= q ||g||^2
(unbiased) multiplies the noise term by about (1 + q) (Jiang & Agrawal's factor), which shifts
log K up by log(1 + q) without changing the slope, as long as the variance term still dominates;
a biased compressor with error feedback adds a delay-like term instead.

Methods (`default_methods`): every registered codec, then Jiang & Agrawal's three (`paper_methods`):
PQASGD, "terngrad+pqasgd" (TernGrad on the model difference every 4 steps); QSGD at the levels their
O(1/sqrt(MK)) rate needs, "qsgd[levels=8]" for d = 64: s = ceil(sqrt(d)) (`qsgd_levels`) at every M, d the
problem's dimension (`Problem.dim`), so that QSGD's variance factor q = min(d/s^2, sqrt(d)/s) <= 1; and
sparse parameter averaging, "fp32+pqasgd" (the model difference every 4 steps, uncompressed: Q =
identity). They run in the worker sweep only (`default_sweeps`).

Measured: K = the first iteration t (1-based) with ||w_t - w*|| / ||w*|| <= ε (`dist_opt` of
metrics.csv, computed at every step here: `Setup.distance_to_optimum`), capped at `cap_factor`
times fp32's K at the same (M, seed) (and at least `min_cap`): a method slower than that is
reported "not reached" (K = NaN, `status` says why), as is a run whose distance diverged
(> 1e6 or non-finite). The local-step method (PQASGD, `[exchange] local = "pqasgd"`) is measured
on x_s, the last synchronized model, so its K is a sync step; K counts iterations (local steps).

Outputs (`--out DIR`, default results/compare-speedup):
  speedup_lr_grid.csv  one row per (method, γ0) of the tuning grid: `GRID_COLUMNS`
  speedup_runs.csv   one row per (sweep, rule, method, knob, M, seed): the rule and its γ0 (lr), K, status, cap, steps run, measured
                     uplink bits per element per iteration (bits_up: 8 x worker 0's message bytes, wire_bytes,
                     summed over the run's messages, every round of a multi-round codec and the inner codec's
                     under error feedback, / (steps x model elements)), compression ratio 32 / bits_up, seconds
  speedup.csv        one row per (sweep, rule, method, knob, M): seeds reached, geometric mean of K with a
                     95 % t-interval over seeds (on log K; nan unless every seed reached ε),
                     speedup K_fp32(M=1) / K, efficiency
                     speedup / M, local slope d log K / d log M to the previous M
  speedup_fit.csv    one row per (rule, method): slope of log K on log M (least squares over every reached
                     (M, seed), 95 % t-interval), the same over the linear part, and M_linear: the
                     largest M up to which every local slope is <= -0.8 (the first M whose local slope
                     rises above -0.8 ends it)
  speedup.png        K against M (log-log, one line per method, ideal 1/M from fp32's M = 1) and K
                     against the compression ratio at the fixed M
Each CSV's `codec_options`, after `method`: every option of the row's codec (at its knob in the
compression sweep), defaults filled in (tgsim.analysis.common.codec_options).

Verdict rules on speedup_runs.csv's worker sweep (tgsim.analysis.verdicts, used by papers_figures/fig09):
  `linear_range`   the largest prefix of M (>= 3 values) over which fp32's slope β of log K on log M
                   has the upper end of the 90 % interval of β + 1 below 0.15 (speedup at least linear,
                   not flattened; two_sided=True: the TOST of β against -1), margin 0.15, α = 0.05;
  `keeps_speedup`  a method's slope against fp32's over that range: one-sided non-inferiority of
                   β_method - β_fp32 < 0.15.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from tgsim.analysis.common import with_codec_options

DEFAULT_OUT = "results/compare-speedup"
LINEAR_SLOPE = -0.8          # a local slope above this ends the linear regime
LR_GRID = (0.0625, 0.125, 0.25, 0.5)    # γ0 tried on the validation split
VALIDATION = 0.2
TUNE_SEED = 100
RULES = ("fp32-lr", "own-lr")
GRID_COLUMNS = ["method", "codec_options", "lr", "workers", "seed", "steps", "status", "val_loss", "chosen_fp32_lr",
                "chosen_own_lr", "seconds"]


@dataclasses.dataclass(frozen=True)
class Problem:
    """The least-squares problem and the schedule (defaults: the full form)."""

    dim: int = 64
    n: int = 262144          # training rows: K M b <= n, so a run stays in its first epoch (see below)
    cond: float = 1.0        # H = I: μ = 1, transient ~ log(1/ε) / γ0
    noise: float = 6.0       # σ of the labels: sets K(M = 1) (∝ σ^2)
    batch: int = 64          # per worker
    lr: float = 0.25         # γ0 (mean-square stable: γ0 (1 + (d + 2) / b) < 2 with room for the codecs)
    tau: float = 16.0        # γ_t = γ0 / (1 + t/τ); a μ = γ0 τ μ = 4 > 1/2
    eps: float = 0.02        # target ||w - w*|| / ||w*||


def qsgd_levels(dim: int) -> int:
    """s = ceil(sqrt(dim)), exactly (integer square root): the fewest QSGD levels with s >= sqrt(dim)."""
    s = math.isqrt(dim)
    return s + (s * s < dim)


def paper_methods(dim: int = Problem.dim) -> tuple[str, ...]:
    """Jiang & Agrawal's three methods, run beside the registered codecs (`default_methods`), for a
    least-squares problem of `dim` weights (`Problem.dim`, 64, unless given; `run` passes its problem's):
      "terngrad+pqasgd"   PQASGD: TernGrad's quantizer on the model difference every 4 steps
                          (tgsim.analysis.common.LOCAL_VARIANTS);
      "qsgd[levels=S]"    quantized SGD configured as their O(1/sqrt(MK)) rate needs. QSGD with s levels
                          has E||Q(v) - v||^2 <= q ||v||^2, q = min(d/s^2, sqrt(d)/s), d the elements of
                          a bucket (here the weight layer: dim <= 512, QSGD's bucket), and the rate holds
                          while q stays bounded; at s = sqrt(d), q = min(1, 1) = 1. So S = ceil(sqrt(dim))
                          (`qsgd_levels`: 8 at dim 64, 4 at dim 16), the same at every worker count M: the
                          levels follow the model's dimension, not M. Reviewer 4 of Jiang & Agrawal
                          (NeurIPS 2018) reads the condition so: "the quantization level s is
                          proportional to the square root of the data dimension N";
      "fp32+pqasgd"       sparse parameter averaging (periodic averaging, Q = identity): the model
                          difference every 4 steps through the PQASGD exchange, uncompressed (float32,
                          8 bits up per element per iteration)."""
    from tgsim.analysis.common import FP32, TERNGRAD
    from tgsim.codecs.qsgd import QSGD

    return (f"{TERNGRAD}+pqasgd", f"{QSGD.name}[levels={qsgd_levels(dim)}]", f"{FP32}+pqasgd")


def default_methods(dim: int = Problem.dim) -> tuple[str, ...]:
    """Every registered codec, plugins included (tgsim.analysis.common.default_methods), then
    `paper_methods(dim)` (duplicates dropped)."""
    from tgsim.analysis.common import default_methods as methods

    return tuple(dict.fromkeys((*methods(), *paper_methods(dim))))


def method_sections(method: str) -> tuple[dict, dict]:
    """(codec section, exchange section) of a method label: a registered codec with its options,
    "+ef", "+pqasgd" (tgsim.analysis.common.split_label)."""
    from tgsim.analysis.common import method_sections as sections

    return sections(method)


def default_sweeps(methods, dim: int = Problem.dim) -> dict[str, tuple[str, tuple]]:
    """The compression sweep at fixed M: method -> (option, values) for every method whose codec
    declares a numeric option with "sweep" metadata (its first; tgsim.codecs.options), from the
    registry, plugins included. `paper_methods(dim)` run in the worker sweep only: they test Jiang &
    Agrawal's rate in M at the configuration the theorem needs (a label given explicitly is swept as
    usual, e.g. "qsgd[levels=3]" over its bucket)."""
    from tgsim.analysis.common import split_label
    from tgsim.codecs import registry

    paper = set(paper_methods(dim))
    out = {}
    for m in methods:
        if m in paper:
            continue
        name, opts, _, _ = split_label(m)
        for key, values in registry.info(name)["sweeps"].items():
            if key not in opts and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                out[m] = (key, tuple(values))
                break
    return out


def config(problem: Problem, M: int, method: str, seed: int, steps: int, codec_over: dict | None = None,
           validation: float = 0.0):
    """The run config of `method` with M workers (tgsim.train.config.Config); validation > 0 holds
    that fraction of the training rows out (evaluate then sees it)."""
    from tgsim.train.config import from_dict

    codec, exchange = method_sections(method)          # a registered codec and its options
    codec = {**codec, **(codec_over or {})}
    return from_dict({
        "run": {"name": f"speedup-{method}", "seed": seed, "steps": steps, "log_every": 10**9},
        "data": {"name": "least_squares", "options": {"n": problem.n, "dim": problem.dim, "noise": problem.noise,
                                                       "cond": problem.cond,
                                                       **({"validation": validation} if validation else {})}},
        "model": {"name": "least_squares"},
        "workers": {"n": M, "batch": problem.batch, "batch_mode": "per_worker"},
        "codec": codec,
        "exchange": {"mode": "ps", **exchange},
        "optimizer": {"name": "sgd"},
        "schedule": {"name": "robbins_monro", "lr": problem.lr, "tau": problem.tau},
    })


class _Setups:
    """tgsim.train.loop.build, with the dataset, model and optimum of a seed built once (they do not
    depend on M or the codec): the shards, codec, optimizer and exchange are made as build makes them."""

    def __init__(self):
        self.base = {}

    def __call__(self, cfg):
        from tgsim.codecs import error_feedback, registry
        from tgsim.data import shard
        from tgsim.exchange import InProcessExchange
        from tgsim.train.loop import Setup, build
        from tgsim.train.optim import make_optimizer

        key = (cfg.run.seed, repr(cfg.data), repr(cfg.model))
        if key not in self.base:
            self.base[key] = build(cfg)
            return self.base[key]
        b = self.base[key]
        shards = shard(b.dataset.y_train, cfg.workers.n, scheme=cfg.data.sharding, alpha=cfg.data.alpha,
                       seed=cfg.run.seed)
        codec = registry.make_codec(cfg.codec)
        if cfg.codec.error_feedback:
            codec = error_feedback.ErrorFeedback(codec)
        return Setup(cfg, b.dataset, shards, b.model, codec, make_optimizer(cfg.optimizer),
                     InProcessExchange(cfg.workers.n), b.optimum, b.xp)


def _count_bytes(codec, sizes: list):
    """Record worker 0's message bytes (`wire_bytes`) of every message the codec makes: of each
    encode_many call, or for a codec of several rounds (properties.rounds > 1, which the trainer runs
    through start_rounds / next_round) of each round. The innermost codec is patched: error feedback
    (`.inner`) encodes through its inner codec's encode_many."""
    inner = codec
    while getattr(inner, "inner", None) is not None:
        inner = inner.inner
    names = ("start_rounds", "next_round") if getattr(inner.properties, "rounds", 1) > 1 else ("encode_many",)
    for name in names:
        orig = getattr(inner, name)

        def wrapped(*args, _orig=orig, **kwargs):
            out = _orig(*args, **kwargs)
            msgs = out[0] if isinstance(out, tuple) else out
            if len(msgs):
                sizes.append(int(msgs[0].wire_bytes))
            return out

        object.__setattr__(inner, name, wrapped)     # the instance only (frozen dataclasses too)


def hitting_time(cfg, eps: float, setups=None) -> dict:
    """Train per cfg until ||w - w*|| / ||w*|| <= eps or cfg.run.steps iterations, measuring the
    distance at every step. Returns {K (nan if not reached), status, steps, dist_final, bits_up,
    seconds}; bits_up: a worker's message bytes (wire_bytes, as the exchange counts them) summed over
    the run, times 8, per model element and iteration (PQASGD sends every p iterations)."""
    from tgsim.errors import NonFiniteGradientError
    from tgsim.analysis.common import fresh_run

    t0 = time.perf_counter()
    setup = (setups or _Setups())(cfg)
    sizes: list[int] = []
    _count_bytes(setup.codec, sizes)
    setup, params, opt, state, step_fn = fresh_run(cfg, setup)
    keys = list(setup.optimum)
    w_star = np.concatenate([np.asarray(setup.optimum[k], np.float64).ravel() for k in keys])
    norm = float(np.linalg.norm(w_star))
    K, status, dist, t = float("nan"), f"not reached in {cfg.run.steps}", float("nan"), 0
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(cfg.run.steps):
            try:
                params, opt, _ = step_fn(setup, params, opt, t, False, codec_state=state)
            except (NonFiniteGradientError, FloatingPointError, ValueError) as e:
                status = f"diverged ({type(e).__name__})"
                break
            w = np.concatenate([np.asarray(params[k], np.float64).ravel() for k in keys])
            dist = float(np.linalg.norm(w - w_star)) / norm
            if not math.isfinite(dist) or dist > 1e6:
                status = "diverged"
                break
            if dist <= eps:
                K, status = t + 1, "reached"
                break
    steps = t + 1
    return dict(K=K, status=status, steps=steps, dist_final=dist, bits_up=8 * sum(sizes) / (steps * w_star.size),
                seconds=time.perf_counter() - t0)


def t_interval(logs) -> tuple[float, float, float]:
    """(geometric mean, lower, upper) of exp(log K) with a 95 % t-interval over seeds (nan if < 2)."""
    from scipy import stats

    x = np.asarray([v for v in logs if math.isfinite(v)], dtype=np.float64)
    if x.size == 0:
        return (float("nan"),) * 3
    m = float(x.mean())
    if x.size < 2:
        return math.exp(m), float("nan"), float("nan")
    h = float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return math.exp(m), math.exp(m - h), math.exp(m + h)


def fit_slope(M, K, seed) -> dict:
    """Slope β of log K = α_seed + β log M (least squares with one intercept per seed: the runs of a
    seed share its data set and optimum) with a 95 % t-interval; finite K only
    (`verdicts.slope_fit`): slope, slope_lo, slope_hi, points."""
    from tgsim.analysis.verdicts import slope_fit

    f = slope_fit(M, K, seed, alpha=0.05)
    return dict(slope=f["slope"], slope_lo=f["lo"], slope_hi=f["hi"], points=f["points"])


def summarize(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(speedup.csv, speedup_fit.csv) from the per-run rows."""
    from tgsim.analysis.common import baseline

    rows = []
    keys = ["sweep", "rule", "method", "knob", "knob_value"]
    for key, g in runs.groupby(keys, sort=False, dropna=False):
        prev = None
        base = runs[(runs.method == baseline()) & (runs.workers == runs.workers.min()) & (runs.sweep == "workers")
                    & (runs.rule == RULES[0])]
        k1 = t_interval(np.log(base.K))[0] if len(base) else float("nan")
        for M, gm in g.groupby("workers"):
            # over all seeds, or nan where some seed did not reach eps (a mean of the reached ones would flatter)
            gmean, lo, hi = t_interval(np.log(gm.K)) if gm.K.notna().all() else (float("nan"),) * 3
            local = float("nan")
            if prev is not None and math.isfinite(gmean) and math.isfinite(prev[1]):
                local = math.log(gmean / prev[1]) / math.log(M / prev[0])
            rows.append(dict(zip(keys, key), workers=M, seeds=len(gm), reached=int(gm.K.notna().sum()),
                             K_gmean=gmean, K_lo=lo, K_hi=hi, speedup=k1 / gmean, efficiency=k1 / gmean / M,
                             local_slope=local, bits_up=float(gm.bits_up.mean()),
                             compression=32.0 / float(gm.bits_up.mean()) if gm.bits_up.mean() > 0 else float("nan")))
            prev = (M, gmean)
    table = pd.DataFrame(rows)
    fits = []
    for (rule, method), g in runs[runs.sweep == "workers"].groupby(["rule", "method"], sort=False):
        t = table[(table.sweep == "workers") & (table.rule == rule) & (table.method == method)].sort_values("workers")
        m_lin = float(t.workers.iloc[0]) if len(t) else float("nan")
        for M, s in zip(t.workers.iloc[1:], t.local_slope.iloc[1:]):
            if not (s <= LINEAR_SLOPE):       # nan (not reached) ends it too
                break
            m_lin = float(M)
        lin = g[g.workers <= m_lin]
        f_all, f_lin = fit_slope(g.workers, g.K, g.seed), fit_slope(lin.workers, lin.K, lin.seed)
        fits.append(dict(rule=rule, method=method, lr=float(g.lr.iloc[0]), **f_all, M_linear=m_lin, **{f"linear_{k}": v for k, v in f_lin.items()},
                         not_reached=int(g.K.isna().sum()), runs=len(g)))
    return table, pd.DataFrame(fits)


def _figure(table: pd.DataFrame, path: Path, fixed_M: int | None, fp32_K: dict) -> None:
    from tgsim.analysis.common import baseline

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    sweep = table[table.sweep == "compression"]
    fig, axes = plt.subplots(1, 2 if len(sweep) else 1, figsize=(11 if len(sweep) else 6, 4.2), squeeze=False)
    ax = axes[0, 0]
    w = table[table.sweep == "workers"]
    sns.lineplot(data=w, x="workers", y="K_gmean", hue="method", style="rule", style_order=list(RULES),
                 marker="o", ax=ax, errorbar=None)
    for _, g in w[w.rule == RULES[0]].groupby("method", sort=False):
        ax.fill_between(g.workers, g.K_lo, g.K_hi, alpha=0.12)
    fp = w[(w.method == baseline()) & (w.rule == RULES[0])].sort_values("workers")
    if len(fp) and math.isfinite(fp.K_gmean.iloc[0]):
        ms = np.array(sorted(w.workers.unique()), dtype=float)
        ax.plot(ms, fp.K_gmean.iloc[0] * ms[0] / ms, "k:", label="ideal 1/M (fp32)")
    ax.set(xscale="log", yscale="log", xlabel="workers M (fixed per-worker batch)",
           ylabel="iterations K to ||w-w*||/||w*|| <= eps",
           title="solid: fp32's γ0 for all; dashed: own γ0 (95 % bands: fp32-lr)")
    ms = sorted(w.workers.unique())
    ax.set_xticks(ms, [str(int(m)) for m in ms])
    ax.minorticks_off()
    ax.legend(fontsize=7)
    if len(sweep):
        ax = axes[0, 1]
        sns.lineplot(data=sweep, x="compression", y="K_gmean", hue="method", marker="o", ax=ax, errorbar=None)
        ref = t_interval([math.log(k) for (M, _), k in fp32_K.items() if M == fixed_M and k > 0])[0]
        if math.isfinite(ref):
            ax.axhline(ref, color="k", ls=":", label=f"{baseline()}, M = {fixed_M}")
        ax.set(xscale="log", yscale="log", xlabel="compression ratio 32 / (uplink bits per element)",
               ylabel="iterations K", title=f"M = {fixed_M}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


_SETUPS = None      # per process: the setups cache of _job


def _job(args) -> dict:
    """One run of the sweep (in a worker process with jobs > 1): args = (job, problem, cap)."""
    global _SETUPS
    from tgsim.analysis.common import single_thread

    (sweep, method, key, value, M, seed), problem, cap = args
    _SETUPS = _SETUPS or _Setups()
    cfg = config(problem, M, method, seed, cap, {key: value} if key else None)
    with single_thread():
        r = hitting_time(cfg, problem.eps, _SETUPS)
    return dict(sweep=sweep, method=method, lr=problem.lr, knob=key or "", knob_value=value if key else np.nan,
                workers=M, seed=seed, eps=problem.eps, cap=cap, **r)


def validation_loss(cfg) -> dict:
    """Train cfg.run.steps iterations (no early stop) and return the loss on the held-out rows."""
    from tgsim.analysis.common import fresh_run
    from tgsim.errors import NonFiniteGradientError

    t0 = time.perf_counter()
    setup, params, opt, state, step_fn = fresh_run(cfg)
    status, loss = "ok", float("inf")
    with np.errstate(over="ignore", invalid="ignore"):
        try:
            for t in range(cfg.run.steps):
                params, opt, _ = step_fn(setup, params, opt, t, False, codec_state=state)
            loss = float(setup.model.evaluate(params, setup.dataset.x_test, setup.dataset.y_test)[0])
        except (NonFiniteGradientError, FloatingPointError, ValueError) as e:
            status = f"diverged ({type(e).__name__})"
    if not math.isfinite(loss):
        status, loss = ("diverged" if status == "ok" else status), float("inf")
    return dict(status=status, val_loss=loss, seconds=time.perf_counter() - t0)


def _tune_job(args) -> dict:
    """One tuning run: args = (method, lr, M, steps, problem)."""
    from tgsim.analysis.common import single_thread

    method, lr, M, steps, problem = args
    cfg = config(dataclasses.replace(problem, lr=lr), M, method, TUNE_SEED, steps, validation=VALIDATION)
    with single_thread():
        r = validation_loss(cfg)
    return dict(method=method, lr=lr, workers=M, seed=TUNE_SEED, steps=steps, **r)


def tune(problem: Problem, methods, lr_grid, M: int, steps: int, jobs: int, bar) -> tuple[pd.DataFrame, dict]:
    """The γ0 grid of every method on the validation split: (speedup_lr_grid table, {method: best γ0});
    ties and an all-diverged method go to the smallest γ0."""
    from tgsim.analysis.common import baseline

    rows = _map(_tune_job, [(m, float(lr), M, steps, problem) for m in methods for lr in lr_grid], jobs, bar)
    grid = pd.DataFrame(rows)
    own = {}
    for m, g in grid.groupby("method", sort=False):
        order = np.lexsort((g.lr.to_numpy(), g.val_loss.to_numpy()))
        own[m] = float(g.lr.to_numpy()[order[0]])
    grid["chosen_fp32_lr"] = grid.lr == own[baseline()]
    grid["chosen_own_lr"] = [lr == own[m] for m, lr in zip(grid.method, grid.lr)]
    return with_codec_options(grid)[GRID_COLUMNS], own


def _map(fn, items, jobs: int, bar):
    """fn over items, in `jobs` spawned processes (1: here), updating the progress bar."""
    if jobs <= 1:
        out = []
        for it in items:
            out.append(fn(it))
            bar.update(1)
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        out = []
        for r in pool.map(fn, items):
            out.append(r)
            bar.update(1)
        return out


RUN_COLUMNS = ["sweep", "rule", "method", "codec_options", "lr", "knob", "knob_value", "workers", "seed", "eps",
               "cap", "K", "status", "steps", "dist_final", "bits_up", "seconds", "compression"]


def run(out=DEFAULT_OUT, *, workers=(1, 2, 4, 8, 16, 32, 64), methods=None, seeds=(0, 1, 2),
        problem: Problem = Problem(), fixed_M: int | None = 16, sweeps=None, cap_factor: float = 8.0,
        min_cap: int = 400, fp32_cap: int = 40000, lr_grid=LR_GRID, tune_steps: int = 300, jobs: int = 1,
        quiet: bool = False) -> dict[str, pd.DataFrame]:
    """The γ0 grid on the validation split (`tune`, at M = fixed_M or 8; lr_grid=(): none, every
    method at problem.lr, rule fp32-lr only), then every (rule, method, M, seed) of the worker sweep
    and every (method, knob, seed) of the compression sweep at fixed_M (None: no sweep; fp32's γ0),
    fp32 first (its K sets the others' caps), in `jobs` processes; writes the CSVs and the figure to
    `out` (None: nothing written). See the module docstring."""
    from tqdm import tqdm

    from tgsim.analysis.common import baseline, write_tables

    base = baseline()
    methods = default_methods(problem.dim) if methods is None else tuple(methods)
    if base not in methods:
        methods = (base, *methods)         # every cap is relative to the baseline's (fp32's) K
    sweeps = default_sweeps(methods, problem.dim) if sweeps is None else sweeps
    lr_grid = tuple(float(x) for x in lr_grid)
    rules = RULES if lr_grid else RULES[:1]
    Ms = sorted(set(workers) | ({fixed_M} if fixed_M is not None else set()))
    t0 = time.perf_counter()
    with tqdm(total=len(methods) * len(lr_grid) + len(Ms) * len(seeds), desc="compare speedup", unit="run",
              disable=quiet or None) as bar:
        if lr_grid:
            grid, own = tune(problem, methods, lr_grid, fixed_M or 8, tune_steps, jobs, bar)
        else:
            grid, own = pd.DataFrame(columns=GRID_COLUMNS), {m: problem.lr for m in methods}
        lr = {(rule, m): own[base] if rule == "fp32-lr" else own[m] for rule in rules for m in methods}
        at = {r: dataclasses.replace(problem, lr=r) for r in set(lr.values())}
        first = [("workers", base, None, None, M, s) for s in seeds for M in Ms]
        rows = _map(_job, [(j, at[own[base]], fp32_cap) for j in first], jobs, bar)
        fp32_K = {(r["workers"], r["seed"]): r["K"] for r in rows}

        def cap(M, seed):
            ref = fp32_K[(M, seed)]
            return max(min_cap, int(cap_factor * ref)) if math.isfinite(ref) else fp32_cap

        distinct = list(dict.fromkeys((m, lr[(rule, m)]) for rule in rules for m in methods if m != base))
        rest = [(("workers", m, None, None, M, s), r) for m, r in distinct for s in seeds for M in workers]
        if fixed_M is not None:
            rest += [(("compression", m, key, v, fixed_M, s), own[base]) for s in seeds
                     for m, (key, values) in sweeps.items() for v in values]
        bar.total = bar.n + len(rest)
        bar.refresh()
        rows += _map(_job, [(j, at[r], cap(j[4], j[5])) for j, r in rest], jobs, bar)
    rows = [dict(r, rule=rule) for r in rows for rule in rules
            if (r["sweep"] == "workers" and lr[(rule, r["method"])] == r["lr"])
            or (r["sweep"] == "compression" and rule == RULES[0])]
    runs = pd.DataFrame(rows)
    runs = runs[(runs.method != base) | runs.workers.isin(workers)].reset_index(drop=True)
    runs["compression"] = 32.0 / runs.bits_up
    runs = with_codec_options(runs)[RUN_COLUMNS]
    table, fits = summarize(runs)
    res = {k: with_codec_options(v) for k, v in
           {"speedup_lr_grid": grid, "speedup_runs": runs, "speedup": table, "speedup_fit": fits}.items()}
    seconds = time.perf_counter() - t0
    out = write_tables(out, res, lambda d: _figure(table, d / "speedup.png", fixed_M, fp32_K))
    if not quiet:
        _print_summary(res, problem, seconds, out, jobs)
    return res


def _print_summary(res: dict, problem: Problem, seconds: float, out, jobs: int = 1) -> None:
    table, fits, grid = res["speedup"], res["speedup_fit"], res["speedup_lr_grid"]
    if len(grid):
        print("γ0 of least validation loss (grid " + ", ".join(f"{x:g}" for x in sorted(set(grid.lr))) +
              f", M = {int(grid.workers.iloc[0])}, {int(grid.steps.iloc[0])} iterations, seed {TUNE_SEED}): " +
              ", ".join(f"{m} {float(g[g.chosen_own_lr].lr.iloc[0]):g}" for m, g in grid.groupby("method", sort=False)))
    w = table[table.sweep == "workers"]
    for rule, wr in w.groupby("rule", sort=False):
        piv = wr.pivot(index="workers", columns="method", values="K_gmean")
        print(f"\n{rule}: iterations K to ||w-w*||/||w*|| <= {problem.eps} (geometric mean over seeds; nan: not "
              f"reached), least squares dim {problem.dim}, per-worker batch {problem.batch}, γ0/(1+t/{problem.tau}):")
        print(piv.round(0).to_string())
    print(f"\nslope of log K on log M (95 % interval), and M_linear (local slopes <= {LINEAR_SLOPE} up to it):")
    print(fits[["rule", "method", "lr", "slope", "slope_lo", "slope_hi", "M_linear", "linear_slope", "not_reached"]]
          .round(3).to_string(index=False))
    c = table[table.sweep == "compression"]
    if len(c):
        print(f"\ncompression sweep at M = {int(c.workers.iloc[0])}: K against compression ratio")
        print(c[["method", "knob", "knob_value", "compression", "K_gmean", "K_lo", "K_hi", "reached", "seeds"]]
              .round(2).to_string(index=False))
    if out is not None:
        print(f"\nwrote {out}/speedup_lr_grid.csv, speedup_runs.csv, speedup.csv, speedup_fit.csv, speedup.png ({seconds:.0f} s, "
              f"{jobs} process{'es' if jobs > 1 else ''})")
