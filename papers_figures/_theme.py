"""One look for every figure script (`figNN_*.py`) and one way to write its outputs.

`theme()` sets the seaborn theme (whitegrid, colorblind palette, readable fonts) for every figure;
`save(fig, name, df, quick, claims)` writes, under papers_figures/out/ (quick: out/quick/; both move
with TGSIM_FIGURES_OUT, as `_common` does):

    NAME.png, NAME.pdf   the figure
    NAME.csv             the tidy data frame drawn in it (one row per plotted value)
    NAME_claims.csv      optional: one row per claim checked by the figure (`claim(...)`), with
                         the columns CLAIM_COLUMNS: claim; paper (the words tested, in quotes, and
                         where a reader finds them: `source(...)`; or "paraphrase: ..." with its
                         place); measured (computed here from `df`); verdict (VERDICTS); kind
                         (KINDS, below); setting (the setting the paper made it in); test (the test
                         behind the verdict: its name, margin, alpha and seeds); scale (how the row
                         depends on this repository's small models and emulated links, SCALE);
                         rows (the path, relative to the report, of the table the verdict used);
                         role (ROLES: how the report's summary counts the row; "" = under its verdict);
                         note (optional: what the verdict hinges on, printed beside it in the summary);
                         key (optional: the claim the row tests when its quoted words do not say it;
                         the summary counts one claim once, make_report.claim_groups)
    inputs/NAME_K.csv    the rows claim K's verdict was decided on (`claim(..., rows=df)`), so that
                         every number printed beside a verdict can be traced to its data

KINDS, what a row tests (the report counts each kind apart):
    paper claim           a claim of Wen et al. 2017 or Jiang & Agrawal 2018 about their own method,
                          under their own rule (TernGrad as published: MAX sharing, fp32's rate)
    paper claim (proxy)   such a claim judged on a stand-in: a quantity it implies rather than the one
                          it states (the quantizer's error or gap for "improves convergence", bits
                          for communication time, modeled for measured time), or this repository's
                          small models and data for the paper's (AlexNet, GoogLeNet, CIFAR-10)
    model arithmetic      the performance model's own formulas (no measurement)
    tgsim variant         a claim tested on tgsim's variants, not the paper's method (MEAN sharing,
                          the exact-sum downlink)
    reviewer question     a question of the public reviews, answered with data (fp16 baselines,
                          each method's own tuned rate)
    other paper's result  a result of QSGD, Stich et al., Suresh et al. or SGD theory
    self-check            tgsim's code against an exact formula or its own declaration

and prints one `wrote PATH` line per file. `make_report.py` embeds the PNG and renders the claims
table in REPORT.md. `label_points(ax, xs, ys, texts)` writes a label beside each point where it
overlaps no other label or marker (call it after the last `tight_layout`).

Every figure goes out through `save_figure(fig, paths, quick)` (`save` calls it; the sweep scripts that
write their own CSVs call it directly): it stamps a quick run's figure with QUICK_MARK above everything
else (`mark_quick`), then runs `check_layout(fig)` and raises LayoutError, writing nothing, when the
figure has overlapping tick labels, an axis with data but no label, a panel letter used twice, a
log axis with fewer than 3 tick labels, a line drawn exactly under another, or a panel's text
reaching outside the panel (`_layout.check_layout`). The
CSVs of a quick run carry a `quick` column (`_common.write_csv`).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from _common import OUT, QUICK_MARK, QUICK_OUT, print_written, write_csv  # noqa: E402
from _layout import LayoutError, check_layout  # noqa: E402,F401

CLAIM_COLUMNS = ["claim", "paper", "measured", "verdict", "kind", "setting", "test", "scale", "rows", "role", "note",
                 "key"]
INPUTS = "inputs"       # the folder beside the claims CSVs (and REPORT.md) holding each verdict's rows
KINDS = ("paper claim", "paper claim (proxy)", "model arithmetic", "tgsim variant", "reviewer question",
         "other paper's result", "self-check")
VERDICTS = ("confirmed", "conditional", "not confirmed", "inconclusive", "split", "n/a", "untestable here")
# "conditional": the test passed, but a condition of the claim's own rule was not checked here (the row's
# setting names it), so it is not counted as confirmed.
# ROLES, how the report's summary counts a row (the `role` column; "" = counted under its verdict):
ROLES = {
    "": "counted under its verdict",
    "supporting": "listed with its kind, not counted: it supports a row that counts the same claim once",
    "placeholder": "no measurement of its own (it points to another row's runs), not counted",
    "re-test": "a reviewer-question row that re-tests a claim (the paper's, or the reviewer's premise) in the "
               "reviewer's setting rather than answering a question; counted on a line of its own",
}
# Where a reader finds the words a row tests. The texts at hand when the report was made: TernGrad's
# abstract (arXiv 1705.07878) and the public reviews of both papers (NIPS 2017 paper 970, NeurIPS 2018
# paper 1261); anything else is marked as not checked against them.
UNCHECKED = "not checked here: only the TernGrad abstract and the public reviews were at hand"
SOURCES = {
    "tg-abstract": "Wen et al., NIPS 2017, abstract (arXiv 1705.07878)",
    "tg-review": "public review of TernGrad, NIPS 2017 (paper 970), reviewer {n}",
    "ja-review": "public review of Jiang & Agrawal, NeurIPS 2018 (paper 1261), reviewer {n}",
    "tg-body": "Wen et al., NIPS 2017, {where}; " + UNCHECKED,
    "ja-abstract": "Jiang & Agrawal, NeurIPS 2018, abstract (papers.nips.cc); " + UNCHECKED,
    "tgsim": "tgsim's {where} (not in either paper)",
}
PAPERS = {"terngrad": "Wen et al., NeurIPS 2017 (TernGrad)",
          "jiang": "Jiang & Agrawal, NeurIPS 2018 (linear speedup, PQASGD)"}
# What each scale-dependent row rests on; REPORT.md's caveat lists them at the top.
SCALE = {
    "convnet": "MNIST-1D convnet, 23,882 parameters, 4,000 training samples (the paper: AlexNet and GoogLeNet, "
               "its abstract's networks)",
    "logreg": "logistic regression, 640 weights",
    "lsq": "least squares, 64 dimensions (synthetic)",
    "mlp": "MLP on scikit-learn's digits (1,797 samples)",
    "synthetic": "synthetic vectors and the convnet's gradients",
    "model": "model only: the performance model's formulas, no measured time",
    "link": "emulated 1 Gb/s link on loopback (tc), 2-4 ranks on one machine",
}


def theme() -> None:
    """The seaborn theme shared by all figures and `tgsim plot` (tgsim.plotting.theme.theme)."""
    from tgsim.plotting.theme import theme as shared

    shared()


theme()

# One colour per codec in every figure (fig03, fig06, fig07, fig09, fig10, fig11): a method keeps its colour
# from panel to panel and from figure to figure, and no colour stands for anything else where codecs are
# drawn (a model, a problem or an exchange mode is told by marker, line style or hatch instead). A codec's
# variants (TernGrad's sharing and scope, QSGD's levels, PowerSGD's rank) are shades of its own hue; error
# feedback does not change the colour (the label says "+ef"). Okabe-Ito's colour-blind safe hues where they
# fit (black, orange, vermillion, blue, sky blue, pink); the rest chosen so that every two colours of the
# table lie at least MIN_COLOR_DISTANCE apart (CIEDE2000, `color_distance`; the only equal pairs are a family
# and its default variant, "qsgd" = "qsgd[levels=7]", "powersgd" = "powersgd[rank=2]").
# tgsim.plotting.theme holds no palette of its own (its seaborn "colorblind" cycle is the fallback for what is
# not a codec).
CODEC_COLORS = {
    "fp32": "#000000",                    # the reference: black
    "fp16": "#747474", "bf16": "#b9b9b9",  # the other floats: greys
    "terngrad": "#e69f00",                # TernGrad as the paper runs it (MAX sharing, clipping 2.5σ): orange
    "terngrad[sharing=mean]": "#7c5808",  # tgsim's MEAN sharing: dark brown (an ochre shade of the orange)
    "terngrad[scope=model]": "#d55e00",   # one scaler for the whole model: vermillion
    "terngrad[sharing=none]": "#73b7aa",  # each worker's own scaler: teal (an orange shade would pass for MAX's)
    "terngrad+pqasgd": "#cc79a7",         # PQASGD (Jiang & Agrawal: TernGrad on the model difference): pink
    "fp32+pqasgd": "#695c9e",             # sparse parameter averaging (Q = identity): slate purple
    "qsgd": "#0072b2", "qsgd[levels=7]": "#0072b2",   # QSGD: blues, darker with more levels
    "qsgd[levels=1]": "#56b4e9", "qsgd[levels=8]": "#045763", "qsgd[levels=127]": "#01315b",
    "suresh": "#2d783e",                  # dark green
    "randomk": "#a3c124",                 # yellow-green
    "topk": "#8a1251",                    # wine
    "sign": "#4f057f",                    # the sign codecs: violet, scaled sign lighter (periwinkle)
    "scaled_sign": "#8386ff",
    "powersgd": "#b94e4c", "powersgd[rank=2]": "#b94e4c",   # PowerSGD: brick red, darker with a higher rank
    "powersgd[rank=1]": "#feac92", "powersgd[rank=4]": "#4d1c12",
}
MIN_COLOR_DISTANCE = 18.0    # CIEDE2000 between any two different colours of CODEC_COLORS (about 8 "just noticeable")


def _lab(color) -> tuple[float, float, float]:
    """CIELAB (D65) of a matplotlib colour (sRGB)."""
    rgb = np.asarray(matplotlib.colors.to_rgb(color), np.float64)
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124564, 0.3575761, 0.1804375], [0.2126729, 0.7151522, 0.0721750],
                    [0.0193339, 0.1191920, 0.9503041]]) @ lin / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def color_distance(a, b) -> float:
    """The CIEDE2000 colour difference of two colours (matplotlib colour specs, or CIELAB triples as
    tuples of 3 floats): about 1 is the smallest a viewer notices side by side; Sharma, Wu and Dalal
    (2005) give the formula and its test pairs."""
    import math

    L1, a1, b1 = a if isinstance(a, tuple) and len(a) == 3 and not isinstance(a[0], str) else _lab(a)
    L2, a2, b2 = b if isinstance(b, tuple) and len(b) == 3 and not isinstance(b[0], str) else _lab(b)
    cbar = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(cbar ** 7 / (cbar ** 7 + 25 ** 7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1, c2 = math.hypot(a1p, b1), math.hypot(a2p, b2)
    h1 = math.degrees(math.atan2(b1, a1p)) % 360 if c1 else 0.0
    h2 = math.degrees(math.atan2(b2, a2p)) % 360 if c2 else 0.0
    dh = 0.0 if c1 * c2 == 0 else (h2 - h1 - 360 if h2 - h1 > 180 else h2 - h1 + 360 if h2 - h1 < -180 else h2 - h1)
    d_big_h = 2 * math.sqrt(c1 * c2) * math.sin(math.radians(dh / 2))
    lbar, cbarp = (L1 + L2) / 2, (c1 + c2) / 2
    if c1 * c2 == 0:
        hbar = h1 + h2
    elif abs(h1 - h2) <= 180:
        hbar = (h1 + h2) / 2
    else:
        hbar = (h1 + h2 + 360) / 2 if h1 + h2 < 360 else (h1 + h2 - 360) / 2
    t = (1 - 0.17 * math.cos(math.radians(hbar - 30)) + 0.24 * math.cos(math.radians(2 * hbar))
         + 0.32 * math.cos(math.radians(3 * hbar + 6)) - 0.20 * math.cos(math.radians(4 * hbar - 63)))
    rc = 2 * math.sqrt(cbarp ** 7 / (cbarp ** 7 + 25 ** 7))
    rt = -math.sin(math.radians(60 * math.exp(-(((hbar - 275) / 25) ** 2)))) * rc
    sl = 1 + 0.015 * (lbar - 50) ** 2 / math.sqrt(20 + (lbar - 50) ** 2)
    sc, sh = 1 + 0.045 * cbarp, 1 + 0.015 * cbarp * t
    dl, dc, dhh = (L2 - L1) / sl, (c2 - c1) / sc, d_big_h / sh
    return math.sqrt(dl ** 2 + dc ** 2 + dhh ** 2 + rt * dc * dhh)


OTHER_COLOR = "#999999"      # a codec with no entry and no family in CODEC_COLORS


def codec_color(label: str) -> str:
    """The colour of a method label ("NAME[key=value][+ef][+pqasgd]", as the compare CSVs name methods) in
    every figure: CODEC_COLORS[label]; else the label without "+ef"; else, for a "+pqasgd" label, its
    codec's own "+pqasgd" entry or PQASGD's colour (terngrad+pqasgd's: periodic quantized averaging,
    whatever its quantizer); else its codec's family colour (the name before "["); else OTHER_COLOR."""
    base = label.replace("+ef", "")
    for key in (label, base):
        if key in CODEC_COLORS:
            return CODEC_COLORS[key]
    family = base.split("[", 1)[0].removesuffix("+pqasgd")
    if base.endswith("+pqasgd"):
        return CODEC_COLORS.get(family + "+pqasgd", CODEC_COLORS["terngrad+pqasgd"])
    return CODEC_COLORS.get(family, OTHER_COLOR)


def codec_palette(labels) -> dict:
    """{label: codec_color(label)} for the method labels `labels`."""
    return {m: codec_color(m) for m in labels}


def out_dir(quick: bool) -> Path:
    d = QUICK_OUT if quick else OUT
    d.mkdir(parents=True, exist_ok=True)
    return d


def verdict(ok) -> str:
    """'confirmed' (true) / 'not confirmed' (false) / 'n/a' (None or NaN); a string in VERDICTS as is; a
    dict (a tgsim.analysis.verdicts result) by its 'verdict'."""
    if isinstance(ok, dict):
        ok = ok["verdict"]
    if isinstance(ok, str):
        if ok not in VERDICTS:
            raise ValueError(f"verdict {ok!r} is not one of {VERDICTS}")
        return ok
    if ok is None or (isinstance(ok, float) and ok != ok):
        return "n/a"
    return "confirmed" if bool(ok) else "not confirmed"


def source(key: str, words: str = "", **fields) -> str:
    """The `paper` cell of a claim: `words` quoted exactly (or a paraphrase, when `words` starts with
    "paraphrase:") followed by where a reader finds them, SOURCES[key] filled with `fields` (n: the
    reviewer's number; where: a section, table or file)."""
    place = SOURCES[key].format(**fields)
    if not words:
        return f"({place})"
    if words.startswith("paraphrase:"):
        return f"{words} ({place})"
    return f'"{words}" ({place})'


def claim(claim: str, paper: str, measured: str, ok, *, kind: str, setting: str = "", test: str = "",
          scale: str = "", rows=None, role: str = "", note: str = "", key: str = "") -> dict:
    """One row of a claims table (CLAIM_COLUMNS, see the module docstring).

    `paper`: the paper's words, quoted exactly with their place ('"..." (Sec. 3.3)'), or a line
    starting "paraphrase:" (a self-check may name its reference instead). `ok`: bool, None, a verdict
    string or a tgsim.analysis.verdicts result (its `test` is used when `test` is empty). `kind`: one of
    KINDS. `role`: one of ROLES ("" counts the row under its verdict; "supporting", "placeholder" and
    "re-test" are counted as ROLES says). `note`: what the verdict hinges on, in a few words (the summary
    prints it beside the verdict). `key`: the claim the row tests, when its quoted words do not say it
    (two claims in one quoted sentence, or one paraphrased sentence tested by several rows): the report's
    summary counts the rows of one claim once (make_report.claim_groups; "" = the quoted words). `scale`: keys of SCALE joined by "+" (expanded) or free text. `rows`: the data frame the
    verdict was decided on (written by `save` to inputs/NAME_K.csv, its path in the row's `rows`
    column). A verdict other than n/a needs a named test; a paper claim, a reviewer question or
    another paper's result needs a quote or a marked paraphrase with its place (`source`), and no
    row may send a reader to a path outside the repository (ValueError otherwise)."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {tuple(ROLES)}")
    if isinstance(ok, dict) and not test:
        test = ok["test"]
    v = verdict(ok)
    if v in ("confirmed", "conditional", "not confirmed", "inconclusive") and not test.strip():
        raise ValueError(f"claim {claim!r}: a verdict ({v}) needs the test it came from")
    if kind in ("paper claim", "paper claim (proxy)", "reviewer question", "other paper's result", "tgsim variant",
                "model arithmetic") \
            and not (paper.lstrip().startswith(('"', "“")) or paper.startswith("paraphrase:")):
        raise ValueError(f"claim {claim!r}: the paper's words must be quoted or marked 'paraphrase:'")
    if kind in ("paper claim", "paper claim (proxy)", "reviewer question") and not paper.rstrip().endswith(")"):
        raise ValueError(f"claim {claim!r}: the words must name where a reader finds them (`source`)")
    if "../" in paper + measured + test + setting:
        raise ValueError(f"claim {claim!r}: a path outside the repository")
    if scale and all(k in SCALE for k in scale.split("+")):
        scale = "; ".join(SCALE[k] for k in scale.split("+"))
    out = {"claim": claim, "paper": paper, "measured": measured, "verdict": v, "kind": kind, "setting": setting,
           "test": test, "scale": scale, "rows": "", "role": role, "note": note, "key": key}
    if rows is not None:
        out["_rows"] = rows
    return out


def untestable(name: str, paper: str, why: str, would_test: str, *, kind: str = "paper claim",
               setting: str = "", key: str = "") -> dict:
    """The claim `name`, out of reach at this scale: verdict "untestable here", `measured` says why and
    what would test it, `test` says that none ran; `key` as in `claim`."""
    return {**claim(name, paper, f"not measured: {why}. Would test it: {would_test}", "untestable here", kind=kind,
                    setting=setting, key=key), "test": "none (out of reach here)"}


def seeds_note(seeds) -> str:
    """'N seed(s): a, b, c' for a figure's title or caption: every figure states its seeds."""
    seeds = sorted({int(s) for s in seeds})
    return f"{len(seeds)} seed(s): " + ", ".join(str(s) for s in seeds)


# Offsets (points) tried in order for a label: right-above, right-below, left-above, left-below, above,
# below, then twice as far.
_OFFSETS = [(6, 3), (6, -9), (-6, 3), (-6, -9), (0, 8), (0, -13),
            (12, 8), (12, -15), (-12, 8), (-12, -15), (0, 16), (0, -21)]


def label_points(ax, xs, ys, texts, fontsize: float = 7, marker_pt: float = 5) -> list:
    """Annotate point i with texts[i] at the first offset in _OFFSETS whose text box (in display
    coordinates, padded by 1 pt) lies inside the axes and overlaps no label placed before it, the
    axes' legend, and no point's marker (a square of half-side `marker_pt` points); when every offset overlaps something,
    the offset with the least overlapping area. Returns the annotations. Greedy, points in x order."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    scale = fig.dpi / 72.0
    centres = ax.transData.transform(list(zip(xs, ys)))
    half = marker_pt * scale
    markers = [Bbox.from_extents(cx - half, cy - half, cx + half, cy + half) for cx, cy in centres]
    frame = ax.get_window_extent(renderer)
    placed, out = [], []
    if ax.get_legend() is not None:
        placed.append(ax.get_legend().get_window_extent(renderer))

    def overlap(a, b) -> float:
        w = min(a.x1, b.x1) - max(a.x0, b.x0)
        h = min(a.y1, b.y1) - max(a.y0, b.y0)
        return w * h if w > 0 and h > 0 else 0.0

    for i in sorted(range(len(texts)), key=lambda k: (centres[k][0], centres[k][1])):
        best = None
        for dx, dy in _OFFSETS:
            ann = ax.annotate(texts[i], (xs[i], ys[i]), xytext=(dx, dy), textcoords="offset points",
                              fontsize=fontsize, ha="left" if dx > 0 else "right" if dx < 0 else "center")
            b = ann.get_window_extent(renderer)
            box = Bbox.from_extents(b.x0 - scale, b.y0 - scale, b.x1 + scale, b.y1 + scale)
            cost = sum(overlap(box, b) for b in placed) + sum(overlap(box, m) for m in markers)
            outside = box.width * box.height - overlap(box, frame)
            cost += outside
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, ann, box)
            else:
                ann.remove()
            if cost == 0:
                break
        placed.append(best[2])
        out.append(best[1])
    return out


def log_ticks(ax, which: str, values, pad: float = 1.25) -> list[float]:
    """On a log `which` ("x" or "y") axis: limits that cover `values` (padded by the factor `pad`) and
    labelled ticks at 1-2-5 x 10^k inside them; at 1-1.5-2-3-4-5-6-8 x 10^k where that gives fewer than
    3; at 10^k (every few decades, at most 8 ticks) where it gives more than 8. No minor labels.
    Returns the ticks."""
    import numpy as np
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    v = np.asarray(values, float)
    v = v[np.isfinite(v) & (v > 0)]
    if not len(v):
        return []
    lo, hi = v.min() / pad, v.max() * pad
    decades = 10.0 ** np.arange(np.floor(np.log10(lo)), np.ceil(np.log10(hi)) + 1)
    ticks = [float(m * d) for d in decades for m in (1, 2, 5) if lo <= m * d <= hi]
    if len(ticks) < 3:
        ticks = [float(m * d) for d in decades for m in (1, 1.5, 2, 3, 4, 5, 6, 8) if lo <= m * d <= hi]
    elif len(ticks) > 8:
        ticks = [float(d) for d in decades if lo <= d <= hi]
        ticks = ticks[::-(-len(ticks) // 8)]
    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xlim if which == "x" else ax.set_ylim)(lo, hi)
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.4g}"))
    axis.set_minor_locator(NullLocator())
    return ticks


def gap_axis(ax, gaps: pd.DataFrame, x: str, y: str, order, floor: float = -10.0, top: float = 5.0) -> None:
    """Limit an accuracy-gap axis (points) to [floor, top] around its margins (0 and -2 points), so that
    the gaps the verdicts judge stay readable, and write below the axis each method whose mean gap lies
    under `floor` with that mean ("off axis: topk -45.2"). `gaps`: the rows drawn (columns x, y);
    `order`: the x categories in drawn order. The axis keeps the data's range when it fits inside."""
    vals = gaps[y].to_numpy(dtype=float)
    vals = vals[np.isfinite(vals)]
    lo = min(float(vals.min()) - 1.0, -3.0) if vals.size else -3.0
    hi = max(float(vals.max()) + 1.0, 1.0) if vals.size else 1.0
    ax.set_ylim(max(lo, floor), min(hi, top))
    means = gaps.groupby(x)[y].mean()
    off = [f"{m} {means[m]:+.1f}" for m in order if m in means.index and np.isfinite(means[m]) and means[m] < floor]
    if off:
        ax.text(0.01, 0.02, "off axis (mean): " + ", ".join(off), transform=ax.transAxes, fontsize=7, va="bottom")


def mark_quick(fig, quick: bool) -> None:
    """On a quick run's figure, QUICK_MARK in bold red just above everything drawn (once; nothing when
    `quick` is false). Call it last: it sits above the figure's tight bounding box at call time."""
    if not quick or any(t.get_gid() == "quick-mark" for t in fig.texts):
        return
    renderer = fig.canvas.get_renderer()
    box = fig.get_tightbbox(renderer)          # inches; the text in figure fractions, which a tight save shifts
    w, h = fig.get_size_inches()
    fig.text(box.x0 / w, (box.y1 + 0.06) / h, QUICK_MARK, ha="left", va="bottom", fontsize=12, fontweight="bold",
             color="#c00000", gid="quick-mark")


def save_figure(fig, paths, quick: bool, **savefig) -> list[Path]:
    """Mark a quick run's figure (`mark_quick`), check its layout (`check_layout`: LayoutError, and
    nothing written, on any problem), write it to every path in `paths` (tight bounding box) and close it."""
    mark_quick(fig, quick)
    problems = check_layout(fig)
    if problems:
        plt.close(fig)
        raise LayoutError("figure layout problems:\n  " + "\n  ".join(problems))
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    for p in paths:
        fig.savefig(p, bbox_inches="tight", **savefig)
    plt.close(fig)
    return paths


def save(fig, name: str, df: pd.DataFrame, quick: bool, claims: list[dict] | None = None) -> list[Path]:
    """Write NAME.png, NAME.pdf, NAME.csv (and NAME_claims.csv) to out/ or out/quick/; close the figure.
    The figure goes through `save_figure` (quick mark, layout check) before any file is written."""
    d = out_dir(quick)
    paths = save_figure(fig, [d / f"{name}.png", d / f"{name}.pdf"], quick)
    paths.append(write_csv(df, d / f"{name}.csv", quick))
    if claims is not None:
        (d / INPUTS).mkdir(exist_ok=True)
        for old in (d / INPUTS).glob(f"{name}_*.csv"):
            old.unlink()
        rows = []
        for k, c in enumerate(claims, 1):
            c = dict(c)
            data = c.pop("_rows", None)
            if data is not None:
                rel = f"{INPUTS}/{name}_{k}.csv"
                paths.append(write_csv(pd.DataFrame(data), d / rel, quick))
                c["rows"] = rel
            rows.append(c)
        paths.append(write_csv(pd.DataFrame(rows, columns=CLAIM_COLUMNS), d / f"{name}_claims.csv", quick))
    print_written(paths)
    return paths
