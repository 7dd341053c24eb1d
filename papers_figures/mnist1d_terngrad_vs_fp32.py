# %% [markdown]
# # TernGrad vs fp32 on MNIST-1D (1-D convnet, 8 workers) — scaled-down TernGrad Table 1 / Fig. 3
#
# The paper's rule: hyper-parameters are tuned for fp32 and kept for TernGrad. We sweep the
# learning rate for fp32 (seed 0), keep the best, then train fp32 and TernGrad (c = 2.5 clipping)
# with 3 seeds each, and record test accuracy and bits sent. TernGrad runs twice: as in the paper
# (parameter server, scalers shared by a MAX all-reduce) and without scaler sharing (all-gather,
# each message decoded with its own scaler), since sharing roughly doubles the quantizer's
# variance at this per-worker batch (8 samples; see `tgsim analyze sharing`).
# Writes out/mnist1d_terngrad_vs_fp32.csv and .png.

# %%
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import OUT, train  # noqa: E402

STEPS = int(__import__("os").environ.get("TGSIM_STEPS", 3000))
BASE = {
    "run": {"name": "mnist1d", "steps": STEPS, "eval_every": 0, "log_every": 100},
    "data": {"name": "mnist1d"},
    "model": {"name": "convnet1d"},
    "workers": {"n": 8, "batch": 64, "batch_mode": "total"},
    "codec": {"name": "fp32"},
    "exchange": {"mode": "ps"},
    "optimizer": {"name": "momentum", "momentum": 0.9},
    "schedule": {"name": "step", "lr": 0.05, "every": int(STEPS * 0.75), "gamma": 0.1},
}

# %% learning-rate sweep for fp32 only
sweep = []
for lr in (0.01, 0.03, 0.1):
    r = train(BASE, schedule={"lr": lr}, run={"name": f"sweep-lr{lr}"})
    sweep.append({"lr": lr, "test_accuracy": r.test_accuracy})
    print(f"fp32 lr={lr}: test accuracy {r.test_accuracy:.4f}")
best_lr = max(sweep, key=lambda row: row["test_accuracy"])["lr"]
print("best fp32 learning rate:", best_lr)

# %% fp32 and TernGrad, 3 seeds each, same hyper-parameters
rows = []
VARIANTS = {
    "fp32": dict(codec={"name": "fp32"}),
    "terngrad (ps, shared scalers)": dict(codec={"name": "terngrad", "clip": "explicit"},
                                          exchange={"mode": "ps", "share_scalers": True}),
    "terngrad (allgather, own scalers)": dict(codec={"name": "terngrad", "clip": "explicit"},
                                              exchange={"mode": "allgather", "share_scalers": False}),
}
for codec, kw in VARIANTS.items():
    for seed in (0, 1, 2):
        r = train(BASE, **kw, run={"seed": seed, "name": f"{codec.split()[0]}-s{seed}"}, schedule={"lr": best_lr})
        rows.append({"codec": codec, "seed": seed, "lr": best_lr, "steps": STEPS, "test_accuracy": r.test_accuracy,
                     "test_loss": r.test_loss, "bits_up_per_worker": r.bits_up, "bits_down_per_worker": r.bits_down})
        print(rows[-1])
df = pd.DataFrame(rows)
OUT.mkdir(parents=True, exist_ok=True)
df.to_csv(OUT / "mnist1d_terngrad_vs_fp32.csv", index=False)
summary = df.groupby("codec").agg(acc_mean=("test_accuracy", "mean"), acc_std=("test_accuracy", "std"),
                                  bits_up=("bits_up_per_worker", "mean"), bits_down=("bits_down_per_worker", "mean"))
print(summary.to_string())

# %% figure
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import seaborn as sns  # noqa: E402

ax = sns.stripplot(data=df, x="codec", y="test_accuracy", size=8)
ax.tick_params(axis="x", labelrotation=15)
ax.set_title(f"MNIST-1D convnet, 8 workers, lr {best_lr} (tuned for fp32), {STEPS} steps")
ax.figure.savefig(OUT / "mnist1d_terngrad_vs_fp32.png", dpi=120, bbox_inches="tight")
