"""`dskbench report`: HTML, Markdown and CSV of results files."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from dskbench.frontends.cli.common import EXIT_OK, EXIT_USAGE

OUT_ROOT = Path("out")


def add_parser(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser("report", help="HTML and Markdown report of results files")
    rep.add_argument("results", nargs="+", type=Path)
    rep.add_argument(
        "--out",
        type=Path,
        help="output folder (default: out/report-NAME, NAME the first results file's name without "
        "`run-` and its suffixes, as the main job names its report)",
    )


def default_out(results: Sequence[Path]) -> Path:
    """`out/report-STAMP` for `results/run-STAMP.jsonl` (the main job's pair of names), else
    `out/report-NAME` for `NAME.jsonl[.gz]`: the first file names the report."""
    name = results[0].name
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return OUT_ROOT / f"report-{name.removeprefix('run-') or 'results'}"


def _fail(message: str) -> int:
    print(f"dskbench report: {message}", file=sys.stderr)
    return EXIT_USAGE


def command(args: argparse.Namespace) -> int:
    from dskbench.report import write_report
    from dskbench.report.csv_out import write_csv
    from dskbench.results.io import ResultsError, read_runs

    try:
        runs = read_runs(args.results)
    except ResultsError as e:
        return _fail(str(e))
    if not any(r.results for r in runs):
        named = ", ".join(map(str, args.results))
        return _fail(f"no result records in {named}: nothing to report (a run writes them as its cases end)")
    out: Path = args.out or default_out(args.results)
    if out.exists() and not out.is_dir():
        return _fail(f"--out {out}: is a file; give a folder for index.html, report.md and results.csv")
    try:
        written = write_report(runs, out, csv_href="results.csv")
        written.append(write_csv(runs, out / "results.csv"))
    except OSError as e:
        return _fail(f"cannot write the report into {out}: {e.strerror or e}")
    for p in written:
        print(p)
    return EXIT_OK
