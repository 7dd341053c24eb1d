"""tgsim/codecs/terngrad/quantizer.py: the clipping modes, the 24-bit threshold rule and
layer_scaling's defaults."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.mutation
def test_quantizer_constants_are_the_documented_rule():
    """quantizer: the clipping modes and the 24-bit threshold of docs/THEORY.md §1.3 (t = word >> 8,
    kept when t s < x 2^24): a 25-bit rule would still be unbiased but would change every code."""
    from tgsim.codecs.terngrad import quantizer

    assert quantizer.CLIP_MODES == ("none", "explicit", "implicit")
    assert quantizer.THRESHOLD_BITS == 24 and quantizer.TWO24 == 16_777_216.0
    # x = 3 / 2^24 of s = 1: thresholds t = 0, 1, 2 keep it (t s < x 2^24), so P = 3 / 2^24
    t = np.array([0, 1, 2, 3, 2**24 - 1], dtype=np.uint32)
    x = np.full(5, np.float32(3 / 2**24))
    assert quantizer.ternary_rule(t, x, np.float32(1.0)).tolist() == [True, True, True, False, False]
    assert quantizer.exact_nonzero_probability(x[:1], 1.0)[0] == 3 / 2**24


@pytest.mark.mutation
def test_layer_scaling_defaults_and_no_sigma_without_clipping():
    """quantizer.layer_scaling: defaults clip = "none", c = 2.5; without clipping σ is not computed
    (0.0) and the scaler is max|g|; with explicit clipping at 2.5σ the bound is f32(2.5 σ)."""
    from tgsim.codecs.terngrad import quantizer

    g = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    none = quantizer.layer_scaling(g)
    assert none == quantizer.layer_scaling(g, "none", 2.5)
    assert none.sigma == 0.0 and none.scaler == float(np.abs(g).max()) and none.clip_bound == float("inf")
    exp = quantizer.layer_scaling(g, "explicit")
    assert exp.clip_bound == float(np.float32(2.5 * exp.sigma)) and exp.sigma > 0
    assert exp == quantizer.layer_scaling(g, "explicit", 2.5)
