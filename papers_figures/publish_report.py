"""Stamp a report with where it came from, publish a full run's report into docs/report/, check it.

    python papers_figures/publish_report.py [--dest docs/report]     # `make figures-publish`
    python papers_figures/publish_report.py --check [--dest docs/report]

The report of a full `make figures` run is the one generated output the repository keeps
(docs/report/: REPORT.md, the PNGs it shows and the verdicts' input tables, at most `MAX_BYTES` in all).

Stamp. make_report.py writes as the first line of every REPORT.md an HTML comment (invisible when
rendered) holding a JSON object, `stamp()`:
    <!-- tgsim-report {"commit": "<40 hex>", "dirty": false, "quick": false, "only": "", ...} -->
commit: `git rev-parse HEAD` of the checkout the scripts ran from ("" unless papers_figures/ sits at
the top of a git checkout: an installed copy inside another repository's tree is not that commit);
dirty: whether tracked files differed from that commit when the run started (`git status
--porcelain --untracked-files=no`); quick: the --quick form; only: the --only filter ("" = every
script); failed: the scripts that exited non-zero; date (UTC) and seconds of the run.

Publish (`publish`) refuses, with one line naming the reason (exit 2), a report that has no stamp,
is QUICK, ran a subset (--only), ran from a dirty tree or outside git, has failed scripts, or shows
a figure whose runs were not made (fig11 without `make figures-real`: `NOT_RUN`). It
copies REPORT.md into the destination with every image link `out/NAME.png` rewritten to `NAME.png`
and the lines linking the PDFs and CSVs (left in papers_figures/out/, not published) dropped, and
copies those PNGs, and the verdicts' input tables it links (out/inputs/NAME_K.csv -> inputs/NAME_K.csv);
the files it wrote before (REPORT.md, *.png, inputs/*.csv) are replaced, nothing else.

Check (`check_published`) lists what is wrong with a published report: no REPORT.md, no stamp, a
stamp that is not a clean full run, a commit that is not a commit of this repository (`git cat-file
-e SHA^{commit}`), an image link to a missing file, a file the report does not show, more than
MAX_BYTES in all. An empty list: the report is a full run of a commit of this repository.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEST = ROOT / "docs" / "report"
MAX_BYTES = 7_000_000     # REPORT.md, its PNGs (3.7 MB) and the verdicts' input tables (2.1 MB)
STAMP_RE = re.compile(r"^<!-- tgsim-report (\{.*\}) -->$")
NOT_RUN = "not run: make figures-real"     # fig11's mark for real-model runs it did not find
IMAGE_RE = re.compile(r"!\[([^\]]*)\]\((?:out/)?([A-Za-z0-9_.-]+\.png)\)")
ROWS_RE = re.compile(r"\]\((?:out/|\./)?(inputs/[A-Za-z0-9_.-]+\.csv)\)")   # a verdict's rows (_theme.INPUTS)


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def stamp(repo: Path, quick: bool, only: str, failed: list[str], seconds: float, date: str | None = None) -> dict:
    """The provenance of a run from the checkout `repo` (module docstring, Stamp)."""
    top = _git(repo, "rev-parse", "--show-toplevel")
    inside = top.returncode == 0 and Path(top.stdout.strip()).resolve() == Path(repo).resolve()
    head = _git(repo, "rev-parse", "HEAD") if inside else None
    commit = head.stdout.strip() if head is not None and head.returncode == 0 else ""
    status = _git(repo, "status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": bool(status is None or status.returncode or status.stdout.strip()),
            "quick": bool(quick), "only": str(only), "failed": list(failed),
            "date": date or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": round(float(seconds), 1)}


def stamp_line(s: dict) -> str:
    """The report's first line for the stamp `s`."""
    return f"<!-- tgsim-report {json.dumps(s, sort_keys=True)} -->"


def read_stamp(text: str) -> dict | None:
    """The stamp of a report's text (its first line), None when it has none."""
    first = text.split("\n", 1)[0].strip()
    m = STAMP_RE.match(first)
    if not m:
        return None
    try:
        s = json.loads(m.group(1))
    except json.JSONDecodeError:
        return None
    return s if isinstance(s, dict) else None


def stamp_problems(s: dict | None) -> list[str]:
    """Why a stamp is not that of a clean full run ([] when it is)."""
    if s is None:
        return ["no tgsim-report stamp on the first line (write it with papers_figures/make_report.py)"]
    out = []
    if s.get("quick", True):
        out.append("the report is the QUICK form (make figures QUICK=1), not a full run")
    if s.get("only"):
        out.append(f"the report ran only {s['only']!r} (--only), not every script")
    if not re.fullmatch(r"[0-9a-f]{40}", str(s.get("commit", ""))):
        out.append("the run's commit is unknown (not run from a git checkout)")
    if s.get("dirty", True):
        out.append("the run started from a checkout with uncommitted changes to tracked files")
    if s.get("failed"):
        out.append(f"scripts failed in the run: {', '.join(s['failed'])}")
    return out


def content_problems(text: str) -> list[str]:
    """Why a report's text is not complete: a figure marked `NOT_RUN` (fig11's real-model runs, made
    by `make figures-real` before `make figures`)."""
    return [f"a figure says {NOT_RUN!r}: run `make figures-real`, then `make figures`"] if NOT_RUN in text else []


def published_text(text: str) -> str:
    """REPORT.md as published: image links out/NAME.png -> NAME.png, the PDF / CSV link lines dropped."""
    lines = [ln for ln in text.split("\n") if not ln.startswith("[PDF](")]
    text = IMAGE_RE.sub(lambda m: f"![{m.group(1)}]({m.group(2)})", "\n".join(lines))
    return ROWS_RE.sub(lambda m: f"]({m.group(1)})", text)


def row_tables(text: str) -> list[str]:
    """The verdicts' input tables a report links (inputs/NAME_K.csv), in order, once each."""
    return list(dict.fromkeys(m.group(1) for m in ROWS_RE.finditer(text)))


def images(text: str) -> list[str]:
    """The PNG file names a report shows, in order."""
    return [m.group(2) for m in IMAGE_RE.finditer(text)]


def publish(report: Path, dest: Path, max_bytes: int = MAX_BYTES) -> list[Path]:
    """Copy the stamped full-run `report` (its PNGs beside it in out/) into `dest` (module docstring);
    the paths written. ValueError naming the reason for a report it refuses or a PNG it lacks."""
    text = report.read_text()
    problems = stamp_problems(read_stamp(text)) + content_problems(text)
    if problems:
        raise ValueError(f"{report}: not published: " + "; ".join(problems))
    out_dir = report.parent / "out" if (report.parent / "out").is_dir() else report.parent
    text = published_text(text)
    pngs = images(text) + row_tables(text)
    missing = [p for p in pngs if not (out_dir / p).is_file()]
    if missing:
        raise ValueError(f"{report}: not published: the report shows {missing[:3]}, missing in {out_dir}")
    size = len(text.encode()) + sum((out_dir / p).stat().st_size for p in pngs)
    if size > max_bytes:
        raise ValueError(f"{report}: not published: {size:,} bytes with its PNGs, more than {max_bytes:,}")
    dest.mkdir(parents=True, exist_ok=True)
    for old in [dest / "REPORT.md", *dest.glob("*.png"), *dest.glob("inputs/*.csv")]:
        old.unlink(missing_ok=True)
    (dest / "inputs").mkdir(exist_ok=True)
    written = [dest / "REPORT.md"]
    written[0].write_text(text)
    for p in pngs:
        shutil.copyfile(out_dir / p, dest / p)
        written.append(dest / p)
    return written


def check_published(dest: Path, repo: Path = ROOT, max_bytes: int = MAX_BYTES) -> list[str]:
    """What is wrong with the report published in `dest` (module docstring, Check); [] when nothing."""
    report = dest / "REPORT.md"
    if not report.is_file():
        return [f"{report} does not exist"]
    text = report.read_text()
    s = read_stamp(text)
    problems = stamp_problems(s) + content_problems(text)
    if s is not None and re.fullmatch(r"[0-9a-f]{40}", str(s.get("commit", ""))):
        if _git(repo, "cat-file", "-e", f"{s['commit']}^{{commit}}").returncode != 0:
            problems.append(f"commit {s['commit']} is not a commit of the repository at {repo}")
    shown = images(text) + row_tables(text)
    problems += [f"the report shows {p}, which is not in {dest}" for p in shown if not (dest / p).is_file()]
    files = [p for p in dest.rglob("*") if p.is_file()]
    extra = sorted(str(p.relative_to(dest)) for p in files if p.name != "REPORT.md" and str(p.relative_to(dest))
                   not in shown)
    problems += [f"{dest / name} is not shown by the report" for name in extra]
    size = sum(p.stat().st_size for p in files)
    if size > max_bytes:
        problems.append(f"{dest} holds {size:,} bytes, more than {max_bytes:,}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Publish the full make figures run's REPORT.md and PNGs, or check "
                                             "the published report.")
    ap.add_argument("--report", default=str(HERE / "REPORT.md"), help="the full run's report (default %(default)s)")
    ap.add_argument("--dest", default=str(DEST), help="where to publish (default %(default)s)")
    ap.add_argument("--check", action="store_true", help="only check the published report")
    args = ap.parse_args(argv)
    dest = Path(args.dest)
    if not args.check:
        report = Path(args.report)
        if not report.is_file():
            print(f"{report} does not exist: run `make figures` first", file=sys.stderr)
            return 2
        try:
            written = publish(report, dest)
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        print(f"published {len(written)} files into {dest} "
              f"({sum(p.stat().st_size for p in written):,} bytes)")
    problems = check_published(dest)
    for p in problems:
        print(f"problem: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
