"""Codecs by name, for configs (`[codec] name = ...`), the CLI (`tgsim codecs`) and the contract tests.

A codec name is one of three things, looked up in this order:

1. a built-in codec: a key of CODECS below;
2. a plugin: an entry point of the group `tgsim.codecs` in any installed distribution, e.g. in the
   plugin's pyproject.toml

       [project.entry-points."tgsim.codecs"]
       sr_bf16 = "tgsim_example_codec:StochasticBF16"

   (a plugin named like a built-in codec is shadowed by it; `tgsim codecs` lists both kinds);
3. an import path "package.module:Class", e.g. `[codec] name = "mycodecs.lowrank:LowRank"`, for a
   module on sys.path (the current directory or PYTHONPATH), with nothing installed.

The class must provide `from_config(codec_config)` and the protocol of tgsim.codecs.base, and
declares its [codec] keys as `Options` (tgsim.codecs.options: defaults, help, the knob `tgsim
compare` sweeps). It then
runs in the simulator (`tgsim run`), over MPI (`tgsim.mpi_runs.train`, where every rank must import
it), under `tgsim analyze unbiasedness --codec NAME`, `tgsim compare variance|bits|speedup|time`
and through the contract (tgsim.testing.CodecContract) with no edit to tgsim.
examples/plugin_codec/ is a complete plugin. Modules load on first use, so listing a codec costs
nothing until it is built.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from importlib import metadata

from tgsim.codecs import options

# name -> "module:Class"; DEFAULT is the codec of a config that names none
DEFAULT = "terngrad"
CODECS = {
    "fp32": "tgsim.codecs.fp32:Float32",
    "terngrad": "tgsim.codecs.terngrad:TernGrad",
    "fp16": "tgsim.codecs.fp16:Float16",
    "bf16": "tgsim.codecs.bf16:BFloat16",
    "sign": "tgsim.codecs.sign:SignSGD",
    "scaled_sign": "tgsim.codecs.sign:ScaledSign",
    "qsgd": "tgsim.codecs.qsgd:QSGD",
    "suresh": "tgsim.codecs.suresh:Suresh",
    "topk": "tgsim.codecs.sparse:TopK",
    "randomk": "tgsim.codecs.sparse:RandomK",
    "powersgd": "tgsim.codecs.powersgd:PowerSGD",
}
ENTRY_POINT_GROUP = "tgsim.codecs"


def plugins() -> dict[str, str]:
    """Installed plugin codecs: entry point name -> "module:Class", built-in names left out."""
    found = {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    return {k: found[k] for k in sorted(found) if k not in CODECS}


def names() -> tuple[str, ...]:
    """The built-in codecs, then the installed plugins (import paths "module:Class" are not listed)."""
    return tuple(CODECS) + tuple(plugins())


def target(name: str) -> str:
    """The "module:Class" that `name` stands for (ValueError naming the known names when none)."""
    if name in CODECS:
        return CODECS[name]
    found = plugins()
    if name in found:
        return found[name]
    if ":" in name:
        return name
    raise ValueError(f"unknown codec {name!r}; expected one of {', '.join(names())}, or an import path "
                     "'package.module:Class' (a plugin: docs/DESIGN.md 'Adding a codec')")


def codec_class(name: str):
    """The class that `name` stands for: a built-in codec, a plugin or "package.module:Class".

    ValueError, naming what failed, for an unknown name, a module that does not import, a missing
    class or a class without `from_config`."""
    module, _, attr = target(name).partition(":")
    if not module or not attr:
        raise ValueError(f"codec {name!r}: an import path must read 'package.module:Class'")
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"codec {name!r}: cannot import module {module!r} ({e}); is it installed or on "
                         "PYTHONPATH?") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"codec {name!r}: module {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(getattr(obj, "from_config", None)):
        raise ValueError(f"codec {name!r}: {module}:{attr} has no from_config(codec_config) "
                         "(the codec protocol, tgsim.codecs.base)")
    return obj


def make_codec(cfg):
    """The codec of a [codec] config section (anything with a `name`, `kernels` and `options`): its
    options are checked against the class's `Options` first (tgsim.codecs.options.parse: a ConfigError
    naming the codec and its keys), then `from_config(cfg)` builds it."""
    cls = codec_class(cfg.name)
    options.parse(cls, cfg)
    return cls.from_config(cfg)


@dataclass(frozen=True)
class CodecConfig:
    """The [codec] section: the codec's name, error feedback, the kernel set, and `options`, a dict of
    the codec's own keys (its `Options`, tgsim.codecs.options; `tgsim codecs` lists them). Keys left
    out take the codec's defaults. In TOML the options are flat keys of [codec] next to name, kernels
    and error_feedback."""

    name: str = DEFAULT             # a codec name, plugin or "module:Class" (codec_class)
    error_feedback: bool = False    # wrap the codec in error feedback (tgsim.codecs.error_feedback)
    kernels: str = "auto"           # "auto" | "reference" | "numba" | "cuda"
    options: dict = field(default_factory=dict)   # the codec's own keys (tgsim.codecs.options.parse)

    def with_options(self, **changes) -> "CodecConfig":
        """A copy with `changes` merged into `options`."""
        return dataclasses.replace(self, options={**self.options, **changes})



def default_config(name: str, error_feedback: bool = False, **opts):
    """A [codec] config (CodecConfig) of codec `name`, wrapped in error feedback when
    `error_feedback`, with the codec's options `opts`."""
    return CodecConfig(name=name, error_feedback=error_feedback, options=dict(opts))


def make(name: str, **opts):
    """The codec `name` with options `opts` (defaults for the rest), kernels "auto"."""
    return make_codec(_Section(name, "auto", dict(opts)))


class _Section:
    """A minimal [codec] section: name, kernels, options (what make_codec and from_config read)."""

    def __init__(self, name: str, kernels: str = "auto", options: dict | None = None):
        self.name, self.kernels, self.options, self.error_feedback = name, kernels, dict(options or {}), False


def info(name: str) -> dict:
    """What the comparisons read about codec `name` from its class and default instance: codec, class
    ("module:Class"), source ("builtin" | "plugin" | "path"), unbiased, combine, stateful (properties),
    sweep ((key, values) of the Options field with "sweep" metadata, or None), sweeps ({key: values}
    of every such field), options (tgsim.codecs.options.describe) and error_feedback (whether `tgsim
    compare` runs it with error feedback: `Options.compare_with_error_feedback`)."""
    cls = codec_class(name)
    props = make(name).properties
    return {"codec": name, "class": target(name),
            "source": "builtin" if name in CODECS else "plugin" if name in plugins() else "path",
            "unbiased": bool(props.unbiased), "combine": props.combine, "stateful": bool(props.stateful),
            "sweep": options.sweep(cls), "sweeps": options.sweeps(cls), "options": options.describe(cls),
            "error_feedback": options.compare_with_error_feedback(cls)}


def describe(cfg_defaults=None) -> list[dict]:
    """One row per registered codec, built-in and plugin: its name, its class ("module:Class"), where
    it comes from ("builtin" | "plugin"), the declared properties of its default instance and its
    options (tgsim.codecs.options.describe). `cfg_defaults`: a [codec] config whose kernels apply."""
    import dataclasses

    kernels = getattr(cfg_defaults, "kernels", "auto")
    rows = []
    for name in names():
        cls = codec_class(name)
        codec = make_codec(_Section(name, kernels))
        rows.append({"codec": name, "class": target(name), "source": "builtin" if name in CODECS else "plugin",
                     **dataclasses.asdict(codec.properties), "options": options.describe(cls)})
    return rows
