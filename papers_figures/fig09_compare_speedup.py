# %% [markdown]
# # Fig. 9 (tgsim): speedup in workers and iterations against the compression ratio
#
# Jiang & Agrawal (NeurIPS 2018) and QSGD claim that quantized SGD keeps the linear speedup of
# synchronous SGD in the number of workers M (iterations to a target ∝ 1/M); TernGrad's Theorem 1
# gives no rate.
#
# Here: `tgsim compare speedup` (tgsim.analysis.compare_speedup; --quick's parameters from
# analysis/compare_cli.py under `--quick`), its speedup.csv and speedup_runs.csv: K_ε, the first
# iteration with ||w - w*||/||w*|| <= ε on least squares (64 dimensions), against M (geometric mean
# over seeds and its interval), and against the compression ratio at a fixed M; rows of the paper's
# rule (fp32's learning rate for every method) when the CSVs have a `rule` column. The verdicts fit
# every method's slope over ONE range of M, the M at which every method reached ε on every seed, and
# compare it with fp32's by an equivalence test (TOST, margin 0.15, α = 0.05;
# tgsim.analysis.verdicts.slopes_common_range). PQASGD is Jiang & Agrawal's own method.

# %%
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, compare_outputs, paper_rule  # noqa: E402
from _theme import claim, label_points, log_ticks, plt, save, seeds_note, sns, theme  # noqa: E402
from tgsim.analysis.verdicts import slopes_common_range  # noqa: E402
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter  # noqa: E402

QUICK, OUT = command_line("Speedup in workers and against compression: tgsim compare speedup, plotted.")
out = compare_outputs("speedup", QUICK)
df = paper_rule(pd.read_csv(out / "speedup.csv")).copy()
fit = paper_rule(pd.read_csv(out / "speedup_fit.csv")).set_index("method")
theme()    # the compare run may have set its own

# %% claims, from the data: every slope over one common range of M (the M every method reached on every
# seed), with intervals, each compared with fp32's by TOST (tgsim.analysis.verdicts.slopes_common_range)
runs = paper_rule(pd.read_csv(out / "speedup_runs.csv"))
runs = runs[runs.sweep == "workers"]
MARGIN = 0.15
sl = slopes_common_range(runs, reference="fp32", margin=MARGIN).set_index("method")
seeds = seeds_note(runs.seed)

# %% figure: (a) K against M with the linear-speedup line, (b) K against compression at fixed M
fig, axes = plt.subplots(1, 2, figsize=(16, 4.6), gridspec_kw={"wspace": 1.0})
w = df[df.sweep == "workers"]
methods = list(dict.fromkeys(df.method))
pal = dict(zip(methods, sns.color_palette("colorblind", len(methods))))
sns.lineplot(data=w, x="workers", y="K_gmean", hue="method", style="method", markers=True, dashes=False, ax=axes[0],
             palette=pal)
for m, d in w.groupby("method"):
    axes[0].fill_between(d.workers, d.K_lo, d.K_hi, alpha=0.12, color=pal[m], label="_nolegend_")
fp = w[w.method == "fp32"].sort_values("workers")
axes[0].plot(fp.workers, fp.K_gmean.iloc[0] / fp.workers, ":", color="black", label="linear speedup (fp32 K / M)")
axes[0].axvspan(sl.M_lo.iloc[0], sl.M_hi.iloc[0], color="0.92", zorder=0, label="common range of the fitted slopes")
axes[0].set(xscale="log", yscale="log", xlabel="workers M", ylabel="iterations K_ε to ||w-w*|| <= ε||w*||",
            title=f"(a) iterations against workers (95 % interval; {seeds})")
h, lab = axes[0].get_legend_handles_labels()


def _slope_label(x: str) -> str:
    """A legend entry: the method with its slope and interval, or why it has none."""
    if x not in sl.index:
        return x
    if not np.isfinite(sl.loc[x].slope):
        return f"{x} (no slope: missed the target at M = {runs.workers.min():g})"
    return f"{x} ({sl.loc[x].slope:.2f} [{sl.loc[x].lo:.2f}, {sl.loc[x].hi:.2f}])"


axes[0].legend(h, [_slope_label(x) for x in lab], fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
               title=f"method (slope of log K on log M,\n95 % t-interval, M = {sl.M_lo.iloc[0]:g}..{sl.M_hi.iloc[0]:g})")
ms = sorted(w.workers.unique())
axes[0].xaxis.set_major_locator(FixedLocator(ms))
axes[0].xaxis.set_minor_locator(NullLocator())
axes[0].xaxis.set_major_formatter(ScalarFormatter())
c = df[df.sweep == "compression"]
M = int(c.workers.iloc[0]) if len(c) else 0
ref = w[w.workers == M][["method", "K_gmean", "compression"]]
c = pd.concat([c, ref[ref.method.isin(["fp32", "terngrad"])]], ignore_index=True)
sns.scatterplot(data=c, x="compression", y="K_gmean", hue="method", style="method", s=70, ax=axes[1],
                palette={**pal, **{m: "gray" for m in c.method if m not in pal}})
axes[1].set(xscale="log", yscale="log", xlabel="compression ratio (32 / bits up per element)",
            ylabel="iterations K_ε (geometric mean over seeds)", title=f"(b) against compression at M = {M}")
log_ticks(axes[1], "x", c.compression)    # labelled ticks that cover the points, wherever they sit
log_ticks(axes[1], "y", c.K_gmean)
axes[1].legend(fontsize=8, title="method (knob value beside)")
fig.tight_layout()
lab = c[c.knob_value.notna()]
label_points(axes[1], lab.compression.to_numpy(), lab.K_gmean.to_numpy(),
             [f"{r.knob} {r.knob_value:g}" for r in lab.itertuples()])

RANGE = f"least squares (dim 64), M = {sl.M_lo.iloc[0]:g}..{sl.M_hi.iloc[0]:g}, fp32's tuned learning rate for every method"


def slope(m):
    r = sl.loc[m]
    return f"{r.slope:.2f} [{r.lo:.2f}, {r.hi:.2f}]"


def vs_fp32(m):
    r = sl.loc[m]
    if not np.isfinite(r.slope):
        return f"{m}: {r.test}"
    return f"{m}: {slope(m)}, minus fp32's {r['diff']:+.2f} [{r.diff_lo:+.2f}, {r.diff_hi:+.2f}]"


pq = [m for m in sl.index if "pqasgd" in m]
others = [m for m in sl.index if m not in ("fp32", "terngrad", *pq)]
claims = [
    claim("fp32 has linear speedup in M", "paraphrase: synchronous SGD's iterations to a target fall as 1/M "
          "(slope -1 of log K on log M)", f"fp32: {slope('fp32')}; slope + 1 {sl.loc['fp32', 'diff']:+.2f} "
          f"[{sl.loc['fp32', 'diff_lo']:+.2f}, {sl.loc['fp32', 'diff_hi']:+.2f}]", sl.loc["fp32", "verdict"],
          kind="other paper's result", setting=RANGE, test=sl.loc["fp32", "test"], scale="lsq"),
    claim("TernGrad keeps the linear speedup", '"We show that $O(1/\\sqrt{MK})$ convergence rate can be achieved if '
          'the sparsification and quantization hyperparameters are configured properly." (Jiang & Agrawal, '
          'abstract); TernGrad\'s Theorem 1 gives no rate', vs_fp32("terngrad"), sl.loc["terngrad", "verdict"],
          kind="paper claim", setting="Jiang & Agrawal: non-convex L-smooth objectives, quantized gradients; here " + RANGE,
          test=sl.loc["terngrad", "test"], scale="lsq"),
] + [
    claim("PQASGD keeps the linear speedup", '"We also propose a strategy called periodic quantized averaging '
          '(PQASGD) that further reduces the communication cost while preserving the $O(1/\\sqrt{MK})$ convergence '
          'rate." (Jiang & Agrawal, abstract)', vs_fp32(m), sl.loc[m, "verdict"], kind="paper claim",
          setting="Jiang & Agrawal's Algorithm 1 (their own method); here TernGrad every 4 steps, " + RANGE,
          test=sl.loc[m, "test"], scale="lsq") for m in pq
] + [
    claim(f"{m} keeps the linear speedup", "paraphrase: QSGD (Alistarh et al.), error-feedback SGD (Stich et al.) "
          "and the other codecs' papers: the compressed method keeps SGD's rate in M", vs_fp32(m),
          sl.loc[m, "verdict"], kind="other paper's result", setting=RANGE, test=sl.loc[m, "test"], scale="lsq")
    for m in others
]
save(fig, "fig09_compare_speedup", pd.concat([df.assign(table="speedup"), fit.reset_index().assign(table="fit"),
                                              sl.reset_index().assign(table="common-range slopes")]),
     QUICK, claims)
