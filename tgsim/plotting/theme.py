"""The project's figure theme and the one way a figure of `tgsim plot` is written.

`theme()` sets the seaborn theme (whitegrid, colorblind palette, readable fonts) that the figure
scripts (papers_figures/_theme.py) and `tgsim plot` share. `save_checked(fig, path)` runs the layout
check (tgsim.plotting.layout.check_layout) and writes the figure only when it passes: LayoutError
naming every problem otherwise, nothing written.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tgsim.plotting.layout import LayoutError, check_layout  # noqa: E402

RC = {"figure.dpi": 110, "savefig.dpi": 150, "axes.titlesize": 11, "axes.labelsize": 10,
      "legend.fontsize": 8.5, "legend.title_fontsize": 9, "figure.titlesize": 12}


def theme() -> None:
    """Set the seaborn theme shared by every figure of the project (global matplotlib state)."""
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind", font_scale=0.9, rc=RC)


def save_checked(fig, path: str | Path, **savefig) -> Path:
    """Check `fig`'s layout (`check_layout`), write it to `path` (tight bounding box; `savefig`: more
    arguments of Figure.savefig) and close it; returns the path. LayoutError listing the problems,
    the figure closed and nothing written, when the check finds any."""
    problems = check_layout(fig)
    if problems:
        plt.close(fig)
        raise LayoutError("figure layout problems:\n  " + "\n  ".join(problems))
    path = Path(path)
    fig.savefig(path, bbox_inches="tight", **savefig)
    plt.close(fig)
    return path
