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


# -- the public contract (tgsim.testing) for every registered codec ------------------------------

from tgsim.codecs import registry  # noqa: E402
from tgsim.testing import CodecContract as PublicContract  # noqa: E402
from tgsim.train.config import CodecConfig  # noqa: E402

REGISTERED = [(name, {}) for name in registry.names()] + [("terngrad", {"clip": "none"}),
                                                          ("terngrad", {"clip": "implicit", "packing": "base3"})]


class TestEveryRegisteredCodec(PublicContract):
    @pytest.fixture(params=REGISTERED, ids=lambda p: p[0] + "".join(f"-{k}={v}" for k, v in p[1].items()))
    def codec(self, request):

        name, options = request.param
        return registry.make_codec(CodecConfig(name=name, options=options))
