"""Counter-based mini-batches: which samples worker `w` uses at step `t`, as a pure function.

The simulator (N virtual workers in one process) and MPI rank `w` call the same function with the
same arguments and get the same indices; nothing depends on call order or on state carried between
steps.

Scheme (epoch permutations, each sample once per epoch): worker `w` walks an endless stream made
of per-epoch permutations of its shard,

    stream = shard[perm_0] ++ shard[perm_1] ++ ...,   perm_e = default_rng([TAG, seed, w, e])
                                                                 .permutation(len(shard))

and step `t` takes positions ``[t*batch, (t+1)*batch)`` of it. Every sample of the shard is
visited exactly once per epoch of ``len(shard)`` consecutive positions. When ``len(shard)`` is not
a multiple of `batch`, the batch that straddles an epoch boundary ends epoch e and begins epoch
e+1, so it can hold the same sample twice (at most ``batch - 1`` such batch positions per epoch
boundary; never when batch divides the shard size). Streams of different workers and seeds are
independent (NumPy SeedSequence hashing of the key); bit-for-bit identity holds for one NumPy
version (NumPy does not promise `permutation` streams across releases).
"""

from __future__ import annotations

import functools

import numpy as np

_TAG_BATCH = 0x42415431


def _nonneg_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    return int(v)


@functools.lru_cache(maxsize=1024)
def _epoch_permutation(seed: int, worker: int, epoch: int, size: int) -> np.ndarray:
    perm = np.random.default_rng([_TAG_BATCH, seed, worker, epoch]).permutation(size)
    perm.flags.writeable = False
    return perm


def batch_indices(shard, batch: int, seed: int, step: int, worker: int) -> np.ndarray:
    """Indices (into the training set) of worker `worker`'s mini-batch at step `step`.

    shard: the worker's index array (from `shard`). A pure function of its arguments; see the
    module docstring for the epoch-permutation scheme. batch > len(shard) is a ValueError.
    """
    shard = np.asarray(shard)
    if shard.ndim != 1 or not (np.issubdtype(shard.dtype, np.integer) or shard.size == 0):
        raise ValueError(
            f"shard must be a 1-D integer index array, got {shard.dtype} {shard.shape}")
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    seed, step, worker = (_nonneg_int("seed", seed), _nonneg_int("step", step),
                          _nonneg_int("worker", worker))
    n, batch = shard.size, int(batch)
    if batch > n:
        raise ValueError(f"batch {batch} is larger than worker {worker}'s shard ({n} samples)")
    start = step * batch
    e0, off = divmod(start, n)
    if off + batch <= n:
        pos = _epoch_permutation(seed, worker, e0, n)[off:off + batch]
    else:  # straddles the end of epoch e0 (batch <= n, so at most two epochs)
        pos = np.concatenate([_epoch_permutation(seed, worker, e0, n)[off:],
                              _epoch_permutation(seed, worker, e0 + 1, n)[:off + batch - n]])
    return shard[pos].astype(np.int64, copy=False)


@functools.lru_cache(maxsize=8)
def _epoch_pair_positions(seed: int, workers: tuple, sizes: tuple, epochs: tuple) -> np.ndarray:
    """(W, 2 max(sizes)) int64: row i = perm of epoch e_i ++ perm of epoch e_i + 1 of worker
    workers[i] (the `_epoch_permutation`s, so the bits of `batch_indices`), -1 past 2 sizes[i]."""
    out = np.full((len(workers), 2 * max(sizes)), -1, dtype=np.int64)
    for i, (w, n, e) in enumerate(zip(workers, sizes, epochs)):
        out[i, :n] = _epoch_permutation(seed, w, e, n)
        out[i, n:2 * n] = _epoch_permutation(seed, w, e + 1, n)
    out.flags.writeable = False
    return out


def batch_indices_many(shards, batch: int, seed: int, step: int, workers) -> np.ndarray:
    """(len(workers), batch) int64: row i is exactly `batch_indices(shards[i], batch, seed, step,
    workers[i])`, with the same checks and errors (the first failing worker's), gathered in a few
    array operations instead of one call per worker.

    The permutations of the workers' current and next epochs are stacked once per combination of
    epochs (a small cache: with equal shard sizes that is once per epoch) and every row's batch is
    one slice of its pair: a batch straddling an epoch boundary continues into the next epoch's
    permutation, as in `batch_indices`.
    """
    workers = tuple(workers)
    if len(shards) != len(workers):
        raise ValueError(f"{len(shards)} shards for {len(workers)} workers")
    arrs = [np.asarray(sh) for sh in shards]
    ok = not (isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1)
    ok = ok and len(arrs) > 0 and all(a.ndim == 1 and a.dtype.kind in "iu" for a in arrs) \
        and len({a.dtype for a in arrs}) == 1
    if ok:
        seed, step = _nonneg_int("seed", seed), _nonneg_int("step", step)
        if not all(isinstance(w, (int, np.integer)) and not isinstance(w, bool) and w >= 0 for w in workers):
            ok = False
    if ok:
        workers = tuple(int(w) for w in workers)
        batch = int(batch)
        sizes = tuple(a.size for a in arrs)
        ok = min(sizes) >= batch and step * batch < 2**62
    if not ok:   # no workers, a failing check, mixed dtypes or huge steps: the per-worker calls
        return np.stack([batch_indices(a, batch, seed, step, w) for a, w in zip(arrs, workers)])
    start = step * batch
    n = np.array(sizes, dtype=np.int64)
    epochs, off = np.divmod(start, n)
    pairs = _epoch_pair_positions(seed, workers, sizes, tuple(epochs.tolist()))
    rows = np.arange(len(arrs))[:, None]
    pos = pairs[rows, off[:, None] + np.arange(batch)]              # < off + batch <= 2 n
    base = np.zeros(len(arrs), dtype=np.int64)
    np.cumsum(n[:-1], out=base[1:])
    return np.concatenate(arrs)[base[:, None] + pos].astype(np.int64, copy=False)


def worker_batch_indices(shards, per_worker_batch: int, seed: int, step: int) -> np.ndarray:
    """(workers, per_worker_batch) int64: row w is `batch_indices(shards[w], ..., worker=w)`."""
    return batch_indices_many(shards, per_worker_batch, seed, step, range(len(shards)))


def worker_batches(dataset, shards, per_worker_batch: int, seed: int, step: int):
    """All workers' mini-batches at `step`, stacked for the simulator.

    Returns (x, y) with x of shape (workers, per_worker_batch, *feature_shape) and y of shape
    (workers, per_worker_batch); row w is what worker w computes alone with `batch_indices`.
    The data are gathered with one fancy-indexing operation per array.
    """
    if len(shards) == 0:
        raise ValueError("shards is empty: need at least one worker")
    idx = worker_batch_indices(shards, per_worker_batch, seed, step)
    return dataset.x_train[idx], dataset.y_train[idx]
