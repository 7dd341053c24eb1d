"""Atomic, checksummed checkpoints: one file per checkpoint, written to a temp file and renamed.

File = npz bytes + sha256(npz bytes) + b"TGCK". A checkpoint whose digest does not match is named
as corrupt and the previous good one is used.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import warnings
from pathlib import Path

import numpy as np

from tgsim.backend import to_numpy

_TRAILER = b"TGCK"
_NAME = re.compile(r"^ckpt-(\d{8})\.tgck$")


def flatten(tree, prefix: str = "") -> dict[str, np.ndarray]:
    """{'a': {'b': x}} -> {'a/b': x} (dict keys must not contain '/')."""
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        else:
            out[key] = to_numpy(v)          # host arrays: a checkpoint resumes on a CPU or a GPU
    return out


def unflatten(flat: dict[str, np.ndarray]) -> dict:
    tree: dict = {}
    for key, v in flat.items():
        node = tree
        *parents, leaf = key.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return tree


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(directory: str | Path, step: int, state: dict, keep: int = 3) -> Path:
    """Write state (nested dict of arrays) as checkpoint `step`; keep the newest `keep` files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, **flatten(state))
    data = buf.getvalue()
    path = directory / f"ckpt-{step:08d}.tgck"
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(data + hashlib.sha256(data).digest() + _TRAILER)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(directory)
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def list_checkpoints(directory: str | Path) -> list[Path]:
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.match(p.name))


def read(path: str | Path) -> dict:
    """Load one checkpoint; ValueError if truncated or its checksum does not match."""
    raw = Path(path).read_bytes()
    if len(raw) < 36 or raw[-4:] != _TRAILER:
        raise ValueError(f"checkpoint {path} is truncated (no trailer)")
    data, digest = raw[:-36], raw[-36:-4]
    if hashlib.sha256(data).digest() != digest:
        raise ValueError(f"checkpoint {path} is corrupt (sha256 mismatch)")
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return unflatten({k: z[k] for k in z.files})


def latest_good(directory: str | Path) -> tuple[int, dict] | None:
    """(step, state) of the newest checkpoint that verifies, warning about each corrupt one skipped."""
    for path in reversed(list_checkpoints(directory)):
        try:
            state = read(path)
        except ValueError as e:
            warnings.warn(f"{e}; falling back to the previous checkpoint", stacklevel=2)
            continue
        return int(_NAME.match(path.name).group(1)), state
    return None
