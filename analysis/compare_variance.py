"""`tgsim compare variance`: the mean squared error of the N-worker average at equal bits per element,
measured through the registered codecs and compared with its exact formula.

Budgets B in {1, 1.6, 2, 4, 8, 16} bits per element. A codec meets B when its REAL payload, 8 ·
len(message.to_bytes()) / n (frame header, per-layer scalars, norms, indices and padding included),
is at most B (1 + TOL), TOL = 5 %, for every codec: the framing (header, per-layer scalars, padding)
costs 0.5-1 % on a 2^15-element vector and 3-4 % on the convnet's 8 layers (terngrad 2.06 bits, base3
1.66, suresh's 1-bit levels 1.03).

Codecs: every registered codec (tgsim.codecs.registry: built-ins and plugins) at its default
options, or labels NAME[key=value;...] that fix some options (`--codecs`, e.g. a figure's
selection). Knobs are the codec's options with "sweep" metadata (its `Options`,
tgsim.codecs.options) that the label leaves free, searched on the measured size (worker 0's
message): every combination of the discrete knobs' values (e.g. qsgd's levels x bucket x coding,
suresh's levels); a knob of fractions (topk/randomk's density) by bisection to the largest value
whose payload is <= B (1 + TOL). Among the candidates that meet B the one with the least exact error
is taken (a codec without an exact formula here, a plugin: the least mean error over 4 seeds). A
codec whose bytes differ between seeds and whose size is random (randomk) is searched on its mean
payload within B (1 + TOL/2), so that the mean of the random sizes stays within B (1 + TOL); the
rows report the measured mean and maximum over all draws. Codecs without knobs (fp32 32, fp16/bf16
16, terngrad 2 (2bit; the label terngrad[packing=base3]: 1.6), scaled_sign 1; 2 for a vector with
zeros: it then also sends a nonzero plane) appear at the smallest budget they meet, fp32 at its own
32; every other (codec, budget) is a row with status "n/a: ...", as is a codec whose server takes a
majority vote (properties.combine, signSGD: ±1 without a magnitude estimates no mean, so an MSE
against v says nothing) or that keeps state between steps (properties.stateful or rounds > 1: one
step's error depends on it). A codec whose best knob under B is that of a lower budget is listed
with it again (measured once); the figure draws it once. `deterministic` (one round instead of R) is
measured: two seeds encode the same bytes.

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
codec, panels N x kind; fp32's MSE of 0 cannot be drawn and is listed in the CSV). Column codec_options:
every option of the row's codec at its knob, defaults filled in (tgsim.analysis.common.codec_options).
"""

from __future__ import annotations

import dataclasses
import functools
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
COLUMNS = ["kind", "codec", "codec_options", "budget", "workers", "status", "knob", "bits_per_element", "bits_max",
           "R", "mse", "mse_lo", "mse_hi", "exact_mse", "rel_mse", "rel_mse_lo", "rel_mse_hi", "exact_rel_mse", "z",
           "p_value", "unbiased", "deterministic", "n", "seed"]


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str                  # registered codec (built-in, plugin or "package.module:Class")
    fixed: dict                # the [codec] options its label fixes (NAME[key=value;...])
    knobs: dict                # {option: values} searched: the codec's "sweep" options not fixed by the label
    deterministic: bool        # two seeds encode the same bytes (measured once, at the fixed options)
    unbiased: bool             # properties.unbiased of the codec at its fixed options
    na: str = ""               # why it is never compared


def default_codecs() -> tuple[str, ...]:
    """Every registered codec (built-ins, then plugins) at its default options, its knobs searched."""
    from tgsim.codecs import registry

    return tuple(registry.names())


def _deterministic(codec) -> bool:
    """Whether two seeds encode a fixed 64-element vector to the same bytes."""
    v = {"g": np.linspace(-1.0, 1.0, 64, dtype=np.float32)[None] * np.float32(1e-2)}
    stats = codec.prepare_many(v)
    shared = codec.local_scalers_many(stats, 1).max(axis=0) if codec.properties.shared_stats else None
    one = [codec.encode_many(v, seed, 0, np.array([0]), shared, stats)[0].to_bytes() for seed in (0, 1)]
    return one[0] == one[1]


@functools.lru_cache(maxsize=None)
def spec(label: str) -> Spec:
    """The Spec of a codec label NAME[key=value;...] (tgsim.analysis.common.split_label): from the
    registry, its unbiasedness as declared, its knobs the "sweep" options of its Options that the
    label leaves free; a codec whose server takes a majority vote (properties.combine) estimates no
    mean and is n/a, as is a stateful or multi-round codec (properties.stateful, rounds).
    ValueError naming the registered codecs (or the codec's keys) otherwise."""
    from tgsim.analysis.common import split_label
    from tgsim.codecs import options, registry

    name, fixed, ef, local = split_label(label)
    if ef or local:
        raise ValueError(f"codec {label!r}: compare variance encodes single steps; '+ef'/'+pqasgd' do not apply")
    try:
        cls = registry.codec_class(name)
        codec = registry.make(name, **fixed)
    except ValueError as e:
        raise ValueError(f"unknown codec {label!r}: {e}") from e
    knobs = {k: v for k, v in options.sweeps(cls).items() if k not in fixed}
    props = codec.properties
    na = "" if props.combine == "mean" else (f"n/a: combine {props.combine!r} (the server's vote) estimates no mean, "
                                             "so an MSE against v says nothing")
    if not na and (props.stateful or getattr(props, "rounds", 1) > 1):
        na = ("n/a: a stateful or multi-round codec: one step's encoding depends on the state it carries "
              "between steps, so a single step's MSE is not its error")
    return Spec(name, fixed, knobs, _deterministic(codec) if not na else True, bool(props.unbiased), na=na)


def make_codec(label: str, knob: dict | None = None):
    from tgsim.codecs import registry

    spec_ = spec(label)
    return registry.make(spec_.name, **{**spec_.fixed, **(knob or {})})


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
    from tgsim.analysis.common import baseline, trajectory
    from tgsim.train.config import from_dict

    cfg = from_dict({"run": {"name": "compare-variance", "seed": seed, "steps": steps},
                     "data": {"name": "mnist1d"}, "model": {"name": "convnet1d"},
                     "workers": {"n": workers, "batch": 32, "batch_mode": "per_worker"},
                     "codec": {"name": baseline()}, "exchange": {"mode": "allreduce"},
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


def formula(codec) -> str | None:
    """Which exact formula of the module docstring applies to `codec`, by its class (None: none; a
    plugin is measured without one): "exact" (float32), "half", "bfloat16", "ternary", "mean_sign",
    "top", "random_sparse", "buckets" (QSGD) or "levels" (Suresh et al.)."""
    from tgsim.codecs import bf16, fp16, fp32, qsgd, sign, sparse, suresh
    from tgsim.codecs.terngrad import TernGrad

    for cls, kind in ((fp32.Float32, "exact"), (fp16.Float16, "half"), (bf16.BFloat16, "bfloat16"),
                      (TernGrad, "ternary"), (sign.ScaledSign, "mean_sign"), (sparse.TopK, "top"),
                      (sparse.RandomK, "random_sparse"), (qsgd.QSGD, "buckets"), (suresh.Suresh, "levels")):
        if type(codec) is cls:
            return kind
    return None


def exact_terms(label: str, codec, layers: dict, w: int, shared=None, key=None) -> tuple[np.ndarray, float]:
    """(b_w flat float64, σ_w^2) of worker w's encoding (module docstring). shared: (L,) float32 scalers
    of its group (terngrad); key: (seed, step) for the rotation of suresh-rot."""
    from tgsim.codecs import qsgd as q_mod, sign as s_mod, sparse as k_mod, suresh as r_mod
    from tgsim.rng import StreamKey

    kind = formula(codec)
    if kind is None:
        raise ValueError(f"codec {label!r} ({type(codec).__name__}) has no exact formula here")
    bias, var = [], 0.0
    stats = codec.prepare_many({k: v[w:w + 1] for k, v in layers.items()}) if kind == "ternary" else None
    for li, (name, g) in enumerate(layers.items()):
        v32 = np.ascontiguousarray(g[w], dtype=np.float32).reshape(-1)
        v = v32.astype(np.float64)
        a = np.abs(v)
        b = np.zeros_like(v)
        if kind == "half":
            b = v32.astype(np.float16).astype(np.float64) - v
        elif kind == "bfloat16":
            b = _bf16(v32).astype(np.float64) - v
        elif kind == "ternary":
            sc = stats[li]
            s = float(np.float32(shared[li])) if shared is not None else float(sc.scaler[0])
            if s > 0:
                p = np.minimum(np.minimum(a, float(sc.clip_bound[0])) / s, 1.0)
                b = np.sign(v) * s * p - v
                var += s * s * float(np.sum(p * (1 - p)))
        elif kind == "mean_sign":
            c = float(np.float32(s_mod.l1_norm(v32) / v.size)) if v.size else 0.0
            b = c * np.sign(v) - v
        elif kind == "top":
            kept = np.zeros(v.size, bool)
            kept[k_mod.top_k_indices(np.abs(v32), codec.kept(v.size))] = True
            b = np.where(kept, 0.0, -v)
        elif kind == "random_sparse":
            p = codec.probabilities(v32)
            x = p < 1
            if x.any():
                pt = np.minimum(np.ceil(p[x] * k_mod.GRID), k_mod.GRID) / k_mod.GRID
                nz = pt > 0
                var += float(np.sum(v[x][nz] ** 2 * (1 / pt[nz] - 1)))
        elif kind == "buckets":
            s, B = codec.levels, codec.bucket or v.size
            norms = q_mod.bucket_norms(a, codec.bucket, codec.norm).astype(np.float64)
            nb = np.repeat(norms, B)[:v.size]
            r = np.where(nb > 0, s * a / np.where(nb > 0, nb, 1.0), 0.0)
            f = r - np.floor(r)
            var += float(np.sum((nb / s) ** 2 * f * (1 - f)))
        elif kind == "levels":
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
def payload_bits(codec, layers: dict, w: int = 0, seed: int = 0) -> float:
    """8 len(message.to_bytes()) / n of worker w's message (step 0, `seed`)."""
    one = {k: np.ascontiguousarray(v[w:w + 1]) for k, v in layers.items()}
    stats = codec.prepare_many(one)
    shared = codec.local_scalers_many(stats, 1).max(axis=0) if codec.properties.shared_stats else None
    msg = codec.encode_many(one, seed, 0, np.array([w]), shared, stats)[0]
    return 8 * len(msg.to_bytes()) / sum(int(np.prod(v.shape[1:])) for v in layers.values())


def _float_knob(spec: Spec) -> str | None:
    """The knob searched by bisection: an option whose sweep values are fractions (floats), or None."""
    for key, values in spec.knobs.items():
        if all(isinstance(v, float) for v in values):
            return key
    return None


def _candidates(spec: Spec) -> list[dict]:
    """Every combination of the discrete knobs' sweep values (the float knob is bisected instead)."""
    import itertools

    fl = _float_knob(spec)
    keys = [k for k in spec.knobs if k != fl]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(spec.knobs[k] for k in keys))]


def _mean_bits(label: str, layers: dict, knob: dict) -> float:
    """The payload of worker 0 for a codec that draws the same bytes for every seed; else its mean size:
    random sparsification, 8 message_bytes(k_n per layer) / n (the count of kept elements is random
    with mean k_n); another stochastic codec, the mean over seeds 0..3."""
    from tgsim.codecs.sparse import RandomK, message_bytes

    codec = make_codec(label, knob)
    if spec(label).deterministic:
        return payload_bits(codec, layers)
    sizes = [int(np.prod(v.shape[1:])) for v in layers.values()]
    if type(codec) is RandomK:
        return 8 * message_bytes([codec.kept(n) for n in sizes], sizes) / sum(sizes)
    return float(np.mean([payload_bits(codec, layers, seed=s) for s in range(4)]))


def _bisect(label: str, layers: dict, budget: float, key: str, fixed: dict) -> tuple[dict | None, float]:
    """The largest value of the fraction knob `key` whose payload is <= budget (1 + TOL) (bisection on
    the size), or None; a codec with random sizes: its mean payload <= budget (1 + TOL/2), so that the
    random sizes' mean stays within B (1 + TOL)."""
    lo, hi = 1e-6, 1.0
    bits = lambda d: _mean_bits(label, layers, {**fixed, key: d})   # noqa: E731
    limit = budget * (1 + (TOL if spec(label).deterministic else TOL / 2))
    b_lo = bits(lo)
    if b_lo > limit:
        return None, b_lo
    if bits(hi) <= limit:
        return {**fixed, key: hi}, bits(hi)
    for _ in range(30):
        mid = math.sqrt(lo * hi)
        if bits(mid) <= limit:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.0005:
            break
    return {**fixed, key: lo}, bits(lo)


def choose(label: str, layers: dict, budgets=BUDGETS) -> dict:
    """{budget: (knob dict, bits) or (None, why)} for one codec on one kind of vector (worker 0's):
    a codec without knobs at the smallest budget its fixed rate meets; with knobs, per budget the
    candidate of least exact error among those that meet it (a fraction knob: the largest value that
    meets it, per combination of the other knobs; a codec without a formula: the least mean error
    over 4 seeds, `_error`)."""
    spec_ = spec(label)
    if spec_.na:
        return {B: (None, spec_.na) for B in budgets}
    if not spec_.knobs:
        bits = payload_bits(make_codec(label), layers)
        own = next((B for B in budgets if bits <= B * (1 + TOL)), None)
        out = {B: (None, f"n/a: fixed rate {bits:.3g} bits/element") for B in budgets}
        out[own if own is not None else float(round(bits))] = ({}, bits)
        return out
    fl = _float_knob(spec_)
    if fl is not None:
        out = {}
        for B in budgets:
            found = [_bisect(label, layers, B, fl, base) for base in _candidates(spec_)]
            ok = [f for f in found if f[0] is not None]
            if not ok:
                out[B] = (None, f"n/a: one element per layer takes {min(f[1] for f in found):.3g} bits")
            else:
                out[B] = min(ok, key=lambda f: _error(label, f[0], layers)) if len(ok) > 1 else ok[0]
        return out
    cands = []
    for knob in _candidates(spec_):
        try:
            codec = make_codec(label, knob)
        except ValueError:
            continue
        bits = payload_bits(codec, layers)
        cands.append((knob, bits, _error(label, knob, layers, codec)))
    out = {}
    for B in budgets:
        ok = [c for c in cands if c[1] <= B * (1 + TOL)]
        out[B] = (min(ok, key=lambda c: c[2])[:2] if ok else
                  (None, f"n/a: the smallest payload is {min(c[1] for c in cands):.3g} bits/element"))
    return out


def _error(label: str, knob: dict, layers: dict, codec=None, draws: int = 4) -> float:
    """||b||^2 + σ^2 of worker 0's encoding (exact_terms); a codec without a formula here: the mean of
    ||decode(encode(v)) - v||^2 over seeds 0..draws-1 (its expectation is the same quantity)."""
    codec = codec or make_codec(label, knob)
    if formula(codec) is not None:
        b, var = exact_terms(label, codec, layers, 0, key=(0, 0))
        return float(b @ b) + var
    one = {k: np.ascontiguousarray(v[:1]) for k, v in layers.items()}
    v = _flat(one, 0)
    stats = codec.prepare_many(one)
    shared = codec.local_scalers_many(stats, 1).max(axis=0) if codec.properties.shared_stats else None
    errs = []
    for seed in range(draws):
        d = _flat(codec.decode(codec.encode_many(one, seed, 0, np.array([0]), shared, stats)[0])) - v
        errs.append(float(d @ d))
    return float(np.mean(errs))


# ---------------------------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------------------------
def measure(label: str, knob: dict, layers: dict, identical: bool, R: int, seed: int, workers=WORKERS,
            exact=True) -> list[dict]:
    """One row per N: measured and exact MSE of the N-worker average (module docstring)."""
    from scipy import stats as st

    codec = make_codec(label, knob)
    exact = exact and formula(codec) is not None          # a plugin has no exact formula here
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
                rot = bool(getattr(codec, "rotate", False))     # the rotation is drawn per round
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
def run(out=DEFAULT_OUT, *, codecs=None, kinds=KINDS, budgets=BUDGETS, workers=WORKERS, n: int = 1 << 15,
        R: int = 30, seed: int = 0, recorded_steps: int = 50, quiet: bool = False) -> dict[str, pd.DataFrame]:
    """Every (codec, budget, N, kind): variance.csv and variance.png in `out` (None: nothing written).
    codecs: labels (NAME[key=value;...]); None: every registered codec (default_codecs)."""
    from tqdm import tqdm

    from tgsim.analysis.common import codec_options, single_thread

    t0 = time.perf_counter()
    rows = []
    codecs = default_codecs() if codecs is None else tuple(codecs)
    with single_thread():
        data = vectors(kinds, n, seed, max(workers), recorded_steps)
        jobs = [(kind, label) for kind in kinds for label in codecs]
        measured: dict = {}
        for kind, label in tqdm(jobs, desc="compare variance", unit="codec", disable=quiet or None):
            layers, identical = data[kind]
            spec_ = spec(label)
            size = int(sum(np.prod(v.shape[1:]) for v in layers.values()))
            for B, (knob, info) in choose(label, layers, budgets).items():
                base = dict(kind=kind, codec=label, codec_options=codec_options(label), budget=B,
                            unbiased=spec_.unbiased, deterministic=spec_.deterministic, n=size, seed=seed)
                if knob is None:
                    rows += [dict(base, workers=N, status=info, knob="") for N in workers]
                    continue
                text = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in knob.items())
                if (kind, label, text) not in measured:        # the same knob at several budgets: measured once
                    measured[(kind, label, text)] = measure(label, knob, layers, identical, R, seed, workers)
                for r in measured[(kind, label, text)]:
                    rows.append(dict(base, status="ok", knob=text, codec_options=codec_options(label, knob), **r))
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
    most that of the default codec (registry.DEFAULT, TernGrad) at its least bits, or nan."""
    from tgsim.codecs import registry

    ok = df[(df.status == "ok") & (df.workers == N)]
    rows = []
    for kind, g in ok.groupby("kind", sort=False):
        tg = g[g.codec == registry.DEFAULT].sort_values("budget")
        if tg.empty:
            continue
        ref = float(tg.rel_mse.iloc[0])
        for codec, c in g.groupby("codec", sort=False):
            if not spec(codec).knobs:
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
