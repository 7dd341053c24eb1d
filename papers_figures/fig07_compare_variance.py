# %% [markdown]
# # Fig. 7 (tgsim): variance at equal bits -- every codec's error against its measured bits per element
#
# The reviewers asked how TernGrad's variance compares with other codecs at the same communication.
# TernGrad's paper reports only its own 2-bit variance bound; QSGD (Alistarh et al.) claims its
# stochastic levels trade bits for variance smoothly (Lemma 3.1), and that with enough levels
# (Elias-coded) it needs fewer bits than a 2-bit ternary code for the same variance.
#
# Here: `tgsim compare variance` (tgsim.analysis.compare_variance; --quick's parameters from
# analysis/compare_cli.py under `--quick`), its variance.csv: the relative MSE ||avg - v̄||² / ||v̄||²
# of the N-worker mean against the REAL payload's bits per element, every codec at budgets 1-16
# bits, N = 1, 8, 32, on synthetic vectors and the MNIST-1D convnet's gradients. The run is shared
# with fig05 and fig10 (out/compare-variance; TGSIM_FIGURES_RERUN=1 runs it again).
# `--quick`: 2 kinds, 2^14 elements, R = 10. Run times: docs/MEASUREMENTS.md.

# %%
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import coding_of, command_line, compare_outputs  # noqa: E402
from _theme import claim, save, sns, theme  # noqa: E402

from tgsim.analysis.compare_variance import reach_terngrad  # noqa: E402

QUICK, OUT = command_line("Variance at equal bits: tgsim compare variance, plotted.")
raw = pd.read_csv(compare_outputs("variance", QUICK) / "variance.csv")
theme()    # the compare run may have set its own
# An error below FLOOR is zero up to float rounding (fp32 sends the vector itself: 0 or ~1e-15 by the
# order of the sum): never a point on the log axis, but named on every panel where it occurs.
FLOOR = 1e-12
ok_rows = raw[raw.status == "ok"].drop_duplicates(["kind", "codec", "workers", "knob"])
df = ok_rows[ok_rows.rel_mse >= FLOOR]
exact = ok_rows[ok_rows.rel_mse < FLOOR]
TOP = "terngrad"      # drawn last, on top of every other codec, with a marker of its own

# %% figure: rows = workers N, columns = vector kind
others = [c for c in dict.fromkeys(df.codec) if c != TOP]
colors = sns.color_palette("tab10") + sns.color_palette("Dark2")
pal = dict(zip(others, colors))
marks = dict(zip(others, ["o", "s", "^", "v", "D", "P", "X", "<", ">", "p", "h", "d", "H", "8"] * 2))
g = sns.relplot(data=df[df.codec != TOP], x="bits_per_element", y="rel_mse", hue="codec", style="codec", row="workers",
                col="kind", kind="line", markers=marks, dashes=False, height=2.9, aspect=1.3, facet_kws={"sharey": False},
                errorbar=None, palette=pal, alpha=0.85)
g.set(xscale="log", yscale="log")
top = None
for (n, kind), ax in g.axes_dict.items():
    d = df[(df.codec == TOP) & (df.workers == n) & (df.kind == kind)].sort_values("bits_per_element")
    if len(d):
        top, = ax.plot(d.bits_per_element, d.rel_mse, "-*", color="black", ms=13, mew=0.6, mec="white", lw=2,
                       zorder=10, label=TOP)
    below = exact[(exact.workers == n) & (exact.kind == kind)]
    if len(below):
        names = ", ".join(f"{c} ({b:.3g} bits)" for c, b in below.groupby("codec", sort=False).bits_per_element.min().items())
        ax.text(0.02, 0.02, f"error < {FLOOR:.0e} (rounding): {names}", transform=ax.transAxes, fontsize=7.5,
                va="bottom", ha="left", bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="0.6", alpha=0.9), zorder=11)
    ax.set_title(f"{kind} vectors, N = {n} worker{'' if n == 1 else 's'}", fontsize=9)
if top is not None:
    legend = {TOP: top, **{t.get_text(): h for t, h in zip(g._legend.texts, g._legend.legend_handles)
                            if t.get_text() != "codec"}}
    g._legend.remove()
    g.add_legend(legend_data=legend, title="codec (TernGrad: black stars, on top)")
g.set_axis_labels("bits per element (measured payload)", "MSE / ||v̄||² (dimensionless)")
g.figure.subplots_adjust(hspace=0.35, wspace=0.25)
g.figure.suptitle("Relative error of the N-worker mean at equal bits (tgsim compare variance)", y=1.03)

# %% claims, from the data
ok = raw[raw.status == "ok"]


def ratio_1_to_32(codec):
    p = ok[(ok.codec == codec) & (ok.kind != "mnist1d")].pivot_table(index=["kind", "budget"], columns="workers", values="rel_mse")
    return (p[1] / p[32]).dropna() if {1, 32} <= set(p.columns) else pd.Series(dtype=float)


tg, tk = ratio_1_to_32("terngrad"), ratio_1_to_32("topk")
reach = reach_terngrad(raw, N=1)
q = reach[reach.codec == "qsgd"]
# the wire coding of QSGD's row at the budget that reaches TernGrad's error (codec_options of the CSV)
q_rows = ok[(ok.codec == "qsgd") & (ok.workers == 1)].set_index(["kind", "budget"])


def q_coding(kind, budget):
    cell = q_rows.codec_options.get((kind, budget)) if "codec_options" in q_rows else None
    return f", {coding_of(cell)} coding" if coding_of(cell) else ""


claims = [
    claim("unbiased encodings average out: error ∝ 1/N", "TernGrad Sec. 3 (independent workers' codes)",  # vectors every worker holds

          f"TernGrad error, same vector on every worker, N = 1 / N = 32: x{tg.min():.1f}-x{tg.max():.1f} (1/N predicts x32)",
          bool(len(tg) and tg.between(32 / 1.5, 32 * 1.5).all())),
    claim("a biased codec's error does not average out", "(reviewers' question; Stich et al. need error feedback)",
          f"top-k error N = 1 / N = 32: x{tk.min():.2f}-x{tk.max():.2f}" if len(tk) else "top-k not measured",
          bool(len(tk) and (tk < 4).all()) if len(tk) else None),
    claim("QSGD needs fewer bits than TernGrad for TernGrad's 2-bit variance", "QSGD: Elias-coded levels beat 2 bits",
          "; ".join(f"{r.kind}: {r.bits:.2f} bits{q_coding(r.kind, r.budget)}" for r in q.itertuples()) or "not reached",
          bool(len(q) and (q.bits < 2).all())),
]
save(g.figure, "fig07_compare_variance", pd.concat([df.assign(drawn=True), exact.assign(drawn=False)],
                                                   ignore_index=True), QUICK, claims)
