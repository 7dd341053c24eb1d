# %% [markdown]
# # Fig. 7 (tgsim): variance at equal bits -- every codec's error against its measured bits per element
#
# Jiang & Agrawal's reviewer 1 asks for the variance "for a given communication budget, in comparison
# to prior art"; here every codec, TernGrad among them, at equal measured bits. TernGrad's paper
# reports only its own 2-bit variance bound; QSGD (Alistarh et al.) claims its stochastic levels
# trade bits for variance smoothly (Lemma 3.1), and that with enough levels (Elias-coded) it needs
# fewer bits than a 2-bit ternary code for the same variance (both paraphrased from QSGD's paper, not
# checked against the seeds: only the TernGrad abstract and the public reviews were at hand).
#
# Here: `tgsim compare variance` (tgsim.analysis.compare_variance; --quick's parameters from
# analysis/compare_cli.py under `--quick`), its variance.csv: the relative MSE ||avg - v̄||² / ||v̄||²
# of the N-worker mean against the REAL payload's bits per element, every codec at budgets 1-16
# bits, N = 1, 8, 32, on synthetic vectors and the MNIST-1D convnet's gradients. The run is shared
# with fig05 and fig10 (out/compare-variance; TGSIM_FIGURES_RERUN=1 runs it again).
# Panels (a)-(e), one per vector kind: every codec at N = 1 worker (the N = 8 and N = 32 rows are in
# the CSV), with TernGrad's points at N = 8 and N = 32 beside its N = 1 point.
# compare variance holds the same synthetic vector on every worker, where averaging hides the
# MAX-sharing penalty and only the codes' random part averages out: by compare variance's exact
# formula the mean of N codes has error ||b||² + σ²/N, b the bias and σ² the variance of one code.
# TernGrad as published clips at 2.5σ before ternarizing (the registry's default, clip=explicit), so
# b is clipping's bias, the same on every worker; its error falls from N = 1 to N = 32 by
# (||b||² + σ²) / (||b||² + σ²/32), x32 only where b = 0: near x30 for Gaussian vectors (few elements
# beyond 2.5σ), a few-fold for Student-t, near x1 for log-normal and sparse vectors, whose clipped
# elements make the bias most of the error. The row "same vector on every worker" prints, per kind,
# the ratio measured and from the exact terms, and the bias's share of the N = 1 error. The last
# panel gives every worker its own gradient (v̄ + heavy-tailed noise, exact errors of independent
# codes, no clipping): panel (f) its absolute error E||mean Q - mean v||², panel (g) the same error relative
# to ||mean v||² (the quantity of panels (a)-(e)). "Unbiased error falls as 1/N" is a self-check of that
# formula on the absolute error (b = 0: slope -1 by construction). "A biased codec's error does not
# average out" is judged on the relative error (_rules.AVERAGING_RULE): with independent noise per
# worker ||mean v||² itself shrinks with N, so top-k's absolute error falls (slope about -0.6) while its
# share of the mean gradient rises; the rule asks whether the relative error's slope on log N stays above
# -0.1 (over N = 1..32, less than 29 % of it removed; an unbiased code's relative error falls with slope
# about -0.34 on these vectors, printed beside it). Slopes of log error on log N, 95 % t-intervals over
# seeds. One colour per codec, as in every figure (_theme.CODEC_COLORS).
# `--quick`: 2 kinds, 2^14 elements, R = 10. Run times: docs/MEASUREMENTS.md.

# %%
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import coding_of, command_line, compare_outputs  # noqa: E402
from _rules import AVERAGING_FLOOR, AVERAGING_RULE, averaging_verdict  # noqa: E402
from _theme import UNCHECKED, claim, codec_color, codec_palette, log_ticks, plt, save, seeds_note, sns, theme  # noqa: E402

from tgsim.analysis.common import terngrad_error  # noqa: E402
from tgsim.analysis.compare_variance import reach_terngrad  # noqa: E402
from tgsim.analysis.verdicts import combine, interval_verdict, slope_fit  # noqa: E402

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

# %% figure: (a)-(e) one panel per vector kind at N = 1, TernGrad also at N = 8 and 32; last panel: different
# gradients per worker
others = [c for c in dict.fromkeys(df.codec) if c != TOP]
pal = codec_palette(others)
marks = dict(zip(others, ["o", "s", "^", "v", "D", "P", "X", "<", ">", "p", "h", "d", "H", "8"] * 2))
KINDS = list(dict.fromkeys(df.kind))
COLS = 3
ROWS = -(-(len(KINDS) + 2) // COLS)
LETTERS = "abcdefghijkl"
_TG = codec_color(TOP)
TG_N = {1: dict(marker="*", ms=14, mfc=_TG, mec="black"), 8: dict(marker="*", ms=11, mfc="#f5cf80", mec="black"),
        32: dict(marker="*", ms=11, mfc="white", mec=_TG)}


def floor_note(kind: str) -> str:
    """The codecs whose error is below FLOOR (those points not drawn on the log axis), for the panel's
    title ("" when none): "name (b bits)" where none of its points is drawn, "name from b bits" where
    its points from b bits on are not (a box inside the panel covered a codec's line)."""
    below = exact[(exact.workers == 1) & (exact.kind == kind)]
    if not len(below):
        return ""
    least = below.groupby("codec", sort=False).bits_per_element.min()
    drawn = set(df[(df.workers == 1) & (df.kind == kind)].codec)     # codecs with a point above FLOOR
    names = ", ".join((f"{c} from {b:.3g} bits" if c in drawn else f"{c} ({b:.3g} bits)").replace(" ", "\u00a0")
                      for c, b in least.items())           # no line break inside one codec's entry
    return "\n" + textwrap.fill(f"points with error < {FLOOR:.0e} not drawn: {names}", 48)


def kind_panel(ax, letter: str, kind: str) -> None:
    """Every codec's relative error against its measured bits at N = 1; TernGrad's points at N = 1, 8, 32."""
    d = df[(df.kind == kind) & (df.workers == 1) & (df.codec != TOP)]
    sns.lineplot(data=d, x="bits_per_element", y="rel_mse", hue="codec", style="codec", markers=marks, dashes=False,
                 palette=pal, errorbar=None, alpha=0.85, ax=ax, legend=False)
    for n, style in TG_N.items():
        t = df[(df.codec == TOP) & (df.kind == kind) & (df.workers == n)].sort_values("bits_per_element")
        ax.plot(t.bits_per_element, t.rel_mse, ls="none", zorder=10, mew=0.8, label=f"TernGrad, N = {n}", **style)
    ax.set(xscale="log", yscale="log", xlabel="bits per element (measured payload)",
           ylabel="MSE / ||v̄||² (dimensionless)", title=f"({letter}) {kind} vectors" + floor_note(kind))
    log_ticks(ax, "x", df.bits_per_element)
    ax.set_yscale("log")


HET_STYLES = {   # own scaler = no sharing; one colour per codec (_theme.CODEC_COLORS)
    "terngrad, MEAN shared": (codec_color("terngrad[sharing=mean]"), "-", "o", 8),
    "terngrad, own scaler": (codec_color("terngrad[sharing=none]"), ":", "*", 9),
    "terngrad, MAX shared": (codec_color("terngrad"), "--", "^", 6),
    "top-k 1 %, no EF": (codec_color("topk"), "-.", "v", 6)}


HET_DODGE = {"terngrad, MEAN shared": 0.9, "terngrad, own scaler": 1.1}


def het_panel(ax, letter: str, value: str = "mse") -> None:
    """E||mean Q - mean v||² against N with different gradients per worker (mean over seeds): absolute
    (`value` "mse") or relative to ||mean v||² ("rel_mse", the quantity the biased codec's row judges)."""
    mean = het.groupby(["codec", "workers"], sort=False)[value].mean()
    for codec, (color, ls, marker, ms) in HET_STYLES.items():
        m = mean[codec]
        # own scaler and MEAN shared nearly coincide: side by side in log N (MEAN left, own scaler right),
        # the own scaler's hollow star drawn over MEAN's dots, so that neither hides the other
        dodge = HET_DODGE.get(codec, 1.0)
        ax.plot(m.index.to_numpy(float) * dodge, m.to_numpy(), color=color, ls=ls, marker=marker, ms=ms, label=codec,
                mfc="white" if codec.endswith("own scaler") else color, mew=1.4,
                zorder=4 if codec.endswith("own scaler") else 3)
    absolute = value == "mse"
    ax.set(xscale="log", yscale="log", xlabel="workers N (each its own gradient)",
           ylabel="E||mean Q - mean v||²  (squared units)" if absolute else
           "E||mean Q - mean v||² / ||mean v||²\n(dimensionless)",
           title=f"({letter}) different gradients per worker:\n" + ("absolute error" if absolute else
                                                                   "error relative to ||mean v||² (judged)"))
    ax.set_xticks(list(HET_WORKERS), [str(n) for n in HET_WORKERS])
    ax.minorticks_off()
    log_ticks(ax, "y", het.groupby(["codec", "workers"])[value].mean())


fig, axes = plt.subplots(ROWS, COLS, figsize=(4.3 * COLS, 3.5 * ROWS), squeeze=False)
for letter, ax, kind in zip(LETTERS, axes.flat, KINDS):
    kind_panel(ax, letter, kind)
het_panel(axes.flat[len(KINDS)], LETTERS[len(KINDS)])
het_panel(axes.flat[len(KINDS) + 1], LETTERS[len(KINDS) + 1], "rel_mse")
legend_ax = axes.flat[len(KINDS) + 2] if len(axes.flat) > len(KINDS) + 2 else None   # the het panels' legend
for ax in axes.flat[len(KINDS) + 2 + (legend_ax is not None):]:
    ax.remove()
handles = [plt.Line2D([], [], color=pal[c], marker=marks[c], label=c) for c in others]
handles += [plt.Line2D([], [], ls="none", mew=0.8, label=f"terngrad, N = {n} (same vector)", **st)
            for n, st in TG_N.items()]
fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 0.93), title="codec, panels (a)-" +
           f"({LETTERS[len(KINDS) - 1]}): N = 1", fontsize=8.5, title_fontsize=9)
het_handles, het_labels = axes.flat[len(KINDS)].get_legend_handles_labels()
het_title = f"panels ({LETTERS[len(KINDS)]}), ({LETTERS[len(KINDS) + 1]}): n = {HET_N}, mean over seeds"
if legend_ax is not None:      # beside the panels it explains
    legend_ax.axis("off")
    legend_ax.legend(het_handles, het_labels, loc="center left", fontsize=8.5, title_fontsize=9, title=het_title)
else:
    fig.legend(het_handles, het_labels, loc="lower left", bbox_to_anchor=(1.0, 0.02), fontsize=8.5,
               title_fontsize=9, title=het_title)
fig.suptitle("Relative error of the N-worker mean at equal bits (tgsim compare variance, seed 0: the same vector on "
             "every worker);\nlast two panels: different gradients per worker, " + seeds_note(HET_SEEDS), y=1.0)
fig.tight_layout()

# %% claims, from the data
ok = raw[raw.status == "ok"]


def same_vector(codec: str) -> pd.DataFrame:
    """Per synthetic kind and budget (the same vector on every worker): the measured and exact errors at
    N = 1 and N = 32, their ratios, and the exact formula's bias ||b||² and variance σ² of one code
    (from exact(N) = ||b||² + σ²/N at N = 1 and 32)."""
    d = ok[(ok.codec == codec) & (ok.kind != "mnist1d") & ok.workers.isin([1, 32])]
    p = d.pivot_table(index=["kind", "budget"], columns="workers", values=["rel_mse", "exact_mse", "mse"])
    if p.empty or 32 not in p["mse"].columns:
        return pd.DataFrame()
    out = pd.DataFrame({"measured_ratio": p["rel_mse"][1] / p["rel_mse"][32],
                        "exact_ratio": p["exact_mse"][1] / p["exact_mse"][32],
                        "bias2": (32 * p["exact_mse"][32] - p["exact_mse"][1]) / 31,
                        "var": 32 * (p["exact_mse"][1] - p["exact_mse"][32]) / 31}).reset_index()
    out["bias_share"] = out.bias2 / (out.bias2 + out["var"])
    return out.dropna(subset=["measured_ratio"])


tg, tk = same_vector("terngrad"), same_vector("topk")
reach = reach_terngrad(raw, N=1)
q = reach[reach.codec == "qsgd"]
# the wire coding of QSGD's row at the budget that reaches TernGrad's error (codec_options of the CSV)
q_rows = ok[(ok.codec == "qsgd") & (ok.workers == 1)].set_index(["kind", "budget"])


def q_coding(kind, budget):
    cell = q_rows.codec_options.get((kind, budget)) if "codec_options" in q_rows else None
    return f", {coding_of(cell)} coding" if coding_of(cell) else ""


def het_slope(codec: str, value: str = "mse") -> dict:
    d = het[het.codec == codec]
    return slope_fit(d.workers, d[value], d.seed)


def yes(ok_: bool) -> str:
    return "confirmed" if ok_ else "not confirmed"


own, top = het_slope("terngrad, own scaler"), het_slope("top-k 1 %, no EF")
own_rel, top_rel = het_slope("terngrad, own scaler", "rel_mse"), het_slope("top-k 1 %, no EF", "rel_mse")
rel_at = het.groupby(["codec", "workers"]).rel_mse.mean()
at = het[het.workers == max(HET_WORKERS)].groupby("codec").mse.mean()
HET = f"different gradients per worker (v̄ + 2 t_3 noise), n = {HET_N}, N = 1..{max(HET_WORKERS)}"


def tg_options() -> str:
    """TernGrad's clipping and sharing options in the CSV's codec_options cell ("key=value;...")."""
    if "codec_options" not in ok or not (ok.codec == "terngrad").any():
        return "the registry's defaults"
    first = str(ok[ok.codec == "terngrad"].codec_options.iloc[0])
    cell = dict(kv.split("=", 1) for kv in first.split(";") if "=" in kv)
    return ", ".join(f"{k}={cell[k]}" for k in ("clip", "clip_factor", "sharing") if k in cell)


TG_CLIP = tg_options()


def same_vector_row() -> dict:
    """TernGrad's N = 1 / N = 32 ratio on the same vector, measured against the exact formula's
    (||b||² + σ²) / (||b||² + σ²/32), per kind, within 10 %; summed up by `combine`."""
    per = {r.kind: yes(abs(r.measured_ratio / r.exact_ratio - 1) < 0.1) for r in tg.itertuples()}
    text = "; ".join(f"{r.kind}: measured x{r.measured_ratio:.1f}, exact x{r.exact_ratio:.1f}, clipping's bias "
                     f"{100 * r.bias_share:.1f} % of the N = 1 error ({per[r.kind]})" for r in tg.itertuples())
    return claim("same vector on every worker: only TernGrad's variance averages out, not clipping's bias",
                 "compare variance's exact formula (tgsim.analysis.compare_variance): the mean of N codes of one "
                 "vector has error ||b||² + σ²/N, so N = 1 / N = 32 is (||b||² + σ²) / (||b||² + σ²/32), x32 "
                 "only when the bias b is 0",
                 f"TernGrad ({TG_CLIP}), N = 1 / N = 32: " + (text or "not measured"),
                 combine(list(per.values())), kind="self-check",
                 setting="tgsim compare variance: the same synthetic vector on every worker, seed 0",
                 test="per kind: the measured ratio within 10 % of the exact formula's (no statistical test; means "
                      "over R draws); summed up by verdicts.combine", scale="synthetic", rows=tg)


def qsgd_row() -> dict:
    """Per kind: QSGD reaches TernGrad's error (N = 1) below 2 bits; summed up by `combine`."""
    per = {r.kind: yes(r.bits < 2) for r in q.itertuples()}
    text = "; ".join(f"{r.kind}: " + (f"{r.bits:.2f} bits{q_coding(r.kind, r.budget)}" if r.bits == r.bits
                                       else "not reached") + f" ({per[r.kind]})" for r in q.itertuples())
    return claim("QSGD needs fewer bits than TernGrad for TernGrad's 2-bit variance", "paraphrase: QSGD (Alistarh "
                 "et al.): with Elias-coded levels, fewer bits than a 2-bit code for the same variance (not checked "
                 "against the seeds: " + UNCHECKED + ")",
                 text or "not reached", combine(list(per.values())) if per else False, kind="other paper's result",
                 setting="one worker, tgsim compare variance's vectors and bit budgets",
                 test="per kind: the measured bits at which QSGD first reaches TernGrad's error below 2 (means over R "
                      "draws, seed 0; no interval); summed up by verdicts.combine", scale="synthetic", rows=q)


claims = [
    claim("unbiased error falls as 1/N (different gradients per worker)",
          "exact formula (compare variance's, used by mean_error here): E||mean_w Q(v_w) - mean_w v_w||² = "
          "||mean_w b_w||² + Σ_w σ_w² / N²; with each worker's own scaler and no clipping b = 0, so the slope on "
          "log N is -1 up to the draws of v",
          f"TernGrad (own scaler): slope of log E||mean Q - mean v||² on log N {own['slope']:.2f} "
          f"[{own['lo']:.2f}, {own['hi']:.2f}]", interval_verdict(own["lo"], own["hi"], -1.15, -0.85),
          kind="self-check", setting=HET + "; exact error of independent codes (terngrad_error)",
          test=f"the slope's 95 % t-interval inside (-1.15, -0.85) (margin 0.15 around -1; disjoint: not confirmed, "
               f"overlapping: inconclusive), {len(HET_SEEDS)} seeds",
          scale="synthetic", rows=het[het.codec == "terngrad, own scaler"]),
    same_vector_row(),
    claim("MAX sharing's penalty with different gradients", "docs/THEORY.md §1.5 (not in the paper: it shares the MAX)",
          f"at N = {max(HET_WORKERS)}: MAX shared / own scaler "
          f"x{at['terngrad, MAX shared'] / at['terngrad, own scaler']:.2f}, "
          f"MEAN shared / own x{at['terngrad, MEAN shared'] / at['terngrad, own scaler']:.2f} (mean over seeds)",
          None, kind="self-check", setting=HET, scale="synthetic",
          rows=het[(het.workers == max(HET_WORKERS)) & het.codec.str.startswith("terngrad")]),
    claim("a biased codec's error does not average out", "paraphrase: Stich et al. (error feedback) need the "
          "residual because a biased compressor's error does not vanish",
          f"top-k 1 % without EF, different gradients per worker: relative error "
          f"{rel_at['top-k 1 %, no EF'][min(HET_WORKERS)]:.2f} at N = {min(HET_WORKERS)}, "
          f"{rel_at['top-k 1 %, no EF'][max(HET_WORKERS)]:.2f} at N = {max(HET_WORKERS)}, slope on log N "
          f"{top_rel['slope']:+.3f} [{top_rel['lo']:+.3f}, {top_rel['hi']:+.3f}] (judged); an unbiased code on the same "
          f"vectors (TernGrad, own scaler): {own_rel['slope']:+.2f} [{own_rel['lo']:+.2f}, {own_rel['hi']:+.2f}]; "
          f"absolute error slope (not judged: ||mean v||² shrinks with N) {top['slope']:.2f} [{top['lo']:.2f}, "
          f"{top['hi']:.2f}]; same vector on every worker, N = 1 / N = 32: "
          + (f"x{tk.measured_ratio.min():.2f}-x{tk.measured_ratio.max():.2f}" if len(tk) else "top-k not measured"),
          averaging_verdict(top_rel["lo"], top_rel["hi"]), kind="other paper's result", setting=HET,
          test=f"the relative error's slope on log N, 95 % t-interval over {len(HET_SEEDS)} seeds, against "
               f"{AVERAGING_FLOOR:g}: " + AVERAGING_RULE,
          scale="synthetic", rows=pd.concat([het[het.codec == "top-k 1 %, no EF"].assign(part="different per worker"),
                                             tk.assign(part="same vector")], ignore_index=True)),
    qsgd_row(),
]
save(fig, "fig07_compare_variance", pd.concat([df.assign(drawn=df.workers.eq(1) | df.codec.eq(TOP)),
                                                exact.assign(drawn=False),
                                                het.assign(drawn=True, kind="different per worker")],
                                               ignore_index=True), QUICK, claims)
