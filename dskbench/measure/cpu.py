"""The CPU timer (method "cpu-wall"): host wall clock around each call, for CPU-only machines.

There is no cache flush on the CPU, so a "cold" request is timed hot and says so in the notes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from dskbench.measure.sampling import assemble, make_stopper
from dskbench.measure.settings import Measurement, MeasureSettings


def measure_cpu(
    launchers: list[Callable[[], Any]],
    *,
    mode: str,
    settings: MeasureSettings,
    clock_ns: Callable[[], int] = time.perf_counter_ns,
    now: Callable[[], float] = time.perf_counter,
) -> Measurement:
    t_start = now()
    n_sets = len(launchers)
    notes = []
    if mode == "cold":
        notes.append("cold requested: cpu-wall has no cache flush, timed hot")
    # warm-up: whole rotation rounds, so every set's call count stays equal
    for i in range(math.ceil(max(settings.warmup_launches, 1) / n_sets) * n_sets):
        launchers[i % n_sets]()
    t_sampling = now()
    stopper = make_stopper(settings, now)
    while True:
        batch = []
        for fn in launchers:  # one rotation round per batch
            t0 = clock_ns()
            fn()
            batch.append((clock_ns() - t0) / 1000.0)
        if stopper.add(batch):
            break
    return assemble(
        stopper,
        method="cpu-wall",
        mode="hot",
        device="cpu",
        n_sets=n_sets,
        launches_per_sample=1,
        wall_s=now() - t_start,
        notes=notes,
        stage_s={"warmup_s": t_sampling - t_start, "prepare_s": 0.0, "sampling_s": now() - t_sampling},
    )
