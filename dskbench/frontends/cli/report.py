"""`dskbench report`: HTML, Markdown and CSV of results files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dskbench.frontends.cli.common import EXIT_OK, EXIT_USAGE


def add_parser(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser("report", help="HTML and Markdown report of results files")
    rep.add_argument("results", nargs="+", type=Path)
    rep.add_argument("--out", type=Path, required=True, help="output folder")


def command(args: argparse.Namespace) -> int:
    from dskbench.report import write_report
    from dskbench.report.csv_out import write_csv
    from dskbench.results.io import ResultsError, read_runs

    try:
        runs = read_runs(args.results)
    except ResultsError as e:
        print(f"dskbench: {e}", file=sys.stderr)
        return EXIT_USAGE
    written = write_report(runs, args.out, csv_href="results.csv")
    written.append(write_csv(runs, args.out / "results.csv"))
    for p in written:
        print(p)
    return EXIT_OK
