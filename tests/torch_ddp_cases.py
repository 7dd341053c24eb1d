"""What the DDP hook's test files share (tests/test_torch_ddp.py over mpi4py, tests/test_torch_dist_comm.py
over torch.distributed): the driver every rank runs, the codec configs checked bit for bit against the
simulator, DDP's bucket cap, and the check of a job's per-step digests against the simulator's."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from mpi_cases import load_params, params_bits

STEPS = 5
DRIVER = Path(__file__).resolve().parent / "torch_ddp_driver.py"
BUCKET_CAP_MB = 0.002          # 2 KiB: from step 1 on, [2.bias, 2.weight] and [0.bias, 0.weight]


def ddp_config(codec: dict, mode: str) -> dict:
    return {"run": {"name": "ddp", "seed": 5, "steps": STEPS, "eval_every": 0, "log_every": 10,
                    "checkpoint_every": 1, "keep_checkpoints": STEPS},
            "data": {"name": "mnist1d"},
            "model": {"name": "torch", "options": {"factory": "tgsim.torch.examples:mlp", "kwargs": {"hidden": [64]}}},
            "workers": {"n": 2, "batch": 32},
            "codec": codec, "exchange": {"mode": mode},
            "optimizer": {"name": "momentum"}, "schedule": {"name": "constant", "lr": 0.05}}


TERNGRAD = ddp_config({"name": "terngrad"}, "allreduce")
TOPK_EF = ddp_config({"name": "topk", "error_feedback": True}, "ps")
CODECS = {     # name -> config: the cases checked bit for bit against the simulator
    "terngrad": TERNGRAD,
    "terngrad-own": ddp_config({"name": "terngrad", "sharing": "none"}, "allgather"),
    "qsgd": ddp_config({"name": "qsgd"}, "ps"),
    "topk-ef": TOPK_EF,
    "powersgd": ddp_config({"name": "powersgd", "rank": 2}, "allreduce"),
    "suresh-ef": ddp_config({"name": "suresh", "rotate": True, "error_feedback": True}, "allgather"),
    "terngrad-model": ddp_config({"name": "terngrad", "scope": "model"}, "allreduce"),
    "terngrad-sharded": ddp_config({"name": "terngrad"}, "sharded_ps"),     # every rank serves one shard
}
WHOLE_STEP = ("powersgd", "terngrad-model")     # codecs that declare properties.whole_step (or take rounds)


def digest(params: dict) -> str:
    return hashlib.sha256(b"".join(np.ascontiguousarray(params[k]).tobytes() for k in sorted(params))).hexdigest()


def check_bits(job, name: str, ranks: int, rebuilt_at: int = 1) -> None:
    """After every step, on every rank, DDP's parameters are the simulator's (one bucket before DDP's
    rebuild at step `rebuilt_at`, two from it on); rank 0's final parameters equal the simulator's
    array by array. A per-bucket codec's exchange, on the hook's worker thread, was entered before DDP
    handed over the last bucket at every step of two buckets; a whole-step codec's never."""
    steps, params = job.sim[name]
    assert len(job.ranks) == ranks
    for r in job.ranks:
        case = r["train"][name]
        assert case["error"] is None, (r["rank"], case["error"])
        assert case["buckets"] == [1] * rebuilt_at + [2] * (STEPS - rebuilt_at), case["buckets"]
        assert case["digests"] == steps, f"rank {r['rank']}: first step that differs: " + \
            str(next((i for i, (a, b) in enumerate(zip(case["digests"], steps)) if a != b), None))
        assert case["sent"] > 0
        per_bucket = name not in WHOLE_STEP
        assert case["per_bucket"] == per_bucket and case["threaded"] == per_bucket    # the jobs on a worker thread
        assert case["early"] == [False] * rebuilt_at + [per_bucket] * (STEPS - rebuilt_at), case["early"]
    assert params_bits(load_params(job.out / f"{name}.npz")) == params_bits(params)
    assert steps[0] != steps[1]                        # the parameters move
