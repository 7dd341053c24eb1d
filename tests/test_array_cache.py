"""tgsim.data.array_cache: the on-disk cache of generated arrays (MNIST-1D's), checked on every read.

A hit returns the bits `make` returned; a missing, truncated, altered or foreign file is a miss that
regenerates and rewrites it (with a warning for a damaged one); an unwritable directory still returns
the arrays; TGSIM_CACHE_DIR=off never touches the disk. MNIST-1D loaded through the cache equals a
fresh generation bit for bit, and its key separates generator seeds and sizes."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tgsim.data import array_cache, load
from tgsim.data import datasets as datasets_mod


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("TGSIM_CACHE_DIR", str(d))
    return d


def _maker(calls):
    def make():
        calls.append(1)
        rng = np.random.default_rng(len(calls))     # a second call would give other bits
        return {"x": rng.standard_normal((5, 3)).astype(np.float32), "y": np.arange(5, dtype=np.int64)}
    return make


def test_a_hit_returns_the_bits_make_returned(cache):
    calls = []
    first, path = array_cache.cached("k-1", _maker(calls))
    second, path2 = array_cache.cached("k-1", _maker(calls))
    assert calls == [1] and path == path2 == cache / "k-1.npz"
    for k in first:
        assert first[k].dtype == second[k].dtype and first[k].tobytes() == second[k].tobytes()
    assert sorted(p.name for p in cache.iterdir()) == ["k-1.npz"]      # no temporary file left


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "no-digest"])
def test_a_damaged_file_is_regenerated_and_rewritten(cache, damage):
    calls = []
    good, path = array_cache.cached("k-2", _maker(calls))
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":     # one byte inside x's data: the zip still reads, the digest differs
        x_bytes = good["x"].tobytes()
        at = raw.index(x_bytes[:8]) + 3
        path.write_bytes(raw[:at] + bytes([raw[at] ^ 0x40]) + raw[at + 1:])
    elif damage == "garbage":
        path.write_bytes(b"not an npz at all")
    else:
        np.savez(path, **good)
    with pytest.warns(RuntimeWarning, match="k-2.npz"):
        again, _ = array_cache.cached("k-2", _maker(calls))
    assert len(calls) == 2                                   # generated again
    assert again["x"].tobytes() != good["x"].tobytes()       # (the maker's second call differs)
    third, _ = array_cache.cached("k-2", _maker(calls))      # and the rewritten file is a hit
    assert len(calls) == 2 and third["x"].tobytes() == again["x"].tobytes()


def test_an_unwritable_directory_still_returns_the_arrays(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the directory should be")
    monkeypatch.setenv("TGSIM_CACHE_DIR", str(blocker / "sub"))
    calls = []
    with pytest.warns(RuntimeWarning, match="cannot write"):
        arrays, path = array_cache.cached("k-3", _maker(calls))
    assert path is None and calls == [1] and arrays["y"].tolist() == [0, 1, 2, 3, 4]


def test_off_never_touches_the_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("TGSIM_CACHE_DIR", "off")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    calls = []
    for _ in range(2):
        _, path = array_cache.cached("k-4", _maker(calls))
        assert path is None
    assert calls == [1, 1] and list(tmp_path.iterdir()) == []


def test_default_directory_and_bad_keys(tmp_path, monkeypatch):
    monkeypatch.delenv("TGSIM_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert array_cache.cache_dir() == tmp_path / "xdg" / "tgsim"
    for key in ("../escape", "a/b", "", "sp ace"):
        with pytest.raises(ValueError, match="cache key"):
            array_cache.cached(key, dict)


def test_mnist1d_through_the_cache_equals_a_fresh_generation(cache):
    """Cold cache (generated, written), then a new in-memory state (read from disk): both equal
    `_mnist1d_generate`'s arrays bit for bit; other sizes and generator seeds are other files."""
    fresh = datasets_mod._mnist1d_generate(1000, 42)
    seen = []
    for _ in range(2):
        datasets_mod._mnist1d_arrays.cache_clear()
        ds = load("mnist1d", num_samples=1000)
        seen.append(ds)
        assert ds.meta["cache"] is not None and os.path.dirname(ds.meta["cache"]) == str(cache)
        for got, k in ((ds.x_train, "x"), (ds.y_train, "y"), (ds.x_test, "x_test"), (ds.y_test, "y_test")):
            assert got.dtype == fresh[k].dtype and got.tobytes() == fresh[k].tobytes(), k
    datasets_mod._mnist1d_arrays.cache_clear()
    load("mnist1d", num_samples=1000, generator_seed=7)
    load("mnist1d", num_samples=500)
    datasets_mod._mnist1d_arrays.cache_clear()
    assert len(list(cache.glob("mnist1d-*.npz"))) == 3
    assert len({p.name for p in cache.glob("*n1000-seed42.npz")}) == 1
