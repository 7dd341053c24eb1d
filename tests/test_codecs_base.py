"""tgsim/codecs/base.py: CodecProperties (defaults, backends, immutability) and PlainCodec. Expected
values are worked out by hand or with plain NumPy, never with the module under test."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tgsim.codecs.base import CodecProperties, PlainCodec


@pytest.mark.mutation
def test_codec_properties_backends_must_be_a_nonempty_subset():
    """CodecProperties.backends: ("numpy",) by default; each of ("numpy",), ("cupy",) and both is
    accepted; an empty tuple, or a name outside ("numpy", "cupy"), is a ValueError naming the field."""
    from tgsim.codecs.base import CodecProperties

    assert CodecProperties(unbiased=True).backends == ("numpy",)
    for ok in (("numpy",), ("cupy",), ("numpy", "cupy")):
        assert CodecProperties(unbiased=True, backends=ok).backends == ok
    for bad in ((), ("torch",), ("numpy", "jax")):
        with pytest.raises(ValueError, match=r"^backends must be a non-empty subset of \('numpy', 'cupy'\)"):
            CodecProperties(unbiased=True, backends=bad)


@pytest.mark.mutation
def test_codec_properties_defaults_and_immutability():
    """CodecProperties(unbiased=...) alone declares a codec with its own wire ("own"), codes that do
    not sum exactly, no shared statistics, no server re-encoding, no state, combined by the mean; the
    declaration is frozen (FrozenInstanceError) and hashable, equal declarations hashing alike."""
    p = CodecProperties(unbiased=True)
    assert (p.wire, p.sums_exactly, p.shared_stats, p.server_reencodes, p.stateful, p.combine) == \
        ("own", False, None, False, False, "mean")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.wire = "tgm1"
    assert hash(p) == hash(CodecProperties(unbiased=True))


@pytest.mark.mutation
def test_plain_codec_says_it_shares_no_statistics():
    """PlainCodec (fp32, fp16) has no statistics to share: local_scalers_many is a TypeError naming
    the codec, "plain" for the base class itself."""
    assert PlainCodec.name == "plain" and isinstance(PlainCodec.from_config(None), PlainCodec)
    with pytest.raises(TypeError, match=r"^plain shares no statistics"):
        PlainCodec().local_scalers_many(np.zeros((2, 1), np.float32))
