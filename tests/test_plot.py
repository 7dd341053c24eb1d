"""`tgsim plot` (tgsim/runs/plot.py, tgsim/runs/read.py): the figure of one or several runs passes the
layout check and is a readable PNG, runs are labelled by what differs in their configs, skipped
steps and run-health's alerts are marked, `tgsim demo` ends with the command that plots its three
runs, and bad input (not a run, runs of different models) is one line on stderr and exit status 2."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from tgsim import cli  # noqa: E402
from tgsim.plotting.layout import check_layout  # noqa: E402
from tgsim.runs import plot as runs_plot  # noqa: E402
from tgsim.runs.read import labels, read_runs  # noqa: E402


def tiny(codec: str = "terngrad", model: str = "mlp", steps: int = 30) -> dict:
    """A run of a few steps on digits (a second, on 2 cores)."""
    options = {"hidden": [8]} if model == "mlp" else {}
    return {"run": {"name": f"plot-{codec}", "steps": steps, "eval_every": 10, "log_every": 5, "checkpoint_every": 10},
            "data": {"name": "digits"}, "model": {"name": model, "options": options},
            "workers": {"n": 2, "batch": 16}, "codec": {"name": codec},
            "exchange": {"mode": "ps"}, "optimizer": {"name": "momentum"},
            "schedule": {"name": "constant", "lr": 0.05}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    from tgsim.train.config import from_dict
    from tgsim.train.loop import run

    base = tmp_path_factory.mktemp("plot-runs")
    out = {}
    for name, d in (("fp32", tiny("fp32")), ("terngrad", tiny()), ("softmax", tiny(model="softmax"))):
        run(from_dict(d), out=base / name, quiet=True)
        out[name] = base / name
    return out


def test_two_runs_make_a_png_labelled_by_their_codecs(runs, tmp_path):
    import matplotlib.pyplot as plt
    from PIL import Image

    from tgsim.plotting.theme import save_checked

    read = read_runs([runs["fp32"], runs["terngrad"]])
    assert labels(read) == ["codec=fp32", "codec=terngrad"]
    fig = runs_plot.draw(read)
    assert check_layout(fig) == []
    axes = fig.axes
    assert [ax.get_title(loc="left")[:3] for ax in axes] == [f"({c})" for c in "abcdefgh"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["codec=fp32", "codec=terngrad"]
    # (c): the training loss against the bits summed over the steps; fp32 sends more per step
    fp32_line, tg_line = axes[2].get_lines()[:2]
    assert fp32_line.get_xdata()[-1] > 5 * tg_line.get_xdata()[-1]
    m = pd.read_csv(runs["terngrad"] / "metrics.csv")
    t = m[(m["split"] == "train") & (m["layer"] == "model")]
    np.testing.assert_allclose(tg_line.get_xdata(), np.cumsum(t["bits_up"] + t["bits_down"]))
    # (g): the clipped fraction of each TernGrad layer; fp32 clips nothing (no line of its own)
    assert len(axes[6].get_lines()) == 4
    png = save_checked(fig, tmp_path / "two.png", dpi=100)
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] > 1000 and im.size[1] > 500
    plt.close("all")


def test_skipped_steps_and_dead_units_are_marked(runs, tmp_path):
    """A copy of the TernGrad run whose metrics.csv says 3 steps were skipped and one layer's units died
    from step 10: crosses in (a), a dashed line at step 10 in (a) and (h), ALERT lines in the title."""
    import matplotlib.pyplot as plt

    sick = tmp_path / "sick"
    shutil.copytree(runs["terngrad"], sick)
    m = pd.read_csv(sick / "metrics.csv")
    model = (m["split"] == "train") & (m["layer"] == "model")
    m.loc[model & m["step"].isin([3, 4, 5]), ["skipped", "loss"]] = [1, np.nan]
    m.loc[(m["layer"] == "fc1.b") & (m["step"] >= 6), "zero_grad_fraction"] = 0.9
    m.loc[m["split"] == "test", "loss"] = np.where(m.loc[m["split"] == "test", "step"] == 30, np.inf, 0.5)
    m.to_csv(sick / "metrics.csv", index=False)
    fig = runs_plot.draw(read_runs([sick]))
    assert check_layout(fig) == []
    a, h = fig.axes[0], fig.axes[7]
    crosses = [c for c in a.collections if c.get_label().startswith("skipped steps")]
    assert len(crosses) == 1 and crosses[0].get_label() == "skipped steps (3)"
    np.testing.assert_array_equal(crosses[0].get_offsets()[:, 0], [3, 4, 5])
    dead = [ln for ln in h.get_lines() if "units died" in ln.get_label()]
    assert [ln.get_label() for ln in dead] == ["units died (fc1.b), step 11"]
    assert any(list(ln.get_xdata()) == [11, 11] for ln in a.get_lines())
    title = fig._suptitle.get_text()
    assert "ALERT run: units died in layer fc1.b from step 11" in title
    assert "ALERT run: the final test loss is inf" in title
    plt.close(fig)


def test_a_sweep_directory_stands_for_its_runs(runs, tmp_path):
    from tgsim.runs.read import expand

    sweep = tmp_path / "sweep"
    (sweep / "runs").mkdir(parents=True)
    for name in ("fp32", "terngrad"):
        shutil.copytree(runs[name], sweep / "runs" / name)
    pd.DataFrame({"dir": ["runs/fp32", "runs/terngrad"]}).to_csv(sweep / "runs.csv", index=False)
    assert expand([sweep, runs["softmax"]]) == [sweep / "runs/fp32", sweep / "runs/terngrad", runs["softmax"]]
    assert labels(read_runs([sweep])) == ["codec=fp32", "codec=terngrad"]
    assert runs_plot.default_out([str(sweep)]) == sweep.resolve() / "plot.png"


@pytest.mark.parametrize("case, says", [
    ("empty", "is not a tgsim run directory: no config.toml and no metrics.csv"),
    ("missing", "is not a directory"),
    ("models", "runs of different models cannot be overlaid: model.name is mlp in"),
])
def test_bad_input_is_one_line_and_exit_2(runs, tmp_path, capsys, case, says):
    args = {"empty": [str(tmp_path)], "missing": [str(tmp_path / "nope")],
            "models": [str(runs["terngrad"]), str(runs["softmax"])]}[case]
    assert cli.main(["plot", *args, "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tgsim plot: ") and says in err, err
    assert not (tmp_path / "x.png").exists()


def test_the_demo_ends_with_the_command_that_plots_its_three_runs(tmp_path, capsys, monkeypatch):
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    assert cli.main(["demo", "--set", "run.steps=10", "--set", "run.eval_every=5", "--results", "res",
                     "--quiet"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("Plot the three runs: tgsim plot res/demo-fp32-"), last
    argv = shlex.split(last.split(": ", 1)[1])
    assert len(argv) == 7 and argv[-2:] == ["--out", "res/demo.png"]
    assert cli.main(argv[1:]) == 0
    with Image.open(Path("res/demo.png")) as im:
        assert im.format == "PNG" and im.size[0] > 1000


def test_layer_sizes_come_from_the_newest_checkpoint_without_params(runs, tmp_path):
    """A run killed before params.npz was written: the per-layer RMS panel's sizes come from its newest
    checkpoint (tgsim.train.checkpoint), the same as params.npz gives."""
    from tgsim.runs.read import read_run

    whole = read_run(runs["terngrad"]).layer_sizes
    killed = tmp_path / "killed"
    shutil.copytree(runs["terngrad"], killed)
    (killed / "params.npz").unlink()
    assert whole and read_run(killed).layer_sizes == whole
