"""The device a sweep plans for, as gating compares requirements with it."""

from __future__ import annotations

import os
from dataclasses import dataclass


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity set where the OS keeps one (a job queue or
    `taskset` that grants 16 cores of a 64-core host gives 16), else every core the OS counts."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class DeviceInfo:
    """The machine a sweep plans for: what gating (dskbench.execution.gate) compares requirements with."""

    kind: str  # "cuda" or "cpu"
    name: str = "cpu"
    sm: int = 0
    count: int = 0
    memory_bytes: int | None = None  # one GPU's total memory; None: not checked (a CPU)

    @classmethod
    def detect(cls, want: str = "cuda") -> DeviceInfo:
        if want == "cpu":
            return cls("cpu")
        try:
            import torch
        except ImportError:
            return cls("cpu")
        if not torch.cuda.is_available():
            return cls("cpu")
        major, minor = torch.cuda.get_device_capability()
        memory = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        return cls(
            "cuda", torch.cuda.get_device_name(), major * 10 + minor, torch.cuda.device_count(), int(memory)
        )
