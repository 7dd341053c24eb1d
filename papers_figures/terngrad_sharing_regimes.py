# %% [markdown]
# # When does sharing the MAX scaler collapse? TernGrad on MNIST-1D across batch, lr and momentum
#
# TernGrad (Wen et al. 2017) shares one scaler per layer across workers, the MAX of the workers'
# s_w = max|clip(g_w)| (the paper's §3.3; the public code's `max_scalers`), and reports no accuracy
# loss for AlexNet at per-worker batches of 64-128+. At 8 workers x 8 samples with momentum 0.9 and
# lr 0.1 (fp32's best rate), max-sharing collapses on MNIST-1D: a worker holding a hard sample sets
# the shared scaler at several times the median worker's, every other worker's variance grows with
# it, ReLU units die (docs/THEORY.md §1.5). This script maps the regime:
#
#   per-worker batch b in {8, 32, 128} (8 workers, total 8b), a fixed budget of 64 epochs
#       (4000 / 1000 / 250 steps), step decay x0.1 at 75 %;
#   optimizer: momentum 0.9 at lr in {0.05, 0.1}, and plain SGD at the same effective step
#       lr / (1 - momentum), i.e. lr in {0.5, 1.0};
#   codec: fp32; TernGrad (c = 2.5) with the scaler shared as the MAX (explicit clipping: the paper;
#       implicit: elements beyond s saturate, the public code), the MEAN (every worker clips at the
#       mean of the workers' 2.5 sigma), or not at all (each worker its own scaler, float mean down);
#   3 seeds each (0, 1, 2): 180 runs, parameter server, MNIST-1D convnet (23,882 parameters).
#
# Per run it records the test accuracy and, from the run's metrics.csv (`tgsim analyze
# run-health`), the largest shared/median scaler ratio and whether units died (an ALERT).
# Writes out/terngrad_sharing_regimes.csv (one row per run) and _summary.csv (mean, 95 % t
# interval over seeds, and the gap to fp32 at the same setting), and a PNG.
#
# `python papers_figures/terngrad_sharing_regimes.py` (180 runs); `--quick`: the same code path at 1/100 of the
# steps and one seed, a smoke run (its accuracies mean nothing), writing to out/quick/.
# TGSIM_JOBS sets the worker processes (default: the number of cores).

# %%
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import collapse_signs, command_line, print_written, sharing_summary, train_many, write_csv  # noqa: E402

QUICK, OUT = command_line("TernGrad's scaler-sharing modes against per-worker batch, lr and momentum.")
SEEDS = (0,) if QUICK else (0, 1, 2)
WORKERS = 8
EPOCH_SAMPLES = 4000 * 64          # 64 epochs of MNIST-1D's 4000 training rows
BATCHES = (8, 32, 128)
EFFECTIVE_LRS = (0.5, 1.0)         # lr / (1 - momentum)
MOMENTA = (0.9, 0.0)
VARIANTS = {
    "fp32": {"codec": {"name": "fp32"}},
    "max, explicit clip": {"codec": {"name": "terngrad", "clip": "explicit", "sharing": "max"}},
    "max, implicit clip": {"codec": {"name": "terngrad", "clip": "implicit", "sharing": "max"}},
    "mean, explicit clip": {"codec": {"name": "terngrad", "clip": "explicit", "sharing": "mean"}},
    "none (own scalers)": {"codec": {"name": "terngrad", "clip": "explicit", "sharing": "none"},
                           "exchange": {"share_scalers": False}},
}


def steps_for(batch: int) -> int:
    steps = EPOCH_SAMPLES // (WORKERS * batch)
    return max(4, steps // 100) if QUICK else steps


def job(variant, batch, momentum, eff_lr, seed):
    steps = steps_for(batch)
    lr = eff_lr * (1 - momentum)
    base = {
        "run": {"name": "regimes", "steps": steps, "eval_every": 0, "log_every": max(1, steps // 40)},
        "data": {"name": "mnist1d"},
        "model": {"name": "convnet1d"},
        "workers": {"n": WORKERS, "batch": batch, "batch_mode": "per_worker"},
        "codec": {"name": "fp32"},      # a variant's codec keys go over it (terngrad: c = 2.5, its default)
        "exchange": {"mode": "ps", "share_scalers": True},
        "optimizer": {"name": "momentum" if momentum else "sgd", **({"momentum": momentum} if momentum else {})},
        "schedule": {"name": "step", "lr": lr, "every": max(1, int(steps * 0.75)), "gamma": 0.1},
    }
    sections = {k: dict(v) for k, v in VARIANTS[variant].items()}
    tag = variant.split()[0].strip(",") + ("-impl" if "implicit" in variant else "")
    sections["run"] = {"seed": seed, "name": f"regime-{tag}-b{batch}-m{momentum}-lr{lr:g}-s{seed}"}
    return base, sections


grid = [(v, b, m, e, s) for b in BATCHES for m in MOMENTA for e in EFFECTIVE_LRS for v in VARIANTS for s in SEEDS]
results = train_many([job(*g) for g in grid], "sharing regimes")

# %% collapse signs of every run, from its metrics.csv
rows = []
for (v, b, m, e, s), r in zip(grid, results):
    rows.append({"variant": v, "batch_per_worker": b, "momentum": m, "effective_lr": e, "lr": e * (1 - m),
                 "seed": s, "steps": steps_for(b), "test_accuracy": r["test_accuracy"],
                 "test_loss": r["test_loss"], "bits_up_per_worker": r["bits_up"], "diverged": r["diverged"], **collapse_signs(r["out"])})
df = pd.DataFrame(rows)
write_csv(df, OUT / "terngrad_sharing_regimes.csv", QUICK)


# %% summary: mean and 95 % t interval over seeds; the gap to fp32 at the same setting
summary = sharing_summary(df, ["batch_per_worker", "momentum", "effective_lr", "variant"])
write_csv(summary, OUT / "terngrad_sharing_regimes_summary.csv", QUICK)
with pd.option_context("display.width", 160, "display.max_rows", 200):
    print(summary.round(3).to_string(index=False))

# %% figure: accuracy against per-worker batch, one panel per optimizer x effective lr
from _theme import save_figure  # noqa: E402
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter  # noqa: E402
import seaborn as sns  # noqa: E402

df["setting"] = df.apply(lambda r: f"{'momentum 0.9' if r.momentum else 'plain SGD'}, lr {r.lr:g}", axis=1)
g = sns.relplot(data=df, x="batch_per_worker", y="test_accuracy", hue="variant", style="variant", col="setting",
                col_wrap=2, kind="line", markers=True, dashes=False, errorbar=("ci", 95), height=3.2, aspect=1.4)
g.set(xscale="log")
for ax in g.axes.flat:
    ax.xaxis.set_major_locator(FixedLocator(list(BATCHES)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())
g.set_axis_labels("per-worker batch (8 workers)", "test accuracy (fraction)")
g.figure.suptitle(f"TernGrad scaler sharing on MNIST-1D, 64 epochs, {len(SEEDS)} seed(s) (mean, 95 % CI)", y=1.02)
png = save_figure(g.figure, OUT / "terngrad_sharing_regimes.png", QUICK, dpi=120)
print_written([OUT / "terngrad_sharing_regimes.csv", OUT / "terngrad_sharing_regimes_summary.csv", *png])
