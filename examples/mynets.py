"""README's "Your PyTorch model" example module: a small CNN on scikit-learn's digits (8 x 8 images),
trained by examples/look_at_runs.ipynb (`factory = "mynets:small_cnn"`, found in the working directory)."""

import torch


def small_cnn(dim, classes, width=16):
    side = int(dim ** 0.5)                                  # digits: 64 features = 8 x 8
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, side, side)),
        torch.nn.Conv2d(1, width, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(width * dim, classes))
