"""`make figures QUICK=1`: papers_figures/make_report.py --quick runs every figure script's quick form
and writes REPORT.md; every figure's PNG, PDF, tidy CSV and claims table exist, are non-empty, and
REPORT.md links each PNG with a relative link.

Every script's figure passed `_layout.check_layout` (the scripts refuse to save a figure that fails
it) and carries the QUICK mark; its CSVs have a `quick` column, True. make_report prints one line as
each script starts and one as it ends, with stdout a pipe; `--quiet` silences them.

The quick report runs once for the module (in a temporary TGSIM_FIGURES_OUT, CI=1, TGSIM_JOBS=2).
`make test` runs the six scripts whose quick forms take about 10 s each (`CHEAP`, `--only`);
`make test-slow` (TGSIM_SLOW) runs all eleven: the five others train or compare on the real models
(fig11 alone about 110 s, the five about 250 CPU-seconds of the suite's budget). Every script's
imports resolve in `make test` either way (test_every_script_imports_what_exists), so a module moved
or renamed under a script fails there. fig03's quick form runs
papers_figures/terngrad_workers_scaling.py's quick form, whose outputs are checked here too
(`fakes.check_sharing_sweep`).
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fakes import check_sharing_sweep

FIGURES = Path(__file__).resolve().parents[1] / "papers_figures"
EXPECTED = ("fig01_gradient_histograms", "fig02_bound_gap", "fig03_workers_scaling", "fig04_convergence",
            "fig05_unbiasedness_variance", "fig06_perfmodel", "fig07_compare_variance", "fig08_compare_bits",
            "fig09_compare_speedup", "fig10_reviewers", "fig11_real_models")
CHEAP = ("fig01_gradient_histograms", "fig02_bound_gap", "fig04_convergence", "fig06_perfmodel",
         "fig07_compare_variance", "fig10_reviewers")
SLOW = bool(os.environ.get("TGSIM_SLOW"))
RUN = EXPECTED if SLOW else CHEAP          # the scripts the module's quick report runs


def _heavy_unless_cheap(names):
    """pytest params: the scripts outside CHEAP marked heavy (run by `make test-slow`)."""
    return [pytest.param(n, marks=() if n in CHEAP else pytest.mark.heavy) for n in names]


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    env = {**{k: v for k, v in os.environ.items() if k != "TGSIM_FIGURES_RERUN"}, "TGSIM_FIGURES_OUT": str(out),
           "MPLBACKEND": "Agg", "CI": "1", "TGSIM_JOBS": "2"}
    only = [] if SLOW else ["--only", ",".join(n.split("_")[0] for n in CHEAP)]
    proc = subprocess.run([sys.executable, str(FIGURES / "make_report.py"), "--quick", *only], env=env,
                          capture_output=True, text=True, timeout=900)
    return out / "quick", proc


@pytest.mark.timeout(900)
def test_every_script_ran(quick_report):
    out, proc = quick_report
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    timings = pd.read_csv(out / "timings.csv")
    assert [s[:-3] for s in timings.script] == list(RUN)
    assert (timings.returncode == 0).all()
    assert f"wrote {out / 'REPORT.md'}" in proc.stdout
    lines = [x for x in proc.stdout.splitlines() if x.startswith("[figures ")]
    assert lines == [x for i, name in enumerate(RUN, 1) for x in (
        f"[figures {i}/{len(RUN)}] {name}: started",
        next(y for y in lines if y.startswith(f"[figures {i}/{len(RUN)}] {name}: done in ")))], lines
    assert all(y.endswith(", exit 0") for y in lines[1::2]), lines
    for line, seconds in zip(lines[1::2], timings.seconds):      # the time printed is the one recorded
        assert re.fullmatch(r"\[figures \d+/\d+\] \w+: done in \d+\.\d s, exit 0", line), line
        assert abs(float(re.search(r"done in (\S+) s", line).group(1)) - seconds) <= 0.06, (line, seconds)
    assert not any(mark in proc.stderr for mark in ("%|", "script/s")), proc.stderr[-2000:]   # no bar under CI


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", _heavy_unless_cheap(EXPECTED))
def test_figure_files_exist_and_are_not_empty(quick_report, name):
    out, _ = quick_report
    for suffix in (".png", ".pdf", ".csv", "_claims.csv"):
        path = out / f"{name}{suffix}"
        assert path.exists() and path.stat().st_size > 0, path
    assert len(pd.read_csv(out / f"{name}.csv")) > 0
    claims = pd.read_csv(out / f"{name}_claims.csv", keep_default_na=False)
    assert list(claims.columns) == ["claim", "paper", "measured", "verdict", "kind", "setting", "test", "scale",
                                    "rows", "role", "note", "key", "quick"] and len(claims) > 0
    assert set(claims.role) <= {"", "supporting", "placeholder", "re-test"}      # _theme.ROLES
    assert claims.quick.astype(str).eq("True").all()
    assert pd.read_csv(out / f"{name}.csv", low_memory=False).quick.astype(bool).all()
    assert set(claims.verdict) <= {"confirmed", "conditional", "not confirmed", "inconclusive", "split", "n/a",
                                   "untestable here"}
    assert set(claims.kind) <= {"paper claim", "paper claim (proxy)", "model arithmetic", "tgsim variant", "reviewer question",
                                "other paper's result", "self-check"}
    assert (claims.measured.str.len() > 0).all()
    decided = claims[claims.verdict.isin(["confirmed", "conditional", "not confirmed", "inconclusive", "split"])]
    assert (decided.test.str.len() > 0).all(), decided       # every verdict names its test
    for rel in decided.rows:             # and the rows it was decided on, written beside the claims
        assert rel and (out / rel).is_file(), (name, rel)


@pytest.mark.timeout(900)
def test_report_links_every_png_and_its_claims(quick_report):
    out, _ = quick_report
    text = (out / "REPORT.md").read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert sorted(links) == sorted(f"{name}.png" for name in RUN)       # relative to REPORT.md
    for link in links:
        assert (out / link).stat().st_size > 0
    header = "| claim | words tested (source) | setting | measured | test | verdict | scale | rows |"
    assert "QUICK form" in text and text.count(header) == len(RUN) + 1      # + the untestable claims
    for kind in ("paper claim", "other paper's result", "self-check"):
        assert re.search(rf"\| {kind} \| \d+ \| \d+ \| \d+ \| \d+ \| \d+ \|", text), kind
    assert "## Reviewers' questions" in text and "23,882 parameters" in text[:text.index("## Summary")]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "papers_figures"))
    import publish_report

    stamp = publish_report.read_stamp(text)                # the first line: the run's provenance
    assert stamp["quick"] and stamp["only"] == ("" if SLOW else ",".join(n.split("_")[0] for n in CHEAP))
    assert stamp["failed"] == []
    assert any("QUICK" in p for p in publish_report.stamp_problems(stamp))     # never published


@pytest.mark.heavy
@pytest.mark.timeout(900)
def test_fig03_ran_the_workers_scaling_sweep(quick_report):
    out, proc = quick_report
    log = (out / "logs" / "fig03_workers_scaling.log").read_text()
    check_sharing_sweep(out, "terngrad_workers_scaling", 3 * 2 * 4, ["optimizer", "workers", "variant"], log)


def _imported_names(script: Path) -> list[tuple[str, str | None, int]]:
    """(module, name or None, line) of every top-level `import m` / `from m import a` in a script."""
    got = []
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Import):
            got += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            got += [(node.module, a.name, node.lineno) for a in node.names]
    return got


@pytest.mark.parametrize("name", EXPECTED)
def test_every_script_imports_what_exists(name, monkeypatch):
    """Each figure script's imports (tgsim, analysis, the papers_figures helpers) resolve to modules
    and names that exist, without running the script: the check `make test` keeps for the scripts
    whose quick forms only `make test-slow` runs."""
    monkeypatch.syspath_prepend(str(FIGURES))
    script = FIGURES / f"{name}.py"
    missing = []
    for module, attr, line in _imported_names(script):
        top = module.split(".")[0]
        if top not in ("tgsim", "analysis") and not top.startswith("_") and not (FIGURES / f"{top}.py").exists():
            continue          # third-party and standard modules: the environment's, checked elsewhere
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{script.name}:{line}: import {module}: {e}")
            continue
        if attr is not None and attr != "*" and not hasattr(mod, attr):
            try:
                importlib.import_module(f"{module}.{attr}")
            except ImportError:
                missing.append(f"{script.name}:{line}: {module} has no {attr}")
    assert not missing, missing


def _make_report(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TGSIM_FIGURES_OUT": str(out), "MPLBACKEND": "Agg", "CI": "1", "TGSIM_JOBS": "2"}
    return subprocess.run([sys.executable, str(FIGURES / "make_report.py"), *args], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.timeout(300)
def test_quiet_prints_no_progress_lines(tmp_path):
    """--quiet (one script, fig06's quick form, the cheapest: the model's arithmetic) prints neither line and still writes the
    figure (the lines themselves, on a pipe and in order: test_every_script_ran)."""
    quiet = _make_report(tmp_path / "quiet", "--quick", "--only", "fig06", "--quiet")
    assert quiet.returncode == 0, quiet.stderr[-4000:]
    assert not [x for x in quiet.stdout.splitlines() if x.startswith("[figures")], quiet.stdout
    assert (tmp_path / "quiet" / "quick" / "fig06_perfmodel.png").stat().st_size > 0
