"""tgsim/train/optim.py: the optimizers' defaults, the weight-decay short cut and OptimizerConfig.
Expected values are worked out by hand or with plain NumPy, never with the module under test."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tgsim.train.optim import OPTIMIZERS, OptimizerConfig, _decayed, adam, make_optimizer, momentum, sgd


PARAMS = {"w": np.array([1.0, -0.75, 0.5], np.float32), "b": np.array([-1.25, 0.8], np.float32)}


GRADS = {"w": np.array([0.3, -2.0, 1e-3], np.float32), "b": np.array([4.0, -0.5], np.float32)}


def _steps(opt, n=3, lr=0.1):
    params, state = dict(PARAMS), opt.init(PARAMS)
    for _ in range(n):
        params, state = opt.update(GRADS, state, params, lr)
    return params


def _same_bits(a, b):
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], strict=True)


@pytest.mark.mutation
def test_zero_weight_decay_returns_the_gradient_itself():
    """λ = 0 is a short cut: the gradient object comes back untouched (no 0·p pass over the
    parameters, so an infinite parameter cannot turn the gradient into NaN); λ ≠ 0 adds λp."""
    g, p = GRADS["w"], PARAMS["w"]
    assert _decayed(g, p, 0.0) is g
    p_inf = np.array([np.inf, 1.0, 1.0], np.float32)
    assert np.array_equal(_decayed(g, p_inf, 0.0), g)
    np.testing.assert_array_equal(_decayed(g, p, 0.5), g + np.float32(0.5) * p)


@pytest.mark.mutation
def test_sgd_default_has_no_weight_decay():
    """sgd() is sgd(weight_decay=0.0): w <- w - γg exactly."""
    _same_bits(_steps(sgd(), 1), {k: PARAMS[k] - np.float32(0.1) * GRADS[k] for k in PARAMS})


@pytest.mark.mutation
def test_momentum_defaults_are_heavy_ball_beta_0_9_without_decay():
    """momentum() is momentum(beta=0.9, nesterov=False, weight_decay=0.0), bit for bit."""
    want = _steps(momentum(0.9, False, 0.0))
    _same_bits(_steps(momentum()), want)
    for other in (momentum(0.8), momentum(0.9, True), momentum(0.9, False, 0.01)):
        assert any(not np.array_equal(_steps(other)[k], want[k]) for k in want)


@pytest.mark.mutation
def test_adam_defaults_are_kingma_ba():
    """adam() is adam(b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0), bit for bit; a changed
    default changes the iterates (eps is visible through a tiny gradient component; b2 only
    through a gradient that changes between steps: for a constant one v / (1 - b2^t) = g^2)."""
    grads = dict(GRADS, w=np.array([0.3, -2.0, 1e-9], np.float32))

    def run(opt):
        params, state = dict(PARAMS), opt.init(PARAMS)
        for i in range(3):
            scaled = {k: np.float32(1 + 2 * i) * g for k, g in grads.items()}
            params, state = opt.update(scaled, state, params, 0.1)
        return params

    want = run(adam(0.9, 0.999, 1e-8, 0.0))
    _same_bits(run(adam()), want)
    for other in (adam(b1=0.8), adam(b2=0.99), adam(eps=1e-6), adam(weight_decay=0.01)):
        assert any(not np.array_equal(run(other)[k], want[k]) for k in want)


@pytest.mark.mutation
def test_optimizer_config_defaults():
    """OptimizerConfig() documents the defaults a config file may leave out: heavy-ball momentum
    0.9, no weight decay, Adam's 0.9 / 0.999 / 1e-8; make_optimizer of it is momentum()."""
    cfg = OptimizerConfig()
    assert (cfg.name, cfg.momentum, cfg.weight_decay, cfg.beta1, cfg.beta2, cfg.eps) == \
        ("momentum", 0.9, 0.0, 0.9, 0.999, 1e-8)
    _same_bits(_steps(make_optimizer(cfg)), _steps(momentum(0.9, False, 0.0)))


@pytest.mark.mutation
def test_optimizer_config_is_frozen_and_names_are_the_four_optimizers():
    """The config is a frozen dataclass (no field changes after a run is configured), and
    OPTIMIZERS lists exactly the names make_optimizer accepts."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        OptimizerConfig().name = "adam"
    assert OPTIMIZERS == ("sgd", "momentum", "nesterov", "adam")
    for name in OPTIMIZERS:
        make_optimizer(OptimizerConfig(name=name))
