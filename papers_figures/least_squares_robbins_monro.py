# %% [markdown]
# # Least squares with Robbins-Monro steps: TernGrad reaches ||w - w*|| < 1e-3 ||w*||
#
# The TernGrad theorem's setting: a strongly convex cost with one minimum, step sizes
# γ_t = γ0 / (1 + t/τ) (Σγ = ∞, Σγ² < ∞). Realizable data (noise 0), condition number 10, dim 32,
# 16 samples per worker; N = 1, 4, 16 workers. Records the first logged step where the relative
# distance to the exact optimum falls below 1e-3. Writes out/least_squares_robbins_monro.csv/.png.

# %%
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import OUT, train  # noqa: E402

BASE = {
    "run": {"name": "lsq", "steps": 2000, "eval_every": 0, "log_every": 10},
    "data": {"name": "least_squares", "options": {"n": 1024, "dim": 32, "noise": 0.0, "cond": 10.0}},
    "model": {"name": "least_squares"},
    "workers": {"n": 1, "batch": 16, "batch_mode": "per_worker"},
    "codec": {"name": "terngrad", "clip": "none"},
    "optimizer": {"name": "sgd"},
    "schedule": {"name": "robbins_monro", "lr": 0.2, "tau": 1000.0},
}

rows, curves = [], []
for n in (1, 4, 16):
    for codec in ("terngrad", "fp32"):
        r = train(BASE, workers={"n": n}, codec={"name": codec}, run={"name": f"lsq-{codec}-N{n}"})
        m = pd.read_csv(r.out / "metrics.csv")
        m = m[(m.layer == "model") & m.dist_opt.notna()][["step", "dist_opt"]].assign(workers=n, codec=codec)
        curves.append(m)
        below = m[m.dist_opt < 1e-3].step
        rows.append({"workers": n, "codec": codec, "steps_to_1e-3": int(below.min()) if len(below) else None,
                     "final_dist": r.dist_opt, "bits_up_per_worker": r.bits_up})
        print(rows[-1])
OUT.mkdir(parents=True, exist_ok=True)
pd.DataFrame(rows).to_csv(OUT / "least_squares_robbins_monro.csv", index=False)

# %% figure
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import seaborn as sns  # noqa: E402

g = sns.relplot(data=pd.concat(curves, ignore_index=True), x="step", y="dist_opt", hue="workers", style="codec", kind="line")
g.set(yscale="log", ylabel="||w - w*|| / ||w*||")
g.refline(y=1e-3)
g.savefig(OUT / "least_squares_robbins_monro.png", dpi=120)
