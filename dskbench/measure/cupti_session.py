"""One CUPTI activity session through torch's profiler: the device activities of what a callable queues.

Why its own module: the batched timer, the CUPTI cross-check and the per-case timer's measured launch gap
(pdl_gap.py) all read kernels' spans this way, and the per-case timer cannot import the batched one.
Through the profiler's low-level switches: torch.profiler.profile turns every event into a Python object
on exit, which for the thousands of launches of a batch's chunk cost far more than the chunk itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def profile(queue: Callable[[], None]) -> list[tuple[str, int, int]]:
    """Device activities (name, start_ns, end_ns) of what `queue` launches, from one profiler session."""
    return cuda_activities(session(queue))


def cuda_activities(result: Any) -> list[tuple[str, int, int]]:
    """The CUDA activities of a profiler session's raw result."""
    from torch.autograd import DeviceType

    out = []
    for e in result.events():
        if e.device_type() == DeviceType.CUDA:
            start = int(e.start_ns())
            out.append((e.name(), start, start + int(e.duration_ns())))
    return out


def session(queue: Callable[[], None]) -> Any:
    """One CUDA-activity profiler session around `queue` (and a synchronisation): its raw result."""
    from torch._C._profiler import ProfilerActivity, _ExperimentalConfig
    from torch.autograd import (
        ProfilerConfig,
        ProfilerState,
        _disable_profiler,
        _enable_profiler,
        _prepare_profiler,
    )

    try:
        config = ProfilerConfig(
            ProfilerState.KINETO, False, False, False, False, False, _ExperimentalConfig()
        )
    except TypeError:  # another torch's signature: the public profiler, slower but the same records
        return public_session(queue)
    activities = {ProfilerActivity.CUDA}
    _prepare_profiler(config, activities)
    _enable_profiler(config, activities)
    try:
        queue()
        torch.cuda.synchronize()
    finally:
        result = _disable_profiler()
    return result


def public_session(queue: Callable[[], None]) -> Any:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as public_profile

    with public_profile(activities=[ProfilerActivity.CUDA]) as prof:
        queue()
        torch.cuda.synchronize()
    return prof.profiler.kineto_results
