"""Codec kernel benchmark: fused Numba kernels vs the array reference vs memory-bandwidth floors.

    tgsim bench codec [--elements N] [--workers W] [--repeats R] [--quick]
    python -m tgsim.bench.codec [n_elements] [workers] [repeats]

Every row is the median of `repeats` timed calls after one untimed warm-up call (so Numba compile
time is excluded; tgsim.bench.timing); the slow reference path uses at most 2 timed calls. Rows:

  floor read g             one parallel read-only pass over the float32 gradient (Numba sum)
  floor philox words       the n Philox4x32-10 words the encode draws (one 32-bit word per element,
                           n/4 blocks of tgsim's stream layout), generated and folded into a sum
                           without being stored: the encode's compute floor
  floor encode             the larger of the two: the rows of the encode are divided by it (x floor)
  floor read payloads      one parallel read-only pass over the W packed 2-bit payloads
  floor write out          one parallel write pass of the float32[n] result (Numba fill into a
                           preallocated array)
  floor wsum               read payloads + write out: the weighted_sum floor
  write fresh out          the same fill into a fresh np.empty each call (page-fault cost)
  moments+encode           reference: stats.layer_moments + ternary.scaling_from_moments +
                           ternary.ternarize + packing.pack; fused: _numba.moments +
                           scaling_from_moments + _numba.encode (clip none / explicit; 2bit / base3)
  fused moments / encode   the two fused passes on their own
  weighted_sum             W workers' 2-bit payloads, one shared scaler (TernGrad's MAX-shared s)
                           and per-worker scalers; fused into a fresh result or into `out=`
  sum_codes                integer Σ codes of the same payloads

Columns: seconds (median), min_seconds (fastest call: the machine may be shared); ratio_vs_floor =
seconds / floor (the encode floor, max(read g, philox words), for the encode rows; the read floor
of g for the moments rows; the wsum floor for the payload rows);
ratio_vs_reference = reference seconds / seconds (the speed-up; > 1 is faster); wire_bytes = payload
bytes (2-bit: n/4 per worker, base-3: ceil(n/5)); bit_identical = the fused output equals the
reference output byte for byte (None: not compared); load_avg, spread (the largest (max - min) /
median of the row's own, its floor's and its reference's timed calls) and warning (load above the
core count, spread above 20 %, too few calls or a time near the clock's resolution: the row's
numbers, its ratios first, are not to be trusted; tgsim.bench.timing.row_check).
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import numba
import numpy as np
from numba import njit, prange

from tgsim.bench import timing
from tgsim.bench.timing import time_call
from tgsim.codecs.terngrad import numba_kernels as fused
from tgsim.codecs import packing
from tgsim.codecs.terngrad import moments as stats, quantizer as ternary
from tgsim.rng import StreamKey
from tgsim.rng.numba_philox import _stream_args, philox_block

CLIP_FACTOR = 2.5


@njit(cache=True, parallel=True, fastmath=True)
def _read_floor_f32(a):
    s = np.float32(0.0)
    for i in prange(a.size):
        s += a[i]
    return s


@njit(cache=True, parallel=True)
def _read_floor_u8(a):
    s = np.uint64(0)
    for i in prange(a.size):
        s += np.uint64(a[i])
    return s


@njit(cache=True, parallel=True)
def _philox_floor(nblocks, c1, c2, c3, k0, k1):
    """Σ over blocks j < nblocks of the xor of Philox4x32-10's four words of counter (j, c1, c2, c3) and
    key (k0, k1) (numba_philox.philox_block): every word the encode draws, none stored."""
    s = np.uint64(0)
    for j in prange(nblocks):
        w0, w1, w2, w3 = philox_block(np.uint32(j), c1, c2, c3, k0, k1)
        s += np.uint64(w0 ^ w1 ^ w2 ^ w3)
    return s


@njit(cache=True, parallel=True)
def _write_floor_f32(a, v):
    for i in prange(a.size):
        a[i] = v


class _Sum(NamedTuple):
    """Two floors paid one after the other: median = sum of the medians, best = sum of the bests."""

    median: float
    best: float
    parts: tuple = ()

    @property
    def timings(self) -> tuple:
        return self.parts


def _reference_encode(g, clip, key, fmt):
    m = stats.layer_moments(g, need_sigma=clip != "none")
    sc = ternary.scaling_from_moments(m.absmax, m.sigma, clip, CLIP_FACTOR)
    return packing.pack(ternary.ternarize(g, sc.scaler, key, sc.clip_bound), fmt)


def _fused_encode(g, clip, key, fmt):
    m = fused.moments(g, clip != "none")
    sc = ternary.scaling_from_moments(m.absmax, m.sigma, clip, CLIP_FACTOR)
    return fused.encode(g, sc.scaler, sc.clip_bound, key, fmt)


def run(n_elements: int = 16_777_216, workers: int = 8, repeats: int = 5) -> list[dict]:
    """Measure every row in one run (see the module docstring); returns a list of row dicts."""
    n = int(n_elements)
    ref_repeats = max(1, min(repeats, 2))
    rng = np.random.default_rng(12345)
    g = rng.standard_normal(n, dtype=np.float32)
    key = StreamKey(seed=0x1234_5678_9ABC, step=3, worker=1, layer=2)
    wire = {f: packing.packed_size(n, f) for f in packing.FORMATS}
    rows: list[dict] = []
    cores, resolution = timing.core_count(), timing.clock_resolution()

    def parts(t):
        return list(t.timings) if isinstance(t, _Sum) else [t]

    def row(what, t, floor=None, reference=None, wire_bytes=None, same=None):
        """t, floor, reference: timings (.median and .best seconds); ratios of medians."""
        used = parts(t) + [p for x in (floor, reference) if x is not None and x is not t for p in parts(x)]
        rows.append({"what": what, "seconds": t.median, "min_seconds": t.best,
                     "ratio_vs_floor": None if floor is None else t.median / floor.median,
                     "ratio_vs_reference": None if reference is None else reference.median / t.median,
                     "wire_bytes": wire_bytes, "bit_identical": same,
                     **timing.row_check(used, timing.load_average(), cores, resolution)})

    # -- floor of the encode side ------------------------------------------------------------------
    floor_read = time_call(lambda: _read_floor_f32(g), repeats)
    row("floor read g (float32, 1 pass)", floor_read, floor=floor_read)
    args = _stream_args(key)
    floor_words = time_call(lambda: _philox_floor(np.int64((n + 3) // 4), *args), repeats)
    row("floor philox words (n words, none stored)", floor_words, floor=floor_read)
    floor_enc = max(floor_read, floor_words, key=lambda t: t.median)
    row(f"floor encode = max(read g, philox words): {'philox' if floor_enc is floor_words else 'read'}",
        floor_enc, floor=floor_enc)

    # -- moments + encode of one layer ------------------------------------------------------------
    for fmt in ("2bit", "base3"):
        for clip in ("none", "explicit"):
            ref_t = time_call(lambda: _reference_encode(g, clip, key, fmt), ref_repeats)
            t = time_call(lambda: _fused_encode(g, clip, key, fmt), repeats)
            row(f"reference moments+encode {fmt} clip={clip}", ref_t, floor=floor_enc,
                wire_bytes=wire[fmt])
            row(f"fused moments+encode {fmt} clip={clip}", t, floor=floor_enc, reference=ref_t,
                wire_bytes=wire[fmt], same=bool(np.array_equal(t.result, ref_t.result)))
    for need_sigma in (False, True):
        t = time_call(lambda: fused.moments(g, need_sigma), repeats)
        row(f"fused moments only, need_sigma={need_sigma}", t, floor=floor_read)
    m = fused.moments(g, True)
    sc = ternary.scaling_from_moments(m.absmax, m.sigma, "explicit", CLIP_FACTOR)
    for clip_bound in (float("inf"), sc.clip_bound):
        label = "none" if clip_bound == float("inf") else "explicit"
        t = time_call(lambda: fused.encode(g, sc.scaler, clip_bound, key, "2bit"), repeats)
        row(f"fused encode only 2bit clip={label}", t, floor=floor_enc, wire_bytes=wire["2bit"])

    # -- weighted_sum of W workers' 2-bit payloads --------------------------------------------------
    payloads = np.stack([
        fused.encode(g, m.absmax, float("inf"), StreamKey(7, step=1, worker=w), "2bit")
        for w in range(workers)])
    shared = np.full(workers, m.absmax, dtype=np.float32)
    distinct = (m.absmax * np.linspace(1.0, 2.0, workers)).astype(np.float32)
    out = np.empty(n, dtype=np.float32)
    floor_rp = time_call(lambda: _read_floor_u8(payloads.reshape(-1)), repeats)
    floor_w = time_call(lambda: _write_floor_f32(out, np.float32(1.0)), repeats)
    floor_ws = _Sum(floor_rp.median + floor_w.median, floor_rp.best + floor_w.best, (floor_rp, floor_w))
    row(f"floor read payloads ({workers} x 2bit)", floor_rp, floor=floor_rp, wire_bytes=payloads.size)
    row("floor write out (float32[n], preallocated)", floor_w, floor=floor_w)
    row("floor wsum = read payloads + write out", floor_ws, floor=floor_ws)
    t = time_call(lambda: _write_floor_f32(np.empty(n, np.float32), np.float32(1.0)), repeats)
    row("write fresh out (np.empty + fill: page faults)", t, floor=floor_ws)
    for label, scalers in (("shared scaler", shared), ("per-worker scalers", distinct)):
        ref_t = time_call(lambda: packing.weighted_sum(payloads, scalers, n, "2bit", workers), ref_repeats)
        row(f"reference weighted_sum {workers} x 2bit, {label}", ref_t, floor=floor_ws,
            wire_bytes=payloads.size)
        t = time_call(lambda: fused.weighted_sum(payloads, scalers, n, "2bit", workers), repeats)
        row(f"fused weighted_sum {workers} x 2bit, {label}, fresh out", t, floor=floor_ws,
            reference=ref_t, wire_bytes=payloads.size,
            same=bool(np.array_equal(t.result.view(np.uint32), ref_t.result.view(np.uint32))))
        t = time_call(lambda: fused.weighted_sum(payloads, scalers, n, "2bit", workers, out=out), repeats)
        row(f"fused weighted_sum {workers} x 2bit, {label}, out= preallocated", t, floor=floor_ws,
            reference=ref_t, wire_bytes=payloads.size,
            same=bool(np.array_equal(t.result.view(np.uint32), ref_t.result.view(np.uint32))))
    ref_t = time_call(lambda: packing.sum_codes(payloads, n, "2bit"), ref_repeats)
    t = time_call(lambda: fused.sum_codes(payloads, n, "2bit"), repeats)
    row(f"fused sum_codes {workers} x 2bit (int8)", t, floor=floor_ws, reference=ref_t,
        wire_bytes=payloads.size, same=bool(np.array_equal(t.result, ref_t.result)))
    return rows


def format_rows(rows: list[dict]) -> str:
    head = (f"{'what':<62} {'ms':>9} {'min ms':>8} {'spread':>7} {'x floor':>8} {'speedup':>8} "
            f"{'wire bytes':>11} {'identical':>9}  warning")
    lines = [head, "-" * len(head)]
    for r in rows:
        f = "" if r["ratio_vs_floor"] is None else f"{r['ratio_vs_floor']:.2f}"
        s = "" if r["ratio_vs_reference"] is None else f"{r['ratio_vs_reference']:.1f}"
        w = "" if r["wire_bytes"] is None else str(r["wire_bytes"])
        b = "" if r.get("bit_identical") is None else str(r["bit_identical"])
        sp = "" if r["spread"] != r["spread"] else f"{100 * r['spread']:.0f}%"
        lines.append((f"{r['what']:<62} {r['seconds'] * 1e3:>9.3f} {r['min_seconds'] * 1e3:>8.3f} {sp:>7} "
                      f"{f:>8} {s:>8} {w:>11} {b:>9}  {r['warning']}").rstrip())
    warned = sum(bool(r["warning"]) for r in rows)
    if warned:
        lines.append(f"WARNING: {warned} of {len(rows)} rows warn (last column): their times and ratios are not "
                     "reliable; rerun on an idle machine or with more --repeats")
    return "\n".join(lines)


def header(n_elements: int) -> str:
    """The line printed above the table: the gradient size and Numba's thread count."""
    return (f"n_elements={n_elements} ({n_elements * 4 / 2**20:.0f} MiB float32), "
            f"numba threads={numba.get_num_threads()}\n"
            + timing.machine_line(timing.load_average(), timing.core_count(), timing.clock_resolution()))


def main(argv: list[str] | None = None) -> None:
    args = [int(a) for a in (sys.argv[1:] if argv is None else argv)[:3]]
    print(header(args[0] if args else 16_777_216))
    print(format_rows(run(*args)))


if __name__ == "__main__":
    main()
