"""The layout check of every figure, `check_layout(fig)` and LayoutError: tgsim.plotting.layout's checks
(in the package, so that `tgsim plot` runs the same ones), imported here by the bare name the figure
scripts use (`from _layout import check_layout`), plus one check the package's lacks:

- a title running into another panel: an axes title (left, centre or right) whose drawn rectangle,
  shrunk by tgsim's SLACK_PX, overlaps another visible axes' frame, title, axis label or tick labels,
  or its own axes' y label (fig11's panel (a) title ran into panel (b)'s y label; tgsim.plotting.layout
  compares tick labels with tick labels only, so it passed that figure).
"""

from __future__ import annotations

from tgsim.plotting.layout import *  # noqa: F401,F403
from tgsim.plotting.layout import SLACK_PX, LayoutError  # noqa: F401
from tgsim.plotting.layout import _name, check_layout as _package_check, tick_labels  # noqa: F401


def _shrunk(box):
    from matplotlib.transforms import Bbox

    return Bbox.from_extents(box.x0 + SLACK_PX, box.y0 + SLACK_PX, box.x1 - SLACK_PX, box.y1 - SLACK_PX)


def _texts_of(ax, renderer) -> list[tuple[str, object]]:
    """(what, drawn box) of `ax`'s titles, axis labels and shown tick labels (non-empty, visible)."""
    out = []
    for loc in ("left", "center", "right"):
        t = ax.title if loc == "center" else getattr(ax, f"_{loc}_title")
        if t.get_visible() and t.get_text().strip():
            out.append((f"title {t.get_text().splitlines()[0][:40]!r}", t.get_window_extent(renderer)))
    for what, lab in (("x label", ax.xaxis.label), ("y label", ax.yaxis.label)):
        if lab.get_visible() and lab.get_text().strip():
            out.append((f"{what} {lab.get_text()[:40]!r}", lab.get_window_extent(renderer)))
    return out


def title_overlaps(fig) -> list[str]:
    """Titles of `fig`'s axes that run into another axes (its frame, title, axis labels or tick labels) or
    into their own y label (module docstring), one sentence each; [] when none. Draws the figure."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    ticks = {}
    for where, lab in tick_labels(fig):
        ticks.setdefault(where.rsplit(" ", 1)[0], []).append((f"tick label {lab.get_text()!r}",
                                                               lab.get_window_extent(renderer)))
    problems = []
    for ax in axes:
        titles = [(w, b) for w, b in _texts_of(ax, renderer) if w.startswith("title")]
        for other in axes:
            if other is ax:       # its own y label (a title wider than its panel runs into it)
                targets = [(w, b) for w, b in _texts_of(ax, renderer) if w.startswith("y label")]
            else:
                targets = [("frame", other.get_window_extent(renderer))] if other.axison else []
                targets += _texts_of(other, renderer) + ticks.get(_name(other, fig.axes.index(other)), [])
            for what, box in titles:
                for target, tb in targets:
                    if _shrunk(box).overlaps(_shrunk(tb)):
                        problems.append(f"{_name(ax, fig.axes.index(ax))}: {what} runs into "
                                        + ("its own" if other is ax else f"{_name(other, fig.axes.index(other))}'s")
                                        + f" {target}")
    return problems


def check_layout(fig) -> list[str]:
    """tgsim.plotting.layout.check_layout's problems and `title_overlaps`'s, one sentence each."""
    return _package_check(fig) + title_overlaps(fig)
