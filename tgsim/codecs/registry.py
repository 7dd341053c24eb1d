"""Codecs by name, for configs (`[codec] name = ...`), the CLI (`tgsim codecs`) and the contract tests.

Adding a codec: write its module (a class with `name`, `properties`, `from_config(codec_config)` and
the protocol of tgsim.codecs.base), then add one line to CODECS below. It then runs in the
simulator (`tgsim run`), over MPI (`mpi_runs.train`) and through the contract (tgsim.testing) with
no other edit. Modules load on first use, so listing a codec costs nothing until it is built.
"""

from __future__ import annotations

import importlib

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


def names() -> tuple[str, ...]:
    return tuple(CODECS)


def codec_class(name: str):
    """The class registered as `name` (ValueError naming the known ones)."""
    if name not in CODECS:
        raise ValueError(f"unknown codec {name!r}; expected one of {', '.join(CODECS)}")
    module, cls = CODECS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_codec(cfg):
    """The codec of a [codec] config section (anything with a `name` and the section's keys)."""
    return codec_class(cfg.name).from_config(cfg)


def describe(cfg_defaults) -> list[dict]:
    """One row per registered codec: its name and the declared properties of its default instance."""
    import dataclasses

    rows = []
    for name in CODECS:
        codec = make_codec(dataclasses.replace(cfg_defaults, name=name))
        rows.append({"codec": name, "class": CODECS[name], **dataclasses.asdict(codec.properties)})
    return rows
