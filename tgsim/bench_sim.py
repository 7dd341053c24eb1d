"""`tgsim bench sim`: simulator throughput and memory, as ratios measured in one run.

For N virtual workers on the MLP (MNIST-1D shapes, per-worker batch fixed):
  * steps/s of the batched step (one loss_and_grad over the worker axis, the codec batched over
    workers: TernGrad.scaling_many / encode_many, then the exchange) against the same step with a
    per-worker Python loop over loss_and_grad (the codec still batched: "step speedup");
  * the same against the fully per-worker pipeline, a Python loop over loss_and_grad and over the
    codec's single-worker scaling / encode ("pipeline speedup");
  * the gradient phase alone, batched against looped;
  * peak memory of one step (tracemalloc, which sees NumPy's allocations) against the floor
    N · params · 4 bytes for the workers' float32 gradients, on an MLP of >= 1M parameters.
All variants are timed in interleaved rounds (each once per round, after one untimed call), so that
a shared machine's load affects them alike; speedups are given best-against-best and as the median
within-round ratio.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np

from tgsim.codecs.terngrad import ScalingBatch
from tgsim.rng import StreamKey
from tgsim.train.config import from_dict
from tgsim.train.loop import build, train_step


def _config(n: int, hidden, batch: int, kernels: str):
    return from_dict({
        "run": {"name": "bench", "steps": 1000},
        "data": {"name": "mnist1d"},
        "model": {"name": "mlp", "options": {"hidden": list(hidden)}},
        "workers": {"n": n, "batch": batch, "batch_mode": "per_worker"},
        "codec": {"name": "terngrad", "clip": "explicit", "kernels": kernels},
        "exchange": {"mode": "ps"},
        "optimizer": {"name": "momentum"},
    })


class _LoopedModel:
    """The same model, its loss_and_grad called once per worker in a Python loop."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def loss_and_grad(self, params, x, y):
        parts = [self.model.loss_and_grad(params, x[i:i + 1], y[i:i + 1]) for i in range(x.shape[0])]
        loss = np.concatenate([p[0] for p in parts])
        grads = {k: np.concatenate([p[1][k] for p in parts]) for k in parts[0][1]}
        return loss, grads


class _LoopedCodec:
    """The same codec, its batched calls made one worker at a time with the single-worker functions
    (TernGrad.scaling / encode): the per-worker pipeline, with the same bits."""

    def __init__(self, codec):
        self.codec = codec

    def __getattr__(self, name):
        return getattr(self.codec, name)

    def prepare_many(self, layers):
        nw = len(next(iter(layers.values())))
        per = [self.codec.scaling({k: v[w] for k, v in layers.items()}) for w in range(nw)]
        return [None if per[0][i] is None else
                ScalingBatch(*(np.array([p[i][f] for p in per]) for f in range(4)))
                for i in range(len(per[0]))]

    def encode_many(self, layers, seed, step, workers, shared_scalers=None, scalings=None, deferred=False):
        return [self.codec.encode({k: v[w] for k, v in layers.items()}, StreamKey(seed, step, int(wid)),
                                  shared_scalers, None if scalings is None else
                                  [None if s is None else s.worker(w) for s in scalings], deferred=deferred)
                for w, wid in enumerate(workers)]


def _rounds(variants: dict, repeats: int) -> dict:
    """Seconds per call of each variant in the steady state of a training loop, measured in
    `repeats` interleaved rounds so that all variants see the same state of a shared, noisy
    machine: per round, each variant in a fixed order is called once untimed (its caches and
    allocator warm again after the other variants ran, as in a loop of that variant alone) and
    then once timed."""
    for fn in variants.values():
        fn()                            # JIT compilation, first-touch allocations
    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            fn()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: np.asarray(t) for name, t in times.items()}


def throughput(workers=(1, 8, 32, 128), hidden=(256, 256), batch: int = 8, repeats: int = 15,
               kernels: str = "auto") -> list[dict]:
    """Per N: steps/s (best round) of the batched step, the looped step and the per-worker pipeline,
    and the speedups two ways: best against best (min/min: each variant's least-disturbed round)
    and the median over rounds of the within-round ratio."""
    from tgsim.train.loop import local_batch

    rows = []
    for n in workers:
        setup = build(_config(n, hidden, batch, kernels))
        params = setup.model.init(0)
        state = setup.optimizer.init(params)
        model, codec = setup.model, setup.codec
        looped_model, looped_codec = _LoopedModel(model), _LoopedCodec(codec)
        x, y = local_batch(setup, 0)

        def step(m, c):
            def run():
                setup.model, setup.codec = m, c
                train_step(setup, params, state, 0)
            return run

        t = _rounds({"batched_grad": lambda: model.loss_and_grad(params, x, y),
                     "looped_grad": lambda: looped_model.loss_and_grad(params, x, y),
                     "batched": step(model, codec), "looped": step(looped_model, codec),
                     "pipeline": step(looped_model, looped_codec)}, repeats)
        setup.model, setup.codec = model, codec

        def speedup(slow, fast):
            return float(t[slow].min() / t[fast].min()), float(np.median(t[slow] / t[fast]))

        row = {"workers": n, "steps_per_s": 1 / float(t["batched"].min()),
               "looped_steps_per_s": 1 / float(t["looped"].min()),
               "pipeline_steps_per_s": 1 / float(t["pipeline"].min())}
        for key, (slow, fast) in {"step": ("looped", "batched"), "grad": ("looped_grad", "batched_grad"),
                                  "pipeline": ("pipeline", "batched")}.items():
            row[f"{key}_speedup"], row[f"{key}_speedup_median_round"] = speedup(slow, fast)
        rows.append(row)
    return rows


def peak_memory(workers: int = 8, hidden=(1024, 1024), batch: int = 8, kernels: str = "auto") -> dict:
    setup = build(_config(workers, hidden, batch, kernels))
    params = setup.model.init(0)
    state = setup.optimizer.init(params)
    n_params = sum(int(np.prod(s)) for s in setup.model.layer_shapes().values())
    train_step(setup, params, state, 0)  # warm-up outside the measurement
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    train_step(setup, params, state, 1)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    floor = workers * n_params * 4
    return {"workers": workers, "params": n_params, "peak_bytes": peak, "floor_bytes": floor,
            "peak_over_floor": peak / floor}


def run(workers=(1, 8, 32, 128), repeats: int = 15) -> dict:
    return {"throughput": throughput(workers, repeats=repeats), "memory": peak_memory()}


def print_report(res: dict) -> None:
    print("simulator throughput, MLP 40-256-256-10, 8 samples per worker, TernGrad (ps, explicit clip)")
    print("speedups: best round against best round (min/min), and in brackets the median over rounds "
          "of the within-round ratio")
    print(f"{'N':>5} {'steps/s':>9} {'looped steps/s':>15} {'step speedup':>16} {'grad speedup':>16} "
          f"{'pipeline steps/s':>17} {'pipeline speedup':>17}")
    for r in res["throughput"]:
        print(f"{r['workers']:5d} {r['steps_per_s']:9.1f} {r['looped_steps_per_s']:15.1f} "
              f"{r['step_speedup']:6.2f}x ({r['step_speedup_median_round']:5.2f}x) "
              f"{r['grad_speedup']:6.2f}x ({r['grad_speedup_median_round']:5.2f}x) "
              f"{r['pipeline_steps_per_s']:17.1f} "
              f"{r['pipeline_speedup']:6.2f}x ({r['pipeline_speedup_median_round']:5.2f}x)")
    print("looped: per-worker loss_and_grad, codec batched; pipeline: per-worker loss_and_grad, "
          "scaling and encode (the target: pipeline speedup >= 5x at N = 32)")
    m = res["memory"]
    print(f"peak memory of one step, MLP of {m['params']:,} parameters, N = {m['workers']}: "
          f"{m['peak_bytes'] / 2**20:.1f} MiB against the gradient floor {m['floor_bytes'] / 2**20:.1f} MiB "
          f"({m['peak_over_floor']:.2f}x)")


if __name__ == "__main__":
    print_report(run())
