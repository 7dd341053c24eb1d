"""Linear models: least squares (with its closed-form optimum), binary logistic, softmax regression.

Scalar-output models (least squares, logistic) store "linear.w" as (dim,) and "linear.b" as (1,).
The products are written as matmuls that keep the worker axis, (N, B, d) @ (d, 1) and
(N, d, B) @ (N, B, 1), so that worker i's result is the same BLAS call whatever N is.
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from tgsim.backend import array_module
from tgsim.models.base import ModelBase, bmm, dense_backward, dense_forward, sum_axis


def _check_positive(name: str, **vals):
    for k, v in vals.items():
        if int(v) != v or int(v) < 1:
            raise ValueError(f"{name}: {k} must be a positive integer, got {v!r}")


def _check_l2(name: str, l2):
    if not (float(l2) >= 0.0):
        raise ValueError(f"{name}: l2 must be >= 0, got {l2!r}")


class _ScalarLinear(ModelBase):
    """z = x . w + b for one output; shared by LeastSquares and LogisticRegression."""

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return (self.dim,)

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {"linear.w": (self.dim,)}
        if getattr(self, "bias", True):
            shapes["linear.b"] = (1,)
        return shapes

    def _fan_in_gain(self, name, shape):
        return shape[0], 1.0

    def _forward(self, xp, params, x):
        w = params["linear.w"][:, None]                      # (d, 1)
        z = bmm(xp, x, w)[..., 0]                           # (N, B)
        if "linear.b" in params:
            z = z + params["linear.b"]
        return z, x

    def _backward(self, xp, params, x, dz):
        # (N, 1, B) @ (N, B, d) -> (N, 1, d)
        grads = {"linear.w": bmm(xp, dz[:, None, :], x)[:, 0, :]}
        if "linear.b" in params:
            grads["linear.b"] = sum_axis(xp, dz, 1)[:, None]
        return grads


@dataclass(frozen=True)
class LeastSquares(_ScalarLinear):
    """loss = 1/(2B) sum_b (x_b . w + b0 - y_b)^2  (+ l2/2 ||w||^2; the intercept b0 is not penalised).

    With l2 > 0 (or full-column-rank centred data) the problem is strongly convex and `optimum` gives
    its unique minimiser from the normal equations in float64.
    """

    dim: int
    l2: float = 0.0
    bias: bool = True
    name: str = "least_squares"
    task: str = "regression"
    head = "squared"

    def __post_init__(self):
        _check_positive(self.name, dim=self.dim)
        _check_l2(self.name, self.l2)

    def optimum(self, x, y, dtype=np.float64) -> dict:
        """Exact minimiser of the full-data objective (mean over all samples) + l2/2 ||w||^2.

        x: (..., dim) (any leading shape, e.g. (M, dim) or (N, B, dim)), y: the matching (...).
        Solved in float64: [X 1]^T [X 1] / M + l2 diag(1..1, 0) theta = [X 1]^T y / M.
        Returns params in `dtype` (float64 by default, so f* can be evaluated exactly).
        """
        xp = array_module(x)
        x = xp.asarray(x, dtype=xp.float64).reshape(-1, self.dim)
        y = xp.asarray(y, dtype=xp.float64).reshape(-1)
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"{self.name}: x has {x.shape[0]} samples but y has {y.shape[0]}")
        m = x.shape[0]
        if self.bias:
            x = xp.concatenate([x, xp.ones((m, 1), xp.float64)], axis=1)
        a = x.T @ x / m
        reg = xp.full(a.shape[0], float(self.l2))
        if self.bias:
            reg[-1] = 0.0
        a = a + xp.diag(reg)
        rhs = x.T @ y / m
        try:
            theta = xp.linalg.solve(a, rhs)
        except np.linalg.LinAlgError as e:
            raise ValueError(f"{self.name}: the normal equations are singular (use l2 > 0 or "
                             f"data of full column rank)") from e
        if not bool(xp.isfinite(theta).all()):
            raise ValueError(f"{self.name}: the normal equations are singular (use l2 > 0)")
        params = {"linear.w": theta[:self.dim].astype(dtype)}
        if self.bias:
            params["linear.b"] = theta[self.dim:].astype(dtype)
        return params


@dataclass(frozen=True)
class LogisticRegression(_ScalarLinear):
    """Binary logistic regression, y in {0, 1}: loss = mean softplus(z) - y z (+ l2/2 ||w||^2)."""

    dim: int
    l2: float = 0.0
    name: str = "logistic"
    task: str = "classification"
    head = "logistic"
    classes = 2

    def __post_init__(self):
        _check_positive(self.name, dim=self.dim)
        _check_l2(self.name, self.l2)


@dataclass(frozen=True)
class SoftmaxRegression(ModelBase):
    """Multinomial logistic regression: logits = x @ w + b, softmax cross-entropy (+ l2/2 ||w||^2)."""

    dim: int
    classes: int = 10
    l2: float = 0.0
    name: str = "softmax"
    task: str = "classification"
    head = "softmax"

    def __post_init__(self):
        _check_positive(self.name, dim=self.dim, classes=self.classes)
        if self.classes < 2:
            raise ValueError(f"{self.name}: classes must be >= 2, got {self.classes}")
        _check_l2(self.name, self.l2)

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return (self.dim,)

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"linear.w": (self.dim, self.classes), "linear.b": (self.classes,)}

    def _fan_in_gain(self, name, shape):
        return shape[0], 1.0

    def _forward(self, xp, params, x):
        return dense_forward(xp, x, params["linear.w"], params["linear.b"]), x

    def _backward(self, xp, params, x, dz):
        dw, db, _ = dense_backward(xp, x, params["linear.w"], dz, need_input_grad=False)
        return {"linear.w": dw, "linear.b": db}


__all__ = ["LeastSquares", "LogisticRegression", "SoftmaxRegression"]
