"""Synchronous data-parallel training with a gradient codec, for any Exchange.

One step (docs/DESIGN.md "Data flow of one step"), for the workers local to this process:
    batches (counter-based: seed, step, worker) -> loss_and_grad (batched over the worker axis)
    -> codec.prepare_many (checks, statistics) -> [shared statistics: MAX or mean over workers]
    -> codec.encode_many (a stateful codec: encode_stateful) -> exchange.aggregate -> mean
    -> optimizer update on every replica (identical bits) -> metrics
A codec of R > 1 rounds (tgsim.codecs.base.MultiRound) replaces encode + aggregate by its rounds,
each round's messages averaged by exchange.mean_fp32 (`run_rounds`).
The codec comes from the registry (tgsim.codecs.registry) by its config name; the trainer reads
only its declared properties (tgsim.codecs.base.CodecProperties) and holds a stateful codec's
state as an opaque dict, checkpointed as "codec_state" (every worker's rows).
A killed run resumes from its newest good checkpoint and ends with the bits of an uninterrupted run:
every random draw is a function of (seed, step, worker, layer), so the step number is all the
state besides the parameters, the optimizer state and the codec state.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tgsim.backend import get_xp, to_numpy
from tgsim.codecs import error_feedback, registry
from tgsim.errors import ConfigError, NonFiniteGradientError, is_nonfinite, nonfinite_elsewhere, nonfinite_error
from tgsim.rng import StreamKey
from tgsim.train import checkpoint, progress, results
from tgsim.train import tensorboard as tb
from tgsim.train.config import Config, config_hash
from tgsim.train.optim import make_optimizer
from tgsim.train.schedules import learning_rate


@dataclass
class Setup:
    cfg: Config
    dataset: object
    shards: list
    model: object
    codec: object                 # a registered codec (tgsim.codecs.base.Codec)
    optimizer: object
    exchange: object
    optimum: dict | None = None   # w* of the full training objective, where the model can solve it
    xp: object = np               # the array module of run.backend: NumPy, or CuPy (one GPU)

    @functools.cached_property
    def device_data(self) -> tuple:
        """(x_train, y_train, x_test, y_test) as arrays of xp: copied to the device once (NumPy: the
        dataset's own arrays)."""
        ds = self.dataset
        return tuple(self.xp.asarray(a) for a in (ds.x_train, ds.y_train, ds.x_test, ds.y_test))

    def distance_to_optimum(self, params) -> float:
        """||w - w*|| / ||w*|| over all parameters (nan when w* is unknown)."""
        if self.optimum is None:
            return float("nan")
        num = sum(float(np.sum((to_numpy(params[k]).astype(np.float64) - v) ** 2)) for k, v in self.optimum.items())
        den = sum(float(np.sum(v ** 2)) for v in self.optimum.values())
        return float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))


def _model_options(model_name: str, options: dict, dataset, seed: int = 0) -> dict:
    """Fill the model's input/output sizes from the dataset, and the run's seed (a torch module's
    constants: tgsim/torch/model.py), where the model takes them and the config leaves them out."""
    from tgsim.models import model_kwargs

    probe = {"dim": int(np.prod(dataset.feature_shape)), "length": int(dataset.feature_shape[-1]),
             "classes": int(dataset.n_classes), "feature_shape": tuple(dataset.feature_shape), "seed": int(seed)}
    accepted = model_kwargs(model_name)
    return {**{k: v for k, v in probe.items() if k in accepted}, **options}


def build(cfg: Config, exchange=None) -> Setup:
    """The Setup of a run of config `cfg` (data set, shards, model, codec, optimizer and the exchange:
    `exchange`, or an in-process one of all workers), checked before the first step (ConfigError on a
    bad combination)."""
    from tgsim.data import load, shard
    from tgsim.exchange import InProcessExchange
    from tgsim.models import make_model

    try:
        xp = get_xp(cfg.run.backend)              # first: no GPU fails before any data is loaded
    except RuntimeError as e:
        raise ConfigError(f"[run] {e}") from e
    try:
        dataset = load(cfg.data.name, seed=cfg.run.seed, **cfg.data.options)
        shards = shard(dataset.y_train, cfg.workers.n, scheme=cfg.data.sharding, alpha=cfg.data.alpha,
                       seed=cfg.run.seed)
        model = make_model(cfg.model.name, **_model_options(cfg.model.name, cfg.model.options, dataset,
                                                                   cfg.run.seed))
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from e
    if model.task != dataset.task:
        raise ConfigError(f"model {cfg.model.name!r} is for {model.task}, data {cfg.data.name!r} is {dataset.task}")
    b = cfg.workers.per_worker_batch
    small = min(len(s) for s in shards)
    if b > small:
        raise ConfigError(f"per-worker batch {b} is larger than the smallest shard ({small} samples)")
    codec = registry.make_codec(cfg.codec)
    if cfg.codec.error_feedback:
        codec = error_feedback.ErrorFeedback(codec)     # ConfigError for a codec it cannot wrap
    exchange = exchange or InProcessExchange(cfg.workers.n)
    if exchange.n_workers != cfg.workers.n:
        raise ConfigError(f"exchange has {exchange.n_workers} workers, config asks for {cfg.workers.n}")
    optimum = model.optimum(dataset.x_train, dataset.y_train) if hasattr(model, "optimum") else None
    return Setup(cfg, dataset, shards, model, codec, make_optimizer(cfg.optimizer), exchange, optimum, xp)


def preflight(setup: Setup) -> dict:
    """The model's initial parameters (run.seed, on the backend) after one forward and backward pass
    on worker 0's batch of step 0 (the real data): what `run` does before it creates or touches the
    results directory, so a model that cannot train (a factory argument it does not take, a torch
    module with BatchNorm statistics, a forward that raises, a shape that does not fit the data) is a
    ConfigError of one line naming the cause, and nothing is written. Worker 0's batch on every MPI
    rank: every rank fails alike. A non-finite loss is not an error here (run.on_nonfinite's)."""
    cfg = setup.cfg
    try:
        params = {k: setup.xp.asarray(v) for k, v in setup.model.init(cfg.run.seed).items()}
        if setup.dataset is not None:
            from tgsim.data.batching import batch_indices_many

            idx = batch_indices_many([setup.shards[0]], cfg.workers.per_worker_batch, cfg.run.seed, 0, [0])
            x, y = setup.device_data[:2]
            idx = setup.xp.asarray(idx)
            setup.model.loss_and_grad(params, x[idx], y[idx])
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001  (whatever a user's model raises: one line, nothing written)
        text = " ".join(str(e).split()) or "(no message)"
        raise ConfigError(f"model {cfg.model.name!r} failed its check (init, one forward and backward pass on "
                          f"worker 0's first batch) before anything was written: {type(e).__name__}: {text}") from e
    return params


def to_device(tree, xp):
    """A checkpoint's tree on the backend: float arrays become arrays of `xp`; integer ones (Adam's
    step count) stay NumPy, as `optimizer.init` makes them."""
    if isinstance(tree, dict):
        return {k: to_device(v, xp) for k, v in tree.items()}
    a = np.asarray(tree)
    return xp.asarray(a) if a.dtype.kind == "f" else a


def local_batch(setup: Setup, step: int):
    """(x, y) of this process's workers of `setup` at `step`: shapes (n_local, B, *features), (n_local, B);
    (None, None) for a Setup without a data set (a model that brings its own gradients: the DDP hook's)."""
    from tgsim.data.batching import batch_indices_many

    if setup.dataset is None:
        return None, None
    cfg = setup.cfg
    local = setup.exchange.local_workers
    idx = batch_indices_many([setup.shards[w] for w in local], cfg.workers.per_worker_batch, cfg.run.seed,
                             step, local)
    x, y = setup.device_data[:2]
    idx = setup.xp.asarray(idx)                 # on a GPU the indices go up, the data stays there
    return x[idx], y[idx]


@dataclass
class StepInfo:
    loss: float
    sent: float
    received: float
    skipped: bool
    layer_stats: list = field(default_factory=list)


def _layer_stats(grads: dict, scalers, scalings, decoded=None, mean=None, ex=None) -> list[dict]:
    """Per-layer metrics, averaged over the local workers, from the (W, *shape) gradients.

    scaler: the shared scaler (else the mean of the workers' max|g|); inf_l1: E_w[max|g| ||g||_1];
    l2sq: E_w[||g||_2^2]; clip_fraction: E_w[fraction of |g| > clip bound] (ternary layers with
    scalings, else nan). The signs of a collapse of scaler sharing:
      scaler_ratio        shared scaler / median of the local workers' own scalers (nan without
                          sharing); all N workers in the simulator, the rank's own over MPI;
      noise_to_signal     the aggregate's quantization noise relative to its size,
                          (Σ_w ||decode_w - g_w||^2 / N^2) / ||mean||^2, summed over all workers
                          (one collective per layer; `decoded`: the local workers' decoded messages);
      zero_grad_fraction  fraction of the layer's elements whose gradient is exactly 0 for every
                          local worker: for the bias of a layer followed by a ReLU, the units dead
                          on the whole batch. One pass per layer over all workers' rows (tgsim.train.layer_stats.row_abs_stats:
    float64 sums, no float64 copy of the gradients); max|g| from pass 1's moments where the codec
    computed them (the same float32 values).
    """
    from tgsim.train.layer_stats import row_abs_stats

    if decoded is not None:                    # a logging step: the statistics are computed on the host
        decoded = [{k: to_numpy(v) for k, v in d.items()} for d in decoded]
        mean = {k: to_numpy(v) for k, v in mean.items()}
    rows = []
    for i, (name, g) in enumerate(grads.items()):
        g = to_numpy(g)
        flat = g.reshape(g.shape[0], -1)
        sc = scalings[i] if scalings is not None else None
        st = row_abs_stats(flat.astype(np.float32, copy=False), None if sc is None else sc.clip_bound)
        n = flat.shape[1]
        absmax = st[:, 3] if sc is None else np.asarray(sc.absmax, dtype=np.float64)
        if sc is None:
            clip = float("nan")
        else:
            clip = float(np.mean(st[:, 2] / n)) if n else 0.0
        scaler = float(scalers[i]) if scalers is not None else float(np.mean(absmax))
        ratio = float("nan")
        if scalers is not None and sc is not None:
            med = float(np.median(np.asarray(sc.scaler, dtype=np.float64)))
            ratio = float(scalers[i]) / med if med > 0 else float("nan")
        noise = float("nan")
        if decoded is not None:
            local_sq = sum(float(np.sum((np.asarray(d[name], np.float64).reshape(-1) - flat[w].astype(np.float64)) ** 2))
                           for w, d in enumerate(decoded))
            signal = float(np.sum(np.asarray(mean[name], np.float64) ** 2))
            total = ex.mean_scalar(local_sq) / ex.n_workers          # Σ over all workers / N^2
            noise = total / signal if signal > 0 else float("nan")
        zero = float(np.mean(np.all(flat == 0, axis=0))) if n else float("nan")
        rows.append(dict(layer=name, scaler=scaler, inf_l1=float(np.mean(absmax * st[:, 0])),
                         l2sq=float(np.mean(st[:, 1])), clip_fraction=clip, scaler_ratio=ratio,
                         noise_to_signal=noise, zero_grad_fraction=zero))
    return rows


def shared_scalers(setup: Setup, stats) -> tuple[bool, np.ndarray | None]:
    """(share, the shared per-layer scalers or None) of a step of `setup` from its statistics `stats`:
    where the config shares them and the codec declares a rule, the MAX or the mean over all workers
    of the local workers' scalers."""
    cfg, ex, codec = setup.cfg, setup.exchange, setup.codec
    how = codec.properties.shared_stats
    share = bool(cfg.exchange.share_scalers and how is not None)
    if not share:
        return False, None
    local_scalers = codec.local_scalers_many(stats, len(ex.local_workers))
    return True, ex.max_scalers(local_scalers) if how == "max" else ex.mean_scalers(local_scalers)


def train_step(setup: Setup, params: dict, opt_state, step: int, with_stats: bool = False, codec_state=None):
    """One synchronous step `step` of `setup` from `params` and `opt_state`; returns (params, opt_state,
    StepInfo), its per-layer metric rows computed only when `with_stats`. Non-finite gradients never
    reach params.

    The codec works on all local workers at once (prepare_many / encode_many: for a packed-code
    codec one kernel call per layer for the W local workers), with the bits of per-worker calls.
    codec_state: for a stateful codec (tgsim.codecs.base.Stateful), the opaque state of the local
    workers ({key: (W, ...)}), replaced in place by the state the codec returns; a skipped step
    leaves it as it was. A single-round stateful codec encodes `codec.encoder_inputs(g, state)`
    (error feedback: p = g + e), on which the statistics and per-layer metrics are computed; a codec
    with `properties.rounds` > 1 goes through `run_rounds`.
    """
    cfg, ex, codec = setup.cfg, setup.exchange, setup.codec
    x, y = local_batch(setup, step)
    losses, grads = setup.model.loss_and_grad(params, x, y)
    local = ex.local_workers
    props = codec.properties
    if props.stateful != (codec_state is not None):
        raise ValueError(f"codec {codec.name!r}: pass the codec state exactly when the codec is stateful")
    multi = props.rounds > 1
    inputs = codec.encoder_inputs(grads, codec_state) if codec_state is not None and not multi else grads

    stats, skip = prepare_checked(codec, inputs, ex, cfg.run.on_nonfinite, step)
    if skip:
        return params, opt_state, StepInfo(float("nan"), 0.0, 0.0, True)

    workers = np.asarray(local, dtype=np.int64)
    lr = learning_rate(cfg.schedule, step, cfg.run.steps)
    if multi:
        mean, comm, new_state = run_rounds(codec, ex, grads, cfg.run.seed, step, workers, codec_state)
        _replace(codec_state, new_state)
        params, opt_state = setup.optimizer.update(mean, opt_state, params, lr)
        layer_rows = _layer_stats(grads, None, None) if with_stats else []
        loss = _mean_loss(ex, losses)
        return params, opt_state, StepInfo(loss, comm.sent, comm.received, False, layer_rows)

    share, shared = shared_scalers(setup, stats)
    if not with_stats:
        inputs = None               # (error feedback: encode_stateful forms p again, one float32 add)
    msgs, new_state = encode_messages(setup, grads, step, workers, codec_state, share, shared, stats)
    if new_state is not None:
        _replace(codec_state, new_state)
    del grads                       # the messages hold what the exchange needs; `inputs` the statistics'
    rkey = StreamKey(cfg.run.seed, step, ex.n_workers, 0) if cfg.exchange.reternarize_downlink else None
    mean, comm = ex.aggregate(codec, msgs, cfg.exchange.mode, share, rkey)
    decoded = [codec.decode(m) for m in msgs] if with_stats else None
    del msgs                        # the payloads, before the optimizer's temporaries
    params, opt_state = setup.optimizer.update(mean, opt_state, params, lr)
    layer_rows = _layer_stats(inputs, shared, stats, decoded, mean, ex) if with_stats else []
    loss = _mean_loss(ex, losses)
    return params, opt_state, StepInfo(loss, comm.sent, comm.received, False, layer_rows)


def prepare_checked(codec, inputs, ex, on_nonfinite: str, step: int):
    """(stats, skip): `codec.prepare_many(inputs)` with its non-finite check agreed over the exchange
    `ex` (a collective: `ex.any_true`). Where no worker's input is finite-checked bad: (stats, False).
    Where some is: on_nonfinite "skip" gives (None, True); "raise" raises NonFiniteGradientError
    naming this process's bad layer, worker and step, or, on a process whose inputs are finite,
    `nonfinite_elsewhere(step)`."""
    bad = stats = None
    try:
        stats = codec.prepare_many(inputs)
    except NonFiniteGradientError as e:
        bad = e
    if not ex.any_true(bad is not None):
        return stats, False
    if on_nonfinite == "raise":
        if bad is not None:
            w = getattr(bad, "worker", None)
            where = f"step {step}" if w is None else f"worker {ex.local_workers[w]}, step {step}"
            raise NonFiniteGradientError(bad.layer, bad.count, where) from bad
        raise nonfinite_elsewhere(step)
    return None, True


def encode_messages(setup: Setup, grads, step: int, workers, codec_state, share: bool, shared, stats):
    """(messages, new codec state or None) of the local workers' `grads` at `step`: a stateful codec's
    `encode_stateful` from `codec_state`, else `encode_many`, deferred (codes encoded piece by piece
    as the pipelined MPI exchange sends them, the same bits) where the codec and the exchange allow
    it for this mode and sharing (`share`, the shared scalers `shared`). `grads` goes to the codec as
    it is: the model's {name: (W, *shape)} or the hook's bucket as one FlatLayers (tgsim.codecs.base);
    a codec with `properties.multi_tensor` encodes every layer in one compiled call per pass."""
    cfg, ex, codec = setup.cfg, setup.exchange, setup.codec
    if codec_state is not None:         # a stateful codec decodes its own messages: never deferred
        return codec.encode_stateful(grads, cfg.run.seed, step, workers, codec_state, shared, stats)
    defers = getattr(ex, "defers_encode", None)
    deferred = bool(codec.properties.defers_encode and defers and
                    defers(cfg.exchange.mode, share, cfg.exchange.reternarize_downlink))
    return codec.encode_many(grads, cfg.run.seed, step, workers, shared, stats,
                             **({"deferred": True} if deferred else {})), None


def _mean_loss(ex, losses) -> float:
    """The mean of every worker's loss over the exchange (a collective); nan, with nothing exchanged,
    where the model gives no losses (None: a model that does not see its loss, the DDP hook's)."""
    if losses is None:
        return float("nan")
    return ex.mean_scalar(float(np.sum(to_numpy(losses))))


def _replace(state: dict, new: dict) -> None:
    """The trainer's codec state becomes `new` (the dict object is kept: callers hold it)."""
    state.clear()
    state.update(new)


def run_rounds(codec, ex, layers: dict, seed: int, step: int, workers, state: dict):
    """(aggregate, CommBytes summed over the rounds, new state) of the step `step` (run seed `seed`) of a
    codec with R = rounds > 1 (tgsim.codecs.base.MultiRound) on the local workers' `layers`, with the
    exchange `ex`, the local `workers` and the codec state `state`: round 0 `start_rounds`, rounds
    1..R-1 `next_round` on the previous round's mean, then `finish_rounds` on the last mean; every
    round's messages are combined by `ex.mean_fp32` (the ordered fp32 mean over all workers)."""
    msgs, ctx = codec.start_rounds(layers, seed, step, workers, state)
    mean, comm = ex.mean_fp32(msgs)
    for _ in range(1, codec.properties.rounds):
        msgs, ctx = codec.next_round(ctx, mean)
        mean, more = ex.mean_fp32(msgs)
        comm += more
    aggregate, new_state = codec.finish_rounds(ctx, mean)
    return aggregate, comm, new_state


def step_function(setup: Setup):
    """The step of this config, called as f(setup, params, opt_state, step, with_stats, codec_state=...):
    `train_step`, or for local SGD / PQASGD a tgsim.train.local_sgd.LocalSteps of this setup."""
    if setup.cfg.exchange.local == "none":
        return train_step
    from tgsim.train import local_sgd

    return local_sgd.LocalSteps(setup)


def start_codec_state(setup: Setup, state: dict) -> dict | None:
    """The local workers' codec state of `setup` at the first step (None for a stateless codec): the
    codec's `init_state`, or on resume (`state`: the checkpoint read) this process's rows of its
    "codec_state" (all N workers' rows); a checkpoint of an older tgsim holds error feedback's
    residuals as "ef_residual" {layer: (N, *shape)}, read as the state {"residual/<layer>": ...}."""
    codec = setup.codec
    if not codec.properties.stateful:
        return None
    local = setup.exchange.local_workers
    init = codec.init_state(setup.model.layer_shapes(), len(local))
    if not state:
        return init
    if "codec_state" in state:
        saved = checkpoint.flatten(state["codec_state"])
    elif "ef_residual" in state:
        saved = error_feedback.as_state(state["ef_residual"])
    else:
        raise ConfigError(f"codec {codec.name!r} keeps per-worker state, but the checkpoint to resume "
                          "from holds none (written with a stateless codec?): it cannot give the bits of an "
                          "uninterrupted run")
    try:
        return error_feedback.local_rows(saved, {k: tuple(v.shape[1:]) for k, v in init.items()}, local)
    except ValueError as e:
        raise ConfigError(f"resume: {e}") from e


def _state_to_save(ex, codec_state) -> dict:
    """{"codec_state": every worker's rows of the codec state (N, ...)} for the checkpoint on the
    process that gathers them ({} for a stateless codec and on the other MPI ranks). A collective:
    every process calls it."""
    if codec_state is None:
        return {}
    rows = ex.gather_rows(error_feedback.pack_rows(codec_state))
    if rows is None:
        return {}
    return {"codec_state": error_feedback.unpack_rows(rows, {k: v.shape[1:] for k, v in codec_state.items()})}


def _device_info(setup: Setup) -> dict:
    """The manifest's GPU lines: the device, and over MPI whether buffers go to MPI from the device
    (CUDA-aware MPI) or are staged through pinned host memory."""
    if setup.xp is np:
        return {}
    dev = setup.xp.cuda.Device()
    info = {"device": int(dev.id), "device_name": _device_name(setup.xp, int(dev.id))}
    if hasattr(setup.exchange, "cuda_aware"):
        info["mpi_gpu_buffers"] = "cuda-aware" if setup.exchange.cuda_aware else "staged through pinned host memory"
    return info


def _device_name(xp, device: int) -> str:
    try:
        name = xp.cuda.runtime.getDeviceProperties(device)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001  (a name is for the record only)
        return "unknown"


@dataclass
class RunResult:
    out: Path | None
    params: dict
    steps: int
    test_loss: float
    test_accuracy: float
    bits_up: float
    bits_down: float
    skipped: int
    dist_opt: float = float("nan")
    eval_split: str = "test"      # "validation" when data.options.validation > 0: test_* are validation numbers
    start_step: int = 0           # the step a resumed run continued from (steps: the run was already complete)
    unhealthy: str = ""           # why the finished run is not usable ("" if it is): `unhealthy`; tgsim run exits 3

    @property
    def exit_status(self) -> int:
        """`tgsim run`'s exit status for this result: 3 when unhealthy, else 0."""
        return EXIT_UNHEALTHY if self.unhealthy else 0


EXIT_UNHEALTHY = 3      # `tgsim run` / the MPI trainer: the run finished, but its result is not usable


def unhealthy(cfg: Config, skipped: int, eval_loss: float, split: str = "test") -> str:
    """Why a finished run of `cfg` is not usable, "" when it is: it skipped more than
    run.max_skipped_fraction of its run.steps steps (non-finite gradients, run.on_nonfinite = "skip"),
    or its final `split` loss `eval_loss` is not finite. `tgsim analyze run-health` raises an ALERT
    for the same two (from metrics.csv)."""
    why = []
    if skipped > cfg.run.max_skipped_fraction * cfg.run.steps:
        why.append(f"{skipped} of {cfg.run.steps} steps skipped for non-finite gradients (more than "
                   f"run.max_skipped_fraction = {cfg.run.max_skipped_fraction:g})")
    if not math.isfinite(eval_loss):
        why.append(f"the final {split} loss is {eval_loss}")
    return "; ".join(why)


def run(cfg: Config, out: str | Path | None = None, resume: bool = False, quiet: bool = False,
        exchange=None, writer: bool = True, results_base: str | Path = "results",
        allow_changes: tuple[str, ...] | list[str] = (), tensorboard: str | Path | None = None) -> RunResult:
    """Train per `cfg`, writing a results directory (only where `writer`); see module docstring. Returns
    the RunResult.

    out: the results directory (default: a new one under `results_base`); resume: continue the run in
    `out` from its newest usable checkpoint; exchange: the exchange (default: in-process, all workers);
    quiet: no progress output; tensorboard: a folder for TensorBoard event files of metrics.csv's
    scalars (tgsim.train.tensorboard; default RUN_DIR/tensorboard where [run] tensorboard, else none).
    Before anything is written: the config, the data, the model's init and one forward and backward
    pass (`preflight`) are checked, a ConfigError otherwise; a resume compares `cfg` with the run's
    config.toml (tgsim.train.config.resume_changes: keys other than RESUME_FREE_KEYS and
    `allow_changes` may not differ) and records an accepted change in `out`/resumes.jsonl, config.toml
    then holding the new config.
    A non-finite gradient under run.on_nonfinite = "raise" checkpoints the state of the steps before it
    (where a checkpoint can resume: every step, or a sync step of local SGD) and raises
    NonFiniteGradientError (on another MPI rank: a ValueError marked `nonfinite`) saying how to go on.
    Progress, only where `writer` and not `quiet`: a tqdm bar on stderr where stderr is a terminal, and
    plain lines on stdout (tgsim.train.progress: every `run.log_every` steps and at the last) where stdout
    is not a terminal or there is no bar, so a batch job's log shows how far the run is; a Numba
    compilation (the first run on a machine) is announced in one line and kept out of the lines' rate.
    """
    # NumPy's warnings on overflow and NaN are silenced: the trainer checks every gradient itself and
    # names the layer, worker and step (run.on_nonfinite), in one line instead of a warning per array
    with progress.CompileWatch(say=None if quiet or not writer else progress.say) as watch, \
            np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _run(cfg, out, resume, quiet, exchange, writer, results_base, tuple(allow_changes), watch, tensorboard)


def _run(cfg, out, resume, quiet, exchange, writer, results_base, allow_changes, watch, tensorboard) -> RunResult:
    setup = build(cfg, exchange)
    ex = setup.exchange
    from tgsim.data import shard_plan_digest

    ex.check_same_config(config_hash(cfg), shard_plan=shard_plan_digest(
        setup.shards, setup.dataset.x_train, setup.dataset.y_train))
    if out is None and resume:
        raise ConfigError("--resume needs the results directory to continue")
    first_params = preflight(setup)           # the model trains: before the directory exists
    out = Path(out) if out is not None else results.new_run_dir(results_base, cfg.run.name)
    changed = results.resume_changes(out, cfg, allow_changes) if resume else {}
    events_dir = tb.log_dir(cfg.run.tensorboard, out, tensorboard)
    if events_dir is not None:
        tb.require()                               # on every rank: the same ConfigError everywhere
    if writer:
        results.prepare(out, cfg, resume)
    start, params, opt_state = 0, None, None
    bits_up = bits_down = 0.0
    skipped = 0
    ckpt_dir = out / "checkpoints"
    state = {}
    if resume:
        found = checkpoint.latest_good(ckpt_dir)
        if found is not None:
            start, state = found
            params, opt_state = state["params"], state.get("opt", {})
            totals = state.get("totals", {})     # counts of steps 1..start (older checkpoints: none, 0)
            bits_up = float(totals.get("bits_up", 0.0))
            bits_down = float(totals.get("bits_down", 0.0))
            skipped = int(totals.get("skipped", 0))
    if writer and changed:
        results.record_resume(out, cfg, start, changed)
    if params is None:
        params = first_params
        opt_state = setup.optimizer.init(params)
    else:                                          # a checkpoint holds host arrays, from a CPU or a GPU run
        params, opt_state = to_device(params, setup.xp), to_device(opt_state, setup.xp)
    codec_state = start_codec_state(setup, state)  # a stateful codec's per-worker state, else None
    events = tb.EventLog(events_dir, purge_step=start + 1 if resume else None) if writer and events_dir else None
    metrics = results.MetricsWriter(out / "metrics.csv", resume_step=start if resume else None,
                                    events=events) if writer else None
    if writer:
        results.write_manifest(out, cfg, {"backend": cfg.run.backend, **_device_info(setup),
                                          "kernels": cfg.codec.kernels, "exchange": type(ex).__name__,
                                          "resumed_from_step": start})

    bar = lines = None
    if not quiet and writer:
        from tqdm import tqdm

        bar = tqdm(total=cfg.run.steps, initial=start, desc=cfg.run.name, unit="step", file=sys.stderr,
                   dynamic_ncols=True, disable=None)     # None: no bar where stderr is not a terminal (logs, CI)
        if bar.disable or not progress.is_terminal(sys.stdout):   # batch jobs: plain lines on stdout
            own = len(ex.local_workers) == ex.n_workers   # over MPI: rank 0's own counts (metrics.csv's)
            lines = progress.ProgressLines(cfg.run.steps, cfg.run.log_every, start,
                                           "bits/worker" if own else "rank 0 bits")
    t0 = time.perf_counter()
    test = (float("nan"), float("nan"))
    last_eval = None                               # the latest evaluation of this process, for the lines
    step_fn = step_function(setup)
    compiled = watch.count

    def save_checkpoint(done: int) -> Path:
        """Checkpoint the state after `done` steps (a collective over MPI: every process calls it)."""
        if metrics is not None:
            metrics.flush()
        state_rows = _state_to_save(ex, codec_state)  # on every process: a gather over MPI
        path = checkpoint.path_of(ckpt_dir, done)
        if writer:
            totals = {"bits_up": np.float64(bits_up), "bits_down": np.float64(bits_down),
                      "skipped": np.int64(skipped)}
            path = checkpoint.save(ckpt_dir, done, {"params": params, "opt": opt_state, "totals": totals,
                                                    **state_rows}, cfg.run.keep_checkpoints)
        if hasattr(ex, "barrier"):
            ex.barrier()
        return path

    for step in range(start, cfg.run.steps):
        with_stats = step % cfg.run.log_every == 0
        try:
            params, opt_state, info = step_fn(setup, params, opt_state, step, with_stats, codec_state=codec_state)
        except ValueError as e:
            if not is_nonfinite(e):
                raise
            if bar is not None:
                bar.close()
            if step > start and step % cfg.exchange.every == 0:      # a state a checkpoint can resume
                kept = f"the state after its {step} steps is checkpointed ({save_checkpoint(step)})"
            elif step == 0:
                kept = "it stopped at its first step (nothing to keep)"
            else:
                found = checkpoint.list_checkpoints(ckpt_dir)
                kept = (f"its newest checkpoint is {found[-1]}" if found else "it has no checkpoint") + \
                    (" (local SGD: checkpoints at sync steps only)" if step % cfg.exchange.every else "")
            advice = (f"run.on_nonfinite = 'raise' stopped the run in {out}: {kept}; fix the cause and continue "
                      "with --resume (a changed config key needs --allow-change KEY), or set "
                      "run.on_nonfinite = 'skip' to skip such steps")
            if isinstance(e, NonFiniteGradientError):
                raise NonFiniteGradientError(e.layer, e.count, e.where, advice) from e
            raise nonfinite_error(f"{e}; {advice}") from e
        if lines is not None and watch.count != compiled:   # Numba compiled in this step: not in the rate
            lines.restart(step + 1)
        compiled = watch.count
        bits_up += 8 * info.sent
        bits_down += 8 * info.received
        skipped += info.skipped
        done = step + 1
        if metrics is not None:
            elapsed = time.perf_counter() - t0
            dist = setup.distance_to_optimum(params) if with_stats or done == cfg.run.steps else float("nan")
            metrics.write(step=done, split="train", layer="model", loss=info.loss, dist_opt=dist, bits_up=8 * info.sent,
                          bits_down=8 * info.received, lr=learning_rate(cfg.schedule, step, cfg.run.steps),
                          skipped=int(info.skipped), seconds=elapsed)
            for row in info.layer_stats:
                metrics.write(step=done, split="train", **row)
        if (cfg.run.eval_every and done % cfg.run.eval_every == 0) or done == cfg.run.steps:
            test = setup.model.evaluate(params, *setup.device_data[2:])
            last_eval = progress.Evaluation(done, float(test[0]), float(test[1]))
            if metrics is not None:
                metrics.write(step=done, split=setup.dataset.eval_split, layer="model", loss=float(test[0]), accuracy=float(test[1]))
        if cfg.run.checkpoint_every and (done % cfg.run.checkpoint_every == 0 or done == cfg.run.steps):
            save_checkpoint(done)
        if bar is not None:
            bar.update(1)
            if done % 10 == 0 or done == cfg.run.steps:
                bar.set_postfix(loss=f"{info.loss:.4f}", refresh=False)
        if lines is not None:
            text = lines.line(done, info.loss, bits_up, bits_down, last_eval, skipped)
            if text is not None:
                if bar.disable:
                    print(text, flush=True)
                else:                                  # stdout piped, the bar on the terminal: keep it whole
                    bar.write(text, file=sys.stdout)
                    sys.stdout.flush()
    if bar is not None:
        bar.close()
    if writer:
        metrics.close()
        results.save_params(out, params)
    if start >= cfg.run.steps and math.isnan(test[0]):
        test = setup.model.evaluate(params, *setup.device_data[2:])
    split = setup.dataset.eval_split
    return RunResult(out if writer else None, params, cfg.run.steps, float(test[0]), float(test[1]),
                     bits_up, bits_down, skipped, setup.distance_to_optimum(params), split, start,
                     unhealthy(cfg, skipped, float(test[0]), split))
