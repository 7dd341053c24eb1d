"""REPORT.md's structure from synthetic claims tables, without running any figure script.

`_theme.claim` refuses a row without its kind, a verdict without its test, and a paper claim whose
words are neither quoted nor marked as a paraphrase. `make_report.report` puts the scale caveat at the
top, counts the verdicts separately for the papers' claims, other papers' results and self-checks,
lists every reviewer's question of `reviewers.QUESTIONS` with the rows that answer it (a row named
but absent is marked "row missing"), and the claims out of reach at this scale.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

FIGURES = Path(__file__).resolve().parents[1] / "papers_figures"


@pytest.fixture
def mods(monkeypatch):
    monkeypatch.syspath_prepend(str(FIGURES))
    import _theme
    import make_report
    import reviewers

    return _theme, make_report, reviewers


def test_claim_rows_carry_kind_test_and_quote(mods):
    theme, _, _ = mods
    row = theme.claim("c", '"exact words" (abstract)', "1.0", True, kind="paper claim", test="TOST, margin 1",
                      setting="s", scale="convnet")
    assert list(row) == theme.CLAIM_COLUMNS and row["verdict"] == "confirmed"
    assert "23,882 parameters" in row["scale"]
    with pytest.raises(TypeError):
        theme.claim("c", '"w"', "1", True)                                   # no kind
    with pytest.raises(ValueError, match="needs the test"):
        theme.claim("c", '"w"', "1", True, kind="paper claim")
    with pytest.raises(ValueError, match="quoted or marked"):
        theme.claim("c", "Sec. 3: roughly so", "1", False, kind="paper claim", test="t")
    assert theme.claim("c", "paraphrase: so", "1", None, kind="other paper's result")["verdict"] == "n/a"
    assert theme.claim("c", "x", "1", {"verdict": "inconclusive", "test": "TOST"}, kind="self-check")["test"] == "TOST"
    with pytest.raises(ValueError):
        theme.claim("c", "x", "1", True, kind="a guess", test="t")


def _write(out: Path, name: str, rows: list[dict]) -> None:
    pd.DataFrame(rows).to_csv(out / f"{name}_claims.csv", index=False)


def test_report_counts_kinds_and_answers_every_question(mods, tmp_path):
    theme, mr, rv = mods
    script = tmp_path / "fig99_fake.py"
    script.write_text("# %% [markdown]\n# # Fig. 99: fake\n#\n# A fake figure.\n")
    answered = rv.QUESTIONS[0]["rows"][0]                     # (figure, claim) of the first question
    _write(tmp_path, "fig99_fake", [
        theme.claim("p1", '"w" (abstract)', "m", True, kind="paper claim", test="TOST"),
        theme.claim("p2", "paraphrase: w", "m", "inconclusive", kind="paper claim", test="TOST"),
        theme.claim("o1", "paraphrase: QSGD", "m", False, kind="other paper's result", test="slope"),
        theme.claim("s1", "THEORY", "m", True, kind="self-check", test="exact"),
        theme.claim("s2", "THEORY", "m", None, kind="self-check")])
    # the first question's first row, under the figure name it cites
    other = tmp_path / f"{answered[0]}_x.py"
    other.write_text("# %% [markdown]\n# # other\n")
    _write(tmp_path, f"{answered[0]}_x", [theme.claim(answered[1], "paraphrase: q", "m", True, kind="paper claim",
                                                      test="t")])
    text = mr.report([other, script], [{"script": "fig99_fake.py", "seconds": 1.0, "returncode": 0}], tmp_path,
                     tmp_path / "REPORT.md", quick=False, seconds=1.0)
    head = text[:text.index("## Summary")]
    assert "23,882 parameters" in head and "640 weights" in head and "64 dimensions" in head and "fig06" in head
    counts = re.search(r"\| paper claim \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|", text).groups()
    assert counts == ("2", "0", "1", str(len(rv.UNTESTABLE)), "0"), counts
    assert re.search(r"\| other paper's result \| 0 \| 1 \| 0 \| 0 \| 0 \|", text)
    assert re.search(r"\| self-check \| 1 \| 0 \| 0 \| 0 \| 1 \|", text)
    section = text[text.index("## Reviewers' questions"):]
    assert section.count("\n| Wen et al.") + section.count("\n| Jiang") == len(rv.QUESTIONS)
    assert f"{answered[0]}: {answered[1]} (confirmed)" in section
    assert "(row missing)" in section                         # the other questions' rows are absent here
    assert "## Claims out of reach at this scale" in text and text.count("untestable here") >= len(rv.UNTESTABLE)
    assert "| claim | paper's words | setting | measured | test | verdict | scale |" in text


def test_every_question_names_rows_or_says_why_not(mods):
    _, _, rv = mods
    papers = {q["paper"] for q in rv.QUESTIONS}
    assert papers == {rv.TERNGRAD, rv.JIANG}
    for q in rv.QUESTIONS:
        assert q["rows"] or q["note"], q
        assert all(f.startswith("fig") and len(f) == 5 for f, _ in q["rows"]), q
    for row in rv.UNTESTABLE:
        assert row["verdict"] == "untestable here" and "Would test it" in row["measured"]
