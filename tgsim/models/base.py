"""The model protocol and the shared numerics (heads, dense layers, L2, batched evaluation).

A model is a small frozen dataclass holding only its hyper-parameters. Parameters live outside it,
in a dict name -> array, and the model provides

    loss_and_grad(params, x, y) -> (loss, grads)

for N workers at once: x is (N, B, *feature_shape), y is (N, B); params carry NO worker axis (the
replicas are identical); loss is (N,) float64 (each worker's mean loss over its B samples plus the
L2 term), grads[name] is (N, *shape) in the parameters' dtype: the gradient of each worker's loss.

Conventions shared by every model
---------------------------------
* Layers are named "<layer>.w" / "<layer>.b"; `layer_shapes()` is ordered input -> output.
  Dense weights are (in, out) (y = x @ w + b); conv weights are (out_channels, in_channels, kernel).
* L2 (`l2 > 0`) penalises weights only, never biases: loss += l2/2 * sum_w ||w||^2, grad_w += l2 * w.
  (With an unpenalised intercept the least-squares problem is still strongly convex for l2 > 0.)
* The compute dtype is the dtype of the parameters: float32 in training, float64 for gradient checks
  (cast params and x to float64 and the same code runs in float64). Labels: int64 class indices for
  classification ({0, 1} for the binary logistic model), float targets for regression.
* NumPy and CuPy run the same lines: `xp = array_module(x)`; nothing here imports CuPy.

Bit-for-bit per worker
----------------------
Worker i's loss and gradients depend only on x[i], y[i] and params, and are bitwise identical to the
result of a call with x[i:i+1], y[i:i+1]: every product keeps the worker axis (`bmm`: one BLAS gemm
per worker, the same call whatever N is; on NumPy the workers' gemms run on the Numba threads,
tgsim.models._numba_bmm), reductions run along the batch axis of one
worker, and no code path depends on N. tests/test_models.py checks this for N = 1, 3, 8.
Every gemm runs with its BLAS library at one thread (tgsim.blas), so the bits do not depend on the
BLAS thread count either (checked for 1, 2 and 4 threads). Across CPU families they may differ:
tgsim.blas says what is bitwise where.
"""

from __future__ import annotations

import math
from typing import Mapping, Protocol, runtime_checkable

import numpy as np

from tgsim.backend import array_module
from tgsim.models import _numba_bmm, _numba_elementwise, cuda_ops

TASKS = ("regression", "classification")
_SEED_TAG = 0x6D6F64656C  # "model"


@runtime_checkable
class Model(Protocol):
    name: str
    task: str  # "regression" | "classification"

    def layer_shapes(self) -> dict[str, tuple[int, ...]]: ...

    def init(self, seed: int) -> dict[str, np.ndarray]: ...

    def loss_and_grad(self, params: Mapping, x, y) -> tuple: ...

    def evaluate(self, params: Mapping, x, y) -> tuple[float, float]: ...  # (+ batch_size=4096)


# ---------------------------------------------------------------------------------------------
# initialisation


def layer_rng(seed: int, index: int) -> np.random.Generator:
    """The generator of layer `index` (its own stream: adding a layer does not shift the others)."""
    return np.random.default_rng([int(seed), _SEED_TAG, int(index)])


def normal_init(rng: np.random.Generator, shape, fan_in: int, gain: float) -> np.ndarray:
    """N(0, gain / fan_in) in float32: gain 2 is He (ReLU layers), gain 1 is LeCun/Glorot-style."""
    std = math.sqrt(gain / max(int(fan_in), 1))
    return (rng.standard_normal(shape) * std).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# input handling


def compute_dtype(params: Mapping):
    """The dtype the model math runs in: the (common) floating dtype of the parameters."""
    dtypes = {np.dtype(p.dtype) for p in params.values()}
    if len(dtypes) != 1:
        raise ValueError(f"parameters have mixed dtypes {sorted(map(str, dtypes))}; cast them to one")
    dt = dtypes.pop()
    if dt.kind != "f":
        raise ValueError(f"parameters must be floating point, got {dt}")
    return dt


def check_params(model, params: Mapping) -> None:
    shapes = model.layer_shapes()
    if set(params) != set(shapes):
        missing = sorted(set(shapes) - set(params))
        extra = sorted(set(params) - set(shapes))
        raise ValueError(f"{model.name}: parameter names mismatch (missing {missing}, unexpected {extra})")
    for k, s in shapes.items():
        if tuple(params[k].shape) != tuple(s):
            raise ValueError(f"{model.name}: parameter {k!r} has shape {tuple(params[k].shape)}, expected {s}")


def prepare_batch(model, params: Mapping, x, y):
    """Validate (N, B, *feature) inputs and (N, B) labels; return (xp, dtype, x, y) in compute dtype
    (integer x kept as it is for a model whose class sets INTEGER_INPUTS = True: token ids)."""
    check_params(model, params)
    dtype = compute_dtype(params)
    xp = array_module(x)
    x = xp.asarray(x)
    y = xp.asarray(y)
    feat = tuple(model.feature_shape)
    if x.ndim != 2 + len(feat) or tuple(x.shape[2:]) != feat:
        raise ValueError(f"{model.name}: x must have shape (N, B, {', '.join(map(str, feat))}), got {tuple(x.shape)}")
    if tuple(y.shape) != tuple(x.shape[:2]):
        raise ValueError(f"{model.name}: y must have shape (N, B) = {tuple(x.shape[:2])}, got {tuple(y.shape)}")
    if x.shape[1] == 0:
        raise ValueError(f"{model.name}: empty batch (B = 0)")
    if x.dtype.kind == "f" or not getattr(model, "INTEGER_INPUTS", False):
        x = x.astype(dtype, copy=False)          # a model with INTEGER_INPUTS keeps integer ids (tokens)
    if model.task == "classification":
        if y.dtype.kind not in "iu":
            raise ValueError(f"{model.name}: classification labels must be integers, got {y.dtype}")
    else:
        y = y.astype(dtype, copy=False)
    return xp, dtype, x, y


# ---------------------------------------------------------------------------------------------
# building blocks (all keep the worker axis: arrays are (N, B, ...))


def bmm(xp, a, b):
    """a @ b with the worker axis kept: a (N, M, K) (any strides, e.g. a swapaxes view), b (K, P) or
    (N, K, P). NumPy float32/float64 operands go through `_numba_bmm.products` (one single-threaded
    gemm per worker, the workers over the Numba threads), other NumPy dtypes through np.matmul; CuPy
    operands through `cuda_ops.bmm` (one fixed-order loop per output element, float32/float64; any
    other dtype is a TypeError there). The route depends on the backend, dtype and
    operand pattern, never on N, so a worker's bits are those of a call with that worker alone."""
    if xp is np and _numba_bmm.supported(a, b):
        return _numba_bmm.products(a, b)
    if xp is not np:
        return cuda_ops.bmm(a, b)        # fixed order per element (tgsim/cuda/batched.cu)
    return xp.matmul(a, b)


def sum_axis(xp, x, axis: int):
    """x.sum(axis=axis), a worker's bits independent of N: NumPy's own sum (it reduces each output
    along its axis the same way whatever the other axes hold; tests/test_models.py checks it), and on
    CuPy the fixed-order kernel of tgsim.models.cuda_ops (CuPy's reduction picks its blocking from
    the whole shape)."""
    if xp is np:
        return x.sum(axis=axis)
    return cuda_ops.sum_axis(x, axis)


# Weights up to this many elements are transposed into a contiguous copy for the input gradient
# d @ w.T, so that every worker's product is an NN gemm: OpenBLAS packs a transposed (NT) operand
# more slowly than the copy costs for these short (B-row) products. Larger weights keep the NT form:
# their strided transpose copy costs more than the NN form saves for a handful of workers (timings:
# docs/MEASUREMENTS.md). The choice depends on the weight's shape only, never on N.
TRANSPOSE_MAX = 1 << 18


def dense_forward(xp, h, w, b):
    """(N, B, in) @ (in, out) + (out,): BLAS calls per worker, the same whatever N is."""
    z = bmm(xp, h, w)
    z += b
    return z


def dense_backward(xp, h, w, d, need_input_grad: bool = True):
    """Grads of a dense layer from d = dL/d(out) (N, B, out): (dw (N,in,out), db (N,out), dh or None).

    dw: one TN gemm per worker on the swapaxes view of h (NumPy hands the transposed view to BLAS
    directly, without a copy).
    """
    dw = bmm(xp, xp.swapaxes(h, 1, 2), d)
    db = sum_axis(xp, d, 1)
    dh = None
    if need_input_grad:
        wt = xp.ascontiguousarray(w.T) if w.size <= TRANSPOSE_MAX else w.T
        dh = bmm(xp, d, wt)
    return dw, db, dh


def relu(xp, z):
    """xp.maximum(z, 0) (NaN kept); one Numba pass for plain NumPy float arrays, same bits."""
    if xp is np:
        out = _numba_elementwise.relu(z)
        if out is not None:
            return out
    return xp.maximum(z, z.dtype.type(0))


def keep_where(xp, keep, d):
    """xp.where(keep, d, 0) bit for bit (d's bits where keep, +0.0 elsewhere), as an integer AND of
    d's bits with an all-ones/all-zeros mask (three elementwise passes, faster than NumPy's where loop
    on a bool mask). keep broadcasts against d."""
    ut = {2: xp.uint16, 4: xp.uint32, 8: xp.uint64}.get(d.dtype.itemsize)
    if ut is None:
        return xp.where(keep, d, d.dtype.type(0))
    mask = xp.broadcast_to(keep, xp.broadcast_shapes(keep.shape, d.shape)).astype(ut)
    xp.negative(mask, out=mask)            # 1 -> all ones (unsigned wrap), 0 -> 0
    mask &= d.view(ut)
    return mask.view(d.dtype)


def relu_backward(xp, pre, d):
    """d where pre > 0, else +0.0; one Numba pass for plain NumPy float arrays, same bits."""
    if xp is np:
        out = _numba_elementwise.keep_positive(pre, d)
        if out is not None:
            return out
    return keep_where(xp, pre > 0, d)


def add_l2(model, params: Mapping, loss, grads: dict):
    """loss += l2/2 sum ||w||^2 (weights only), grads[w] += l2 * w. Returns the new loss."""
    l2 = float(getattr(model, "l2", 0.0))
    if l2 == 0.0:
        return loss
    for k, p in params.items():
        if k.endswith(".w"):
            grads[k] += p.dtype.type(l2) * p     # in place: the same adds, no second (N, *shape) array
    return loss + l2_penalty(model, params)


def l2_penalty(model, params: Mapping) -> float:
    """l2/2 * sum over weights of ||w||^2, in float64 (0.0 when the model has no L2 term)."""
    l2 = float(getattr(model, "l2", 0.0))
    if l2 == 0.0:
        return 0.0
    pen = 0.0
    for k, p in params.items():
        if k.endswith(".w"):
            p64 = p.astype(array_module(p).float64)
            pen += float((p64 * p64).sum())
    return 0.5 * l2 * pen


# ---------------------------------------------------------------------------------------------
# heads: per-sample loss (N, B) and d(mean loss)/d(output)


def squared_head(xp, out, y):
    """out, y: (N, B). loss_b = (out_b - y_b)^2 / 2."""
    r = out - y
    return 0.5 * (r * r), r / out.shape[1]


def _log_sigmoid_parts(xp, z):
    e = xp.exp(-xp.abs(z))                      # in (0, 1], never overflows
    softplus = xp.maximum(z, z.dtype.type(0)) + xp.log1p(e)   # log(1 + exp(z))
    sig = xp.where(z >= 0, 1 / (1 + e), e / (1 + e))
    return softplus, sig


def logistic_head(xp, z, y):
    """Binary cross-entropy on logits z (N, B) with labels y in {0, 1}."""
    yf = y.astype(z.dtype)
    softplus, sig = _log_sigmoid_parts(xp, z)
    return softplus - yf * z, (sig - yf) / z.shape[1]


def softmax_head(xp, z, y):
    """Softmax cross-entropy on logits z (N, B, C) with integer labels y (N, B)."""
    classes = z.shape[-1]
    m = z.max(axis=-1, keepdims=True)
    s = z - m
    lse = xp.log(sum_axis(xp, xp.exp(s), -1)[..., None])
    zy = xp.take_along_axis(s, y[..., None].astype(xp.int64), axis=-1)
    per = (lse - zy)[..., 0]
    p = xp.exp(s - lse)
    onehot = (xp.arange(classes) == y[..., None])
    return per, (p - onehot.astype(z.dtype)) / z.shape[1]


def check_labels(xp, model, y, classes: int) -> None:
    if y.size and (int(y.min()) < 0 or int(y.max()) >= classes):
        raise ValueError(f"{model.name}: labels must lie in [0, {classes}), got range "
                         f"[{int(y.min())}, {int(y.max())}]")


def mean_loss(xp, per):
    """(N, B) per-sample losses -> (N,) float64 means (row-wise, so per-worker results are bit-stable)."""
    return sum_axis(xp, per.astype(xp.float64), -1) / per.shape[-1]


# ---------------------------------------------------------------------------------------------
# shared driver


class ModelBase:
    """Mixin: subclasses provide feature_shape, layer_shapes, _init_layer, _forward, _backward, head."""

    head: str = "softmax"   # "squared" | "logistic" | "softmax"

    # -- to be provided ---------------------------------------------------------------------
    @property
    def feature_shape(self) -> tuple[int, ...]:  # pragma: no cover - abstract
        raise NotImplementedError

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _forward(self, xp, params, x):  # -> (out, cache)  # pragma: no cover - abstract
        raise NotImplementedError

    def _backward(self, xp, params, cache, dout) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def _fan_in_gain(self, name: str, shape: tuple[int, ...]) -> tuple[int, float]:
        """(fan_in, gain) of weight `name`; default: dense (in, out), He for all but the last layer."""
        last_w = [k for k in self.layer_shapes() if k.endswith(".w")][-1]
        return shape[0], (1.0 if name == last_w else 2.0)

    # -- provided --------------------------------------------------------------------------
    @property
    def num_params(self) -> int:
        return sum(math.prod(s) for s in self.layer_shapes().values())

    @property
    def num_classes(self) -> int | None:
        return getattr(self, "classes", None)

    def init(self, seed: int) -> dict[str, np.ndarray]:
        """float32 parameters, deterministic from `seed`: weights N(0, gain/fan_in), biases zero."""
        params = {}
        for i, (k, shape) in enumerate(self.layer_shapes().items()):
            if k.endswith(".b"):
                params[k] = np.zeros(shape, np.float32)
            else:
                fan_in, gain = self._fan_in_gain(k, shape)
                params[k] = normal_init(layer_rng(seed, i), shape, fan_in, gain)
        return params

    def _head(self, xp, out, y):
        if self.head == "squared":
            return squared_head(xp, out, y)
        if self.head == "logistic":
            return logistic_head(xp, out, y)
        return softmax_head(xp, out, y)

    def _check_labels(self, xp, y):
        if self.head == "logistic":
            check_labels(xp, self, y, 2)
        elif self.head == "softmax":
            check_labels(xp, self, y, self.classes)

    def loss_and_grad(self, params: Mapping, x, y):
        xp, dtype, x, y = prepare_batch(self, params, x, y)
        self._check_labels(xp, y)
        out, cache = self._forward(xp, params, x)
        per, dout = self._head(xp, out, y)
        loss = mean_loss(xp, per)
        grads = self._backward(xp, params, cache, dout.astype(dtype, copy=False))
        grads = {k: grads[k].astype(dtype, copy=False) for k in self.layer_shapes()}
        loss = add_l2(self, params, loss, grads)
        return loss, grads

    def predict(self, params: Mapping, x):
        """Model output for (M, *feature) inputs: predictions (regression), logits (classification)."""
        xp = array_module(x)
        dtype = compute_dtype(params)
        x = xp.asarray(x).astype(dtype, copy=False)
        out, _ = self._forward(xp, params, x[None])
        return out[0]

    def evaluate(self, params: Mapping, x, y, batch_size: int = 4096) -> tuple[float, float]:
        """(mean loss incl. the L2 term, accuracy) on (M, *feature) data; accuracy is nan for regression.

        Processed in chunks of `batch_size` samples; the mean loss is the objective whose full-data
        minimiser `LeastSquares.optimum` returns.
        """
        if int(batch_size) < 1:
            raise ValueError(f"{self.name}: batch_size must be >= 1, got {batch_size!r}")
        xp = array_module(x)
        x = xp.asarray(x)
        y = xp.asarray(y)
        m = x.shape[0]
        if m == 0:
            raise ValueError(f"{self.name}: evaluate needs at least one sample")
        if tuple(y.shape) != (m,):
            raise ValueError(f"{self.name}: y must have shape ({m},), got {tuple(y.shape)}")
        total, correct = 0.0, 0
        for s in range(0, m, int(batch_size)):
            xb, yb = x[s:s + int(batch_size)][None], y[s:s + int(batch_size)][None]
            _, _, xb, yb = prepare_batch(self, params, xb, yb)
            self._check_labels(xp, yb)
            out, _ = self._forward(xp, params, xb)
            per, _ = self._head(xp, out, yb)
            total += float(per.astype(xp.float64).sum())
            if self.head == "logistic":
                correct += int(((out > 0) == (yb == 1)).sum())
            elif self.head == "softmax":
                correct += int((out.argmax(axis=-1) == yb).sum())
        loss = total / m + l2_penalty(self, params)
        acc = float("nan") if self.task == "regression" else correct / m
        return loss, acc
