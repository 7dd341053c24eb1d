"""Shared helpers for the figure scripts: command line, where outputs go, running configs with overrides.

`command_line(description)` parses a script's flags (`--quick`) and returns where it writes: OUT
(`TGSIM_FIGURES_OUT`, default papers_figures/out), or OUT/quick for the quick form, so a quick run never
overwrites a full run's CSV and PNG. `train(base, **sections)` runs one config; `train_many(jobs)` runs a
list of (base, sections) pairs in `TGSIM_JOBS` worker processes (default: the number of cores), each
limited to one BLAS / Numba thread, with a progress bar on stderr. Results are bit-identical to serial
runs: the simulator's bits do not depend on thread counts (tests/test_models.py,
tests/test_numba_kernels.py). The bar is hidden when stderr is not a terminal or when the environment
variable CI is set to a true-ish value (anything but "", "0", "false", "no", "off").
`write_csv(df, path, quick)` writes a script's CSV with a `quick` column (True in the quick form), so
a smoke run's numbers cannot pass for a full run's; its figures carry QUICK_MARK (`_theme.mark_quick`).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from tqdm import tqdm

from tgsim.train import config as config_mod
from tgsim.train.loop import run

OUT = Path(os.environ.get("TGSIM_FIGURES_OUT", Path(__file__).resolve().parent / "out"))
QUICK_OUT = OUT / "quick"
_FALSE = ("", "0", "false", "no", "off")
QUICK_MARK = "QUICK (smoke test, not for reporting)"


def command_line(description: str) -> tuple[bool, Path]:
    """Parse the script's flags; return (quick, the folder its CSV and PNG go to, created if missing).

    Inside a Jupyter kernel the kernel's own arguments are ignored (the full form runs).
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true",
                        help=f"the same code path, shortened to a smoke run; writes to {QUICK_OUT}")
    args = parser.parse_args([] if "ipykernel" in sys.modules else None)
    out = QUICK_OUT if args.quick else OUT
    out.mkdir(parents=True, exist_ok=True)
    return args.quick, out


def print_written(paths: Iterable[Path]) -> None:
    """Print one `wrote PATH` line per output file."""
    for p in paths:
        print(f"wrote {p}")


def write_csv(df, path: Path, quick: bool) -> Path:
    """Write `df` to `path` (no index) with a last column `quick`: True for a --quick run's rows, whose
    numbers come from a smoke run and are not results. Returns `path`."""
    df.drop(columns="quick", errors="ignore").assign(quick=bool(quick)).to_csv(path, index=False)
    return Path(path)


def _merged(base: dict, sections: dict) -> dict:
    """`base` with `sections` merged over it (tgsim.train.config.merge_sections: a codec section that
    names another codec drops base's codec options)."""
    return config_mod.merge_sections(base, sections)


def train(base: dict, **sections):
    """Run `base` (a config dict) with section overrides, quietly, under OUT/runs."""
    return run(config_mod.from_dict(_merged(base, sections)), quiet=True, results_base=OUT / "runs")


def _one_thread() -> None:
    import numba
    from threadpoolctl import threadpool_limits

    numba.set_num_threads(1)
    threadpool_limits(1)


def _job(job):
    """One run's summary; a run whose gradient turned non-finite (it diverged) is a row too, with
    NaN results, `diverged` set to where it happened and no run directory (`out` None)."""
    from tgsim.errors import NonFiniteGradientError

    base, sections = job
    try:
        r = train(base, **sections)
    except NonFiniteGradientError as e:
        nan = float("nan")
        return {"test_accuracy": nan, "test_loss": nan, "eval_split": "", "bits_up": nan, "bits_down": nan,
                "skipped": 0, "dist_opt": nan, "out": None, "diverged": f"{e.layer}, {e.where}"}
    return {"test_accuracy": r.test_accuracy, "test_loss": r.test_loss, "eval_split": r.eval_split,
            "bits_up": r.bits_up, "bits_down": r.bits_down, "skipped": r.skipped, "dist_opt": r.dist_opt,
            "out": str(r.out), "diverged": ""}


def progress_disabled() -> bool | None:
    """True when CI is set to a true-ish value; otherwise None (tqdm then shows the bar only on a terminal)."""
    return True if os.environ.get("CI", "").strip().lower() not in _FALSE else None


def progress(total: int, desc: str) -> tqdm:
    """A progress bar over `total` runs on stderr, hidden under CI or when stderr is not a terminal."""
    return tqdm(total=total, desc=desc, unit="run", file=sys.stderr, disable=progress_disabled(),
                dynamic_ncols=True)


def _collect(results: Iterable[dict], bar: tqdm) -> list[dict]:
    """List `results` in the order they come, advancing `bar` by one per result."""
    out = []
    for r in results:
        out.append(r)
        bar.update()
    return out


def t_half_width(x, level: float = 0.95) -> float:
    """Half-width of the `level` (default 95 %) Student-t interval of the mean of `x` (NaNs dropped; nan
    for < 2 values). The accuracy-gap panels draw 90 %: the interval their one-sided tests at alpha
    0.05 (TOST, non-inferiority) decide on."""
    import numpy as np
    from scipy import stats

    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    q = stats.t.ppf(0.5 + level / 2, len(x) - 1) if len(x) > 1 else float("nan")
    return float(q * x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")


def t_band(x, level: float = 0.90) -> tuple[float, float]:
    """(low, high) of the `level` Student-t interval of the mean of `x` (NaNs dropped), for seaborn's
    `errorbar=`: 90 % by default, the interval the accuracy verdicts' one-sided tests at alpha 0.05 (TOST,
    non-inferiority) decide on, so that a band drawn is the band judged (fig03, fig08, fig11). One
    value: (mean, mean); none: (nan, nan)."""
    import numpy as np

    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    if not len(x):
        return float("nan"), float("nan")
    m, h = float(x.mean()), t_half_width(x, level)
    return (m - h, m + h) if np.isfinite(h) else (m, m)


def collapse_signs(run_dir: str | None) -> dict:
    """A run's scaler-sharing collapse signs from its metrics.csv (`tgsim analyze run-health`):
    the largest shared/median scaler ratio over layers and logged steps, whether any layer's units
    died (run-health's ALERT), and the largest final fraction of all-zero gradient elements
    (NaN / False for a run that diverged and left no directory: `run_dir` None)."""
    import numpy as np

    from tgsim.analysis.run_health import run_health

    if run_dir is None:
        return {"ratio_max": float("nan"), "dying": False, "zero_last_max": float("nan")}
    h = run_health(run_dir)
    ratio = h["ratio_max"].to_numpy(np.float64)
    return {"ratio_max": float(np.nanmax(ratio)) if np.isfinite(ratio).any() else float("nan"),
            "dying": bool(h["alert_dying"].any()), "zero_last_max": float(h["zero_last"].max())}


def sharing_summary(df, keys: list[str]):
    """Per group of `keys` (the last one "variant"): mean, 95 % t half-width and minimum of the test
    accuracy over seeds, the median of the runs' largest shared/median scaler ratio, the runs whose
    units died or that diverged, and the gap of the mean to fp32's in the same setting."""
    summary = df.groupby(keys, sort=False).agg(
        acc_mean=("test_accuracy", "mean"), acc_ci95=("test_accuracy", t_half_width),
        acc_min=("test_accuracy", "min"), ratio_max=("ratio_max", "median"),
        dying_runs=("dying", "sum"), diverged_runs=("diverged", lambda d: int((d != "").sum())),
        runs=("seed", "count")).reset_index()
    fp32 = summary[summary.variant == "fp32"].set_index(keys[:-1]).acc_mean
    summary["gap_to_fp32"] = summary.acc_mean.to_numpy() - fp32.loc[
        list(summary[keys[:-1]].itertuples(index=False, name=None))].to_numpy()
    return summary


def train_many(jobs: list[tuple[dict, dict]], desc: str = "runs") -> list[dict]:
    """Run every (base, sections) job; returns one summary dict per job, in job order.

    A progress bar labelled `desc` counts finished runs; with worker processes it advances as the
    results arrive in job order (`Pool.imap`).
    """
    procs = int(os.environ.get("TGSIM_JOBS", os.cpu_count() or 1))
    with progress(len(jobs), desc) as bar:
        if procs <= 1 or len(jobs) <= 1:
            return _collect(map(_job, jobs), bar)
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(min(procs, len(jobs)), initializer=_one_thread) as pool:
            return _collect(pool.imap(_job, jobs, chunksize=1), bar)


def mnist1d_convnet_config(seed: int = 0, steps: int = 1000, codec: str = "terngrad", workers: int = 8,
                           batch: int = 64, lr: float = 0.05):
    """The MNIST-1D convnet of the figures (8 workers, total batch 64, momentum 0.9, step decay x0.1 at
    75 %, parameter server, TernGrad with c = 2.5 explicit clipping and MAX-shared scalers) as a
    `tgsim.train.config` object, for `tgsim.analysis.common.trajectory` (fig01, fig02)."""
    sections = {"codec": {"name": codec, "clip": "explicit", "clip_factor": 2.5}} if codec == "terngrad" else \
        {"codec": {"name": codec}}
    base = {
        "run": {"name": "figures-convnet", "seed": seed, "steps": steps},
        "data": {"name": "mnist1d"},
        "model": {"name": "convnet1d"},
        "workers": {"n": workers, "batch": batch, "batch_mode": "total"},
        "codec": {"name": "fp32"},
        "exchange": {"mode": "ps"},
        "optimizer": {"name": "momentum", "momentum": 0.9},
        "schedule": {"name": "step", "lr": lr, "every": max(1, int(steps * 0.75)), "gamma": 0.1},
    }
    return config_mod.from_dict(_merged(base, sections))


COMPARE_CSV = {"variance": "variance.csv", "speedup": "speedup.csv", "bits": "bits.csv"}
# methods the full form runs beside the command's defaults (every registered codec): PQASGD for
# fig08's claims of Jiang & Agrawal (TernGrad averaged every 4 steps)
EXTRA_METHODS = {"bits": ("terngrad+pqasgd",)}


def compare_outputs(what: str, quick: bool) -> Path:
    """The folder of `tgsim compare WHAT` (variance, speedup, bits) under OUT (quick: OUT/quick), running
    it there (its --quick form when `quick`, with compare_cli's parameters) unless its CSV is already
    there; TGSIM_FIGURES_RERUN=1 runs it again anyway. Several figures read one run. The full form
    runs EXTRA_METHODS[what] beside the default methods."""
    out = (QUICK_OUT if quick else OUT) / f"compare-{what}"
    if not (out / COMPARE_CSV[what]).exists() or os.environ.get("TGSIM_FIGURES_RERUN", "").strip().lower() not in _FALSE:
        # its own process: the full forms use a spawn process pool, which would re-run this script
        import subprocess

        from tgsim.analysis.common import default_methods

        code = "import sys; from tgsim.cli import main; sys.exit(main(sys.argv[1:]))"
        extra = [] if quick or what not in EXTRA_METHODS else \
            ["--methods", ",".join((*default_methods(), *EXTRA_METHODS[what]))]
        subprocess.run([sys.executable, "-c", code, "compare", what, "--out", str(out),
                        *(["--quick"] if quick else extra)], check=True)
    return out


def paper_rule(df):
    """Rows of the paper's rule (every method at fp32's tuned learning rate) when the CSV has a `rule`
    column (compare bits / speedup write fp32-lr and own-lr rows); all rows otherwise."""
    return df[df["rule"] == "fp32-lr"] if "rule" in df.columns and (df["rule"] == "fp32-lr").any() else df


def coding_of(codec_options) -> str | None:
    """The `coding` option named in a compare CSV's codec_options cell ("key=value;...",
    tgsim.analysis.common.codec_options): which wire coding the codec ran with (QSGD's "paper" Elias
    coding of Alistarh et al. §3.2, "elias", "fixed"); None when the cell names none (NaN, or a CSV
    written before the column existed)."""
    if not isinstance(codec_options, str):
        return None
    return dict(item.split("=", 1) for item in codec_options.split(";") if "=" in item).get("coding")


def with_coding(label: str, codec_options) -> str:
    """`label` followed by " (CODING coding)" when the row's codec_options name a coding (`coding_of`),
    and by " (SHARING sharing)" when they name a scaler-sharing mode (TernGrad's max / mean / none),
    with ", whole-model scaler" for TernGrad's scope=model."""
    opts = dict(item.split("=", 1) for item in codec_options.split(";") if "=" in item) \
        if isinstance(codec_options, str) else {}
    coding, sharing = coding_of(codec_options), opts.get("sharing")
    extra = ([f"{coding} coding"] if coding else []) + ([f"{sharing.upper()} sharing"] if sharing else []) + \
        (["whole-model scaler"] if opts.get("scope") == "model" else [])
    return f"{label} ({', '.join(extra)})" if extra else label
