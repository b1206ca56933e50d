"""How long an item is expected to take: the model a sharded sweep cuts by and the hang watch scales
its limits from. Only relative sizes matter for balance; the hang limit multiplies it generously."""

from __future__ import annotations

from dskbench.device.info import DeviceInfo
from dskbench.execution.gate import why_not
from dskbench.execution.items import WorkItem
from dskbench.shapes.cases import Case

# Fitted to the quick sweep's ok cases on one H200 with batched timing (the fit is in
# results/h200-2026-11-27b/README.md): a fixed cost per case, its minimum traffic at a set-up rate, and
# its sampling with calibration and capture (a per-case timer, `--no-batch`, takes several times that).
CASE_OVERHEAD_S = 0.015  # resolve, inputs, reference, check, warm-up, graph capture, per case
UNIT_OVERHEAD_S = 3.0  # a kernel's first use in a process: imports, JIT build, autotuning
SETUP_BYTES_PER_S = 2e10  # input generation + fp32 reference + check, per byte of minimum traffic
TYPICAL_SAMPLING_S = 0.03  # sampling a case takes at most its budget, and usually no more than this
SKIP_COST_S = 0.01  # a case the GPU will skip (wrong architecture, needs several GPUs, ...)


def item_cost(item: WorkItem, device: DeviceInfo, budget_s: float) -> float:
    """Estimated wall seconds of one item: a fixed overhead, its sampling (the budget, or less: the
    typical time), and the case's minimum traffic at a set-up rate (inputs, fp32 reference and check
    scale with it)."""
    from dskbench.adapters import get_adapter

    adapter = get_adapter(item.kernel)
    backend = {b.name: b for b in adapter.all_backends()}.get(item.backend) if adapter else None
    if adapter is None or backend is None:
        return SKIP_COST_S
    case = Case.from_json(item.case)
    try:
        skipped = why_not(adapter, backend, case, device)
        nbytes = adapter.traffic_for(item.backend, case).bytes
    except Exception:  # noqa: BLE001 - an estimate; the worker reports the real failure
        skipped, nbytes = None, 0
    if skipped:
        return SKIP_COST_S
    return CASE_OVERHEAD_S + min(budget_s, TYPICAL_SAMPLING_S) + nbytes / SETUP_BYTES_PER_S
