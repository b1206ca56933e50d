"""The `dskbench` argument parser: each command module adds its own sub-command."""

from __future__ import annotations

import argparse

from dskbench.frontends.cli import (
    asv_history,
    comm,
    compare,
    fidelity,
    insitu,
    kernels,
    noise_prior,
    pack,
    pick,
    plan_stats,
    registry,
    report,
    run,
    run_to_run,
    selftest,
    stats,
    warm,
)
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
    "stats": stats,
    "plan-stats": plan_stats,
    "run-to-run": run_to_run,
    "noise-prior": noise_prior,
    "pack": pack,
    "asv-history": asv_history,
    "comm": comm,
    "insitu": insitu,
    "fidelity": fidelity,
    "selftest": selftest,
}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="dskbench", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"dskbench {version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for module in COMMANDS.values():
        module.add_parser(sub)
    return p
