# %% [markdown]
# # Fig. 1 (tgsim): gradient histograms over iterations -- original, clipped, ternary (TernGrad Fig. 2)
#
# The paper's Fig. 2 shows, over AlexNet's training, the histograms of a conv and a fully-connected
# layer's gradients before clipping, after clipping to ±2.5σ and after ternarizing, and Sec. 3.3 reports
# that clipping changes the gradient's length by only 1.0-1.5 % and its direction by 2-3°.
#
# Here: the MNIST-1D convnet trained with TernGrad (8 workers, total batch 64, momentum 0.9, c = 2.5
# explicit clipping); every `EVERY` steps worker 0's gradient of conv2.w (2,560 elements) and fc1.w
# (20,480) is binned (101 bins over ± 1.5 x the layer's largest ternary scaler over training; larger
# |g| fall into the edge bins) as is (original), clipped
# (`tgsim.analysis.common.clip_values`) and after one TernGrad encode/decode
# (`tgsim.analysis.pooled_bias.decoded_draws`); the length change and angle of clipping come from
# `tgsim.analysis.clipping.clip_stats` over all 8 workers. Full: 1000 steps, every 10;
# `--quick`: 30 steps, every 3. Run times: docs/MEASUREMENTS.md.

# %%
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, mnist1d_convnet_config  # noqa: E402
from _theme import claim, plt, save, source  # noqa: E402

from tgsim.analysis.clipping import clip_stats, gaussian_reference  # noqa: E402
from tgsim.analysis.common import clip_values, single_thread, trajectory  # noqa: E402
from tgsim.analysis.pooled_bias import decoded_draws  # noqa: E402
from tgsim.codecs import TernGrad  # noqa: E402

QUICK, OUT = command_line("Gradient histograms over iterations: original, clipped, ternary.")
STEPS, EVERY = (30, 3) if QUICK else (1000, 10)
LAYERS = {"conv2.w": "conv layer conv2.w", "fc1.w": "dense layer fc1.w"}
KINDS = ("original", "clipped (±2.5σ)", "ternary")
BINS = 101
CODEC = TernGrad(clip="explicit", clip_factor=2.5)

# %% record worker 0's gradients (and every worker's clipping statistics)
grads0, stats = {k: {} for k in LAYERS}, []


def record(t, setup, params, grads):
    if t % EVERY:
        return
    for layer in LAYERS:
        g = np.asarray(grads[layer], np.float32).reshape(grads[layer].shape[0], -1)
        g0 = g[0]
        grads0[layer][t] = {KINDS[0]: g0.astype(np.float64), KINDS[1]: clip_values(g0, "explicit", 2.5).reshape(-1),
                            KINDS[2]: decoded_draws(CODEC, g0, 0, 1, seed=t)[0]}
        st = clip_stats(g)
        stats.extend({"step": t, "layer": layer, "worker": w, **{k: float(v[w]) for k, v in st.items()}}
                     for w in range(g.shape[0]))


with single_thread():
    trajectory(mnist1d_convnet_config(steps=STEPS), STEPS, record)
stats = pd.DataFrame(stats)

# %% tidy histograms: one row per (layer, kind, step, bin)
rows = []
for layer, by_step in grads0.items():
    # ± 1.5 x the largest ternary scaler over training: the clipped body and the ternary levels stay
    # visible; the original's rarer, larger values pile up in the two edge bins
    lim = 1.5 * max(np.abs(v[KINDS[2]]).max() for v in by_step.values())
    edges = np.linspace(-lim, lim, BINS + 1)
    centers = 0.5 * (edges[1:] + edges[:-1])
    for t, kinds in by_step.items():
        for kind, v in kinds.items():
            counts, _ = np.histogram(np.clip(v, edges[0], edges[-1]), edges)
            rows += [{"layer": layer, "kind": kind, "step": t, "bin_center": c, "bin_width": edges[1] - edges[0],
                      "count": int(k)} for c, k in zip(centers, counts)]
df = pd.DataFrame(rows)

# %% figure: 2 layers x 3 kinds of heat maps (iteration against gradient value, colour = log count, empty bins white)
fig, axes = plt.subplots(2, 3, figsize=(12, 6.4), sharey=True)
for i, layer in enumerate(LAYERS):
    for j, kind in enumerate(KINDS):
        d = df[(df.layer == layer) & (df.kind == kind)].pivot(index="step", columns="bin_center", values="count")
        ax = axes[i, j]
        mesh = ax.pcolormesh(d.columns.to_numpy(), d.index.to_numpy(), np.ma.masked_equal(np.log10(1 + d.to_numpy()), 0),
                             cmap="mako_r", shading="nearest", vmin=0, vmax=np.log10(1 + d.to_numpy().max()))
        ax.set_title(f"{LAYERS[layer]}: {kind}")
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-2, 2))
        ax.grid(False)
        if i == 1:
            ax.set_xlabel("gradient value ∂L/∂w (loss per weight unit)")
        if j == 0:
            ax.set_ylabel("training step (iterations)")
        fig.colorbar(mesh, ax=ax, label="log10(1 + count)", pad=0.02)
fig.suptitle(f"Histograms of worker 0's gradient over training (MNIST-1D convnet, 23,882 parameters, TernGrad, "
             f"{STEPS} steps, one run: seed 0;\nvalues beyond the axis counted in the edge bins)")
fig.tight_layout()

# %% claims, from the data (clipping statistics over every worker and recorded step)
ref = gaussian_reference()
length = 100 * stats.length_change.abs().median()
angle = stats.angle_deg.median()
per_layer = stats.groupby("layer").agg(clipped=("fraction_clipped", "median"), length=("length_change", "median"),
                                      angle=("angle_deg", "median"))
detail = "; ".join(f"{k}: {100 * r.clipped:.2f} % clipped, length {100 * r.length:+.2f} %, {r.angle:.2f}°"
                   for k, r in per_layer.iterrows())
SETTING = "the paper: AlexNet on ImageNet, c = 2.5; here 8 workers, total batch 64, c = 2.5"
CLIP_ROWS = stats[["step", "layer", "worker", "fraction_clipped", "length_change", "angle_deg"]].assign(
    gaussian_length_change=ref["length_change"], gaussian_angle_deg=ref["angle_deg"])
claims = [
    claim("clipping changes the length little",
          source("tg-body", "paraphrase: clipping at 2.5σ changes the gradient's length by about 1.0-1.5 %",
                 where="Sec. 3.3"),
          f"median |change| {length:.2f} % (Gaussian reference {100 * abs(ref['length_change']):.2f} %)",
          0.5 <= length <= 3.0, kind="paper claim (proxy)", setting=SETTING,
          test="tolerance, no statistical test: the median over steps and workers inside [0.5, 3] % (around the "
               "paper's 1.0-1.5 %); one run, seed 0", scale="convnet", rows=CLIP_ROWS),
    claim("clipping changes the direction little",
          source("tg-body", "paraphrase: clipping at 2.5σ turns the gradient by about 2-3°", where="Sec. 3.3"),
          f"median angle {angle:.2f}° (Gaussian reference {ref['angle_deg']:.2f}°)", 1.0 <= angle <= 6.0,
          kind="paper claim (proxy)", setting=SETTING,
          test="tolerance, no statistical test: the median angle inside [1, 6]° (around the paper's 2-3°); one run, "
               "seed 0", scale="convnet", rows=CLIP_ROWS),
    claim("per layer (median over steps and workers)",
          source("tg-body", "paraphrase: one conv and one fc layer's gradient histograms, clipped at 2.5σ",
                 where="Fig. 2"),
          detail, None, kind="paper claim (proxy)", setting="AlexNet; here seed 0", scale="convnet", rows=CLIP_ROWS),
]
save(fig, "fig01_gradient_histograms", df, QUICK, claims)
