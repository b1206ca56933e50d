"""Build a sweep's JIT modules before the sweep, many at once: `dskbench warm`.

Why: on a fresh GPU box most of a first sweep's wall time is compilation, not measuring, and a
sweep compiles one module after another, in the order it meets them. The compilers are CPU work
(nvcc through FlashInfer, tvm-ffi, torch extensions; Triton), so they can run side by side. Warming
runs one item per (kernel, backend, variant) — the one that triggers the build — in `jobs` worker
processes at once, spread over the host's GPUs; each item is prepared exactly as the sweep prepares it
(inputs, reference, bind, first launch, check) and nothing is timed. The caches they fill (FlashInfer's,
tvm-ffi's, Triton's, torch's extension dir) are the ones the sweep then finds.

The same engine as a sweep (dskbench/execution/: one pool, one worker protocol, one hang watch): a
crashing build loses its item only, a hung one is killed at its case limit, and every item comes back
with its status (a wrong result or a skip shows here already) and its first-launch seconds, the build
time.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dskbench.device.info import DeviceInfo
from dskbench.execution.items import SweepOptions, WorkItem
from dskbench.execution.pool import Pool, Slot
from dskbench.execution.sweep import case_limits, worker_plan

DEFAULT_MAX_JOBS = 16  # nvcc builds are memory- and core-hungry; more rarely helps on a 16-64 core host


def default_jobs(cpus: int | None = None) -> int:
    """Half the cores (a build runs several compiler threads, but most builds are short and one long
    one, such as Marlin's, leaves the rest idle), at least 1, at most 16."""
    cpus = cpus or os.cpu_count() or 1
    return max(1, min(DEFAULT_MAX_JOBS, cpus // 2))


def warm_items(items: Sequence[WorkItem]) -> list[WorkItem]:
    """One item per (kernel, backend, variant): the first in plan order (the smallest decode case)."""
    seen: set[tuple[str, str, Any]] = set()
    out = []
    for it in items:
        key = (it.kernel, it.backend, it.case.get("variant"))
        if key not in seen:
            seen.add(key)
            out.append(it)
    return out


def _groups(items: Sequence[WorkItem]) -> list[list[WorkItem]]:
    """Items by kernel (a kernel's backends often share modules: one process builds them in turn)."""
    by_kernel: dict[str, list[WorkItem]] = {}
    for it in items:
        by_kernel.setdefault(it.kernel, []).append(it)
    return list(by_kernel.values())


def jobs_for(items: Sequence[WorkItem], jobs: int) -> int:
    """Worker processes a warm-up of these items runs at once: no more than it has kernels."""
    return max(1, min(jobs, len(_groups(warm_items(items)))))


@dataclasses.dataclass
class WarmResult:
    kernel: str
    backend: str
    variant: str | None
    case_id: str
    status: str
    reason: str | None
    first_launch_s: float | None  # the build (JIT compile, autotune) plus one launch
    item_s: float | None  # the whole item: inputs, reference, bind, first launch, check


def _result(item: WorkItem, fields: dict[str, Any]) -> WarmResult:
    stages = fields.get("stages") or {}
    return WarmResult(
        kernel=item.kernel,
        backend=item.backend,
        variant=item.case.get("variant"),
        case_id=item.case_id,
        status=str(fields.get("status", "error")),
        reason=fields.get("reason"),
        first_launch_s=stages.get("first_launch_s"),
        item_s=stages.get("item_s"),
    )


def run_warm(
    items: Sequence[WorkItem],
    opts: SweepOptions,
    jobs: int,
    gpu_tokens: Sequence[str] | None = None,
    progress: Callable[[WarmResult], None] | None = None,
) -> list[WarmResult]:
    """Prepare every warm item (no timing) in `jobs` worker processes at once.

    gpu_tokens: CUDA_VISIBLE_DEVICES value of each GPU to spread the workers over (round robin by
    job); None leaves the environment as it is. Returns one WarmResult per item, in plan order.
    """
    from dskbench.execution.shard import worker_env

    picked = warm_items(items)
    if not picked:
        return []
    jobs = jobs_for(items, jobs)
    wopts = dataclasses.replace(opts, warm_only=True, gpus=1, measure_ceilings=False)
    plan = worker_plan(wopts, opts.seed or 0, None)
    slots = [
        Slot(f"job {j}", plan, env=worker_env(gpu_tokens[j % len(gpu_tokens)]) if gpu_tokens else None)
        for j in range(jobs)
    ]
    results: dict[int, WarmResult] = {}

    def record(_slot: int, item: WorkItem, fields: dict[str, Any]) -> None:
        r = _result(item, fields)
        results[item.index] = r
        if progress:
            progress(r)

    limits = case_limits(
        wopts, DeviceInfo(opts.device) if opts.device == "cpu" else DeviceInfo.detect("cuda")
    )
    Pool(slots, record, limits, shared=_groups(picked)).run()
    return [results[it.index] for it in picked if it.index in results]


def summary_lines(results: Sequence[WarmResult], wall_s: float, jobs: int) -> list[str]:
    """A table, slowest build first, then the counts and the time saved by building side by side."""
    lines = [f"{'first launch':>12}  {'status':8} kernel · backend · variant"]
    for r in sorted(results, key=lambda r: -(r.first_launch_s or 0.0)):
        t = f"{r.first_launch_s:10.1f} s" if r.first_launch_s is not None else " " * 12
        why = f"  ({str(r.reason)[:90]})" if r.status not in ("ok",) and r.reason else ""
        lines.append(f"{t}  {r.status:8} {r.kernel} · {r.backend} · {r.variant or '-'}{why}")
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    serial = sum(r.item_s or 0.0 for r in results)
    lines.append(
        f"warmed {len(results)} (kernel, backend, variant): "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        + f"; wall {wall_s:.1f} s with {jobs} jobs (items one after another: {serial:.1f} s)"
    )
    return lines


def warm(
    items: Sequence[WorkItem],
    opts: SweepOptions,
    jobs: int,
    gpu_tokens: Sequence[str] | None,
    out: Path | None = None,
) -> list[WarmResult]:
    """run_warm with a line per item on stderr, the table on stdout and, if asked, a JSON file."""
    import json

    t0 = time.monotonic()
    results = run_warm(
        items,
        opts,
        jobs,
        gpu_tokens,
        progress=lambda r: print(
            f"warm: {r.status:7} {r.first_launch_s or 0:7.1f} s  {r.kernel} · {r.backend}",
            file=sys.stderr,
            flush=True,
        ),
    )
    wall = time.monotonic() - t0
    jobs = jobs_for(items, jobs)
    for line in summary_lines(results, wall, jobs):
        print(line)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        from dskbench.results.environment import environment

        doc = {
            "environment": environment(DeviceInfo.detect(opts.device)),  # date, host, GPU, versions, git
            "wall_s": round(wall, 2),
            "jobs": jobs,
            "gpus": list(gpu_tokens or []),
            "results": [dataclasses.asdict(r) for r in results],
        }
        out.write_text(json.dumps(doc, indent=1) + "\n")
    return results
