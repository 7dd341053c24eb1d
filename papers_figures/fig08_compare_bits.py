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
# scaler sharing (MAX, the paper's, or MEAN). Verdicts: one-sided t-tests on the per-seed ratios
# (α = 0.05), against fp32 and against fp16; non-inferiority of the accuracy at the common step with
# a 1-point margin (α = 0.05; a run diverged before it fails). `--quick`: 1 seed, 3 methods (no
# fp16), 100 / 30 steps.

# %%
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, compare_outputs, t_half_width, with_coding  # noqa: E402
from _theme import claim, plt, save, seeds_note, sns, theme  # noqa: E402
from tgsim.analysis.verdicts import noninferiority  # noqa: E402

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

# %% figure: per rule (rows), (a) total bits relative to fp32 (dashed: fp16's), (b) accuracy at the common step
fig, axes = plt.subplots(len(rules), 2, figsize=(13, 4.6 * len(rules)), squeeze=False)
order = list(dict.fromkeys(df.shown))
for i, rule in enumerate(rules):
    d0 = df[df.rule == rule]
    ax = axes[i, 0]
    sns.barplot(data=d0, x="shown", y="ratio_mean", hue="problem", order=order, ax=ax, errorbar=None)
    for bars, (_, d) in zip(ax.containers, d0.groupby("problem", sort=False)):   # 95 % interval over seeds
        d = d.set_index("shown")
        for b in bars:   # a method that missed the target on some seed has no bar (ratio NaN)
            x = b.get_x() + b.get_width() / 2
            if order[int(round(x))] not in d.index:
                continue
            r = d.loc[order[int(round(x))]]
            if pd.notna(r.ratio_mean):
                ax.errorbar([x], [r.ratio_mean], yerr=[[r.err_lo], [r.err_hi]], fmt="none", color="black", lw=1)
        f16 = d.ratio_mean[d.method == "fp16"]
        if len(bars) and len(f16) and pd.notna(f16.iloc[0]):   # fp16's ratio: the saving against fp16 is the gap
            ax.axhline(f16.iloc[0], color=bars[0].get_facecolor(), ls="--", lw=1)
    ax.set(yscale="log", xlabel="method", ylabel="bits up + down to the target / fp32's  (ratio)",
           title=f"({'ac'[i]}) {rule}: communication to 1.25 x fp32's minimum loss\n"
                 f"(95 % t-interval; {FP16_NOTE}no bar: target missed on some seed)")
    ax.axhline(1, color="black", lw=0.8)
    ax = axes[i, 1]
    sns.barplot(data=d0, x="shown", y="accuracy_common_mean", hue="problem", order=order, ax=ax, errorbar=None)
    for bars, (_, d) in zip(ax.containers, d0.groupby("problem", sort=False)):   # 95 % t-interval over seeds
        d = d.set_index("shown")
        for b in bars:   # no bar: some seed diverged before the common step
            x = b.get_x() + b.get_width() / 2
            r = d.loc[order[int(round(x))]] if order[int(round(x))] in d.index else None
            if r is not None and pd.notna(r.accuracy_common_mean):
                ax.errorbar([x], [r.accuracy_common_mean], yerr=[[r.acc_lo], [r.acc_hi]], fmt="none", color="black",
                            lw=1)
    ax.set(xlabel="method", ylabel="test accuracy (fraction)", ylim=(0, 1),
           title=f"({'bd'[i]}) {rule}: test accuracy at the common step ({common_text})\n"
                 f"(fp32's step budget; 95 % t-interval; no bar: diverged on some seed)")
    ax.get_legend().remove()
for ax in axes.flat:    # every method's tick, also one whose bars are all missing (nan)
    ax.set_xticks(range(len(order)), order)
    ax.set_xlim(-0.5, len(order) - 0.5)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right", rotation_mode="anchor")
h, lab = axes[0, 0].get_legend_handles_labels()
for ax in axes[:, 0]:
    ax.get_legend().remove()
fig.legend(h, lab, loc="lower center", ncol=len(lab), title="problem")
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


def below(x, bound: float) -> dict:
    """One-sided t-test of mean(x) < bound at alpha 0.05 (tgsim.analysis.verdicts.noninferiority on
    bound - x with margin 0)."""
    r = noninferiority(bound - np.asarray(x, float), margin=0.0, nonfinite="fail")
    n = r["n"] + r["dropped"]
    return dict(r, test=f"one-sided t-test of the mean ratio < {bound:g} (the 90 % interval's upper end), "
                        f"alpha 0.05, {n} seed(s) per problem (a seed that missed the target fails the claim)")


def ratio_text(x) -> str:
    x = np.asarray(x, float)
    return f"{np.nanmean(x):.3g} ± {t_half_width(x):.2g} of the bits ({1 / np.nanmean(x):.1f}x fewer)"


def joint(results: list[dict]) -> str:
    v = [r["verdict"] for r in results]
    return "confirmed" if v and all(x == "confirmed" for x in v) else \
        "not confirmed" if "not confirmed" in v else "inconclusive" if v else "n/a"


def reached(g: pd.DataFrame) -> pd.Series:
    """The per-seed bit ratios, +inf where the method missed the target (K NaN)."""
    return g.bits.where(g.K.notna(), np.inf)


def accuracy_test(x: pd.DataFrame) -> dict:
    """Non-inferiority of the per-seed accuracy at the common step against the reference's (paired,
    1-point margin, alpha 0.05; a seed without it, diverged before the common step, fails the claim)."""
    return noninferiority(x.accuracy_common.where(x.common_status == "ok"),
                          x.accuracy_common_ref.where(x.common_status_ref == "ok"), margin=0.01, scale=100,
                          unit=" points", nonfinite="fail")


def accuracy_text(x: pd.DataFrame) -> str:
    """The mean difference of the accuracy at the common step (points), with the step and how many seeds
    were measured there."""
    ok = (x.common_status == "ok") & (x.common_status_ref == "ok")
    d = 100 * (x.accuracy_common - x.accuracy_common_ref)[ok]
    return (f"{d.mean():+.1f} points at step {COMMON.get(x.problem.iloc[0], '?')} (common to all methods; "
            f"{int(ok.sum())}/{len(x)} seeds measured there)")


AT_COMMON = "accuracy at the common step (fp32's step budget), not at each method's stopping step"
claims = []
# every TernGrad variant of the run (the label names its scaler sharing: MAX is the paper's)
TERN = [m for m in dict.fromkeys(df.method) if m.split("[")[0] == "terngrad"]
for m, rule in [(m, r) for m in TERN for r in rules]:
    tg = per_seed(m, rule)
    shown = df[df.method == m].shown.iloc[0]
    suffix = ("" if m == "terngrad" else f" [{shown}]") + ("" if rule == "fp32-lr" else " (each method's tuned rate)")
    res = [below(reached(g), 1.0) for _, g in tg.groupby("problem")]
    claims.append(claim(
        "TernGrad needs fewer bits in total to reach the loss" + suffix,
        '"Our approach requires only three numerical levels {-1,0,1}, which can aggressively reduce the '
        'communication time." (abstract)',
        f"{shown}: " + "; ".join(f"{p}: {ratio_text(g.bits)} vs fp32 (K {g.K.mean():.0f} vs {g.K_ref.mean():.0f} "
                                 f"steps; reached {int(g.K.notna().sum())}/{len(g)})"
                                 for p, g in tg.groupby("problem", sort=False)),
        joint(res), kind="paper claim", setting=f"{RULES[rule]}; {SETTING}",
        test=(res[0]["test"] + " each") if res else "", scale=SCALE))
    f16 = per_seed(m, rule, "fp16")
    res = [below(g.bits.where(g.K.notna() & g.K_ref.notna(), np.inf), 1.0) for _, g in f16.groupby("problem")]
    claims.append(claim(
        "TernGrad's saving against fp16" + suffix,
        "paraphrase: reviewer 2 of TernGrad (NIPS 2017) asks for the saving against 16-bit floats, not 32-bit",
        "; ".join(f"{p}: {shown} sends {ratio_text(g.bits)} vs fp16" for p, g in f16.groupby("problem", sort=False))
        or "fp16 not run in this form", joint(res), kind="paper claim",
        setting=f"{RULES[rule]}; {SETTING}", test=(res[0]["test"] + " each") if res else "", scale=SCALE))
pq = [m for m in df.method.unique() if "pqasgd" in m]
for m in pq or ["pqasgd"]:
    g = per_seed(m, "fp32-lr")
    res = [below(reached(x), 0.05) for _, x in g.groupby("problem")]
    claims.append(claim(
        "PQASGD needs 3-5 % of fp32's communication",
        '"our PQASGD can converge as fast as full-communication SGD with only 3%-5% communication data size." '
        "(Jiang & Agrawal, abstract)",
        "; ".join(f"{p}: {m} sends {100 * np.nanmean(x.bits):.2g} % of fp32's bits (reached {int(x.K.notna().sum())}"
                  f"/{len(x)} seeds)" for p, x in g.groupby("problem", sort=False)) or "PQASGD not run in this form",
        joint(res), kind="paper claim",
        setting="Jiang & Agrawal: CIFAR-10 and speech, 1 Gb/s cluster; here TernGrad every 4 steps, fp32's rate; "
                + SETTING, test=(res[0]["test"].replace("< 0.05", "< 0.05 (5 %)") + " each") if res else "",
        scale=SCALE))
    acc = [accuracy_test(x) for _, x in g.groupby("problem")]
    claims.append(claim(
        "PQASGD's accuracy against fp32's",
        "paraphrase: reviewer 3 of Jiang & Agrawal asks whether periodic averaging diverges and for the accuracies",
        (f"{m}: " + "; ".join(f"{p}: {accuracy_text(x)}" for p, x in g.groupby("problem", sort=False))) if len(g)
        else "PQASGD not run in this form",
        joint(acc), kind="paper claim", setting=SETTING,
        test=(acc[0]["test"] + " each, " + AT_COMMON) if acc else "", scale=SCALE))
claims.append(claim(
    "every method reaches fp32's loss target", "paraphrase: reviewers of both papers ask whether the compressed "
    "methods reach the same error (total communication for a fixed error)",
    "; ".join(f"{p}, {r}: " + ", ".join(f"{x.method} {x.reached}/{x.seeds}" for x in d.itertuples() if x.reached < x.seeds)
              for (p, r), d in df.groupby(["problem", "rule"], sort=False) if (d.reached < d.seeds).any())
    or "all seeds of all methods", bool((df.reached == df.seeds).all()), kind="paper claim",
    setting=SETTING, test="count of seeds that reached the target (all must)", scale=SCALE))
for m, rule in [(m, r) for m in TERN for r in rules]:
    tg = per_seed(m, rule)
    shown = df[df.method == m].shown.iloc[0]
    res = [accuracy_test(x) for _, x in tg.groupby("problem")]
    claims.append(claim(
        "at no loss of accuracy" + ("" if m == "terngrad" else f" [{shown}]")
        + ("" if rule == "fp32-lr" else " (each method's tuned rate)"),
        '"applying TernGrad on AlexNet does not incur any accuracy loss and can even improve accuracy. The '
        'accuracy loss of GoogLeNet induced by TernGrad is less than 2% on average." (abstract)',
        f"{shown}: " + "; ".join(f"{p}: {accuracy_text(x)}" for p, x in tg.groupby("problem", sort=False)),
        joint(res), kind="paper claim",
        setting=f"the paper: AlexNet and GoogLeNet on ImageNet; here {RULES[rule]}; {SETTING}",
        test=(res[0]["test"] + " each, " + AT_COMMON) if res else "",
        scale=SCALE))
save(fig, "fig08_compare_bits", df, QUICK, claims)
