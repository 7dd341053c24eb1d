"""The training loop: determinism, kill + resume, checkpoints, results directory, config errors,
exchange modes, non-finite policy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tgsim.codecs import NonFiniteGradientError
from tgsim.train import checkpoint
from tgsim.train.config import ConfigError, from_dict
from tgsim.train.loop import build, run, train_step

SMALL = {
    "run": {"name": "t", "seed": 3, "steps": 30, "eval_every": 10, "log_every": 5, "checkpoint_every": 10},
    "data": {"name": "digits"},
    "model": {"name": "mlp", "options": {"hidden": [32]}},
    "workers": {"n": 4, "batch": 32},
    "codec": {"name": "terngrad", "clip": "explicit"},
    "exchange": {"mode": "ps"},
    "optimizer": {"name": "momentum"},
    "schedule": {"name": "constant", "lr": 0.05},
}


def cfg_with(**sections):
    """SMALL with `sections` merged over it (a codec section naming another codec drops SMALL's
    terngrad options: tgsim.train.config.merge_sections)."""
    from tgsim.train.config import merge_sections

    return from_dict(merge_sections(SMALL, sections))


def params_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]).view(np.uint32),
                                                       np.asarray(b[k]).view(np.uint32)) for k in a)


def load_params(path: Path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def test_same_config_same_bits_and_kernels_agree(tmp_path):
    a = run(cfg_with(), out=tmp_path / "a", quiet=True)
    b = run(cfg_with(), out=tmp_path / "b", quiet=True)
    c = run(cfg_with(codec={"kernels": "reference"}), out=tmp_path / "c", quiet=True)
    assert params_equal(a.params, b.params)
    assert params_equal(a.params, c.params), "Numba and reference kernels must give the same training bits"
    d = run(cfg_with(run={"seed": 4}), out=tmp_path / "d", quiet=True)
    assert not params_equal(a.params, d.params), "a different seed must change the run"


@pytest.mark.parametrize("mode", ["allreduce", "allgather"])
def test_exchange_modes_give_the_same_bits_as_ps(tmp_path, mode):
    ps = run(cfg_with(run={"steps": 10}), out=tmp_path / "ps", quiet=True)
    other = run(cfg_with(run={"steps": 10}, exchange={"mode": mode}), out=tmp_path / mode, quiet=True)
    assert params_equal(ps.params, other.params)
    assert other.bits_up != ps.bits_up  # same math, different wire


def test_bits_counted_from_payloads(tmp_path):
    r = run(cfg_with(run={"steps": 2}), out=tmp_path / "r", quiet=True)
    setup = build(cfg_with())
    n = sum(int(np.prod(s)) for s in setup.model.layer_shapes().values())
    layers = len(setup.model.layer_shapes())
    # uplink per worker per step: header + per layer 4 bytes scaler + ceil(n_l/4), + MAX all-reduce of scalers
    up_codes = sum(4 + -(-int(np.prod(s)) // 4) for s in setup.model.layer_shapes().values())
    assert r.bits_up / 2 > 8 * up_codes
    assert r.bits_up / 2 < 8 * (up_codes + 200 + 2 * 4 * layers)
    fp = run(cfg_with(run={"steps": 2}, codec={"name": "fp32"}), out=tmp_path / "f", quiet=True)
    assert fp.bits_up / 2 == pytest.approx(8 * 2 * 3 / 4 * 4 * n)   # ring all-reduce, N = 4
    assert fp.bits_up / r.bits_up > 12


def _run_cli(args, **kw):
    return subprocess.Popen([sys.executable, "-m", "tgsim.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_kill_and_resume_gives_the_bits_of_an_uninterrupted_run(tmp_path):
    """SIGKILL a real `tgsim run` process after its first checkpoint, resume it, compare bits."""
    import tomli_w

    from tgsim.train.config import to_dict

    cfg = cfg_with(run={"steps": 400, "checkpoint_every": 50, "eval_every": 100})
    path = tmp_path / "cfg.toml"
    path.write_bytes(tomli_w.dumps(to_dict(cfg)).encode())
    full = run(cfg, out=tmp_path / "full", quiet=True)

    out = tmp_path / "killed"
    proc = _run_cli(["run", str(path), "--out", str(out), "--quiet"])
    deadline = time.time() + 120
    while time.time() < deadline and not checkpoint.list_checkpoints(out / "checkpoints"):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ckpts = checkpoint.list_checkpoints(out / "checkpoints")
    assert ckpts, "the run never wrote a checkpoint"
    assert not (out / "params.npz").exists(), "the run finished before it was killed; make it longer"

    res = _run_cli(["run", "--resume", "--out", str(out), "--quiet"])
    stdout, stderr = res.communicate(timeout=300)
    assert res.returncode == 0, stderr
    assert params_equal(load_params(out / "params.npz"), full.params)
    import pandas as pd

    m = pd.read_csv(out / "metrics.csv")
    steps = m[(m.split == "train") & (m.layer == "model")].step
    assert list(steps) == list(range(1, 401)), "metrics must hold each step once after a resume"


def test_corrupt_checkpoint_is_named_and_the_previous_one_used(tmp_path, capsys):
    cfg = cfg_with(run={"steps": 30, "checkpoint_every": 10})
    full = run(cfg, out=tmp_path / "full", quiet=True)
    ck = checkpoint.list_checkpoints(tmp_path / "full" / "checkpoints")
    assert [p.name for p in ck] == ["ckpt-00000010.tgck", "ckpt-00000020.tgck", "ckpt-00000030.tgck"]
    raw = bytearray(ck[-1].read_bytes())
    raw[100] ^= 0xFF
    ck[-1].write_bytes(bytes(raw))
    (tmp_path / "full" / "params.npz").unlink()
    again = run(cfg, out=tmp_path / "full", resume=True, quiet=True)
    assert f"tgsim: skipping checkpoint {ck[-1]}: corrupt (sha256 mismatch)" in capsys.readouterr().err
    assert params_equal(again.params, full.params)


def test_results_directory(tmp_path):
    out = tmp_path / "r"
    run(cfg_with(run={"steps": 5}), out=out, quiet=True)
    assert {p.name for p in out.iterdir()} >= {"config.toml", "manifest.json", "metrics.csv", "params.npz"}
    import json

    import pandas as pd

    man = json.loads((out / "manifest.json").read_text())
    assert man["seed"] == 3 and "numpy" in man["versions"] and man["git_commit"]
    assert isinstance(man["cpu"], str) and man["cpu"]
    gemm = [lib for lib in man["blas"]["libraries"] if lib["models_gemm"]]
    assert len(gemm) == 1 and gemm[0]["internal_api"] and gemm[0]["architecture"], man["blas"]
    m = pd.read_csv(out / "metrics.csv")
    layer_rows = m[m.layer != "model"]
    assert set(layer_rows.layer) == set(build(cfg_with()).model.layer_shapes())
    assert (layer_rows.inf_l1 >= layer_rows.l2sq).all()   # ||g||_inf ||g||_1 >= ||g||_2^2
    assert m[m.split == "test"].accuracy.between(0, 1).all()
    with pytest.raises(FileExistsError, match="--resume"):
        run(cfg_with(run={"steps": 5}), out=out, quiet=True)


@pytest.mark.parametrize("bad, match", [
    ({"workers": {"n": 3, "batch": 32}}, "split evenly"),
    ({"codec": {"name": "no-such-codec"}}, "unknown codec"),
    ({"run": {"stepz": 3}}, "unknown key"),
    ({"exchange": {"mode": "allreduce", "share_scalers": False}}, "share_scalers"),
    ({"model": {"name": "mlp", "options": {"widht": 3}}}, "widht"),
    ({"data": {"name": "cifar"}}, "cifar"),
    ({"workers": {"n": 2, "batch": 2000, "batch_mode": "per_worker"}}, "larger than the smallest shard"),
])
def test_bad_config_fails_before_any_work(tmp_path, bad, match):
    with pytest.raises(ConfigError, match=match):
        cfg = cfg_with(**bad)
        run(cfg, out=tmp_path / "x", quiet=True)
    assert not (tmp_path / "x").exists()


def test_nonfinite_gradient_raise_or_skip(tmp_path, monkeypatch):
    setup = build(cfg_with())
    params = setup.model.init(0)
    state = setup.optimizer.init(params)
    orig = setup.model.loss_and_grad

    def poisoned(p, x, y):
        loss, grads = orig(p, x, y)
        grads["fc1.w"][2, 0, 0] = np.nan
        return loss, grads

    monkeypatch.setattr(type(setup.model), "loss_and_grad", lambda self, p, x, y: poisoned(p, x, y))
    with pytest.raises(NonFiniteGradientError, match="fc1.w.*step 0"):
        train_step(setup, params, state, 0)
    skip = build(cfg_with(run={"on_nonfinite": "skip"}))
    p2, s2, info = train_step(skip, params, state, 0)
    assert info.skipped and params_equal(p2, params)
