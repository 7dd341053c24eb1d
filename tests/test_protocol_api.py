"""The codec API: every registered codec class (and ErrorFeedback) is importable from tgsim.codecs,
loaded on first use; every encode_many takes its statistics as `stats=`; every single-round codec
has the single-worker `encode(layers, key)` / `decode(msg)` of README's example."""

from __future__ import annotations

import inspect
import subprocess
import sys

import numpy as np
import pytest

import tgsim.codecs
from tgsim.codecs import registry
from tgsim.rng import StreamKey
from tgsim.testing import single_encode_errors
from tgsim.train.config import CodecConfig


def test_every_codec_class_is_exported():
    for name in registry.CODECS:
        cls = registry.codec_class(name)
        assert getattr(tgsim.codecs, cls.__name__) is cls, name
        assert cls.__name__ in tgsim.codecs.__all__ and cls.__name__ in dir(tgsim.codecs)
    from tgsim.codecs import QSGD, ErrorFeedback     # noqa: F401  (the import the README shows)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchCodec'"):
        tgsim.codecs.NoSuchCodec  # noqa: B018


def test_importing_tgsim_codecs_loads_no_peer_codec():
    code = ("import sys, tgsim.codecs; print(sorted(m for m in sys.modules if m.startswith('tgsim.codecs.')))\n"
            "from tgsim.codecs import QSGD; print('tgsim.codecs.qsgd' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert "tgsim.codecs.qsgd" not in out[0] and "tgsim.codecs.sparse" not in out[0]
    assert out[1] == "True"


@pytest.mark.parametrize("name", list(registry.CODECS))
def test_encode_many_takes_stats(name):
    cls = registry.codec_class(name)
    params = inspect.signature(cls.encode_many).parameters
    assert "stats" in params and "scalings" not in params
    if hasattr(cls, "encode"):
        assert "scalings" not in inspect.signature(cls.encode).parameters


@pytest.mark.parametrize("name", list(registry.CODECS))
def test_single_worker_encode_is_the_batched_row(name):
    """Every codec of one round: encode(layers, StreamKey(seed, step, w)) has the bytes of worker w's
    message of encode_many (own statistics), and decode reads it."""
    codec = registry.make_codec(CodecConfig(name=name))
    if codec.properties.rounds > 1:
        pytest.skip(f"{name}: {codec.properties.rounds} rounds, no single message")
    assert single_encode_errors(codec) == []


class WrongWorker:
    """`inner` whose single-worker encode draws as worker w + 1 (a control the check must catch)."""

    def __init__(self, inner):
        self._inner = inner

    def encode(self, layers, key):
        return self._inner.encode(layers, StreamKey(key.seed, key.step, key.worker + 1))

    def __getattr__(self, attr):
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self._inner, attr)


def test_a_single_encode_of_another_stream_is_caught():
    """Positive control: a stochastic codec encoding with the wrong worker's stream is reported."""
    for name in ("terngrad", "qsgd", "randomk"):
        codec = registry.make_codec(CodecConfig(name=name))
        assert single_encode_errors(WrongWorker(codec)), name
    assert single_encode_errors(registry.make_codec(CodecConfig(name="fp32"))) == []
    assert np.array_equal(  # the README's peer-codec lines
        tgsim.codecs.QSGD().decode(tgsim.codecs.QSGD().encode({"w": np.zeros(3, np.float32)}, StreamKey(1)))["w"],
        np.zeros(3, np.float32))
