"""`dskbench list`: the kernels of the registry, their status, the models that run them, adapter and
backends."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dskbench.frontends.cli import args as types
from dskbench.frontends.cli import common
from dskbench.frontends.cli.common import EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    ls = sub.add_parser("list", help="kernels in the registry, their status, models, adapter and backends")
    ls.add_argument("--status", help="only kernels with this status (benchmark, host-only, ...)")
    types.add_model(ls, "kernels")
    ls.add_argument("--json", action="store_true", help="machine-readable output")


def kernel_models(entry: Any, adapter: Any, shapes: Any) -> list[str]:
    """The models that run the kernel's executed ops, as the registry records them per op; a kernel whose
    registry entry names no op is measured at the ops its adapter picks (their `models` in the shapes file)."""
    from dskbench.shapes.models import op_models, sorted_models

    found = [m for op in entry.ops if op.executed for m in op_models(op.models)]
    if not entry.ops and adapter is not None:
        found = [m for op in adapter.ops if op in shapes.ops for m in op_models(shapes.ops[op].models)]
    return sorted_models(found)


def kernel_ops(entry: Any, adapter: Any, shapes: Any) -> list[str]:
    """The ops a kernel is measured at: with an adapter, those a sweep has cases of (its registry ops
    with shapes for the adapter's role, else the ops the adapter names); without one, its registry ops."""
    if adapter is None:
        return list(entry.op_names)
    from dskbench.execution.runner import measured_ops

    return measured_ops(entry, adapter(), shapes)


def models_text(models: list[str]) -> str:
    """`R1`, `V3.2`, `R1, V3.2`; `-` when no model runs the kernel."""
    from dskbench.shapes.models import short_name

    return ", ".join(short_name(m) for m in models) or "-"


def command(args: argparse.Namespace) -> int:
    from dskbench.adapters import adapters

    registry, shapes = common.registry_and_shapes()
    known = adapters()
    wanted = set(args.model or ())
    rows = []
    for name in sorted(registry):
        e = registry[name]
        if args.status and e.status != args.status:
            continue
        a = known.get(name)
        models = kernel_models(e, a, shapes)
        if wanted and not wanted & set(models):
            continue
        rows.append(
            {
                "kernel": name,
                "category": e.category,
                "source": e.source,
                "status": e.status,
                "models": models,
                "ops": len(kernel_ops(e, a, shapes)),
                "adapter": a.__name__ if a else None,
                "backends": [b.name for b in a.backends] if a else [],
            }
        )
    if args.json:
        print(json.dumps(rows, indent=1))
        return EXIT_OK
    print(f"{'kernel':42} {'category':14} {'source':11} {'status':16} {'models':9} ops  backends")
    for r in rows:
        b = ", ".join(r["backends"]) if r["adapter"] else "(no adapter)"
        print(
            f"{r['kernel']:42} {r['category'] or '':14} {r['source'] or '':11} {r['status']:16} "
            f"{models_text(r['models']):9} {r['ops']:3}  {b}"
        )
    print(f"{len(rows)} kernels, {sum(1 for r in rows if r['adapter'])} with an adapter")
    return EXIT_OK
