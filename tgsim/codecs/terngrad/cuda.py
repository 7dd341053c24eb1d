"""The CUDA kernels (tgsim/cuda/terngrad.cu) on CuPy arrays: same functions, same bits as `_reference`.

    moments(g, need_sigma)                         -> stats.LayerMoments
    encode(g, scaler, clip_bound, key, fmt)        -> cupy uint8 payload
    moments_many(G, need_sigma)                    -> (absmax, sigma, finite) NumPy arrays over rows
    encode_many(G, scalers, clip_bounds, seed, step, workers, layer, fmt) -> cupy uint8 (W, nbytes)
    moments_layers(Gs, need_sigma)                 -> [(absmax, sigma, finite)] per layer, one launch
    encode_layers(Gs, scalers, clip_bounds, seed, step, workers, layers, fmt) -> [cupy uint8 (W, nb)]
    weighted_sum_layers(payloads, scalers, sizes, fmt, divide_by) -> [cupy float32], one launch
    weighted_sum(payloads, scalers, n, fmt, divide_by) -> cupy float32
    sum_codes(payloads, n, fmt, dtype=None)        -> cupy integer codes summed over workers

The kernel source is compiled once per process with `cupy.RawModule` (NVRTC, `-fmad=false`; CuPy
appends `-ftz=true`, which the kernels are written to be immune to; CuPy also keeps the binary in
its on-disk kernel cache). CuPy is imported only inside functions, so this
module imports on machines without it. The kernel logic is tested on the CPU by
tests/test_cuda_kernels.py (nvcc host build of the same bodies), and on a GPU against the reference.

Inputs: `g` is a float32 layer (flattened); payloads are a (workers, nbytes) uint8 array (or a
sequence of 1-D payloads); scalers are float32 values (a float32 array, or numbers that are exactly
float32 - anything else is a ValueError, since the kernel reads float32 and must equal the float64
reference arithmetic bit for bit).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tgsim.backend import RawKernels
from tgsim.codecs import packing
from tgsim.codecs.terngrad import moments as stats
from tgsim.rng import StreamKey
from tgsim.rng.philox import MAX_ELEMENTS

CUDA_DIR = Path(__file__).resolve().parents[2] / "cuda"
KERNEL_FILE = "terngrad.cu"
HEADER_FILE = "philox.cuh"
# -fmad=false: no FMA contraction anywhere (the kernels also use __d*_rn intrinsics).
# -ftz=false does NOT survive: CuPy appends -ftz=true after these options for every RawModule
# (cupy/cuda/compiler.py, _compile_with_cache_cuda), and the last -ftz wins: float32 instructions
# would read denormal inputs as zeros. The kernels therefore contain no float32 arithmetic,
# compare or conversion instruction (philox.cuh: tg_f2d / tg_d2f), so FTZ has nothing to act on;
# tests/test_cuda_kernels.py checks the PTX compiled with CuPy's options and runs the host bodies
# with x86 FTZ/DAZ set. The option is kept to state the intent.
NVRTC_OPTIONS = ("-fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true")
KERNELS = ("tg_moments_lanes", "tg_moments_tree", "tg_encode_2bit", "tg_encode_base3",
           "tg_weighted_sum", "tg_sum_codes", "tg_moments_rows", "tg_encode_rows", "tg_weighted_sum_rows")
FMT_CODE = {"2bit": 0, "base3": 1}
BLOCK = 256
MAX_GRID = 1 << 16          # grid-stride loops cover the rest
TREE_BLOCK = 1024
ROW_THREADS = 1024          # terngrad.cu TG_ROW_THREADS: tg_moments_rows runs one block per row
ROW_MAX = 1 << 22           # rows longer than this take the two-kernel moments (one row, whole GPU)
NO_BAD = 2**64 - 1


def _cp():
    import cupy  # noqa: PLC0415  (optional dependency, imported lazily)
    return cupy


def source() -> str:
    """terngrad.cu with philox.cuh inlined: one self-contained unit (so CuPy's cache key covers both)."""
    header = (CUDA_DIR / HEADER_FILE).read_text()
    code = (CUDA_DIR / KERNEL_FILE).read_text()
    include = f'#include "{HEADER_FILE}"'
    if include not in code:
        raise RuntimeError(f"{KERNEL_FILE} no longer includes {HEADER_FILE}")
    return code.replace(include, header, 1)


_KERNELS = RawKernels(lambda: source(), NVRTC_OPTIONS, lambda: _cp(), BLOCK, MAX_GRID)
_kernel = _KERNELS.kernel
_reset_cache = _KERNELS.reset          # forget the compiled module (tests swap the array module)
_launch = _KERNELS.launch


def _fmt(fmt: str) -> int:
    if fmt not in FMT_CODE:
        raise ValueError(f"unknown packing format {fmt!r}; expected one of {packing.FORMATS}")
    return FMT_CODE[fmt]


def _layer(g):
    """Contiguous flat float32 device array (no silent dtype conversion: that would change bits)."""
    cp = _cp()
    g = cp.asarray(g)
    if g.dtype != cp.float32:
        raise ValueError(f"expected a float32 layer, got {g.dtype}")
    return cp.ascontiguousarray(g).reshape(-1)


# -- moments ------------------------------------------------------------------------------------
def moments(g, need_sigma: bool = True) -> stats.LayerMoments:
    """LayerMoments (absmax, σ when `need_sigma`, finiteness) of the CuPy layer g, in the order of
    stats.layer_moments."""
    cp = _cp()
    g = _layer(g)
    n = int(g.size)
    if n == 0:
        return stats.LayerMoments(0.0, 0.0, True)
    lanes = stats.LANES
    s1 = cp.empty(lanes, dtype=cp.float64)
    s2 = cp.empty(lanes, dtype=cp.float64)
    amax = cp.empty(lanes, dtype=cp.float32)
    bad = cp.zeros(1, dtype=cp.int32)
    _launch("tg_moments_lanes", lanes, (g, np.int64(n), s1, s2, amax, bad))
    if int(cp.asnumpy(bad)[0]):
        return stats.LayerMoments(float("nan"), float("nan"), False)
    _kernel("tg_moments_tree")((1,), (TREE_BLOCK,), (s1, s2, amax, np.int32(lanes)))
    absmax = float(cp.asnumpy(amax[:1])[0])
    if not need_sigma:
        return stats.LayerMoments(absmax, 0.0, True)
    k = float(cp.asnumpy(g[:1]).astype(np.float64)[0])
    sigma = stats.moments_from_sums(n, k, float(cp.asnumpy(s1[:1])[0]), float(cp.asnumpy(s2[:1])[0]))
    return stats.LayerMoments(absmax, sigma, True)


def _rows(G):
    """Contiguous (workers, n) float32 device array."""
    cp = _cp()
    G = cp.asarray(G)
    if G.dtype != cp.float32:
        raise ValueError(f"expected float32 layers, got {G.dtype}")
    if G.ndim != 2:
        raise ValueError(f"G: expected a 2-D array (workers, elements), got shape {G.shape}")
    return cp.ascontiguousarray(G)


def moments_many(G, need_sigma: bool = True):
    """(absmax, sigma, finite) NumPy arrays over the rows of G (W, n): row w has the bits of
    moments(G[w], need_sigma). The rows' kernels are queued on one stream (lane and tree scratch
    reused in stream order) and the results read back with one copy each at the end."""
    cp = _cp()
    G = _rows(G)
    nw, n = int(G.shape[0]), int(G.shape[1])
    absmax, sigma = np.zeros(nw), np.zeros(nw)
    if nw == 0 or n == 0:
        return absmax, sigma, np.ones(nw, dtype=bool)
    lanes = stats.LANES
    s1 = cp.empty(lanes, dtype=cp.float64)
    s2 = cp.empty(lanes, dtype=cp.float64)
    amax = cp.empty(lanes, dtype=cp.float32)
    bad = cp.zeros(nw, dtype=cp.int32)
    res_s = cp.empty((nw, 2), dtype=cp.float64)
    res_a = cp.empty(nw, dtype=cp.float32)
    for w in range(nw):
        _launch("tg_moments_lanes", lanes, (G[w], np.int64(n), s1, s2, amax, bad[w:w + 1]))
        _kernel("tg_moments_tree")((1,), (TREE_BLOCK,), (s1, s2, amax, np.int32(lanes)))
        res_s[w, 0:1] = s1[0:1]
        res_s[w, 1:2] = s2[0:1]
        res_a[w:w + 1] = amax[0:1]
    finite = cp.asnumpy(bad) == 0
    a = cp.asnumpy(res_a).astype(np.float64)
    sums = cp.asnumpy(res_s)
    k = cp.asnumpy(G[:, 0]).astype(np.float64)
    for w in range(nw):
        if not finite[w]:
            absmax[w] = sigma[w] = np.nan
            continue
        absmax[w] = a[w]
        if need_sigma:
            sigma[w] = stats.moments_from_sums(n, float(k[w]), float(sums[w, 0]), float(sums[w, 1]))
    return absmax, sigma, finite


# -- encode -------------------------------------------------------------------------------------
def _check_stream_range(n: int) -> None:
    if n > MAX_ELEMENTS:
        raise ValueError(f"stream range [0, {n}) outside [0, {MAX_ELEMENTS})")


def _check_worker_ids(wk: np.ndarray) -> None:
    if wk.size and (wk.dtype.kind not in "iu" or int(wk.min()) < 0 or int(wk.max()) >= 2**32):
        raise ValueError("workers: expected integer worker ids in [0, 2^32)")


def encode(g, scaler: float, clip_bound: float, key: StreamKey, fmt: str):
    """Packed payload (CuPy uint8) in packing `fmt` of ternary.ternarize(g, scaler, key, clip_bound):
    one fused kernel."""
    cp = _cp()
    code = _fmt(fmt)
    g = _layer(g)
    n = int(g.size)
    _check_stream_range(n)
    nb = packing.packed_size(n, fmt)
    out = cp.empty(nb, dtype=cp.uint8)
    if nb == 0:
        return out
    k0, k1 = key.key
    args = (g, np.int64(n), np.float32(scaler), np.float32(clip_bound), np.uint32(k0), np.uint32(k1),
            np.uint32(key.layer), np.uint32(key.worker), np.uint32(key.step), out)
    if code == 0:
        _launch("tg_encode_2bit", -(-n // 4), args)
    else:
        _launch("tg_encode_base3", -(-nb // 4), args)
    return out


def encode_many(G, scalers, clip_bounds, seed: int, step: int, workers, layer: int, fmt: str):
    """uint8 (W, nbytes) device array: row w is encode(G[w], scalers[w], clip_bounds[w],
    StreamKey(seed, step, workers[w], layer), fmt); one launch per row into the rows of one output."""
    cp = _cp()
    code = _fmt(fmt)
    G = _rows(G)
    nw, n = int(G.shape[0]), int(G.shape[1])
    _check_stream_range(n)
    s64 = np.asarray(scalers, dtype=np.float64).reshape(-1)
    c64 = np.asarray(clip_bounds, dtype=np.float64).reshape(-1)
    wk = np.asarray(workers)
    if s64.shape != (nw,) or c64.shape != (nw,) or wk.shape != (nw,):
        raise ValueError(f"scalers, clip_bounds and workers must have shape ({nw},), got "
                         f"{s64.shape}, {c64.shape}, {wk.shape}")
    _check_worker_ids(wk)
    k0, k1 = StreamKey(int(seed), int(step), 0, int(layer)).key
    with np.errstate(over="ignore", invalid="ignore"):
        s32, c32 = s64.astype(np.float32), c64.astype(np.float32)
    wk = wk.astype(np.uint32)
    nb = packing.packed_size(n, fmt)
    out = cp.empty((nw, nb), dtype=cp.uint8)
    if nb == 0:
        return out
    for w in range(nw):
        args = (G[w], np.int64(n), s32[w], c32[w], np.uint32(k0), np.uint32(k1), np.uint32(layer),
                wk[w], np.uint32(step), out[w])
        if code == 0:
            _launch("tg_encode_2bit", -(-n // 4), args)
        else:
            _launch("tg_encode_base3", -(-nb // 4), args)
    return out


# -- a whole step: every (worker, layer) row in one launch --------------------------------------
def _address(a) -> int:
    """Device address of a contiguous CuPy array's first element (the kernels' pointer tables)."""
    return int(a.data.ptr)


def _table(values, dtype):
    return _cp().asarray(np.ascontiguousarray(np.asarray(values, dtype=dtype)))


def moments_layers(Gs, need_sigma: bool = True) -> list:
    """[(absmax, sigma, finite) NumPy arrays over the rows of G] for each G (W, n_l) of Gs: the bits of
    moments_many(G, need_sigma) for each. Rows of at most ROW_MAX elements take ONE launch of
    tg_moments_rows for the whole step (a block per row, the order of moments.py) and one copy back;
    longer rows take moments_many's two kernels each."""
    cp = _cp()
    Gs = [_rows(G) for G in Gs]
    out = [None] * len(Gs)
    small = [i for i, G in enumerate(Gs) if G.shape[1] <= ROW_MAX]
    for i, G in enumerate(Gs):
        if i not in small or G.shape[0] == 0 or G.shape[1] == 0:
            out[i] = moments_many(G, need_sigma)
    small = [i for i in small if out[i] is None]
    if small:
        addr, sizes, where = [], [], []
        for i in small:
            G, nb = Gs[i], Gs[i].strides[0]
            base = _address(G)
            for w in range(G.shape[0]):
                addr.append(base + w * nb)
                sizes.append(G.shape[1])
                where.append((i, w))
        count = len(addr)
        s1 = cp.empty(count, dtype=cp.float64)
        s2 = cp.empty(count, dtype=cp.float64)
        amax = cp.empty(count, dtype=cp.float32)
        bad = cp.zeros(count, dtype=cp.int32)
        _kernel("tg_moments_rows")((min(count, MAX_GRID),), (ROW_THREADS,),
                                   (_table(addr, np.uint64), _table(sizes, np.int64), np.int32(count),
                                    s1, s2, amax, bad))
        h1, h2, ha, hb = (cp.asnumpy(x) for x in (s1, s2, amax, bad))
        for i in small:
            nw = Gs[i].shape[0]
            out[i] = (np.zeros(nw), np.zeros(nw), np.ones(nw, dtype=bool))
        for r, (i, w) in enumerate(where):
            absmax, sigma, finite = out[i]
            if hb[r]:
                finite[w] = False
                absmax[w] = sigma[w] = np.nan
                continue
            absmax[w] = float(ha[r])
            if need_sigma:
                sigma[w] = stats.moments_from_sums(sizes[r], 0.0, float(h1[r]), float(h2[r]))
    return out


def encode_layers(Gs, scalers, clip_bounds, seed: int, step: int, workers, layers, fmt: str) -> list:
    """[uint8 (W, nbytes_l) device array] for each G (W, n_l) of Gs: the bits of encode_many(G,
    scalers[:, i], clip_bounds[i], seed, step, workers, layers[i], fmt) for each, in ONE launch of
    tg_encode_rows over every (layer, worker) row. scalers: (W, len(Gs)); clip_bounds: one (W,)
    vector per layer."""
    cp = _cp()
    code = _fmt(fmt)
    Gs = [_rows(G) for G in Gs]
    nw = len(np.asarray(workers))
    s64 = np.asarray(scalers, dtype=np.float64).reshape(nw, len(Gs))
    wk = np.asarray(workers)
    _check_worker_ids(wk)
    if len(clip_bounds) != len(Gs) or len(layers) != len(Gs):
        raise ValueError(f"{len(Gs)} layers, {len(clip_bounds)} clip bound vectors, {len(layers)} layer ids")
    k0, k1 = StreamKey(int(seed), int(step)).key
    outs, rows, sizes, sc, cb, lay, wid, dst, starts = [], [], [], [], [], [], [], [], [0]
    with np.errstate(over="ignore", invalid="ignore"):
        for i, G in enumerate(Gs):
            if G.shape[0] != nw:
                raise ValueError(f"layer {i}: {G.shape[0]} rows for {nw} workers")
            n = int(G.shape[1])
            _check_stream_range(n)
            nb = packing.packed_size(n, fmt)
            o = cp.empty((nw, nb), dtype=cp.uint8)
            outs.append(o)
            if nb == 0:
                continue
            c64 = np.asarray(clip_bounds[i], dtype=np.float64).reshape(-1)
            if c64.shape != (nw,):
                raise ValueError(f"layer {i}: clip bounds of shape {c64.shape}, expected ({nw},)")
            threads = -(-n // 4) if code == 0 else -(-nb // 4)
            base, obase = _address(G), _address(o)
            for w in range(nw):
                rows.append(base + w * G.strides[0])
                dst.append(obase + w * nb)
                sizes.append(n)
                sc.append(s64[w, i])
                cb.append(c64[w])
                lay.append(int(layers[i]))
                wid.append(int(wk[w]))
                starts.append(starts[-1] + threads)
        if len(rows):
            args = (_table(rows, np.uint64), _table(sizes, np.int64),
                    _table(np.asarray(sc).astype(np.float32), np.float32),
                    _table(np.asarray(cb).astype(np.float32), np.float32),
                    _table(lay, np.uint32), _table(wid, np.uint32), _table(dst, np.uint64),
                    _table(starts, np.int64), np.int32(len(rows)), np.int32(code),
                    np.uint32(k0), np.uint32(k1), np.uint32(step))
            _launch("tg_encode_rows", starts[-1], args)
    return outs


# -- decode -------------------------------------------------------------------------------------
def _payloads(payloads, n: int, fmt: str):
    """(workers, nbytes) contiguous uint8 device array, checked like packing.check_payload."""
    cp = _cp()
    if isinstance(payloads, np.ndarray):
        payloads = cp.asarray(payloads)
    elif not isinstance(payloads, cp.ndarray):      # a sequence of 1-D payloads
        payloads = cp.stack([cp.asarray(p) for p in payloads]) if len(payloads) else \
            cp.zeros((0, packing.packed_size(n, fmt)), dtype=cp.uint8)
    nb = packing.packed_size(n, fmt)
    if payloads.ndim != 2 or payloads.dtype != cp.uint8:
        row = payloads[0] if payloads.ndim >= 1 and payloads.shape[0] else payloads
        raise ValueError(f"payload of worker 0: expected a 1-D uint8 payload, got {row.dtype} {row.shape}")
    if payloads.shape[1] != nb and payloads.shape[0]:
        raise ValueError(f"payload of worker 0: {payloads.shape[1]} bytes for {n} elements in {fmt}, "
                         f"expected {nb}")
    if payloads.shape[0] >= 2**31:
        raise ValueError(f"{payloads.shape[0]} payloads: at most 2^31 - 1 workers")
    return cp.ascontiguousarray(payloads)


def _no_bad():
    return _cp().asarray(np.array([NO_BAD], dtype=np.uint64))


def _raise_bad(payloads, first_bad, n: int, fmt: str) -> None:
    """ValueError naming the first invalid (worker, byte), as packing.check_payload words it."""
    cp = _cp()
    idx = int(cp.asnumpy(first_bad)[0])
    if idx == NO_BAD:
        return
    nb = payloads.shape[1]
    w, b = divmod(idx, nb)
    byte = int(cp.asnumpy(payloads[w, b:b + 1])[0])
    where = f"payload of worker {w}"
    if not packing.LUT[fmt][1][byte]:
        kind = "code 0b11" if fmt == "2bit" else "byte > 242"
        raise ValueError(f"{where}: invalid {kind} at byte {b} (0x{byte:02x})")
    raise ValueError(f"{where}: non-zero pad codes after element {n} (byte {b}, 0x{byte:02x})")


def _scalers(scalers, workers: int):
    """float32 device vector of the workers' scalers; ValueError unless each is exactly a float32."""
    cp = _cp()
    if isinstance(scalers, cp.ndarray):
        s = scalers.reshape(-1)
        if s.dtype != cp.float32:
            s64 = s.astype(cp.float64)
            s = s64.astype(cp.float32)
            same = (s.astype(cp.float64) == s64) | cp.isnan(s64)
            if not bool(cp.asnumpy(same.all())):
                raise ValueError("scalers must be float32 values (the kernel reads float32)")
    else:
        s64 = np.asarray(scalers, dtype=np.float64).reshape(-1)
        s32 = s64.astype(np.float32)
        if not bool(((s32.astype(np.float64) == s64) | np.isnan(s64)).all()):
            raise ValueError("scalers must be float32 values (the kernel reads float32)")
        s = cp.asarray(s32)
    if s.size != workers:
        raise ValueError(f"{s.size} scalers for {workers} payloads")
    return cp.ascontiguousarray(s)


def weighted_sum(payloads, scalers, n: int, fmt: str, divide_by: int):
    """float32 (n,) of (Σ_w s_w codes_w) / divide_by from the W packed `payloads` (W, nbytes) in packing
    `fmt` and their `scalers` s_w, as packing.weighted_sum, after the payload checks."""
    cp = _cp()
    code = _fmt(fmt)
    payloads = _payloads(payloads, n, fmt)
    workers, nb = int(payloads.shape[0]), packing.packed_size(n, fmt)
    s = _scalers(scalers, workers)
    inv = np.float64(1.0 / divide_by)
    out = cp.empty(n, dtype=cp.float32)
    first_bad = _no_bad()
    _launch("tg_weighted_sum", nb, (payloads, np.int32(workers), np.int64(nb), s, np.int64(n),
                                    np.int32(code), inv, out, first_bad))
    _raise_bad(payloads, first_bad, n, fmt)
    return out


def weighted_sum_layers(payloads, scalers, sizes, fmt: str, divide_by: int) -> list:
    """[weighted_sum(payloads[i], scalers[:, i], sizes[i], fmt, divide_by)] for every layer i, in ONE
    launch of tg_weighted_sum_rows and one copy back of the layers' first invalid bytes; an invalid
    payload raises the ValueError of the first such layer, as the layer-by-layer calls would.
    payloads: per layer a (W, nbytes) uint8 device array or a sequence of W payloads; scalers (W, L)."""
    cp = _cp()
    code = _fmt(fmt)
    if len(payloads) != len(sizes):
        raise ValueError(f"{len(payloads)} layers of payloads for {len(sizes)} sizes")
    P = [_payloads(p, int(n), fmt) for p, n in zip(payloads, sizes)]
    workers = int(P[0].shape[0]) if P else 0
    if any(int(p.shape[0]) != workers for p in P):
        raise ValueError("every layer needs the same number of payloads")
    S = [_scalers(scalers[:, i] if not isinstance(scalers, (list, tuple)) else scalers[i], workers)
         for i in range(len(P))]
    outs = [(cp.empty if workers > 0 else cp.zeros)(int(n), dtype=cp.float32) for n in sizes]   # 0 workers: +0.0
    rows = [i for i, p in enumerate(P) if p.shape[1] > 0 and workers > 0]
    if rows:
        table = cp.concatenate([S[i] for i in rows]) if len(rows) > 1 else S[rows[0]]
        starts = np.concatenate([[0], np.cumsum([int(P[i].shape[1]) for i in rows])])
        first_bad = cp.asarray(np.full(len(rows), NO_BAD, dtype=np.uint64))
        args = (_table([_address(P[i]) for i in rows], np.uint64), _table([P[i].shape[1] for i in rows], np.int64),
                _table([int(sizes[i]) for i in rows], np.int64), cp.ascontiguousarray(table), np.int32(workers),
                np.int32(code), np.float64(1.0 / divide_by), _table([_address(outs[i]) for i in rows], np.uint64),
                _table(starts, np.int64), np.int32(len(rows)), first_bad)
        _launch("tg_weighted_sum_rows", int(starts[-1]), args)
        bad = cp.asnumpy(first_bad)
        for k, i in enumerate(rows):
            if int(bad[k]) != NO_BAD:
                _raise_bad(P[i], first_bad[k:k + 1], int(sizes[i]), fmt)
    return outs


def sum_codes(payloads, n: int, fmt: str = "2bit", dtype=None):
    """Σ_w codes_w as integers of `dtype` (default: the smallest that holds W), (n,), from the W packed
    `payloads` in packing `fmt` (packing.sum_codes), after the payload checks."""
    cp = _cp()
    code = _fmt(fmt)
    payloads = _payloads(payloads, n, fmt)
    workers, nb = int(payloads.shape[0]), packing.packed_size(n, fmt)
    if dtype is None:
        dtype = cp.int8 if workers <= 127 else (cp.int16 if workers <= 32767 else cp.int32)
    out = cp.empty(n, dtype=cp.int32)
    first_bad = _no_bad()
    _launch("tg_sum_codes", nb, (payloads, np.int32(workers), np.int64(nb), np.int64(n),
                                 np.int32(code), out, first_bad))
    _raise_bad(payloads, first_bad, n, fmt)
    return out.astype(dtype)


__all__ = ["moments", "encode", "moments_many", "encode_many", "moments_layers", "encode_layers",
           "weighted_sum_layers", "weighted_sum", "sum_codes", "source",
           "NVRTC_OPTIONS", "KERNELS"]
