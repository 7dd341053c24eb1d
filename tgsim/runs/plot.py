"""`tgsim plot RUN_DIR [RUN_DIR ...] [--out FILE]`: one figure of one or several runs, overlaid.

Eight panels, drawn with the project's theme (tgsim.plotting.theme) and written only when the
layout check passes (tgsim.plotting.layout):

    (a) training loss against steps       (b) test (or validation) accuracy against steps
    (c) training loss against bits        (d) test accuracy against bits
    (e) per-layer scaler                  (f) per-layer RMS of the gradient (σ where its mean is 0)
    (g) per-layer clipped fraction        (h) per-layer zero-gradient fraction (run-health's sign)

Bits are the bits per worker sent up plus received down, summed over the steps so far (metrics.csv's
bits_up + bits_down). A regression run's (b) and (d) show the evaluation loss instead. Each run has
one colour, its label the config keys that differ between the runs (tgsim.runs.read.labels); with
one run the per-layer panels give each layer a colour. Marked: skipped steps (crosses at the bottom
of (a)), the step where a layer's units died (`tgsim analyze run-health`'s ALERT: a dashed vertical
line in (a) and (h), the rule's threshold dotted in (h)), and every run-level ALERT (too many
skipped steps, a non-finite final loss) in the figure's title lines. A series identical to one
already drawn in its panel is not drawn again: its label joins the first one's ("a = b").

RUN_DIR may be a sweep directory (tgsim.runs.sweep: runs.csv), standing for all its runs. Bad input
(not a run directory, runs of different models) is a RunDirError: one line and exit status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from tgsim.errors import RunDirError
from tgsim.runs.read import RunData, labels, read_runs

PANELS = (("(a) training loss", "step", "training loss"),
          ("(b) evaluation", "step", None),
          ("(c) training loss against bits", "bits per worker (up + down)", "training loss"),
          ("(d) evaluation against bits", "bits per worker (up + down)", None),
          ("(e) per-layer scaler", "step", "scaler"),
          ("(f) per-layer gradient RMS (σ)", "step", "RMS of g per element"),
          ("(g) per-layer clipped fraction", "step", "fraction of |g| clipped"),
          ("(h) per-layer zero-gradient fraction", "step", "fraction of g = 0 on every worker"))
LOG_RATIO = 30.0             # a positive axis spanning this ratio or more is drawn on a log scale,
DENSE_RATIO = 1000.0         # labelled at 1-2-5 x 10^k below this ratio, at the powers of 10 above it
MAX_LAYER_LEGEND = 8         # one run: a legend of the layers when it has at most this many


class _Panel:
    """One axes and the series drawn in it, so that a series equal to an earlier one (the layout check's
    "line drawn exactly over another") joins that one's label instead of being drawn."""

    def __init__(self, ax):
        self.ax = ax
        self.lines: list = []
        self.names: list = []            # per drawn line: the labels of the series it stands for

    def line(self, x, y, label: str | None = None, **kw) -> None:
        x, y = np.asarray(x, float), np.asarray(y, float)
        keep = np.isfinite(x) & np.isfinite(y)
        if not keep.any():
            return
        x, y = x[keep], y[keep]
        for k, drawn in enumerate(self.lines):
            dx, dy = drawn.get_xdata(), drawn.get_ydata()
            if len(dx) == len(x) and np.allclose(dx, x) and np.allclose(dy, y, rtol=1e-6):
                if label and self.names[k]:
                    self.names[k].append(label)
                    more = len(self.names[k]) - 2
                    drawn.set_label(" = ".join(self.names[k][:2]) + (f" (= {more} more)" if more > 0 else ""))
                return
        self.lines += self.ax.plot(x, y, label=label or "_nolegend_", **kw)
        self.names.append([label] if label else [])

    def scale(self, which: str) -> None:
        """A log scale on `which` ("x"/"y") where every drawn value is positive and they span LOG_RATIO or
        more; labelled at 1-2-5 x 10^k where they span less than DENSE_RATIO, so at least 3 labels show."""
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        vals = np.concatenate([np.asarray(ln.get_xdata() if which == "x" else ln.get_ydata(), float)
                               for ln in self.lines]) if self.lines else np.array([])
        if not (len(vals) and (vals > 0).all() and vals.max() / vals.min() >= LOG_RATIO):
            return
        (self.ax.set_xscale if which == "x" else self.ax.set_yscale)("log")
        axis = self.ax.xaxis if which == "x" else self.ax.yaxis
        if vals.max() / vals.min() < DENSE_RATIO:
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: _tick(v)))
        axis.set_minor_formatter(NullFormatter())


def _tick(v: float) -> str:
    """A log axis' tick label: 0.05, 20, 500, 2e4, 1e6."""
    if v <= 0:
        return ""
    if 1e-3 <= v < 1e4:
        return f"{v:g}"
    exp = int(np.floor(np.log10(v) + 1e-9))
    return f"{v / 10 ** exp:g}e{exp}"


def _eval_name(runs: list[RunData]) -> tuple[str, str]:
    """(column, axis label) of the evaluation panels: accuracy where any run has it, else the loss."""
    splits = sorted({s for r in runs for s in r.evals["split"].unique()}) or ["test"]
    split = "/".join(splits)
    if any(r.evals["accuracy"].notna().any() for r in runs):
        return "accuracy", f"{split} accuracy"
    return "loss", f"{split} loss"


def draw(runs: list[RunData], names: list[str] | None = None):
    """The figure of `runs` (module docstring), labelled `names` (default tgsim.runs.read.labels)."""
    import matplotlib.pyplot as plt

    from tgsim.analysis.run_health import DEAD_ALERT
    from tgsim.plotting.theme import theme

    theme()
    names = names or labels(runs)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(2, 4, figsize=(17, 7.6))
    panels = [_Panel(ax) for ax in axes.flat]
    eval_col, eval_label = _eval_name(runs)
    several = len(runs) > 1
    died_at: set = set()                 # steps already marked in (a): one line per step
    for i, (run, name) in enumerate(zip(runs, names)):
        c = colours[i % len(colours)]
        alert = " (ALERT)" if run.run_alerts or run.dead else ""
        t, e, lay = run.train, run.evals, run.layers
        panels[0].line(t["step"], t["loss"], f"{name}{alert}", color=c, lw=1.0)
        panels[1].line(e["step"], e[eval_col], name, color=c, marker="o", ms=3)
        panels[2].line(t["bits"], t["loss"], name, color=c, lw=1.0)
        panels[3].line(e["bits"], e[eval_col], name, color=c, marker="o", ms=3)
        skipped = t.loc[t["skipped"].fillna(0).astype(float) > 0, "step"]
        if len(skipped):
            panels[0].ax.scatter(skipped, np.full(len(skipped), 0.03), marker="x", s=18, color=c,
                                 transform=panels[0].ax.get_xaxis_transform(), zorder=5,
                                 label=f"skipped steps ({len(skipped)}){'' if not several else ': ' + name}")
        for k, (layer, d) in enumerate(lay.groupby("layer", sort=False)):
            lc = c if several else colours[k % len(colours)]
            ll = None if several else layer          # several runs: the figure's legend names the colours
            kw = dict(color=lc, lw=0.9, alpha=0.75 if several else 1.0)
            panels[4].line(d["step"], d["scaler"], ll, **kw)
            panels[5].line(d["step"], d["rms"], ll, **kw)
            panels[6].line(d["step"], d["clip_fraction"], ll, **kw)
            panels[7].line(d["step"], d["zero_grad_fraction"], ll, **kw)
        if run.dead:                     # one mark per run: the first step a layer's units died at
            step = min(run.dead.values())
            who = f"{name}: " if several else ""
            layers = [k for k, v in run.dead.items() if v == step]
            what = layers[0] if len(layers) == 1 else f"{len(layers)} layers"
            panels[7].line([step, step], [0, 1], f"{who}units died ({what}), step {step:.0f}", color=c,
                           ls="--", lw=1.2)
            if step not in died_at:
                died_at.add(step)
                panels[0].ax.axvline(step, color=c, ls="--", lw=1.0)
    if any(r.dead for r in runs) or any(p.lines for p in panels[7:]):
        panels[7].ax.axhline(DEAD_ALERT, color="0.4", ls=":", lw=1.0, label=f"run-health ALERT at {DEAD_ALERT:g}")
    for k, (p, (title, xlabel, ylabel)) in enumerate(zip(panels, PANELS)):
        p.ax.set_title(title, loc="left")
        p.ax.set_xlabel(xlabel)
        p.ax.set_ylabel(ylabel or eval_label)
        if k in (2, 3):
            p.scale("x")
        if k in (4, 5):
            p.scale("y")
        if not p.lines:
            p.ax.text(0.5, 0.5, "no data in metrics.csv" if k != 5 else "no data (layer sizes: params.npz)",
                      ha="center", va="center", transform=p.ax.transAxes, fontsize=8, color="0.4")
    handles, texts = panels[0].ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, texts, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(handles), 3),
                   frameon=False)
    if not several:
        if 0 < len(panels[4].lines) <= MAX_LAYER_LEGEND:
            panels[4].ax.legend(fontsize=7, title="layer")
    if panels[7].lines or any(r.dead for r in runs):
        panels[7].ax.legend(fontsize=7)
    title = _title(runs, names)
    fig.suptitle(title, x=0.01, y=0.995, ha="left", va="top", fontsize=10)
    top = 1 - (0.05 + 0.034 * title.count("\n")) * 7.6 / fig.get_figheight()
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.09, top=top, wspace=0.32, hspace=0.42)   # fixed: no
    return fig                                                                  # legend or title squeezes a panel


def _title(runs: list[RunData], names: list[str]) -> str:
    """The figure's title lines: what was trained, and every run-level ALERT."""
    c = runs[0].config
    what = f"{c.get('model.name', '?')} on {c.get('data.name', '?')}, {c.get('workers.n', '?')} workers"
    head = f"{runs[0].path}: {what}" if len(runs) == 1 else f"{len(runs)} runs of {what}"
    lines = [head]
    for r, n in zip(runs, names):
        for a in r.run_alerts:
            lines.append(f"ALERT {n if len(runs) > 1 else 'run'}: {a}")
        if r.dead:
            first = min(r.dead.values())
            which = ", ".join(sorted(r.dead)[:3]) + (f" and {len(r.dead) - 3} more" if len(r.dead) > 3 else "")
            lines.append(f"ALERT {n if len(runs) > 1 else 'run'}: units died in layer{'s' if len(r.dead) > 1 else ''} "
                         f"{which} from step {first:.0f} (tgsim analyze run-health)")
    return "\n".join(lines[:8] + ([f"... {len(lines) - 8} more"] if len(lines) > 8 else []))


def default_out(paths: list[str]) -> Path:
    """Where the figure goes without --out: plot.png in the one directory given (a run or a sweep), or
    in the directory that holds all the runs given."""
    dirs = [Path(p).resolve() for p in paths]
    if len(dirs) == 1:
        return dirs[0] / "plot.png"
    common = Path(*Path(dirs[0]).parts[:next((i for i, parts in enumerate(zip(*(d.parts for d in dirs)))
                                              if len(set(parts)) > 1), min(len(d.parts) for d in dirs))])
    return common / "plot.png"


def plot(paths, out: str | Path | None = None, dpi: float = 100) -> Path:
    """Read the runs `paths` name (tgsim.runs.read.read_runs), draw them (`draw`) and write the figure
    to `out` (default `default_out`) at `dpi`; returns the path written. RunDirError on bad input; LayoutError
    (tgsim.plotting.layout) when the drawn figure fails the layout check."""
    from tgsim.plotting.theme import save_checked

    paths = [str(p) for p in paths]
    runs = read_runs(paths)
    path = Path(out) if out is not None else default_out(paths)
    if not path.parent.is_dir():
        raise RunDirError(f"--out {path}: the directory {path.parent} does not exist")
    return save_checked(draw(runs), path, dpi=dpi)


def add_arguments(p) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (tgsim run, the MPI trainer's "
                   "results, a sweep's runs), or a sweep directory for all its runs")
    p.add_argument("--out", help="the PNG (or PDF, SVG: by its suffix) to write (default plot.png in the one "
                   "directory given, else in the directory holding the runs)")
    p.add_argument("--dpi", type=float, default=100, help="resolution of a PNG (default 100: 1,700 pixels wide)")


def cmd(args) -> int:
    """`tgsim plot`: 0 written (its path printed); 2 bad input, one line on stderr."""
    try:
        path = plot(args.runs, args.out, args.dpi)
    except RunDirError as e:
        print(f"tgsim plot: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0

