"""One look for every figure script (`figNN_*.py`) and one way to write its outputs.

`theme()` sets the seaborn theme (whitegrid, colorblind palette, readable fonts) for every figure;
`save(fig, name, df, quick, claims)` writes, under papers_figures/out/ (quick: out/quick/; both move
with TGSIM_FIGURES_OUT, as `_common` does):

    NAME.png, NAME.pdf   the figure
    NAME.csv             the tidy data frame drawn in it (one row per plotted value)
    NAME_claims.csv      optional: one row per paper claim checked by the figure, with columns
                         claim, paper (what the paper reported, in words and numbers), measured
                         (computed here from `df`), verdict ("confirmed", "not confirmed", "n/a")

and prints one `wrote PATH` line per file. `make_report.py` embeds the PNG and renders the claims
table in REPORT.md.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from _common import OUT, QUICK_OUT, print_written  # noqa: E402

CLAIM_COLUMNS = ["claim", "paper", "measured", "verdict"]


def theme() -> None:
    """The seaborn theme shared by all figures."""
    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind", font_scale=0.9,
                  rc={"figure.dpi": 110, "savefig.dpi": 150, "axes.titlesize": 11, "axes.labelsize": 10,
                      "legend.fontsize": 8.5, "legend.title_fontsize": 9, "figure.titlesize": 12})


theme()


def out_dir(quick: bool) -> Path:
    d = QUICK_OUT if quick else OUT
    d.mkdir(parents=True, exist_ok=True)
    return d


def verdict(ok) -> str:
    """'confirmed' / 'not confirmed' / 'n/a' (None or NaN)."""
    if ok is None or (isinstance(ok, float) and ok != ok):
        return "n/a"
    return "confirmed" if bool(ok) else "not confirmed"


def claim(claim: str, paper: str, measured: str, ok) -> dict:
    """One row of a claims table (see the module docstring)."""
    return {"claim": claim, "paper": paper, "measured": measured, "verdict": verdict(ok)}


def save(fig, name: str, df: pd.DataFrame, quick: bool, claims: list[dict] | None = None) -> list[Path]:
    """Write NAME.png, NAME.pdf, NAME.csv (and NAME_claims.csv) to out/ or out/quick/; close the figure."""
    d = out_dir(quick)
    paths = [d / f"{name}.png", d / f"{name}.pdf", d / f"{name}.csv"]
    fig.savefig(paths[0], bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    df.to_csv(paths[2], index=False)
    if claims is not None:
        paths.append(d / f"{name}_claims.csv")
        pd.DataFrame(claims, columns=CLAIM_COLUMNS).to_csv(paths[-1], index=False)
    plt.close(fig)
    print_written(paths)
    return paths
