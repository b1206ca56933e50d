"""CUDA timers: CUDA-graph replays ("cuda-graph") and blocking-kernel eager launches ("cuda-eager").

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
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from dskbench.measure import nvml
from dskbench.measure.core import CaptureFailed, assemble, drive, gap_for, launches_for, select_timer
from dskbench.measure.settings import Measurement, MeasureSettings

CALIBRATION_LAUNCHES = 8  # launches in the first (calibration) graph, rounded to the number of sets
COLD_MIN_LAUNCHES = 16  # cold graphs: at least this many [flush, launch] pairs, to average flush noise
# ...unless the pairs last this long anyway: a 4 ms attention kernel needs no 16 launches per sample to
# drown ~1 us of flush jitter, and 16-launch cold samples of ms-long kernels made a few cases take much
# of a sweep's measuring time (results/h200x2-2026-11-21/README.md).
COLD_MIN_SPAN_US = 2000.0
MAX_REPLAYS_PER_BATCH = 64
MAX_EAGER_COLD_BATCH = 32  # launches per eager batch: each is ~4 queue entries (flush, 2 events, kernel)
MAX_EAGER_HOT_LAUNCHES = 128  # launches queued per eager hot batch (the driver queue is finite)
MAX_SLEEP_US = 50_000.0
NVML_PERIOD_S = 0.1  # read clocks at most this often while sampling

_flush_buffers: dict[tuple[int, int], torch.Tensor] = {}


def cold_min_launches(pair_us: float) -> int:
    """[flush, kernel] pairs per cold sample: COLD_MIN_LAUNCHES, fewer once they span COLD_MIN_SPAN_US."""
    if pair_us <= 0:
        return COLD_MIN_LAUNCHES
    return max(1, min(COLD_MIN_LAUNCHES, math.ceil(COLD_MIN_SPAN_US / pair_us)))


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


def _events(n: int) -> list[torch.cuda.Event]:
    return [torch.cuda.Event(enable_timing=True) for _ in range(n)]


def _us(a: torch.cuda.Event, b: torch.cuda.Event) -> float:
    return a.elapsed_time(b) * 1000.0


class _CudaTimer:
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

    def _evs(self, n: int) -> list[torch.cuda.Event]:
        """n timing events, reused across batches (re-recording an event after reading it is fine)."""
        if len(self._pool) < n:
            self._pool.extend(_events(n - len(self._pool)))
        return self._pool[:n]

    def _flush(self) -> None:
        assert self.flush_buf is not None
        if self.settings.flush_kind == "read":
            # Read 2 x L2 into one scalar: L2 is left holding clean lines, so the timed kernel pays
            # no write-back of the flush's own data (an experiment: see MeasureSettings.flush_kind).
            if self._flush_sink is None:
                self._flush_sink = torch.zeros((), dtype=torch.int64, device=self.flush_buf.device)
            torch.sum(self.flush_buf, dim=0, out=self._flush_sink)
        else:
            self.flush_buf.zero_()

    def _sleep(self, us: float) -> None:
        torch.cuda._sleep(int(min(us, MAX_SLEEP_US) * self.rate))

    def _late(self) -> bool:
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


class GraphTimer(_CudaTimer):
    method = "cuda-graph"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.n = 0
        self.replays = 1

    def _capture(self, n: int, launches: bool) -> torch.cuda.CUDAGraph:
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.current_stream()
        try:
            with torch.cuda.graph(g, capture_error_mode="thread_local"):
                for i in range(n):
                    if self.cold:
                        self._flush()
                    if launches:
                        self.launchers[i % self.n_sets]()
        except Exception as e:
            # graph.__exit__ skips restoring the stream when capture_end raises: restore it here
            torch.cuda.set_stream(stream)
            try:
                torch.cuda.synchronize()
            except Exception as sticky:  # the context is broken: no fallback can help
                raise RuntimeError(f"CUDA error after a failed graph capture: {sticky}") from e
            raise CaptureFailed(f"{type(e).__name__}: {e}") from e
        return g

    def _build(self, n: int) -> None:
        self.close()
        graphs = [self._capture(n, launches=True)]
        if self.cold:
            graphs.append(self._capture(n, launches=False))
        for g in graphs:  # first replay uploads the graph: keep it out of any timing
            g.replay()
        torch.cuda.synchronize()
        self.graphs, self.n = graphs, n

    def _time_replays(self, reps: int) -> list[list[float]]:
        """Per-replay times (us) of each graph, replayed in turn `reps` times behind a sleep."""
        evs = self._evs(reps * len(self.graphs) + 1)
        self._sleep(self.lead_us)
        evs[0].record()
        j = 1
        for _ in range(reps):
            for g in self.graphs:
                g.replay()
                evs[j].record()
                j += 1
        evs[-1].synchronize()
        times = [_us(evs[i], evs[i + 1]) for i in range(len(evs) - 1)]
        k = len(self.graphs)
        return [times[g::k] for g in range(k)]

    def _per_launch(self) -> tuple[float, float]:
        """(launch incl. flush, flush) per launch in us, from the fastest of 3 replays."""
        times = self._time_replays(3)
        total = min(times[0]) / self.n
        flush = min(times[1]) / self.n if self.cold else 0.0
        return total, flush

    def prepare(self) -> None:
        s = self.settings
        target, cap = s.replay_target_us, s.max_graph_launches
        n = launches_for(0.0, 1.0, self.n_sets, cap, minimum=CALIBRATION_LAUNCHES)
        for _ in range(3):  # calibrate, resize, until a replay lasts between 0.5x and 10x the target
            self._build(n)
            total, flush = self._per_launch()
            minimum = cold_min_launches(total) if self.cold else 1
            want = launches_for(target, total, self.n_sets, cap, minimum)
            if n < minimum:  # too few pairs to average the flush: resize whatever the replay length
                n = want
                continue
            if want == n or 0.5 * target <= n * total <= 10 * target:
                break
            n = want
        if n != self.n:  # the last resize was not built yet
            self._build(n)
        self.launches_per_sample = self.n
        pair_us = self.n * (total + flush)
        self.replays = max(1, min(MAX_REPLAYS_PER_BATCH, math.ceil(s.batch_target_ms * 1000 / pair_us)))

    def batch(self, busy: Callable[[], None]) -> list[float]:
        k = len(self.graphs)
        evs = self._evs(self.replays * k + 1)
        self._sleep(self.lead_us)
        evs[0].record()
        j = 1
        late = False
        for r in range(self.replays):
            for g in self.graphs:
                g.replay()
                evs[j].record()
                j += 1
            if r == 0:
                late = evs[0].query()  # the GPU was already past the sleep: replay 0 may include idle
        busy()
        evs[-1].synchronize()
        self.batch_gpu_us = _us(evs[0], evs[-1])
        times = [_us(evs[i], evs[i + 1]) for i in range(len(evs) - 1)]
        start = 0
        if late:
            self._late()
            start = 1
        out = []
        for r in range(start, self.replays):
            t_k = times[r * k]
            if self.cold:
                t_f = times[r * k + 1]
                out.append((t_k - t_f) / self.n)
                self.flush_samples.append(t_f / self.n)
            else:
                out.append(t_k / self.n)
        return out

    def close(self) -> None:
        for g in self.graphs:
            g.reset()
        self.graphs = []


class EagerTimer(_CudaTimer):
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
        start, end = _events(2)
        self._sleep(2.0 * n0 * self.host_us + 50.0)
        start.record()
        self._launch_all(n0)
        end.record()
        flush = 0.0
        if self.cold:
            f0, f1 = _events(2)
            f0.record()
            self._flush()
            f1.record()
            f1.synchronize()
            flush = _us(f0, f1)
        end.synchronize()
        per_launch = max(_us(start, end) / n0, 0.01)
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
        gate, *evs = self._evs(2 * b + 1)
        self._sleep(self.lead_us)
        gate.record()
        for i in range(b):
            self._flush()
            evs[2 * i].record()
            self.launchers[i % self.n_sets]()
            evs[2 * i + 1].record()
        late = gate.query()
        busy()
        evs[-1].synchronize()
        self.batch_gpu_us = _us(gate, evs[-1])
        if late and self._late():
            return []
        out = [_us(evs[2 * i], evs[2 * i + 1]) for i in range(b)]
        # flush plus two event records between one launch's end and the next one's start
        self.flush_samples.extend(_us(evs[2 * i - 1], evs[2 * i]) for i in range(1, b))
        return out

    def _batch_hot(self, busy: Callable[[], None]) -> list[float]:
        k, g = self.samples_per_batch, self.group
        evs = self._evs(k + 1)
        self._sleep(self.lead_us)
        evs[0].record()
        for j in range(k):
            self._launch_all(g)
            evs[j + 1].record()
        late = evs[0].query()
        busy()
        evs[-1].synchronize()
        self.batch_gpu_us = _us(evs[0], evs[-1])
        if late and self._late():
            return []
        return [_us(evs[j], evs[j + 1]) / g for j in range(k)]


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
    timer: _CudaTimer,
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
        warm_up(launchers, settings)

        def make(cls: type[_CudaTimer]) -> Callable[[], _CudaTimer]:
            return lambda: cls(launchers, mode, settings, index, buf)

        timer, reason = select_timer(capturable, make(GraphTimer), make(EagerTimer))
        clocks = ClockReader(index)
        gap = gap_for(settings, timer.method, mode)
        gap_notes = []
        if gap is None and settings.launch_gap_us:
            gap_notes.append(f"no launch gap calibrated for {timer.method} {mode}: samples not corrected")
        raw: list[float] = []
        try:
            stopper = drive(timer, settings, clocks, gap_us=gap, raw=raw)
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
    )
