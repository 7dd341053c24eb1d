"""Shared helpers for the figure scripts: where outputs go, and running a config with overrides."""

from __future__ import annotations

import os
from pathlib import Path

from tgsim.train import config as config_mod
from tgsim.train.loop import run

OUT = Path(os.environ.get("TGSIM_FIGURES_OUT", Path(__file__).resolve().parent / "out"))


def train(base: dict, **sections):
    """Run `base` (a config dict) with section overrides, quietly, under OUT/runs."""
    d = {k: dict(v) for k, v in base.items()}
    for name, values in sections.items():
        d[name] = {**d.get(name, {}), **values}
    cfg = config_mod.from_dict(d)
    return run(cfg, quiet=True, results_base=OUT / "runs")
