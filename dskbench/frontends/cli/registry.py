"""`dskbench registry generate`: the kernel registry (re)generated from the trace documents."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    reg = sub.add_parser("registry", help="the kernel registry generated from the trace documents")
    reg_sub = reg.add_subparsers(dest="registry_command", required=True)
    gen = reg_sub.add_parser("generate", help="(re)generate kernels_registry/ from traces/")
    gen.add_argument(
        "--traces",
        nargs="+",
        type=Path,
        help="trace documents (default: every .md in traces/); refused into a folder generated from more",
    )
    gen.add_argument(
        "--out",
        type=Path,
        help="output folder: new, empty, or one generate wrote (default: kernels_registry/)",
    )
    gen.add_argument("--check", action="store_true", help="fail if the committed registry differs")


def command(args: argparse.Namespace) -> int:
    from dskbench.registry.load import cli_generate

    return cli_generate(args.traces, args.out, args.check)
