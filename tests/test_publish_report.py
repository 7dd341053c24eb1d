"""papers_figures/publish_report.py: the report's provenance stamp, publishing a full run into
docs/report/, and the check that the committed report is a clean full run of a commit of this
repository (each refusal with its negative control)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "papers_figures"))

import publish_report as pr  # noqa: E402


def _head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def _full(**changes) -> dict:
    s = {"commit": _head(), "dirty": False, "quick": False, "only": "", "failed": [], "date": "2026-11-28 00:00 UTC",
         "seconds": 1.0}
    return {**s, **changes}


def _run(tmp_path: Path, s: dict, pngs=("fig01_a.png", "fig02_b.png"), rows=("fig01_a_1.csv",)) -> Path:
    """A report as make_report writes it (stamp, image links into out/, PDF / CSV link lines, links to
    the verdicts' rows in out/inputs/) and its PNGs and rows."""
    out = tmp_path / "run" / "out"
    (out / "inputs").mkdir(parents=True)
    body = [pr.stamp_line(s), "# The papers' claims, checked", ""]
    for r in rows:
        (out / "inputs" / r).write_text("seed,x\n0,1\n")
        body += [f"| claim | confirmed | [{r}](out/inputs/{r}) |", ""]
    for p in pngs:
        (out / p).write_bytes(b"\x89PNG" + p.encode() * 10)
        stem = p[:-4]
        body += [f"![{stem}](out/{p})", "", f"[PDF](out/{stem}.pdf) · [data (CSV)](out/{stem}.csv)", ""]
    report = tmp_path / "run" / "REPORT.md"
    report.write_text("\n".join(body))
    return report


def test_stamp_reads_back_and_names_this_checkout(tmp_path):
    """stamp() of this checkout names its HEAD; the line round-trips through read_stamp; outside a git
    checkout, or below its top (an installed copy inside another tree), the commit is '' and the run
    counts as dirty."""
    s = pr.stamp(ROOT, quick=False, only="", failed=[], seconds=3.14159)
    assert s["commit"] == _head() and s["seconds"] == 3.1
    assert pr.read_stamp(pr.stamp_line(s) + "\n# title") == s
    assert pr.read_stamp("# no stamp\n") is None and pr.read_stamp("<!-- tgsim-report [1] -->") is None
    outside = pr.stamp(tmp_path, quick=False, only="", failed=[], seconds=0)
    assert outside["commit"] == "" and outside["dirty"]
    below = pr.stamp(ROOT / "papers_figures", quick=False, only="", failed=[], seconds=0)   # not the checkout's top
    assert below["commit"] == "" and below["dirty"]


def test_publish_copies_a_full_run_and_the_check_passes(tmp_path):
    """A clean full run: REPORT.md with links rewritten to the PNGs beside it, PDF / CSV lines dropped,
    the PNGs copied, an older PNG removed; check_published finds nothing wrong."""
    report = _run(tmp_path, _full())
    dest = tmp_path / "docs" / "report"
    dest.mkdir(parents=True)
    (dest / "old.png").write_bytes(b"old")
    (dest / "inputs").mkdir()
    (dest / "inputs" / "old_1.csv").write_text("old")
    written = pr.publish(report, dest)
    assert sorted(p.name for p in written) == ["REPORT.md", "fig01_a.png", "fig01_a_1.csv", "fig02_b.png"]
    text = (dest / "REPORT.md").read_text()
    assert "![fig01_a](fig01_a.png)" in text and "out/" not in text and "[PDF]" not in text
    assert "[fig01_a_1.csv](inputs/fig01_a_1.csv)" in text and (dest / "inputs" / "fig01_a_1.csv").is_file()
    assert not (dest / "inputs" / "old_1.csv").exists()
    assert not (dest / "old.png").exists()
    assert pr.check_published(dest, ROOT) == []


@pytest.mark.parametrize("change, reason", [
    ({"quick": True}, "QUICK"), ({"only": "fig02"}, "--only"), ({"dirty": True}, "uncommitted"),
    ({"failed": ["fig03_x.py"]}, "fig03_x.py"), ({"commit": ""}, "commit is unknown")])
def test_publish_refuses_a_run_that_is_not_clean_and_full(tmp_path, change, reason):
    """QUICK, --only, a dirty checkout, a failed script, no commit: refused naming the reason, nothing written."""
    report = _run(tmp_path, _full(**change))
    dest = tmp_path / "dest"
    with pytest.raises(ValueError, match=reason):
        pr.publish(report, dest)
    assert not dest.exists()


def test_publish_refuses_a_report_whose_real_model_runs_were_not_made(tmp_path):
    """fig11's table says "not run: make figures-real" when make figures found no real-model runs:
    refused, and the check names it in a published copy."""
    report = _run(tmp_path, _full())
    report.write_text(report.read_text() + "\n| real | n/a | not run: make figures-real (TGSIM_FIGURES_REAL=1) |\n")
    with pytest.raises(ValueError, match="make figures-real"):
        pr.publish(report, tmp_path / "d")
    dest = tmp_path / "ok"
    pr.publish(_run(tmp_path / "b", _full()), dest)
    (dest / "REPORT.md").write_text((dest / "REPORT.md").read_text() + "\nnot run: make figures-real\n")
    assert any("figures-real" in p for p in pr.check_published(dest, ROOT))


def test_publish_refuses_missing_pngs_and_too_many_bytes(tmp_path):
    report = _run(tmp_path, _full())
    (report.parent / "out" / "fig02_b.png").unlink()
    with pytest.raises(ValueError, match="fig02_b.png"):
        pr.publish(report, tmp_path / "d1")
    report = _run(tmp_path / "again", _full())
    with pytest.raises(ValueError, match="more than 10"):
        pr.publish(report, tmp_path / "d2", max_bytes=10)


def test_check_finds_a_foreign_commit_a_missing_or_extra_file_and_the_size(tmp_path):
    """check_published: a commit not in this repository, a shown PNG missing, a file not shown, the
    byte limit, a missing REPORT.md; each named."""
    dest = tmp_path / "d"
    pr.publish(_run(tmp_path, _full()), dest)
    text = (dest / "REPORT.md").read_text()
    (dest / "REPORT.md").write_text(text.replace(_head(), "0" * 40, 1))
    assert any("is not a commit" in p for p in pr.check_published(dest, ROOT))
    (dest / "REPORT.md").write_text(text)
    (dest / "fig01_a.png").unlink()
    (dest / "stray.png").write_bytes(b"x")
    (dest / "inputs" / "fig01_a_1.csv").unlink()
    (dest / "inputs" / "stray_1.csv").write_text("x")
    problems = pr.check_published(dest, ROOT)
    assert any("fig01_a.png, which is not" in p for p in problems) and any("stray.png" in p for p in problems)
    assert any("inputs/fig01_a_1.csv, which is not" in p for p in problems)
    assert any("stray_1.csv is not shown" in p for p in problems)
    assert any("more than 5" in p for p in pr.check_published(dest, ROOT, max_bytes=5))
    assert pr.check_published(tmp_path / "none", ROOT) == [f"{tmp_path / 'none' / 'REPORT.md'} does not exist"]


def test_the_committed_report_is_a_clean_full_run_of_this_repository():
    """docs/report/ (the one generated output the repository keeps): a full, clean, successful
    `make figures` run of a commit of this repository, every PNG it shows present, nothing else,
    at most 5 MB."""
    if not (pr.DEST / "REPORT.md").exists():
        pytest.skip("docs/report/REPORT.md is not committed yet (make figures, then make figures-publish)")
    assert pr.check_published(pr.DEST, ROOT) == []
