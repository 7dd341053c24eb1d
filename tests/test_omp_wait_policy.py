"""Importing tgsim makes idle OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE) unless the user chose a
policy: tgsim/__init__.py. Each case runs in a fresh interpreter, since the policy is read once, when
an OpenMP runtime starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import os, time
import tgsim
import numpy as np
from numba import njit, prange

@njit(parallel=True)
def total(a):
    s = 0.0
    for i in prange(a.size):
        s += a[i]
    return s

a = np.ones(1 << 12)
total(a)
t0, c0 = time.perf_counter(), time.process_time()
for _ in range(200):          # short regions with idle gaps between them, as a training step has
    total(a)
    time.sleep(0.002)
print(os.environ.get("OMP_WAIT_POLICY"), time.process_time() - c0, time.perf_counter() - t0)
"""


def _probe(policy: str | None) -> tuple[str, float, float]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    name, cpu, wall = out.stdout.split()
    return name, float(cpu), float(wall)


def test_import_sets_passive_and_keeps_the_users_choice():
    assert _probe(None)[0] == "PASSIVE"
    assert _probe("ACTIVE")[0] == "ACTIVE"


def test_idle_threads_sleep_between_regions():
    """200 regions with 2 ms sleeps between them: under tgsim's default the process's CPU time stays
    below a quarter of its wall time (the pool's threads sleep while the main thread sleeps); the
    positive control, OMP_WAIT_POLICY=ACTIVE (threads spin through the gaps), uses at least twice
    tgsim's CPU share. With one core the spinning thread cannot run beside the main one, so the
    control needs two."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cores < 2:
        pytest.skip("the spinning control needs 2 cores")
    _, cpu, wall = _probe(None)
    assert cpu < 0.25 * wall, (cpu, wall)
    _, cpu_active, wall_active = _probe("ACTIVE")
    assert cpu_active / wall_active > 2 * cpu / wall, (cpu_active, wall_active, cpu, wall)
