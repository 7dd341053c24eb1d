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
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np


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
