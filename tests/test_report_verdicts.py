"""REPORT.md's structure from synthetic claims tables, without running any figure script.

`_theme.claim` refuses a row without its kind, a verdict without its test, a paper claim whose words
are neither quoted nor marked as a paraphrase or do not name their source, and a path outside the
repository. `make_report.report` puts the scale caveat at the top, counts the verdicts separately
for each kind (`_theme.KINDS`), links each verdict's input rows, lists every reviewer's question of
`reviewers.QUESTIONS` with the rows that answer it (a row named but absent is marked "row missing"),
and the claims out of reach at this scale. `save` writes each verdict's rows under inputs/.
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
    with pytest.raises(ValueError, match="where a reader finds them"):
        theme.claim("c", '"exact words"', "1.0", True, kind="paper claim", test="t")
    with pytest.raises(ValueError, match="outside the repository"):
        theme.claim("c", '"w" (../shared/seeds/x.txt)', "1", True, kind="reviewer question", test="t")
    assert theme.source("tg-review", "words", n=2) == '"words" (public review of TernGrad, NIPS 2017 (paper 970), ' \
                                                      'reviewer 2)'
    assert theme.UNCHECKED in theme.source("tg-body", "paraphrase: x", where="Table 1")
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
        theme.claim("p1", '"w" (abstract)', "m", True, kind="paper claim", test="TOST",
                    rows=pd.DataFrame({"seed": [0, 1], "x": [0.5, 0.6]})),
        theme.claim("p2", "paraphrase: w (abstract)", "m", "inconclusive", kind="paper claim", test="TOST"),
        theme.claim("v1", "paraphrase: w", "m", "split", kind="tgsim variant", test="TOST"),
        theme.claim("r1", '"q" (review)', "m", False, kind="reviewer question", test="TOST"),
        theme.claim("a1", '"q"', "m", True, kind="model arithmetic", test="formula"),
        theme.claim("o1", "paraphrase: QSGD", "m", False, kind="other paper's result", test="slope"),
        theme.claim("s1", "THEORY", "m", True, kind="self-check", test="exact"),
        theme.claim("s2", "THEORY", "m", None, kind="self-check")])
    # the first question's first row, under the figure name it cites
    other = tmp_path / f"{answered[0]}_x.py"
    other.write_text("# %% [markdown]\n# # other\n")
    _write(tmp_path, f"{answered[0]}_x", [theme.claim(answered[1], "paraphrase: q (abstract)", "m", True,
                                                      kind="paper claim", test="t")])
    text = mr.report([other, script], [{"script": "fig99_fake.py", "seconds": 1.0, "returncode": 0}], tmp_path,
                     tmp_path / "REPORT.md", quick=False, seconds=1.0)
    head = text[:text.index("## Summary")]
    assert "23,882 parameters" in head and "640 weights" in head and "64 dimensions" in head and "fig06" in head
    # columns: confirmed, conditional, not confirmed, split, inconclusive, untestable here, n/a, not counted
    n = r" (\d+) \|" * 8
    counts = re.search(r"\| paper claim \|" + n, text).groups()
    assert counts == ("2", "0", "0", "0", "1", str(len(rv.UNTESTABLE)), "0", "0"), counts
    assert re.search(r"\| tgsim variant \| 0 \| 0 \| 0 \| 1 \| 0 \| 0 \| 0 \| 0 \|", text)
    assert re.search(r"\| reviewer question \| 0 \| 0 \| 1 \| 0 \| 0 \| 0 \| 0 \| 0 \|", text)
    assert re.search(r"\| model arithmetic \| 1 \| 0 \| 0 \| 0 \| 0 \| 0 \| 0 \| 0 \|", text)
    assert re.search(r"\| other paper's result \| 0 \| 0 \| 1 \| 0 \| 0 \| 0 \| 0 \| 0 \|", text)
    assert re.search(r"\| self-check \| 1 \| 0 \| 0 \| 0 \| 0 \| 0 \| 1 \| 0 \|", text)
    section = text[text.index("## Reviewers' questions"):]
    assert section.count("\n| Wen et al.") + section.count("\n| Jiang") == len(rv.QUESTIONS)
    assert f"{answered[0]}: {answered[1]} (confirmed)" in section
    assert "(row missing)" in section                         # the other questions' rows are absent here
    assert "## Claims out of reach at this scale" in text and text.count("untestable here") >= len(rv.UNTESTABLE)
    assert "| claim | words tested (source) | setting | measured | test | verdict | scale | rows |" in text
    assert "../" not in text


def test_save_writes_each_verdicts_rows_and_links_them(mods, tmp_path, monkeypatch):
    theme, mr, _ = mods
    monkeypatch.setattr(theme, "out_dir", lambda quick: tmp_path)
    fig = theme.plt.figure()
    fig.add_subplot().plot([0, 1], [0, 1])
    fig.axes[0].set(xlabel="x", ylabel="y")
    data = pd.DataFrame({"seed": [0, 1, 2], "gap": [0.1, -0.2, 0.3]})
    claims = [theme.claim("a", '"w" (abstract)', "m", True, kind="paper claim", test="t", rows=data),
              theme.claim("b", "x", "m", None, kind="self-check")]
    theme.save(fig, "fig99_fake", pd.DataFrame({"x": [1]}), False, claims)
    c = pd.read_csv(tmp_path / "fig99_fake_claims.csv", keep_default_na=False)
    assert list(c.rows) == ["inputs/fig99_fake_1.csv", ""]
    back = pd.read_csv(tmp_path / "inputs" / "fig99_fake_1.csv")
    assert back.drop(columns="quick").equals(data)
    table = mr.claims_table(c, rows_dir="out/")
    assert "[fig99_fake_1.csv](out/inputs/fig99_fake_1.csv)" in table


def test_every_question_names_rows_or_says_why_not(mods):
    _, _, rv = mods
    papers = {q["paper"] for q in rv.QUESTIONS}
    assert papers == {rv.TERNGRAD, rv.JIANG}
    for q in rv.QUESTIONS:
        assert q["rows"] or q["note"], q
        assert all(f.startswith("fig") and len(f) == 5 for f, _ in q["rows"]), q
    for row in rv.UNTESTABLE:
        assert row["verdict"] == "untestable here" and "Would test it" in row["measured"]
