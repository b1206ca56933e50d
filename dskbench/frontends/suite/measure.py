"""A kernel's measurements for the asv and pytest-benchmark front ends: its planned cases run through the
runner in one isolated worker, the JSON lines kept, each record flattened into a plain dict."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from dskbench.execution.config import RunConfig
from dskbench.frontends.suite.config import selection_info
from dskbench.frontends.suite.plan import case_key
from dskbench.frontends.suite.plan_cache import child_pythonpath


def measure_kernel(
    kernel: str,
    items: list[dict[str, Any]],
    config: RunConfig,
    keep_dir: Path | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Measure `items` (one kernel's cases) through the runner in one isolated worker; plain dict out.

    Returns ``{"kernel", "jsonl", "summary", "environment", "cases": {key: case}}`` where each case is
    ``{"status", "reason", "samples_s", "median_s", "gbps", "tflops", "bytes", "flops", ...}`` (see
    `case_result`). The run's JSON lines are copied to `keep_dir` when given: they hold the reasons of
    every skipped, wrong or failed case, which the front ends can only show as n/a or a skip.
    """
    from dskbench.execution.items import WorkItem
    from dskbench.execution.runner import run_sweep
    from dskbench.results.io import read_runs

    work = [WorkItem(index=i, **it) for i, it in enumerate(items)]
    with tempfile.TemporaryDirectory(prefix="dskbench-suite-") as tmp, child_pythonpath():
        out = Path(tmp) / "results.jsonl"
        summary = run_sweep(work, [], config.options, out, progress=progress)
        kept = None
        if keep_dir is not None:
            keep_dir.mkdir(parents=True, exist_ok=True)
            kept = keep_dir / f"{_stamp()}-{slug(kernel)}.jsonl"
            shutil.copyfile(out, kept)
        runs = read_runs([out])
    env = runs[-1].environment if runs else {}
    cases: dict[str, dict[str, Any]] = {}
    for run in runs:
        for rec in run.results:
            cases[case_key(rec.get("case_id", rec["kernel"]), rec["backend"]["name"])] = case_result(rec)
    return {
        "kernel": kernel,
        "jsonl": str(kept) if kept else None,
        "summary": summary.line(),
        "environment": {k: env.get(k) for k in ("run_id", "host", "device", "versions", "git")},
        "selection": selection_info(config),
        "cases": cases,
    }


def case_result(rec: dict[str, Any]) -> dict[str, Any]:
    """One result record as the front ends need it: samples in seconds, bandwidth, FLOPs, why not ok."""
    from dskbench.results.access import part_of, rate

    timing = dict(rec.get("timing") or {})
    traffic, clocks = part_of(rec, "traffic"), part_of(rec, "clocks")
    samples_us = timing.pop("samples_us", None) or []
    median_us = timing.get("median_us")
    if not samples_us and median_us is not None:
        samples_us = [median_us]
    median_s = median_us * 1e-6 if median_us else None
    for k in ("clocks_before", "clocks_after", "clocks_during"):
        timing.pop(k, None)
    return {
        "status": rec["status"],
        "reason": rec.get("reason"),
        "backend": rec.get("backend", {}),
        "samples_s": [x * 1e-6 for x in samples_us],
        "median_s": median_s,
        "gbps": rate(rec, "gbps"),
        "tflops": rate(rec, "tflops"),
        "bytes": traffic.bytes if traffic else None,
        "flops": traffic.flops if traffic else None,
        "metrics": rec.get("metrics") or {},
        "timing": timing,
        "check": rec.get("check"),
        "throttled": clocks.throttled if clocks else None,
    }


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}"


def slug(s: str) -> str:
    out = "".join(c if c.isalnum() or c in "._-" else "_" for c in s)
    return out.strip("._") or "x"
