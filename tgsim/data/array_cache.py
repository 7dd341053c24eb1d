"""An on-disk cache of generated arrays, checked on every read.

    arrays, path = cached("mnist1d-...", make)    # make() -> dict name -> np.ndarray

A generated dataset (MNIST-1D) is a pure function of its arguments and its generator's version, so
the arrays one process generated can be read by the next instead of generated again. `key` must
name everything the arrays depend on (the caller puts the generator's version in it).

Where: ``$TGSIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/tgsim``, else ``~/.cache/tgsim``;
``TGSIM_CACHE_DIR=off`` turns the cache off (every call runs `make`).

File: ``<dir>/<key>.npz`` holding the arrays and ``__sha256__``, the SHA-256 of the arrays' names,
dtypes, shapes and bytes (`digest`). A read whose file is missing, unreadable, not an npz, or whose
digest differs is a miss: the arrays are generated again and the file rewritten (a warning names a
damaged file). A write goes to a temporary file in the same directory and is renamed over the
target (`os.replace`, atomic on POSIX), so concurrent processes (MPI ranks, test workers) never
read half a file; a directory that cannot be written is skipped with a warning, and the arrays are
still returned. Arrays read from the cache equal the generated ones bit for bit (npz stores raw
bytes).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

DIGEST = "__sha256__"
_KEY = re.compile(r"^[A-Za-z0-9._+-]+$")


def cache_dir() -> Path | None:
    """The cache directory (not created here), or None when TGSIM_CACHE_DIR=off."""
    env = os.environ.get("TGSIM_CACHE_DIR")
    if env is not None and env.strip().lower() in ("off", "0", "none", ""):
        return None
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tgsim"


def digest(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 over each array's name, dtype, shape and C-order bytes, names sorted."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _read(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of `path` when it exists and its digest matches; None otherwise (warning if damaged)."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if k != DIGEST}
            stored = str(z[DIGEST]) if DIGEST in z.files else ""
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        warnings.warn(f"tgsim cache: {path} is unreadable ({type(e).__name__}: {e}); generating again",
                      RuntimeWarning, stacklevel=3)
        return None
    if stored != digest(arrays):
        warnings.warn(f"tgsim cache: {path} does not match its checksum; generating again",
                      RuntimeWarning, stacklevel=3)
        return None
    return arrays


def _write(path: Path, arrays: dict[str, np.ndarray]) -> bool:
    """Write atomically (temporary file + os.replace); False, with a warning, when it cannot."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays, **{DIGEST: np.array(digest(arrays))})
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        warnings.warn(f"tgsim cache: cannot write {path} ({e}); set TGSIM_CACHE_DIR to a writable "
                      "directory, or TGSIM_CACHE_DIR=off", RuntimeWarning, stacklevel=3)
        return False
    return True


def cached(key: str, make: Callable[[], dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], Path | None]:
    """The arrays cached under `key`, or `make()`'s, written to the cache for the next call.

    Returns (arrays, path): path is the cache file the arrays were read from or written to, None
    when the cache is off or could not be written. `key`: letters, digits and ``._+-`` only."""
    if not _KEY.match(key):
        raise ValueError(f"cache key {key!r}: use letters, digits and ._+- only")
    where = cache_dir()
    path = None if where is None else where / f"{key}.npz"
    if path is not None:
        hit = _read(path)
        if hit is not None:
            return hit, path
    arrays = make()
    if path is not None and _write(path, arrays):
        return arrays, path
    return arrays, None
