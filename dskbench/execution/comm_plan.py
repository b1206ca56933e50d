"""A communication benchmark's plan: the kernels, backends and cases of one process group, in the order
they run (cheapest and safest first), the hang limits, and the checks every process makes before any
starts a process group (so that no rank is left waiting for one that refused)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dskbench.execution.limits import parse_timeout, timeout_from_env

WHO = "dskbench comm"  # the prefix of every message the benchmark prints
KERNELS = ("custom_all_reduce", "flashinfer_communication_fusion")
PHASES = ("decode", "prefill", "decode_graph")
EXIT_HUNG = 124  # the watchdog ended the process (as timeout(1) does)
# Backends run cheapest and safest first: the baselines and the AOT kernel before the JIT builds
# (minutes on a fresh machine) and the kernels most likely to hang or crash a run
BACKEND_ORDER = ("nccl", "sgl_kernel", "nccl+fused_add_rmsnorm", "sglang_jit", "flashinfer")
CASE_TIMEOUT_S = 240.0  # --case-timeout's default (first-use JIT included)
SETUP_TIMEOUT_S = 480.0  # --setup-timeout's default (JIT builds included)
TEARDOWN_S = 90.0  # a rank's barrier and destroy_process_group at the end
START_S = 60.0  # driver mode: a torchrun's start (rendezvous, imports), on top of its phases' limits
STOP_GRACE_S = 45.0  # driver mode: after SIGTERM, how long a torchrun may take to stop its ranks


def hang_limits(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> None:
    """--case-timeout and --setup-timeout as seconds (0 = no limit), set on `args`. Unset, the case limit
    is DSKBENCH_CASE_TIMEOUT_S when set (as for `dskbench run`; 0 there turns the watch off, set-up
    included), else the defaults. Raises LimitError (one line) for a value that is not seconds >= 0."""
    env = timeout_from_env(environ)
    if args.case_timeout is None:
        args.case_timeout = env if env is not None else CASE_TIMEOUT_S
    else:
        args.case_timeout = parse_timeout(str(args.case_timeout), "--case-timeout")
    if args.setup_timeout is None:
        args.setup_timeout = 0.0 if env == 0 else SETUP_TIMEOUT_S
    else:
        args.setup_timeout = parse_timeout(str(args.setup_timeout), "--setup-timeout")


@dataclasses.dataclass
class Plan:
    """One kernel's backends and cases at this world size."""

    kernel: str
    backends: list[Any]
    cases: list[Any]


def make_plan(args: argparse.Namespace, world: int) -> list[Plan]:
    """(kernel, backends, cases) for this world size; raises ValueError on an unknown backend."""
    from dskbench.adapters import get_adapter
    from dskbench.adapters.comm.allreduce import comm_cases
    from dskbench.execution.gate import applicable
    from dskbench.shapes.cases import default_shapes

    shapes = default_shapes()
    profile = "quick" if args.quick else "full"
    phases = tuple(args.sweep or ("decode", "prefill"))
    plans, known = [], set()
    for kernel in args.kernel or KERNELS:
        adapter = get_adapter(kernel)
        backends = [b for b in adapter.backends]  # torch-ref is the oracle, not a contender
        known.update(b.name for b in backends)
        if args.backend:
            backends = [b for b in backends if b.name in args.backend]
        cases = [
            c
            for c in comm_cases(shapes, kernel, world, phases, profile, args.tokens)
            if applicable(adapter, c)
        ]
        plans.append(Plan(kernel, backends, cases))
    unknown = sorted(set(args.backend or ()) - known)
    if unknown:
        raise ValueError(f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return plans


def check_out(out: Path, resume: bool) -> None:
    """--out must be new or a dskbench results file (and readable, to resume from): checked by every
    process before any starts a process group, so that no rank is left waiting for one that refused.
    Raises ResultsError (a ValueError) naming the file."""
    from dskbench.results.io import prepare_append, read_runs

    prepare_append(out, repair=False)  # rank 0's writer cuts an unfinished last line, and says so
    if resume and out.exists():
        read_runs([out])


def plan_checked(args: argparse.Namespace, world: int, need_out: bool = True) -> list[Plan]:
    """make_plan, with the --out check first; raises ValueError (one line) for bad input."""
    if need_out and args.out is None:
        raise ValueError("--out is required")
    if need_out:
        check_out(args.out, args.resume)
    return make_plan(args, world)


def ordered(plans: list[Plan]) -> list[tuple[Plan, Any]]:
    """(plan, backend) pairs in BACKEND_ORDER (then plan order)."""
    pairs = [(p, b) for p in plans for b in p.backends]
    pos = {name: i for i, name in enumerate(BACKEND_ORDER)}
    return sorted(pairs, key=lambda pb: pos.get(pb[1].name, len(pos)))


def settings_for(args: argparse.Namespace) -> Any:
    from dskbench.measure import MeasureSettings

    s = MeasureSettings.quick() if args.quick else MeasureSettings()
    return s.with_(max_time_s=args.budget) if args.budget is not None else s


def work_items(
    plans: list[Plan], done: set[tuple[str, str]]
) -> list[tuple[Plan, Any, list[tuple[Any, Any]]]]:
    """(plan, backend, [(work item, case)]) in BACKEND_ORDER: the cases --resume did not find done, each
    as the engine's WorkItem (its identity in every record; `index`: its place in this run)."""
    from dskbench.execution.items import WorkItem

    out, n = [], 0
    for plan, backend in ordered(plans):
        pairs = []
        for c in plan.cases:
            if (c.id, backend.name) not in done:
                pairs.append((WorkItem(n, plan.kernel, backend.name, c.to_json()), c))
                n += 1
        out.append((plan, backend, pairs))
    return out


def hang_reason(limit_s: float, limit: str) -> str:
    """A phase the watchdog ended, in the engine's words (a worker's time-out)."""
    return (
        f"timed out: no result within {limit_s:g} s ({limit}); a rank hung in a collective or a kernel, "
        "and the ranks were ended"
    )
