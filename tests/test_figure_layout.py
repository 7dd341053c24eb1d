"""papers_figures/_layout.check_layout finds overlapping tick labels, axes with data but no label,
repeated panel letters, log axes with fewer than 3 tick labels, a line drawn exactly over another and
a panel's text reaching outside it, and passes a clean figure (each check with a figure that passes);
`_theme.save_figure` refuses a figure with a problem and stamps a quick run's figure with the QUICK mark; `_common.write_csv` marks quick CSVs.
The figure scripts call `save_figure` before writing any PNG, so every script run in
tests/test_figures.py and tests/test_figures_report.py runs the check on its own figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "papers_figures"))
import _common  # noqa: E402
import _layout  # noqa: E402
import _theme  # noqa: E402


def _clean():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([1, 2, 3], [1, 4, 9], marker="o")
    ax.set(xlabel="step", ylabel="loss", title="(a) clean")
    return fig, ax


@pytest.fixture(autouse=True)
def _close():
    """Each test in matplotlib's default style, whatever an earlier test set globally (seaborn's
    "paper" context shrinks the fonts, and these geometries are sized for the defaults)."""
    with matplotlib.rc_context():
        matplotlib.style.use("default")
        yield
    plt.close("all")


def test_a_clean_figure_passes():
    fig, _ = _clean()
    assert _layout.check_layout(fig) == []


def test_overlapping_x_tick_labels_are_reported():
    fig, ax = _clean()
    ax.set_xticks([1, 1.05, 2, 3], ["one thousand", "one thousand and one", "2", "3"])
    problems = _layout.check_layout(fig)
    assert any("tick labels overlap" in p and "one thousand" in p for p in problems), problems


def test_rotated_labels_overlap_as_rotated_rectangles():
    """Labels at 30° whose axis-aligned boxes overlap but whose text does not pass; crowded ones fail."""
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.bar(range(4), [1, 2, 3, 4])
    ax.set(xlabel="codec", ylabel="value")
    ax.set_xticks(range(4), ["terngrad", "qsgd levels", "topk with ef", "fp32"], rotation=30, ha="right",
                  rotation_mode="anchor")
    assert _layout.check_layout(fig) == []
    boxes = [lab.get_window_extent() for lab in ax.get_xticklabels()]
    assert any(a.overlaps(b) for a, b in zip(boxes, boxes[1:]))         # the axis-aligned boxes do overlap
    ax.set_xticks(range(4), ["a very long codec name indeed"] * 4, rotation=2, ha="right", rotation_mode="anchor")
    assert any("tick labels overlap" in p for p in _layout.check_layout(fig))


def test_log_axis_minor_labels_over_fixed_ticks_are_reported():
    """The defect of terngrad_workers_scaling.png: fixed ticks on a log axis with its minor labels left on."""
    fig, ax = plt.subplots(figsize=(3, 2.5))
    ax.plot([2, 4, 8, 16, 32, 64], [0.5, 0.6, 0.7, 0.7, 0.6, 0.5])
    ax.set(xscale="log", xlabel="workers", ylabel="accuracy")
    ax.set_xticks([2, 4, 8, 16, 32, 64], ["2", "4", "8", "16", "32", "64"])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(10, 10)))
    assert any("tick labels overlap" in p for p in _layout.check_layout(fig))


def test_hidden_and_empty_labels_are_ignored():
    fig, ax = _clean()
    ax.set_xticks([1, 1.01, 2, 3], ["", "x", "2", "3"])
    assert _layout.check_layout(fig) == []
    ax.set_xticks([1, 1.01, 2, 3], ["wide label", "wide label", "2", "3"])
    assert _layout.check_layout(fig)
    for lab in ax.get_xticklabels()[:1]:
        lab.set_visible(False)
    assert _layout.check_layout(fig) == []


@pytest.mark.parametrize("missing", ["x", "y"])
def test_an_unlabelled_axis_with_data_is_reported(missing):
    fig, ax = _clean()
    (ax.set_xlabel if missing == "x" else ax.set_ylabel)("")
    assert _layout.check_layout(fig) == [f"axes 0 ('(a) clean'): {missing} axis has data but no label"]


def test_an_axes_without_data_needs_no_label():
    fig, ax = plt.subplots()
    ax.text(0.5, 0.5, "not measured", ha="center")
    ax.set(xticks=[], yticks=[])
    assert _layout.check_layout(fig) == []


def test_a_grid_labelled_on_its_outer_axes_passes_and_a_stray_panel_does_not():
    fig, axes = plt.subplots(2, 2, figsize=(6, 5))
    for ax in axes.flat:
        ax.plot([1, 2], [3, 4])
    for ax in axes[1]:
        ax.set_xlabel("step")
    for ax in axes[:, 0]:
        ax.set_ylabel("loss")
    assert _layout.check_layout(fig) == []
    extra = fig.add_axes([1.1, 0.3, 0.2, 0.3])
    extra.plot([0, 1], [0, 1])
    problems = _layout.check_layout(fig)
    assert problems == ["axes 4: x axis has data but no label", "axes 4: y axis has data but no label"], problems


def test_a_repeated_panel_letter_is_reported():
    fig, (a, b) = plt.subplots(1, 2)
    for ax, t in ((a, "(a) momentum"), (b, "(a) plain SGD")):
        ax.plot([1, 2], [1, 2])
        ax.set(xlabel="x", ylabel="y", title=t)
    assert any("panel letter (a) used twice" in p for p in _layout.check_layout(fig))
    b.set_title("(b) plain SGD")
    assert _layout.check_layout(fig) == []


def test_save_figure_refuses_a_bad_figure_and_writes_nothing(tmp_path):
    fig, ax = _clean()
    ax.set_ylabel("")
    with pytest.raises(_layout.LayoutError, match="y axis has data but no label"):
        _theme.save_figure(fig, tmp_path / "bad.png", quick=False)
    assert not (tmp_path / "bad.png").exists()


@pytest.mark.parametrize("quick", [False, True])
def test_quick_mark_and_quick_column(tmp_path, quick):
    fig, _ = _clean()
    _theme.save_figure(fig, tmp_path / "f.png", quick=quick)
    marks = [t.get_text() for t in fig.texts if t.get_gid() == "quick-mark"]
    assert marks == ([_common.QUICK_MARK] if quick else [])
    assert (tmp_path / "f.png").stat().st_size > 0
    path = _common.write_csv(pd.DataFrame({"a": [1, 2]}), tmp_path / "f.csv", quick)
    df = pd.read_csv(path)
    assert list(df.columns) == ["a", "quick"] and (df.quick == quick).all()


def test_log_ticks_cover_the_data():
    """fig09(b)'s defect: the points sat at 3.5-4.6 and the only labelled ticks were 1 and 2."""
    fig, ax = plt.subplots()
    ax.scatter([3.5, 4.1, 4.6], [10, 20, 30])
    ax.set(xscale="log", yscale="log", xlabel="compression", ylabel="K")
    ticks = _theme.log_ticks(ax, "x", [3.5, 4.1, 4.6])
    lo, hi = ax.get_xlim()
    assert len(ticks) >= 3 and lo <= 3.5 and hi >= 4.6 and all(lo <= t <= hi for t in ticks)
    assert _layout.check_layout(fig) == []


def _log_panel(lo: float, hi: float):
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([lo, hi], [1, 2], marker="o")
    ax.set(xscale="log", xlim=(lo, hi), xlabel="bits", ylabel="error")
    return fig, ax


def test_a_log_axis_with_fewer_than_three_labels_is_reported():
    """Over 0.5-20 matplotlib's default log formatter labels only 10^0 and 10^1; over 1-100 it labels
    three decades, and `_theme.log_ticks` labels 0.5-20 at 1-2-5 x 10^k: both pass."""
    fig, ax = _log_panel(0.5, 20)
    problems = _layout.check_layout(fig)
    assert len(problems) == 1 and problems[0].startswith("axes 0: log x axis shows 2 tick label(s)"), problems
    assert problems[0].endswith("(needs 3)")
    _theme.log_ticks(ax, "x", [0.5, 20], pad=1.0)
    assert _layout.check_layout(fig) == []
    fig, ax = _log_panel(1, 100)
    assert _layout.check_layout(fig) == []


def test_shared_log_axes_with_hidden_inner_labels_pass():
    """An inner panel of a shared log axis shows no labels and passes while its neighbour labels the
    axis; with the neighbour's labels hidden too, both are reported."""
    fig, axes = plt.subplots(1, 2, sharey=True, figsize=(6, 3))
    for ax in axes:
        ax.plot([1, 2, 3], [1, 50, 1000])
        ax.set(yscale="log", xlabel="step")
    axes[0].set_ylabel("loss")
    assert _layout.check_layout(fig) == []
    assert not [lab for lab in axes[1].get_yticklabels() if lab.get_visible() and lab.get_text()]
    axes[0].tick_params(labelleft=False)                     # no axes of the pair labels the shared axis
    problems = _layout.check_layout(fig)
    assert [p.split(" [")[0] for p in problems] == ["axes 0: log y axis shows 0 tick label(s)",
                                                    "axes 1: log y axis shows 0 tick label(s)"], problems


def test_a_line_drawn_exactly_over_another_is_reported():
    fig, ax = _clean()
    ax.plot([1, 2, 3], [1, 4, 9 * (1 + 1e-9)], label="fp16")
    ax.lines[0].set_label("bf16")
    problems = _layout.check_layout(fig)
    assert problems == ["axes 0 ('(a) clean'): line 'fp16' is drawn exactly over line 'bf16' (same x and y "
                        "data), which it hides"], problems
    ax.lines[1].set_ydata([1, 4, 9.1])                        # differs at one point: both visible
    assert _layout.check_layout(fig) == []
    ax.lines[1].set_ydata([1, 4, 9])
    ax.lines[1].set_visible(False)                           # a hidden duplicate hides nothing
    assert _layout.check_layout(fig) == []


@pytest.mark.parametrize("how", ["text", "annotate"])
def test_text_outside_its_panel_is_reported(how):
    fig, ax = _clean()
    if how == "text":
        ax.text(0.98, 0.05, "a note that runs on past the edge", transform=ax.transAxes, ha="left")
    else:
        ax.annotate("a label above the top", (2, 9), xytext=(0, 30), textcoords="offset points", ha="center")
    problems = _layout.check_layout(fig)
    assert len(problems) == 1 and "outside its panel" in problems[0], problems


def test_text_inside_its_panel_and_an_outside_legend_pass():
    """Texts inside the axes pass; a title, axis labels and a legend placed outside the axes
    (bbox_to_anchor) are not the panel's texts."""
    fig, ax = _clean()
    ax.text(0.02, 0.98, "inside, top left", transform=ax.transAxes, va="top")
    ax.annotate("9", (3, 9), xytext=(-4, -4), textcoords="offset points", ha="right", va="top")
    ax.legend(["series"], loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.set_title("(a) a title wider than the panel it sits above, by far")
    assert _layout.check_layout(fig) == []


def test_zero_length_error_bars_are_not_a_hidden_series():
    """An error bar of length zero draws its two caps at one place: caps are not series, so the
    check passes; two real lines with the same data still fail."""
    fig, ax = plt.subplots()
    ax.errorbar([1, 2], [1, 2], yerr=[0, 0], capsize=2)
    ax.set(xlabel="x", ylabel="y")
    assert _layout.check_layout(fig) == []
    ax.plot([1, 2], [1, 2])
    ax.plot([1, 2], [1, 2])
    assert any("drawn exactly over" in p for p in _layout.check_layout(fig))
    plt.close(fig)


def test_two_texts_overlapping_in_a_panel_are_reported():
    """Two point labels (or notes) inside one axes whose drawn boxes overlap are reported (fig09 (d)'s
    "levels 8" ran into "levels 16"); moved apart, they pass; the figure's own texts are checked too."""
    fig, ax = _clean()
    ax.annotate("levels 8", (2, 4), xytext=(4, 2), textcoords="offset points")
    ax.annotate("levels 16", (2, 4), xytext=(10, 4), textcoords="offset points")
    problems = _layout.check_layout(fig)
    assert len(problems) == 1 and "'levels 8' overlaps text 'levels 16'" in problems[0], problems
    ax.texts[1].set_position((10, -40))
    assert _layout.check_layout(fig) == []
    fig.text(0.02, 0.01, "a note below the figure")
    fig.text(0.05, 0.01, "another note on top of it")
    assert any("the figure: text" in p for p in _layout.check_layout(fig))


def test_color_distance_is_ciede2000():
    """`_theme.color_distance` against Sharma, Wu and Dalal's (2005) CIEDE2000 test pairs (CIELAB in, ΔE00 out)."""
    for lab1, lab2, want in (((50.0, 2.6772, -79.7751), (50.0, 0.0, -82.7485), 2.0425),
                             ((50.0, 2.5, 0.0), (73.0, 25.0, -18.0), 27.1492),
                             ((2.0776, 0.0795, -1.1350), (0.9033, -0.0636, -0.5514), 0.9082),
                             ((50.0, -1.0, 2.0), (50.0, 0.0, 0.0), 2.3669)):
        assert _theme.color_distance(lab1, lab2) == pytest.approx(want, abs=1e-4)
    assert _theme.color_distance("#e69f00", "#e69f00") == 0.0


def test_every_two_codec_colours_are_clearly_apart():
    """No two methods of CODEC_COLORS share a colour or draw near-identical ones (the old palette drew
    MEAN-sharing TernGrad and PowerSGD rank 2 in two browns, suresh and TernGrad's own-scaler in green and
    teal, QSGD's 7 and 8 levels in two like blues): every two different colours lie at least
    MIN_COLOR_DISTANCE (CIEDE2000) apart, and equal colours only name a family and its default variant.
    TernGrad as the paper runs it stays orange."""
    import itertools

    colors = _theme.CODEC_COLORS
    assert colors["terngrad"].lower() == "#e69f00"
    assert _theme.MIN_COLOR_DISTANCE >= 15
    close = []
    for (ka, a), (kb, b) in itertools.combinations(colors.items(), 2):
        if a.lower() == b.lower():
            assert ka.split("[")[0] == kb.split("[")[0] and "[" not in ka, (ka, kb, "share a colour")
            continue
        d = _theme.color_distance(a, b)
        if d < _theme.MIN_COLOR_DISTANCE:
            close.append(f"{ka} {a} / {kb} {b}: {d:.1f}")
    assert not close, close
