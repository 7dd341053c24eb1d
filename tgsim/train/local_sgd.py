"""Local steps: local SGD (periodic model averaging) and PQASGD, for any codec and any exchange.

Config: ``[exchange] every = p`` and ``local = "average" | "pqasgd"`` (``"none"``, the default, is
the synchronous gradient exchange of `tgsim.train.loop.train_step`, untouched). `run()` hands each
step to a `LocalSteps` object instead of `train_step` when `enabled(cfg)`.

The algorithm: Jiang & Agrawal 2018 ("A Linear Speedup Analysis of Distributed Deep Learning with
Sparse and Quantized Communication"), Algorithm 1 (PQASGD), n workers, period p, learning rate γ,
x_s the model of the last sync (as we read the paper; tgsim does not carry its PDF):

    for t = 0, 1, ..., T-1, on every worker i in parallel:
        x^i <- x^i - γ ∇F(x^i; ξ_t^i)                         a local SGD step on the worker's own batch
        if (t + 1) mod p == 0:                                  a sync step
            x^i <- x_s + (1/n) Σ_j Q(x^j - x_s);  x_s <- x^i      the quantized model difference, averaged

Local SGD / periodic averaging (the paper's PASGD; Lin et al. 2020, "Don't use large mini-batches,
use local SGD") is Q = identity: x^i <- (1/n) Σ_j x^j.

tgsim's arithmetic: the model difference in units of the step
------------------------------------------------------------
Every worker keeps A^i, the sum of its gradients since the last sync (float32, added in step order;
A^i = g at the period's first step, a copy), and its replica is recomputed from x_s at each step:

    x^i = fl(x_s - fl(γ_k · A^i))                       evaluated by model.loss_and_grad on x^i alone
    sync:  ḡ = mean over workers of Q(A^i)               pqasgd: codec.encode_many(A) + exchange.aggregate
                                                        average: exchange.mean_fp32(A) (the ordered fp32 mean)
           x_s, state = optimizer.update(ḡ, state, x_s, γ_k);  A^i <- empty

In exact arithmetic x^i - x_s = -γ_k A^i, so with optimizer "sgd" the sync is
x_s - γ_k mean Q(A^i) = x_s + mean Q(x^i - x_s), Algorithm 1, for every codec with Q(c v) = c Q(v)
for real c (stochastic ternarization with the same draws, QSGD, top-k, random-k and the scaled sign
are; the fp16/bf16 casts up to their rounding; the plain sign is not: it takes a step of γ_k per
element in the direction of the vote, a signSGD step on the period's gradient sum). γ_k is the
schedule at the period's first step k·p, constant within the period (at p = 1: the schedule).

Why this form, and what is bitwise:
* p = 1 is the synchronous step bit for bit, for every codec and optimizer: A^i is g^i (a copy), the
  replicas are x_s, and the sync makes train_step's calls in train_step's order with the same
  stream keys (seed, step, worker), so the same messages, mean and optimizer update
  (tests/test_local_sgd.py). The paper's literal form cannot be: fl(fl(x - fl(γg)) - x) is not
  -fl(γg) (the local step rounds onto x's grid), and mean_i fl(γ g^i) is not fl(γ mean_i g^i): an
  O(ulp(x)) difference per sync.
* p > 1 with fp32 is local SGD as defined by the two lines above; tests/test_local_sgd.py checks it
  bit for bit against an independent NumPy loop, and against the textbook sequential form
  (x^i <- x^i - γ g, then the plain mean of the models) within float32 rounding.
* The replica is recomputed from x_s, not stepped: the rounding error of the local steps does not
  accumulate in x^i, only in the float32 sum A^i.

Optimizer state: one state, identical on every replica, applied at the syncs to ḡ; the local steps
are plain SGD steps. With "sgd" this is Algorithm 1 (whose analysis is for plain SGD). With
"momentum"/"nesterov" the momentum acts on the period's averaged pseudo-gradient: SlowMo (Wang et al.
2020) with base optimizer SGD and slow learning rate α = 1 (u <- βu + (x_s - x̄)/γ, x_s <- x_s - γu).
Not Lin et al.'s local momentum (a buffer per worker, kept across syncs): at p = 1 the workers'
buffers average to the synchronous buffer in exact arithmetic only (mean_i fl(βv_i + g_i) is not
fl(β v + mean_i g_i)), and they are per-worker state that a checkpoint would have to carry; a
buffer reset at every sync would make p = 1 plain SGD. Adam, and the optimizer's weight decay, with
p > 1 are ConfigErrors (tgsim/train/config.py says why).

The rest of the run
* Sync steps: t with (t + 1) mod p == 0, and the run's last step (a shorter last period).
* Between syncs the run's `params` are x_s, the last synchronized model: it is what is evaluated,
  measured (distance to the optimum), checkpointed and saved.
* Checkpoints are written at sync steps only (config: run.checkpoint_every a multiple of every),
  where every A^i is empty, so params + optimizer state are the whole state: a killed run resumes
  with the bits of an uninterrupted run (A^i of another MPI rank never has to reach rank 0's file).
* Bytes: payloads at the syncs only (the exchange's counts). Local steps still make the control
  collectives the synchronous step makes (the mean loss for the metrics, the non-finite flag),
  which tgsim never counts as payload.
* Non-finite values: a local gradient with NaN/Inf stops the run (on_nonfinite = "raise", on every
  worker as in train_step) or is dropped on every worker ("skip": A^i unchanged, the step counted as
  skipped); a period whose A^i is non-finite at the sync (overflow) is dropped whole (no exchange, no
  update, counted as skipped); a period with no gradient left makes no sync.
* Per-layer statistics (metrics.csv) are those of the exchanged A^i at a sync step, when some step
  of its period asked for them (run.log_every).
"""

from __future__ import annotations

import numpy as np

from tgsim.backend import array_module
from tgsim.errors import ConfigError, NonFiniteGradientError, nonfinite_elsewhere
from tgsim.rng import StreamKey
from tgsim.train.schedules import learning_rate


def enabled(cfg) -> bool:
    """True when the run of config `cfg` takes local steps ([exchange] local is not "none")."""
    return cfg.exchange.local != "none"


def period_lr(cfg, step: int) -> float:
    """γ_k: the schedule of `cfg` at the first step of the period holding `step` (constant within a period)."""
    p = cfg.exchange.every
    return learning_rate(cfg.schedule, (step // p) * p, cfg.run.steps)


def is_sync_step(cfg, step: int) -> bool:
    """Whether step `step` (0-based) of the run of `cfg` ends a period: (step + 1) mod every == 0, or it
    is the run's last step."""
    return (step + 1) % cfg.exchange.every == 0 or step + 1 == cfg.run.steps


def replica(params: dict, acc: dict, i: int, lr: float) -> dict:
    """Local worker i's model x_s - γ A^i from the synchronized `params` x_s, the accumulated gradients
    `acc` {name: (W, *shape)} and γ = `lr`, in float32 as the sgd optimizer computes p - γ g."""
    xp = array_module(next(iter(params.values())))
    f = xp.float32(lr)
    return {k: p - f * acc[k][i] for k, p in params.items()}


def local_gradients(model, params: dict, acc: dict | None, lr: float, x, y):
    """(losses (W,), grads {name: (W, *shape)}) of the W local workers of `model` on their batches x, y,
    each at its own replica of `params` (replica(params, acc, i, lr)).

    With no accumulated gradient (`acc` None: the period's first step) every replica is x_s: one
    batched call; else one call per worker on x[i:i+1] with x^i. Both give a worker the same bits
    (tgsim/models/base.py, "Bit-for-bit per worker").
    """
    if acc is None:
        return model.loss_and_grad(params, x, y)
    xp = array_module(x)
    losses, grads = [], {}
    for i in range(x.shape[0]):
        loss, g = model.loss_and_grad(replica(params, acc, i, lr), x[i:i + 1], y[i:i + 1])
        losses.append(loss)
        for k, v in g.items():
            grads.setdefault(k, []).append(v)
    return xp.concatenate(losses), {k: xp.concatenate(v) for k, v in grads.items()}


def first_nonfinite(layers: dict):
    """(layer, local worker index, count) of the first of `layers` {name: (W, *shape)} holding NaN/Inf for
    some worker, or None."""
    for name, g in layers.items():
        xp = array_module(g)
        flat = g.reshape(g.shape[0], -1)
        ok = xp.isfinite(flat).all(axis=1)
        if not bool(ok.all()):
            w = int(xp.argmin(ok))
            return name, w, int((~xp.isfinite(flat[w])).sum())
    return None


class LocalSteps:
    """The step function of a run with local steps: `(setup, params, opt_state, step, with_stats)
    -> (params, opt_state, StepInfo)`, like train_step; holds each local worker's A^i between syncs
    (see the module docstring)."""

    def __init__(self, setup):
        if setup.codec.properties.stateful:     # config.validate names the combination; this guards build()'s codec
            raise ConfigError(f"[exchange] local = {setup.cfg.exchange.local!r} cannot carry the per-worker state "
                              f"of the stateful codec {setup.codec.name!r} between syncs")
        self.setup = setup
        self.acc: dict | None = None      # {layer: (W, *shape)} A^i of the local workers; None: empty
        self.stats_wanted = False         # some step of this period asked for per-layer statistics
        self.first = True                 # no step taken yet: the run (or its resume) must start a period

    def __call__(self, setup, params: dict, opt_state, step: int, with_stats: bool = False, codec_state=None):
        from tgsim.train.loop import StepInfo, local_batch

        if codec_state is not None:
            raise ValueError("local steps keep no codec state (config.validate refuses a stateful codec with them)")

        cfg, ex = setup.cfg, setup.exchange
        local = ex.local_workers
        lr = period_lr(cfg, step)
        if step % cfg.exchange.every == 0 and self.acc is not None:
            raise RuntimeError(f"step {step} starts a period but the previous period never synced")
        if self.first and step % cfg.exchange.every:
            raise RuntimeError(f"the run starts (or resumes) at step {step}, inside a period of {cfg.exchange.every} "
                               "steps: the workers' local models are not in a checkpoint (checkpoints at sync steps only)")
        self.first = False
        self.stats_wanted = self.stats_wanted or with_stats
        x, y = local_batch(setup, step)
        losses, grads = local_gradients(setup.model, params, self.acc, lr, x, y)
        bad = first_nonfinite(grads)
        skipped = ex.any_true(bad is not None)
        if skipped and cfg.run.on_nonfinite == "raise":
            if bad is not None:
                layer, w, count = bad
                raise NonFiniteGradientError(layer, count, f"worker {local[w]}, step {step}")
            raise nonfinite_elsewhere(step)
        if not skipped:
            if self.acc is None:
                self.acc = dict(grads)    # A^i = g^i (fresh arrays from the model, no copy needed)
            else:
                for k, g in grads.items():
                    self.acc[k] += g
        del grads
        sent = received = 0.0
        rows = []
        if is_sync_step(cfg, step):
            acc, want, self.acc, self.stats_wanted = self.acc, self.stats_wanted, None, False
            synced = self._sync(acc, step, want) if acc is not None else None
            if synced is None:
                skipped = skipped or acc is not None      # a period dropped at its sync
            else:
                mean, comm, rows = synced
                params, opt_state = setup.optimizer.update(mean, opt_state, params, lr)
                sent, received = comm.sent, comm.received
        loss = float("nan") if skipped else ex.mean_scalar(float(np.sum(losses)))
        return params, opt_state, StepInfo(loss, sent, received, skipped, rows)

    def _sync(self, acc: dict, step: int, with_stats: bool):
        """(ḡ, CommBytes, layer rows) of the period ending at `step`, or None where the period is dropped."""
        from tgsim.train.loop import _layer_stats, shared_scalers

        setup = self.setup
        cfg, ex, codec = setup.cfg, setup.exchange, setup.codec
        local = ex.local_workers
        if cfg.exchange.local == "average":
            bad = first_nonfinite(acc)
            if self._drop(None if bad is None else (bad[0], bad[2], bad[1]), step):
                return None
            mean, comm = ex.mean_fp32([{k: a[i] for k, a in acc.items()} for i in range(len(local))])
            return mean, comm, (_layer_stats(acc, None, None) if with_stats else [])
        # pqasgd: the calls of train_step, on A instead of g
        bad, stats = None, None
        try:
            stats = codec.prepare_many(acc)
        except NonFiniteGradientError as e:
            bad = (e.layer, e.count, getattr(e, "worker", None))
        if self._drop(bad, step):
            return None
        share, shared = shared_scalers(self.setup, stats)
        defers = getattr(ex, "defers_encode", None)
        deferred = bool(codec.properties.defers_encode and defers and
                        defers(cfg.exchange.mode, share, cfg.exchange.reternarize_downlink))
        msgs = codec.encode_many(acc, cfg.run.seed, step, np.asarray(local, dtype=np.int64), shared, stats,
                                 **({"deferred": True} if deferred else {}))
        rkey = StreamKey(cfg.run.seed, step, ex.n_workers, 0) if cfg.exchange.reternarize_downlink else None
        mean, comm = ex.aggregate(codec, msgs, cfg.exchange.mode, share, rkey)
        decoded = [codec.decode(m) for m in msgs] if with_stats else None
        del msgs
        rows = _layer_stats(acc, shared, stats, decoded, mean, ex) if with_stats else []
        return mean, comm, rows

    def _drop(self, bad, step: int) -> bool:
        """True (drop the period) if any worker's A is non-finite and on_nonfinite = "skip"; raise for
        "raise". bad: (layer, count, local worker index or None) of this process's first bad layer, or None."""
        cfg, ex = self.setup.cfg, self.setup.exchange
        if not ex.any_true(bad is not None):
            return False
        if cfg.run.on_nonfinite == "raise":
            if bad is not None:
                layer, count, w = bad
                where = f"step {step}" if w is None else f"worker {ex.local_workers[w]}, step {step}"
                raise NonFiniteGradientError(layer, count, f"{where} (the period's gradient sum)")
            raise nonfinite_elsewhere(step, "gradient sum")
        return True
