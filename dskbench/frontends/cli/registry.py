"""`dskbench registry generate | triton-files`: the kernel registry (re)generated from the trace documents,
and the data file of the Triton kernels behind trace rows that name only a file."""

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
    tf = reg_sub.add_parser(
        "triton-files",
        help="read the Triton kernels of the trace rows that name only a file from sglang's source "
        "into traces/triton_kernels.yaml",
    )
    tf.add_argument(
        "--from",
        dest="source",
        type=Path,
        help="an sglang wheel (.whl), or a folder holding the sglang package (default: the installed one)",
    )
    tf.add_argument("--traces", nargs="+", type=Path, help="trace documents (default: every .md in traces/)")
    tf.add_argument("--out", type=Path, help="data file to write (default: traces/triton_kernels.yaml)")


def command(args: argparse.Namespace) -> int:
    if args.registry_command == "triton-files":
        from dskbench.registry.command import cli_triton_files

        return cli_triton_files(args.source, args.traces, args.out)
    from dskbench.registry.load import cli_generate

    return cli_generate(args.traces, args.out, args.check)
