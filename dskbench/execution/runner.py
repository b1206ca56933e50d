"""The sweep: plan (kernel x case x backend), then run it through the execution engine
(dskbench/execution/): each item checked, then timed, in a watched worker process, its record written
as it finishes. A kernel that hangs, kills its process or poisons the CUDA context loses only its own
item: it is recorded as ``error`` with what happened, and a fresh worker takes the next one.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from dskbench.adapters import get_adapter
from dskbench.adapters.backends import Backend
from dskbench.device.info import DeviceInfo
from dskbench.execution.case import (  # noqa: F401 - the public names of one case's execution
    Prepared,
    backend_block,
    execute_item,
    is_poisoning,
    measure_settings,
    prepare_case,
    run_one,
    timed_ceilings,
)
from dskbench.execution.gate import applicable
from dskbench.execution.items import (  # noqa: F401
    MODES,
    PlanError,
    SweepOptions,
    WorkItem,
    case_seed,
    sweep_seed,
)
from dskbench.execution.pool import Slot
from dskbench.execution.shared_gpu import start_check
from dskbench.execution.sweep import (  # noqa: F401
    Recorder,
    SweepSummary,
    case_limits,
    execute,
    run_in_process,
    worker_plan,
)
from dskbench.execution.twins import measure_once
from dskbench.shapes.cases import ModelShapes

# Registry statuses whose kernels are planned case by case: a needs-multi-gpu kernel with an adapter
# gets one record per case, skipped with the GPU count it needs (`dskbench comm` measures it).
PLANNED_STATUSES = ("benchmark", "needs-multi-gpu")


# -- planning -------------------------------------------------------------------------------------------


def select_kernels(registry: dict[str, Any], names: list[str] | None) -> list[str]:
    if not names:
        return sorted(registry)
    out = []
    by_alias = {a: e.name for e in registry.values() for a in getattr(e, "aliases", ())}
    for n in names:
        if n in registry:
            out.append(n)
        elif n in by_alias:
            out.append(by_alias[n])
        else:
            close = difflib.get_close_matches(n, list(registry) + list(by_alias), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else "; `dskbench list` shows them all"
            raise PlanError(f"unknown kernel {n!r}{hint}")
    return out


def plan_sweep(
    registry: dict[str, Any],
    shapes: ModelShapes,
    kernels: list[str],
    backends: list[str] | None,
    opts: SweepOptions,
) -> tuple[list[WorkItem], list[dict[str, Any]]]:
    """Work items to run, and the `skipped` records decided without running anything."""
    items: list[WorkItem] = []
    skips: list[dict[str, Any]] = []
    known_backends: set[str] = set()
    for name in kernels:
        entry = registry[name]
        status_skip = {"kernel": name, "case_id": name, "reason": f"{entry.status}: {entry.status_reason}"}
        if entry.status not in PLANNED_STATUSES:
            skips.append(status_skip)
            continue
        adapter = get_adapter(name)
        if adapter is None:
            if entry.status != "benchmark":
                skips.append(status_skip)
                continue
            skips.append({"kernel": name, "case_id": name, "reason": "no adapter for this kernel yet"})
            continue
        planned = len(items)
        all_b = adapter.all_backends()
        known_backends.update(b.name for b in all_b)
        chosen = [b for b in all_b if _backend_selected(b, backends, opts.device)]
        ops = swept_ops(entry, adapter, shapes)
        for phase in opts.phases:
            for case in shapes.cases(name, ops, adapter.role, phase, opts.profile, list(opts.tp)):
                if not applicable(adapter, case):  # not a case of this kernel: no record
                    continue
                for b in chosen:
                    items.append(WorkItem(len(items), name, b.name, case.to_json(), entry.category))
        if entry.status != "benchmark" and len(items) == planned:  # e.g. an all-reduce at --tp 1 only
            skips.append(status_skip)
    if backends:
        unknown = sorted(set(backends) - known_backends)
        if unknown:
            raise PlanError(
                f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(sorted(known_backends))}"
            )
    return items, skips


def swept_ops(entry: Any, adapter: Any, shapes: ModelShapes) -> list[str]:
    """The ops a kernel is swept at: its registry ops that the shapes file gives shapes for in the
    adapter's role, else (an entry naming none of them) the ops the adapter names."""
    ops = [op for op in entry.op_names if shapes.ops.get(op) and shapes.ops[op].roles.get(adapter.role)]
    return ops or list(adapter.ops)


def measured_ops(entry: Any, adapter: Any, shapes: ModelShapes) -> list[str]:
    """The swept ops at which the kernel has a case in some sweep at some tp (`applicable`): what a sweep
    measures it at, whatever the profile (`dskbench list` counts them)."""
    tps = shapes.values("tp")
    return [
        op
        for op in swept_ops(entry, adapter, shapes)
        if any(
            applicable(adapter, case)
            for phase in shapes.phases
            for case in shapes.cases(entry.name, [op], adapter.role, phase, "quick", tps)
        )
    ]


def _backend_selected(b: Backend, wanted: list[str] | None, device: str) -> bool:
    if wanted:
        return b.name in wanted
    if device == "cpu":
        return b.name == "torch-ref"  # the only thing a CPU can run
    return b.name != "torch-ref"  # on a GPU the reference is the oracle, not a contender


# -- the sweep -------------------------------------------------------------------------------------------


def ceilings_for_workers(isolate: bool) -> dict[str, Any] | None:
    """The GPU's measured ceilings. When the cases run in workers they are measured in a process of their
    own: measured here, they would leave this process a CUDA context, about 1 GiB of the GPU that the
    largest cases then lack, for the whole run (and a case short of memory would count it as memory
    another process might free). An in-process run measures them itself."""
    if not isolate:
        return timed_ceilings()
    from dskbench.execution.shard import ShardError, probe_gpus, visible_gpus

    try:
        return probe_gpus(visible_gpus(1), "cuda", True)[0]["ceilings"]
    except ShardError:  # the probe could not run: measure them here, as an in-process run does
        return timed_ceilings()


def run_sweep(
    items: list[WorkItem],
    skips: list[dict[str, Any]],
    opts: SweepOptions,
    out: Path,
    progress: Any = None,
) -> SweepSummary:
    """Run a planned sweep on this machine's GPU (or CPU), or sharded over several (opts.gpus > 1)."""
    if opts.gpus > 1:
        from dskbench.execution.shard import run_sharded

        return run_sharded(items, skips, opts, out, progress)
    import dataclasses

    from dskbench.results.environment import command_line, environment, multicast_env, new_run_id, run_peaks

    device = DeviceInfo.detect(opts.device)
    sharing = start_check(1, device.kind) if items else None  # before the ceilings, which it would skew
    run_id = new_run_id()
    run_seed = sweep_seed(opts)
    to_run, copies = measure_once(items) if opts.dedupe else (items, {})
    from dskbench.execution.build_ahead import building, start_builder

    builder = start_builder(to_run, opts, None, device)
    settled = builder.deferred_records() if builder is not None else []
    if builder is not None:
        to_run = builder.items
    ceilings = None
    if device.kind == "cuda" and opts.measure_ceilings and items:
        ceilings = ceilings_for_workers(opts.isolate)
    limits = case_limits(opts, device)
    env = {
        "run_id": run_id,
        **environment(device, opts.no_multicast),
        "ceilings": ceilings,
        **run_peaks(device),
        **({"shared_gpu": sharing} if sharing else {}),
        "settings": {
            **dataclasses.asdict(opts),
            "run_seed": run_seed,
            "items": len(items),
            "copied_items": sum(len(c) for c in copies.values()),  # records copying a twin's
            "case_timeout": limits.describe() if opts.isolate else "off (in-process run)",
        },
        "command": command_line(),
    }
    workers_env = multicast_env(True) if opts.no_multicast else None  # None: this process's own
    plan = {**worker_plan(opts, run_seed, ceilings), **(builder.plan_extra() if builder else {})}
    slot = Slot("", plan, env=workers_env, units=[to_run] if to_run else [])
    in_process = None if opts.isolate else run_in_process(to_run, device, opts, run_seed, ceilings)
    with building(builder):
        return execute(
            out, env, skips, [slot], limits, copies, progress, in_process=in_process, settled=settled
        )
