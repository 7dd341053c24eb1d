"""Helpers shared by the Numba kernels of TernGrad (moments, encode, decode): input checks and the
sizes below which a kernel runs serially on the calling thread."""

from __future__ import annotations

import contextlib

import numba
import numpy as np

from tgsim.codecs import packing

# Work below which a kernel runs serially on the calling thread (no parallel region): W * n
# elements (moments, encode), W * nbytes payload bytes (weighted_sum, sum_codes): below it a
# parallel region costs more to start than it saves (the timings behind each threshold:
# docs/MEASUREMENTS.md). On a machine whose cores are busy with other processes a parallel region
# can wait for its worker thread to be scheduled, like any multithreaded library there; run with
# NUMBA_NUM_THREADS=1 on such a machine: every kernel then takes its serial path (the bits are the
# same either way).
SERIAL_MOMENTS = 1 << 15
# The folded σ pass (layers of _FOLD_MIN..LANES elements, _sigma_small): parallel over workers
# (one task per worker) from W*n = 2^14 and W >= 2 (docs/MEASUREMENTS.md).
SERIAL_FOLD = 1 << 14
SERIAL_ABSMAX = 1 << 17
SERIAL_ENCODE = 1 << 15
SERIAL_DECODE = 1 << 17
_WORKER_TASKS = 4               # W >= this x threads: one task per worker (fewer regions, no scratch)


def _as_f32_flat(g, what="g") -> np.ndarray:
    g = np.asarray(g)
    if g.dtype != np.float32:
        raise ValueError(f"{what}: expected float32, got {g.dtype}")
    return np.ascontiguousarray(g.reshape(-1))


def _as_f32_rows(G, what="G") -> np.ndarray:
    G = np.asarray(G)
    if G.dtype != np.float32:
        raise ValueError(f"{what}: expected float32, got {G.dtype}")
    if G.ndim != 2:
        raise ValueError(f"{what}: expected a 2-D array (workers, elements), got shape {G.shape}")
    return np.ascontiguousarray(G)


def _threads() -> int:
    return numba.get_num_threads()


_NO_ERRSTATE = contextlib.nullcontext()



_ZERO_BYTE = {"2bit": 0b01010101, "base3": 1 + 3 + 9 + 27 + 81}


def _check_fmt(fmt: str) -> None:
    if fmt not in packing.FORMATS:
        raise ValueError(f"unknown packing {fmt!r}; expected one of {packing.FORMATS}")


def _per_worker(values, nw: int, what: str) -> np.ndarray:
    """float64 (W,) of per-worker numbers (float32 inputs are exact in float64)."""
    v = np.asarray(values)
    if v.shape != (nw,):
        raise ValueError(f"{what}: expected shape ({nw},), got {v.shape}")
    if v.dtype.kind not in "fiu":
        raise ValueError(f"{what}: expected real numbers, got {v.dtype}")
    return v.astype(np.float64)


def _worker_ids(workers, nw: int) -> np.ndarray:
    wk = np.asarray(workers)
    if wk.shape != (nw,):
        raise ValueError(f"workers: expected shape ({nw},), got {wk.shape}")
    if nw and wk.dtype.kind not in "iu":
        raise ValueError(f"workers: expected integer worker ids, got {wk.dtype}")
    if nw and (int(wk.min()) < 0 or int(wk.max()) >= 2**32):
        raise ValueError(f"worker ids must be in [0, 2^32), got [{int(wk.min())}, {int(wk.max())}]")
    return np.ascontiguousarray(wk, dtype=np.uint32)

