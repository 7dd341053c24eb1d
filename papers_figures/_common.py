"""Shared helpers for the figure scripts: where outputs go, and running configs with overrides.

`train(base, **sections)` runs one config; `train_many(jobs)` runs a list of (base, sections)
pairs in `TGSIM_JOBS` worker processes (default: the number of cores), each limited to one
BLAS / Numba thread. Results are bit-identical to serial runs: the simulator's bits do not depend
on thread counts (tests/test_models.py, tests/test_numba_kernels.py).
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from tgsim.train import config as config_mod
from tgsim.train.loop import run

OUT = Path(os.environ.get("TGSIM_FIGURES_OUT", Path(__file__).resolve().parent / "out"))


def _merged(base: dict, sections: dict) -> dict:
    d = {k: dict(v) for k, v in base.items()}
    for name, values in sections.items():
        d[name] = {**d.get(name, {}), **values}
    return d


def train(base: dict, **sections):
    """Run `base` (a config dict) with section overrides, quietly, under OUT/runs."""
    return run(config_mod.from_dict(_merged(base, sections)), quiet=True, results_base=OUT / "runs")


def _one_thread() -> None:
    import numba
    from threadpoolctl import threadpool_limits

    numba.set_num_threads(1)
    threadpool_limits(1)


def _job(job):
    base, sections = job
    r = train(base, **sections)
    return {"test_accuracy": r.test_accuracy, "test_loss": r.test_loss, "eval_split": r.eval_split,
            "bits_up": r.bits_up, "bits_down": r.bits_down, "skipped": r.skipped, "out": str(r.out)}


def train_many(jobs: list[tuple[dict, dict]]) -> list[dict]:
    """Run every (base, sections) job; returns one summary dict per job, in order."""
    procs = int(os.environ.get("TGSIM_JOBS", os.cpu_count() or 1))
    if procs <= 1 or len(jobs) <= 1:
        return [_job(j) for j in jobs]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(min(procs, len(jobs)), initializer=_one_thread) as pool:
        return pool.map(_job, jobs, chunksize=1)
