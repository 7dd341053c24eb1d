"""A zoo of user-style torch models (tests/test_torch_zoo.py): what a user writes, each either trained
with the same bits by the simulator, by `mpiexec ... tgsim.mpi_runs.train` and by DDP with tgsim's hook
(over mpi4py and over torch.distributed launched by torchrun), or refused by all of them before any
update with one line naming what to change (tgsim/torch/model.py, "What a module may hold").

Each factory takes what TorchModel passes (`dim`, `classes`, `feature_shape`) and is written the way
a user would write it, in plain torch.nn. `tokens` is a torch data factory of integer token ids.
Three cases train with weight decay (momentum, Nesterov, Adam). `ZOO` maps a case name to (its config dict at 2 workers, None for a supported model or the text of
the refusal).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

STEPS = 3


class ConvLN(nn.Module):
    """Two convolutions, a LayerNorm and a linear head on 8x8 images (the issue's user model)."""

    def __init__(self, dim, classes, width=4):
        super().__init__()
        self.side = int(round(dim ** 0.5))
        self.c1 = nn.Conv2d(1, width, 3, padding=1)
        self.c2 = nn.Conv2d(width, width, 3, padding=1)
        self.norm = nn.LayerNorm(width * dim)
        self.head = nn.Linear(width * dim, classes)

    def forward(self, x):
        h = x.view(-1, 1, self.side, self.side)
        h = F.relu(self.c2(F.relu(self.c1(h))))
        return self.head(self.norm(h.flatten(1)))


def conv_ln(dim, classes):
    return ConvLN(dim, classes)


class Frozen(nn.Module):
    """A fixed random projection (a frozen Linear) and a frozen bias under a trained head."""

    def __init__(self, dim, classes):
        super().__init__()
        self.proj = nn.Linear(dim, 24)
        self.proj.requires_grad_(False)
        self.head = nn.Linear(24, classes)
        self.head.bias.requires_grad_(False)

    def forward(self, x):
        return self.head(torch.tanh(self.proj(x)))


def frozen(dim, classes):
    return Frozen(dim, classes)


class Unused(nn.Module):
    """An MLP with a layer its forward pass never calls (left over from an experiment)."""

    def __init__(self, dim, classes):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim, 16), nn.ReLU(), nn.Linear(16, classes))
        self.spare = nn.Linear(4, 4)

    def forward(self, x):
        return self.body(x)


def unused(dim, classes):
    return Unused(dim, classes)


class Tied(nn.Module):
    """Two hidden layers sharing one weight matrix."""

    def __init__(self, dim, classes):
        super().__init__()
        self.inp = nn.Linear(dim, 16)
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.b.weight = self.a.weight
        self.out = nn.Linear(16, classes)

    def forward(self, x):
        return self.out(torch.relu(self.b(torch.relu(self.a(torch.relu(self.inp(x)))))))


def tied(dim, classes):
    return Tied(dim, classes)


class Buffers(nn.Module):
    """Constant buffers: an input scale and a random (seed-dependent) feature mixing matrix."""

    def __init__(self, dim, classes):
        super().__init__()
        self.register_buffer("scale", torch.full((dim,), 1 / 16.0))
        self.register_buffer("mix", torch.randn(dim, dim) / dim ** 0.5)
        self.body = nn.Sequential(nn.Linear(dim, 16), nn.GELU(), nn.Linear(16, classes))

    def forward(self, x):
        return self.body((x * self.scale) @ self.mix)


def buffers(dim, classes):
    return Buffers(dim, classes)


def batchnorm_no_stats(dim, classes):
    """BatchNorm over the batch only (no running statistics: no state outside the parameters)."""
    return nn.Sequential(nn.Linear(dim, 16), nn.BatchNorm1d(16, track_running_stats=False), nn.ReLU(),
                         nn.Linear(16, classes))


class TinyGPT(nn.Module):
    """Token embedding + learned positions, causal multi-head self-attention with its mask as a
    buffer, a LayerNorm and a linear head predicting the next token; input: int64 token ids."""

    def __init__(self, dim, classes, d_model=16, heads=2):
        super().__init__()
        self.embed = nn.Embedding(classes, d_model)
        self.pos = nn.Parameter(torch.randn(dim, d_model) * 0.02)
        self.attn = nn.MultiheadAttention(d_model, heads, batch_first=True)
        self.register_buffer("mask", torch.ones(dim, dim, dtype=torch.bool).triu(1))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)

    def forward(self, ids):
        h = self.embed(ids) + self.pos
        a, _ = self.attn(h, h, h, attn_mask=self.mask, need_weights=False)
        return self.head(self.norm(h + a)[:, -1])


def tiny_gpt(dim, classes):
    return TinyGPT(dim, classes)


def tokens(n_train=256, n_test=64, context=8, vocab=11):
    """Integer token windows: y = (sum of the window) mod vocab; x int64 (n, context)."""
    rng = np.random.default_rng(7)
    x = rng.integers(0, vocab, size=(n_train + n_test, context), dtype=np.int64)
    y = x.sum(axis=1) % vocab
    return {"x_train": x[:n_train], "y_train": y[:n_train], "x_test": x[n_train:], "y_test": y[n_train:]}


# -- refused: state outside the parameters, randomness in forward ------------------------------------------

def batchnorm(dim, classes):
    return nn.Sequential(nn.Linear(dim, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, classes))


class FunctionalDropout(nn.Module):
    def __init__(self, dim, classes):
        super().__init__()
        self.a, self.b = nn.Linear(dim, 16), nn.Linear(16, classes)

    def forward(self, x):
        return self.b(F.dropout(torch.relu(self.a(x)), 0.3, training=self.training))


def functional_dropout(dim, classes):
    return FunctionalDropout(dim, classes)


class Noisy(nn.Module):
    def __init__(self, dim, classes):
        super().__init__()
        self.a = nn.Linear(dim, classes)

    def forward(self, x):
        return self.a(x + 0.1 * torch.randn_like(x))


def noisy(dim, classes):
    return Noisy(dim, classes)


class Counter(nn.Module):
    def __init__(self, dim, classes):
        super().__init__()
        self.a = nn.Linear(dim, classes)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return self.a(x)


def counter(dim, classes):
    return Counter(dim, classes)


def module_dropout(dim, classes):
    return nn.Sequential(nn.Linear(dim, 16), nn.Dropout(0.2), nn.Linear(16, classes))


# -- the cases ---------------------------------------------------------------------------------------------

def config(factory: str, codec: dict, mode: str, data: dict | None = None, optimizer: dict | None = None) -> dict:
    return {"run": {"name": "zoo", "seed": 3, "steps": STEPS, "eval_every": 0, "log_every": 10,
                    "checkpoint_every": 1, "keep_checkpoints": STEPS},
            "data": data or {"name": "digits"},
            "model": {"name": "torch", "options": {"factory": f"torch_zoo:{factory}"}},
            "workers": {"n": 2, "batch": 32}, "codec": codec, "exchange": {"mode": mode},
            "optimizer": optimizer or {"name": "momentum"}, "schedule": {"name": "constant", "lr": 0.05}}


TOKENS = {"name": "torch", "options": {"factory": "torch_zoo:tokens"}}
TERNGRAD = {"name": "terngrad"}
ZOO = {
    "conv_ln": (config("conv_ln", TERNGRAD, "ps"), None),
    "frozen": (config("frozen", {"name": "qsgd"}, "ps"), None),
    "unused": (config("unused", {"name": "powersgd", "rank": 2}, "allreduce",
                      optimizer={"name": "nesterov", "weight_decay": 0.01}), None),
    "tied": (config("tied", TERNGRAD, "allreduce", optimizer={"name": "momentum", "weight_decay": 0.01}), None),
    "buffers_adam": (config("buffers", {"name": "qsgd"}, "allgather", optimizer={"name": "adam", "weight_decay": 0.01}),
                     None),
    "buffers": (config("buffers", {"name": "topk", "error_feedback": True}, "ps"), None),
    "batchnorm_no_stats": (config("batchnorm_no_stats", {"name": "terngrad", "sharing": "none"}, "allgather"), None),
    "tiny_gpt": (config("tiny_gpt", TERNGRAD, "ps", TOKENS), None),
    "batchnorm": (config("batchnorm", TERNGRAD, "ps"), "BatchNorm with running statistics"),
    "module_dropout": (config("module_dropout", TERNGRAD, "ps"), "Dropout with p = 0.2"),
    "functional_dropout": (config("functional_dropout", TERNGRAD, "ps"), "the forward pass draws random numbers"),
    "noisy": (config("noisy", TERNGRAD, "ps"), "the forward pass draws random numbers"),
    "counter": (config("counter", TERNGRAD, "ps"), "changed buffer 'calls' in place"),
}
SUPPORTED = [k for k, (_, why) in ZOO.items() if why is None]


def case_config(name: str, workers: int = 2) -> dict:
    """ZOO[name]'s config at `workers` workers of 16 samples each."""
    import copy

    d = copy.deepcopy(ZOO[name][0])
    d["workers"] = {"n": workers, "batch": 16 * workers}
    return d
REFUSED = [k for k, (_, why) in ZOO.items() if why is not None]
