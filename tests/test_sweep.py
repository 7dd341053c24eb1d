"""`tgsim sweep` (tgsim/runs/sweep.py): the grid of --set values x seeds into one directory with a tidy
runs.csv and one progress line per run when piped; a sweep killed inside a run and started again
has every run once, with the bits of an uninterrupted sweep; bad input (a key that does not exist,
another grid in the directory) is one line and exit status 2."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mpi_cases import load_params
from tgsim import cli
from tgsim.runs import sweep

BASE = {"run": {"name": "sw", "steps": 12, "eval_every": 6, "log_every": 4, "checkpoint_every": 4},
        "data": {"name": "digits"}, "model": {"name": "mlp", "options": {"hidden": [8]}},
        "workers": {"n": 2, "batch": 16}, "codec": {"name": "terngrad"}, "exchange": {"mode": "ps"},
        "optimizer": {"name": "momentum"}, "schedule": {"name": "constant", "lr": 0.05}}
SETS = {"schedule.lr": ["0.05", "0.1"], "codec.name": ["'fp32'", "'terngrad'"]}


def test_split_values_keeps_commas_inside_quotes_and_brackets():
    assert sweep.split_values("1, [2,3],'a,b', {x = 1, y = 2}") == ["1", "[2,3]", "'a,b'", "{x = 1, y = 2}"]


def test_the_grid_runs_into_one_directory_with_runs_csv(tmp_path, capsys):
    from tgsim.train.config import from_dict, to_dict

    cfg = tmp_path / "base.toml"
    import tomli_w

    cfg.write_bytes(tomli_w.dumps(to_dict(from_dict(BASE))).encode())
    out = tmp_path / "sw"
    rc = cli.main(["sweep", str(cfg), "--set", "codec.name=fp32,terngrad", "--set", "run.steps=8",
                   "--seeds", "2", "--out", str(out)])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split("  ")[0] for ln in lines if ln.startswith("run ")] == \
        [f"run {k}/4" for k in (1, 1, 2, 2, 3, 3, 4, 4)]
    assert lines[1].startswith("run 1/4  codec.name=fp32 seed=0  test loss ") and lines[1].endswith(
        str(out / "runs" / "000-name=fp32-seed=0"))
    assert lines[-1] == f"plot: tgsim plot {out}"
    rows = pd.read_csv(out / "runs.csv")
    assert list(rows.columns) == ["index", "dir", "codec.name", "run.steps", *sweep.RUN_COLUMNS[2:]]
    assert rows["codec.name"].tolist() == ["fp32", "fp32", "terngrad", "terngrad"]
    assert rows["seed"].tolist() == [0, 1, 0, 1] and (rows["steps"] == 8).all()
    assert (rows["bits"] == rows["bits_up"] + rows["bits_down"]).all()
    assert rows.loc[0, "bits_up"] > 5 * rows.loc[2, "bits_up"]
    assert rows["test_accuracy"].between(0, 1).all() and (rows["wall_seconds"] > 0).all()
    # a run's directory is a tgsim run of its point's config
    m = pd.read_csv(out / rows.loc[3, "dir"] / "metrics.csv")
    assert m["step"].max() == 8


def test_a_killed_sweep_continues_with_the_uninterrupted_bits(tmp_path, monkeypatch):
    from tgsim.train import loop as loop_mod

    whole = sweep.run_sweep(BASE, SETS, out=tmp_path / "whole", quiet=True)
    original, started = loop_mod.train_step, []

    def dying(setup, params, opt_state, step, *args, **kwargs):
        if step == 0:
            started.append(setup.cfg.run.name)
        if len(started) == 2 and step == 6:              # the second run, after its checkpoint at 4
            raise KeyboardInterrupt("killed")
        return original(setup, params, opt_state, step, *args, **kwargs)

    monkeypatch.setattr(loop_mod, "train_step", dying)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(BASE, SETS, out=tmp_path / "killed", quiet=True)
    monkeypatch.undo()
    assert len(pd.read_csv(tmp_path / "killed" / "runs.csv")) == 1
    killed = sweep.run_sweep(BASE, SETS, out=tmp_path / "killed", quiet=True)
    a, b = pd.read_csv(whole / "runs.csv"), pd.read_csv(killed / "runs.csv")
    assert b["dir"].tolist() == a["dir"].tolist() and len(b) == 4
    cols = ["schedule.lr", "codec.name", "seed", "test_loss", "test_accuracy", "bits_up", "bits_down", "skipped"]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    assert b["resumed_from"].tolist() == [0, 4, 0, 0]
    for d in a["dir"]:
        pa, pb = load_params(whole / d / "params.npz"), load_params(killed / d / "params.npz")
        assert all(np.array_equal(pa[k], pb[k]) for k in pa)
        ma, mb = (pd.read_csv(x / d / "metrics.csv").drop(columns="seconds") for x in (whole, killed))
        pd.testing.assert_frame_equal(ma, mb)


@pytest.mark.parametrize("args, says", [
    (["--set", "run.nope=1,2"], "sweep point run.nope=1: unknown key(s) ['nope'] in [run]"),
    (["--set", "schedule.lr=0.1", "--set", "schedule.lr=0.2"], "--set schedule.lr is given twice"),
    (["--set", "run.seed=1,2", "--seeds", "2"], "--seeds with --set run.seed=...: give the seeds one way"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, says):
    assert cli.main(["sweep", "demo", *args, "--out", str(tmp_path / "sw")]) == 2
    err = capsys.readouterr().err
    assert err == f"tgsim sweep: {says}\n" or (err.count("\n") == 1 and says in err), err
    assert not (tmp_path / "sw").exists()


def test_a_directory_holding_another_grid_is_refused(tmp_path, capsys):
    sweep.run_sweep(BASE, {"schedule.lr": ["0.05"]}, out=tmp_path / "sw", quiet=True)
    with pytest.raises(Exception, match="holds another sweep"):
        sweep.run_sweep(BASE, {"schedule.lr": ["0.1"]}, out=tmp_path / "sw", quiet=True)
