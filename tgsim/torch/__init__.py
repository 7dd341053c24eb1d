"""A user's torch.nn.Module as a tgsim model: the trainer, codecs, exchanges and run directory of
`tgsim run` train it as N virtual workers in one process, or one worker per MPI rank.

    from tgsim.torch import TorchModel
    model = TorchModel(factory="tgsim.torch.examples:digits_resnet", dim=64, classes=10)
    params = model.init(seed=0)                        # {parameter name: float32 array}, sorted by name
    loss, grads = model.loss_and_grad(params, x, y)    # x (N, B, 64), y (N, B): one gradient per worker

In a config: `[model] name = "torch"`, `options = {factory = "package.module:function"}`; the
trainer fills `dim` and `classes` from the data set. tgsim/torch/model.py holds the adapter,
tgsim/torch/examples.py the example networks. Nothing here imports torch until a model is built, so
`import tgsim.torch` works without it (building a model then says `pip install tgsim[torch]`).
"""

from __future__ import annotations

from tgsim.torch.model import TorchModel, determinism

__all__ = ["TorchModel", "determinism"]
