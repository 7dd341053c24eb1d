"""`run.backend = "cupy"`: the config checks, and the trainer's device plumbing through a stand-in CuPy.

Without a GPU (marker `nvcc`, the stand-in of tests/test_cuda_batched.py): `tgsim.train.loop.run`
with backend "cupy" takes every CuPy-only line of the trainer (device data and batch indices,
parameters and optimizer state made by xp, the models' fixed-order kernels through the nvcc host
harness, host copies for the per-layer statistics, checkpoints and params.npz) while the codec and
the exchange see NumPy arrays. Checked: the same bits twice, kill-and-resume equals the
uninterrupted run, and a checkpoint written by the "GPU" run resumes with backend "numpy" and the
other way round. What only a GPU checks (marker `gpu`): the same run with real CuPy arrays
(the codec's CUDA kernels, the exchange on device payloads), tests/test_gpu_training.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tgsim import backend
from tgsim.models import base as model_base
from tgsim.train import checkpoint
from tgsim.train import loop as train_loop
from tgsim.train.config import ConfigError, from_dict

SMALL = {
    "run": {"name": "g", "seed": 5, "steps": 30, "eval_every": 10, "log_every": 5, "checkpoint_every": 10,
            "backend": "cupy"},
    "data": {"name": "digits"},
    "model": {"name": "mlp", "options": {"hidden": [16]}},
    "workers": {"n": 3, "batch": 24},
    "codec": {"name": "terngrad", "clip": "explicit"},
    "exchange": {"mode": "ps"},
    "optimizer": {"name": "adam"},
    "schedule": {"name": "constant", "lr": 0.01},
}


def cfg_with(**sections):
    """SMALL with `sections` merged over it (a codec section naming another codec drops SMALL's
    terngrad options: tgsim.train.config.merge_sections)."""
    from tgsim.train.config import merge_sections

    return from_dict(merge_sections(SMALL, sections))


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes() for k in a)


# ------------------------------------------------------------------------------------------------
# config checks (no GPU, no nvcc)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sections, match", [
    ({"run": {"backend": "torch"}}, "backend must be one of"),
    ({"codec": {"name": "qsgd"}}, "runs on NumPy only"),
    ({"codec": {"kernels": "numba"}}, "kernels = 'numba' runs on NumPy"),
    ({"codec": {"error_feedback": True}}, "error feedback or local steps"),
    ({"run": {"backend": "numpy"}, "codec": {"kernels": "cuda"}}, "set run.backend = 'cupy'"),
])
def test_backend_config_errors(sections, match):
    with pytest.raises(ConfigError, match=match):
        cfg_with(**sections)


def test_codecs_declare_their_backends():
    from tgsim.codecs import registry
    from tgsim.codecs.base import CodecProperties
    from tgsim.train.config import CodecConfig

    on_gpu = {r["codec"] for r in registry.describe(CodecConfig()) if "cupy" in r["backends"]}
    assert on_gpu == {"terngrad", "fp32"}
    assert all("numpy" in r["backends"] for r in registry.describe(CodecConfig()))
    for bad in ((), ("torch",), ("numpy", "jax")):
        with pytest.raises(ValueError, match="backends must be"):
            CodecProperties(unbiased=True, backends=bad)


def test_fp32_and_reference_kernels_are_accepted_on_cupy():
    assert cfg_with(codec={"name": "fp32"}).run.backend == "cupy"
    assert cfg_with(codec={"kernels": "reference"}).codec.kernels == "reference"


@pytest.mark.skipif(backend.gpu_available(), reason="this machine has a GPU: the cupy backend builds")
def test_cupy_backend_without_a_gpu_says_what_to_install():
    with pytest.raises(ConfigError, match=r"\[run\] backend 'cupy' requested but no CUDA device"):
        train_loop.build(cfg_with())


# ------------------------------------------------------------------------------------------------
# the trainer's CuPy lines through the stand-in
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def stand_in(fake_cp, monkeypatch):
    monkeypatch.setattr(train_loop, "get_xp", lambda name: fake_cp if name == "cupy" else np)
    monkeypatch.setattr(model_base, "array_module", lambda x: fake_cp)
    return fake_cp


@pytest.mark.nvcc
def test_run_on_the_stand_in_is_deterministic_and_resumes_bitwise(stand_in, tmp_path):
    cfg = cfg_with()
    full = train_loop.run(cfg, out=tmp_path / "full", quiet=True)
    assert any(k.startswith("tgb_bmm") for k in stand_in._launches), "the models must take the CuPy route"
    again = train_loop.run(cfg, out=tmp_path / "again", quiet=True)
    assert same_bits(full.params, again.params)
    assert 0.0 < full.test_accuracy <= 1.0 and np.isfinite(full.test_loss)
    manifest = json.loads((tmp_path / "full" / "manifest.json").read_text())
    assert manifest["backend"] == "cupy" and manifest["device_name"] == "stand-in (harness)"
    # kill after step 20: the newest checkpoint and the final params are lost
    (tmp_path / "full" / "checkpoints" / "ckpt-00000030.tgck").unlink()
    (tmp_path / "full" / "params.npz").unlink()
    resumed = train_loop.run(cfg, out=tmp_path / "full", resume=True, quiet=True)
    assert resumed.start_step == 20 and same_bits(resumed.params, full.params)


@pytest.mark.nvcc
@pytest.mark.parametrize("first, second", [("cupy", "numpy"), ("numpy", "cupy")])
def test_a_checkpoint_resumes_on_the_other_backend(fake_cp, monkeypatch, tmp_path, first, second):
    """Each phase on its own route: "numpy" is the plain NumPy trainer, "cupy" the stand-in."""
    out = tmp_path / "run"
    for phase, (name, steps) in enumerate([(first, 10), (second, 30)]):
        with monkeypatch.context() as m:
            if name == "cupy":
                m.setattr(train_loop, "get_xp", lambda n: fake_cp if n == "cupy" else np)
                m.setattr(model_base, "array_module", lambda x: fake_cp)
            launched = len(fake_cp._launches)
            res = train_loop.run(cfg_with(run={"backend": name, "steps": steps}), out=out, resume=phase == 1,
                                 quiet=True)
            assert (len(fake_cp._launches) > launched) == (name == "cupy")
        if phase == 0:
            state = checkpoint.read(checkpoint.list_checkpoints(out / "checkpoints")[-1])
            assert all(type(v) is np.ndarray for v in checkpoint.flatten(state).values())
    assert res.start_step == 10 and res.steps == 30
    assert np.isfinite(res.test_loss) and res.test_accuracy > 0.3
    assert json.loads((out / "manifest.json").read_text())["backend"] == second


@pytest.mark.nvcc
def test_bench_sim_gpu_rows_on_the_stand_in(stand_in, monkeypatch):
    """`tgsim bench sim --backend cupy`'s code path: the four timings per row, the ratios, and the
    vendor route (cupy.matmul) swapped in only while it is timed."""
    from tgsim.bench import sim_gpu
    from tgsim.models import cuda_ops

    monkeypatch.setattr(sim_gpu, "get_xp", lambda name: stand_in)
    own = cuda_ops.bmm
    rows = sim_gpu.run("cupy", workers=(2,), batch=3, repeats=1,
                       models={"mlp": ("mlp", {"dim": 6, "hidden": (5,), "classes": 3})})
    assert cuda_ops.bmm is own
    (row,) = rows
    assert row["N"] == 2 and row["params"] == 6 * 5 + 5 + 5 * 3 + 3
    for k in ("bitwise", "vendor", "looped", "one process"):
        assert row[f"{k} ms"] > 0
    assert row["bitwise / vendor"] == pytest.approx(row["bitwise ms"] / row["vendor ms"])
    text = sim_gpu.format_rows(rows, "cupy")
    assert "bitwise / vendor <= 2" in text and "mlp" in text
