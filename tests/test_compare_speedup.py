"""tgsim.analysis.compare_speedup's methods: Jiang & Agrawal's methods among the defaults (QSGD at
s = ceil(sqrt(dim)) levels, the dimension's rule, at every M; PQASGD; sparse parameter averaging), and
the measured uplink bits of every kind of codec (plain, error feedback, several rounds, local steps)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tgsim.analysis import common
from tgsim.analysis import compare_speedup as cs


@pytest.mark.parametrize("dim, levels", [(1, 1), (2, 2), (15, 4), (16, 4), (17, 5), (63, 8), (64, 8), (65, 9),
                                         (10**12, 10**6), (10**12 + 1, 10**6 + 1)])
def test_qsgd_levels_is_ceil_sqrt_dim(dim, levels):
    """s = ceil(sqrt(dim)), exact for perfect squares and their neighbours: QSGD's variance factor
    q = min(d/s^2, sqrt(d)/s) is at most 1 there, and s - 1 levels would leave it above 1."""
    s = cs.qsgd_levels(dim)
    assert s == levels
    assert min(dim / s**2, math.sqrt(dim) / s) <= 1 + 1e-12
    if s > 1:
        assert min(dim / (s - 1) ** 2, math.sqrt(dim) / (s - 1)) > 1


def test_paper_methods_follow_the_problems_dimension():
    """PQASGD, QSGD at ceil(sqrt(dim)) levels (8 at the default dim 64, 4 at 16), sparse parameter averaging;
    the default dim is Problem's."""
    assert cs.Problem().dim == 64
    assert cs.paper_methods() == ("terngrad+pqasgd", "qsgd[levels=8]", "fp32+pqasgd")
    assert cs.paper_methods(64) == cs.paper_methods()
    assert cs.paper_methods(16) == ("terngrad+pqasgd", "qsgd[levels=4]", "fp32+pqasgd")
    for dim in (16, 64):
        assert cs.default_methods(dim)[-3:] == cs.paper_methods(dim)


def test_default_methods_add_jiang_and_agrawals_methods():
    """Every registered codec, then the paper's three (no duplicates); those run in the worker sweep only,
    while plain QSGD and an explicit label keep their compression sweep."""
    methods = cs.default_methods()
    assert methods[:len(common.default_methods())] == common.default_methods()
    assert methods[-3:] == ("terngrad+pqasgd", "qsgd[levels=8]", "fp32+pqasgd")
    assert len(set(methods)) == len(methods)
    sweeps = cs.default_sweeps(methods)
    assert not set(cs.paper_methods()) & set(sweeps) and sweeps["qsgd"][0] == "levels"
    assert cs.default_sweeps(["qsgd[levels=4]"]) == {"qsgd[levels=4]": ("bucket", (0, 8192, 2048, 512, 128))}
    assert "qsgd[levels=4]" not in cs.default_sweeps(["qsgd[levels=4]"], dim=16)


def test_paper_methods_build_valid_configs():
    """fp32+pqasgd is local SGD with period 4 through the identity codec (fp32); qsgd[levels=8] has 8 levels
    at every M; terngrad+pqasgd is PQASGD."""
    assert common.split_label("fp32+pqasgd") == ("fp32", {}, False, "pqasgd")
    assert cs.method_sections("fp32+pqasgd") == ({"name": "fp32"}, {"local": "pqasgd", "every": 4})
    assert cs.method_sections("terngrad+pqasgd") == ({"name": "terngrad"}, {"local": "pqasgd", "every": 4})
    assert cs.method_sections("qsgd[levels=8]") == ({"name": "qsgd", "levels": 8}, {})
    spa = cs.config(cs.Problem(n=4096), 8, "fp32+pqasgd", seed=0, steps=5)
    assert spa.codec.name == common.FP32 and not spa.codec.error_feedback
    assert (spa.exchange.local, spa.exchange.every) == ("pqasgd", 4)
    for M in (1, 8, 64):
        assert cs.config(cs.Problem(n=4096), M, "qsgd[levels=8]", seed=0, steps=5).codec.options == {"levels": 8}


def test_run_uses_its_problems_dimension(monkeypatch):
    """run() without methods runs the paper's methods for its problem's dim (QSGD at 4 levels for dim 16),
    not the default 64's, and sweeps none of them; the runs themselves are stubbed."""
    seen = []

    def fake_job(args):
        (sweep, method, key, value, M, seed), problem, cap = args
        seen.append((sweep, method, problem.dim))
        return dict(sweep=sweep, method=method, lr=problem.lr, knob=key or "", knob_value=value if key else np.nan,
                    workers=M, seed=seed, eps=problem.eps, cap=cap, K=100.0 / M, status="reached",
                    steps=int(100 / M), dist_final=0.01, bits_up=32.0, seconds=0.0)

    monkeypatch.setattr(cs, "_job", fake_job)
    res = cs.run(None, workers=(1, 2, 4), seeds=(0,), problem=cs.Problem(dim=16, n=4096), fixed_M=2, lr_grid=(),
                 quiet=True)
    methods = set(res["speedup_runs"].method)
    assert set(cs.paper_methods(16)) <= methods and "qsgd[levels=8]" not in methods
    assert {d for _, _, d in seen} == {16}
    swept = {m for s, m, _ in seen if s == "compression"}
    assert swept and not swept & set(cs.paper_methods(16))
    row = res["speedup_runs"][res["speedup_runs"].method == "qsgd[levels=4]"].iloc[0]
    assert "levels=4" in row.codec_options


@pytest.mark.parametrize("method, bits", [("fp32", 32.0), ("topk+ef", None), ("scaled_sign+ef", None),
                                          ("powersgd", 32.0), ("terngrad+pqasgd", None), ("fp32+pqasgd", 8.0),
                                          ("qsgd[levels=8]", None)])
def test_bits_up_counts_every_kind_of_codec(method, bits):
    """bits_up > 0 for error feedback (the inner codec encodes) and PowerSGD (two rounds; on the least-squares
    vector it sends float32: 32 bits); PQASGD sends every 4th step, a quarter of TernGrad's bits; sparse
    parameter averaging a quarter of fp32's."""
    cfg = cs.config(cs.Problem(n=4096), 4, method, seed=0, steps=8)
    got = cs.hitting_time(cfg, 1e-12)["bits_up"]
    if bits is not None:
        assert got == pytest.approx(bits)
    assert 0 < got < 32.5
    if method == "terngrad+pqasgd":
        tern = cs.hitting_time(cs.config(cs.Problem(n=4096), 4, "terngrad", seed=0, steps=8), 1e-12)["bits_up"]
        assert got == pytest.approx(tern / 4)
