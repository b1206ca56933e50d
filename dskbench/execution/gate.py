"""Whether a case runs here: one rule, decided from planning-time facts only (the DeviceInfo detected
once per process, the adapter, the backend, the case; no live query of the GPU), so every caller gives
the same answer: the planner's cost model (a case to skip costs nothing), the case's execution (asked
first, before anything is resolved or built: a skipped case's record is written from it) and
`dskbench comm` (with its process group's `ranks`).

Two questions, kept apart on purpose:

* **Not applicable** (`applicable`): the case does not exist for this kernel, e.g. an FP8 GEMM at an op
  whose weight is BF16. It is dropped from the plan and leaves no record: no machine could run it.
* **A reason** (`why_not`): the case exists, but this machine or this backend cannot run it (wrong
  architecture, too few GPUs, too little memory, a shape the backend rejects). It is recorded as
  ``skipped`` with the reason, so a reader of the results sees what was not measured and why.

`why_not` checks, first reason wins: the backend's requirement (CUDA, capability windows, GPU count),
the GPUs the case needs, the adapter's and the backend's own per-case reasons (on a CPU, also a torch
reference known to be too slow to time there), and whether the case's minimum traffic fits the GPU's
memory (MEMORY_SHARE of its total, DeviceInfo.memory_bytes).
"""

from __future__ import annotations

from typing import Any

from dskbench.adapters.backends import Backend
from dskbench.device.info import DeviceInfo
from dskbench.shapes.cases import Case

# The share of a GPU's memory a case's minimum traffic may take: inputs and outputs are only part of
# what a case allocates (fp32 reference, workspaces, the caching allocator's slack).
MEMORY_SHARE = 0.85


def applicable(adapter: Any, case: Case) -> bool:
    """Whether `case` exists for this kernel at all (the planner drops it silently when not)."""
    return bool(adapter.applies(case))


def multi_gpu_reason(needed: int, device: DeviceInfo, ranks: int = 1) -> str | None:
    """Why a case that needs several GPUs is not run here: too few GPUs, or (enough of them) because
    one process per GPU is needed, which the sweep's worker is not. `ranks`: the processes that run the
    case together (`dskbench comm`'s process group, one per GPU); as many as it needs run it."""
    if needed <= 1 or needed == ranks:
        return None
    if needed > device.count:
        return f"needs {needed} GPUs (found {device.count})"
    return f"needs {needed} processes, one per GPU: measured by `dskbench comm --nproc {needed}`"


def memory_reason(adapter: Any, backend: Backend, case: Case, device: DeviceInfo) -> str | None:
    """Why the case's minimum traffic and its backend's scratch do not fit this GPU's memory; None on a
    CPU or a device whose memory is unknown (the traffic is not even computed then)."""
    if device.kind != "cuda" or device.memory_bytes is None:
        return None
    needed = adapter.traffic_for(backend.name, case).bytes + adapter.scratch_bytes(backend.name, case)
    total = device.memory_bytes
    if needed > MEMORY_SHARE * total:
        return f"needs at least {needed / 2**30:.1f} GiB of GPU memory, {total / 2**30:.1f} GiB free"
    return None


def why_not(adapter: Any, backend: Backend, case: Case, device: DeviceInfo, ranks: int = 1) -> str | None:
    """Why this (adapter, backend, case) is skipped on `device` when `ranks` processes run it (the
    sweep: one), or None when it may run. The case must be `applicable`."""
    return (
        backend.requires.reason_unmet(device)
        or multi_gpu_reason(adapter.gpus_needed(case), device, ranks)
        or adapter.skip_reason(case)
        or (adapter.cpu_skip_reason(case) if device.kind == "cpu" else None)
        or (backend.skip(case) if backend.skip else None)
        or memory_reason(adapter, backend, case, device)
    )
