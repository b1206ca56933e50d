"""`dskbench pick`: the fastest correct backend per DeepSeek op and batch, and a decode-step estimate."""

from __future__ import annotations

import argparse
from pathlib import Path

from dskbench.frontends.cli import args as types


def add_parser(sub: argparse._SubParsersAction) -> None:
    pk = sub.add_parser(
        "pick", help="fastest correct backend per DeepSeek op and batch; decode-step estimate"
    )
    pk.add_argument("results", nargs="+", type=Path)
    pk.add_argument("--phase", choices=("decode", "prefill"), help="default: both")
    pk.add_argument(
        "--batch", type=types.positive_ints, help="batch points, e.g. 1,8,64,256 (default: all measured)"
    )
    pk.add_argument(
        "--tp",
        type=types.positive_int,
        default=1,
        help="tensor-parallel degree of the deployment (default 1)",
    )
    pk.add_argument("--kv-len", type=types.positive_int, help="KV context length for attention rows")
    pk.add_argument("--device", help="GPU name, when the results hold several")
    pk.add_argument("--out", type=Path, help="folder for pick.md, pick.html, pick.json")


def command(args: argparse.Namespace) -> int:
    from dskbench.pick.command import cli_pick

    batch = list(args.batch) if args.batch else None
    return cli_pick(
        args.results, args.phase, batch, args.tp, args.out, kv_len=args.kv_len, device=args.device
    )
