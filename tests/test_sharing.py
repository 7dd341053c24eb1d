"""Scaler-sharing modes of TernGrad: "max" over workers (the paper), "mean" (every worker clips at
the mean of the workers' scalers) and "none" (each worker's own scaler).

Hand-computed cases; the MPI bits of each mode are in tests/test_mpi.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from tgsim.codecs import TernGrad
from tgsim.exchange.base import mean_of_scalers
from tgsim.exchange.inprocess import InProcessExchange
from tgsim.train.config import ConfigError, from_dict, to_dict
from tgsim.train.loop import run


def test_mean_of_scalers_by_hand():
    """(1 + 3 + 5) / 3 = 3 and (2 + 4 + 9) / 3 = 5, exactly; 0.1 + 0.2 + 0.4 over 3 is the float32
    of the float64 sum times 1/3, the rows added in worker order."""
    rows = np.array([[1, 2], [3, 4], [5, 9]], dtype=np.float32)
    assert mean_of_scalers(rows, 3).tolist() == [3.0, 5.0]
    assert InProcessExchange(3).mean_scalers(rows).tolist() == [3.0, 5.0]
    r = np.array([[0.1], [0.2], [0.4]], dtype=np.float32)
    want = np.float32(((np.float64(r[0, 0]) + np.float64(r[1, 0])) + np.float64(r[2, 0])) * (1.0 / 3))
    assert mean_of_scalers(r, 3)[0] == want


def test_mean_sharing_clips_every_worker_at_the_shared_scaler():
    """g = (0.5, -2, 4, 0) with the shared scaler s = 1 (below the worker's own 4): the elements
    beyond s are sent as -s and +s in every one of 200 draws (clipped, p = 1), 0 as 0, and 0.5 is
    sent as s in a fraction of draws within 0.5 +- 0.12 (seed 3; 4.8 sd of Binomial(200, 0.5))."""
    codec = TernGrad(clip="none", sharing="mean", kernels="reference")
    g = np.array([0.5, -2.0, 4.0, 0.0], dtype=np.float32)
    layers = {"g": np.repeat(g[None], 200, axis=0)}
    msgs = codec.encode_many(layers, 3, 0, np.arange(200), shared_scalers=np.array([1.0], np.float32))
    v = np.stack([codec.decode(m)["g"] for m in msgs])
    assert np.all(v[:, 1] == -1.0) and np.all(v[:, 2] == 1.0) and np.all(v[:, 3] == 0.0)
    assert set(np.unique(v[:, 0])) <= {0.0, 1.0} and abs(v[:, 0].mean() - 0.5) < 0.12
    with pytest.raises(ValueError, match="share with MAX"):   # max sharing refuses a scaler below the local one
        TernGrad(clip="none", kernels="reference").encode_many(layers, 3, 0, np.arange(200),
                                                              shared_scalers=np.array([1.0], np.float32))


def test_sharing_declares_its_properties():
    assert TernGrad(sharing="max").properties.shared_stats == "max"
    assert TernGrad(sharing="mean").properties.shared_stats == "mean"
    assert TernGrad(sharing="none").properties.shared_stats is None
    assert TernGrad(clip="none", sharing="max").unbiased
    assert not TernGrad(clip="none", sharing="mean").unbiased      # it clips at the mean
    with pytest.raises(ValueError, match="sharing"):
        TernGrad(sharing="median")


def _cfg(**codec):
    return from_dict({"run": {"steps": 30, "eval_every": 0, "log_every": 10, "checkpoint_every": 0, "seed": 1},
                      "data": {"name": "least_squares"}, "model": {"name": "least_squares"},
                      "workers": {"n": 4, "batch": 32}, "codec": {"name": "terngrad", **codec},
                      "exchange": {"mode": "allgather"}, "schedule": {"name": "constant", "lr": 0.05}})


def test_each_mode_trains_and_none_is_no_sharing(tmp_path):
    """The three modes give three different trained parameters; "none" gives the bits of
    share_scalers = false with "max"."""
    params = {}
    for mode in ("max", "mean", "none"):
        params[mode] = run(_cfg(sharing=mode), out=tmp_path / mode, quiet=True).params
    flat = {m: np.concatenate([np.ravel(p[k]) for k in sorted(p)]) for m, p in params.items()}
    assert not np.array_equal(flat["max"], flat["mean"]) and not np.array_equal(flat["mean"], flat["none"])
    d = _cfg(sharing="max")
    off = from_dict({**to_dict(d), "exchange": {"mode": "allgather", "share_scalers": False}})
    p_off = run(off, out=tmp_path / "off", quiet=True).params
    assert np.array_equal(np.concatenate([np.ravel(p_off[k]) for k in sorted(p_off)]), flat["none"])


def test_integer_allreduce_needs_a_shared_scaler():
    with pytest.raises(ConfigError, match="share_scalers"):
        from_dict({"codec": {"sharing": "none"}, "exchange": {"mode": "allreduce"}})
