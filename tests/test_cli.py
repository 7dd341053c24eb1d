"""`tgsim run` as a user meets it: one clear line for a missing file, the totals of a resumed run,
a quiet exit when the reader of stdout goes away, and the MPI summary's per-worker bits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
