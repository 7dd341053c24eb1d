"""Per-codec options: each codec class declares its own keys, defaults and help in `Options`.

A codec declares `Options`, a frozen dataclass nested in its class, one field per key of the
`[codec]` section it reads, with a default and field metadata:

    "help"     a one-line description (printed by `tgsim codecs`);
    "sweep"    optional: a tuple of values `tgsim compare` sweeps for the codec's bits/variance
               trade-off; `tgsim compare speedup` sweeps the first such field, `compare variance`
               searches the product of all of them (a float field: bisection up to its "max");
    "choices"  optional: the only values allowed;
    "min", "max"  optional: bounds of a number, inclusive.

`option(default, help, ...)` writes that field. A class attribute `compare_with_error_feedback = True`
of `Options` (not a field) makes `tgsim compare` run the codec with error feedback.
`from_config(cfg)` reads `parse(cls, cfg)`:

    from dataclasses import dataclass
    from tgsim.codecs import options

    class QSGD:
        @dataclass(frozen=True)
        class Options:
            levels: int = options.option(7, "s quantization levels of |v|/norm", min=1,
                                         sweep=(1, 3, 7, 15))
            norm: str = options.option("l2", "the bucket norm", choices=("l2", "max"))

        @classmethod
        def from_config(cls, cfg):
            o = options.parse(cls, cfg)          # a QSGD.Options; ConfigError for a bad key/value
            return cls(levels=o.levels, norm=o.norm, kernels=getattr(cfg, "kernels", "auto"))

`cfg` is a [codec] config (tgsim.train.config.CodecConfig: `name`, `error_feedback`, `kernels`
and `options`, a dict of the codec's own keys) or a plain mapping of option keys. A key the codec
does not declare, a value of the wrong type or outside its choices/bounds is a ConfigError naming
the codec and the key (and, for an unknown key, the codec's keys). An `Options.__post_init__` may
raise ValueError for combinations; parse names the codec in front of its message. A class without
`Options` (a third-party codec written before options were declared) takes no option keys.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from tgsim.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """The options of a codec that reads no [codec] keys of its own."""


def option(default, help: str, *, sweep: tuple | None = None, choices: tuple | None = None,
           min: float | None = None, max: float | None = None):
    """A dataclass field of an `Options` class: `default`, and metadata help/sweep/choices/min/max."""
    meta: dict[str, Any] = {"help": help}
    if sweep is not None:
        meta["sweep"] = tuple(sweep)
    if choices is not None:
        meta["choices"] = tuple(choices)
    if min is not None:
        meta["min"] = min
    if max is not None:
        meta["max"] = max
    if isinstance(default, (list, dict, set)):
        raise TypeError("option defaults must be immutable (use a tuple)")
    return dataclasses.field(default=default, metadata=meta)


def options_class(codec_cls) -> type:
    """The `Options` dataclass `codec_cls` declares (NoOptions when it declares none).

    TypeError when `Options` is not a frozen dataclass or a field has no default."""
    opts = getattr(codec_cls, "Options", None)
    if opts is None:
        return NoOptions
    if not (dataclasses.is_dataclass(opts) and isinstance(opts, type)):
        raise TypeError(f"{_label(codec_cls)}.Options must be a dataclass")
    if not opts.__dataclass_params__.frozen:
        raise TypeError(f"{_label(codec_cls)}.Options must be a frozen dataclass")
    for f in dataclasses.fields(opts):
        if f.default is dataclasses.MISSING:
            raise TypeError(f"{_label(codec_cls)}.Options.{f.name} has no default")
    return opts


def keys(codec_cls) -> tuple[str, ...]:
    """The option keys `codec_cls` reads, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(options_class(codec_cls)))


def describe(codec_cls) -> list[dict]:
    """One row per option of the codec class `codec_cls`: key, type (of the default), default, help,
    sweep (tuple or None), choices (tuple or None)."""
    rows = []
    for f in dataclasses.fields(options_class(codec_cls)):
        rows.append({"key": f.name, "type": type(f.default).__name__, "default": f.default,
                     "help": f.metadata.get("help", ""), "sweep": f.metadata.get("sweep"),
                     "choices": f.metadata.get("choices")})
    return rows


def sweep(codec_cls) -> tuple[str, tuple] | None:
    """(key, values) of the option `tgsim compare` sweeps for the codec class `codec_cls`, or None when
    it has none."""
    for f in dataclasses.fields(options_class(codec_cls)):
        if "sweep" in f.metadata:
            return f.name, tuple(f.metadata["sweep"])
    return None


def sweeps(codec_cls) -> dict[str, tuple]:
    """{key: values} of every option of the codec class `codec_cls` with "sweep" metadata, in
    declaration order (the first is `sweep`'s knob; `tgsim compare variance` searches the product of
    all of them)."""
    return {f.name: tuple(f.metadata["sweep"]) for f in dataclasses.fields(options_class(codec_cls))
            if "sweep" in f.metadata}


def compare_with_error_feedback(codec_cls) -> bool:
    """Whether `tgsim compare` runs the codec class `codec_cls` wrapped in error feedback: the class
    attribute `Options.compare_with_error_feedback` (False when absent), declared by biased codecs
    whose error does not shrink without it (scaled sign, top-k)."""
    return bool(getattr(options_class(codec_cls), "compare_with_error_feedback", False))


def _label(codec_cls) -> str:
    return getattr(codec_cls, "__name__", str(codec_cls))


def _codec_name(codec_cls, cfg) -> str:
    name = getattr(cfg, "name", None)
    return str(name) if name else str(getattr(codec_cls, "name", _label(codec_cls)))


def _coerce(codec: str, f: dataclasses.Field, v):
    """`v` checked against the field's default type, choices and bounds (ConfigError naming both)."""
    default = f.default
    where = f"codec {codec!r} option {f.name!r}"
    if isinstance(default, bool):
        if not isinstance(v, bool):
            raise ConfigError(f"{where} must be true or false, got {v!r}")
    elif isinstance(default, int):
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise ConfigError(f"{where} must be an integer, got {v!r}")
    elif isinstance(default, float):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{where} must be a number, got {v!r}")
        v = float(v)
    elif isinstance(default, str):
        if not isinstance(v, str):
            raise ConfigError(f"{where} must be a string, got {v!r}")
    elif isinstance(default, tuple):
        if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {v!r}")
        v = tuple(v)
    choices = f.metadata.get("choices")
    if choices is not None and v not in choices:
        raise ConfigError(f"{where} must be one of {', '.join(map(repr, choices))}, got {v!r}")
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    if lo is not None and v < lo:
        raise ConfigError(f"{where} must be >= {lo}, got {v!r}")
    if hi is not None and v > hi:
        raise ConfigError(f"{where} must be <= {hi}, got {v!r}")
    return v


def raw_options(cfg) -> Mapping:
    """The option keys of `cfg`: its `options` dict (a CodecConfig), or `cfg` itself (a mapping)."""
    if cfg is None:
        return {}
    if isinstance(cfg, Mapping):
        return cfg
    opts = getattr(cfg, "options", None)
    return {} if opts is None else opts


def parse(codec_cls, cfg=None):
    """The `Options` instance of `codec_cls` for the [codec] config `cfg` (defaults for missing keys).

    ConfigError "codec 'NAME' has no option 'KEY'; its options: a, b, ..." for an unknown key, and a
    ConfigError naming the codec and key for a value of the wrong type or outside its choices/bounds
    (or a ValueError of `Options.__post_init__`)."""
    opts_cls = options_class(codec_cls)
    codec = _codec_name(codec_cls, cfg)
    raw = dict(raw_options(cfg))
    fields = {f.name: f for f in dataclasses.fields(opts_cls)}
    unknown = [k for k in raw if k not in fields]
    if unknown:
        valid = ", ".join(fields) if fields else "none"
        which = "option" if len(unknown) == 1 else "options"
        raise ConfigError(f"codec {codec!r} has no {which} {', '.join(map(repr, unknown))}; its options: {valid}")
    kw = {k: _coerce(codec, fields[k], v) for k, v in raw.items()}
    try:
        return opts_cls(**kw)
    except (TypeError, ValueError) as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"codec {codec!r}: {err}") from err


def resolved(codec_cls, cfg=None) -> dict:
    """Every option of `codec_cls` with its value for `cfg` (defaults filled in), tuples as lists:
    what a results directory's config.toml and the config digest store."""
    o = parse(codec_cls, cfg)
    return {f.name: (list(v) if isinstance(v := getattr(o, f.name), tuple) else v)
            for f in dataclasses.fields(o)}
