# %% [markdown]
# # Fig. 6 (tgsim): throughput against 1-512 GPUs, fp32 against TernGrad (TernGrad Fig. 5)
#
# The paper's Fig. 5 models the training throughput of AlexNet, GoogLeNet and VGG-A on 1 Gb/s
# Ethernet (4 GTX 1080 per node) and 100 Gb/s InfiniBand (4 P100 per node), and reports that
# TernGrad's gain over fp32 grows with the number of GPUs, as the bandwidth falls, and with the
# share of fully-connected weights (AlexNet, VGG-A gain most; GoogLeNet little).
#
# MODEL ONLY: panels (a)-(f) and every claim but the last are the performance model's arithmetic,
# not measurements. Here: `tgsim.analysis.perfmodel.fig5` (docs/THEORY.md §6: wait-free backprop, a
# parameter server, TernGrad's exact-sum downlink of ceil(log2(2N+1)) bits), the paper's 2-bit
# downlink (`Exchange(downlink="reternarize")`), and fp16 as fp32's exchange with half the bytes
# (fp32 on links of twice the bandwidth, same latency). The
# paper publishes Fig. 5 as a plot only (no table of its points), so its claims are checked in words
# and numbers in the claims table, not as drawn points.
# Panels (a)-(f): the model. (g) the model's communication term against a real link:
# `tgsim bench exchange --quick` (1 Gb/s
# shaped with tc on a private network namespace's loopback, N = 2 and 4 MPI ranks, 1M and 4M
# parameters) measures the step-time speedup of each TernGrad exchange over fp32's native
# all-reduce; the model's communication term predicts the byte ratio (fp32 bytes / TernGrad bytes,
# encode and decode free). Read from results/bench_exchange.csv when present, else measured here
# (needs root for the namespace: without it the panel says so). `--quick` only reads an
# existing CSV. The panel, its claim and the CSV name the file read, when it was written (its
# modification time) and QUICK when a --quick benchmark wrote it: the CSV's `quick` column says so
# (tgsim bench exchange writes it); a CSV without it (written by an older tgsim) is judged by its
# grid instead -- every row inside the --quick grid at <= 3 timed steps counts as QUICK (a guess:
# a full run restricted by hand to that grid is marked too). Run times: docs/MEASUREMENTS.md.

# %%
import dataclasses
import os
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line  # noqa: E402
from _theme import claim, save, sns  # noqa: E402

from tgsim.bench import exchange as bench_exchange  # noqa: E402

from tgsim.analysis import perfmodel as pm  # noqa: E402

QUICK, OUT = command_line("Performance model: throughput against 1-512 GPUs (TernGrad Fig. 5).")
df = pm.fig5()
gains = pm.gain_table(df)
df = df.merge(gains[["net", "cluster", "gpus", "gain"]], on=["net", "cluster", "gpus"])
NETS, GPUS = tuple(dict.fromkeys(df.net)), tuple(sorted(df.gpus.unique()))
# the paper's 2-bit downlink (the server re-ternarizes the sum) beside tgsim's exact-sum downlink
two = pm.throughput_table(NETS, GPUS, ("ethernet", "infiniband"), ("fp32", "terngrad"),
                          pm.Exchange("ps", downlink="reternarize"))
gains2 = pm.gain_table(two)
two = two[two.codec == "terngrad"].merge(gains2[["net", "cluster", "gpus", "gain"]], on=["net", "cluster", "gpus"])


def fp16_rows(cluster: str):
    """fp16 in the model: fp32's exchange with half the bytes, i.e. fp32 on a cluster whose links (network
    and inside a node) have twice the bandwidth and the same latency (the model's time per message is
    latency + bytes / bandwidth)."""
    cl = pm.CLUSTERS[cluster]
    fast = dataclasses.replace(cl, network=dataclasses.replace(cl.network, bandwidth=2 * cl.network.bandwidth),
                               intra_bandwidth=2 * cl.intra_bandwidth)
    t = pm.throughput_table(NETS, GPUS, (fast,), ("fp32",))
    return t.assign(cluster=cluster, bandwidth=cl.network.bandwidth, codec="fp16")


f16 = pd.concat([fp16_rows(c) for c in ("ethernet", "infiniband")], ignore_index=True)
LABEL = {"fp32": "fp32", "fp16": "fp16 (fp32's model, half the bytes)",
         "terngrad": "TernGrad, exact-sum downlink (tgsim)", "terngrad2": "TernGrad, 2-bit downlink (the paper's)"}
df = pd.concat([df, f16, two.assign(codec="terngrad2")], ignore_index=True)
df["codec"] = df.codec.map(LABEL)
df["cluster_label"] = df.cluster.map({"ethernet": "1 Gb/s Ethernet (GTX 1080)", "infiniband": "100 Gb/s InfiniBand (P100)"})
print(gains.pivot_table(index="gpus", columns=["cluster", "net"], values="gain").round(2).to_string())

# %% figure: rows = cluster, columns = network
g = sns.relplot(data=df, x="gpus", y="throughput", hue="codec", style="codec", row="cluster_label", col="net",
                kind="line", markers=True, dashes=False, height=3.2, aspect=1.2, facet_kws={"sharey": False})
g.set(xscale="log", yscale="log", xticks=[1, 8, 64, 512], xticklabels=["1", "8", "64", "512"])
g.set_axis_labels("GPUs", "throughput (images/s)")
g.set_titles("{col_name}, {row_name}", size=9)
for letter, ((row, col), ax) in zip("abcdef", g.axes_dict.items()):
    d = gains[(gains.net == col) & (gains.cluster == df[df.cluster_label == row].cluster.iloc[0])]
    d2 = gains2[(gains2.net == col) & (gains2.cluster == d.cluster.iloc[0])]
    ax.set_title(f"({letter}) {col}, {row}\nTernGrad/fp32 at 2 -> 512 GPUs: x{d[d.gpus == 2].gain.iloc[0]:.1f} -> "
                 f"x{d[d.gpus == 512].gain.iloc[0]:.1f}\n(2-bit downlink: x{d2[d2.gpus == 2].gain.iloc[0]:.1f} -> "
                 f"x{d2[d2.gpus == 512].gain.iloc[0]:.1f})", fontsize=9)
sns.move_legend(g, "upper center", bbox_to_anchor=(0.45, 0.0), ncol=2, title="codec, panels (a)-(f)",
                fontsize=11, title_fontsize=11, markerscale=1.6)
g.figure.subplots_adjust(hspace=0.42)
g.figure.suptitle("MODEL ONLY, no measurement in (a)-(f): modeled throughput, parameter server, wait-free backprop "
                  "(TernGrad Fig. 5); deterministic, no seeds", y=1.07)


# %% (c) the communication term against an emulated 1 Gb/s link (tgsim bench exchange)
def bench_rows():
    """(rows of tgsim bench exchange, where they came from): the repo's results/bench_exchange.csv,
    an earlier run's out/bench_exchange_quick.csv, else a fresh --quick run (full form only)."""
    repo = HERE.parent / "results" / "bench_exchange.csv"
    mine = OUT / "bench_exchange_quick.csv"
    for path in (repo, mine):
        if path.exists():
            return pd.read_csv(path), provenance(path)
    if QUICK:
        return None, "not measured in the quick form (run the full form, or `tgsim bench exchange`)"
    cmd = [sys.executable, "-c", "import sys; from tgsim.cli import main; sys.exit(main(sys.argv[1:]))",
           "bench", "exchange", "--quick", "--quiet", "--out", str(mine)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ})
    except subprocess.TimeoutExpired:
        return None, "not measured: tgsim bench exchange --quick timed out"
    if r.returncode or not mine.exists():
        why = (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1][:90]
        return None, f"not measured: {why}"
    return pd.read_csv(mine), provenance(mine) + ", measured in this run"


def bench_quick(rows) -> bool:
    """Was `rows` (a tgsim bench exchange CSV) written by its --quick form? Its `quick` column when it
    has one; else (an older tgsim's CSV) its grid: every row inside the --quick grid
    (bench_exchange.QUICK) at no more timed steps (bench_exchange.is_quick)."""
    return bench_exchange.is_quick(rows, guess_from_grid=True)


def provenance(path: Path) -> str:
    """`PATH, written TIME` (the file's modification time, ISO 8601, local zone), `, QUICK` when a
    --quick benchmark wrote it."""
    when = datetime.fromtimestamp(path.stat().st_mtime).astimezone().isoformat(timespec="seconds")
    rel = os.path.relpath(path, HERE.parent)
    return f"{rel}, written {when}" + (", QUICK (tgsim bench exchange --quick)" if bench_quick(pd.read_csv(path)) else "")


HERE = Path(__file__).resolve().parent
bench, source = bench_rows()
axc = g.figure.add_axes([1.04, 0.12, 0.3, 0.72])
tg = None
if bench is not None:
    tg = bench[bench["mode"].str.startswith("tg_")].copy()
    tg["config"] = [f"N = {r.ranks}, {r.params / 1e6:g}M params, {r.rate}" for r in tg.itertuples()]
    sns.scatterplot(data=tg, x="byte_ratio", y="speedup", hue="mode", style="config", s=70, ax=axc,
                    palette=sns.color_palette("colorblind")[2:2 + tg["mode"].nunique()])
    hi = float(max(tg.byte_ratio.max(), tg.speedup.max())) * 1.1
    axc.plot([1, hi], [1, hi], color="black", lw=1, label="measured = byte ratio (model)")
    axc.set(xscale="log", yscale="log", xlim=(1, hi), ylim=(1, hi))
    axc.legend(fontsize=10, loc="upper left", bbox_to_anchor=(0.0, -0.14), ncol=1, markerscale=1.3)
else:
    axc.text(0.5, 0.5, textwrap.fill(source, 38), ha="center", va="center", fontsize=9, transform=axc.transAxes)
    axc.set(xticks=[], yticks=[])
axc.set(xlabel="byte ratio fp32 / TernGrad (the model's communication term)",
        ylabel="measured step speedup over fp32 all-reduce (ratio)")
axc.set_title("(g) emulated link, tc on loopback\n" + (textwrap.fill(f"read {source}", 60) if tg is not None
                                                          else "not measured"), fontsize=9)

# %% claims, from the model (the module's checks) and the data
ok_n, _ = pm.claim_gain_grows_with_workers()
ok_b, bw = pm.claim_gain_grows_as_bandwidth_falls()
ok_fc, _ = pm.claim_gain_grows_with_fc_weights()
ib = gains[gains.cluster == "infiniband"].pivot(index="gpus", columns="net", values="gain")
eth = gains[gains.cluster == "ethernet"].pivot(index="gpus", columns="net", values="gain")
ib2 = gains2[gains2.cluster == "infiniband"].pivot(index="gpus", columns="net", values="gain")
eth2 = gains2[gains2.cluster == "ethernet"].pivot(index="gpus", columns="net", values="gain")
grows2 = bool(((ib2.loc[512] > ib2.loc[2]) & (eth2.loc[512] > eth2.loc[2])).all())
MODEL = ("model arithmetic (deterministic, no statistical test): the performance model of docs/THEORY.md §6, "
         "not a measurement")
SETTING = "the paper: AlexNet, GoogLeNet, VGG-A; 1 Gb/s Ethernet (4 GTX 1080 per node), 100 Gb/s InfiniBand (4 P100)"
claims = [
    claim("the gain grows with the number of GPUs (the paper's 2-bit downlink)",
          "paraphrase: Fig. 5 shows TernGrad's gain over fp32 growing with the number of GPUs",
          "2-bit downlink, gain at 2 -> 512 GPUs, Ethernet: " + ", ".join(
              f"{n} x{eth2[n].loc[2]:.1f} -> x{eth2[n].loc[512]:.1f}" for n in eth2.columns) + "; InfiniBand: "
          + ", ".join(f"{n} x{ib2[n].loc[2]:.1f} -> x{ib2[n].loc[512]:.1f}" for n in ib2.columns), grows2,
          kind="paper claim", setting=SETTING + "; downlink 2 bits as in the paper",
          test=MODEL + "; confirmed when gain(512) > gain(2) on both clusters for every net", scale="model"),
    claim("the gain grows with the number of GPUs (tgsim's exact-sum downlink)",
          "paraphrase: Fig. 5 shows TernGrad's gain over fp32 growing with the number of GPUs",
          "exact-sum downlink, gain at 2 -> 512 GPUs, Ethernet: " + ", ".join(
              f"{n} x{eth[n].loc[2]:.1f} -> x{eth[n].loc[512]:.1f}" for n in eth.columns) + "; InfiniBand: "
          + ", ".join(f"{n} x{ib[n].loc[2]:.1f} -> x{ib[n].loc[512]:.1f}" for n in ib.columns),
          bool(((ib.loc[512] > ib.loc[2]) & (eth.loc[512] > eth.loc[2])).all()), kind="paper claim",
          setting=SETTING + "; downlink ceil(log2(2N+1)) bits (tgsim's exact sum)",
          test=MODEL + "; confirmed when gain(512) > gain(2) on both clusters for every net", scale="model"),
    claim("the gain grows as the bandwidth falls", "paraphrase: Fig. 5: the gains on 1 Gb/s Ethernet exceed those "
          "on InfiniBand", "at 8 GPUs, Ethernet / InfiniBand: " + ", ".join(f"{n} x{eth[n].loc[8]:.2f} / x{ib[n].loc[8]:.2f}"
                                                                          for n in ib.columns), ok_b,
          kind="paper claim", setting=SETTING, test=MODEL + " (perfmodel.claim_gain_grows_as_bandwidth_falls)",
          scale="model"),
    claim("more fully-connected weights, more gain", "paraphrase: Fig. 5: AlexNet and VGG-A gain most, GoogLeNet "
          "least", "Ethernet, 64 GPUs: " + ", ".join(f"{n} x{eth[n].loc[64]:.2f}" for n in eth.columns), ok_fc,
          kind="paper claim", setting=SETTING, test=MODEL + " (perfmodel.claim_gain_grows_with_fc_weights)",
          scale="model"),
    claim("fp16 against fp32 and TernGrad in the model", "paraphrase: TernGrad's reviewer 2 asks for the comparison "
          "with 16-bit floats", "Ethernet, 64 GPUs, throughput TernGrad (2-bit down) / fp16: " + ", ".join(
              f"{n} x{float(two[(two.net == n) & (two.cluster == 'ethernet') & (two.gpus == 64)].throughput.iloc[0]) / float(f16[(f16.net == n) & (f16.cluster == 'ethernet') & (f16.gpus == 64)].throughput.iloc[0]):.2f}"
              for n in NETS), None, kind="paper claim", setting=SETTING, scale="model"),
    claim("on a real (emulated) 1 Gb/s link TernGrad's step speedup reaches its byte ratio",
          "Fig. 5's model: communication time ∝ bytes (encode/decode not modeled)",
          ("not measured: " + source) if tg is None else f"from {source}: " +
          "; ".join(f"{m}: {100 * d.pct_of_ratio.min():.0f}-{100 * d.pct_of_ratio.max():.0f} % of the byte ratio "
                    f"(speedup x{d.speedup.min():.2f}-x{d.speedup.max():.2f})" for m, d in tg.groupby("mode")),
          None, kind="self-check", setting="tgsim bench exchange: 2 and 4 MPI ranks, 1M and 4M parameters",
          scale="link"),
]
data = df if tg is None else pd.concat([df.assign(panel="model"), tg.assign(panel="emulated link", bench_source=source)],
                                        ignore_index=True)
save(g.figure, "fig06_perfmodel", data, QUICK, claims)
