"""The codec contract (tests/codec_contract.py) instantiated for the TernGrad variants.

TernGrad(clip="explicit") declares itself biased (``unbiased`` is False); the contract then checks
that the exact binomial test *does* reject it on a heavy-tailed vector, i.e. that the declaration
is true.
"""

import pytest

from codec_contract import CodecContract
from tgsim.codecs import TernGrad


class TestTernGradNoClip(CodecContract):
    @pytest.fixture
    def codec(self):
        return TernGrad(clip="none", kernels="reference")


class TestTernGradBase3(CodecContract):
    @pytest.fixture
    def codec(self):
        return TernGrad(packing="base3", kernels="reference")


class TestTernGradExplicitClip(CodecContract):
    @pytest.fixture
    def codec(self):
        return TernGrad(clip="explicit", kernels="reference")

    def test_declares_biased(self, codec):
        assert codec.unbiased is False
