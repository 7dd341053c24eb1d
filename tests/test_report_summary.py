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
_N = iter(range(10**6))


def _row(kind, verdict, role="", measured="m", paper=None, figure="figXX", claim="c", key=""):
    """One claims row; by default its own quoted words (a claim of its own: rows with the same words or
    key are one claim, counted once)."""
    paper = f'"words {next(_N)}" (somewhere)' if paper is None else paper
    return dict(figure=figure, claim=claim, paper=paper, measured=measured, verdict=verdict, kind=kind,
                setting="", test="t", scale="least squares, 64 dimensions (synthetic)", rows="", role=role, note="",
                key=key)


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


ALEXNET = '"applying TernGrad on AlexNet does not incur any accuracy loss" (abstract)'
GOOGLENET = '"The accuracy loss of GoogLeNet induced by TernGrad is less than 2% on average." (abstract)'
BITS = '"which can aggressively reduce the communication time." (abstract)'
GUIDED = '"we propose layer-wise ternarizing and gradient clipping" (abstract)'


def _one_claim_table() -> pd.DataFrame:
    """The report's case (reader findings 4, §4): one abstract sentence tested by fig08 and fig11, at fp32's
    rate (proxy) and at each method's tuned rate (a reviewer's re-test, or a placeholder), and on tgsim's
    MEAN variant; one sentence holding two claims told apart by their keys; one paraphrase tested twice."""
    proxy, rq, tv = "paper claim (proxy)", "reviewer question", "tgsim variant"
    return pd.DataFrame([
        _row(proxy, "not confirmed", paper=ALEXNET, figure="fig08", claim="AlexNet"),
        _row(rq, "not confirmed", role="re-test", paper=ALEXNET, figure="fig08", claim="AlexNet (tuned rate)"),
        _row(proxy, "not confirmed", paper=ALEXNET, figure="fig11", claim="AlexNet (fp32-lr)"),
        _row(rq, "n/a", role="placeholder", paper=ALEXNET, figure="fig11", claim="AlexNet (own-lr)"),
        _row(tv, "not confirmed", paper=ALEXNET, figure="fig11", claim="AlexNet (MEAN; fp32-lr)"),
        _row(tv, "inconclusive", paper=ALEXNET, figure="fig11", claim="AlexNet (MEAN; own-lr)"),
        _row(proxy, "split", paper=GOOGLENET, figure="fig08", claim="GoogLeNet"),
        _row(rq, "split", role="re-test", paper=GOOGLENET, figure="fig08", claim="GoogLeNet (tuned rate)"),
        _row(proxy, "inconclusive", paper=GOOGLENET, figure="fig11", claim="GoogLeNet (fp32-lr)"),
        _row(proxy, "split", paper=BITS, figure="fig08", claim="bits"),
        _row(rq, "confirmed", role="re-test", paper=BITS, figure="fig08", claim="bits (tuned rate)"),
        _row(proxy, "confirmed", paper=BITS, figure="fig11", claim="bits (fp32-lr)"),
        _row(proxy, "confirmed", paper=GUIDED, figure="fig02", claim="clipping lowers the error", key="clipping"),
        _row(proxy, "confirmed", role="supporting", paper=GUIDED, figure="fig02", claim="layer-wise gap",
             key="layer-wise"),
        _row(proxy, "confirmed", paper=GUIDED, figure="fig10", claim="layer-wise error", key="layer-wise"),
        _row(proxy, "not confirmed", paper="paraphrase: length (Sec. 3.3)", figure="fig01", claim="length",
             key="Sec. 3.3"),
        _row(proxy, "not confirmed", paper="paraphrase: direction (Sec. 3.3)", figure="fig01", claim="direction",
             key="Sec. 3.3"),
        _row(rq, "confirmed", role="re-test", paper='"16bit is reasonably safe" (review)', figure="fig08",
             claim="fp16 saving"),
        _row(rq, "not confirmed", role="re-test", paper='"16bit is reasonably safe" (review)', figure="fig11",
             claim="fp16 saving"),
    ])


def test_a_claim_tested_by_several_rows_is_counted_once_under_its_combined_verdict():
    """The AlexNet sentence (fig08 and fig11, fp32's and the tuned rate) counts once on the proxy line, not
    on the re-test line; GoogLeNet's and the bits sentence once each, split; two claims in one sentence
    (told apart by `key`) count apart; one paraphrased sentence tested twice (fig01) counts once; the
    MEAN variant's rows count once on their own line; a re-test no proxy row tests counts on its line."""
    c = make_report.summary_counts(_one_claim_table())
    proxy = c.loc["paper claim (proxy)"]
    assert (proxy["confirmed"], proxy["not confirmed"], proxy["split"], proxy["inconclusive"]) == (2, 2, 2, 0), proxy
    assert proxy["not counted"] == 5                 # fig11's AlexNet, GoogLeNet, bits; fig02's gap; fig01 direction
    retest = c.loc[make_report.RETEST_LINE]
    assert (retest["split"], retest[list(make_report.SUMMARY_VERDICTS)].sum(), retest["not counted"]) == (1, 1, 4)
    tv = c.loc["tgsim variant"]
    assert (tv["split"], tv["not confirmed"], tv["inconclusive"], tv["not counted"]) == (1, 0, 0, 1)
    total = c[list(make_report.SUMMARY_VERDICTS)].to_numpy().sum() + c["not counted"].sum()
    assert total == len(_one_claim_table())
    text = "\n".join(make_report.summary_lines(_one_claim_table()))
    assert "yes, once for the claim's 3 rows: not confirmed" in text, text
    assert "no: supporting row (the claim is counted once, with fig08: AlexNet)" in text, text
    assert "| paper claim (proxy) | 2 | 0 | 2 | 2 | 0 | 0 | 0 | 5 | 0 |" in text, text


def test_combined_verdict_follows_combine():
    cv = make_report.combined_verdict
    assert cv(["not confirmed", "not confirmed", "n/a"]) == "not confirmed"
    assert cv(["split", "confirmed"]) == "split" and cv(["confirmed", "inconclusive"]) == "split"
    assert cv(["confirmed", "conditional"]) == "conditional"
    assert cv(["untestable here", "confirmed"]) == "confirmed" and cv(["untestable here"]) == "untestable here"
    assert cv(["n/a"]) == "n/a"
    assert make_report.claim_key('"a  b" (x)') == "quote: a b" and make_report.claim_key("paraphrase: a") == ""
    assert make_report.claim_key('"a" (x)', key="k") == "key: k"


def test_a_no_loss_claim_is_refuted_by_any_row_that_shows_a_loss():
    """"No accuracy loss" at margin 0 (_rules.NO_LOSS_RULE in the rows' test) can at best be inconclusive,
    so one row showing a loss makes the claim "not confirmed", not "split"; other claims stay split."""
    from _rules import NO_LOSS_RULE

    cv = make_report.combined_verdict
    assert cv(["inconclusive", "not confirmed"], at_best_inconclusive=True) == "not confirmed"
    assert cv(["inconclusive", "inconclusive", "n/a"], at_best_inconclusive=True) == "inconclusive"
    assert cv(["inconclusive", "not confirmed"]) == "split"
    words = '"does not incur any accuracy loss" (abstract)'
    rows = [dict(_row("paper claim (proxy)", v, paper=words, figure=f), test="t; " + NO_LOSS_RULE)
            for f, v in (("fig08", "inconclusive"), ("fig11", "not confirmed"))]
    g = make_report.claim_groups(pd.DataFrame(rows))
    assert g.combined[g.counted].tolist() == ["not confirmed"]
    plain = make_report.claim_groups(pd.DataFrame([dict(r, test="t") for r in rows]))
    assert plain.combined[plain.counted].tolist() == ["split"]


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
