"""Run every figure script (`figNN_*.py`) and write REPORT.md with each figure and its claims table.

    python papers_figures/make_report.py [--quick] [--only fig02,fig05] [--rerun-compare] [--no-run] [--quiet]

`make figures` runs it (`make figures QUICK=1` passes --quick). Each script runs in its own process
(`python SCRIPT [--quick]`, its log in out/logs/ or out/quick/logs/). On stdout, terminal or not
(batch jobs, CI), one plain line as each script starts and one as it ends:

    [figures 3/10] fig03_workers_scaling: started
    [figures 3/10] fig03_workers_scaling: done in 41.2 s, exit 0

and, on a terminal, a progress bar over the scripts on stderr (hidden under CI, as
`_common.progress` does); `--quiet` silences the lines and the bar. A script that fails does not
stop the others; the report lists it and the command exits with status 1.

REPORT.md: papers_figures/REPORT.md (quick: out/quick/REPORT.md; with TGSIM_FIGURES_OUT set, the full
report goes to that folder): a scale caveat (CAVEAT: model sizes, emulated links, modeled parts); the bits
accounting, said once (BITS_NOTE: fp32 32 + 32, fp16/bf16 16 + 16 bits per element per step on the parameter
server every codec uses; TernGrad's exact-sum downlink, not the paper's 2-bit one); the
summary, counting verdicts separately for the papers' claims, other papers' results and self-checks
(`_theme.KINDS`; `summary_counts`: a claim tested by several rows counted once, its other rows "supporting",
placeholders not counted, reviewer-question rows that re-test a claim on a line of their own, `_theme.ROLES`),
with every verdict's test, what it hinges on (the row's note) and a short scale; the reviewers' questions of both papers with the rows that
answer them (`reviewers.QUESTIONS`); then per figure its PNG (relative link), PDF, CSV, runtime and
claims table (the paper's words, the setting, the number measured, the test, the verdict, the scale);
last, the claims out of reach at this scale (`reviewers.UNTESTABLE`). The `tgsim compare` runs that fig05 and fig07-10 share are kept
in out/compare-*/ and reused by a full run (--rerun-compare runs them again); the quick form always
runs them again. timings.csv beside REPORT.md holds the seconds per script. The first line of
REPORT.md is the run's provenance stamp (the commit it ran from, whether the checkout had changes,
QUICK, --only, failed scripts: papers_figures/publish_report.py), also kept in provenance.json for
--no-run; `make figures-publish` copies a clean full run's report into docs/report/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
PROVENANCE = "provenance.json"   # the run's stamp (publish_report.stamp), beside timings.csv
sys.path.insert(0, str(HERE))
from _common import OUT, QUICK_OUT, progress_disabled  # noqa: E402
from _rules import NO_LOSS_RULE  # noqa: E402
from _theme import UNCHECKED  # noqa: E402
from publish_report import ROOT, stamp  # noqa: E402
from tqdm import tqdm  # noqa: E402


def scripts(only: str = "") -> list[Path]:
    found = sorted(HERE.glob("fig[0-9][0-9]_*.py"))
    keep = {x.strip() for x in only.split(",") if x.strip()}
    return [p for p in found if not keep or p.name[:5] in keep]


def header(path: Path) -> tuple[str, str]:
    """(title, first paragraph) of a script's `# %% [markdown]` header."""
    lines = []
    for line in path.read_text().splitlines()[1:]:
        if not line.startswith("#") or line.startswith("# %%"):
            break
        lines.append(line[2:] if line.startswith("# ") else "")
    title = lines[0].lstrip("# ").strip() if lines else path.stem
    body, para = lines[1:], []
    for line in body:
        if not line.strip() and para:
            break
        if line.strip():
            para.append(line.strip())
    return title, " ".join(para)


def say(line: str, quiet: bool) -> None:
    """One plain progress line on stdout, flushed at once (a pipe buffers otherwise); beside a bar
    on the same terminal through tqdm.write; nothing when `quiet`."""
    if not quiet:
        tqdm.write(line, file=sys.stdout)
        sys.stdout.flush()


def run_all(paths: list[Path], quick: bool, logs: Path, quiet: bool = False) -> list[dict]:
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MPLBACKEND": "Agg"}
    rows = []
    with tqdm(paths, desc="figures", unit="script", file=sys.stderr, disable=True if quiet else progress_disabled(),
              dynamic_ncols=True) as bar:
        for i, p in enumerate(bar, 1):
            bar.set_postfix_str(p.stem)
            tag = f"[figures {i}/{len(paths)}] {p.stem}"
            say(f"{tag}: started", quiet)
            t0 = time.perf_counter()
            with open(logs / f"{p.stem}.log", "w") as log:
                rc = subprocess.run([sys.executable, str(p), *(["--quick"] if quick else [])], env=env,
                                    stdout=log, stderr=subprocess.STDOUT).returncode
            seconds = time.perf_counter() - t0
            rows.append({"script": p.name, "seconds": round(seconds, 1), "returncode": rc})
            say(f"{tag}: done in {seconds:.1f} s, exit {rc}", quiet)
            if rc:
                tqdm.write(f"{p.name} failed (exit {rc}); see {logs / (p.stem + '.log')}", file=sys.stderr)
    return rows


CAVEAT_TEXT = [
    "> **Scale.** Every measurement here is small: the MNIST-1D convnet has 23,882 parameters (4,000 training "
    "samples), logistic regression 640 weights, least squares 64 dimensions (fig04: 16), the MLP runs on "
    "scikit-learn's 1,797 digits; fig11's torch models are a GroupNorm ResNet of 5,122 parameters (digits) "
    "and a character transformer of 82,665 (the standard library's source); the TernGrad abstract names AlexNet "
    "and GoogLeNet (the papers' datasets and clusters are in their bodies, not at hand). Workers are simulated in "
    "one process; the only link measured is an emulated 1 Gb/s "
    "loopback (tc, 2-4 ranks on one machine){bench}. fig06 (panels a-f) is the performance model's arithmetic, "
    "not a measurement. A verdict says what the data show at this scale; each row's `scale` column says "
    "what it rests on; the summary's tables carry a short form of it.",
]


def reused_runs(out: Path) -> str:
    """The earlier runs this report's scripts read rather than ran (out/compare-*/, out/real-models/): each
    folder with the time its newest file was written (no commit is recorded for them); "" when none."""
    found = []
    for d in sorted([*out.glob("compare-*"), out / "real-models"]):
        files = [f for f in d.rglob("*") if f.is_file()] if d.is_dir() else []
        if files:
            when = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(max(f.stat().st_mtime for f in files)))
            found.append(f"{d.name}/ (last written {when})")
    return ("> **Reused runs.** Some scripts read earlier runs kept in the output folder instead of running them "
            "again (their commit is not recorded): " + ", ".join(found) + ".") if found else ""


def caveat(s: pd.DataFrame | None = None) -> list[str]:
    """The scale caveat; when fig06's bench row (`s`, the claims) says its CSV was written by a QUICK bench,
    the caveat says so beside "the only link measured", with the steps and cores the row names."""
    bench = ""
    if s is not None and len(s) and "measured" in s:
        rows = s[(s.get("figure", "") == "fig06") & s.measured.astype(str).str.contains("QUICK (tgsim bench", regex=False)]
        if len(rows):
            m = re.search(r"QUICK \(tgsim bench exchange --quick(?:: ([^)]*))?\)", str(rows.measured.iloc[0]))
            bench = (", and fig06 (g) read a QUICK bench of it (tgsim bench exchange --quick"
                     + (f": {m.group(1)}" if m and m.group(1) else "") + "), a smoke run, not a timing")
    return [CAVEAT_TEXT[0].replace("{bench}", bench)]


CAVEAT = caveat()
# the bits accounting of every "of fp32's bits", "x fewer bits" and "parameter server" in the report (fig08,
# fig11: compare_bits.matched_bits), said once at the top
BITS_NOTE = ("> **Bits.** Every \"of fp32's bits\", \"x fewer bits\" and \"parameter server\" below (fig08, fig11) "
             "counts every method on one exchange, the same parameter server: fp32 is charged 32 bits up + 32 down "
             "per element per step, fp16 and bf16 16 + 16, every codec its measured payloads up and down on that "
             "server. TernGrad's downlink there is tgsim's exact-sum downlink (the server sends the sum of the N "
             "workers' codes, ceil(log2(2N+1)) bits per element: 5 at N = 8), not the paper's re-ternarized 2-bit "
             "one; fig06 models both.")
BITS_WORDS = ("of fp32's bits", "fewer bits", "x fewer", "parameter server")


def bits_note(s: pd.DataFrame | None) -> str:
    """BITS_NOTE when some row of the claims `s` speaks of bits against fp32's or of the parameter server
    (BITS_WORDS, or a row of fig08 or fig11); "" otherwise."""
    if s is None or not len(s):
        return ""
    text = s.reindex(columns=["claim", "measured", "setting", "test"]).astype(object).fillna("").astype(str) \
        .agg(" ".join, axis=1)
    fig = s["figure"].astype(str) if "figure" in s else pd.Series("", index=s.index)
    hit = fig.isin(["fig08", "fig11"]) | text.apply(lambda t: any(w in t for w in BITS_WORDS))
    return BITS_NOTE if hit.any() else ""
KIND_TITLES = {"paper claim": "The papers' claims about their own method, under their own rule (Wen et al. 2017, "
                              "Jiang & Agrawal 2018)",
               "paper claim (proxy)": "The papers' claims judged on a stand-in: a quantity the claim implies "
                                      "(the quantizer's error for 'improves convergence', bits for communication "
                                      "time, modeled for measured time), or this repository's small models and data "
                                      "for the paper's (AlexNet, GoogLeNet, CIFAR-10), or the paper's method run outside its own "
                                      "conditions (PQASGD with TernGrad's 3 levels)",
               "model arithmetic": "The performance model's arithmetic (formulas, no measurement), under the paper's "
                                   "2-bit downlink",
               "tgsim variant": "The claims tested on tgsim's variants (MEAN sharing, exact-sum downlink; the "
                                "performance model under the exact-sum downlink among them), not the papers' method",
               "reviewer question": "The reviewers' questions, answered with data (16-bit baselines, tuned rates)",
               "other paper's result": "Other papers' results (QSGD, Stich et al., Suresh et al., SGD theory)",
               "self-check": "Self-checks of tgsim's code"}
SUMMARY_VERDICTS = ("confirmed", "conditional", "not confirmed", "split", "inconclusive", "untestable here", "n/a")
COLUMNS = ["claim", "paper", "setting", "measured", "test", "verdict", "scale", "rows"]
# rows written before the `role` column: a placeholder says it points to another row's runs
PLACEHOLDER_WORDS = "not counted again"
RETEST_LINE = "reviewer question (re-test)"


def _cell(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def with_note(verdict: str, note: str) -> str:
    """A verdict and what it hinges on ("not confirmed: 1 of 36 runs diverged ..."), the verdict said once
    when the note starts with it."""
    note = str(note or "").strip()
    if not note:
        return verdict
    return note if note.startswith(verdict) else f"{verdict}: {note}"


def claims_table(claims: pd.DataFrame, rows_dir: str = "") -> str:
    """A claims CSV as a markdown table: claim, the words tested and where they are, setting, measured,
    test, verdict (bold unless confirmed or n/a), scale, and a link to the rows the verdict used
    (`rows_dir`: their folder relative to the report, e.g. "out/")."""
    c = claims.reindex(columns=COLUMNS + ["note", "role"]).astype(object).fillna("")
    out = ["| claim | words tested (source) | setting | measured | test | verdict | scale | rows |",
           "|---|---|---|---|---|---|---|---|"]
    for r in c.itertuples(index=False):
        cells = [_cell(getattr(r, k)) for k in COLUMNS]
        cells[5] = f"**{cells[5]}**" if cells[5] not in ("confirmed", "n/a", "") else cells[5]
        if str(r.note).strip():
            cells[5] += f" ({_cell(with_note(str(r.verdict), r.note).removeprefix(str(r.verdict) + ': '))})"
        if str(r.role).strip() in ("supporting", "placeholder"):
            cells[5] += f" [{r.role}: not counted in the summary]"
        cells[7] = f"[{cells[7].rsplit('/', 1)[-1]}]({rows_dir}{cells[7]})" if cells[7] else "-"
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def short_scale(scale: str) -> str:
    """A row's scale in a few words for the summary: each "; "-part up to its first " (" and its first
    two comma-separated pieces ("MNIST-1D convnet, 23,882 parameters; ...")."""
    parts = []
    for part in str(scale).split("; "):
        part = part.split(" (")[0].strip()
        if part:
            parts.append(", ".join(part.split(", ")[:2]))
    return "; ".join(parts) or "-"


def roles(s: pd.DataFrame) -> pd.Series:
    """Each row's role (_theme.ROLES): its `role` column, or "placeholder" for a row that points to another
    row's runs (PLACEHOLDER_WORDS in `measured`) and names no role."""
    role = s["role"].astype(object).fillna("").astype(str) if "role" in s else pd.Series("", index=s.index)
    measured = s["measured"].astype(object).fillna("").astype(str) if "measured" in s else pd.Series("", index=s.index)
    return role.where((role != "") | ~measured.str.contains(PLACEHOLDER_WORDS, regex=False), "placeholder")


LINES = [k for kind in KIND_TITLES for k in ((kind, RETEST_LINE) if kind == "reviewer question" else (kind,))]
# lines whose rows are grouped together by claim: a reviewer's re-test of a claim the proxy line already tests
# (the same quoted words, e.g. the AlexNet sentence at each method's tuned rate) is that claim's supporting row
FAMILIES = {RETEST_LINE: "paper claim (proxy)"}
QUOTE = re.compile(r'^\s*["“](.+?)["”]', re.S)


def claim_key(paper: str, key: str = "") -> str:
    """The claim a row tests: its `key` when given, else its quoted words (whitespace folded); "" for a
    paraphrase or a reference (such a row is a claim of its own unless it names a key)."""
    if str(key or "").strip():
        return "key: " + str(key).strip()
    m = QUOTE.match(str(paper or ""))
    return "quote: " + " ".join(m.group(1).split()) if m else ""


def combined_verdict(verdicts, at_best_inconclusive: bool = False) -> str:
    """One claim's verdict over the verdicts of its counted rows (analysis.verdicts.combine: all agree ->
    that verdict; passed with a condition -> "conditional"; differing -> "split"); a row already "split"
    makes the claim split, "untestable here" rows count only when nothing else tested the claim.
    at_best_inconclusive: a claim no row can confirm (_rules.NO_LOSS_RULE: "no accuracy loss" at margin
    0), where a loss shown by any row refutes it: combine(best="inconclusive")."""
    from tgsim.analysis.verdicts import PASSED, combine
    v = [x for x in verdicts if x not in ("n/a", "")]
    tested = [x for x in v if x != "untestable here"]
    if not tested:
        return "untestable here" if v else "n/a"
    if at_best_inconclusive and not any(x in PASSED or x == "split" for x in tested):
        return combine(tested, best="inconclusive")
    if "split" in tested:
        return "split"
    return combine(tested)


def claim_groups(s: pd.DataFrame) -> pd.DataFrame:
    """How the summary counts each row, one claim once: `s` with count_role (roles), count_line (its summary
    line), group (the claim: claim_key within the line, or the re-test line grouped with the proxy line,
    FAMILIES), counted (the one row that counts the claim: the first row of the first line among the
    claim's rows that are neither supporting nor placeholders), combined (that row's claim verdict over
    all those rows, combined_verdict; "" elsewhere), n_rows (how many rows it combines) and counted_with
    ("figure: claim" of the counting row, for the claim's other rows). A row without a key or quoted words
    is a claim of its own."""
    s = s.fillna("").reset_index(drop=True)
    s = s.assign(count_role=roles(s))
    s["count_line"] = s.kind.where(~((s.kind == "reviewer question") & (s.count_role == "re-test")), RETEST_LINE)
    keys = [claim_key(p, k) for p, k in zip(s.paper, s["key"] if "key" in s else [""] * len(s))]
    s["group"] = [f"{FAMILIES.get(line, line)} | {k or f'row {i}'}" for i, (line, k) in enumerate(zip(s.count_line, keys))]
    rank = s.count_line.map({line: i for i, line in enumerate(LINES)}).fillna(len(LINES))
    s["counted"], s["combined"], s["n_rows"], s["counted_with"] = False, "", 0, ""
    eligible = ~s.count_role.isin(["supporting", "placeholder"])
    for _, g in s[eligible].groupby("group", sort=False):
        first = g.assign(rank=rank[g.index]).sort_values("rank", kind="stable").index[0]
        no_loss = "test" in g and all(NO_LOSS_RULE in str(t) for t, v in zip(g.test, g.verdict)
                                          if v not in ("n/a", "", "untestable here"))
        s.loc[first, ["counted", "combined", "n_rows"]] = [True, combined_verdict(g.verdict, no_loss), len(g)]
        others = [i for i in g.index if i != first]
        s.loc[others, "counted_with"] = f"{s.figure[first] if 'figure' in s else ''}: {s.claim[first]}"
    return s


def summary_counts(s: pd.DataFrame) -> pd.DataFrame:
    """Verdict counts per summary line (index: KIND_TITLES' kinds, with RETEST_LINE after "reviewer
    question"), columns SUMMARY_VERDICTS, "not counted" and "words not at hand". Only what each line tests
    is counted, and one claim once (claim_groups): the rows that test one claim (the same key or quoted
    words; the re-test line's rows grouped with the proxy line's) count once, on the line of their first
    row, under their combined verdict (combined_verdict); the claim's other rows, a row with role
    "supporting" and a "placeholder" (no measurement of its own) go to "not counted"; a reviewer-question
    row with role "re-test" (it re-tests a claim rather than answers a question) is counted on
    RETEST_LINE unless the proxy line tests the same claim. `s`: the claims, or claim_groups' result."""
    s = s if "counted" in s else claim_groups(s)
    out = []
    for line in LINES:
        k = s[s.count_line == line]
        counted = k[k.counted]
        c = counted.combined.value_counts()
        unchecked = int(((counted.paper.str.contains(UNCHECKED, regex=False)
                          | (counted.kind == "other paper's result")) & (counted.combined != "n/a")).sum())
        out.append({"line": line, **{v: int(c.get(v, 0)) for v in SUMMARY_VERDICTS},
                    "not counted": len(k) - len(counted), "words not at hand": unchecked})
    return pd.DataFrame(out).set_index("line")


def summary_lines(s: pd.DataFrame) -> list[str]:
    """The summary: verdict counts per kind of row (`_theme.KINDS`: the papers' claims under their own
    rule, the model's arithmetic, tgsim's variants, reviewers' questions, other papers' results,
    self-checks), each kind counted apart (`summary_counts`), then one table per kind (figure, claim,
    verdict with what it hinges on, how the row is counted, a short scale, test)."""
    s = claim_groups(s)
    counts = summary_counts(s)
    out = ["## Summary", "", "Each kind of row is counted apart: only the first line counts the papers' claims "
           "about their own method under their own rule; the second counts those claims judged on a stand-in "
           "(another quantity, smaller models, or the method outside the paper's own conditions). A claim tested "
           "by several rows (the same quoted words or claim key: several figures, problems, or fp32's and each "
           "method's tuned rate) is counted once, on the line of its first row, under one verdict combined over its "
           "rows (all agree: that verdict; they differ: split); the others are listed as supporting rows under "
           "\"not counted\", with the placeholders that point to another row's runs. \"conditional\": the test passed but a condition "
           "of the claim's rule was not checked here. Reviewer-question rows that re-test a claim (the paper's or "
           "the reviewer's premise) rather than answer a question have a line of their own. The last column counts "
           "the rows with a verdict whose words come from text that was not at hand: a "
           "paraphrase of the papers' bodies or of Jiang & Agrawal's abstract (marked \"not checked here\" in the "
           "row), and every other paper's result (QSGD, Stich et al., Suresh et al., SGD theory: paraphrased, "
           "their texts not at hand).",
           "", "| kind | " + " | ".join(SUMMARY_VERDICTS) + " | not counted | words not at hand |",
           "|---" * (len(SUMMARY_VERDICTS) + 3) + "|"]
    for line, r in counts.iterrows():
        out.append(f"| {line} | " + " | ".join(str(r[v]) for v in SUMMARY_VERDICTS)
                   + f" | {r['not counted']} | {r['words not at hand']} |")
    out.append("")
    titles = dict(KIND_TITLES)
    titles[RETEST_LINE] = ("Reviewer-question rows that re-test a claim (the paper's, or the reviewer's premise) in the "
                           "reviewer's setting, rather than answer a question")
    for line in LINES:
        k = s[s.count_line == line]
        if k.empty:
            continue
        c = counts.loc[line]
        out += [f"### {titles[line]}", "", ", ".join(f"{c[v]} {v}" for v in SUMMARY_VERDICTS[:-1])
                + f", {c['n/a']} measured without a verdict"
                + (f"; {c['not counted']} listed but not counted (supporting rows, placeholders)" if c["not counted"]
                   else "") + ".", "",
                "| figure | claim | verdict | counted | scale | test |", "|---|---|---|---|---|---|"]
        for r in k.itertuples():
            note = str(getattr(r, "note", "") or "")
            counted = {"supporting": "no: supporting row", "placeholder": "no: placeholder"}.get(r.count_role, "yes")
            if r.counted and r.n_rows > 1:
                counted = f"yes, once for the claim's {r.n_rows} rows: {r.combined}"
            elif r.counted_with:
                counted = f"no: supporting row (the claim is counted once, with {r.counted_with})"
            out.append(f"| {r.figure} | {_cell(r.claim)} | {_cell(with_note(r.verdict, note))} | "
                       f"{counted} | {_cell(short_scale(getattr(r, 'scale', '')))} | {_cell(r.test)} |")
        out.append("")
    return out


def reviewers_lines(s: pd.DataFrame, questions: list[dict]) -> list[str]:
    """The reviewers' questions: each with the figure rows that answer it (their verdicts), a row
    named but absent marked "(row missing)", and the note."""
    have = {(r.figure, r.claim): r.verdict for r in s.itertuples()}
    out = ["## Reviewers' questions", "", "The public reviews of both papers (TernGrad: NIPS 2017, paper 970; Jiang "
           "& Agrawal: NeurIPS 2018, paper 1261, on papers.nips.cc), each question in a few words, with the rows of "
           "this report that answer it or why it cannot be answered here.", "",
           "| paper | reviewer | question | answered by | note |", "|---|---|---|---|---|"]
    for q in questions:
        rows = "; ".join(f"{f}: {c} ({have[(f, c)]})" if (f, c) in have else f"{f}: {c} (row missing)"
                         for f, c in q["rows"]) or "-"
        out.append(f"| {q['paper']} | {q['reviewer']} | {_cell(q['question'])} | {_cell(rows)} | {_cell(q['note'])} |")
    return out + [""]


def report(paths: list[Path], timings: list[dict], out: Path, target: Path, quick: bool, seconds: float,
           provenance: dict | None = None) -> str:
    """REPORT.md's text; `provenance` (publish_report.stamp) goes on its first line."""
    from publish_report import stamp_line
    from reviewers import QUESTIONS, UNTESTABLE

    rel = lambda p: os.path.relpath(p, target.parent)  # noqa: E731
    t = {r["script"]: r for r in timings}
    parts, summary = [], []
    for p in paths:
        title, about = header(p)
        png, claims_csv = out / f"{p.stem}.png", out / f"{p.stem}_claims.csv"
        r = t.get(p.name, {})
        status = "ok" if r.get("returncode") == 0 else f"FAILED (exit {r.get('returncode')})"
        parts.append(f"## {title}\n\n`python papers_figures/{p.name}{' --quick' if quick else ''}`: "
                     f"{r.get('seconds', float('nan')):.0f} s, {status}.\n\n{about}\n")
        if png.exists():
            parts.append(f"![{p.stem}]({rel(png)})\n\n[PDF]({rel(out / (p.stem + '.pdf'))}) · "
                         f"[data (CSV)]({rel(out / (p.stem + '.csv'))})\n")
        if claims_csv.exists():
            c = pd.read_csv(claims_csv, keep_default_na=False)
            parts.append(claims_table(c, rows_dir=rel(out) + "/") + "\n")
            summary.append(c.assign(figure=p.stem[:5]))
    untestable = pd.DataFrame(UNTESTABLE).assign(figure="-")
    parts += ["## Claims out of reach at this scale", "", claims_table(untestable.drop(columns="rows", errors="ignore")),
              ""]
    summary.append(untestable)
    lines = ([stamp_line(provenance)] if provenance else []) + [
             f"# The papers' claims, checked{' (QUICK form)' if quick else ''}", "",
             f"Generated by `python papers_figures/make_report.py{' --quick' if quick else ''}` "
             f"({time.strftime('%Y-%m-%d %H:%M %Z')}, {seconds / 60:.1f} min for {len(paths)} scripts"
             + (f", commit {provenance['commit'][:12] or 'unknown'}{' with uncommitted changes' if provenance['dirty'] else ''}"
                if provenance else "") + ").", "", *caveat(pd.concat(summary, ignore_index=True)), "",
             *([bits_note(pd.concat(summary, ignore_index=True)), ""]
               if bits_note(pd.concat(summary, ignore_index=True)) else []),
             *([reused_runs(out), ""] if reused_runs(out) else [])]
    if quick:
        lines += ["> QUICK form: every script ran its smoke-test size (few steps, few seeds). The code paths "
                  "are the full ones, the numbers are not: do not read the verdicts below as results.", ""]
    s = pd.concat(summary, ignore_index=True)
    lines += summary_lines(s) + reviewers_lines(s, QUESTIONS)
    lines += ["| script | seconds | status |", "|---|---|---|"]
    lines += [f"| {r['script']} | {r['seconds']:.0f} | {'ok' if r['returncode'] == 0 else 'FAILED'} |" for r in timings]
    return "\n".join(lines + ["", *parts])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Run every figure script and write REPORT.md.")
    ap.add_argument("--quick", action="store_true", help="each script's --quick form; report in out/quick/")
    ap.add_argument("--only", default="", help="comma-separated figure prefixes, e.g. fig02,fig05")
    ap.add_argument("--rerun-compare", action="store_true", help="run the shared tgsim compare runs again")
    ap.add_argument("--no-run", action="store_true", help="only write REPORT.md from the outputs and timings.csv "
                    "already there (after rerunning one script by hand)")
    ap.add_argument("--quiet", action="store_true", help="no progress: neither the started / done lines nor the bar")
    args = ap.parse_args(argv)
    out = QUICK_OUT if args.quick else OUT
    out.mkdir(parents=True, exist_ok=True)
    if (args.quick or args.rerun_compare) and not args.no_run:
        for d in out.glob("compare-*"):
            shutil.rmtree(d)
    default_out = "TGSIM_FIGURES_OUT" not in os.environ
    target = out / "REPORT.md" if args.quick or not default_out else HERE / "REPORT.md"
    paths = scripts(args.only)
    if args.no_run:
        timings = pd.read_csv(out / "timings.csv").to_dict("records")
        seconds = sum(r["seconds"] for r in timings)
        saved = out / PROVENANCE
        provenance = json.loads(saved.read_text()) if saved.is_file() else None
    else:
        start = stamp(ROOT, args.quick, args.only, [], 0.0)        # the checkout as the run starts
        t0 = time.perf_counter()
        timings = run_all(paths, args.quick, out / "logs", args.quiet)
        seconds = time.perf_counter() - t0
        pd.DataFrame(timings).to_csv(out / "timings.csv", index=False)
        provenance = {**start, "failed": [r["script"] for r in timings if r["returncode"]], "seconds": round(seconds, 1)}
        (out / PROVENANCE).write_text(json.dumps(provenance, sort_keys=True))
    target.write_text(report(paths, timings, out, target, args.quick, seconds, provenance))
    print(f"wrote {target} ({seconds:.0f} s)")
    failed = [r["script"] for r in timings if r["returncode"]]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
