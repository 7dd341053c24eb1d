"""The DDP hook's two forms of a step (tgsim.torch.ddp): per bucket (`Buckets`), each bucket's layers
checked, encoded and exchanged when DDP hands the bucket over, on a worker thread, while the backward
pass goes on; and the whole step (`hook_setup`: the trainer's `train_step` over all layers at the last
bucket), for what `whole_step_reason` names.

For one step `t` of rank r (worker r of N), a bucket B (a subset of the layers, in any order):

    g      = {l: the bucket's gradient view of layer l}        as (1, *shape), l in B, ordered by i_l: a
                                                                FlatLayers of the bucket's buffer (host)
    i_l    = layer l's position in the step's full layer order (parameter names sorted: TorchModel's)
    p      = codec.encoder_inputs(g, e_B)                       stateful: e_B = the state of B's layers
    stats  = codec.prepare_many(p)                              NaN/Inf checks, local statistics
    bad    = exchange.any_true(a layer of B is non-finite)      a collective
    shared = MAX/mean over workers of codec.local_scalers_many(stats)   per layer, where shared
    msgs   = codec.encode_many(g, seed, t, [r], shared, stats)  IndexedLayers: StreamKey(seed, t, r, i_l)
    mean   = exchange.aggregate(codec, msgs, mode, shared)      written into the bucket's views

The bucket's layers (g's views, ordered by i_l) and their FlatLayers are built once per bucket and
kept while the bucket's buffer and views keep their addresses (`Buckets.plan`; DDP reuses the buffer
every step, a rebuild changes it): each later step costs no per-layer bookkeeping before the codec.

Every quantity is per layer (a codec that does not declare `properties.whole_step` promises it:
tgsim.codecs.base), the stream keys carry the layer's index i_l in the full order, so each layer's
mean has the bits of the simulator's one call over all layers (`tgsim.train.loop.train_step`).

Order and threads: DDP hands the buckets over in increasing bucket index on every rank; each is one
job on this rank's single worker thread (FIFO), so every rank issues the same collectives in the same
order, all on that thread; meanwhile the hook itself, on the thread DDP calls it on (the "main
thread"), issues none. The job completes the bucket's torch Future (`set_result(buffer)`, or
`set_exception`). At the last bucket the main thread waits for every job of the step, runs the last
bucket's job itself (nothing is left for it to overlap), then commits: the step counter, the bytes,
and the codec state (error feedback's residuals) of all buckets, kept pending until then.

Non-finite gradients: on_nonfinite = "raise" raises in the bucket where the NaN is (the same
NonFiniteGradientError as the simulator's, naming layer, worker and step; a ValueError on the other
ranks), the later buckets are not exchanged, and the hook raises it at the last bucket. "skip": the
bucket of the NaN and every later one are not exchanged, and at the last bucket every bucket's
buffer is zeroed, the pending codec state is dropped (the state stays that of the step before, as in
the simulator) and `state.skipped` is set. The buckets exchanged before the NaN's bucket count in
`state.sent` / `received`: on a skipped step those are the bytes that went over the wire, where the
simulator counts none.

The thread runs where the transport allows it: NumPy arrays (the CPU) and an exchange over
torch.distributed or an mpi4py communicator initialized at MPI_THREAD_SERIALIZED or above
(`MPI.Query_thread()`); otherwise (CuPy arrays, a lower MPI thread level, `thread=False`) each
bucket's job runs inline in the hook, in the same order, with the same bits. The CuPy path (inline,
CuPy's stream synchronized before each future completes) is not covered by this repository's CPU
tests.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tgsim.backend import get_xp
from tgsim.codecs.base import FlatLayers, IndexedLayers
from tgsim.train.loop import Setup, encode_messages, prepare_checked, shared_scalers
from tgsim.train.optim import Optimizer


# -- the whole step: the trainer's step, fed by DDP -------------------------------------------------------

class _HookModel:
    """The model of the hook's Setup: its gradients are the ones DDP handed over ({name: (1, *shape)}),
    its losses None (the hook does not see the loss, so the step averages none)."""

    def __init__(self, shapes: dict):
        self.shapes = dict(shapes)
        self.grads: dict | None = None

    def layer_shapes(self) -> dict:
        return dict(self.shapes)

    def loss_and_grad(self, params, x, y):
        return None, self.grads


def _capture(box: dict) -> Optimizer:
    """An Optimizer whose update stores the aggregated mean in box["mean"] and changes nothing."""

    def update(grads, state, params, lr):
        box["mean"] = grads
        return params, state

    return Optimizer(lambda params: {}, update)


def hook_setup(cfg, shapes: dict, codec, exchange, box: dict) -> Setup:
    """The trainer's Setup for `train_step` inside the hook: the model is `_HookModel` (DDP's
    gradients {name: (1, *shape)}, `shapes` {name: shape}), the optimizer `_capture(box)`; no data
    set, so `local_batch` draws no batch (the model ignores x, y). Both forms of the step read the
    config, codec, exchange, array module and layer shapes from it."""
    xp = get_xp(cfg.run.backend)
    return Setup(cfg, None, [None] * cfg.workers.n, _HookModel(shapes), codec, _capture(box), exchange, xp=xp)


# -- per bucket -------------------------------------------------------------------------------------------


def whole_step_reason(cfg, codec, names) -> str | None:
    """Why the hook must run one step over all layers at the last bucket (None: it runs per bucket):
    the codec declares `whole_step` or takes several rounds, the downlink is re-encoded (the
    parameter server draws under the mean's layer positions), or a stateful codec's state has a key
    that is not "<kind>/<layer name>"."""
    props = codec.properties
    if props.whole_step:
        return f"codec {codec.name!r} declares whole_step"
    if props.rounds > 1:
        return f"codec {codec.name!r} runs {props.rounds} rounds"
    if cfg.exchange.reternarize_downlink:
        return "[exchange] reternarize_downlink re-encodes the mean of all layers"
    if props.stateful:
        keys = codec.init_state({k: (1,) for k in names}, 1)
        odd = [k for k in keys if k.partition("/")[2] not in names]
        if odd:
            return f"codec {codec.name!r} keeps state {odd[0]!r} that is not per layer"
    return None


def thread_allowed(exchange, xp) -> bool:
    """Whether the bucket jobs may run on a worker thread: NumPy arrays, and an exchange whose comm
    is not an mpi4py communicator below MPI_THREAD_SERIALIZED (only one thread calls MPI at a time)."""
    if xp is not np:
        return False
    mpi = sys.modules.get("mpi4py.MPI")             # loaded where the comm is mpi4py's
    if mpi is not None and isinstance(getattr(exchange, "comm", None), mpi.Comm):
        return mpi.Query_thread() >= mpi.THREAD_SERIALIZED
    return True


class Buckets:
    """One rank's buckets of the step in flight (module docstring). state: the TgsimHookState;
    threaded: run the jobs on one worker thread (else inline)."""

    def __init__(self, state, threaded: bool):
        self.state = state
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="tgsim-ddp-bucket") if threaded else None
        self.plans: dict = {}            # bucket index -> (key, layers, their _grads form): `plan`
        self._reset()

    def plan(self, index: int, key: tuple, build) -> tuple:
        """(layers {name: gradient view} in step order, their `_grads` form) of bucket `index`, built
        once and kept while `key` stays the same. key: the bucket buffer's address and size, and each
        parameter's and gradient view's address; DDP reuses a bucket's buffer every step, so equal
        addresses are the same views of it, and a bucket rebuild changes them. The kept views hold the
        buffer they alias, so no other buffer can take its address while the plan is kept. key None:
        built every time, nothing kept (CuPy arrays: taking them from torch's tensors (DLPack) is what
        makes CuPy's stream wait for torch's, each step).
        build() -> ({name: view}, the buffer as a 1-D array) on a miss."""
        got = self.plans.get(index)
        if key is not None and got is not None and got[0] == key:
            return got[1], got[2]
        grads, flat = build()
        index_of = self.state.index
        layers = {k: grads[k] for k in sorted(grads, key=index_of.__getitem__)}
        form = self._grads(layers, flat)
        if key is not None:
            self.plans[index] = (key, layers, form)
        return layers, form

    def _reset(self) -> None:
        self.jobs: list = []
        self.views: dict = {}            # layer name -> its view in a bucket's buffer (gradient, then mean)
        self.error: BaseException | None = None
        self.bad = False
        self.new_state: dict = {}
        self.sent = self.received = 0.0

    def submit(self, layers: dict, form, buffer, fut, xp, last: bool) -> None:
        """Queue the bucket of gradient views `layers` {name: array} (step order) and their `_grads`
        form `form` (both from `plan`), whose buffer fills `fut`. The last bucket runs on the calling
        thread after the step's other jobs (nothing is left to overlap)."""
        self.views.update(layers)
        if self.pool is None or last:
            for j in self.jobs:
                j.result()
            self._job(layers, form, buffer, fut, xp)
        else:
            self.jobs.append(self.pool.submit(self._job, layers, form, buffer, fut, xp))

    def _job(self, layers: dict, form, buffer, fut, xp) -> None:
        try:
            if self.error is None and not self.bad:
                self._exchange(layers, form)
            if self.error is not None:
                fut.set_exception(self.error)
                return
            if xp is not np:
                xp.cuda.get_current_stream().synchronize()
            fut.set_result(buffer)
        except BaseException as e:  # noqa: BLE001  (raised on the main thread at the last bucket)
            self.error = e
            fut.set_exception(e)

    def _grads(self, layers: dict, flat):
        """The bucket's layers as one worker's (1, *shape) with their step indices: a FlatLayers of the
        bucket's buffer `flat` where every view is a range of it (a host buffer), else an IndexedLayers."""
        st = self.state
        shapes = st.setup.model.shapes
        if isinstance(flat, np.ndarray) and all(isinstance(a, np.ndarray) for a in layers.values()):
            try:
                return FlatLayers.from_views(flat, {k: a.reshape(shapes[k]) for k, a in layers.items()}, st.index)
            except ValueError:
                pass
        return IndexedLayers({k: a.reshape((1,) + shapes[k]) for k, a in layers.items()}, st.index)

    def _exchange(self, layers: dict, grads) -> None:
        """The bucket's check, encode and exchange (module docstring) of its gradient views `layers`,
        given to the codec as `grads` (their `_grads` form); the mean into the views."""
        st = self.state
        setup = st.setup
        cfg, ex, codec = setup.cfg, setup.exchange, setup.codec
        state_in = None
        if st.codec_state is not None:
            state_in = {k: v for k, v in st.codec_state.items() if k.partition("/")[2] in layers}
        inputs = codec.encoder_inputs(grads, state_in) if state_in is not None else grads
        stats, skip = prepare_checked(codec, inputs, ex, cfg.run.on_nonfinite, st.step)
        del inputs
        if skip:
            self.bad = True
            return
        workers = np.asarray(ex.local_workers, dtype=np.int64)
        share, shared = shared_scalers(setup, stats)
        msgs, new = encode_messages(setup, grads, st.step, workers, state_in, share, shared, stats)
        if new is not None:
            self.new_state.update(new)
        del grads
        mean, comm = ex.aggregate(codec, msgs, cfg.exchange.mode, share, None)
        self.sent += comm.sent
        self.received += comm.received
        xp = setup.xp
        for k, out in layers.items():
            out[...] = xp.asarray(mean[k]).reshape(out.shape)

    def finish(self) -> None:
        """At the last bucket, on the main thread: wait for every job of the step, then commit it
        (module docstring); raises the step's error, if any, after counting the step."""
        st = self.state
        for j in self.jobs:
            j.result()
        views, error, bad, new_state = self.views, self.error, self.bad, self.new_state
        sent, received = self.sent, self.received
        self._reset()
        st.step += 1
        st.sent += sent
        st.received += received
        if error is not None:
            raise error
        missing = [k for k in st.params if k not in views]
        if missing:
            raise ValueError(f"tgsim DDP hook: step {st.step - 1}: no gradient reached the hook for {missing[:5]}")
        st.skipped = bad
        if bad:
            for a in views.values():
                a[...] = 0
            if st.setup.xp is not np:
                st.setup.xp.cuda.get_current_stream().synchronize()
        elif st.codec_state is not None:
            st.codec_state.update(new_state)
        st.mean = {k: views[k] for k in st.params}


__all__ = ["Buckets", "hook_setup", "thread_allowed", "whole_step_reason"]
