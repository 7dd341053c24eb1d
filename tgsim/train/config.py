"""Run configuration: nested dataclasses read from TOML, checked before any work starts.

Unknown sections or keys, impossible batch splits and unknown names are errors that name the key.
`resolved(cfg)` is what a results directory stores as config.toml.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tgsim.codecs import registry
from tgsim.codecs.registry import CodecConfig  # noqa: F401  (re-exported: tgsim.train.config.CodecConfig)
from tgsim.errors import ConfigError  # noqa: F401  (re-exported: tgsim.train.config.ConfigError)
from tgsim.train.optim import OPTIMIZERS, OptimizerConfig
from tgsim.train.schedules import SCHEDULES, ScheduleConfig




@dataclass(frozen=True)
class RunConfig:
    name: str = "run"
    seed: int = 0
    steps: int = 1000
    eval_every: int = 100        # test-set evaluation period (steps); 0 = only at the end
    log_every: int = 10          # per-layer statistics period (steps)
    checkpoint_every: int = 0    # 0 = no checkpoints; else every k steps and at the last step
    keep_checkpoints: int = 3
    on_nonfinite: str = "raise"  # "raise" (checkpoint the last good step, stop: exit 2) | "skip" (skip the step, count it)
    max_skipped_fraction: float = 0.1   # a run that skipped more of its steps ends unhealthy (`tgsim run` exit 3)
    backend: str = "numpy"       # "numpy" (CPU) | "cupy" (one GPU per process: data, model, codec, exchange, optimizer)
    tensorboard: bool = False    # also write metrics.csv's scalars as TensorBoard event files (tgsim.train.tensorboard)


@dataclass(frozen=True)
class DataConfig:
    name: str = "mnist1d"
    sharding: str = "iid"        # "iid" | "dirichlet"
    alpha: float = 0.5           # Dirichlet concentration
    options: dict = field(default_factory=dict)   # passed to tgsim.data.load


@dataclass(frozen=True)
class ModelConfig:
    name: str = "mlp"
    options: dict = field(default_factory=dict)   # passed to tgsim.models.make_model


@dataclass(frozen=True)
class WorkersConfig:
    n: int = 4
    batch: int = 64              # total (global) batch, or per-worker batch (batch_mode)
    batch_mode: str = "total"    # "total": each worker takes batch/n (paper Fig. 3) | "per_worker"

    @property
    def per_worker_batch(self) -> int:
        return self.batch // self.n if self.batch_mode == "total" else self.batch


# CodecConfig, the [codec] section, lives with the registry (the codec layer builds codecs from it)


_CODEC_KEYS = ("name", "error_feedback", "kernels")
# every key of the flat [codec] section that config.toml files held before the codecs declared their
# options: a table with all of them is such a file, whose keys of other codecs are dropped
_LEGACY_FLAT = frozenset({"name", "clip", "clip_factor", "packing", "min_size", "float_layers", "kernels", "levels",
                          "bucket", "norm", "coding", "density", "k", "rotate", "sharing", "error_feedback"})


def codec_section(values: dict) -> CodecConfig:
    """The CodecConfig of a flat [codec] table `values`: name, error_feedback and kernels, the rest the
    codec's options (ConfigError naming the codec and its valid keys for a key it does not have)."""
    from tgsim.codecs import options as codec_options

    if not isinstance(values, dict):
        raise ConfigError("[codec] must be a table")
    common = _section(_CodecCommon, "codec", {k: v for k, v in values.items() if k in _CODEC_KEYS})
    opts = {k: v for k, v in values.items() if k not in _CODEC_KEYS}
    try:
        cls = registry.codec_class(common.name)
    except ValueError as err:
        raise ConfigError(f"[codec] {err}") from err
    if _LEGACY_FLAT <= set(values):
        own = set(codec_options.keys(cls))
        opts = {k: v for k, v in opts.items() if k in own}
    try:
        codec_options.parse(cls, CodecConfig(name=common.name, options=opts))
    except ConfigError as err:
        raise ConfigError(f"[codec] {err}") from err
    return CodecConfig(name=common.name, error_feedback=common.error_feedback, kernels=common.kernels,
                       options=opts)


@dataclass(frozen=True)
class _CodecCommon:
    name: str = registry.DEFAULT
    error_feedback: bool = False
    kernels: str = "auto"


# "sharded_ps": every rank serves one shard of the summed codes (tgsim/exchange/sharded.py): packed-code
# codecs with shared scalers, and fp32 (its exact reduce-scatter, as in every mode)
EXCHANGE_MODES = ("allreduce", "ps", "allgather", "sharded_ps")
LOCAL_MODES = ("none", "average", "pqasgd")


@dataclass(frozen=True)
class ExchangeConfig:
    mode: str = "ps"             # "allreduce" (integer codes / fp32) | "ps" (parameter server) | "allgather"
    #                              | "sharded_ps" (every rank the server of one shard; shared scalers)
    share_scalers: bool = True   # MAX all-reduce of per-layer scalers before encoding
    reternarize_downlink: bool = False   # ps only: the server ternarizes the averaged gradient again
    # local steps (tgsim/train/local_sgd.py): "none" = the synchronous gradient exchange every step;
    # "average" = local SGD, the models averaged exactly every `every` steps; "pqasgd" = the model
    # difference since the last sync sent through the codec every `every` steps (Jiang & Agrawal 2018)
    local: str = "none"
    every: int = 1               # the sync period p of the local modes (steps)


@dataclass(frozen=True)
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    codec: CodecConfig = field(default_factory=CodecConfig)
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)


_SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}


def _section(cls, name: str, values: dict):
    if not isinstance(values, dict):
        raise ConfigError(f"[{name}] must be a table")
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in [{name}]; valid: {sorted(known)}")
    kw = {}
    for k, v in values.items():
        default = known[k].default if known[k].default is not dataclasses.MISSING else known[k].default_factory()
        if isinstance(default, bool) and not isinstance(v, bool):
            raise ConfigError(f"[{name}] {k} must be true or false, got {v!r}")
        if isinstance(default, int) and not isinstance(default, bool) and not (isinstance(v, int) and not isinstance(v, bool)):
            raise ConfigError(f"[{name}] {k} must be an integer, got {v!r}")
        if isinstance(default, float) and not (isinstance(v, (int, float)) and not isinstance(v, bool)):
            raise ConfigError(f"[{name}] {k} must be a number, got {v!r}")
        if isinstance(default, float):
            v = float(v)
        if isinstance(default, tuple):
            v = tuple(v)
        kw[k] = v
    return cls(**kw)


def from_dict(d: dict[str, Any]) -> Config:
    """The validated Config of the nested dict `d` (a parsed TOML file: one table per section);
    ConfigError on an unknown section or key, or a value `validate` refuses."""
    unknown = sorted(set(d) - set(_SECTIONS))
    if unknown:
        raise ConfigError(f"unknown section(s) {unknown}; valid: {sorted(_SECTIONS)}")
    classes = {f.name: type(getattr(Config(), f.name)) for f in dataclasses.fields(Config)}
    cfg = Config(**{name: codec_section(d.get(name, {})) if name == "codec" else
                  _section(classes[name], name, d.get(name, {})) for name in _SECTIONS})
    validate(cfg)
    return cfg


def builtin_names() -> tuple[str, ...]:
    """The configs that ship in the package (tgsim/configs/NAME.toml), by name."""
    from importlib import resources

    return tuple(sorted(p.name[:-5] for p in (resources.files("tgsim") / "configs").iterdir()
                        if p.name.endswith(".toml")))


def builtin_path(name: str) -> Path | None:
    """tgsim/configs/NAME.toml inside the installed package for NAME = `name`, or None when there is none."""
    from importlib import resources

    path = resources.files("tgsim") / "configs" / f"{name}.toml"
    return Path(str(path)) if path.is_file() else None


def config_path(arg: str | Path) -> Path:
    """The TOML file `arg` names: a path, else the name of a built-in config (`demo` is
    tgsim/configs/demo.toml inside the installed package). ConfigError when it is neither."""
    path = Path(arg)
    if path.is_file():
        return path
    builtin = builtin_path(str(arg))
    if builtin is not None:
        return builtin
    raise ConfigError(f"config file {arg} does not exist (built-in configs, by name: {', '.join(builtin_names())})")


def load(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Read a TOML file (a path, or a built-in config's name: `config_path`) and apply
    `section.key=value` overrides (values parsed as TOML)."""
    path = config_path(path)
    with open(path, "rb") as f:
        d = tomllib.load(f)
    return from_dict(apply_overrides(d, overrides or []))


def _renamed_codec(codec: dict, name) -> dict:
    """The [codec] table `codec` about to be given codec `name`: as it is for the same codec; for
    another, only name, kernels and error_feedback (its option keys belong to its old codec)."""
    if name == codec.get("name", registry.DEFAULT):
        return dict(codec)
    return {k: v for k, v in codec.items() if k in _CODEC_KEYS}


def merge_sections(base: dict, sections: dict) -> dict:
    """A config dict: `base` with each section of `sections` merged key by key over base's; a
    [codec] section that names another codec replaces base's codec options (`apply_overrides`' rule)."""
    d = {k: dict(v) for k, v in base.items()}
    for name, values in sections.items():
        old = d.get(name, {})
        if name == "codec" and "name" in values:
            old = _renamed_codec(old, values["name"])
        d[name] = {**old, **values}
    return d


def apply_overrides(d: dict, overrides: list[str]) -> dict:
    """`d` with `section.key=value` overrides applied (values parsed as TOML, else a bare string).

    An override that names another codec (`codec.name=...`) starts its [codec] section anew: the
    file's option keys, which belong to the file's codec, are dropped (name, kernels and
    error_feedback are kept), and the other `codec.*` overrides apply to the new codec."""
    d = json.loads(json.dumps(d))
    parsed = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) < 2:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw  # a bare string
        parsed.append((parts, value))
    names = [v for parts, v in parsed if parts == ["codec", "name"]]
    if isinstance(d.get("codec"), dict) and names:
        d["codec"] = _renamed_codec(d["codec"], names[-1])
    for parts, value in parsed:
        node = d
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return d


def validate(cfg: Config) -> None:
    """Check the combination of `cfg`'s values (worker count and batch, run lengths, codec, exchange,
    optimizer, schedule, data); returns None, raises ConfigError naming the section and key at fault."""
    w, r = cfg.workers, cfg.run
    if w.n < 1:
        raise ConfigError(f"[workers] n must be >= 1, got {w.n}")
    if w.batch_mode not in ("total", "per_worker"):
        raise ConfigError(f"[workers] batch_mode must be 'total' or 'per_worker', got {w.batch_mode!r}")
    if w.batch_mode == "total" and (w.batch % w.n or w.batch < w.n):
        raise ConfigError(f"[workers] total batch {w.batch} cannot be split evenly over {w.n} workers")
    if w.batch < 1:
        raise ConfigError(f"[workers] batch must be >= 1, got {w.batch}")
    if r.steps < 0 or r.eval_every < 0 or r.log_every < 1 or r.checkpoint_every < 0 or r.keep_checkpoints < 1:
        raise ConfigError("[run] steps/eval_every/checkpoint_every must be >= 0, log_every/keep_checkpoints >= 1")
    if r.on_nonfinite not in ("raise", "skip"):
        raise ConfigError(f"[run] on_nonfinite must be 'raise' or 'skip', got {r.on_nonfinite!r}")
    if not 0.0 <= r.max_skipped_fraction <= 1.0:
        raise ConfigError(f"[run] max_skipped_fraction must be in [0, 1], got {r.max_skipped_fraction}")
    if not 0 <= r.seed < 2**63:
        raise ConfigError(f"[run] seed must be in [0, 2^63), got {r.seed}")
    if r.backend not in BACKENDS:
        raise ConfigError(f"[run] backend must be one of {BACKENDS}, got {r.backend!r}")
    c = cfg.codec
    try:
        registry.codec_class(c.name)      # a built-in codec, a plugin or "package.module:Class"
    except ValueError as err:
        raise ConfigError(f"[codec] {err}") from err
    if c.kernels not in ("auto", "reference", "numba", "cuda"):
        raise ConfigError(f"[codec] kernels must be auto/reference/numba/cuda, got {c.kernels!r}")
    e = cfg.exchange
    if e.mode not in EXCHANGE_MODES:
        raise ConfigError(f"[exchange] mode must be one of {EXCHANGE_MODES}, got {e.mode!r}")
    try:
        props = registry.make_codec(c).properties
    except (TypeError, ValueError) as err:
        raise ConfigError(f"[codec] {err}") from err
    _check_backend(cfg, props)
    if e.reternarize_downlink and e.mode != "ps":
        raise ConfigError("[exchange] reternarize_downlink needs mode = 'ps'")
    if e.reternarize_downlink and not props.server_reencodes:
        raise ConfigError(f"[exchange] reternarize_downlink needs a codec whose server re-encodes; {c.name!r} does not")
    if e.mode == "allreduce" and not (props.sums_exactly or props.float_mean):
        raise ConfigError(f"[exchange] mode 'allreduce' needs a codec whose codes sum exactly; {c.name!r} sends "
                          "whole messages: use 'ps' or 'allgather'")
    if e.mode == "allreduce" and props.sums_exactly and (props.shared_stats is None or not e.share_scalers):
        raise ConfigError("[exchange] integer all-reduce of ternary codes needs share_scalers = true "
                          "(summing codes with different scalers is wrong)")
    if e.mode == "sharded_ps" and not (props.sums_exactly or props.float_mean):
        raise ConfigError(f'[exchange] mode = "sharded_ps" needs a codec whose codes sum exactly; {c.name!r} sends '
                          "whole messages: use 'ps' or 'allgather'")
    if e.mode == "sharded_ps" and props.sums_exactly and (props.shared_stats is None or not e.share_scalers):
        from tgsim.exchange.sharded import refusal     # the exchange's own one-line reason

        raise ConfigError(refusal(shared=False, reternarize=False))
    if cfg.optimizer.name not in OPTIMIZERS:
        raise ConfigError(f"[optimizer] unknown optimizer {cfg.optimizer.name!r}; expected one of {OPTIMIZERS}")
    if cfg.schedule.name not in SCHEDULES:
        raise ConfigError(f"[schedule] unknown schedule {cfg.schedule.name!r}; expected one of {SCHEDULES}")
    if cfg.data.sharding not in ("iid", "dirichlet"):
        raise ConfigError(f"[data] sharding must be 'iid' or 'dirichlet', got {cfg.data.sharding!r}")
    _check_local_steps(cfg, props)


BACKENDS = ("numpy", "cupy")


def _check_backend(cfg: Config, props) -> None:
    """ConfigError for a combination the CuPy backend does not run (checked before any work): a codec
    that does not declare "cupy" in its properties.backends; error feedback and local steps (their
    per-worker state is kept in host arrays)."""
    if cfg.run.backend != "cupy":
        if cfg.codec.kernels == "cuda":
            raise ConfigError("[codec] kernels = 'cuda' runs on CuPy arrays: set run.backend = 'cupy'")
        return
    if "cupy" not in props.backends:
        gpu = [n for n in registry.names()
               if "cupy" in registry.make_codec(CodecConfig(name=n)).properties.backends]
        raise ConfigError(f"[run] backend 'cupy' runs the codecs {', '.join(gpu)}; {cfg.codec.name!r} runs on "
                          "NumPy only (run.backend = 'numpy')")
    if cfg.codec.kernels == "numba":
        raise ConfigError("[codec] kernels = 'numba' runs on NumPy arrays; with run.backend = 'cupy' use "
                          "'auto', 'cuda' or 'reference'")
    if cfg.codec.error_feedback or cfg.exchange.local != "none":
        raise ConfigError("[run] backend 'cupy' does not run error feedback or local steps yet (their "
                          "per-worker state lives in host arrays): use run.backend = 'numpy'")


def _check_local_steps(cfg: Config, props) -> None:
    """[exchange] local / every: the combinations tgsim/train/local_sgd.py cannot run, and why."""
    e, r, o = cfg.exchange, cfg.run, cfg.optimizer
    if e.local not in LOCAL_MODES:
        raise ConfigError(f"[exchange] local must be one of {LOCAL_MODES}, got {e.local!r}")
    if e.every < 1:
        raise ConfigError(f"[exchange] every must be >= 1 (the sync period in steps), got {e.every}")
    if e.local == "none":
        if e.every != 1:
            raise ConfigError(f"[exchange] every = {e.every} needs local = 'average' (local SGD) or 'pqasgd': "
                              "local = 'none' exchanges the gradients at every step")
        return
    if e.local == "average" and not props.float_mean:
        raise ConfigError(f"[exchange] local = 'average' averages the models exactly in float32, so the codec "
                          f"{cfg.codec.name!r} would not be used: use a float32 codec (fp32), or local = 'pqasgd' "
                          "to send the model difference through the codec")
    if props.stateful or getattr(cfg.codec, "error_feedback", False):
        raise ConfigError(f"[exchange] local = {e.local!r} does not carry per-worker codec state (error feedback's "
                          "residuals, a stateful codec's state) between syncs; use local = 'none' for it")
    if r.checkpoint_every % e.every:
        raise ConfigError(f"[run] checkpoint_every = {r.checkpoint_every} must be a multiple of [exchange] every = "
                          f"{e.every}: checkpoints are written at sync steps only (between syncs every worker "
                          "holds its own model, which a checkpoint does not store)")
    if e.every > 1 and o.name == "adam":
        raise ConfigError(f"[exchange] every = {e.every} with optimizer 'adam': the local steps are plain SGD steps "
                          "at the schedule's learning rate, which for Adam is a step size, not an SGD learning rate; "
                          "use sgd, momentum or nesterov (Adam applies with every = 1)")
    if e.every > 1 and o.weight_decay != 0.0:
        raise ConfigError(f"[exchange] every = {e.every} with [optimizer] weight_decay = {o.weight_decay}: the decay "
                          "would act on the synchronized model once per period, not at each local step; put the "
                          "L2 term in the model (model.options.l2), which every local gradient includes")


def codec_dict(c: CodecConfig) -> dict:
    """The flat [codec] table of `c`: name, error_feedback, kernels and every option of the codec with
    its value (defaults filled in, tuples as lists), so that equal configs give equal tables."""
    from tgsim.codecs import options as codec_options

    return {"name": c.name, "error_feedback": c.error_feedback, "kernels": c.kernels,
            **codec_options.resolved(registry.codec_class(c.name), c)}


def to_dict(cfg: Config) -> dict:
    """The config `cfg` as nested plain dicts (what config.toml and config_hash store; `from_dict` reads
    it back): the [codec] section flat (codec_dict)."""
    d = dataclasses.asdict(cfg)
    d["codec"] = codec_dict(cfg.codec)
    return d


def config_hash(cfg: Config) -> str:
    """sha256 (hex) of the resolved config `cfg` (what ranks compare at start-up)."""
    return hashlib.sha256(json.dumps(to_dict(cfg), sort_keys=True).encode()).hexdigest()


# Keys a resumed run may change without --allow-change (`resume_changes`): none of them changes a
# parameter bit of any step, so the run continues as if it had been started with the new values.
#   run.steps                 the run's length (refused where the schedule decays over it: poly)
#   run.name                  a label (progress bar, default directory name)
#   run.log_every, run.eval_every   which steps write per-layer statistics / evaluate: reads only
#   run.checkpoint_every, run.keep_checkpoints   where the state is saved, not what it is
#   run.on_nonfinite          a run that reached the resume point under "raise" skipped no step, so
#                             continuing under "skip" gives the bits of a run started with "skip"
#   run.max_skipped_fraction  only the exit status of the run's end
#   run.tensorboard           whether metrics.csv's scalars also go to TensorBoard event files
#   run.backend               the one exception that changes bits from the resume point on: a checkpoint
#                             holds host arrays and resumes on either backend (CPU <-> GPU, the
#                             documented move of a run between machines); recorded like the others
RESUME_FREE_KEYS = ("run.steps", "run.name", "run.log_every", "run.eval_every", "run.checkpoint_every",
                    "run.keep_checkpoints", "run.on_nonfinite", "run.max_skipped_fraction", "run.backend",
                    "run.tensorboard")
SCHEDULES_OVER_STEPS = ("poly",)      # schedules whose learning rate depends on run.steps


def flat_dict(cfg: Config) -> dict[str, Any]:
    """{"section.key": value} of the resolved config `cfg` (to_dict, one level; tables stay values)."""
    return {f"{sec}.{k}": v for sec, keys in to_dict(cfg).items() for k, v in keys.items()}


def resume_changes(stored: Config, new: Config, allow: tuple[str, ...] | list[str] = ()) -> dict[str, tuple]:
    """{key: (stored value, new value)} of the keys that differ between the config `stored` of a run
    directory and the config `new` it is resumed with, when every difference is accepted: a key of
    RESUME_FREE_KEYS (run.steps only where the schedule does not decay over it) or one named in
    `allow` (--allow-change: a key, or a section for all its keys). ConfigError listing the refused keys otherwise: a resumed run with
    another codec, learning rate, data, ... would mix two configs in one run directory."""
    old, cur = flat_dict(stored), flat_dict(new)
    changed = {k: (old.get(k), cur.get(k)) for k in sorted(set(old) | set(cur)) if old.get(k) != cur.get(k)}
    free = set(RESUME_FREE_KEYS)
    if new.schedule.name in SCHEDULES_OVER_STEPS or stored.schedule.name in SCHEDULES_OVER_STEPS:
        free.discard("run.steps")
    unknown = sorted(set(allow) - set(old) - set(cur) - set(_SECTIONS))
    if unknown:
        raise ConfigError(f"--allow-change {', '.join(unknown)}: no such config key (section.key, or a section)")
    allowed = set(allow)
    refused = [k for k in changed if k not in free and k not in allowed and k.split(".")[0] not in allowed]
    if refused:
        shown, names = refused, refused
        if "codec.name" in refused:         # another codec: its options differ too, one section to allow
            others = [k for k in refused if k.startswith("codec.") and k != "codec.name"]
            shown = [k for k in refused if k not in others]
            names = [k if k != "codec.name" else "codec" for k in shown]
        diff = "; ".join(f"{k}: {changed[k][0]!r} -> {changed[k][1]!r}" for k in shown)
        if "codec.name" in refused and len(shown) < len(refused):
            diff += f" (and {len(refused) - len(shown)} codec options)"
        why = (" (run.steps: the 'poly' schedule decays over it, so every step's learning rate changes)"
               if "run.steps" in refused else "")
        raise ConfigError(f"--resume: the config differs from the run's config.toml in {diff}{why}; resume with "
                          f"the run's own config, or pass --allow-change {' --allow-change '.join(names)} to "
                          "continue with the change (recorded in resumes.jsonl)")
    return changed
