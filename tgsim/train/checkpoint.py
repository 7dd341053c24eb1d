"""Atomic, checksummed checkpoints: one file per checkpoint, written to a temp file and renamed.

File = npz bytes + sha256(npz bytes) + b"TGCK". On resume (`latest_good`):

  a corrupt checkpoint (truncated, digest mismatch, unreadable) with an older good one: one plain line
      on stderr, `tgsim: skipping checkpoint PATH: reason`, and the newest good one is used;
  checkpoints, none of them usable: NoUsableCheckpointError (a ConfigError: `tgsim run` prints it in
      one line and exits 2) naming each file and why; never a silent restart from step 0;
  no checkpoint at all (the run was stopped before its first one, or checkpoint_every = 0): one plain
      line on stderr and the run starts again from step 0 (nothing saved was lost).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import sys
import zipfile
from pathlib import Path

import numpy as np

from tgsim.backend import to_numpy
from tgsim.errors import ConfigError

_TRAILER = b"TGCK"
_NAME = re.compile(r"^ckpt-(\d{8})\.tgck$")


class NoUsableCheckpointError(ConfigError):
    """--resume found checkpoint files and none of them can be read; the message names each and why."""


def flatten(tree, prefix: str = "") -> dict[str, np.ndarray]:
    """{'a': {'b': x}} -> {'a/b': x}: the nested dict `tree` as one level of host arrays, each key
    prefixed with `prefix` (dict keys must not contain '/')."""
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        else:
            out[key] = to_numpy(v)          # host arrays: a checkpoint resumes on a CPU or a GPU
    return out


def unflatten(flat: dict[str, np.ndarray]) -> dict:
    """{'a/b': x} -> {'a': {'b': x}}: the nested dict of the flat dict `flat` (`flatten` undone)."""
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
    """Write `state` (nested dict of arrays) as checkpoint `step` in `directory` (atomically, with a
    sha256 trailer); keep the newest `keep` files. Returns the checkpoint's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, **flatten(state))
    data = buf.getvalue()
    path = path_of(directory, step)
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


def path_of(directory: str | Path, step: int) -> Path:
    """The checkpoint file of `step` in `directory` (ckpt-<step, 8 digits>.tgck)."""
    return Path(directory) / f"ckpt-{int(step):08d}.tgck"


def list_checkpoints(directory: str | Path) -> list[Path]:
    """The checkpoint files (ckpt-<step>.tgck) in `directory`, oldest step first; [] when it does not exist."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.match(p.name))


def read(path: str | Path) -> dict:
    """The state (nested dict of arrays) of the checkpoint file `path`; ValueError if truncated or its
    checksum does not match."""
    raw = Path(path).read_bytes()
    if len(raw) < 36 or raw[-4:] != _TRAILER:
        raise ValueError(f"checkpoint {path} is truncated (no trailer)")
    data, digest = raw[:-36], raw[-36:-4]
    if hashlib.sha256(data).digest() != digest:
        raise ValueError(f"checkpoint {path} is corrupt (sha256 mismatch)")
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return unflatten({k: z[k] for k in z.files})


def _why(path: Path, e: Exception) -> str:
    """The reason a checkpoint cannot be used, without repeating its path."""
    text = str(e).replace(f"checkpoint {path} is ", "").replace(str(path), "").strip(" :")
    return text or type(e).__name__


def latest_good(directory: str | Path, say=None) -> tuple[int, dict] | None:
    """(step, state) of the newest checkpoint that verifies; None when `directory` holds no checkpoint.

    Each corrupt one skipped for an older good one is one line to `say` (default: stderr,
    `tgsim: skipping checkpoint PATH: reason`); NoUsableCheckpointError names every file and why when
    none verifies; no checkpoint at all is also said in one line (the caller starts from step 0)."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    paths = list_checkpoints(directory)
    if not paths:
        say(f"tgsim: no checkpoint in {directory} (the run stopped before its first one, or "
            "run.checkpoint_every = 0): starting from step 0")
        return None
    bad = []
    for path in reversed(paths):
        try:
            state = read(path)
        except (ValueError, OSError, zipfile.BadZipFile) as e:
            bad.append((path, _why(path, e)))
            continue
        for p, why in bad:
            say(f"tgsim: skipping checkpoint {p}: {why}")
        return int(_NAME.match(path.name).group(1)), state
    raise NoUsableCheckpointError(
        f"--resume: no usable checkpoint in {directory}: " + "; ".join(f"{p.name}: {why}" for p, why in bad)
        + " (refusing to restart from step 0; move the checkpoints away to start the run over)")
