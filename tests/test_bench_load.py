"""Benchmarks say when their numbers cannot be trusted: the load average against
the core count, the spread of a row's timed calls, too few calls, a time near the clock's resolution
(tgsim.bench.timing.judge / row_check), in every row of `bench codec`, `bench codec --codec all`,
`bench sim` and in bench exchange's CSV."""

from __future__ import annotations

import math
import re
import time

import numpy as np
import pandas as pd
import pytest

from tgsim.bench import timing

NS = 1e-9


def test_a_loaded_machine_and_a_wide_spread_warn():
    """Positive controls: a 30 % spread, a load above the core count, one timed call, a 10 us median
    on a 1 us clock each warn; a clean row (5 % spread, load 0.5 on 2 cores, 5 calls, 10 ms on a 1 ns
    clock) does not. The limits: a load equal to the core count and a spread of exactly 20 % do not."""
    clean = dict(spread=0.05, calls=5, shortest=0.01, load=0.5, cores=2, resolution=NS)
    assert timing.judge(**clean) == ""
    assert timing.judge(**{**clean, "spread": 0.30}) == "spread 30 % > 20 %"
    assert timing.judge(**{**clean, "load": 2.5}) == "load average 2.5 > 2 cores"
    assert timing.judge(**{**clean, "spread": 0.30, "load": 2.5}) == "load average 2.5 > 2 cores; spread 30 % > 20 %"
    assert "1 timed call" in timing.judge(**{**clean, "calls": 1, "spread": float("nan")})
    assert "< 100 x the clock's 1e+03 ns" in timing.judge(**{**clean, "shortest": 1e-5, "resolution": 1e-6})
    assert timing.judge(**{**clean, "load": 2.0, "spread": 0.20}) == ""
    assert timing.judge(**{**clean, "load": float("nan")}) == ""          # no load average on this system


def test_row_check_takes_the_worst_of_a_rows_timings():
    """A ratio row is as good as the worse of its two timings: (max - min) / median of each."""
    fast = np.array([1.0, 1.02, 1.01, 1.0]) * 1e-3                       # spread 2 %
    noisy = np.array([1.0, 1.3, 1.1, 1.0]) * 1e-3                        # spread 30 / 1.05
    r = timing.row_check([fast, noisy], load=0.1, cores=4, resolution=NS)
    assert r["spread"] == pytest.approx(0.3 / 1.05) and r["warning"].startswith("spread 29 %")
    assert r["load_avg"] == 0.1
    r = timing.row_check([fast, timing.Timing(fast)], load=0.1, cores=4, resolution=NS)
    assert r["spread"] == pytest.approx(0.02 / 1.005) and r["warning"] == ""
    assert math.isnan(timing.spread([1.0])) and timing.spread([1.0, 2.0, 3.0]) == 1.0


def test_the_clock_resolves_far_below_the_timed_calls():
    """perf_counter, not a coarse clock: its measured step is under 10 us (a 4 ms clock would show
    4e-3), and the resolution of a coarse fake clock is measured as its step."""
    assert timing.clock_resolution() < 1e-5
    ticks = iter(range(10**6))
    assert timing.clock_resolution(lambda: next(ticks) // 4 * 4e-3, reads=50) == pytest.approx(4e-3)
    assert time.get_clock_info("perf_counter").monotonic


def test_every_bench_row_has_the_trust_columns(monkeypatch, capsys):
    """Rows of bench codec --codec all and bench exchange's summary carry load_avg, spread and warning;
    with the load average faked above the core count every row warns, and the printed table says so."""
    from tgsim.bench import codecs_all
    from tgsim.bench import exchange as be

    monkeypatch.setattr(timing, "load_average", lambda: 99.0)
    rows = codecs_all.run(("fp32", "terngrad"), n_elements=1 << 12, workers=2, repeats=3)
    for r in rows:
        assert r["load_avg"] == 99.0 and r["spread"] >= 0 and "load average 99.0 >" in r["warning"]
    text = codecs_all.format_rows(rows, 1 << 12, 2)
    assert "WARNING: load average 99.0" in text and "WARNING: 2 of 2 rows warn" in text
    base = dict(topology="shared", rate="1gbit", ranks=2, params=4_000_000, t_encode=0.0, t_decode=0.0,
                payload_max_link=1.0, payload_total=400.0, wire_bytes=400.0, cores=2, steps=5, t_wire=1.0)
    df = be.summarize(pd.DataFrame([
        {**base, "mode": "fp32_native", "t_step": 1.0, "t_step_min": 0.95, "t_step_max": 1.05, "loadavg": 0.5},
        {**base, "mode": "tg_allreduce", "t_step": 0.5, "t_step_min": 0.45, "t_step_max": 0.6, "loadavg": 3.0}]))
    r = df.set_index("mode")
    assert r.loc["fp32_native", "spread"] == pytest.approx(0.1) and r.loc["fp32_native", "warning"] == ""
    assert r.loc["tg_allreduce", "spread"] == pytest.approx(0.3)
    assert r.loc["tg_allreduce", "warning"] == "load average 3.0 > 2 cores; spread 30 % > 20 %"
    assert {"load_avg", "spread", "warning"} <= set(df.columns)


def _ms(*values):
    return timing.Timing(np.asarray(values, dtype=np.float64) * 1e-3)


CLEAN = _ms(10.0, 10.2, 10.1, 10.05)              # spread 2 %
NOISY = _ms(10.0, 13.0, 11.0, 10.5)               # spread 3 / 10.75 = 28 %: (max - min) / median


def test_bench_codec_backend_table_warns_on_a_wide_spread():
    """`tgsim bench codec --backend numpy|cupy` (codec_gpu): fake timings through the same row and
    table code. Positive control: a row whose own timing has a 30 % spread warns (and one whose floor
    has it: x_read divides both); a clean row does not; the machine line and the count say so; a load
    above the core count warns every row and the machine line."""
    from tgsim.bench import codec_gpu

    wide = _ms(10.0, 13.0, 10.0, 10.0)            # (13 - 10) / 10 = 30 %
    kw = dict(load=0.5, cores=2, resolution=NS)
    rows = [codec_gpu.make_row("numpy", "read pass, copy", CLEAN, CLEAN.median, 1000, [CLEAN], **kw),
            codec_gpu.make_row("numpy", "encode 1 layer", wide, CLEAN.median, 1000, [CLEAN], **kw),
            codec_gpu.make_row("numpy", "aggregate 8", CLEAN, 2e-3, 1000, [NOISY], **kw)]
    assert rows[0]["warning"] == "" and rows[0]["spread"] == pytest.approx(0.2 / 10.075)
    assert rows[1]["warning"] == "spread 30 % > 20 %" and rows[1]["x_read"] == pytest.approx(10.0 / 10.075)
    assert rows[2]["warning"] == "spread 28 % > 20 %"
    text = codec_gpu.format_rows(rows, load=0.5, cores=2, resolution=NS)
    lines = text.splitlines()
    assert lines[1].startswith("load average 0.50 (1 min) on 2 cores") and "WARNING: load" not in text
    assert lines[2].split() == ["row", "elements", "ms", "floor_ms", "x_read", "spread", "warning"]
    assert lines[3].endswith(" 2%") and re.search(r" 30% +spread 30 % > 20 %$", lines[4])
    assert lines[-1].startswith("WARNING: 2 of 3 rows warn")
    loaded = [codec_gpu.make_row("cupy", "read pass, copy", CLEAN, CLEAN.median, 1000, [CLEAN], load=3.0, cores=2,
                                 resolution=codec_gpu.CUDA_EVENT_RESOLUTION)]
    text = codec_gpu.format_rows(loaded, load=3.0, cores=2, resolution=NS)
    assert "WARNING: load average 3.0 > 2 cores" in text and "CUDA event times" in text
    assert loaded[0]["warning"] == "load average 3.0 > 2 cores" and "WARNING: 1 of 1 rows warn" in text


def test_bench_sim_backend_table_warns_on_a_wide_spread():
    """`tgsim bench sim --backend numpy|cupy` (sim_gpu): a row is as good as the worst of its four
    timings. Positive control: a 30 % spread in one of them warns, printed under the row and counted;
    four clean timings do not."""
    from tgsim.bench import sim_gpu

    four = dict.fromkeys(("bitwise", "vendor", "looped", "one process"), CLEAN)
    kw = dict(load=0.5, cores=2, resolution=NS)
    clean = sim_gpu.make_row("mlp", 100, 32, 8, four, **kw)
    noisy = sim_gpu.make_row("mlp", 100, 128, 8, {**four, "looped": _ms(10.0, 10.0, 13.0, 10.0)}, **kw)
    assert clean["warning"] == "" and clean["bitwise / vendor"] == pytest.approx(1.0)
    assert noisy["warning"] == "spread 30 % > 20 %" and noisy["spread"] == pytest.approx(0.3)
    text = sim_gpu.format_rows([clean, noisy], "numpy", **kw)
    lines = text.splitlines()
    assert lines[1].startswith("load average 0.50 (1 min) on 2 cores") and lines[2].split()[-1] == "spread"
    assert lines[3].endswith(" 2%") and lines[4].endswith(" 30%")
    assert lines[5] == "    warning mlp N = 128: spread 30 % > 20 %"
    assert lines[6].startswith("WARNING: 1 of 2 rows warn") and len(lines) == 7
    assert "WARNING" not in sim_gpu.format_rows([clean], "numpy", **kw).replace("a row warns", "")
