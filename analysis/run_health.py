"""`tgsim analyze run-health RUN_DIR`: the signs of a scaler-sharing collapse in a run's metrics.csv.

A run logs, per layer and logged step (tgsim.train.loop._layer_stats):

    scaler_ratio        shared scaler / median worker's own scaler
    noise_to_signal     (Σ_w ||decode_w - g_w||^2 / N^2) / ||aggregate||^2
    zero_grad_fraction  fraction of elements with a zero gradient on every worker's batch

Per layer this reports the first and last logged values, the maximum, and flags:

    dying     zero_grad_fraction >= DEAD_ALERT at DEAD_STEPS consecutive logged steps (most of the
              layer's elements get no gradient on any worker's batch: its ReLU units died): an
              ALERT, the collapse itself; `dead_step` is the step it first fired at
    ratio     scaler_ratio > RATIO_ALERT at any step (one worker's scaler dominates the shared one:
              every other worker's quantization variance grows with it): a warning
    noise     noise_to_signal > NOISE_ALERT at the last logged step (the update is mostly noise): a
              warning; near convergence the mean gradient is small, so a healthy run can show it

and for the run as a whole (`run_alerts`, the rule of tgsim.train.loop.unhealthy, by which `tgsim run`
exits 3):

    skipped   more than run.max_skipped_fraction (config.toml; default 0.1) of run.steps skipped for
              non-finite gradients (run.on_nonfinite = "skip"): an ALERT
    loss      the last evaluation's loss is not finite: an ALERT

Exit status: 0 when no layer or run check raises an ALERT (warnings alone exit 0), 1 when some layer raises an
ALERT (its units died: CI and batch jobs can gate on it), 2 on bad input (no run directory, no
metrics.csv, or one written by an older tgsim without the per-layer columns).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

RATIO_ALERT = 5.0
NOISE_ALERT = 1.0
# Chosen on papers_figures/terngrad_sharing_regimes.py's 180 runs (8 workers, per-worker batch 8-128):
# it fires on every one of the 11 b = 8 runs whose max-sharing collapsed (final accuracy < 0.8) and on
# 7 of the 145 runs that ended above 0.8; the earlier rule (a rise of 0.25 from the first logged step)
# fired on 35 of those 145, fp32 at its best learning rate included. Healthy b = 8 runs stay at 0.25-0.5.
DEAD_ALERT = 0.75
DEAD_STEPS = 2

EXIT_OK, EXIT_ALERT, EXIT_BAD_INPUT = 0, 1, 2

__all__ = ["DEAD_ALERT", "DEAD_STEPS", "EXIT_ALERT", "EXIT_BAD_INPUT", "EXIT_OK", "NOISE_ALERT", "RATIO_ALERT",
           "dead_step", "run_alerts", "run_health"]


def dead_step(steps: np.ndarray, zero: np.ndarray) -> float:
    """The logged step at which `zero` has been >= DEAD_ALERT for DEAD_STEPS consecutive logged
    steps for the first time (nan when it never has)."""
    run = 0
    for s, z in zip(steps, zero):
        run = run + 1 if z >= DEAD_ALERT else 0
        if run >= DEAD_STEPS:
            return float(s)
    return float("nan")


def run_alerts(run_dir) -> list[str]:
    """The run-level ALERTs of the run in `run_dir` (metrics.csv, and config.toml's run.steps and
    run.max_skipped_fraction where it has them): too many skipped steps, a non-finite final evaluation loss."""
    import tomllib

    from tgsim.train.config import RunConfig

    path = Path(run_dir) / "metrics.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path}: not a tgsim run directory (no metrics.csv)")
    m = pd.read_csv(path)
    run_cfg = {}
    cfg_path = Path(run_dir) / "config.toml"
    if cfg_path.is_file():
        run_cfg = tomllib.loads(cfg_path.read_text()).get("run", {})
    model = m[(m["split"] == "train") & (m["layer"] == "model")]
    steps = int(run_cfg.get("steps", model["step"].max() if len(model) else 0))
    limit = float(run_cfg.get("max_skipped_fraction", RunConfig.max_skipped_fraction))
    alerts = []
    skipped = int(pd.to_numeric(model["skipped"], errors="coerce").fillna(0).sum()) if "skipped" in m else 0
    if skipped > limit * steps:
        alerts.append(f"{skipped} of {steps} steps skipped for non-finite gradients (> run.max_skipped_fraction "
                      f"= {limit:g})")
    evals = m[m["split"].isin(("test", "validation"))].sort_values("step")
    if len(evals):
        last = float(evals["loss"].iloc[-1])
        if not np.isfinite(last):
            alerts.append(f"the final {evals['split'].iloc[-1]} loss is {last} (step {int(evals['step'].iloc[-1])})")
    return alerts


def run_health(run_dir) -> pd.DataFrame:
    """One row per layer: first/last/max of the three signs and the alert flags."""
    path = Path(run_dir) / "metrics.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path}: not a tgsim run directory (no metrics.csv)")
    m = pd.read_csv(path)
    need = {"step", "split", "layer", "scaler_ratio", "noise_to_signal", "zero_grad_fraction"}
    if not need <= set(m.columns):
        raise ValueError(f"{path} has no {sorted(need - set(m.columns))}: written by an older tgsim")
    layers = m[(m["split"] == "train") & (m["layer"] != "model")].sort_values("step")
    rows = []
    for layer, d in layers.groupby("layer", sort=False):
        ratio, noise, zero = (d[c].to_numpy(dtype=np.float64) for c in ("scaler_ratio", "noise_to_signal", "zero_grad_fraction"))
        dead = dead_step(d["step"].to_numpy(), zero)
        rows.append(dict(
            layer=layer, steps=int(d["step"].iloc[-1]),
            ratio_first=ratio[0], ratio_max=np.nanmax(ratio) if np.isfinite(ratio).any() else np.nan,
            noise_first=noise[0], noise_last=noise[-1],
            zero_first=zero[0], zero_last=zero[-1], zero_max=np.nanmax(zero) if np.isfinite(zero).any() else np.nan,
            dead_step=dead,
            alert_ratio=bool(np.nanmax(ratio) > RATIO_ALERT) if np.isfinite(ratio).any() else False,
            alert_noise=bool(noise[-1] > NOISE_ALERT),
            alert_dying=bool(np.isfinite(dead))))
    return pd.DataFrame(rows)


def main(args: argparse.Namespace) -> int:
    try:
        df = run_health(args.run_dir)
        alerts = run_alerts(args.run_dir)
    except (FileNotFoundError, ValueError) as e:
        print(f"tgsim analyze run-health: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for a in alerts:
        print(f"ALERT run: {a}")
    if df.empty:
        print(f"{args.run_dir}: no per-layer metrics (run with log_every <= steps)")
        return EXIT_ALERT if alerts else EXIT_OK
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    flagged = df[df[["alert_ratio", "alert_noise", "alert_dying"]].any(axis=1)]
    if flagged.empty and not alerts:
        print("no alert: no layer's shared scaler dominates, the update is not noise-bound, no units die")
    for r in flagged.itertuples():
        if r.alert_dying:
            print(f"ALERT {r.layer}: zero-gradient fraction >= {DEAD_ALERT} from step {r.dead_step:.0f} "
                  f"(max {r.zero_max:.2f}, last {r.zero_last:.2f}): units died")
        warn = [w for w, f in (("scaler_ratio max %.3g > %g" % (r.ratio_max, RATIO_ALERT), r.alert_ratio),
                               ("noise_to_signal %.3g > %g at the end" % (r.noise_last, NOISE_ALERT), r.alert_noise))
                if f]
        if warn:
            print(f"warning {r.layer}: " + "; ".join(warn))
    return EXIT_ALERT if df["alert_dying"].any() or alerts else EXIT_OK


def register_cli(sub) -> None:
    p = sub.add_parser("run-health", help="signs of a scaler-sharing collapse in a run directory's metrics.csv "
                       "(exit 0: healthy, 1: ALERT, 2: bad input)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", help="a `tgsim run` output directory (with metrics.csv)")
    p.set_defaults(func=main)
