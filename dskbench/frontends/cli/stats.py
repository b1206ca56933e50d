"""`dskbench stats`: how a sweep went (counts, wall time per GPU with and without JIT, stage breakdown)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dskbench.frontends.cli import args as types
from dskbench.frontends.cli.common import EXIT_OK, read_results, write_json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "stats",
        help="how a sweep went: counts, wall time per GPU with and without JIT, where the time went",
    )
    p.add_argument("results", nargs="+", type=Path, help="results files (.jsonl or .jsonl.gz)")
    p.add_argument(
        "--top", type=types.positive_int, default=10, help="kernels to list by item time (default 10)"
    )
    p.add_argument("--json", type=Path, help="also write the figures here")


def command(args: argparse.Namespace) -> int:
    from dskbench.analysis.sweep_stats import report_lines, run_stats

    stats = [run_stats(r) for r in read_results(args.results)]
    for s in stats:
        print("\n".join(report_lines(s, args.top)))
    if args.json:
        write_json(args.json, stats)
    return EXIT_OK
