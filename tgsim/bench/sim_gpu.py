"""`tgsim bench sim --backend cupy`: the price of batch-invariant model kernels on a GPU, as ratios
measured in one run.

For N virtual workers × B samples each, one `loss_and_grad` of the model on CuPy arrays, timed four
ways in interleaved rounds (tgsim.bench.timing.rounds; each call ends with a device synchronize):
  * "bitwise": the models' own route, products and batch sums through tgsim.models.cuda_ops (a
    fixed order per output element: a worker's bits do not depend on N);
  * "vendor": the same call with cupy.matmul and CuPy's own sums (cuBLAS picks its blocking from the
    whole shape, so a worker's bits in a batch of N can differ from its bits alone);
  * "looped": one call per worker in a Python loop (bitwise by construction, launch-bound);
  * "one process": a single worker holding all N·B samples (the compute floor of the step).
The target: bitwise within 2x of vendor ("bitwise / vendor" <= 2). Models: the MNIST-1D
convnet (23,882 parameters) and the MLP 40-256-256-10 (78,858), N = 32 and 128, B = 8.
With backend "numpy" the same rows are timed on the CPU, where "bitwise" and "vendor" are both the
NumPy route (the ratio is then ~1 by construction).

Trust (the decision every benchmark shares: tgsim.bench.timing.row_check): each row
also has load_avg, spread (the largest (max - min) / median over the rounds of its four timings: its
ratios divide them) and warning (load above the core count, spread above 20 %, fewer than 2 rounds,
a time near perf_counter's resolution; '' when none applies). The table prints the machine line, a
spread column, each row's warning and a count of the rows that warn; the same on both backends (the
clock is perf_counter around a device synchronize on CuPy).
"""

from __future__ import annotations

import contextlib

import numpy as np

from tgsim.backend import get_xp
from tgsim.bench import timing
from tgsim.bench.timing import Timing, rounds
from tgsim.models import cuda_ops, make_model

MODELS = {
    "convnet1d": ("convnet1d", {"length": 40, "classes": 10}),
    "mlp 40-256-256-10": ("mlp", {"dim": 40, "hidden": (256, 256), "classes": 10}),
}
WORKERS = (32, 128)
BATCH = 8


@contextlib.contextmanager
def vendor_route():
    """cuda_ops.bmm / sum_axis replaced by cupy.matmul and x.sum: the non-bitwise route, for timing."""
    saved = cuda_ops.bmm, cuda_ops.sum_axis
    cuda_ops.bmm = lambda a, b: cuda_ops._cp().matmul(a, b)
    cuda_ops.sum_axis = lambda x, axis: x.sum(axis=axis)
    try:
        yield
    finally:
        cuda_ops.bmm, cuda_ops.sum_axis = saved


def _data(xp, model, n: int, bsz: int, seed: int = 0):
    rng = np.random.default_rng([seed, n, bsz])
    x = rng.standard_normal((n, bsz, *model.feature_shape)).astype(np.float32)
    y = rng.integers(0, model.classes, (n, bsz))
    return xp.asarray(x), xp.asarray(y)


def make_row(label: str, params: int, n: int, batch: int, t: dict[str, Timing], load: float = float("nan"),
             cores: int = 1, resolution: float = 1e-9) -> dict:
    """One row from the four timings {"bitwise", "vendor", "looped", "one process"}: best ms of each,
    the ratios (best against best) and the trust columns (tgsim.bench.timing.row_check over all four)."""
    best = {k: v.best for k, v in t.items()}
    return {"model": label, "params": params, "N": n, "B": batch,
            **{f"{k} ms": 1e3 * s for k, s in best.items()},
            "bitwise / vendor": best["bitwise"] / best["vendor"],
            "looped / bitwise": best["looped"] / best["bitwise"],
            "bitwise / one process": best["bitwise"] / best["one process"],
            **timing.row_check(list(t.values()), load, cores, resolution)}


def run(backend: str = "cupy", workers=WORKERS, batch: int = BATCH, repeats: int = 20, models=None) -> list[dict]:
    xp = get_xp(backend)
    sync = (lambda: xp.cuda.Device().synchronize()) if xp is not np else (lambda: None)
    cores, resolution = timing.core_count(), timing.clock_resolution()
    rows = []
    for label, (name, opts) in (models or MODELS).items():
        model = make_model(name, **opts)
        params = {k: xp.asarray(v) for k, v in model.init(0).items()}
        for n in workers:
            x, y = _data(xp, model, n, batch)
            x1, y1 = x.reshape(1, n * batch, *x.shape[2:]), y.reshape(1, n * batch)

            def timed(fn):
                def call():
                    out = fn()
                    sync()
                    return out
                return call

            def vendor():
                with vendor_route():
                    return model.loss_and_grad(params, x, y)

            t = rounds({
                "bitwise": timed(lambda: model.loss_and_grad(params, x, y)),
                "vendor": timed(vendor),
                "looped": timed(lambda: [model.loss_and_grad(params, x[i:i + 1], y[i:i + 1]) for i in range(n)]),
                "one process": timed(lambda: model.loss_and_grad(params, x1, y1)),
            }, repeats, warmup=2)
            rows.append(make_row(label, model.num_params, n, batch, t, timing.load_average(), cores, resolution))
    return rows


def _percent(v: float) -> str:
    return "" if v != v else f"{100 * v:.0f}%"


def format_rows(rows: list[dict], backend: str, load: float | None = None, cores: int | None = None,
                resolution: float | None = None) -> str:
    """The table: a title, the machine line (tgsim.bench.timing.machine_line; load, cores, resolution
    default to this machine's now), a row per (model, N) with its spread, each warning row's warning
    under it, and a WARNING line counting them."""
    load = timing.load_average() if load is None else load
    cores = timing.core_count() if cores is None else cores
    resolution = timing.clock_resolution() if resolution is None else resolution
    cols = ["model", "params", "N", "B", "bitwise ms", "vendor ms", "looped ms", "one process ms",
            "bitwise / vendor", "looped / bitwise", "bitwise / one process", "spread"]
    fmt = {c: (lambda v: f"{v:.3f}") for c in cols if c.endswith(" ms")}
    fmt.update({c: (lambda v: f"{v:.2f}x") for c in cols if "/" in c})
    fmt["spread"] = _percent
    cells = [[fmt.get(c, str)(r.get(c, float("nan")) if c == "spread" else r[c]) for c in cols] for r in rows]
    width = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = [f"loss_and_grad of N workers x B samples on {backend} (best of the interleaved rounds); "
             "target: bitwise / vendor <= 2",
             timing.machine_line(load, cores, resolution),
             "  ".join(c.ljust(w) for c, w in zip(cols, width)).rstrip()]
    for r, row in zip(rows, cells):
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, width)).rstrip())
        if r.get("warning"):
            lines.append(f"    warning {r['model']} N = {r['N']}: {r['warning']}")
    warned = sum(bool(r.get("warning")) for r in rows)
    if warned:
        lines.append(f"WARNING: {warned} of {len(rows)} rows warn: their times and ratios are not reliable; "
                     "rerun on an idle machine or with more --repeats")
    return "\n".join(lines)
