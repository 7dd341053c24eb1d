"""TorchModel: a torch.nn.Module built by a factory, behind tgsim's model protocol (tgsim/models/base.py).

    model = TorchModel(factory="tgsim.torch.examples:mlp", dim=40, classes=10)
    params = model.init(seed=0)              # {name: float32 array}, names sorted, no worker axis
    loss, grads = model.loss_and_grad(params, x, y)   # x (N, B, dim), y (N, B)
    # loss (N,) float64, grads[name] (N, *shape) in the parameters' dtype

The module
----------
`factory` names a callable as "package.module:function"; it is called with `kwargs`, plus `dim`,
`classes` and `feature_shape` (one sample's shape, a tuple) where its signature names them and
`kwargs` does not (the trainer fills them from the data set), and must return a torch.nn.Module.

What a module may hold (the same rule in the simulator, on MPI ranks and in the DDP hook,
tgsim/torch/ddp.py):
- trainable parameters (`requires_grad=True`) are the model's parameters, keyed by their
  `named_parameters()` names and ordered by name, so every codec, checkpoint and MPI rank sees the
  same layers in the same order; tied parameters count once, under their first name;
- frozen parameters (`requires_grad=False`) are constants: not trained, not sent, not counted in
  bits, at the values the factory builds under the run's seed (`seed`, filled by the trainer from
  [run] seed);
- a parameter the forward pass does not use gets a zero gradient (the hook: DDP needs
  `find_unused_parameters=True` for it);
- buffers are constants (the factory's values under `seed`): a buffer the forward pass changes in
  place (BatchNorm's running statistics, a counter) is refused, since it would not be in what the
  trainer checkpoints and exchanges; BatchNorm with `track_running_stats=False`, GroupNorm and
  LayerNorm normalise without such state;
- randomness in the forward pass (nn.Dropout, F.dropout, torch.rand*, torch.randn_like, ...) is
  refused: the check compares torch's random state before and after each worker's forward and
  backward pass (`ForwardStateError`); its draws would not be keyed by (seed, step, worker), so
  runs would not repeat bit for bit;
- inputs: integer data (token ids, from a torch data factory) reach the module as int64, floating
  data in the parameters' dtype; masks the module builds (a causal attention mask) are its own.
The module is built once (under `seed`) as a skeleton; the parameters of a call are put into it with
`torch.func.functional_call`, as tensors sharing memory with the NumPy arrays (`torch.from_numpy`,
no copy).

The loss
--------
classification: cross-entropy of the logits (B, C) against int64 labels (torch's
`cross_entropy`, the mean over the worker's B samples); regression: mean squared error of the
outputs (B,) or (B, 1) against float targets (torch's `mse_loss`). No L2 term: weight decay is the
optimizer's (`[optimizer] weight_decay`). The loss tgsim reports is that float32 (or float64) mean,
widened to float64.

Bit-for-bit per worker
----------------------
Worker i's forward and backward pass is its own torch call on x[i], y[i], with the same shapes
whatever N is, so its loss and gradients are bitwise those of a call with x[i:i+1] alone. Every
call runs with torch at one intra-op thread (`torch.set_num_threads(1)`, restored afterwards): a
CPU kernel's reduction order then does not depend on the thread count, and an MPI rank computes
the simulator's bits for its worker. `determinism()` states these settings (the run manifest
records them). The compute dtype is the parameters' (float32 in training, float64 for gradient
checks).

On a GPU (run.backend = "cupy")
-------------------------------
With CuPy arrays the module runs on the CuPy array's current CUDA device. Parameters, inputs and
the gradient buffers pass between CuPy and torch through DLPack (`torch.from_dlpack`: the same
device memory, no copy); under the DLPack protocol torch's import makes its current stream wait
for CuPy's, and the call ends with torch's stream synchronized, so the CuPy code after it sees the
gradients written. Every call runs under `gpu_determinism`: torch's deterministic algorithms on
(CUBLAS_WORKSPACE_CONFIG=":4096:8" set when unset, as cuBLAS requires for them), cuDNN's
deterministic kernels and no autotuning (`cudnn.benchmark` off), TF32 off for matmuls and
convolutions; restored afterwards. Worker i is still its own call on x[i] with the same shapes,
so on one GPU type its gradient is bitwise that of a call with x[i:i+1] alone, and an MPI rank on
that GPU type computes the simulator's bits for its worker. CPU and GPU bits differ (other
kernels).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import ClassVar, Mapping

import numpy as np

from tgsim.errors import ConfigError
from tgsim.models.base import TASKS, check_labels, check_params, prepare_batch

INSTALL_HINT = "pip install tgsim[torch]"
THREADS = 1          # torch's intra-op threads inside every call of a TorchModel


def import_torch():
    """The torch module; ConfigError naming the extra to install when torch is missing."""
    try:
        import torch
    except ImportError as err:
        raise ConfigError(f"model 'torch' needs PyTorch, which is not installed: {INSTALL_HINT}") from err
    return torch


def determinism(device: str = "cpu") -> dict:
    """The settings a TorchModel's bits depend on, for the run manifest: torch's version, the device
    ("cpu", or "cuda" with the GPU's name and torch's CUDA and cuDNN versions), the intra-op threads
    of every call, whether torch's deterministic-algorithms flag is on (on a GPU: inside every call,
    `gpu_determinism`), the float32 matmul precision and whether oneDNN (mkldnn) kernels are enabled."""
    torch = import_torch()
    out = {"version": torch.__version__, "device": device, "threads": THREADS,
           "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
           "float32_matmul_precision": torch.get_float32_matmul_precision(),
           "mkldnn": bool(torch.backends.mkldnn.enabled)}
    if device == "cuda":
        out.update(deterministic_algorithms=True, gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version(), cudnn_deterministic=True, cudnn_benchmark=False,
                   tf32=False)
    return out


@contextlib.contextmanager
def gpu_determinism(torch):
    """Inside the block: torch's deterministic algorithms, cuDNN deterministic without autotuning,
    TF32 off (module docstring, On a GPU); the previous settings restored after it."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32)
    torch.use_deterministic_algorithms(True)
    cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32 = True, False, False, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32 = saved[2:]


@contextlib.contextmanager
def one_thread(torch):
    """torch at THREADS intra-op threads inside the block, the previous count restored after it."""
    prev = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


@contextlib.contextmanager
def torch_threads_kept(torch):
    """torch's intra-op thread count after the block as it was before it, whatever the block did.

    Numba's OpenMP threading layer, started by tgsim's first parallel kernel in a process, sets the
    OpenMP runtime's thread count to NUMBA_NUM_THREADS (the core count by default); torch's CPU
    build shares that runtime and reads its intra-op count from it, so without this a user's
    `torch.set_num_threads(1)` would silently become the core count, and torch's backward would
    reduce in another order than the simulator's (and oversubscribe the cores). The DDP hook's
    create() (which starts Numba's pool) and its step run inside this block."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def resolve_factory(spec: str):
    """The callable named by `spec` = "package.module:function" (dotted attributes allowed after the
    colon); ValueError saying what did not resolve.

    A module that is not on sys.path is looked for in the working directory, as `python -m` and
    `python script.py` users expect: where its top-level package is not found, the working directory is
    put first on sys.path (and stays there) and the import is tried again, so `factory = "mynets:cnn"`
    with ./mynets.py works under `tgsim run` and `mpiexec ... python -m tgsim.mpi_runs.train` alike."""
    import sys

    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"model 'torch': factory must look like 'package.module:function', got {spec!r}")
    module_name, attr = spec.split(":")
    top = module_name.split(".")[0]
    try:
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            cwd = os.getcwd()
            on_path = {os.path.abspath(p or os.curdir) for p in sys.path}
            if err.name != top or cwd in on_path:
                raise
            sys.path.insert(0, cwd)                  # as `python -m` does
            importlib.invalidate_caches()
            obj = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"model 'torch': factory {spec!r}: cannot import module {module_name!r} ({err}; looked "
                         f"on sys.path and in the working directory {os.getcwd()}: put the module there or add "
                         "its folder to PYTHONPATH)") from err
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"model 'torch': factory {spec!r}: {obj.__name__!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"model 'torch': factory {spec!r} is not callable ({type(obj).__name__})")
    return obj


def _tensor(torch, a):
    """A torch tensor sharing memory with the array `a`: a NumPy array through `torch.from_numpy` (a
    read-only one too, without torch's warning about it, never written through), a CuPy array
    through DLPack (`torch.from_dlpack`, on its device)."""
    if not isinstance(a, np.ndarray):
        return torch.from_dlpack(a)
    if a.flags.writeable:
        return torch.from_numpy(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


@contextlib.contextmanager
def _on_device(torch, xp):
    """The block's torch settings for arrays of `xp`: one thread (NumPy), or `gpu_determinism` on the
    CuPy array's current device (CuPy), torch's stream synchronized at the end."""
    if xp is np:
        with one_thread(torch):
            yield
        return
    with torch.cuda.device(int(xp.cuda.Device().id)), gpu_determinism(torch):
        try:
            yield
        finally:
            torch.cuda.current_stream().synchronize()


@dataclass(frozen=True)
class TorchModel:
    """A torch.nn.Module from `factory` as a tgsim model (module docstring).

    factory: "package.module:function" returning the nn.Module; task: "classification"
    (cross-entropy) or "regression" (mean squared error); dim: the length of a flat feature vector;
    classes: the number of classes (0 for regression); feature_shape: the shape of one sample the
    module takes (default (dim,)); kwargs: keyword arguments of the factory; seed: the run's seed,
    under which the factory builds the module's constants (frozen parameters, buffers).
    """

    factory: str
    task: str = "classification"
    dim: int = 0
    classes: int = 0
    feature_shape: tuple = ()
    kwargs: dict = field(default_factory=dict, hash=False)
    seed: int = 0
    name: str = field(default="torch", init=False)
    FIXED_FIELDS: ClassVar[tuple[str, ...]] = ("name",)     # task is an argument (tgsim.models.model_kwargs)
    INTEGER_INPUTS: ClassVar[bool] = True     # integer data reaches the module as int64 (module docstring)

    def __post_init__(self):
        import_torch()                           # without torch: the extra to install, before anything else
        if self.task not in TASKS:
            raise ValueError(f"model 'torch': task must be one of {TASKS}, got {self.task!r}")
        if not isinstance(self.kwargs, dict):
            raise ValueError(f"model 'torch': kwargs must be a table of the factory's arguments, got {self.kwargs!r}")
        shape = (tuple(int(d) for d in self.feature_shape) if self.feature_shape
                 else (int(self.dim),) if self.dim else ())
        if not shape or min(shape) < 1:
            raise ValueError(f"model 'torch': give dim (the feature length) or feature_shape, got dim={self.dim!r}, "
                             f"feature_shape={self.feature_shape!r}")
        if self.dim and math.prod(shape) != int(self.dim):
            raise ValueError(f"model 'torch': feature_shape {shape} does not hold dim = {self.dim} features")
        object.__setattr__(self, "feature_shape", shape)
        resolve_factory(self.factory)            # a factory that does not resolve fails here, not at step 0

    # -- the module ------------------------------------------------------------------------------
    def build(self, seed: int):
        """A fresh nn.Module from the factory, its initial parameters drawn with torch's generator
        seeded with `seed` (torch's global random state is saved and restored around it)."""
        torch = import_torch()
        fn = resolve_factory(self.factory)
        kw = dict(self.kwargs)
        try:
            accepted = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            accepted = {}
        for key in ("dim", "classes"):
            if key in accepted and key not in kw and getattr(self, key):
                kw[key] = int(getattr(self, key))
        if "feature_shape" in accepted and "feature_shape" not in kw:
            kw["feature_shape"] = tuple(self.feature_shape)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            module = fn(**kw)
        if not isinstance(module, torch.nn.Module):
            raise ValueError(f"model 'torch': factory {self.factory!r} returned {type(module).__name__}, "
                             "not a torch.nn.Module")
        _check_stateless(torch, module, self.factory)
        return module

    @functools.cached_property
    def _skeleton(self):
        """The module built once (under `seed`), into which every call puts its parameters, and its
        buffers; its frozen parameters stay in it as constants."""
        module = self.build(self.seed)
        return module, dict(module.named_buffers())

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """{trainable parameter name: shape}, sorted by name (frozen parameters are constants)."""
        module, _ = self._skeleton
        return {k: tuple(p.shape) for k, p in sorted(module.named_parameters()) if p.requires_grad}

    @property
    def num_params(self) -> int:
        return sum(math.prod(s) for s in self.layer_shapes().values())

    @property
    def num_classes(self) -> int | None:
        return self.classes if self.task == "classification" else None

    def init(self, seed: int) -> dict[str, np.ndarray]:
        """float32 trainable parameters of the module the factory builds under torch seed `seed`,
        sorted by name."""
        module = self.build(seed)
        return {k: p.detach().to(dtype=import_torch().float32).numpy().copy()
                for k, p in sorted(module.named_parameters()) if p.requires_grad}

    # -- the protocol ----------------------------------------------------------------------------
    def _module_on(self, torch, xp):
        """(module, buffers) for arrays of `xp`: the skeleton (NumPy), or its copy on the current CUDA
        device (CuPy; made once per device)."""
        if xp is np:
            return self._skeleton
        device = int(xp.cuda.Device().id)
        cache = self.__dict__.setdefault("_on_gpu", {})
        if device not in cache:
            module, buffers = self._skeleton
            import copy

            gpu = copy.deepcopy(module).to(torch.device("cuda", device))
            cache[device] = (gpu, dict(gpu.named_buffers()))
        return cache[device]

    def _call(self, torch, tensors: dict, x, xp=np):
        """The module's output for the input tensor `x` with the parameters `tensors`."""
        module, buffers = self._module_on(torch, xp)
        dtype = next(iter(tensors.values())).dtype
        bufs = {k: b.to(dtype) if b.is_floating_point() else b for k, b in buffers.items()}
        return torch.func.functional_call(module, (tensors, bufs), (x,), tie_weights=True, strict=False)

    def _loss(self, torch, out, y, reduction: str = "mean"):
        """The per-batch loss of outputs `out` against `y` (module docstring)."""
        F = torch.nn.functional
        if self.task == "classification":
            if out.ndim != 2:
                raise ValueError(f"model 'torch': a classifier's output must be (batch, classes), "
                                 f"got {tuple(out.shape)}")
            return F.cross_entropy(out, y, reduction=reduction)
        if out.ndim == 2 and out.shape[1] == 1:
            out = out[:, 0]
        if tuple(out.shape) != tuple(y.shape):
            raise ValueError(f"model 'torch': a regression output must be (batch,) or (batch, 1), "
                             f"got {tuple(out.shape)}")
        return F.mse_loss(out, y, reduction=reduction)

    def _check_labels(self, xp, y, out) -> None:
        if self.task == "classification":
            check_labels(xp, self, y, int(out.shape[-1]))

    def loss_and_grad(self, params: Mapping, x, y):
        """(loss (N,) float64, {name: (N, *shape)} gradients) of the N workers' batches x (N, B,
        *feature_shape), y (N, B) at `params`: one forward and backward pass per worker."""
        xp, dtype, x, y = prepare_batch(self, params, x, y)
        torch = import_torch()
        watch = ForwardWatch(torch, self._module_on(torch, xp)[1], f"factory {self.factory!r}")
        if self.task == "classification":
            y = y.astype(xp.int64, copy=False)
        shapes = self.layer_shapes()
        names = list(shapes)
        n = x.shape[0]
        grads = {k: xp.empty((n, *s), dtype) for k, s in shapes.items()}
        loss = np.empty(n, np.float64)
        module, _ = self._module_on(torch, xp)
        module.train()
        with _on_device(torch, xp):
            tensors = {k: _tensor(torch, xp.ascontiguousarray(params[k])).requires_grad_(True) for k in names}
            leaves = [tensors[k] for k in names]
            for i in range(n):
                watch.start()
                out = self._call(torch, tensors, _tensor(torch, _input(xp, x[i], dtype)), xp)
                if i == 0:
                    self._check_labels(xp, y, out)
                li = self._loss(torch, out, _tensor(torch, xp.ascontiguousarray(y[i])))
                gs = torch.autograd.grad(li, leaves, allow_unused=True)
                watch.check()
                loss[i] = float(li.detach())
                for k, g in zip(names, gs):
                    if g is None:                      # a parameter the forward pass does not use
                        grads[k][i] = 0
                    else:
                        _tensor(torch, grads[k][i]).copy_(g)
        return (loss if xp is np else xp.asarray(loss)), grads

    def predict(self, params: Mapping, x):
        """The module's outputs (logits or predictions) for M samples x (M, *feature_shape)."""
        check_params(self, params)
        torch = import_torch()
        xp = _xp_of(params)
        module, _ = self._module_on(torch, xp)
        module.eval()
        dtype = next(iter(params.values())).dtype
        with _on_device(torch, xp), torch.no_grad():
            tensors = {k: _tensor(torch, xp.ascontiguousarray(params[k])) for k in self.layer_shapes()}
            out = self._call(torch, tensors, _tensor(torch, _input(xp, xp.asarray(x), dtype)), xp)
        return out.numpy() if xp is np else xp.from_dlpack(out.detach())

    def evaluate(self, params: Mapping, x, y, batch_size: int = 4096) -> tuple[float, float]:
        """(mean loss, accuracy) of the module in eval mode on M samples x (M, *feature_shape), y (M,),
        in chunks of `batch_size`; the loss summed per sample in float64; accuracy nan for regression."""
        if int(batch_size) < 1:
            raise ValueError(f"model 'torch': batch_size must be >= 1, got {batch_size!r}")
        check_params(self, params)
        xp = _xp_of(params)
        x, y = xp.asarray(x), xp.asarray(y)
        m = x.shape[0]
        if m == 0:
            raise ValueError("model 'torch': evaluate needs at least one sample")
        if tuple(y.shape) != (m,):
            raise ValueError(f"model 'torch': y must have shape ({m},), got {tuple(y.shape)}")
        if tuple(x.shape[1:]) != self.feature_shape:
            raise ValueError(f"model 'torch': x must have shape (M, {', '.join(map(str, self.feature_shape))}), "
                             f"got {tuple(x.shape)}")
        torch = import_torch()
        module, _ = self._module_on(torch, xp)
        dtype = next(iter(params.values())).dtype
        total, correct = 0.0, 0
        module.eval()
        with _on_device(torch, xp), torch.no_grad():
            tensors = {k: _tensor(torch, xp.ascontiguousarray(params[k])) for k in self.layer_shapes()}
            for s in range(0, m, int(batch_size)):
                xb = _input(xp, x[s:s + int(batch_size)], dtype)
                yb = y[s:s + int(batch_size)]
                yb = xp.ascontiguousarray(yb.astype(dtype) if self.task == "regression" else yb.astype(xp.int64))
                out = self._call(torch, tensors, _tensor(torch, xb), xp)
                self._check_labels(xp, yb, out)
                yt = _tensor(torch, yb)
                per = self._loss(torch, out, yt, reduction="none")
                total += float(per.double().sum())
                if self.task == "classification":
                    correct += int((out.argmax(dim=-1) == yt).sum())
        acc = float("nan") if self.task == "regression" else correct / m
        return total / m, acc


def _input(xp, x, dtype):
    """The module's input array: integer data (token ids) as int64, anything else in `dtype`; C order."""
    return xp.ascontiguousarray(x, dtype=xp.int64 if x.dtype.kind in "iu" else dtype)


class ForwardStateError(ValueError):
    """A module's forward (or backward) pass drew random numbers or changed a buffer in place."""


class ForwardWatch:
    """Sees what a forward and backward pass changed outside the parameters: torch's CPU random
    state (and each CUDA device's that torch has initialised) and the buffers' in-place version
    counters (`Tensor._version`). `start()` before the pass, `check()` after it raises
    ForwardStateError naming what changed (module docstring: what a module may hold)."""

    def __init__(self, torch, buffers: dict, where: str):
        self.torch, self.buffers, self.where = torch, dict(buffers), where
        self._rng = self._versions = None

    def _random_state(self):
        torch = self.torch
        states = [torch.random.get_rng_state()]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states += list(torch.cuda.get_rng_state_all())
        return states

    def start(self) -> None:
        self._rng = self._random_state()
        self._versions = {k: b._version for k, b in self.buffers.items()}

    def check(self) -> None:
        changed = [k for k, b in self.buffers.items() if b._version != self._versions.get(k)]
        if changed:
            raise ForwardStateError(
                f"model 'torch': {self.where}: the forward pass changed buffer {changed[0]!r} in place: state "
                "outside the parameters, which tgsim neither exchanges nor checkpoints (BatchNorm: "
                "track_running_stats=False, or GroupNorm/LayerNorm; else keep it a constant or make it a parameter)")
        now = self._random_state()
        if len(now) != len(self._rng) or any(not self.torch.equal(a, b) for a, b in zip(now, self._rng)):
            raise ForwardStateError(
                f"model 'torch': {self.where}: the forward pass draws random numbers (dropout, torch.rand*, "
                "randn_like, ...): its draws are not keyed by (seed, step, worker), so the simulator, MPI ranks "
                "and the DDP hook would not repeat each other's bits; remove the randomness from forward")


def _xp_of(params: Mapping):
    """The array module of the parameters (NumPy or CuPy)."""
    from tgsim.backend import array_module

    return array_module(next(iter(params.values())))


def _check_stateless(torch, module, factory: str) -> None:
    """ValueError for a module with state outside its parameters: BatchNorm tracking running
    statistics, Dropout with p > 0."""
    nn = torch.nn
    for name, sub in module.named_modules():
        where = f"model 'torch': factory {factory!r}: module {name or type(module).__name__!r}"
        if isinstance(sub, nn.modules.batchnorm._BatchNorm) and sub.track_running_stats:
            raise ValueError(f"{where} is a BatchNorm with running statistics, state the trainer does not "
                             "exchange or checkpoint: use GroupNorm/LayerNorm, or track_running_stats=False")
        if isinstance(sub, nn.modules.dropout._DropoutNd) and sub.p > 0:
            raise ValueError(f"{where} is a Dropout with p = {sub.p}: its random draws are not keyed by "
                             "(seed, step, worker), so runs would not repeat bit for bit")


__all__ = ["INSTALL_HINT", "THREADS", "TorchModel", "determinism", "gpu_determinism", "import_torch",
           "resolve_factory", "torch_threads_kept", "ForwardStateError", "ForwardWatch"]
