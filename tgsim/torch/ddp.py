"""A DDP communication hook that sends the gradients through a tgsim codec and tgsim's MPI exchange,
so DistributedDataParallel trains with the bits of tgsim's simulator.

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from tgsim.torch import ddp as tgddp

    torch.set_num_threads(1)                               # the simulator's per-worker bits (tgsim.torch.model)
    dist.init_process_group("gloo", init_method="file:///tmp/store", rank=rank, world_size=n)
    state = tgddp.TgsimHookState.create(module, config)    # collective: every rank, the same config
    model = DDP(module)
    tgddp.register(model, state)                           # model.register_comm_hook(state, tgsim_hook)
    opt = tgddp.TgsimOptimizer(state)                      # tgsim's sgd / momentum / adam arithmetic
    for step in range(steps):
        x, y = ...                                         # worker `rank`'s batch at `step`
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()   # the hook runs here
        opt.step()

launched as `mpiexec -n N python script.py` (mpi4py's COMM_WORLD carries tgsim's exchange; the
process group only runs DDP's own start-up broadcast). With `transport="torch"`:

    dist.init_process_group("gloo")                      # torchrun's env:// (or "nccl" on GPUs)
    state = tgddp.TgsimHookState.create(module, config, transport="torch")

tgsim's exchange runs over torch.distributed's default process group, the one DDP uses
(`torch_exchange()`: MPIExchange over `tgsim.torch.dist_comm.TorchDistComm`), so any launcher
that starts the process group works (`torchrun --nproc-per-node N script.py`), without mpiexec or
mpi4py. The messages, their order and the aggregation are MPIExchange's over either transport, so
the parameters are the same bits; Gloo's all_gather takes equal sizes only, so variable-size
gathers pad to the largest block or go point to point (tgsim/torch/dist_comm.py). On GPUs (NCCL),
host buffers go over a Gloo group the comm makes, device (CuPy) buffers over NCCL.

`config` is a tgsim config (a dict of its TOML sections, or a `tgsim.train.config.Config`); the
hook reads [run] seed and on_nonfinite, [workers] n (= the number of ranks), [codec] and
[exchange]; TgsimOptimizer reads [optimizer], [schedule] and [run] steps.

The step
--------
DDP calls `tgsim_hook(state, bucket)` once per gradient bucket, in bucket order, and the hook
returns a torch Future that DDP waits for at the end of the backward pass. The hook takes the
bucket's gradients (float32 views of its buffer) under their parameter names, found by the
parameters' storage addresses (`data_ptr`): DDP rebuilds its buckets after the first step (other
members, another order), so nothing is keyed by the bucket's index. The layers are numbered by
their names' order (TorchModel's): layer l has index i_l in the step's full order whatever bucket
it is in. It writes the aggregated mean into the bucket's buffer and fills the future with that
buffer; DDP copies it into the parameters' `.grad` (with `gradient_as_bucket_view=True` the buffer
is the `.grad`). The hook runs no optimizer. Two forms, with the same bits:

* per bucket (`state.per_bucket`; tgsim/torch/ddp_bucket.py): where every layer's message is a
  function of that layer alone (the codec does not declare `properties.whole_step`), each bucket is
  checked, encoded and exchanged when DDP hands it over, on a worker thread of this rank, so the link
  works while the backward pass goes on; the codec draws layer l from StreamKey(seed, step, rank,
  i_l) (tgsim.codecs.base.IndexedLayers). At the last bucket the hook waits for the step's buckets
  and commits the step (counter, bytes, codec state).
* whole step (`state.whole_step`: the reason): TernGrad's scope = "model" (one scaler for all
  layers), a codec of several rounds (PowerSGD), a re-encoded downlink. The hook keeps the buckets'
  views and at the last bucket runs ONE tgsim step over all layers: `tgsim.train.loop.train_step`,
  the trainer's own step, the gradients entering as the model's output and the mean leaving through
  the optimizer's place (tgsim.torch.ddp_bucket.hook_setup).

Either way this rank is worker `rank` of N at step `state.step` with the run seed, so the
counter-based random keys (seed, step, worker, layer), the shared scalers, the error-feedback
residuals (`state.codec_state`), the NaN checks and the exchange's aggregation are exactly those of
an MPI rank of `tgsim.mpi_runs.train`.

On GPUs
-------
A module on a CUDA device (one per rank, `torch.cuda.set_device(local_rank)`) with [run] backend =
"cupy": the hook and TgsimOptimizer see the gradients and parameters as CuPy arrays sharing the
tensors' memory (DLPack), the codec runs its CUDA kernels, the exchange moves CuPy buffers (MPI:
CUDA-aware or staged through the host; `transport="torch"`: NCCL), and CuPy's stream is
synchronized before DDP or torch reads what the hook or the optimizer wrote.

What is bitwise
---------------
With `torch.set_num_threads(1)`, the module the simulator's TorchModel builds from the same factory
and seed, worker `rank`'s batch of the simulator at each step (`tgsim.data.batch_indices`), and the
loss TorchModel uses (cross-entropy, mean over the batch), `.grad` after the backward pass is the
simulator's aggregated gradient bit for bit, and TgsimOptimizer leaves the simulator's parameters.
torch.optim optimizers work too, on the same `.grad`, but their float formulas are not tgsim's
(tgsim/train/optim.py), so their parameters differ from the simulator's in the last bits.

Checks
------
`create` is a collective: every rank gathers every rank's parameter list (names, shapes, dtypes)
and the config's digest; where they differ, every rank raises the same RankConfigMismatchError
naming the first difference (before DDP is built, nothing sent). A non-finite gradient raises
tgsim's NonFiniteGradientError naming the layer, worker and step (run.on_nonfinite = "raise"; on
the other ranks a ValueError pointing to it), or skips the step (on_nonfinite = "skip": the buckets
get zeros, `state.skipped` is set, the codec state stays as it was and TgsimOptimizer leaves
parameters and optimizer state as they are, as the simulator does; per bucket, the bytes of the
buckets exchanged before the bad one still count in `state.sent`, where the simulator counts none).
`register` refuses a hook whose second argument is not named `bucket` (DDP itself then says only
`KeyError: 'bucket'`).
"""

from __future__ import annotations

import hashlib
import inspect
import warnings
from dataclasses import dataclass, field

import numpy as np

from tgsim.backend import get_xp, to_numpy
from tgsim.codecs import error_feedback, registry
from tgsim.errors import ConfigError, RankConfigMismatchError
from tgsim.torch.ddp_bucket import Buckets, hook_setup, thread_allowed, whole_step_reason
from tgsim.torch.model import THREADS, ForwardWatch, _check_stateless, import_torch, torch_threads_kept
from tgsim.train.config import Config, config_hash, from_dict
from tgsim.train.loop import Setup, start_codec_state, train_step
from tgsim.train.optim import make_optimizer
from tgsim.train.schedules import learning_rate


# -- the parameters and the ranks ------------------------------------------------------------------------

def _module_of(module):
    """The wrapped module of a DistributedDataParallel, else `module` itself."""
    torch = import_torch()
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        return module.module
    return module


def named_parameters(module) -> dict:
    """{name: parameter} of the module's trainable parameters (tied ones once, under their first
    name), sorted by name: TorchModel's layer order. ConfigError for a parameter that is not a
    float32 tensor, or parameters on more than one device (the CPU, or one CUDA device)."""
    module = _module_of(module)
    params = {k: p for k, p in sorted(module.named_parameters()) if p.requires_grad}
    if not params:
        raise ConfigError("tgsim DDP hook: the module has no trainable parameters")
    first = next(iter(params.values())).device
    for k, p in params.items():
        if str(p.dtype) != "torch.float32" or p.device.type not in ("cpu", "cuda") or p.device != first:
            raise ConfigError(f"tgsim DDP hook: parameter {k!r} is {p.dtype} on {p.device}; the hook takes "
                              "float32 parameters, all on the CPU or all on one CUDA device "
                              f"(the first is on {first})")
    return params


def _array(tensor):
    """The tensor's data as an array sharing its memory: a NumPy view of a CPU tensor, a CuPy array of a
    CUDA tensor (DLPack; the protocol makes CuPy's stream wait for torch's)."""
    t = tensor.detach()
    if not t.is_cuda:
        return t.numpy()
    import cupy

    return cupy.from_dlpack(t)


def _host_copy(v):
    """A NumPy copy of an array (NumPy or CuPy), a dict of arrays, or anything else unchanged."""
    if isinstance(v, dict):
        return {n: _host_copy(a) for n, a in v.items()}
    if isinstance(v, np.ndarray):
        return np.array(v, copy=True)
    return to_numpy(v) if hasattr(v, "__cuda_array_interface__") else v


def _on(xp, v):
    """`v` (an array, a dict of arrays, anything else) with its arrays on `xp`'s device, as copies."""
    if isinstance(v, dict):
        return {n: _on(xp, a) for n, a in v.items()}
    if isinstance(v, np.ndarray) or hasattr(v, "__cuda_array_interface__"):
        return xp.array(v, copy=True)
    return v


def _synchronize(xp) -> None:
    """CuPy's current stream synchronized (its writes seen by torch's stream); nothing on NumPy."""
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


def parameter_mismatch(everyone: list[list]) -> str | None:
    """The message for every rank's parameter list [(name, shape, dtype), ...] (rank order) when they
    differ, naming each differing rank's first difference from rank 0; None when all agree."""
    ref = everyone[0]
    problems = []
    for r, mine in enumerate(everyone[1:], start=1):
        if mine == ref:
            continue
        ref_d, mine_d = {e[0]: e[1:] for e in ref}, {e[0]: e[1:] for e in mine}
        only0, only_r = sorted(set(ref_d) - set(mine_d)), sorted(set(mine_d) - set(ref_d))
        if only0 or only_r:
            what = (f"rank 0 has {only0[:3]} that rank {r} lacks" if only0 else "") + \
                   ("; " if only0 and only_r else "") + \
                   (f"rank {r} has {only_r[:3]} that rank 0 lacks" if only_r else "")
        else:
            k = next(k for k in ref_d if ref_d[k] != mine_d[k])
            what = (f"parameter {k!r} is {tuple(mine_d[k][0])} {mine_d[k][1]} on rank {r}, "
                    f"{tuple(ref_d[k][0])} {ref_d[k][1]} on rank 0")
        problems.append(what)
    if not problems:
        return None
    return ("tgsim DDP hook: the ranks' modules have different parameters (" + " | ".join(problems) +
            "). Build the same module (factory, arguments) on every rank.")


def _config(config) -> Config:
    if isinstance(config, Config):
        return config
    if isinstance(config, dict):
        return from_dict(config)
    raise ConfigError(f"tgsim DDP hook: config must be a dict of tgsim config sections or a Config, "
                      f"got {type(config).__name__}")


TRANSPORTS = ("mpi", "torch")


def one_piece_chunk(elements: int) -> int:
    """The `chunk` of the hook's exchange for a model of `elements` parameters: the exchange's
    default (tgsim.exchange.mpi.CHUNK elements per piece) when the message has more than one piece,
    else -1, the whole-message path: with one piece there is nothing to overlap, and that path
    encodes and decodes every layer in one kernel call. The bits are the same either way."""
    from tgsim.exchange.mpi import CHUNK

    return CHUNK if elements > CHUNK else -1


def torch_exchange(**kwargs):
    """tgsim's MPI exchange (MPIExchange, keyword arguments passed on) over torch.distributed's
    default process group: `MPIExchange(comm=TorchDistComm(), **kwargs)`. A collective (every rank
    calls it, after init_process_group); mpi4py is not needed."""
    from tgsim.exchange.mpi import MPIExchange
    from tgsim.torch.dist_comm import TorchDistComm

    return MPIExchange(comm=TorchDistComm(), **kwargs)


@dataclass
class TgsimHookState:
    """The hook's state (module docstring). cfg: the tgsim config; exchange: tgsim's exchange of one
    worker per rank (MPIExchange over mpi4py's COMM_WORLD or torch.distributed); params: {name:
    parameter} in name order; names: {data_ptr: name}; codec: the registered codec (wrapped in
    ErrorFeedback where the config asks); codec_state: a stateful codec's state of this rank ({key:
    (1, ...)}, error feedback's residuals), else None; step: the step the next exchange runs;
    skipped: whether the last step was skipped (non-finite gradient, on_nonfinite = "skip"); sent /
    received: this rank's bytes over all steps; index: {name: the layer's index in name order};
    whole_step: why the hook runs one step over all layers at the last bucket, or None where it
    exchanges per bucket (`buckets`: tgsim.torch.ddp_bucket.Buckets)."""

    cfg: Config
    exchange: object
    params: dict
    names: dict
    codec: object
    codec_state: dict | None = None
    step: int = 0
    skipped: bool = False
    sent: float = 0.0
    received: float = 0.0
    setup: Setup | None = field(default=None, repr=False)
    watch: ForwardWatch | None = field(default=None, repr=False)
    mean: dict = field(default_factory=dict, repr=False)
    _grads: dict = field(default_factory=dict, repr=False)
    _pending: list = field(default_factory=list, repr=False)
    _futures: list = field(default_factory=list, repr=False)
    _box: dict = field(default_factory=dict, repr=False)
    index: dict = field(default_factory=dict, repr=False)
    whole_step: str | None = None
    buckets: Buckets | None = field(default=None, repr=False)

    @property
    def per_bucket(self) -> bool:
        return self.buckets is not None

    @property
    def seed(self) -> int:
        return self.cfg.run.seed

    @property
    def rank(self) -> int:
        return int(self.exchange.local_workers[0])

    @property
    def world(self) -> int:
        return int(self.exchange.n_workers)

    @classmethod
    def create(cls, module, config, exchange=None, transport: str = "mpi", thread: bool = True) -> "TgsimHookState":
        """The state of the hook for `module` (an nn.Module or the DDP wrapping it) under the tgsim
        `config`, over `exchange` (default, by `transport`: "mpi", tgsim.exchange.mpi.MPIExchange on
        mpi4py's COMM_WORLD; "torch", `torch_exchange()` over torch.distributed's default process
        group; one exchange of a single worker, e.g. InProcessExchange(1), runs the hook in one
        process). A collective: every
        rank calls it; it checks, through the exchange's `comm.allgather`, that every rank has the
        same parameters and config (the same RankConfigMismatchError on every rank otherwise).
        ConfigError for a config the hook cannot run: [workers] n other than the number of ranks,
        local steps, a [run] backend that is not the parameters' device ("numpy" for CPU parameters,
        "cupy" for CUDA ones: CuPy's current device is then set to theirs). thread: run the per-bucket
        exchanges on a worker thread where the transport allows it (tgsim.torch.ddp_bucket), else inline
        in the hook (the same bits)."""
        torch = import_torch()
        threads = torch.get_num_threads()                # the user's, before Numba's layer could reset it
        with torch_threads_kept(torch):
            state = cls._create(module, config, exchange, transport, thread)
        if threads != THREADS and state.setup.xp is np:
            warnings.warn(f"tgsim DDP hook: torch runs at {threads} intra-op threads; the simulator's TorchModel "
                          "computes each worker's gradient at 1, and torch's CPU kernels reduce in another order "
                          "at other counts, so the parameters will not be the simulator's bits: call "
                          "torch.set_num_threads(1) before training", RuntimeWarning, stacklevel=2)
        return state

    @classmethod
    def _create(cls, module, config, exchange, transport, thread):
        torch = import_torch()
        cfg = _config(config)
        params = named_parameters(module)
        if transport not in TRANSPORTS:
            raise ConfigError(f"tgsim DDP hook: transport must be one of {TRANSPORTS}, got {transport!r}")
        if exchange is None:
            from tgsim.exchange.mpi import MPIExchange

            chunk = one_piece_chunk(sum(int(p.numel()) for p in params.values()))
            exchange = torch_exchange(chunk=chunk) if transport == "torch" else MPIExchange(chunk=chunk)
        if len(exchange.local_workers) != 1:
            raise ConfigError("tgsim DDP hook: the exchange must hold one worker per process (MPIExchange)")
        if cfg.workers.n != exchange.n_workers:
            raise ConfigError(f"tgsim DDP hook: [workers] n = {cfg.workers.n}, but {exchange.n_workers} ranks run")
        if cfg.exchange.local != "none":
            raise ConfigError(f"tgsim DDP hook: [exchange] local = {cfg.exchange.local!r}: the hook exchanges "
                              "gradients every step (local steps need tgsim's trainer)")
        device = next(iter(params.values())).device
        want = "numpy" if device.type == "cpu" else "cupy"
        if cfg.run.backend != want:
            raise ConfigError(f"tgsim DDP hook: the parameters are on {device}, so [run] backend must be {want!r}, "
                              f"got {cfg.run.backend!r}")
        if device.type == "cuda":
            get_xp("cupy").cuda.Device(device.index or 0).use()
        mine = {"params": [[k, list(p.shape), str(p.dtype)] for k, p in params.items()], "config": config_hash(cfg)}
        everyone = exchange.comm.allgather(mine) if exchange.n_workers > 1 else [mine]
        problem = parameter_mismatch([e["params"] for e in everyone])
        if problem is None and len({e["config"] for e in everyone}) > 1:
            odd = [r for r, e in enumerate(everyone) if e["config"] != everyone[0]["config"]]
            problem = (f"tgsim DDP hook: the config differs from rank 0's on rank(s) {odd} (config sha256). "
                       "Give every rank the same config.")
        if problem is not None:
            raise RankConfigMismatchError(problem)
        inner = _module_of(module)
        try:
            _check_stateless(torch, inner, type(inner).__name__)
        except ValueError as e:
            raise ConfigError(str(e).replace("model 'torch': factory", "tgsim DDP hook: module", 1)) from None
        codec = registry.make_codec(cfg.codec)
        if cfg.codec.error_feedback:
            codec = error_feedback.ErrorFeedback(codec)
        box: dict = {}
        setup = hook_setup(cfg, {k: tuple(p.shape) for k, p in params.items()}, codec, exchange, box)
        state = cls(cfg, exchange, params, {p.data_ptr(): k for k, p in params.items()}, codec, setup=setup,
                    _box=box)
        state.codec_state = start_codec_state(setup, {})
        state.index = {k: i for i, k in enumerate(params)}
        state.whole_step = whole_step_reason(cfg, codec, list(params))
        if state.whole_step is None:
            state.buckets = Buckets(state, thread and thread_allowed(exchange, setup.xp))
        state.watch = ForwardWatch(torch, dict(inner.named_buffers()), f"module {type(inner).__name__}")
        inner.register_forward_pre_hook(lambda mod, args: state.watch.start())
        inner.register_forward_hook(lambda mod, args, out: state.watch.check())
        if device.type == "cpu":             # Numba's pool starts once per process; its OpenMP layer's reset of
            import numba                     # torch's thread count happens here, undone by create()

            numba.get_num_threads()
        return state

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """What a resumed run needs of this rank's hook: {"step", "sent", "received", "codec_state":
        {key: array (1, ...)} or None (error feedback's residuals, PowerSGD's warm start), "config":
        the config's sha256, "rank"}; arrays are copies. Save it beside the module's parameters and
        TgsimOptimizer.state_dict() (torch.save or numpy), one file per rank."""
        codec_state = None if self.codec_state is None else {k: _host_copy(v) for k, v in self.codec_state.items()}
        return {"step": int(self.step), "sent": float(self.sent), "received": float(self.received),
                "codec_state": codec_state, "config": config_hash(self.cfg), "rank": self.rank}

    def load_state_dict(self, saved: dict) -> None:
        """Continue from `saved` (state_dict() of the same rank, config and module): the next exchange
        runs step saved["step"] with the saved codec state, so the resumed run has the uninterrupted
        run's bits. ValueError, changing nothing, when it comes from another config, another rank or
        holds another codec state (keys, shapes, dtypes)."""
        for key in ("step", "codec_state", "config", "rank"):
            if key not in saved:
                raise ValueError(f"tgsim DDP hook: load_state_dict: the saved state has no {key!r}")
        if saved["config"] != config_hash(self.cfg):
            raise ValueError("tgsim DDP hook: load_state_dict: the state was saved under another config "
                             "(config sha256 differs)")
        if int(saved["rank"]) != self.rank:
            raise ValueError(f"tgsim DDP hook: load_state_dict: the state is rank {saved['rank']}'s; this is rank "
                             f"{self.rank}")
        mine, theirs = self.codec_state, saved["codec_state"]
        if (mine is None) != (theirs is None) or (mine is not None and (
                set(mine) != set(theirs) or any(np.shape(theirs[k]) != np.shape(mine[k]) or
                                                np.asarray(theirs[k]).dtype != mine[k].dtype for k in mine))):
            raise ValueError("tgsim DDP hook: load_state_dict: the saved codec state does not match this codec's "
                             "(keys, shapes or dtypes)")
        if int(saved["step"]) < 0:
            raise ValueError(f"tgsim DDP hook: load_state_dict: step {saved['step']} < 0")
        if mine is not None:
            self.codec_state = {k: _on(self.setup.xp, np.asarray(theirs[k], dtype=mine[k].dtype)) for k in mine}
        self.step = int(saved["step"])
        self.sent, self.received = float(saved.get("sent", 0.0)), float(saved.get("received", 0.0))

    # -- the hook's work ---------------------------------------------------------------------------
    def name_of(self, param) -> str:
        try:
            return self.names[param.data_ptr()]
        except KeyError:
            raise ValueError(f"tgsim DDP hook: a bucket holds a parameter of shape {tuple(param.shape)} that is "
                             "not one of the module's the state was created for (create the state from the "
                             "module DDP wraps; parameters must be updated in place)") from None

    def bucket_grads(self, bucket) -> dict:
        """{parameter name: the bucket's gradient view} of the bucket's parameters."""
        return {self.name_of(p): g for p, g in zip(bucket.parameters(), bucket.gradients())}

    def collect(self, bucket) -> None:
        """Keep the bucket's gradients under their parameter names, and its buffer for the result."""
        self._grads.update(self.bucket_grads(bucket))
        self._pending.append(bucket.buffer())

    def finish(self) -> list:
        """Run the step over all collected layers (module docstring), write the mean into the
        collected gradient views; the buffers to fill the futures with, in the order collected."""
        grads, buffers = self._grads, self._pending
        self._grads, self._pending = {}, []
        missing = [k for k in self.params if k not in grads]
        if missing:
            raise ValueError(f"tgsim DDP hook: step {self.step}: no gradient reached the hook for {missing[:5]}")
        model = self.setup.model
        arrays = {k: _array(grads[k]) for k in self.params}          # views of the buckets' buffers
        model.grads = {k: a.reshape((1,) + model.shapes[k]) for k, a in arrays.items()}
        self._box.clear()
        try:
            _, _, info = train_step(self.setup, {}, {}, self.step, False, codec_state=self.codec_state)
        finally:
            model.grads = None
            self.step += 1
        self.skipped = bool(info.skipped)
        self.sent += info.sent
        self.received += info.received
        self.mean = arrays
        mean = self._box.get("mean")
        for k, out in arrays.items():
            if mean is None:
                out[...] = 0
            else:
                out[...] = self.setup.xp.asarray(mean[k]).reshape(out.shape)
        _synchronize(self.setup.xp)
        return buffers


def tgsim_hook(state: TgsimHookState, bucket):
    """DDP comm hook: a Future per bucket, filled with the bucket's aggregated mean; per bucket, by the
    bucket's own exchange (on a worker thread where allowed), the last bucket waiting for the step's;
    whole step, all at the last bucket by one tgsim step over all layers (module docstring). The
    argument must be named `bucket`."""
    torch = import_torch()
    fut = torch.futures.Future()
    if state.buckets is not None:
        with torch_threads_kept(torch):
            buf, params, grads = bucket.buffer(), bucket.parameters(), bucket.gradients()
            key = (buf.data_ptr(), buf.numel(), tuple(p.data_ptr() for p in params),
                   tuple(g.data_ptr() for g in grads)) if state.setup.xp is np else None
            layers, form = state.buckets.plan(bucket.index(), key, lambda: (
                {k: _array(g) for k, g in state.bucket_grads(bucket).items()}, _array(buf)))
            state.buckets.submit(layers, form, buf, fut, state.setup.xp, bucket.is_last())
            if bucket.is_last():
                state.buckets.finish()
        return fut
    state._futures.append(fut)
    state.collect(bucket)
    if bucket.is_last():
        futures, state._futures = state._futures, []
        try:
            with torch_threads_kept(torch):
                buffers = state.finish()
        except BaseException as e:
            for f in futures[:-1]:
                f.set_exception(e)
            raise
        for f, buf in zip(futures, buffers):
            f.set_result(buf)
    return fut


def register(ddp_module, state: TgsimHookState, hook=tgsim_hook) -> None:
    """`ddp_module.register_comm_hook(state, hook)`, after checking that the hook's second argument is
    named `bucket` (DDP passes it by that name; it reports a misnamed one only as KeyError: 'bucket')."""
    try:
        names = list(inspect.signature(hook).parameters)
    except (TypeError, ValueError):
        names = None
    if names is not None and (len(names) != 2 or names[1] != "bucket"):
        name = getattr(hook, "__name__", hook)
        raise ValueError(f"a DDP comm hook takes (state, bucket), its second argument named 'bucket' "
                         f"(DDP passes it by that name); {name!r} takes ({', '.join(names)})")
    ddp_module.register_comm_hook(state, hook)


# -- the optimizer ----------------------------------------------------------------------------------------

class TgsimOptimizer:
    """tgsim's optimizer ([optimizer] of the state's config: sgd, momentum, nesterov, adam;
    tgsim/train/optim.py) applied to the module's parameters in place, on NumPy views of them, with
    the learning rate of [schedule] at the step the hook just exchanged. Its float32 arithmetic is the
    simulator's, so with the hook the parameters stay the simulator's bit for bit. torch.optim
    optimizers also work on the hook's gradients but are not bitwise equal to tgsim's simulator
    (different float formulas)."""

    def __init__(self, state: TgsimHookState):
        self.state = state
        self.optimizer = make_optimizer(state.cfg.optimizer)
        self.opt_state = self.optimizer.init(self._arrays())
        self.applied = state.step           # the next step whose gradient it may apply

    def _arrays(self) -> dict:
        return {k: _array(p) for k, p in self.state.params.items()}

    def state_dict(self) -> dict:
        """{"applied": the next step it may apply, "opt_state": the optimizer's state (NumPy copies)}."""
        return {"applied": int(self.applied), "opt_state": {k: _host_copy(v) for k, v in self.opt_state.items()}}

    def load_state_dict(self, saved: dict) -> None:
        """Continue from `saved` (state_dict() after the same step as the hook state loaded)."""
        if int(saved["applied"]) != self.state.step:
            raise ValueError(f"TgsimOptimizer.load_state_dict: saved after step {int(saved['applied']) - 1}, but the "
                             f"hook's next step is {self.state.step}: load the hook's state from the same checkpoint")
        self.opt_state = {k: _on(self.state.setup.xp, v) for k, v in saved["opt_state"].items()}
        self.applied = int(saved["applied"])

    def zero_grad(self) -> None:
        """Every parameter's .grad to None (DDP writes the next step's mean)."""
        for p in self.state.params.values():
            p.grad = None

    def step(self) -> None:
        """w <- update(w, .grad) for the step the hook last exchanged (nothing where it was skipped);
        ValueError when the hook has run no step since the last call."""
        st = self.state
        if st.step != self.applied + 1:
            unused = [k for k, p in st.params.items() if p.grad is None]
            if st.step == self.applied and unused and len(unused) < len(st.params):
                raise ValueError(f"TgsimOptimizer.step: parameter {unused[0]!r} got no gradient, so DDP never handed "
                                 "its bucket to the hook: build DDP(..., find_unused_parameters=True) for a module "
                                 "with parameters the forward pass does not use (the simulator gives them a zero "
                                 "gradient)")
            raise ValueError(f"TgsimOptimizer.step: the hook has exchanged steps {self.applied}..{st.step - 1} since "
                             "the last update; call step() once after each backward pass that ran the hook")
        step, self.applied = self.applied, st.step
        if st.skipped:
            return
        params = self._arrays()
        grads = {}
        for k, p in st.params.items():
            if p.grad is not None:
                grads[k] = _array(p.grad)
            elif k in st.mean:           # unused in forward: DDP leaves .grad None, the hook's mean holds it
                grads[k] = st.mean[k]
            else:
                raise ValueError(f"TgsimOptimizer.step: parameter {k!r} has no gradient")
        lr = learning_rate(st.cfg.schedule, step, st.cfg.run.steps)
        new, self.opt_state = self.optimizer.update(grads, self.opt_state, params, lr)
        xp = st.setup.xp
        for k, a in params.items():
            xp.copyto(a, new[k])
        _synchronize(xp)


def digest(module) -> str:
    """sha256 of the module's parameters' bytes in name order (what ranks compare after training)."""
    h = hashlib.sha256()
    for p in named_parameters(module).values():
        h.update(np.ascontiguousarray(p.detach().cpu().numpy()).tobytes())
    return h.hexdigest()


__all__ = ["TRANSPORTS", "TgsimHookState", "TgsimOptimizer", "digest", "named_parameters", "register", "tgsim_hook",
           "torch_exchange"]
