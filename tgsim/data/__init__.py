"""Datasets that need no download, sharded across N workers, with counter-based mini-batches.

    ds = load("digits", seed=0)                            # Dataset: x float32, y int64
    shards = shard(ds.y_train, 8, "dirichlet", alpha=0.5)  # disjoint, covering index arrays
    x, y = worker_batches(ds, shards, 32, seed=0, step=t)  # (8, 32, 64), (8, 32)
    idx = batch_indices(shards[w], 32, seed=0, step=t, worker=w)   # what MPI rank w uses alone
"""

from tgsim.data.batching import batch_indices, worker_batch_indices, worker_batches
from tgsim.data.datasets import DATASETS, Dataset, dataset_kwargs, load
from tgsim.data.sharding import SCHEMES, label_histograms, shard, shard_plan_digest, tv_distances

__all__ = ["DATASETS", "Dataset", "SCHEMES", "batch_indices", "dataset_kwargs", "label_histograms",
           "load", "shard", "shard_plan_digest", "tv_distances", "worker_batch_indices", "worker_batches"]
