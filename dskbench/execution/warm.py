"""Build a sweep's JIT modules before the sweep, many at once: `dskbench warm`.

Why: on a fresh GPU box most of a first sweep's wall time is compilation, not measuring, and a
sweep compiles one module after another, in the order it meets them. The compilers are CPU work
(nvcc through FlashInfer, tvm-ffi, torch extensions; Triton), so they can run side by side. Warming
runs one item per (kernel, backend, variant) — the one that triggers the build — and, for a backend that
compiles per shape (Triton, CuTe DSL), one per shape, in `jobs` worker processes at once (sized by cores
and memory), spread over the host's GPUs, the longest builds of an earlier warm-up first. Each item is
prepared as the sweep prepares it (inputs, reference, bind, first launch, check) and nothing is timed,
except that a per-shape backend's later shapes are launched unchecked: they only compile again, and their
torch references (the larger part of their time) are the sweep's work. The caches the items fill
(FlashInfer's, tvm-ffi's, Triton's, torch's extension dir) are the ones the sweep then finds.

The same engine as a sweep (dskbench/execution/: one pool, one worker protocol, one hang watch): a
crashing build loses its item only, a hung one is killed at its case limit, and every item comes back
with its status (a skip or a wrong result shows here already) and its first-launch seconds, the build
time.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from dskbench.device.info import DeviceInfo, usable_cores
from dskbench.execution import memory_retry
from dskbench.execution.build_memory import BuildMemory
from dskbench.execution.host_threads import BUILDER_THREADS
from dskbench.execution.items import SweepOptions, WorkItem
from dskbench.execution.pool import Pool, Slot
from dskbench.execution.sweep import case_limits, worker_plan

GIB_PER_JOB = 6  # host memory one build may take (nvcc on a large CUTLASS or Marlin template)
# Builders and their compilers run this much nicer than the process that started them: a run that builds
# ahead keeps its measuring worker's CPU work (inputs, references, launches) ahead of dozens of compilers,
# and a warm-up alone leaves the box responsive. Among builders a long build's many compiler processes
# still get most of the CPU.
BUILD_NICE = 10
# The longest builds set when the last one ends, and on a box whose compilers use every core a long
# single-file build shares the CPU evenly with dozens of short ones. A unit expected to build this long
# runs a little less nice than the other builders (still nicer than the measuring worker).
CRITICAL_BUILD_S = 240.0
CRITICAL_NICE = 5
# Backends whose compiler runs again for each new shape: Triton specialises a kernel on its integer
# arguments (and autotunes per key), CuTe DSL compiles per shape. Their every case is warmed, not one.
PER_SHAPE_KINDS = ("triton", "cutedsl")
UNIT_ITEMS = 16  # builds one builder process takes at a time (build_units)
CHEAP_BUILD_S = 5.0  # a unit expected to build in less shares its process with its neighbours (packed)
PER_SHAPE_S = 3.0  # the cost longest_first gives a build after its module's first (one more shape)


def default_jobs(cpus: int | None = None, memory_bytes: int | None = None) -> int:
    """Half the usable cores (a build runs several compiler threads, but most builds are short and one long
    one, such as Marlin's, leaves the rest idle), and no more than the host's memory holds at
    GIB_PER_JOB each; at least 1."""
    cpus = cpus or usable_cores()
    memory_bytes = memory_bytes if memory_bytes is not None else host_memory()
    by_memory = memory_bytes // (GIB_PER_JOB * 2**30) if memory_bytes else cpus
    return max(1, min(cpus // 2, by_memory))


def host_memory() -> int | None:
    """This host's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def adapter_and_backend(kernel: str, backend: str) -> tuple[Any, Any]:
    """The kernel's adapter and its backend of that name (None for either not registered)."""
    from dskbench.adapters import get_adapter

    adapter = get_adapter(kernel)
    if adapter is None:
        return None, None
    return adapter, next((b for b in adapter.all_backends() if b.name == backend), None)


def builds_per_shape(kernel: str, backend: str) -> bool:
    """Whether this backend compiles again for each shape (PER_SHAPE_KINDS, or its own flag)."""
    b = adapter_and_backend(kernel, backend)[1]
    return b is not None and (b.kind in PER_SHAPE_KINDS or b.builds_per_shape)


def build_key(item: WorkItem, per_shape: bool) -> str:
    """The build an item needs: its (kernel, backend, variant) and op, and its shape for a backend that
    compiles per shape. Items of one key share one build. The op counts because a JIT module is often
    specialised on the op's fixed sizes (sglang's JIT RMSNorm on the hidden size, FlashInfer's
    merge_state on the head size), not on the token count."""
    key = f"{item.kernel} · {item.backend} · {item.case.get('variant') or '-'} · {item.case.get('op')}"
    return key + f" · {sorted((item.case.get('dims') or {}).items())}" if per_shape else key


def build_keys(
    items: Sequence[WorkItem], per_shape: Callable[[str, str], bool] = builds_per_shape
) -> list[str]:
    """build_key of each item, in order (per_shape asked once per (kernel, backend))."""
    shaped: dict[tuple[str, str], bool] = {}
    out = []
    for it in items:
        if (it.kernel, it.backend) not in shaped:
            shaped[(it.kernel, it.backend)] = per_shape(it.kernel, it.backend)
        out.append(build_key(it, shaped[(it.kernel, it.backend)]))
    return out


def skipped_by_case(item: WorkItem) -> bool:
    """Whether the adapter or the backend skips this item's case on any machine (a shape the backend
    rejects, as FlashInfer's merge_state does 128 heads): such an item builds nothing, so its build takes
    a later item of the same key."""
    from dskbench.shapes.cases import Case

    adapter, backend = adapter_and_backend(item.kernel, item.backend)
    if adapter is None:
        return False
    case = Case.from_json(item.case)
    return bool(adapter.skip_reason(case) or (backend is not None and backend.skip and backend.skip(case)))


def gated_here(device: DeviceInfo) -> Callable[[WorkItem], str | None]:
    """Why an item is skipped on `device` by the plan's gate (execution/gate.py: architecture, GPU count,
    memory, the case's own rules), or None: decided without a worker, so a build the device cannot run
    costs no process."""
    from dskbench.execution.gate import why_not
    from dskbench.shapes.cases import Case

    def reason(item: WorkItem) -> str | None:
        adapter, backend = adapter_and_backend(item.kernel, item.backend)
        if adapter is None or backend is None:
            return None
        return why_not(adapter, backend, Case.from_json(item.case), device)

    return reason


def skipped_or_gated(gated: Callable[[WorkItem], str | None]) -> Callable[[WorkItem], bool]:
    """warm_items' `skipped` for a device: the case's own rules (skipped_by_case) or its gate (gated_here)."""
    return lambda it: bool(skipped_by_case(it) or gated(it))


def warm_plan(
    items: Sequence[WorkItem],
    device: DeviceInfo | None,
    per_shape: Callable[[str, str], bool] = builds_per_shape,
) -> list[WorkItem]:
    """warm_items, with builds the device skips (gated_here) cut to one per (kernel, backend): that item
    records why, and the others (a per-shape backend for another architecture has dozens) start no
    process."""
    if device is None:
        return warm_items(items, per_shape)
    gated = gated_here(device)
    picked = warm_items(items, per_shape, skipped_or_gated(gated))
    said: set[tuple[str, str]] = set()
    out = []
    for it in picked:
        if gated(it):
            if (it.kernel, it.backend) in said:
                continue
            said.add((it.kernel, it.backend))
        out.append(it)
    return out


def warm_items(
    items: Sequence[WorkItem],
    per_shape: Callable[[str, str], bool] = builds_per_shape,
    skipped: Callable[[WorkItem], bool] = skipped_by_case,
) -> list[WorkItem]:
    """The items a sweep's compilers need: one per (kernel, backend, variant, op), the first in plan order
    (the smallest decode case) that its case's own rules do not skip; for a backend that compiles per
    shape, one per distinct shape. A key whose every item is skipped keeps its first (its record says
    why)."""
    chosen: dict[str, int] = {}  # build key -> the position of its item
    settled: set[str] = set()  # keys whose chosen item runs
    for pos, (it, key) in enumerate(zip(items, build_keys(items, per_shape), strict=True)):
        if key in settled:
            continue
        runs = not skipped(it)
        if key not in chosen or runs:
            chosen[key] = pos
        if runs:
            settled.add(key)
    built: set[tuple[Any, ...]] = set()  # (kernel, backend, variant) whose first item is already in
    out = []
    for pos in sorted(chosen.values()):
        it = items[pos]
        first = (it.kernel, it.backend, it.case.get("variant"))
        # the first item of a build is checked (a wrong result shows here already); a later shape
        # only compiles again, and its reference and check would be the sweep's work done twice
        out.append(it if first not in built else dataclasses.replace(it, checked=False))
        built.add(first)
    return out


def unit_costs(units: list[list[WorkItem]], build_s: dict[tuple[str, str], float]) -> list[float]:
    """Each unit's expected build seconds, from those an earlier warm-up recorded for its (kernel,
    backend)s: a (kernel, backend) costs its build seconds in the first unit that holds it (where its
    module builds) and PER_SHAPE_S an item after that (a compile for one more shape)."""
    seen: set[tuple[str, str]] = set()
    costs = []
    for unit in units:
        cost = 0.0
        for it in unit:
            pair = (it.kernel, it.backend)
            cost += build_s.get(pair, 0.0) if pair not in seen else PER_SHAPE_S * (pair in build_s)
            seen.add(pair)
        costs.append(cost)
    return costs


def longest_first(units: list[list[WorkItem]], build_s: dict[tuple[str, str], float]) -> list[list[WorkItem]]:
    """Units ordered by unit_costs, longest first, so the long builds start at once and the short ones
    fill the other jobs."""
    costs = unit_costs(units, build_s)
    order = sorted(range(len(units)), key=lambda u: costs[u], reverse=True)  # stable: unknown keep plan order
    return [units[u] for u in order]


def critical_plan(
    units: list[list[WorkItem]], build_s: dict[tuple[str, str], float]
) -> Callable[[list[WorkItem]], dict]:
    """The plan keys of a unit's builder: CRITICAL_NICE for a unit expected to build CRITICAL_BUILD_S or
    longer (looked up by any of its items: a unit may reach its builder with items left out)."""
    unit_of = {
        it.index: cost for unit, cost in zip(units, unit_costs(units, build_s), strict=True) for it in unit
    }

    def extra(unit: list[WorkItem]) -> dict:
        cost = max((unit_of.get(it.index, 0.0) for it in unit), default=0.0)
        return {"nice": CRITICAL_NICE} if cost >= CRITICAL_BUILD_S else {}

    return extra


def kernel_groups(items: Sequence[WorkItem]) -> list[list[WorkItem]]:
    """Items by kernel (a kernel's backends often share modules: one process builds them in turn)."""
    by_kernel: dict[str, list[WorkItem]] = {}
    for it in items:
        by_kernel.setdefault(it.kernel, []).append(it)
    return list(by_kernel.values())


def build_units(items: Sequence[WorkItem], size: int = UNIT_ITEMS) -> list[list[WorkItem]]:
    """The units builders take, one worker process each: a kernel's items (kernel_groups), cut into
    pieces of at most `size` where a backend compiles per shape. One process for all of a kernel's
    shapes made a chain of hundreds of compiles while other builders sat idle; a piece costs one more
    process start instead."""
    return [g[i : i + size] for g in kernel_groups(items) for i in range(0, len(g), size)]


def packed(
    units: list[list[WorkItem]], build_s: dict[tuple[str, str], float], size: int = UNIT_ITEMS
) -> list[list[WorkItem]]:
    """The units, with neighbouring cheap ones (expected under CHEAP_BUILD_S each, by unit_costs) joined
    up to `size` items: a process start costs more than most of their builds, and a box that builds
    while it measures spends it on every unit. A unit with a long build keeps a process to itself."""
    out: list[list[WorkItem]] = []
    open_unit: list[WorkItem] | None = None
    for unit, cost in zip(units, unit_costs(units, build_s), strict=True):
        if cost >= CHEAP_BUILD_S:
            out.append(unit)
            open_unit = None  # joined units stay in plan order
            continue
        if open_unit is not None and len(open_unit) + len(unit) <= size:
            open_unit.extend(unit)
            continue
        open_unit = list(unit)
        out.append(open_unit)
    return out


def jobs_for(items: Sequence[WorkItem], jobs: int) -> int:
    """Worker processes a warm-up of these items runs at once: no more than it has units (build_units)."""
    return max(1, min(jobs, len(build_units(warm_items(items)))))


@dataclasses.dataclass
class WarmResult:
    kernel: str
    backend: str
    variant: str | None
    case_id: str
    status: str
    reason: str | None
    first_launch_s: float | None  # the build (JIT compile, autotune) plus one launch
    item_s: float | None  # the whole item: inputs, reference, bind, first launch, check (some unchecked)
    # bind and first launch: where a build happens (a FlashInfer wrapper's plan builds its module in bind)
    build_s: float | None = None
    stages: dict[str, float] = dataclasses.field(default_factory=dict)  # the item's stages, as recorded


def warm_result(item: WorkItem, fields: dict[str, Any]) -> WarmResult:
    stages = fields.get("stages") or {}
    return WarmResult(
        kernel=item.kernel,
        backend=item.backend,
        variant=item.case.get("variant"),
        case_id=item.case_id,
        status=str(fields.get("status", "error")),
        reason=fields.get("reason"),
        first_launch_s=stages.get("first_launch_s"),
        item_s=stages.get("item_s"),
        build_s=build_seconds(stages),
        stages={k: float(v) for k, v in stages.items() if isinstance(v, int | float)},
    )


def build_seconds(stages: dict[str, Any]) -> float | None:
    """A build item's compile time: its bind plus its first launch (None when it never launched)."""
    first = stages.get("first_launch_s")
    if not isinstance(first, int | float):
        return None
    bind = stages.get("bind_s")
    return round(float(first) + (float(bind) if isinstance(bind, int | float) else 0.0), 4)


def warm_pool(
    picked: Sequence[WorkItem],
    opts: SweepOptions,
    jobs: int,
    on_result: Callable[[WorkItem, dict[str, Any]], None],
    gpu_tokens: Sequence[str] | None = None,
    build_s: dict[tuple[str, str], float] | None = None,
    env_for: Callable[[str], dict[str, str]] | None = None,
    admit: Callable[[WorkItem], bool] | None = None,
    on_drop: Callable[[WorkItem], None] | None = None,
) -> Pool:
    """The pool that prepares the warm items `picked` (nothing timed) in `jobs` worker processes, the
    longest builds first; each item's record fields go to on_result. gpu_tokens: CUDA_VISIBLE_DEVICES
    value of each GPU to spread the workers over (round robin by job), env_for(token) more variables
    for a worker there; None leaves the environment as it is. admit/on_drop: Pool's (builds to leave
    out once a unit is taken)."""
    from dskbench.results.environment import worker_env

    wopts = dataclasses.replace(opts, warm_only=True, gpus=1, measure_ceilings=False)
    plan = {**worker_plan(wopts, opts.seed or 0, None), "nice": BUILD_NICE, "threads": BUILDER_THREADS}

    def env(j: int) -> dict[str, str] | None:
        if not gpu_tokens:
            return None
        token = gpu_tokens[j % len(gpu_tokens)]
        return {**worker_env(token), **(env_for(token) if env_for else {})}

    slots = [Slot(f"build {j}", plan, env=env(j)) for j in range(jobs)]
    units = packed(build_units(picked), build_s or {})
    device = DeviceInfo(opts.device) if opts.device == "cpu" else DeviceInfo.detect("cuda")
    limits = case_limits(wopts, device, build_s)  # the build times it orders by set the builds' grace too
    return Pool(
        slots,
        lambda _slot, item, fields: on_result(item, fields),
        limits,
        shared=longest_first(units, build_s or {}),
        admit=admit,
        on_drop=on_drop,
        unit_plan=critical_plan(units, build_s or {}),
    )


def run_warm(
    items: Sequence[WorkItem],
    opts: SweepOptions,
    jobs: int,
    gpu_tokens: Sequence[str] | None = None,
    progress: Callable[[WarmResult], None] | None = None,
    build_s: dict[tuple[str, str], float] | None = None,
    memory: BuildMemory | None = None,
    device: DeviceInfo | None = None,
) -> list[WarmResult]:
    """Prepare every warm item (no timing) in `jobs` worker processes at once (warm_plan's, for `device`).

    gpu_tokens: CUDA_VISIBLE_DEVICES value of each GPU to spread the workers over (round robin by
    job); None leaves the environment as it is. memory: where the builds done are remembered (a later
    `run --build-ahead` leaves them out). opts.defer_builds_over_s: the builds deferred_here names are
    not made, each recorded skipped with why. A build out of GPU memory beside the others is built once
    more at the end, alone. Returns one WarmResult per item, in plan order.
    """
    picked = warm_plan(items, device)
    if not picked:
        return []
    results: dict[int, WarmResult] = {}
    keys = {it.index: key for it, key in zip(picked, build_keys(picked), strict=True)}
    why = deferred_here(picked, keys, opts.defer_builds_over_s, build_s, memory, device)
    for it in picked:  # left out: recorded skipped with the command that builds them, not remembered
        if keys[it.index] in why:
            results[it.index] = warm_result(it, {"status": "skipped", "reason": why[keys[it.index]]})
    todo = [it for it in picked if keys[it.index] not in why]

    short: list[WorkItem] = []  # builds that ran out of GPU memory beside the others

    def record(item: WorkItem, fields: dict[str, Any]) -> None:
        if memory_retry.out_of_memory(fields):
            short.append(item)
        r = warm_result(item, fields)
        results[item.index] = r
        if memory is not None:
            memory.add(keys[item.index], r.status)
        if progress:
            progress(r)

    try:
        if todo:
            jobs = min(jobs_for(items, jobs), len(build_units(todo)))
            warm_pool(todo, opts, jobs, record, gpu_tokens, build_s).run()
            if short and jobs > 1:  # the other builds held the memory these lacked: each again, alone
                warm_pool(list(short), opts, 1, record, gpu_tokens, build_s).run()
    finally:
        if memory is not None:
            memory.save()
    return [results[it.index] for it in picked if it.index in results]


def deferred_here(
    picked: Sequence[WorkItem],
    keys: dict[int, str],
    over_s: float | None,
    build_s: dict[tuple[str, str], float] | None,
    memory: BuildMemory | None,
    device: DeviceInfo | None,
) -> dict[str, str]:
    """Build key -> why warm leaves it out (`--defer-builds-over`, build_times.deferred_builds' rule and
    reason): the builds of `picked` that `memory` does not know and `device` does not skip."""
    from dskbench.execution.build_times import deferred_builds, packaged_build_times

    known = memory.known(keys.values()) if memory is not None and over_s else set()
    gated = gated_here(device) if device is not None and over_s else (lambda _it: None)
    builds = [dataclasses.replace(it, build=keys[it.index]) for it in picked if not gated(it)]
    builds = [it for it in builds if it.build not in known]
    return deferred_builds(builds, build_s if build_s is not None else packaged_build_times(), over_s)
