# %% [markdown]
# # Fig. 8 (tgsim): bits to a loss target -- total communication per method
#
# TernGrad's claim: 2-bit gradients cut the communication ~16x against fp32 at no loss of accuracy
# (its Tables 1-3 keep fp32's hyper-parameters). The reviewers asked what it costs to reach the
# same loss, counting both directions and the extra steps a noisier gradient needs.
#
# Here: `tgsim compare bits` (tgsim.analysis.compare_bits; --quick's parameters from
# analysis/compare_cli.py under `--quick`), its bits.csv: the uplink + downlink bits until the
# smoothed training loss reaches 1.25 x fp32's minimum, relative to fp32's (ratio), and the test
# accuracy then, on logistic regression and the MNIST-1D convnet. Rows of the paper's rule (every
# method at fp32's tuned learning rate, rule "fp32-lr") when the CSV has a `rule` column.
# `--quick`: 1 seed, 3 methods, 100 / 30 steps. Run times: docs/MEASUREMENTS.md.

# %%
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, compare_outputs, paper_rule, with_coding  # noqa: E402
from _theme import claim, plt, save, sns, theme  # noqa: E402

QUICK, OUT = command_line("Bits to a loss target per method: tgsim compare bits, plotted.")
df = paper_rule(pd.read_csv(compare_outputs("bits", QUICK) / "bits.csv")).copy()
theme()    # the compare run may have set its own
df["err_lo"] = (df.ratio_mean - df.ratio_lo).clip(lower=0)
df["err_hi"] = (df.ratio_hi - df.ratio_mean).clip(lower=0)
# the tick label says which wire coding a codec ran with (QSGD's), from the CSV's codec_options
df["shown"] = [with_coding(m, o) for m, o in zip(df.method, df.get("codec_options", [None] * len(df)))]

# %% figure: (a) total bits relative to fp32, (b) accuracy when the target is reached
fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
order = list(dict.fromkeys(df.shown))
sns.barplot(data=df, x="shown", y="ratio_mean", hue="problem", order=order, ax=axes[0], errorbar=None)
for bars, (_, d) in zip(axes[0].containers, df.groupby("problem", sort=False)):   # 95 % interval over seeds
    d = d.set_index("shown")
    for b in bars:   # a method that missed the target on some seed has no bar (ratio NaN)
        x = b.get_x() + b.get_width() / 2
        r = d.loc[order[int(round(x))]]
        if pd.notna(r.ratio_mean):
            axes[0].errorbar([x], [r.ratio_mean], yerr=[[r.err_lo], [r.err_hi]], fmt="none", color="black", lw=1)
axes[0].set(yscale="log", xlabel="method", ylabel="bits up + down to the loss target / fp32's  (ratio)",
            title="(a) communication to 1.25 x fp32's minimum loss\n(no bar: target missed on some seed)")
axes[0].axhline(1, color="black", lw=0.8)
sns.barplot(data=df, x="shown", y="accuracy_mean", hue="problem", order=order, ax=axes[1], errorbar=None)
axes[1].set(xlabel="method", ylabel="test accuracy (fraction)", ylim=(0, 1),
            title="(b) test accuracy, mean over seeds")
for ax in axes:
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right", rotation_mode="anchor")
axes[1].get_legend().remove()
h, lab = axes[0].get_legend_handles_labels()
axes[0].get_legend().remove()
fig.legend(h, lab, loc="lower center", ncol=len(lab), title="problem")
fig.tight_layout(rect=(0, 0.1, 1, 1))

# %% claims, from the data
t = df[df.method == "terngrad"].set_index("problem")
f = df[df.method == "fp32"].set_index("problem")
claims = [
    claim("TernGrad needs >= 8x fewer bits in total to reach the loss", "~16x fewer bits per step (2 vs 32 bits)",
          "; ".join(f"{p}: x{1 / r.ratio_mean:.1f} fewer bits in total (K {r.K_mean:.0f} vs fp32's "
                    f"{f.loc[p].K_mean:.0f} steps)" for p, r in t.iterrows()), bool((t.ratio_mean < 1 / 8).all())),
    claim("every method reaches fp32's loss target", "(reviewers' question)",
          "; ".join(f"{p}: " + ", ".join(f"{r.method} {r.reached}/{r.seeds}" for r in d.itertuples() if r.reached < r.seeds)
                    for p, d in df.groupby("problem", sort=False) if (d.reached < d.seeds).any()) or "all seeds of all methods",
          bool((df.reached == df.seeds).all())),
    claim("at no loss of accuracy", "Tables 1-3: within ~0.5-1 point of fp32",
          "; ".join(f"{p}: {100 * (r.accuracy_mean - f.loc[p].accuracy_mean):+.1f} points" for p, r in t.iterrows()),
          bool(((t.accuracy_mean - f.loc[t.index].accuracy_mean) > -0.01).all())),
]
save(fig, "fig08_compare_bits", df, QUICK, claims)
