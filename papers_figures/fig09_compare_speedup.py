# %% [markdown]
# # Fig. 9 (tgsim): speedup in workers and iterations against the compression ratio
#
# Jiang & Agrawal (NeurIPS 2018) show an $O(1/\sqrt{MK})$ rate for quantized SGD when the quantization is
# configured properly, and for their PQASGD (their abstract, paraphrased; not checked here: only the
# public reviews of that paper were at hand, and its reviewer 1 reads the combined method's bound as
# O(1+q/√MK)); QSGD and error-feedback SGD (Stich et al.) are paraphrased as keeping SGD's linear
# speedup in the number of workers M (iterations to a target ∝ 1/M; their texts not at hand; no source
# here makes that claim for plain sign or for random-k without memory, whose rows get no verdict);
# TernGrad's Theorem 1 gives no rate.
#
# Here: `tgsim compare speedup` (tgsim.analysis.compare_speedup; --quick's parameters from
# analysis/compare_cli.py under `--quick`), its speedup.csv and speedup_runs.csv: K_ε, the first
# iteration with ||w - w*||/||w*|| <= ε on least squares (d = 64 dimensions), against M (geometric mean
# over seeds and its 95 % t-interval), and against the compression ratio at a fixed M; rows of the
# paper's rule (fp32's learning rate for every method) when the CSVs have a `rule` column.
#
# The tested range (compare_speedup.linear_range): the largest prefix of M, at least 3 values, over
# which fp32's slope β of log K on log M (one intercept per seed) has β + 1 below +0.15 at the upper
# end of its 90 % interval (α = 0.05): the worker counts where SGD's own speedup has not flattened.
# Past it K reaches the deterministic transient and no method can speed up linearly, so the claims
# are tested there only (no such range: "untestable here"). fp32's own row: the TOST of β against -1
# over that range. Each method's row (compare_speedup.keeps_speedup): its slope against fp32's over
# the range, one-sided non-inferiority of β_method - β_fp32 < 0.15 (falling faster than fp32 is no
# loss of speedup).
#
# Methods (compare_speedup.paper_methods, in the full form's method list; --quick runs three codecs
# only, and these rows then read "not run"): Jiang & Agrawal's rate claim tested on
#   * QSGD at the levels their theorem needs: the rate holds while QSGD's variance factor
#     q = min(d/s^2, sqrt(d)/s) stays bounded, and q = 1 at s = sqrt(d), d the model's dimension (the
#     elements of a QSGD bucket: here the 64 least-squares weights, one bucket). So s = ceil(sqrt(d)) levels
#     at EVERY worker count M, "qsgd[levels=8]" for d = 64 (compare_speedup.qsgd_levels); the number of
#     levels follows the dimension, not M (reviewer 4 of the paper: "the quantization level s is
#     proportional to the square root of the data dimension N");
#   * sparse parameter averaging ("fp32+pqasgd": the model difference every 4 steps, uncompressed, Q = identity);
#   * PQASGD, their own method ("terngrad+pqasgd": TernGrad's quantizer on the model difference every 4 steps);
#   * TernGrad as the registry runs it, the paper's recipe (MAX-shared scaler, clipping at 2.5σ, 3 levels;
#     at d = 64 its message carries about 9 bits per element, header and scaler included): no paper claims
#     that TernGrad keeps a linear speedup (its Theorem 1 gives no rate); the row answers TernGrad's
#     reviewer 3 (no rate analysis) and Jiang & Agrawal's reviewer 1 (linear speedup against prior art).
# Every other registered codec: its own paper's claim (QSGD at its default 7 levels among them).
# A row whose method sends what fp32 sends here (the same K on every run) is measured without a verdict;
# a method that never reaches ε over the range fails (as fig08 counts a missed target): _rules.
# speedup_row_verdict. Reviewer 4 of Jiang & Agrawal asks whether PQASGD still improves "when smaller
# number of bits is used for QSGD": the row "PQASGD against fewer-bit QSGD" answers it from panel (d)'s
# runs at one M (QSGD's fewest levels against PQASGD), with no verdict; PQASGD with QSGD as its own
# quantizer was not run (reviewers.QUESTIONS names the command that would run it). One colour per method,
# as in every figure (_theme.CODEC_COLORS).

# %%
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, compare_outputs, paper_rule  # noqa: E402
from _rules import speedup_row_verdict  # noqa: E402
from _theme import (UNCHECKED, claim, codec_palette, label_points, log_ticks, plt, save, seeds_note, source,  # noqa: E402
                    theme, untestable)
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402
from tgsim.analysis.common import split_label  # noqa: E402
from tgsim.analysis.compare_cli import SPEEDUP_QUICK_PROBLEM  # noqa: E402
from tgsim.analysis.compare_speedup import Problem, paper_methods  # noqa: E402
from tgsim.analysis.verdicts import keeps_speedup, linear_range, slope_fit  # noqa: E402
from tgsim.codecs import registry  # noqa: E402

QUICK, OUT = command_line("Speedup in workers and against compression: tgsim compare speedup, plotted.")
out = compare_outputs("speedup", QUICK)
df = paper_rule(pd.read_csv(out / "speedup.csv")).copy()
theme()    # the compare run may have set its own

# %% the verdicts: fp32's linear range, then every method's slope against fp32's over it
runs = paper_rule(pd.read_csv(out / "speedup_runs.csv"))
runs = runs[runs.sweep == "workers"]
MARGIN, ALPHA, BASE = 0.15, 0.05, "fp32"
lin = linear_range(runs, BASE, margin=MARGIN, alpha=ALPHA)
MS = lin["Ms"]
methods = [m for m in dict.fromkeys(runs.method) if m != BASE]
keep = {m: keeps_speedup(runs, m, BASE, MS, margin=MARGIN, alpha=ALPHA) for m in methods} if MS else {}
seeds = seeds_note(runs.seed)
full = slope_fit(runs[runs.method == BASE].workers, runs[runs.method == BASE].K, runs[runs.method == BASE].seed)
M_all = sorted(runs.workers.unique())


PERIOD = 4         # "+pqasgd": the model difference every 4 steps (LOCAL_VARIANTS)


def same_as_fp32(m: str, within: float = 0.0) -> bool:
    """Whether m's K equals fp32's at every (M, seed) of the worker sweep (NaN counting as equal), or is
    `within` that many iterations of it (sparse parameter averaging: fp32's K up to the sync period)."""
    a = runs[runs.method == m].set_index(["workers", "seed"]).K.sort_index()
    b = runs[runs.method == BASE].set_index(["workers", "seed"]).K.sort_index()
    return a.index.equals(b.index) and np.allclose(a.to_numpy(float), b.to_numpy(float), rtol=0.0, atol=within,
                                                   equal_nan=True)


def unbiased(m: str) -> bool:
    """Whether m's codec is unbiased (registry properties) and runs without error feedback."""
    name, _, ef, _ = split_label(m)
    return registry.make(name).properties.unbiased and not ef


# the problem the compare run solved (its --quick form's keywords over Problem's defaults), and Jiang &
# Agrawal's methods for it: PQASGD, QSGD at s = ceil(sqrt(DIM)) levels, sparse parameter averaging
DIM = Problem(**(SPEEDUP_QUICK_PROBLEM if QUICK else {})).dim
PQ_M, QSGD_M, SPA_M = paper_methods(DIM)
LEVELS = split_label(QSGD_M)[1]["levels"]


def local(m: str) -> bool:
    """Whether m sends the model difference every few steps (a "+pqasgd" label)."""
    return split_label(m)[3] is not None


SPA = [m for m in methods if local(m) and split_label(m)[0] == BASE]       # Q = identity: parameter averaging
PQ = sorted((m for m in methods if local(m) and m not in SPA), key=lambda m: m != PQ_M)     # PQASGD's own first
RATE = [m for m in methods if m == QSGD_M]
TERN = [m for m in methods if m == "terngrad"]
OTHERS = [m for m in methods if m not in (*PQ, *SPA, *RATE, *TERN)]
JA = [(f"QSGD, s = ⌈√{DIM}⌉ = {LEVELS} levels", RATE), ("sparse parameter averaging", SPA), ("PQASGD", PQ)]
HAVE = [t for t, ms in (*JA, ("TernGrad at fixed levels", TERN)) if ms]
LACK = [t for t, ms in JA if not ms]
PANELS = [(textwrap.fill("Jiang & Agrawal's rate claim: " + ", ".join(HAVE), 80)
           + (f"\n({', '.join(LACK)}: not in this run)" if LACK else ""), [*RATE, *SPA, *PQ, *TERN]),
          ("unbiased codecs (their papers' claims)", [m for m in OTHERS if unbiased(m)]),
          ("biased codecs (their papers' claims)", [m for m in OTHERS if not unbiased(m)])]
PANELS = [(t, ms) for t, ms in PANELS if ms]
SAME = {m for m in methods if same_as_fp32(m)}
# sparse parameter averaging whose K is fp32's up to the sync period (K is counted on the last synchronized
# model: within 3 periods on every run): its slope is fp32's by construction, the test cannot fail (no
# power), so like fp16's rows it gets no verdict
SAME_PERIOD = {m for m in SPA if m not in SAME and same_as_fp32(m, within=3 * PERIOD)}
SAME |= SAME_PERIOD

# %% figure: one panel of K against M per group of methods (fp32 in each), then K against compression at fixed M
w = df[df.sweep == "workers"]
c_rows = df[df.sweep == "compression"]
n_panels = len(PANELS) + (1 if len(c_rows) else 0)
rows_ = (n_panels + 1) // 2
fig, axes = plt.subplots(rows_, 2, figsize=(15, 6.2 * rows_), squeeze=False)
for ax in axes.flat[n_panels:]:
    ax.remove()
ORDER = [m for _, ms in PANELS for m in ms]         # colours and markers in panel order: each method its own
palette = codec_palette([BASE, *ORDER])         # one colour per codec in every figure (fp32: black)
MARKERS = {BASE: "o", **dict(zip(ORDER, "sD^vP*Xph<>8d" * 2))}


def slope_text(m: str) -> str:
    """A legend entry: the method and the quantity its verdict judged, with the interval judged: its slope
    minus fp32's over the tested range (90 % interval); fp32's own slope + 1 (90 %, the linear range's
    test); and why a point or a slope is missing."""
    notes = []
    d = w[w.method == m]
    miss = d[d.K_gmean.isna()].workers
    if len(miss):
        notes.append("no point at M = " + ", ".join(f"{x:g}" for x in miss) + ": not every seed reached ε")
    if m in SAME:
        notes.append(f"same K as {BASE} on every run, {runs[runs.method == m].bits_up.mean():.3g} bits up per "
                     "element: hollow, dashed")
    if m == BASE:
        s = (f"slope + 1 {lin['diff']:+.2f} [{lin['diff_lo']:+.2f}, {lin['diff_hi']:+.2f}] over M = "
             f"{lin['M_lo']:g}..{lin['M_hi']:g}" if MS else "no linear range")
    elif not MS:
        s = "untested: no linear range"
    else:
        k = keep[m]
        s = (f"{k['diff']:+.2f} [{k['diff_lo']:+.2f}, {k['diff_hi']:+.2f}]"
             if np.isfinite(k["slope"]) and np.isfinite(k.get("diff_lo", np.nan)) else "no slope")
    return f"{m}: {s}" + (f"\n    ({'; '.join(notes)})" if notes else "")


for j, (title, members) in enumerate(PANELS):
    ax = axes.flat[j]
    members = [BASE, *members]
    for i, m in enumerate(members):
        d = w[w.method == m].sort_values("workers")
        dodge = np.exp(0.07 * (i - (len(members) - 1) / 2))       # side by side in log M: no series hides another
        x, k, lo, hi = (d.workers * dodge).to_numpy(), d.K_gmean.to_numpy(), d.K_lo.to_numpy(), d.K_hi.to_numpy()
        color, hollow, z = palette[m], m in SAME, 3 if m == BASE else 4
        f = np.isfinite(k)
        if not f.any():   # no point at any M: a legend entry of text only (no marker that matches nothing drawn)
            ax.plot([], [], ls="none", marker="none", label=slope_text(m))
            continue
        ax.plot(x[f], k[f], color=color, marker=MARKERS[m], ls="--" if hollow else "-", mfc="none" if hollow else color,
                ms=6, lw=1.3, label=slope_text(m), zorder=z)
        f &= np.isfinite(lo) & np.isfinite(hi)
        if f.any():
            ax.errorbar(x[f], k[f], yerr=np.vstack([k - lo, hi - k])[:, f], fmt="none", ecolor=color, capsize=2,
                        lw=1.0, zorder=z)
    fp = w[w.method == BASE].sort_values("workers")
    ms = np.array(M_all, float)
    if len(fp) and np.isfinite(fp.K_gmean.iloc[0]):
        ax.plot(ms, fp.K_gmean.iloc[0] * ms[0] / ms, ":", color="black", lw=1, label=f"linear speedup ({BASE}'s K at "
                f"M = {ms[0]:g}, / M)")
    if MS:
        ax.axvspan(min(MS) / 1.25, max(MS) * 1.25, color="0.88", zorder=0,
                   label=f"tested range: {BASE} linear (M = {min(MS):g}..{max(MS):g})")
    vals = w[w.method.isin(members)][["K_gmean", "K_lo", "K_hi"]].to_numpy().ravel()
    ax.set(xscale="log", yscale="log", xlabel="workers M (fixed batch per worker)",
           ylabel="iterations K_ε to ||w-w*|| <= ε||w*||")
    ax.set_title(f"({'abcdefgh'[j]}) {title}\n(geometric mean, 95 % interval; {seeds})",
                 loc="left")
    ax.set_xlim(ms.min() / 1.35, ms.max() * 1.35)
    ax.xaxis.set_major_locator(FixedLocator(ms))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    log_ticks(ax, "y", vals)
    ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
              title="method: slope of log K on log M minus fp32's over the tested range\n[90 % interval, the one "
                    "the verdict judges; fp32: its slope + 1]")

COMPRESSION_NOTES = []
if len(c_rows):
    ax = axes.flat[len(PANELS)]
    M = int(c_rows.workers.iloc[0])
    ref = w[(w.workers == M) & w.method.isin([BASE, *RATE, *SPA, *PQ, *TERN])]
    ref = ref.assign(knob="", knob_value=np.nan)
    points, missing = [], []
    for m, d in pd.concat([ref, c_rows], ignore_index=True).groupby("method", sort=False):
        d = d.sort_values("knob_value")
        ok = d[np.isfinite(d.K_gmean) & np.isfinite(d.compression)]
        gone = d[~(np.isfinite(d.K_gmean) & np.isfinite(d.compression))]
        why = []
        for r in gone.itertuples():
            what = f"{r.knob} {r.knob_value:g}" if isinstance(r.knob, str) and r.knob else f"M = {M}"
            why.append(what + (": not every seed reached ε" if not np.isfinite(r.K_gmean) else ": no bits measured"))
        color = palette.get(m, "gray")
        ax.plot(ok.compression, ok.K_gmean, marker=MARKERS.get(m, "X"), color=color, ls="-" if len(ok) > 1 else "none",
                ms=7, mfc="none" if m in SAME else color,
                label=m + (f"\n    (no point: {'; '.join(why)})" if why else ""))
        if why:
            missing.append(f"{m}: " + "; ".join(why))
        points.append(ok)
    pts = pd.concat(points, ignore_index=True)
    ax.set(xscale="log", yscale="log", xlabel="compression ratio (32 / measured bits up per element)",
           ylabel="iterations K_ε (geometric mean over seeds)")
    ax.set_title(f"({'abcdefgh'[len(PANELS)]}) against compression at M = {M}: the swept codecs' knob values "
                 f"(labelled where room),\nfp32 and panel (a)'s methods at M = {M}", loc="left")
    log_ticks(ax, "x", pts.compression)
    log_ticks(ax, "y", pts.K_gmean)
    ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, title="method")
    COMPRESSION_NOTES = missing
fig.tight_layout(h_pad=2.5, w_pad=3.0)
if len(c_rows):
    lab = pts[pts.knob.astype(str).str.len() > 0]
    placed = label_points(ax, lab.compression.to_numpy(), lab.K_gmean.to_numpy(),
                          [f"{r.knob} {r.knob_value:g}" for r in lab.itertuples()])
    renderer = fig.canvas.get_renderer()
    kept = []
    # every drawn point's marker (about 7 pt across): a label over another point's marker is dropped too
    half = 3.5 * fig.dpi / 72.0
    cen = ax.transData.transform(np.column_stack([pts.compression.to_numpy(float), pts.K_gmean.to_numpy(float)]))
    from matplotlib.transforms import Bbox
    marks = [Bbox.from_extents(cx - half, cy - half, cx + half, cy + half) for cx, cy in cen]
    pad = 1.5 * fig.dpi / 72.0
    for a in placed:      # a label that overlaps one already kept or a marker, or leaves the panel, is dropped
        b = a.get_window_extent(renderer)        # (values in the CSV)
        b = Bbox.from_extents(b.x0 - pad, b.y0 - pad, b.x1 + pad, b.y1 + pad)
        own = ax.transData.transform([a.xy])[0]
        if any(b.overlaps(k) for k in kept) or any(b.overlaps(m) and not m.contains(*own) for m in marks) \
                or not ax.get_window_extent(renderer).contains(b.x0, b.y0) \
                or not ax.get_window_extent(renderer).contains(b.x1, b.y1):
            a.remove()
        else:
            kept.append(b)

# %% claims: one row per method, decided over the tested range, with the rows each verdict used
RULE = ("fp32's linear range: the largest prefix of M, at least 3 values, over which the 90 % interval of fp32's "
        f"slope of log K on log M, plus 1, ends below +{MARGIN:g} (alpha {ALPHA:g})")
SETTING = (f"least squares (dim {DIM}), fixed batch per worker, M = {min(MS):g}..{max(MS):g} ({RULE}), fp32's "
           "learning rate for every method at every M (not tuned per method or per worker count)" if MS else
           f"least squares (dim {DIM}), fixed batch per worker, M = {M_all[0]:g}..{M_all[-1]:g}: no linear range "
           f"({RULE})")
RATE_WORDS = source("ja-abstract", "We show that $O(1/\\sqrt{MK})$ convergence rate can be achieved if the "
                    "sparsification and quantization hyperparameters are configured properly.")
CONDITIONS = source("ja-review", "The authors derive explicit conditions on the quantization mechanism, as well as "
                    "the components exchanged to ensure that the convergence rate corresponds to full data exchange.",
                    n=2)
LEVEL_WORDS = source("ja-review", "In line 220, the quantization level s is proportional to the square root of the "
                     "data dimension N", n=4)
SPA_WORDS = source("ja-review", "This paper provides theoretical convergence analysis on two recent methods that "
                   "reduces communication cost in distributed learning, i.e., sparse parameter averaging and gradient "
                   "quantization.", n=4)
PQ_WORDS = source("ja-abstract", "We also propose a strategy called periodic quantized averaging (PQASGD) that "
                  "further reduces the communication cost while preserving the $O(1/\\sqrt{MK})$ convergence rate.")
PRIOR_ART = source("ja-review", "Finally, since the paper claims to establish linear speedups, these should be also "
                   "proved experimentally in comparison to prior art.", n=1)
NO_RATE = source("tg-review", "it’s a pity that there’s no theoretical analysis of the convergence rate.", n=3)
OTHER_WORDS = ("paraphrase: QSGD (Alistarh et al.), error-feedback SGD (Stich et al.) and the other codecs' papers: "
               f"the compressed method keeps SGD's rate in M (not checked against the seeds: {UNCHECKED})")
# methods run outside the setting of any claim at hand: their rows report the measurement, no verdict
NO_SOURCE = {
    "sign": "plain sign without error feedback: no source at hand claims that it keeps SGD's rate in M (the "
            "error-feedback form is the scaled_sign+ef row)",
    "randomk": "random-k without memory, at fp32's learning rate (not tuned for random-k): the claim paraphrased for sparsified SGD "
               "(Stich et al.) is made with memory (error feedback), so these settings do not match it",
}
R1_RATE = source("ja-review", "As the theoretical convergence bound in the paper (line 255) suggests, the proposed "
                 "approach converge at rate O(1+q/ sqrt(MK) )", n=1)
WOULD = ("a problem whose noise term dominates K over at least 3 worker counts (a smaller batch per worker, larger "
         "label noise or a smaller ε), so that fp32 itself speeds up linearly there")


def rows_of(*ms) -> pd.DataFrame:
    """The runs a verdict used: the methods' worker sweep over the tested range."""
    r = runs[runs.method.isin(ms)]
    return r[r.workers.isin(MS)] if MS else r


def measured(m: str) -> str:
    """m's slope over the tested range (95 % interval) and its difference to fp32's (90 % interval, the
    one-sided test's); a method with fp32's K on every run says so, with its measured bits."""
    k = keep[m]
    same = ((f"; same K as fp32 up to the {PERIOD}-step sync period (within {3 * PERIOD} iterations) on every run"
             if m in SAME_PERIOD else "; same K as fp32 on every run") if m in SAME else "") + \
        f"; {runs[runs.method == m].bits_up.mean():.3g} bits up per element (measured)"
    if not np.isfinite(k["slope"]) or not np.isfinite(k["lo"]):
        return f"{m}: {k['test']}" + same
    return (f"{m}: slope {k['slope']:.2f} [{k['lo']:.2f}, {k['hi']:.2f}] over M = {k['M_lo']:g}..{k['M_hi']:g}; "
            f"minus fp32's {k['diff']:+.2f} [{k['diff_lo']:+.2f}, {k['diff_hi']:+.2f}] (90 % interval)" + same)


def row(name: str, m: str | None, paper: str, kind: str, setting: str, why_absent: str = "", *, role: str = "",
        note: str = "", no_claim: str = "", conditional: bool = False, key: str = "") -> dict:
    """The claim `name` about method m, its verdict by `_rules.speedup_row_verdict`: "n/a" when the run did
    not include m, or when m's K is fp32's on every run (it compresses nothing here: nothing to test);
    "untestable here" without a range; "not confirmed" when m missed ε on every run of the range (its
    failure, as fig08 counts a missed target); else `keeps_speedup` over the tested range, "conditional" in
    place of "confirmed" when `conditional` (a condition of the claim's rule not checked here, `note` names
    it). `no_claim`: why no claim at hand covers the setting run; the row then gives the measurement and
    no verdict. `role`, `note`, `key`: the row's (_theme.claim; `key` keeps two claims that quote one
    sentence apart in the report's count)."""
    mine = rows_of(m) if m is not None else runs.iloc[:0]
    if no_claim and m is not None:       # no claim at hand in this setting: the measurement, no verdict
        text = measured(m) if m in keep and np.isfinite(keep[m]["slope"]) else (
            f"{m}: reached ε on {int(mine.K.notna().sum())} of {len(mine)} runs over the range")
        return claim(name, paper, f"{text}; no verdict: {no_claim}", None, kind=kind, setting=setting, scale="lsq",
                     rows=rows_of(BASE, m), role=role, key=key)
    verdict, why = speedup_row_verdict(run=m is not None, has_range=bool(MS), same_as_reference=m in SAME,
                                       reached=int(mine.K.notna().sum()), runs=len(mine),
                                       slope_verdict=keep[m]["verdict"] if m in keep else None)
    if why == "not run":
        return claim(name, paper, f"not run: {why_absent}", None, kind=kind, setting=setting, key=key)
    if why == "no linear range":
        return {**untestable(name, paper, f"fp32 itself has no linear range here ({lin['test']})", WOULD, kind=kind,
                             setting=setting, key=key), "_rows": lin["prefixes"]}
    if why.startswith("the same runs"):
        return claim(name, paper, measured(m) + ("; no verdict: its K is fp32's (up to the sync period) on every "
                                                 "run, so its slope is fp32's by construction and the slope test "
                                                 "cannot fail (no power); what it saves is exchanges (one every "
                                                 f"{PERIOD} steps: the bits above), not iterations"
                                                 if m in SAME_PERIOD else
                                                 "; no verdict: the same runs as fp32's, nothing compressed to test"),
                     None, kind=kind, setting=setting, scale="lsq", rows=rows_of(BASE, m), key=key)
    if why.startswith("missed"):
        return claim(name, paper, f"{m}: missed ε on all {len(mine)} runs over M = {min(MS):g}..{max(MS):g} (cap "
                     f"{int(mine.cap.max())} iterations)", verdict, kind=kind, setting=setting,
                     test="a method that reaches ε on no run keeps no speedup (its failure, as in fig08)",
                     scale="lsq", rows=rows_of(BASE, m), key=key)
    if verdict == "confirmed" and conditional:
        verdict = "conditional"     # the test passed; a condition of the claim's rule is not checked here
    return claim(name, paper, measured(m), verdict, kind=kind, setting=setting, test=keep[m]["test"],
                 scale="lsq", rows=rows_of(BASE, m), role=role, note=note, key=key)


def tern_config(m: str) -> str:
    """The configuration m ran with, from the CSV's codec_options (TernGrad's clipping and sharing) and its
    measured bits up per element."""
    cell = runs[runs.method == m].codec_options.dropna()
    opts = dict(kv.split("=", 1) for kv in str(cell.iloc[0]).split(";") if "=" in kv) if len(cell) else {}
    shown = ", ".join(f"{k}={opts[k]}" for k in ("sharing", "clip", "clip_factor", "scope") if k in opts)
    return (f"{m} with {shown or 'the registry defaults'} (the registry's defaults: the paper's recipe, a MAX-shared "
            f"scaler and clipping at 2.5σ), every step, fp32's learning rate; "
            f"{runs[runs.method == m].bits_up.mean():.3g} bits up per element measured at d = {DIM} (3 levels, "
            "packed 4 to a byte, plus the message header and the float32 scaler, which weigh heavily at 64 "
            "elements)")


def fewer_k_text(q: pd.DataFrame, pq) -> str:
    """Which of QSGD's level counts `q` reach ε in fewer iterations than PQASGD's row `pq` (geometric
    means), the fewest two with their Ks and compression: the part of reviewer 4's answer where
    fewer-bit QSGD beats PQASGD in iterations."""
    better = q[np.isfinite(q.K_gmean) & (q.K_gmean < pq.K_gmean)].sort_values("knob_value")
    if not len(better):
        return f"No QSGD level count reaches ε in fewer iterations than PQASGD ({pq.K_gmean:.0f}). "
    few = better.iloc[:2]
    return ("QSGD with " + " and ".join(f"{r.knob_value:g}" for r in few.itertuples()) + " levels needs fewer "
            "iterations (" + ", ".join(f"{r.K_gmean:.0f}" for r in few.itertuples()) + f") than PQASGD "
            f"({pq.K_gmean:.0f}), at less compression (" + ", ".join(f"x{r.compression:.3g}" for r in few.itertuples())
            + f" against x{pq.compression:.3g})"
            + (f"; so does every larger level count ({len(better) - 2} more)" if len(better) > 2 else "") + ". ")


def fewer_bits_row() -> dict:
    """Reviewer 4 of Jiang & Agrawal: "Will the proposed method still have improvement when smaller number of
    bits is used for QSGD?" Read as PQASGD against QSGD at fewer levels: at panel (d)'s M, PQASGD's K and
    compression beside QSGD's at each level count of the compression sweep (an answer, no verdict). The
    other reading, PQASGD quantizing with fewer-bit QSGD itself, was not run (reviewers.QUESTIONS)."""
    words = source("ja-review", "Will the proposed method still have improvement when smaller number of bits is used "
                   "for QSGD?", n=4)
    name = "PQASGD against fewer-bit QSGD (reviewer 4's question)"
    q = c_rows[c_rows.method == "qsgd"].sort_values("knob_value") if len(c_rows) else c_rows
    if not len(q) or not PQ:
        return claim(name, words, "not in this run: " + ("no QSGD level sweep" if not len(q) else "no PQASGD"),
                     None, kind="reviewer question", setting="tgsim compare speedup's compression sweep")
    M = int(q.workers.iloc[0])
    pq = w[(w.method == PQ[0]) & (w.workers == M)].iloc[0]
    fp = w[(w.method == BASE) & (w.workers == M)].iloc[0]

    def k(r) -> str:
        return (f"K {r.K_gmean:.0f} [{r.K_lo:.0f}, {r.K_hi:.0f}]" if np.isfinite(r.K_gmean) else
                "missed ε on some seed")
    text = (f"at M = {M}: {PQ[0]} {k(pq)} at compression x{pq.compression:.3g} ({32 / pq.compression:.3g} bits up "
            f"per element); fp32 {k(fp)}; QSGD by levels: " + "; ".join(
                f"{r.knob_value:g} level(s) {k(r)} at x{r.compression:.3g}" for r in q.itertuples())
            + f". PQASGD compresses more than QSGD at its fewest level ({q.knob_value.min():g}: "
              f"x{q.compression.iloc[0]:.3g}) and reaches ε in "
            + ("fewer" if pq.K_gmean < q.K_gmean.iloc[0] else "more") + " iterations (geometric means; the "
            "intervals " + ("overlap" if pq.K_hi >= q.K_lo.iloc[0] and q.K_hi.iloc[0] >= pq.K_lo else "do not overlap")
            + "). " + fewer_k_text(q, pq) + "Not answered: PQASGD quantizing with fewer-bit QSGD itself (no "
              "qsgd+pqasgd run; the command is in the reviewers' table)")
    return claim(name, words, text, None, kind="reviewer question",
                 setting=f"least squares (dim {DIM}), M = {M} (panel (d)'s; "
                         + (f"inside fp32's linear range M = {min(MS):g}..{max(MS):g}" if MS and min(MS) <= M <= max(MS)
                            else "outside fp32's linear range: K near its deterministic floor") + "), fp32's "
                         "learning rate for every method; PQASGD = "
                         f"{PQ[0]} (TernGrad's quantizer every 4 steps), QSGD = the compression sweep's levels "
                         "(one QSGD bucket of 64)",
                 test="an answer to the question (iterations to ε and measured compression side by side), no "
                      "verdict: one M, geometric means over seeds with 95 % t-intervals",
                 scale="lsq", rows=pd.concat([q, w[w.method.isin([PQ[0], BASE]) & (w.workers == M)]],
                                             ignore_index=True))


fp_rows = runs[runs.method == BASE].assign(in_tested_range=lambda d: d.workers.isin(MS))
full_text = f"over all M = {M_all[0]:g}..{M_all[-1]:g}: slope {full['slope']:.2f} [{full['lo']:.2f}, {full['hi']:.2f}]"
if MS:
    fp_measured = (f"tested range M = {lin['M_lo']:g}..{lin['M_hi']:g}: slope {lin['slope']:.2f} [{lin['lo']:.2f}, "
                   f"{lin['hi']:.2f}], slope + 1 {lin['diff']:+.2f} [{lin['diff_lo']:+.2f}, {lin['diff_hi']:+.2f}] "
                   "(90 %); " + full_text)
else:
    fp_measured = (f"no prefix of at least 3 M passes; M = {lin['M_lo']:g}..{lin['M_hi']:g}: slope {lin['slope']:.2f}"
                   f", slope + 1 {lin['diff']:+.2f} [{lin['diff_lo']:+.2f}, {lin['diff_hi']:+.2f}]; " + full_text
                   if np.isfinite(lin["slope"]) else "fp32 reached ε on every seed at fewer than 3 M; " + full_text)
not_run = (f"this run's methods are {', '.join([BASE, *methods])} (--quick runs three); the full form runs it "
           "(tgsim.analysis.compare_speedup.default_methods)")
claims = [
    # the range is chosen by fp32's own TOST, so that TOST is no verdict on fp32 (it would confirm by
    # construction): the row measures where the other methods are judged
    claim("fp32's linear range in M (where the other methods are judged)", source(
          "tgsim", "paraphrase: SGD theory: with a fixed batch per worker, "
          "synchronous SGD's iterations to a target fall as 1/M (slope -1 of log K on log M) while the gradient "
          "noise dominates K, up to the M where K reaches the deterministic transient",
          where="tgsim.analysis.compare_speedup docstring (SGD on a quadratic)"),
          fp_measured + "; no verdict: the range is the one where fp32's own TOST passes, so judging fp32 on it "
          "would confirm by construction", None, kind="self-check", setting=SETTING,
          test=(f"the range: {RULE}" if MS else f"no range: {RULE}") + f" ({lin['test']})",
          scale="lsq", rows=fp_rows),
    row(f"{QSGD_M} keeps the linear speedup (Jiang & Agrawal's rate)", RATE[0] if RATE else None,
        RATE_WORDS + "; " + LEVEL_WORDS, "paper claim",
        "Jiang & Agrawal: \"Lipschitz continuous (possibly non-convex) loss functions\" (reviewer 2 of paper 1261), "
        "quantized gradients with the quantization configured for the rate; reviewer 4: the level s \"is proportional "
        "to the square root of the data dimension\" (the constant 1 is tgsim's choice); "
        f"here QSGD with s = ceil(sqrt(d)) = {LEVELS} levels at every M, d = {DIM} (the least-squares "
        "weights, one QSGD bucket), so QSGD's variance factor q = min(d/s^2, sqrt(d)/s) <= 1; " + SETTING, not_run,
        key="Jiang & Agrawal's rate: quantized gradients"),
    row("sparse parameter averaging keeps the linear speedup", SPA[0] if SPA else None, RATE_WORDS + "; " + SPA_WORDS,
        "paper claim",
        "Jiang & Agrawal's sparse parameter averaging (periodic averaging): the model difference every 4 steps, "
        f"uncompressed (Q = identity, {SPA_M}), K counted in iterations on the last synchronized model; the period "
        "is 4 at every M (whether it meets the theorem's condition on the period is not checked here); " + SETTING,
        not_run, note="the theorem's condition on the period is not checked here", conditional=True,
        key="Jiang & Agrawal's rate: sparse parameter averaging"),
    row("PQASGD keeps the linear speedup", PQ[0] if PQ else None, PQ_WORDS, "paper claim (proxy)",
        f"Jiang & Agrawal's PQASGD (their own method; its algorithm paraphrased, {UNCHECKED}); here with TernGrad's "
        f"3-level quantizer on the model difference every 4 steps ({PQ_M}), outside their conditions on the "
        "quantization levels (a stand-in: the method outside its own rule), K counted in iterations on the last "
        "synchronized model. The rate quoted is the abstract's; reviewer 1 reads the paper's bound for the "
        f"combined method otherwise: {R1_RATE}; " + SETTING, not_run,
        note="TernGrad's 3 levels, outside the paper's conditions on the levels"),
    *[row(f"{m} keeps the linear speedup", m, PQ_WORDS, "paper claim (proxy)", "a PQASGD variant; " + SETTING,
          note="a PQASGD variant outside the paper's conditions") for m in PQ[1:]],
    row("TernGrad keeps the linear speedup", TERN[0] if TERN else None,
        PRIOR_ART + "; " + NO_RATE, "reviewer question",
        "the words quoted are not the paper's about TernGrad, and neither is a claim about its speedup: the first asks "
        "Jiang & Agrawal to show linear speedup against prior art, the second regrets that TernGrad has no rate "
        "analysis; no paper claims that TernGrad keeps a linear speedup. "
        + (f"Ran: {tern_config(TERN[0])}. " if TERN else "") + "Jiang & Agrawal's test of the linear speedup applied to "
        "TernGrad as prior art (their conditions on the quantization levels do not cover its 3 fixed levels); "
        + SETTING, "this run has no TernGrad", role="re-test"),
    *[row(f"{m} keeps the linear speedup", m, OTHER_WORDS, "other paper's result", SETTING,
          no_claim=NO_SOURCE.get(split_label(m)[0], "") if not split_label(m)[2] else "") for m in OTHERS],
    fewer_bits_row(),
]
tables = [df.assign(table="speedup"), lin["prefixes"].assign(table="fp32 linear-range prefixes"),
          pd.DataFrame([dict(keep[m], table="slope against fp32 over the tested range") for m in keep])]
save(fig, "fig09_compare_speedup", pd.concat(tables, ignore_index=True), QUICK, claims)
