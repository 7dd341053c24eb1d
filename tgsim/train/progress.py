"""Plain progress lines for runs whose stdout is not a terminal (mpiexec, Slurm, CI, `| tee log`), or
that show no progress bar (stderr not a terminal); tgsim.train.loop.run prints them on stdout.

One line every `log_every` steps and at the last step, e.g.

    step 500/4000  loss 0.4123  acc 0.912 (step 500)  bits/worker up 1.234e+07 down 4.500e+07  12.3 steps/s  eta 4m44s

Fields, each separated by two spaces:
    step DONE/TOTAL   steps completed (1-based: the line after the step's update) of the run's total;
    loss              the training loss of that step (mean over the workers);
    acc / eval loss   the latest evaluation of this process and the step it was made at; accuracy where
                      the task has one, else the evaluation loss; left out before the first evaluation;
    bits              bits sent up and received down so far (the run's totals, including the steps before
                      a resume), labelled by the caller: "bits/worker" in the simulator, "rank 0 bits" over
                      MPI (rank 0's own counts, as in metrics.csv);
    skipped N         only where steps were skipped (non-finite gradients);
    steps/s, eta      the rate of the steps done by this process (a resumed run counts only the steps since
                      the resume) and the time the remaining steps take at that rate.

A step in which Numba compiled kernels (the first run on a machine; then they are cached on disk,
cache=True) is left out of the rate: `CompileWatch` counts the compilations and announces the first in
one line on stderr, and the trainer calls `ProgressLines.restart` after such a step.

The formatting functions are pure; `ProgressLines` keeps the start step and the start time, and reads the time
from a clock it is given (time.perf_counter, looked up when it is made, by default; a fake clock in tests).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple


class Evaluation(NamedTuple):
    """An evaluation on the test (or validation) split: the step it was made at, its loss and accuracy
    (nan for regression)."""
    step: int
    loss: float
    accuracy: float


def is_due(done: int, total: int, every: int) -> bool:
    """Whether the line of step `done` (1-based) is printed: every `every` steps and at the last step.

    A run of `total` steps from step 0 prints ceil(total / every) lines; `every` < 1 prints only the last.
    """
    return done == total or (every >= 1 and done % every == 0)


def rate_and_eta(done: int, start: int, total: int, elapsed: float) -> tuple[float, float]:
    """(steps per second, seconds left) from the `done - start` steps this process made in `elapsed`
    seconds, of `total` steps; (nan, nan) before a step is done or while no time has passed; seconds
    left is 0 at the end."""
    made = done - start
    if made <= 0 or not elapsed > 0:
        return float("nan"), (0.0 if done >= total else float("nan"))
    rate = made / elapsed
    return rate, max(total - done, 0) / rate


def format_duration(seconds: float) -> str:
    """`seconds` rounded to whole seconds as "45s", "4m44s" or "2h05m" (minutes rounded); "?" if unknown."""
    if not math.isfinite(seconds):
        return "?"
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    h, m = divmod(int(round(s / 60)), 60)
    return f"{h}h{m:02d}m"


def format_rate(rate: float) -> str:
    """The steps per second `rate` with three significant digits and no exponent ("1234", "12.3",
    "0.0512"); "?" if unknown."""
    if not math.isfinite(rate):
        return "?"
    return f"{rate:.0f}" if rate >= 100 else f"{rate:.3g}"


def format_line(done: int, total: int, loss: float, bits_up: float, bits_down: float, rate: float, eta: float,
                evaluation: Evaluation | None = None, skipped: int = 0, bits_label: str = "bits/worker") -> str:
    """One progress line (module docstring: the fields): step `done`/`total`, the `loss`, the last
    `evaluation` when given, the bits up and down (`bits_up`, `bits_down`, labelled `bits_label`), the
    `skipped` steps when any, the `rate` in steps/s and the `eta` in seconds."""
    parts = [f"step {done}/{total}", f"loss {loss:.4g}"]
    if evaluation is not None:
        if math.isfinite(evaluation.accuracy):
            parts.append(f"acc {evaluation.accuracy:.3f} (step {evaluation.step})")
        elif math.isfinite(evaluation.loss):
            parts.append(f"eval loss {evaluation.loss:.4g} (step {evaluation.step})")
    parts.append(f"{bits_label} up {bits_up:.3e} down {bits_down:.3e}")
    if skipped:
        parts.append(f"skipped {skipped}")
    parts.append(f"{format_rate(rate)} steps/s")
    parts.append(f"eta {format_duration(eta)}")
    return "  ".join(parts)


@dataclass
class ProgressLines:
    """The progress lines of one run in this process: `line(...)` gives the text of step `done`'s line
    when it is due (is_due), else None. `start`: the step this process began at (0, or the step of the
    checkpoint a resume continues from); the clock starts when the object is made."""
    total: int
    every: int
    start: int = 0
    bits_label: str = "bits/worker"
    clock: Callable[[], float] | None = None
    t0: float = field(init=False)

    def __post_init__(self):
        self.clock = self.clock or time.perf_counter
        self.t0 = self.clock()

    def restart(self, done: int) -> None:
        """Count the rate from step `done` on (the clock read now): the steps up to `done` took time
        that the rest will not take (Numba compiling its kernels, the first run on a machine)."""
        self.start, self.t0 = done, self.clock()

    def line(self, done: int, loss: float, bits_up: float, bits_down: float, evaluation: Evaluation | None = None,
             skipped: int = 0) -> str | None:
        if not is_due(done, self.total, self.every):
            return None
        rate, eta = rate_and_eta(done, self.start, self.total, self.clock() - self.t0)
        return format_line(done, self.total, loss, bits_up, bits_down, rate, eta, evaluation, skipped, self.bits_label)


def is_terminal(stream) -> bool:
    """Whether `stream` is a terminal (False for pipes, files, closed or replaced streams)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def say(line: str) -> None:
    """One line on stderr, written around a progress bar (tqdm.write) if one is shown."""
    import sys

    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)
    sys.stderr.flush()


class CompileWatch:
    """A block in which Numba's compilations are counted (`count`: numba's "numba:compile" events,
    which fire on a cache miss only, never when a kernel is loaded from its on-disk cache). The first
    one calls `say` with one line (None: silent), `tgsim: compiling Numba kernels (once per machine,
    cached in DIR) ...`. Without Numba the count stays 0."""

    def __init__(self, say=None):
        self.say, self.count = say, 0
        self._listener = None

    def __enter__(self):
        try:
            from numba.core import event
        except ImportError:
            return self
        watch = self

        class _Listener(event.Listener):
            def on_start(self, ev):
                watch.count += 1
                if watch.count == 1 and watch.say is not None:
                    watch.say(f"tgsim: compiling Numba kernels (once per machine, cached in "
                              f"{_cache_dir(ev.data)}) ...")

            def on_end(self, ev):
                pass

        self._listener = _Listener()
        event.register("numba:compile", self._listener)
        return self

    def __exit__(self, *exc):
        if self._listener is not None:
            from numba.core import event

            event.unregister("numba:compile", self._listener)
            self._listener = None
        return False


def _cache_dir(data) -> str:
    """Where Numba caches the kernel of a compile event's `data`: $NUMBA_CACHE_DIR, else its dispatcher's
    cache folder (a __pycache__ beside the source)."""
    import os

    if os.environ.get("NUMBA_CACHE_DIR"):
        return os.environ["NUMBA_CACHE_DIR"]
    try:
        return str(data["dispatcher"]._cache._cache_path)
    except (KeyError, TypeError, AttributeError):
        return "__pycache__ beside tgsim's sources"
