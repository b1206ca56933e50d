"""What `dskbench warm` shows of its builds: a line per build as it ends, the table of builds slowest first
with the counts, and the JSON file (execution/warm.py makes the builds)."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dskbench.device.info import DeviceInfo
from dskbench.execution.build_memory import BuildMemory
from dskbench.execution.items import SweepOptions, WorkItem
from dskbench.execution.warm import WarmResult, jobs_for, run_warm


def summary_lines(results: Sequence[WarmResult], wall_s: float, jobs: int) -> list[str]:
    """A table, slowest build first, then the counts and the time saved by building side by side."""
    from dskbench.results.io import deferred

    lines = [f"{'build':>12}  {'status':8} kernel · backend · variant"]
    for r in sorted(results, key=lambda r: -(r.build_s or 0.0)):
        t = f"{r.build_s:10.1f} s" if r.build_s is not None else " " * 12
        # a deferred build's reason is kept whole: it ends with the command that builds it
        why = str(r.reason) if deferred(vars(r)) else str(r.reason)[:90]
        why = f"  ({why})" if r.status not in ("ok",) and r.reason else ""
        lines.append(f"{t}  {r.status:8} {r.kernel} · {r.backend} · {r.variant or '-'}{why}")
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    serial = sum(r.item_s or 0.0 for r in results)
    left_out = [f"{r.kernel} · {r.backend}" for r in results if deferred(vars(r))]  # one build an item
    lines.append(
        f"warmed {len(results)} (kernel, backend, variant): "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        + f"; wall {wall_s:.1f} s with {jobs} jobs (items one after another: {serial:.1f} s)"
        + (f"; {len(left_out)} builds deferred ({', '.join(sorted(set(left_out)))})" if left_out else "")
    )
    return lines


def warm(
    items: Sequence[WorkItem],
    opts: SweepOptions,
    jobs: int,
    gpu_tokens: Sequence[str] | None,
    out: Path | None = None,
    build_s: dict[tuple[str, str], float] | None = None,
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
            f"warm: {r.status:7} {r.build_s or 0:7.1f} s  {r.kernel} · {r.backend}",
            file=sys.stderr,
            flush=True,
        ),
        build_s=build_s,
        memory=BuildMemory.here() if opts.device == "cuda" else None,
        device=DeviceInfo.detect(opts.device),
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
