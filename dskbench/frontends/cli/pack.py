"""`dskbench pack`: a results file packed for committing (samples rounded, compact JSON, gzip)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dskbench.frontends.cli.common import EXIT_OK, UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pack", help="a results file packed for committing: samples to 5 digits, compact JSON, gzip"
    )
    p.add_argument("results", type=Path, help="results file (.jsonl or .jsonl.gz)")
    p.add_argument("out", type=Path, help="the packed file (.jsonl.gz)")


def command(args: argparse.Namespace) -> int:
    from dskbench.results.io import ResultsError
    from dskbench.results.pack import pack

    if args.out.resolve() == args.results.resolve():
        raise UsageError(f"{args.out}: the packed file must not be the file it packs")
    existed = args.out.exists()
    try:
        n = pack(args.results, args.out)
    except ResultsError as e:
        if not existed:  # no half-written file left behind
            args.out.unlink(missing_ok=True)
        raise UsageError(str(e)) from None
    print(f"{args.out}: {n} records, {args.out.stat().st_size / 1e6:.2f} MB")
    return EXIT_OK
