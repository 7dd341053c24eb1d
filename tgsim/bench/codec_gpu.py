"""`tgsim bench codec --backend cupy|numpy`: TernGrad's whole encode and decode-and-sum against read
passes of the same data, measured in one run (issue 23, items 3 and 4).

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
result written, at the copy's bandwidth. Targets on an H100 (issue 23): encode 1 layer (64M) and
encode step within 3x, aggregate of 8 within 3x.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from tgsim.bench.timing import time_call


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


def _median_seconds(fn, xp, repeats: int) -> float:
    if xp is np:
        return time_call(fn, repeats).median
    from cupyx.profiler import benchmark

    return float(np.median(benchmark(fn, n_repeat=repeats, n_warmup=2).gpu_times[0]))


def _copy_kernel(xp):
    if xp is np:
        return lambda x, y: np.copyto(y, x)
    return xp.ElementwiseKernel("T x", "T y", "y = x", "tgsim_bench_copy")


def _read_pass(x, xp, repeats: int) -> tuple[float, float]:
    """(copy / 2, kernel / 2) seconds for a read pass over x."""
    y = xp.empty_like(x)
    kern = _copy_kernel(xp)
    return (_median_seconds(lambda: x.copy(), xp, repeats) / 2,
            _median_seconds(lambda: kern(x, y), xp, repeats) / 2)


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


def _time_torch(torch, fn, repeats: int) -> float:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return float(np.median(out))


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

    def row(what, seconds, floor, elements):
        rows.append(dict(backend=backend, row=what, elements=elements, ms=1e3 * seconds, floor_ms=1e3 * floor,
                         x_read=seconds / floor))

    copy, kern = _read_pass(g, xp, repeats)
    read = min(copy, kern)
    rows.append(dict(backend=backend, row="read pass, copy", elements=n_elements, ms=1e3 * copy, floor_ms=1e3 * read,
                     x_read=copy / read))
    rows.append(dict(backend=backend, row="read pass, kernel", elements=n_elements, ms=1e3 * kern,
                     floor_ms=1e3 * read, x_read=kern / read))
    row("encode 1 layer", _median_seconds(lambda: encode({"g": g[None]}, one), xp, repeats), read, n_elements)
    step_read = min(_read_pass(step_flat, xp, repeats))
    row(f"encode step ({layers} x {layer_elements})", _median_seconds(lambda: encode(step, one), xp, repeats),
        step_read, layers * layer_elements)
    msgs = encode({"g": G}, np.arange(workers))
    payload_bytes = sum(int(m.wire_bytes) for m in msgs)
    bandwidth = 2 * 4 * n_elements / (2 * copy)          # bytes/s of the copy (read + write)
    row(f"aggregate {workers}", _median_seconds(lambda: codec.aggregate(msgs, divide_by=workers), xp, repeats),
        (payload_bytes + 4 * n_elements) / bandwidth, n_elements)
    torch_run = _torch_ternarize() if xp is not np else None
    if torch_run is not None:
        torch, fn = torch_run
        x = torch.as_tensor(g, device="cuda")
        row("torch ternarize (eager)", _time_torch(torch, lambda: fn(x), repeats), read, n_elements)
    return rows


def format_rows(rows: list[dict]) -> str:
    head = ("TernGrad on " + rows[0]["backend"] + ": ms per call (median), x_read = time / the faster read pass of "
            "the same bytes (copy / 2 or kernel y = x / 2), measured in this run")
    cols = ["row", "elements", "ms", "floor_ms", "x_read"]
    cells = [[str(r["row"]), f"{r['elements']:,}", f"{r['ms']:.4g}", f"{r['floor_ms']:.4g}", f"{r['x_read']:.3g}"]
             for r in rows]
    width = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    return "\n".join([head, "  ".join(c.ljust(w) for c, w in zip(cols, width))] +
                     ["  ".join(v.ljust(w) for v, w in zip(x, width)) for x in cells])
