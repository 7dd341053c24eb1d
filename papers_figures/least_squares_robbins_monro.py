# %% [markdown]
# # Least squares with Robbins-Monro steps: TernGrad reaches ||w - w*|| < 1e-3 ||w*||
#
# The TernGrad theorem's setting: a strongly convex cost with one minimum, step sizes
# γ_t = γ0 / (1 + t/τ) (Σγ = ∞, Σγ² < ∞). Realizable data (noise 0), condition number 10, dim 32,
# 16 samples per worker; N = 1, 4, 16 workers. Records the first logged step where the relative
# distance to the exact optimum falls below 1e-3. Writes out/least_squares_robbins_monro.csv/.png and
# prints the paths it wrote; a bar on stderr counts the finished runs (hidden under CI=1 or when stderr
# is not a terminal).
#
# Full form, 6 runs of 2000 steps: `python papers_figures/least_squares_robbins_monro.py`; quick form,
# the same code path at 500 steps (TernGrad still crosses 1e-3, near step 400), writing to out/quick/:
# `python papers_figures/least_squares_robbins_monro.py --quick`. Run times: docs/MEASUREMENTS.md.
# TGSIM_JOBS sets the worker processes (default: the number of cores); TGSIM_FIGURES_OUT moves out/.

# %%
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, print_written, train_many, write_csv  # noqa: E402

QUICK, OUT = command_line("Least squares with Robbins-Monro steps: steps until ||w - w*|| < 1e-3 ||w*||.")
STEPS = 500 if QUICK else 2000
BASE = {
    "run": {"name": "lsq", "steps": STEPS, "eval_every": 0, "log_every": 10},
    "data": {"name": "least_squares", "options": {"n": 1024, "dim": 32, "noise": 0.0, "cond": 10.0}},
    "model": {"name": "least_squares"},
    "workers": {"n": 1, "batch": 16, "batch_mode": "per_worker"},
    "codec": {"name": "terngrad", "clip": "none"},
    "optimizer": {"name": "sgd"},
    "schedule": {"name": "robbins_monro", "lr": 0.2, "tau": 1000.0},
}

runs = [(n, codec) for n in (1, 4, 16) for codec in ("terngrad", "fp32")]
res = train_many([(BASE, dict(workers={"n": n}, codec={"name": codec}, run={"name": f"lsq-{codec}-N{n}"}))
                  for n, codec in runs], "least squares")
rows, curves = [], []
for (n, codec), r in zip(runs, res):
    m = pd.read_csv(Path(r["out"]) / "metrics.csv")
    m = m[(m.layer == "model") & m.dist_opt.notna()][["step", "dist_opt"]].assign(workers=n, codec=codec)
    curves.append(m)
    below = m[m.dist_opt < 1e-3].step
    rows.append({"workers": n, "codec": codec, "steps_to_1e-3": int(below.min()) if len(below) else None,
                 "final_dist": r["dist_opt"], "bits_up_per_worker": r["bits_up"]})
    print(rows[-1])
write_csv(pd.DataFrame(rows), OUT / "least_squares_robbins_monro.csv", QUICK)

# %% figure: one colour per N (light to dark, workers = 1 as visible as the rest), one dash per codec
from _theme import log_ticks, save_figure, sns  # noqa: E402

curves = pd.concat(curves, ignore_index=True)
curves["workers N"] = curves.workers.astype(str)
g = sns.relplot(data=curves, x="step", y="dist_opt", hue="workers N", style="codec", kind="line", lw=1.8,
                palette=sns.color_palette("colorblind", 3), height=4, aspect=1.4)
g.set(yscale="log")
log_ticks(g.ax, "y", pd.concat([curves.dist_opt, pd.Series([1e-3])]))     # one panel; the line at 1e-3 shown
g.set_axis_labels("training step (iterations)", "||w - w*|| / ||w*|| (relative distance)")
g.refline(y=1e-3, color="black", lw=1)
reached = {c: ", ".join(str(r["workers"]) for r in rows if r["codec"] == c and r["steps_to_1e-3"] is not None)
           for c in ("terngrad", "fp32")}
g.figure.suptitle(f"Least squares (dim 32, condition 10, noise 0), Robbins-Monro steps 0.2 / (1 + t/1000), {STEPS} "
                  f"steps\nbelow 1e-3 (black line) at N = {reached['terngrad'] or 'none'} (TernGrad), "
                  f"{reached['fp32'] or 'none'} (fp32)", y=1.07, fontsize=10)
png = save_figure(g.figure, OUT / "least_squares_robbins_monro.png", QUICK, dpi=120)
print_written([OUT / "least_squares_robbins_monro.csv", *png])
