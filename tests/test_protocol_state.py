"""State passed in and out (tgsim.codecs.base.Stateful): error feedback owns its residuals as its
state {"residual/<layer>": (n_local, *shape)}, `encode_stateful` leaves the state passed in as it
was, and a checkpoint written before "codec_state" (error feedback's "ef_residual") still resumes
with the bits of an uninterrupted run."""

from __future__ import annotations

import numpy as np

from tgsim.codecs import error_feedback, registry
from tgsim.codecs.base import Stateful
from tgsim.testing import contract_layers
from tgsim.train import checkpoint
from tgsim.train.config import CodecConfig, from_dict
from tgsim.train.loop import run

CFG = {
    "run": {"name": "ef", "seed": 3, "steps": 16, "eval_every": 0, "log_every": 8, "checkpoint_every": 8},
    "data": {"name": "digits"},
    "model": {"name": "mlp", "options": {"hidden": [8]}},
    "workers": {"n": 3, "batch": 24},
    "codec": {"name": "scaled_sign", "error_feedback": True},
    "exchange": {"mode": "ps"},
    "optimizer": {"name": "momentum"},
    "schedule": {"name": "constant", "lr": 0.05},
}


def bits(tree: dict) -> dict:
    return {k: np.ascontiguousarray(np.asarray(v, np.float32)).tobytes() for k, v in tree.items()}


def test_error_feedback_state_in_and_out():
    """init_state: zeros under "residual/<layer>", the local-worker axis first; encode_stateful twice
    from the same state gives the same messages and new state, and the state passed in is unchanged;
    the new residual is p - D(C(p)) for p = g + e."""
    codec = error_feedback.ErrorFeedback(registry.make_codec(CodecConfig(name="scaled_sign")))
    assert isinstance(codec, Stateful)
    layers = contract_layers()
    state = codec.init_state({k: v.shape[1:] for k, v in layers.items()}, 3)
    assert {k: v.shape for k, v in state.items()} == {"residual/" + k: v.shape for k, v in layers.items()}
    assert not any(v.any() for v in state.values())
    workers = np.arange(3)
    _, state = codec.encode_stateful(layers, 1, 0, workers, state)
    before = bits(state)
    msgs, new = codec.encode_stateful(layers, 1, 1, workers, state)
    msgs2, new2 = codec.encode_stateful(layers, 1, 1, workers, state)
    assert bits(state) == before and bits(new) == bits(new2)
    assert [m.to_bytes() for m in msgs] == [m.to_bytes() for m in msgs2]
    p = codec.encoder_inputs(layers, state)
    want = error_feedback.new_residual(p, [codec.decode(m) for m in msgs])
    assert bits(error_feedback.residuals(new)) == bits(want)


def test_a_checkpoint_with_ef_residual_still_resumes(tmp_path):
    """The step-8 checkpoint rewritten in the old layout ("ef_residual" {layer: (N, *shape)} instead
    of "codec_state") resumes to the uninterrupted run's parameters."""
    cfg = from_dict(CFG)
    full = run(cfg, out=tmp_path / "full", quiet=True)
    state = checkpoint.read(tmp_path / "full" / "checkpoints" / "ckpt-00000008.tgck")
    state["ef_residual"] = error_feedback.residuals(checkpoint.flatten(state.pop("codec_state")))
    assert any(v.any() for v in state["ef_residual"].values())
    checkpoint.save(tmp_path / "old" / "checkpoints", 8, state)
    (tmp_path / "old" / "config.toml").write_bytes((tmp_path / "full" / "config.toml").read_bytes())
    again = run(cfg, out=tmp_path / "old", resume=True, quiet=True)
    assert again.start_step == 8 and bits(again.params) == bits(full.params)
