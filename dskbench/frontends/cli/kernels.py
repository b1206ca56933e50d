"""`dskbench list`: the kernels of the registry, their status, adapter and backends."""

from __future__ import annotations

import argparse
import json

from dskbench.frontends.cli import common
from dskbench.frontends.cli.common import EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    ls = sub.add_parser("list", help="kernels in the registry, their status, adapter and backends")
    ls.add_argument("--status", help="only kernels with this status (benchmark, host-only, ...)")
    ls.add_argument("--json", action="store_true", help="machine-readable output")


def command(args: argparse.Namespace) -> int:
    from dskbench.adapters import adapters

    registry, _shapes = common.registry_and_shapes()
    known = adapters()
    rows = []
    for name in sorted(registry):
        e = registry[name]
        if args.status and e.status != args.status:
            continue
        a = known.get(name)
        rows.append(
            {
                "kernel": name,
                "category": e.category,
                "source": e.source,
                "status": e.status,
                "ops": len(e.op_names),
                "adapter": a.__name__ if a else None,
                "backends": [b.name for b in a.backends] if a else [],
            }
        )
    if args.json:
        print(json.dumps(rows, indent=1))
        return EXIT_OK
    print(f"{'kernel':42} {'category':14} {'source':11} {'status':16} ops  backends")
    for r in rows:
        b = ", ".join(r["backends"]) if r["adapter"] else "(no adapter)"
        print(
            f"{r['kernel']:42} {r['category'] or '':14} {r['source'] or '':11} {r['status']:16} {r['ops']:3}  {b}"
        )
    print(f"{len(rows)} kernels, {sum(1 for r in rows if r['adapter'])} with an adapter")
    return EXIT_OK
