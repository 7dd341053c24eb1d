"""Models as (params, loss_and_grad) over a leading worker axis, with hand-derived gradients.

    model = make_model("mlp", dim=40, hidden=(256, 256), classes=10)
    params = model.init(seed=0)                        # dict name -> float32 array, no worker axis
    loss, grads = model.loss_and_grad(params, x, y)    # x (N, B, *feature), y (N, B)
    # loss (N,) float64, grads[name] (N, *shape) float32: one gradient per worker

See tgsim/models/base.py for the protocol and the conventions (L2 on weights only, layer naming,
dtype genericity, bitwise per-worker independence).

OPTIONAL_MODELS are built by other packages, imported only when such a model is asked for: "torch"
is tgsim.torch's TorchModel (a user's torch.nn.Module; needs the `torch` extra). A model class may
name the fields that are not arguments in FIXED_FIELDS (default: name and task).
"""

from __future__ import annotations

import dataclasses

from tgsim.models.base import Model, ModelBase
from tgsim.models.convnet import ConvNet1D
from tgsim.models.linear import LeastSquares, LogisticRegression, SoftmaxRegression
from tgsim.models.mlp import MLP

MODELS: dict[str, type] = {
    "least_squares": LeastSquares,
    "logistic": LogisticRegression,
    "softmax": SoftmaxRegression,
    "mlp": MLP,
    "convnet1d": ConvNet1D,
}
# name -> "module:Class", imported on first use (the module may need an optional dependency)
OPTIONAL_MODELS: dict[str, str] = {"torch": "tgsim.torch.model:TorchModel"}


def model_kwargs(name: str) -> list[str]:
    """The keyword arguments `make_model(name, ...)` accepts."""
    cls = _lookup(name)
    fixed = getattr(cls, "FIXED_FIELDS", ("name", "task"))
    return [f.name for f in dataclasses.fields(cls) if f.init and f.name not in fixed]


def _lookup(name: str) -> type:
    if isinstance(name, str) and name in OPTIONAL_MODELS:
        import importlib

        module, cls = OPTIONAL_MODELS[name].split(":")
        return getattr(importlib.import_module(module), cls)
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join([*MODELS, *OPTIONAL_MODELS])}") from None


def make_model(name: str, **kwargs) -> Model:
    """Build the model registered as `name` from its hyper-parameters (dataclass fields)."""
    cls = _lookup(name)
    valid = model_kwargs(name)
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise ValueError(f"model {name!r}: unknown argument(s) {', '.join(unknown)}; "
                         f"valid arguments: {', '.join(valid)}")
    required = [f.name for f in dataclasses.fields(cls)
                if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [k for k in required if k not in kwargs]
    if missing:
        raise ValueError(f"model {name!r}: missing required argument(s) {', '.join(missing)}; "
                         f"valid arguments: {', '.join(valid)}")
    return cls(**kwargs)


__all__ = ["MODELS", "OPTIONAL_MODELS", "ConvNet1D", "LeastSquares", "LogisticRegression", "MLP", "Model", "ModelBase",
           "SoftmaxRegression", "make_model", "model_kwargs"]
