# %% [markdown]
# # Fig. 3 (tgsim): accuracy against workers at a fixed total batch, per scaler-sharing mode
#
# TernGrad's Fig. 3 / Table 1: with N workers at a fixed total batch, TernGrad stays within about
# 0.5 points of fp32's accuracy (its Table 1: CIFAR-10, up to 8 workers) with the scaler shared as
# the MAX over workers. docs/THEORY.md §1.5 measures where MAX sharing collapses.
# (A paraphrase of the paper's body, not checked here: only the TernGrad abstract and the public
# reviews were at hand.)
#
# Here: the sweep of papers_figures/terngrad_workers_scaling.py (MNIST-1D convnet, total batch 256,
# N = 2..64, momentum 0.9 and plain SGD, fp32 against TernGrad with the scaler shared as the MAX,
# the MEAN or not at all, 3 seeds, 144 runs). It is not rerun here in full: the
# full form reads its CSV (out/terngrad_workers_scaling.csv) when present and runs the script only
# when it is missing; `--quick` runs the script's own --quick form (10 steps, 1 seed: a smoke run
# whose accuracies mean nothing). Panels (a), (c): accuracy with momentum and with plain SGD;
# (b), (d): the runs' largest shared/median scaler ratio. Row (e)-(h): one run's collapse
# diagnostics against its accuracy, step by step: the demo recipe (tgsim/configs/demo.toml: 8
# workers, total batch 64, momentum 0.9, lr 0.1, 4000 steps) with the scaler shared as the MAX (it
# collapses) and as the MEAN, from each run's metrics.csv: test accuracy, the largest shared/median
# scaler ratio over layers, the largest noise-to-signal over layers, and the largest fraction of
# dead units (elements with a zero gradient on every worker); quick: 40 steps. The same recipe runs
# with MAX, MEAN and fp32 over 3 seeds (quick: 1) for the multi-seed collapse row. Verdicts: TOST
# equivalence to fp32's accuracy per (optimizer, N), paired by seed, margin 1 point, α = 0.05
# (tgsim.analysis.verdicts.equivalence; "inconclusive" with the seeds a decision would need); the
# bands are 90 % t-intervals (the TOST's); a diverged run is drawn as x at 0 and counted. Run times:
# docs/MEASUREMENTS.md.

# %%
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import NullLocator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import collapse_signs, command_line, t_band, train_many  # noqa: E402
from _rules import diverged_note, diverged_summary, spread_checked  # noqa: E402
from _theme import UNCHECKED, claim, codec_color, log_ticks, plt, save, seeds_note, source, sns  # noqa: E402
from reviewers import margin, reading, words  # noqa: E402
from tgsim.analysis.verdicts import combine, equivalence  # noqa: E402

QUICK, OUT = command_line("Accuracy against workers at a fixed total batch, per sharing mode (from the sweep's CSV).")
csv = OUT / "terngrad_workers_scaling.csv"
if QUICK or not csv.exists():
    subprocess.run([sys.executable, str(HERE / "terngrad_workers_scaling.py"), *(["--quick"] if QUICK else [])],
                   check=True, env={**os.environ, "TGSIM_FIGURES_OUT": str(OUT.parent if QUICK else OUT)})
df = pd.read_csv(csv)

# %% the demo recipe (8 workers x 8 samples) with MAX and MEAN sharing and fp32, over seeds; the first
# seed's runs give the collapse diagnostics of row (e)-(h)
demo = tomllib.loads((HERE.parent / "tgsim" / "configs" / "demo.toml").read_text())
STEPS_C = 40 if QUICK else demo["run"]["steps"]
SEEDS_C = (0,) if QUICK else (0, 1, 2)
SHARING = ("max", "mean")
VARIANTS_C = (*SHARING, "fp32")
jobs = [(demo, {"run": {"name": f"collapse-{m}", "seed": seed, "steps": STEPS_C, "eval_every": max(1, STEPS_C // 20),
                        "log_every": max(1, STEPS_C // 40), "checkpoint_every": 0},
                "codec": {"name": "fp32"} if m == "fp32" else {"sharing": m},
                "schedule": {"every": int(STEPS_C * 0.75)}}) for seed in SEEDS_C for m in VARIANTS_C]
all_runs = train_many(jobs, "collapse runs")
recipe = pd.DataFrame([{"variant": m, "seed": seed, "test_accuracy": r["test_accuracy"], "diverged": r["diverged"],
                        **collapse_signs(r["out"])}
                       for (seed, m), r in zip([(s_, m_) for s_ in SEEDS_C for m_ in VARIANTS_C], all_runs)])
runs = all_runs[:len(SHARING)]           # the first seed's MAX and MEAN runs
diag = []
for m, r in zip(SHARING, runs):
    met = pd.read_csv(Path(r["out"]) / "metrics.csv")
    acc = met[(met.split != "train") & (met.layer == "model")][["step", "accuracy"]]
    lay = met[(met.split == "train") & (met.layer != "model")].groupby("step")[
        ["scaler_ratio", "noise_to_signal", "zero_grad_fraction"]].max()
    d = lay.reset_index().merge(acc, on="step", how="outer").sort_values("step")
    diag.append(d.assign(variant=f"terngrad, {m}"))
diag = pd.concat(diag, ignore_index=True)

# %% figure: (a) accuracy gap to fp32, (b) MAX scaler ratio, one row per optimizer; (c) one run's diagnostics
MARGIN = margin("workers") / 100          # the claim's one margin (reviewers.WORDS), as a fraction
fig = plt.figure(figsize=(13, 11.5))
grid = fig.add_gridspec(3, 4, height_ratios=[1, 1, 0.85], hspace=0.62, wspace=0.7, top=0.91, bottom=0.13)
axes = np.empty((2, 2), dtype=object)
for i in range(2):
    axes[i, 0] = fig.add_subplot(grid[i, 0:2], sharex=axes[0, 0] if i else None)
    axes[i, 1] = fig.add_subplot(grid[i, 2:4], sharex=axes[0, 0])
axc = [fig.add_subplot(grid[2, k]) for k in range(4)]
workers = sorted(df.workers.unique())
variants = list(dict.fromkeys(df.variant))
# one colour per codec in every figure (_theme.CODEC_COLORS): TernGrad's MAX sharing (the paper's) orange, MEAN
# dark brown, no sharing (each worker's own scaler) teal, fp32 black
SHARE_LABEL = {"fp32": "fp32", "max": "terngrad", "mean": "terngrad[sharing=mean]", "none": "terngrad[sharing=none]"}
pal = {v: codec_color(SHARE_LABEL.get(v.split(", ")[-1], v)) for v in variants}
pal.update({f"terngrad, {m}": codec_color(SHARE_LABEL[m]) for m in ("max", "mean")})
marks = dict(zip(variants, ["o", "X", "s", "P", "D"]))
# panels (a), (c): the axis shows the bulk of the per-run gaps; a run further than OUTLIER points from fp32's
# same seed is an outlier: drawn as a triangle at the axis's edge and named with its value, and so is a
# setting's mean beyond the axis (fp32's own failed run, 0.663 at N = 2, made the axis span -21..+28)
OUTLIER = 10.0


def gap_limits(gaps, margin_points: float) -> tuple[float, float]:
    """(low, high) of a gap axis: the finite per-run gaps within OUTLIER points of 0, padded by 1 point,
    and at least ±3 margins."""
    g = np.asarray(gaps, float)
    bulk = g[np.isfinite(g) & (np.abs(g) <= OUTLIER)]
    lo = min(-3 * margin_points, float(bulk.min()) - 1 if bulk.size else -3 * margin_points)
    hi = max(3 * margin_points, float(bulk.max()) + 1 if bulk.size else 3 * margin_points)
    return lo, hi


def mark_beyond(ax, d, lo: float, hi: float, letter: str) -> str:
    """On a gap panel with y limits (lo, hi): each finite run beyond them a filled triangle at the edge,
    each setting mean beyond them a hollow one (its variant's colour, side by side per variant); returns
    the note naming every such run (N, seed, variant, its gap, fp32's accuracy) and every such mean,
    printed below the figure (a box inside the panel covered its data)."""
    out = d[np.isfinite(d.gap_points) & ((d.gap_points < lo) | (d.gap_points > hi))]
    order = {v: k for k, v in enumerate(variants)}
    for r in out.itertuples():
        up = r.gap_points > hi
        x = r.workers * np.exp(0.06 * (order.get(r.variant, 0) - 1))
        ax.scatter([x], [hi if up else lo], marker="^" if up else "v", s=55, color=pal[r.variant], zorder=7,
                   clip_on=False, edgecolor="black", linewidth=0.5)
    means = d.groupby(["workers", "variant"], sort=True).gap_points.mean()
    off = means[(means < lo) | (means > hi)]
    for (n, v), x in off.items():
        up = x > hi
        ax.scatter([n * np.exp(0.06 * (order.get(v, 0) - 1))], [hi if up else lo], marker="^" if up else "v", s=70,
                   facecolor="white", edgecolor=pal[v], linewidth=1.5, zorder=7, clip_on=False)
    parts = []
    for (n, seed), g in out.groupby(["workers", "seed"], sort=True):
        parts.append(f"N = {n}, seed {seed}: " + ", ".join(f"{v.split(', ')[-1]} {x:+.1f}"
                                                          for v, x in zip(g.variant, g.gap_points))
                     + f" (fp32 {g.ref.iloc[0]:.3f})")
    text = ("runs beyond the axis (▲▼): " + "; ".join(parts) if parts else "") + \
        (("\n" if parts else "") + "means beyond the axis: " + "; ".join(
            f"N = {n}: " + ", ".join(f"{v.split(', ')[-1]} {x:+.1f}" for (_, v), x in g.items())
            for n, g in off.groupby(level="workers")) if len(off) else "")
    return f"({letter}) " + text.replace("\n", "; ") if text else ""


fp32_acc = df[df.variant == "fp32"].set_index(["optimizer", "workers", "seed"]).test_accuracy
gap = df[df.variant != "fp32"].assign(
    ref=lambda d: fp32_acc.reindex(pd.MultiIndex.from_frame(d[["optimizer", "workers", "seed"]])).to_numpy())
gap["gap_points"] = 100 * (gap.test_accuracy - gap.ref)      # the paired difference the verdicts test
BEYOND = []          # the notes on what lies beyond the gap axes, printed below the figure
RINGED = []          # per gap panel: its diverged runs, named in its title
DODGE = 0.05         # the variants' intervals side by side (log x): bands of three colours mixed into one
for i, (opt, d) in enumerate(gap.groupby("optimizer", sort=False)):
    ok = d.dropna(subset=["gap_points"])
    rank = {v: k for k, v in enumerate(dict.fromkeys(ok.variant))}
    ok = ok.assign(x=ok.workers * np.exp(DODGE * (ok.variant.map(rank) - 1)))
    sns.lineplot(data=ok, x="x", y="gap_points", hue="variant", style="variant", markers=marks, dashes=False,
                 errorbar=None, ax=axes[i, 0], legend=i == 0, palette=pal)
    for (v, x), g in ok.groupby(["variant", "x"]):      # the verdict's 90 % t-interval, as bars (no data line)
        band = t_band(g.gap_points) if len(g) > 1 else (np.nan, np.nan)
        if np.all(np.isfinite(band)):
            m = g.gap_points.mean()
            axes[i, 0].errorbar([x], [m], yerr=[[m - band[0]], [band[1] - m]], fmt="none", ecolor=pal[v], capsize=3,
                                elinewidth=1.4, zorder=2)
    axes[i, 0].axhspan(-MARGIN * 100, MARGIN * 100, color="0.85", zorder=0, label="_margin")
    axes[i, 0].axhline(0, color="black", lw=0.8)
    bad = d[d.test_accuracy.isna()]          # diverged runs (the method's failure): drawn at the bottom, counted
    RINGED.clear()
    lo, hi = gap_limits(ok.gap_points, MARGIN * 100)
    axes[i, 0].set_ylim(lo, hi)
    BEYOND.append(mark_beyond(axes[i, 0], ok, lo, hi, "ac"[i]))
    n_out = int(((ok.gap_points < lo) | (ok.gap_points > hi)).sum())
    if len(bad):
        axes[i, 0].scatter(bad.workers, np.full(len(bad), lo), marker="x", s=60, color=[pal[v] for v in bad.variant],
                           zorder=6, clip_on=False)
        # the verdict counts a diverged run as its setting's failure, while the line's mean there rests on the
        # finite runs only: ring that mean, and name the run in the title (a note inside the panel crossed lines)
        for (v, n), g in bad.groupby(["variant", "workers"]):
            fin = ok[(ok.variant == v) & (ok.workers == n)]
            if len(fin):
                axes[i, 0].scatter([fin.x.iloc[0]], [fin.gap_points.mean()], s=260, facecolor="none",
                                   edgecolor="crimson", linewidth=1.6, zorder=8)
            RINGED.append(f"{v.split(', ')[-1].upper()} at N = {n}, seed " + ", ".join(str(x) for x in g.seed)
                          + f": its setting fails; red ring: the mean of its {len(fin)} finite run(s)")
    axes[i, 0].set(ylabel="accuracy - fp32's,\nsame seed (points)",
                   title=f"({'ac'[i]}) {opt}: gap to fp32's accuracy\n(mean, 90 % t-interval: the verdict's; "
                         f"grey: the ±{MARGIN * 100:g}-point margin;\nx at the bottom: a diverged run ({len(bad)})"
                         + (f"; ▲▼ at the edge: a run > {OUTLIER:g} points off ({n_out}))" if n_out else ")")
                         + "".join(f"\n{r}" for r in RINGED))
    axes[i, 0].title.set_fontsize(10)
    r = d[d.variant.str.contains("max|mean")]
    sns.lineplot(data=r, x="workers", y="ratio_max", hue="variant", style="variant", markers=marks, dashes=False,
                 errorbar=None, ax=axes[i, 1], legend=False, palette=pal)
    axes[i, 1].set(yscale="log", ylabel="largest shared / median\nscaler (ratio)", title=f"({'bd'[i]}) {opt}: shared scaler")
for ax in axes.flat:
    ax.set(xscale="log", xlabel=f"workers N (total batch {int((df.workers * df.batch_per_worker).iloc[0])})")
    ax.set_xticks(workers, [str(n) for n in workers])
    ax.xaxis.set_minor_locator(NullLocator())
for i, (opt, d) in enumerate(df.groupby("optimizer", sort=False)):   # labelled ticks that cover the ratios
    log_ticks(axes[i, 1], "y", d[d.variant.str.contains("max|mean")].ratio_max)
h, lab = axes[0, 0].get_legend_handles_labels()
axes[0, 0].get_legend().remove()
fig.legend(h, lab, loc="lower center", bbox_to_anchor=(0.5, 0.025), ncol=len(lab), title="variant (scaler sharing)")
if any(BEYOND):
    import textwrap
    fig.text(0.02, 0.002, textwrap.fill("Beyond the gap axes (▲ run, △ mean; values in the CSV): "
                                        + "; ".join(b for b in BEYOND if b), 190), fontsize=7, ha="left", va="bottom")
for ax, letter, (col, label) in zip(axc, "efgh", [("accuracy", "test accuracy (fraction)"),
                                                  ("scaler_ratio", "shared / median scaler\n(largest layer)"),
                                                  ("noise_to_signal", "noise-to-signal\n(largest layer)"),
                                                  ("zero_grad_fraction", "dead units\n(largest layer, fraction)")]):
    ax.set_title(f"({letter})", loc="left", fontsize=10)
    d = diag.dropna(subset=[col])
    order_c = sorted(d.variant.unique(), key=lambda v: v.endswith("max"))      # MAX last: drawn on top
    for v in order_c:
        dv = d[d.variant == v]
        ax.plot(dv.step, dv[col], color=pal[v], lw=1.6 if v.endswith("max") else 1.0,
                alpha=1.0 if v.endswith("max") else 0.75, zorder=3 if v.endswith("max") else 2)
    ax.set(xlabel="training step (iterations)", ylabel=label)
    if col in ("scaler_ratio", "noise_to_signal"):
        ax.set_yscale("log")
        log_ticks(ax, "y", d[col])
pos = axc[0].get_position()
fig.text(pos.x0, pos.y1 + 0.035, f"Row (e)-(h), one run each (seed {SEEDS_C[0]}): the demo recipe ({STEPS_C} steps), "
         "MAX (orange) vs MEAN (dark brown) sharing", ha="left", va="bottom", fontsize=10)
steps = int(df.steps.iloc[0])
fig.suptitle(f"MNIST-1D convnet (23,882 parameters), {steps} steps, {seeds_note(df.seed)}; row (e)-(h): one run each, "
             f"seed {SEEDS_C[0]}{' (quick: a smoke run)' if QUICK else ''}", y=0.985)

# %% claims, from the data: TOST equivalence of each variant's accuracy to fp32's, paired by seed, per
# (optimizer, N), the claim's one margin, alpha 0.05; a diverged run is the failure of the method that
# diverged (tgsim.analysis.verdicts, nonfinite="attribute"): in TernGrad's arm it refutes that setting,
# in fp32's arm it leaves the pair out
SETTING = ("the paper: CIFAR-10, up to 8 workers, MAX sharing (paraphrase of its body, " + UNCHECKED + "; the "
           "seeds say only that the scalar is shared among workers, its reviewer 2); here MNIST-1D convnet, total batch "
           f"{int((df.workers * df.batch_per_worker).iloc[0])}, N = {min(workers)}..{max(workers)}, {steps} steps")
div = df[df.test_accuracy.isna()].groupby(["variant", "optimizer", "workers"]).size()
VARIANT_KIND = {"max": ("paper claim (proxy)", "TernGrad as published (MAX sharing)"),   # Table 1: CIFAR-10
                "mean": ("tgsim variant", "tgsim's MEAN sharing"), "none": ("tgsim variant", "no sharing")}
fp_c = recipe[recipe.variant == "fp32"].set_index("seed").test_accuracy
lost_c = {m: recipe[recipe.variant == m].assign(
    gone=lambda d: (d.test_accuracy.to_numpy() < fp_c.reindex(d.seed).to_numpy() - 0.05) | d.dying.astype(bool)
    | d.test_accuracy.isna()) for m in SHARING}
n_max = int(lost_c["max"].gone.sum())
# fp32's own outliers: a finite fp32 run more than 10 points below its setting's median fp32 run
fp = df[df.variant == "fp32"].assign(med=lambda d: d.groupby(["optimizer", "workers"]).test_accuracy.transform("median"))
fp_low = fp[fp.test_accuracy < fp.med - 0.10]
claims = []
for v in [x for x in df.variant.unique() if x != "fp32"]:
    res = []
    finite_only = {}  # per setting: the verdict of its finite runs alone (a diverged pair left out)
    for (opt, n), d in df.groupby(["optimizer", "workers"], sort=False):
        a = d[d.variant == v].set_index("seed").test_accuracy
        b = d[d.variant == "fp32"].set_index("seed").test_accuracy.reindex(a.index)
        res.append((opt, n, spread_checked(equivalence(a.to_numpy(), b.to_numpy(), margin=MARGIN, scale=100,
                                                       unit=" points"))))
        finite_only[(opt, n)] = equivalence(a.to_numpy(), b.to_numpy(), margin=MARGIN, nonfinite="drop")
    verdicts = [r["verdict"] for _, _, r in res]
    joint = combine(verdicts, every=True)
    kind, what = VARIANT_KIND.get(v.split(", ")[-1], ("tgsim variant", v))
    finite = [x for x in res if np.isfinite(x[2]["diff"])]
    worst = min(finite, key=lambda x: x[2]["diff"]) if finite else None
    need = [r["seeds_needed"] for _, _, r in res if r["verdict"] == "inconclusive"]
    failed = [(o, n, r["failed"]) for o, n, r in res if r["failed"]]
    ref_failed = sum(r["ref_failed"] for _, _, r in res)
    settings = [dict(label=f"N = {n} ({o})", verdict=r["verdict"], failed=r["failed"],
                     finite_verdict=finite_only[(o, n)]["verdict"], finite_n=finite_only[(o, n)]["n"])
                for o, n, r in res]
    n_runs = int((df.variant == v).sum())
    note = diverged_note(settings, n_runs)
    # the summary's words beside the verdict: what it hinges on (the diverged runs, each named)
    gone = df[(df.variant == v) & df.test_accuracy.isna()]
    short = diverged_summary(settings, gone[["workers", "optimizer", "seed"]].to_dict("records"), n_runs)
    claims.append(claim(
        f"{what}: within {MARGIN * 100:g} point of fp32 at every N",
        words("workers"),
        f"{verdicts.count('confirmed')} settings equivalent, {verdicts.count('not confirmed')} not, "
        f"{verdicts.count('inconclusive')} undecided of {len(res)}"
        + (f"; diverged (its failure): " + ", ".join(f"N = {n} ({o}) {k} run(s)" for o, n, k in failed)
           if failed else "")
        + (f"; worst finite gap {worst[2]['diff']:+.1f} points "
           + (f"[{worst[2]['lo']:+.1f}, {worst[2]['hi']:+.1f}] " if np.isfinite(worst[2]["lo"]) else "(no interval) ")
           + f"at N = {worst[1]} ({worst[0]})" if worst else "")
        + (f"; undecided settings need up to {max(x for x in need if x)} seeds at the observed spread"
           if any(need) else "")
        + (f"; {need.count(None)} undecided setting(s) no number of seeds would confirm (|gap| >= margin, or "
           "fewer than 2 seeds: no spread)" if None in need else "")
        + (f"; {ref_failed} pair(s) left out: fp32 diverged (fp32's failure)" if ref_failed else "")
        + "".join(f"; N = {n} ({o}): undecided, {r['reading']} (gap {r['diff']:+.1f} points)"
                  for o, n, r in res if "reading" in r)
        + ("; " + note if note else "")
        + ("; fp32's own low runs (kept in their pairs, so their gaps favour the method): " + ", ".join(
            f"N = {r.workers} ({r.optimizer}) seed {r.seed}: {r.test_accuracy:.3f} against its setting's median "
            f"{r.med:.3f}" for r in fp_low.itertuples()) if len(fp_low) else "")
        + (f"; the demo recipe (8 workers x 8 samples, momentum 0.9): MAX collapsed in {n_max} of "
           f"{len(lost_c['max'])} runs (self-check row below)" if v.split(", ")[-1] == "max" else ""),
        joint, kind=kind, setting=SETTING, note=short,
        test=f"TOST equivalence (paired t) per (optimizer, N), {reading('workers')}, alpha 0.05, "
             f"{df.seed.nunique()} seed(s); a diverged run fails its own method; a setting whose usable pairs have "
             "no spread (a zero-width interval) is undecided; confirmed when every setting is, not confirmed when "
             "any is",
        scale="convnet", rows=gap[gap.variant == v][["variant", "optimizer", "workers", "seed", "test_accuracy",
                                                     "ref", "gap_points", "diverged"]]
        .rename(columns={"ref": "fp32_accuracy"})))
claims.append(claim("diverged runs, by the method that diverged", source("tgsim", where="sweep's runs"),
                    "; ".join(f"{v}, {o}, N = {n}: {k}" for (v, o, n), k in div.items()) or "none",
                    None, kind="self-check", setting=SETTING, scale="convnet"))
mx = df[df.variant.str.contains("max")].groupby("workers").ratio_max.median()
claims.append(claim("MAX sharing's scaler grows with N", source("tgsim", where="measurement"),
                    f"median largest shared/median ratio x{mx.iloc[0]:.3g} at N = {mx.index[0]}, x{mx.iloc[-1]:.3g} "
                    f"at N = {mx.index[-1]}", None, kind="self-check", setting=SETTING, scale="convnet"))
small = df[df.variant.str.contains("max") & (df.batch_per_worker <= 8)]
fp_small = df[(df.variant == "fp32") & (df.batch_per_worker <= 8)].set_index(["optimizer", "workers", "seed"])
lost = (small.set_index(["optimizer", "workers", "seed"]).test_accuracy
        < fp_small.test_accuracy.reindex(small.set_index(["optimizer", "workers", "seed"]).index) - 0.05).fillna(True)
collapsed = int((lost | small.dying.astype(bool).to_numpy()).sum())
claims.append(claim("MAX sharing collapses at <= 8 samples per worker (the sweep)", source("tgsim", where="docs/THEORY.md §1.5"),
                    f"{collapsed} of {len(small)} runs at <= 8 samples per worker lost > 5 points against fp32's same "
                    f"seed or had dying units (run-health ALERT)" if len(small) else "no run at <= 8 samples per worker",
                    (collapsed * 2 > len(small)) if len(small) else None, kind="self-check", setting=SETTING,
                    test=f"count over {small.seed.nunique() if len(small) else 0} seed(s) x settings: confirmed when "
                         "most runs collapse (> 5 points below fp32's run or dying units)", scale="convnet",
                    rows=small.assign(collapsed=(lost | small.dying.astype(bool).to_numpy()).to_numpy())[
                        ["variant", "optimizer", "workers", "seed", "test_accuracy", "dying", "collapsed"]]))
claims.append(claim(
    "MAX sharing collapses in the demo recipe (8 workers x 8 samples)", source("tgsim", where="docs/THEORY.md §1.5: 2 of 3 runs; the paper shares the MAX"),
    "; ".join(f"{m.upper()}: {int(d.gone.sum())} of {len(d)} runs collapsed (accuracies "
              + ", ".join(f"{a:.3f}" for a in d.test_accuracy) + ")" for m, d in lost_c.items())
    + "; fp32: " + ", ".join(f"{a:.3f}" for a in fp_c), n_max * 2 > len(SEEDS_C), kind="self-check",
    setting=f"tgsim/configs/demo.toml: 8 workers, total batch 64, momentum 0.9, lr 0.1, {STEPS_C} steps",
    test=f"count over {len(SEEDS_C)} seed(s) ({', '.join(map(str, SEEDS_C))}): a run collapsed when its accuracy is "
         "> 5 points below fp32's same seed, it diverged, or run-health's dying ALERT fired; confirmed when most "
         "MAX runs collapsed", scale="convnet",
    rows=pd.concat([*lost_c.values(), recipe[recipe.variant == "fp32"]])[
        ["variant", "seed", "test_accuracy", "dying", "diverged", "gone"]].rename(columns={"gone": "collapsed"})))
last = diag.dropna(subset=["accuracy"]).groupby("variant").last()
dead = diag.groupby("variant").zero_grad_fraction.max()
ratio = diag.groupby("variant").scaler_ratio.max()
claims.append(claim("one run: MAX sharing's collapse in its diagnostics (demo recipe)", source("tgsim", where="measurement"),
                    "; ".join(f"{v}: final accuracy {last.accuracy[v]:.3f}, largest scaler ratio x{ratio[v]:.3g}, "
                              f"dead units up to {dead[v]:.2f}" for v in last.index), None, kind="self-check",
                    setting="8 workers, total batch 64, momentum 0.9, lr 0.1", scale="convnet"))
save(fig, "fig03_workers_scaling", pd.concat([df.assign(panel="sweep"), diag.assign(panel="one run"),
                                              recipe.assign(panel="demo recipe over seeds")],
                                             ignore_index=True), QUICK, claims)
