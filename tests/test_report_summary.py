"""The report's summary counts only what each kind of row tests (papers_figures/make_report.summary_counts):
a claim tested by several rows counts once (the others have role "supporting"), a placeholder that points
to another row's runs is not counted as measured (role "placeholder", or, in a claims CSV written before
the role column, its words "not counted again"), a reviewer-question row that re-tests a claim counts on
a line of its own, and "conditional" (the test passed, a condition of the rule unchecked) is not
"confirmed". Also: the summary's short scale, and the caveat naming a QUICK bench read by fig06 (g).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "papers_figures"))
import _theme  # noqa: E402
import make_report  # noqa: E402

Q = '"words" (somewhere)'


def _row(kind, verdict, role="", measured="m", paper=Q, figure="figXX", claim="c"):
    return dict(figure=figure, claim=claim, paper=paper, measured=measured, verdict=verdict, kind=kind,
                setting="", test="t", scale="least squares, 64 dimensions (synthetic)", rows="", role=role, note="")


def _table() -> pd.DataFrame:
    rows = [
        _row("paper claim", "confirmed"),
        _row("paper claim", "conditional"),                       # the period's condition unchecked
        _row("paper claim", "untestable here"),
        _row("paper claim (proxy)", "confirmed"),                 # the layer-wise claim, counted once ...
        _row("paper claim (proxy)", "confirmed", role="supporting"),   # ... and its two supporting rows
        _row("paper claim (proxy)", "confirmed", role="supporting"),
        _row("paper claim (proxy)", "not confirmed"),
        _row("tgsim variant", "confirmed"),
        _row("tgsim variant", "n/a"),                             # measured without a verdict
        _row("tgsim variant", "n/a", role="placeholder"),
        _row("tgsim variant", "n/a", measured="these are the fp32-lr row's runs, not counted again"),   # older CSV
        _row("reviewer question", "confirmed", role="re-test"),
        _row("reviewer question", "n/a"),
        _row("other paper's result", "not confirmed", paper="paraphrase: someone"),
        _row("other paper's result", "n/a", paper="paraphrase: someone"),
        _row("self-check", "confirmed", paper="tgsim"),
        _row("paper claim (proxy)", "split", paper='"x" (' + _theme.UNCHECKED + ")"),
    ]
    return pd.DataFrame(rows)


def test_summary_counts_only_what_each_kind_tests():
    c = make_report.summary_counts(_table())
    assert list(c.columns) == [*make_report.SUMMARY_VERDICTS, "not counted", "words not at hand"]
    pc = c.loc["paper claim"]
    assert (pc["confirmed"], pc["conditional"], pc["untestable here"], pc["not counted"]) == (1, 1, 1, 0)
    proxy = c.loc["paper claim (proxy)"]
    assert (proxy["confirmed"], proxy["not confirmed"], proxy["split"], proxy["not counted"]) == (1, 1, 1, 2)
    assert proxy["words not at hand"] == 1
    tv = c.loc["tgsim variant"]
    assert (tv["confirmed"], tv["n/a"], tv["not counted"]) == (1, 1, 2)        # both placeholders left out
    assert c.loc["reviewer question"]["confirmed"] == 0 and c.loc["reviewer question"]["n/a"] == 1
    assert c.loc[make_report.RETEST_LINE]["confirmed"] == 1
    other = c.loc["other paper's result"]
    assert (other["not confirmed"], other["n/a"], other["words not at hand"]) == (1, 1, 1)
    assert c.loc["self-check"]["confirmed"] == 1
    assert c[list(make_report.SUMMARY_VERDICTS)].to_numpy().sum() + c["not counted"].sum() == len(_table())


def test_summary_tables_say_how_each_row_is_counted_and_its_scale():
    text = "\n".join(make_report.summary_lines(_table()))
    assert "| kind | confirmed | conditional |" in text
    assert "| paper claim (proxy) | 1 | 0 | 1 | 1 | 0 | 0 | 0 | 2 | 1 |" in text, text
    assert "no: supporting row" in text and "no: placeholder" in text
    assert "| least squares, 64 dimensions |" in text
    assert make_report.RETEST_LINE in text


def test_short_scale_keeps_the_first_two_pieces_of_each_part():
    assert make_report.short_scale("MNIST-1D convnet, 23,882 parameters, 4,000 training samples (the paper: x)"
                                   "; logistic regression, 640 weights") == \
        "MNIST-1D convnet, 23,882 parameters; logistic regression, 640 weights"
    assert make_report.short_scale("") == "-"


def test_caveat_names_a_quick_bench():
    s = pd.DataFrame([_row("self-check", "n/a", figure="fig06", measured="from out/b.csv, written T, QUICK "
                           "(tgsim bench exchange --quick: 3 timed steps, up to 4 ranks on 2 cores): ...")])
    text = make_report.caveat(s)[0]
    assert "QUICK bench" in text and "3 timed steps, up to 4 ranks on 2 cores" in text, text
    assert "QUICK" not in make_report.caveat(None)[0] and "{bench}" not in make_report.caveat(None)[0]


def test_claim_rejects_an_unknown_role_and_keeps_a_known_one():
    with pytest.raises(ValueError, match="role"):
        _theme.claim("c", Q, "m", True, kind="paper claim", test="t", role="counted twice")
    r = _theme.claim("c", Q, "m", "conditional", kind="paper claim", test="t", role="supporting", note="why")
    assert (r["verdict"], r["role"], r["note"]) == ("conditional", "supporting", "why")


def test_a_verdict_and_its_note_say_the_verdict_once():
    assert make_report.with_note("not confirmed", "not confirmed: 1 of 36 runs diverged") == \
        "not confirmed: 1 of 36 runs diverged"
    assert make_report.with_note("conditional", "the period is not checked") == "conditional: the period is not checked"
    assert make_report.with_note("confirmed", "") == "confirmed"
    row = dict(_row("paper claim (proxy)", "not confirmed"), note="not confirmed: 1 of 36 runs diverged")
    text = "\n".join(make_report.summary_lines(pd.DataFrame([row])))
    assert "| not confirmed: 1 of 36 runs diverged |" in text and "not confirmed: not confirmed" not in text


def test_reused_runs_names_each_folder_and_when_it_was_written(tmp_path):
    assert make_report.reused_runs(tmp_path) == ""
    (tmp_path / "compare-bits").mkdir()
    (tmp_path / "compare-bits" / "bits.csv").write_text("x\n1\n")
    os.utime(tmp_path / "compare-bits" / "bits.csv", (1_795_168_800, 1_795_168_800))
    text = make_report.reused_runs(tmp_path)
    assert "compare-bits/ (last written 2026-11-2" in text and "commit is not recorded" in text, text


def test_the_bits_accounting_is_said_once_where_bits_are_compared():
    """Where a row speaks of fp32's bits or the parameter server (fig08, fig11), the report states the
    accounting once (make_report.bits_note): fp32 32 up + 32 down, the 16-bit floats 16 + 16 bits per
    element per step on the same parameter server as every codec, and TernGrad's exact-sum downlink, not
    the paper's 2-bit one; a report with no such row does not."""
    bits = pd.DataFrame([_row("paper claim (proxy)", "confirmed", figure="fig08",
                              measured="logistic: confirmed, 0.19 [0.18, 0.2] of fp32's parameter-server bits")])
    note = make_report.bits_note(bits)
    for words in ("32 bits up + 32 down", "fp16 and bf16 16 + 16", "same parameter server",
                  "ceil(log2(2N+1))", "not the paper's re-ternarized 2-bit"):
        assert words in note, (words, note)
    assert make_report.bits_note(pd.DataFrame([_row("self-check", "confirmed", figure="fig04")])) == ""
    assert make_report.bits_note(None) == ""
