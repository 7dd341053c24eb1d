"""tgsim.data: datasets without downloads, sharding across workers, counter-based mini-batches."""

from __future__ import annotations

import dataclasses

import random
import socket
from pathlib import Path

import numpy as np
import pytest

from tgsim.data import (DATASETS, Dataset, batch_indices, dataset_kwargs, load, shard,
                        tv_distances, worker_batch_indices, worker_batches)
from tgsim.data import datasets as datasets_mod

# name -> (n_train, n_test, feature_shape, n_classes) at default kwargs
EXPECTED = {
    "least_squares": (1024, 256, (32,), 0),
    "classification": (2000, 500, (20,), 4),
    "digits": (1347, 450, (64,), 10),
    "breast_cancer": (426, 143, (30,), 2),
    "wine": (133, 45, (13,), 3),
    "mnist1d": (4000, 1000, (40,), 10),
}


def test_every_name_is_covered():
    # pychars: its classes depend on Python (tests/test_data_text.py); torch: a factory (tests/test_torch_data.py)
    assert set(DATASETS) == set(EXPECTED) | {"pychars", "torch"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shapes_dtypes_labels(name):
    ds = load(name)
    n_train, n_test, feat, k = EXPECTED[name]
    assert isinstance(ds, Dataset) and ds.name == name
    assert ds.x_train.shape == (n_train, *feat) and ds.x_test.shape == (n_test, *feat)
    assert ds.feature_shape == feat and ds.n_classes == k
    assert ds.x_train.dtype == np.float32 and ds.x_test.dtype == np.float32
    assert np.all(np.isfinite(ds.x_train)) and np.all(np.isfinite(ds.x_test))
    if k == 0:
        assert ds.task == "regression"
        assert ds.y_train.dtype == np.float32 and ds.y_test.dtype == np.float32
    else:
        assert ds.task == "classification"
        assert ds.y_train.dtype == np.int64 and ds.y_test.dtype == np.int64
        for y in (ds.y_train, ds.y_test):
            assert y.min() >= 0 and y.max() < k
        assert set(np.unique(ds.y_train)) == set(range(k))   # every class present in train
    assert name in repr(ds) and "array" not in repr(ds)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_deterministic_for_a_seed(name):
    a, b = load(name, seed=3), load(name, seed=3)
    for part in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(a, part), getattr(b, part))
    # callers get their own arrays: writing to one load does not change the next
    a.x_train[:] = 0
    assert np.any(load(name, seed=3).x_train != 0)


@pytest.mark.parametrize("name", ["least_squares", "classification", "digits", "wine"])
def test_seed_changes_the_data_or_split(name):
    a, b = load(name, seed=0), load(name, seed=1)
    assert not np.array_equal(a.y_train, b.y_train)


@pytest.mark.parametrize("name", ["digits", "breast_cancer", "wine"])
def test_sklearn_split_is_stratified_and_standardized(name):
    ds = load(name, test_fraction=0.3)
    n = ds.n_train + ds.n_test
    assert abs(ds.n_test / n - 0.3) < 0.02
    glob = np.bincount(np.concatenate([ds.y_train, ds.y_test])) / n
    for y in (ds.y_train, ds.y_test):
        assert np.max(np.abs(np.bincount(y, minlength=ds.n_classes) / y.size - glob)) < 0.02
    mu, sd = ds.x_train.mean(axis=0), ds.x_train.std(axis=0)
    assert np.allclose(mu, 0, atol=1e-5)
    assert np.allclose(sd[sd > 0], 1, atol=1e-4)           # digits has constant-zero pixels
    raw = load(name, standardize=False)
    assert raw.x_train.min() >= 0                            # raw features of all three are >= 0


def test_breast_cancer_is_binary():
    ds = load("breast_cancer")
    assert ds.n_classes == 2 and set(np.unique(ds.y_train)) == {0, 1}


def test_least_squares_spectrum_and_meta():
    ds = load("least_squares", n=20000, dim=8, cond=400.0, noise=0.05)
    s = ds.meta["spectrum"]
    assert s[0] == pytest.approx(1.0) and s[-1] == pytest.approx(1 / 20.0)
    assert np.all(np.diff(s) < 0)
    cov = np.cov(ds.x_train.T.astype(np.float64))
    ev = np.linalg.eigvalsh(cov)
    assert ev.max() / ev.min() == pytest.approx(400.0, rel=0.1)   # cond of E[x x^T]
    resid = ds.y_train - ds.x_train @ ds.meta["w_true"]
    assert resid.std() == pytest.approx(0.05, rel=0.05)
    w_star = ds.meta["w_star"]
    x, y = ds.x_train.astype(np.float64), ds.y_train.astype(np.float64)
    np.testing.assert_allclose(x.T @ (x @ w_star - y), 0, atol=1e-6 * len(y))   # normal equations
    assert ds.meta["loss_star"] == pytest.approx(np.mean((x @ w_star - y) ** 2) / 2)
    rot = load("least_squares", n=20000, dim=8, cond=400.0, rotate=True)
    ev = np.linalg.eigvalsh(np.cov(rot.x_train.T.astype(np.float64)))
    assert ev.max() / ev.min() == pytest.approx(400.0, rel=0.1)
    q = rot.meta["rotation"]
    np.testing.assert_allclose(q @ q.T, np.eye(8), atol=1e-12)


def test_classification_separation():
    ds = load("classification", classes=5, dim=10, separation=4.0)
    np.testing.assert_allclose(np.linalg.norm(ds.meta["means"], axis=1), 4.0)
    assert np.all(np.bincount(ds.y_train) == ds.n_train // 5)
    # nearest-mean classification is far better than chance at this separation
    d = ((ds.x_test[:, None, :] - ds.meta["means"][None]) ** 2).sum(-1)
    assert np.mean(d.argmin(1) == ds.y_test) > 0.8


# ------------------------------------------------------------------------------------------------
# MNIST-1D: offline, global RNG untouched, cached

def _forbid_network(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("network access during dataset load")

    monkeypatch.setattr(socket.socket, "connect", boom)
    monkeypatch.setattr(socket.socket, "connect_ex", boom)
    monkeypatch.setattr(socket, "create_connection", boom)
    monkeypatch.setattr(socket, "getaddrinfo", boom)
    import requests
    for fn in ("get", "post", "request", "head"):
        monkeypatch.setattr(requests, fn, boom)
    monkeypatch.setattr(requests.Session, "request", boom)


def test_mnist1d_offline_no_files_and_global_rng_restored(monkeypatch, tmp_path):
    _forbid_network(monkeypatch)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)                          # mnist1d.get_dataset would write a .pkl here
    monkeypatch.setenv("TGSIM_CACHE_DIR", str(tmp_path / "cache"))   # empty: the generator runs
    datasets_mod._mnist1d_arrays.cache_clear()
    np.random.seed(1234)
    random.seed(1234)
    ds = load("mnist1d", num_samples=1000)           # generated (the cache directory is empty)
    assert ds.n_train == 800 and ds.n_test == 200 and ds.meta["generation_seconds"] > 0
    after_np, after_py = np.random.random(), random.random()
    np.random.seed(1234)
    random.seed(1234)
    assert after_np == np.random.random() and after_py == random.random()
    assert list(work.iterdir()) == []
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [Path(ds.meta["cache"]).name]


def test_mnist1d_generator_is_deterministic_and_cached():
    gen = datasets_mod._mnist1d_generate
    a, b = list(gen(1000, 42).values()), list(gen(1000, 42).values())
    for u, v in zip(a[:4], b[:4]):
        np.testing.assert_array_equal(u, v)
    c = list(gen(1000, 7).values())
    assert not np.array_equal(a[0], c[0])
    load("mnist1d")
    hits = datasets_mod._mnist1d_arrays.cache_info().hits
    load("mnist1d")
    assert datasets_mod._mnist1d_arrays.cache_info().hits == hits + 1


# ------------------------------------------------------------------------------------------------
# bad arguments

def test_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown dataset 'mnist'.*digits.*mnist1d"):
        load("mnist")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_unknown_kwarg_lists_valid_ones(name):
    valid = dataset_kwargs(name)
    with pytest.raises(ValueError, match="unknown keyword argument.*'bogus'") as e:
        load(name, bogus=1)
    for k in valid:
        assert k in str(e.value)


@pytest.mark.parametrize("name, kwargs, match", [
    ("least_squares", {"cond": 0.5}, "cond"),
    ("least_squares", {"dim": 0}, "dim"),
    ("least_squares", {"n": 2.5}, "n must be an integer"),
    ("least_squares", {"noise": float("nan")}, "noise"),
    ("classification", {"classes": 1}, "classes"),
    ("digits", {"test_fraction": 1.0}, "test_fraction"),
    ("wine", {"test_fraction": 0.0}, "test_fraction"),
    ("wine", {"test_fraction": 0.01}, "cannot split"),
    ("mnist1d", {"num_samples": 1005}, "multiple of 10"),
])
def test_bad_kwarg_values(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        load(name, **kwargs)


def test_bad_seed():
    with pytest.raises(ValueError, match="seed"):
        load("wine", seed=-1)


# ------------------------------------------------------------------------------------------------
# sharding

def _check_partition(shards, n):
    allidx = np.concatenate(shards)
    assert allidx.dtype == np.int64
    assert allidx.size == n and np.array_equal(np.sort(allidx), np.arange(n))   # disjoint+complete
    for s in shards:
        assert np.all(np.diff(s) > 0)                                            # sorted, unique


@pytest.mark.parametrize("workers", [1, 3, 8])
@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_shards_disjoint_and_complete(scheme, workers):
    y = load("digits").y_train
    sh = shard(y, workers, scheme, alpha=0.3, seed=5)
    assert len(sh) == workers
    _check_partition(sh, y.size)
    again = shard(y, workers, scheme, alpha=0.3, seed=5)
    assert all(np.array_equal(a, b) for a, b in zip(sh, again))
    if workers > 1:
        other = shard(y, workers, scheme, alpha=0.3, seed=6)
        assert not all(np.array_equal(a, b) for a, b in zip(sh, other))


def test_iid_sizes_near_equal():
    sizes = [s.size for s in shard(np.zeros(1003, np.int64), 8)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1003


def _mean_tv(y, alpha, seeds=range(10), workers=8):
    return np.mean([tv_distances(y, shard(y, workers, "dirichlet", alpha=alpha, seed=s), 10).mean()
                    for s in seeds])


def test_dirichlet_skew_decreases_with_alpha():
    y = load("digits").y_train
    iid = np.mean([tv_distances(y, shard(y, 8, "iid", seed=s), 10).mean() for s in range(10)])
    tv = {a: _mean_tv(y, a) for a in (0.1, 1.0, 100.0)}
    assert tv[0.1] > 0.5 > tv[1.0] > 0.15 > iid      # measured ~0.67, ~0.33; iid ~0.09
    assert tv[0.1] > tv[1.0] > tv[100.0]
    assert tv[100.0] < iid + 0.02          # ~0.04: per-class cuts make alpha=100 ~ stratified IID


def test_dirichlet_min_per_worker():
    y = load("digits").y_train
    for s in range(5):
        sh = shard(y, 8, "dirichlet", alpha=0.1, seed=s, min_per_worker=60)
        assert min(x.size for x in sh) >= 60
        _check_partition(sh, y.size)
    with pytest.raises(ValueError, match="min_per_worker"):
        shard(y, 8, "dirichlet", alpha=0.05, min_per_worker=160, max_tries=5)
    with pytest.raises(ValueError, match="min_per_worker"):
        shard(y, 8, "iid", min_per_worker=200)


def test_dirichlet_regression_by_quantile_bins():
    ds = load("least_squares", n=2000)
    sh = shard(ds.y_train, 4, "dirichlet", alpha=0.1, seed=0)
    _check_partition(sh, ds.n_train)
    means = [ds.y_train[s].mean() for s in sh]
    assert np.ptp(means) > 0.5 * ds.y_train.std()       # workers see different ranges of y
    sh_iid = shard(ds.y_train, 4, "iid", seed=0)
    assert np.ptp([ds.y_train[s].mean() for s in sh_iid]) < 0.2 * ds.y_train.std()


@pytest.mark.parametrize("kwargs, match", [
    ({"workers": 0}, "workers"),
    ({"workers": 4, "scheme": "pathological"}, "unknown scheme.*iid, dirichlet"),
    ({"workers": 4, "scheme": "dirichlet", "alpha": 0.0}, "alpha"),
    ({"workers": 4, "scheme": "dirichlet", "alpha": float("inf")}, "alpha"),
    ({"workers": 4, "seed": -3}, "seed"),
    ({"workers": 200}, "min_per_worker"),
])
def test_shard_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        shard(np.arange(100) % 3, **kwargs)


# ------------------------------------------------------------------------------------------------
# counter-based mini-batches

def test_batch_indices_pure_function():
    sh = shard(load("digits").y_train, 4, seed=0)
    a = batch_indices(sh[2], 16, seed=9, step=7, worker=2)
    assert a.dtype == np.int64 and a.shape == (16,)
    assert np.array_equal(a, batch_indices(sh[2].copy(), 16, seed=9, step=7, worker=2))
    assert np.all(np.isin(a, sh[2])) and np.unique(a).size == 16
    for other in ({"step": 8}, {"worker": 3}, {"seed": 10}):
        args = dict(seed=9, step=7, worker=2) | other
        assert not np.array_equal(a, batch_indices(sh[2], 16, **args))
    # order of calls does not matter: no state carried between steps
    later = batch_indices(sh[2], 16, seed=9, step=1000, worker=2)
    assert np.array_equal(a, batch_indices(sh[2], 16, seed=9, step=7, worker=2))
    assert np.array_equal(later, batch_indices(sh[2], 16, seed=9, step=1000, worker=2))


@pytest.mark.parametrize("size, batch", [(40, 8), (37, 8), (10, 10), (5, 1)])
def test_each_sample_once_per_epoch(size, batch):
    shard_ = np.arange(1000, 1000 + size, dtype=np.int64)
    stream = np.concatenate([batch_indices(shard_, batch, 3, t, 1) for t in range(3 * size)])
    epochs = stream[: (len(stream) // size) * size].reshape(-1, size)
    for e in epochs:
        assert np.array_equal(np.sort(e), shard_)
    assert not np.array_equal(epochs[0], epochs[1])          # a fresh permutation every epoch


def test_batch_larger_than_shard():
    with pytest.raises(ValueError, match="larger than worker 0's shard"):
        batch_indices(np.arange(5), 6, 0, 0, 0)
    with pytest.raises(ValueError, match="batch"):
        batch_indices(np.arange(5), 0, 0, 0, 0)
    with pytest.raises(ValueError, match="step"):
        batch_indices(np.arange(5), 2, 0, -1, 0)
    with pytest.raises(ValueError, match="larger"):
        batch_indices(np.array([], dtype=np.int64), 1, 0, 0, 0)


def test_worker_batches_match_each_worker_alone():
    ds = load("digits")
    shards = shard(ds.y_train, 8, "dirichlet", alpha=0.5, seed=1, min_per_worker=32)
    for step in (0, 1, 57):
        x, y = worker_batches(ds, shards, 32, seed=4, step=step)
        assert x.shape == (8, 32, 64) and y.shape == (8, 32)
        assert x.dtype == np.float32 and y.dtype == np.int64
        idx = worker_batch_indices(shards, 32, 4, step)
        for w in range(8):
            own = batch_indices(shards[w], 32, seed=4, step=step, worker=w)
            assert np.array_equal(idx[w], own)
            np.testing.assert_array_equal(x[w], ds.x_train[own])
            np.testing.assert_array_equal(y[w], ds.y_train[own])


@pytest.mark.parametrize("name", ["digits", "mnist1d", "least_squares"])
def test_validation_is_held_out_of_train_and_replaces_test(name):
    full = load(name, seed=3)
    ds = load(name, seed=3, validation=0.2)
    assert ds.eval_split == "validation" and full.eval_split == "test"
    assert ds.n_train + ds.n_test == full.n_train                   # every training row, once
    assert abs(ds.n_test - 0.2 * full.n_train) <= 1
    rows = {r.tobytes() for r in full.x_train}
    fit, val = {r.tobytes() for r in ds.x_train}, {r.tobytes() for r in ds.x_test}
    assert fit | val == rows and not fit & val                      # disjoint; the test split unused
    assert not val & {r.tobytes() for r in full.x_test}
    if ds.task == "classification":                                 # stratified: class shares kept
        share = np.bincount(ds.y_test, minlength=ds.n_classes) / ds.n_test
        np.testing.assert_allclose(share, np.bincount(full.y_train, minlength=ds.n_classes) / full.n_train,
                                   atol=1.5 / ds.n_test * ds.n_classes)
    again = load(name, seed=3, validation=0.2)
    np.testing.assert_array_equal(again.x_test, ds.x_test)
    other = load(name, seed=4, validation=0.2)
    assert not np.array_equal(other.y_test if name != "least_squares" else other.x_test,
                              ds.y_test if name != "least_squares" else ds.x_test)


def test_an_unstratified_validation_split_takes_labels_seen_once():
    """digits with one label made unique: the stratified split refuses it (its error names the data
    set); validation_stratify=False draws the rows plainly, seeded, disjoint from the fit rows; a
    non-bool is refused."""
    from tgsim.data import datasets as dsm

    full = load("digits", seed=3)
    y = full.y_train.copy()
    y[0] = full.n_classes                          # a label seen once
    odd = dataclasses.replace(full, y_train=y, n_classes=full.n_classes + 1)
    with pytest.raises(ValueError, match="cannot hold out"):
        dsm._hold_out(odd, 0.2, 3)
    plain = dsm._hold_out(odd, 0.2, 3, stratify=False)
    assert plain.n_train + plain.n_test == full.n_train and abs(plain.n_test - 0.2 * full.n_train) <= 1
    fit, val = {r.tobytes() for r in plain.x_train}, {r.tobytes() for r in plain.x_test}
    assert not fit & val
    assert np.array_equal(dsm._hold_out(odd, 0.2, 3, stratify=False).x_test, plain.x_test)
    assert not np.array_equal(load("digits", seed=3, validation=0.2, validation_stratify=False).y_test,
                              load("digits", seed=3, validation=0.2).y_test)
    with pytest.raises(ValueError, match="validation_stratify"):
        load("digits", validation=0.2, validation_stratify="no")


@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan"), "x"])
def test_bad_validation_fraction(bad):
    with pytest.raises(ValueError, match="validation"):
        load("digits", validation=bad)


def test_run_on_a_validation_split_writes_validation_rows(tmp_path):
    import csv

    from tgsim.train import config as config_mod
    from tgsim.train.loop import run

    cfg = config_mod.from_dict({"run": {"name": "v", "steps": 4, "eval_every": 2}, "data": {
        "name": "digits", "options": {"validation": 0.25}}, "model": {"name": "softmax"},
        "workers": {"n": 2, "batch": 8}, "codec": {"name": "fp32"}, "exchange": {"mode": "allreduce"}})
    res = run(cfg, quiet=True, results_base=tmp_path)
    assert res.eval_split == "validation"
    splits = {row["split"] for row in csv.DictReader(open(res.out / "metrics.csv"))}
    assert splits == {"train", "validation"}
