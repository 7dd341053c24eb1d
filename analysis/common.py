"""Shared pieces of the analysis checks: gradient shapes, trajectories, TernGrad moments, CSV output.

Gradient shapes
    ``synthetic_gradient(kind, n, seed)`` for kind in SYNTHETIC_SHAPES (Gaussian, Student-t with 3
    degrees of freedom, log-normal magnitudes with random signs, sparse: 95 % exact zeros) and
    ``recorded_gradients(...)``: one worker's per-layer gradients of an MLP trained for a few steps
    on scikit-learn's digits with fp32 SGD (the training loop of tgsim.train, unchanged).

Trajectories
    ``trajectory(cfg, steps, on_step)`` drives ``tgsim.train.loop.build`` + ``train_step`` and calls
    ``on_step(t, setup, params, grads)`` *before* each step with the per-worker mini-batch gradients
    at the current parameters (``grads[name]`` has the worker axis first). They are the gradients
    that ``train_step`` uses at that step: batches are a pure function of (seed, step, worker) and
    the model is deterministic, so computing them twice gives the same bits.

TernGrad moments (docs/THEORY.md §1), vectorized over a leading axis
    ``terngrad_scaling(g, clip, c)`` -> (s, bound) per row, with the codec's own rule
    (``scaling_from_moments``); ``terngrad_second_moment`` = E||Q(g)||^2 = s Σ_k min(x_k, s),
    x_k = min(|g_k|, bound) (= s ||g||_1 without clipping); ``terngrad_error`` = E||Q(g) - g||^2.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from tgsim.codecs.fp32 import Float32
from tgsim.codecs.terngrad import TernGrad
from tgsim.codecs.terngrad.quantizer import scaling_from_moments

# the two codecs the TernGrad analyses (bound, convergence, assumption1, clipping) train and compare,
# by their classes' registered names: the exact float32 mean and TernGrad
FP32, TERNGRAD = Float32.name, TernGrad.name

DEFAULT_OUT = Path("results/analysis")
SYNTHETIC_SHAPES = ("gaussian", "student_t3", "lognormal", "sparse")
_SHAPE_TAG = {"gaussian": 11, "student_t3": 12, "lognormal": 13, "sparse": 14}


# ---------------------------------------------------------------------------------------------
# gradient shapes
# ---------------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------------
# comparison labels: every registered codec, its options and its declared knobs (tgsim.codecs.registry)
# ---------------------------------------------------------------------------------------------
LOCAL_VARIANTS = {"pqasgd": {"local": "pqasgd", "every": 4}}   # "+pqasgd": the model difference every 4 steps
EF_SUFFIX = "+ef"


def split_label(label: str) -> tuple[str, dict, bool, str | None]:
    """(codec name, its options, error feedback, local variant) of a comparison label

        NAME[key=value;key=value][+ef][+pqasgd]

    NAME a registered codec (built-in or plugin) or "package.module:Class"; the bracket its [codec]
    options (values read as TOML; "," also separates them); "+ef" wraps it in error feedback;
    "+pqasgd" sends the model difference through it every 4 steps (LOCAL_VARIANTS). ValueError for a
    malformed label."""
    import tomllib

    rest, local = label, None
    for variant in LOCAL_VARIANTS:
        if rest.endswith("+" + variant):
            rest, local = rest[:-len(variant) - 1], variant
    ef = rest.endswith(EF_SUFFIX)
    if ef:
        rest = rest[:-len(EF_SUFFIX)]
    opts: dict = {}
    if rest.endswith("]"):
        if "[" not in rest:
            raise ValueError(f"method {label!r}: ']' without '['")
        rest, _, body = rest[:-1].partition("[")
        for item in body.replace(";", ",").split(","):
            if not item.strip():
                continue
            key, sep, raw = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"method {label!r}: option {item!r} must read key=value")
            try:
                value = tomllib.loads(f"v = {raw.strip()}")["v"]
            except tomllib.TOMLDecodeError:
                value = raw.strip()         # a bare string
            opts[key.strip()] = value
    if not rest:
        raise ValueError(f"method {label!r}: no codec name")
    return rest, opts, ef, local


def split_list(text: str) -> tuple[str, ...]:
    """A comma-separated list of labels; commas inside a label's [options] do not split it."""
    out, depth, cur = [], 0, ""
    for ch in str(text):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return tuple(x.strip() for x in out if x.strip())


def method_sections(method: str) -> tuple[dict, dict]:
    """(flat [codec] section, [exchange] additions) of a comparison label (`split_label`), its codec
    looked up in the registry and its options checked against the codec's Options (ValueError naming
    the registered codecs, or the codec and its keys)."""
    from tgsim.codecs import options, registry

    name, opts, ef, local = split_label(method)
    try:
        cls = registry.codec_class(name)
        options.parse(cls, registry.default_config(name, **opts))
    except ValueError as e:
        raise ValueError(f"method {method!r}: {e}") from e
    section = {"name": name, **opts, **({"error_feedback": True} if ef else {})}
    return section, dict(LOCAL_VARIANTS[local]) if local else {}


OPTIONS_COLUMN = "codec_options"       # the compare tables' column of each row's resolved codec options


def _option_text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_option_text(x) for x in v) + "]"
    return str(v)


@functools.lru_cache(maxsize=None)
def _codec_options(label: str, knob: tuple) -> str:
    from tgsim.codecs import options, registry

    name, opts, _, _ = split_label(label)
    cfg = registry.default_config(name, **{**opts, **dict(knob)})
    return ";".join(f"{k}={_option_text(v)}" for k, v in
                    sorted(options.resolved(registry.codec_class(name), cfg).items()))


def codec_options(label: str, knob: dict | None = None) -> str:
    """Every option of the codec of comparison label `label` (`split_label`), the label's values and
    `knob`'s (a swept option: {key: value}) over the codec's defaults (tgsim.codecs.options.resolved),
    as "key=value;key=value" with the keys sorted (floats to 6 significant digits, booleans true/false,
    lists [a,b]); "" for a codec without options. E.g. "qsgd" -> "bucket=512;coding=paper;levels=7;norm=l2"."""
    return _codec_options(label, tuple(sorted((knob or {}).items())))


def with_codec_options(df: pd.DataFrame, label: str = "method") -> pd.DataFrame:
    """A copy of `df` with OPTIONS_COLUMN (`codec_options` of each row's `label`, and of its swept
    option where the row has "knob" (the key, else empty or NaN) and "knob_value" columns) inserted right
    after `label`; replaced where it is already there; `df` unchanged when it has no `label` column."""
    if label not in df.columns:
        return df
    knob = ["knob", "knob_value"] if {"knob", "knob_value"} <= set(df.columns) else None
    out = df.drop(columns=[OPTIONS_COLUMN], errors="ignore")

    def one(r) -> str:
        if knob is not None and isinstance(r[knob[0]], str) and r[knob[0]]:
            value = r[knob[1]]
            value = int(value) if isinstance(value, float) and value.is_integer() else value
            return codec_options(r[label], {r[knob[0]]: value})
        return codec_options(r[label])

    values = [one(r) for _, r in out.iterrows()] if len(out) else []
    out.insert(list(out.columns).index(label) + 1, OPTIONS_COLUMN, pd.Series(values, index=out.index, dtype=object))
    return out


def codec_config(method: str):
    """The CodecConfig (tgsim.train.config) of a comparison label."""
    from tgsim.train.config import codec_section

    return codec_section(method_sections(method)[0])


def baseline() -> str:
    """The registered codec every comparison is relative to: the first whose messages are the float32
    layers themselves (properties: float_mean, or wire "float32"), unbiased and stateless: fp32."""
    from tgsim.codecs import registry

    for name in registry.names():
        props = registry.make(name).properties
        if getattr(props, "float_mean", getattr(props, "wire", None) == "float32") and props.unbiased \
                and not props.stateful:
            return name
    raise ValueError("no registered codec sends float32 layers (the comparisons' baseline)")


def default_methods(with_error_feedback: bool = True) -> tuple[str, ...]:
    """Every registered codec (built-ins, then plugins) at its default options, the baseline first;
    "+ef" appended where the codec declares `Options.compare_with_error_feedback`."""
    from tgsim.codecs import registry

    base = baseline()
    out = [base]
    for name in registry.names():
        if name == base:
            continue
        info = registry.info(name)
        out.append(name + (EF_SUFFIX if with_error_feedback and info["error_feedback"] else ""))
    return tuple(out)


def quick_methods() -> tuple[str, ...]:
    """--quick's three methods: the baseline, the default codec (registry.DEFAULT) and one registered
    codec run with error feedback: the first with a sweep knob (a tunable compressor), else the first."""
    from tgsim.codecs import registry

    ef = [m for m in default_methods() if m.endswith(EF_SUFFIX)]
    tunable = [m for m in ef if registry.info(m[:-len(EF_SUFFIX)])["sweep"] is not None]
    pick = (tunable or ef)[:1]
    return tuple(dict.fromkeys([baseline(), registry.DEFAULT, *pick]))


def synthetic_gradient(kind: str, n: int = 3000, seed: int = 0) -> np.ndarray:
    """A float32 test vector of one of SYNTHETIC_SHAPES, keyed by (kind, seed)."""
    if kind not in _SHAPE_TAG:
        raise ValueError(f"unknown gradient shape {kind!r}; valid: {SYNTHETIC_SHAPES}")
    rng = np.random.default_rng([_SHAPE_TAG[kind], int(seed)])
    if kind == "gaussian":
        g = rng.standard_normal(n)
    elif kind == "student_t3":
        g = rng.standard_t(3, n)
    elif kind == "lognormal":
        g = np.where(rng.random(n) < 0.5, -1.0, 1.0) * rng.lognormal(0.0, 2.0, n)
    else:  # sparse: 5 % non-zero Gaussian entries, the rest exact zeros (ReLU/embedding-like)
        g = np.where(rng.random(n) < 0.05, rng.standard_normal(n), 0.0)
        g[0] = 1.0  # never all-zero
    return (1e-2 * g).astype(np.float32)


def clip_section(codec: str, clip: str) -> dict:
    """The [codec] table of `codec` with its `clip` option where it declares one (TernGrad's)."""
    from tgsim.codecs import options, registry

    has = "clip" in options.keys(registry.codec_class(codec))
    return {"name": codec, **({"clip": clip} if has else {})}


def network_section(model: str | None = None, hidden=(64,)) -> dict:
    """The [model] table of the analyses' network: tgsim's MLP with `hidden` widths when `model` is
    None, else the torch.nn.Module built by the factory `model` = "package.module:function"
    (tgsim.models.make_model's optional model "torch", a TorchModel: its layers are the module's
    parameters, by name; the trainer fills the factory's dim and classes from the data set; a factory
    that does not resolve is the trainer's ConfigError, before any step)."""
    if model is None:
        return {"name": "mlp", "options": {"hidden": list(hidden)}}
    return {"name": "torch", "options": {"factory": model}}


def data_section(data: str = "digits", **fields) -> dict:
    """The [data] table of the analyses' data set `data`: one of tgsim's data sets by name, or a torch
    data factory "package.module:function" (name "torch", options = {factory = data}: tgsim.torch.data,
    torch imported there); `fields` (sharding, alpha) added."""
    if ":" in data:
        return {"name": "torch", "options": {"factory": data}, **fields}
    return {"name": data, **fields}


def network_label(model: str | None = None, data: str = "digits") -> str:
    """'MLP on digits', or '<factory> on <data>': the network of a summary line."""
    return f"{'MLP' if model is None else model} on {data}"


def mlp_digits_config(seed: int = 0, *, codec: str = FP32, clip: str = "none", steps: int = 100,
                      hidden=(64,), workers: int = 4, batch: int = 16, lr: float = 0.1,
                      optimizer: str = "sgd", sharding: str = "iid", alpha: float = 0.5,
                      model: str | None = None, data: str = "digits"):
    """Config of an MLP on scikit-learn's digits (64 features, 10 classes), per-worker batch; `model`
    a factory "package.module:function" trains that torch.nn.Module instead (``network_section``),
    `data` another of tgsim's data sets (tgsim.data.DATASETS) or a torch data factory (``data_section``)."""
    from tgsim.train.config import from_dict

    return from_dict({
        "run": {"name": "analysis-mlp", "seed": seed, "steps": steps},
        "data": data_section(data, sharding=sharding, alpha=alpha),
        "model": network_section(model, hidden),
        "workers": {"n": workers, "batch": batch, "batch_mode": "per_worker"},
        "codec": clip_section(codec, clip),
        "exchange": {"mode": "allreduce" if codec == FP32 else "ps"},
        "optimizer": {"name": optimizer},
        "schedule": {"name": "constant", "lr": lr},
    })


def least_squares_config(seed: int = 0, *, codec: str = FP32, clip: str = "none", steps: int = 1000,
                         lr: float = 0.2, schedule: str = "constant", tau: float = 50.0, dim: int = 16,
                         n: int = 1024, noise: float = 0.5, cond: float = 4.0, workers: int = 4,
                         batch: int = 8, share_scalers: bool = True):
    """Config of least squares with a known optimum (noise > 0: the mini-batch gradient at w* is not 0)."""
    from tgsim.train.config import from_dict

    return from_dict({
        "run": {"name": "analysis-ls", "seed": seed, "steps": steps},
        "data": {"name": "least_squares", "options": {"n": n, "dim": dim, "noise": noise, "cond": cond}},
        "model": {"name": "least_squares"},
        "workers": {"n": workers, "batch": batch, "batch_mode": "per_worker"},
        "codec": clip_section(codec, clip),
        "exchange": {"mode": "allreduce" if (codec == FP32 or share_scalers) else "allgather",
                     "share_scalers": share_scalers},
        "optimizer": {"name": "sgd"},
        "schedule": {"name": schedule, "lr": lr, "tau": tau},
    })


def trajectory(cfg, steps: int | None = None, on_step: Callable | None = None, setup=None,
               need_grads: bool = True):
    """Train per cfg with build + train_step, calling on_step(t, setup, params, grads) before step t.

    Returns (setup, final params). grads[name] is (n_workers, *shape) float32. With need_grads
    False, grads is None (saves one forward/backward per step) and on_step is also called once
    after the last step, with t = steps and the final parameters.
    """
    from tgsim.train.loop import build, local_batch, train_step

    setup = setup or build(cfg)
    steps = cfg.run.steps if steps is None else steps
    params = setup.model.init(cfg.run.seed)
    opt = setup.optimizer.init(params)
    for t in range(steps):
        if on_step is not None:
            grads = None
            if need_grads:
                x, y = local_batch(setup, t)
                _, grads = setup.model.loss_and_grad(params, x, y)
            on_step(t, setup, params, grads)
        params, opt, _ = train_step(setup, params, opt, t)
    if on_step is not None and not need_grads:  # the final parameters too (t = steps)
        on_step(steps, setup, params, None)
    return setup, params


def fresh_run(cfg, setup=None):
    """(setup, params, optimizer state, codec state, step function) of a run at step 0: what
    `tgsim.train.loop.run` starts from, for loops that stop on their own condition (the codec state,
    None for a stateless codec, is passed as `codec_state=` and updated in place by each step)."""
    from tgsim.train.loop import build, start_codec_state, step_function

    setup = setup or build(cfg)
    params = setup.model.init(cfg.run.seed)
    return setup, params, setup.optimizer.init(params), start_codec_state(setup, {}), step_function(setup)


def write_tables(out, tables: dict, figure: Callable[[Path], None] | None = None) -> Path | None:
    """Write each DataFrame of `tables` to out/<key>.csv and call figure(out) (out None: nothing)."""
    if out is None:
        return None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, df in tables.items():
        df.to_csv(out / f"{name}.csv", index=False)
    if figure is not None:
        figure(out)
    return out


@functools.lru_cache(maxsize=8)
def _recorded(steps: int, seed: int, hidden: tuple, workers: int, batch: int, model: str | None = None,
              data: str = "digits"):
    cfg = mlp_digits_config(seed, steps=steps, hidden=hidden, workers=workers, batch=batch, model=model, data=data)
    out = {}

    def grab(t, setup, params, grads):
        if t == steps - 1:
            out.update({k: np.array(v[0], dtype=np.float32).reshape(-1) for k, v in grads.items()})

    trajectory(cfg, steps, grab)
    for v in out.values():
        v.flags.writeable = False
    return out


def recorded_gradients(steps: int = 50, seed: int = 0, hidden=(64,), workers: int = 4,
                       batch: int = 16, model: str | None = None, data: str = "digits") -> dict[str, np.ndarray]:
    """Worker 0's flattened per-layer gradients at the last of `steps` fp32 SGD steps (MLP, digits; or
    the torch factory `model` on `data`, ``network_section``)."""
    return dict(_recorded(int(steps), int(seed), tuple(hidden), int(workers), int(batch), model, str(data)))


def gradient_shapes(n: int = 3000, seed: int = 0, recorded_steps: int | None = 50, model: str | None = None,
                    data: str = "digits") -> dict[str, np.ndarray]:
    """Synthetic shapes plus (unless recorded_steps is None) 'mlp:<layer>' recorded gradients of tgsim's
    MLP, or 'model:<parameter name>' of the torch factory `model`, trained on `data`."""
    shapes = {k: synthetic_gradient(k, n, seed) for k in SYNTHETIC_SHAPES}
    if recorded_steps:
        prefix = "mlp" if model is None else "model"
        for k, v in recorded_gradients(recorded_steps, seed, model=model, data=data).items():
            shapes[f"{prefix}:{k}"] = v
    return shapes


# ---------------------------------------------------------------------------------------------
# TernGrad's scaler and moments, vectorized over rows
# ---------------------------------------------------------------------------------------------
def _rows(g) -> np.ndarray:
    g = np.asarray(g, dtype=np.float32)
    return g.reshape(1, -1) if g.ndim <= 1 else g.reshape(g.shape[0], -1)


def terngrad_scaling(g, clip: str = "none", clip_factor: float = 2.5):
    """(s, bound) float64 arrays per row of g (rows = workers), by the codec's rule."""
    a = _rows(g)
    absmax = np.abs(a).max(axis=1).astype(np.float64)
    sigma = a.astype(np.float64).std(axis=1) if clip != "none" else np.zeros(a.shape[0])
    sc = [scaling_from_moments(float(m), float(sd), clip, clip_factor) for m, sd in zip(absmax, sigma)]
    return np.array([x.scaler for x in sc]), np.array([x.clip_bound for x in sc])


def _terngrad_inputs(g, clip: str, clip_factor: float, scaler):
    """(|g| rows in float64, scaler per row (or the shared one), x = min(|g|, clip bound))."""
    a = np.abs(_rows(g).astype(np.float64))
    s, bound = terngrad_scaling(g, clip, clip_factor)
    if scaler is not None:
        s = np.broadcast_to(np.asarray(scaler, dtype=np.float64), s.shape)
    return a, s, np.minimum(a, bound[:, None])


def terngrad_second_moment(g, clip: str = "none", clip_factor: float = 2.5, scaler=None) -> np.ndarray:
    """E||Q(g)||^2 = s Σ_k min(x_k, s) per row, x_k = min(|g_k|, bound); `scaler` overrides s (shared)."""
    a, s, x = _terngrad_inputs(g, clip, clip_factor, scaler)
    return s * np.minimum(x, s[:, None]).sum(axis=1)


def terngrad_error(g, clip: str = "none", clip_factor: float = 2.5, scaler=None) -> np.ndarray:
    """E||Q(g) - g||^2 per row: Σ p (s - |g|)^2 + (1 - p) g^2, p = min(x/s, 1) (bias included)."""
    a, s, x = _terngrad_inputs(g, clip, clip_factor, scaler)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(s[:, None] > 0, np.minimum(x / s[:, None], 1.0), 0.0)
    return np.sum(p * (s[:, None] - a) ** 2 + (1 - p) * a * a, axis=1)


def clip_values(g, clip: str = "explicit", clip_factor: float = 2.5) -> np.ndarray:
    """E[Q(g)] of TernGrad with clipping: sign(g) min(|g|, bound) (explicit) or min(|g|, s) (implicit)."""
    a = _rows(g).astype(np.float64)
    s, bound = terngrad_scaling(g, clip, clip_factor)
    lim = np.minimum(bound, s) if clip == "implicit" else bound
    return (np.sign(a) * np.minimum(np.abs(a), lim[:, None])).reshape(np.shape(g))


# ---------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------
def write_csv(df: pd.DataFrame, out: str | Path | None, name: str) -> Path | None:
    """df -> out/name.csv (directories created); None when out is None."""
    if out is None:
        return None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.csv"
    df.to_csv(path, index=False)
    return path


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        return False


def loglog_slope(t, y) -> float:
    """Least-squares slope of log y on log t (finite, positive points only)."""
    t = np.asarray(t, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    ok = (t > 0) & (y > 0) & np.isfinite(y)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(t[ok]), np.log(y[ok]), 1)[0])


class single_thread:
    """Run numba kernels on one thread inside the block (restored after).

    The analysis encodes thousands of small layers (10^2..10^4 elements), where a kernel call on
    several numba threads pays more in thread synchronisation than the work takes, the more so on
    a loaded machine (docs/MEASUREMENTS.md). One thread gives the same bits (the kernels'
    reductions have a fixed order).
    """

    def __enter__(self):
        try:
            import numba

            self._prev = numba.get_num_threads()
            numba.set_num_threads(1)
        except Exception:  # numba missing or threading layer unavailable
            self._prev = None
        return self

    def __exit__(self, *exc):
        if self._prev is not None:
            import numba

            numba.set_num_threads(self._prev)
        return False
