"""`tgsim run` as a user meets it: one clear line for a missing file, the totals of a resumed run,
a quiet exit when the reader of stdout goes away, and the MPI summary's per-worker bits."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_cases import MPI_INSTALL, needs_mpi
from tgsim import cli

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TINY = ["--set", "run.steps=12", "--set", "run.checkpoint_every=5", "--set", "run.eval_every=0",
        "--set", "data.name='digits'", "--set", "model.name='mlp'", "--set", "model.options={hidden=[16]}",
        "--set", "workers.n=2", "--set", "workers.batch=16", "--quiet"]
DEMO = str(REPO / "tgsim" / "configs" / "demo.toml")


def _tgsim(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tgsim.cli", *args], capture_output=True, text=True, timeout=300,
                          **kw)


@pytest.mark.parametrize("args, says", [
    (["run", "no-such-config.toml"], "config file no-such-config.toml does not exist"),
    (["run", "--resume", "--out", "no-such-dir"], "no run to resume in no-such-dir"),
    (["run", "--resume"], "--resume needs --out DIR"),
    (["run"], "needs a CONFIG.toml"),
])
def test_missing_files_end_in_one_line_and_exit_2(tmp_path, args, says):
    proc = _tgsim(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"tgsim run: {proc.stderr.strip().split(': ', 1)[1]}"]
    assert says in proc.stderr and "Traceback" not in proc.stderr


def test_resume_of_a_finished_run_says_so_and_reports_the_whole_run(tmp_path):
    out = tmp_path / "r"
    first = _tgsim("run", DEMO, "--out", str(out), *TINY)
    assert first.returncode == 0, first.stderr
    again = _tgsim("run", "--resume", "--out", str(out), "--quiet")
    assert again.returncode == 0, again.stderr
    assert "already complete (12 steps)" in again.stdout
    summary = [line for line in first.stdout.splitlines() if line.startswith("test loss")]
    assert summary and summary[0] in again.stdout.splitlines(), (first.stdout, again.stdout)
    assert "bits/worker up 0.000e+00" not in again.stdout


def test_resume_midway_counts_the_bits_before_the_checkpoint(tmp_path):
    """A run stopped after its step-5 checkpoint and resumed reports the bits of all 12 steps."""
    from tgsim.train import config as config_mod
    from tgsim.train.loop import run

    args = cli.build_parser().parse_args(["run", DEMO, *TINY])
    cfg = config_mod.load(args.config, args.set)
    full = run(cfg, out=tmp_path / "full", quiet=True)
    part = run(config_mod.load(args.config, args.set + ["run.steps=5"]), out=tmp_path / "part", quiet=True)
    (tmp_path / "part" / "config.toml").write_text((tmp_path / "full" / "config.toml").read_text())
    resumed = run(cfg, out=tmp_path / "part", resume=True, quiet=True)
    assert resumed.start_step == 5 and part.bits_up > 0
    assert (resumed.bits_up, resumed.bits_down, resumed.skipped) == (full.bits_up, full.bits_down, full.skipped)


def test_a_closed_stdout_ends_quietly(tmp_path):
    """`tgsim bench codec --quick | head -1`: no BrokenPipeError traceback, the SIGPIPE status."""
    proc = subprocess.Popen([sys.executable, "-m", "tgsim.cli", "bench", "codec", "--quick"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    proc.stdout.readline()
    proc.stdout.close()                         # the reader goes away, as `head -1` does
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err


def test_mpi_summary_reports_worker_ranks_and_the_server_apart():
    from tgsim.mpi_runs.train import per_worker_bits

    totals = [{"rank": 0, "sent": 300.0, "received": 200.0}, {"rank": 1, "sent": 10.0, "received": 30.0},
              {"rank": 2, "sent": 20.0, "received": 50.0}]
    ps = per_worker_bits(totals, "ps")
    assert ps.startswith("bits/worker up 1.200e+02 down 3.200e+02 (ranks 1..2; rank 0 as server up 2.400e+03")
    assert per_worker_bits(totals, "allgather").startswith("bits/worker up 8.800e+02 down 7.467e+02")
    assert per_worker_bits(totals[:1], "ps").startswith("bits/worker up 2.400e+03 down 1.600e+03")
    assert per_worker_bits(totals, "allreduce", start_step=30).endswith("since the resume at step 30")


def test_no_progress_bar_where_stderr_is_not_a_terminal(tmp_path):
    """Logs and CI get the summary lines, not thousands of progress-bar redraws."""
    proc = _tgsim("run", DEMO, "--out", str(tmp_path / "r"), *[a for a in TINY if a != "--quiet"])
    assert proc.returncode == 0, proc.stderr
    assert "step/s" not in proc.stderr and "%|" not in proc.stderr, proc.stderr[-2000:]


# -- issue 46: a user's model and a resumed run are never silently wrong ---------------------------

def _main(capsys, *args) -> tuple[int, list[str], str]:
    """`tgsim ARGS` in this process: (exit status, stderr's lines, stdout)."""
    capsys.readouterr()
    rc = cli.main(list(args))
    got = capsys.readouterr()
    return rc, got.err.strip().splitlines(), got.out


TORCH_SET = ["--set", "model.name='torch'", "--set"]


@pytest.mark.parametrize("options, says", [
    ("{factory='fakes:small_net', kwargs={widht=3}}", "TypeError: small_net() got an unexpected keyword argument 'widht'"),
    ("{factory='fakes:raising_net'}", "RuntimeError: forward exploded on purpose"),
    ("{factory='fakes:batchnorm_net'}", "is a BatchNorm with running statistics"),
])
def test_a_model_that_cannot_train_fails_in_one_line_before_anything_is_written(tmp_path, capsys, options, says):
    """A misspelled factory argument, a forward that raises, a BatchNorm module: exit 2, one line naming
    the cause, no run directory (the same --out then works once the model is fixed)."""
    pytest.importorskip("torch")
    out = tmp_path / "r"
    rc, err, _ = _main(capsys, "run", DEMO, "--out", str(out), *TINY, *TORCH_SET, f"model.options={options}")
    assert rc == 2 and len(err) == 1 and says in err[0] and "before anything was written" in err[0], err
    assert not out.exists()


def test_resume_refuses_another_config_and_records_an_allowed_change(tmp_path, capsys):
    """--resume with another codec or learning rate: exit 2, one line naming the keys, nothing changed.
    run.steps may change (resumes.jsonl records it, config.toml follows) and gives the bits of a run
    of the new length; --allow-change KEY accepts another key."""
    import numpy as np

    full, part = tmp_path / "full", tmp_path / "part"
    assert _main(capsys, "run", DEMO, "--out", str(full), *TINY)[0] == 0
    assert _main(capsys, "run", DEMO, "--out", str(part), *TINY, "--set", "run.steps=5")[0] == 0
    stored = (part / "config.toml").read_text()
    for change, says in ((["--set", "codec.name='qsgd'"], "codec.name: 'terngrad' -> 'qsgd'"),
                         (["--set", "schedule.lr=0.5"], "schedule.lr: 0.1 -> 0.5")):
        rc, err, _ = _main(capsys, "run", "--resume", "--out", str(part), "--quiet", *change)
        assert rc == 2 and len(err) == 1 and says in err[0] and "--allow-change" in err[0], err
    assert (part / "config.toml").read_text() == stored and not (part / "resumes.jsonl").exists()
    rc, err, out = _main(capsys, "run", "--resume", "--out", str(part), "--quiet", "--set", "run.steps=12")
    assert rc == 0 and "resumed at step 5 of 12" in out, err
    with np.load(full / "params.npz") as a, np.load(part / "params.npz") as b:
        assert all(a[k].tobytes() == b[k].tobytes() for k in a.files)
    assert json.loads((part / "resumes.jsonl").read_text())["changed"] == {"run.steps": [5, 12]}
    assert "steps = 12" in (part / "config.toml").read_text()
    rc, err, _ = _main(capsys, "run", "--resume", "--out", str(part), "--quiet", "--set", "schedule.lr=0.5",
                       "--allow-change", "schedule.lr")
    assert rc == 0, err
    assert json.loads((part / "resumes.jsonl").read_text().splitlines()[-1])["changed"] == {"schedule.lr": [0.1, 0.5]}


def _poison_batches(monkeypatch, worker: int, steps) -> None:
    """NaN in `worker`'s inputs at the given steps (its gradient then holds NaN)."""
    from tgsim.train import loop as loop_mod

    original = loop_mod.local_batch

    def poisoned(setup, step):
        x, y = original(setup, step)
        if step in steps:
            x = x.copy()
            x[worker] = float("nan")
        return x, y

    monkeypatch.setattr(loop_mod, "local_batch", poisoned)


def test_a_nonfinite_gradient_stops_in_one_line_and_resume_loses_no_step(tmp_path, capsys, monkeypatch):
    """NaN in worker 1's gradient at step 7 (0-based): exit 2, one line naming the layer, the worker, the
    step and run.on_nonfinite; the 7 steps before it are checkpointed, and once the cause is gone
    --resume ends with the bits of a run that never failed."""
    import numpy as np

    full, cut = tmp_path / "full", tmp_path / "cut"
    assert _main(capsys, "run", DEMO, "--out", str(full), *TINY)[0] == 0
    _poison_batches(monkeypatch, 1, {7})
    rc, err, _ = _main(capsys, "run", DEMO, "--out", str(cut), *TINY)
    assert rc == 2 and len(err) == 1, err
    assert re.search(r"layer '\S+': gradient has \d+ non-finite values .* at worker 1, step 7;", err[0]), err
    assert "run.on_nonfinite" in err[0] and "ckpt-00000007.tgck" in err[0] and "Traceback" not in err[0]
    assert (cut / "checkpoints" / "ckpt-00000007.tgck").exists()
    monkeypatch.undo()
    rc, err, out = _main(capsys, "run", "--resume", "--out", str(cut), "--quiet")
    assert rc == 0 and "resumed at step 7 of 12" in out, err
    with np.load(full / "params.npz") as a, np.load(cut / "params.npz") as b:
        assert all(a[k].tobytes() == b[k].tobytes() for k in a.files)


def test_a_run_that_skipped_too_many_steps_exits_3_and_run_health_alerts(tmp_path, capsys, monkeypatch):
    """on_nonfinite = 'skip': 2 of 12 steps skipped (> run.max_skipped_fraction 0.1) exits 3 with one
    line and `analyze run-health` raises an ALERT (exit 1); 1 of 12 exits 0 with no run ALERT."""
    _poison_batches(monkeypatch, 0, {3, 8})
    skip = ["--set", "run.on_nonfinite='skip'"]
    rc, err, out = _main(capsys, "run", DEMO, "--out", str(tmp_path / "bad"), *TINY, *skip)
    assert rc == 3 and len(err) == 1 and "2 of 12 steps skipped" in err[0] and "run-health" in err[0], err
    rc, _, out = _main(capsys, "analyze", "run-health", str(tmp_path / "bad"))
    assert rc == 1 and "ALERT run: 2 of 12 steps skipped" in out, out
    rc, err, _ = _main(capsys, "run", DEMO, "--out", str(tmp_path / "ok"), *TINY, *skip,
                       "--set", "run.max_skipped_fraction=0.2")
    assert rc == 0 and err == [], err
    rc, _, out = _main(capsys, "analyze", "run-health", str(tmp_path / "ok"))
    assert "ALERT run" not in out


def test_a_nonfinite_final_loss_is_unhealthy():
    from tgsim.train.config import from_dict
    from tgsim.train.loop import unhealthy

    cfg = from_dict({"run": {"steps": 100}})
    assert unhealthy(cfg, 10, 0.5) == ""
    assert unhealthy(cfg, 0, float("nan")) == "the final test loss is nan"
    assert unhealthy(cfg, 11, 0.5).startswith("11 of 100 steps skipped")


def test_a_factory_module_in_the_working_directory_is_found(tmp_path, capsys, monkeypatch):
    """factory = "cwd_nets:net" with ./cwd_nets.py and nothing on PYTHONPATH: `tgsim run` imports it
    from the working directory, as `python -m` would."""
    pytest.importorskip("torch")
    (tmp_path / "cwd_nets_46.py").write_text("import torch\n\ndef net(dim, classes):\n"
                                             "    return torch.nn.Linear(dim, classes)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "cwd_nets_46", raising=False)
    rc, err, _ = _main(capsys, "run", DEMO, "--out", str(tmp_path / "r"), *TINY, *TORCH_SET,
                       "model.options={factory='cwd_nets_46:net'}")
    sys.modules.pop("cwd_nets_46", None)
    assert rc == 0, err


@needs_mpi
def test_mpi_trainer_checks_the_model_and_the_resume_before_rank_0_writes(tmp_path):
    """Two ranks: a factory module in the working directory (found there) whose forward raises: every
    rank says so in one line, exit 2, no directory; --resume with another learning rate: refused on
    every rank, exit 2, the run's config.toml unchanged."""
    pytest.importorskip("torch")
    (tmp_path / "boom_nets_46.py").write_text(
        "import torch\n\nclass Boom(torch.nn.Linear):\n    def forward(self, x):\n"
        "        raise RuntimeError('forward exploded')\n\ndef net(dim, classes):\n    return Boom(dim, classes)\n")
    train = ["-m", "tgsim.mpi_runs.train", DEMO, *TINY]
    bad = MPI_INSTALL.run([(2, [*train, "--out", str(tmp_path / "bad"), *TORCH_SET,
                                "model.options={factory='boom_nets_46:net'}"])], timeout=120, cwd=tmp_path)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 2, bad.report()
    assert all("RuntimeError: forward exploded" in line for line in lines), bad.report()
    assert not (tmp_path / "bad").exists()
    from tgsim.train.config import load
    from tgsim.train.loop import run

    run(load(DEMO, [s for s in TINY[1::2] if s != "--quiet"]), out=tmp_path / "r", quiet=True)
    stored = (tmp_path / "r" / "config.toml").read_text()
    again = MPI_INSTALL.run([(2, ["-m", "tgsim.mpi_runs.train", "--resume", "--out", str(tmp_path / "r"), "--quiet",
                                  "--set", "schedule.lr=0.5"])], timeout=120)
    lines = again.stderr.strip().splitlines()
    assert again.returncode == 2 and len(lines) == 2, again.report()
    assert all("schedule.lr: 0.1 -> 0.5" in line for line in lines), again.report()
    assert (tmp_path / "r" / "config.toml").read_text() == stored
