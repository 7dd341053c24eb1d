"""`tgsim bench codec --backend cupy|numpy`: TernGrad's whole encode and decode-and-sum against read
passes of the same data, measured in one run.

The same code runs on CuPy (the CUDA kernels, tgsim/cuda/terngrad.cu) and on NumPy (the host's
Numba kernels); every row is the median of `repeats` timed calls after warm-up calls (CuPy:
`cupyx.profiler.benchmark`'s GPU times; NumPy: `tgsim.bench.timing.time_call`).

  read pass, copy     x.copy() of the float32 data, / 2 (a copy reads once and writes once)
  read pass, kernel   an elementwise y = x into a preallocated y (CuPy: cupy.ElementwiseKernel;
                      NumPy: np.copyto), / 2
  encode 1 layer      one worker, one layer of n elements: prepare_many + local_scalers_many +
                      encode_many of the registry's default TernGrad (tgsim.bench.codecs_all)
  encode step         one worker, L layers of m elements each (default 100 x 100,000), the same calls
  aggregate W         codec.aggregate of W workers' messages of the 1-layer case (decode and sum into
                      the float32 mean)
  torch ternarize     CuPy only, when PyTorch with CUDA is installed: a plain eager PyTorch TernGrad
                      of the 1-layer case (clip at 2.5 sigma, Bernoulli, int8 codes, 2-bit pack)

x_read = seconds / floor, the floor being the faster read pass of the same bytes: the layer (encode
1 layer, torch), the step's L x m elements, and for aggregate the W payloads read plus the float32
result written, at the copy's bandwidth. The targets on a GPU: encode 1 layer (64M) and encode
step within 3x, aggregate of 8 within 3x.

Trust (the same decision as every benchmark: tgsim.bench.timing.row_check): each
row also has load_avg (the 1-minute load average when it was timed), spread (the largest (max - min)
/ median of its own timed calls and of its floor's) and warning (load above the core count, spread
above 20 %, fewer than 2 timed calls, a median under 100 x the clock's resolution; '' when none
applies). The table prints the machine line, a spread column, each row's warning and a count of the
rows that warn. The clock is perf_counter on NumPy (and for the torch row); on CuPy the CUDA events of
cupyx.profiler.benchmark, judged at their resolution (CUDA_EVENT_RESOLUTION, 0.5 us).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from tgsim.bench import timing
from tgsim.bench.timing import Timing, time_call

CUDA_EVENT_RESOLUTION = 0.5e-6      # s: cudaEventElapsedTime's documented resolution (about 0.5 us)


def _xp(backend: str):
    if backend == "numpy":
        return np
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as e:          # ImportError, CUDARuntimeError, RuntimeError
        raise SystemExit(f"tgsim bench codec --backend cupy: no CUDA GPU/CuPy ({type(e).__name__}: {e}); "
                         "install the gpu-cuda12 or gpu-cuda13 extra on a machine with a GPU") from None
    return cupy


def _timing(fn, xp, repeats: int) -> Timing:
    """Every timed call's seconds: NumPy, `time_call` (perf_counter, one warm-up call); CuPy, the GPU
    times (CUDA events) of cupyx.profiler.benchmark after 2 warm-up calls."""
    if xp is np:
        return time_call(fn, repeats)
    from cupyx.profiler import benchmark

    return Timing(np.asarray(benchmark(fn, n_repeat=repeats, n_warmup=2).gpu_times[0], dtype=np.float64))


def _resolution(xp) -> float:
    """The resolution of the clock `_timing` reads on this backend."""
    return timing.clock_resolution() if xp is np else CUDA_EVENT_RESOLUTION


def _half(t: Timing) -> Timing:
    """A read pass is half a copy (one read, one write): every call's seconds / 2."""
    return Timing(t.seconds / 2)


def _copy_kernel(xp):
    if xp is np:
        return lambda x, y: np.copyto(y, x)
    return xp.ElementwiseKernel("T x", "T y", "y = x", "tgsim_bench_copy")


def _read_pass(x, xp, repeats: int) -> tuple[Timing, Timing]:
    """(copy / 2, kernel / 2): the timings of a read pass over x."""
    y = xp.empty_like(x)
    kern = _copy_kernel(xp)
    return _half(_timing(lambda: x.copy(), xp, repeats)), _half(_timing(lambda: kern(x, y), xp, repeats))


def _faster(a: Timing, b: Timing) -> Timing:
    return a if a.median <= b.median else b


def _torch_ternarize():
    """A plain eager PyTorch TernGrad of a flat float32 CUDA tensor, or None without torch/CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None

    def run(x):
        s = 2.5 * x.std()
        c = x.clamp(-s, s)
        scale = c.abs().max()
        codes = (torch.rand_like(c) * scale < c.abs()).to(torch.int8) * torch.sign(c).to(torch.int8)
        u = (codes + 1).to(torch.uint8)
        u = torch.nn.functional.pad(u, (0, (-u.numel()) % 4)).view(-1, 4)
        return (u[:, 0] | (u[:, 1] << 2) | (u[:, 2] << 4) | (u[:, 3] << 6)), scale

    return torch, run


def _time_torch(torch, fn, repeats: int) -> Timing:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return Timing(np.asarray(out, dtype=np.float64))


def make_row(backend: str, what: str, t: Timing, floor: float, elements: int, floor_timings=(),
             load: float = float("nan"), cores: int = 1, resolution: float = 1e-9) -> dict:
    """One row: median ms of `t`, the floor (s) it is divided by, x_read, and the trust columns of
    tgsim.bench.timing.row_check over `t` and the timings the floor came from (a ratio: both)."""
    return dict(backend=backend, row=what, elements=elements, ms=1e3 * t.median, floor_ms=1e3 * floor,
                x_read=t.median / floor, **timing.row_check([t, *floor_timings], load, cores, resolution))


def run(backend: str = "cupy", n_elements: int = 1 << 26, layers: int = 100, layer_elements: int = 100_000,
        workers: int = 8, repeats: int = 10) -> list[dict]:
    from tgsim.bench.codecs_all import _steps
    from tgsim.codecs import registry
    from tgsim.train.config import CodecConfig

    xp = _xp(backend)
    codec = registry.make_codec(dataclasses.replace(CodecConfig(), name="terngrad"))
    def encode(layers: dict, ids):       # prepare, share the scalers, encode: tgsim.bench.codecs_all's step
        return _steps(codec, layers, ids)()

    rng = np.random.default_rng(0)
    one = np.arange(1)
    g = xp.asarray(rng.standard_normal(n_elements, dtype=np.float32))
    step = {f"l{i}": xp.asarray(rng.standard_normal((1, layer_elements), dtype=np.float32)) for i in range(layers)}
    step_flat = xp.asarray(rng.standard_normal(layers * layer_elements, dtype=np.float32))
    G = xp.asarray(rng.standard_normal((workers, n_elements), dtype=np.float32))
    rows = []
    cores, resolution = timing.core_count(), _resolution(xp)

    def row(what, t: Timing, floor: float, elements: int, floor_timings=()):
        rows.append(make_row(backend, what, t, floor, elements, floor_timings, timing.load_average(), cores,
                             resolution))

    copy, kern = _read_pass(g, xp, repeats)
    read = _faster(copy, kern)
    row("read pass, copy", copy, read.median, n_elements, [read])
    row("read pass, kernel", kern, read.median, n_elements, [read])
    row("encode 1 layer", _timing(lambda: encode({"g": g[None]}, one), xp, repeats), read.median, n_elements, [read])
    step_read = _faster(*_read_pass(step_flat, xp, repeats))
    row(f"encode step ({layers} x {layer_elements})", _timing(lambda: encode(step, one), xp, repeats),
        step_read.median, layers * layer_elements, [step_read])
    msgs = encode({"g": G}, np.arange(workers))
    payload_bytes = sum(int(m.wire_bytes) for m in msgs)
    bandwidth = 2 * 4 * n_elements / (2 * copy.median)   # bytes/s of the copy (read + write)
    row(f"aggregate {workers}", _timing(lambda: codec.aggregate(msgs, divide_by=workers), xp, repeats),
        (payload_bytes + 4 * n_elements) / bandwidth, n_elements, [copy])
    torch_run = _torch_ternarize() if xp is not np else None
    if torch_run is not None:
        torch, fn = torch_run
        x = torch.as_tensor(g, device="cuda")
        rows.append(make_row(backend, "torch ternarize (eager)", _time_torch(torch, lambda: fn(x), repeats),
                             read.median, n_elements, [read], timing.load_average(), cores,
                             max(timing.clock_resolution(), resolution)))
    return rows


def _percent(v: float) -> str:
    return "" if v != v else f"{100 * v:.0f}%"


def format_rows(rows: list[dict], load: float | None = None, cores: int | None = None,
                resolution: float | None = None) -> str:
    """The table: a title, the machine line (load average, cores, clock: tgsim.bench.timing.machine_line;
    load, cores, resolution default to this machine's now), a row per timing with its spread and
    warning, and a WARNING line counting the rows that warn."""
    backend = rows[0]["backend"]
    load = timing.load_average() if load is None else load
    cores = timing.core_count() if cores is None else cores
    resolution = timing.clock_resolution() if resolution is None else resolution
    head = ("TernGrad on " + backend + ": ms per call (median), x_read = time / the faster read pass of "
            "the same bytes (copy / 2 or kernel y = x / 2), measured in this run")
    machine = timing.machine_line(load, cores, resolution)
    if backend == "cupy":
        machine += (f"\nGPU rows: CUDA event times (cupyx.profiler.benchmark), judged at their resolution "
                    f"{CUDA_EVENT_RESOLUTION * 1e9:.0f} ns")
    cols = ["row", "elements", "ms", "floor_ms", "x_read", "spread", "warning"]
    cells = [[str(r["row"]), f"{r['elements']:,}", f"{r['ms']:.4g}", f"{r['floor_ms']:.4g}", f"{r['x_read']:.3g}",
              _percent(r.get("spread", float("nan"))), r.get("warning", "")] for r in rows]
    width = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    lines = [head, machine, "  ".join(c.ljust(w) for c, w in zip(cols, width)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(x, width)).rstrip() for x in cells]
    warned = sum(bool(r.get("warning")) for r in rows)
    if warned:
        lines.append(f"WARNING: {warned} of {len(rows)} rows warn (last column): their times and x_read are not "
                     "reliable; rerun on an idle machine or with more --repeats")
    return "\n".join(lines)
