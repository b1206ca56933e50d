"""`dskbench asv-history`: results files as an asv history, one point per version of a library."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from dskbench.frontends.cli.common import EXIT_OK, UsageError, read_results


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "asv-history",
        help="results files as asv's dashboard: one point per version of a library (its releases)",
        description="Write an asv history of the runs in RESULTS: one point per value of the runs' "
        "`versions[--by]` (a library's releases), each point every ok case of its runs, in a git "
        "repository of one commit per point made for it, with asv's results and configuration; then, "
        "where asv is installed, `asv publish` and the offline fix, so OUT/html/index.html is the dashboard.",
    )
    p.add_argument("results", type=Path, nargs="+", help="results files or folders of them")
    p.add_argument("--by", required=True, help="the version that names a point, e.g. flashinfer-python")
    p.add_argument("--out", type=Path, required=True, help="a new or empty folder (or an earlier history)")
    p.add_argument("--no-publish", action="store_true", help="write the history only, not the site")


def command(args: argparse.Namespace) -> int:
    from dskbench.frontends.asv.history import HistoryError, write_history

    runs = read_results(args.results)
    if not runs:
        raise UsageError(f"{', '.join(map(str, args.results))}: no runs in them")
    try:
        made = write_history(runs, args.by, args.out)
    except HistoryError as e:
        raise UsageError(str(e)) from None
    for point, commit in made:
        n = sum(1 for r in point.runs for x in r.results if x.get("status") == "ok")
        print(f"{args.by} {point.name}: {len(point.runs)} run(s), {n} ok results, commit {commit[:8]}")
    if args.no_publish:
        print(f"asv publish --config {args.out / 'asv.conf.json'} builds the site")
        return EXIT_OK
    beside = Path(sys.executable).parent / "asv"  # the asv of this Python's environment
    asv = str(beside) if beside.is_file() else shutil.which("asv")
    if asv is None:
        print(f"asv is not installed: `asv publish --config {args.out / 'asv.conf.json'}` builds the site")
        return EXIT_OK
    p = subprocess.run(
        [asv, "publish", "--config", "asv.conf.json"], cwd=args.out, capture_output=True, text=True
    )
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UsageError(f"asv publish in {args.out} failed: {tail[0]}")
    from dskbench.frontends.asv.offline import make_offline

    make_offline(args.out / "html")
    print(f"dashboard: {args.out / 'html' / 'index.html'} (works without network)", file=sys.stderr)
    return EXIT_OK
