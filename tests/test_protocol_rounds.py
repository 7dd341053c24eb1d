"""The trainer's driver of multi-round codecs (tgsim.codecs.base.MultiRound, tgsim.train.loop.run_rounds)
with a tiny fake two-round codec: each round's messages are combined by `exchange.mean_fp32`, the
aggregate and the new state come from the last round's mean, the step's bytes are the sum of the
rounds', the state is checkpointed as "codec_state" (all N workers' rows) and a killed run resumes
with it; over MPI (2 ranks) the simulator's bits."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from fakes import kill_train_step_at
from mpi_cases import _DRIVER, load_params, mpiexec, needs_mpi, params_bits, params_digest, simulate, train_losses
from tgsim.codecs.base import CodecProperties, MultiRound
from tgsim.train import checkpoint
from tgsim.train.config import from_dict
from tgsim.train.loop import build, local_batch, run, train_step

NAME = "tests.test_protocol_rounds:TwoRounds"       # the codec by its import path (tgsim.codecs.registry)
PREFIX = "memory/"


class TwoRounds:
    """A fake codec of two rounds per step, worker w with memory m_w (float32, 0 at step 0):

        round 0:  p_w = f32(g_w) + m_w                 sent; mean0 = ordered fp32 mean of the p_w
        round 1:  d_w = (p_w - mean0)^2                sent; mean1 = ordered fp32 mean of the d_w
        aggregate = mean0 + f32(0.25) · mean1;  m_w' = f32(0.5) · (p_w - mean0)
    """

    name = "two_rounds"
    properties = CodecProperties(unbiased=False, wire="own", stateful=True, rounds=2)

    @classmethod
    def from_config(cls, cfg):
        return cls()

    def prepare_many(self, layers):
        return None

    def local_scalers_many(self, stats, workers=None):
        raise TypeError("two_rounds shares no statistics")

    def init_state(self, shapes, n_local):
        return {PREFIX + k: np.zeros((n_local, *tuple(s)), np.float32) for k, s in shapes.items()}

    def start_rounds(self, layers, seed, step, workers, state):
        p = {k: np.asarray(g, np.float32) + state[PREFIX + k] for k, g in layers.items()}
        return [{k: v[i] for k, v in p.items()} for i in range(len(workers))], {"p": p}

    def next_round(self, ctx, mean):
        d = {k: (v - mean[k]) ** 2 for k, v in ctx["p"].items()}
        return [{k: v[i] for k, v in d.items()} for i in range(len(next(iter(d.values()))))], {**ctx, "mean0": mean}

    def finish_rounds(self, ctx, mean):
        m0 = ctx["mean0"]
        agg = {k: m0[k] + np.float32(0.25) * mean[k] for k in m0}
        return agg, {PREFIX + k: np.float32(0.5) * (v - m0[k]) for k, v in ctx["p"].items()}


BASE = {
    "run": {"name": "rounds", "seed": 7, "steps": 12, "eval_every": 0, "log_every": 4, "checkpoint_every": 4},
    "data": {"name": "digits"},
    "model": {"name": "mlp", "options": {"hidden": [8]}},
    "workers": {"n": 3, "batch": 24},
    "codec": {"name": NAME},
    "exchange": {"mode": "ps"},
    "optimizer": {"name": "sgd"},
    "schedule": {"name": "constant", "lr": 0.1},
}


def cfg_of(d=BASE, **sections):
    d = {k: dict(v) for k, v in d.items()}
    for sec, values in sections.items():
        d[sec] = {**d[sec], **values}
    return from_dict(d)


def ordered_mean(rows: list) -> np.ndarray:
    """f32(Σ_w f64(x_w) · (1/N)), w in order: the exchange's mean_fp32, written out."""
    acc = np.zeros(np.shape(rows[0]), np.float64)
    for r in rows:
        acc += np.asarray(r, np.float64)
    return (acc * np.float64(1.0 / len(rows))).astype(np.float32)


def bits(tree: dict) -> dict:
    return {k: np.ascontiguousarray(np.asarray(v, np.float32)).tobytes() for k, v in tree.items()}


def test_the_fake_codec_declares_the_protocol():
    codec = TwoRounds()
    assert isinstance(codec, MultiRound) and codec.properties.rounds == 2
    with pytest.raises(ValueError, match="stateful"):
        CodecProperties(unbiased=False, rounds=2)


def test_train_step_drives_both_rounds_and_keeps_the_state():
    """Three steps of train_step, N = 3 in the simulator: the parameters, the state (each worker its
    own memory) and the bytes equal the rounds computed by hand from the same batches: two ordered
    fp32 means, the aggregate from the last, sgd's update, and 2 ring all-reduces of the float32
    layers (2 (N-1)/N · 4 M bytes each, M the model's size) per step."""
    setup = build(cfg_of())
    assert type(setup.codec).__name__ == "TwoRounds"
    shapes = setup.model.layer_shapes()
    params = setup.model.init(7)
    opt = setup.optimizer.init(params)
    ref_params, ref_opt = dict(params), setup.optimizer.init(params)
    state = setup.codec.init_state(shapes, 3)
    memory = {k: np.zeros((3, *s), np.float32) for k, s in shapes.items()}
    size = sum(int(np.prod(s)) for s in shapes.values())
    for step in range(3):
        x, y = local_batch(setup, step)
        _, g = setup.model.loss_and_grad(ref_params, x, y)
        p = {k: np.asarray(g[k], np.float32) + memory[k] for k in g}
        mean0 = {k: ordered_mean(list(v)) for k, v in p.items()}
        mean1 = {k: ordered_mean([(v[w] - mean0[k]) ** 2 for w in range(3)]) for k, v in p.items()}
        agg = {k: mean0[k] + np.float32(0.25) * mean1[k] for k in p}
        memory = {k: np.float32(0.5) * (v - mean0[k]) for k, v in p.items()}
        ref_params, ref_opt = setup.optimizer.update(agg, ref_opt, ref_params, 0.1)

        params, opt, info = train_step(setup, params, opt, step, with_stats=step == 1, codec_state=state)
        assert bits(params) == bits(ref_params), step
        assert bits(state) == bits({PREFIX + k: v for k, v in memory.items()}), step
        assert info.sent == info.received == 2 * (2 * 2 / 3 * 4 * size), step
        assert not np.array_equal(state[PREFIX + "fc1.w"][0], state[PREFIX + "fc1.w"][1])
    with pytest.raises(ValueError, match="stateful"):
        train_step(setup, params, opt, 3)


def test_killed_run_resumes_with_the_codec_state(tmp_path, monkeypatch):
    """A run killed at step 10 (checkpoints at 4 and 8) resumes from step 8 with every worker's
    state ("codec_state", N = 3 rows) and ends with the uninterrupted run's parameters; the same
    checkpoint with the state zeroed gives other bits, and one without it is refused."""
    cfg = cfg_of()
    full = run(cfg, out=tmp_path / "full", quiet=True)
    kill_train_step_at(monkeypatch, 10)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, out=tmp_path / "killed", quiet=True)
    monkeypatch.undo()
    last = checkpoint.list_checkpoints(tmp_path / "killed" / "checkpoints")[-1]
    saved = checkpoint.flatten(checkpoint.read(last)["codec_state"])
    shapes = build(cfg).model.layer_shapes()
    assert {k: v.shape for k, v in saved.items()} == {PREFIX + k: (3, *s) for k, s in shapes.items()}
    again = run(cfg, out=tmp_path / "killed", resume=True, quiet=True)
    assert again.start_step == 8 and bits(again.params) == bits(full.params)

    state = checkpoint.read(last)
    state["codec_state"] = {k: np.zeros_like(v) for k, v in saved.items()}
    checkpoint.save(tmp_path / "zeroed" / "checkpoints", 8, state)
    (tmp_path / "zeroed" / "config.toml").write_bytes((tmp_path / "killed" / "config.toml").read_bytes())
    assert bits(run(cfg, out=tmp_path / "zeroed", resume=True, quiet=True).params) != bits(full.params)
    del state["codec_state"]
    checkpoint.save(tmp_path / "none" / "checkpoints", 8, state)
    (tmp_path / "none" / "config.toml").write_bytes((tmp_path / "killed" / "config.toml").read_bytes())
    with pytest.raises(Exception, match="holds none"):
        run(cfg, out=tmp_path / "none", resume=True, quiet=True)


@needs_mpi
def test_rounds_over_mpi_equal_the_simulator(tmp_path):
    """mpiexec -n 2 (one worker per rank): the parameters on every rank, the training losses and
    rank 0's checkpointed state of both workers have the simulator's bits."""
    d = {k: dict(v) for k, v in BASE.items()}
    d["workers"] = {"n": 2, "batch": 16}
    (tmp_path / "cases.json").write_text(json.dumps({"rounds": d}))
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    tests = Path(__file__).resolve().parent        # the ranks import this module by NAME (and mpi_cases)
    res, _ = mpiexec([(2, [str(driver), str(tmp_path / "cases.json"), str(tmp_path / "mpi")])], timeout=120,
                     PYTHONPATH=os.pathsep.join([str(tests.parent), str(tests)]))
    assert res.returncode == 0, res.stdout + res.stderr
    sim = simulate(d, tmp_path / "sim")
    mpi_out = tmp_path / "mpi" / "rounds"
    assert params_bits(load_params(mpi_out / "params.npz")) == params_bits(sim.params)
    assert set(json.loads((tmp_path / "mpi" / "digests.json").read_text())["rounds"]) == {params_digest(sim.params)}
    assert train_losses(mpi_out) == train_losses(tmp_path / "sim")
    for step in (4, 8, 12):
        got, want = (checkpoint.flatten(checkpoint.read(o / "checkpoints" / f"ckpt-{step:08d}.tgck")["codec_state"])
                     for o in (mpi_out, tmp_path / "sim"))
        assert bits(got) == bits(want), step
