# %% [markdown]
# # Fig. 8 (tgsim): bits to a loss target -- total communication per method
#
# TernGrad's claim: ternary gradients "aggressively reduce the communication time" at no loss of
# accuracy on AlexNet and under 2 % on GoogLeNet (abstract; its Tables keep fp32's hyper-parameters).
# Jiang & Agrawal: PQASGD converges as fast as full-communication SGD with 3-5 % of its data. The
# reviewers asked what it costs to reach the same loss, against fp16 as well as fp32, counting both
# directions and the extra steps a noisier gradient needs, with tuned learning rates.
#
# Here: `tgsim compare bits` (tgsim.analysis.compare_bits; --quick's parameters from
# analysis/compare_cli.py under `--quick`), its bits.csv: the uplink + downlink bits until the
# smoothed training loss reaches 1.25 x fp32's minimum, relative to fp32's (ratio; dashed lines:
# fp16's, so a bar's distance below its line is the saving against fp16), and the test accuracy at
# one common step, fp32's step budget (600 logistic, 800 convnet; every method measured there, a
# method that reached the target earlier trained on to it for this measurement only), on logistic
# regression and the MNIST-1D convnet; one row of panels per rule: every method at fp32's tuned
# learning rate (the paper's rule, "fp32-lr") and at its own ("own-lr"). TernGrad's label names its
# scaler sharing (MAX, the paper's, or MEAN). Verdicts (tgsim.analysis.verdicts, one rule for every
# figure): one-sided t-tests on the per-seed ratios (α = 0.05), against fp32 and against fp16, per
# problem, where every seed reached the target ("missed (k/n)" and no ratio otherwise: the method's
# miss is its failure, the reference's leaves no ratio); non-inferiority of the accuracy at the
# common step with each sentence's own margin (reviewers.WORDS: "no accuracy loss" 0 points, "less
# than 2%" 2 points; a run that diverged is its own method's failure); a summary "split" when the
# problems disagree. Panels (b), (d) draw the paired accuracy gap to fp32 the verdicts test (90 % t-intervals,
# the interval the one-sided tests decide on). One colour per method, as in every figure; the problem by
# hatch, marker and dash pattern. "No accuracy loss" gives no tolerance: at margin 0 its verdict is at best
# inconclusive (_rules.no_loss_verdict). Reviewer 3 of Jiang & Agrawal's question on periodic averaging
# (divergence, accuracies) gets an answer row, without a verdict.
# Kinds: TernGrad (MAX) at fp32's rate is the paper's claim; at its own rate, the reviewers'
# question; MEAN sharing, tgsim's variant. `--quick`: 1 seed, 3 methods (no fp16), 100 / 30 steps.

# %%
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, compare_outputs, t_band, with_coding  # noqa: E402
from _theme import claim, codec_color, gap_axis, log_ticks, plt, save, seeds_note, source, theme  # noqa: E402
from _rules import accuracy_verdict  # noqa: E402
from reviewers import margin, reading, words  # noqa: E402
from tgsim.analysis.verdicts import combine, noninferiority, reached_ratio  # noqa: E402

QUICK, OUT = command_line("Bits to a loss target per method: tgsim compare bits, plotted.")
out = compare_outputs("bits", QUICK)
df = pd.read_csv(out / "bits.csv")
runs = pd.read_csv(out / "bits_runs.csv")
if "rule" not in df.columns:
    df["rule"], runs["rule"] = "fp32-lr", "fp32-lr"
if "accuracy_common" not in runs.columns or "accuracy_common_mean" not in df.columns:
    raise SystemExit(f"fig08: {out} holds compare bits CSVs without the accuracy at the common step "
                     "(accuracy_common); run compare bits again (make_report.py --rerun-compare, or "
                     "TGSIM_FIGURES_RERUN=1)")
theme()    # the compare run may have set its own
df["err_lo"] = (df.ratio_mean - df.ratio_lo).clip(lower=0)
df["err_hi"] = (df.ratio_hi - df.ratio_mean).clip(lower=0)
df["acc_lo"] = (df.accuracy_common_mean - df.accuracy_common_lo).clip(lower=0)
df["acc_hi"] = (df.accuracy_common_hi - df.accuracy_common_mean).clip(lower=0)
COMMON = {p: int(s) for p, s in runs[runs.common_status == "ok"].groupby("problem", sort=False).common_step.max().items()}
common_text = ", ".join(f"{p} {s}" for p, s in COMMON.items())
FP16_NOTE = "dashed: fp16's ratio; " if (df.method == "fp16").any() else "no fp16 in this run; "
# the tick label names the wire coding (QSGD's) and TernGrad's scaler sharing, from codec_options
df["shown"] = [with_coding(m, o) for m, o in zip(df.method, df.get("codec_options", [None] * len(df)))]
RULES = {"fp32-lr": "fp32's tuned learning rate for every method (the paper's rule)",
         "own-lr": "each method's own tuned learning rate"}
rules = [r for r in RULES if r in set(df.rule)]
seeds = seeds_note(runs.seed)
shown_of = dict(zip(df.method, df.shown))
_fp32 = runs[runs.method == "fp32"].set_index(["rule", "problem", "seed"])
gaps = runs[runs.method != "fp32"].assign(
    ref=lambda d: _fp32.accuracy_common.reindex(pd.MultiIndex.from_frame(d[["rule", "problem", "seed"]])).to_numpy(),
    ok=lambda d: (d.common_status == "ok").to_numpy()
    & (_fp32.common_status.reindex(pd.MultiIndex.from_frame(d[["rule", "problem", "seed"]])) == "ok").to_numpy())
gaps["gap_points"] = np.where(gaps.ok, 100 * (gaps.accuracy_common - gaps.ref), np.nan)
gaps["shown"] = gaps.method.map(shown_of)


# %% figure: per rule (rows), (a) total bits relative to fp32 (dashed: fp16's), (b) accuracy at the common step.
# One colour per method, as in every figure (_theme.CODEC_COLORS); the problem is told by hatch (bars), marker
# (points) and dash pattern (fp16's line)
from matplotlib.legend_handler import HandlerTuple  # noqa: E402

fig, axes = plt.subplots(len(rules), 2, figsize=(13, 4.6 * len(rules)), squeeze=False)
order = list(dict.fromkeys(df.shown))
problems = list(dict.fromkeys(df.problem))
HATCH = dict(zip(problems, ["", "///", "...", "xxx"]))
MARK = dict(zip(problems, ["o", "s", "^", "D"]))
F16_LS = dict(zip(problems, ["--", "-.", ":", (0, (5, 1))]))
width = 0.8 / len(problems)
for i, rule in enumerate(rules):
    d0 = df[df.rule == rule]
    ax = axes[i, 0]
    for k, p in enumerate(problems):           # bars: the mean ratio, 95 % interval over seeds
        dp = d0[d0.problem == p].set_index("shown")
        for x, sh in enumerate(order):          # a method that missed the target on some seed has no bar (NaN)
            if sh not in dp.index or not np.isfinite(dp.ratio_mean[sh]):
                continue
            r, xx = dp.loc[sh], x + (k - (len(problems) - 1) / 2) * width
            ax.bar(xx, r.ratio_mean, width=width, color=codec_color(r.method), hatch=HATCH[p], edgecolor="white",
                   lw=0.5)
            ax.errorbar([xx], [r.ratio_mean], yerr=[[r.err_lo], [r.err_hi]], fmt="none", color="black", lw=1)
        f16 = dp.ratio_mean[dp.method == "fp16"]
        if len(f16) and pd.notna(f16.iloc[0]) and not any(    # fp16's ratio: the saving is the gap; problems
                ln.get_gid() == "fp16" and np.allclose(ln.get_ydata(), f16.iloc[0]) for ln in ax.lines):  # alike: one
            ax.axhline(f16.iloc[0], color=codec_color("fp16"), ls=F16_LS[p], lw=1.1, gid="fp16")
    ax.set(yscale="log", xlabel="method", ylabel="bits up + down to the target / fp32's  (ratio)",
           title=f"({'ac'[i]}) {rule}: communication to 1.25 x fp32's minimum loss\n"
                 f"(95 % t-interval; {FP16_NOTE}no bar: target missed on some seed)")
    ax.axhline(1, color="black", lw=0.8)
    log_ticks(ax, "y", pd.concat([d0.ratio_lo, d0.ratio_hi, d0.ratio_mean, pd.Series([1.0])]))
    ax = axes[i, 1]     # the paired accuracy gap to fp32 at the common step: what the accuracy verdicts test
    g0 = gaps[gaps.rule == rule].assign(shown_problem=lambda x: x.shown + " (" + x.problem + ")")
    gap_axis(ax, g0, "shown_problem", "gap_points", [f"{sh} ({p})" for sh in order for p in problems])
    lo_y, hi_y = ax.get_ylim()
    for k, p in enumerate(problems):
        for x, sh in enumerate(order):
            v = g0[(g0.problem == p) & (g0.shown == sh)]
            if not v.gap_points.notna().any():
                continue
            m, (b0, b1) = float(np.nanmean(v.gap_points)), t_band(v.gap_points)   # the verdicts' 90 % interval
            xx, c = x + (k - (len(problems) - 1) / 2) * 0.3, codec_color(v.method.iloc[0])
            if b1 > b0:          # a zero-width interval (every seed alike) has no band
                ax.plot([xx, xx], [b0, b1], color=c, lw=1.2)
                ax.plot([xx - 0.06, xx + 0.06], [b0, b0], color=c, lw=1)
                ax.plot([xx - 0.06, xx + 0.06], [b1, b1], color=c, lw=1)
            if lo_y <= m <= hi_y:
                ax.plot([xx], [m], marker=MARK[p], color=c, ms=7, mec="white", mew=0.6, ls="none")
    ax.set_ylim(lo_y, hi_y)
    ax.axhline(0, color="black", lw=0.8)
    ax.axhline(-margin("under-2"), color="black", lw=0.8, ls=":")
    ax.set(xlabel="method", ylabel="accuracy - fp32's (points)",
           title=f"({'bd'[i]}) {rule}: accuracy gap to fp32, common step\n"
                 f"({common_text}; 90 % t-interval, the verdicts'; dotted: -2 points)")
for ax in axes.flat:    # every method's tick, also one whose bars are all missing (nan)
    ax.set_xticks(range(len(order)), order)
    ax.set_xlim(-0.5, len(order) - 0.5)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right", rotation_mode="anchor")
handles = [(plt.Rectangle((0, 0), 1, 1, fc="0.55", ec="white", hatch=HATCH[p]),
            plt.Line2D([], [], marker=MARK[p], color="0.4", ls="none"),
            plt.Line2D([], [], color=codec_color("fp16"), ls=F16_LS[p])) for p in problems]
fig.legend(handles, problems, handler_map={tuple: HandlerTuple(ndivide=None, pad=0.8)}, loc="lower center",
           ncol=len(problems), handlelength=7, handleheight=1.6, title="problem: bar hatch, point marker, fp16's line (colour: the method, as in every "
                                     "figure)")
fig.suptitle(f"tgsim compare bits: logistic regression (640 weights) and the MNIST-1D convnet (23,882 parameters), "
             f"8 workers; {seeds}", y=1.0)
fig.tight_layout(rect=(0, 0.06, 1, 0.98))

# %% claims, from the data: per-seed ratios of total bits, tested one-sided at alpha 0.05
SCALE = "logreg+convnet"
SETTING = "8 workers, total batch 64, momentum 0.9, parameter server; the loss target 1.25 x fp32's minimum"


def per_seed(method: str, rule: str, other: str = "fp32") -> pd.DataFrame:
    """Per problem and seed: method's total bits / other's, the method's accuracies and other's (at
    its stopping step: accuracy; at the common step: accuracy_common; same rule for both; fp32 is run
    under one rate, so its rows are the same under both rules)."""
    a = runs[(runs.method == method) & (runs.rule == rule)]
    b = runs[(runs.method == other) & (runs.rule == rule)]
    m = a.merge(b, on=["problem", "seed"], suffixes=("", "_ref"))
    return m.assign(bits=m.bits_total / m.bits_total_ref)


def bits_claim(g: pd.DataFrame, bound: float = 1.0) -> list[tuple[str, dict]]:
    """Per problem: `reached_ratio` of the method's bits against the reference's (a seed where the method
    missed the target is its failure; one where only the reference missed leaves no ratio)."""
    return [(p, reached_ratio(x.bits_total, x.bits_total_ref, x.K.notna(), x.K_ref.notna(), bound=bound))
            for p, x in g.groupby("problem", sort=False)]


def bits_text(res: list[tuple[str, dict]], other: str) -> str:
    return "; ".join(f"{p}: {r['verdict']}, " + (f"{r['text']} of {other}'s bits ({1 / r['ratio']:.1f}x fewer)"
                                                 if np.isfinite(r["ratio"]) else r["text"]) for p, r in res)


def accuracy_claim(x: pd.DataFrame, key: str) -> dict:
    """Non-inferiority of the per-seed accuracy at the common step against the reference's (paired, the
    claim's one margin, alpha 0.05; a seed where the method diverged before the common step is its
    failure, one where only the reference did leaves the pair out), judged by `_rules.accuracy_verdict`:
    a sentence with no tolerance (margin 0, "no accuracy loss") is at best inconclusive."""
    return accuracy_verdict(noninferiority(x.accuracy_common.where(x.common_status == "ok"),
                                           x.accuracy_common_ref.where(x.common_status_ref == "ok"),
                                           margin=margin(key) / 100, scale=100, unit=" points"), margin(key))


def accuracy_answer(x: pd.DataFrame) -> dict:
    """The paired accuracy difference at the common step against the reference's with its 90 % interval
    over the pairs where both reached the common step (an answer: `noninferiority` at margin 0 gives the
    interval, its verdict is not used; the runs that diverged are counted apart, not dropped silently)."""
    return noninferiority(x.accuracy_common.where(x.common_status == "ok"),
                          x.accuracy_common_ref.where(x.common_status_ref == "ok"), margin=0.0, scale=100,
                          unit=" points", nonfinite="drop")


def accuracy_text(res: list[tuple[str, dict]], verdicts: bool = True) -> str:
    """Per problem: the verdict (with its reading, `_rules.no_loss_verdict`; none when `verdicts` is
    false), the mean paired difference in points with its 90 % interval, or the runs that diverged."""
    return "; ".join(f"{p}: " + (f"{r['verdict']}" + (f" ({r['reading']})" if r.get("reading") else "") + ", "
                                 if verdicts else "")
                     + (f"{r['diff']:+.2f} points [90 % interval {r['lo']:+.2f}, "
                                                 f"{r['hi']:+.2f}]" if np.isfinite(r["lo"]) else
                                                 f"diverged in {r['failed']} of {r['n'] + r['dropped']} run(s)"
                                                 if r["failed"] else f"{r['diff']:+.2f} points (no interval)")
                     + f" at step {COMMON.get(p, '?')}" for p, r in res)


ROW_COLUMNS = ["problem", "seed", "method", "rule", "lr", "K", "bits_total", "method_ref", "K_ref", "bits_total_ref",
               "accuracy_common", "common_status", "accuracy_common_ref", "common_status_ref"]


def kind_of(m: str, rule: str, proxy: bool = True) -> str:
    """TernGrad as published (MAX sharing) at fp32's rate: the paper's claim under its own rule, judged on
    a stand-in (this repository's models for AlexNet's and GoogLeNet's, bits for communication time);
    at its own tuned rate: reviewer 1 of Jiang & Agrawal's question; another sharing: tgsim's variant."""
    if m != "terngrad":
        return "tgsim variant"
    return "paper claim (proxy)" if rule == "fp32-lr" else "reviewer question"


def own_rule_only(g: pd.DataFrame, method: str, rule: str) -> tuple[pd.DataFrame, list]:
    """Under own-lr, the problems where the method's tuned rate is fp32's hold its fp32-lr runs: they are
    left out of the own-lr row (named in it) rather than counted twice. Returns (rows kept, left out)."""
    if rule != "own-lr" or "lr" not in df.columns:
        return g, []
    lr = df[df.method == method].pivot_table(index="problem", columns="rule", values="lr")
    if not {"own-lr", "fp32-lr"} <= set(lr.columns):
        return g, []
    left = sorted(lr.index[lr["own-lr"] == lr["fp32-lr"]])
    return g[~g.problem.isin(left)], left


def left_text(left: list) -> str:
    return (f"; {', '.join(left)}: the tuned rate is fp32's, so these are the fp32-lr row's runs, not counted "
            "again") if left else ""


AT_COMMON = "accuracy at the common step (fp32's step budget), not at each method's stopping step"
RULE_WORDS = {"fp32-lr": "", "own-lr": " (each method's tuned rate)"}
claims = []
# every TernGrad variant of the run (the label names its scaler sharing: MAX is the paper's)
TERN = [m for m in dict.fromkeys(df.method) if m.split("[")[0] == "terngrad"]
for m, rule in [(m, r) for m in TERN for r in rules]:
    tg, left = own_rule_only(per_seed(m, rule), m, rule)
    shown = df[df.method == m].shown.iloc[0]
    suffix = ("" if m == "terngrad" else f" [{shown}]") + RULE_WORDS[rule]
    res = bits_claim(tg)
    claims.append(claim(
        "TernGrad needs fewer bits in total to reach the loss" + suffix, words("comm"),
        f"{shown}: " + bits_text(res, "fp32") + left_text(left), combine([r["verdict"] for _, r in res]), kind=kind_of(m, rule),
        setting=f"{RULES[rule]}; {SETTING}",
        test=(res[0][1]["test"] + "; per problem, summary split when they disagree") if res else "", scale=SCALE,
        rows=tg.reindex(columns=ROW_COLUMNS)))
    f16, left = own_rule_only(per_seed(m, rule, "fp16"), m, rule)
    res = bits_claim(f16)
    claims.append(claim(
        "TernGrad's saving against fp16" + suffix, words("fp16"),
        (f"{shown}: " + bits_text(res, "fp16") + left_text(left)) if res or left else "fp16 not run in this form",
        combine([r["verdict"] for _, r in res]), kind="reviewer question" if m == "terngrad" else "tgsim variant",
        setting=f"{RULES[rule]}; {SETTING}",
        test=(res[0][1]["test"] + "; per problem, summary split when they disagree") if res else "", scale=SCALE,
        rows=f16.reindex(columns=ROW_COLUMNS)))
pq = [m for m in df.method.unique() if "pqasgd" in m]
for m in pq or ["pqasgd"]:
    g = per_seed(m, "fp32-lr")
    res = bits_claim(g, 0.05)
    claims.append(claim(
        "PQASGD needs 3-5 % of fp32's communication", words("pqasgd"),
        (f"{m}: " + bits_text(res, "fp32")) if len(g) else "PQASGD not run in this form",
        combine([r["verdict"] for _, r in res]), kind="paper claim (proxy)",
        setting="Jiang & Agrawal: CIFAR-10 and speech, 1 Gb/s cluster; here TernGrad every 4 steps, fp32's rate; "
                + SETTING, test=(res[0][1]["test"] + " (5 %: the claim read as at most 5 %, so a ratio under 3 % also confirms it, fewer "
                "bits being its direction); per problem") if res else "",
        scale=SCALE, rows=g.reindex(columns=ROW_COLUMNS)))
    # reviewer 3 of Jiang & Agrawal asks whether periodic averaging diverged and for the accuracies: an
    # answer (the accuracies, their difference to fp32's and the divergences), not a claim that can fail;
    # Jiang & Agrawal's own words on accuracy are not among the texts at hand
    acc = [(p, accuracy_answer(x)) for p, x in g.groupby("problem", sort=False)]
    div = {p: (int((x.common_status != "ok").sum()), len(x)) for p, x in g.groupby("problem", sort=False)}
    claims.append(claim(
        "PQASGD's accuracy against fp32's", words("diverge"),
        (f"{m}, accuracy at the common step minus fp32's (same seed): " + "; ".join(
            f"{p}: diverged before the common step in {div[p][0]} of {div[p][1]} run(s), "
            + accuracy_text([(p, r)], verdicts=False).split(": ", 1)[1] for p, r in acc))
        if len(g) else "PQASGD not run in this form",
        None, kind="reviewer question", setting=SETTING,
        test=("an answer to the question (the accuracies and the divergences), no verdict: the paired difference "
              "with the 90 % t-interval of a one-sided test at alpha 0.05 (" + acc[0][1]["test"].split(";")[0]
              + "), a diverged run counted, per problem, " + AT_COMMON) if acc else "", scale=SCALE,
        rows=g.reindex(columns=ROW_COLUMNS)))
short = df[df.reached < df.seeds]
claims.append(claim(
    "every method reaches fp32's loss target", words("fixed-error"),
    "; ".join(f"{p}, {r}: " + ", ".join(f"{x.method} missed ({x.seeds - x.reached}/{x.seeds})" for x in d.itertuples())
              for (p, r), d in short.groupby(["problem", "rule"], sort=False)) or "all seeds of all methods",
    None, kind="reviewer question", setting=SETTING,
    test="count of seeds that reached the target (an answer to the request: no verdict)", scale=SCALE,
    rows=df[["problem", "rule", "method", "reached", "seeds"]]))
for key in ("no-loss", "under-2"):
    for m, rule in [(m, r) for m in TERN for r in rules]:
        tg, left = own_rule_only(per_seed(m, rule), m, rule)
        shown = df[df.method == m].shown.iloc[0]
        res = [(p, accuracy_claim(x, key)) for p, x in tg.groupby("problem", sort=False)]
        claims.append(claim(
            ("no accuracy loss (AlexNet's sentence)" if key == "no-loss" else
             "accuracy loss under 2 points (GoogLeNet's sentence)")
            + ("" if m == "terngrad" else f" [{shown}]") + RULE_WORDS[rule],
            words(key), f"{shown}: " + accuracy_text(res) + left_text(left), combine([r["verdict"] for _, r in res]),
            kind=kind_of(m, rule, proxy=True),
            setting=f"the paper: AlexNet and GoogLeNet on ImageNet; here {RULES[rule]}; {SETTING}",
            test=(res[0][1]["test"] + f"; {reading(key)}; per problem, summary split when they disagree, "
                  + AT_COMMON) if res else "", scale=SCALE, rows=tg.reindex(columns=ROW_COLUMNS)))
save(fig, "fig08_compare_bits", df, QUICK, claims)
