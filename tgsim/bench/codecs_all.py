"""Every registered codec, one run: encode and decode-sum throughput as ratios.

    tgsim bench codec --codec all|NAME [--layers K] [--elements N] [--workers W] [--repeats R] [--quick]

For each codec (its default config, tgsim.codecs.registry) on one Gaussian float32 layer of n
elements, in the same process and run:

  encode      prepare_many + encode_many of W workers' copies of the layer (the protocol's pass 1
              and 2), per worker;
  aggregate   codec.aggregate of the W messages (decode and sum into the float32 mean), the
              exchange's work for codecs with their own wire (the packed-code wire's integer sums
              are in `tgsim bench codec`);
  floors      a read pass over the float32 layer (np.add.reduce; encode) and over the W messages'
              bytes plus a write of the float32 result (np.bitwise_or.reduce + fill; aggregate),
              single-threaded NumPy like most codecs, measured in the same run;
  reference   codecs with a `kernels` option (terngrad, fp16, bf16, sign, scaled_sign, qsgd, suresh,
              topk, randomk): the same two steps
              with kernels = "reference" (the array code); `x reference` = its time / the
              default's (kernels = "auto": Numba on the host), and `ref x read` / `ref x floor` the
              reference's own time over the same read pass / floor, so one run shows the reference,
              the Numba kernels and the read pass side by side.

With `--layers K` (K > 1), the same encode and aggregate of K layers of n/K elements each (the
first n mod K layers one element longer: n in all), in the same run: `encode_K_x_one` and
`aggregate_K_x_one` are their times over the one-layer times, `encode_K_flat_x_one` the encode of
the K layers held in one buffer at offsets (tgsim.codecs.base.FlatLayers: a DDP bucket's form) over
the one layer's. A codec whose passes run once over all of a step's layers (one compiled call per
pass: `multi_tensor`, the codec's declared property, in its row) stays near 1; one call per layer
grows with K.

Rows are medians of `repeats` timed calls after one warm-up call (tgsim.bench.timing). Each row also
has load_avg, spread (the largest (max - min) / median over its timings: encode, aggregate, the floors
and the reference's) and warning (tgsim.bench.timing.row_check: load above the core count, spread
above 20 %, too few calls, a time near the clock's resolution).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tgsim.bench import timing
from tgsim.bench.timing import time_call
from tgsim.codecs.base import flat_layers


def _steps(codec, layers: dict, workers: np.ndarray):
    def encode():
        stats = codec.prepare_many(layers)
        shared = None
        if codec.properties.shared_stats is not None:
            local = codec.local_scalers_many(stats, len(workers))
            shared = local.max(axis=0) if codec.properties.shared_stats == "max" else local.mean(axis=0)
        return codec.encode_many(layers, 1, 0, workers, shared, stats)

    return encode


def split_layers(g: np.ndarray, workers: int, k: int) -> dict:
    """{"l0000": (workers, n_0), ...}: `g` cut into k consecutive layers (sizes differ by at most one
    element), each repeated for every worker."""
    parts = np.array_split(g, k)
    return {f"l{i:04d}": np.repeat(p[None], workers, axis=0) for i, p in enumerate(parts)}


def run(names, n_elements: int = 1 << 22, workers: int = 8, repeats: int = 5, layers: int = 1) -> list[dict]:
    from tgsim.codecs import registry
    from tgsim.train.config import CodecConfig

    g = np.random.default_rng(0).standard_normal(n_elements).astype(np.float32)
    one = {"g": np.repeat(g[None], workers, axis=0)}
    many = split_layers(g, workers, layers) if layers > 1 else None
    ids = np.arange(workers)
    cores, resolution = timing.core_count(), timing.clock_resolution()
    t_read = time_call(lambda: np.add.reduce(g), repeats)
    out = np.empty(n_elements, dtype=np.float32)
    t_write = time_call(lambda: out.fill(0.0), repeats)
    floor_read, floor_write = t_read.median, t_write.median
    rows = []
    for name in names:
        cfg = dataclasses.replace(CodecConfig(), name=name)
        variants = {"default": registry.make_codec(cfg)}
        if getattr(variants["default"], "kernels", None) not in (None, "reference"):
            variants["reference"] = registry.make_codec(dataclasses.replace(cfg, kernels="reference"))
        t, used = {}, [t_read, t_write]
        for label, codec in variants.items():
            encode = _steps(codec, one, ids)
            te = time_call(encode, repeats if label == "default" else min(repeats, 2))
            msgs = te.result
            ta = time_call(lambda: codec.aggregate(msgs, divide_by=workers), repeats if label == "default" else
                           min(repeats, 2))
            t[label] = (te.median, ta.median, msgs)
            used += [te, ta]
        enc, agg, msgs = t["default"]
        wire = int(np.mean([m.wire_bytes for m in msgs]))
        payload = np.frombuffer(b"".join(m.to_bytes() for m in msgs), dtype=np.uint8)
        t_or = time_call(lambda: np.bitwise_or.reduce(payload), repeats)
        floor_agg = t_or.median + floor_write
        ref = t.get("reference")
        nan = float("nan")
        k_cols = {}
        if many is not None:
            codec = variants["default"]
            tk = time_call(_steps(codec, many, ids), repeats)
            mk = tk.result
            tka = time_call(lambda: codec.aggregate(mk, divide_by=workers), repeats)
            tkf = time_call(_steps(codec, flat_layers(many), ids), repeats)
            used += [tk, tka, tkf]
            k_cols = {f"encode_{layers}_x_one": tk.median / enc, f"aggregate_{layers}_x_one": tka.median / agg,
                      f"encode_{layers}_flat_x_one": tkf.median / enc,
                      "multi_tensor": bool(codec.properties.multi_tensor)}
        rows.append(dict(
            codec=name, encode_ms_per_worker=1e3 * enc / workers,
            encode_x_read=enc / workers / floor_read,
            encode_x_reference=(ref[0] / enc) if ref else nan,
            encode_ref_x_read=(ref[0] / workers / floor_read) if ref else nan,
            aggregate_ms=1e3 * agg, aggregate_x_floor=agg / floor_agg,
            aggregate_x_reference=(ref[1] / agg) if ref else nan,
            aggregate_ref_x_floor=(ref[1] / floor_agg) if ref else nan,
            bits_per_element=8 * wire / n_elements, **k_cols,
            **timing.row_check(used + [t_or], timing.load_average(), cores, resolution)))
    return rows


def format_rows(rows: list[dict], n_elements: int, workers: int, layers: int = 1) -> str:
    head = (f"every codec (default config), a Gaussian layer of {n_elements:,} float32 elements, {workers} "
            "workers; x read / x floor: times the read pass of the layer (encode, per worker) and the read of "
            "the messages + write of the mean (aggregate) measured in this run; x reference: the array code's "
            "time / the default kernels' (codecs with a kernels option; the default, 'auto', is Numba on the host); "
            "ref x read / ref x floor: the array code's time over the same read pass / floor"
            + (f"; encode_{layers}_x_one / aggregate_{layers}_x_one: the same elements as {layers} layers, "
               f"time over the one layer's; encode_{layers}_flat_x_one: those layers in one buffer at offsets "
               "(FlatLayers); multi_tensor: the codec's passes run over all layers in one compiled call"
               if layers > 1 else ""))
    cols = list(rows[0])
    fmt = {c: (lambda v: f"{v:.3g}") for c in cols if c != "codec"}
    fmt.update(load_avg=lambda v: f"{v:.2f}", spread=lambda v: "" if v != v else f"{100 * v:.0f}%",
               warning=str, multi_tensor=str)
    cells = [[r["codec"]] + [fmt[c](r[c]) for c in cols[1:]] for r in rows]
    width = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = [head, "  ".join(c.ljust(w) for c, w in zip(cols, width))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, width)).rstrip() for row in cells]
    lines.insert(1, timing.machine_line(timing.load_average(), timing.core_count(), timing.clock_resolution()))
    warned = sum(bool(r["warning"]) for r in rows)
    if warned:
        lines.append(f"WARNING: {warned} of {len(rows)} rows warn (column warning): their times and ratios are not "
                     "reliable; rerun on an idle machine or with more --repeats")
    return "\n".join(lines)
