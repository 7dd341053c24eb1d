"""The speedup verdict rules of tgsim.analysis.verdicts on hand-made worker sweeps: `linear_range` (the
largest prefix of M over which fp32's speedup is at least linear up to the margin, or with two_sided the
TOST of its slope against -1) and `keeps_speedup` (a method's slope against fp32's over that range,
one-sided non-inferiority). Each table is K = c_seed M^β(M) with
a small fixed seed-by-M scatter, so every slope and verdict is known in advance."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tgsim.analysis.verdicts import keeps_speedup, linear_range

MS = (1, 2, 4, 8, 16, 32, 64)
SEEDS = (0, 1, 2)
# log-scale scatter per (seed, M index): zero mean per seed, ~1 % of K
JITTER = np.array([[0.010, -0.008, 0.004, -0.006, 0.009, -0.005, -0.004],
                   [-0.007, 0.006, -0.009, 0.008, -0.004, 0.007, -0.001],
                   [-0.003, 0.002, 0.005, -0.002, -0.005, -0.002, 0.005]])


def sweep(method: str, K_of_M, missed=()) -> pd.DataFrame:
    """One method's runs: K = K_of_M(M) x (1 + seed / 10) x exp(JITTER), NaN at the (M, seed) in `missed`."""
    rows = []
    for s in SEEDS:
        for i, M in enumerate(MS):
            K = float(K_of_M(M)) * (1 + s / 10) * float(np.exp(JITTER[s, i]))
            rows.append(dict(method=method, workers=M, seed=s, K=np.nan if (M, s) in missed else K))
    return pd.DataFrame(rows)


def linear_then_flat(M):
    """1000 / M up to M = 8, then flat at 125 (the transient floor)."""
    return 1000.0 / min(M, 8)


@pytest.mark.parametrize("two_sided", [False, True])
def test_linear_range_is_the_largest_prefix_where_fp32_is_linear(two_sided):
    """Positive control: K ∝ 1/M up to 8, flat beyond: the range is M = 1..8 under both rules, the TOST
    confirms there; every longer prefix fails."""
    r = linear_range(sweep("fp32", linear_then_flat), "fp32", two_sided=two_sided)
    assert r["Ms"] == [1, 2, 4, 8] and r["verdict"] == "confirmed" and r["tost"] == "confirmed"
    assert abs(r["slope"] + 1) < 0.02 and -0.15 < r["diff_lo"] and r["diff_hi"] < 0.15
    p = r["prefixes"].set_index("M_hi")
    assert list(p.index) == [4, 8, 16, 32, 64]
    assert (p.loc[[4, 8], "verdict"] == "confirmed").all() and (p.loc[[16, 32, 64], "verdict"] != "confirmed").all()
    assert "largest prefix" in r["test"] and "margin 0.15" in r["test"]
    assert ("TOST of fp32's slope against -1 confirms" in r["test"]) == two_sided


@pytest.mark.parametrize("two_sided", [False, True])
def test_linear_range_is_empty_when_fp32_is_never_linear(two_sided):
    """Negative control: K ∝ M^-0.5 everywhere: no prefix passes, Ms = [], and the verdict of the shortest
    prefix (M = 1..4) is not confirmed."""
    r = linear_range(sweep("fp32", lambda M: 1000.0 * M ** -0.5), "fp32", two_sided=two_sided)
    assert r["Ms"] == [] and r["verdict"] == "not confirmed" and r["tost"] == "not confirmed"
    assert (r["prefixes"].verdict != "confirmed").all() and r["M_hi"] == 4
    assert "none passes" in r["test"]


def test_linear_range_one_sided_accepts_faster_than_linear():
    """K ∝ M^-1.3 (faster than 1/M) everywhere: the one-sided rule takes every M (the speedup never flattens);
    the TOST against -1 refutes every prefix (slope + 1 = -0.3 < -0.15), so two_sided finds no range."""
    runs = sweep("fp32", lambda M: 1000.0 * M ** -1.3)
    one = linear_range(runs, "fp32")
    assert one["Ms"] == list(MS) and one["verdict"] == "confirmed" and one["tost"] == "not confirmed"
    two = linear_range(runs, "fp32", two_sided=True)
    assert two["Ms"] == [] and two["verdict"] == "not confirmed"


def test_linear_range_needs_three_reached_worker_counts():
    """fp32 missed ε on one seed at M = 4: only M = 1, 2 are usable, fewer than 3: inconclusive, no range."""
    r = linear_range(sweep("fp32", linear_then_flat, missed={(4, 1)}), "fp32")
    assert r["Ms"] == [] and r["verdict"] == "inconclusive" and len(r["prefixes"]) == 0


def test_keeps_speedup_confirms_a_parallel_curve_and_refutes_a_flat_one():
    """Over fp32's range M = 1..8: a codec with 3 x fp32's K (slope -1) keeps the speedup; one whose K falls as
    M^-0.5 does not; one falling faster than fp32 (M^-1.4) keeps it too (non-inferiority, not equivalence)."""
    fp = sweep("fp32", linear_then_flat)
    runs = pd.concat([fp, sweep("same", lambda M: 3 * linear_then_flat(M)),
                      sweep("flat", lambda M: 3000.0 * M ** -0.5), sweep("steep", lambda M: 3000.0 * M ** -1.4)])
    Ms = linear_range(fp, "fp32")["Ms"]
    same, flat, steep = (keeps_speedup(runs, m, "fp32", Ms) for m in ("same", "flat", "steep"))
    assert same["verdict"] == "confirmed" and abs(same["diff"]) < 0.02 and (same["M_lo"], same["M_hi"]) == (1, 8)
    assert flat["verdict"] == "not confirmed" and flat["diff_lo"] >= 0.15
    assert steep["verdict"] == "confirmed" and steep["diff"] < -0.3
    assert "non-inferiority" in same["test"] and same["points"] == 4


def test_keeps_speedup_undecided_when_the_method_misses_inside_the_range():
    """A codec that missed ε on a seed at M = 4 has M = 1, 2 only (fewer than 3): inconclusive; one that missed
    at M = 1 has no slope: inconclusive with the reason."""
    fp = sweep("fp32", linear_then_flat)
    runs = pd.concat([fp, sweep("late", linear_then_flat, missed={(4, 2)}),
                      sweep("never", linear_then_flat, missed={(1, 0)})])
    late = keeps_speedup(runs, "late", "fp32", [1, 2, 4, 8])
    assert late["verdict"] == "inconclusive" and late["points"] == 2 and "2 M" in late["test"]
    never = keeps_speedup(runs, "never", "fp32", [1, 2, 4, 8])
    assert never["verdict"] == "inconclusive" and "missed the target at M = 1" in never["test"]
    assert keeps_speedup(runs, "absent", "fp32", [1, 2, 4, 8])["verdict"] == "inconclusive"
