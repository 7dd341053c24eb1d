"""Two rules of the report's bits and summaries, on small hand-made tables (no training run):

- `tgsim.analysis.compare_bits.matched_bits`: every ratio compares methods on one exchange, a parameter
  server. The exchange counts fp32 as a ring all-reduce (2 (N-1)/N x 32 = 56 bits per element each way
  at N = 8: 112 per step) and fp16 with a 32-bit float downlink (16 + 32); the matched bits charge fp32
  32 + 32 and the named 16-bit floats 16 + 16 per element per step, every other method its measured
  bits. `ratio_rows` gives the mean per-seed ratio with the (1 - 2 alpha) interval the verdicts judge.
- `tgsim.analysis.verdicts.combine(best="inconclusive")` and `tally`: a claim that no test here can
  confirm ("does not incur any accuracy loss", margin 0) is "not confirmed" as soon as any problem shows
  a loss, never "split"; the tally names how many problems gave which verdict.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tgsim.analysis import compare_bits as cb
from tgsim.analysis.verdicts import combine, tally

N_EL = 1000       # elements of the hand-made model


def _runs(terngrad_bits=(0.8e6, 0.9e6, 1.0e6), fp32_K=(100, 110, 120), fp16_K=(100, 110, 120), tern_K=(150, 160, 170)):
    """bits_runs rows as compare bits writes them at N = 8: fp32 charged the ring (112 bits per element per
    step), fp16 16 up + 32 down, TernGrad its own measured bits."""
    rows = []
    for s in range(3):
        for m, K, up, down in (("fp32", fp32_K[s], 56, 56), ("fp16", fp16_K[s], 16, 32),
                               ("terngrad", tern_K[s], None, None)):
            if up is None:
                total = terngrad_bits[s]
                bu = total / 3
            else:
                bu, total = K * N_EL * up, K * N_EL * (up + down)
            rows.append(dict(problem="p", rule="fp32-lr", method=m, seed=s, K=float(K), steps=K, bits_up=bu,
                             bits_down=total - bu, bits_total=total, bits_up_per_step=bu / K,
                             bits_up_per_element=bu / K / N_EL))
    return pd.DataFrame(rows)


def test_fp32_is_charged_a_parameter_server_not_the_ring():
    r = cb.matched_bits(_runs(), reference="fp32").set_index(["method", "seed"])
    np.testing.assert_allclose(r.loc["fp32"].elements, N_EL)               # derived from the two per-step columns
    np.testing.assert_allclose(r.loc["fp32"].bits_ps, np.array([100, 110, 120]) * N_EL * 64)
    np.testing.assert_allclose(r.loc["terngrad"].bits_ps, [0.8e6, 0.9e6, 1.0e6])   # measured, unchanged
    np.testing.assert_allclose(r.loc["terngrad"].ratio, np.array([0.8e6, 0.9e6, 1.0e6]) / (np.array([100, 110, 120])
                                                                                      * N_EL * 64))
    # the ring ratio is kept apart: 64 / 112 of the matched one
    np.testing.assert_allclose(r.loc["terngrad"].ring_ratio, r.loc["terngrad"].ratio * 64 / 112)
    assert (r.loc["fp32"].ratio == 1.0).all()


def test_fp16_is_charged_16_up_and_16_down_when_named():
    r = cb.matched_bits(_runs(), dense={"fp16": 16}, reference="fp32").set_index(["method", "seed"])
    np.testing.assert_allclose(r.loc["fp16"].bits_ps, np.array([100, 110, 120]) * N_EL * 32)
    np.testing.assert_allclose(r.loc["fp16"].ratio, 0.5)                   # same K as fp32: half its bits
    unnamed = cb.matched_bits(_runs(), reference="fp32").set_index(["method", "seed"])
    np.testing.assert_allclose(unnamed.loc["fp16"].ratio, 48 / 64)         # measured: 16 up + 32-bit float down


def test_a_method_that_missed_has_no_ratio_and_elements_column_wins():
    runs = _runs()
    runs.loc[(runs.method == "terngrad") & (runs.seed == 1), "K"] = np.nan
    runs["elements"] = N_EL
    runs["bits_up_per_element"] = np.nan                                    # not needed when `elements` is there
    r = cb.matched_bits(runs, reference="fp32").set_index(["method", "seed"])
    assert math.isnan(r.loc[("terngrad", 1), "ratio"]) and np.isfinite(r.loc[("terngrad", 0), "ratio"])
    np.testing.assert_allclose(r.loc["fp32"].bits_ps, np.array([100, 110, 120]) * N_EL * 64)


def test_ratio_rows_give_the_interval_the_verdicts_judge():
    r = cb.ratio_rows(cb.matched_bits(_runs(), reference="fp32"), reference="fp32").set_index("method")
    x = np.array([0.8e6, 0.9e6, 1.0e6]) / (np.array([100, 110, 120]) * N_EL * 64)
    h = stats.t.ppf(0.95, 2) * x.std(ddof=1) / np.sqrt(3)                  # 90 %: one-sided tests at alpha 0.05
    np.testing.assert_allclose(r.loc["terngrad", ["ratio", "lo", "hi"]].astype(float), [x.mean(), x.mean() - h,
                                                                                         x.mean() + h])
    assert r.loc["terngrad", "verdict"] == "confirmed" and r.loc["fp32", "ratio"] == 1.0


def test_no_loss_summary_is_not_confirmed_when_any_problem_shows_a_loss():
    # the report's fig08 and fig11 cases: {inconclusive, not confirmed}, in either order
    assert combine(["inconclusive", "not confirmed"], best="inconclusive") == "not confirmed"
    assert combine(["not confirmed", "inconclusive"], best="inconclusive") == "not confirmed"
    assert combine(["inconclusive", "inconclusive"], best="inconclusive") == "inconclusive"
    assert combine(["inconclusive", "n/a"], best="inconclusive") == "inconclusive"
    assert combine([], best="inconclusive") == "n/a"
    with pytest.raises(ValueError):                                         # such a claim cannot be confirmed
        combine(["confirmed", "inconclusive"], best="inconclusive")


def test_the_default_combine_is_unchanged():
    assert combine(["inconclusive", "not confirmed"]) == "split"
    assert combine(["confirmed", "confirmed"]) == "confirmed"
    assert combine(["confirmed", "inconclusive"], every=True) == "inconclusive"
    assert combine(["confirmed", "not confirmed"], every=True) == "not confirmed"


def test_combine_takes_conditional_as_a_weaker_confirmed():
    """"conditional" (a passed test, a condition of the rule unchecked; _theme.VERDICTS) is a verdict
    `combine` takes: among "confirmed" settings the summary is "conditional", never "confirmed" (which
    would drop the unchecked condition) nor "split" (nothing disagrees); beside a failure it is as
    "confirmed" would be; a claim that can at best be inconclusive rejects it as it rejects "confirmed"."""
    assert combine(["confirmed", "conditional"]) == "conditional"
    assert combine(["conditional", "confirmed", "n/a"]) == "conditional"
    assert combine(["conditional", "conditional"]) == "conditional"
    assert combine(["confirmed", "conditional"], every=True) == "conditional"
    assert combine(["conditional", "inconclusive"]) == "split"
    assert combine(["conditional", "not confirmed"], every=True) == "not confirmed"
    assert combine(["conditional", "inconclusive"], every=True) == "inconclusive"
    with pytest.raises(ValueError):
        combine(["conditional", "inconclusive"], best="inconclusive")
    with pytest.raises(ValueError):
        combine(["conditional", "passed"])       # still no other word


def test_tally_says_what_happened_per_problem():
    v = ["inconclusive", "not confirmed", "inconclusive", "not confirmed"]
    p = ["logistic", "convnet", "resnet", "transformer"]
    assert tally(v, p) == "inconclusive on 2 of 4 (logistic, resnet); not confirmed on 2 of 4 (convnet, transformer)"
    assert tally(v, p, {"not confirmed": "loss shown"}) == \
        "inconclusive on 2 of 4 (logistic, resnet); loss shown on 2 of 4 (convnet, transformer)"
    assert tally(["confirmed", "n/a"]) == "confirmed on 1 of 1"
    assert tally([]) == ""
