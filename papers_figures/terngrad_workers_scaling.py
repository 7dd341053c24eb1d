# %% [markdown]
# # TernGrad against fp32 as the workers grow at a fixed total batch (TernGrad Table 1's shape)
#
# The paper's Table 1 trains with N workers at a fixed total batch (each worker takes batch / N)
# and reports TernGrad within about 0.5 points of fp32. At workstation scale: MNIST-1D convnet
# (23,882 parameters), total batch 256, N in {2, 4, 8, 16, 32, 64} (128 down to 4 samples a
# worker), 1000 steps (64 epochs), step decay x0.1 at 750; momentum 0.9 at lr 0.1 (fp32's best at
# 8 x 8) and plain SGD at lr 0.5 (at lr 1.0, the same effective step as the momentum runs, fp32
# itself diverged in 7 of 18 runs and ended below 0.5 in 4 more); fp32 against TernGrad (c = 2.5,
# explicit clipping, parameter server) with the scaler shared as the MAX (the paper), the MEAN, or
# not at all (each worker's own). 3 seeds (0, 1, 2): 144 runs.
#
# Writes out/terngrad_workers_scaling.csv (one row per run: accuracy, bits up per worker, the
# run's largest shared/median scaler ratio and whether units died, from its metrics.csv),
# _summary.csv (mean, 95 % t interval over seeds, gap to fp32 at the same N and optimizer) and a PNG.
#
# `python papers_figures/terngrad_workers_scaling.py`; `--quick`: the same code path at 10 steps,
# one seed and N = 2, 8, 64, a smoke run (its accuracies mean nothing), writing to out/quick/. TGSIM_JOBS sets
# the worker processes (default: the number of cores).

# %%
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import collapse_signs, command_line, print_written, sharing_summary, train_many, write_csv  # noqa: E402

QUICK, OUT = command_line("TernGrad's sharing modes against the number of workers at a fixed total batch.")
SEEDS = (0,) if QUICK else (0, 1, 2)
WORKERS = (2, 8, 64) if QUICK else (2, 4, 8, 16, 32, 64)
TOTAL_BATCH = 256
STEPS = 10 if QUICK else 1000
OPTIMIZERS = {"momentum 0.9, lr 0.1": ({"name": "momentum", "momentum": 0.9}, 0.1),
              "plain SGD, lr 0.5": ({"name": "sgd"}, 0.5)}
VARIANTS = {
    "fp32": {"codec": {"name": "fp32"}},
    "terngrad, max": {"codec": {"name": "terngrad", "clip": "explicit", "sharing": "max"}},
    "terngrad, mean": {"codec": {"name": "terngrad", "clip": "explicit", "sharing": "mean"}},
    "terngrad, none": {"codec": {"name": "terngrad", "clip": "explicit", "sharing": "none"},
                       "exchange": {"share_scalers": False}},
}
BASE = {
    "run": {"name": "scaling", "steps": STEPS, "eval_every": 0, "log_every": max(1, STEPS // 40)},
    "data": {"name": "mnist1d"},
    "model": {"name": "convnet1d"},
    "workers": {"n": 8, "batch": TOTAL_BATCH, "batch_mode": "total"},
    "codec": {"name": "fp32"},      # a variant's codec keys go over it (terngrad: c = 2.5, its default)
    "exchange": {"mode": "ps", "share_scalers": True},
    "schedule": {"name": "step", "every": int(STEPS * 0.75), "gamma": 0.1},
}


def job(variant, n, opt, seed):
    optimizer, lr = OPTIMIZERS[opt]
    sections = {k: dict(v) for k, v in VARIANTS[variant].items()}
    tag = variant.split()[-1]
    sections.update(run={"seed": seed, "name": f"scaling-{tag}-n{n}-{optimizer['name']}-s{seed}"},
                    workers={"n": n}, optimizer=dict(optimizer), schedule={"lr": lr})
    return BASE, sections


grid = [(v, n, o, s) for n in WORKERS for o in OPTIMIZERS for v in VARIANTS for s in SEEDS]
results = train_many([job(*g) for g in grid], "workers scaling")
df = pd.DataFrame([{"variant": v, "workers": n, "batch_per_worker": TOTAL_BATCH // n, "optimizer": o, "seed": s,
                    "steps": STEPS, "test_accuracy": r["test_accuracy"], "test_loss": r["test_loss"],
                    "bits_up_per_worker": r["bits_up"], "diverged": r["diverged"], **collapse_signs(r["out"])}
                   for (v, n, o, s), r in zip(grid, results)])
write_csv(df, OUT / "terngrad_workers_scaling.csv", QUICK)

# %% summary: mean and 95 % t interval over seeds; the gap to fp32 at the same N and optimizer
summary = sharing_summary(df, ["optimizer", "workers", "variant"])
write_csv(summary, OUT / "terngrad_workers_scaling_summary.csv", QUICK)
with pd.option_context("display.width", 160, "display.max_rows", 200):
    print(summary.round(3).to_string(index=False))

# %% figure: accuracy against workers, one panel per optimizer
from _theme import save_figure  # noqa: E402
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter  # noqa: E402
import seaborn as sns  # noqa: E402

g = sns.relplot(data=df, x="workers", y="test_accuracy", hue="variant", style="variant", col="optimizer", kind="line",
                markers=True, dashes=False, errorbar=("ci", 95), height=3.6, aspect=1.3)
g.set(xscale="log")
for ax in g.axes.flat:    # one label per N: the log axis's minor labels (2x10^0, 3x10^0, ...) printed over them
    ax.xaxis.set_major_locator(FixedLocator(list(WORKERS)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())
g.set_axis_labels(f"workers N (total batch {TOTAL_BATCH})", "test accuracy (fraction)")
g.set_titles("{col_name}")
g.figure.suptitle(f"MNIST-1D, {STEPS} steps, {len(SEEDS)} seed(s) (mean, 95 % CI)", y=1.03)
png = save_figure(g.figure, OUT / "terngrad_workers_scaling.png", QUICK, dpi=120)
print_written([OUT / "terngrad_workers_scaling.csv", OUT / "terngrad_workers_scaling_summary.csv", *png])
