"""examples/look_at_runs.ipynb runs as written (nbclient, the venv's own ipykernel) at a small size: its
parameters cell replaced by smaller values, in a copy beside examples/mynets.py in a temporary
folder. The sweep it runs leaves runs.csv with one row per run, the plot and the unbiasedness CSV."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "look_at_runs.ipynb"
SMALL = """STEPS = 6
SEEDS = 1
CODECS = ["fp32", "terngrad"]
LRS = [0.05]
CODEC = "terngrad"
QUICK = True
OUT = "results/notebook-sweep"
"""


def test_the_notebook_runs_a_sweep_and_reads_it_back(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("torch")
    shutil.copy(REPO / "examples" / "mynets.py", tmp_path / "mynets.py")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    params = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1 and "STEPS = " in params[0].source
    params[0].source = SMALL
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
    out = tmp_path / "results" / "notebook-sweep"
    runs = pd.read_csv(out / "runs.csv")
    assert runs["codec.name"].tolist() == ["fp32", "terngrad"] and (runs["steps"] == 6).all()
    assert (out / "plot.png").stat().st_size > 10_000
    checks = pd.read_csv(out / "unbiasedness" / "unbiasedness_codecs.csv")
    assert checks["codec"].tolist() == ["terngrad"]
    summary = nb.cells[3].outputs[0]["data"]["text/plain"]
    assert "accuracy" in summary and "terngrad" in summary
    assert any("image/png" in o.get("data", {}) for o in nb.cells[4].outputs)
