"""`tgsim run --resume` and its checkpoints: a corrupt checkpoint skipped for an
older good one is one plain line on stderr (no Python warning); no usable checkpoint at all is an
error naming each file and why (exit 2), never a silent restart from step 0; no checkpoint at all (a
run stopped before its first one) restarts from step 0 with one plain line."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import tomli_w

from tgsim.cli import main
from tgsim.train import checkpoint
from tgsim.train.config import from_dict, to_dict
from tgsim.train.loop import run


def _cfg():
    return from_dict({"run": {"steps": 30, "eval_every": 0, "log_every": 10, "checkpoint_every": 10, "seed": 4},
                      "data": {"name": "digits"}, "model": {"name": "mlp", "options": {"hidden": [16]}},
                      "workers": {"n": 4, "batch": 16}, "codec": {"name": "terngrad"}, "exchange": {"mode": "ps"},
                      "schedule": {"name": "constant", "lr": 0.1}})


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """An uninterrupted 30-step run, checkpoints at 10, 20, 30; a pristine copy of its directory."""
    base = tmp_path_factory.mktemp("resume")
    res = run(_cfg(), out=base / "full", quiet=True)
    return base, res


def _copy(full, dest):
    import shutil

    base, _ = full
    shutil.copytree(base / "full", dest)
    (dest / "params.npz").unlink()            # as if killed after its last checkpoint
    return dest, checkpoint.list_checkpoints(dest / "checkpoints")


def _flip(path):
    raw = bytearray(path.read_bytes())
    raw[100] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_a_corrupt_checkpoint_is_skipped_in_one_plain_line(full, tmp_path, capsys):
    """The newest checkpoint corrupt: one line `tgsim: skipping checkpoint PATH: corrupt (sha256
    mismatch)` on stderr, no Python warning, and the run resumes from step 20 to the same parameters
    and the same bits as the uninterrupted run."""
    _, ref = full
    out, ck = _copy(full, tmp_path / "r")
    assert [p.name for p in ck] == ["ckpt-00000010.tgck", "ckpt-00000020.tgck", "ckpt-00000030.tgck"]
    _flip(ck[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = run(_cfg(), out=out, resume=True, quiet=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tgsim: skipping checkpoint {ck[-1]}: corrupt (sha256 mismatch)"], err
    assert res.start_step == 20
    assert (res.bits_up, res.bits_down) == (ref.bits_up, ref.bits_down)
    for k in ref.params:
        np.testing.assert_array_equal(np.asarray(res.params[k]), np.asarray(ref.params[k]))


def test_no_usable_checkpoint_is_an_error_naming_each_file(full, tmp_path, capsys):
    """Every checkpoint corrupt (one flipped byte, one truncated, one empty): `tgsim run --resume`
    exits 2 with one line on stderr naming the three files and why; metrics.csv is left as it was and
    no run restarts from step 0."""
    out, ck = _copy(full, tmp_path / "r")
    _flip(ck[0])
    ck[1].write_bytes(ck[1].read_bytes()[:-10])
    ck[2].write_bytes(b"")
    before = (out / "metrics.csv").read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["run", "--resume", "--out", str(out), "--quiet"]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert len(err) == 1, err
    line = err[0]
    assert line.startswith("tgsim run: --resume: no usable checkpoint in ") and "step 0" in line
    assert "ckpt-00000010.tgck: corrupt (sha256 mismatch)" in line
    assert "ckpt-00000020.tgck: truncated (no trailer)" in line and "ckpt-00000030.tgck: truncated" in line
    assert (out / "metrics.csv").read_bytes() == before and not (out / "params.npz").exists()
    with pytest.raises(checkpoint.NoUsableCheckpointError):
        checkpoint.latest_good(out / "checkpoints", say=lambda line: None)


def test_no_checkpoint_at_all_restarts_from_step_0_in_one_line(tmp_path, capsys):
    """A run stopped before its first checkpoint (no checkpoints directory): --resume says so in one
    line and runs from step 0 to the uninterrupted run's parameters (nothing saved was lost)."""
    out = tmp_path / "r"
    out.mkdir()
    cfg = _cfg()
    (out / "config.toml").write_bytes(tomli_w.dumps(to_dict(cfg)).encode())
    assert main(["run", "--resume", "--out", str(out), "--quiet"]) == 0
    cap = capsys.readouterr()
    err = [line for line in cap.err.splitlines() if line.strip()]
    assert err == [f"tgsim: no checkpoint in {out / 'checkpoints'} (the run stopped before its first one, or "
                   "run.checkpoint_every = 0): starting from step 0"], err
    m = pd.read_csv(out / "metrics.csv")
    assert list(m[(m.split == "train") & (m.layer == "model")].step) == list(range(1, 31))
