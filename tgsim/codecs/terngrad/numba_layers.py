"""Whole-step Numba kernels of TernGrad: one call over every layer (and every worker) of a step.

    moments_layers(Gs, need_sigma)                  -> [(absmax, sigma, finite)] per layer
    encode_layers(Gs, scalers, clip_bounds, seed, step, workers, layers, fmt) -> [uint8 (W, nbytes_l)]
    weighted_sum_layers(payloads, scalers, sizes, fmt, divide_by)      -> [float32 (n_l,)]
    scaled_code_sum_layers(payloads, sizes, fmt, scalers, divide_by)   -> [float32 (n_l,)]

Each result equals, bit for bit, the per-layer function of the same kernel set applied to each layer
(moments_many, encode_many, weighted_sum, scaled_code_sum), errors included: the per-row and
per-chunk task functions are those of numba_moments / numba_encode / numba_decode, only the driver
differs. The rows of the step's layers reach the kernel by address (`tgsim.codecs._numba_rows`:
an int64 table of row addresses, one per (layer, worker), layer-major), so no layer is stacked or
copied; the rows of one flat buffer (tgsim.codecs.base.FlatLayers) are rows with a stride, read
in place. Where the step's work in all reaches the per-layer threshold (numba_common's SERIAL_*),
every layer's tasks (encode: (row, chunk) pairs; decode: (layer, byte chunk) pairs; moments: rows of
at most ROW_TASK_MAX elements, round-robin over a few tasks) run in one parallel region, however
small each layer; else the per-layer rules apply (serial layers in one serial call, the others in
one region). Longer rows run moments_many on their own. Which driver runs a task does not change
its bits.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from tgsim.codecs import packing
from tgsim.errors import PayloadError
from tgsim.codecs._numba_rows import address, row
from tgsim.codecs.terngrad import numba_common as nc
from tgsim.codecs.terngrad.moments import LANES
from tgsim.codecs.terngrad.numba_common import _as_f32_rows, _check_fmt, _threads, _worker_ids
from tgsim.codecs._numba_uint import _decode_codes
from tgsim.codecs.terngrad.numba_decode import (_DEC_CHUNK, _TABLE_WORKERS, _acc, _check_payloads, _count,
                                                _count_dtype, _index, _int_out, _map_out, _scale_out, _uniform_out,
                                                scaled_code_sum, sum_codes, weighted_sum)
from tgsim.codecs.terngrad.numba_encode import _B3_UNITS, _ENC2_CHUNK, _enc2_task, _enc3_task
from tgsim.codecs.terngrad.numba_moments import (_INF_BITS, _absbits_max, _fold_zeros, _sigma_worker, moments_many,
                                                 serial_moments)
from tgsim.rng import StreamKey
from tgsim.rng.philox import MAX_ELEMENTS

_F32 = np.empty(0, np.float32)
_U32 = np.empty(0, np.uint32)
_U8 = np.empty(0, np.uint8)


def _f32_rows(G) -> np.ndarray:
    """G as a float32 (W, n) array whose rows are each contiguous (a C-contiguous array, or rows of
    one flat buffer: tgsim.codecs.base.FlatLayers), else a C-contiguous copy (numba_common._as_f32_rows:
    its checks and errors)."""
    if type(G) is np.ndarray and G.dtype == np.float32 and G.ndim == 2 and (G.flags.c_contiguous
                                                                            or G.strides[1] == 4):
        return G
    return _as_f32_rows(G)


def _row_addresses(arrays, nw: int) -> np.ndarray:
    """int64 (L * W,): the address of row w of C-contiguous array l (W, m_l) at l * W + w."""
    if not arrays:
        return np.zeros(0, np.int64)
    base = np.array([address(a) for a in arrays], np.int64)
    stride = np.array([a.strides[0] if a.ndim == 2 else 0 for a in arrays], np.int64)
    return (base[:, None] + stride[:, None] * np.arange(nw, dtype=np.int64)[None, :]).reshape(-1)


# -- moments ---------------------------------------------------------------------------------------
@njit(cache=True)
def _moment_row(r, addrs, sizes, need_sigma, absmax, sigma, finite, s1, s2, sums, mb):
    """Row r (sizes[r] >= 1 elements at addrs[r]) -> absmax[r], sigma[r], finite[r]: the largest |g|
    bit pattern and, when need_sigma, the sums (S1, S2) of numba_moments._sigma_worker (the
    documented lane order), then stats.moments_from_sums' float64 operations m1 = S1 / n, var =
    S2 / n - m1 m1, σ = sqrt(var) where var > 0 else 0 (no fastmath: no FMA contraction); a
    non-finite row gives (nan, nan, False), σ without need_sigma 0. s1/s2 (>= min(n, LANES) float64),
    sums (1, 2) float64 and mb (1,) uint32: the task's scratch."""
    n = sizes[r]
    g = row(addrs, r, n, _F32)
    bits = row(addrs, r, n, _U32)
    if need_sigma:
        nl = min(n, LANES)
        mb[0] = _sigma_worker(g, bits, s1[:nl], s2[:nl], sums, 0, _fold_zeros(n))
    else:
        mb[0] = _absbits_max(bits)
    if mb[0] >= _INF_BITS:
        finite[r] = False
        absmax[r] = np.nan
        sigma[r] = np.nan
        return
    finite[r] = True
    absmax[r] = np.float64(mb.view(np.float32)[0])
    sigma[r] = 0.0
    if need_sigma:
        m1 = sums[0, 0] / n
        var = sums[0, 1] / n - m1 * m1
        if var > 0.0:
            sigma[r] = np.sqrt(var)


@njit(cache=True)
def _moments_block(b, nb, addrs, sizes, need_sigma, absmax, sigma, finite):
    """_moment_row of rows b, b + nb, b + 2 nb, ... in order, with one scratch for all of them (not an
    allocation of up to 2 x 512 KiB per row)."""
    nl = 1
    for r in range(b, sizes.size, nb):
        nl = max(nl, min(sizes[r], LANES))
    s1 = np.empty(nl if need_sigma else 1, dtype=np.float64)
    s2 = np.empty(nl if need_sigma else 1, dtype=np.float64)
    sums = np.empty((1, 2), dtype=np.float64)
    mb = np.empty(1, dtype=np.uint32)
    for r in range(b, sizes.size, nb):
        _moment_row(r, addrs, sizes, need_sigma, absmax, sigma, finite, s1, s2, sums, mb)


@njit(cache=True, parallel=True)
def _moments_rows_par(nb, addrs, sizes, need_sigma, absmax, sigma, finite):
    """_moment_row of every row as one parallel region of nb tasks, task b the rows b, b + nb, ...
    (_moments_block: one scratch per task)."""
    for b in prange(nb):
        _moments_block(b, nb, addrs, sizes, need_sigma, absmax, sigma, finite)


# Rows of at most this many elements are one task each of the step's one moments region; a layer
# with longer rows runs moments_many on its own (its passes split each row over the threads).
ROW_TASK_MAX = 1 << 20


def moments_layers(Gs, need_sigma: bool = True) -> list:
    """[(absmax, sigma, finite) float64/float64/bool arrays over the W rows of G] for each float32
    G (W, n_l) of Gs: the bits of numba_moments.moments_many(G, need_sigma) for each.

    Rows of at most ROW_TASK_MAX elements go through one compiled call: one parallel region where
    they hold SERIAL_MOMENTS elements in all and twice as many rows as threads, else the layers
    moments_many would pass serially (numba_moments.serial_moments) serially on this thread and the
    others through moments_many; layers of longer rows through moments_many (its passes split each
    row over the threads). σ of row r as _moment_row (stats.moments_from_sums' operations)."""
    Gs = [_f32_rows(G) for G in Gs]
    out: list = [None] * len(Gs)
    serial, rows_par = [], []
    threads = _threads()
    for i, G in enumerate(Gs):
        nw, n = G.shape
        if nw == 0 or n == 0:
            out[i] = (np.zeros(nw), np.zeros(nw), np.ones(nw, dtype=bool))
        elif threads == 1 or serial_moments(nw, n, need_sigma, threads):
            serial.append(i)
        elif n <= ROW_TASK_MAX:
            rows_par.append(i)
        else:
            out[i] = moments_many(G, need_sigma)
    todo = serial + rows_par
    nws = np.array([Gs[i].shape[0] for i in todo], np.int64)
    ns = np.array([Gs[i].shape[1] for i in todo], np.int64)
    par = threads > 1 and int(nws.sum()) >= 2 * threads and int((nws * ns).sum()) >= nc.SERIAL_MOMENTS
    if not par:
        for i in rows_par:
            out[i] = moments_many(Gs[i], need_sigma)
        todo, nws, ns = serial, nws[:len(serial)], ns[:len(serial)]
    if not todo:
        return out
    sizes = np.repeat(ns, nws)
    starts = np.concatenate([[0], np.cumsum(nws)]).tolist()
    if (nws == nws[0]).all():
        addrs = _row_addresses([Gs[i] for i in todo], int(nws[0]))
    else:
        addrs = np.concatenate([_row_addresses([Gs[i]], int(Gs[i].shape[0])) for i in todo])
    absmax = np.empty(sizes.size, dtype=np.float64)
    sigma = np.empty(sizes.size, dtype=np.float64)
    finite = np.empty(sizes.size, dtype=np.bool_)
    if par:
        nb = min(sizes.size, nc._WORKER_TASKS * threads)
        _moments_rows_par(np.int64(nb), addrs, sizes, bool(need_sigma), absmax, sigma, finite)
    else:
        _moments_block(0, 1, addrs, sizes, bool(need_sigma), absmax, sigma, finite)     # on this thread
    for k, i in enumerate(todo):
        a, b = starts[k], starts[k + 1]
        out[i] = (absmax[a:b], sigma[a:b], finite[a:b])
    return out


# -- encode ----------------------------------------------------------------------------------------
@njit(cache=True)
def _enc_task(r, ch, gaddr, oaddr, sizes, nbytes, s_scaled, cb, lay, wid, step, k0, k1, k, words, vals):
    """Chunk ch of row r: numba_encode's _enc2_task (k = 4) or _enc3_task (k = 5) with the row's
    scaler, clip bound, layer id and worker id (counter words: block, layer, worker, step)."""
    n = sizes[r]
    g = row(gaddr, r, n, _F32)
    out = row(oaddr, r, nbytes[r], _U8)
    if k == 4:
        nch = max(1, (n // 4 + _ENC2_CHUNK - 1) // _ENC2_CHUNK)
        _enc2_task(g, out, ch, nch, 0, s_scaled[r], cb[r], lay[r], wid[r], step, k0, k1)
    else:
        _enc3_task(g, out, ch, 0, s_scaled[r], cb[r], lay[r], wid[r], step, k0, k1, words, vals)


@njit(cache=True)
def _enc_chunks(n, k):
    """The chunks (tasks) of a row of n >= 1 elements: of _ENC2_CHUNK bytes (2-bit), of _B3_UNITS
    20-element units (base-3)."""
    if k == 4:
        return max(1, (n // 4 + _ENC2_CHUNK - 1) // _ENC2_CHUNK)
    return ((n + 19) // 20 + _B3_UNITS - 1) // _B3_UNITS


def _enc_chunk_counts(ns: np.ndarray, k: int) -> np.ndarray:
    """int64 `_enc_chunks(n, k)` of each n >= 1 of ns, in one NumPy expression."""
    ns = np.asarray(ns, dtype=np.int64)
    if k == 4:
        return np.maximum(1, (ns // 4 + _ENC2_CHUNK - 1) // _ENC2_CHUNK)
    return ((ns + 19) // 20 + _B3_UNITS - 1) // _B3_UNITS


@njit(cache=True)
def _enc_rows_serial(rows, gaddr, oaddr, sizes, nbytes, s_scaled, cb, lay, wid, step, k0, k1, k):
    """Every chunk of the rows `rows` (of n >= 1 elements), in order, on this thread."""
    words = np.empty(20 * _B3_UNITS, dtype=np.uint32)
    vals = np.empty(20 * _B3_UNITS, dtype=np.uint8)
    for r in rows:
        for ch in range(_enc_chunks(sizes[r], k)):
            _enc_task(r, ch, gaddr, oaddr, sizes, nbytes, s_scaled, cb, lay, wid, step, k0, k1, k, words, vals)


@njit(cache=True, parallel=True)
def _enc_rows_par(task_row, task_ch, gaddr, oaddr, sizes, nbytes, s_scaled, cb, lay, wid, step, k0, k1, k):
    for t in prange(task_row.size):
        words = np.empty(20 * _B3_UNITS if k == 5 else 0, dtype=np.uint32)
        vals = np.empty(20 * _B3_UNITS if k == 5 else 0, dtype=np.uint8)
        _enc_task(task_row[t], task_ch[t], gaddr, oaddr, sizes, nbytes, s_scaled, cb, lay, wid, step, k0, k1, k,
                  words, vals)


def encode_layers(Gs, scalers, clip_bounds, seed: int, step: int, workers, layers, fmt: str) -> list:
    """[uint8 (W, nbytes_l)] for each float32 G (W, n_l) of Gs: the bits of numba_encode.encode_many(G,
    scalers[:, i], clip_bounds[i], seed, step, workers, layers[i], fmt) for each, every (layer,
    worker) row in one call. scalers: (W, len(Gs)); clip_bounds: one (W,) vector per layer;
    layers: the layer ids of the stream keys (StreamKey(seed, step, workers[w], layers[i]))."""
    _check_fmt(fmt)
    Gs = [_f32_rows(G) for G in Gs]
    nl = len(Gs)
    wk = _worker_ids(workers, len(np.asarray(workers)))
    nw = wk.size
    if len(clip_bounds) != nl or len(layers) != nl:
        raise ValueError(f"{nl} layers, {len(clip_bounds)} clip bound vectors, {len(layers)} layer ids")
    s = np.asarray(scalers)
    if s.shape != (nw, nl) or (s.size and s.dtype.kind not in "fiu"):
        raise ValueError(f"scalers: expected real numbers of shape ({nw}, {nl}), got {s.dtype} {s.shape}")
    lay = np.array(layers, dtype=np.int64).reshape(nl)
    k0, k1 = StreamKey(int(seed), int(step), 0, int(lay.max()) if nl else 0).key   # range checks
    if nl and int(lay.min()) < 0:
        raise ValueError(f"layer must be in [0, 2^32), got {int(lay.min())}")
    shapes = np.array([G.shape for G in Gs], np.int64).reshape(nl, 2)
    if (shapes[:, 0] != nw).any():
        i = int(np.argmax(shapes[:, 0] != nw))
        raise ValueError(f"layer {i}: {shapes[i, 0]} rows for {nw} workers")
    ns = shapes[:, 1]
    if nl and ns.max() > MAX_ELEMENTS:
        raise ValueError(f"stream range [0, {int(ns.max())}) outside [0, {MAX_ELEMENTS})")
    try:
        cbs = np.array(clip_bounds, dtype=np.float64).reshape(nl, nw) if nl and nw else np.zeros((nl, nw))
    except ValueError:
        cbs = None
    if cbs is None or (nl and np.shape(clip_bounds[0]) != (nw,)):
        raise ValueError(f"clip_bounds: expected {nl} vectors of shape ({nw},)")
    k = packing.CODES_PER_BYTE[fmt]
    nbs = -(-ns // k)
    outs = [np.empty((nw, nb), dtype=np.uint8) for nb in nbs.tolist()]     # each its own array: a message
    if nw == 0 or nl == 0:                                                  # part's .base is its layer's batch
        return outs
    with np.errstate(over="ignore", invalid="ignore"):
        cb = cbs.reshape(-1).astype(np.float32)                      # f32(clip_bound), layer-major rows
        s_scaled = s.astype(np.float64).T.reshape(-1).astype(np.float32).astype(np.float64) * np.float64(2.0 ** -24)
    sizes = np.repeat(ns, nw)
    args = (_row_addresses(Gs, nw), _row_addresses(outs, nw), sizes, np.repeat(nbs, nw), s_scaled, cb,
            np.repeat(lay, nw).astype(np.uint32), np.tile(wk, nl), np.uint32(step), np.uint32(k0), np.uint32(k1),
            np.int64(k))
    par = np.zeros(sizes.size, bool)
    if _threads() > 1:          # the whole step's rows in one region where all of them are worth one
        par = sizes > 0 if nw * int(ns.sum()) >= nc.SERIAL_ENCODE else np.repeat(nw * ns >= nc.SERIAL_ENCODE, nw)
    rows = np.flatnonzero(~par & (sizes > 0))
    if rows.size:
        _enc_rows_serial(rows, *args)
    if par.any():
        rows = np.flatnonzero(par)
        nch = _enc_chunk_counts(sizes[rows], k)
        task_row = np.repeat(rows, nch)
        task_ch = np.arange(task_row.size, dtype=np.int64) - np.repeat(np.cumsum(nch) - nch, nch)
        _enc_rows_par(task_row, task_ch, *args)
    for r in np.flatnonzero(np.isnan(cb)):       # np.minimum(x, nan) = nan: every draw rejects
        outs[r // nw][r % nw] = nc._ZERO_BYTE[fmt]
    return outs


# -- decode-and-sum --------------------------------------------------------------------------------
@njit(cache=True)
def _pad_bad(v, first, k):
    """True when a field m >= first of the last byte v is not 1 (a non-zero pad code)."""
    for m in range(first, k):
        f = (v >> np.uint32(2 * m)) & np.uint32(3) if k == 4 else (v // np.uint32(3 ** m)) % np.uint32(3)
        if f != 1:
            return True
    return False


@njit(cache=True)
def _pads_bad(paddr, l, nw, nb, n, k, j1):
    """1 when a chunk ending at byte j1 is layer l's last and a worker's last byte has non-zero pad
    codes, else 0."""
    padded = nb * k - n
    if j1 == nb and padded > 0:
        for w in range(nw):
            if _pad_bad(np.uint32(row(paddr, l * nw + w, nb, _U8)[nb - 1]), k - padded, k):
                return np.uint8(1)
    return np.uint8(0)


@njit(cache=True)
def _dec_task(t, task_layer, task_ch, paddr, nw, nbs, ns, oaddr, k, uni, s, inv, tix, mults, table, f, scal,
              flag, count_dtype):
    """Bytes task_ch[t] * _DEC_CHUNK .. of layer l = task_layer[t], every worker: numba_decode's
    uniform route (uni[l]: out = f32((f64(Σ codes) * s[l]) * inv)) or table route (table row
    tix[l]; workers past the table added in float64 with scal[l * nw + w]); flag[t] = 1 where a
    byte is invalid or, in the layer's last chunk, a last byte has non-zero pad codes."""
    l = task_layer[t]
    nb = nbs[l]
    n = ns[l]
    j0 = task_ch[t] * _DEC_CHUNK
    j1 = min(j0 + _DEC_CHUNK, nb)
    o = row(oaddr, l, n, _F32)[j0 * k:min(j1 * k, n)]
    bad = np.uint8(0)
    if uni[l]:
        c = np.zeros((k, j1 - j0), dtype=count_dtype.dtype)
        for w in range(nw):
            p = row(paddr, l * nw + w, nb, _U8)[j0:j1]
            bad |= _count(c, p, 4) if k == 4 else _count(c, p, 5)
        _uniform_out(o, c, k, np.int32(nw), s[l], inv)
    else:
        nt = mults.size
        ti = tix[l]
        c = np.zeros((k, j1 - j0), dtype=np.uint16)
        for w in range(nt):
            p = row(paddr, l * nw + w, nb, _U8)[j0:j1]
            bad |= _index(c, p, mults[w], 4) if k == 4 else _index(c, p, mults[w], 5)
        if nt == nw:
            _map_out(o, c, k, f[ti])
        else:
            tab = table[ti]
            a = np.empty((k, j1 - j0), dtype=np.float64)
            for m in range(k):
                for j in range(j1 - j0):
                    a[m, j] = tab[c[m, j]]
            for w in range(nt, nw):
                p = row(paddr, l * nw + w, nb, _U8)[j0:j1]
                bad |= _acc(a, p, scal[l * nw + w], 4) if k == 4 else _acc(a, p, scal[l * nw + w], 5)
            _scale_out(o, a, k, inv)
    flag[t] = bad | _pads_bad(paddr, l, nw, nb, n, k, j1)


@njit(cache=True)
def _dec_serial(layers, paddr, nw, nbs, ns, oaddr, k, uni, s, inv, tix, mults, table, f, scal, count_dtype):
    """Every chunk of the layers `layers`, in order, on this thread; returns their flags (per task)."""
    nt = 0
    for l in layers:
        nt += (nbs[l] + _DEC_CHUNK - 1) // _DEC_CHUNK
    task_layer = np.empty(nt, dtype=np.int64)
    task_ch = np.empty(nt, dtype=np.int64)
    t = 0
    for l in layers:
        for ch in range((nbs[l] + _DEC_CHUNK - 1) // _DEC_CHUNK):
            task_layer[t] = l
            task_ch[t] = ch
            t += 1
    flag = np.zeros(nt, dtype=np.uint8)
    for t in range(nt):
        _dec_task(t, task_layer, task_ch, paddr, nw, nbs, ns, oaddr, k, uni, s, inv, tix, mults, table, f, scal,
                  flag, count_dtype)
    return task_layer[flag != 0]


@njit(cache=True, parallel=True)
def _dec_par(task_layer, task_ch, paddr, nw, nbs, ns, oaddr, k, uni, s, inv, tix, mults, table, f, scal,
             count_dtype):
    """The tasks as one parallel region; returns the layers of the flagged tasks."""
    flag = np.zeros(task_layer.size, dtype=np.uint8)
    for t in prange(task_layer.size):
        _dec_task(t, task_layer, task_ch, paddr, nw, nbs, ns, oaddr, k, uni, s, inv, tix, mults, table, f, scal,
                  flag, count_dtype)
    return task_layer[flag != 0]


def _layer_rows(payloads, sizes, fmt: str):
    """(kept arrays, int64 row addresses (L * W,), W, nbytes per layer) of the layers' payloads: per
    layer a (W, nbytes) uint8 array (numba_decode._check_payloads: its checks and errors) or a
    sequence of W uint8 payloads of nbytes each."""
    _check_fmt(fmt)
    if len(payloads) != len(sizes):
        raise ValueError(f"{len(payloads)} layers of payloads for {len(sizes)} sizes")
    k = packing.CODES_PER_BYTE[fmt]
    kept, bases, strides, nws, nbs, listed = [], [], [], [], [], {}
    for i, (p, n) in enumerate(zip(payloads, sizes)):
        if int(n) != n or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        nb = -(-int(n) // k)
        if isinstance(p, np.ndarray):
            if not (p.dtype == np.uint8 and p.ndim == 2 and p.shape[1] == nb and p.flags.c_contiguous):
                p, nb = _check_payloads(p, n, fmt)
            kept.append(p)
            bases.append(address(p))
            nws.append(p.shape[0])
        else:
            rows = list(p)
            if not all(type(q) is np.ndarray and q.dtype == np.uint8 and q.ndim == 1 and q.size == nb
                       and q.flags.c_contiguous for q in rows):
                rows = [np.ascontiguousarray(q) for q in rows]
                for w, q in enumerate(rows):
                    if q.dtype != np.uint8 or q.ndim != 1 or q.size != nb:
                        raise ValueError(f"payload of worker {w}: expected {nb} uint8 bytes for {n} elements in "
                                         f"{fmt}, got {q.dtype} {q.shape}")
            kept.append(rows)
            listed[i] = [address(q) for q in rows]
            bases.append(0)
            nws.append(len(rows))
        strides.append(nb)
        nbs.append(nb)
    nw = nws[0] if nws else 0
    if any(v != nw for v in nws):
        raise ValueError("every layer needs the same number of payloads")
    addrs = (np.array(bases, np.int64)[:, None]
             + np.array(strides, np.int64)[:, None] * np.arange(nw, dtype=np.int64)[None, :])
    if listed:
        addrs[list(listed)] = np.array(list(listed.values()), np.int64).reshape(len(listed), nw)
    return kept, addrs.reshape(-1), nw, np.array(nbs, np.int64)


def _raise_first(kept, flagged, sizes, fmt: str, scalers, uniform_scalers) -> None:
    """The ValueError of the first flagged layer: its per-layer function (weighted_sum with
    `scalers` (W, L), else scaled_code_sum with `uniform_scalers` (L,)) run again, which raises it."""
    for i in flagged:
        P = kept[i] if isinstance(kept[i], np.ndarray) else np.stack(kept[i])
        if scalers is None:
            scaled_code_sum(P, int(sizes[i]), fmt, uniform_scalers[i], 1)
        else:
            weighted_sum(P, scalers[:, i], int(sizes[i]), fmt, 1)


def _decode_layers(payloads, sizes, fmt: str, divide_by: int, uniform_scalers, scalers) -> list:
    """The decode-and-sum driver of weighted_sum_layers (scalers (W, L)) and scaled_code_sum_layers
    (uniform_scalers (L,), one scaler per layer)."""
    kept, paddr, nw, nbs = _layer_rows(payloads, sizes, fmt)
    nl = len(nbs)
    if nl == 0:
        return []
    ns = np.array([int(n) for n in sizes], np.int64)
    inv = np.float64(1.0 / divide_by)
    if scalers is not None:
        S = np.asarray(scalers)
        if S.shape != (nw, nl):
            raise ValueError(f"scalers: expected shape ({nw}, {nl}), got {S.shape}")
        S = S.astype(np.float64)
        uni = np.zeros(nl, dtype=np.bool_)
        if 0 < nw <= 32767 and nl:
            s0 = S[0]
            with np.errstate(all="ignore"):     # numba_decode._is_uniform, per layer
                uni = np.isfinite(s0) & (s0 > 0.0) & (s0 <= np.finfo(np.float32).max) & \
                    (s0.astype(np.float32).astype(np.float64) == s0) & (S == s0).all(axis=0)
        s = S[0] if nw else np.zeros(nl)
    else:
        if nw > 32767:
            raise ValueError(f"scaled_code_sum: {nw} workers, at most 32767")
        s = np.asarray(uniform_scalers, dtype=np.float64).reshape(-1)
        if s.shape != (nl,):
            raise ValueError(f"scalers: expected {nl} values, got {s.size}")
        uni = np.ones(nl, dtype=np.bool_)
    offs = np.concatenate([[0], np.cumsum(ns)]).tolist()
    flat = np.empty(offs[-1], dtype=np.float32)      # one allocation (huge pages), not one per layer
    outs = [flat[offs[i]:offs[i + 1]] for i in range(nl)]
    if nw == 0:
        for o, v in zip(outs, s):
            o[:] = np.float32(0.0 * inv) if scalers is not None else np.float32((np.float64(0.0) * v) * inv)
        return outs
    nt = min(nw, _TABLE_WORKERS)
    tix = np.cumsum(~uni) - 1
    lt = int((~uni).sum())
    if lt:
        idx = np.arange(3 ** nt)
        table = np.zeros((lt, 3 ** nt), dtype=np.float64)
        St = S[:, ~uni]
        with np.errstate(all="ignore"):           # numba_decode._partial_sums, each row's operations
            for w in range(nt):
                table += ((idx // 3 ** w) % 3 - 1).astype(np.float64)[None, :] * St[w][:, None]
            f = (table * inv).astype(np.float32)
        pad = 3 * (3 ** nt - 1) // 2 + 1 - table.shape[1]
        table = np.concatenate([table, np.zeros((lt, pad))], axis=1)
        f = np.concatenate([f, np.zeros((lt, pad), dtype=np.float32)], axis=1)
        scal = S.T.reshape(-1)
    else:
        table, f, scal = np.zeros((1, 1)), np.zeros((1, 1), np.float32), np.zeros(nl * nw)
    mults = (3 ** np.arange(nt)).astype(np.uint16)
    args = (paddr, np.int64(nw), nbs, ns, _row_addresses(outs, 1), np.int64(packing.CODES_PER_BYTE[fmt]), uni, s, inv,
            tix.astype(np.int64), mults, table, f, scal, _count_dtype(nw))
    par = np.zeros(nl, bool)
    if _threads() > 1:          # every layer in one region where the step's bytes are worth one
        par = nbs > 0 if nw * int(nbs.sum()) >= nc.SERIAL_DECODE else nw * nbs >= nc.SERIAL_DECODE
    flagged = [_dec_serial(np.flatnonzero(~par & (nbs > 0)), *args)]
    if par.any():
        nch = -(-nbs[par] // _DEC_CHUNK)
        task_layer = np.repeat(np.flatnonzero(par), nch)
        task_ch = np.arange(task_layer.size, dtype=np.int64) - np.repeat(np.cumsum(nch) - nch, nch)
        flagged.append(_dec_par(task_layer, task_ch, *args))
    if flagged[0].size or (len(flagged) > 1 and flagged[1].size):
        _raise_first(kept, np.unique(np.concatenate(flagged)), ns, fmt, None if scalers is None else S, s)
    return outs


def weighted_sum_layers(payloads, scalers, sizes, fmt: str, divide_by: int) -> list:
    """[numba_decode.weighted_sum(payloads[i], scalers[:, i], sizes[i], fmt, divide_by)] for every layer
    i, every (layer, byte chunk) in one call, with the same bits and, for an invalid payload, the
    ValueError of the first such layer (as the layer-by-layer calls raise it). payloads: per layer a
    (W, nbytes) uint8 array or a sequence of W payloads; scalers (W, L)."""
    return _decode_layers(payloads, sizes, fmt, divide_by, None, scalers)


def scaled_code_sum_layers(payloads, sizes, fmt: str, scalers, divide_by: int) -> list:
    """[numba_decode.scaled_code_sum(payloads[i], sizes[i], fmt, scalers[i], divide_by)] for every layer
    i (one shared scaler per layer), in one call: f32((f64(Σ_w codes_w) * f64(s_i)) * f64(1/divide_by)),
    with the same bits and errors (the first invalid layer's). payloads as weighted_sum_layers."""
    return _decode_layers(payloads, sizes, fmt, divide_by, scalers, None)


# -- integer code sums (the integer all-reduce) ----------------------------------------------------------
@njit(cache=True)
def _isum_task(t, task_layer, task_ch, paddr, nw, nbs, ns, offs, out, k, flag, count_dtype):
    """Bytes task_ch[t] * _DEC_CHUNK .. of layer l: out[offs[l] + e] = Σ_w code_w(e) (numba_decode's
    _isum_task on rows by address); flag[t] as in _dec_task."""
    l = task_layer[t]
    nb = nbs[l]
    n = ns[l]
    j0 = task_ch[t] * _DEC_CHUNK
    j1 = min(j0 + _DEC_CHUNK, nb)
    c = np.zeros((k, j1 - j0), dtype=count_dtype.dtype)
    bad = np.uint8(0)
    for w in range(nw):
        p = row(paddr, l * nw + w, nb, _U8)[j0:j1]
        bad |= _count(c, p, 4) if k == 4 else _count(c, p, 5)
    _int_out(out[offs[l] + j0 * k:offs[l] + min(j1 * k, n)], c, k, np.int32(nw))
    flag[t] = bad | _pads_bad(paddr, l, nw, nb, n, k, j1)


@njit(cache=True)
def _isum_serial(task_layer, task_ch, paddr, nw, nbs, ns, offs, out, k, count_dtype):
    flag = np.zeros(task_layer.size, dtype=np.uint8)
    for t in range(task_layer.size):
        _isum_task(t, task_layer, task_ch, paddr, nw, nbs, ns, offs, out, k, flag, count_dtype)
    return flag


def sum_codes_layers(payloads, sizes, fmt: str, dtype=None, out=None) -> list:
    """[numba_decode.sum_codes(payloads[i], sizes[i], fmt, dtype)] for every layer i, in one serial call,
    written one after another into `out` (a C-contiguous 1-D array of Σ sizes elements of `dtype`,
    default: the smallest integer type that holds W, as sum_codes) and returned as views of it; the
    same bits and, for an invalid payload, the first such layer's ValueError. payloads as
    weighted_sum_layers."""
    kept, paddr, nw, nbs = _layer_rows(payloads, sizes, fmt)
    ns = np.array([int(n) for n in sizes], np.int64)
    offs = np.concatenate([[0], np.cumsum(ns)]).astype(np.int64)
    if dtype is None:
        dtype = np.int8 if nw <= 127 else (np.int16 if nw <= 32767 else np.int32)
    if out is None:
        out = np.empty(int(offs[-1]), dtype=dtype)
    elif out.ndim != 1 or out.size != offs[-1] or out.dtype != np.dtype(dtype) or not out.flags.c_contiguous:
        raise ValueError(f"out: expected a C-contiguous 1-D {np.dtype(dtype)} array of {int(offs[-1])} elements")
    if nw == 0:
        out[:] = 0
    nch = -(-nbs // _DEC_CHUNK) if nw else np.zeros(len(nbs), np.int64)
    task_layer = np.repeat(np.arange(len(nbs), dtype=np.int64), nch)
    task_ch = np.arange(task_layer.size, dtype=np.int64) - np.repeat(np.cumsum(nch) - nch, nch)
    if task_layer.size:
        flag = _isum_serial(task_layer, task_ch, paddr, np.int64(nw), nbs, ns, offs, out,
                            np.int64(packing.CODES_PER_BYTE[fmt]), _count_dtype(nw))
        for i in np.unique(task_layer[flag != 0]):      # the first flagged layer's own error
            sum_codes(kept[i] if isinstance(kept[i], np.ndarray) else np.stack(kept[i]), int(ns[i]), fmt, dtype)
    return [out[offs[i]:offs[i + 1]] for i in range(len(nbs))]


@njit(cache=True)
def _decode_code_rows(codes, offs, scalers, n, inv, out):
    bad = 0
    for i in range(offs.size - 1):
        bad += _decode_codes(codes[offs[i]:offs[i + 1]], n, scalers[i], inv, out[offs[i]:offs[i + 1]])
    return bad


def decode_code_sums_layers(codes, sizes, n: int, scalers) -> list:
    """[packing.decode_code_sums(codes[o_i : o_i + sizes[i]], n, scalers[i])] for the layers' integer
    code sums of N = n workers laid one after another in `codes`, in one call: float32
    f32((f64(Σ codes) * f64(s_i)) * f64(1/n)) per element, the same bits; PayloadError when a sum
    lies beyond [-n, n]."""
    codes = np.ascontiguousarray(np.asarray(codes).reshape(-1))
    offs = np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))]).astype(np.int64)
    if offs[-1] != codes.size:
        raise ValueError(f"{codes.size} code sums for layers of {int(offs[-1])} elements")
    scalers = np.asarray(scalers, dtype=np.float64).reshape(-1)
    if scalers.size != offs.size - 1:
        raise ValueError(f"{scalers.size} scalers for {offs.size - 1} layers")
    out = np.empty(codes.size, dtype=np.float32)
    if codes.size and _decode_code_rows(codes, offs, scalers, np.int64(n), np.float64(1.0 / n), out):
        raise PayloadError(f"an integer code sum lies beyond N = {n}")
    return [out[offs[i]:offs[i + 1]] for i in range(offs.size - 1)]


__all__ = ["moments_layers", "encode_layers", "weighted_sum_layers", "scaled_code_sum_layers", "sum_codes_layers",
           "decode_code_sums_layers"]
