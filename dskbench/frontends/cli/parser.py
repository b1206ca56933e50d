"""The `dskbench` argument parser: each command module adds its own sub-command."""

from __future__ import annotations

import argparse

from dskbench.frontends.cli import compare, kernels, pick, registry, report, run, warm
from dskbench.frontends.cli.args import Parser
from dskbench.frontends.cli.common import DESCRIPTION, version

# In `dskbench --help` order.
COMMANDS = {
    "registry": registry,
    "list": kernels,
    "run": run,
    "warm": warm,
    "compare": compare,
    "pick": pick,
    "report": report,
}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="dskbench", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"dskbench {version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for module in COMMANDS.values():
        module.add_parser(sub)
    return p
