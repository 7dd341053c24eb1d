"""Results directory of one run: config.toml, manifest.json, metrics.csv, checkpoints/, params.npz, and
resumes.jsonl when a resume changed the config (one line per such resume: its step and the keys).

Existing results are never overwritten silently: a non-empty directory is only reused by --resume.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import numpy as np
import tomli_w

from tgsim import blas
from tgsim.backend import to_numpy
from tgsim.train.config import Config, config_hash, to_dict

METRIC_COLUMNS = ["step", "split", "layer", "loss", "accuracy", "dist_opt", "bits_up", "bits_down", "lr",
                  "scaler", "inf_l1", "l2sq", "clip_fraction", "scaler_ratio", "noise_to_signal",
                  "zero_grad_fraction", "skipped", "seconds"]


def new_run_dir(base: str | Path, name: str) -> Path:
    """The path `base`/<name>-<UTC time> for a new run named `name`, with a numeric suffix if that
    exists already (not created)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = Path(base) / f"{name}-{stamp}"
    k = 2
    while path.exists():
        path = Path(base) / f"{name}-{stamp}-{k}"
        k += 1
    return path


def prepare(out: Path, cfg: Config, resume: bool) -> None:
    """Create the results directory `out` and write `cfg` to its config.toml; FileExistsError when `out`
    is not empty and this is not a `resume` (a resumed run keeps its config.toml)."""
    if out.exists() and any(out.iterdir()) and not resume:
        raise FileExistsError(f"results directory {out} exists and is not empty; pass --resume to continue "
                              "that run or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    if resume and (out / "config.toml").exists():
        return
    _write_config(out, cfg)


def _write_config(out: Path, cfg: Config) -> None:
    """`cfg` into `out`/config.toml, atomically."""
    cfg_path = out / "config.toml"
    tmp = cfg_path.with_suffix(".tmp")
    tmp.write_bytes(tomli_w.dumps(to_dict(cfg)).encode())
    os.replace(tmp, cfg_path)


def resume_changes(out: Path, cfg: Config, allow: tuple[str, ...] = ()) -> dict[str, tuple]:
    """{key: (stored, new)} of the accepted differences between `out`/config.toml and the config `cfg`
    a resume continues with ({} when there is no config.toml to compare with); ConfigError listing the
    refused ones (tgsim.train.config.resume_changes: RESUME_FREE_KEYS and `allow` are accepted)."""
    from tgsim.train import config as config_mod

    path = Path(out) / "config.toml"
    if not path.is_file():
        return {}
    try:
        stored = config_mod.load(path)
    except config_mod.ConfigError as e:
        raise config_mod.ConfigError(f"--resume: the run's {path} cannot be read back: {e}") from e
    return config_mod.resume_changes(stored, cfg, allow)


def record_resume(out: Path, cfg: Config, step: int, changed: dict[str, tuple]) -> None:
    """A resume at `step` that changed the config: one JSON line in `out`/resumes.jsonl (the step, the
    time and {key: [stored, new]}), and config.toml rewritten to `cfg`, the config now in force."""
    line = {"step": int(step), "written_at": datetime.now(timezone.utc).isoformat(),
            "changed": {k: [a, b] for k, (a, b) in changed.items()}}
    with open(out / "resumes.jsonl", "a") as f:
        f.write(json.dumps(line, default=str) + "\n")
    _write_config(out, cfg)


def _git_commit() -> str:
    src = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def write_manifest(out: Path, cfg: Config, extra: dict) -> None:
    """Write `out`/manifest.json: versions, git commit, seed and config hash of `cfg`, host, CPU, BLAS,
    command line and time, for a torch model (tgsim.torch) torch's version and the settings its bits
    depend on (`tgsim.torch.determinism`), and the fields of `extra`."""
    manifest = {
        "tgsim": _version("tgsim"),
        "python": sys.version.split()[0],
        "versions": {p: _version(p) for p in ("numpy", "scipy", "numba", "pandas", "scikit-learn", "mnist1d",
                                              "cupy-cuda12x", "mpi4py")},
        "git_commit": _git_commit(),
        "seed": cfg.run.seed,
        "config_sha256": config_hash(cfg),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": blas.cpu_model(),
        "cpu_count": os.cpu_count(),
        "blas": blas.describe(),
        "command": sys.argv,
        "written_at": datetime.now(timezone.utc).isoformat(),
        **extra,
    }
    if cfg.model.name == "torch":
        from tgsim.torch import determinism

        manifest["torch"] = determinism("cpu" if cfg.run.backend == "numpy" else "cuda")
    path = out / "manifest.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, path)


class MetricsWriter:
    """Append-only tidy CSV; on resume, rows after the checkpoint's step are dropped first. events: a
    tgsim.train.tensorboard.EventLog that gets every row written (its `row`), flushed and closed
    with the CSV, or None."""

    def __init__(self, path: Path, resume_step: int | None = None, events=None):
        self.path = path
        self.events = events
        if resume_step is not None and path.exists():
            with open(path, newline="") as f:
                rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
            tmp = path.with_suffix(".tmp")
            with open(tmp, "w", newline="") as f:
                w = csv.DictWriter(f, METRIC_COLUMNS)
                w.writeheader()
                w.writerows(rows)
            os.replace(tmp, path)
        new = not path.exists()
        self._f = open(path, "a", newline="")
        self._w = csv.DictWriter(self._f, METRIC_COLUMNS, extrasaction="raise")
        if new:
            self._w.writeheader()
        self._t0 = time.perf_counter()

    def write(self, **row) -> None:
        row = {k: (f"{v:.9g}" if isinstance(v, float) else v) for k, v in row.items()}
        if self.events is not None:
            self.events.row(row)          # the values as the CSV holds them
        self._w.writerow(row)

    def flush(self) -> None:
        self._f.flush()
        if self.events is not None:
            self.events.flush()

    def close(self) -> None:
        self._f.close()
        if self.events is not None:
            self.events.close()


def save_params(out: Path, params: dict) -> None:
    """Write the parameters `params` {name: array} as host arrays to `out`/params.npz (atomically)."""
    path = out / "params.npz"
    tmp = out / "params.tmp.npz"
    np.savez(tmp, **{k: to_numpy(v) for k, v in params.items()})
    os.replace(tmp, path)
