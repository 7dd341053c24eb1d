"""`tgsim compare bits`: total uplink + downlink bits until the training loss first reaches a
threshold, the test accuracy then, and the test accuracy at one common step, per method.

Problems (`PROBLEMS`): logistic regression (multinomial: data "digits", model "softmax", 10 classes,
640 weights) and the MNIST-1D convnet of the demo (data "mnist1d", model "convnet1d", 23,882
parameters). Both: 8 workers, total batch 64 (8 per worker), momentum 0.9, constant learning rate.
Real models (`REAL_PROBLEMS`, not run unless named): "resnet", the GroupNorm ResNet of
tgsim.torch.examples (width 8, one block per stage: 5,122 parameters) on digits, momentum 0.9, its
own grid `SGD_REAL_GRID` (0.0125 to 0.8 by factors of 2), 300 steps; "transformer", the causal character transformer (d_model 64, 2 layers: 82,665 parameters) on
"pychars", Adam with its own grid `ADAM_GRID` (0.00075 to 0.012 by factors of 2: Adam's useful rates
lie far below SGD's), 400 steps, its validation rows a plain seeded draw
(`data.options.validation_stratify = false`: some next-byte classes occur once, which a stratified
split refuses); both 4 workers, total batch 64.
`at_workers(problem, N)` is the problem at N workers, named NAME-nN (`--workers`).
Methods (`methods`): labels of registered codecs (tgsim.analysis.common.split_label: NAME[key=value],
"+ef", "+pqasgd"); by default every registered codec, plugins included, at its default options,
with error feedback where its Options ask for it (common.default_methods); the baseline (the
float32 codec, common.baseline) is always run.

Learning rates: two rules, side by side (column "rule"), both tuned on a validation split (20 % of
the training rows held out, stratified: `data.options.validation`; a problem with stratify False: a
plain seeded draw, `data.options.validation_stratify = false`; the test set is not seen), from
the grid `LR_GRID` (0.025, 0.05, 0.1, 0.2), one tuning seed (`TUNE_SEED` = 100, not one of the
reported seeds), `steps` steps each, score = the validation loss at the end (a diverged run scores
+inf):
  fp32-lr  the paper's rule: fp32's best rate, kept for every method;
  own-lr   each method's own best rate on the same grid.
Every run of the grid is a row of bits_lr_grid.csv with the rates each rule chose. A method whose
own rate equals fp32's has the same runs under both rules (training is deterministic given the
seed); they are run once.

Threshold. The training loss of a step is the mean over the workers' batches; it is smoothed by a
trailing rolling mean over `window` steps (50; --quick: steps // 5). Phase 1 trains fp32 for `steps`
steps per seed; threshold = 1.25 x the mean over seeds of the minimum of fp32's smoothed curve.
Phase 2 trains every method under each rule (fp32 again: deterministic, so fp32's ratio is exactly 1) until its
smoothed loss first reaches the threshold or the cap, `cap_factor` (2) x `steps` ("not reached in
S"; "diverged" for a non-finite gradient or loss): fp32 reaches it near the end of its own run, so a
method about as fast needs room past `steps`. At the stopping step: K (1-based step of the hit), the bits one
worker sent (uplink) and received (downlink) summed over steps 1..K, from the wire bytes the
exchange counts for the codec's real payloads (`StepInfo.sent` / `received`), and the test accuracy
of the model then (the accuracy at the threshold; at the last step where not reached). Exchange mode
"ps" (push the codes, pull the server's downlink); the exchange itself counts the float32 wire (fp32)
as a ring all-reduce, 2 (N-1)/N x 32 = 56 bits per element each way at N = 8 (`bits_total` of its rows).

Matched accounting (`matched_bits`, `ACCOUNTING`): every ratio compares methods on one exchange, a
parameter server. fp32's bits there are derived, not measured (its per-step bits are constant): stopping
step x elements x (32 up + 32 down), `bits_ps`; every other method's `bits_ps` is its measured
`bits_total` (its codes up, the server's downlink: a float32 mean for a codec whose messages do not sum,
e.g. fp16's 16 up + 32 down). `ratio` = bits_ps / fp32's bits_ps, same problem and seed. A caller that
names the dense float codecs (`dense=`, e.g. the report's fp16 and bf16 at 16 bits) charges them b up +
b down, a server that sends the mean back in their own format. `ring_ratio`: bits_total / fp32's
bits_total as the exchange counts them (fp32 on the ring), kept apart, never beside a verdict.

Common step. The stopping steps differ between methods, so every phase-2 run also measures the test
loss and accuracy at one step common to all methods of a problem: fp32's step budget `steps`
(`Problem.steps`; columns `common_step`, `test_loss_common`, `accuracy_common`). A run that reaches
the threshold before it keeps training to it for this measurement only: K, the bits, the smoothed
loss and `accuracy` stay those of step K. `common_status`: "ok" (measured at step `steps`),
"diverged" (before it: nan), "capped" (a cap below `steps`: the state at the last step).

Outputs (`--out DIR`, default results/compare-bits):
  bits_lr_grid.csv  one row per (problem, method, lr) of the tuning grid: `GRID_COLUMNS`
  bits_runs.csv     one row per (problem, rule, method, seed): `RUN_COLUMNS`
  bits.csv          one row per (problem, rule, method): `COLUMNS` (ratio to fp32 at fp32's rate, both
                    on a parameter server (`matched_bits`): mean over seeds with a 95 % t-interval;
                    bits_ps_mean: the mean matched bits; nan unless every seed reached the threshold;
                    accuracy_common_mean / _lo / _hi: the accuracy at the common step, mean with a 95 %
                    t-interval, nan unless every seed was measured there; common_measured: how many were)
  bits.png          bits to threshold relative to fp32 per method (log scale), one panel per problem,
                    one bar per rule
Each CSV has a column `quick`: True when written by --quick (a smoke test, numbers not for reporting);
the figure's title and the printed summary then say QUICK. `tgsim compare time` refuses such rows
unless asked with --allow-quick (`QUICK_COLUMN`). Each CSV's `codec_options`, after `method`: every
option of the method's codec, defaults filled in (tgsim.analysis.common.codec_options), e.g. QSGD's
coding.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from tgsim.analysis.common import with_codec_options

DEFAULT_OUT = "results/compare-bits"
FACTOR = 1.25              # threshold = FACTOR x fp32's minimum smoothed training loss (mean over seeds)
LR_GRID = (0.025, 0.05, 0.1, 0.2)     # learning rates tried on the validation split
VALIDATION = 0.2           # fraction of the training rows held out for tuning
TUNE_SEED = 100            # the tuning runs' seed (not one of the reported seeds)
RULES = ("fp32-lr", "own-lr")



def default_methods() -> tuple[str, ...]:
    """Every registered codec, plugins included (tgsim.analysis.common.default_methods)."""
    from tgsim.analysis.common import default_methods as methods

    return methods()


def method_sections(method: str) -> tuple[dict, dict]:
    """(codec section, exchange section) of a method label: a registered codec with its options,
    "+ef", "+pqasgd" (tgsim.analysis.common.split_label)."""
    from tgsim.analysis.common import method_sections as sections

    return sections(method)


RUN_COLUMNS = ["problem", "rule", "method", "codec_options", "seed", "lr", "cap", "steps", "window", "threshold",
               "status", "K", "elements", "bits_up", "bits_down", "bits_total", "bits_ps", "ratio", "ring_ratio",
               "bits_up_per_step", "bits_up_per_element",
               "loss_smoothed", "accuracy", "common_step", "common_status", "test_loss_common", "accuracy_common",
               "seconds", "quick"]
COLUMNS = ["problem", "rule", "method", "codec_options", "lr", "seeds", "reached", "threshold", "K_mean",
           "bits_total_mean", "bits_ps_mean", "ratio_mean", "ratio_lo", "ratio_hi", "bits_up_per_element", "accuracy_mean",
           "common_step", "common_measured", "accuracy_common_mean", "accuracy_common_lo", "accuracy_common_hi", "quick"]
QUICK_COLUMN = "quick"     # True in every row of a --quick run (1 seed, a few steps): a smoke test, not a result

GRID_COLUMNS = ["problem", "method", "codec_options", "lr", "seed", "steps", "status", "val_loss", "val_accuracy",
                "chosen_fp32_lr", "chosen_own_lr", "seconds"]


@dataclasses.dataclass(frozen=True)
class Problem:
    """One training problem. model_options / data_options: (key, value) pairs of the [model] / [data]
    options (a torch model: ("factory", "package.module:function"), ("kwargs", ((key, value), ...)));
    optimizer: "momentum" (with `momentum`) or "adam" (its defaults); lr_grid: this problem's own
    grid of rates, used instead of the run's when not empty; stratify False: the validation split is
    drawn without stratification (`validation_stratify = false`; next-byte data has classes seen once)."""
    name: str
    data: str
    model: str
    steps: int
    lr: float = 0.1            # the rate when no grid is given (`run(lr_grid=())`)
    workers: int = 8
    batch: int = 64            # total
    momentum: float = 0.9
    optimizer: str = "momentum"
    model_options: tuple = ()
    data_options: tuple = ()
    lr_grid: tuple = ()
    stratify: bool = True      # False: the validation rows are a plain seeded draw (validation_stratify)


def _options(pairs) -> dict:
    """A nested (key, value) tuple of Problem.model_options / data_options as a dict."""
    return {k: _options(v) if isinstance(v, tuple) and v and all(isinstance(x, tuple) and len(x) == 2 for x in v)
            else v for k, v in pairs}


def torch_problem(name: str, data: str, factory: str, steps: int, kwargs: dict, **kw) -> Problem:
    """A Problem on a torch.nn.Module (model "torch", options factory + kwargs); the factory is named
    as a string, so nothing here imports torch."""
    return Problem(name, data, "torch", steps,
                   model_options=(("factory", factory), ("kwargs", tuple(sorted(kwargs.items())))), **kw)


PROBLEMS = {"logistic": Problem("logistic", "digits", "softmax", 600),
            "convnet": Problem("convnet", "mnist1d", "convnet1d", 800)}
# The real-model problems (not in the default list; `--problems resnet,transformer`):
#   resnet       the GroupNorm ResNet of tgsim.torch.examples, width 8, 1 block per stage (5,122
#                parameters), on scikit-learn's digits; momentum 0.9, its own grid SGD_REAL_GRID (LR_GRID
#                with one rate below it and two above: each method's best rate inside the grid)
#   transformer  the causal character transformer (d_model 64, 4 heads, 2 layers, 82,665 parameters)
#                on "pychars" (20,000 windows of 32 bytes); Adam, whose rates live about 30x below
#                SGD's: its own grid ADAM_GRID
# both 4 workers (`--workers` replaces it), total batch 64, 300 / 400 steps.
ADAM_GRID = (0.00075, 0.0015, 0.003, 0.006, 0.012)
SGD_REAL_GRID = (0.0125, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8)
REAL_PROBLEMS = {
    "resnet": torch_problem("resnet", "digits", "tgsim.torch.examples:resnet", 300, {"width": 8, "blocks": 1},
                            workers=4, lr=0.05, lr_grid=SGD_REAL_GRID),
    "transformer": torch_problem("transformer", "pychars", "tgsim.torch.examples:char_transformer", 400,
                                 {"d_model": 64, "heads": 4, "layers": 2}, workers=4, lr=0.003, optimizer="adam",
                                 data_options=(("num_samples", 20000), ("context", 32)), lr_grid=ADAM_GRID,
                                 stratify=False)}
ALL_PROBLEMS = {**PROBLEMS, **REAL_PROBLEMS}


def at_workers(problem: Problem, workers: int) -> Problem:
    """The problem at `workers` workers (same total batch), named NAME-nN."""
    if int(workers) < 1 or problem.batch % int(workers):
        raise ValueError(f"compare bits: {workers} workers must be >= 1 and divide the total batch {problem.batch} "
                         f"of {problem.name!r}")
    return dataclasses.replace(problem, name=f"{problem.name}-n{int(workers)}", workers=int(workers))


def grid_of(problem: Problem, lr_grid) -> tuple[float, ...]:
    """The rates tried for `problem`: its own grid when it has one and the run tunes at all (lr_grid
    not empty), else lr_grid."""
    return tuple(float(x) for x in problem.lr_grid) if problem.lr_grid and lr_grid else tuple(lr_grid)


def config(problem: Problem, method: str, seed: int, steps: int, lr: float | None = None, validation: float = 0.0):
    """The run config; lr None: the problem's; validation > 0: that fraction of the training rows is
    held out and `evaluate` sees it instead of the test set."""
    from tgsim.train.config import from_dict

    codec, exchange = method_sections(method)
    held = {"validation": validation, **({} if problem.stratify else {"validation_stratify": False})}
    data_options = {**_options(problem.data_options), **(held if validation > 0 else {})}
    optimizer = {"name": "momentum", "momentum": problem.momentum, "weight_decay": 0.0} \
        if problem.optimizer == "momentum" else {"name": problem.optimizer}
    return from_dict({
        "run": {"name": f"bits-{problem.name}-{method}", "seed": seed, "steps": steps, "log_every": 10**9},
        "data": {"name": problem.data, "sharding": "iid", **({"options": data_options} if data_options else {})},
        "model": {"name": problem.model, **({"options": _options(problem.model_options)}
                                            if problem.model_options else {})},
        "workers": {"n": problem.workers, "batch": problem.batch, "batch_mode": "total"},
        "codec": dict(codec),
        "exchange": {"mode": "ps", **exchange},
        "optimizer": optimizer,
        "schedule": {"name": "constant", "lr": problem.lr if lr is None else lr},
    })


def train(cfg, window: int, threshold: float | None, common: int | None = None, setup=None) -> dict:
    """Train per cfg; stop where the trailing `window`-step mean of the training loss first reaches
    `threshold` (None: run every step). Returns K (nan: not reached), status, `steps` (the stopping
    step: K, else the last step run), the bits one worker sent and received over steps 1..steps, the
    minimum smoothed loss up to then, the test accuracy there.

    common: a step at which the test loss and accuracy are also measured (`test_loss_common`,
    `accuracy_common`, `common_step`, `common_status`); a run that reaches the threshold before it
    keeps training to it for this measurement only (K, bits, the smoothed loss and `accuracy` stay those
    of step K). common_status: "ok" (measured at step `common`), "diverged" (before step `common`:
    nan), "capped" (cfg.run.steps < common: the state at the last step, common_step that step), "none"
    (common None: nan)."""
    from tgsim.analysis.common import fresh_run
    from tgsim.errors import NonFiniteGradientError

    if common is not None and int(common) < 1:
        raise ValueError(f"compare bits: the common step must be >= 1, got {common!r}")
    t0 = time.perf_counter()
    setup, params, opt, state, step_fn = fresh_run(cfg, setup)
    n_params = sum(int(np.prod(s)) for s in setup.model.layer_shapes().values())
    losses = np.full(cfg.run.steps, np.nan)
    up = down = 0.0
    K, status, smin, t = float("nan"), f"not reached in {cfg.run.steps}", float("inf"), -1
    nan2 = (float("nan"), float("nan"))
    at_stop = at_common = None          # (test loss, accuracy) at step K, at step `common`
    diverged = False

    def evaluate():
        with np.errstate(over="ignore", invalid="ignore"):
            return tuple(float(v) for v in setup.model.evaluate(params, setup.dataset.x_test, setup.dataset.y_test))

    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(cfg.run.steps):
            try:
                params, opt, info = step_fn(setup, params, opt, t, False, codec_state=state)
            except (NonFiniteGradientError, FloatingPointError, ValueError) as e:
                diverged, why = True, f"diverged ({type(e).__name__})"
                break
            if at_stop is None:
                up += 8 * info.sent
                down += 8 * info.received
            losses[t] = info.loss
            if not math.isfinite(info.loss):
                diverged, why = True, "diverged"
                break
            if at_stop is None and t + 1 >= window:
                s = float(losses[t + 1 - window:t + 1].mean())
                smin = min(smin, s)
                if threshold is not None and s <= threshold:
                    K, status, at_stop = t + 1, "reached", evaluate()
            if common is not None and t + 1 == common:
                at_common = at_stop if K == t + 1 else evaluate()
            if at_stop is not None and (common is None or t + 1 >= common):
                break
    last = t + 1
    if diverged and at_stop is None:
        status = why
    steps = int(K) if at_stop is not None else last
    if at_stop is None:
        at_stop = nan2 if diverged else evaluate()
    if common is None:
        common_status, common_step, at_common = "none", float("nan"), nan2
    elif at_common is not None:
        common_status, common_step = "ok", int(common)
    elif diverged:
        common_status, common_step, at_common = "diverged", float("nan"), nan2
    else:                               # the cap came first: the state at the last step
        common_status, common_step, at_common = "capped", last, (at_stop if steps == last else evaluate())
    return dict(K=K, status=status, steps=steps, elements=n_params, eval_loss=at_stop[0], accuracy=at_stop[1], bits_up=up,
                bits_down=down, bits_total=up + down, bits_up_per_step=up / max(steps, 1),
                bits_up_per_element=up / max(steps, 1) / n_params, loss_smoothed=smin,
                common_step=common_step, common_status=common_status, test_loss_common=at_common[0],
                accuracy_common=at_common[1], seconds=time.perf_counter() - t0)


def _job(args) -> dict:
    """One run (in a worker process with jobs > 1):
    args = (problem, method, seed, window, threshold, cap, lr, validation, common)."""
    from tgsim.analysis.common import single_thread

    problem, method, seed, window, threshold, cap, lr, validation, common = args
    with single_thread():
        cfg = config(problem, method, seed, cap, lr, validation)
        r = train(cfg, window, threshold, common)
    return dict(problem=problem.name, method=method, seed=seed, lr=lr, cap=cap, window=window,
                threshold=threshold if threshold is not None else float("nan"), **r)


def choose(grid: pd.DataFrame) -> dict:
    """{(problem, method): the rate of least validation loss} (a diverged run scores +inf; ties and an
    all-diverged column go to the smallest rate)."""
    best = {}
    for (prob, method), g in grid.groupby(["problem", "method"], sort=False):
        score = g.val_loss.where(np.isfinite(g.val_loss), np.inf).to_numpy()
        lrs = g.lr.to_numpy()
        order = np.lexsort((lrs, score))
        best[(prob, method)] = float(lrs[order[0]])
    return best


def tune(problems, methods, lr_grid, jobs: int, bar=None) -> tuple[pd.DataFrame, dict]:
    """The grid: every (problem, method, lr) trained `problem.steps` steps at TUNE_SEED on the
    validation split; returns (bits_lr_grid table, {(problem, method): own best rate})."""
    from tgsim.analysis.compare_speedup import _map

    jobs_ = [(p, m, TUNE_SEED, max(1, min(50, p.steps // 5)), None, p.steps, float(lr), VALIDATION, None)
             for p in problems for m in methods for lr in grid_of(p, lr_grid)]
    rows = _map(_job, jobs_, jobs, bar)
    grid = pd.DataFrame([dict(problem=r["problem"], method=r["method"], lr=r["lr"], seed=r["seed"],
                              steps=r["steps"], status="diverged" if r["status"].startswith("diverged") else "ok",
                              val_loss=r["eval_loss"], val_accuracy=r["accuracy"], seconds=r["seconds"])
                         for r in rows])
    own = choose(grid)
    from tgsim.analysis.common import baseline

    fp = {p.name: own[(p.name, baseline())] for p in problems}
    grid["chosen_fp32_lr"] = [lr == fp[p] for p, lr in zip(grid.problem, grid.lr)]
    grid["chosen_own_lr"] = [lr == own[(p, m)] for p, m, lr in zip(grid.problem, grid.method, grid.lr)]
    return with_codec_options(grid)[GRID_COLUMNS], own


def at_grid_edge(grid: pd.DataFrame) -> pd.DataFrame:
    """The (problem, method, lr) rows of a bits_lr_grid table whose chosen own rate is the smallest or
    the largest rate tried for that problem and method: the best rate may lie outside the grid."""
    rows = []
    for (prob, method), g in grid.groupby(["problem", "method"], sort=False):
        chosen = g[g.chosen_own_lr]
        if len(chosen) and g.lr.nunique() > 1 and float(chosen.lr.iloc[0]) in (g.lr.min(), g.lr.max()):
            rows.append({"problem": prob, "method": method, "lr": float(chosen.lr.iloc[0]),
                         "edge": "lowest" if float(chosen.lr.iloc[0]) == g.lr.min() else "highest"})
    return pd.DataFrame(rows, columns=["problem", "method", "lr", "edge"])


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
    """bits.csv from bits_runs.csv: one row per (problem, rule, method), `COLUMNS`. ratio_* and the
    means of K and bits: nan unless every seed reached the threshold; accuracy_common_*: the mean and
    95 % t-interval over seeds of the accuracy at the common step, nan unless every seed was measured
    there (common_status "ok"; common_measured counts them)."""
    rows = []
    for (prob, rule, method), g in runs.groupby(["problem", "rule", "method"], sort=False):
        every = bool(g.K.notna().all())
        m, lo, hi = t_interval(g.ratio) if every else (float("nan"),) * 3
        ok = g.common_status == "ok"
        cm, clo, chi = t_interval(g.accuracy_common) if ok.all() else (float("nan"),) * 3
        rows.append(dict(problem=prob, rule=rule, method=method, lr=float(g.lr.iloc[0]), seeds=len(g),
                         reached=int(g.K.notna().sum()), threshold=float(g.threshold.iloc[0]),
                         K_mean=float(g.K.mean()) if every else float("nan"),
                         bits_total_mean=float(g.bits_total.mean()) if every else float("nan"),
                         bits_ps_mean=float(g.bits_ps.mean()) if every and "bits_ps" in g else float("nan"),
                         ratio_mean=m, ratio_lo=lo, ratio_hi=hi,
                         bits_up_per_element=float(g.bits_up_per_element.mean()),
                         accuracy_mean=float(g.accuracy.mean()),
                         common_step=float(g.common_step[ok].max()) if ok.any() else float("nan"),
                         common_measured=int(ok.sum()), accuracy_common_mean=cm, accuracy_common_lo=clo,
                         accuracy_common_hi=chi,
                         quick=bool(g[QUICK_COLUMN].astype(bool).any()) if QUICK_COLUMN in g else False))
    return with_codec_options(pd.DataFrame(rows, columns=COLUMNS))


ACCOUNTING = ("parameter server for every method: fp32 32 up + 32 down bits per element per step (derived: "
              "stopping step x elements x 64; not the ring all-reduce the exchange charges it)")
ACCOUNTING_DENSE = ("parameter server for every method: fp32 32 up + 32 down, {dense} 16 up + 16 down bits per "
                    "element per step (derived: stopping step x elements x bits; the exchange itself charges fp32 a "
                    "ring all-reduce and a 16-bit float a 32-bit float downlink), every other codec its measured "
                    "payloads (its codes up, the server's downlink)")


def elements(runs: pd.DataFrame) -> pd.Series:
    """Each run's element count: the `elements` column where written, else bits_up_per_step /
    bits_up_per_element (the two columns of every bits_runs.csv, also those written before `elements`)."""
    derived = runs.bits_up_per_step / runs.bits_up_per_element
    if "elements" in runs:
        return runs.elements.astype(float).where(runs.elements.notna(), derived)
    return derived


def matched_bits(runs: pd.DataFrame, dense: dict | None = None, reference: str | None = None) -> pd.DataFrame:
    """A copy of bits_runs `runs` with every method's bits on one exchange, a parameter server (module
    docstring): `elements`; `bits_ps`, the baseline (`reference`, default fp32: common.baseline) charged
    steps x elements x (32 + 32) and a method of `dense` ({label: b bits}) steps x elements x 2b, where
    `steps` is the stopping step (K when reached); every other method its measured `bits_total`; `ratio`,
    bits_ps / the reference's bits_ps of the same problem and seed (its fp32-lr run; NaN where the
    method did not reach the target or the reference has no run); `ring_ratio`, bits_total / the
    reference's bits_total as the exchange counts them (fp32 on a ring all-reduce). Works on
    bits_runs.csv files written before these columns existed (`elements`)."""
    if reference is None:
        from tgsim.analysis.common import baseline

        reference = baseline()
    per_element = {reference: 32.0, **{k: float(v) for k, v in (dense or {}).items()}}
    out = runs.copy()
    out["elements"] = elements(out)
    b = out.method.map(per_element)
    derived = out.steps.astype(float) * out.elements * 2 * b
    out["bits_ps"] = np.where(b.notna(), derived, out.bits_total.astype(float))
    at = out[(out.method == reference) & (out.rule == (RULES[0] if (out.rule == RULES[0]).any() else out.rule.iloc[0]))]
    ref_ps = at.set_index(["problem", "seed"]).bits_ps
    ref_ring = at.set_index(["problem", "seed"]).bits_total
    key = pd.MultiIndex.from_frame(out[["problem", "seed"]])
    fp, fr = ref_ps.reindex(key).to_numpy(float), ref_ring.reindex(key).to_numpy(float)
    reached = out.K.notna().to_numpy()
    out["ratio"] = np.where(reached & np.isfinite(fp), out.bits_ps / fp, np.nan)
    out["ring_ratio"] = np.where(reached & np.isfinite(fr), out.bits_total / fr, np.nan)
    return out


def ratio_rows(runs: pd.DataFrame, reference: str | None = None, alpha: float = 0.05) -> pd.DataFrame:
    """Per (problem, rule, method) of `matched_bits` runs: tgsim.analysis.verdicts.reached_ratio of the
    per-seed bits_ps against the reference's (fp32; same rule, problem and seed): ratio (the mean per-seed
    ratio), lo, hi (its (1 - 2 alpha) t-interval: the interval the verdicts judge; NaN unless every seed of
    both reached the target), verdict (ratio < 1), missed (the method's seeds that missed the target),
    ref_missed, n."""
    from tgsim.analysis.verdicts import reached_ratio

    if reference is None:
        from tgsim.analysis.common import baseline

        reference = baseline()
    rows = []
    for (prob, rule, method), g in runs.groupby(["problem", "rule", "method"], sort=False):
        ref = runs[(runs.method == reference) & (runs.rule == rule) & (runs.problem == prob)]
        x = g.merge(ref, on=["problem", "seed"], suffixes=("", "_ref"))
        r = reached_ratio(x.bits_ps, x.bits_ps_ref, x.K.notna(), x.K_ref.notna(), alpha=alpha)
        rows.append(dict(problem=prob, rule=rule, method=method, ratio=r["ratio"], lo=r["lo"], hi=r["hi"],
                         verdict=r["verdict"], missed=r["a_missed"], ref_missed=r["b_missed"], n=r["n"]))
    return pd.DataFrame(rows, columns=["problem", "rule", "method", "ratio", "lo", "hi", "verdict", "missed",
                                       "ref_missed", "n"])


def _figure(runs: pd.DataFrame, path: Path, quick: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    probs = list(dict.fromkeys(runs.problem))
    fig, axes = plt.subplots(1, len(probs), figsize=(5.5 * len(probs), 4.2), squeeze=False)
    for ax, prob in zip(axes[0], probs):
        d = runs[runs.problem == prob]
        d = d[d.groupby(["rule", "method"]).ratio.transform(lambda r: r.notna().all())]   # every seed reached
        order = [m for m in dict.fromkeys(runs[runs.problem == prob].method)]
        if len(d):
            hue_order = [r for r in RULES if r in set(runs.rule)]
            sns.barplot(data=d, x="method", y="ratio", order=order, hue="rule", hue_order=hue_order,
                        errorbar=("ci", 95), ax=ax)
            sns.stripplot(data=d, x="method", y="ratio", order=order, hue="rule", hue_order=hue_order, dodge=True,
                          palette=["k"] * len(hue_order), size=3, legend=False, ax=ax)
        ax.axhline(1.0, color="k", ls=":")
        ax.set(yscale="log", xlabel="", ylabel="bits (up + down) to threshold / fp32's\n(parameter server: fp32 32 up + 32 down)",
               title=f"{prob}: loss <= {FACTOR} x fp32's min (no bar: some seed did not reach it)")
        if ax.get_legend() is not None:
            if ax is axes[0, -1]:
                sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1.0), title="learning rate", fontsize=8)
            else:
                ax.get_legend().remove()
        ax.tick_params(axis="x", rotation=60)
    if quick:
        fig.suptitle("QUICK (--quick: a smoke test, numbers not for reporting)", color="tab:red")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def run(out=DEFAULT_OUT, *, problems=tuple(PROBLEMS.values()), methods=None, seeds=(0, 1, 2),
        window: int = 50, cap_factor: float = 2.0, lr_grid=LR_GRID, jobs: int = 1,
        quiet: bool = False, quick: bool = False) -> dict[str, pd.DataFrame]:
    """Phase 0: the learning-rate grid on the validation split (`tune`; lr_grid=(): no tuning, every
    method at `Problem.lr`, rule fp32-lr only); phase 1: fp32 at its rate per (problem, seed) for the
    threshold; phase 2: every (problem, rule, method, seed) to the threshold. Writes the CSVs and the
    figure to `out` (None: nothing written). quick: the --quick form; every CSV row says so (QUICK_COLUMN)."""
    from tqdm import tqdm

    from tgsim.analysis.common import write_tables
    from tgsim.analysis.compare_speedup import _map

    from tgsim.analysis.common import baseline, default_methods

    base = baseline()
    methods = default_methods() if methods is None else tuple(methods)
    if base not in methods:
        methods = (base, *methods)          # every ratio is relative to the baseline's (fp32's) bits
    problems, lr_grid = tuple(problems), tuple(float(x) for x in lr_grid)
    win = {p.name: max(1, min(window, p.steps // 5)) for p in problems}
    t0 = time.perf_counter()
    n_tune = sum(len(grid_of(p, lr_grid)) for p in problems) * len(methods)
    with tqdm(total=n_tune + len(problems) * len(seeds) * (1 + len(methods) * (2 if lr_grid else 1)),
              desc="compare bits", unit="run", disable=quiet or None) as bar:
        if lr_grid:
            grid, own = tune(problems, methods, lr_grid, jobs, bar)
        else:
            grid, own = pd.DataFrame(columns=GRID_COLUMNS), {(p.name, m): p.lr for p in problems for m in methods}
        lr = {(p.name, "fp32-lr", m): own[(p.name, base)] for p in problems for m in methods}
        if lr_grid:
            lr.update({(p.name, "own-lr", m): own[(p.name, m)] for p in problems for m in methods})
        first = [(p, base, s, win[p.name], None, p.steps, own[(p.name, base)], 0.0, None)
                 for p in problems for s in seeds]
        phase1 = _map(_job, first, jobs, bar)
        thr = {p.name: FACTOR * float(np.mean([r["loss_smoothed"] for r in phase1 if r["problem"] == p.name]))
               for p in problems}
        # one run per distinct (problem, method, rate, seed): a rule whose rate equals the other's shares it
        distinct = list(dict.fromkeys((p, m, lr[(p.name, rule, m)]) for p in problems
                                      for rule in (RULES if lr_grid else RULES[:1]) for m in methods))
        bar.total = n_tune + len(first) + len(distinct) * len(seeds)
        rest = [(p, m, s, win[p.name], thr[p.name], int(cap_factor * p.steps), r, 0.0, p.steps)
                for p, m, r in distinct for s in seeds]
        done = {(r["problem"], r["method"], r["lr"], r["seed"]): r for r in _map(_job, rest, jobs, bar)}
    rows = [dict(done[(p.name, m, lr[(p.name, rule, m)], s)], rule=rule) for p in problems
            for rule in (RULES if lr_grid else RULES[:1]) for m in methods for s in seeds]
    runs = pd.DataFrame(rows)
    runs = matched_bits(runs)       # every ratio on one exchange: fp32 on a parameter server too
    runs[QUICK_COLUMN] = bool(quick)
    runs, grid = with_codec_options(runs)[RUN_COLUMNS], grid.assign(**{QUICK_COLUMN: bool(quick)})
    table = summarize(runs)
    res = {"bits_lr_grid": grid, "bits_runs": runs, "bits": table}
    seconds = time.perf_counter() - t0
    out = write_tables(out, res, lambda d: _figure(runs, d / "bits.png", quick))
    if not quiet:
        _print_summary(res, problems, seeds, seconds, out, jobs, cap_factor, lr_grid)
        edge = at_grid_edge(grid) if len(grid) else pd.DataFrame()
        for r in edge.itertuples():
            print(f"warning: {r.problem} {r.method}: the chosen rate {r.lr:g} is the {r.edge} of its grid; "
                  "the best rate may lie outside it")
    return res


def _print_summary(res: dict, problems, seeds, seconds: float, out, jobs: int, cap_factor: float, lr_grid) -> None:
    from tgsim.analysis.common import baseline

    table = res["bits"]
    if table[QUICK_COLUMN].any():
        print("QUICK: --quick run (a smoke test, numbers not for reporting)")
    for p in problems:
        t = table[table.problem == p.name]
        fp_lr = float(t[(t.method == baseline())].lr.iloc[0])
        opt = f"momentum {p.momentum}" if p.optimizer == "momentum" else p.optimizer
        print(f"\n{p.name} ({p.data} / {p.model}, {p.workers} workers, batch {p.batch}, {opt}, "
              f"fp32 {p.steps} steps at lr {fp_lr:g}, cap {int(cap_factor * p.steps)}, seeds {list(seeds)}): "
              f"threshold {t.threshold.iloc[0]:.4f} (smoothed training loss, {FACTOR} x fp32's minimum); "
              + (f"rates from {list(lr_grid)} on a {VALIDATION:g} validation split, seed {TUNE_SEED}"
                 if lr_grid else "no tuning") + f"; accuracy_common at step {p.steps}"
              + (f"; optimizer {p.optimizer}, own grid {list(grid_of(p, lr_grid))}" if p.lr_grid else ""))
        print(t[["rule", "method", "lr", "reached", "seeds", "K_mean", "bits_total_mean", "ratio_mean", "ratio_lo",
                 "ratio_hi", "bits_up_per_element", "accuracy_mean", "accuracy_common_mean"]].to_string(index=False,
                                                                                float_format=lambda v: f"{v:.4g}"))
    print(f"\nratio: bits / fp32's, {ACCOUNTING}; other codecs: their measured parameter-server payloads")
    if out is not None:
        print(f"\nwrote {out}/bits_lr_grid.csv, bits_runs.csv, bits.csv, bits.png ({seconds:.0f} s, {jobs} process"
              f"{'es' if jobs > 1 else ''})")
