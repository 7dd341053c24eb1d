# %% [markdown]
# # Fig. 3 (tgsim): accuracy against workers at a fixed total batch, per scaler-sharing mode
#
# TernGrad's Fig. 3 / Table 1: with N workers at a fixed total batch, TernGrad stays within about
# 0.5 points of fp32's accuracy (its Table 1: CIFAR-10, up to 8 workers) with the scaler shared as
# the MAX over workers. docs/THEORY.md §1.5 measures where MAX sharing collapses.
#
# Here: the sweep of papers_figures/terngrad_workers_scaling.py (MNIST-1D convnet, total batch 256,
# N = 2..64, momentum 0.9 and plain SGD, fp32 against TernGrad with the scaler shared as the MAX,
# the MEAN or not at all, 3 seeds, 144 runs). It is not rerun here in full: the
# full form reads its CSV (out/terngrad_workers_scaling.csv) when present and runs the script only
# when it is missing; `--quick` runs the script's own --quick form (10 steps, 1 seed: a smoke run
# whose accuracies mean nothing). Panels (a), (c): accuracy with momentum and with plain SGD;
# (b), (d): the runs' largest shared/median scaler ratio. Row (e)-(h): one run's collapse
# diagnostics against its accuracy, step by step: the demo recipe (tgsim/configs/demo.toml: 8
# workers, total batch 64, momentum 0.9, lr 0.1, 4000 steps) with the scaler shared as the MAX (it
# collapses) and as the MEAN, from each run's metrics.csv: test accuracy, the largest shared/median
# scaler ratio over layers, the largest noise-to-signal over layers, and the largest fraction of
# dead units (elements with a zero gradient on every worker); quick: 200 steps. Run times:
# docs/MEASUREMENTS.md.

# %%
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import NullLocator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import command_line, t_half_width, train_many  # noqa: E402
from _theme import claim, log_ticks, plt, save, sns  # noqa: E402

QUICK, OUT = command_line("Accuracy against workers at a fixed total batch, per sharing mode (from the sweep's CSV).")
csv = OUT / "terngrad_workers_scaling.csv"
if QUICK or not csv.exists():
    subprocess.run([sys.executable, str(HERE / "terngrad_workers_scaling.py"), *(["--quick"] if QUICK else [])],
                   check=True, env={**os.environ, "TGSIM_FIGURES_OUT": str(OUT.parent if QUICK else OUT)})
df = pd.read_csv(csv)

# %% one run's collapse diagnostics: the demo recipe with MAX and with MEAN sharing
demo = tomllib.loads((HERE.parent / "tgsim" / "configs" / "demo.toml").read_text())
STEPS_C = 200 if QUICK else demo["run"]["steps"]
SHARING = ("max", "mean")
runs = train_many([(demo, {"run": {"name": f"collapse-{m}", "steps": STEPS_C, "eval_every": max(1, STEPS_C // 20),
                                   "log_every": max(1, STEPS_C // 40), "checkpoint_every": 0},
                           "codec": {"sharing": m}, "schedule": {"every": int(STEPS_C * 0.75)}}) for m in SHARING],
                  "collapse runs")
diag = []
for m, r in zip(SHARING, runs):
    met = pd.read_csv(Path(r["out"]) / "metrics.csv")
    acc = met[(met.split != "train") & (met.layer == "model")][["step", "accuracy"]]
    lay = met[(met.split == "train") & (met.layer != "model")].groupby("step")[
        ["scaler_ratio", "noise_to_signal", "zero_grad_fraction"]].max()
    d = lay.reset_index().merge(acc, on="step", how="outer").sort_values("step")
    diag.append(d.assign(variant=f"terngrad, {m}"))
diag = pd.concat(diag, ignore_index=True)

# %% figure: (a) accuracy, (b) MAX scaler ratio, one row per optimizer; (c) one run's diagnostics
fig = plt.figure(figsize=(13, 11.5))
grid = fig.add_gridspec(3, 4, height_ratios=[1, 1, 0.85], hspace=0.5, wspace=0.7, top=0.94, bottom=0.11)
axes = np.empty((2, 2), dtype=object)
for i in range(2):
    axes[i, 0] = fig.add_subplot(grid[i, 0:2], sharex=axes[0, 0] if i else None)
    axes[i, 1] = fig.add_subplot(grid[i, 2:4], sharex=axes[0, 0])
axc = [fig.add_subplot(grid[2, k]) for k in range(4)]
workers = sorted(df.workers.unique())
variants = list(dict.fromkeys(df.variant))
pal = dict(zip(variants, sns.color_palette("colorblind", len(variants))))
marks = dict(zip(variants, ["o", "X", "s", "P", "D"]))
for i, (opt, d) in enumerate(df.groupby("optimizer", sort=False)):
    sns.lineplot(data=d, x="workers", y="test_accuracy", hue="variant", style="variant", markers=marks, dashes=False,
                 errorbar=("ci", 95), ax=axes[i, 0], legend=i == 0, palette=pal)
    axes[i, 0].set(ylabel="test accuracy (fraction)", title=f"({'ac'[i]}) {opt}: accuracy, mean and 95 % CI over seeds")
    r = d[d.variant.str.contains("max|mean")]
    sns.lineplot(data=r, x="workers", y="ratio_max", hue="variant", style="variant", markers=marks, dashes=False,
                 errorbar=None, ax=axes[i, 1], legend=False, palette=pal)
    axes[i, 1].set(yscale="log", ylabel="largest shared / median scaler (ratio)", title=f"({'bd'[i]}) {opt}: shared scaler")
for ax in axes.flat:
    ax.set(xscale="log", xlabel=f"workers N (total batch {int((df.workers * df.batch_per_worker).iloc[0])})")
    ax.set_xticks(workers, [str(n) for n in workers])
    ax.xaxis.set_minor_locator(NullLocator())
for i, (opt, d) in enumerate(df.groupby("optimizer", sort=False)):   # labelled ticks that cover the ratios
    log_ticks(axes[i, 1], "y", d[d.variant.str.contains("max|mean")].ratio_max)
h, lab = axes[0, 0].get_legend_handles_labels()
axes[0, 0].get_legend().remove()
fig.legend(h, lab, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=len(lab), title="variant (scaler sharing)")
for ax, letter, (col, label) in zip(axc, "efgh", [("accuracy", "test accuracy (fraction)"),
                                                  ("scaler_ratio", "shared / median scaler\n(largest layer)"),
                                                  ("noise_to_signal", "noise-to-signal\n(largest layer)"),
                                                  ("zero_grad_fraction", "dead units\n(largest layer, fraction)")]):
    ax.set_title(f"({letter})", loc="left", fontsize=10)
    d = diag.dropna(subset=[col])
    sns.lineplot(data=d, x="step", y=col, hue="variant", palette=pal, ax=ax, legend=False, lw=1.3)
    ax.set(xlabel="training step (iterations)", ylabel=label)
    if col in ("scaler_ratio", "noise_to_signal"):
        ax.set_yscale("log")
        log_ticks(ax, "y", d[col])
pos = axc[0].get_position()
fig.text(pos.x0, pos.y1 + 0.035, f"Row (e)-(h), one run each: the demo recipe ({STEPS_C} steps), MAX (orange) vs MEAN "
         "(green) sharing", ha="left", va="bottom", fontsize=10)
steps, seeds = int(df.steps.iloc[0]), df.seed.nunique()
fig.suptitle(f"MNIST-1D convnet, {steps} steps, {seeds} seed(s){' (quick: a smoke run)' if QUICK else ''}", y=0.985)

# %% claims, from the data
s = (df.groupby(["optimizer", "workers", "variant"], sort=False)
     .agg(acc=("test_accuracy", "mean"), ci=("test_accuracy", t_half_width)).reset_index())
fp = s[s.variant == "fp32"].set_index(["optimizer", "workers"]).acc
s["gap"] = s.acc.to_numpy() - fp.loc[list(zip(s.optimizer, s.workers))].to_numpy()
claims = []
for v in [x for x in df.variant.unique() if x != "fp32"]:
    g = s[s.variant == v]
    worst = g.loc[g.gap.idxmin()]
    claims.append(claim(f"{v}: within 1 point of fp32 at every N", "Table 1: TernGrad within ~0.5 points of fp32",
                        f"gaps {100 * g.gap.min():+.1f} to {100 * g.gap.max():+.1f} points (worst at N = "
                        f"{worst.workers}, {worst.optimizer})", bool((g.gap > -0.01).all())))
mx = df[df.variant.str.contains("max")].groupby("workers").ratio_max.median()
claims.append(claim("MAX sharing's scaler grows with N", "(not in the paper)",
                    f"median largest shared/median ratio x{mx.iloc[0]:.3g} at N = {mx.index[0]}, x{mx.iloc[-1]:.3g} "
                    f"at N = {mx.index[-1]}", None))
last = diag.dropna(subset=["accuracy"]).groupby("variant").last()
dead = diag.groupby("variant").zero_grad_fraction.max()
ratio = diag.groupby("variant").scaler_ratio.max()
claims.append(claim("one run: MAX sharing's collapse in its diagnostics (demo recipe)", "(not in the paper)",
                    "; ".join(f"{v}: final accuracy {last.accuracy[v]:.3f}, largest scaler ratio x{ratio[v]:.3g}, "
                              f"dead units up to {dead[v]:.2f}" for v in last.index), None))
save(fig, "fig03_workers_scaling", pd.concat([df.assign(panel="sweep"), diag.assign(panel="one run")],
                                             ignore_index=True), QUICK, claims)
