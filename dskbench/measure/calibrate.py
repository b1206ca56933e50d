"""The per-launch gap between our timers and CUPTI's kernel durations, measured once per run.

Why: a cuda-graph sample is a replay's time over its n launches, so every launch carries the boundary
to the next graph node (kernel i end -> kernel i+1 start; ~0.2-0.4 us on H200), which CUPTI's kernel
duration excludes; an eager sample carries event and launch latency (~1 us hot, ~3 us cold). On a 1 us
kernel that is 20-300%. The gap belongs to the GPU, driver and timer, not to the kernel, so it is
measured here on a few small elementwise ops (where it is largest relative to the kernel) and measure()
subtracts it (MeasureSettings.launch_gap_us; raw_median_us keeps the uncorrected number).

How: each op runs in an eager loop under torch.profiler (CUPTI), cold (flush before every launch,
outside the launch's annotation) and hot, each launch inside its own record_function; then measure()
times it in the same conditions (graph and eager, uncorrected). Device activities are attributed to
launches through their linked correlation id (the op that launched them, whose CPU start lies inside
one launch's annotation); a launch's CUPTI time is the span from its first activity's start to its last
one's end, so a multi-kernel op's internal gaps count as part of the op. A mode's gap is the median over
ops of (ours - CUPTI); the mid-size op's graph gap also carries its replay's start over only ~20
launches, one reason the median rather than the mean. The parsing works on plain tuples, so it is
tested without a GPU.
"""

from __future__ import annotations

import math
import statistics
import time
from bisect import bisect_right
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dskbench.measure.settings import MeasureSettings

PREFIX = "dskbench.launch#"  # record_function name of one profiled launch
PROFILE_ITERS = 64  # profiled launches per op and mode (a multiple of the 4 input sets)
MIN_COVERAGE = 0.9  # share of launches a grouping must find to be trusted
SKIP_NAMES = ("FillFunctor", "Activity Buffer", "Buffer Request", "cudaProfiler")  # flush, profiler
GAP_BOUNDS_US = {
    "hot": (-0.5, 2.0),
    "cold": (-0.5, 2.0),
    "eager_hot": (-0.5, 10.0),
    "eager_cold": (-0.5, 10.0),
    "batch_cold": (-0.5, 2.0),
}
GAP_FIELDS = {"eager_": "eager_gap_us", "batch_": "batch_gap_us"}  # key prefix -> row field (else gap_us)
SPREAD_WARN_US = 0.3  # ops disagreeing by more than this: the gap is not one constant
CAL_SETTINGS = MeasureSettings.quick(max_time_s=0.3)

# (name, start_ns, end_ns, key): a device activity and the launch it belongs to (None: not ours)
Activity = tuple[str, int, int, Hashable | None]


@dataclass(frozen=True)
class Span:
    """One launch as CUPTI saw it."""

    start_ns: int
    end_ns: int
    activities: int
    busy_ns: int  # sum of the activities' own durations (less than the span when they leave gaps)
    names: tuple[str, ...]

    @property
    def span_us(self) -> float:
        return (self.end_ns - self.start_ns) / 1000.0

    @property
    def busy_us(self) -> float:
        return self.busy_ns / 1000.0


def launch_spans(acts: Iterable[Activity]) -> dict[Hashable, Span]:
    """Group activities by key (None dropped); each group's span runs from first start to last end."""
    out: dict[Hashable, Span] = {}
    for name, start, end, key in acts:
        if key is None:
            continue
        g = out.get(key)
        if g is None:
            out[key] = Span(start, end, 1, end - start, (name,))
        else:
            names = g.names if name in g.names else (*g.names, name)
            out[key] = Span(
                min(g.start_ns, start), max(g.end_ns, end), g.activities + 1, g.busy_ns + end - start, names
            )
    return out


def keys_by_correlation(
    device: Iterable[tuple[str, int, int, int]],
    cpu: Iterable[tuple[str, int, int, int]],
    prefix: str = PREFIX,
) -> list[Activity]:
    """Key device activities (name, start, end, linked correlation id) by launch annotation.

    `cpu` holds the host front-end events (name, start, end, correlation id): the annotations (names starting with
    `prefix`, one per launch, not nested in each other) and the ops inside them. An activity belongs to
    the annotation that contains the CPU start of its linked op; the profiler's own device-side copies
    of the annotations (gpu_user_annotation, named like them) are left out."""
    starts: dict[int, int] = {}
    ranges: list[tuple[int, int, str]] = []
    for name, start, end, corr in cpu:
        if corr > 0:
            starts[corr] = start
        if name.startswith(prefix):
            ranges.append((start, end, name))
    ranges.sort()
    begins = [r[0] for r in ranges]
    out: list[Activity] = []
    for name, start, end, linked in device:
        if name.startswith(prefix):
            continue
        key = None
        t = starts.get(linked) if linked > 0 else None
        if t is not None:
            i = bisect_right(begins, t) - 1
            if i >= 0 and t < ranges[i][1]:
                key = ranges[i][2]
        out.append((name, start, end, key))
    return out


def keys_by_order(
    device: Iterable[tuple[str, int, int, Any]],
    labels: Sequence[Hashable],
    prefix: str = PREFIX,
    skip: Sequence[str] = SKIP_NAMES,
) -> list[Activity] | None:
    """Last resort, when nothing links activities to launches: drop the flush and profiler activities by
    name, sort by start and cut into len(labels) equal groups in launch order. Right only when every
    launch runs the same number of activities; None when the count does not divide."""
    acts = sorted(
        (a for a in device if not a[0].startswith(prefix) and not any(k in a[0] for k in skip)),
        key=lambda a: a[1],
    )
    n = len(labels)
    if n == 0 or not acts or len(acts) % n:
        return None
    k = len(acts) // n
    return [(name, start, end, labels[i // k]) for i, (name, start, end, _) in enumerate(acts)]


def resolve_spans(
    device: Sequence[tuple[str, int, int, int]],
    cpu: Sequence[tuple[str, int, int, int]],
    labels: Sequence[Hashable],
    prefix: str = PREFIX,
) -> tuple[dict[Hashable, Span], str]:
    """Spans of the launches named `labels`, and how they were grouped: "correlation", else the
    profiler's device-side annotation spans ("gpu_user_annotation"), else "order", else "none"."""
    want = set(labels)

    def covered(spans: Mapping[Hashable, Span]) -> bool:
        return bool(want) and sum(1 for k in spans if k in want) >= MIN_COVERAGE * len(want)

    spans = launch_spans(keys_by_correlation(device, cpu, prefix))
    if covered(spans):
        return spans, "correlation"
    spans = launch_spans((n, s, e, n) for n, s, e, _ in device if n.startswith(prefix))
    if covered(spans):
        return spans, "gpu_user_annotation"
    ordered = keys_by_order(device, labels, prefix)
    if ordered is not None:
        return launch_spans(ordered), "order"
    return {}, "none"


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def summarize_gaps(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per method and mode, the median over ops of (ours - CUPTI), the spread, and warnings.

    `rows`: one per op and mode with "op", "mode", "gap_us" (graph) and "eager_gap_us"."""
    out: dict[str, Any] = {"spread_us": {}, "warnings": []}
    for key in GAP_BOUNDS_US:
        prefix = next((p for p in GAP_FIELDS if key.startswith(p)), "")
        mode = key.removeprefix(prefix)
        field = GAP_FIELDS.get(prefix, "gap_us")
        vals = [float(r[field]) for r in rows if r.get("mode") == mode and _finite(r.get(field))]
        gap = statistics.median(vals) if vals else None
        out[f"{key}_us"] = gap
        out["spread_us"][key] = max(vals) - min(vals) if vals else None
        lo, hi = GAP_BOUNDS_US[key]
        if gap is None:
            if prefix != "batch_":  # the batched timer needs CUPTI: its gap absent is no fault
                out["warnings"].append(f"{key}: no op gave a gap")
        elif not lo <= gap <= hi:
            out["warnings"].append(f"{key}: gap {gap:.3f} us outside [{lo}, {hi}]: not applied")
        if vals and max(vals) - min(vals) > SPREAD_WARN_US:
            out["warnings"].append(f"{key}: ops disagree by {max(vals) - min(vals):.2f} us")
    return out


def with_reference(row: Mapping[str, Any], spans: Sequence[Span]) -> dict[str, Any]:
    """One op and mode's timings (graph_method, graph_us, eager_us) with its CUPTI reference (cupti_*)
    and gaps: None where no launch was found or the graph timer fell back to eager."""
    out = dict(row)
    for k, v in span_summary(spans).items():
        out[f"cupti_{k}"] = None if isinstance(v, float) and not math.isfinite(v) else v
    cupti = out["cupti_median_us"]
    graph_ok = cupti is not None and out["graph_method"] == "cuda-graph"
    out["gap_us"] = out["graph_us"] - cupti if graph_ok else None
    out["eager_gap_us"] = out["eager_us"] - cupti if cupti is not None else None
    batch = out.get("batch_us")
    out["batch_gap_us"] = batch - cupti if cupti is not None and _finite(batch) else None
    return out


# Which calibrated gaps are subtracted. The batched cold timer's (measure/batch.py): a kernel's CUPTI span
# read inside a graph right after the flush runs a few tenths of a microsecond over the same kernel's span
# launched alone, so its samples are brought to the reference the event timers are held to. The cold graph's: against CUPTI (`dskbench fidelity`) the
# correction brought more cold cases within target, while in hot mode back-to-back launches of PDL-enabled
# kernels overlap in the graph and hide the boundary gap, and the correction brought fewer
# (results/h200-2026-11-21/README.md gives the counts). Hot (and eager) stay raw; calibrated values are
# still recorded with the run.
APPLIED_GAPS = frozenset({"cold", "batch_cold"})


def gap_settings(cal: Mapping[str, Any] | None) -> dict[str, float] | None:
    """MeasureSettings.launch_gap_us from a calibration result: finite values inside GAP_BOUNDS_US
    (negatives clamped to 0: ours below CUPTI is noise, never time to add). None: nothing usable."""
    if not cal or "error" in cal:
        return None
    out: dict[str, float] = {}
    for key, (lo, hi) in GAP_BOUNDS_US.items():
        if key not in APPLIED_GAPS:
            continue
        v = cal.get(f"{key}_us")
        if _finite(v) and lo <= v <= hi:
            out[key] = max(0.0, float(v))
    return out or None


def settings_with_gap(settings: MeasureSettings, ceilings: Mapping[str, Any] | None) -> MeasureSettings:
    """`settings` with the launch gap of `ceilings["launch_gap"]` (from measure_ceilings); unchanged
    when the run has no usable calibration."""
    gaps = gap_settings((ceilings or {}).get("launch_gap"))
    return settings.with_(launch_gap_us=gaps) if gaps else settings


# ---- GPU side ----


@dataclass
class ProfileJob:
    """Launches to profile: iters launches cycling through the launchers, flushed before each if cold."""

    launchers: Sequence[Callable[[], Any]]
    cold: bool
    iters: int = PROFILE_ITERS


def kineto_tuples(
    events: Iterable[Any], cuda: Any, cpu: Any
) -> tuple[list[tuple[str, int, int, int]], list[tuple[str, int, int, int]]]:
    """Plain tuples from the profiler's kineto events (`prof.profiler.kineto_results.events()`, read in
    process: no trace export): device activities (name, start, end, linked correlation id) and host
    front-end events (name, start, end, correlation id). `cuda`/`cpu`: the DeviceType values.

    Host events with a linked correlation id are runtime/driver calls (cudaLaunchKernel): their own
    correlation ids are CUPTI's, a different id space from the ops' that could collide, so they are
    left out (torch's own parser tells front-end events apart the same way)."""
    device, host = [], []
    for e in events:
        start = int(e.start_ns())
        end = start + int(e.duration_ns())
        dt = e.device_type()
        if dt == cuda:
            device.append((e.name(), start, end, int(e.linked_correlation_id())))
        elif dt == cpu and int(e.linked_correlation_id()) == 0:
            host.append((e.name(), start, end, int(e.correlation_id())))
    return device, host


def profile_launches(jobs: Sequence[ProfileJob], flush: Any) -> tuple[list[list[Span]], str]:
    """CUPTI spans of every launch of every job, from one profiler session; and the grouping used.
    `flush`: the cold-mode flush buffer (zeroed before each cold launch, outside its annotation)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    for job in jobs:  # lazy loading and handles outside the profile
        for i in range(2 * len(job.launchers)):
            job.launchers[i % len(job.launchers)]()
    torch.cuda.synchronize()
    labels: list[list[str]] = []
    j = 0
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for job in jobs:
            mine = []
            for i in range(job.iters):
                if job.cold:
                    flush.zero_()
                label = f"{PREFIX}{j}"
                j += 1
                with record_function(label):
                    job.launchers[i % len(job.launchers)]()
                mine.append(label)
            labels.append(mine)
        torch.cuda.synchronize()
    from torch.autograd import DeviceType

    device, cpu = kineto_tuples(prof.profiler.kineto_results.events(), DeviceType.CUDA, DeviceType.CPU)
    spans, how = resolve_spans(device, cpu, [x for mine in labels for x in mine])
    return [[spans[x] for x in mine if x in spans] for mine in labels], how


def span_summary(spans: Sequence[Span]) -> dict[str, Any]:
    """Medians over one job's launches: span (the reference), busy time, activities per launch."""
    if not spans:
        return {"median_us": math.nan, "busy_us": math.nan, "per_launch": 0, "launches": 0, "names": []}
    return {
        "median_us": statistics.median(s.span_us for s in spans),
        "busy_us": statistics.median(s.busy_us for s in spans),
        "per_launch": statistics.median(s.activities for s in spans),
        "launches": len(spans),
        "names": sorted({n[:80] for s in spans for n in s.names}),
    }


def _ops(index: int) -> list[tuple[str, list[Callable[[], Any]]]]:
    """Small elementwise ops (4 L2-resident input sets) and one of ~10 us; random data."""
    import torch

    dev = torch.device("cuda", index)
    g = torch.Generator(device=dev)
    g.manual_seed(4321)

    def sets(shape: tuple[int, int], n: int) -> list[tuple[torch.Tensor, ...]]:
        return [
            tuple(torch.randn(*shape, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
            for _ in range(n)
        ]

    add_s, mul_s, add_m = sets((1, 7168), 4), sets((64, 4096), 4), sets((4096, 2048), 1)
    return [
        ("add_1x7168_bf16", [lambda s=s: torch.add(s[0], s[1], out=s[2]) for s in add_s]),
        ("mul_64x4096_bf16", [lambda s=s: torch.mul(s[0], s[1], out=s[2]) for s in mul_s]),
        ("add_4096x2048_bf16", [lambda s=s: torch.add(s[0], s[1], out=s[2]) for s in add_m]),
    ]


def _batch_medians(
    entries: Sequence[Sequence[Callable[[], Any]]], device: str, settings: MeasureSettings
) -> list[float | None]:
    """The batched cold timer's medians of the ops (uncorrected); None each where it cannot run."""
    from dskbench.measure.batch import cupti_available, measure_batch

    if not cupti_available():
        return [None] * len(entries)
    got = measure_batch(entries, device=device, settings=settings)
    return [None if isinstance(m, str) else m.median_us for m in got]


def calibrate_launch_gap(
    index: int = 0,
    settings: MeasureSettings | None = None,
    ops: Sequence[tuple[str, Sequence[Callable[[], Any]]]] | None = None,
) -> dict[str, Any]:
    """{"hot_us", "cold_us" (cuda-graph), "eager_hot_us", "eager_cold_us", "method", "grouping",
    "spread_us", "warnings", "ops": [per op and mode: ours, CUPTI, gaps], "wall_s"}. A few seconds.
    `ops`: (name, launchers) to calibrate on instead of the built-in small elementwise ops."""
    import torch

    from dskbench.measure.core import measure
    from dskbench.measure.cuda import flush_buffer, l2_bytes
    from dskbench.measure.sampling import MODES

    t0 = time.perf_counter()
    s = (settings or CAL_SETTINGS).with_(launch_gap_us=None)
    device = f"cuda:{index}"
    rows: list[dict[str, Any]] = []
    with torch.cuda.device(index):
        ops = list(ops) if ops is not None else _ops(index)
        flush = flush_buffer(index, s.flush_bytes or 2 * l2_bytes(index))
        # profile first: every later measurement (these and the run's) then follows a profiler session
        jobs = [ProfileJob(fns, mode == "cold") for _, fns in ops for mode in MODES]
        spans, grouping = profile_launches(jobs, flush)
        batch = _batch_medians([fns for _, fns in ops], device, s)
        for k, (name, fns) in enumerate(ops):
            for mode in MODES:
                graph = measure(fns, device=device, mode=mode, settings=s)
                eager = measure(fns, device=device, mode=mode, capturable=False, settings=s)
                rows.append(
                    {
                        "op": name,
                        "mode": mode,
                        "n_sets": len(fns),
                        "graph_method": graph.method,
                        "graph_us": graph.median_us,
                        "graph_noise": graph.noise,
                        "eager_us": eager.median_us,
                        "eager_noise": eager.noise,
                        "batch_us": batch[k] if mode == "cold" else None,
                    }
                )
        del ops, jobs
        torch.cuda.empty_cache()
    rows = [with_reference(row, sp) for row, sp in zip(rows, spans, strict=True)]
    return {
        **summarize_gaps(rows),
        "method": "median over ops of (measure() median - CUPTI span per launch), torch.profiler in-process",
        "grouping": grouping,
        "ops": rows,
        "wall_s": time.perf_counter() - t0,
    }
