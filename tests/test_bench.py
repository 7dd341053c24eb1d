"""tgsim.bench: the shared timing helper, the quick forms of `tgsim bench codec | sim`, the one-process
floor of `tgsim bench sim`."""

from __future__ import annotations

import sys
import weakref
from pathlib import Path

import numpy as np

from tgsim.bench import timing
from tgsim.cli import main

REPO = Path(__file__).resolve().parents[1]


class _Recorder:
    """Variants and a clock over one event log: each variant call logs its name and advances a fake
    time by its own duration; each clock read logs "clock"."""

    def __init__(self, durations: dict):
        self.durations, self.events, self.now, self.calls = durations, [], 0.0, 0

    def variant(self, name):
        def call():
            self.events.append(name)
            self.now += self.durations[name]
            self.calls += 1
            return (name, self.calls)
        return call

    def clock(self):
        self.events.append("clock")
        return self.now


def test_rounds_interleave_and_time_only_the_timed_call():
    rec = _Recorder({"a": 1.0, "b": 2.0})
    t = timing.rounds({"a": rec.variant("a"), "b": rec.variant("b")}, 2, warm_each=True, clock=rec.clock)
    one_round = ["a", "clock", "a", "clock", "b", "clock", "b", "clock"]
    assert rec.events == ["a", "b"] + one_round + one_round      # warm-up round, then 2 timed rounds
    assert rec.events[2:5] == ["a", "clock", "a"]                 # the per-round warm-up call is outside the clock
    assert t["a"].seconds.tolist() == [1.0, 1.0] and t["b"].seconds.tolist() == [2.0, 2.0]
    assert t["b"].result == ("b", 10) and t["a"].median == 1.0 and t["b"].best == 2.0


def test_time_call_is_the_median_of_back_to_back_calls_after_one_warmup():
    durations = iter([5.0, 3.0, 1.0, 2.0])                       # the warm-up call is the slow one
    now = [0.0]

    def fn():
        now[0] += next(durations)
        return now[0]

    t = timing.rounds({"f": fn}, 3, clock=lambda: now[0])["f"]
    assert t.seconds.tolist() == [3.0, 1.0, 2.0] and t.median == 2.0 and t.best == 1.0 and t.result == 11.0
    rec = _Recorder({"f": 1.0})
    timing.time_call(rec.variant("f"), 3)
    assert rec.calls == 4


def test_rounds_with_no_timed_round_only_warm_up():
    rec = _Recorder({"a": 1.0, "b": 1.0})
    t = timing.rounds({"a": rec.variant("a"), "b": rec.variant("b")}, 0, warmup=2, clock=rec.clock)
    assert rec.events == ["a", "b", "a", "b"] and t["a"].seconds.size == 0 and t["b"].result == ("b", 4)


def test_rounds_keep_no_result_alive_during_later_calls():
    """As in a loop that drops each result: a call's result is released before the next call, except
    the last round's, which `result` returns."""
    refs, alive = [], []

    class Box:
        pass

    def fn():
        alive.append(sum(r() is not None for r in refs))
        box = Box()
        refs.append(weakref.ref(box))
        return box

    t = timing.rounds({"a": fn, "b": fn}, 3, warm_each=True)
    assert alive == [0] * 12 + [1, 1]          # 2 warm-up calls, 3 rounds of 4; a's last result kept while b runs
    assert t["a"].result is refs[-3]() and t["b"].result is refs[-1]()


def _table_rows(out: str, first_word: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.split()[:1] == [first_word]]


def test_bench_codec_quick_prints_every_row(capsys):
    assert main(["bench", "codec", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "n_elements=262144 (1 MiB float32), numba threads=" in out
    head = next(line for line in out.splitlines() if line.startswith("what"))
    assert head.split() == ["what", "ms", "min", "ms", "spread", "x", "floor", "speedup", "wire", "bytes", "identical",
                            "warning"]
    assert "load average " in out and " cores; clock perf_counter, resolution " in out
    for key in ("floor read g (float32, 1 pass)", "floor philox words (n words, none stored)",
                "floor encode = max(read g, philox words): ", "fused moments+encode 2bit clip=explicit",
                "fused moments+encode base3 clip=none", "floor wsum = read payloads + write out",
                "fused weighted_sum 8 x 2bit, per-worker scalers, out= preallocated", "fused sum_codes 8 x 2bit"):
        assert key in out, key
    fused = _table_rows(out, "fused")
    compared = [t for r in fused for t in r if t in ("True", "False")]     # the warning column never holds them
    assert len(compared) == 9 and set(compared) == {"True"}        # 4 encodes, 4 weighted sums, sum_codes


def test_bench_sim_quick_reports_the_floor(capsys):
    assert main(["bench", "sim", "--quick"]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.strip().startswith("N "))
    assert "floor steps/s" in head and head.rstrip().endswith("x floor  spread") and "pipeline speedup" in head
    assert "load average " in out and " cores; clock perf_counter, resolution " in out
    rows = [line.replace("(", " ").replace(")", " ").replace("x", " ").replace("%", " ").split()
            for line in out.splitlines() if line[:5].strip().isdigit()]
    assert [r[0] for r in rows] == ["1", "8"]
    for r in rows:  # N, steps/s, looped steps/s, step x2, grad x2, pipeline steps/s, pipeline x2, floor, x floor x2, spread
        assert len(r) == 14 and all(float(v) > 0 for v in r[:13]) and float(r[13]) >= 0, r
    assert "x floor = batched step time / floor time" in out and "peak memory of one step" in out


def test_floor_is_one_process_sgd_on_the_whole_batch():
    """The floor's step: the N workers' samples as ONE worker's batch, loss_and_grad, w - lr g."""
    from tgsim.bench import sim
    from tgsim.train.loop import build, local_batch
    from tgsim.train.schedules import learning_rate

    setup = build(sim._config(3, (16,), 4, "auto"))
    params = setup.model.init(0)
    before = {k: v.copy() for k, v in params.items()}
    new = sim._one_process_step(setup, params)()
    x, y = local_batch(setup, 0)                                  # (3, 4, 40), (3, 4)
    _, g = setup.model.loss_and_grad(params, x.reshape(1, 12, -1), y.reshape(1, 12))
    lr = np.float32(learning_rate(setup.cfg.schedule, 0, setup.cfg.run.steps))
    for k in params:
        assert np.array_equal(params[k], before[k])                   # not modified in place
        assert new[k].dtype == np.float32 and np.array_equal(new[k], params[k] - lr * g[k][0]), k
    rows = sim.throughput(workers=(2,), hidden=(16,), batch=4, repeats=2)
    assert rows[0]["floor_steps_per_s"] > 0 and rows[0]["x_floor"] > 0 and rows[0]["x_floor_median_round"] > 0


# netem.sh in the installed package (a wheel, not editable): tests/test_wheel.py


def test_philox_floor_draws_every_word_the_encode_draws():
    """The Philox floor folds the xor of every block's four words: the same sum as the stream's words
    (tgsim.rng.random_words) folded in NumPy, so it computes every word and skips none."""
    from tgsim.bench.codec import _philox_floor
    from tgsim.rng import StreamKey, random_words
    from tgsim.rng.numba_philox import _stream_args

    key = StreamKey(seed=11, step=2, worker=1, layer=3)
    n = 4 * 1000
    w = random_words(n, key).reshape(-1, 4)
    expect = int(np.bitwise_xor.reduce(w, axis=1).astype(np.uint64).sum())
    assert int(_philox_floor(np.int64(n // 4), *_stream_args(key))) == expect
    assert int(_philox_floor(np.int64(n // 4 - 1), *_stream_args(key))) != expect


def test_bench_codec_layers_splits_the_same_elements():
    """`--layers K`: the same n elements as K layers (sizes differ by at most one), every codec's row
    gains the K-layer encode and aggregate times over the one layer's; K outside 1..n is one line, exit 2."""
    from tgsim.bench import codecs_all

    g = np.arange(10, dtype=np.float32)
    parts = codecs_all.split_layers(g, 2, 3)
    assert [p.shape for p in parts.values()] == [(2, 4), (2, 3), (2, 3)]
    assert np.array_equal(np.concatenate([p[1] for p in parts.values()]), g)
    rows = codecs_all.run(("terngrad", "fp16"), n_elements=1 << 10, workers=2, repeats=1, layers=8)
    for r in rows:
        assert r["encode_8_x_one"] > 0 and r["aggregate_8_x_one"] > 0 and r["encode_8_flat_x_one"] > 0, r
    assert [r["multi_tensor"] for r in rows] == [True, False]
    assert main(["bench", "codec", "--quick", "--layers", "0"]) == 2


def test_bench_every_codec_gives_a_row_of_ratios():
    """`tgsim bench codec --codec all`: one row per registered codec, finite positive ratios, and the
    bits per element of the real payloads (fp32 32, fp16 16, terngrad 2 + its scaler)."""
    from tgsim.bench import codecs_all
    from tgsim.codecs import registry

    rows = codecs_all.run(registry.names(), n_elements=1 << 12, workers=2, repeats=1)
    assert [r["codec"] for r in rows] == list(registry.names())
    for r in rows:
        assert r["encode_x_read"] > 0 and r["aggregate_x_floor"] > 0
    bits = {r["codec"]: r["bits_per_element"] for r in rows}
    assert bits["fp32"] == 32 and 16 < bits["fp16"] < 16.1 and 2 < bits["terngrad"] < 2.2
    assert rows[[r["codec"] for r in rows].index("terngrad")]["encode_x_reference"] > 0
