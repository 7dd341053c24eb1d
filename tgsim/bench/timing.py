"""The one timing helper of the benchmarks: named variants timed in interleaved rounds.

    t = rounds({"a": fa, "b": fb}, repeats=15, warm_each=True)
    t["a"].seconds, t["a"].median, t["a"].best, t["a"].result

Order of calls: `warmup` untimed rounds (every variant called once per round, in the given order:
compilation, caches, first-touch allocations), then `repeats` timed rounds. In a timed round each
variant, in order, is called once untimed if `warm_each` (its caches and allocator warm again after
the other variants ran, as in a loop of that variant alone) and then once between two clock reads.
Interleaving makes a shared machine's changing load hit every variant alike.

  * one variant, warm_each=False: one warm-up call, then `repeats` calls back to back (the median of
    `repeats` calls after a warm-up: `tgsim bench codec`'s rows);
  * several variants, warm_each=True: the steady state of a training loop of each variant
    (`tgsim bench sim`);
  * variants that record what they measure inside each call (`tgsim.bench.exchange_rank`: the
    components of one MPI step of each mode); there the seconds of one round, the last warm-up
    round run as a timed round, set how many timed rounds follow.

The clock is time.perf_counter (nanosecond resolution on Linux; `clock_resolution` measures it).

Trust in a row (`row_check`, shared by `tgsim bench codec`, `bench codec --codec all`, `bench sim`
and the rows of `bench exchange`): a row warns when

  * the machine's 1-minute load average (os.getloadavg) exceeds its core count (the cores this
    process may run on): other work takes cores from the timed calls, which then wait whole
    scheduler ticks (4 ms at 250 Hz) and come out in steps of them;
  * the spread of its timed calls, (max - min) / median, exceeds SPREAD_LIMIT (20 %), for any of
    the timings it is made of (a ratio: both);
  * a timing had fewer than MIN_REPEATS timed calls (no spread can be estimated), or its median is
    under RESOLUTION_FACTOR x the clock's resolution (quantization, not the call, sets the number).
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

SPREAD_LIMIT = 0.20         # (max - min) / median of a timing's calls above this: the row warns
MIN_REPEATS = 2             # fewer timed calls: no spread, the row warns
RESOLUTION_FACTOR = 100     # a median under 100 x the clock's resolution: the row warns


@dataclass(frozen=True)
class Timing:
    """Seconds of each timed call of one variant, in call order, and what its last call returned."""

    seconds: np.ndarray
    result: Any = None

    @property
    def median(self) -> float:
        return float(np.median(self.seconds))

    @property
    def best(self) -> float:
        """The fastest call: the least disturbed one on a shared machine."""
        return float(np.min(self.seconds))


def rounds(variants: Mapping[str, Callable[[], Any]], repeats: int, *, warmup: int = 1, warm_each: bool = False,
           clock: Callable[[], float] = time.perf_counter) -> dict[str, Timing]:
    """Time every variant `repeats` times in interleaved rounds (see the module docstring for the
    order of calls); returns {name: Timing}. Every call's return value is dropped as soon as the
    call returns (no result stays alive during later calls) except in the last round: `result` is
    the variant's last return value (of its last warm-up call when repeats = 0)."""
    warmup, repeats = max(0, warmup), max(0, repeats)
    results = dict.fromkeys(variants)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(warmup + repeats):
        for name, fn in variants.items():
            if r < warmup:
                out = fn()
            else:
                if warm_each:
                    fn()
                t0 = clock()
                out = fn()
                times[name].append(clock() - t0)
            if r == warmup + repeats - 1:
                results[name] = out
            del out
    return {name: Timing(np.asarray(times[name], dtype=np.float64), results[name]) for name in variants}


def time_call(fn: Callable[[], Any], repeats: int) -> Timing:
    """One variant: `repeats` timed calls after one untimed warm-up call."""
    return rounds({"call": fn}, max(1, repeats))["call"]


def spread(seconds) -> float:
    """(max - min) / median of the timed calls; nan for fewer than two."""
    s = np.asarray(seconds, dtype=np.float64)
    if s.size < 2:
        return float("nan")
    med = float(np.median(s))
    return float((s.max() - s.min()) / med) if med > 0 else float("inf")


def load_average() -> float:
    """The machine's 1-minute load average (os.getloadavg); nan where the system has none."""
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):
        return float("nan")


def core_count() -> int:
    """The cores this process may run on (its affinity mask), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=4)
def clock_resolution(clock: Callable[[], float] = time.perf_counter, reads: int = 2000) -> float:
    """The smallest step of `clock` seen in `reads` back-to-back reads, and at least the resolution
    the system declares for perf_counter: what one clock read can tell apart."""
    declared = time.get_clock_info("perf_counter").resolution if clock is time.perf_counter else 0.0
    step, last = math.inf, clock()
    for _ in range(reads):
        now = clock()
        if now > last:
            step = min(step, now - last)
        last = now
    return max(declared, step if math.isfinite(step) else declared)


def machine_warning(load: float, cores: int) -> str:
    """'' or the warning for a load average above the core count."""
    if math.isfinite(load) and load > cores:
        return f"load average {load:.1f} > {cores} cores"
    return ""


def judge(spread: float, calls: int, shortest: float, load: float, cores: int, resolution: float,
          spread_limit: float = SPREAD_LIMIT, min_repeats: int = MIN_REPEATS) -> str:
    """The warning of one row ('' when none applies), from its numbers: the largest spread of its
    timings ((max - min) / median; nan: fewer than two calls), the fewest timed calls of any of them,
    the shortest median (s), the load average, the core count and the clock's resolution (s)."""
    out = [machine_warning(load, cores)]
    if spread > spread_limit:                      # nan compares False
        out.append(f"spread {100 * spread:.0f} % > {100 * spread_limit:.0f} %")
    if calls < min_repeats:
        out.append(f"{calls} timed call{'s' if calls != 1 else ''} (< {min_repeats}: no spread)")
    if shortest < RESOLUTION_FACTOR * resolution:
        out.append(f"{shortest * 1e6:.3g} us < {RESOLUTION_FACTOR} x the clock's {resolution * 1e9:.3g} ns")
    return "; ".join(w for w in out if w)


def row_check(timings, load: float, cores: int, resolution: float,
              spread_limit: float = SPREAD_LIMIT) -> dict:
    """The trust columns of one row from its timings (Timing objects or arrays of seconds): load_avg,
    spread (the largest of its timings'), warning (`judge`; '' when none applies)."""
    arrays = [np.asarray(t.seconds if isinstance(t, Timing) else t, dtype=np.float64) for t in timings]
    worst = max((x for x in map(spread, arrays) if not math.isnan(x)), default=float("nan"))
    calls = min((a.size for a in arrays), default=0)
    shortest = min((float(np.median(a)) for a in arrays if a.size), default=math.inf)
    return {"load_avg": load, "spread": worst,
            "warning": judge(worst, calls, shortest, load, cores, resolution, spread_limit)}


def machine_line(load: float, cores: int, resolution: float) -> str:
    """The line a benchmark prints above its table: load, cores, clock; WARNING when overloaded."""
    text = (f"load average {load:.2f} (1 min) on {cores} cores; clock perf_counter, resolution "
            f"{resolution * 1e9:.3g} ns; a row warns when its spread (max - min) / median > "
            f"{100 * SPREAD_LIMIT:.0f} %")
    machine = machine_warning(load, cores)
    return text + (f"\nWARNING: {machine}: other work shares the cores, timings and ratios are not reliable"
                   if machine else "")
