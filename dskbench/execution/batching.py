"""Prepared cases held in a worker and timed together (measure/batch.py), each recorded as if timed alone.

A worker prepares its items one by one (gate, inputs, reference, check: case.prepare_item); a case that
is to be timed cold is held rather than timed at once. When BATCH_CASES are held, or the held inputs
fill a share of the GPU's memory, or the worker's items run out, the held cases are timed in one batch
and their records written. A case the batch cannot time (its graph cannot be captured, CUPTI gave it no
samples) is timed alone with the per-case timer; so is everything when CUPTI is missing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dskbench.device.info import DeviceInfo
from dskbench.execution import gpu_lock
from dskbench.execution.case import (
    Prepared,
    as_dict,
    error_fields,
    is_poisoning,
    measure_settings,
    measured_fields,
    time_prepared,
    with_item_time,
    with_record_time,
)
from dskbench.execution.items import SweepOptions, WorkItem

BATCH_CASES = 48  # cases timed together at most
MEMORY_SHARE = 0.35  # hold cases while the allocator holds less than this share of the GPU


@dataclass
class Held:
    item: WorkItem
    base: dict[str, Any]
    prep: Prepared
    prep_s: float  # the item's time before it was held (gate, inputs, reference, check)


def enabled(device: DeviceInfo, opts: SweepOptions) -> bool:
    """Whether a worker holds cases for batches at all: a GPU sweep that times (not warm)."""
    return device.kind == "cuda" and opts.batch and not opts.warm_only


def timed_together(entries: list[list[Any]], settings: Any) -> list[Any]:
    """The batch timer (measure/batch.py): a Measurement or a reason per entry."""
    from dskbench.measure.batch import measure_batch

    return measure_batch(entries, device="cuda", settings=settings)


def eligible(opts: SweepOptions, prep: Prepared) -> bool:
    """Whether a prepared case may be timed in a batch: cold with the write flush, capturable, on a GPU
    whose profiler records kernels, under a policy that stops on noise."""
    if not opts.batch or opts.device != "cuda" or prep.device != "cuda":
        return False
    if opts.mode != "cold" or opts.flush != "write" or opts.stopping == "fixed":
        return False
    if not prep.backend.capturable:
        return False
    from dskbench.measure.batch import cupti_available

    return cupti_available()


class Batcher:
    """The held cases of one worker, and their timing."""

    def __init__(self, device: DeviceInfo, opts: SweepOptions, ceilings: dict | None) -> None:
        self.device, self.opts, self.ceilings = device, opts, ceilings
        self.held: list[Held] = []

    def offer(self, item: WorkItem, base: dict[str, Any], prep: Prepared, prep_s: float) -> bool:
        """Hold a prepared case for the next batch if it may be timed in one (True)."""
        if not eligible(self.opts, prep):
            return False
        self.held.append(Held(item, base, prep, prep_s))
        return True

    def settings(self) -> Any:
        """The run's measurement settings with its calibrated launch gaps (the batched timer's among them)."""
        from dskbench.measure.calibrate import settings_with_gap

        return settings_with_gap(measure_settings(self.opts), self.ceilings)

    def full(self) -> bool:
        """Time the held cases now: as many as a batch takes, or their memory is a share of the GPU."""
        if len(self.held) >= BATCH_CASES:
            return True
        if self.device.kind != "cuda":
            return False
        import torch

        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        return torch.cuda.memory_allocated() > MEMORY_SHARE * total

    def time_all(self, emit: Callable[[WorkItem, dict[str, Any]], None]) -> None:
        """Time every held case; `emit` each one's record fields. A poisoning CUDA error propagates
        (the worker exits; its parent re-runs the held cases one by one)."""
        held, self.held = self.held, []
        if not held:
            return
        from dskbench.execution import shared_gpu

        before = shared_gpu.record_fields(self.device.kind, fresh=True)  # its cases' records carry it
        t0 = time.perf_counter()
        try:
            with gpu_lock.held():  # no builder's GPU work while the batch samples (build_ahead.py)
                got = timed_together([[h.prep.launch] for h in held], self.settings())
        except Exception as e:  # noqa: BLE001 - the cases are timed alone below, unless the context broke
            if is_poisoning(f"{type(e).__name__}: {e}"):
                raise
            got = [f"batch failed: {type(e).__name__}: {e}"[:300]] * len(held)
        share = (time.perf_counter() - t0) / len(held)
        from dskbench.measure.validity import problem

        for h, m in zip(held, got, strict=True):
            if not isinstance(m, str) and (why := problem(as_dict(m))):  # timed again, alone
                m = f"the batch's measurement was impossible ({why})"
            t_case = time.perf_counter()
            try:
                if isinstance(m, str):
                    fields = time_prepared(h.base, h.prep, self.device, self.opts, self.ceilings)
                    if fields.get("status") == "ok":
                        fields["timing"].setdefault("notes", []).append(f"timed alone: {m}")
                else:
                    h.base["stages"]["measure_s"] = round(share, 4)
                    fields = measured_fields(h.base, h.prep, m, self.device, self.opts, self.ceilings)
                    fields = with_record_time(fields, t_case)
            except Exception as e:  # noqa: BLE001 - a failing kernel is a result
                if is_poisoning(f"{type(e).__name__}: {e}"):
                    raise
                fields = error_fields(h.item, e)
            if before and fields.get("status") == "ok" and "shared_gpu" not in fields:
                fields.update(before)  # others used the GPU when the batch began: they shared its sampling
            own = h.prep_s + (time.perf_counter() - t_case) + (0.0 if isinstance(m, str) else share)
            emit(h.item, with_item_time(fields, own))
        del held, got
