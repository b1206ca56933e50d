"""The one timing entry point, `measure()`.

Every front end (CLI runner, asv, pytest-benchmark) times through `measure()`; there is no second timer.
Device-specific timers (cuda.py, cpu.py) only produce batches of per-launch samples; the stopping
policy, method selection (graph, else eager with the reason recorded) and the result live in
sampling.py, so they are the same everywhere and testable with fakes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dskbench.measure.sampling import MODES
from dskbench.measure.settings import Measurement, MeasureSettings


def _check_args(launchers: Sequence[Callable[[], Any]], mode: str) -> list[Callable[[], Any]]:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    out = list(launchers)
    if not out:
        raise ValueError("measure() needs at least one launcher")
    for f in out:
        if not callable(f):
            raise TypeError(f"launcher {f!r} is not callable")
    return out


def measure(
    launchers: Sequence[Callable[[], Any]],
    *,
    device: str = "cuda",
    mode: str = "cold",
    capturable: bool = True,
    settings: MeasureSettings | None = None,
) -> Measurement:
    """Time one kernel: per-launch samples until the settings' stopping policy is met or the budget ends.

    `launchers`: one zero-argument callable per input set, each launching the kernel once on the current
    stream. Launches cycle through them round robin, so every replay/sample uses every set equally.
    `mode`: "cold" flushes L2 before every launch (the flush's time is excluded), "hot" runs back to back.
    `capturable`: False skips CUDA graph capture and times eagerly (cuda-eager). device "cpu": wall clock.
    """
    fns = _check_args(launchers, mode)
    settings = settings or MeasureSettings()
    if str(device).startswith("cpu"):
        from dskbench.measure.cpu import measure_cpu

        return measure_cpu(fns, mode=mode, settings=settings)
    from dskbench.measure.cuda import measure_cuda

    return measure_cuda(fns, device=str(device), mode=mode, capturable=capturable, settings=settings)
