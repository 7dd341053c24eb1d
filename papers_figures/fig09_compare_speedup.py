# %% [markdown]
# # Fig. 9 (tgsim): speedup in workers and iterations against the compression ratio
#
# Jiang & Agrawal (NeurIPS 2018) and QSGD claim that quantized SGD keeps the linear speedup of
# synchronous SGD in the number of workers M (iterations to a target ∝ 1/M); TernGrad's Theorem 1
# gives no rate. docs/THEORY.md §4.7 measured fp32's slope -1.00 and TernGrad's -0.93 (MAX scaler).
#
# Here: `tgsim compare speedup` (tgsim.analysis.compare_speedup; --quick's parameters from
# analysis/compare_cli.py under `--quick`), its speedup.csv and speedup_fit.csv: K_ε, the first
# iteration with ||w - w*||/||w*|| <= ε on least squares, against M (geometric mean over seeds and
# its interval), and against the compression ratio at a fixed M; rows of the paper's rule (fp32's
# learning rate for every method) when the CSVs have a `rule` column. Run times: docs/MEASUREMENTS.md.

# %%
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, compare_outputs, paper_rule  # noqa: E402
from _theme import claim, label_points, log_ticks, plt, save, sns, theme  # noqa: E402
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter  # noqa: E402

QUICK, OUT = command_line("Speedup in workers and against compression: tgsim compare speedup, plotted.")
out = compare_outputs("speedup", QUICK)
df = paper_rule(pd.read_csv(out / "speedup.csv")).copy()
fit = paper_rule(pd.read_csv(out / "speedup_fit.csv")).set_index("method")
theme()    # the compare run may have set its own

# %% figure: (a) K against M with the linear-speedup line, (b) K against compression at fixed M
fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.3))
w = df[df.sweep == "workers"]
methods = list(dict.fromkeys(df.method))
pal = dict(zip(methods, sns.color_palette("colorblind", len(methods))))
sns.lineplot(data=w, x="workers", y="K_gmean", hue="method", style="method", markers=True, dashes=False, ax=axes[0],
             palette=pal)
for m, d in w.groupby("method"):
    axes[0].fill_between(d.workers, d.K_lo, d.K_hi, alpha=0.12, color=pal[m], label="_nolegend_")
fp = w[w.method == "fp32"].sort_values("workers")
axes[0].plot(fp.workers, fp.K_gmean.iloc[0] / fp.workers, ":", color="black", label="linear speedup (fp32 K / M)")
axes[0].set(xscale="log", yscale="log", xlabel="workers M", ylabel="iterations K_ε to ||w-w*|| <= ε||w*||",
            title="(a) iterations against workers (95 % interval)")
h, lab = axes[0].get_legend_handles_labels()
axes[0].legend(h, [f"{x} ({fit.loc[x].linear_slope:.2f} to M = {fit.loc[x].M_linear:g})" if x in fit.index else x
                   for x in lab], fontsize=8, title="method (slope of log K on log M)")
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

# %% claims, from the data
def slope(m):
    r = fit.loc[m]
    return (f"{r.linear_slope:.2f} [{r.linear_slope_lo:.2f}, {r.linear_slope_hi:.2f}] up to M = {r.M_linear:g} "
            f"(all M: {r.slope:.2f})")


def linear(m):   # the slope -1 inside the 95 % interval of the fit over M <= M_linear
    r = fit.loc[m]
    return bool(r.linear_slope_lo <= -1 <= r.linear_slope_hi)


others = [m for m in fit.index if m not in ("fp32", "terngrad")]
claims = [
    claim("fp32 has linear speedup in M (slope -1 up to M_linear)", "synchronous SGD: K ∝ 1/M (slope -1)", slope("fp32"),
          linear("fp32")),
    claim("TernGrad keeps the linear speedup", "Jiang & Agrawal: quantized SGD, K ∝ 1/M; TernGrad: no rate",
          slope("terngrad") + f"; M = 1: K x{w[(w.method == 'terngrad') & (w.workers == 1)].K_gmean.iloc[0] / fp.K_gmean.iloc[0]:.1f} fp32's",
          linear("terngrad")),
    claim("the other codecs keep it", "QSGD, Stich et al. (error feedback): K ∝ 1/M",
          "; ".join(f"{m}: {slope(m)}" for m in others) or "none run",
          all(linear(m) for m in others) if others else None),
]
save(fig, "fig09_compare_speedup", pd.concat([df.assign(table="speedup"), fit.reset_index().assign(table="fit")]),
     QUICK, claims)
