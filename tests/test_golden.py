"""Golden bits: sha256 of codec payloads, exchange aggregates and trained parameters for fixed seeds.

A refactor must keep every bit. tests/golden.json records:
* "codec": for every TernGrad option (clip none/explicit/implicit x packing 2bit/base3 x float
  layers by name and by size), on fixed synthetic gradients of 4 workers: each worker's message
  bytes with and without scaler sharing, the codec's aggregate, the batched encode's messages, and
  the in-process exchange's mean and counted bytes in every mode (ps with and without a
  re-ternarized downlink, allreduce, allgather; shared and own scalers), plus the fp32 mean.
  These depend on no BLAS call, so they hold on any CPU; both CPU kernel sets (reference, numba)
  must give them.
* "trained": params.npz of short training runs (fp32 and TernGrad, every exchange mode), keyed by
  the machine's numerics (the models' BLAS kernel and NumPy's SIMD level, README "Reproducibility"):
  compared where the key was recorded, skipped with the reason elsewhere.

Record (only when a change is MEANT to change bits, and say so in the commit):
    python tests/test_golden.py --write            # codec hashes + this machine's trained hashes
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

GOLDEN = Path(__file__).with_name("golden.json")
WORKERS = 4
SHAPES = {"conv.w": (6, 3, 5), "conv.b": (6,), "fc.w": (37, 11), "fc.b": (11,), "big.w": (1000,), "tiny.b": (3,),
          "zero.w": (5,)}
CODEC_OPTIONS = [dict(clip=clip, packing=packing, **extra)
                 for clip in ("none", "explicit", "implicit") for packing in ("2bit", "base3")
                 for extra in ({}, {"float_layers": ("fc.b",), "min_size": 8})]


def _sha(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        if isinstance(a, (bytes, bytearray)):
            h.update(bytes(a))
        else:
            a = np.ascontiguousarray(np.asarray(a))
            h.update(str(a.dtype).encode() + str(a.shape).encode())
            h.update(a.tobytes())
    return h.hexdigest()[:24]


def _layers_sha(layers: dict) -> str:
    return _sha(*(x for name in sorted(layers) for x in (name.encode(), np.asarray(layers[name]))))


def gradients() -> list[dict]:
    """Fixed gradients of 4 workers: mixed scales, heavy tails, a zero layer, float16/64 inputs."""
    rng = np.random.default_rng(20261124)
    out = []
    for w in range(WORKERS):
        g = {}
        for i, (name, shape) in enumerate(SHAPES.items()):
            x = rng.standard_t(3, size=shape) * 10.0 ** (i - 3)
            g[name] = np.zeros(shape, np.float32) if name == "zero.w" else x.astype(np.float32)
        g["conv.b"] = g["conv.b"].astype(np.float16)       # widened exactly
        g["fc.w"] = g["fc.w"].astype(np.float64) * (1 + w)  # rounded to float32
        out.append(g)
    return out


def codec_hashes(kernels: str) -> dict:
    from tgsim.codecs import TernGrad
    from tgsim.exchange import InProcessExchange
    from tgsim.rng import StreamKey

    grads = gradients()
    stacked = {k: np.stack([np.asarray(g[k], np.float32) for g in grads]) for k in SHAPES}
    ex = InProcessExchange(WORKERS)
    out = {"fp32_mean": _layers_sha(ex.mean_fp32([{k: np.asarray(g[k], np.float32) for k in g} for g in grads])[0])}
    for opts in CODEC_OPTIONS:
        codec = TernGrad(kernels=kernels, **opts)
        tag = ",".join(f"{k}={v}" for k, v in sorted(opts.items()))
        scalings = [codec.scaling(g) for g in grads]
        shared = ex.max_scalers(np.stack([codec.local_scalers(s) for s in scalings]))
        rec = {}
        for share in (False, True):
            s = shared if share else None
            msgs = [codec.encode(g, StreamKey(11, 3, w), s, scalings[w]) for w, g in enumerate(grads)]
            many = codec.encode_many(stacked, 11, 3, np.arange(WORKERS), s, codec.scaling_many(stacked))
            rec[f"messages shared={share}"] = _sha(*(m.to_bytes() for m in msgs))
            rec[f"encode_many shared={share}"] = _sha(*(m.to_bytes() for m in many))
            rec[f"aggregate shared={share}"] = _layers_sha(codec.aggregate(msgs, divide_by=WORKERS))
            modes = [("allgather", None), ("ps", None), ("ps", StreamKey(11, 3, WORKERS))]
            modes += [("allreduce", None)] if share else []
            for mode, rkey in modes:
                mean, comm = ex.aggregate(codec, msgs, mode, share, rkey)
                name = f"{mode}{' reternarized' if rkey else ''} shared={share}"
                rec[name] = _layers_sha(mean) + f" {comm.sent:.1f}/{comm.received:.1f}"
        out[tag] = rec
    return out


TRAIN = {
    "run": {"name": "golden", "seed": 5, "steps": 12, "eval_every": 0, "log_every": 4},
    "data": {"name": "digits"},
    "model": {"name": "mlp", "options": {"hidden": [24]}},
    "workers": {"n": 4, "batch": 32},
    "optimizer": {"name": "momentum"},
    "schedule": {"name": "constant", "lr": 0.1},
}
TRAIN_CASES = {
    "fp32 allreduce": ({"name": "fp32"}, {"mode": "allreduce"}),
    "terngrad explicit ps shared": ({"name": "terngrad", "clip": "explicit"}, {"mode": "ps", "share_scalers": True}),
    "terngrad implicit base3 ps reternarized": ({"name": "terngrad", "clip": "implicit", "packing": "base3"},
                                                {"mode": "ps", "share_scalers": True, "reternarize_downlink": True}),
    "terngrad none allreduce": ({"name": "terngrad", "clip": "none"}, {"mode": "allreduce"}),
    "terngrad explicit allgather own": ({"name": "terngrad", "clip": "explicit"},
                                        {"mode": "allgather", "share_scalers": False}),
    "terngrad explicit ps own": ({"name": "terngrad", "clip": "explicit"}, {"mode": "ps", "share_scalers": False}),
}


def numerics_key() -> str:
    """What a trained run's bits depend on besides the code: the models' BLAS kernel and NumPy's SIMD."""
    from numpy._core import _multiarray_umath as umath

    from tgsim import blas

    gemm = [lib for lib in blas.describe()["libraries"] if lib["models_gemm"]]
    kernel = f"{gemm[0]['internal_api']} {gemm[0]['architecture']}" if gemm else "unknown BLAS"
    simd = [f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f)]
    return f"{kernel} | numpy {simd[-1] if simd else umath.__cpu_baseline__[-1]}"


def trained_hashes(tmp: Path) -> dict:
    from tgsim.train.config import from_dict
    from tgsim.train.loop import run

    out = {}
    for name, (codec, exchange) in TRAIN_CASES.items():
        cfg = from_dict({**TRAIN, "codec": codec, "exchange": exchange})
        res = run(cfg, out=tmp / name.replace(" ", "_"), quiet=True)
        out[name] = _layers_sha(res.params) + f" {res.bits_up:.1f}/{res.bits_down:.1f}"
    return out


def _golden() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("kernels", ["reference", "numba"])
def test_codec_and_exchange_bits_are_the_golden_ones(kernels):
    want, got = _golden()["codec"], codec_hashes(kernels)
    assert got.keys() == want.keys()
    for tag in want:
        assert got[tag] == want[tag], f"{kernels} kernels, {tag}: bits changed"


def test_trained_parameters_are_the_golden_ones(tmp_path):
    key = numerics_key()
    recorded = _golden()["trained"]
    if key not in recorded:
        pytest.skip(f"no golden trained bits for this machine's numerics ({key}); recorded for "
                    f"{sorted(recorded)}: `python tests/test_golden.py --write` records them")
    assert trained_hashes(tmp_path) == recorded[key]


def test_a_changed_bit_is_caught():
    """Positive control: one flipped bit of one worker's gradient changes the golden hashes."""
    base = _sha(gradients()[0]["big.w"])
    g = gradients()[0]["big.w"].copy()
    g.view(np.uint32)[17] ^= 1
    assert _sha(g) != base


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    data = _golden() if GOLDEN.exists() else {"codec": {}, "trained": {}}
    data["codec"] = codec_hashes("numba")
    assert codec_hashes("reference") == data["codec"], "the reference and numba kernels disagree"
    with tempfile.TemporaryDirectory() as tmp:
        data["trained"][numerics_key()] = trained_hashes(Path(tmp))
    GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}: {len(data['codec'])} codec configs, trained bits for {sorted(data['trained'])}")
