"""Optimizers as pure functions over parameter dicts, state passed explicitly (optax style).

    state = opt.init(params)
    params, state = opt.update(grads, state, params, lr)

All arithmetic is float32 elementwise in a fixed order, so every replica (virtual worker or MPI
rank) that applies the same aggregate gets the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from tgsim.backend import array_module


class Optimizer(NamedTuple):
    init: Callable
    update: Callable


def _decayed(g, p, weight_decay: float):
    """g + λ p (L2 weight decay added to the gradient)."""
    if weight_decay == 0.0:
        return g
    xp = array_module(p)
    return g + xp.float32(weight_decay) * p


def sgd(weight_decay: float = 0.0) -> Optimizer:
    """Optimizer (init, update) of plain SGD: w <- w - γ (g + λw), λ = `weight_decay`."""

    def init(params):
        return {}

    def update(grads, state, params, lr):
        xp = array_module(next(iter(params.values())))
        lr = xp.float32(lr)
        return {k: p - lr * _decayed(grads[k], p, weight_decay) for k, p in params.items()}, state

    return Optimizer(init, update)


def momentum(beta: float = 0.9, nesterov: bool = False, weight_decay: float = 0.0) -> Optimizer:
    """Optimizer (init, update) of momentum SGD, β = `beta`, λ = `weight_decay` added to the gradient:
    heavy ball v <- βv + g; w <- w - γv; with `nesterov`: w <- w - γ(g + βv) with the new v."""

    def init(params):
        xp = array_module(next(iter(params.values())))
        return {"v": {k: xp.zeros_like(p) for k, p in params.items()}}

    def update(grads, state, params, lr):
        xp = array_module(next(iter(params.values())))
        lr, b = xp.float32(lr), xp.float32(beta)
        new_p, new_v = {}, {}
        for k, p in params.items():
            g = _decayed(grads[k], p, weight_decay)
            v = b * state["v"][k] + g
            step = g + b * v if nesterov else v
            new_p[k], new_v[k] = p - lr * step, v
        return new_p, {"v": new_v}

    return Optimizer(init, update)


def adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0) -> Optimizer:
    """Optimizer (init, update) of Adam (Kingma & Ba 2015) with bias correction, β1 = `b1`, β2 = `b2`,
    ε = `eps`; L2 decay λ = `weight_decay` added to the gradient."""

    def init(params):
        xp = array_module(next(iter(params.values())))
        return {"m": {k: xp.zeros_like(p) for k, p in params.items()},
                "v": {k: xp.zeros_like(p) for k, p in params.items()},
                "t": np.zeros((), dtype=np.int64)}

    def update(grads, state, params, lr):
        xp = array_module(next(iter(params.values())))
        t = int(state["t"]) + 1
        c1 = xp.float32(1.0 - b1**t)
        c2 = xp.float32(1.0 - b2**t)
        f1, f2, lr32, e = xp.float32(b1), xp.float32(b2), xp.float32(lr), xp.float32(eps)
        # 1 - β in float64, rounded once (float32(1) - float32(β) cancels: 1.3e-5 relative error at
        # β = 0.999, which the float64 bias correction c2 then does not match)
        g1, g2 = xp.float32(1.0 - b1), xp.float32(1.0 - b2)
        new_p, m_new, v_new = {}, {}, {}
        for k, p in params.items():
            g = _decayed(grads[k], p, weight_decay)
            m = f1 * state["m"][k] + g1 * g
            v = f2 * state["v"][k] + g2 * g * g
            new_p[k] = p - lr32 * (m / c1) / (xp.sqrt(v / c2) + e)
            m_new[k], v_new[k] = m, v
        return new_p, {"m": m_new, "v": v_new, "t": np.asarray(t, dtype=np.int64)}

    return Optimizer(init, update)


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "momentum"          # "sgd" | "momentum" | "nesterov" | "adam"
    momentum: float = 0.9
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8


OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam")


def make_optimizer(cfg: OptimizerConfig) -> Optimizer:
    """The Optimizer of the [optimizer] config `cfg` (sgd, momentum, nesterov or adam with its
    hyper-parameters); ValueError for an unknown name."""
    if cfg.name == "sgd":
        return sgd(cfg.weight_decay)
    if cfg.name in ("momentum", "nesterov"):
        return momentum(cfg.momentum, cfg.name == "nesterov", cfg.weight_decay)
    if cfg.name == "adam":
        return adam(cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.name!r}; expected one of {OPTIMIZERS}")
