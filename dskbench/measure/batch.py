"""Batched cold timing ("cupti-graph"): many cases sampled by one stream of graph replays, each case's
time read from CUPTI's activity records.

Why: a case timed alone pays for its own calibration, two graphs (launches with flushes, flushes alone)
and at least one or two 20 ms batches before its stopping rule may look at it; most of a sweep's
measuring time went there. Here every case gets one graph of [flush, launch], and one profiled chunk
replays the graphs of all the batch's cases still sampling; CUPTI gives each kernel's start and end on
the device, so a case's sample is its own span (batch_spans.py) and the flush is left out by
construction rather than subtracted. In a chunk each case's replays run back to back, a short case's
first one not counted (contiguous()), so a case meets only itself, as in the per-case timer; chunks
repeat until each case's stopping rule is met. The flush is in the same graph as the launch, right
before it, as in the per-case timer, so a case sees the same cold L2. A sample is one launch (the
per-case timer averages many), so a case takes at least MIN_SAMPLE_US of samples, and never fewer than
the settings' minimum.

Used for cold mode with the write flush when the profiler (CUPTI through torch.profiler) works; a case
whose graph cannot be captured, and every case when CUPTI is missing, is timed by the per-case timers.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from dskbench.measure import cross_check, cupti_session, nvml
from dskbench.measure.batch_spans import (
    EARLY_NOTE,
    JITTER_NS,
    MARKER,
    ChunkMismatch,
    clock_step_ns,
    per_case,
    split_groups,
)
from dskbench.measure.cuda import ClockReader
from dskbench.measure.cuda_timer import l2_bytes
from dskbench.measure.sampling import assemble, gap_for, make_stopper, subtract_gap
from dskbench.measure.settings import Measurement, MeasureSettings

METHOD = "cupti-graph"
MAX_MIN_SAMPLES = 64  # ...for short kernels, where one launch is a noisy sample
MIN_SAMPLE_US = 2000.0  # device time of a case's first samples (its flushes included)
MAX_ROUNDS = 2048
GROWTH = 1.3  # a case short of its noise target asks for this much more than the 1/sqrt(n) law says
# A [flush, launch] replay shorter than this leads its run in a chunk with one replay more, not counted:
# what ran before a kernel moves a short one's reading, not a long one's (whose extra replay would cost most)
LEAD_UNDER_US = 250.0
# Cases whose replay takes this long or more (prefill GEMMs, attention) are sampled after the lighter ones of
# their batch, and the lighter ones only once the GPU has idled SETTLE_S (heavy work may have just run):
# behind millisecond GEMMs a light kernel read up to a quarter longer (results/h200-2026-11-29/).
HEAVY_FROM_US = LEAD_UNDER_US
SETTLE_S = 0.05
MAX_CHUNK_RETRIES = 2  # chunks whose markers did not add up, before the batch gives up
STEP_FLUSHES = 2048  # flush durations the clock's step is read from (batch_spans.clock_step_ns)...
MIN_STEP_FLUSHES = 64  # ...once at least this many are in

_cupti_ok: bool | None = None


def cupti_available() -> bool:
    """Whether torch.profiler records CUDA kernel activities here (checked once per process)."""
    global _cupti_ok
    if _cupti_ok is None:
        try:
            buf = torch.zeros(16, dtype=torch.complex64, device="cuda")
            acts = _profile(buf.zero_)
            _cupti_ok = any(MARKER in a[0] for a in acts)
        except Exception:  # noqa: BLE001 - no kineto/CUPTI: the per-case timers serve
            _cupti_ok = False
    return _cupti_ok


def _profile(queue: Callable[[], None]) -> list[tuple[str, int, int]]:
    """Device activities (name, start_ns, end_ns) of what `queue` launches, from one profiler session
    (cupti_session.py); through `_session`, which a probe may wrap to time it."""
    return cupti_session.cuda_activities(_session(queue))


def _session(queue: Callable[[], None]) -> Any:
    return cupti_session.session(queue)


_flush: dict[tuple[int, int], torch.Tensor] = {}


def flush_buffer(index: int, nbytes: int) -> torch.Tensor:
    """The flush's buffer: complex64, so that its fill kernel is one no benchmarked kernel launches and
    marks where each case begins (batch_spans.MARKER). Allocated once per device and size."""
    buf = _flush.get((index, nbytes))
    if buf is None:
        _flush.clear()
        buf = torch.ones(max(1, nbytes // 8), dtype=torch.complex64, device=f"cuda:{index}")
        _flush[(index, nbytes)] = buf
    return buf


def _capture(launch: Callable[[], Any], flush: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """One graph: flush, launch. Raises on a launch that cannot be captured."""
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            flush()
            launch()
    except Exception:
        torch.cuda.set_stream(stream)  # graph.__exit__ skips this when capture_end raises
        torch.cuda.synchronize()
        raise
    return g


def _flush_graph(flush: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """One graph of the flush alone, uploaded: the event cross-check's other half of a pair."""
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            flush()
    except Exception:
        torch.cuda.set_stream(stream)
        torch.cuda.synchronize()
        raise
    g.replay()
    torch.cuda.synchronize()
    return g


def _clock(index: int) -> cross_check.CudaClock:
    return cross_check.CudaClock(index)


class BatchCase:
    """One case of a batch: its graphs (one per input set), stopper and GPU time used so far."""

    def __init__(self, graphs: list[torch.cuda.CUDAGraph]) -> None:
        self.graphs = graphs
        self.gpu_s = 0.0  # its spans and flushes: the clock its budget is read on
        self.stopper: Any = None
        self.flushes: list[float] = []
        self.raw: list[float] = []  # spans before the calibrated gap is subtracted
        self.early = 0  # samples whose kernel started before the flush ended (clipped)
        self.done = False
        self.empty = 0  # chunks that gave it no sample
        self.est_us = 0.0  # one [flush, launch] replay, for sizing chunks
        self.quota = 0  # rounds it takes part in, in the next chunk
        self.launched = 0  # replays so far (input sets are taken round robin)

    def start(self, settings: MeasureSettings) -> None:
        """Its stopper, once its replay time is known: at least MIN_SAMPLE_US of samples."""
        floor = min(MAX_MIN_SAMPLES, math.ceil(MIN_SAMPLE_US / self.est_us))
        s = settings.with_(min_samples=max(settings.min_samples, floor), min_time_s=0.0)
        self.stopper = make_stopper(s, now=lambda: self.gpu_s)
        self.quota = self.stopper.min_samples

    def next_quota(self, max_samples: int) -> int:
        """Samples to ask for next: what the noise law says the target needs, at least a tenth more."""
        st = self.stopper
        n = len(st.samples)
        if n == 0:
            return st.min_samples
        ratio = st.noise / st.target() if math.isfinite(st.noise) else 2.0
        want = math.ceil(n * max(ratio**2 * GROWTH, 1.1)) - n
        return max(8, min(want, max_samples - n, 4 * n))


def measure_batch(
    entries: Sequence[Sequence[Callable[[], Any]]], *, device: str, settings: MeasureSettings
) -> list[Measurement | str]:
    """Time each entry (its launchers: one per input set) cold, all in one stream of rounds.

    Returns, per entry, its Measurement or a one-line reason it was not timed here (its graph could
    not be captured): the caller times those with the per-case timer."""
    t_start = time.perf_counter()
    batch_no = next(_BATCHES)
    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    out: list[Measurement | str] = ["not timed"] * len(entries)
    with torch.cuda.device(index):
        clocks_before = nvml.read_clocks(index)
        flush_bytes = settings.flush_bytes or 2 * l2_bytes(index)
        buf = flush_buffer(index, flush_bytes)

        def flush() -> None:
            buf.zero_()

        t_warm = time.perf_counter()
        for fns in entries:  # lazy loading, handles, workspaces: off the capture
            for f in fns:
                f()
        torch.cuda.synchronize()
        t_capture = time.perf_counter()
        cases: dict[int, BatchCase] = {}
        for i, fns in enumerate(entries):
            try:
                cases[i] = BatchCase([_capture(f, flush) for f in fns])
            except Exception as e:  # noqa: BLE001 - timed alone by the caller
                out[i] = f"graph capture failed: {type(e).__name__}: {e}"[:500]
        _estimate(cases)
        for c in cases.values():
            c.start(settings)
        t_sampling = time.perf_counter()
        clocks = ClockReader(index)
        notes: list[str] = []
        gap = gap_for(settings, METHOD, "cold")
        if gap is None and settings.launch_gap_us:
            notes.append(f"no launch gap calibrated for {METHOD}: samples not corrected")
        sample_by_weight(cases, clocks, settings, notes, gap)
        t_done = time.perf_counter()
        torch.cuda.synchronize()
        clocks_after = nvml.read_clocks(index)
        checks = cross_checks(cases, flush, index, settings) if settings.cross_check else None
        t_checked = time.perf_counter()
    throttled, reasons, during = nvml.judge(clocks.reads)
    n = max(len(cases), 1)
    shares = {
        "warmup_s": (t_capture - t_warm) / n,
        "prepare_s": (t_sampling - t_capture) / n,
        "sampling_s": (t_done - t_sampling) / n,
    }
    if checks is not None:
        shares["cross_check_s"] = (t_checked - t_done) / n
    for i, c in cases.items():
        if not c.stopper.samples:
            out[i] = "CUPTI gave no samples of it"
            continue
        flush_us = sorted(c.flushes)[len(c.flushes) // 2] if c.flushes else None
        m = assemble(
            c.stopper,
            method=METHOD,
            mode="cold",
            device=f"cuda:{index}",
            n_sets=len(c.graphs),
            launches_per_sample=1,
            wall_s=(time.perf_counter() - t_start) / n,
            flush_us=flush_us,
            flush_bytes=flush_bytes,
            flush_kind="write",
            clocks_before=clocks_before,
            clocks_after=clocks_after,
            clocks_during=during,
            throttled=throttled,
            throttle_reasons=reasons,
            notes=[*notes, batch_note(batch_no, i, len(cases)), *_early_note(c)],
            launch_gap_us=gap,
            raw_samples=c.raw[: len(c.stopper.samples)],
            stage_s=shares,
        )
        if checks is not None:
            m.cross_check = cross_check.cross_of(
                m.to_dict(), cross_check.EVENTS, checks.get(i, []), settings.launch_gap_us, "cold"
            )
        out[i] = m
        for g in c.graphs:
            g.reset()
    return out


def cross_checks(
    cases: dict[int, BatchCase], flush: Callable[[], None], index: int, settings: MeasureSettings
) -> dict[int, list[float]]:
    """The event timer's raw samples of each case that has samples (dskbench.measure.cross_check): its own
    [flush, launch] graph replayed in pairs with one graph of the flush alone, captured here once for
    the whole batch. Nothing (every case then says why) when that graph cannot be captured."""
    try:
        g = _flush_graph(flush)
    except Exception:  # noqa: BLE001 - no cross-check rather than no timing
        return {}
    mine = [(i, c) for i, c in cases.items() if c.stopper.samples]
    try:
        got = cross_check.event_pairs([(c.graphs[0], c.est_us) for _, c in mine], g, _clock(index))
    except Exception:  # noqa: BLE001 - the timings stand without their cross-check
        torch.cuda.synchronize()
        return {}
    finally:
        g.reset()
    if settings.cooldown > 0:
        time.sleep(
            settings.cooldown * sum(2 * len(s) * c.est_us for (_, c), s in zip(mine, got, strict=True)) * 1e-6
        )
    return {i: s for (i, _), s in zip(mine, got, strict=True)}


_BATCHES = itertools.count(1)  # this process's batches, numbered for the notes


def batch_note(batch_no: int, index: int, size: int) -> str:
    """Which batch of its worker a case was sampled in, and where: its neighbours in the replays are the
    cases noted with the same batch number (what ran before a case is one thing that can move it)."""
    return f"sampled in a batch of {size} cases (batch {batch_no} of this worker, case {index + 1})"


def _early_note(c: BatchCase) -> list[str]:
    if not c.early:
        return []
    return [EARLY_NOTE.format(n=c.early)]


def _estimate(cases: dict[int, BatchCase]) -> None:
    """Upload every graph (its first replay) and time one replay of each with events."""
    for c in cases.values():
        for g in c.graphs:
            g.replay()
    torch.cuda.synchronize()
    for c in cases.values():
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        c.graphs[0].replay()
        b.record()
        b.synchronize()
        c.est_us = max(a.elapsed_time(b) * 1000.0, 1.0)


def contiguous(taken: Sequence[int], est_us: Sequence[float]) -> tuple[list[int], list[int]]:
    """A chunk's replays: each case's samples back to back, lightest case first, each run of a case under
    LEAD_UNDER_US led by one more replay whose sample is dropped (the case's first kernel after another
    case's). Returns (the case of each replay, the bucket of each: the case, or len(est_us) for a
    dropped one).

    Why: interleaved with other cases a light kernel read longer than alone (the clocks lowered by a heavy
    neighbour's power, and more; docs/measurement.md), so a case's reading depended on which cases shared
    its batch. Back to back, as the per-case timer replays it, a case meets only itself."""
    counts: dict[int, int] = {}
    for k in taken:
        counts[k] = counts.get(k, 0) + 1
    replays: list[int] = []
    buckets: list[int] = []
    for k in sorted(counts, key=lambda k: (est_us[k], k)):
        lead = 1 if est_us[k] < LEAD_UNDER_US else 0
        replays += [k] * (counts[k] + lead)
        buckets += [len(est_us)] * lead + [k] * counts[k]
    return replays, buckets


def sample_by_weight(
    cases: dict[int, BatchCase],
    clocks: ClockReader,
    settings: MeasureSettings,
    notes: list[str],
    gap: float | None,
) -> None:
    """sample_rounds over the batch's light cases, then over its heavy ones (HEAVY_FROM_US): no light case
    is sampled beside a heavy one, whose power draw lowers the clocks the light one runs at. The light ones
    start after SETTLE_S of idle, since heavy work may have just run (the estimate's replays, references,
    the batch before)."""
    light = {i: c for i, c in cases.items() if c.est_us < HEAVY_FROM_US}
    heavy = {i: c for i, c in cases.items() if i not in light}
    if light:
        time.sleep(SETTLE_S)
    for group in (light, heavy):
        if group:
            sample_rounds(group, clocks, settings, notes, gap)


def sample_rounds(
    cases: dict[int, BatchCase],
    clocks: ClockReader,
    settings: MeasureSettings,
    notes: list[str],
    gap: float | None,
) -> None:
    """Chunks of rounds until every case's stopper has stopped (or the chunks stop adding up). In a chunk
    each case takes part in its first `quota` rounds; the chunk ends after the settings' batch_target_ms
    of device time and is followed by their cooldown: the per-case timer's duty cycle (100 ms chunks of
    large GEMMs and flushes held an H200 at its power cap more often than the per-case timer did)."""
    target_us = settings.batch_target_ms * 1000.0
    misses = 0
    flush_ns: list[int] = []  # the flushes' durations: the clock's step is read off them
    resolution_us: float | None = None
    while True:
        active = [c for c in cases.values() if not c.done]
        if not active:
            return
        taken: list[int] = []
        budget, rounds = target_us, 0
        while rounds < MAX_ROUNDS and budget > 0:
            step = [k for k, c in enumerate(active) if rounds < c.quota]
            if not step:
                break
            taken += step
            budget -= sum(active[k].est_us for k in step)
            rounds += 1
        replays, order = contiguous(taken, [c.est_us for c in active])

        def queue(replays=replays, order=order, active=active) -> None:
            for k, counted in zip(replays, order, strict=True):
                c = active[k]
                c.graphs[c.launched % len(c.graphs)].replay()
                if counted == k:  # a lead replays the input set the run's first sample will use
                    c.launched += 1
            clocks()

        acts = _profile(queue)
        clocks()
        try:
            spans = per_case(split_groups(acts, len(order)), order, len(active) + 1)[:-1]
        except ChunkMismatch as e:
            misses += 1
            if misses > MAX_CHUNK_RETRIES:
                notes.append(f"CUPTI activities did not add up ({e}): sampling stopped")
                for c in active:
                    c.done = True
                return
            continue
        if resolution_us is None and len(flush_ns) < STEP_FLUSHES:
            flush_ns += [g.flush_ns for mine in spans for g in mine][: STEP_FLUSHES - len(flush_ns)]
            step = clock_step_ns(flush_ns) if len(flush_ns) >= MIN_STEP_FLUSHES else None
            resolution_us = None if step is None else (step + 2 * JITTER_NS) / 1000.0
        for c, mine in zip(active, spans, strict=True):
            c.stopper.resolution_us = resolution_us
            c.gpu_s += sum(g.span_ns + g.flush_ns for g in mine) * 1e-9
            c.flushes.extend(g.flush_us for g in mine)
            c.empty = 0 if mine else c.empty + 1
            spans_us = [g.span_us for g in mine]
            c.early += sum(1 for g in mine if g.early_ns > 0)
            c.raw.extend(spans_us)
            c.done = c.stopper.add(subtract_gap(spans_us, gap)) or c.empty >= 2
            c.quota = 0 if c.done else c.next_quota(settings.max_samples)
        if settings.cooldown > 0:
            time.sleep(settings.cooldown * (target_us - budget) * 1e-6)
