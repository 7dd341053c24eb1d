"""A user's own torch model for examples/ddp_train.py: two convolutions, a LayerNorm and a linear
head on scikit-learn's digits (8 x 8 images, which tgsim's `digits` data set gives flat: 64
features). No BatchNorm or Dropout (state outside the parameters): tgsim refuses those.

    PYTHONPATH=examples tgsim run CONFIG.toml     # [model] options = {factory = "ddp_nets:digits_net"}
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class DigitsNet(nn.Module):
    """conv 3x3 (1 -> width), ReLU, conv 3x3 stride 2 (width -> width), ReLU, LayerNorm over the
    flattened maps, linear head to `classes` logits. Takes (batch, side * side) or (batch, 1, side, side)."""

    def __init__(self, classes: int = 10, width: int = 8, side: int = 8):
        super().__init__()
        self.side = side
        half = (side + 1) // 2
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, stride=2)
        self.norm = nn.LayerNorm(width * half * half)
        self.head = nn.Linear(width * half * half, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, 1, self.side, self.side)
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.head(self.norm(x.flatten(1)))


def digits_net(dim: int = 64, classes: int = 10, width: int = 8) -> DigitsNet:
    """The factory tgsim calls ("ddp_nets:digits_net"): `dim` flat features of a square image."""
    side = math.isqrt(dim)
    if side * side != dim:
        raise ValueError(f"digits_net: dim = {dim} is not a square image's pixel count")
    return DigitsNet(classes, width, side)
