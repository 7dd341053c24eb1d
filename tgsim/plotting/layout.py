"""Layout checks of a drawn matplotlib figure: `check_layout(fig)` lists its problems in words.

It draws the figure and reports

- two tick labels that overlap: every visible, non-empty tick label of every axes (major and minor,
  only ticks inside the view limits, the ones matplotlib draws), compared pairwise across the whole
  figure as the rectangles they occupy on the canvas (rotated labels as rotated rectangles, from
  `Text.get_window_extent`), each shrunk by SLACK_PX so that labels that merely touch pass;
- an axis with data but no label: an x or y axis of an axes that has data (`Axes.has_data`), is on
  and visible, with an empty label, unless another axes of the figure that shares that axis or sits
  in the same column (x) or row (y) carries the label, as seaborn's grids label only their outer
  axes; a colour bar needs one label, on its long axis;
- a panel letter used twice: two axes titles (or texts of the figure) that start with the same "(x)";
- a log axis with too few labels: a log-scaled x or y axis of an axes with data that shows fewer
  than MIN_LOG_LABELS visible, non-empty tick labels (major and minor, inside the view), unless it
  shows none and an axes sharing it shows enough (seaborn's grids hide the inner panels' labels);
- a series drawn entirely under another: two visible Line2D of one axes with the same number of
  points and the same x and y data (np.allclose, relative tolerance SAME_RTOL, NaN equal to NaN):
  the later one hides the earlier, reported with both labels;
- text outside its panel: a visible, non-empty Text of an axes' own (`ax.texts`: `ax.text`,
  `ax.annotate`, `bar_label`; not titles, axis or tick labels, legends) whose drawn rectangle
  reaches more than EDGE_PX beyond the axes' rectangle.

`tgsim.plotting.theme.save_checked` (`tgsim plot`) and the figure scripts' `_theme.save_figure` raise
LayoutError on any problem, so neither can write such a figure.
"""

from __future__ import annotations

import re

import numpy as np
from matplotlib.text import Text

SLACK_PX = 0.5      # pixels each label's rectangle shrinks by before the overlap test
ALIGN_PX = 3.0      # axes whose edges differ by less share a column / row
LETTER = re.compile(r"^\s*\(([a-z])\)")
MIN_LOG_LABELS = 3  # tick labels a log axis with data must show
SAME_RTOL = 1e-6    # relative tolerance of "the same data" for two lines
EDGE_PX = 2.0       # pixels a panel's own text may reach beyond the axes


class LayoutError(RuntimeError):
    """A figure failed `check_layout`."""


def _name(ax, i: int) -> str:
    title = next((t for t in (ax.get_title("left"), ax.get_title(), ax.get_title("right")) if t), "")
    title = title.splitlines()[0][:40] if title else ""
    return f"axes {i}" + (f" ({title!r})" if title else "")


def _shown_ticks(axis):
    """The ticks `axis` draws: the current major and minor locations inside its view limits."""
    scale = axis.get_transform()
    lo, hi = sorted(scale.transform(np.asarray(axis.get_view_interval(), float)))
    tol = 1e-6 * max(hi - lo, 1e-300)
    ticks = [*axis.get_major_ticks(len(axis.get_majorticklocs())),
             *axis.get_minor_ticks(len(axis.get_minorticklocs()))]
    for t in ticks:
        loc = t.get_loc()
        if loc is None:
            continue
        with np.errstate(all="ignore"):
            v = float(scale.transform(np.asarray([loc], float))[0])
        if np.isfinite(v) and lo - tol <= v <= hi + tol:
            yield t


def tick_labels(fig) -> list[tuple[str, object]]:
    """(where, Text) of every tick label the drawn figure shows."""
    out = []
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible() or not ax.axison:
            continue
        for axis, xy in ((ax.xaxis, "x"), (ax.yaxis, "y")):
            if not axis.get_visible():
                continue
            for t in _shown_ticks(axis):
                for lab in (t.label1, t.label2):
                    if lab.get_visible() and lab.get_text().strip():
                        out.append((f"{_name(ax, i)} {xy}", lab))
    return out


def _corners(text, renderer) -> np.ndarray:
    """The 4 corners (display pixels) of the rectangle `text` covers, rotated with it, shrunk by SLACK_PX."""
    box = text.get_window_extent(renderer)          # axis-aligned box of the rotated text
    angle = text.get_rotation()
    if angle % 90:
        text.set_rotation(0)
        flat = text.get_window_extent(renderer)
        text.set_rotation(angle)
        w, h = flat.width, flat.height
    else:
        w, h = (box.height, box.width) if angle % 180 else (box.width, box.height)
    w, h = max(w - 2 * SLACK_PX, 0.0), max(h - 2 * SLACK_PX, 0.0)
    c, s = np.cos(np.radians(angle)), np.sin(np.radians(angle))
    half = np.array([[-w, -h], [w, -h], [w, h], [-w, h]]) / 2
    return half @ np.array([[c, s], [-s, c]]) + [(box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2]


def _overlap(p: np.ndarray, q: np.ndarray) -> bool:
    """Do the convex quadrilaterals p and q (4 x 2 corners) overlap (separating axis theorem)?"""
    for poly in (p, q):
        for k in range(4):
            edge = poly[(k + 1) % 4] - poly[k]
            normal = np.array([-edge[1], edge[0]])
            if not normal.any():
                continue
            a, b = p @ normal, q @ normal
            if a.max() <= b.min() or b.max() <= a.min():
                return False
    return True


def _labelled_elsewhere(fig, ax, xy: str) -> bool:
    """Does another axes that shares `ax`'s `xy` axis, or sits in its column (x) / row (y), carry a label?"""
    shared = (ax.get_shared_x_axes() if xy == "x" else ax.get_shared_y_axes()).get_siblings(ax)
    p = ax.get_position()
    for other in fig.axes:
        if other is ax or not (other.get_xlabel() if xy == "x" else other.get_ylabel()).strip():
            continue
        q = other.get_position()
        px = fig.transFigure.transform([[p.x0, p.y0], [p.x1, p.y1]])
        qx = fig.transFigure.transform([[q.x0, q.y0], [q.x1, q.y1]])
        k = 0 if xy == "x" else 1
        aligned = abs(px[0, k] - qx[0, k]) < ALIGN_PX and abs(px[1, k] - qx[1, k]) < ALIGN_PX
        if other in shared or aligned:
            return True
    return False


def _labels_shown(axis) -> list[str]:
    """The texts of the visible, non-empty tick labels `axis` draws (major and minor, inside the view)."""
    return [lab.get_text() for t in _shown_ticks(axis) for lab in (t.label1, t.label2)
            if lab.get_visible() and lab.get_text().strip()]


def _log_axis_labels(i: int, ax) -> list[str]:
    """A log-scaled axis of `ax` (axes `i`) with data that shows fewer than MIN_LOG_LABELS tick labels
    (module docstring); an axis showing none passes when an axes sharing it shows enough."""
    if not ax.get_visible() or not ax.axison or not ax.has_data():
        return []
    out = []
    for xy, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
        if axis.get_scale() != "log" or not axis.get_visible():
            continue
        shown = _labels_shown(axis)
        shared = (ax.get_shared_x_axes() if xy == "x" else ax.get_shared_y_axes()).get_siblings(ax)
        if not shown and any(len(_labels_shown(o.xaxis if xy == "x" else o.yaxis)) >= MIN_LOG_LABELS
                             for o in shared if o is not ax and o.get_visible()):
            continue
        if len(shown) < MIN_LOG_LABELS:
            out.append(f"{_name(ax, i)}: log {xy} axis shows {len(shown)} tick label(s) {shown} "
                       f"(needs {MIN_LOG_LABELS})")
    return out


def _same(a, b) -> bool:
    """Do two arrays hold the same values (same shape, np.allclose at SAME_RTOL, NaN equal to NaN)?"""
    try:
        a, b = np.asarray(a, float), np.asarray(b, float)
    except (TypeError, ValueError):
        return False
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=SAME_RTOL, atol=0.0, equal_nan=True))


def _hidden_lines(i: int, ax) -> list[str]:
    """Pairs of visible lines of `ax` (axes `i`) with the same x and y data: the later hides the earlier.
    An error bar's caps are not series (a zero-length bar's two caps coincide) and are left out."""
    from matplotlib.container import ErrorbarContainer

    caps = {id(c) for ct in ax.containers if isinstance(ct, ErrorbarContainer) for c in (ct[1] or ())}
    lines = [ln for ln in ax.lines if ln.get_visible() and len(ln.get_xdata()) > 0 and id(ln) not in caps]
    out = []
    for k, a in enumerate(lines):
        for b in lines[k + 1:]:
            if _same(a.get_xdata(), b.get_xdata()) and _same(a.get_ydata(), b.get_ydata()):
                out.append(f"{_name(ax, i)}: line {b.get_label()!r} is drawn exactly over line "
                           f"{a.get_label()!r} (same x and y data), which it hides")
    return out


def _texts_outside(i: int, ax, renderer) -> list[str]:
    """Visible, non-empty texts of `ax` (axes `i`) reaching more than EDGE_PX beyond its rectangle."""
    if not ax.get_visible():
        return []
    frame = ax.get_window_extent(renderer)
    out = []
    for t in ax.texts:
        if not t.get_visible() or not t.get_text().strip():
            continue
        b = Text.get_window_extent(t, renderer)         # the text's own box (an annotation's arrow aside)
        over = max(frame.x0 - b.x0, b.x1 - frame.x1, frame.y0 - b.y0, b.y1 - frame.y1)
        if over > EDGE_PX:
            out.append(f"{_name(ax, i)}: text {t.get_text()[:40]!r} reaches {over:.0f} px outside its panel")
    return out


def check_layout(fig) -> list[str]:
    """Draw `fig`; return its layout problems (module docstring), one sentence each; [] when clean."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    problems = []
    labels = [(where, lab, _corners(lab, renderer)) for where, lab in tick_labels(fig)]
    for i, (wa, la, pa) in enumerate(labels):
        for wb, lb, pb in labels[i + 1:]:
            if _overlap(pa, pb):
                problems.append(f"tick labels overlap: {la.get_text()!r} ({wa}) and {lb.get_text()!r} ({wb})")
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible() or not ax.axison or not ax.has_data():
            continue
        if getattr(ax, "_colorbar", None) is not None:
            if not (ax.get_xlabel().strip() or ax.get_ylabel().strip()):
                problems.append(f"{_name(ax, i)}: colour bar without a label")
            continue
        for xy, axis, label in (("x", ax.xaxis, ax.get_xlabel()), ("y", ax.yaxis, ax.get_ylabel())):
            if axis.get_visible() and not label.strip() and not _labelled_elsewhere(fig, ax, xy):
                problems.append(f"{_name(ax, i)}: {xy} axis has data but no label")
    seen: dict[str, str] = {}
    titles = [t for ax in fig.axes for t in (ax.get_title("left"), ax.get_title(), ax.get_title("right"))]
    for t in [*titles, *(x.get_text() for x in fig.texts)]:
        m = LETTER.match(t or "")
        if m:
            if m.group(1) in seen:
                problems.append(f"panel letter ({m.group(1)}) used twice: {seen[m.group(1)]!r} and {t[:40]!r}")
            else:
                seen[m.group(1)] = t[:40]
    for i, ax in enumerate(fig.axes):
        problems += _log_axis_labels(i, ax) + _hidden_lines(i, ax) + _texts_outside(i, ax, renderer)
    return problems
