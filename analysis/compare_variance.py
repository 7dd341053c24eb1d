"""`tgsim compare variance`: the mean squared error of the N-worker average at equal bits per element,
measured through the registered codecs and compared with its exact formula.

Budgets B in {1, 1.6, 2, 4, 8, 16} bits per element. A codec meets B when its REAL payload, 8 ·
len(message.to_bytes()) / n (frame header, per-layer scalars, norms, indices and padding included),
is at most B (1 + TOL), TOL = 5 %, for every codec: the framing (header, per-layer scalars, padding)
costs 0.5-1 % on a 2^15-element vector and 3-4 % on the convnet's 8 layers (terngrad 2.06 bits, base3
1.66, suresh's 1-bit levels 1.03). Knobs are searched on that measured size (worker 0's message):
qsgd over (levels, bucket, coding fixed/elias), suresh over levels 2^b, topk/randomk over density
(bisection to the largest density whose payload is <= B (1 + TOL)); among the candidates that meet
B the one with the least exact error is taken (randomk: the search uses its mean payload, at k_n
kept elements per layer, within B (1 + TOL/2), so that the mean of the random sizes stays within
B (1 + TOL); the rows report the measured mean and maximum over all draws). Fixed-rate codecs
(fp32 32, fp16/bf16 16, terngrad 2 (2bit) or 1.6 (base3), scaled_sign 1
(2 for a vector with zeros: it then also sends a nonzero plane)) appear at the smallest budget they
meet, fp32 at its own 32; every other (codec, budget) is a row with status "n/a: ...", as is signSGD
(±1 without a magnitude: its majority vote estimates no mean, so an MSE against v says nothing).
A codec whose best knob under B is that of a lower budget (suresh's whole bits at 1.6) is listed
with it again; the figure draws it once.

Vectors (`kind`): synthetic float32 vectors of n = 2^15 (gaussian, student_t2: Student-t with 2
degrees of freedom, infinite variance; lognormal: log-normal magnitudes (σ = 2) with random signs;
sparse: 95 % exact zeros), which every worker holds (the codec's noise alone), and "mnist1d": the
per-worker mini-batch gradients (all layers, 23,882 elements) of the MNIST-1D convnet after
`recorded_steps` fp32 SGD steps with 32 workers (tgsim.analysis.common.trajectory), worker w holding
its own. Encodings: worker w of round r encodes with StreamKey(seed, step = r, worker = w): R rounds
of 32 workers, whose groups of N = 1, 8, 32 consecutive workers give 32, 4, 1 averages per round.
The average of a group is the codecs' mean combine f32(Σ_w f64(decode_w) / N); for a codec that
shares statistics (terngrad: the MAX of the scalers) the group's workers share them.

Exact formula. For worker w with vector v_w let b_w = E[Q(v_w)] - v_w (bias) and σ_w^2 =
E||Q(v_w) - E Q(v_w)||^2 (variance); the draws of different workers are independent, so

    E || (1/N) Σ_w Q(v_w) - (1/N) Σ_w v_w ||^2 = || (1/N) Σ_w b_w ||^2 + (1/N^2) Σ_w σ_w^2

(unbiased codecs: b = 0, the (1/N^2) Σ_w err_w of independent encodings; deterministic codecs: σ = 0,
so with identical vectors the bias^2 term does not shrink with N). Per codec, per layer (float64,
with the float32 scalars the codec sends):
    terngrad  s the (shared) scaler, x = min(|v|, clip bound), p = min(x/s, 1):
              E Q = sign(v) s p, σ^2 = Σ s^2 p (1 - p)   (clip none: σ^2 = s||v||_1 - ||v||^2)
    qsgd      σ^2 = Σ_buckets (norm_b / s)^2 Σ_i f_i (1 - f_i), f_i = frac(s |v_i| / norm_b)
    suresh    σ^2 = Δ^2 Σ_i f_i (1 - f_i), Δ = (hi - lo)/(k - 1), f_i = frac((v_i - lo)/Δ); with the
              rotation (n/d) times that over the rotated y = H D v' / sqrt(d), given D (per round)
    randomk   σ^2 = Σ_i v_i^2 (1/p̃_i - 1), p̃_i = min(ceil(λ|v_i| 2^24), 2^24) / 2^24
    topk      b = -v off the k largest |v_i|; scaled_sign b = c sign(v) - v, c = f32(||v||_1 / n);
    fp16/bf16 b = round(v) - v; fp32 b = 0. (Up to the 2^-24 resolution of the uniforms and the
              float32 rounding of decoded values, far below the intervals.)
Measured: per round the mean over the round's groups of ||avg - v̄||^2 (and of ||avg - v̄||^2 /
||v̄||^2, the relative MSE); over R rounds a 95 % t-interval; `z`, `p_value`: the paired test of
mean(measured_r - exact_r) = 0 (exact_r varies by round only with the rotation).

Outputs (`--out DIR`, default results/compare-variance): variance.csv (one row per codec x budget x
N x kind) and variance.png (MSE / ||v̄||^2 against measured bits per element, log-log, one line per
codec, panels N x kind; fp32's MSE of 0 cannot be drawn and is listed in the CSV).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

DEFAULT_OUT = "results/compare-variance"
BUDGETS = (1.0, 1.6, 2.0, 4.0, 8.0, 16.0)
WORKERS = (1, 8, 32)
KINDS = ("gaussian", "student_t2", "lognormal", "sparse", "mnist1d")
TOL = 0.05
ALPHA = 0.05
COLUMNS = ["kind", "codec", "budget", "workers", "status", "knob", "bits_per_element", "bits_max", "R", "mse",
           "mse_lo", "mse_hi", "exact_mse", "rel_mse", "rel_mse_lo", "rel_mse_hi", "exact_rel_mse", "z", "p_value",
           "unbiased", "deterministic", "n", "seed"]


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str                  # registered codec
    fixed: dict                # its [codec] options
    knob: str | None           # "qsgd" (levels, bucket, coding) | "levels" | "density" | None (fixed rate)
    deterministic: bool
    unbiased: bool
    na: str = ""               # why it is never compared


SPECS = {
    "fp32": Spec("fp32", {}, None, True, True),
    "fp16": Spec("fp16", {}, None, True, False),
    "bf16": Spec("bf16", {}, None, True, False),
    "terngrad": Spec("terngrad", {"clip": "none", "packing": "2bit", "sharing": "max"}, None, False, True),
    "terngrad-base3": Spec("terngrad", {"clip": "none", "packing": "base3", "sharing": "max"}, None, False, True),
    "terngrad-clip": Spec("terngrad", {"clip": "explicit", "clip_factor": 2.5, "sharing": "max"}, None, False, False),
    "scaled_sign": Spec("scaled_sign", {}, None, True, False),
    "sign": Spec("sign", {}, None, True, False, na="n/a: signSGD sends ±1 without a magnitude (its majority vote "
                 "estimates no mean)"),
    "qsgd": Spec("qsgd", {"norm": "l2"}, "qsgd", False, True),
    "suresh": Spec("suresh", {"rotate": False}, "levels", False, True),
    "suresh-rot": Spec("suresh", {"rotate": True}, "levels", False, True),
    "topk": Spec("topk", {"k": 0}, "density", True, False),
    "randomk": Spec("randomk", {"k": 0}, "density", False, True),
}
CODECS = tuple(k for k in SPECS if k != "suresh-rot")   # the default set (suresh-rot: a Hadamard transform
#                                                          per worker and round for the formula, ~4x the cost)


def spec(label: str) -> Spec:
    """SPECS[label]; any other codec name (a plugin, "package.module:Class") at its default config and
    fixed rate, its unbiasedness as declared, drawn R times (no exact formula: exact_mse is nan).
    ValueError naming the known labels for a name that is neither."""
    if label in SPECS:
        return SPECS[label]
    from tgsim.codecs import registry
    from tgsim.train.config import CodecConfig

    try:
        codec = registry.make_codec(dataclasses.replace(CodecConfig(), name=label))
    except ValueError as e:
        raise ValueError(f"unknown codec {label!r}: not one of {', '.join(SPECS)}, and {e}") from e
    return Spec(label, {}, None, False, bool(codec.properties.unbiased))


def make_codec(label: str, knob: dict | None = None):
    from tgsim.codecs import registry
    from tgsim.train.config import CodecConfig

    spec_ = spec(label)
    return registry.make_codec(CodecConfig(name=spec_.name, options={**spec_.fixed, **(knob or {})}))


# ---------------------------------------------------------------------------------------------
# vectors
# ---------------------------------------------------------------------------------------------
def synthetic(kind: str, n: int, seed: int) -> np.ndarray:
    """float32 (n,): common.synthetic_gradient's shapes, and student_t2 (2 degrees of freedom)."""
    from tgsim.analysis.common import synthetic_gradient

    if kind == "student_t2":
        rng = np.random.default_rng([21, int(seed)])
        return (1e-2 * rng.standard_t(2, n)).astype(np.float32)
    return synthetic_gradient(kind, n, seed)


def mnist1d_gradients(workers: int, steps: int, seed: int) -> dict:
    """{layer: (workers, *shape) float32}: the convnet's per-worker gradients before step `steps`."""
    from tgsim.analysis.common import trajectory
    from tgsim.train.config import from_dict

    cfg = from_dict({"run": {"name": "compare-variance", "seed": seed, "steps": steps},
                     "data": {"name": "mnist1d"}, "model": {"name": "convnet1d"},
                     "workers": {"n": workers, "batch": 32, "batch_mode": "per_worker"},
                     "codec": {"name": "fp32"}, "exchange": {"mode": "allreduce"},
                     "optimizer": {"name": "momentum", "momentum": 0.9}, "schedule": {"name": "constant", "lr": 0.05}})
    out = {}

    def grab(t, setup, params, grads):
        if t == steps - 1:
            out.update({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in grads.items()})

    trajectory(cfg, steps, grab)
    return out


def vectors(kinds, n: int, seed: int, workers: int, recorded_steps: int) -> dict:
    """{kind: (layers {name: (workers, *shape) float32}, identical rows?)}."""
    out = {}
    for kind in kinds:
        if kind == "mnist1d":
            out[kind] = (mnist1d_gradients(workers, recorded_steps, seed), False)
        else:
            out[kind] = ({"g": np.tile(synthetic(kind, n, seed), (workers, 1))}, True)
    return out


def _flat(layers: dict, w: int | None = None) -> np.ndarray:
    """Worker w's layers (or a decoded dict) concatenated, float64."""
    return np.concatenate([np.asarray(v if w is None else v[w], np.float64).reshape(-1) for v in layers.values()])


# ---------------------------------------------------------------------------------------------
# exact bias and variance of one worker's encoding
# ---------------------------------------------------------------------------------------------
def _bf16(v32: np.ndarray) -> np.ndarray:
    u = v32.view(np.uint32).astype(np.uint64)
    b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return b.view(np.float32)


def exact_terms(label: str, codec, layers: dict, w: int, shared=None, key=None) -> tuple[np.ndarray, float]:
    """(b_w flat float64, σ_w^2) of worker w's encoding (module docstring). shared: (L,) float32 scalers
    of its group (terngrad); key: (seed, step) for the rotation of suresh-rot."""
    from tgsim.codecs import qsgd as q_mod, sign as s_mod, sparse as k_mod, suresh as r_mod
    from tgsim.rng import StreamKey

    bias, var = [], 0.0
    stats = codec.prepare_many({k: v[w:w + 1] for k, v in layers.items()}) if SPECS[label].name == "terngrad" else None
    for li, (name, g) in enumerate(layers.items()):
        v32 = np.ascontiguousarray(g[w], dtype=np.float32).reshape(-1)
        v = v32.astype(np.float64)
        a = np.abs(v)
        b = np.zeros_like(v)
        kind = SPECS[label].name
        if kind == "fp16":
            b = v32.astype(np.float16).astype(np.float64) - v
        elif kind == "bf16":
            b = _bf16(v32).astype(np.float64) - v
        elif kind == "terngrad":
            sc = stats[li]
            s = float(np.float32(shared[li])) if shared is not None else float(sc.scaler[0])
            if s > 0:
                p = np.minimum(np.minimum(a, float(sc.clip_bound[0])) / s, 1.0)
                b = np.sign(v) * s * p - v
                var += s * s * float(np.sum(p * (1 - p)))
        elif kind == "scaled_sign":
            c = float(np.float32(s_mod.l1_norm(v32) / v.size)) if v.size else 0.0
            b = c * np.sign(v) - v
        elif kind == "topk":
            kept = np.zeros(v.size, bool)
            kept[k_mod.top_k_indices(np.abs(v32), codec.kept(v.size))] = True
            b = np.where(kept, 0.0, -v)
        elif kind == "randomk":
            p = codec.probabilities(v32)
            x = p < 1
            if x.any():
                pt = np.minimum(np.ceil(p[x] * k_mod.GRID), k_mod.GRID) / k_mod.GRID
                nz = pt > 0
                var += float(np.sum(v[x][nz] ** 2 * (1 / pt[nz] - 1)))
        elif kind == "qsgd":
            s, B = codec.levels, codec.bucket or v.size
            norms = q_mod.bucket_norms(a, codec.bucket, codec.norm).astype(np.float64)
            nb = np.repeat(norms, B)[:v.size]
            r = np.where(nb > 0, s * a / np.where(nb > 0, nb, 1.0), 0.0)
            f = r - np.floor(r)
            var += float(np.sum((nb / s) ** 2 * f * (1 - f)))
        elif kind == "suresh":
            k = codec.levels
            y = r_mod.rotate(v, StreamKey(key[0], key[1], w, li)) if codec.rotate else v
            lo, hi = r_mod.outward_range(y)
            step = r_mod.spacing(lo, hi, k)
            if step > 0:
                x = np.minimum((y - float(lo)) / step, k - 1)
                f = x - np.floor(x)
                var += step * step * float(np.sum(f * (1 - f))) * (v.size / y.size)
        bias.append(b)
    return np.concatenate(bias), var


# ---------------------------------------------------------------------------------------------
# payload size and the knob search
# ---------------------------------------------------------------------------------------------
def payload_bits(codec, layers: dict, w: int = 0) -> float:
    """8 len(message.to_bytes()) / n of worker w's message (step 0)."""
    one = {k: np.ascontiguousarray(v[w:w + 1]) for k, v in layers.items()}
    stats = codec.prepare_many(one)
    shared = codec.local_scalers_many(stats, 1).max(axis=0) if codec.properties.shared_stats else None
    msg = codec.encode_many(one, 0, 0, np.array([w]), shared, stats)[0]
    return 8 * len(msg.to_bytes()) / sum(int(np.prod(v.shape[1:])) for v in layers.values())


def _candidates(spec: Spec) -> list[dict]:
    if spec.knob == "qsgd":
        out = [dict(levels=2**b - 1, bucket=B, coding="fixed") for b in range(1, 16) for B in (0, 8192, 2048, 512, 128)]
        return out + [dict(levels=s, bucket=B, coding="elias") for s in (1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256,
                                                                         1024, 4096, 16384, 65535)
                      for B in (0, 8192, 2048, 512)]
    if spec.knob == "levels":
        return [dict(levels=2**b) for b in range(1, 17)]
    return []


def _sparse_bits(label: str, layers: dict, density: float) -> float:
    """topk: the real payload of worker 0; randomk: its mean, 8 message_bytes(k_n per layer) / n (the
    count of kept elements is random with mean k_n; one draw's size would make the search noisy)."""
    codec = make_codec(label, dict(density=density))
    if label == "topk":
        return payload_bits(codec, layers)
    from tgsim.codecs.sparse import message_bytes

    sizes = [int(np.prod(v.shape[1:])) for v in layers.values()]
    return 8 * message_bytes([codec.kept(n) for n in sizes], sizes) / sum(sizes)


def _density_for(label: str, layers: dict, budget: float) -> tuple[dict | None, float]:
    """The largest density whose payload is <= budget (1 + TOL) (bisection on the size), or None;
    randomk's mean payload <= budget (1 + TOL/2), so that the random sizes' mean stays within B (1 + TOL)."""
    lo, hi = 1e-6, 1.0
    bits = lambda d: _sparse_bits(label, layers, d)   # noqa: E731
    limit = budget * (1 + (TOL / 2 if label == "randomk" else TOL))
    b_lo = bits(lo)
    if b_lo > limit:
        return None, b_lo
    if bits(hi) <= limit:
        return dict(density=hi), bits(hi)
    for _ in range(30):
        mid = math.sqrt(lo * hi)
        if bits(mid) <= limit:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.0005:
            break
    return dict(density=lo), bits(lo)


def choose(label: str, layers: dict, budgets=BUDGETS) -> dict:
    """{budget: (knob dict, bits) or (None, why)} for one codec on one kind of vector (worker 0's)."""
    spec_ = spec(label)
    if spec_.na:
        return {B: (None, spec_.na) for B in budgets}
    if spec_.knob is None:
        bits = payload_bits(make_codec(label), layers)
        own = next((B for B in budgets if bits <= B * (1 + TOL)), None)
        out = {B: (None, f"n/a: fixed rate {bits:.3g} bits/element") for B in budgets}
        out[own if own is not None else float(round(bits))] = ({}, bits)
        return out
    if spec_.knob == "density":
        out = {}
        for B in budgets:
            knob, bits = _density_for(label, layers, B)
            out[B] = (knob, bits) if knob is not None else (None, f"n/a: one element per layer takes {bits:.3g} bits")
        return out
    cands = []
    for knob in _candidates(spec_):
        try:
            codec = make_codec(label, knob)
        except ValueError:
            continue
        bits = payload_bits(codec, layers)
        b, var = exact_terms(label, codec, layers, 0, key=(0, 0))
        cands.append((knob, bits, float(b @ b) + var))
    out = {}
    for B in budgets:
        ok = [c for c in cands if c[1] <= B * (1 + TOL)]
        out[B] = (min(ok, key=lambda c: c[2])[:2] if ok else
                  (None, f"n/a: the smallest payload is {min(c[1] for c in cands):.3g} bits/element"))
    return out


# ---------------------------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------------------------
def measure(label: str, knob: dict, layers: dict, identical: bool, R: int, seed: int, workers=WORKERS,
            exact=True) -> list[dict]:
    """One row per N: measured and exact MSE of the N-worker average (module docstring)."""
    from scipy import stats as st

    exact = exact and label in SPECS          # a plugin has no exact formula here
    codec = make_codec(label, knob)
    W = max(workers)
    ids = np.arange(W)
    V = np.stack([_flat(layers, w) for w in range(W)])
    rounds = 1 if spec(label).deterministic else R
    shares = codec.properties.shared_stats is not None
    groups = {N: V.reshape(W // N, N, -1).mean(axis=1) for N in workers}
    norm2 = {N: np.einsum("gi,gi->g", t, t) for N, t in groups.items()}
    allstats = codec.prepare_many(layers)
    local = codec.local_scalers_many(allstats, W) if shares else None
    meas = {N: [] for N in workers}
    rel = {N: [] for N in workers}
    ex = {N: [] for N in workers}
    bits = []
    const = {}
    for r in range(rounds):
        for N in (workers if shares else (None,)):
            shared = None if N is None else np.repeat(local.reshape(W // N, N, -1).max(axis=1), N, axis=0)
            msgs = [m for g in range(W // (N or W)) for m in codec.encode_many(
                {k: v[g * (N or W):(g + 1) * (N or W)] for k, v in layers.items()}, seed, r,
                ids[g * (N or W):(g + 1) * (N or W)], None if shared is None else shared[g * N], None)]
            bits += [8 * len(m.to_bytes()) / V.shape[1] for m in msgs]
            D = np.stack([_flat(codec.decode(m)) for m in msgs])
            for M in (workers if N is None else (N,)):
                avg = (D.reshape(W // M, M, -1).sum(axis=1) * (1.0 / M)).astype(np.float32).astype(np.float64)
                e = np.einsum("gi,gi->g", avg - groups[M], avg - groups[M])
                meas[M].append(float(e.mean()))
                rel[M].append(float(np.mean(e / norm2[M])))
                if not exact:
                    continue
                rot = label == "suresh-rot"
                if (M, shared is None) in const and not rot:
                    ex[M].append(const[(M, shared is None)])
                    continue
                terms = []
                for w in range(1 if identical and not rot else W):
                    sh = None if shared is None else shared[w]
                    terms.append(exact_terms(label, codec, layers, w, sh, key=(seed, r)))
                if len(terms) == 1:
                    terms *= W
                bsum = np.stack([t[0] for t in terms]).reshape(W // M, M, -1).mean(axis=1)
                vsum = np.array([t[1] for t in terms]).reshape(W // M, M).sum(axis=1) / M**2
                val = (float(np.mean(np.einsum("gi,gi->g", bsum, bsum) + vsum)),
                       float(np.mean((np.einsum("gi,gi->g", bsum, bsum) + vsum) / norm2[M])))
                const[(M, shared is None)] = val
                ex[M].append(val)
    rows = []
    for N in workers:
        x, xr = np.array(meas[N]), np.array(rel[N])
        e = np.array([v[0] for v in ex[N]]) if exact else np.full(x.size, np.nan)
        er = np.array([v[1] for v in ex[N]]) if exact else np.full(x.size, np.nan)
        if x.size > 1:
            t = float(st.t.ppf(1 - ALPHA / 2, x.size - 1))
            h, hr = t * x.std(ddof=1) / math.sqrt(x.size), t * xr.std(ddof=1) / math.sqrt(x.size)
            d = x - e
            se = d.std(ddof=1) / math.sqrt(d.size)
            z = float(d.mean() / se) if se > 0 else (0.0 if d.mean() == 0 else math.copysign(math.inf, d.mean()))
            p = float(2 * st.t.sf(abs(z), d.size - 1)) if math.isfinite(z) else 0.0
        else:
            h = hr = 0.0
            z = 0.0 if math.isclose(x.mean(), e.mean(), rel_tol=1e-6, abs_tol=1e-30) else math.inf
            p = 1.0 if z == 0.0 else 0.0
        if not exact:                       # nothing to test the measured MSE against
            z = p = float("nan")
        rows.append(dict(workers=N, R=int(x.size), mse=float(x.mean()), mse_lo=float(x.mean() - h),
                         mse_hi=float(x.mean() + h), exact_mse=float(e.mean()), rel_mse=float(xr.mean()),
                         rel_mse_lo=float(xr.mean() - hr), rel_mse_hi=float(xr.mean() + hr),
                         exact_rel_mse=float(er.mean()), z=z, p_value=p, bits_per_element=float(np.mean(bits)),
                         bits_max=float(np.max(bits))))
    return rows


# ---------------------------------------------------------------------------------------------
# the comparison
# ---------------------------------------------------------------------------------------------
def run(out=DEFAULT_OUT, *, codecs=CODECS, kinds=KINDS, budgets=BUDGETS, workers=WORKERS, n: int = 1 << 15,
        R: int = 30, seed: int = 0, recorded_steps: int = 50, quiet: bool = False) -> dict[str, pd.DataFrame]:
    """Every (codec, budget, N, kind): variance.csv and variance.png in `out` (None: nothing written)."""
    from tqdm import tqdm

    from tgsim.analysis.common import single_thread

    t0 = time.perf_counter()
    rows = []
    with single_thread():
        data = vectors(kinds, n, seed, max(workers), recorded_steps)
        jobs = [(kind, label) for kind in kinds for label in codecs]
        for kind, label in tqdm(jobs, desc="compare variance", unit="codec", disable=quiet or None):
            layers, identical = data[kind]
            spec_ = spec(label)
            size = int(sum(np.prod(v.shape[1:]) for v in layers.values()))
            for B, (knob, info) in choose(label, layers, budgets).items():
                base = dict(kind=kind, codec=label, budget=B, unbiased=spec_.unbiased,
                            deterministic=spec_.deterministic, n=size, seed=seed)
                if knob is None:
                    rows += [dict(base, workers=N, status=info, knob="") for N in workers]
                    continue
                text = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in knob.items())
                for r in measure(label, knob, layers, identical, R, seed, workers):
                    rows.append(dict(base, status="ok", knob=text, **r))
    df = pd.DataFrame(rows).reindex(columns=COLUMNS)
    res = {"variance": df}
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        df.to_csv(out / "variance.csv", index=False)
        figure(df, out / "variance.png")
    if not quiet:
        print_summary(df, out, time.perf_counter() - t0)
    return res


def reach_terngrad(df: pd.DataFrame, N: int = 1) -> pd.DataFrame:
    """Per kind and codec with a knob: the smallest budget at which its relative MSE (N workers) is at
    most TernGrad's (2 bits), or nan."""
    ok = df[(df.status == "ok") & (df.workers == N)]
    rows = []
    for kind, g in ok.groupby("kind", sort=False):
        tg = g[g.codec == "terngrad"]
        if tg.empty:
            continue
        ref = float(tg.rel_mse.iloc[0])
        for codec, c in g.groupby("codec", sort=False):
            if spec(codec).knob is None:
                continue
            hit = c[c.rel_mse <= ref].sort_values("budget")
            rows.append(dict(kind=kind, codec=codec, terngrad_rel_mse=ref,
                             budget=float(hit.budget.iloc[0]) if len(hit) else float("nan"),
                             bits=float(hit.bits_per_element.iloc[0]) if len(hit) else float("nan")))
    return pd.DataFrame(rows)


def figure(df: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    d = df[(df.status == "ok") & (df.rel_mse > 0)].drop_duplicates(["kind", "codec", "workers", "knob"])
    sns.set_theme(style="whitegrid", context="paper")
    g = sns.relplot(data=d, x="bits_per_element", y="rel_mse", hue="codec", style="codec", row="workers",
                    col="kind", kind="line", markers=True, dashes=False, height=2.6, aspect=1.1,
                    facet_kws=dict(sharey=False), errorbar=None)
    g.set(xscale="log", yscale="log")
    g.set_axis_labels("bits per element (measured payload)", "MSE / ||v||^2 of the N-worker mean")
    g.set_titles("{col_name}, N = {row_name}")
    g.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(g.figure)


def print_summary(df: pd.DataFrame, out, seconds: float) -> None:
    ok = df[df.status == "ok"]
    pd.set_option("display.width", 200)
    for kind in [k for k in ("gaussian", "mnist1d") if k in set(ok.kind)] or list(ok.kind.unique()[:1]):
        t = ok[(ok.kind == kind) & (ok.workers == ok.workers.min())]
        piv = t.pivot_table(index="codec", columns="budget", values="rel_mse", aggfunc="first")
        print(f"\n{kind}: MSE / ||v||^2 of the mean of N = {int(t.workers.min())} by bit budget (blank: n/a):")
        print(piv.map(lambda v: f"{v:.3g}").replace("nan", "").to_string())
    unb = ok[ok.unbiased & ~ok.deterministic & (ok.R > 1) & ok.p_value.notna()]   # nan: no exact formula (plugins)
    m = len(unb)
    if m:
        out95 = int((unb.p_value < ALPHA).sum())
        print(f"\nunbiased codecs: exact formula outside the measured 95 % interval in {out95} "
              f"of {m} rows; outside at family-wise {ALPHA} (Bonferroni, p < {ALPHA / m:.1e}): "
              f"{int((unb.p_value < ALPHA / m).sum())}")
    reach = reach_terngrad(df)
    if len(reach):
        print("\nbits per element at which each codec's relative MSE (N = 1) reaches TernGrad's (2 bits):")
        print(reach.pivot(index="codec", columns="kind", values="budget").to_string())
    na = df[df.status.str.startswith("n/a")].drop_duplicates(["kind", "codec", "budget"])
    print(f"\nn/a rows: {len(na)} (codec x budget x kind; see the status column)")
    if out is not None:
        print(f"wrote {out}/variance.csv, {out}/variance.png ({seconds:.0f} s)")
