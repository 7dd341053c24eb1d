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

The class must provide `from_config(codec_config)` and the protocol of tgsim.codecs.base. It then
runs in the simulator (`tgsim run`), over MPI (`tgsim.mpi_runs.train`, where every rank must import
it), under `tgsim analyze unbiasedness --codec NAME`, `tgsim compare variance|bits|speedup|time`
and through the contract (tgsim.testing.CodecContract) with no edit to tgsim.
examples/plugin_codec/ is a complete plugin. Modules load on first use, so listing a codec costs
nothing until it is built.
"""

from __future__ import annotations

import importlib
from importlib import metadata

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
    """The codec of a [codec] config section (anything with a `name` and the section's keys)."""
    return codec_class(cfg.name).from_config(cfg)


def describe(cfg_defaults) -> list[dict]:
    """One row per registered codec, built-in and plugin: its name, its class ("module:Class"), where
    it comes from ("builtin" | "plugin") and the declared properties of its default instance."""
    import dataclasses

    rows = []
    for name in names():
        codec = make_codec(dataclasses.replace(cfg_defaults, name=name))
        rows.append({"codec": name, "class": target(name), "source": "builtin" if name in CODECS else "plugin",
                     **dataclasses.asdict(codec.properties)})
    return rows
