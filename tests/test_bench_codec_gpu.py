"""`tgsim bench codec --backend numpy|cupy` (tgsim.bench.codec_gpu, issue 23 items 3-4): the same rows
on NumPy (run here, the code path CI can check) and on CuPy (GPU-marked: skipped without a GPU).
Timings are not asserted (machines are shared); the structure of the ratios is."""

from __future__ import annotations

import math

import pytest

from tgsim import backend
from tgsim.bench import codec_gpu
from tgsim.cli import main

SMALL = dict(n_elements=1 << 14, layers=3, layer_elements=500, workers=4, repeats=2)


def _check(rows, backend_name):
    names = [r["row"] for r in rows]
    assert names[:5] == ["read pass, copy", "read pass, kernel", "encode 1 layer", "encode step (3 x 500)",
                         "aggregate 4"]
    assert all(r["backend"] == backend_name for r in rows)
    for r in rows:
        assert math.isfinite(r["x_read"]) and r["x_read"] > 0 and r["ms"] > 0, r
        assert math.isclose(r["x_read"], r["ms"] / r["floor_ms"], rel_tol=1e-9)
    # the floor is the faster of the two read passes
    assert min(rows[0]["x_read"], rows[1]["x_read"]) == 1.0


def test_numpy_backend_rows():
    _check(codec_gpu.run("numpy", **SMALL), "numpy")


def test_cli_quick_prints_the_table(capsys):
    assert main(["bench", "codec", "--backend", "numpy", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "TernGrad on numpy" in out and "encode step (4 x 1000)" in out and "aggregate 8" in out


@pytest.mark.skipif(backend.gpu_available(), reason="CuPy and a GPU are present: the refusal is not reachable")
def test_cupy_backend_without_a_gpu_says_so():
    with pytest.raises(SystemExit, match="no CUDA GPU/CuPy"):
        codec_gpu.run("cupy", **SMALL)


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason="no CUDA GPU (CuPy not installed or no device)")
def test_cupy_backend_rows():
    _check(codec_gpu.run("cupy", **SMALL), "cupy")
