"""`tgsim sweep CONFIG --set key=v1,v2,... [--seeds K] [--out DIR]`: a grid of runs into one directory.

    tgsim sweep demo --set schedule.lr=0.05,0.1 --set codec.name=fp32,terngrad --seeds 2 --out results/lr
    tgsim sweep demo --set schedule.lr=0.05,0.1 --set codec.name=fp32,terngrad --seeds 2 --out results/lr  # again: continues

Each `--set` names a config key (as `tgsim run --set`) and its values, separated by commas outside
quotes and brackets, each parsed as TOML (else a bare string); a key with one value is a fixed
override (in runs.csv too, but not in the runs' names). The grid is every combination of the values, in the order given, the last key varying
fastest, then `--seeds K` seeds run.seed, run.seed + 1, ..., run.seed + K - 1 (fastest of all). Every
point's config is loaded and checked before any run starts: a key that does not exist, a value the
config refuses, a --seeds with a swept run.seed is a ConfigError naming it (one line, exit status 2).

DIR (default results/sweep-<run.name>-<UTC time>) holds

    sweep.json     the grid: the base config, the swept keys and values, the seeds, and per run its
                   directory and its config's sha256 (tgsim.train.config.config_hash)
    runs/NNN-...   one `tgsim run` directory per point, named by its index and values
    runs.csv       one row per finished run (RUN_COLUMNS, the swept keys after `dir`), in grid order,
                   rewritten (atomically) as each run ends

A sweep started again with the same DIR and grid continues: the runs runs.csv lists are kept, a run
directory without its row is resumed from its newest checkpoint (`tgsim run --resume`; from step 0
where it has none), the others start. Every run is a function of its config, so a sweep killed and
continued has each run once, with the bits of an uninterrupted sweep. A DIR holding another grid is
refused (ConfigError). A run that stops on a non-finite gradient (run.on_nonfinite = "raise") is
recorded with its error and the sweep goes on.

Progress: one line per run on stdout as it starts and as it ends (its result, wall time and
directory), so a piped sweep (`| tee log`, a batch job) shows how far it is; each run's own bar is
shown where stdout is a terminal. Exit status: 0; 2 bad input; 3 when a run ended unhealthy or
stopped on an error (its row says which).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
import time
import tomllib
from datetime import datetime, timezone
from pathlib import Path

from tgsim.errors import ConfigError

RUN_COLUMNS = ["index", "dir", "seed", "steps", "eval_split", "test_loss", "test_accuracy", "bits_up", "bits_down",
               "bits", "skipped", "unhealthy", "error", "wall_seconds", "resumed_from"]


def split_values(text: str) -> list[str]:
    """The comma-separated items of `text`, commas inside quotes or brackets kept ("1,[2,3],'a,b'" is
    three items)."""
    items, depth, quote, cur = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
            continue
        cur += ch
    items.append(cur.strip())
    return items


def parse_sets(items: list[str]) -> dict[str, list[str]]:
    """{key: [raw values]} of `--set key=v1,v2,...` items (raw: TOML text, as `tgsim run --set` takes).
    ConfigError for an item without `=`, an empty value or a key given twice."""
    out: dict[str, list[str]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or "." not in key:
            raise ConfigError(f"--set {item!r} must look like section.key=value1,value2,...")
        if key in out:
            raise ConfigError(f"--set {key} is given twice; list its values in one --set")
        values = split_values(raw)
        if not all(values):
            raise ConfigError(f"--set {item!r}: an empty value")
        out[key] = values
    return out


def _parsed(raw: str):
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _slug(key: str, raw: str) -> str:
    text = f"{key.rsplit('.', 1)[-1]}={raw}"
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", text).strip("_")[:40]


def plan(config, sets: dict[str, list[str]], seeds: int | None = None) -> list[dict]:
    """The sweep's runs, in grid order (module docstring): per point {"index", "dir" (relative to the
    sweep directory), "values" {key: parsed value} of the keys --set names, "swept" (those given
    several values: they name the run's directory and its progress lines), "seed", "overrides" (the
    `section.key=value` strings), "config" (the loaded, checked Config), "config_sha256"}. `config`: a
    TOML path or a built-in config's name, or a config dict (its sections' tables). ConfigError
    naming the first point whose config does not load."""
    from tgsim.train import config as config_mod

    if seeds is not None and seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    if seeds is not None and "run.seed" in sets:
        raise ConfigError("--seeds with --set run.seed=...: give the seeds one way")
    if isinstance(config, dict):
        base = config_mod.from_dict(config)
        base_dict = config_mod.to_dict(base)
    else:
        path = config_mod.config_path(config)
        base_dict = tomllib.loads(path.read_text())
        base = config_mod.from_dict(base_dict)
    keys = list(sets)
    swept = [k for k in keys if len(sets[k]) > 1]        # one value: a fixed override, not a column
    seed_list = [base.run.seed + s for s in range(seeds)] if seeds else [None]
    points = []
    for combo in itertools.product(*(sets[k] for k in keys)):
        for seed in seed_list:
            overrides = [f"{k}={v}" for k, v in zip(keys, combo)] + ([f"run.seed={seed}"] if seed is not None else [])
            try:
                cfg = config_mod.from_dict(config_mod.apply_overrides(base_dict, overrides))
            except ConfigError as e:
                raise ConfigError(f"sweep point {', '.join(overrides) or '(the base config)'}: {e}") from e
            i = len(points)
            name = "-".join([f"{i:03d}", *(_slug(k, v) for k, v in zip(keys, combo) if k in swept),
                             *([f"seed={seed}"] if seed is not None else [])])
            values = {k: _parsed(v) for k, v in zip(keys, combo)}
            points.append({"index": i, "dir": f"runs/{name}", "values": values, "swept": swept,
                           "seed": cfg.run.seed, "overrides": overrides, "config": cfg,
                           "config_sha256": config_mod.config_hash(cfg)})
    return points


def _manifest(points: list[dict], config, sets, seeds) -> dict:
    return {"config": str(config) if not isinstance(config, dict) else "(a config dict)", "set": sets, "seeds": seeds,
            "runs": [{"dir": p["dir"], "config_sha256": p["config_sha256"]} for p in points]}


def _open_dir(out: Path, points: list[dict], config, sets, seeds) -> None:
    """Create the sweep directory `out` with sweep.json, or check that the one there holds this grid
    (ConfigError naming the first run that differs)."""
    path = out / "sweep.json"
    mine = _manifest(points, config, sets, seeds)
    if path.is_file():
        theirs = json.loads(path.read_text())
        if theirs.get("runs") != mine["runs"]:
            old = {r["dir"]: r["config_sha256"] for r in theirs.get("runs", [])}
            first = next((r["dir"] for r in mine["runs"] if old.get(r["dir"]) != r["config_sha256"]),
                         "the number of runs")
            raise ConfigError(f"{out} holds another sweep ({first} differs): continue it with its own config, "
                              "--set and --seeds, or choose another --out")
        return
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} exists and is not a sweep directory (no sweep.json): choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**mine, "written_at": datetime.now(timezone.utc).isoformat()}, indent=2,
                              default=str))
    os.replace(tmp, path)


def _read_rows(out: Path) -> dict[str, dict]:
    import pandas as pd

    path = out / "runs.csv"
    if not path.is_file():
        return {}
    return {r["dir"]: r for r in pd.read_csv(path, keep_default_na=False).to_dict("records")}


def _write_rows(out: Path, rows: dict[str, dict], points: list[dict], keys: list[str]) -> Path:
    import pandas as pd

    order = [p["dir"] for p in points if p["dir"] in rows]
    cols = RUN_COLUMNS[:2] + [k for k in keys if k != "run.seed"] + RUN_COLUMNS[2:]
    df = pd.DataFrame([rows[d] for d in order], columns=cols)
    path = out / "runs.csv"
    tmp = out / "runs.csv.tmp"
    df.to_csv(tmp, index=False)
    os.replace(tmp, path)
    return path


def _describe(p: dict) -> str:
    parts = [f"{k}={v}" for k, v in p["values"].items() if k != "run.seed" and k in p["swept"]] + \
        [f"seed={p['seed']}"]
    return " ".join(parts)


def run_sweep(config, sets: dict[str, list[str]] | list[str], seeds: int | None = None, out: str | Path | None = None,
              quiet: bool = False, results_base: str | Path = "results", say=print) -> Path:
    """Run (or continue) the sweep of `config` over `sets` ({key: [raw TOML values]} or `--set` items)
    and `seeds` into `out` (module docstring); returns the sweep directory. ConfigError on bad input,
    before any run starts. `quiet`: no progress lines (`say` prints them) and no per-run bars."""
    from tgsim.errors import is_nonfinite
    from tgsim.train import results
    from tgsim.train.loop import run

    sets = parse_sets(sets) if isinstance(sets, list) else {k: [str(v) for v in vs] for k, vs in sets.items()}
    points = plan(config, sets, seeds)
    if out is None:
        out = results.new_run_dir(results_base, f"sweep-{points[0]['config'].run.name}")
    out = Path(out)
    _open_dir(out, points, config, sets, seeds)
    rows = _read_rows(out)
    keys = list(sets)
    terminal = sys.stdout.isatty()
    say = (lambda *a, **k: None) if quiet else say
    for p in points:
        head = f"run {p['index'] + 1}/{len(points)}  {_describe(p)}"
        if p["dir"] in rows:
            say(f"{head}  done already", flush=True)
            continue
        run_dir = out / p["dir"]
        resume = run_dir.is_dir() and any(run_dir.iterdir())
        say(f"{head}  {'resumed' if resume else 'started'}", flush=True)
        t0 = time.perf_counter()
        row = {"index": p["index"], "dir": p["dir"], **{k: v for k, v in p["values"].items() if k != "run.seed"},
               "seed": p["seed"], "steps": p["config"].run.steps, "error": ""}
        try:
            res = run(p["config"], out=run_dir, resume=resume, quiet=quiet or not terminal)
        except ValueError as e:
            if not is_nonfinite(e):
                raise
            row.update(eval_split="", test_loss=float("nan"), test_accuracy=float("nan"), bits_up=float("nan"),
                       bits_down=float("nan"), bits=float("nan"), skipped=0, unhealthy="",
                       error=" ".join(str(e).split()), resumed_from=0)
            res = None
        if res is not None:
            row.update(eval_split=res.eval_split, test_loss=res.test_loss, test_accuracy=res.test_accuracy,
                       bits_up=res.bits_up, bits_down=res.bits_down, bits=res.bits_up + res.bits_down,
                       skipped=res.skipped, unhealthy=res.unhealthy, resumed_from=res.start_step)
        row["wall_seconds"] = round(time.perf_counter() - t0, 3)
        rows[p["dir"]] = row
        _write_rows(out, rows, points, keys)
        if res is None:
            say(f"{head}  stopped: {row['error']}", flush=True)
        else:
            say(f"{head}  {res.eval_split} loss {res.test_loss:.4f} accuracy {res.test_accuracy:.4f}  bits/worker "
                f"up {res.bits_up:.3e} down {res.bits_down:.3e}  {row['wall_seconds']:.1f} s"
                + (f"  UNHEALTHY: {res.unhealthy}" if res.unhealthy else "") + f"  {run_dir}", flush=True)
    return out


def exit_status(out: Path) -> int:
    """3 when a run of the sweep in `out` ended unhealthy or stopped on an error (runs.csv), else 0."""
    rows = _read_rows(Path(out)).values()
    return 3 if any(str(r.get("unhealthy", "")) or str(r.get("error", "")) for r in rows) else 0


def add_arguments(p) -> None:
    p.add_argument("config", help="CONFIG.toml, or a built-in config's name (demo)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=V1,V2,...",
                   help="a config key and its values (TOML, comma-separated); one value: a fixed override")
    p.add_argument("--seeds", type=int, help="K seeds per point: run.seed, run.seed + 1, ..., run.seed + K - 1")
    p.add_argument("--out", help="the sweep directory (default results/sweep-<name>-<time>); an existing sweep "
                   "there continues")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def cmd(args) -> int:
    """`tgsim sweep`: 0 every run finished healthy; 2 bad input (one line on stderr); 3 a run unhealthy or
    stopped on an error."""
    try:
        out = run_sweep(args.config, args.set, args.seeds, args.out, quiet=args.quiet)
    except (ConfigError, FileExistsError) as e:
        print(f"tgsim sweep: {e}", file=sys.stderr)
        return 2
    print(f"runs.csv: {out / 'runs.csv'}")
    print(f"plot: tgsim plot {out}")
    return exit_status(out)
