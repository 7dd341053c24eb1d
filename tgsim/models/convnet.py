"""A LeNet-like 1-D convnet for MNIST-1D: [conv1d -> ReLU -> max-pool(2)] x 2 -> dense -> ReLU -> dense.

(Computed as max-pool then ReLU, which is the same function and, with ties in a pair sent to the
first element, the same gradient, at half the elementwise work.)

Activations are channels-last, (N, B, length, channels), with the worker axis kept throughout.
conv1d (stride 1, "same" or "valid" padding) is im2col + matmul: the windows are gathered with one
integer index (NumPy and CuPy alike), flattened to (N, B*L_out, kernel*C_in) and multiplied by the
(kernel*C_in, C_out) weight matrix, one BLAS call per worker. The input gradient scatters the column
gradient back with `kernel` strided slice-adds (a loop over kernel offsets, never over workers).

Conv weights are stored (out_channels, in_channels, kernel) like PyTorch's; the flattened feature
fed to fc1 is ordered (position, channel).
"""

from __future__ import annotations

from dataclasses import dataclass

from tgsim.models.base import (TRANSPOSE_MAX, ModelBase, bmm, dense_backward, dense_forward, keep_where, relu,
                               relu_backward, sum_axis)

PADDINGS = ("same", "valid")


def _pad_amounts(kernel: int, padding: str) -> tuple[int, int]:
    if padding == "valid":
        return 0, 0
    left = (kernel - 1) // 2
    return left, kernel - 1 - left


def conv1d_forward(xp, h, w, b, padding: str):
    """h (N, B, L, C) channels-last, w (O, C, k), b (O,) -> (z (N, B, L_out, O), cache)."""
    n, bsz, length, c = h.shape
    o, _, k = w.shape
    pl, pr = _pad_amounts(k, padding)
    if pl or pr:
        h = xp.pad(h, ((0, 0), (0, 0), (pl, pr), (0, 0)))
    l_out = h.shape[2] - k + 1
    idx = xp.arange(l_out)[:, None] + xp.arange(k)[None, :]           # (L_out, k)
    cols = h[:, :, idx, :].reshape(n, bsz * l_out, k * c)             # (N, B*L_out, k*C)
    wmat = xp.ascontiguousarray(w.transpose(2, 1, 0)).reshape(k * c, o)
    z = bmm(xp, cols, wmat)
    z += b
    return z.reshape(n, bsz, l_out, o), (cols, wmat, (n, bsz, length, c), (pl, pr))


def conv1d_backward(xp, cache, dz, need_input_grad: bool = True):
    """dz (N, B, L_out, O) -> (dw (N, O, C, k), db (N, O), dh (N, B, L, C) or None)."""
    cols, wmat, (n, bsz, length, c), (pl, pr) = cache
    _, _, l_out, o = dz.shape
    k = wmat.shape[0] // c
    dz2 = dz.reshape(n, bsz * l_out, o)
    dwmat = bmm(xp, xp.swapaxes(cols, 1, 2), dz2)                   # (N, k*C, O)
    dw = xp.ascontiguousarray(dwmat.reshape(n, k, c, o).transpose(0, 3, 2, 1))
    db = sum_axis(xp, dz2, 1)
    if not need_input_grad:
        return dw, db, None
    wt = xp.ascontiguousarray(wmat.T) if wmat.size <= TRANSPOSE_MAX else wmat.T   # NN gemms (see base)
    dcols = bmm(xp, dz2, wt).reshape(n, bsz, l_out, k, c)
    dhp = xp.zeros((n, bsz, l_out + k - 1, c), dtype=dz.dtype)
    for j in range(k):
        dhp[:, :, j:j + l_out, :] += dcols[:, :, :, j, :]
    return dw, db, dhp[:, :, pl:pl + length, :]


def maxpool2_forward(xp, h):
    """Max over non-overlapping pairs along the length axis of (N, B, L, C); an odd tail is dropped."""
    n, bsz, length, c = h.shape
    half = length // 2
    pairs = h[:, :, :2 * half, :].reshape(n, bsz, half, 2, c)
    a0, a1 = pairs[:, :, :, 0, :], pairs[:, :, :, 1, :]
    take1 = a1 > a0                                                   # ties go to the first element
    return xp.where(take1, a1, a0), (take1, h.shape)


def maxpool2_backward(xp, cache, d):
    """Route d (N, B, L//2, C) to the selected element of each pair; zeros elsewhere (and on a tail)."""
    take1, shape = cache
    n, bsz, length, c = shape
    half = d.shape[2]
    mask = xp.stack([~take1, take1], axis=3)                          # (N, B, half, 2, C)
    dpairs = keep_where(xp, mask, d[:, :, :, None, :]).reshape(n, bsz, 2 * half, c)
    if 2 * half == length:
        return dpairs
    dh = xp.zeros(shape, dtype=d.dtype)
    dh[:, :, :2 * half, :] = dpairs
    return dh


@dataclass(frozen=True)
class ConvNet1D(ModelBase):
    """MNIST-1D convnet; input x (N, B, length) (one channel).

    Defaults (length 40, channels (16, 32), kernel 5, "same" padding, hidden 64, 10 classes):
    40 -> conv 16 -> pool 20 -> conv 32 -> pool 10 -> 320 -> 64 -> 10, 23,882 parameters.
    """

    length: int = 40
    channels: tuple[int, ...] = (16, 32)
    kernel: int = 5
    hidden: int = 64
    classes: int = 10
    padding: str = "same"
    l2: float = 0.0
    name: str = "convnet1d"
    task: str = "classification"
    head = "softmax"

    def __post_init__(self):
        channels = (self.channels,) if isinstance(self.channels, int) else tuple(int(c) for c in self.channels)
        object.__setattr__(self, "channels", channels)
        for k, v in (("length", self.length), ("kernel", self.kernel), ("hidden", self.hidden),
                     ("classes", self.classes)) + tuple(("channels", c) for c in channels):
            if int(v) != v or v < 1:
                raise ValueError(f"{self.name}: {k} must be a positive integer, got {v!r}")
        if not channels:
            raise ValueError(f"{self.name}: need at least one conv layer (channels is empty)")
        if self.classes < 2:
            raise ValueError(f"{self.name}: classes must be >= 2, got {self.classes}")
        if self.padding not in PADDINGS:
            raise ValueError(f"{self.name}: padding must be one of {PADDINGS}, got {self.padding!r}")
        if not float(self.l2) >= 0.0:
            raise ValueError(f"{self.name}: l2 must be >= 0, got {self.l2!r}")
        if self.flat_length() < 1:
            raise ValueError(f"{self.name}: length {self.length} is too short for {len(channels)} "
                             f"conv({self.kernel}, {self.padding}) + pool(2) blocks")

    def flat_length(self) -> int:
        """Sequence length after the conv/pool blocks."""
        length = self.length
        for _ in self.channels:
            if self.padding == "valid":
                length = length - self.kernel + 1
            length //= 2
        return length

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return (self.length,)

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {}
        c_in = 1
        for i, c in enumerate(self.channels):
            shapes[f"conv{i + 1}.w"] = (c, c_in, self.kernel)
            shapes[f"conv{i + 1}.b"] = (c,)
            c_in = c
        flat = self.flat_length() * c_in
        shapes["fc1.w"] = (flat, self.hidden)
        shapes["fc1.b"] = (self.hidden,)
        shapes["fc2.w"] = (self.hidden, self.classes)
        shapes["fc2.b"] = (self.classes,)
        return shapes

    def _fan_in_gain(self, name, shape):
        if name.startswith("conv"):
            return shape[1] * shape[2], 2.0
        return shape[0], (1.0 if name == "fc2.w" else 2.0)

    def _forward(self, xp, params, x):
        h = x[..., None]                                              # (N, B, L, 1)
        convs = []
        for i in range(len(self.channels)):
            z, ccache = conv1d_forward(xp, h, params[f"conv{i + 1}.w"], params[f"conv{i + 1}.b"], self.padding)
            # pool(relu(z)) == relu(pool(z)) (both monotone): the ReLU runs on the pooled half
            pooled, pcache = maxpool2_forward(xp, z)
            h = relu(xp, pooled)
            convs.append((ccache, pcache, h))
        pooled_shape = h.shape
        flat = h.reshape(h.shape[0], h.shape[1], -1)
        z1 = dense_forward(xp, flat, params["fc1.w"], params["fc1.b"])
        a1 = relu(xp, z1)
        out = dense_forward(xp, a1, params["fc2.w"], params["fc2.b"])
        return out, (convs, pooled_shape, flat, z1, a1)

    def _backward(self, xp, params, cache, d):
        convs, pooled_shape, flat, z1, a1 = cache
        grads = {}
        grads["fc2.w"], grads["fc2.b"], da1 = dense_backward(xp, a1, params["fc2.w"], d)
        dz1 = relu_backward(xp, z1, da1)
        grads["fc1.w"], grads["fc1.b"], dflat = dense_backward(xp, flat, params["fc1.w"], dz1)
        dh = dflat.reshape(pooled_shape)
        for i in range(len(self.channels) - 1, -1, -1):
            ccache, pcache, act = convs[i]
            dpooled = relu_backward(xp, act, dh)                     # act > 0 iff pooled > 0
            dz = maxpool2_backward(xp, pcache, dpooled)
            dw, db, dh = conv1d_backward(xp, ccache, dz, need_input_grad=i > 0)
            grads[f"conv{i + 1}.w"], grads[f"conv{i + 1}.b"] = dw, db
        return grads
