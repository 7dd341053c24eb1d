"""The layout check of every figure, `check_layout(fig)` and LayoutError: tgsim.plotting.layout's checks
(in the package, so that `tgsim plot` runs the same ones), imported here by the bare name the figure
scripts use (`from _layout import check_layout`), plus two checks the package's lacks:

- a title running into another panel: an axes title (left, centre or right) whose drawn rectangle,
  shrunk by tgsim's SLACK_PX, overlaps another visible axes' frame, title, axis label or tick labels,
  or its own axes' y label (fig11's panel (a) title ran into panel (b)'s y label; tgsim.plotting.layout
  compares tick labels with tick labels only, so it passed that figure).
- two texts that overlap: any two visible, non-empty texts drawn inside one axes (`ax.text`,
  `ax.annotate`: point labels, notes), or two of the figure's own texts (`fig.text`), whose drawn
  rectangles, shrunk by SLACK_PX, overlap (fig09 (d)'s point labels ran into each other; the package
  checks texts against their panel's edge only).
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


def text_overlaps(fig) -> list[str]:
    """Pairs of visible, non-empty texts inside one axes, or among the figure's own texts, whose drawn
    rectangles (shrunk by SLACK_PX) overlap, one sentence each; [] when none. Draws the figure."""
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    groups = [(_name(ax, i), ax.texts) for i, ax in enumerate(fig.axes) if ax.get_visible()]
    groups.append(("the figure", fig.texts))
    problems = []
    for where, texts in groups:
        shown = [(t, _shrunk(Text.get_window_extent(t, renderer))) for t in texts
                 if t.get_visible() and t.get_text().strip()]
        for k, (a, ba) in enumerate(shown):
            for b, bb in shown[k + 1:]:
                if ba.overlaps(bb):
                    problems.append(f"{where}: text {a.get_text()[:30]!r} overlaps text {b.get_text()[:30]!r}")
    return problems


def check_layout(fig) -> list[str]:
    """tgsim.plotting.layout.check_layout's problems, `title_overlaps`'s and `text_overlaps`'s, one
    sentence each."""
    return _package_check(fig) + title_overlaps(fig) + text_overlaps(fig)
