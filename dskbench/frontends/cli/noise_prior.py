"""`dskbench noise-prior`: fit the noise prior `dskbench compare` judges with from pairs of unchanged runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dskbench.frontends.cli.common import EXIT_OK, UsageError


def quantile(s: str) -> float:
    try:
        q = float(s)
    except ValueError:
        q = -1.0
    if not 0.0 < q < 1.0:
        raise argparse.ArgumentTypeError(f"expected a quantile between 0 and 1, e.g. 0.999, got {s!r}")
    return q


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "noise-prior",
        help="fit compare's noise prior (floor per latency band) from pairs of unchanged runs",
    )
    p.add_argument(
        "--pair",
        nargs=3,
        action="append",
        metavar=("NAME", "A", "B"),
        help="two back-to-back runs of the same code on one machine (repeatable; default: the pairs "
        "committed under results/)",
    )
    p.add_argument(
        "--out", type=Path, help="prior file to write (default: the one dskbench ships, noise_prior.json)"
    )
    p.add_argument("--quantile", type=quantile, help="quantile of |change| a band's floor is (default 0.999)")


def command(args: argparse.Namespace) -> int:
    from dskbench.analysis.noise import PRIOR_FILE, QUANTILE
    from dskbench.analysis.noise_fit import default_pairs, fit, report_lines

    pairs = args.pair or default_pairs()
    if not args.pair and not all(Path(a).is_file() for _n, a, _b in pairs):
        raise UsageError(
            "the committed pairs are read from a checkout's results/, and this one has none: "
            "give your own with --pair NAME A B"
        )
    try:
        doc = fit(pairs, args.quantile or QUANTILE, custom=bool(args.pair))
    except ValueError as e:  # a results file that cannot be read, or nothing to fit
        raise UsageError(str(e)) from None
    out: Path = args.out or PRIOR_FILE
    try:
        out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    except OSError as e:
        raise UsageError(f"--out {out}: cannot write it: {e.strerror or e}") from None
    print(f"{out}: {sum(p['cases'] for p in doc['pairs'])} cases from {len(doc['pairs'])} pairs")
    print("\n".join(report_lines(doc)))
    return EXIT_OK
