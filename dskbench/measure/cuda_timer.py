"""What every CUDA timer shares: the cold-mode L2 flush, the GPU sleep that keeps the device ahead of
the host, timing events, and the CudaTimer base the graph and eager timers (and their collective
variants) build on. How the timers use them: cuda.py's docstring."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from dskbench.measure.settings import MeasureSettings

CALIBRATION_LAUNCHES = 8  # launches in the first (calibration) graph, rounded to the number of sets
MAX_SLEEP_US = 50_000.0

_flush_buffers: dict[tuple[int, int], torch.Tensor] = {}
_sleep_rate: dict[int, float] = {}  # torch.cuda._sleep cycles per microsecond


def l2_bytes(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).L2_cache_size)


def flush_buffer(index: int, nbytes: int) -> torch.Tensor:
    """The cold-mode flush buffer (int32, allocated once per device and size, outside any timing)."""
    key = (index, nbytes)
    buf = _flush_buffers.get(key)
    if buf is None:
        for k in [k for k in _flush_buffers if k[0] == index]:
            del _flush_buffers[k]
        buf = torch.empty(max(1, nbytes // 4), dtype=torch.int32, device=f"cuda:{index}")
        buf.fill_(1)
        _flush_buffers[key] = buf
    return buf


def sleep_rate(index: int) -> float:
    """Cycles per microsecond of torch.cuda._sleep on this device (measured once)."""
    rate = _sleep_rate.get(index)
    if rate is None:
        torch.cuda._sleep(1000)  # first call loads the kernel
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 2_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        rate = max(cycles / (start.elapsed_time(end) * 1000.0), 100.0)
        _sleep_rate[index] = rate
    return rate


def events(n: int) -> list[torch.cuda.Event]:
    return [torch.cuda.Event(enable_timing=True) for _ in range(n)]


def elapsed_us(a: torch.cuda.Event, b: torch.cuda.Event) -> float:
    return a.elapsed_time(b) * 1000.0


class CudaTimer:
    """A timer's state and the steps every CUDA timer takes: flush, sleep ahead, record events."""

    method = "cuda"

    def __init__(
        self,
        launchers: list[Callable[[], Any]],
        mode: str,
        settings: MeasureSettings,
        index: int,
        flush_buf: torch.Tensor | None,
    ) -> None:
        self.launchers = launchers
        self.n_sets = len(launchers)
        self.cold = mode == "cold"
        self.settings = settings
        self.index = index
        self.flush_buf = flush_buf
        self._flush_sink: torch.Tensor | None = None
        self.rate = sleep_rate(index)
        self.lead_us = 100.0  # GPU sleep ahead of each batch
        self.launches_per_sample = 1
        self.batch_gpu_us = 0.0
        self.flush_samples: list[float] = []
        self.notes: list[str] = []
        self._late_noted = False
        self._pool: list[torch.cuda.Event] = []

    def timing_events(self, n: int) -> list[torch.cuda.Event]:
        """n timing events, reused across batches (re-recording an event after reading it is fine)."""
        if len(self._pool) < n:
            self._pool.extend(events(n - len(self._pool)))
        return self._pool[:n]

    def flush(self) -> None:
        """Queue one L2 flush (cold mode)."""
        assert self.flush_buf is not None
        if self.settings.flush_kind == "read":
            # Read 2 x L2 into one scalar: L2 is left holding clean lines, so the timed kernel pays
            # no write-back of the flush's own data (an experiment: see MeasureSettings.flush_kind).
            if self._flush_sink is None:
                self._flush_sink = torch.zeros((), dtype=torch.int64, device=self.flush_buf.device)
            torch.sum(self.flush_buf, dim=0, out=self._flush_sink)
        else:
            self.flush_buf.zero_()

    def gpu_sleep(self, us: float) -> None:
        """Queue a spinning kernel of about `us` microseconds (at most MAX_SLEEP_US)."""
        torch.cuda._sleep(int(min(us, MAX_SLEEP_US) * self.rate))

    def fell_behind(self) -> bool:
        """The sleep ended before the host finished queuing: lengthen it. True: discard the batch."""
        if self.lead_us >= MAX_SLEEP_US:
            if not self._late_noted:
                self.notes.append("host could not stay ahead of the GPU even behind a 50 ms sleep")
                self._late_noted = True
            return False
        self.lead_us = min(self.lead_us * 2.0, MAX_SLEEP_US)
        return True

    @property
    def flush_us(self) -> float | None:
        return statistics.median(self.flush_samples) if self.flush_samples else None

    def close(self) -> None:
        pass
