"""The sweep: plan (kernel x case x backend), run each item checked-then-timed, write results as they finish.

Items run in a worker subprocess (dskbench/worker.py). A kernel that kills its process or poisons the
CUDA context (illegal address, device assert) loses only its own item: the parent records it as
``error`` with the worker's last words and starts a fresh worker at the next item.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dskbench.adapters import get_adapter
from dskbench.backends import Backend, DeviceInfo, Unavailable, resolve
from dskbench.results import ResultsWriter, environment_record, result_record
from dskbench.shapes import Case, ModelShapes

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
EXIT_POISONED = 3
MODES = ("cold", "hot", "rotate")


# Registry statuses whose kernels are planned case by case: a needs-multi-gpu kernel with an adapter
# gets one record per case, skipped with the GPU count it needs (scripts/comm_bench.py measures it).
PLANNED_STATUSES = ("benchmark", "needs-multi-gpu")


class PlanError(ValueError):
    """A sweep request that names something that does not exist."""


@dataclass(frozen=True)
class WorkItem:
    index: int
    kernel: str
    backend: str
    case: dict[str, Any]
    category: str | None = None

    @property
    def case_id(self) -> str:
        return Case.from_json(self.case).id

    def identity(self) -> dict[str, Any]:
        """The fields that name this item in every record, whatever happened to it."""
        c = self.case
        return {
            "case_id": self.case_id,
            "kernel": self.kernel,
            "category": self.category,
            "op": c["op"],
            "variant": c.get("variant"),
            "phase": c["phase"],
            "point": c["point"],
            "dims": c["dims"],
            "backend": {"name": self.backend},
        }


@dataclass
class SweepOptions:
    device: str = "cuda"  # "cuda" or "cpu"
    phases: tuple[str, ...] = ("decode", "prefill")
    profile: str = "full"  # full | quick | cpu
    tp: tuple[int, ...] = (1,)
    mode: str = "cold"
    flush: str = "write"  # cold mode's L2 flush: "write" (zero_) or "read" (MeasureSettings.flush_kind)
    seed: int | None = None  # None: fresh inputs every run
    isolate: bool = True
    budget_s: float | None = None  # per-case time budget override
    measure_ceilings: bool = True
    dedupe: bool = True  # measure a (kernel, backend, dims, variant) once; its other ops' records copy it
    gpus: int = 1  # >1: shard the items over this many GPUs, one worker process each (dskbench/shard.py)
    host_gpus: int | None = None  # GPUs of the host when a worker sees only its own (multi-GPU gating)
    warm_only: bool = False  # prepare (build, first launch, check) but time nothing: dskbench warm
    costs_from: tuple[str, ...] = ()  # results files whose item times cut a sharded sweep (shard.py)


# -- planning -------------------------------------------------------------------------------------------


def select_kernels(registry: dict[str, Any], names: list[str] | None) -> list[str]:
    if not names:
        return sorted(registry)
    out = []
    by_alias = {a: e.name for e in registry.values() for a in getattr(e, "aliases", ())}
    for n in names:
        if n in registry:
            out.append(n)
        elif n in by_alias:
            out.append(by_alias[n])
        else:
            close = difflib.get_close_matches(n, list(registry) + list(by_alias), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else "; `dskbench list` shows them all"
            raise PlanError(f"unknown kernel {n!r}{hint}")
    return out


def plan_sweep(
    registry: dict[str, Any],
    shapes: ModelShapes,
    kernels: list[str],
    backends: list[str] | None,
    opts: SweepOptions,
) -> tuple[list[WorkItem], list[dict[str, Any]]]:
    """Work items to run, and the `skipped` records decided without running anything."""
    items: list[WorkItem] = []
    skips: list[dict[str, Any]] = []
    known_backends: set[str] = set()
    for name in kernels:
        entry = registry[name]
        status_skip = {"kernel": name, "case_id": name, "reason": f"{entry.status}: {entry.status_reason}"}
        if entry.status not in PLANNED_STATUSES:
            skips.append(status_skip)
            continue
        adapter = get_adapter(name)
        if adapter is None:
            if entry.status != "benchmark":
                skips.append(status_skip)
                continue
            skips.append({"kernel": name, "case_id": name, "reason": "no adapter for this kernel yet"})
            continue
        planned = len(items)
        all_b = adapter.all_backends()
        known_backends.update(b.name for b in all_b)
        chosen = [b for b in all_b if _backend_selected(b, backends, opts.device)]
        ops = [op for op in entry.op_names if shapes.ops.get(op) and shapes.ops[op].roles.get(adapter.role)]
        if not ops:
            ops = list(adapter.ops)
        for phase in opts.phases:
            for case in shapes.cases(name, ops, adapter.role, phase, opts.profile, list(opts.tp)):
                if not adapter.applies(case):
                    continue
                for b in chosen:
                    items.append(WorkItem(len(items), name, b.name, case.to_json(), entry.category))
        if entry.status != "benchmark" and len(items) == planned:  # e.g. an all-reduce at --tp 1 only
            skips.append(status_skip)
    if backends:
        unknown = sorted(set(backends) - known_backends)
        if unknown:
            raise PlanError(
                f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(sorted(known_backends))}"
            )
    return items, skips


def _backend_selected(b: Backend, wanted: list[str] | None, device: str) -> bool:
    if wanted:
        return b.name in wanted
    if device == "cpu":
        return b.name == "torch-ref"  # the only thing a CPU can run
    return b.name != "torch-ref"  # on a GPU the reference is the oracle, not a contender


# -- one item --------------------------------------------------------------------------------------------


def case_seed(run_seed: int, case_id: str, backend: str) -> int:
    return (run_seed + zlib.crc32(f"{case_id}|{backend}".encode())) % 2**31


def backend_block(b: Backend, resolved: Any = None) -> dict[str, Any]:
    block: dict[str, Any] = {
        "name": b.name,
        "kind": b.kind,
        "target": b.target,
        "package": b.package,
        "label": b.label,
        "dispatches_to": b.dispatches_to,
        "capturable": b.capturable,
    }
    if resolved is not None:
        block.update(resolved_target=resolved.target, package=resolved.package, version=resolved.version)
    return block


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
    kernel: str, case: Case, backend_name: str, device: DeviceInfo, seed: int
) -> tuple[dict[str, Any], Prepared | None]:
    """Gate, resolve, build inputs, run once and check against the reference.

    Returns the record fields so far and a Prepared case; None when the fields already say why the
    case stops here (status skipped or wrong). Exceptions propagate (the caller records them).
    """
    adapter = get_adapter(kernel)
    if adapter is None:
        raise PlanError(f"no adapter for {kernel}")
    backends = {b.name: b for b in adapter.all_backends()}
    if backend_name not in backends:
        raise PlanError(f"{kernel} has no backend {backend_name!r} (it has {', '.join(backends)})")
    backend = backends[backend_name]
    base: dict[str, Any] = {
        "case_id": case.id,
        "kernel": case.kernel,
        "op": case.op,
        "variant": case.variant,
        "phase": case.phase,
        "point": case.point,
        "dims": case.dims,
        "seed": seed,
        "backend": backend_block(backend),
    }
    reason = (
        backend.requires.reason_unmet(device)
        or multi_gpu_reason(adapter.gpus_needed(case), device)
        or adapter.skip_reason(case)
        or (backend.skip(case) if backend.skip else None)
    )
    if reason:
        return {**base, "status": "skipped", "reason": reason}, None
    try:
        resolved = resolve(backend)
    except Unavailable as e:
        return {**base, "status": "skipped", "reason": str(e)}, None
    base["backend"] = backend_block(backend, resolved)
    traffic = adapter.traffic_for(backend.name, case)
    base["traffic"] = {
        "bytes": traffic.bytes,
        "flops": traffic.flops,
        "compute": traffic.compute,
        "note": traffic.note,
    }
    dev = "cuda" if device.kind == "cuda" else "cpu"
    too_big = _memory_shortfall(traffic.bytes, dev)
    if too_big:
        return {**base, "status": "skipped", "reason": too_big}, None
    stages: dict[str, float] = {}
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        _sync(dev)
        now = time.perf_counter()
        stages[name] = round(now - t, 4)
        t = now

    inputs = adapter.make_inputs(case, dev, seed)
    lap("inputs_s")
    ref = adapter.reference(inputs, case)
    lap("reference_s")
    launch = backend.bind(resolved.fn, inputs, case)
    lap("bind_s")
    out = launch()
    lap("first_launch_s")
    chk = adapter.check(out, ref, case)
    lap("check_s")
    base["stages"] = stages
    base["check"] = {"error": chk.error, "tolerance": chk.tolerance, "detail": chk.detail}
    del out, ref
    if not chk.ok:
        why = f"relative error {chk.error:.3g} > tolerance {chk.tolerance:.1g}"
        if chk.error <= chk.tolerance:  # failed on another of the adapter's criteria: say which
            why = f"check failed: {chk.detail}"
        elif chk.detail:
            why += f" ({chk.detail})"
        return {**base, "status": "wrong", "reason": why}, None
    return base, Prepared(adapter, backend, resolved, case, inputs, launch, traffic, dev, seed)


def multi_gpu_reason(needed: int, device: DeviceInfo) -> str | None:
    """Why a case that needs several GPUs is not run here: too few GPUs, or (enough of them) because
    one process per GPU is needed, which the sweep's worker is not."""
    if needed <= 1:
        return None
    if needed > device.count:
        return f"needs {needed} GPUs (found {device.count})"
    return (
        f"needs {needed} processes, one per GPU: measured by "
        f"`torchrun --nproc-per-node {needed} scripts/comm_bench.py`"
    )


def execute_item(
    item: WorkItem, device: DeviceInfo, opts: SweepOptions, run_seed: int, ceilings: dict | None
) -> dict[str, Any]:
    """Prepare (gate, resolve, check), then time through the measurement core. Returns record fields."""
    if opts.host_gpus and opts.host_gpus > device.count:  # a shard's worker sees one GPU of several
        device = dataclasses.replace(device, count=opts.host_gpus)
    case = Case.from_json(item.case)
    base, prep = prepare_case(
        item.kernel, case, item.backend, device, case_seed(run_seed, case.id, item.backend)
    )
    base["category"] = item.category
    if prep is None:
        return base
    if opts.warm_only:  # the JIT build happened in the first launch; the caches keep it for the sweep
        return {**base, "status": "ok"}
    from dskbench import measure as core

    launchers = [prep.launch]
    if opts.mode == "rotate":
        launchers += _rotation_sets(prep)
    settings = core.settings_with_gap(measure_settings(opts), ceilings)
    mode = "hot" if opts.mode == "rotate" else opts.mode  # rotate: no flush, the sets overflow L2
    t0 = time.perf_counter()
    m = core.measure(
        launchers, device=prep.device, mode=mode, capturable=prep.backend.capturable, settings=settings
    )
    base["stages"]["measure_s"] = round(time.perf_counter() - t0, 4)
    timing = _as_dict(m)
    if not timing.get("n_samples") or timing.get("median_us") != timing.get("median_us"):  # none, or NaN
        return {**base, "status": "error", "reason": "the measurement produced no timing samples"}
    timing["mode"] = opts.mode
    timing["input_sets"] = len(launchers)
    peaks = core.datasheet_peaks(device.name) if prep.device == "cuda" else None
    compute = {"int8": "fp8"}.get(prep.traffic.compute, prep.traffic.compute)
    metrics = core.metrics(
        timing["median_us"], prep.traffic.bytes, prep.traffic.flops, ceilings, peaks, compute=compute
    )
    clock_keys = ("clocks_before", "clocks_after", "throttled", "throttle_reasons")
    clocks = {k: timing.pop(k) for k in clock_keys if k in timing}
    return {**base, "status": "ok", "timing": timing, "metrics": metrics, "clocks": clocks}


def measure_settings(opts: SweepOptions) -> Any:
    """The core's settings for a sweep: quick lists get a short budget; a CPU run (reference timings,
    some of them seconds per call) warms up once and stops at its budget."""
    from dskbench.measure import MeasureSettings

    settings = MeasureSettings.quick() if opts.profile in ("quick", "cpu") else MeasureSettings()
    if opts.device == "cpu":
        settings = dataclasses.replace(settings, warmup_launches=1, min_samples=1, min_time_s=0.0)
    if opts.budget_s is not None:
        settings = dataclasses.replace(settings, max_time_s=opts.budget_s)
    if opts.flush != settings.flush_kind:
        settings = dataclasses.replace(settings, flush_kind=opts.flush)
    return settings


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


def _memory_shortfall(needed: int, dev: str) -> str | None:
    if dev != "cuda":
        return None
    import torch

    free, _total = torch.cuda.mem_get_info()
    if needed > 0.85 * free:
        return f"needs at least {needed / 2**30:.1f} GiB of GPU memory, {free / 2**30:.1f} GiB free"
    return None


def _sync(dev: str) -> None:
    if dev == "cuda":
        import torch

        torch.cuda.synchronize()


def _as_dict(m: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(m):
        return dataclasses.asdict(m)
    if hasattr(m, "to_json"):
        return m.to_json()
    return dict(m)


def finished_keys(runs: list) -> set[tuple[str, str]]:
    """(case_id, backend) pairs that already have a result a resumed sweep need not repeat.

    Errors are retried (they may have been a dead worker); ok, wrong and skipped results stand.
    """
    done = set()
    for run in runs:
        for rec in run.results:
            if rec["status"] != "error":
                done.add((rec.get("case_id", rec["kernel"]), rec["backend"]["name"]))
    return done


def is_poisoning(message: str) -> bool:
    return any(s.lower() in message.lower() for s in POISONING_ERRORS)


# -- the sweep -------------------------------------------------------------------------------------------


@dataclass
class SweepSummary:
    out: Path
    counts: Counter
    wall_s: float
    items: int

    def line(self) -> str:
        parts = ", ".join(f"{k} {self.counts.get(k, 0)}" for k in ("ok", "wrong", "skipped", "error"))
        return f"{self.items} cases: {parts} in {self.wall_s:.1f} s -> {self.out}"


def dedupe_items(items: list[WorkItem]) -> tuple[list[WorkItem], dict[int, list[WorkItem]]]:
    """Items to run, and for each of them (by index) the items that launch the same kernel with the same
    inputs: another op of the same shape (input_layernorm and post_attention_layernorm are both
    [T, 7168]), or decode and prefill at the same T. On the 2026-11-21 plan, 15% of the runnable items.
    Their records are copies of the measured one, marked `shared_with` (Recorder)."""
    first: dict[tuple[str, str, str, str], WorkItem] = {}
    run: list[WorkItem] = []
    copies: dict[int, list[WorkItem]] = {}
    for it in items:
        c = it.case
        key = (it.kernel, it.backend, json.dumps(c["dims"], sort_keys=True), json.dumps(c.get("variant")))
        primary = first.get(key)
        if primary is None:
            first[key] = it
            run.append(it)
        else:
            copies.setdefault(primary.index, []).append(it)
    return run, copies


class Recorder:
    """The one writer of a sweep's result records: thread-safe, so that the workers of several GPUs
    (dskbench/shard.py) record through it as their cases finish. Counts statuses and reports progress."""

    def __init__(
        self,
        writer: ResultsWriter,
        run_id: str,
        progress: Any = None,
        copies: dict[int, list[WorkItem]] | None = None,
    ):
        self.writer, self.run_id, self.progress = writer, run_id, progress
        self.copies = copies or {}  # item index -> items whose records copy its result (dedupe_items)
        self.counts: Counter = Counter()
        self.closed = False  # set once the sweep ends (an interrupted shard may still report)
        self._lock = threading.Lock()

    def skip(self, s: dict[str, Any]) -> None:
        with self._lock:
            self.writer.write(result_record(self.run_id, "skipped", backend={"name": "-"}, **s))
            self.counts["skipped"] += 1

    def __call__(self, item: WorkItem, fields: dict[str, Any], **extra: Any) -> None:
        fields = {**fields, **extra}
        fields.pop("poisoned", None)
        status = fields.pop("status")
        with self._lock:
            if self.closed:
                return
            fields.setdefault("finished", round(time.time(), 3))  # unix seconds: sweep rate, wall per GPU
            self.writer.write(result_record(self.run_id, status, index=item.index, **fields))
            self.counts[status] += 1
            if self.progress:
                self.progress(item, status, fields)
            for twin in self.copies.get(item.index, ()):
                ident = twin.identity()
                same = {k: ident[k] for k in ("case_id", "op", "variant", "phase", "point", "dims")}
                copy = {**fields, **same, "shared_with": item.case_id}
                self.writer.write(result_record(self.run_id, status, index=twin.index, **copy))
                self.counts[status] += 1
                if self.progress:
                    self.progress(twin, status, copy)


def sweep_seed(opts: SweepOptions) -> int:
    """The run's input seed: --seed, or a fresh one (recorded with the run either way)."""
    return opts.seed if opts.seed is not None else int.from_bytes(os.urandom(4), "little") % 2**31


def timed_ceilings() -> dict[str, Any]:
    """This GPU's measured ceilings, with the seconds they took (a start-up cost, reported)."""
    from dskbench.measure import measure_ceilings

    t0 = time.monotonic()
    ceilings = measure_ceilings("cuda")
    ceilings["measured_in_s"] = round(time.monotonic() - t0, 2)
    return ceilings


def run_sweep(
    items: list[WorkItem],
    skips: list[dict[str, Any]],
    opts: SweepOptions,
    out: Path,
    progress: Any = None,
) -> SweepSummary:
    if opts.gpus > 1:
        from dskbench.shard import run_sharded

        return run_sharded(items, skips, opts, out, progress)
    from dskbench.environment import environment, new_run_id

    t0 = time.monotonic()
    device = DeviceInfo.detect(opts.device)
    run_id = new_run_id()
    run_seed = sweep_seed(opts)
    env = environment(device)
    to_run, copies = dedupe_items(items) if opts.dedupe else (items, {})
    ceilings = None
    if device.kind == "cuda" and opts.measure_ceilings and items:
        ceilings = timed_ceilings()
    with ResultsWriter(out) as w:
        w.write(
            environment_record(
                run_id,
                **env,
                ceilings=ceilings,
                settings={
                    **dataclasses.asdict(opts),
                    "run_seed": run_seed,
                    "items": len(items),
                    "copied_items": sum(len(c) for c in copies.values()),  # records copying a twin's
                },
                command=sys.argv,
            )
        )
        record = Recorder(w, run_id, progress, copies)
        for s in skips:
            record.skip(s)
        if opts.isolate:
            _run_isolated(to_run, device, opts, run_seed, ceilings, record)
        else:
            for item in to_run:
                record(item, run_one(item, device, opts, run_seed, ceilings))
        record.closed = True
    return SweepSummary(out, record.counts, time.monotonic() - t0, len(items) + len(skips))


def run_one(
    item: WorkItem, device: DeviceInfo, opts: SweepOptions, run_seed: int, ceilings
) -> dict[str, Any]:
    """execute_item with every failure turned into an error record (the sweep goes on)."""
    base = item.identity()
    t0 = time.perf_counter()
    try:
        fields = execute_item(item, device, opts, run_seed, ceilings)
    except Exception as e:  # noqa: BLE001 - a failing kernel is a result, not a crash of the sweep
        msg = f"{type(e).__name__}: {e}".strip()
        if "OutOfMemory" in type(e).__name__ or "out of memory" in msg.lower():
            msg = "out of memory: " + msg
        fields = {**base, "status": "error", "reason": msg[:2000]}
        if is_poisoning(msg):
            fields["poisoned"] = True
        _free(device, force=True)
        return fields
    _free(device, force=fields.get("status") in ("error", "wrong"))
    if isinstance(fields.get("stages"), dict):  # the whole item, set-up and clean-up included
        fields["stages"]["item_s"] = round(time.perf_counter() - t0, 4)
    return fields


_FREE_EVERY = 32  # items between full clean-ups when nothing forces one
_freed = itertools.count(1)  # items this process has cleaned up after


def _free(device: DeviceInfo, force: bool = False) -> None:
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


def _run_isolated(items, device, opts, run_seed, ceilings, record) -> None:
    """Run items in worker subprocesses; a dead worker costs one item, then a new worker resumes.
    Items keep their plan index in the records; the workers see them numbered 0..n-1."""
    if not items:
        return
    local = [dataclasses.replace(it, index=j) for j, it in enumerate(items)]
    with tempfile.TemporaryDirectory(prefix="dskbench-") as tmp:
        plan = write_plan(Path(tmp) / "plan.json", local, opts, run_seed, ceilings)
        start = 0
        while start < len(local):
            start = _one_worker(plan, local, start, lambda it, f: record(items[it.index], f))


def write_plan(path: Path, items: list[WorkItem], opts: SweepOptions, run_seed: int, ceilings) -> Path:
    """The plan file a worker reads. Item i must sit at position i (the worker protocol uses both)."""
    assert all(it.index == n for n, it in enumerate(items)), "plan items must be numbered 0..n-1"
    plan = {
        "items": [dataclasses.asdict(i) for i in items],
        "opts": dataclasses.asdict(opts),
        "run_seed": run_seed,
        "ceilings": ceilings,
    }
    path.write_text(json.dumps(plan))
    return path


def _one_worker(
    plan: Path,
    items: list[WorkItem],
    start: int,
    record,
    env: dict[str, str] | None = None,
    live: set | None = None,
) -> int:
    """Start a worker at `start`; return where the next worker must start.

    Protocol on the worker's stdout: ``BEGIN i`` before item i, ``RESULT {json}`` after it, and
    ``NEXT n`` when it exits on purpose (n = len(items) when done, i + 1 after a poisoning error).
    `env`: the worker's environment (a shard sets CUDA_VISIBLE_DEVICES); `live`: a set the running
    process is kept in, so that an interrupted sharded sweep can stop it.
    """
    cmd = [sys.executable, "-m", "dskbench.worker", str(plan), str(start)]
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1, env=env)
        if live is not None:
            live.add(proc)
        assert proc.stdout is not None
        current: int | None = None
        last_done = start - 1
        next_index: int | None = None
        for line in proc.stdout:
            kind, _, payload = line.rstrip("\n").partition(" ")
            if kind == "BEGIN":
                current = int(payload)
            elif kind == "RESULT":
                data = json.loads(payload)
                record(items[data["index"]], data["fields"])
                last_done, current = data["index"], None
            elif kind == "NEXT":
                next_index = int(payload)
        code = proc.wait()
        if live is not None:
            live.discard(proc)
        if current is None and next_index is not None:
            return next_index
        failed = current if current is not None else last_done + 1
        if failed >= len(items):
            return failed
        err.seek(0)
        tail = err.read()[-1500:].strip()
        reason = f"worker process died (exit code {code}) while running this case"
        if tail:
            reason += f": {tail}"
        item = items[failed]
        record(item, {**item.identity(), "status": "error", "reason": reason})
        return failed + 1
