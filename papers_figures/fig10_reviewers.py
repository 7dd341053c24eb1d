# %% [markdown]
# # Fig. 10 (tgsim): the two questions of TernGrad's reviews
#
# (a) Layer-wise against whole-model ternarizing. The paper (Sec. 3.3) uses one scaler per layer and
#     argues that it narrows the gap ||g||_inf ||g||_1 / ||g||² of the bound (and so the variance)
#     against one scaler for the whole model. Measured on an MLP on scikit-learn's digits trained
#     with TernGrad (`tgsim.analysis.bound.mlp_ratios`: model[layerwise] against model[global],
#     without and with 2.5σ clipping), over training. fig02 shows the same on the MNIST-1D convnet.
# (b) TernGrad against fp16 and 4-bit QSGD: the relative error of the N-worker mean and the bits each
#     sends, from `tgsim compare variance`'s CSV (shared with fig05 and fig07; QSGD at the 4-bit budget
#     with its best knob under it, fp16's rounding error, TernGrad's 2 bits).
# Full: 300 MLP steps (a few s) plus the shared compare run; `--quick`: 60 steps.

# %%
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import coding_of, command_line, compare_outputs  # noqa: E402
from _theme import claim, plt, save, sns, theme  # noqa: E402

from tgsim.analysis.bound import mlp_ratios  # noqa: E402
from tgsim.analysis.common import single_thread  # noqa: E402

QUICK, OUT = command_line("Layer-wise vs whole-model scaler; TernGrad vs fp16 and 4-bit QSGD.")
STEPS, EVERY = (60, 5) if QUICK else (300, 5)

with single_thread():
    mlp = mlp_ratios(steps=STEPS, every=EVERY)
cv = pd.read_csv(compare_outputs("variance", QUICK) / "variance.csv")
theme()    # the compare run may have set its own

# %% tidy
m = mlp[mlp.layer.isin(["model[layerwise]", "model[global]"])].melt(
    id_vars=["step", "layer", "worker"], value_vars=["ratio_none", "ratio_explicit"], var_name="clip", value_name="ratio")
m["scaler"] = m.layer.map({"model[layerwise]": "one per layer", "model[global]": "one for the model"})
m["clip"] = m["clip"].map({"ratio_none": "no clipping", "ratio_explicit": "clipping 2.5σ"})
ok = cv[cv.status == "ok"]
pick = pd.concat([ok[ok.codec == "terngrad"], ok[ok.codec == "fp16"], ok[(ok.codec == "qsgd") & (ok.budget == 4.0)]])
pick["label"] = pick.codec.map({"terngrad": "TernGrad, 2 bits", "fp16": "fp16, 16 bits", "qsgd": "QSGD, 4-bit budget"})
df = pd.concat([m.assign(panel="a"), pick.assign(panel="b")[["panel", "kind", "codec", "label", "workers", "budget", "knob",
                                                               *(["codec_options"] if "codec_options" in pick else []),
                                                               "bits_per_element", "rel_mse"]]], ignore_index=True)

# %% figure
fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
sns.lineplot(data=m, x="step", y="ratio", hue="scaler", style="clip", estimator="median", errorbar=("pi", 50),
             ax=axes[0])
axes[0].set(yscale="log", xlabel="training step (iterations)", ylabel="E||Q(g)||² / ||g||²  (dimensionless)",
            title="(a) whole MLP: one scaler per layer vs one for the model")
axes[0].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
b = df[(df.panel == "b") & (df.workers == 1)]
sns.barplot(data=b, x="kind", y="rel_mse", hue="label", ax=axes[1], errorbar=None,
            hue_order=["TernGrad, 2 bits", "QSGD, 4-bit budget", "fp16, 16 bits"])
for bars in axes[1].containers:
    axes[1].bar_label(bars, fmt="%.1e", fontsize=6.5, rotation=90, padding=2)
axes[1].set(yscale="log", xlabel="vector kind (one worker, N = 1)",
            ylabel="MSE / ||v̄||² of one worker  (dimensionless)", title="(b) error at their bits (N = 1)")
axes[1].set_ylim(top=b.rel_mse.max() * 300)
axes[1].legend(fontsize=8, title="codec", loc="upper left", bbox_to_anchor=(1.01, 1))
fig.tight_layout()

# %% claims, from the data
med = m.groupby(["scaler", "clip"]).ratio.median()
n1 = b.pivot_table(index="kind", columns="codec", values="rel_mse")
bits = b.pivot_table(index="kind", columns="codec", values="bits_per_element")
per_bit = (n1["terngrad"] * bits["terngrad"]) / (n1["qsgd"] * bits["qsgd"])
# QSGD's wire coding per kind, from the CSV's codec_options (its best knob under the 4-bit budget)
q_cells = b[b.codec == "qsgd"].set_index("kind").get("codec_options", pd.Series(dtype=object))
q_coding = {k: f" ({coding_of(q_cells.get(k))} coding)" if coding_of(q_cells.get(k)) else "" for k in n1.index}
claims = [
    claim("one scaler per layer narrows the gap (MLP)", "Sec. 3.3: layer-wise ternarizing tightens the bound",
          f"median gap {med['one per layer', 'no clipping']:.2f} per layer vs {med['one for the model', 'no clipping']:.2f} "
          f"for the model (clipped: {med['one per layer', 'clipping 2.5σ']:.2f} vs {med['one for the model', 'clipping 2.5σ']:.2f})",
          med["one per layer", "no clipping"] < med["one for the model", "no clipping"]),
    claim("TernGrad against 4-bit QSGD at N = 1", "reviewers: is 2-bit TernGrad better than 4-bit QSGD?",
          "; ".join(f"{k}: TernGrad error x{n1.loc[k, 'terngrad'] / n1.loc[k, 'qsgd']:.3g} QSGD's{q_coding[k]} at "
                    f"{bits.loc[k, 'terngrad'] / bits.loc[k, 'qsgd']:.2f}x its bits" for k in n1.index),
          bool((per_bit < 1).all())),
    claim("fp16's error is negligible", "reviewers: fp16 halves the bits at no cost",
          "; ".join(f"{k}: {n1.loc[k, 'fp16']:.1e} (TernGrad {n1.loc[k, 'terngrad']:.2f})" for k in n1.index),
          bool((n1["fp16"] < 1e-4).all())),
]
save(fig, "fig10_reviewers", df, QUICK, claims)
