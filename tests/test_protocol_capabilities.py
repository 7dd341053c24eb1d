"""Capabilities, not a wire name (tgsim.codecs.base.CodecProperties): `wire` is derived from
float_mean / sums_exactly and must agree with them; the contract's `capability_errors` names a
declared capability whose methods are missing or wrong; the exchange and the trainer never read
`properties.wire`."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from tgsim.codecs import error_feedback, registry
from tgsim.codecs.base import CodecProperties
from tgsim.testing import capability_errors
from tgsim.train.config import CodecConfig

ROOT = Path(__file__).resolve().parents[1]


def make(name: str):
    return registry.make_codec(CodecConfig(name=name))


def test_wire_is_derived_from_the_capabilities():
    assert CodecProperties(unbiased=True, float_mean=True).wire == "float32"
    assert CodecProperties(unbiased=True, sums_exactly=True).wire == "tgm1"
    assert CodecProperties(unbiased=True).wire == "own"
    legacy = CodecProperties(unbiased=True, wire="float32")
    assert legacy.float_mean and legacy == CodecProperties(unbiased=True, float_mean=True)
    with pytest.raises(ValueError, match="contradicts"):
        CodecProperties(unbiased=True, wire="tgm1")                  # packed codes that do not sum
    with pytest.raises(ValueError, match="contradicts"):
        CodecProperties(unbiased=True, wire="own", float_mean=True)
    with pytest.raises(ValueError, match="exclude"):
        CodecProperties(unbiased=True, float_mean=True, sums_exactly=True)
    with pytest.raises(ValueError, match="defers_encode"):
        CodecProperties(unbiased=True, defers_encode=True)


class Hiding:
    """`inner` with some attributes hidden or replaced (a codec that declares more than it does)."""

    def __init__(self, inner, hide=(), **replace):
        self._inner, self._hide, self._replace = inner, set(hide), replace
        self.name, self.properties = inner.name, replace.pop("properties", inner.properties)

    def __getattr__(self, attr):
        if attr.startswith("_") or attr in self._hide:
            raise AttributeError(attr)
        return self._replace.get(attr) or getattr(self._inner, attr)


def test_registered_codecs_implement_what_they_declare():
    for name in registry.names():
        assert capability_errors(make(name)) == [], name
    assert capability_errors(error_feedback.ErrorFeedback(make("qsgd"))) == []
    assert capability_errors(error_feedback.ErrorFeedback(make("terngrad"))) == []


def test_a_missing_capability_is_named():
    tern = make("terngrad")
    assert any("SummableCodes" in e for e in capability_errors(Hiding(tern, hide={"kernels_for"})))
    assert any("downlink_codec" in e for e in capability_errors(Hiding(tern, hide={"downlink_codec"})))

    def no_deferred(layers, seed, step, workers, shared_scalers=None, stats=None):
        return tern.encode_many(layers, seed, step, workers, shared_scalers, stats)

    assert any("deferred=True" in e for e in capability_errors(Hiding(tern, encode_many=no_deferred)))

    fp32 = make("fp32")

    def scaled(layers, seed, step, workers, shared_scalers=None, stats=None, **_):
        return [{k: v * np.float32(2) for k, v in m.items()} for m in fp32.encode_many(layers, seed, step, workers)]

    assert any("float_mean" in e for e in capability_errors(Hiding(fp32, encode_many=scaled, decode=lambda m: dict(
        (k, v / np.float32(2)) for k, v in m.items()))))
    stateful = CodecProperties(unbiased=False, stateful=True)
    assert any("init_state" in e for e in capability_errors(Hiding(make("qsgd"), properties=stateful)))


SOURCES = sorted((ROOT / "tgsim" / "exchange").glob("*.py")) + [ROOT / "tgsim" / "train" / "loop.py",
                                                                ROOT / "tgsim" / "train" / "local_sgd.py"]


def wire_reads(path: Path) -> list[int]:
    """Lines of `path` that read an attribute named `wire` (a call such as staging.wire(...) aside)."""
    tree = ast.parse(path.read_text())
    calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "wire" and id(n) not in calls]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_the_exchange_and_the_trainer_never_read_wire(path):
    assert wire_reads(path) == [], f"{path.name} branches on properties.wire"


def test_the_wire_check_sees_a_read(tmp_path):
    """Positive control of the check above: a line testing `codec.properties.wire` is found, a call
    named wire is not."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f(codec, staging):\n    staging.wire(1)\n    return codec.properties.wire == 'tgm1'\n")
    assert wire_reads(probe) == [3]
