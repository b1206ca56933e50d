"""One case, in the process that runs it: gate, resolve, build inputs, check against the reference,
then time through the measurement core. Every failure becomes an error record (`run_one`)."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from dskbench.adapters import get_adapter
from dskbench.adapters.backends import Backend, Unavailable, resolve
from dskbench.device.info import DeviceInfo
from dskbench.execution import gpu_lock, runtimes, shared_gpu
from dskbench.execution.gate import why_not
from dskbench.execution.items import PlanError, SweepOptions, WorkItem, case_seed
from dskbench.execution.reference_cache import REFERENCES
from dskbench.results.records import BackendInfo, Check, Clocks, Identity, Metrics, Stages, Timing, Traffic
from dskbench.shapes.cases import Case

# Substrings of errors after which the CUDA context cannot be trusted: the worker exits and is replaced.
POISONING_ERRORS = (
    "illegal memory access",
    "illegal instruction",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "CUDA error: an illegal",
    "cudaErrorLaunchFailure",
    "context is destroyed",
)


def backend_block(b: Backend, resolved: Any = None) -> dict[str, Any]:
    """The record's backend: as declared, and once resolved what really loaded."""
    info = BackendInfo(b.name, b.kind, b.target, b.package, b.label, b.dispatches_to, b.capturable)
    if resolved is not None:
        info = info.with_resolution(resolved.target, resolved.package, resolved.version)
    return info.to_json()


@dataclass
class Prepared:
    """A case ready to time: inputs built, backend bound, output checked against the reference."""

    adapter: Any
    backend: Backend
    resolved: Any
    case: Case
    inputs: dict[str, Any]
    launch: Any
    traffic: Any
    device: str
    seed: int


def prepare_case(
    kernel: str, case: Case, backend_name: str, device: DeviceInfo, seed: int, check: bool = True
) -> tuple[dict[str, Any], Prepared | None]:
    """Gate, resolve, build inputs, run once and check against the reference (`check` False: run once
    only, as a JIT warm-up does; nothing it returns is timed). Returns the record fields so far and a
    Prepared case; None when the fields already say why the case stops here (status skipped or wrong).
    Exceptions propagate (the caller records them)."""
    t_begin = time.perf_counter()
    adapter = get_adapter(kernel)
    if adapter is None:
        raise PlanError(f"no adapter for {kernel}")
    backends = {b.name: b for b in adapter.all_backends()}
    if backend_name not in backends:
        raise PlanError(f"{kernel} has no backend {backend_name!r} (it has {', '.join(backends)})")
    backend = backends[backend_name]
    ident = Identity(case.id, case.kernel, None, case.op, case.variant, case.phase, case.point, case.dims)
    base: dict[str, Any] = {**ident.to_json(), "seed": seed, "backend": backend_block(backend)}
    reason = why_not(adapter, backend, case, device)  # the plan's rule, asked again where the case runs
    if reason:
        return {**base, "status": "skipped", "reason": reason}, None
    dev = "cuda" if device.kind == "cuda" else "cpu"
    t_resolve = time.perf_counter()
    try:
        resolved = resolve(backend)
    except Unavailable as e:
        return {**base, "status": "skipped", "reason": str(e)}, None
    runtimes.start(backend.kind, dev)  # once per process: a runtime's start is not the kernel's launch
    stages: dict[str, float] = {"resolve_s": round(time.perf_counter() - t_resolve, 4)}
    base["backend"] = backend_block(backend, resolved)
    traffic = adapter.traffic_for(backend.name, case)
    base["traffic"] = Traffic(traffic.bytes, traffic.flops, traffic.compute, traffic.note).to_json()
    t = time.perf_counter()
    stages["setup_s"] = round(t - t_begin - stages["resolve_s"], 4)

    def lap(name: str) -> None:
        nonlocal t
        _sync(dev)
        now = time.perf_counter()
        stages[name] = round(now - t, 4)
        t = now

    # a build beside a run's measuring makes its inputs (GPU work) while that run samples nothing
    with gpu_lock.held() if not check else nullcontext():
        inputs = adapter.make_inputs(case, dev, seed)
        lap("inputs_s")
    if not check:  # a warm-up: bind and launch once (the JIT build), no reference
        launch = backend.bind(resolved.fn, inputs, case)
        lap("bind_s")
        launch()
        lap("first_launch_s")
        base["stages"] = stages
        return base, Prepared(adapter, backend, resolved, case, inputs, launch, traffic, dev, seed)
    ref_key = (kernel, case.id, seed, dev)
    ref = REFERENCES.get(ref_key)
    if ref is None:
        ref = adapter.reference(inputs, case)
        REFERENCES.put(ref_key, ref)
    lap("reference_s")
    launch = backend.bind(resolved.fn, inputs, case)
    lap("bind_s")
    out = launch()
    lap("first_launch_s")
    chk = adapter.check(out, ref, case)
    lap("check_s")
    base["stages"] = stages
    base["check"] = Check(chk.error, chk.tolerance, chk.detail).to_json()
    del out, ref
    if not chk.ok:
        why = f"relative error {chk.error:.3g} > tolerance {chk.tolerance:.1g}"
        if chk.error <= chk.tolerance:  # failed on another of the adapter's criteria: say which
            why = f"check failed: {chk.detail}"
        elif chk.detail:
            why += f" ({chk.detail})"
        return {**base, "status": "wrong", "reason": why}, None
    return base, Prepared(adapter, backend, resolved, case, inputs, launch, traffic, dev, seed)


def prepare_item(
    item: WorkItem, device: DeviceInfo, opts: SweepOptions, run_seed: int
) -> tuple[dict[str, Any], Prepared | None]:
    """A work item's case prepared (gate, resolve, check): its record fields so far, and the Prepared
    case when it is to be timed (None when the fields already say how it ended)."""
    if opts.host_gpus and opts.host_gpus > device.count:  # a shard's worker sees one GPU of several
        device = dataclasses.replace(device, count=opts.host_gpus)
    case = Case.from_json(item.case)
    base, prep = prepare_case(
        item.kernel, case, item.backend, device, case_seed(run_seed, case.id), check=item.checked
    )
    base["category"] = item.category
    if prep is not None and opts.warm_only:  # the JIT build happened in the first launch
        return {**base, "status": "ok"}, None
    return base, prep


def execute_item(
    item: WorkItem, device: DeviceInfo, opts: SweepOptions, run_seed: int, ceilings: dict | None
) -> dict[str, Any]:
    """Prepare (gate, resolve, check), then time through the measurement core. Returns record fields."""
    base, prep = prepare_item(item, device, opts, run_seed)
    if prep is None:
        return base
    return time_prepared(base, prep, device, opts, ceilings)


def time_prepared(
    base: dict[str, Any], prep: Prepared, device: DeviceInfo, opts: SweepOptions, ceilings: dict | None
) -> dict[str, Any]:
    """A prepared case timed alone by the measurement core: its record fields."""
    from dskbench import measure as core

    launchers = [prep.launch]
    if opts.mode == "rotate":
        launchers += _rotation_sets(prep)
    settings = core.settings_with_gap(measure_settings(opts), ceilings)
    mode = "hot" if opts.mode == "rotate" else opts.mode  # rotate: no flush, the sets overflow L2
    t0 = time.perf_counter()

    def measure_once() -> dict[str, Any]:
        m = core.measure(
            launchers,
            device=prep.device,
            mode=mode,
            capturable=prep.backend.capturable,
            settings=settings,
        )
        if settings.cross_check and prep.device == "cuda":
            cupti_check(m, launchers, mode, prep.backend.capturable, settings)
        return as_dict(m)

    with gpu_lock.held():  # no builder's GPU work while this case samples (build_ahead.py)
        measured, why = measure_valid(measure_once)
    t1 = time.perf_counter()
    base["stages"]["measure_s"] = round(t1 - t0, 4)
    return with_record_time(measured_fields(base, prep, measured, device, opts, ceilings, why), t1)


def with_record_time(fields: dict[str, Any], since: float) -> dict[str, Any]:
    """The record fields with the seconds their building took since the measurement ended (record_s)."""
    if isinstance(fields.get("stages"), dict):
        fields["stages"]["record_s"] = round(time.perf_counter() - since, 4)
    return fields


def cupti_check(m: Any, launchers: list, mode: str, capturable: bool, settings: Any) -> None:
    """The second timer of an event-timed measurement: a short CUPTI pass (dskbench.measure.cupti_pass),
    its result in `m.cross_check` and its seconds in `m.stage_s`."""
    import torch

    from dskbench.measure.cupti_pass import per_case_check

    t0 = time.perf_counter()
    m.cross_check = per_case_check(
        m.to_dict(),
        launchers,
        mode=mode,
        capturable=capturable,
        index=torch.cuda.current_device(),
        flush_bytes=m.flush_bytes,
        gaps=settings.launch_gap_us,
    )
    m.stage_s = {**(m.stage_s or {}), "cross_check_s": round(time.perf_counter() - t0, 4)}


def measured_fields(
    base: dict[str, Any],
    prep: Prepared,
    m: Any,
    device: DeviceInfo,
    opts: SweepOptions,
    ceilings: dict | None,
    why: str | None = None,
) -> dict[str, Any]:
    """The record fields of a prepared case and its Measurement (timing, metrics, clocks); `why`: the
    reason the measurement is impossible (the record is then `unstable`)."""
    from dskbench import measure as core

    measured = as_dict(m)
    base["stages"].update(measured.pop("stage_s", None) or {})
    if not _has_samples(measured):
        return {**base, "status": "error", "reason": "the measurement produced no timing samples"}
    clocks = Clocks.from_json({k: measured.pop(k) for k in Clocks.KEYS if k in measured})
    if measured.get("cross_check") is None:
        from dskbench.measure.cross_check import skipped

        measured["cross_check"] = skipped(no_cross_check(opts, prep.device))
    timing = Timing.from_json({**measured, "mode": opts.mode, "input_sets": measured.get("n_sets", 1)})
    if why:  # kept for the reader to see; no metrics: they would be computed from an impossible median
        return {
            **base,
            "status": "unstable",
            "reason": why,
            "timing": timing.to_json(),
            "clocks": clocks.to_json(),
        }
    peaks = core.datasheet_peaks(device.name) if prep.device == "cuda" else None
    compute = {"int8": "fp8"}.get(prep.traffic.compute, prep.traffic.compute)
    metrics = Metrics.from_json(
        core.metrics(
            timing.median_us, prep.traffic.bytes, prep.traffic.flops, ceilings, peaks, compute=compute
        )
    )
    parts = {"timing": timing.to_json(), "metrics": metrics.to_json(), "clocks": clocks.to_json()}
    return {**base, "status": "ok", **parts, **shared_gpu.record_fields(prep.device)}


def _has_samples(measured: dict[str, Any]) -> bool:
    return bool(measured.get("n_samples")) and measured.get("median_us") == measured.get(
        "median_us"
    )  # not NaN


def measure_valid(measure_once: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], str | None]:
    """A measurement and why it is impossible (None: it is possible; dskbench.measure.validity).

    An impossible one is measured once more, from scratch (a new graph, a new flush calibration): a
    burst of another process's work on a shared GPU passes. The second stands either way, its notes
    saying why the first was dropped; still impossible, the case is `unstable`."""
    from dskbench.measure.validity import problem

    measured = measure_once()
    why = problem(measured) if _has_samples(measured) else None
    if why is None:
        return measured, None
    again = measure_once()
    again["notes"] = [*(again.get("notes") or []), f"measured twice: the first was dropped ({why})"]
    return again, problem(again) if _has_samples(again) else None


def measure_settings(opts: SweepOptions) -> Any:
    """The core's settings for a sweep: quick lists get a short budget; a CPU run (reference timings,
    some of them seconds per call) warms up once and stops at its budget."""
    from dskbench.measure import MeasureSettings

    settings = MeasureSettings.quick() if opts.profile in ("quick", "cpu") else MeasureSettings()
    if opts.device == "cpu":
        settings = dataclasses.replace(settings, warmup_launches=1, min_samples=1, min_time_s=0.0)
    if opts.budget_s is not None:
        settings = dataclasses.replace(settings, max_time_s=opts.budget_s)
    if opts.min_time_s is not None:
        settings = dataclasses.replace(settings, min_time_s=min(opts.min_time_s, settings.max_time_s))
    if opts.flush != settings.flush_kind:
        settings = dataclasses.replace(settings, flush_kind=opts.flush)
    if opts.stopping != settings.stopping:
        settings = dataclasses.replace(settings, stopping=opts.stopping)
    if opts.cross_check and opts.device == "cuda":
        settings = dataclasses.replace(settings, cross_check=True)
    return settings


def no_cross_check(opts: SweepOptions, device: str) -> str:
    """Why a record timed without a second timer has none."""
    if not opts.cross_check:
        from dskbench.measure.cross_check import SKIPPED_BY_OPTION

        return SKIPPED_BY_OPTION
    if device != "cuda":
        return "a CPU run: wall-clock timing has no second timer"
    return "not cross-checked"


def _rotation_sets(prep: Prepared) -> list:
    """Extra input sets so that, rotated, they overflow L2 (rotate mode: cold without a flush)."""
    from dskbench.adapters.base import input_bytes

    per_set = max(input_bytes(prep.inputs), 1)
    n_extra = min(max(0, -(-3 * _l2_bytes(prep.device) // per_set) - 1), 63)
    return [
        prep.backend.bind(
            prep.resolved.fn, prep.adapter.make_inputs(prep.case, prep.device, prep.seed + i + 1), prep.case
        )
        for i in range(n_extra)
    ]


def _l2_bytes(dev: str) -> int:
    if dev != "cuda":
        return 0
    import torch

    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20))


def _sync(dev: str) -> None:
    if dev == "cuda":
        import torch

        torch.cuda.synchronize()


def as_dict(m: Any) -> dict[str, Any]:
    """A Measurement (or anything timed) as the plain dict a record is built from."""
    if dataclasses.is_dataclass(m):
        return dataclasses.asdict(m)
    if hasattr(m, "to_json"):
        return m.to_json()
    return dict(m)


def is_poisoning(message: str) -> bool:
    return any(s.lower() in message.lower() for s in POISONING_ERRORS)


def timed_ceilings() -> dict[str, Any]:
    """This GPU's measured ceilings, with the seconds they took (a start-up cost, reported)."""
    from dskbench.measure import measure_ceilings

    t0 = time.monotonic()
    ceilings = measure_ceilings("cuda")
    ceilings["measured_in_s"] = round(time.monotonic() - t0, 2)
    return ceilings


def run_one(
    item: WorkItem,
    device: DeviceInfo,
    opts: SweepOptions,
    run_seed: int,
    ceilings,
    hold: Callable[[WorkItem, dict[str, Any], Prepared, float], bool] | None = None,
    make_room: Callable[[], bool] | None = None,
) -> dict[str, Any] | None:
    """execute_item with every failure turned into an error record (the sweep goes on).

    `hold(item, fields, prepared, seconds so far)`: offered the prepared case before it is timed; when it
    takes it (True) the case is timed later with others (execution/batching.py) and None is returned.
    `make_room()`: called when the case ran out of GPU memory; it times and frees the cases held so far
    (True when there were some), and the case is then run once more.

    A case that ran out of memory while builders share its GPU (a run that builds ahead) is run once more
    under the GPU lock, once they have freed the memory (memory_retry.py): the builders' inputs,
    not the case, filled the GPU. A build that ran out of memory is run once more too, without the lock,
    once the memory is free: other builds or the measuring worker held it."""
    from dskbench.execution import memory_retry

    fields = _run_once(item, device, opts, run_seed, ceilings, hold)
    if fields is not None and make_room and memory_retry.out_of_memory(fields) and make_room():
        first = fields  # the held cases filled the GPU: they are timed and freed, this one runs again,
        fields = _run_once(item, device, opts, run_seed, ceilings)  # timed alone (its record says why)
        if fields is not None:
            fields["retried"] = (
                f"the first run ran out of memory beside held cases: {first.get('reason', '')}"[:300]
            )
    builder = opts.warm_only  # a build: other builds (dskbench warm's jobs) may share its GPU too
    if fields is None or not memory_retry.short_beside_builders(fields, device.kind, builder):
        return fields
    return memory_retry.again_beside_builders(
        fields, lambda: _run_once(item, device, opts, run_seed, ceilings), builder=builder
    )


def _run_once(
    item: WorkItem,
    device: DeviceInfo,
    opts: SweepOptions,
    run_seed: int,
    ceilings,
    hold: Callable[[WorkItem, dict[str, Any], Prepared, float], bool] | None = None,
) -> dict[str, Any] | None:
    """run_one without its second try. A CUDA error is often raised late (an asynchronous fault surfaces
    at the next synchronising call, which may be the clean-up): the clean-up is guarded too, and its error
    becomes the case's reason."""
    t0 = time.perf_counter()
    try:
        fields, prep = prepare_item(item, device, opts, run_seed)
        if prep is not None:
            if hold is not None and hold(item, fields, prep, time.perf_counter() - t0):
                return None
            fields = time_prepared(fields, prep, device, opts, ceilings)
        t_clean = time.perf_counter()
        del prep
        # a build's worker leaves the GPU's memory to the sweep's (several of them share one GPU)
        free_memory(device, force=opts.warm_only or fields.get("status") in ("error", "wrong"))
        if isinstance(fields.get("stages"), dict):
            fields["stages"]["cleanup_s"] = round(time.perf_counter() - t_clean, 4)
    except Exception as e:  # noqa: BLE001 - a failing kernel is a result, not a crash of the sweep
        fields = error_fields(item, e)
    else:
        return with_item_time(fields, time.perf_counter() - t0)  # the whole item, clean-up included
    # cleaned up past the except clause: its traceback keeps the failed frames' tensors (a KV cache) alive
    if not fields.get("poisoned"):
        try:
            free_memory(device, force=True)
        except Exception as later:  # noqa: BLE001 - the context broke while cleaning up
            fields = error_fields(item, later)
    return fields


def with_item_time(fields: dict[str, Any], item_s: float) -> dict[str, Any]:
    """The record fields with the item's own wall time, and what no stage accounts for."""
    if isinstance(fields.get("stages"), dict):
        stages = Stages.from_json({**fields["stages"], "item_s": round(item_s, 4)})
        fields["stages"] = stages.with_other().to_json()
    return fields


def failure_message(e: BaseException) -> str:
    """What an exception says about a case: its type and message, the CUDA error text itself (not the
    advice after it), an out-of-memory marked as such."""
    msg = f"{type(e).__name__}: {e}".strip()
    if "CUDA error" in msg:  # the error's own line; the rest is advice (CUDA_LAUNCH_BLOCKING, docs links)
        msg = msg.splitlines()[0]
    if "OutOfMemory" in type(e).__name__ or "out of memory" in msg.lower():
        msg = "out of memory: " + msg
    return msg[:2000]


def error_fields(item: WorkItem, e: BaseException) -> dict[str, Any]:
    """An error record for an exception (failure_message), marked `poisoned` when the CUDA context
    cannot be trusted after it."""
    msg = failure_message(e)
    fields: dict[str, Any] = {**item.identity(), "status": "error", "reason": msg}
    if is_poisoning(msg):
        fields["poisoned"] = True
    return fields


_FREE_EVERY = 32  # items between full clean-ups when nothing forces one
_freed = itertools.count(1)  # items this process has cleaned up after


def free_memory(device: DeviceInfo, force: bool = False) -> None:
    """Return what a case left behind. A full gc.collect + empty_cache costs tens of milliseconds a
    case (a few minutes over a full sweep), so it runs after failures, every _FREE_EVERY items, or when
    the caching allocator holds over a third of the GPU; the allocator reuses the rest."""
    import gc

    periodic = next(_freed) % _FREE_EVERY == 0
    cuda = False
    if device.kind == "cuda":
        import torch

        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()  # nothing to free otherwise
    if cuda and not force:
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        force = torch.cuda.memory_reserved() > total / 3
    if not (force or periodic):
        return
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
