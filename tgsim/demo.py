"""`tgsim demo`: encode one step of real gradients with TernGrad and print what crossed the wire.

Four virtual workers each compute the gradient of a two-layer ReLU network (softmax cross-entropy)
on their own shard of a synthetic 10-class problem; they share scalers (MAX), ternarize with c·σ
clipping, and the packed messages are aggregated. Printed per layer: size, scaler, the
Assumption-3 ratio ||g||_inf·||g||_1 / ||g||_2^2, the clip fraction, and the relative error of the
ternary mean against the fp32 mean; then the bytes on the wire against fp32.
"""

from __future__ import annotations

import time

import numpy as np

from tgsim.codecs import TernGrad
from tgsim.rng import StreamKey


def mlp_gradients(x, y, params):
    """Gradients of mean softmax cross-entropy of relu(x W1 + b1) W2 + b2."""
    w1, b1, w2, b2 = params["w1"], params["b1"], params["w2"], params["b2"]
    h = np.maximum(x @ w1 + b1, 0)
    z = h @ w2 + b2
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    dz = p / len(y)
    dh = (dz @ w2.T) * (h > 0)
    return {"w1": x.T @ dh, "b1": dh.sum(0), "w2": h.T @ dz, "b2": dz.sum(0)}


def run(workers: int = 4, seed: int = 0, batch: int = 256, d: int = 256, hidden: int = 512) -> dict:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((10, d)).astype(np.float32)
    params = {"w1": (rng.standard_normal((d, hidden)) / np.sqrt(d)).astype(np.float32),
              "b1": np.zeros(hidden, np.float32),
              "w2": (rng.standard_normal((hidden, 10)) / np.sqrt(hidden)).astype(np.float32),
              "b2": np.zeros(10, np.float32)}
    grads = []
    for _ in range(workers):
        y = rng.integers(0, 10, batch)
        x = (centers[y] + 2.0 * rng.standard_normal((batch, d))).astype(np.float32)
        grads.append({k: v.astype(np.float32) for k, v in mlp_gradients(x, y, params).items()})

    codec = TernGrad(clip="explicit", clip_factor=2.5)
    t0 = time.perf_counter()
    scalings = [codec.scaling(g) for g in grads]
    shared = np.max([codec.local_scalers(s) for s in scalings], axis=0)
    msgs = [codec.encode(g, StreamKey(seed, 0, w), shared, s) for w, (g, s) in enumerate(zip(grads, scalings))]
    mean_t = codec.aggregate(msgs)
    seconds = time.perf_counter() - t0

    print(f"TernGrad demo: {workers} workers, one step of a {d}-{hidden}-10 ReLU network, clip 2.5σ (explicit)")
    print(f"{'layer':6} {'n':>8} {'shared s':>10} {'inf*l1/l2^2':>12} {'clipped %':>10} {'rel.err':>8}")
    rows = []
    for i, name in enumerate(params):
        gs = np.stack([g[name].reshape(-1).astype(np.float64) for g in grads])
        mean32 = gs.mean(0)
        ratio = np.mean([np.abs(v).max() * np.abs(v).sum() / (v @ v) for v in gs])
        clipped = np.mean([(np.abs(v) > (sc[i].clip_bound)).mean() for v, sc in zip(gs, scalings)])
        err = np.linalg.norm(mean_t[name].reshape(-1) - mean32) / np.linalg.norm(mean32)
        rows.append(dict(layer=name, n=gs.shape[1], scaler=float(shared[i]), ratio=ratio, clipped=clipped, rel_err=err))
        print(f"{name:6} {gs.shape[1]:8d} {shared[i]:10.3e} {ratio:12.1f} {100 * clipped:10.2f} {err:8.3f}")
    n_total = sum(r["n"] for r in rows)
    wire = msgs[0].wire_bytes
    print(f"wire bytes per worker: {wire} (fp32: {4 * n_total}, ratio {4 * n_total / wire:.1f}x); "
          f"encode+aggregate {seconds * 1e3:.1f} ms")
    return {"rows": rows, "wire_bytes": wire, "fp32_bytes": 4 * n_total}
