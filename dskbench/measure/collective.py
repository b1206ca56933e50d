"""Timing a collective (an all-reduce across ranks) with the measurement core, every rank in step.

`measure()` cannot time a collective as it is: each rank would size its graphs, its batches and its
stopping point from its own clock, and a rank that launches one all-reduce more than the others waits
for ever. Here every choice that decides how many kernels are launched is made once for all ranks:

* launches per graph (or per eager group) and replays per batch: rank 0's values, broadcast;
* graph capture counts only when it worked on every rank (else all ranks time eagerly);
* sampling stops when the stopping policy (stopping.py) has stopped on every rank.

Everything else is the core's: the CUDA timers (graph replays behind a GPU sleep, cold-L2 flushes
subtracted), the statistics, and the Measurement (core.assemble), computed per rank from its own
samples. The first replay (eager: first sample) of each batch is not a sample: each rank's GPU starts a
batch behind its own sleep, and that first collective absorbs the ranks' skew, so every sample is a
collective that the ranks entered together.

The agreement goes over a CPU (gloo) process group, between batches, while the GPUs are idle.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from dskbench.measure.sampling import CaptureFailed, assemble, gap_for, launches_for, make_stopper, take
from dskbench.measure.settings import Measurement, MeasureSettings
from dskbench.measure.stopping import Stopper

CPU_CALLS_PER_BATCH = 8  # cpu-wall: timed calls per batch (after the untimed one)
PRE_CALIBRATION_LAUNCHES = 8  # eager launches timed (twice) to choose launches per graph


class Agreement:
    """Rank 0 decides, every rank follows; `group` is a CPU (gloo) process group, or None for the default
    group. Without an initialised process group (one rank) every call returns its own argument."""

    def __init__(self, group: Any = None):
        import torch.distributed as dist

        self.group = group
        self.active = dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
        self.rank = dist.get_rank(group) if self.active else 0
        self.size = dist.get_world_size(group) if self.active else 1

    def _src(self) -> int:
        import torch.distributed as dist

        return dist.get_global_rank(self.group, 0) if self.group is not None else 0

    def value(self, x: float) -> float:
        """Rank 0's x on every rank."""
        if not self.active:
            return x
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(x)], dtype=torch.float64)
        dist.broadcast(t, src=self._src(), group=self.group)
        return float(t.item())

    def all(self, flag: bool) -> bool:
        """True only where every rank says True."""
        if not self.active:
            return bool(flag)
        import torch
        import torch.distributed as dist

        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return bool(t.item())

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's obj, in rank order, on every rank."""
        if not self.active:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out


def drive_collective(
    timer: Any,
    settings: MeasureSettings,
    agree: Agreement,
    busy: Callable[[], None] = lambda: None,
    gap_us: float | None = None,
    raw: list[float] | None = None,
    now: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> Stopper:
    """sampling.drive, with the stop agreed: batches go on until every rank's stopping policy has stopped
    (a rank that stopped first keeps launching, in step, and ignores the extra samples)."""
    stopper = make_stopper(settings, now)
    while True:
        batch = timer.batch(busy)
        if not stopper.stopped:
            take(stopper, batch, gap_us, raw)
        if agree.all(stopper.stopped):
            break
        if settings.cooldown > 0 and timer.batch_gpu_us > 0:
            sleep(settings.cooldown * timer.batch_gpu_us * 1e-6)
    return stopper


class CpuCollectiveTimer:
    """cpu-wall for collectives on CPU tensors (gloo): a fixed number of calls per batch, the first one
    untimed (it absorbs the ranks' skew). Lets the collective path run, and be tested, on a CPU."""

    method = "cpu-wall"
    launches_per_sample = 1
    flush_us = None

    def __init__(
        self, launchers: Sequence[Callable[[], Any]], clock_ns: Callable[[], int] = time.perf_counter_ns
    ):
        self.launchers = list(launchers)
        self.clock_ns = clock_ns
        self.notes: list[str] = []
        self.batch_gpu_us = 0.0
        self.calls = 0

    def prepare(self) -> None:
        pass

    def batch(self, busy: Callable[[], None]) -> list[float]:
        n = len(self.launchers)
        self.launchers[self.calls % n]()
        self.calls += 1
        out = []
        for _ in range(CPU_CALLS_PER_BATCH):
            t0 = self.clock_ns()
            self.launchers[self.calls % n]()
            out.append((self.clock_ns() - t0) / 1000.0)
            self.calls += 1
        return out

    def close(self) -> None:
        pass


def _cuda_timer_classes() -> tuple[type, type]:
    """The collective subclasses of the CUDA timers (built on first use: the CUDA timers import torch)."""
    from dskbench.measure.cuda import EagerTimer
    from dskbench.measure.cuda_graph import GraphTimer, replays_for

    class CollectiveGraphTimer(GraphTimer):
        """GraphTimer with an agreed graph size and replay count, capture agreed by all ranks, and the
        first replay of each batch dropped (it absorbs the ranks' skew). `capture_context` wraps each
        capture (a custom all-reduce registers the buffers the graph uses when its context exits)."""

        def __init__(self, *args: Any, n: int, agree: Agreement, capture_context: Callable[[], Any]):
            super().__init__(*args)
            self.n_agreed, self.agree, self.capture_context = n, agree, capture_context
            self.discard_replays = 1

        def capture_graphs(self, n: int) -> list[Any]:
            graphs: list[Any] = []
            err: CaptureFailed | None = None
            hard: Exception | None = None  # not a capture failure (a broken context): no eager fallback
            with self.capture_context():
                try:
                    graphs.append(self.capture(n, launches=True))
                    if self.cold:
                        graphs.append(self.capture(n, launches=False))
                except CaptureFailed as e:
                    err = e
                except Exception as e:  # noqa: BLE001 - agreed first, then raised on every rank
                    hard = e
                ok = self.agree.all(err is None and hard is None)  # inside the context: its exit is a
                if not ok:  # collective too
                    for g in graphs:
                        g.reset()
                    # every rank raises the same kind: one falling back to eager launches while another
                    # gives up would leave the first waiting in a collective for ever
                    hard_anywhere = not self.agree.all(hard is None)
                    if hard is not None:
                        raise hard
                    if hard_anywhere:
                        raise RuntimeError("graph capture broke on another rank (its error is recorded)")
                    raise err or CaptureFailed("graph capture failed on another rank")
            return graphs

        def prepare(self) -> None:
            self.build(self.n_agreed)
            total, flush = self.per_launch()
            pair_us = max(self.n * (total + flush), 1e-3)
            self.replays = int(self.agree.value(replays_for(self.settings.batch_target_ms, pair_us)))
            self.launches_per_sample = self.n

    class CollectiveEagerTimer(EagerTimer):
        """EagerTimer with rank 0's group size and batch size, and the first sample of a batch dropped."""

        def __init__(self, *args: Any, agree: Agreement):
            super().__init__(*args)
            self.agree = agree

        def prepare(self) -> None:
            super().prepare()  # its launch counts depend on the number of input sets only
            self.samples_per_batch = max(2, int(self.agree.value(self.samples_per_batch)))
            if self.cold:
                queued = self.samples_per_batch
            else:
                self.group = int(self.agree.value(self.group))
                self.launches_per_sample = self.group
                queued = self.group * self.samples_per_batch
            self.lead_us = 1.5 * queued * self.host_us + 50.0

        def batch(self, busy: Callable[[], None]) -> list[float]:
            return super().batch(busy)[1:]

    return CollectiveGraphTimer, CollectiveEagerTimer


def measure_collective(
    launchers: Sequence[Callable[[], Any]],
    *,
    agree: Agreement,
    device: str = "cuda",
    mode: str = "hot",
    capturable: bool = True,
    settings: MeasureSettings | None = None,
    capture_context: Callable[[], Any] = contextlib.nullcontext,
) -> Measurement:
    """Time one collective on this rank; every rank of `agree` must call it with the same arguments.

    Launchers, modes and the Measurement are those of `measure()`. `capture_context` wraps each graph
    capture (e.g. a custom all-reduce's `capture()`, which registers the graph's buffers on exit)."""
    settings = settings or MeasureSettings()
    if mode not in ("hot", "cold"):
        raise ValueError(f"mode must be hot or cold, got {mode!r}")
    fns = list(launchers)
    if not fns:
        raise ValueError("measure_collective() needs at least one launcher")
    n_sets = len(fns)
    t_start = time.perf_counter()
    if str(device).startswith("cpu"):
        return _measure_cpu(fns, agree, settings, mode, t_start)
    import torch

    from dskbench.measure import cuda, nvml
    from dskbench.measure.cuda_graph import COLD_MIN_LAUNCHES

    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    graph_cls, eager_cls = _cuda_timer_classes()
    with torch.cuda.device(index):
        clocks_before = nvml.read_clocks(index)
        flush_bytes, buf = cuda.cold_flush(index, mode, settings)
        cuda.warm_up(fns, settings)
        cold = mode == "cold"
        minimum = COLD_MIN_LAUNCHES if cold else 1
        per_launch = cuda.eager_per_launch(fns, index, PRE_CALIBRATION_LAUNCHES)
        want = launches_for(
            settings.replay_target_us, per_launch, n_sets, settings.max_graph_launches, minimum
        )
        n = int(agree.value(want))
        base = (fns, mode, settings, index, buf)
        reason = None
        timer: Any = None
        if capturable:
            timer = graph_cls(*base, n=n, agree=agree, capture_context=capture_context)
            try:
                timer.prepare()
            except CaptureFailed as e:
                timer.close()
                timer, reason = None, f"graph capture failed: {e}"
        else:
            reason = "capturable=False"
        if timer is None:
            timer = eager_cls(*base, agree=agree)
            timer.prepare()
        clocks = cuda.ClockReader(index)
        gap = gap_for(settings, timer.method, mode)
        raw: list[float] = []
        try:
            stopper = drive_collective(timer, settings, agree, clocks, gap_us=gap, raw=raw)
        finally:
            timer.close()
        torch.cuda.synchronize()
        clocks_after = nvml.read_clocks(index)
    return cuda.finish(
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
        notes=["collective: launch counts agreed by all ranks; first replay of each batch dropped"],
        gap=gap,
        raw=raw,
    )


def _measure_cpu(
    fns: list[Callable[[], Any]], agree: Agreement, settings: MeasureSettings, mode: str, t_start: float
) -> Measurement:
    for i in range(math.ceil(max(settings.warmup_launches, 1) / len(fns)) * len(fns)):
        fns[i % len(fns)]()
    timer = CpuCollectiveTimer(fns)
    stopper = drive_collective(timer, settings, agree)
    notes = ["cold requested: cpu-wall has no cache flush, timed hot"] if mode == "cold" else []
    return assemble(
        stopper,
        method=timer.method,
        mode="hot",
        device="cpu",
        n_sets=len(fns),
        launches_per_sample=1,
        wall_s=time.perf_counter() - t_start,
        notes=notes,
    )
