"""`dskbench insitu`: one decoder layer of pick's kernels in one CUDA graph against the sum of its
kernels timed alone: the step estimate checked in situ (GPU)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dskbench.frontends.cli import args as types
from dskbench.frontends.cli.common import UsageError, need_gpu


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "insitu",
        help="one decoder layer of pick's kernels in one CUDA graph against their isolated sum (GPU)",
    )
    p.add_argument("results", nargs="+", type=Path, help="results files, as `dskbench pick` reads them")
    p.add_argument(
        "--batch",
        type=types.positive_ints,
        default=(1, 16, 64, 256),
        help="batch sizes, e.g. 1,16,64,256 (the default)",
    )
    p.add_argument("--layer", choices=("moe", "dense"), default="moe")
    p.add_argument(
        "--mode", choices=("cold", "hot"), default="cold", help="L2 flushed before each launch or not"
    )
    p.add_argument("--tp", type=types.positive_int, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument(
        "--kv-len", type=types.positive_int, help="attention context (default: the deployment file's)"
    )
    p.add_argument("--seed", type=types.seed, default=0)
    p.add_argument("--out", type=Path, default=Path("results/insitu-layer.json"), help="JSON file to write")


def command(args: argparse.Namespace) -> int:
    from dskbench.pick.choose import PickError, check_tp, load_runs
    from dskbench.results.io import ResultsError

    try:
        runs, dev = load_runs(args.results)
        check_tp(runs, args.tp, ["decode"])
    except (PickError, ResultsError) as e:
        raise UsageError(str(e)) from None
    need_gpu("insitu")
    from dskbench.analysis.insitu import run

    return run(args, runs, dev)
