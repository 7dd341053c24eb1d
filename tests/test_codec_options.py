"""Per-codec options (tgsim.codecs.options): every registered codec declares `Options`, a frozen
dataclass of its [codec] keys; a config is checked against it (unknown keys, types, choices and
bounds are ConfigErrors that name the codec and the key); `tgsim codecs` prints each codec's
options; config.toml round trips and digests do not depend on whether defaults were written out."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tgsim import cli
from tgsim.codecs import options, registry
from tgsim.errors import ConfigError
from tgsim.train import config as config_mod
from tgsim.train.config import CodecConfig, from_dict

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plugin_codec"
PLUGIN = "tgsim_example_codec:StochasticBF16"     # by import path, with EXAMPLE on sys.path (`example`)
BASE = {"exchange": {"mode": "ps"}}


@pytest.fixture
def example(monkeypatch):
    """examples/plugin_codec on sys.path for one test (a local build of it may declare an entry point,
    which must not leak into other tests' registry)."""
    monkeypatch.syspath_prepend(str(EXAMPLE))


def codec(**section):
    return from_dict({**BASE, "codec": section}).codec


# -- parse ---------------------------------------------------------------------------------------------

def test_defaults_and_given_values():
    """Keys left out take the codec's defaults; given ones are kept, an integer for a float widened."""
    qsgd = registry.codec_class("qsgd")
    o = options.parse(qsgd, CodecConfig(name="qsgd", options={"levels": 3}))
    assert (o.levels, o.bucket, o.norm) == (3, 512, "l2")
    tg = options.parse(registry.codec_class("terngrad"), {"clip_factor": 3, "float_layers": ["a"]})
    assert tg.clip_factor == 3.0 and isinstance(tg.clip_factor, float) and tg.float_layers == ("a",)
    assert dataclasses.is_dataclass(o) and o.__dataclass_params__.frozen


def test_the_defaults_are_those_of_the_flat_config():
    """The same defaults per codec as the one flat CodecConfig had, so existing configs mean what they
    meant (the golden bits rely on terngrad's)."""
    tg = registry.make("terngrad")
    assert (tg.clip, tg.clip_factor, tg.packing, tg.min_size, tg.float_layers, tg.sharing) == \
        ("explicit", 2.5, "2bit", 0, (), "max")
    q = registry.make("qsgd")
    assert (q.levels, q.bucket, q.norm) == (7, 512, "l2")
    s = registry.make("suresh")
    assert (s.levels, s.rotate) == (7, False)
    for name in ("topk", "randomk"):
        c = registry.make(name)
        assert (c.density, c.k) == (0.01, 0)


def test_an_unknown_key_names_the_codec_and_its_options():
    with pytest.raises(ConfigError) as e:
        codec(name="terngrad", density=0.5)
    assert "codec 'terngrad' has no option 'density'; its options: clip, clip_factor, packing, min_size, " \
           "float_layers, sharing" in str(e.value)
    with pytest.raises(ConfigError, match="codec 'fp32' has no option 'levels'; its options: none"):
        codec(name="fp32", levels=3)
    with pytest.raises(ConfigError, match="codec 'qsgd' has no options 'rotate', 'k'; its options: levels, bucket"):
        registry.make_codec(CodecConfig(name="qsgd", options={"rotate": True, "k": 2}))


@pytest.mark.parametrize("section, says", [
    ({"name": "qsgd", "levels": "seven"}, "codec 'qsgd' option 'levels' must be an integer, got 'seven'"),
    ({"name": "qsgd", "levels": 0}, "codec 'qsgd' option 'levels' must be >= 1, got 0"),
    ({"name": "qsgd", "norm": "l3"}, "codec 'qsgd' option 'norm' must be one of 'l2', 'max', got 'l3'"),
    ({"name": "suresh", "rotate": 1}, "codec 'suresh' option 'rotate' must be true or false, got 1"),
    ({"name": "topk", "density": "all"}, "codec 'topk' option 'density' must be a number, got 'all'"),
    ({"name": "topk", "density": 2.0}, "codec 'topk' option 'density' must be <= 1.0, got 2.0"),
    ({"name": "terngrad", "clip": "soft"}, "codec 'terngrad' option 'clip' must be one of 'none', 'explicit'"),
    ({"name": "terngrad", "clip_factor": -1.0}, "codec 'terngrad': clip_factor must be a positive number"),
    ({"name": "terngrad", "float_layers": "fc"}, "codec 'terngrad' option 'float_layers' must be a list"),
    ({"name": PLUGIN, "mantissa_bits": 9}, f"codec '{PLUGIN}' option 'mantissa_bits' must be <= 7, got 9"),
])
def test_a_wrong_value_names_the_codec_and_the_key(section, says, example):
    with pytest.raises(ConfigError) as e:
        codec(**section)
    assert says in str(e.value)


def test_common_keys_are_not_options():
    """name, kernels and error_feedback are the section's own keys for every codec."""
    c = codec(name="topk", kernels="reference", error_feedback=True, density=0.25)
    assert (c.name, c.kernels, c.error_feedback, c.options) == ("topk", "reference", True, {"density": 0.25})
    with pytest.raises(ConfigError, match=r"\[codec\] kernels must be"):
        codec(name="topk", kernels="gpu")


# -- every codec declares Options ------------------------------------------------------------------------

@pytest.mark.parametrize("name", [*registry.names(), PLUGIN])
def test_every_registered_codec_declares_options(name, example):
    """A frozen dataclass with a default and a one-line help for every field, at most a tuple of sweep
    values, and a default instance equal to the parse of an empty config."""
    cls = registry.codec_class(name)
    assert "Options" in vars(cls) or any("Options" in vars(b) for b in cls.__mro__[1:-1]), name
    opts = cls.Options
    assert dataclasses.is_dataclass(opts) and opts.__dataclass_params__.frozen
    for f in dataclasses.fields(opts):
        assert f.default is not dataclasses.MISSING
        assert f.metadata.get("help") and "\n" not in f.metadata["help"], (name, f.name)
        assert isinstance(f.metadata.get("sweep", ()), tuple)
    assert options.parse(cls, CodecConfig(name=name)) == opts()


def test_a_class_without_options_takes_no_keys():
    class Bare:
        name = "bare"

    assert options.options_class(Bare) is options.NoOptions and options.keys(Bare) == ()
    with pytest.raises(ConfigError, match="codec 'bare' has no option 'x'; its options: none"):
        options.parse(Bare, {"x": 1})


def test_an_options_class_must_be_frozen():
    class Loose:
        @dataclasses.dataclass
        class Options:
            a: int = 1

    with pytest.raises(TypeError, match="frozen"):
        options.parse(Loose, {})


def test_sweeps_come_from_the_metadata(example):
    assert options.sweep(registry.codec_class("qsgd"))[0] == "levels"
    assert options.sweep(registry.codec_class("topk")) == ("density", (0.02, 0.05, 0.1, 0.25, 0.5, 1.0))
    assert options.sweep(registry.codec_class("fp32")) is None
    assert options.sweeps(registry.codec_class(PLUGIN)) == {"mantissa_bits": (3, 5, 7)}
    assert options.compare_with_error_feedback(registry.codec_class("topk"))
    assert not options.compare_with_error_feedback(registry.codec_class("randomk"))


# -- the config file -------------------------------------------------------------------------------------

def test_round_trip_and_digest():
    """to_dict writes the [codec] table flat, every option resolved; from_dict reads it back to an
    equal config; a config that names its defaults has the digest of one that leaves them out."""
    a = from_dict({**BASE, "codec": {"name": "qsgd", "levels": 3}})
    d = config_mod.to_dict(a)
    assert d["codec"] == {"name": "qsgd", "error_feedback": False, "kernels": "auto",
                          **options.resolved(registry.codec_class("qsgd"), {"levels": 3})}
    back = from_dict(d)
    assert config_mod.to_dict(back) == d and config_mod.config_hash(back) == config_mod.config_hash(a)
    explicit = from_dict({**BASE, "codec": {"name": "qsgd", "levels": 3, "bucket": 512}})
    assert config_mod.config_hash(explicit) == config_mod.config_hash(a)
    other = from_dict({**BASE, "codec": {"name": "qsgd", "levels": 4}})
    assert config_mod.config_hash(other) != config_mod.config_hash(a)


def test_a_config_toml_with_every_old_flat_key_still_loads():
    """Results directories written before the codecs declared options hold every codec's keys; such a
    [codec] table loads, keeping the named codec's keys only."""
    old = {"name": "terngrad", "clip": "none", "clip_factor": 2.5, "packing": "base3", "min_size": 0,
           "float_layers": [], "kernels": "auto", "levels": 7, "bucket": 512, "norm": "l2", "coding": "fixed",
           "density": 0.01, "k": 0, "rotate": False, "sharing": "mean", "error_feedback": False}
    c = codec(**old)
    assert c.options == {"clip": "none", "clip_factor": 2.5, "packing": "base3", "min_size": 0,
                         "float_layers": [], "sharing": "mean"}
    partial = {k: v for k, v in old.items() if k != "rotate"}
    with pytest.raises(ConfigError, match="has no options 'levels'"):
        codec(**partial)


# -- tgsim codecs ----------------------------------------------------------------------------------------

def test_tgsim_codecs_prints_every_option_with_default_and_help(capsys):
    assert cli.main(["codecs"]) == 0
    out = capsys.readouterr().out
    blocks = out.split("\noptions")[1]
    for name in registry.names():
        cls = registry.codec_class(name)
        assert f"\n{name}:" in blocks
        for row in options.describe(cls):
            default = list(row["default"]) if isinstance(row["default"], tuple) else row["default"]
            assert f"  {row['key']} = {default!r}  {row['help']}" in blocks, (name, row["key"])
    assert "\nfp32: none" in blocks
    assert "levels = 7  s: quantization levels" in blocks and "compare sweeps 1, 3, 7, 31, 255" in blocks


def test_an_override_naming_another_codec_starts_its_section_anew():
    """`--set codec.name=...` on a config written for TernGrad drops TernGrad's option keys (they are not
    the new codec's); the other codec overrides apply to the new codec; without a new name the file's
    options stay."""
    fp32 = config_mod.load("demo", ["codec.name='fp32'"]).codec
    assert (fp32.name, fp32.options) == ("fp32", {})
    q = config_mod.load("demo", ["codec.levels=3", "codec.name='qsgd'", "exchange.mode='ps'"]).codec
    assert (q.name, q.options) == ("qsgd", {"levels": 3})
    tg = config_mod.load("demo", ["codec.sharing='max'"]).codec
    assert tg.name == "terngrad" and tg.options["clip"] == "explicit" and tg.options["sharing"] == "max"
    with pytest.raises(ConfigError, match="codec 'fp32' has no option 'clip'"):
        config_mod.load("demo", ["codec.name='fp32'", "codec.clip='none'"])


def test_merging_a_section_that_names_another_codec_drops_the_old_options():
    base = {**BASE, "codec": {"name": "terngrad", "clip": "none", "kernels": "reference"}}
    d = config_mod.merge_sections(base, {"codec": {"name": "fp32"}})
    assert d["codec"] == {"name": "fp32", "kernels": "reference"} and base["codec"]["clip"] == "none"
    assert config_mod.merge_sections(base, {"codec": {"sharing": "mean"}})["codec"] == \
        {"name": "terngrad", "clip": "none", "kernels": "reference", "sharing": "mean"}
    assert from_dict(d).codec.name == "fp32"
