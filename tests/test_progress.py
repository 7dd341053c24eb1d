"""Progress in batch jobs: plain lines on stdout where it is not a terminal.

Unit tests of tgsim.train.progress (which steps print, the rate and time left with a fake clock, the
line's fields), the training loop's choice of bar and lines by which streams are terminals, a resumed
run's rate counting only its own steps, and `tgsim run` / `mpiexec -n 2 ... mpi_runs.train` with
stdout piped: exactly ceil(steps / log_every) lines (one per multiple of log_every, plus the last step
where it is not one), from rank 0 only, none with --quiet.
"""

from __future__ import annotations

import io
import math
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tgsim.train import progress
from tgsim.train.config import from_dict
from tgsim.train.loop import run

REPO = Path(__file__).resolve().parents[1]
TGSIM = Path(sys.executable).parent / "tgsim"       # the installed console script, as a user runs it
TGSIM_CMD = [str(TGSIM)] if TGSIM.exists() else [sys.executable, "-m", "tgsim.cli"]
DEMO = str(REPO / "tgsim" / "configs" / "demo.toml")
# the demo config made small: 2 workers, an MLP on the digits data; a step takes milliseconds
SMALL_SETS = ["data.name='digits'", "model.name='mlp'", "model.options={hidden=[16]}", "workers.n=2",
              "workers.batch=16", "run.checkpoint_every=0"]
SMALL = {
    "run": {"name": "p", "seed": 1, "steps": 12, "eval_every": 0, "log_every": 5, "checkpoint_every": 0},
    "data": {"name": "digits"},
    "model": {"name": "mlp", "options": {"hidden": [16]}},
    "workers": {"n": 2, "batch": 16},
    "codec": {"name": "terngrad"},
}
LINE = re.compile(r"^step (\d+)/(\d+)  loss \S+  (?:acc (\S+) \(step (\d+)\)  )?(bits/worker|rank 0 bits) "
                  r"up (\S+) down (\S+)  (\S+) steps/s  eta (\S+)$")


def progress_lines(text: str) -> list[re.Match]:
    """The progress lines of `text` (a line that starts "step " must match the whole format)."""
    found = [line for line in text.splitlines() if line.startswith("step ")]
    matches = [LINE.match(line) for line in found]
    assert all(matches), found
    return matches


def cfg_with(**run_options):
    d = {k: dict(v) for k, v in SMALL.items()}
    d["run"].update(run_options)
    return from_dict(d)


# -- the module: which steps, rate and time left, the line -----------------------------------------------

@pytest.mark.parametrize("total, every", [(12, 5), (10, 5), (4000, 50), (3, 10), (1, 1), (7, 1)])
def test_a_run_prints_ceil_total_over_every_lines_ending_at_the_last_step(total, every):
    due = [d for d in range(1, total + 1) if progress.is_due(d, total, every)]
    assert len(due) == math.ceil(total / every)
    assert due[-1] == total and all(d % every == 0 for d in due[:-1])


def test_rate_and_time_left_count_only_the_steps_of_this_process():
    assert progress.rate_and_eta(60, 50, 100, 2.0) == (5.0, 8.0)        # 10 steps since the resume at 50
    assert progress.rate_and_eta(60, 0, 100, 2.0) == (30.0, 40 / 30)
    assert progress.rate_and_eta(100, 50, 100, 4.0) == (12.5, 0.0)
    rate, eta = progress.rate_and_eta(50, 50, 100, 1.0)                  # nothing done yet
    assert math.isnan(rate) and math.isnan(eta)
    rate, eta = progress.rate_and_eta(10, 0, 100, 0.0)                   # no time has passed
    assert math.isnan(rate) and math.isnan(eta)


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (0.4, "0s"), (59.4, "59s"), (60, "1m00s"), (284, "4m44s"),
                                           (3599, "59m59s"), (3600, "1h00m"), (3600 + 5 * 60 + 29, "1h05m"),
                                           (50 * 3600, "50h00m"), (float("nan"), "?"), (float("inf"), "?")])
def test_durations(seconds, text):
    assert progress.format_duration(seconds) == text


@pytest.mark.parametrize("rate, text", [(1234.4, "1234"), (100.0, "100"), (12.34, "12.3"), (1.0, "1"),
                                        (0.05123, "0.0512"), (float("nan"), "?")])
def test_rates(rate, text):
    assert progress.format_rate(rate) == text


def test_the_line_has_every_field_and_the_evaluation_only_once_made():
    ev = progress.Evaluation(500, 0.31, 0.9123)
    line = progress.format_line(500, 4000, 0.41234, 1.234e7, 4.5e7, 12.34, 284.0, ev)
    assert line == ("step 500/4000  loss 0.4123  acc 0.912 (step 500)  bits/worker up 1.234e+07 down 4.500e+07  "
                    "12.3 steps/s  eta 4m44s")
    assert LINE.match(line)
    before = progress.format_line(450, 4000, 0.5, 1e7, 4e7, 12.34, 300.0)
    assert "acc" not in before and LINE.match(before)
    regression = progress.format_line(10, 20, 0.5, 1.0, 2.0, 1.0, 10.0, progress.Evaluation(10, 0.0123, float("nan")))
    assert "eval loss 0.0123 (step 10)" in regression and "acc" not in regression
    skipped = progress.format_line(10, 20, float("nan"), 1.0, 2.0, 1.0, 10.0, skipped=2, bits_label="rank 0 bits")
    assert "loss nan" in skipped and "  skipped 2  " in skipped and "  rank 0 bits up " in skipped


def test_progress_lines_with_a_fake_clock():
    now = [100.0]
    lines = progress.ProgressLines(total=100, every=10, start=50, clock=lambda: now[0])
    now[0] = 101.0
    assert lines.line(55, 0.5, 1.0, 2.0) is None                         # not a multiple of 10
    now[0] = 102.0
    assert lines.line(60, 0.5, 1.0, 2.0).endswith("  5 steps/s  eta 8s")   # 10 steps in 2 s, 40 left
    now[0] = 110.0
    assert lines.line(100, 0.5, 1.0, 2.0).endswith("  5 steps/s  eta 0s")


# -- the training loop: bar or lines, by which streams are terminals -------------------------------------

class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stdout_tty, stderr_tty, lines_expected, bar_expected", [
    (True, True, False, True),      # an interactive run: the bar only, as before
    (False, True, True, True),      # `tgsim run | tee log`: the bar on the terminal, the lines in the log
    (True, False, True, False),     # `tgsim run 2>err.log`: no bar, so the lines on the terminal
    (False, False, True, False),    # a batch job
])
def test_lines_where_stdout_is_not_a_terminal_or_there_is_no_bar(tmp_path, monkeypatch, stdout_tty, stderr_tty,
                                                                  lines_expected, bar_expected):
    out, err = (_Terminal() if stdout_tty else io.StringIO()), (_Terminal() if stderr_tty else io.StringIO())
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    res = run(cfg_with(), out=tmp_path / "r")
    found = progress_lines(out.getvalue())
    assert [int(m[1]) for m in found] == ([5, 10, 12] if lines_expected else [])
    assert ("12/12" in err.getvalue()) == bar_expected
    assert "step 5/" not in err.getvalue()
    if found:       # the last line's totals are the run's
        assert (found[-1][6], found[-1][7]) == (f"{res.bits_up:.3e}", f"{res.bits_down:.3e}")
        assert found[-1][5] == "bits/worker"


def test_quiet_or_not_the_writer_prints_nothing(tmp_path, capsys):
    run(cfg_with(), out=tmp_path / "q", quiet=True)
    run(cfg_with(), writer=False)
    captured = capsys.readouterr()
    assert progress_lines(captured.out) == [] and captured.err == ""


def test_a_resumed_run_counts_its_rate_from_the_resume(tmp_path, capsys, monkeypatch):
    """Steps 5..12 after a resume from the step-5 checkpoint: lines at 10 and 12, the latest evaluation
    marked with its step, and the rate of the steps since the resume (a fake clock: one second a read)."""
    cfg = cfg_with(checkpoint_every=5, eval_every=4)
    run(cfg, out=tmp_path / "r", quiet=True)
    for path in (tmp_path / "r" / "checkpoints").iterdir():
        if not path.name.startswith("ckpt-00000005"):
            path.unlink()
    ticks = iter(range(1000))
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    capsys.readouterr()
    res = run(cfg, out=tmp_path / "r", resume=True)
    assert res.start_step == 5
    found = progress_lines(capsys.readouterr().out)
    assert [(m[1], m[4], m[8], m[9]) for m in found] == [("10", "8", "5", "0s"), ("12", "12", "3.5", "0s")]


# -- the command line, stdout piped ------------------------------------------------------------------------

def _run_args(out: Path, steps: int, log_every: int) -> list[str]:
    sets = [*SMALL_SETS, f"run.steps={steps}", f"run.log_every={log_every}", "run.eval_every=10"]
    return ["run", DEMO, "--out", str(out), *[a for s in sets for a in ("--set", s)]]


def test_tgsim_run_with_stdout_piped_prints_ceil_steps_over_log_every_lines(tmp_path):
    steps, every = 23, 5
    proc = subprocess.run([*TGSIM_CMD, *_run_args(tmp_path / "r", steps, every)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    found = progress_lines(proc.stdout)
    assert len(found) == math.ceil(steps / every)
    assert [int(m[1]) for m in found] == [5, 10, 15, 20, 23] and {m[2] for m in found} == {str(steps)}
    assert [m[4] for m in found] == [None, "10", "10", "20", "23"]          # the latest evaluation's step
    assert all(m[8] != "?" for m in found) and found[-1][9] == "0s"
    summary = next(line for line in proc.stdout.splitlines() if line.startswith("test loss"))
    assert f"bits/worker up {found[-1][6]} down {found[-1][7]} (whole run)" in summary
    accuracy = float(re.search(r"accuracy (\S+)", summary)[1])
    assert float(found[-1][3]) == pytest.approx(accuracy, abs=6e-4)        # the final evaluation, 3 digits
    assert "steps/s" not in proc.stderr


def test_tgsim_run_quiet_prints_no_progress_line(tmp_path, capsys):
    """`tgsim run --quiet` (in this process: the same parser and command, without a second interpreter)."""
    from tgsim import cli

    assert cli.main([*_run_args(tmp_path / "q", 12, 5), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert progress_lines(captured.out) == [] and "test loss" in captured.out and captured.err == ""
    assert cli.main(_run_args(tmp_path / "loud", 12, 5)) == 0                # the control: without --quiet
    assert [int(m[1]) for m in progress_lines(capsys.readouterr().out)] == [5, 10, 12]


# -- MPI: rank 0 only ------------------------------------------------------------------------------------

def _mpi():
    if str(REPO / "tests") not in sys.path:
        sys.path.insert(0, str(REPO / "tests"))
    import mpi_launch

    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("needs mpi4py")
    if not mpi_launch.DEFAULT.ok:
        pytest.skip(mpi_launch.DEFAULT.skip_reason())
    return mpi_launch.DEFAULT


def test_mpi_training_prints_the_lines_from_rank_0_only(tmp_path):
    mpi = _mpi()
    steps, every = 12, 5
    sets = [*SMALL_SETS, f"run.steps={steps}", f"run.log_every={every}", "run.eval_every=0"]
    job = mpi.run([(2, ["-m", "tgsim.mpi_runs.train", DEMO, "--out", str(tmp_path / "mpi"),
                        *[a for s in sets for a in ("--set", s)]])], timeout=180)
    assert job.returncode == 0, job.report()
    found = progress_lines(job.stdout)
    assert [int(m[1]) for m in found] == [5, 10, 12], job.report()        # twice as many if both ranks printed
    assert {m[5] for m in found} == {"rank 0 bits"}, job.report()
    assert progress_lines(job.stderr) == []


def test_a_step_in_which_numba_compiles_is_announced_and_left_out_of_the_rate(tmp_path, capsys, monkeypatch):
    """Step 0 compiles a fresh Numba kernel (as the first run on a machine does): one line on stderr
    says so, and the rate counts from the step after it (a fake clock: one second a read, so the line
    of step 5 shows the 4 steps after step 1 in one second, not 5)."""
    import numba

    from tgsim.train import loop as loop_mod

    original = loop_mod.train_step

    def compiling(setup, params, opt_state, step, *args, **kwargs):
        if step == 0:
            numba.njit(lambda v: v + 1)(step)        # a new function: a real compilation
        return original(setup, params, opt_state, step, *args, **kwargs)

    monkeypatch.setattr(loop_mod, "train_step", compiling)
    ticks = iter(range(1000))
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    capsys.readouterr()
    run(cfg_with(), out=tmp_path / "r")
    got = capsys.readouterr()
    said = [line for line in got.err.splitlines() if "compiling" in line]
    assert len(said) == 1 and said[0].startswith("tgsim: compiling Numba kernels (once per machine, cached in "), said
    found = progress_lines(got.out)
    assert [(m[1], m[8]) for m in found][0] == ("5", "4")
