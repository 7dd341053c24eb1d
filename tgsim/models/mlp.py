"""Multi-layer perceptron: dense + ReLU blocks, then a dense softmax cross-entropy head."""

from __future__ import annotations

from dataclasses import dataclass

from tgsim.models.base import ModelBase, dense_backward, dense_forward, relu, relu_backward


@dataclass(frozen=True)
class MLP(ModelBase):
    """x (N, B, dim) -> [dense(h_i) -> ReLU]* -> dense(classes) -> softmax cross-entropy.

    Layers "fc1", "fc2", ..., the last one the output layer; weights (in, out), He init on ReLU
    layers, LeCun (gain 1) on the output layer. `l2` penalises weights only.
    """

    dim: int
    hidden: tuple[int, ...] = (256, 256)
    classes: int = 10
    l2: float = 0.0
    name: str = "mlp"
    task: str = "classification"
    head = "softmax"

    def __post_init__(self):
        hidden = (self.hidden,) if isinstance(self.hidden, int) else tuple(int(h) for h in self.hidden)
        object.__setattr__(self, "hidden", hidden)
        for k, v in (("dim", self.dim), ("classes", self.classes)) + tuple(("hidden", h) for h in hidden):
            if int(v) != v or v < 1:
                raise ValueError(f"{self.name}: {k} must be a positive integer, got {v!r}")
        if self.classes < 2:
            raise ValueError(f"{self.name}: classes must be >= 2, got {self.classes}")
        if not float(self.l2) >= 0.0:
            raise ValueError(f"{self.name}: l2 must be >= 0, got {self.l2!r}")

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return (self.dim,)

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        widths = (self.dim, *self.hidden, self.classes)
        shapes = {}
        for i in range(len(widths) - 1):
            shapes[f"fc{i + 1}.w"] = (widths[i], widths[i + 1])
            shapes[f"fc{i + 1}.b"] = (widths[i + 1],)
        return shapes

    def _forward(self, xp, params, x):
        n_layers = len(self.hidden) + 1
        inputs, pres = [x], []
        h = x
        for i in range(1, n_layers + 1):
            z = dense_forward(xp, h, params[f"fc{i}.w"], params[f"fc{i}.b"])
            if i < n_layers:
                pres.append(z)
                h = relu(xp, z)
                inputs.append(h)
            else:
                h = z
        return h, (inputs, pres)

    def _backward(self, xp, params, cache, d):
        inputs, pres = cache
        n_layers = len(self.hidden) + 1
        grads = {}
        for i in range(n_layers, 0, -1):
            dw, db, dh = dense_backward(xp, inputs[i - 1], params[f"fc{i}.w"], d, need_input_grad=i > 1)
            grads[f"fc{i}.w"], grads[f"fc{i}.b"] = dw, db
            if i > 1:
                d = relu_backward(xp, pres[i - 2], dh)
        return grads
