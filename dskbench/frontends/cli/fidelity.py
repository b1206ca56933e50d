"""`dskbench fidelity`: our timer against CUPTI kernel durations and Triton's do_bench_cudagraph (GPU)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dskbench.frontends.cli import args as types
from dskbench.frontends.cli.common import need_gpu


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fidelity",
        help="our timer against CUPTI and Triton's do_bench_cudagraph on a set of kernel cases (GPU)",
    )
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument(
        "--iters", type=types.positive_int, default=200, help="profiler iterations per case (default 200)"
    )
    p.add_argument(
        "--min-time", type=types.seconds, help="our sampling floor in seconds (default: the core's)"
    )


def command(args: argparse.Namespace) -> int:
    need_gpu("fidelity")
    from dskbench.execution.fidelity import run

    return run(args)
