"""Whether a case can run here: the one gating chain (backend requirements, GPU count, the adapter's
and the backend's own skips). The planner's cost model and the case itself ask the same question."""

from __future__ import annotations

from typing import Any

from dskbench.adapters.backends import Backend, DeviceInfo
from dskbench.shapes.cases import Case


def multi_gpu_reason(needed: int, device: DeviceInfo, ranks: int = 1) -> str | None:
    """Why a case that needs several GPUs is not run here: too few GPUs, or (enough of them) because
    one process per GPU is needed, which the sweep's worker is not. `ranks`: the processes that run the
    case together (scripts/comm_bench.py's process group, one per GPU); as many as it needs run it."""
    if needed <= 1 or needed == ranks:
        return None
    if needed > device.count:
        return f"needs {needed} GPUs (found {device.count})"
    return (
        f"needs {needed} processes, one per GPU: measured by "
        f"`torchrun --nproc-per-node {needed} scripts/comm_bench.py`"
    )


def skip_reason(adapter: Any, backend: Backend, case: Case, device: DeviceInfo, ranks: int = 1) -> str | None:
    """Why this (adapter, backend, case) is skipped on `device` when `ranks` processes run it (the
    sweep: one), or None when it may run."""
    return (
        backend.requires.reason_unmet(device)
        or multi_gpu_reason(adapter.gpus_needed(case), device, ranks)
        or adapter.skip_reason(case)
        or (backend.skip(case) if backend.skip else None)
    )
