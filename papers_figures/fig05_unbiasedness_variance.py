# %% [markdown]
# # Fig. 5 (tgsim): unbiasedness and variance -- measured against exact, and the test's power
#
# TernGrad (Eq. 5) and its peers claim unbiased encodings E[Q(g)] = g with a known error: TernGrad's
# E||Q(g) - g||² = s||g||_1 - ||g||² (docs/THEORY.md §1.2), QSGD's Lemma 3.1 and so on (§2).
#
# (a) measured relative error E||Q - g||²/||g||² against the exact formula: every registered codec
#     through the real encode/decode (`tgsim compare variance`, all bit budgets, N = 1, 8, 32 workers,
#     its CSV) and the peers' pure functions (`tgsim.analysis.variance.variance_table`, R draws).
# (b) the power of the exact binomial unbiasedness test: the smallest multiplicative bias δ it detects
#     with power 0.9 against the number of draws R (`tgsim.analysis.unbiased_check.power_curve`).
# (c) every registered codec's declared unbiasedness against the test (`unbiased_check.codec_table`), each in
#     its registered default configuration, which the tick label names where it decides the declaration:
#     TernGrad's default is the paper's recipe, explicit clipping at 2.5σ, so it is declared biased
#     (TernGrad.unbiased: no clipping and no MEAN sharing); TernGrad without clipping, "terngrad[clip=none]",
#     is the unbiased variant of Eq. 5 and is tested beside it. A codec without a relative bias value
#     (PowerSGD, tested as a matrix) is drawn at the floor with a hollow marker.
# Full: n = 3000, R = 1000 draws, R grid 100..10000 (plus `tgsim compare variance`, shared with
# fig07 and fig10); `--quick`: n = 1000, R = 200, R grid 100..3000. Run times: docs/MEASUREMENTS.md.

# %%
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, compare_outputs  # noqa: E402
from _theme import source, claim, log_ticks, plt, save, sns, theme  # noqa: E402

from tgsim.analysis.common import gradient_shapes, single_thread  # noqa: E402
from tgsim.analysis.unbiased_check import codec_table, power_curve  # noqa: E402
from tgsim.analysis.variance import variance_table  # noqa: E402
from tgsim.codecs import registry  # noqa: E402

# the peers' functions named as the registry names the same codec, so that panel (a) shows one label per codec
PEER_NAMES = {"top_k": "topk", "random_sparsification": "randomk"}
# categories that are not codecs (the two sources of (a), the two declarations of (c)) in colours no codec has
# (orange, blue and the rest mean a codec in every figure: _theme.CODEC_COLORS), told apart by marker too
NONCODEC_COLORS = ("#ddcc77", "#404040")     # sand, dark slate
QUICK, OUT = command_line("Unbiasedness and variance: measured against exact error; the power of the test.")
N, R, RS = (1000, 200, (100, 300, 1000, 3000)) if QUICK else (3000, 1000, (100, 300, 1000, 3000, 10000))

with single_thread():
    shapes = gradient_shapes(N, 0, None)
    var, _ = variance_table(shapes, R=R)
    power = power_curve(shapes, RS)
    # the registered defaults, and TernGrad's unbiased variant (no clipping) beside its default (clipping 2.5σ)
    codecs = codec_table([*registry.names(), "terngrad[clip=none]"], n=20_000 if not QUICK else 5_000)
cv = pd.read_csv(compare_outputs("variance", QUICK) / "variance.csv")
theme()    # the compare run may have set its own

# %% tidy: (a) one row per measured error; (b) power; (c) codecs
a_peer = var[var.quantity == "error"].assign(source="peers' pure functions (analysis/variance)",
                                             measured=lambda d: d.empirical / d.norm2, exact=lambda d: d.formula / d.norm2,
                                             label=lambda d: d.quantizer.str.replace(r"\[.*", "", regex=True)
                                             .replace(PEER_NAMES),
                                             reject=lambda d: d.reject.astype(bool))
ok = cv[(cv.status == "ok") & (cv.exact_rel_mse > 0)]
a_codec = ok.assign(source="registered codecs, N = 1/8/32 (compare variance)", measured=ok.rel_mse,
                    exact=ok.exact_rel_mse, label=ok.codec, shape=ok.kind, reject=(ok.p_value < 0.05 / max(len(ok), 1))
                    & (np.abs(ok.rel_mse / ok.exact_rel_mse - 1) > 1e-3))  # Bonferroni 5 %, and off by > 0.1 %
cols = ["panel", "source", "label", "shape", "measured", "exact", "reject"]
df = pd.concat([a_peer.assign(panel="a")[cols], a_codec.assign(panel="a")[cols],
                power.assign(panel="b", label="binomial test", source="exact power")[
                    ["panel", "source", "label", "shape", "R", "delta_power50", "delta_power90", "delta_power99"]],
                codecs.assign(panel="c", label=codecs.codec, source=codecs.test)[
                    ["panel", "source", "label", "declared_unbiased", "reject", "min_detectable_bias",
                     "largest_relative_error", "consistent"]]], ignore_index=True)

# %% figure
fig, ax = plt.subplot_mosaic([["a", "a"], ["b", "c"]], figsize=(13, 10.5), gridspec_kw={"height_ratios": [1.1, 1]})
axes = [ax["a"], ax["b"], ax["c"]]
a = df[df.panel == "a"].assign(reject=lambda d: d.reject.astype(bool))
a["ratio"] = a.measured / a.exact
a["verdict"] = np.where(a.reject, "rejected (Bonferroni, and off by > 0.1 %)", "accepted")
order = sorted(a.label.unique(), key=lambda x: (not x.startswith("terngrad"), x))
SOURCES_A = sorted(a.source.unique())
sns.stripplot(data=a, x="label", y="ratio", hue="source", order=order, hue_order=SOURCES_A, dodge=True, jitter=0.25,
              size=4, alpha=0.85, ax=axes[0], palette=dict(zip(SOURCES_A, NONCODEC_COLORS)), linewidth=0.4,
              edgecolor="black")
bad = a[a.reject]
if len(bad):
    axes[0].scatter([order.index(x) for x in bad.label], bad.ratio, marker="X", s=80, color="black", zorder=5,
                    label="rejected (Bonferroni 5 %, off by > 0.1 %)")
axes[0].axhline(1.0, color="black", lw=1, label="measured = exact")
axes[0].set(xlabel="codec or quantizer", ylabel="measured / exact  E||Q(g) - g||² (ratio)",
            title=f"(a) error: measured over exact, every shape, bit budget and N ({len(a)} rows; "
                  f"exact error {a.exact[a.exact > 0].min():.0e} to {a.exact.max():.0e} of ||g||²)")
plt.setp(axes[0].get_xticklabels(), rotation=30, ha="right", rotation_mode="anchor")
axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="source")
b = df[df.panel == "b"]
# gradient shapes are not codecs: shades of grey, told apart by marker and dash too
SHAPES_B = list(dict.fromkeys(b["shape"]))
sns.lineplot(data=b, x="R", y="delta_power90", hue="shape", style="shape", markers=True, ax=axes[1],
             hue_order=SHAPES_B, palette=dict(zip(SHAPES_B, sns.color_palette("Greys_r", len(SHAPES_B) + 1))))
axes[1].set(xscale="log", yscale="log", xlabel="draws R of the binomial test",
            ylabel="smallest bias δ detected, power 0.9  (fraction)",
            title=f"(b) power of the exact test\n(n = {N}, α = 1e-3)")
axes[1].legend(title="gradient shape", loc="lower left")
log_ticks(axes[1], "x", b.R, pad=1.3)
log_ticks(axes[1], "y", b.delta_power90, pad=1.3)
c = df[df.panel == "c"].copy()
HUE_ORDER = ["declared unbiased", "declared biased"]
DECLARED_COLORS = dict(zip(HUE_ORDER, NONCODEC_COLORS))


def codec_label(name: str) -> str:
    """The tick label of a registered codec in panel (c): TernGrad's names its clipping and sharing (its
    declaration depends on them: TernGrad.unbiased), other codecs their registered name."""
    from tgsim.analysis.common import split_label

    base, opts, _, _ = split_label(name)
    if base != "terngrad":
        return name
    codec = registry.make(base, **opts)
    clip = f"clip {codec.clip_factor:g}σ" if codec.clip != "none" else "no clipping"
    return f"{name} ({clip}, {codec.sharing.upper()})"


c["declared"] = np.where(c.declared_unbiased.astype(bool), "declared unbiased", "declared biased")
c["verdict"] = np.where(c.reject.astype(bool), "test rejects unbiasedness", "test accepts")
c["bias"] = np.maximum(c.largest_relative_error.astype(float), 1e-6)
no_value = c.bias.isna()            # tested as a matrix (PowerSGD): no relative bias to draw
c["bias"] = c.bias.fillna(1e-6)
c["label"] = [codec_label(x) for x in c.label]
sns.scatterplot(data=c[~no_value], x="label", y="bias", hue="declared", style="verdict", s=90, ax=axes[2],
                markers={"test rejects unbiasedness": "X", "test accepts": "o"}, hue_order=HUE_ORDER,
                palette=DECLARED_COLORS, edgecolor="black")
if no_value.any():
    axes[2].scatter(c[no_value].label, c[no_value].bias, marker="o", s=90, facecolor="none",
                    edgecolor=[DECLARED_COLORS[x] for x in c[no_value].declared], zorder=3,
                    label="no relative bias (matrix test); at the floor")
axes[2].set(yscale="log", xlabel="registered codec (default configuration; TernGrad also without clipping)",
            ylabel="largest relative bias measured  (fraction, floor 1e-6)",
            title="(c) declared unbiasedness\nagainst the test")
plt.setp(axes[2].get_xticklabels(), rotation=40, ha="right", rotation_mode="anchor")
axes[2].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
fig.suptitle(f"Synthetic vectors (n = {N}); every table's draws from seed 0 (tgsim compare variance: its --seed, 0)",
             y=1.02)
fig.tight_layout()

# %% claims, from the data
tern = a[a.label.str.startswith("terngrad")]
tern_none = a_peer[a_peer.quantizer == "terngrad[none]"]
p90 = b[b.R == max(RS)].set_index("shape").delta_power90
claims = [
    claim("TernGrad's error is s||g||_1 - ||g||² (unclipped)", source("tgsim", where="docs/THEORY.md §1.2, from the paper's Sec. 3"),
          f"{int((~tern_none.reject).sum())}/{len(tern_none)} shapes inside the α = 1e-3 interval "
          f"(largest |measured/exact - 1| {np.max(np.abs(tern_none.measured / tern_none.exact - 1)):.3f})",
          not tern_none.reject.any(), kind="self-check", setting="synthetic vectors; tgsim's TernGrad codec",
          test="the measured mean error inside its alpha = 1e-3 interval around the exact formula, every shape",
          rows=tern_none,
          scale="synthetic"),
    claim("every codec's measured error matches its exact formula", source("tgsim", where="docs/THEORY.md: QSGD Lemma 3.1, Suresh et al., TernGrad §1.2"),
          f"{int((~a.reject).sum())}/{len(a)} rows accepted ({int(a.reject.sum())} rejected; TernGrad variants "
          f"{int((~tern.reject).sum())}/{len(tern)})", not a.reject.any(), kind="self-check",
          setting="every registered codec through its real encode/decode",
          test="the measured mean error inside its alpha = 1e-3 interval around the exact formula, every row", rows=a,
          scale="synthetic"),
    claim("declared unbiasedness agrees with the test",
          source("tgsim", where="codec declarations: QSGD, Suresh, random-k and TernGrad without clipping "
                 "(terngrad[clip=none]) unbiased; TernGrad as registered (the paper's explicit clipping at 2.5σ, "
                 "TernGrad.unbiased), fp16, bf16, sign, scaled sign, top-k and PowerSGD biased"),
          f"{int(c.consistent.astype(bool).sum())}/{len(c)} codecs consistent (the registered defaults and "
          "terngrad[clip=none]); " + "; ".join(f"{r.label}: declared {'unbiased' if r.declared_unbiased else 'biased'}, "
                                               f"{'rejected' if r.reject else 'accepted'}"
                                               for r in c[c.label.str.startswith("terngrad")].itertuples()),
          bool(c.consistent.astype(bool).all()), kind="self-check", setting="every registered codec, default options",
          test="exact binomial unbiasedness test (tgsim.analysis.unbiased_check.codec_table) against each codec's "
               "declaration", scale="synthetic", rows=c),
    claim("power of the unbiasedness test", source("tgsim", where="unbiasedness test"),
          f"at R = {max(RS)} a bias of {p90.min():.2%}-{p90.max():.2%} is detected with power 0.9", None,
          kind="self-check", scale="synthetic"),
]
save(fig, "fig05_unbiasedness_variance", df, QUICK, claims)
