"""The codec registry: every registered codec is listed, configured by name, refused where its wire
cannot go, and trains in the simulator in every mode its properties allow."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tgsim import cli
from tgsim.codecs import registry
from tgsim.errors import ConfigError
from tgsim.train.config import CodecConfig, from_dict
from tgsim.train.loop import run

BASE = {
    "run": {"name": "reg", "seed": 1, "steps": 6, "eval_every": 0, "log_every": 3},
    "data": {"name": "digits"},
    "model": {"name": "mlp", "options": {"hidden": [16]}},
    "workers": {"n": 3, "batch": 24},
    "optimizer": {"name": "momentum"},
    "schedule": {"name": "constant", "lr": 0.05},
}


def _modes(name: str) -> list[str]:
    props = registry.make_codec(dataclasses.replace(CodecConfig(), name=name)).properties
    return ["ps", "allgather"] + ([] if props.wire == "own" else ["allreduce"])


def test_tgsim_codecs_lists_every_registered_codec(capsys):
    assert cli.main(["codecs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["codec", "unbiased", "wire"]
    assert [line.split()[0] for line in out[1:1 + len(registry.names())]] == list(registry.names())


def test_unknown_codec_names_the_known_ones():
    with pytest.raises(ConfigError, match=f"unknown codec .nosuch.; expected one of {', '.join(registry.names())}"):
        from_dict({**BASE, "codec": {"name": "nosuch"}})


@pytest.mark.parametrize("name", [n for n in registry.names() if "allreduce" not in _modes(n)])
def test_whole_message_codecs_are_refused_in_allreduce(name):
    with pytest.raises(ConfigError, match="allreduce' needs a codec whose codes sum exactly"):
        from_dict({**BASE, "codec": {"name": name}, "exchange": {"mode": "allreduce"}})


@pytest.mark.parametrize("name,mode", [(n, m) for n in registry.names() for m in _modes(n)])
def test_every_registered_codec_trains_in_the_simulator(tmp_path, name, mode):
    cfg = from_dict({**BASE, "codec": {"name": name}, "exchange": {"mode": mode}})
    res = run(cfg, out=tmp_path / "r", quiet=True)
    assert np.isfinite(res.test_loss) and res.bits_up > 0 and res.bits_down > 0
    again = run(cfg, out=tmp_path / "again", quiet=True)
    assert all(np.array_equal(res.params[k], again.params[k]) for k in res.params)


def test_fp16_sends_16_bits_per_element_up():
    cfg = from_dict({**BASE, "codec": {"name": "fp16"}, "exchange": {"mode": "ps"}})
    res = run(cfg, out=None, quiet=True, writer=False)
    n_params = sum(int(np.prod(s)) for s in cfg_model_shapes(cfg).values())
    per_step = res.bits_up / cfg.run.steps
    assert 16 * n_params < per_step < 16 * n_params + 8 * 64      # + the 22-byte header


def cfg_model_shapes(cfg):
    from tgsim.train.loop import build

    return build(cfg).model.layer_shapes()


@pytest.mark.parametrize("codec,mode,says", [
    ("terngrad", "allgather", "reternarize_downlink needs mode = 'ps'"),
    ("fp32", "ps", "reternarize_downlink needs a codec whose server re-encodes; 'fp32' does not"),
])
def test_reternarized_downlink_needs_ps_and_a_reencoding_codec(codec, mode, says):
    with pytest.raises(ConfigError, match=says):
        from_dict({**BASE, "codec": {"name": codec}, "exchange": {"mode": mode, "reternarize_downlink": True}})


@pytest.mark.mutation
def test_registry_names_classes_and_describe():
    """The registered names, in the documented order, each naming a class whose own `name` is the
    registered name (what configs, the CLI and MPI runs rely on); DEFAULT is terngrad, the config's
    default; describe() gives one row per name with its "module:Class"; an unknown name is a
    ValueError."""
    from tgsim.codecs import registry
    from tgsim.train.config import CodecConfig

    want = ("fp32", "terngrad", "fp16", "bf16", "sign", "scaled_sign", "qsgd", "suresh", "topk", "randomk",
            "powersgd")
    assert registry.names() == want
    assert registry.DEFAULT == "terngrad" == CodecConfig().name
    assert registry.CODECS == {
        "fp32": "tgsim.codecs.fp32:Float32", "terngrad": "tgsim.codecs.terngrad:TernGrad",
        "fp16": "tgsim.codecs.fp16:Float16", "bf16": "tgsim.codecs.bf16:BFloat16",
        "sign": "tgsim.codecs.sign:SignSGD", "scaled_sign": "tgsim.codecs.sign:ScaledSign",
        "qsgd": "tgsim.codecs.qsgd:QSGD", "suresh": "tgsim.codecs.suresh:Suresh",
        "topk": "tgsim.codecs.sparse:TopK", "randomk": "tgsim.codecs.sparse:RandomK",
        "powersgd": "tgsim.codecs.powersgd:PowerSGD"}
    for name in want:
        assert registry.codec_class(name).name == name
    rows = registry.describe(CodecConfig())
    assert [(r["codec"], r["class"]) for r in rows] == [(n, registry.CODECS[n]) for n in want]
    with pytest.raises(ValueError, match="unknown codec"):
        registry.codec_class("nosuch")
