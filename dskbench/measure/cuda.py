"""CUDA timers: CUDA-graph replays ("cuda-graph", cuda_graph.py) and blocking-kernel eager launches
("cuda-eager", here), and `measure_cuda`, which runs one of them.

cuda-graph, hot: one graph holds n launches (cycling through the input sets), n chosen so that a replay
lasts >= replay_target_us. Each sample is one replay's event-to-event time over n. Replays are queued
back to back behind a short GPU sleep, so the device never waits for the host's graph-launch call.

cuda-graph, cold: two graphs, K = [flush, launch] x n and F = [flush] x n, replayed as adjacent pairs;
a sample is (t_K - t_F) / n, and flush_us is t_F / n. Why a difference of graphs rather than events
inside the graph: events recorded inside a graph need `Event(external=True)` and event-record nodes,
whose availability and timing behaviour vary by torch/driver version, while this scheme uses only
plain capture and events between replays (TritonBench's do_bench_cudagraph with cold L2 does the
same). Pairing adjacent replays cancels slow drift in flush speed (clocks, temperature); the flush
noise that remains is averaged over n and over many samples, and the median resists outliers. The
flush writes a buffer of 2 x L2 (read from the device) with a fill kernel, as Triton does.

cuda-eager (capturable=False, or capture failed): launches are queued behind torch.cuda._sleep, a
spinning kernel long enough to cover the host's enqueue time for the whole batch (nvbench's blocking
kernel), so the host's launch overhead never shows in the device timeline. If the sleep had already
ended when the host finished queuing, the batch is discarded and the sleep doubled. Cold: [flush,
event, launch, event] per launch, one sample per launch. Hot: events around groups of back-to-back
launches (a group lasts ~replay_target_us), so a sample is a group's time over its size, as in graphs.

Between batches the host idles `cooldown` x the batch's device time (see MeasureSettings), and NVML is
read while a batch runs (at most every 0.1 s) to judge throttling. Known residual: a hot-graph sample
carries one graph start per replay (a few us over >= replay_target_us, well under 3% at the default).

Launch gap: a graph sample is (kernel + the boundary to the next node) per launch, CUPTI's duration only
the kernel; eager samples carry event and launch latency. MeasureSettings.launch_gap_us, measured
against CUPTI by calibrate.py, is subtracted from every sample; raw_median_us keeps the uncorrected median.
A cold graph whose kernel follows the flush over a programmatic edge has its own gap measured against
CUPTI instead, from its own samples once taken (pdl_gap.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from dskbench.measure import nvml
from dskbench.measure.cuda_graph import GraphTimer
from dskbench.measure.cuda_timer import (
    CALIBRATION_LAUNCHES,
    MAX_SLEEP_US,
    CudaTimer,
    elapsed_us,
    events,
    flush_buffer,
    l2_bytes,
    sleep_rate,
)
from dskbench.measure.pdl_gap import case_gap
from dskbench.measure.sampling import assemble, drive, gap_for, launches_for, select_timer, subtract_gap
from dskbench.measure.settings import Measurement, MeasureSettings

MAX_EAGER_COLD_BATCH = 32  # launches per eager batch: each is ~4 queue entries (flush, 2 events, kernel)
MAX_EAGER_HOT_LAUNCHES = 128  # launches queued per eager hot batch (the driver queue is finite)
NVML_PERIOD_S = 0.1  # read clocks at most this often while sampling


class EagerTimer(CudaTimer):
    method = "cuda-eager"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.host_us = 0.0  # host enqueue time per launch
        self.group = 1  # hot: launches per sample
        self.samples_per_batch = 1

    def _launch_all(self, n: int) -> None:
        for i in range(n):
            self.launchers[i % self.n_sets]()

    def prepare(self) -> None:
        s = self.settings
        n0 = launches_for(0.0, 1.0, self.n_sets, 10**9, minimum=CALIBRATION_LAUNCHES)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        self._launch_all(n0)
        self.host_us = (time.perf_counter() - t0) * 1e6 / n0
        torch.cuda.synchronize()
        start, end = events(2)
        self.gpu_sleep(2.0 * n0 * self.host_us + 50.0)
        start.record()
        self._launch_all(n0)
        end.record()
        flush = 0.0
        if self.cold:
            f0, f1 = events(2)
            f0.record()
            self.flush()
            f1.record()
            f1.synchronize()
            flush = elapsed_us(f0, f1)
        end.synchronize()
        per_launch = max(elapsed_us(start, end) / n0, 0.01)
        if self.cold:
            self.launches_per_sample = 1
            self.samples_per_batch = launches_for(
                s.batch_target_ms * 1000, per_launch + flush, self.n_sets, MAX_EAGER_COLD_BATCH
            )
            queued = self.samples_per_batch
            self.host_us += 10.0  # the flush and two event records queued with each launch
        else:
            self.group = launches_for(s.replay_target_us, per_launch, self.n_sets, MAX_EAGER_HOT_LAUNCHES)
            self.launches_per_sample = self.group
            per_sample = self.group * per_launch
            fit = max(1, MAX_EAGER_HOT_LAUNCHES // self.group)
            self.samples_per_batch = max(1, min(fit, math.ceil(s.batch_target_ms * 1000 / per_sample)))
            queued = self.group * self.samples_per_batch
        self.lead_us = 1.5 * queued * self.host_us + 50.0

    def batch(self, busy: Callable[[], None]) -> list[float]:
        if self.cold:
            return self._batch_cold(busy)
        return self._batch_hot(busy)

    def _batch_cold(self, busy: Callable[[], None]) -> list[float]:
        b = self.samples_per_batch
        gate, *evs = self.timing_events(2 * b + 1)
        self.gpu_sleep(self.lead_us)
        gate.record()
        for i in range(b):
            self.flush()
            evs[2 * i].record()
            self.launchers[i % self.n_sets]()
            evs[2 * i + 1].record()
        late = gate.query()
        busy()
        evs[-1].synchronize()
        self.batch_gpu_us = elapsed_us(gate, evs[-1])
        if late and self.fell_behind():
            return []
        out = [elapsed_us(evs[2 * i], evs[2 * i + 1]) for i in range(b)]
        # flush plus two event records between one launch's end and the next one's start
        self.flush_samples.extend(elapsed_us(evs[2 * i - 1], evs[2 * i]) for i in range(1, b))
        return out

    def _batch_hot(self, busy: Callable[[], None]) -> list[float]:
        k, g = self.samples_per_batch, self.group
        evs = self.timing_events(k + 1)
        self.gpu_sleep(self.lead_us)
        evs[0].record()
        for j in range(k):
            self._launch_all(g)
            evs[j + 1].record()
        late = evs[0].query()
        busy()
        evs[-1].synchronize()
        self.batch_gpu_us = elapsed_us(evs[0], evs[-1])
        if late and self.fell_behind():
            return []
        return [elapsed_us(evs[j], evs[j + 1]) / g for j in range(k)]


def eager_per_launch(
    launchers: Sequence[Callable[[], Any]], index: int, launches: int = CALIBRATION_LAUNCHES
) -> float:
    """Device time of one launch (us): `launches` (rounded up to whole rotations; a fixed number, so
    every rank of a collective launches as many) queued behind a GPU sleep long enough to hide the
    host's launch cost, as the eager timer does."""
    n = len(launchers)
    count = math.ceil(launches / n) * n
    t0 = time.perf_counter()
    for i in range(count):
        launchers[i % n]()
    host_us = (time.perf_counter() - t0) * 1e6
    torch.cuda.synchronize()
    start, end = events(2)
    torch.cuda._sleep(int(min(2.0 * host_us + 50.0, MAX_SLEEP_US) * sleep_rate(index)))
    start.record()
    for i in range(count):
        launchers[i % n]()
    end.record()
    end.synchronize()
    return max(elapsed_us(start, end) / count, 0.01)


class ClockReader:
    """NVML clocks read while batches run, at most every NVML_PERIOD_S: the timers' `busy` hook, and
    the reads the throttle verdict is made from."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.reads: list[dict[str, Any]] = []
        self._last = -math.inf

    def __call__(self) -> None:
        now = time.perf_counter()
        if now - self._last >= NVML_PERIOD_S:
            self._last = now
            r = nvml.read_clocks(self.index)
            if r is not None:
                self.reads.append(r)


def cold_flush(index: int, mode: str, settings: MeasureSettings) -> tuple[int | None, torch.Tensor | None]:
    """(flush bytes, flush buffer) of a cold measurement; (None, None) when hot."""
    if mode != "cold":
        return None, None
    nbytes = settings.flush_bytes or 2 * l2_bytes(index)
    return nbytes, flush_buffer(index, nbytes)


def warm_up(launchers: list[Callable[[], Any]], settings: MeasureSettings) -> None:
    """JIT compilation, autotuning, handle creation, lazy loading: whole rotation rounds, then sync."""
    n = len(launchers)
    for i in range(math.ceil(max(settings.warmup_launches, 1) / n) * n):
        launchers[i % n]()
    torch.cuda.synchronize()


def finish(
    stopper: Any,
    timer: CudaTimer,
    *,
    mode: str,
    index: int,
    n_sets: int,
    t_start: float,
    flush_bytes: int | None,
    settings: MeasureSettings,
    reason: str | None,
    clocks_before: dict[str, Any] | None,
    clocks_after: dict[str, Any] | None,
    clocks: ClockReader,
    notes: list[str],
    gap: float | None,
    raw: list[float],
    stage_s: dict[str, float] | None = None,
) -> Measurement:
    """The Measurement of a CUDA timer's samples, with the clocks read around and during them."""
    throttled, reasons, during = nvml.judge(clocks.reads)
    return assemble(
        stopper,
        method=timer.method,
        mode=mode,
        device=f"cuda:{index}",
        n_sets=n_sets,
        launches_per_sample=timer.launches_per_sample,
        wall_s=time.perf_counter() - t_start,
        flush_us=timer.flush_us,
        flush_bytes=flush_bytes,
        flush_kind=settings.flush_kind if mode == "cold" else None,
        fallback_reason=reason,
        clocks_before=clocks_before,
        clocks_after=clocks_after,
        clocks_during=during,
        throttled=throttled,
        throttle_reasons=reasons,
        notes=[*timer.notes, *notes],
        launch_gap_us=gap,
        raw_samples=raw,
        stage_s=stage_s,
    )


def measure_cuda(
    launchers: list[Callable[[], Any]],
    *,
    device: str,
    mode: str,
    capturable: bool,
    settings: MeasureSettings,
) -> Measurement:
    t_start = time.perf_counter()
    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    n_sets = len(launchers)
    with torch.cuda.device(index):
        clocks_before = nvml.read_clocks(index)
        flush_bytes, buf = cold_flush(index, mode, settings)
        t_warmup = time.perf_counter()
        warm_up(launchers, settings)
        t_prepare = time.perf_counter()

        def make(cls: type[CudaTimer]) -> Callable[[], CudaTimer]:
            return lambda: cls(launchers, mode, settings, index, buf)

        timer, reason = select_timer(capturable, make(GraphTimer), make(EagerTimer))
        clocks = ClockReader(index)
        gap = gap_for(settings, timer.method, mode)
        gap_notes = []
        if gap is None and settings.launch_gap_us:
            gap_notes.append(f"no launch gap calibrated for {timer.method} {mode}: samples not corrected")
        raw: list[float] = []
        t_sampling = time.perf_counter()
        try:
            stopper = drive(timer, settings, clocks, gap_us=gap, raw=raw)  # its last batch waited for the GPU
            if gap and isinstance(timer, GraphTimer) and timer.cold:  # its own gap, if behind a PDL edge
                gap, gap_notes = case_gap(timer, raw, gap)
                stopper.samples[:] = subtract_gap(raw, gap)
            t_done = time.perf_counter()
        finally:
            timer.close()
        torch.cuda.synchronize()
        clocks_after = nvml.read_clocks(index)
    return finish(
        stopper,
        timer,
        mode=mode,
        index=index,
        n_sets=n_sets,
        t_start=t_start,
        flush_bytes=flush_bytes,
        settings=settings,
        reason=reason,
        clocks_before=clocks_before,
        clocks_after=clocks_after,
        clocks=clocks,
        notes=gap_notes,
        gap=gap,
        raw=raw,
        stage_s={
            "warmup_s": t_prepare - t_warmup,
            "prepare_s": t_sampling - t_prepare,
            "sampling_s": t_done - t_sampling,
        },
    )
