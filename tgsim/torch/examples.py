"""Example networks for TorchModel, plain torch.nn (no torchvision), on tgsim's flat feature vectors.

* `mlp(dim, classes, hidden=(128, 128))`: Linear-ReLU layers, then a Linear head of `classes`
  outputs (one for regression, classes = 0): MNIST-1D (dim 40), any of tgsim's flat data sets.
* `resnet(dim, classes, width=16, blocks=2, channels=1)`: a small residual network for square
  images given flat (scikit-learn's digits: dim 64, one 8x8 channel). The forward pass reshapes the
  (B, dim) batch to (B, channels, side, side); a 3x3 stem of `width` channels, `blocks` basic blocks
  (two 3x3 convolutions, identity shortcut) at `width` channels, `blocks` more at 2 * width with the
  first at stride 2 (a 1x1 projection shortcut), global average pooling and a Linear head. GroupNorm
  (min(4, channels) groups) normalises: it keeps no running statistics, so the parameters are the
  whole state. At width 16 and blocks 2 it holds about 43k parameters.
* `char_transformer(dim, classes, d_model=64, heads=4, layers=2, ff=None)`: a small causal
  transformer for next-token prediction (tgsim's "pychars" data: `dim` = the context length, x the
  float token ids, `classes` = the vocabulary). Token embedding (classes x d_model) plus a learned
  position embedding (dim x d_model, N(0, 0.02^2)), `layers` pre-norm encoder layers
  (nn.TransformerEncoderLayer, norm_first, GELU, feed-forward width ff = 2 * d_model unless given,
  dropout 0) under a causal mask (position t attends to positions <= t), a final LayerNorm, and a
  Linear head on the last position's output: the logits of the token after the window. At the
  defaults and 105 classes it holds about 81k parameters.

Each factory builds its module with torch's default initialisation, drawn from torch's generator
(TorchModel.init seeds it). torch is imported when a factory is called, not when this module is.
"""

from __future__ import annotations

import functools
import math

from tgsim.torch.model import import_torch


def mlp(dim: int, classes: int = 0, hidden=(128, 128)):
    """nn.Sequential of Linear(dim -> h) + ReLU per entry h of `hidden`, then Linear(-> max(classes, 1))."""
    nn = import_torch().nn
    if int(dim) < 1 or any(int(h) < 1 for h in hidden):
        raise ValueError(f"mlp: dim and hidden widths must be >= 1, got dim={dim!r}, hidden={hidden!r}")
    layers, width = [], int(dim)
    for h in hidden:
        layers += [nn.Linear(width, int(h)), nn.ReLU()]
        width = int(h)
    layers.append(nn.Linear(width, max(int(classes), 1)))
    return nn.Sequential(*layers)


def resnet(dim: int, classes: int, width: int = 16, blocks: int = 2, channels: int = 1):
    """The small ResNet of the module docstring for flat images of `dim` = channels * side^2 features."""
    _, ResNet = _resnet_classes()
    side = math.isqrt(int(dim) // max(int(channels), 1))
    if int(channels) < 1 or int(channels) * side * side != int(dim):
        raise ValueError(f"resnet: dim = {dim} is not channels ({channels}) times a square side^2")
    if int(width) < 1 or int(blocks) < 1 or int(classes) < 2:
        raise ValueError(f"resnet: width and blocks must be >= 1 and classes >= 2, got width={width!r}, "
                         f"blocks={blocks!r}, classes={classes!r}")
    return ResNet(int(channels), side, int(classes), int(width), int(blocks))


@functools.cache
def _resnet_classes():
    """(BasicBlock, ResNet): nn.Module subclasses, defined on first use (torch imported then)."""
    torch = import_torch()
    nn = torch.nn

    def norm(c):
        return nn.GroupNorm(min(4, c), c)

    class BasicBlock(nn.Module):
        """relu(x' + bn(conv(relu(bn(conv(x)))))), x' = x or a 1x1 strided projection of x."""

        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
            self.norm1 = norm(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
            self.norm2 = norm(cout)
            self.shortcut = nn.Identity()
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), norm(cout))

        def forward(self, x):
            h = torch.relu(self.norm1(self.conv1(x)))
            return torch.relu(self.norm2(self.conv2(h)) + self.shortcut(x))

    class ResNet(nn.Module):
        """Stem, two stages of basic blocks (the second at stride 2, twice the width), pool, head."""

        def __init__(self, channels: int, side: int, classes: int, width: int, blocks: int):
            super().__init__()
            self.shape = (channels, side, side)
            self.stem = nn.Sequential(nn.Conv2d(channels, width, 3, padding=1, bias=False), norm(width), nn.ReLU())
            stage1 = [BasicBlock(width, width, 1) for _ in range(blocks)]
            stage2 = [BasicBlock(width, 2 * width, 2)]
            stage2 += [BasicBlock(2 * width, 2 * width, 1) for _ in range(blocks - 1)]
            self.stages = nn.Sequential(*stage1, *stage2)
            self.head = nn.Linear(2 * width, classes)

        def forward(self, x):
            h = self.stages(self.stem(x.reshape(x.shape[0], *self.shape)))
            return self.head(h.mean(dim=(2, 3)))

    return BasicBlock, ResNet


def char_transformer(dim: int, classes: int, d_model: int = 64, heads: int = 4, layers: int = 2, ff=None):
    """The causal character transformer of the module docstring: windows of `dim` token ids ->
    logits (B, classes) of the next token."""
    ff = 2 * int(d_model) if ff is None else ff
    for key, v, low in (("dim", dim, 1), ("classes", classes, 2), ("d_model", d_model, 1), ("heads", heads, 1),
                        ("layers", layers, 1), ("ff", ff, 1)):
        if isinstance(v, bool) or int(v) != v or int(v) < low:
            raise ValueError(f"char_transformer: {key} must be an integer >= {low}, got {v!r}")
    if int(d_model) % int(heads):
        raise ValueError(f"char_transformer: d_model ({d_model}) must be a multiple of heads ({heads})")
    return _transformer_class()(int(dim), int(classes), int(d_model), int(heads), int(layers), int(ff))


@functools.cache
def _transformer_class():
    """CharTransformer: an nn.Module subclass, defined on first use (torch imported then)."""
    torch = import_torch()
    nn = torch.nn

    class CharTransformer(nn.Module):
        """Embedding + positions, causal pre-norm encoder layers, LayerNorm, head on the last position."""

        def __init__(self, context: int, vocab: int, d_model: int, heads: int, layers: int, ff: int):
            super().__init__()
            self.context, self.vocab = context, vocab
            self.embed = nn.Embedding(vocab, d_model)
            self.pos = nn.Parameter(torch.randn(context, d_model) * 0.02)
            self.blocks = nn.ModuleList(   # each drawn on its own (nn.TransformerEncoder would copy one)
                nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=ff, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True) for _ in range(layers))
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab)

        def forward(self, x):
            if x.ndim != 2 or x.shape[1] != self.context:
                raise ValueError(f"char_transformer: input must be (batch, {self.context}) token ids, "
                                 f"got {tuple(x.shape)}")
            ids = x.long()
            h = self.embed(ids) + self.pos
            mask = torch.ones(self.context, self.context, dtype=torch.bool, device=x.device).triu(1)
            for block in self.blocks:
                h = block(h, src_mask=mask)
            return self.head(self.norm(h[:, -1]))

    return CharTransformer


__all__ = ["char_transformer", "mlp", "resnet"]
