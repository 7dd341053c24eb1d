"""`tgsim bench sim`: simulator throughput and memory, as ratios measured in one run.

For N virtual workers on the MLP (MNIST-1D shapes, per-worker batch fixed):
  * steps/s of the batched step (one loss_and_grad over the worker axis, the codec batched over
    workers: TernGrad.scaling_many / encode_many, then the exchange) against the same step with a
    per-worker Python loop over loss_and_grad (the codec still batched: "step speedup");
  * the same against the fully per-worker pipeline, a Python loop over loss_and_grad and over the
    codec's single-worker scaling / encode ("pipeline speedup");
  * the gradient phase alone, batched against looped;
  * the batched step against its compute floor ("x floor" = step time / floor time): one step of
    the same model trained as ONE process on the whole batch -- its N · B samples gathered from the
    training set, one loss_and_grad with a single worker of N · B samples, a plain SGD update, fp32,
    no codec, no exchange;
  * peak memory of one step (tracemalloc, which sees NumPy's allocations) against the floor
    N · params · 4 bytes for the workers' float32 gradients, on an MLP of >= 1M parameters.
All variants are timed in interleaved rounds (tgsim.bench.timing.rounds: each once per round, after
one untimed call), so that a shared machine's load affects them alike; ratios are given
best-against-best and as the median within-round ratio. Each row also has load_avg, spread (the
largest (max - min) / median over rounds of its six variants) and warning (tgsim.bench.timing.row_check:
load above the core count, spread above 20 %, too few rounds, a time near the clock's resolution).
"""

from __future__ import annotations

import tracemalloc

import numpy as np

from tgsim.bench import timing
from tgsim.bench.timing import rounds
from tgsim.codecs.terngrad.codec import ScalingBatch
from tgsim.data.batching import batch_indices_many
from tgsim.rng import StreamKey
from tgsim.train.config import from_dict
from tgsim.train.loop import build, local_batch, train_step
from tgsim.train.optim import sgd
from tgsim.train.schedules import learning_rate


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


def _one_process_step(setup, params, step: int = 0):
    """The compute floor of the N workers' step: a function that runs one step of the same model as
    ONE process on the whole batch -- the N · B samples of the workers' batches at `step` gathered
    from the training set, loss_and_grad on them as a single worker (shape (1, N · B, ...)), and a
    plain SGD update of `params` (float32; no codec, no exchange, no momentum). Returns the new
    parameters; `params` is not modified."""
    cfg, ds = setup.cfg, setup.dataset
    local = setup.exchange.local_workers
    idx = batch_indices_many([setup.shards[w] for w in local], cfg.workers.per_worker_batch, cfg.run.seed,
                             step, local).reshape(-1)
    model, update = setup.model, sgd().update
    lr = learning_rate(cfg.schedule, step, cfg.run.steps)

    def run():
        _, grads = model.loss_and_grad(params, ds.x_train[idx][None], ds.y_train[idx][None])
        return update({k: g[0] for k, g in grads.items()}, {}, params, lr)[0]
    return run


def throughput(workers=(1, 8, 32, 128), hidden=(256, 256), batch: int = 8, repeats: int = 15,
               kernels: str = "auto") -> list[dict]:
    """Per N: steps/s (best round) of the batched step, the looped step, the per-worker pipeline and
    the one-process floor, and the ratios two ways: best against best (min/min: each variant's
    least-disturbed round) and the median over rounds of the within-round ratio. Speedups are
    slow / fast (> 1: the batched form is faster); x_floor = batched step / floor: the cost of the
    simulated step against training the same model as one process."""
    rows = []
    cores, resolution = timing.core_count(), timing.clock_resolution()
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

        timed = rounds({"batched_grad": lambda: model.loss_and_grad(params, x, y),
                        "looped_grad": lambda: looped_model.loss_and_grad(params, x, y),
                        "batched": step(model, codec), "looped": step(looped_model, codec),
                        "pipeline": step(looped_model, looped_codec),
                        "floor": _one_process_step(setup, params)}, repeats, warm_each=True)
        setup.model, setup.codec = model, codec
        t = {name: timing.seconds for name, timing in timed.items()}

        def ratio(num, den):
            return float(t[num].min() / t[den].min()), float(np.median(t[num] / t[den]))

        row = {"workers": n, "steps_per_s": 1 / float(t["batched"].min()),
               "looped_steps_per_s": 1 / float(t["looped"].min()),
               "pipeline_steps_per_s": 1 / float(t["pipeline"].min()),
               "floor_steps_per_s": 1 / float(t["floor"].min())}
        for key, (slow, fast) in {"step": ("looped", "batched"), "grad": ("looped_grad", "batched_grad"),
                                  "pipeline": ("pipeline", "batched")}.items():
            row[f"{key}_speedup"], row[f"{key}_speedup_median_round"] = ratio(slow, fast)
        row["x_floor"], row["x_floor_median_round"] = ratio("batched", "floor")
        row.update(timing.row_check(list(t.values()), timing.load_average(), cores, resolution))
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


def _percent(v: float) -> str:
    return "" if v != v else f"{100 * v:.0f}%"


def print_report(res: dict) -> None:
    print("simulator throughput, MLP 40-256-256-10, 8 samples per worker, TernGrad (ps, explicit clip)")
    print(timing.machine_line(timing.load_average(), timing.core_count(), timing.clock_resolution()))
    print("ratios: best round against best round (min/min), and in brackets the median over rounds "
          "of the within-round ratio")
    print(f"{'N':>5} {'steps/s':>9} {'looped steps/s':>15} {'step speedup':>16} {'grad speedup':>16} "
          f"{'pipeline steps/s':>17} {'pipeline speedup':>17} {'floor steps/s':>14} {'x floor':>16} {'spread':>7}")
    warned = 0
    for r in res["throughput"]:
        warned += bool(r["warning"])
        print(f"{r['workers']:5d} {r['steps_per_s']:9.1f} {r['looped_steps_per_s']:15.1f} "
              f"{r['step_speedup']:6.2f}x ({r['step_speedup_median_round']:5.2f}x) "
              f"{r['grad_speedup']:6.2f}x ({r['grad_speedup_median_round']:5.2f}x) "
              f"{r['pipeline_steps_per_s']:17.1f} "
              f"{r['pipeline_speedup']:6.2f}x ({r['pipeline_speedup_median_round']:5.2f}x) "
              f"{r['floor_steps_per_s']:14.1f} "
              f"{r['x_floor']:6.2f}x ({r['x_floor_median_round']:5.2f}x) {_percent(r['spread']):>7}")
        if r["warning"]:
            print(f"      warning N = {r['workers']}: {r['warning']}")
    if warned:
        print(f"WARNING: {warned} of {len(res['throughput'])} rows warn: their steps/s and ratios are not reliable; "
              "rerun on an idle machine or with more --repeats")
    print("looped: per-worker loss_and_grad, codec batched; pipeline: per-worker loss_and_grad, "
          "scaling and encode (the target: pipeline speedup >= 5x at N = 32)")
    print("floor: the same model as one process on the whole batch (N x 8 samples, one loss_and_grad, "
          "SGD, fp32, no codec, no exchange); x floor = batched step time / floor time")
    m = res["memory"]
    print(f"peak memory of one step, MLP of {m['params']:,} parameters, N = {m['workers']}: "
          f"{m['peak_bytes'] / 2**20:.1f} MiB against the gradient floor {m['floor_bytes'] / 2**20:.1f} MiB "
          f"({m['peak_over_floor']:.2f}x)")


if __name__ == "__main__":
    print_report(run())
