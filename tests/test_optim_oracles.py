"""Independent oracles for the optimizers (tgsim/train/optim.py) and the learning-rate schedules
(tgsim/train/schedules.py).

Every expected value here is computed in the test, in float64, from the conventions the docstrings
state — hand-expanded iterates, closed forms (matrix powers of the linear recurrence a quadratic
gives, the constant-gradient form of Adam) or an explicit float64 loop — never by calling tgsim. A
bit-equality test between two runs cannot see a bug both runs share (momentum applying the learning
rate twice passed every such test); these can.

Conventions checked (from the docstrings in optim.py):
  sgd        w <- w - γ (g + λw)
  momentum   v <- βv + g';  w <- w - γ v              (heavy ball, g' = g + λw, no dampening)
  nesterov   v <- βv + g';  w <- w - γ (g' + βv_new)
  adam       g' = g + λw (coupled L2, not AdamW); m <- β1 m + (1-β1) g'; v <- β2 v + (1-β2) g'²;
             w <- w - γ (m / (1-β1^t)) / (sqrt(v / (1-β2^t)) + ε)   (ε outside the sqrt, after the
             bias correction: Kingma & Ba's Algorithm 1 and torch.optim.Adam)
These are the standard ones (torch.optim.SGD with dampening=0, torch.optim.Adam); the optional
torch tests at the end compare with torch directly where it is installed.

The optimizers run in float32, so results are compared with rtol 1e-6 (plus an absolute floor of a
few float32 ulps of the initial scale, for iterates that pass near zero).
"""

from __future__ import annotations

import numpy as np
import pytest

from tgsim.train.optim import OptimizerConfig, adam, make_optimizer, momentum, sgd
from tgsim.train.schedules import ScheduleConfig, learning_rate

RTOL = 1e-6
ATOL = 3e-7      # ~2.5 float32 ulps at 1.0: the initial parameters below are O(1)

# A separable quadratic f(w) = ½ Σ_i a_i w_i², split over two parameter tensors (the optimizers work
# on dicts): gradient a ⊙ w. Curvatures and starting points chosen so no iterate cancels to ~0.
A = {"layer.w": np.array([0.5, 2.0, 5.0]), "layer.b": np.array([1.0, 3.0])}
W0 = {"layer.w": np.array([1.0, -0.75, 0.5]), "layer.b": np.array([-1.25, 0.8])}


def _f32(d):
    return {k: np.asarray(v, dtype=np.float32) for k, v in d.items()}


def _run(opt, grad_fn, w0, lrs):
    """Drive a tgsim optimizer for len(lrs) steps on float32 params; returns the list of iterates
    (float64 copies) after each step, and checks that update never mutates its inputs."""
    params = _f32(w0)
    state = opt.init(params)
    out = []
    for lr in lrs:
        old, before = params, {k: v.copy() for k, v in params.items()}
        grads = _f32(grad_fn(params))
        params, state = opt.update(grads, state, params, lr)
        assert all(v.dtype == np.float32 for v in params.values())
        # a pure function: the params passed in are unchanged
        assert all(np.array_equal(old[k], before[k]) for k in before)
        out.append({k: np.asarray(v, dtype=np.float64) for k, v in params.items()})
    return out


def _quad_grad(params):
    return {k: A[k] * np.asarray(p, dtype=np.float64) for k, p in params.items()}


def _assert_close(got, want, what):
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=RTOL, atol=ATOL, err_msg=f"{what}: {k}")


# ---------------------------------------------------------------------------------------------
# hand-expanded iterates: 1-D f(w) = ½·2·w², w0 = 1, γ = 0.1, β = 0.9 (numbers worked out by hand)


HAND = {
    # sgd: w_{t+1} = (1 - γa) w_t = 0.8 w_t
    ("sgd", 0.0): [0.8, 0.64, 0.512, 0.4096],
    # sgd + λ = 0.5: w_{t+1} = (1 - γ(a+λ)) w_t = 0.75 w_t
    ("sgd", 0.5): [0.75, 0.5625, 0.421875, 0.31640625],
    # heavy ball: v1 = 2, w1 = 1 - 0.2 = 0.8; v2 = 1.8 + 1.6 = 3.4, w2 = 0.8 - 0.34 = 0.46;
    # v3 = 3.06 + 0.92 = 3.98, w3 = 0.46 - 0.398 = 0.062; v4 = 3.582 + 0.124 = 3.706, w4 = -0.3086
    ("momentum", 0.0): [0.8, 0.46, 0.062, -0.3086],
    # nesterov: v1 = 2, step = 2 + 0.9·2 = 3.8, w1 = 0.62; g = 1.24, v2 = 1.8 + 1.24 = 3.04,
    # step = 1.24 + 2.736 = 3.976, w2 = 0.2224; g = 0.4448, v3 = 2.736 + 0.4448 = 3.1808,
    # step = 0.4448 + 2.86272 = 3.30752, w3 = -0.108352
    ("nesterov", 0.0): [0.62, 0.2224, -0.108352],
    # heavy ball + λ = 0.5 (coupled: g' = 2.5 w): v1 = 2.5, w1 = 0.75; v2 = 2.25 + 1.875 = 4.125,
    # w2 = 0.3375; v3 = 3.7125 + 0.84375 = 4.55625, w3 = -0.118125
    ("momentum", 0.5): [0.75, 0.3375, -0.118125],
    # nesterov + λ = 0.5: v1 = 2.5, step = 2.5 + 2.25 = 4.75, w1 = 0.525; g' = 1.3125,
    # v2 = 2.25 + 1.3125 = 3.5625, step = 1.3125 + 3.20625 = 4.51875, w2 = 0.073125
    ("nesterov", 0.5): [0.525, 0.073125],
}


@pytest.mark.parametrize("name,wd", list(HAND))
def test_hand_computed_iterates_1d(name, wd):
    """sgd / heavy ball / nesterov, with and without L2 decay, on f(w) = w² (a = 2) from w0 = 1 with
    γ = 0.1, β = 0.9: every iterate equals the value worked out by hand in the comment above."""
    opt = make_optimizer(OptimizerConfig(name=name, momentum=0.9, weight_decay=wd))
    want = HAND[(name, wd)]
    a = np.array([2.0])
    params = {"w": np.array([1.0], dtype=np.float32)}
    state = opt.init(params)
    for t, w_expected in enumerate(want):
        params, state = opt.update({"w": (a * params["w"]).astype(np.float32)}, state, params, 0.1)
        np.testing.assert_allclose(params["w"].astype(np.float64), [w_expected], rtol=RTOL, atol=ATOL,
                                   err_msg=f"{name} wd={wd}: iterate {t + 1}")


# ---------------------------------------------------------------------------------------------
# closed forms on the separable quadratic


def _sgd_closed_form(t, lr, wd):
    """w_t = (1 - γ(a + λ))^t w0, per coordinate."""
    return {k: (1.0 - lr * (A[k] + wd)) ** t * W0[k] for k in A}


def _momentum_closed_form(t, lr, beta, wd, nesterov):
    """The state (w, v) of each coordinate evolves linearly, with c = a + λ:
        heavy ball  v' = βv + cw,  w' = w - γv'             = (1 - γc) w - γβ v
        nesterov    v' = βv + cw,  w' = w - γ(cw + βv')     = (1 - γc(1+β)) w - γβ² v
    so (w_t, v_t) = M^t (w0, 0) with the 2x2 matrix M below."""
    out = {}
    for k in A:
        ws = []
        for c, w0 in zip(A[k] + wd, W0[k]):
            if nesterov:
                m = np.array([[1.0 - lr * c * (1.0 + beta), -lr * beta * beta], [c, beta]])
            else:
                m = np.array([[1.0 - lr * c, -lr * beta], [c, beta]])
            ws.append((np.linalg.matrix_power(m, t) @ np.array([w0, 0.0]))[0])
        out[k] = np.array(ws)
    return out


@pytest.mark.parametrize("wd", [0.0, 0.3])
def test_sgd_matches_closed_form(wd):
    """sgd(λ) on the quadratic: w_t = (1 - γ(a+λ))^t w0 for t = 1..5, every coordinate of both tensors."""
    lr = 0.15
    got = _run(sgd(weight_decay=wd), _quad_grad, W0, [lr] * 5)
    for t, g in enumerate(got, start=1):
        _assert_close(g, _sgd_closed_form(t, lr, wd), f"sgd wd={wd} step {t}")


@pytest.mark.parametrize("nesterov", [False, True], ids=["heavy_ball", "nesterov"])
@pytest.mark.parametrize("wd", [0.0, 0.3])
def test_momentum_matches_closed_form(nesterov, wd):
    """momentum(β, nesterov, λ) on the quadratic: (w_t, v_t) = M^t (w0, 0) for t = 1..5, with M the
    2x2 matrix of the documented recurrence (see _momentum_closed_form). Catches γ applied twice,
    decoupled instead of coupled decay, dampening, and heavy-ball/Nesterov mix-ups."""
    lr, beta = 0.1, 0.8
    got = _run(momentum(beta=beta, nesterov=nesterov, weight_decay=wd), _quad_grad, W0, [lr] * 5)
    for t, g in enumerate(got, start=1):
        _assert_close(g, _momentum_closed_form(t, lr, beta, wd, nesterov),
                      f"{'nesterov' if nesterov else 'heavy ball'} wd={wd} step {t}")


@pytest.mark.parametrize("eps,b2", [(1e-8, 0.999), (0.5, 0.999), (1e-8, 0.9999)])
def test_adam_constant_gradient_closed_form(eps, b2):
    """Adam on a linear loss f(w) = c·w (constant gradient c): with bias correction m̂_t = c and
    v̂_t = c² exactly, so every step is γ c / (|c| + ε) and w_t = w0 - t γ c / (|c| + ε).
    ε = 0.5 pins its placement (outside the sqrt of the bias-corrected v: ε inside the sqrt gives
    c/sqrt(c²+ε), no bias correction gives steps (1-β1^t)/sqrt(1-β2^t) times smaller or larger).
    β2 = 0.999 / 0.9999 also pin the float32 rounding of 1 - β2: computed as f32(1) - f32(β2) it is
    1.3e-5 (0.999) / 1.7e-4 (0.9999) off, and every step came out 6.6e-6 / 8e-5 too large."""
    c = {"layer.w": np.array([3.0, -0.5, 1.0]), "layer.b": np.array([-2.0, 0.25])}
    lr = 0.1
    got = _run(adam(b1=0.9, b2=b2, eps=eps), lambda p: c, W0, [lr] * 5)
    for t, g in enumerate(got, start=1):
        want = {k: W0[k] - t * lr * c[k] / (np.abs(c[k]) + eps) for k in c}
        _assert_close(g, want, f"adam eps={eps} b2={b2} step {t}")


def _adam_reference(w0, grad_fn, lrs, b1, b2, eps, wd):
    """Kingma & Ba (2015) Algorithm 1 with coupled L2 decay, written out in float64."""
    w = {k: np.array(v, dtype=np.float64) for k, v in w0.items()}
    m = {k: np.zeros_like(v) for k, v in w.items()}
    v = {k: np.zeros_like(x) for k, x in w.items()}
    out = []
    for t, lr in enumerate(lrs, start=1):
        g = grad_fn(w)
        for k in w:
            gk = g[k] + wd * w[k]
            m[k] = b1 * m[k] + (1.0 - b1) * gk
            v[k] = b2 * v[k] + (1.0 - b2) * gk * gk
            m_hat = m[k] / (1.0 - b1 ** t)
            v_hat = v[k] / (1.0 - b2 ** t)
            w[k] = w[k] - lr * m_hat / (np.sqrt(v_hat) + eps)
        out.append({k: x.copy() for k, x in w.items()})
    return out


@pytest.mark.parametrize("wd", [0.0, 0.3])
def test_adam_first_step_by_hand(wd):
    """Adam's first step from m = v = 0 is γ g'/(|g'| + ε) with g' = a w0 + λ w0 (bias correction
    turns m1 = (1-β1) g', v1 = (1-β2) g'² back into g' and g'²), whatever β1, β2."""
    lr, eps = 0.05, 1e-3
    got = _run(adam(b1=0.8, b2=0.99, eps=eps, weight_decay=wd), _quad_grad, W0, [lr])[0]
    want = {}
    for k in A:
        g = (A[k] + wd) * W0[k]
        want[k] = W0[k] - lr * g / (np.abs(g) + eps)
    _assert_close(got, want, f"adam first step wd={wd}")


@pytest.mark.parametrize("wd", [0.0, 0.3])
def test_adam_matches_float64_reference_on_quadratic(wd):
    """Adam(β1, β2, ε, λ) on the quadratic for 5 steps with a changing γ (as a schedule gives):
    iterates equal the float64 Algorithm 1 loop above (bias correction with the step count t
    starting at 1, coupled L2 decay, ε after the sqrt)."""
    lrs = [0.05, 0.1, 0.02, 0.08, 0.04]
    kw = dict(b1=0.85, b2=0.995, eps=1e-3)
    got = _run(adam(weight_decay=wd, **kw), _quad_grad, W0, lrs)
    want = _adam_reference(W0, _quad_grad, lrs, wd=wd, **kw)
    for t, (g, w) in enumerate(zip(got, want), start=1):
        _assert_close(g, w, f"adam wd={wd} step {t}")


@pytest.mark.parametrize("name", ["sgd", "momentum", "nesterov"])
def test_learning_rate_is_read_per_step(name):
    """γ changes between steps: step t uses γ_t (not γ_0, not γ²). For sgd w_t = Π(1 - γ_s a) w0;
    for momentum the closed form becomes the product of the per-step matrices M(γ_s)."""
    lrs = [0.1, 0.3, 0.05, 0.2]
    beta = 0.9
    got = _run(make_optimizer(OptimizerConfig(name=name, momentum=beta)), _quad_grad, W0, lrs)[-1]
    want = {}
    for k in A:
        ws = []
        for a, w0 in zip(A[k], W0[k]):
            state = np.array([w0, 0.0])
            for lr in lrs:
                if name == "sgd":
                    m = np.array([[1.0 - lr * a, 0.0], [0.0, 0.0]])
                elif name == "nesterov":
                    m = np.array([[1.0 - lr * a * (1.0 + beta), -lr * beta * beta], [a, beta]])
                else:
                    m = np.array([[1.0 - lr * a, -lr * beta], [a, beta]])
                state = m @ state
            ws.append(state[0])
        want[k] = np.array(ws)
    _assert_close(got, want, f"{name} with changing lr")


def test_make_optimizer_passes_hyperparameters():
    """make_optimizer wires each config field to its optimizer (β, ε, λ reach the math): the
    config-built optimizer's first steps equal the closed forms with those values."""
    # sgd with decay: one step
    got = _run(make_optimizer(OptimizerConfig(name="sgd", weight_decay=0.2)), _quad_grad, W0, [0.1])[0]
    _assert_close(got, _sgd_closed_form(1, 0.1, 0.2), "sgd from config")
    # momentum β = 0.5 (not the default 0.9), two steps
    got = _run(make_optimizer(OptimizerConfig(name="momentum", momentum=0.5, weight_decay=0.1)),
               _quad_grad, W0, [0.1, 0.1])[-1]
    _assert_close(got, _momentum_closed_form(2, 0.1, 0.5, 0.1, False), "momentum from config")
    # adam β1, β2, ε from the config
    cfg = OptimizerConfig(name="adam", beta1=0.7, beta2=0.9, eps=0.01, weight_decay=0.05)
    got = _run(make_optimizer(cfg), _quad_grad, W0, [0.1, 0.1, 0.1])[-1]
    want = _adam_reference(W0, _quad_grad, [0.1] * 3, b1=0.7, b2=0.9, eps=0.01, wd=0.05)[-1]
    _assert_close(got, want, "adam from config")
    with pytest.raises(ValueError, match="unknown optimizer"):
        make_optimizer(OptimizerConfig(name="adagrad"))


# ---------------------------------------------------------------------------------------------
# schedules: γ_t (t 0-based) against the closed form in the docstring, boundaries included


@pytest.mark.parametrize("cfg,total,expected", [
    # constant: γ0 whatever t
    (ScheduleConfig(name="constant", lr=0.25), 10, {0: 0.25, 9: 0.25, 10: 0.25, 1000: 0.25}),
    # step: γ0 · gamma^(t // every); every = 3: t = 0..2 -> 0.1, 3..5 -> 0.05, 6 -> 0.025
    (ScheduleConfig(name="step", lr=0.1, every=3, gamma=0.5), 10,
     {0: 0.1, 2: 0.1, 3: 0.05, 5: 0.05, 6: 0.025, 9: 0.0125}),
    # poly: end + (γ0 - end)(1 - t/T)^p, T = 10, p = 2, end = 0.1; t >= T stays at end
    (ScheduleConfig(name="poly", lr=1.0, power=2.0, end_lr=0.1), 10,
     {0: 1.0, 5: 0.1 + 0.9 * 0.25, 9: 0.1 + 0.9 * 0.01, 10: 0.1, 15: 0.1}),
    # poly, p = 1, end 0: linear decay to 0 at t = T
    (ScheduleConfig(name="poly", lr=0.4, power=1.0, end_lr=0.0), 8, {0: 0.4, 2: 0.3, 4: 0.2, 8: 0.0}),
    # robbins_monro: γ0 / (1 + t/τ), τ = 10
    (ScheduleConfig(name="robbins_monro", lr=1.0, tau=10.0), 100, {0: 1.0, 10: 0.5, 30: 0.25, 90: 0.1}),
], ids=["constant", "step", "poly_p2_floor", "poly_linear", "robbins_monro"])
def test_schedule_closed_forms(cfg, total, expected):
    """learning_rate(cfg, t, T) equals the documented closed form at hand-picked steps, including
    the first step, the step-decay boundaries (every-1 / every) and poly's end (t = T and past it)."""
    for t, want in expected.items():
        assert learning_rate(cfg, t, total) == pytest.approx(want, rel=1e-12, abs=1e-15), (cfg.name, t)


def test_schedule_poly_zero_total_and_unknown_name():
    """poly with total_steps = 0 divides by max(T, 1) (no ZeroDivisionError); an unknown name is a
    ValueError naming it."""
    cfg = ScheduleConfig(name="poly", lr=1.0, power=1.0, end_lr=0.0)
    assert learning_rate(cfg, 0, 0) == pytest.approx(1.0)
    assert learning_rate(cfg, 1, 0) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="cosine"):
        learning_rate(ScheduleConfig(name="cosine"), 0, 10)


# ---------------------------------------------------------------------------------------------
# torch.optim as a second, external oracle (only where torch is installed)


def _torch_iterates(torch_opt_factory, lr_steps):
    torch = pytest.importorskip("torch", reason="torch not installed: the torch.optim comparison is skipped")
    ws = {k: torch.tensor(W0[k], dtype=torch.float64, requires_grad=True) for k in W0}
    a = {k: torch.tensor(A[k], dtype=torch.float64) for k in A}
    opt = torch_opt_factory(torch, list(ws.values()))
    for _ in range(lr_steps):
        opt.zero_grad()
        loss = sum(0.5 * (a[k] * ws[k] * ws[k]).sum() for k in ws)
        loss.backward()
        opt.step()
    return {k: ws[k].detach().numpy().copy() for k in ws}


@pytest.mark.parametrize("nesterov,beta", [(False, 0.0), (False, 0.9), (True, 0.9)],
                         ids=["sgd", "heavy_ball", "nesterov"])
@pytest.mark.parametrize("wd", [0.0, 0.3])
def test_sgd_momentum_match_torch(nesterov, beta, wd):
    """tgsim sgd / momentum / nesterov equal torch.optim.SGD(lr, momentum=β, dampening=0,
    nesterov, weight_decay=λ) after 5 steps on the quadratic (torch: buf <- β buf + g, g + λw
    first; nesterov steps along g + β buf — tgsim's documented convention)."""
    lr = 0.1
    want = _torch_iterates(lambda torch, ps: torch.optim.SGD(ps, lr=lr, momentum=beta, dampening=0.0,
                                                             nesterov=nesterov, weight_decay=wd), 5)
    name = "sgd" if beta == 0.0 else ("nesterov" if nesterov else "momentum")
    got = _run(make_optimizer(OptimizerConfig(name=name, momentum=beta, weight_decay=wd)),
               _quad_grad, W0, [lr] * 5)[-1]
    _assert_close(got, want, f"{name} wd={wd} vs torch")


@pytest.mark.parametrize("wd", [0.0, 0.3])
def test_adam_matches_torch(wd):
    """tgsim adam equals torch.optim.Adam(lr, betas, eps, weight_decay=λ) after 5 steps on the
    quadratic (torch: coupled L2, denom = sqrt(v)/sqrt(1-β2^t) + ε, step lr/(1-β1^t)), i.e. the
    same ε placement as tgsim's docstring/Kingma & Ba."""
    lr, b1, b2, eps = 0.05, 0.85, 0.995, 1e-3
    want = _torch_iterates(lambda torch, ps: torch.optim.Adam(ps, lr=lr, betas=(b1, b2), eps=eps,
                                                              weight_decay=wd), 5)
    got = _run(adam(b1=b1, b2=b2, eps=eps, weight_decay=wd), _quad_grad, W0, [lr] * 5)[-1]
    _assert_close(got, want, f"adam wd={wd} vs torch")
