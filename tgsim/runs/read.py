"""Read run directories (`tgsim run`, the MPI trainer's rank 0, a torch model's run, a sweep's runs) for
`tgsim plot` and a notebook.

    runs = read_runs(["results/a", "results/sweep-x"])   # a sweep directory stands for all its runs
    labels(runs)                                          # what differs in their configs, per run

A run directory is one with config.toml and metrics.csv (README "A run"); a sweep directory holds
runs.csv and the runs it lists (tgsim.runs.sweep). Anything else is a RunDirError naming the
directory; so is a set of runs of different models or data sets (RUN_IDENTITY), which one figure
cannot compare.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from tgsim.errors import RunDirError

# The config keys two runs must share to be drawn in one figure: the same network on the same data.
RUN_IDENTITY = ("model.name", "model.options", "data.name")
# Keys left out of a run's label unless nothing else differs: labels of the run, not of its training.
LABEL_QUIET = ("run.name",)
LABEL_TAKEN = ("name", "options")   # tails too vague to stand for their key
LABEL_KEYS_SHOWN = 4          # a label names at most this many differing keys ("..." after them)


@dataclass
class RunData:
    """One run directory, read: `path`; `config` {"section.key": value} of its config.toml; `metrics`
    its metrics.csv; `layer_sizes` {layer: elements} from params.npz (or the newest checkpoint's
    params; {} when neither is there); `run_alerts` the run-level ALERTs and `dead` {layer: step}
    the layers whose units died (tgsim.analysis.run_health)."""

    path: Path
    config: dict
    metrics: pd.DataFrame
    layer_sizes: dict = field(default_factory=dict)
    run_alerts: list = field(default_factory=list)
    dead: dict = field(default_factory=dict)

    @property
    def train(self) -> pd.DataFrame:
        """The model rows of the training split: one per step (loss, bits_up, bits_down, skipped, ...),
        with `bits` = bits up + down per worker summed over the steps so far."""
        m = self.metrics
        t = m[(m["split"] == "train") & (m["layer"] == "model")].sort_values("step").copy()
        t["bits"] = (t["bits_up"].fillna(0) + t["bits_down"].fillna(0)).cumsum()
        return t

    @property
    def evals(self) -> pd.DataFrame:
        """The evaluation rows (split test or validation), with `bits` at their step."""
        m = self.metrics
        e = m[m["split"].isin(("test", "validation")) & (m["layer"] == "model")].sort_values("step")
        t = self.train[["step", "bits"]]
        return e.drop(columns="bits", errors="ignore").merge(t, on="step", how="left")

    @property
    def layers(self) -> pd.DataFrame:
        """The per-layer rows of the training split, with `rms` = sqrt(l2sq / elements), the per-element
        root mean square of the layer's gradient (its σ where the gradient's mean is 0; nan where the
        size is unknown)."""
        m = self.metrics
        lay = m[(m["split"] == "train") & (m["layer"] != "model")].sort_values("step").copy()
        sizes = lay["layer"].map(self.layer_sizes).astype(float)
        lay["rms"] = np.sqrt(lay["l2sq"].astype(float) / sizes)
        return lay


def _flat_config(path: Path) -> dict:
    try:
        d = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise RunDirError(f"{path}: cannot be read as a tgsim config: {e}") from e
    return {f"{sec}.{k}": v for sec, keys in d.items() if isinstance(keys, dict) for k, v in keys.items()}


def _layer_sizes(run_dir: Path) -> dict:
    """{layer: elements} of the run's parameters: params.npz, else the newest checkpoint that reads
    (tgsim.train.checkpoint); {} when none can be read."""
    import zipfile

    from tgsim.train import checkpoint

    try:
        with np.load(run_dir / "params.npz", allow_pickle=False) as z:
            return {k: int(z[k].size) for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile):
        pass
    for path in reversed(checkpoint.list_checkpoints(run_dir / "checkpoints")):
        try:
            return {k: int(np.size(v)) for k, v in checkpoint.read(path)["params"].items()}
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):
            continue
    return {}


def read_run(path: str | Path) -> RunData:
    """The run in directory `path` (config.toml, metrics.csv; params.npz where present) with its
    health (tgsim.analysis.run_health). RunDirError when `path` is not a run directory."""
    from tgsim.analysis import run_health

    p = Path(path)
    if not p.is_dir():
        raise RunDirError(f"{p} is not a directory (a tgsim run directory holds config.toml and metrics.csv)")
    missing = [f for f in ("config.toml", "metrics.csv") if not (p / f).is_file()]
    if missing:
        raise RunDirError(f"{p} is not a tgsim run directory: no {' and no '.join(missing)}")
    try:
        metrics = pd.read_csv(p / "metrics.csv")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise RunDirError(f"{p / 'metrics.csv'} cannot be read: {e}") from e
    need = {"step", "split", "layer", "loss", "accuracy", "bits_up", "bits_down", "skipped"}
    if not need <= set(metrics.columns):
        raise RunDirError(f"{p / 'metrics.csv'} lacks the columns {sorted(need - set(metrics.columns))}: "
                          "not written by tgsim run")
    run = RunData(p, _flat_config(p / "config.toml"), metrics, _layer_sizes(p))
    run.run_alerts = run_health.run_alerts(p)
    if {"scaler_ratio", "noise_to_signal", "zero_grad_fraction"} <= set(metrics.columns):
        health = run_health.run_health(p)
        if len(health):
            run.dead = {r.layer: float(r.dead_step) for r in health.itertuples() if r.alert_dying}
    return run


def expand(paths) -> list[Path]:
    """The run directories `paths` name: a run directory itself, or for a sweep directory (with
    runs.csv) each run it lists, in its order. RunDirError for a sweep whose runs.csv lists none."""
    out = []
    for path in map(Path, paths):
        table = path / "runs.csv"
        if table.is_file() and not (path / "metrics.csv").is_file():
            rows = pd.read_csv(table)
            if "dir" not in rows.columns or not len(rows):
                raise RunDirError(f"{table} lists no runs (a sweep that has finished none yet?)")
            out += [path / d for d in rows["dir"]]
        else:
            out.append(path)
    return out


def same_model(runs: list[RunData]) -> None:
    """RunDirError when `runs` differ in a key of RUN_IDENTITY (another model or data set), naming the
    key, both values and both directories."""
    first = runs[0]
    for r in runs[1:]:
        for key in RUN_IDENTITY:
            a, b = first.config.get(key), r.config.get(key)
            if a != b:
                raise RunDirError(f"runs of different models cannot be overlaid: {key} is {_show(a)} in "
                                  f"{first.path} but {_show(b)} in {r.path}")


def read_runs(paths) -> list[RunData]:
    """Every run `paths` name (`expand`), read (`read_run`) and checked to be of one model (`same_model`).
    RunDirError on the first problem."""
    dirs = expand(paths)
    if not dirs:
        raise RunDirError("no run directory given")
    runs = [read_run(d) for d in dirs]
    same_model(runs)
    return runs


def _show(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return str(v)


def differing_keys(configs: list[dict]) -> list[str]:
    """The config keys whose values are not the same in all `configs` ({"section.key": value} each),
    in config order; the keys of LABEL_QUIET only when nothing else differs. Where codec.name
    differs, a codec option key only one codec has is left out (the codec's name says it)."""
    keys = list(dict.fromkeys(k for c in configs for k in c))
    diff = [k for k in keys if len({_show(c.get(k)) for c in configs}) > 1]
    if "codec.name" in diff:
        shared = set.intersection(*(set(c) for c in configs))
        diff = [k for k in diff if not k.startswith("codec.") or k in shared or k == "codec.name"
                or len({_show(c[k]) for c in configs if k in c}) > 1]
    loud = [k for k in diff if k not in LABEL_QUIET]
    return loud or diff


def labels(runs: list[RunData]) -> list[str]:
    """One label per run: the keys that differ between the runs' configs as `key=value` (at most
    LABEL_KEYS_SHOWN; the section left out where the rest names the key alone, `section.name` shown
    as `section`, e.g. codec=fp32), each run's own values; a
    single run, or runs whose configs are equal, by their directories' names."""
    keys = differing_keys([r.config for r in runs]) if len(runs) > 1 else []
    if not keys:
        names = [r.path.name for r in runs]
        return names if len(set(names)) == len(names) else [str(r.path) for r in runs]
    tails = [k.split(".")[0] if k.endswith(".name") else k.split(".", 1)[1] for k in keys]   # codec.name: codec
    short = {k: (t if tails.count(t) == 1 and t not in LABEL_TAKEN else k) for k, t in zip(keys, tails)}
    out = []
    for r in runs:
        parts = [f"{short[k]}={_show(r.config[k])}" for k in keys if k in r.config]
        text = ", ".join(parts[:LABEL_KEYS_SHOWN]) + (", ..." if len(parts) > LABEL_KEYS_SHOWN else "")
        out.append(text or r.path.name)
    return out
