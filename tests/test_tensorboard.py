"""TensorBoard event files of a run (tgsim/train/tensorboard.py), read back with the tensorboard package's
EventAccumulator: every finite number of metrics.csv is there at its step under its tag, from the
simulator (`[run] tensorboard = true`), from a resumed run (the killed run's later points dropped)
and from rank 0 of a 2-rank mpiexec run (`--tensorboard DIR`); the DDP hook's per-step counts
(HookLog); without the tensorboard package a run that asks for event files stops before writing."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from fakes import events, kill_train_step_at
from mpi_cases import mpiexec, needs_mpi, write_toml
from tgsim.errors import ConfigError
from tgsim.train import tensorboard as tb
from tgsim.train.config import from_dict
from tgsim.train.loop import run

pytest.importorskip("tensorboard")


def tiny(**run_keys) -> dict:
    return {"run": {"name": "tb", "steps": 24, "eval_every": 8, "log_every": 4, "checkpoint_every": 8, **run_keys},
            "data": {"name": "digits"}, "model": {"name": "mlp", "options": {"hidden": [8]}},
            "workers": {"n": 2, "batch": 16}, "codec": {"name": "terngrad"}, "exchange": {"mode": "ps"},
            "optimizer": {"name": "momentum"}, "schedule": {"name": "constant", "lr": 0.05}}


def expected(metrics_csv) -> dict[str, list[tuple[int, float]]]:
    """The same, computed from metrics.csv by this test's own reading of the tag scheme, as float32."""
    m = pd.read_csv(metrics_csv)
    out: dict = {}
    for row in m.to_dict("records"):
        if row["layer"] != "model":
            cols = [(f"{c}/{row['layer']}", c) for c in ("scaler", "inf_l1", "l2sq", "clip_fraction", "scaler_ratio",
                                                         "noise_to_signal", "zero_grad_fraction")]
        elif row["split"] == "train":
            cols = [(f"train/{c}", c) for c in ("loss", "bits_up", "bits_down", "lr", "skipped", "dist_opt", "seconds")]
        else:
            cols = [(f"{row['split']}/{c}", c) for c in ("loss", "accuracy")]
        for tag, c in cols:
            v = float(row[c])
            if np.isfinite(v):
                out.setdefault(tag, []).append((int(row["step"]), float(np.float32(v))))
    return out


def assert_equal_to_csv(logdir, metrics_csv) -> dict:
    got, want = events(logdir), expected(metrics_csv)
    assert sorted(got) == sorted(want)
    for tag in want:
        assert got[tag] == want[tag], tag
    return got


def test_the_simulators_events_equal_metrics_csv(tmp_path):
    run(from_dict(tiny(tensorboard=True)), out=tmp_path / "r", quiet=True)
    got = assert_equal_to_csv(tmp_path / "r" / "tensorboard", tmp_path / "r" / "metrics.csv")
    assert len(got["train/loss"]) == 24 and [s for s, _ in got["test/accuracy"]] == [8, 16, 24]
    assert {"scaler/fc1.w", "clip_fraction/fc2.b", "zero_grad_fraction/fc1.b"} <= set(got)


def test_a_resumed_run_drops_the_killed_runs_later_points(tmp_path, monkeypatch):
    """Killed at step 13 (after its checkpoint at 8, having written steps 9-13), resumed: the event files
    of both processes read back as the resumed metrics.csv, each step once."""
    cfg = from_dict(tiny(tensorboard=True))
    kill_train_step_at(monkeypatch, 13)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, out=tmp_path / "r", quiet=True)
    monkeypatch.undo()
    run(cfg, out=tmp_path / "r", resume=True, quiet=True)
    assert len(list((tmp_path / "r" / "tensorboard").glob("events.out.tfevents.*"))) == 2
    got = assert_equal_to_csv(tmp_path / "r" / "tensorboard", tmp_path / "r" / "metrics.csv")
    assert [s for s, _ in got["train/loss"]] == list(range(1, 25))


def test_without_the_tensorboard_package_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard.summary.writer.event_file_writer", None)
    with pytest.raises(ConfigError, match=r"pip install 'tgsim\[tensorboard\]'"):
        run(from_dict(tiny()), out=tmp_path / "r", quiet=True, tensorboard=tmp_path / "tb")
    assert not (tmp_path / "r").exists() and not (tmp_path / "tb").exists()


def test_the_hook_log_writes_each_steps_counts(tmp_path):
    """HookLog on a DDP hook state's counts (step, sent, received, skipped): each step's bits, not the
    totals, from the state's counts at the start (a resumed state)."""
    from types import SimpleNamespace

    state = SimpleNamespace(step=5, sent=1000.0, received=3000.0, skipped=False)
    log = tb.HookLog(tmp_path / "tb", state)
    for k in range(3):
        state.step += 1
        state.sent += 10 + k
        state.received += 30
        state.skipped = k == 1
        log.step(state, loss=1.0 / (k + 1), lr=0.1)
    log.close()
    got = events(tmp_path / "tb")
    assert got["train/bits_up"] == [(6, 80.0), (7, 88.0), (8, 96.0)]
    assert got["train/bits_down"] == [(s, 240.0) for s in (6, 7, 8)]
    assert got["train/skipped"] == [(6, 0.0), (7, 1.0), (8, 0.0)]
    assert got["train/loss"] == [(6, 1.0), (7, 0.5), (8, float(np.float32(1 / 3)))]


@needs_mpi
def test_rank_0_of_two_mpi_ranks_writes_its_metrics_as_events(tmp_path):
    cfg = write_toml(tiny(), tmp_path / "cfg.toml")
    job, _ = mpiexec([(2, ["-m", "tgsim.mpi_runs.train", str(cfg), "--out", str(tmp_path / "r"), "--quiet",
                           "--tensorboard", str(tmp_path / "tb")])], timeout=240)
    assert job.returncode == 0, job.report()
    got = assert_equal_to_csv(tmp_path / "tb", tmp_path / "r" / "metrics.csv")
    assert len(got["train/loss"]) == 24
    assert not (tmp_path / "r" / "tensorboard").exists()
