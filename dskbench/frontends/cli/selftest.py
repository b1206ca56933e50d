"""`dskbench selftest`: the measurement core on plain torch ops against CUPTI and Triton's timers (GPU)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dskbench.frontends.cli.common import need_gpu


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "selftest",
        help="the measurement core on plain torch ops against CUPTI and Triton's timers, cold and hot (GPU)",
    )
    p.add_argument("out", type=Path, help="JSON file to write")
    p.add_argument("--quick", action="store_true", help="the core's quick budgets")
    p.add_argument("--no-ceilings", action="store_true", help="skip the measured ceilings")
    p.add_argument("--only", nargs="+", metavar="NAME", help="op names to run (default: all)")


def command(args: argparse.Namespace) -> int:
    need_gpu("selftest")
    from dskbench.measure.selftest import run

    return run(args)
