"""`dskbench plan-stats`: a sweep's size before it runs, per profile, after twins, per GPU architecture."""

from __future__ import annotations

import argparse
from pathlib import Path

from dskbench.frontends.cli import args as types
from dskbench.frontends.cli.common import EXIT_OK, registry_and_shapes, write_json

DEFAULT_GPUS = ("90:80", "100:180")


def gpu(s: str) -> tuple[str, object]:
    """`SM[:GIB]` -> (name, a one-GPU DeviceInfo of that architecture and memory)."""
    from dskbench.execution.plan_stats import parse_gpu

    try:
        return parse_gpu(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected SM[:GIB], e.g. 90:80, got {s!r}") from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan-stats",
        help="a sweep's size before it runs: items per profile, measured after twins, what each GPU runs",
    )
    p.add_argument(
        "--profile",
        action="append",
        choices=("full", "quick", "cpu"),
        help="repeatable (default: full, quick)",
    )
    p.add_argument(
        "--tp", type=types.positive_ints, default=(1, 4, 8), help="TP degrees, e.g. 1,4,8 (default 1,4,8)"
    )
    p.add_argument(
        "--gpu",
        type=gpu,
        action="append",
        metavar="SM[:GIB]",
        help="a GPU's compute capability and memory, e.g. 90:80 (repeatable; default 90:80 and 100:180; "
        "no memory: the memory rule is not checked)",
    )
    p.add_argument("--json", type=Path, help="also write the rows here")


def command(args: argparse.Namespace) -> int:
    from dskbench.execution.plan_stats import line, parse_gpu, plan_rows

    registry, shapes = registry_and_shapes()
    gpus = dict(args.gpu or [parse_gpu(s) for s in DEFAULT_GPUS])
    rows = plan_rows(registry, shapes, args.profile or ["full", "quick"], tuple(args.tp), gpus)
    for row in rows:
        print(line(row))
    if args.json:
        write_json(args.json, rows)
    return EXIT_OK
