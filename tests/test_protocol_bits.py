"""Bits on the wire (tgsim.codecs.base: `bits_per_element(layers_or_shapes)`): every codec counts
every byte of one worker's message, headers included, as 8 len(msg.to_bytes()) / elements; and
the framed codecs' messages start with distinct magics."""

from __future__ import annotations

import numpy as np
import pytest

from tgsim.codecs import registry
from tgsim.codecs.base import layer_shapes
from tgsim.codecs.qsgd import QSGD
from tgsim.codecs.sparse import RandomK, TopK
from tgsim.codecs.suresh import Suresh
from tgsim.codecs.terngrad import TernGrad
from tgsim.testing import bits_errors, contract_layers, encode
from tgsim.train.config import CodecConfig


def make(name: str):
    return registry.make_codec(CodecConfig(name=name))


VARIANTS = {
    **{f"qsgd-{c}": (lambda c=c: QSGD(coding=c, bucket=64)) for c in ("fixed", "elias", "paper")},
    "suresh-rotate": lambda: Suresh(rotate=True),
    "topk-k": lambda: TopK(k=3),
    "randomk-dense": lambda: RandomK(density=0.5),
    "terngrad-base3-float": lambda: TernGrad(packing="base3", min_size=20),
}


@pytest.mark.parametrize("name", list(registry.names()) + list(VARIANTS))
def test_bits_per_element_is_the_measured_wire(name):
    """Contract layers of 3 workers (7 x 13, an all-zero 5, 1001): the measured bits of every worker's
    message equal bits_per_element (at most it for codecs whose sizes depend on the values)."""
    codec = VARIANTS[name]() if name in VARIANTS else make(name)
    assert bits_errors(codec) == []


def test_terngrad_counts_its_header():
    """One layer of 1,000 elements: 2,000 bits of codes + the scaler + the 38-byte fixed header and
    the layer's 10 bytes of shape = 292 bytes, 2.336 bits per element (the codes and scaler alone:
    2.032)."""
    codec = TernGrad()
    layers = {"w": np.random.default_rng(0).standard_normal((1, 1000)).astype(np.float32)}
    msg = encode(codec, layers)[0]
    assert len(msg.to_bytes()) == 292
    assert codec.bits_per_element({"w": (1000,)}) == 8 * 292 / 1000 == 2.336
    assert codec.link_bits(1000, 4)["up"] == pytest.approx(2.032)


class Counting:
    """`inner` with another bits_per_element (a codec that counts wrong)."""

    def __init__(self, inner, bits, exact=True):
        self._inner, self.bits_per_element, self.bits_exact = inner, bits, exact

    def __getattr__(self, attr):
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self._inner, attr)


def test_a_count_without_the_header_is_caught():
    """Positive controls: TernGrad's old count (codes and scalers only) and a bound below the
    messages of a variable-size codec are both reported."""
    tern = TernGrad()

    def codes_only(layers_or_shapes):
        shapes = layer_shapes(layers_or_shapes)
        n = sum(int(np.prod(s)) for s in shapes.values())
        return 8 * sum(4 + -(-int(np.prod(s)) // 4) for s in shapes.values()) / n

    assert bits_errors(Counting(tern, codes_only))
    assert bits_errors(Counting(make("scaled_sign"), lambda shapes: 1.0, exact=False))
    assert bits_errors(Counting(tern, lambda shapes: tern.bits_per_element(shapes) + 1e-9))


def test_framed_codecs_have_distinct_magics():
    """The first 4 bytes of each registered codec's message (the float32 codec sends raw values, no
    frame): no two codecs share a magic, so bytes of one are never parsed as another's."""
    magics = {}
    for name in registry.names():
        codec = make(name)
        if codec.properties.float_mean:
            continue
        magics.setdefault(encode(codec, contract_layers())[0].to_bytes()[:4], []).append(name)
    assert all(len(v) == 1 for v in magics.values()), magics
