"""`dskbench run-to-run`: the spread of two sweeps of the same cases, by latency band."""

from __future__ import annotations

import argparse
from pathlib import Path

from dskbench.frontends.cli.common import EXIT_OK, UsageError, read_results, write_json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run-to-run",
        help="spread of two sweeps of the same cases: median, p90 and max |delta| of the medians",
    )
    p.add_argument("a", type=Path, help="results file of the first sweep")
    p.add_argument("b", type=Path, help="results file of the second sweep")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument(
        "--only-common",
        type=Path,
        nargs="+",
        default=[],
        metavar="FILE",
        help="pair only (case, backend)s measured ok in these files too (an A/B on the same cases)",
    )


def command(args: argparse.Namespace) -> int:
    from dskbench.analysis.run_to_run import NoPairs, compare, medians, report_lines

    a, b = medians(read_results([args.a])), medians(read_results([args.b]))
    for other in args.only_common:
        keep = medians(read_results([other])).keys()
        a = {k: v for k, v in a.items() if k in keep}
    try:
        doc = compare(a, b)
    except NoPairs as e:
        raise UsageError(f"{args.a} and {args.b}: {e}") from None
    doc["files"] = [str(args.a), str(args.b)]
    doc["only_common"] = [str(x) for x in args.only_common]
    if args.json:
        write_json(args.json, doc)
    print("\n".join(report_lines(doc)))
    return EXIT_OK
