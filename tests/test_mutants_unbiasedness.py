"""Tests written to kill mutants that survived `make mutation` in analysis/unbiasedness.py.

tests/test_statistics.py compares binom_two_sided_pvalues with scipy.stats.binomtest on random
(k, n, p), where two outcomes are never exactly as likely; these pin the tie tolerance (_RERR)
with p = 1/2, where they are, and the input validation, which no test reached.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from tgsim.analysis import unbiasedness as ub


@pytest.mark.parametrize("n", [1, 2, 9, 10, 41, 100])
def test_pvalues_at_exact_ties_match_scipy(n):
    """p = 1/2 (and p = 1/3 with n + 1 divisible by 3, where pmf(j) = pmf(j+1) at the mode): the
    outcomes as likely as the observed one, up to scipy's relative 1e-7, count in both tails —
    a tolerance below 1 drops the mirrored tail (p-value halves), a larger one adds outcomes."""
    for p in (0.5, 1 / 3):
        k = np.arange(n + 1)
        got = ub.binom_two_sided_pvalues(k, n, p)
        want = [st.binomtest(int(j), n, p).pvalue for j in k]
        for j in k:
            assert math.isclose(got[j], want[j], rel_tol=1e-9, abs_tol=1e-300), (j, n, p)
    # the symmetric case by hand: n = 2, k = 0 -> P(0) + P(2) = 1/2
    assert ub.binom_two_sided_pvalues(np.array([0]), 2, 0.5)[0] == pytest.approx(0.5, rel=1e-12)


@pytest.mark.parametrize("k", [-1, 6, [0, 6], [-1, 3]])
def test_counts_outside_0_n_are_rejected(k):
    """A count below 0 or above n is not a Binomial(n, p) outcome: ValueError, not a p-value."""
    with pytest.raises(ValueError, match="counts"):
        ub.binom_two_sided_pvalues(np.array(k), 5, 0.5)


@pytest.mark.parametrize("p", [-0.1, 1.5, 1.0 + 1e-12, math.nan])
def test_probabilities_outside_0_1_are_rejected(p):
    """p must lie in [0, 1] (NaN included in the rejection); p = 0 and p = 1 themselves are fine."""
    with pytest.raises(ValueError, match="probabilities"):
        ub.binom_two_sided_pvalues(np.array([1, 2]), 5, np.array([0.5, p]))
    assert list(ub.binom_two_sided_pvalues(np.array([0, 5]), 5, np.array([0.0, 1.0]))) == [1.0, 1.0]
