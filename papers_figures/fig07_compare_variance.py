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
# compare variance holds the same vector on every worker, where averaging hides the MAX-sharing
# penalty and a biased code's error is the same at every N by construction; the bottom panel gives
# every worker its own gradient (v̄ + heavy-tailed noise, exact errors of independent codes) and the
# verdicts on averaging come from it (slopes of log error on log N, 95 % t-intervals over seeds).
# `--quick`: 2 kinds, 2^14 elements, R = 10. Run times: docs/MEASUREMENTS.md.

# %%
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import coding_of, command_line, compare_outputs  # noqa: E402
from _theme import claim, save, seeds_note, sns, theme  # noqa: E402

from tgsim.analysis.common import terngrad_error  # noqa: E402
from tgsim.analysis.compare_variance import reach_terngrad  # noqa: E402
from tgsim.analysis.verdicts import interval_verdict, slope_fit  # noqa: E402

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

# %% different gradients per worker: v_w = v̄ + 2 t_3 noise (heavy-tailed, independent per worker), the
# exact error of the mean of N independent TernGrad codes (variance plus squared bias, from
# terngrad_error) with each worker's own scaler, the MAX and the MEAN of the workers' scalers shared,
# and the deterministic error of top-k 1 % (no error feedback); relative to ||mean_w v_w||².
HET_N, HET_SEEDS, HET_WORKERS = (2 ** 12, (0, 1), (1, 2, 4, 8, 16, 32)) if QUICK else \
    (2 ** 14, (0, 1, 2), (1, 2, 4, 8, 16, 32))


def mean_error(v: np.ndarray, sharing: str) -> float:
    """E||(1/N) Σ_w Q(v_w) - v̄||² for independent TernGrad codes of the rows of v (no clipping): the
    squared mean bias plus Σ_w Var_w / N², with the scaler per worker (own), or shared as the MAX or
    the MEAN of the workers' max |v_w|."""
    own = np.abs(v).max(axis=1)
    s = {"own": own, "max": np.full_like(own, own.max()), "mean": np.full_like(own, own.mean())}[sharing]
    e = terngrad_error(v, "none", scaler=s)                                 # E||Q(v_w) - v_w||² per worker
    bias = np.sign(v) * np.minimum(np.abs(v), s[:, None]) - v               # E Q(v_w) - v_w
    var = e - (bias ** 2).sum(axis=1)
    return float((bias.mean(axis=0) ** 2).sum() + var.sum() / len(v) ** 2)


def topk_error(v: np.ndarray, density: float = 0.01) -> float:
    k = max(1, int(density * v.shape[1]))
    out = np.zeros_like(v)
    idx = np.argpartition(-np.abs(v), k - 1, axis=1)[:, :k]
    np.put_along_axis(out, idx, np.take_along_axis(v, idx, axis=1), axis=1)
    return float(((out.mean(axis=0) - v.mean(axis=0)) ** 2).sum())


het = []
for seed in HET_SEEDS:
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(HET_N)
    for n in HET_WORKERS:
        v = base + 2.0 * rng.standard_t(3, size=(n, HET_N))
        ref = float((v.mean(axis=0) ** 2).sum())
        for name, err in (("terngrad, own scaler", mean_error(v, "own")), ("terngrad, MAX shared", mean_error(v, "max")),
                          ("terngrad, MEAN shared", mean_error(v, "mean")), ("top-k 1 %, no EF", topk_error(v))):
            het.append({"seed": seed, "workers": n, "codec": name, "mse": err, "rel_mse": err / ref})
het = pd.DataFrame(het)

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
g.figure.suptitle("Relative error of the N-worker mean at equal bits (tgsim compare variance, seed 0: the same vector "
                  "on every worker);\nbottom panel: different gradients per worker, " + seeds_note(HET_SEEDS), y=1.05)
axh = g.figure.add_axes([0.08, -0.32, 0.5, 0.2])
sns.lineplot(data=het, x="workers", y="mse", hue="codec", style="codec", markers=True, dashes=True, ax=axh,
             errorbar=None)     # dashed styles: the own-scaler and MEAN-shared lines nearly coincide
axh.set(xscale="log", yscale="log", xlabel="workers N (each its own gradient)",
        ylabel="E||mean Q - mean v||²\n(squared units)",
        title=f"different gradients per worker (n = {HET_N}; mean over seeds)")
axh.set_xticks(list(HET_WORKERS), [str(n) for n in HET_WORKERS])
axh.minorticks_off()
axh.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.02, 1.0))

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



def het_slope(codec: str) -> dict:
    d = het[het.codec == codec]
    return slope_fit(d.workers, d.mse, d.seed)


own, top = het_slope("terngrad, own scaler"), het_slope("top-k 1 %, no EF")
at = het[het.workers == max(HET_WORKERS)].groupby("codec").mse.mean()
HET = f"different gradients per worker (v̄ + 2 t_3 noise), n = {HET_N}, N = 1..{max(HET_WORKERS)}"
claims = [
    claim("unbiased error falls as 1/N (different gradients per worker)", "paraphrase: TernGrad Sec. 3: the workers' "
          "codes are independent and unbiased, so the mean's error falls as 1/N",
          f"TernGrad (own scaler): slope of log E||mean Q - mean v||² on log N {own['slope']:.2f} "
          f"[{own['lo']:.2f}, {own['hi']:.2f}]; same vector on every worker (compare variance), N = 1 / N = 32: "
          f"x{tg.min():.1f}-x{tg.max():.1f}", interval_verdict(own["lo"], own["hi"], -1.15, -0.85), kind="paper claim",
          setting=HET + "; exact error of independent codes (terngrad_error)",
          test=f"the slope's 95 % t-interval inside (-1.15, -0.85) (margin 0.15 around -1; disjoint: not confirmed, "
               f"overlapping: inconclusive), {len(HET_SEEDS)} seeds",
          scale="synthetic"),
    claim("MAX sharing's penalty with different gradients", "docs/THEORY.md §1.5 (not in the paper: it shares the MAX)",
          f"at N = {max(HET_WORKERS)}: MAX shared / own scaler x{at['terngrad, MAX shared'] / at['terngrad, own scaler']:.2f}, "
          f"MEAN shared / own x{at['terngrad, MEAN shared'] / at['terngrad, own scaler']:.2f} (mean over seeds)",
          None, kind="self-check", setting=HET, scale="synthetic"),
    claim("a biased codec's error does not average out", "paraphrase: Stich et al. (error feedback) need the "
          "residual because a biased compressor's error does not vanish",
          f"top-k 1 % without EF, different gradients per worker: slope {top['slope']:.2f} [{top['lo']:.2f}, "
          f"{top['hi']:.2f}]; same vector on every worker, N = 1 / N = 32: "
          + (f"x{tk.min():.2f}-x{tk.max():.2f}" if len(tk) else "top-k not measured"),
          interval_verdict(top["lo"], top["hi"], low=-0.5), kind="other paper's result", setting=HET,
          test=f"the slope's 95 % t-interval above -0.5 (far from the -1 of averaging), {len(HET_SEEDS)} seeds",
          scale="synthetic"),
    claim("QSGD needs fewer bits than TernGrad for TernGrad's 2-bit variance", "paraphrase: QSGD (Alistarh et al.): "
          "with Elias-coded levels, fewer bits than a 2-bit code for the same variance",
          "; ".join(f"{r.kind}: {r.bits:.2f} bits{q_coding(r.kind, r.budget)}" for r in q.itertuples()) or "not reached",
          bool(len(q) and (q.bits < 2).all()), kind="other paper's result",
          setting="one worker, tgsim compare variance's vectors and bit budgets",
          test="the measured bits at which QSGD first reaches TernGrad's error below 2 in every kind (means over R "
               "draws, seed 0; no interval)", scale="synthetic"),
]
save(g.figure, "fig07_compare_variance", pd.concat([df.assign(drawn=True), exact.assign(drawn=False),
                                                    het.assign(drawn=True, kind="different per worker")],
                                                   ignore_index=True), QUICK, claims)
