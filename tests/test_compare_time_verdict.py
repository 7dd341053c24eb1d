"""`tgsim compare time`'s verdicts (analysis/perfmodel_verdict.py, compare_time.model_times and
sensitivity): a codec wins a setting only when its 95 % interval is above 1, the count of settings
won, the refusal of input without an fp16 (or fp32, bf16) baseline. Tiny synthetic bits_runs
rows and wire/cost tables; no compare bits run, no measurement."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from tgsim.analysis import compare_time as ct
from tgsim.analysis.perfmodel_verdict import (count_wins, log_ratio_interval, missing_baselines,
                                              settings_table)
from tgsim.cli import main

FLOATS = ("fp32", "fp16", "bf16")
# per-seed K (seeds 0, 1, 2): the floats noisy around 760; "half" certainly 2x fewer; "straddle" noisy
# around the floats' steps, its interval containing 1
K = {"fp32": [760.0, 780.0, 740.0], "fp16": [880.0, 700.0, 760.0], "bf16": [800.0, 790.0, 770.0]}


def _steps(codec_k: list[float], methods=FLOATS) -> pd.DataFrame:
    rows = [dict(rule="own-lr", problem="convnet", method=m, lr=0.1, K=float(np.mean(K[m])),
                 K_seed=dict(enumerate(K[m]))) for m in methods]
    rows.append(dict(rule="own-lr", problem="convnet", method="terngrad", lr=0.1, K=float(np.mean(codec_k)),
                     K_seed=dict(enumerate(codec_k))))
    return pd.DataFrame(rows)


def _wire_cost(workers):
    """Every method's bytes per element (the floats' ring: 4, 2, 2; terngrad's the floats' 2 in every
    pattern, so it wins or loses by its steps alone) and no codec seconds."""
    rows = []
    for N in workers:
        for m, b in (("fp32", 4.0), ("fp16", 2.0), ("bf16", 2.0), ("terngrad", 2.0)):
            rows.append(dict(method=m, workers=N, pattern="ring", up=0.0, down=0.0, reduce=b, elements=1 << 10))
    cost = pd.DataFrame(dict(method=["fp32", "fp16", "bf16", "terngrad"], encode_host=0.0, decode_host=0.0))
    return pd.DataFrame(rows), cost


SMALL = dict(nets=("resnet50",), links={1: 50e-6, 100: 2e-6}, workers=(8, 64), hardware=("p100-fp32",),
             codec_cost="none")


def test_log_ratio_interval_positive_and_negative_controls():
    """alpha = 0.05, seeds 0..2 (no random draws). Positive control: a codec whose K is half the
    float's in every seed (with seed noise) at the same step time has an interval above 1. Negative
    control: a codec whose per-seed ratios are 1.3, 0.8, 1.1 straddles 1."""
    kf = {0: 760.0, 1: 780.0, 2: 740.0}
    s, lo, hi = log_ratio_interval(kf, 1.0, {0: 380.0, 1: 400.0, 2: 360.0}, 1.0)
    assert lo > 1.0 and 1.8 < s < 2.2 and hi > s
    s, lo, hi = log_ratio_interval(kf, 1.0, {0: 760 / 1.3, 1: 780 / 0.8, 2: 740 / 1.1}, 1.0)
    assert lo < 1.0 < hi
    assert all(math.isnan(v) for v in log_ratio_interval(kf, 1.0, {0: 1.0, 1: math.nan, 2: 1.0}, 1.0))


@pytest.mark.parametrize("codec_k,wins", [([380.0, 400.0, 360.0], 4), ([990.0, 620.0, 680.0], 0)])
def test_a_setting_counts_only_when_the_interval_is_above_1(codec_k, wins):
    """Same bytes as fp16/bf16, no codec seconds: a codec with half the steps wins every setting
    (positive control); one whose steps straddle the floats' (ratio point near 1, wide interval) wins
    none, even where its point estimate is above 1 (negative control)."""
    steps = _steps(codec_k)
    wire, cost = _wire_cost(SMALL["workers"])
    df = ct.model_times(steps, wire, cost, **SMALL)
    table = settings_table(df, FLOATS)
    assert int(df.win.sum()) == wins and not df[df.method.isin(FLOATS)].win.any()
    assert len(table) == 4 and (table.best_codec == "terngrad").all()
    assert int(count_wins(table).wins.iloc[0]) == wins
    assert table.win.eq(table.lo > 1).all()
    if wins == 0:
        assert (table.speedup > 1).any()          # the point alone would have counted
    sens = ct.sensitivity(steps, wire, cost, **SMALL)
    assert list(sens.compute_speed) == list(ct.SPEEDS) and (sens.wins == wins).all()


def test_a_missing_fp16_baseline_is_refused(tmp_path, capsys):
    """Steps without fp16: missing_baselines names it, check_baselines raises, and the command exits 2
    with one line naming fp16, writing nothing; with all three floats nothing is missing."""
    assert missing_baselines(_steps([1.0] * 3), FLOATS) == {}
    steps = _steps([1.0] * 3, methods=("fp32", "bf16"))
    assert missing_baselines(steps, FLOATS) == {"own-lr": ["fp16"]}
    with pytest.raises(ct.MissingBaselineError, match="fp16"):
        ct.check_baselines(steps)
    bits = tmp_path / "bits"
    bits.mkdir()
    pd.DataFrame([dict(problem="convnet", rule="own-lr", method=m, seed=s, lr=0.1, steps=30, K=20 + s, quick=False)
                  for m in ("fp32", "bf16", "terngrad") for s in (0, 1)]).to_csv(bits / "bits_runs.csv", index=False)
    out = tmp_path / "time"
    assert main(["compare", "time", "--bits", str(bits), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fp16" in err[0] and "bf16" not in err[0].split("baseline(s)")[1].split(":")[1], err
    assert not out.exists()


def test_strong_scaling_shrinks_the_per_gpu_batch():
    from tgsim.analysis.perfmodel_nets import get_net

    net = get_net("resnet50")
    assert [ct.per_gpu_batch(net, N, "weak") for N in (8, 64)] == [net.batch] * 2
    assert [ct.per_gpu_batch(net, N, "strong") for N in (8, 64, 4096)] == [net.batch, net.batch // 8, 1]
