"""tgsim.data's "pychars": next-byte windows of the Python standard library's own source. The windows
and targets against the corpus read here independently (the files under sysconfig's stdlib, the
SHA-256 and Python version in meta), the block split (no window or target of the test split inside a
training block), determinism per seed, loading with the network refused, and bad arguments."""

from __future__ import annotations

import hashlib
import platform
import socket
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from tgsim.data import datasets
from tgsim.data.datasets import PYCHARS_BLOCK, PYCHARS_MODULES, load

SMALL = dict(num_samples=3000, context=16)


def _corpus() -> bytes:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return b"".join((stdlib / name).read_bytes() for name in PYCHARS_MODULES)


def test_windows_are_the_corpus_bytes_and_the_next_byte():
    """x: context tokens, y: the token after them; mapped back through meta's vocab they are the
    corpus' bytes at each window's offset; shapes, dtypes, counts, vocabulary and meta as documented."""
    ds = load("pychars", 3, **SMALL)
    corpus = np.frombuffer(_corpus(), np.uint8)
    meta = ds.meta
    assert meta["sha256"] == hashlib.sha256(corpus.tobytes()).hexdigest()
    assert meta["python_version"] == platform.python_version()
    assert meta["modules"] == list(PYCHARS_MODULES) == sorted(PYCHARS_MODULES)
    assert meta["vocab"] == sorted(set(corpus.tolist())) and ds.n_classes == len(meta["vocab"])
    assert (ds.n_train, ds.n_test) == (2400, 600) and ds.feature_shape == (16,)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    vocab = np.asarray(meta["vocab"])
    for part in ("train", "test"):
        x, y = getattr(ds, f"x_{part}"), getattr(ds, f"y_{part}")
        starts = meta[f"{part}_starts"]
        assert np.array_equal(x, np.round(x)) and x.min() >= 0 and x.max() < ds.n_classes
        assert len(np.unique(starts)) == len(starts)                # drawn without replacement
        assert np.array_equal(vocab[x.astype(np.int64)], corpus[starts[:, None] + np.arange(16)])
        assert np.array_equal(vocab[y], corpus[starts + 16])
    p = np.bincount(ds.y_train, minlength=ds.n_classes) / ds.n_train
    assert meta["unigram_loss"] == pytest.approx(-np.mean(np.log(p[ds.y_train])), rel=1e-12)


def test_split_is_by_block_and_keyed_by_seed():
    """Every window and its target lie inside one block; no block holds both training and test
    windows; the same seed gives the same arrays, another seed other test blocks."""
    a, b, c = load("pychars", 0, **SMALL), load("pychars", 0, **SMALL), load("pychars", 1, **SMALL)
    for part in ("x_train", "y_train", "x_test", "y_test"):
        assert np.array_equal(getattr(a, part), getattr(b, part)), part
    blocks = {}
    for part in ("train", "test"):
        s = a.meta[f"{part}_starts"]
        assert np.array_equal(s // PYCHARS_BLOCK, (s + 16) // PYCHARS_BLOCK), part
        blocks[part] = set((s // PYCHARS_BLOCK).tolist())
    assert not blocks["train"] & blocks["test"]
    assert set((c.meta["test_starts"] // PYCHARS_BLOCK).tolist()) != blocks["test"]


def test_loads_without_the_network(monkeypatch):
    """With every socket refused, pychars still loads (its corpus read again from disk)."""
    def refuse(*args, **kwargs):
        raise OSError("network refused by the test")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    datasets._pychars_corpus.cache_clear()
    ds = load("pychars", 0, num_samples=200, context=8)
    assert ds.n_train == 160 and ds.feature_shape == (8,)


@pytest.mark.parametrize("kwargs,match", [
    (dict(context=PYCHARS_BLOCK), "context must be <"),
    (dict(context=0), "context must be >= 1"),
    (dict(num_samples=10**8), "windows asked"),
    (dict(test_fraction=1.0), "test_fraction must be in"),
    (dict(num_samples=3, test_fraction=0.1), "empty split"),
    (dict(vocab=3), "unknown keyword"),
])
def test_bad_arguments_say_what_is_wrong(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load("pychars", 0, **kwargs)


def test_a_missing_module_file_is_named(monkeypatch, tmp_path):
    """A Python installation without the standard library's source: the error names the file."""
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: {"stdlib": str(tmp_path)})
    datasets._pychars_corpus.cache_clear()
    with pytest.raises(ValueError, match=PYCHARS_MODULES[0]):
        load("pychars", 0, **SMALL)
    datasets._pychars_corpus.cache_clear()
