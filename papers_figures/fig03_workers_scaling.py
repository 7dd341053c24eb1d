# %% [markdown]
# # Fig. 3 (tgsim): accuracy against workers at a fixed total batch, per scaler-sharing mode
#
# TernGrad's Fig. 3 / Table 1: with N workers at a fixed total batch, TernGrad stays within about
# 0.5 points of fp32's accuracy (its Table 1: CIFAR-10, up to 8 workers) with the scaler shared as
# the MAX over workers. docs/THEORY.md §1.5 measures where MAX sharing collapses.
#
# Here: the sweep of papers_figures/terngrad_workers_scaling.py (MNIST-1D convnet, total batch 256,
# N = 2..64, momentum 0.9 and plain SGD, fp32 against TernGrad with the scaler shared as the MAX,
# the MEAN or not at all, 3 seeds, 144 runs, 24 min on 2 cores). It is not rerun here in full: the
# full form reads its CSV (out/terngrad_workers_scaling.csv) when present and runs the script only
# when it is missing; `--quick` runs the script's own --quick form (10 steps, 1 seed: ~30 s, a
# smoke run whose accuracies mean nothing). Panel (b): the runs' largest shared/median scaler ratio.

# %%
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
from matplotlib.ticker import LogFormatter, NullLocator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import command_line, t_half_width  # noqa: E402
from _theme import claim, plt, save, sns  # noqa: E402

QUICK, OUT = command_line("Accuracy against workers at a fixed total batch, per sharing mode (from the sweep's CSV).")
csv = OUT / "terngrad_workers_scaling.csv"
if QUICK or not csv.exists():
    subprocess.run([sys.executable, str(HERE / "terngrad_workers_scaling.py"), *(["--quick"] if QUICK else [])],
                   check=True, env={**os.environ, "TGSIM_FIGURES_OUT": str(OUT.parent if QUICK else OUT)})
df = pd.read_csv(csv)

# %% figure: (a) accuracy, (b) MAX scaler ratio, one row per optimizer
fig, axes = plt.subplots(2, 2, figsize=(11.5, 7.5), sharex=True)
workers = sorted(df.workers.unique())
variants = list(dict.fromkeys(df.variant))
pal = dict(zip(variants, sns.color_palette("colorblind", len(variants))))
marks = dict(zip(variants, ["o", "X", "s", "P", "D"]))
for i, (opt, d) in enumerate(df.groupby("optimizer", sort=False)):
    sns.lineplot(data=d, x="workers", y="test_accuracy", hue="variant", style="variant", markers=marks, dashes=False,
                 errorbar=("ci", 95), ax=axes[i, 0], legend=i == 0, palette=pal)
    axes[i, 0].set(ylabel="test accuracy (fraction)", title=f"(a) {opt}: accuracy, mean and 95 % CI over seeds")
    r = d[d.variant.str.contains("max|mean")]
    sns.lineplot(data=r, x="workers", y="ratio_max", hue="variant", style="variant", markers=marks, dashes=False,
                 errorbar=None, ax=axes[i, 1], legend=False, palette=pal)
    axes[i, 1].set(yscale="log", ylabel="largest shared / median scaler (ratio)", title=f"(b) {opt}: shared scaler")
for ax in axes.flat:
    ax.set(xscale="log", xlabel=f"workers N (total batch {int((df.workers * df.batch_per_worker).iloc[0])})")
    ax.set_xticks(workers, [str(n) for n in workers])
    ax.xaxis.set_minor_locator(NullLocator())
for ax in axes[:, 1]:
    ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 1)))
h, lab = axes[0, 0].get_legend_handles_labels()
axes[0, 0].get_legend().remove()
fig.legend(h, lab, loc="lower center", ncol=len(lab), title="variant (scaler sharing)")
steps, seeds = int(df.steps.iloc[0]), df.seed.nunique()
fig.suptitle(f"MNIST-1D convnet, {steps} steps, {seeds} seed(s){' (quick: a smoke run)' if QUICK else ''}")
fig.tight_layout(rect=(0, 0.07, 1, 1))

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
save(fig, "fig03_workers_scaling", df, QUICK, claims)
