"""Splitting a training set across N workers: IID or label-skewed (Dirichlet).

`shard(y_train, workers, scheme, alpha, seed)` returns one sorted int64 index array per worker;
the arrays are disjoint and together cover every training sample.

* ``"iid"``: a random permutation (keyed by seed) cut into `workers` parts whose sizes differ by
  at most one.
* ``"dirichlet"``: label skew as in Hsu, Qi & Brown 2019 ("Measuring the effects of non-identical
  data distribution for federated visual classification"), in the per-class form used by
  Yurochkin et al. 2019 and NIID-Bench (Li et al. 2021): for every class c, proportions
  ``p_c ~ Dirichlet(alpha * 1_workers)`` and the (shuffled) samples of class c are cut at
  ``floor(cumsum(p_c) * n_c)``. Small alpha: each worker sees few classes; alpha -> inf: IID.
  If some worker gets fewer than `min_per_worker` samples, the whole draw is repeated (the draws
  continue from the same keyed stream, so the result is still a pure function of the arguments);
  after `max_tries` failed draws a ValueError says so.
  Regression targets (floating-point y) are cut into `n_bins` quantile bins of y, and the bins play
  the role of classes: every worker then sees a skewed range of target values.

`label_histograms` / `tv_distances` measure the skew: the total-variation distance of each
worker's label distribution from the global one, ``TV(p, q) = sum |p - q| / 2`` in [0, 1].
"""

from __future__ import annotations

import numpy as np

_TAG_IID = 0x49494431
_TAG_DIRICHLET = 0x44495231

SCHEMES = ("iid", "dirichlet")


def _labels_for_skew(y: np.ndarray, n_bins: int) -> np.ndarray:
    """Integer labels for the Dirichlet split: y itself, or quantile bins of a float y."""
    if np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_:
        return y.astype(np.int64)
    if not np.issubdtype(y.dtype, np.floating):
        raise ValueError(f"y_train must hold integer labels or float targets, got {y.dtype}")
    if not np.all(np.isfinite(y)):
        raise ValueError("y_train holds NaN/Inf; cannot bin regression targets")
    edges = np.quantile(y, np.linspace(0.0, 1.0, n_bins + 1)[1:-1])
    return np.searchsorted(edges, y, side="right").astype(np.int64)


def shard(y_train, workers: int, scheme: str = "iid", alpha: float = 0.5, seed: int = 0, *,
          min_per_worker: int = 1, max_tries: int = 100, n_bins: int = 10) -> list[np.ndarray]:
    """Index arrays (sorted, int64) of the training samples each of `workers` workers holds.

    y_train: 1-D array of labels (int) or regression targets (float; "dirichlet" then splits by
    `n_bins` quantile bins of y). min_per_worker: every worker gets at least this many samples, or
    ValueError. See the module docstring for the schemes.
    """
    y = np.asarray(y_train)
    if y.ndim != 1:
        raise ValueError(f"y_train must be 1-D, got shape {y.shape}")
    n = y.shape[0]
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if (isinstance(min_per_worker, bool) or not isinstance(min_per_worker, (int, np.integer))
            or min_per_worker < 0):
        raise ValueError(f"min_per_worker must be a non-negative integer, got {min_per_worker!r}")
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; valid: {', '.join(SCHEMES)}")
    workers, seed = int(workers), int(seed)
    if workers * min_per_worker > n:
        raise ValueError(f"{n} samples cannot give {workers} workers at least {min_per_worker} "
                         f"each (min_per_worker)")

    if scheme == "iid":
        perm = np.random.default_rng([_TAG_IID, seed]).permutation(n)
        return [np.sort(p).astype(np.int64) for p in np.array_split(perm, workers)]

    try:
        alpha = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"alpha must be a positive number, got {alpha!r}") from None
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be positive and finite, got {alpha!r}")
    if isinstance(max_tries, bool) or not isinstance(max_tries, (int, np.integer)) or max_tries < 1:
        raise ValueError(f"max_tries must be a positive integer, got {max_tries!r}")
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")
    labels = _labels_for_skew(y, int(n_bins))
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    rng = np.random.default_rng([_TAG_DIRICHLET, seed])
    smallest = 0
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(workers)]
        for idx in by_class:
            p = rng.dirichlet(np.full(workers, alpha))
            idx = rng.permutation(idx)
            cuts = np.floor(np.cumsum(p)[:-1] * idx.size).astype(np.int64)
            for w, piece in enumerate(np.split(idx, np.clip(cuts, 0, idx.size))):
                parts[w].append(piece)
        out = [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
        smallest = min(o.size for o in out)
        if smallest >= min_per_worker:
            return out
    raise ValueError(
        f"dirichlet sharding (alpha={alpha}, workers={workers}, n={n}): no draw in {max_tries} "
        f"tries gave every worker >= {min_per_worker} samples (last smallest shard: {smallest}); "
        f"raise alpha, lower workers or min_per_worker, or raise max_tries")


def label_histograms(y_train, shards, n_classes: int | None = None) -> np.ndarray:
    """(workers, n_classes) label counts of each shard."""
    y = np.asarray(y_train).astype(np.int64)
    k = int(n_classes) if n_classes is not None else int(y.max()) + 1
    return np.stack([np.bincount(y[s], minlength=k)[:k] for s in shards])


def tv_distances(y_train, shards, n_classes: int | None = None) -> np.ndarray:
    """Total-variation distance of each worker's label distribution from the global one."""
    y = np.asarray(y_train).astype(np.int64)
    k = int(n_classes) if n_classes is not None else int(y.max()) + 1
    glob = np.bincount(y, minlength=k)[:k] / y.size
    h = label_histograms(y, shards, k).astype(np.float64)
    local = h / np.maximum(h.sum(axis=1, keepdims=True), 1)
    return 0.5 * np.abs(local - glob).sum(axis=1)


def shard_plan_digest(shards, *arrays) -> str:
    """sha256 of the shard index arrays (and the data arrays) a run trains on: what MPI ranks compare."""
    import hashlib

    h = hashlib.sha256()
    for s in list(shards) + list(arrays):
        a = np.ascontiguousarray(np.asarray(s))
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()
