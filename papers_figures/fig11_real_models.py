# %% [markdown]
# # Fig. 11 (tgsim): the papers' claims on two small torch models -- a ResNet and a transformer, tuned, at equal bits and in time
#
# TernGrad's claims are about AlexNet ("no accuracy loss") and GoogLeNet ("less than 2 % on average"),
# its speed claims about GPU clusters; TernGrad's reviewer 2 asked for a 16-bit baseline (a 4-bit gradient,
# he adds, would then give a factor of 4 over it), Jiang & Agrawal's reviewers for rates tuned
# for every method and worker count, the total communication to a fixed error and links above 1 Gb/s.
# Here the two torch models of tgsim.torch.examples: the GroupNorm ResNet (width 8, one block per
# stage, 5,122 parameters) on scikit-learn's digits and the causal character transformer (82,665
# parameters, Adam) on "pychars", through `tgsim compare bits --problems resnet,transformer --workers N`
# (tgsim.analysis.compare_bits: rates chosen on a validation split per model and worker count, the
# paper's rule fp32-lr and each method's own-lr; the loss target 1.25 x fp32's minimum smoothed
# training loss; bits up + down to it; test accuracy and loss at fp32's step budget) and `tgsim compare
# time --net-file` (the model's real parameter shapes and its forward + backward seconds per batch
# measured here on the host CPU, one thread; DDP step time modeled on 1, 10, 100 Gb/s, N = 8..512, one
# device per node: the figure and the speed verdict use 1 Gb/s, a row lists 10 and 100 Gb/s at the
# measured N). One CPU thread's compute is slower than a GPU's, so the modeled communication share,
# and with it the room for any codec's speedup, is smaller here than on a GPU cluster. Methods: fp32, fp16, bf16; TernGrad as the paper runs it (MAX sharing, explicit clipping at
# 2.5 sigma: the registry defaults), tgsim's recommended MEAN sharing, and the paper's recipe with one
# scaler for the whole model instead of one per layer (`scope=model`: max |g| and sigma over all
# layers; reviewer 1 of TernGrad asks for the trade-offs of layer-wise ternarizing); QSGD with the
# paper's Elias
# coding at 2, 4 and 8 bits, a "b-bit" QSGD being the one whose sign + level word is b bits in the
# fixed coding: s = 2^(b-1) - 1 levels (1, 7, 127; its real bits with the paper's coding are measured);
# scaled sign and top-k (density 1 %) with error feedback; PowerSGD at ranks 1, 2, 4. 3 seeds.
#
# Verdicts (tgsim.analysis.verdicts, the report's one rule): per problem, with a summary "split" when
# the problems disagree; accuracy with each sentence's own margin (reviewers.WORDS); bits only where
# every seed reached the target ("missed (k/n)" otherwise); an own-lr row leaves out the problems whose
# tuned rate is fp32's (those runs are the fp32-lr row's). Speed: judged per model only at the N whose
# steps to the target K were measured (8); the other N carry that K over, are drawn hollow in (c) and
# are not judged. The compute is one CPU thread on the host, not a GPU.
#
# The full form runs only when asked (`make figures-real`: TGSIM_FIGURES_REAL=1, worker counts
# TGSIM_REAL_WORKERS: 8 under `make figures-real`, 4,8 when the script runs alone; the worker counts
# the table holds are those of the run it reads) or reuses its earlier run in out/real-models/; otherwise its table
# says "not run". `--quick`: 1 seed, 5 methods
# (the three floats and TernGrad per layer and whole-model), 8 workers, 24 / 20 steps. fig10 (a) and fig02 measure the
# quantizer's error of one scaler per layer against one for the whole model on the MLP and convnet.

# %%
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import publish_report  # noqa: E402
from _common import command_line, t_band, t_half_width, with_coding  # noqa: E402
from _theme import claim, codec_color, gap_axis, log_ticks, plt, save, seeds_note, theme  # noqa: E402
from _rules import accuracy_verdict  # noqa: E402
from reviewers import margin, reading, words  # noqa: E402
from tgsim.analysis.verdicts import combine, interval_verdict, noninferiority, reached_ratio  # noqa: E402

QUICK, OUT = command_line("The papers' claims on a torch ResNet and a transformer: compare bits + compare time.")
REAL = OUT / "real-models"      # not compare-*: make_report --rerun-compare keeps it
FULL_METHODS = ("fp32", "fp16", "bf16", "terngrad", "terngrad[sharing=mean]", "terngrad[scope=model]", "qsgd[levels=1]",
                "qsgd[levels=7]",
                "qsgd[levels=127]", "scaled_sign+ef", "topk+ef", "powersgd[rank=1]", "powersgd[rank=2]",
                "powersgd[rank=4]")
METHODS = FULL_METHODS[:4] + ("terngrad[scope=model]",) if QUICK else FULL_METHODS
WORKERS = (8,) if QUICK else tuple(int(x) for x in os.environ.get("TGSIM_REAL_WORKERS", "4,8").split(","))
SEEDS = 1 if QUICK else 3
MODELS = ("resnet", "transformer")
RUN = QUICK or os.environ.get("TGSIM_FIGURES_REAL", "").strip().lower() not in ("", "0", "false", "no", "off")
TGSIM = "import sys; from tgsim.cli import main; sys.exit(main(sys.argv[1:]))"


def tgsim(*args) -> None:
    """`tgsim ARGS` in its own process (the compare commands' process pools must not re-run this script)."""
    subprocess.run([sys.executable, "-c", TGSIM, *map(str, args)], check=True)


# %% the models' parameter shapes and forward + backward seconds per batch, measured on this host
def measure_net(name: str, batch: int, repeats: int) -> dict:
    """The net file of compare time (tgsim.analysis.perfmodel_nets.net_from_file) for problem `name`:
    its torch module's parameters in registration (forward) order and the median seconds of one
    forward + backward pass of `batch` training rows, one thread."""
    import torch

    from tgsim.analysis import compare_bits as cb
    from tgsim.train.loop import build

    setup = build(cb.config(cb.REAL_PROBLEMS[name], "fp32", 0, 1))
    module = setup.model.build(0)
    x = torch.from_numpy(np.ascontiguousarray(setup.dataset.x_train[:batch]))
    y = torch.from_numpy(setup.dataset.y_train[:batch].astype(np.int64))
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = []
        for i in range(repeats + 2):       # two warm-up passes
            module.zero_grad()
            t0 = time.perf_counter()
            torch.nn.functional.cross_entropy(module(x), y).backward()
            if i >= 2:
                times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(prev)
    layers = [{"name": k, "shapes": [list(p.shape)]} for k, p in module.named_parameters()]
    return {"name": name, "batch": batch, "seconds": float(np.median(times)), "source":
            f"measured on this host's CPU, 1 thread, torch {torch.__version__}, median of {repeats}", "layers": layers}


# %% the runs: compare bits on both models at every worker count, then compare time per model
BITS = REAL / "bits"
if RUN and (QUICK or not (BITS / "bits.csv").exists()
            or os.environ.get("TGSIM_FIGURES_RERUN", "").strip().lower() not in ("", "0", "false", "no", "off")):
    t0 = time.perf_counter()
    (REAL / "nets").mkdir(parents=True, exist_ok=True)
    for name in MODELS:      # per-device batch: the total batch 64 over 8 workers
        (REAL / "nets" / f"{name}.json").write_text(json.dumps(measure_net(name, 8, 5 if QUICK else 30), indent=1))
    tgsim("compare", "bits", "--problems", ",".join(MODELS), "--workers", ",".join(map(str, WORKERS)),
          "--methods", ",".join(METHODS), "--seeds", SEEDS, "--out", BITS,
          *(["--quick", "--lr-grid", "0.1"] if QUICK else ["--jobs", os.environ.get("TGSIM_JOBS", "0")]))
    N_TIME = 8 if 8 in WORKERS else max(WORKERS)      # compare time's K: the problems at 8 workers
    for name in MODELS:
        tgsim("compare", "time", "--bits", BITS, "--problem", f"{name}-n{N_TIME}", "--nets", "",
              "--net-file", REAL / "nets" / f"{name}.json", "--hardware", "host-cpu", "--codec-cost", "host",
              "--out", REAL / f"time-{name}", *(["--quick"] if QUICK else []))
    (REAL / "seconds.txt").write_text(f"{time.perf_counter() - t0:.0f}\n")
HAVE = (BITS / "bits.csv").exists() and all((REAL / f"time-{m}" / "time.csv").exists() for m in MODELS)
# the worker counts whose steps to the target K were measured (compare bits ran there); compare time
# carries the K of N_TIME over to every other N
_ns = sorted({int(p.rsplit("-n", 1)[1]) for p in pd.read_csv(BITS / "bits.csv").problem}) if HAVE else []
K_MEASURED = [8 if 8 in _ns else max(_ns)] if _ns else []      # = N_TIME of the run above

# %% tables: tuned rates, accuracy and loss at the common step (3 seeds, 95 % t-intervals), bits, time
theme()
if HAVE:
    df = pd.read_csv(BITS / "bits.csv")
    runs = pd.read_csv(BITS / "bits_runs.csv")
    grid = pd.read_csv(BITS / "bits_lr_grid.csv")
    time_df = pd.concat([pd.read_csv(REAL / f"time-{m}" / "time.csv") for m in MODELS], ignore_index=True)
    nets = {m: json.loads((REAL / "nets" / f"{m}.json").read_text()) for m in MODELS}
    df["shown"] = [with_coding(m, o) for m, o in zip(df.method, df.codec_options)]
    df["model"] = df.problem.str.rsplit("-n", n=1).str[0]
    df["workers"] = df.problem.str.rsplit("-n", n=1).str[1].astype(int)
    loss = runs.groupby(["problem", "rule", "method"], sort=False).test_loss_common.agg(
        loss_common_mean="mean", loss_common_hw=t_half_width).reset_index()
    df = df.merge(loss, on=["problem", "rule", "method"], how="left")
    pd.set_option("display.width", 200)
    print(f"seconds of the runs: {(REAL / 'seconds.txt').read_text().strip() if (REAL / 'seconds.txt').exists() else '?'}")
    for m, n in nets.items():
        print(f"{m}: {sum(int(np.prod(s)) for l in n['layers'] for s in l['shapes'])} parameters, forward + "
              f"backward {1e3 * n['seconds']:.2f} ms per batch of {n['batch']} ({n['source']})")
    print("\ntuned learning rate per method (rule own-lr: each method's own; fp32-lr: fp32's for all):")
    print(df.pivot_table(index="method", columns=["model", "workers", "rule"], values="lr", sort=False).to_string())
    print("\ntest accuracy and loss at the common step (fp32's step budget), mean [95 % t-interval], and the "
          "bits to the target relative to fp32's:")
    for r in df.itertuples():
        print(f"  {r.problem:<15s} {r.rule:<7s} {r.method:<22s} lr {r.lr:<8g} acc {r.accuracy_common_mean:.4f} "
              f"[{r.accuracy_common_lo:.4f}, {r.accuracy_common_hi:.4f}] loss {r.loss_common_mean:.4f} "
              f"± {r.loss_common_hw:.4f}  reached {r.reached}/{r.seeds}  bits {r.bits_total_mean:.4g} "
              f"(x{r.ratio_mean:.3g} [{r.ratio_lo:.3g}, {r.ratio_hi:.3g}] of fp32's)")
    tt = time_df[(time_df.rule == "own-lr") & time_df.workers.isin([8, 64, 512])]
    print("\nmodeled time to the target (s; own-lr; host CPU compute measured, one device per node) and "
          "the speedup over the best float [95 % interval]:")
    print(tt.pivot_table(index=["net", "method"], columns=["link_gbps", "workers"], values="time_to_target",
                         sort=False).to_string(float_format=lambda v: f"{v:.3g}"))
else:
    df = pd.DataFrame(columns=["problem", "rule", "method", "shown", "model", "workers"])
    runs = time_df = pd.DataFrame()
    print(f"fig11: no run in {REAL}: run `make figures-real` (TGSIM_FIGURES_REAL=1) first")

# %% figure: (a) bits to the target / fp32's, (b) accuracy at the common step, (c) time speedup at 1 Gb/s.
# One colour per method in every panel and figure (_theme.CODEC_COLORS); the model (and worker count) is
# told by hatch in (a), by marker in (b) and by line style and marker in (c)
fig, axes = plt.subplots(1, 3, figsize=(18, 5.6), gridspec_kw={"width_ratios": [1, 1, 0.85]})
if HAVE:
    d = df[df.rule == "own-lr"].copy()
    d["setting"] = d.model + ", N = " + d.workers.astype(str)
    order = list(dict.fromkeys(d.shown))
    method_of = dict(zip(df.shown, df.method))
    settings = list(dict.fromkeys(d.setting))
    HATCH = dict(zip(settings, ["", "///", "...", "xxx"]))
    MARK = dict(zip(settings, ["o", "s", "^", "D"]))
    width = 0.8 / len(settings)
    for k, s in enumerate(settings):
        ds = d[d.setting == s].set_index("shown")
        for x, sh in enumerate(order):
            if sh in ds.index and np.isfinite(ds.ratio_mean[sh]):      # no bar: some seed missed the target
                axes[0].bar(x + (k - (len(settings) - 1) / 2) * width, ds.ratio_mean[sh], width=width,
                            color=codec_color(method_of[sh]), hatch=HATCH[s], edgecolor="white", lw=0.5)
    axes[0].set(yscale="log", xlabel="method", ylabel="bits up + down to the target / fp32's",
                title="(a) own-lr: communication to 1.25 x fp32's\nminimum loss (no bar: some seed missed it)")
    axes[0].axhline(1, color="black", lw=0.8)
    log_ticks(axes[0], "y", pd.concat([d.ratio_mean, pd.Series([1.0])]), pad=1.6)
    axes[0].set_ylim(top=6)          # room above the bars for the legend
    from matplotlib.legend_handler import HandlerTuple

    axes[0].legend(handles=[(plt.Rectangle((0, 0), 1, 1, fc="0.55", ec="white", hatch=HATCH[s]),
                             plt.Line2D([], [], marker=MARK[s], color="0.4", ls="none")) for s in settings],
                   labels=settings, handler_map={tuple: HandlerTuple(ndivide=None, pad=0.6)}, loc="upper right",
                   handlelength=4, handleheight=1.4,
                   fontsize=7, title="model, workers: bar (a), marker (b)", ncol=2)
    fp = runs[runs.method == "fp32"].set_index(["rule", "problem", "seed"]).accuracy_common
    gp = runs[(runs.rule == "own-lr") & (runs.method != "fp32")].assign(
        gap=lambda x: 100 * (x.accuracy_common.to_numpy()
                             - fp.reindex(pd.MultiIndex.from_frame(x[["rule", "problem", "seed"]])).to_numpy()))
    gp["shown"] = gp.method.map(dict(zip(df.method, df.shown)))
    gp["setting"] = gp.problem.str.replace("-n", ", N = ", regex=False)
    # the axis and its off-axis note per method and model (a mean beyond the axis is named with its value)
    gp["shown_setting"] = gp.shown + " (" + gp.problem.str.rsplit("-n", n=1).str[0] + ")"
    gap_axis(axes[1], gp, "shown_setting", "gap", [f"{sh} ({s.split(',')[0]})" for sh in order for s in settings],
             floor=-12.0)
    lo_y, hi_y = axes[1].get_ylim()
    for k, s in enumerate(settings):
        for x, sh in enumerate(order):
            v = gp[(gp.setting == s) & (gp.shown == sh)].gap
            if not v.notna().any():
                continue
            m, (b0, b1) = float(np.nanmean(v)), t_band(v)        # the 90 % interval the verdicts decide on
            xx = x + (k - (len(settings) - 1) / 2) * 0.3
            c = codec_color(method_of[sh])
            if b1 > b0:          # a zero-width interval (every seed alike) has no band
                axes[1].plot([xx, xx], [b0, b1], color=c, lw=1.2)
                axes[1].plot([xx - 0.06, xx + 0.06], [b0, b0], color=c, lw=1)
                axes[1].plot([xx - 0.06, xx + 0.06], [b1, b1], color=c, lw=1)
            if lo_y <= m <= hi_y:
                axes[1].plot([xx], [m], marker=MARK[s], color=c, ms=6, mec="white", mew=0.6, ls="none")
    axes[1].set_ylim(lo_y, hi_y)
    axes[1].axhline(0, color="black", lw=0.8)
    axes[1].axhline(-margin("under-2"), color="black", lw=0.8, ls=":")
    axes[1].set(xlabel="method", ylabel="accuracy - fp32's, same seed (points)",
                title="(b) own-lr: accuracy gap to fp32 at the common step\n(mean, 90 % t-interval, the "
                      "verdicts'; dotted: -2 points)")
    t1 = time_df[(time_df.rule == "own-lr") & (time_df.link_gbps == 1) & ~time_df.method.isin(["fp32", "fp16", "bf16"])
                 & time_df.speedup_best.notna()]
    shown_methods = ("terngrad", "terngrad[sharing=mean]", "qsgd[levels=7]", "powersgd[rank=2]")
    t1 = t1[t1.method.isin(shown_methods)]
    net_style = {"resnet": ("-", "o"), "transformer": ("--", "s")}
    for (net, meth), g in t1.groupby(["net", "method"], sort=False):
        g = g.sort_values("workers")
        x = g.workers * (1.04 if net == "transformer" else 0.96)      # side by side where they coincide
        ls, mk = net_style.get(net, ("-.", "^"))
        c = codec_color(meth)
        axes[2].errorbar(x, g.speedup_best, yerr=[(g.speedup_best - g.speedup_best_lo).clip(lower=0),
                                                  (g.speedup_best_hi - g.speedup_best).clip(lower=0)],
                         ls=ls, marker=mk, color=c, mfc="white", capsize=2, lw=1, label=f"{net}: {meth}")
        at = g.workers.isin(K_MEASURED).to_numpy()        # K measured here: the marker filled in
        axes[2].scatter(x[at], g.speedup_best[at], marker=mk, color=c, zorder=4, s=30)
    axes[2].legend(handles=[plt.Line2D([], [], color=codec_color(m), lw=2, label=m) for m in shown_methods
                            if (t1.method == m).any()]
                   + [plt.Line2D([], [], color="0.3", ls=ls, marker=mk, mfc="white", label=net)
                      for net, (ls, mk) in net_style.items() if (t1.net == net).any()],
                   fontsize=7, title="method (colour), model (line)", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[2].axhline(1, color="black", ls=":")
    axes[2].set(xscale="log", yscale="log", xlabel="workers N (one device per node)",
                ylabel="time to target: best float / method's",
                title=f"(c) own-lr, 1 Gb/s: modeled speedup, 95 % interval\n(filled: K measured at N = "
                      f"{', '.join(map(str, K_MEASURED))}; hollow: K carried over)")
    log_ticks(axes[2], "y", pd.concat([t1.speedup_best_lo, t1.speedup_best_hi, pd.Series([0.5, 2.0])]))
    for ax in axes[:2]:
        ax.set_xticks(range(len(order)), order)
        ax.set_xlim(-0.5, len(order) - 0.5)
        plt.setp(ax.get_xticklabels(), rotation=40, ha="right", rotation_mode="anchor", fontsize=7)
    ns = sorted(set(time_df.workers))
    axes[2].set_xticks(ns, [str(n) for n in ns])
    axes[2].minorticks_off()
    fig.suptitle(f"torch ResNet (digits) and transformer (pychars) through tgsim; {seeds_note(runs.seed)}; one colour "
                 "per method (as in every figure)", y=1.0)
else:
    for ax in axes:
        ax.text(0.5, 0.5, publish_report.NOT_RUN, ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
fig.tight_layout(w_pad=2.5)

# %% claims (paper rule fp32-lr and own-lr; per model at every worker count; alpha 0.05)
SCALE = "torch ResNet, 5,122 parameters, digits; char transformer, 82,665 parameters, pychars"
SETTING = ("total batch 64, parameter server; rates tuned on a validation split per model and worker count; "
           "loss target 1.25 x fp32's minimum smoothed training loss")
RULES = {"fp32-lr": "fp32's tuned rate for every method (the paper's rule)", "own-lr": "each method's own tuned rate"}
NOT_RUN = f"{publish_report.NOT_RUN} (TGSIM_FIGURES_REAL=1)"     # publish_report refuses a report showing it
ABSENT = "not run in this form" if HAVE else NOT_RUN


def paired(method: str, rule: str, other: str = "fp32") -> pd.DataFrame:
    """Per problem and seed: the method's runs beside `other`'s (same rule), bits = total bits ratio."""
    a = runs[(runs.method == method) & (runs.rule == rule)]
    b = runs[(runs.method == other) & (runs.rule == rule)]
    m = a.merge(b, on=["problem", "seed"], suffixes=("", "_ref"))
    return m.assign(bits=np.where(m.K.notna() & m.K_ref.notna(), m.bits_total / m.bits_total_ref, np.nan))


ROW_COLUMNS = ["problem", "seed", "method", "rule", "lr", "K", "bits_total", "method_ref", "lr_ref", "K_ref",
               "bits_total_ref", "accuracy_common", "common_status", "accuracy_common_ref", "common_status_ref"]


def same_as_paper_rule(method: str) -> set:
    """The problems where the method's own tuned rate is fp32's: there its own-lr runs are its fp32-lr
    runs, so an own-lr row leaves them out rather than count the same data twice."""
    lr = df[df.method == method].pivot_table(index="problem", columns="rule", values="lr")
    return set(lr.index[(lr.get("own-lr") == lr.get("fp32-lr"))]) if {"own-lr", "fp32-lr"} <= set(lr.columns) \
        else set()


def accuracy_rows(g: pd.DataFrame, key: str) -> list[tuple[str, dict]]:
    """Per problem: non-inferiority of the accuracy at the common step against fp32's (the claim's one
    margin; a run of the method that diverged before it is its failure), judged by
    `_rules.accuracy_verdict`: at margin 0 ("no accuracy loss") at best inconclusive."""
    return [(p, accuracy_verdict(noninferiority(x.accuracy_common.where(x.common_status == "ok"),
                                                x.accuracy_common_ref.where(x.common_status_ref == "ok"),
                                                margin=margin(key) / 100, scale=100, unit=" points"), margin(key)))
            for p, x in g.groupby("problem", sort=False)]


def per_problem_text(res: list[tuple[str, dict]]) -> str:
    return "; ".join(f"{p}: {r['verdict']}" + (f" ({r['reading']})" if r.get("reading") else "")
                     + f", {r['diff']:+.2f} points [90 % interval {r['lo']:+.2f}, {r['hi']:+.2f}]"
                     if np.isfinite(r["lo"]) else f"{p}: {r['verdict']}, " + (
                         f"diverged in {r['failed']} run(s)" if r.get("failed") else "no interval")
                     for p, r in res)


def bits_rows(g: pd.DataFrame) -> list[tuple[str, dict]]:
    return [(p, reached_ratio(x.bits_total, x.bits_total_ref, x.K.notna(), x.K_ref.notna()))
            for p, x in g.groupby("problem", sort=False)]


def bits_text(res, other: str) -> str:
    return "; ".join(f"{p}: {r['verdict']}, " + (f"{r['text']} of {other}'s bits" if np.isfinite(r["ratio"])
                                                  else r["text"]) for p, r in res)


def kind_of(method: str, rule: str, proxy: bool = True) -> str:
    """The paper's recipe at fp32's rate: its claim under its own rule, judged on a stand-in (these two
    models for AlexNet and GoogLeNet, bits for communication time); at its own tuned rate: reviewer 1
    of Jiang & Agrawal's question; MEAN sharing: tgsim's variant."""
    if method != "terngrad":
        return "tgsim variant"
    return "paper claim (proxy)" if rule == "fp32-lr" else "reviewer question"


claims = []
TERN = {"terngrad": "paper recipe", "terngrad[sharing=mean]": "MEAN sharing"}
DETAIL = {"terngrad": "as the paper runs it (MAX sharing, explicit clipping at 2.5 sigma)",
          "terngrad[sharing=mean]": "as tgsim recommends (MEAN sharing, explicit clipping at 2.5 sigma)"}
for m, recipe in TERN.items():
    same = same_as_paper_rule(m) if HAVE else set()
    for key, name in (("no-loss", "no accuracy loss (AlexNet's sentence)"),
                      ("under-2", "accuracy loss under 2 points (GoogLeNet's sentence)")):
        for rule in RULES:
            g = paired(m, rule) if HAVE else pd.DataFrame()
            left = sorted(same) if rule == "own-lr" else []
            if len(g):
                g = g[~g.problem.isin(left)]
            res = accuracy_rows(g, key) if len(g) else []
            text = per_problem_text(res) + (f"; {', '.join(left)}: the tuned rate is fp32's, so these are the "
                                            "fp32-lr row's runs, not counted again" if left else "")
            claims.append(claim(
                f"{name} ({recipe}; {rule})", words(key), text.strip("; ") or ABSENT,
                combine([r["verdict"] for _, r in res]) if HAVE else "n/a", kind=kind_of(m, rule, proxy=True),
                setting=f"the paper: AlexNet, GoogLeNet on ImageNet; here TernGrad {DETAIL[m]}, {RULES[rule]}; {SETTING}",
                test=(res[0][1]["test"] + f"; {reading(key)}; per problem, summary split when they disagree; test "
                      "accuracy at fp32's step budget") if res else "", scale=SCALE,
                rows=g.reindex(columns=ROW_COLUMNS) if len(g) else None))
    for other, name, key in (("fp32", "TernGrad needs fewer bits in total to reach the loss", "comm"),
                             ("fp16", "TernGrad's saving against fp16", "fp16")):
        # own-lr: a problem where the method's and `other`'s tuned rates are both fp32's holds the
        # fp32-lr row's runs; it is left out rather than counted twice
        both = same & (same_as_paper_rule(other) if other != "fp32" else same) if HAVE else set()
        for rule in RULES:
            g = paired(m, rule, other) if HAVE else pd.DataFrame()
            left = sorted(both) if rule == "own-lr" else []
            if len(g):
                g = g[~g.problem.isin(left)]
            res = bits_rows(g) if len(g) else []
            text = bits_text(res, other) + (f"; {', '.join(left)}: both tuned rates are fp32's, so these are the "
                                            "fp32-lr row's runs, not counted again" if left else "")
            claims.append(claim(
                f"{name} ({recipe}; {rule})", words(key), text.strip("; ") or ABSENT,
                combine([r["verdict"] for _, r in res]) if res else "n/a",
                kind=kind_of(m, rule) if other == "fp32" else ("reviewer question" if m == "terngrad"
                                                               else "tgsim variant"),
                setting=f"TernGrad {DETAIL[m]}, {RULES[rule]}; {SETTING}",
                test=(res[0][1]["test"] + "; per problem, summary split when they disagree") if res else "",
                scale=SCALE, rows=g.reindex(columns=ROW_COLUMNS) if len(g) else None))
    # time to the target on 1 Gb/s: judged per model at the N whose K was measured; other N carry K over
    text, verdict, rows = ABSENT, "n/a", None
    if HAVE and (time_df.method == m).any():
        t = time_df[(time_df.method == m) & (time_df.rule == "own-lr") & (time_df.link_gbps == 1)].copy()
        t["K_source"] = np.where(t.workers.isin(K_MEASURED), "measured", f"modeled from N = {K_MEASURED[0]}")
        judged = t[t.workers.isin(K_MEASURED)]
        per = {net: combine([interval_verdict(r.speedup_best_lo, r.speedup_best_hi, low=1.0) for r in g.itertuples()])
               for net, g in judged.groupby("net", sort=False)}
        verdict = combine(list(per.values()))
        carried = t[~t.workers.isin(K_MEASURED)]
        text = ("; ".join(f"{r.net}: {per[r.net]}, {r.speedup_best:.2f} [{r.speedup_best_lo:.2f}, "
                          f"{r.speedup_best_hi:.2f}] at N = {r.workers}"
                          + (" (borderline: an end of the interval lies within 0.01 of 1)"
                             if min(abs(r.speedup_best_lo - 1), abs(r.speedup_best_hi - 1)) < 0.01 else "")
                          for r in judged.itertuples())
                + (f"; not judged (K carried over from N = {K_MEASURED[0]}): " + ", ".join(
                    f"{net} {int((g.speedup_best_lo > 1).sum())} won / {int((g.speedup_best_hi < 1).sum())} lost of "
                    f"{len(g)}" for net, g in carried.groupby("net", sort=False)) if len(carried) else ""))
        rows = t[["net", "method", "rule", "link_gbps", "workers", "K_source", "speedup_best", "speedup_best_lo",
                  "speedup_best_hi"]]
    claims.append(claim(
        f"significant speed gains ({recipe}; modeled, 1 Gb/s)", words("speed"), text, verdict,
        kind="paper claim (proxy)" if m == "terngrad" else "tgsim variant",     # modeled time, best float
        setting=f"TernGrad {DETAIL[m]}; time to the loss target = K (measured, own-lr, at N = "
        f"{', '.join(map(str, K_MEASURED)) or '-'}) x the modeled DDP step on 1 Gb/s, one device per node, compute "
        "measured on this host's CPU (one thread), codec seconds host",
        test="per model: the 95 % t-interval of the per-seed speedup over the best of fp32/fp16/bf16 at the N whose "
             "K was measured; above 1: confirmed, below 1: not confirmed; summary split when the models disagree; "
             "rows at other N (K carried over) are shown, not judged", scale=SCALE, rows=rows))
    # the faster links reviewer 4 of Jiang & Agrawal asks about: the same model at 10 and 100 Gb/s
    text, rows = ABSENT, None
    if HAVE and (time_df.method == m).any():
        f = time_df[(time_df.method == m) & (time_df.rule == "own-lr") & (time_df.link_gbps > 1)
                    & time_df.workers.isin(K_MEASURED)]
        text = "; ".join(f"{r.net} at {r.link_gbps:g} Gb/s, N = {r.workers}: {r.speedup_best:.2f} "
                         f"[{r.speedup_best_lo:.2f}, {r.speedup_best_hi:.2f}]" for r in f.itertuples()) or ABSENT
        rows = f[["net", "method", "rule", "link_gbps", "workers", "speedup_best", "speedup_best_lo",
                  "speedup_best_hi"]]
    claims.append(claim(
        f"speedup on faster links ({recipe}; modeled, 10 and 100 Gb/s)", words("links"), text, "n/a",
        kind="reviewer question" if m == "terngrad" else "tgsim variant",
        setting=f"TernGrad {DETAIL[m]}; as the 1 Gb/s row, the link at 10 and 100 Gb/s", scale=SCALE, rows=rows))
# layer-wise against whole-model ternarizing: the paper's recipe with a scaler per layer against one
# for the model, each at its own tuned rate, paired by seed (the same batches)
res, text, g = [], [], pd.DataFrame()
if HAVE:
    g = paired("terngrad", "own-lr", "terngrad[scope=model]")
    for p, x in g.groupby("problem", sort=False):
        ok = (x.common_status == "ok") & (x.common_status_ref == "ok")
        r = noninferiority(x.accuracy_common.where(x.common_status == "ok"),
                           x.accuracy_common_ref.where(x.common_status_ref == "ok"), margin=0.0, scale=100,
                           unit=" points")
        res.append(r)
        b = reached_ratio(x.bits_total, x.bits_total_ref, x.K.notna(), x.K_ref.notna())
        text.append(f"{p}: {r['verdict']}, layer-wise {r['diff']:+.2f} points [90 % interval {r['lo']:+.2f}, "
                    f"{r['hi']:+.2f}], bits to the target: "
                    + (f"{b['text']} of whole-model's" if np.isfinite(b["ratio"]) else b["text"]))
claims.append(claim(
    "one scaler per layer beats one for the whole model (paper recipe; own-lr)", words("layerwise"),
    "; ".join(text) or ABSENT, combine([r["verdict"] for r in res]) if HAVE else "n/a", kind="reviewer question",
    setting=f"TernGrad {DETAIL['terngrad']}, a scaler per layer against one for the whole model (scope=model), "
    f"{RULES['own-lr']}; {SETTING}",
    test=(res[0]["test"] + "; confirmed when layer-wise is higher; per problem, test accuracy at fp32's step budget")
    if res else "", scale=SCALE, rows=g.reindex(columns=ROW_COLUMNS) if len(g) else None))
# QSGD's bits: the measured bits per element of the paper's coding at each level count
text = NOT_RUN
if HAVE:
    q = df[df.method.str.startswith("qsgd") & (df.rule == "own-lr")]
    text = "; ".join(f"{r.problem} {r.method}: {r.bits_up_per_element:.3g} bits up per element, "
                     + (f"x{r.ratio_mean:.3g} of fp32's bits to the target" if r.reached == r.seeds
                        else f"missed ({r.seeds - r.reached}/{r.seeds})") for r in q.itertuples())
claims.append(claim("QSGD's bits with the paper's coding (2, 4, 8-bit words)", words("qsgd-bits"),
                    text or "QSGD not run in this form", "n/a", kind="reviewer question", setting=SETTING, scale=SCALE))
save(fig, "fig11_real_models", df.drop(columns=[c for c in ("shown",) if c in df.columns]), QUICK, claims)
