# %% [markdown]
# # Fig. 6 (tgsim): throughput against 1-512 GPUs, fp32 against TernGrad (TernGrad Fig. 5)
#
# The paper's Fig. 5 models the training throughput of AlexNet, GoogLeNet and VGG-A on 1 Gb/s
# Ethernet (4 GTX 1080 per node) and 100 Gb/s InfiniBand (4 P100 per node), and reports that
# TernGrad's gain over fp32 grows with the number of GPUs, as the bandwidth falls, and with the
# share of fully-connected weights (AlexNet, VGG-A gain most; GoogLeNet little).
#
# Here: `tgsim.analysis.perfmodel.fig5` (docs/THEORY.md §6: wait-free backprop, a parameter server,
# TernGrad's exact-sum downlink of ceil(log2(2N+1)) bits), and the module's three claim checks. The
# paper's published points are not in the module (it holds the model only), so none are drawn; the
# emulated-network measurements (`tgsim bench exchange`) validate a different part of the model and
# are not drawn either. No training: about 2 s in either form (`--quick` draws the same).

# %%
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line  # noqa: E402
from _theme import claim, save, sns  # noqa: E402

from tgsim.analysis import perfmodel as pm  # noqa: E402

QUICK, OUT = command_line("Performance model: throughput against 1-512 GPUs (TernGrad Fig. 5).")
df = pm.fig5()
gains = pm.gain_table(df)
df = df.merge(gains[["net", "cluster", "gpus", "gain"]], on=["net", "cluster", "gpus"])
df["cluster_label"] = df.cluster.map({"ethernet": "1 Gb/s Ethernet (GTX 1080)", "infiniband": "100 Gb/s InfiniBand (P100)"})
print(gains.pivot_table(index="gpus", columns=["cluster", "net"], values="gain").round(2).to_string())

# %% figure: rows = cluster, columns = network
g = sns.relplot(data=df, x="gpus", y="throughput", hue="codec", style="codec", row="cluster_label", col="net",
                kind="line", markers=True, dashes=False, height=3.2, aspect=1.2, facet_kws={"sharey": False})
g.set(xscale="log", yscale="log", xticks=[1, 8, 64, 512], xticklabels=["1", "8", "64", "512"])
g.set_axis_labels("GPUs", "throughput (images/s)")
g.set_titles("{col_name}, {row_name}", size=9)
for (row, col), ax in g.axes_dict.items():
    d = gains[(gains.net == col) & (gains.cluster == df[df.cluster_label == row].cluster.iloc[0])]
    ax.set_title(f"{col}, {row}\nTernGrad/fp32: x{d[d.gpus == 512].gain.iloc[0]:.1f} at 512 GPUs, "
                 f"peak x{d.gain.max():.1f}", fontsize=9)
sns.move_legend(g, "center left", bbox_to_anchor=(1.0, 0.5), title="codec")
g.figure.subplots_adjust(hspace=0.42)
g.figure.suptitle("Modeled throughput, parameter server, wait-free backprop (TernGrad Fig. 5)", y=1.05)

# %% claims, from the model (the module's checks) and the data
ok_n, _ = pm.claim_gain_grows_with_workers()
ok_b, bw = pm.claim_gain_grows_as_bandwidth_falls()
ok_fc, _ = pm.claim_gain_grows_with_fc_weights()
ib = gains[gains.cluster == "infiniband"].pivot(index="gpus", columns="net", values="gain")
eth = gains[gains.cluster == "ethernet"].pivot(index="gpus", columns="net", values="gain")
claims = [
    claim("the gain grows with the number of GPUs", "Fig. 5: larger gains at more GPUs",
          "InfiniBand gain at 2 -> peak: " + ", ".join(f"{n} x{ib[n].loc[2]:.2f} -> x{ib[n].max():.2f} "
                                                       f"(N = {ib[n].idxmax()})" for n in ib.columns), ok_n),
    claim("the gain grows as the bandwidth falls", "Fig. 5: Ethernet gains exceed InfiniBand's",
          "at 8 GPUs, Ethernet / InfiniBand: " + ", ".join(f"{n} x{eth[n].loc[8]:.2f} / x{ib[n].loc[8]:.2f}"
                                                         for n in ib.columns), ok_b),
    claim("more fully-connected weights, more gain", "Fig. 5: AlexNet and VGG-A gain most, GoogLeNet least",
          "Ethernet, 64 GPUs: " + ", ".join(f"{n} x{eth[n].loc[64]:.2f}" for n in eth.columns), ok_fc),
    claim("the gain falls after its peak", "(not in the paper: its downlink is 2 bits)",
          "Ethernet AlexNet x" + f"{eth['alexnet'].max():.1f} peak, x{eth['alexnet'].loc[512]:.1f} at 512 "
          "(the exact-sum downlink widens with N)", None),
]
save(g.figure, "fig06_perfmodel", df, QUICK, claims)
