"""`tgsim compare bits`: total uplink + downlink bits until the training loss first reaches a
threshold, and the test accuracy then, per method (issue 19, item 2).

Problems (`PROBLEMS`): logistic regression (multinomial: data "digits", model "softmax", 10 classes,
640 weights) and the MNIST-1D convnet of the demo (data "mnist1d", model "convnet1d", 23,882
parameters). Both: 8 workers, total batch 64 (8 per worker), momentum 0.9, constant learning rate
0.1 (fp32's rate of the demo, tgsim/configs/demo.toml; the demo's step decay comes at step 3000,
after these runs end). Every method trains at fp32's rate (the paper's rule), none has its own: the
column "lr" holds the rate used. The sign-type codec runs only with error feedback
(scaled_sign+ef); the plain sign is not compared. On the convnet several codecs do not train at
this rate (in the full run, seeds 0-2: terngrad with MAX sharing, qsgd at 3 levels, scaled_sign+ef,
randomk, suresh stall or collapse, accuracy near chance; topk+ef is slower): they are reported "not
reached", not given their own rate (issue 19 item 5, a per-method grid, is a separate comparison).

Threshold. The training loss of a step is the mean over the workers' batches; it is smoothed by a
trailing rolling mean over `window` steps (50; --quick: steps // 5). Phase 1 trains fp32 for `steps`
steps per seed; threshold = 1.25 x the mean over seeds of the minimum of fp32's smoothed curve.
Phase 2 trains every method (fp32 again: deterministic, so fp32's ratio is exactly 1) until its
smoothed loss first reaches the threshold or the cap, `cap_factor` (2) x `steps` ("not reached in
S"; "diverged" for a non-finite gradient or loss): fp32 reaches it near the end of its own run, so a
method about as fast needs room past `steps`. At the stopping step: K (1-based step of the hit), the bits one
worker sent (uplink) and received (downlink) summed over steps 1..K, from the wire bytes the
exchange counts for the codec's real payloads (`StepInfo.sent` / `received`), and the test accuracy
of the model then (the accuracy at the threshold; at the last step where not reached). Exchange mode
"ps" (push the codes, pull the server's downlink); the float32 wire (fp32) is always counted as a ring
all-reduce, 2 (N-1)/N x 32 = 56 bits per element each way at N = 8: fp32's best uncompressed baseline.

Outputs (`--out DIR`, default results/compare-bits):
  bits_runs.csv   one row per (problem, method, seed): `RUN_COLUMNS`
  bits.csv        one row per (problem, method): `COLUMNS` (ratio to fp32: mean over seeds with a
                  95 % t-interval; nan unless every seed reached the threshold)
  bits.png        bits to threshold relative to fp32 per method (log scale), one panel per problem
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

DEFAULT_OUT = "results/compare-bits"
FACTOR = 1.25              # threshold = FACTOR x fp32's minimum smoothed training loss (mean over seeds)

# method -> (codec section, exchange section)
METHODS = {
    "fp32": ({"name": "fp32"}, {}),
    "fp16": ({"name": "fp16"}, {}),
    "bf16": ({"name": "bf16"}, {}),
    "terngrad": ({"name": "terngrad", "sharing": "mean"}, {}),
    "terngrad-max": ({"name": "terngrad", "sharing": "max"}, {}),
    "qsgd": ({"name": "qsgd", "levels": 3, "bucket": 512}, {}),
    "scaled_sign+ef": ({"name": "scaled_sign", "error_feedback": True}, {}),
    "topk+ef": ({"name": "topk", "density": 0.01, "error_feedback": True}, {}),
    "randomk": ({"name": "randomk", "density": 0.1}, {}),
    "suresh": ({"name": "suresh"}, {}),
    "pqasgd": ({"name": "terngrad", "sharing": "mean"}, {"local": "pqasgd", "every": 4}),
}

RUN_COLUMNS = ["problem", "method", "seed", "lr", "cap", "steps", "window", "threshold", "status", "K", "bits_up",
               "bits_down", "bits_total", "ratio", "bits_up_per_step", "bits_up_per_element", "loss_smoothed",
               "accuracy", "seconds"]
COLUMNS = ["problem", "method", "lr", "seeds", "reached", "threshold", "K_mean", "bits_total_mean", "ratio_mean",
           "ratio_lo", "ratio_hi", "bits_up_per_element", "accuracy_mean"]


@dataclasses.dataclass(frozen=True)
class Problem:
    name: str
    data: str
    model: str
    steps: int
    lr: float = 0.1
    workers: int = 8
    batch: int = 64            # total
    momentum: float = 0.9


PROBLEMS = {"logistic": Problem("logistic", "digits", "softmax", 600),
            "convnet": Problem("convnet", "mnist1d", "convnet1d", 800)}


def config(problem: Problem, method: str, seed: int, steps: int):
    from tgsim.train.config import from_dict

    codec, exchange = METHODS[method]
    return from_dict({
        "run": {"name": f"bits-{problem.name}-{method}", "seed": seed, "steps": steps, "log_every": 10**9},
        "data": {"name": problem.data, "sharding": "iid"},
        "model": {"name": problem.model},
        "workers": {"n": problem.workers, "batch": problem.batch, "batch_mode": "total"},
        "codec": dict(codec),
        "exchange": {"mode": "ps", **exchange},
        "optimizer": {"name": "momentum", "momentum": problem.momentum, "weight_decay": 0.0},
        "schedule": {"name": "constant", "lr": problem.lr},
    })


def train(cfg, window: int, threshold: float | None) -> dict:
    """Train per cfg; stop where the trailing `window`-step mean of the training loss first reaches
    `threshold` (None: run every step). Returns K (nan: not reached), status, the bits one worker sent
    and received up to the stopping step, the minimum smoothed loss, the test accuracy there."""
    from tgsim.errors import NonFiniteGradientError
    from tgsim.train.loop import build, start_residual, step_function

    t0 = time.perf_counter()
    setup = build(cfg)
    params = setup.model.init(cfg.run.seed)
    opt = setup.optimizer.init(params)
    residual = start_residual(setup, {})
    step_fn = step_function(setup)
    n_params = sum(int(np.prod(s)) for s in setup.model.layer_shapes().values())
    losses = np.full(cfg.run.steps, np.nan)
    up = down = 0.0
    K, status, smin, t = float("nan"), f"not reached in {cfg.run.steps}", float("inf"), -1
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(cfg.run.steps):
            try:
                params, opt, info = step_fn(setup, params, opt, t, False, residual=residual)
            except (NonFiniteGradientError, FloatingPointError, ValueError) as e:
                status = f"diverged ({type(e).__name__})"
                break
            up += 8 * info.sent
            down += 8 * info.received
            losses[t] = info.loss
            if not math.isfinite(info.loss):
                status = "diverged"
                break
            if t + 1 >= window:
                s = float(losses[t + 1 - window:t + 1].mean())
                smin = min(smin, s)
                if threshold is not None and s <= threshold:
                    K, status = t + 1, "reached"
                    break
    steps = t + 1
    acc = float(setup.model.evaluate(params, setup.dataset.x_test, setup.dataset.y_test)[1]) \
        if not status.startswith("diverged") else float("nan")
    return dict(K=K, status=status, steps=steps, bits_up=up, bits_down=down, bits_total=up + down,
                bits_up_per_step=up / max(steps, 1), bits_up_per_element=up / max(steps, 1) / n_params,
                loss_smoothed=smin, accuracy=acc, seconds=time.perf_counter() - t0)


def _job(args) -> dict:
    """One run (in a worker process with jobs > 1): args = (problem, method, seed, window, threshold, cap)."""
    from tgsim.analysis.common import single_thread

    problem, method, seed, window, threshold, cap = args
    with single_thread():
        r = train(config(problem, method, seed, cap), window, threshold)
    return dict(problem=problem.name, method=method, seed=seed, lr=problem.lr, cap=cap, window=window,
                threshold=threshold if threshold is not None else float("nan"), **r)


def t_interval(x) -> tuple[float, float, float]:
    """(mean, lower, upper) with a 95 % Student-t interval (papers_figures/_common.t_half_width's logic)."""
    from scipy import stats

    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return (float("nan"),) * 3
    m = float(x.mean())
    h = float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else float("nan")
    return m, m - h, m + h


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (prob, method), g in runs.groupby(["problem", "method"], sort=False):
        every = bool(g.K.notna().all())
        m, lo, hi = t_interval(g.ratio) if every else (float("nan"),) * 3
        rows.append(dict(problem=prob, method=method, lr=float(g.lr.iloc[0]), seeds=len(g),
                         reached=int(g.K.notna().sum()), threshold=float(g.threshold.iloc[0]),
                         K_mean=float(g.K.mean()) if every else float("nan"),
                         bits_total_mean=float(g.bits_total.mean()) if every else float("nan"),
                         ratio_mean=m, ratio_lo=lo, ratio_hi=hi,
                         bits_up_per_element=float(g.bits_up_per_element.mean()),
                         accuracy_mean=float(g.accuracy.mean())))
    return pd.DataFrame(rows, columns=COLUMNS)


def _figure(runs: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    probs = list(dict.fromkeys(runs.problem))
    fig, axes = plt.subplots(1, len(probs), figsize=(5.5 * len(probs), 4.2), squeeze=False)
    for ax, prob in zip(axes[0], probs):
        d = runs[(runs.problem == prob) & runs.ratio.notna()]
        order = [m for m in dict.fromkeys(runs[runs.problem == prob].method)]
        if len(d):
            sns.barplot(data=d, x="method", y="ratio", order=order, errorbar=("ci", 95), ax=ax)
            sns.stripplot(data=d, x="method", y="ratio", order=order, color="k", size=3, ax=ax)
        ax.axhline(1.0, color="k", ls=":")
        ax.set(yscale="log", xlabel="", ylabel="bits (up + down) to threshold / fp32's",
               title=f"{prob}: loss <= {FACTOR} x fp32's min")
        ax.tick_params(axis="x", rotation=60)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def run(out=DEFAULT_OUT, *, problems=tuple(PROBLEMS.values()), methods=tuple(METHODS), seeds=(0, 1, 2),
        window: int = 50, cap_factor: float = 2.0, jobs: int = 1, quiet: bool = False) -> dict[str, pd.DataFrame]:
    """Phase 1: fp32 per (problem, seed) for the threshold; phase 2: every (problem, method, seed) to
    the threshold. Writes the CSVs and the figure to `out` (None: nothing written)."""
    from tqdm import tqdm

    from tgsim.analysis.compare_speedup import _map

    methods = tuple(methods)
    if "fp32" not in methods:
        methods = ("fp32", *methods)        # every ratio is relative to fp32's bits
    problems = tuple(problems)
    win = {p.name: max(1, min(window, p.steps // 5)) for p in problems}
    t0 = time.perf_counter()
    first = [(p, "fp32", s, win[p.name], None, p.steps) for p in problems for s in seeds]
    with tqdm(total=len(first) + len(problems) * len(methods) * len(seeds), desc="compare bits", unit="run",
              disable=quiet or None) as bar:
        phase1 = _map(_job, first, jobs, bar)
        thr = {p.name: FACTOR * float(np.mean([r["loss_smoothed"] for r in phase1 if r["problem"] == p.name]))
               for p in problems}
        rest = [(p, m, s, win[p.name], thr[p.name], int(cap_factor * p.steps)) for p in problems for m in methods for s in seeds]
        rows = _map(_job, rest, jobs, bar)
    runs = pd.DataFrame(rows)
    ref = runs[runs.method == "fp32"].set_index(["problem", "seed"]).bits_total
    fp = runs.apply(lambda r: ref.get((r.problem, r.seed), float("nan")), axis=1)
    runs["ratio"] = np.where(runs.K.notna() & np.isfinite(fp), runs.bits_total / fp, np.nan)
    runs = runs[RUN_COLUMNS]
    table = summarize(runs)
    res = {"bits_runs": runs, "bits": table}
    seconds = time.perf_counter() - t0
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for name, df in res.items():
            df.to_csv(out / f"{name}.csv", index=False)
        _figure(runs, out / "bits.png")
    if not quiet:
        _print_summary(res, problems, seeds, seconds, out, jobs, cap_factor)
    return res


def _print_summary(res: dict, problems, seeds, seconds: float, out, jobs: int, cap_factor: float) -> None:
    table = res["bits"]
    for p in problems:
        t = table[table.problem == p.name]
        print(f"\n{p.name} ({p.data} / {p.model}, {p.workers} workers, batch {p.batch}, momentum {p.momentum}, "
              f"lr {p.lr}, fp32 {p.steps} steps, cap {int(cap_factor * p.steps)}, seeds {list(seeds)}): threshold {t.threshold.iloc[0]:.4f} "
              f"(smoothed training loss, {FACTOR} x fp32's minimum)")
        print(t[["method", "reached", "seeds", "K_mean", "bits_total_mean", "ratio_mean", "ratio_lo", "ratio_hi",
                 "bits_up_per_element", "accuracy_mean"]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if out is not None:
        print(f"\nwrote {out}/bits_runs.csv, bits.csv, bits.png ({seconds:.0f} s, {jobs} process"
              f"{'es' if jobs > 1 else ''})")
