"""PowerSGD in the trainer (tgsim.train.loop drives its two rounds through the exchange's ordered fp32
mean): it trains, its bytes are the two rounds' payloads, a run resumed from a checkpoint ends with
the bits of an uninterrupted one, and `mpiexec -n 2` gives the simulator's bits (the helpers are
tests/test_mpi.py's)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from mpi_cases import cases_over_mpi_equal_the_simulator, needs_mpi, params_bits, train_losses
from tgsim.codecs.powersgd import PowerSGD
from tgsim.exchange.base import ring_allreduce_bytes
from tgsim.train import checkpoint
from tgsim.train.config import from_dict
from tgsim.train.loop import run

NAME = "powersgd"
BASE = {
    "run": {"name": "psgd", "seed": 5, "steps": 40, "eval_every": 0, "log_every": 10, "checkpoint_every": 20},
    "data": {"name": "digits"},
    "model": {"name": "mlp", "options": {"hidden": [32]}},
    "workers": {"n": 2, "batch": 32},
    "codec": {"name": NAME, "rank": 2},
    "exchange": {"mode": "allreduce"},
    "optimizer": {"name": "momentum"},
    "schedule": {"name": "constant", "lr": 0.05},
}


def case(**sections) -> dict:
    d = {k: dict(v) for k, v in BASE.items()}
    for sec, values in sections.items():
        d[sec] = {**d[sec], **values}
    return d


def state_bits(out, step: int) -> dict:
    state = checkpoint.flatten(checkpoint.read(out / "checkpoints" / f"ckpt-{step:08d}.tgck")["codec_state"])
    return {k: np.ascontiguousarray(v).tobytes() for k, v in state.items()}


def test_powersgd_trains_and_counts_both_rounds(tmp_path):
    """digits, MLP 64-32-10, 4 workers, 150 steps: test accuracy >= 0.85 at rank 1 and 2 (fp32 reaches
    ~0.95 here); each step's bytes are the ring all-reduce of the two rounds' payloads, 2 (N-1)/N ·
    bits_per_element · elements / 8, and the run is deterministic (the same parameters twice)."""
    for rank in (1, 2):
        d = case(run={"steps": 150, "checkpoint_every": 0}, workers={"n": 4, "batch": 64},
                 codec={"rank": rank}, schedule={"lr": 0.1})
        res = run(from_dict(d), out=tmp_path / f"r{rank}", quiet=True)
        assert res.test_accuracy >= 0.85, (rank, res.test_accuracy)
        shapes = {k: v.shape for k, v in res.params.items()}
        elements = sum(int(np.prod(s)) for s in shapes.values())
        per_step = ring_allreduce_bytes(PowerSGD(rank=rank).bits_per_element(shapes) * elements / 8, 4)
        assert res.bits_up == pytest.approx(8 * per_step * 150, rel=1e-9), rank
        if rank == 2:
            again = run(from_dict(d), out=tmp_path / "again", quiet=True)
            assert params_bits(again.params) == params_bits(res.params)


def test_a_model_without_matrices_trains_with_fp32s_bits():
    """Least squares (a weight vector and a bias), 3 workers, 30 steps: every layer is sent as float32
    in round 1 and round 2 is empty, so the run has fp32's parameters, bit for bit, and its bytes."""
    d = {"run": {"steps": 30, "eval_every": 0, "checkpoint_every": 0}, "data": {"name": "least_squares"},
         "model": {"name": "least_squares"}, "workers": {"n": 3, "batch": 24}, "codec": {"name": NAME},
         "exchange": {"mode": "allreduce"}}
    psgd = run(from_dict(d), writer=False, quiet=True)
    fp32 = run(from_dict({**d, "codec": {"name": "fp32"}}), writer=False, quiet=True)
    assert params_bits(psgd.params) == params_bits(fp32.params)
    assert psgd.bits_up == fp32.bits_up > 0


def test_resume_from_a_checkpoint_gives_the_uninterrupted_bits(tmp_path):
    """40 steps with checkpoints at 20 and 40; the run cut after step 20 (its later checkpoint and
    parameters removed) and resumed ends with the same parameters, losses and codec state (every
    worker's residuals and the warm-start Q) as the uninterrupted run."""
    d = case()
    full = run(from_dict(d), out=tmp_path / "full", quiet=True)
    shutil.copytree(tmp_path / "full", tmp_path / "cut")
    (tmp_path / "cut" / "checkpoints" / "ckpt-00000040.tgck").unlink()
    (tmp_path / "cut" / "params.npz").unlink()
    resumed = run(from_dict(d), out=tmp_path / "cut", resume=True, quiet=True)
    assert resumed.start_step == 20
    assert params_bits(resumed.params) == params_bits(full.params)
    assert train_losses(tmp_path / "cut") == train_losses(tmp_path / "full")
    assert state_bits(tmp_path / "cut", 40) == state_bits(tmp_path / "full", 40)
    state = checkpoint.flatten(checkpoint.read(tmp_path / "full" / "checkpoints" / "ckpt-00000040.tgck")["codec_state"])
    assert {k.split("/")[0] for k in state} == {"residual", "q"}
    q = state["q/fc1.w"]
    assert q.shape[0] == 2 and np.array_equal(q[0], q[1]) and np.any(q != 0)


@needs_mpi
def test_powersgd_over_mpi_equals_the_simulator(tmp_path):
    """One mpiexec -n 2 job, 40 steps at rank 1 and rank 4 with warm start, and rank 2 without: every
    rank ends with the simulator's parameters, the same training losses, and rank 0's checkpoints at
    steps 20 and 40 hold both workers' codec state with the simulator's bits."""
    cases = {"rank1": case(codec={"rank": 1}), "rank4": case(codec={"rank": 4}),
             "rank2-cold": case(codec={"rank": 2, "warm_start": False}, exchange={"mode": "ps"})}
    for name, mpi_out, sim_out in cases_over_mpi_equal_the_simulator(tmp_path, cases, 2, timeout=150):
        for step in (20, 40):
            assert state_bits(mpi_out, step) == state_bits(sim_out, step), (name, step)
        rows = checkpoint.flatten(checkpoint.read(mpi_out / "checkpoints" / "ckpt-00000040.tgck")["codec_state"])
        assert not np.array_equal(rows["residual/fc1.w"][0], rows["residual/fc1.w"][1]), "each worker's own residual"
