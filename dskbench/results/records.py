"""Typed records of a results file: the environment of a run and the result of each case.

A result record is written as one flat JSON object: the case's identity at the top level, the other
parts (backend, check, timing, metrics, ...) as nested objects. Each type has one `to_json` and one
`from_json`; keys a type does not know are kept in `extra` and written back unchanged, so files of
newer or older writers read and round-trip. A part's fields marked `omit_none` are left out of the
JSON while unset; the others are always written (null when unknown), as the engine has always written
them. docs/results.schema.json is generated from these types (dskbench.results.schema).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from dskbench.results.part import Part, RecordError
from dskbench.results.part import always as _always
from dskbench.results.part import extra_field as _extra
from dskbench.results.part import finite as _finite
from dskbench.results.part import optional as _optional
from dskbench.results.part import required as _required

SCHEMA = "dskbench.results/1"
# unstable: checked and timed, but the timing is impossible (dskbench.measure.validity), twice: kept
# for the reader to see, never used as a number
STATUSES = ("ok", "wrong", "skipped", "error", "unstable")
TIMED = ("ok", "unstable")  # the statuses whose record carries a timing


__all__ = ["Part", "RecordError"]


@dataclass(frozen=True)
class Identity(Part):
    """What a result is about. A case's identity names all of it; a kernel skipped at planning has only
    its name (`case_id` = `kernel`)."""

    case_id: str = _required("kernel/op[:variant]/phase/var=value,...: stable across runs")
    kernel: str = _required("registry kernel")
    category: str | None = _always("registry category")
    op: str | None = _always("DeepSeek op (shapes file name); unset: a kernel-level record")
    variant: str | None = _always("op variant, e.g. gate_up")
    phase: str | None = _always("sweep: decode, prefill, decode_graph")
    point: dict[str, Any] | None = _always("sweep variables: T, B, kv_len, tp")
    dims: dict[str, Any] | None = _always("dimensions the inputs were built from")
    extra: Mapping[str, Any] = _extra()

    KEYS: ClassVar[tuple[str, ...]] = ("case_id", "kernel", "category", "op", "variant", "phase", "point", "dims")

    def to_json(self) -> dict[str, Any]:
        if self.op is None:  # kernel level: no case to name
            out = {"case_id": self.case_id, "kernel": self.kernel}
            return {**out, "category": self.category} if self.category is not None else out
        return {k: getattr(self, k) for k in self.KEYS}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Identity:
        if "kernel" not in d:
            raise RecordError("a result record needs its kernel")
        keys = {k: d[k] for k in cls.KEYS if k in d}
        return cls(**{"case_id": d["kernel"], **keys})


@dataclass(frozen=True)
class BackendInfo(Part):
    """The backend a case ran on: declared (registry), then what really loaded once resolved. A record
    written before the backend was looked up (a crash, a planning skip) has only its name."""

    name: str = _required("backend name; '-' for a kernel skipped at planning")
    kind: str | None = _always("aot, jit, triton, cutedsl, cubin, torch, host")
    target: str | None = _always("declared module:attr")
    package: str | None = _always("distribution (the resolved one once resolved)")
    label: str | None = _always('e.g. "Hopper path: ..."')
    dispatches_to: str | None = _always("a wrapper that forwards elsewhere")
    capturable: bool | None = _always("safe to capture in a CUDA graph")
    resolved_target: str | None = _optional("what really loaded")
    version: str | None = _always("the resolved package's version")
    extra: Mapping[str, Any] = _extra()

    DECLARED: ClassVar[tuple[str, ...]] = ("kind", "target", "package", "label", "dispatches_to", "capturable")

    def with_resolution(self, target: str, package: str | None, version: str | None) -> BackendInfo:
        """The backend once looked up: what loaded, from which distribution, at which version."""
        return replace(self, resolved_target=target, package=package, version=version)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.kind is not None:
            out.update({k: getattr(self, k) for k in self.DECLARED})
        if self.resolved_target is not None:
            out.update(resolved_target=self.resolved_target, version=self.version)
        return {**out, **self.extra}


@dataclass(frozen=True)
class Check(Part):
    """The first launch's output against the reference. Whether it passed is the record's status (ok or
    wrong): an adapter may fail a case on more than the relative error."""

    error: float | None = _always("relative error ||out-ref||/||ref|| or the adapter's own measure")
    tolerance: float | None = _always("the largest error that passes")
    detail: str | None = _always("the adapter's note")
    extra: Mapping[str, Any] = _extra()


@dataclass(frozen=True)
class Traffic(Part):
    """The minimum work of a case, for GB/s and TFLOP/s."""

    bytes: int | None = _always("inputs read once, outputs written once")
    flops: int | float | None = _always("floating-point operations")
    compute: str | None = _always("tensor rate the FLOPs compare with: bf16, fp8, fp4, int8")
    note: str | None = _always("how the traffic was counted")
    extra: Mapping[str, Any] = _extra()


@dataclass(frozen=True)
class CrossCheck(Part):
    """A second timer's view of the same case (dskbench.measure.cross_check): CUDA events for a case CUPTI
    timed, CUPTI for one the events timed; both medians before any launch-gap correction. Outside its
    band the record is flagged (agrees false), its status kept; beyond 2x either way it is unstable."""

    method: str | None = _always("cuda-events or cupti: the second timer; null when none ran (skipped says why)")
    agrees: bool | None = _always("the ratio lies in its band; null when not cross-checked")
    median_us: float | None = _optional("the second timer's median per launch (no gap subtracted)")
    main_us: float | None = _optional("the record's own median before the launch gap was subtracted")
    ratio: float | None = _optional("main_us / median_us")
    band: list[float | None] | None = _optional("[lo, hi]: the ratio's normal range (null: unbounded)")
    overhead_us: float | None = _optional("the event timer's per-launch overhead over CUPTI the band allows")
    samples: int | None = _optional("the second timer's samples")
    note: str | None = _optional("why the timers disagree")
    via: str | None = _optional("how the CUPTI pass launched the case, when not from a graph")
    skipped: str | None = _optional("why there is no cross-check (turned off, no CUPTI, a CPU run)")
    extra: Mapping[str, Any] = _extra()

    @property
    def flagged(self) -> bool:
        """The timers disagree beyond their normal band."""
        return self.agrees is False


@dataclass(frozen=True)
class Timing(Part):
    """The measurement core's result for one case; times per launch in microseconds."""

    median_us: float | None = _required("median per-launch time (null: no samples; never on an ok result)")
    p10_us: float | None = _always("10th percentile")
    p90_us: float | None = _always("90th percentile")
    mean_us: float | None = _always("mean")
    min_us: float | None = _always("fastest sample")
    max_us: float | None = _always("slowest sample")
    cv: float | None = _always("stdev / mean of the samples")
    noise: float | None = _always("relative half-width of the median's 95% CI")
    n_samples: int | None = _always("samples taken")
    launches_per_sample: int | None = _always("each sample is the mean over this many launches")
    converged: bool | None = _always("noise reached its target within the budget")
    wall_s: float | None = _always("the whole measurement: warm-up, capture, sampling")
    method: str | None = _always("cuda-graph, cuda-eager, cpu-wall")
    mode: str | None = _always("cold, hot, rotate")
    device: str | None = _always("cuda or cpu")
    n_sets: int | None = _always("input sets the core rotated through")
    samples_us: list[float] | None = _always("the samples (launch gap subtracted)")
    raw_median_us: float | None = _always("median before the launch gap was subtracted")
    launch_gap_us: float | None = _always("per-launch graph node gap subtracted from every sample")
    clamped: int | None = _optional("samples shorter than the launch gap, clamped at 0")
    flush_us: float | None = _always("cold: median time of one L2 flush (excluded)")
    flush_bytes: int | None = _always("cold: bytes one flush touches")
    flush_kind: str | None = _always("cold: write or read")
    fallback_reason: str | None = _always("why the eager method was used")
    clocks_during: dict[str, Any] | None = _always("NVML reads taken while the GPU was busy")
    notes: list[str] | None = _always("the core's remarks")
    input_sets: int | None = _optional("input sets of the case (rotate mode: several)")
    rank: int | None = _optional("collectives: the slowest rank, whose timing this is")
    stopping: dict[str, Any] | None = _optional("the stopping policy: {name, its parameters}")
    cross_check: CrossCheck | None = _optional(
        "a second timer's view (results files written before it have none: not cross-checked)"
    )
    extra: Mapping[str, Any] = _extra()

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        if self.cross_check is not None:
            out["cross_check"] = self.cross_check.to_json()
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Any:
        t = super().from_json(d)
        if isinstance(t.cross_check, Mapping):
            t = replace(t, cross_check=CrossCheck.from_json(t.cross_check))
        return t

    def __post_init__(self) -> None:
        if self.stopping is not None and not (
            isinstance(self.stopping, Mapping) and isinstance(self.stopping.get("name"), str)
        ):
            raise RecordError(f"timing.stopping must be an object with a name, not {self.stopping!r}")
        if self.cross_check is not None and not isinstance(self.cross_check, CrossCheck | Mapping):
            raise RecordError(f"timing.cross_check must be an object, not {self.cross_check!r}")


@dataclass(frozen=True)
class Metrics(Part):
    """What a timing means against the traffic: one key per quantity."""

    latency_us: float | None = _always("the median the metrics were computed at")
    gbps: float | None = _always("achieved GB/s (collectives: bus bandwidth)")
    tflops: float | None = _always("achieved TFLOP/s")
    compute: str | None = _always("tensor rate compared with: bf16, fp8, fp4")
    pct_bw_measured: float | None = _always(
        "% of the run's measured copy bandwidth (null when that ceiling was throttled or did not converge)"
    )
    pct_compute_measured: float | None = _always(
        "% of the run's measured matmul rate (null when that ceiling was throttled or did not converge)"
    )
    pct_bw_datasheet: float | None = _always("% of the datasheet HBM bandwidth: the % of peak")
    pct_compute_datasheet: float | None = _always("% of the datasheet dense tensor rate: the % of peak")
    floor_us: float | None = _always("the roofline time: traffic at the peaks (floor_peaks says which)")
    bound: str | None = _always("memory or compute")
    pct_of_floor: float | None = _always("floor_us / median, in %")
    floor_peaks: str | None = _optional(
        "the peaks floor_us is taken at: datasheet, measured (no datasheet entry), or datasheet+measured"
    )
    ceilings_unused: dict[str, str] | None = _optional(
        "measured ceilings this record is not compared with, and why (throttled, not converged)"
    )
    payload_bytes: int | None = _optional("collectives: bytes each rank contributes")
    algbw_gbps: float | None = _optional("collectives: payload / time")
    busbw_gbps: float | None = _optional("collectives: 2(n-1)/n x payload / time")
    extra: Mapping[str, Any] = _extra()

    @property
    def pct_bw(self) -> float | None:
        """% of bandwidth peak: of the datasheet (a GPU with no datasheet entry has none)."""
        return _first_finite(self.pct_bw_datasheet)

    @property
    def pct_compute(self) -> float | None:
        """% of compute peak: of the datasheet (a GPU with no datasheet entry has none)."""
        return _first_finite(self.pct_compute_datasheet)


def _first_finite(*xs: Any) -> float | None:
    return next((float(x) for x in xs if _finite(x)), None)


@dataclass(frozen=True)
class Clocks(Part):
    """NVML around the case."""

    clocks_before: dict[str, Any] | None = _always("SM/memory clocks, temperature, power before")
    clocks_after: dict[str, Any] | None = _always("the same after")
    throttled: bool | None = _always("clocks were held down (null: unknown, no NVML)")
    throttle_reasons: list[str] | None = _always("NVML's reasons")
    extra: Mapping[str, Any] = _extra()

    KEYS: ClassVar[tuple[str, ...]] = ("clocks_before", "clocks_after", "throttled", "throttle_reasons")


@dataclass(frozen=True)
class Stages(Part):
    """Where one case's wall time went, in seconds (each stage ends with a device sync, so a stage's
    GPU work is charged to it). measure_s = warmup_s + prepare_s + sampling_s + the measurement's own
    bookkeeping (clocks, flush buffer, graph release); item_s is the whole case, clean-up included, and
    other_s what no stage accounts for."""

    setup_s: float | None = _optional("look up the adapter and backend, gate the case, its traffic model")
    resolve_s: float | None = _optional("import the backend (and, once a process, its kind's runtime)")
    inputs_s: float | None = _optional("build the inputs (make_inputs)")
    reference_s: float | None = _optional("run the torch reference")
    bind_s: float | None = _optional("bind the backend to the inputs")
    first_launch_s: float | None = _optional("the first launch (its binary's load; JIT builds, autotuning)")
    check_s: float | None = _optional("compare the output with the reference")
    warmup_s: float | None = _optional("warm-up launches before anything is timed")
    prepare_s: float | None = _optional("launch-count calibration and CUDA graph capture")
    sampling_s: float | None = _optional("the timed batches, until the stopping policy stops")
    cross_check_s: float | None = _optional("the second timer's brief reading (its share of a batch's)")
    measure_s: float | None = _optional("the whole measurement (warm-up, prepare, sampling, bookkeeping)")
    record_s: float | None = _optional("the record built from the measurement (metrics, clocks, flags)")
    cleanup_s: float | None = _optional("the case's tensors released (a full collection now and then)")
    item_s: float | None = _optional("the whole case, set-up and clean-up included")
    other_s: float | None = _optional("item_s less the stages above (record keeping, clean-up)")
    extra: Mapping[str, Any] = _extra()

    BEFORE_MEASURE: ClassVar[tuple[str, ...]] = (
        "setup_s",
        "resolve_s",
        "inputs_s",
        "reference_s",
        "bind_s",
        "first_launch_s",
        "check_s",
    )
    IN_MEASURE: ClassVar[tuple[str, ...]] = ("warmup_s", "prepare_s", "sampling_s")
    AFTER_MEASURE: ClassVar[tuple[str, ...]] = ("record_s", "cleanup_s")

    def with_other(self) -> Stages:
        """With other_s: item_s less the stages before, during and after the measurement."""
        if not _finite(self.item_s):
            return self
        named = (*self.BEFORE_MEASURE, "measure_s", *self.AFTER_MEASURE)
        known = sum(x for x in (getattr(self, k) for k in named) if _finite(x))
        return replace(self, other_s=round(max(0.0, float(self.item_s) - known), 4))


@dataclass(frozen=True)
class Environment(Part):
    """The first record of a run: the machine, the software and the settings its results share."""

    run_id: str = _required("YYYYMMDDTHHMMSSZ-xxxxxx")
    created: str = _required("UTC ISO-8601 time the run started")
    device: dict[str, Any] = _required("kind, name, sm, count, memory_gib, ... and NVML's driver, uuid")
    versions: dict[str, Any] = _required("package -> version (null: not installed)")
    host: str | None = _optional("host name")
    platform: str | None = _optional("OS")
    git: dict[str, Any] | None = _optional("commit, dirty, source_tree (the package's git tree id)")
    multicast: dict[str, Any] | None = _optional("NVLink multicast: env, off")
    ceilings: dict[str, Any] | None = _optional("measured ceilings and launch_gap (null on CPU)")
    settings: dict[str, Any] | None = _optional("the sweep options")
    command: list[str] | None = _optional("the command line")
    gpus: list[dict[str, Any]] | None = _optional("one entry per GPU of a sharded or collective run")
    peaks: dict[str, Any] | None = _optional(
        "the datasheet peaks every % of peak is taken against: name, hbm_gbps, <rate>_tflops, source"
    )
    shared_gpu: list[dict[str, Any]] | None = _optional(
        "at the start, per GPU of the run: state (exclusive, shared, unknown), the other processes on it "
        "(pid, name, used_mib), mig, mps"
    )
    extra: Mapping[str, Any] = _extra()

    null_keys: frozenset[str] = field(default=frozenset(), compare=False, metadata={"internal": True})

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out.pop("null_keys")
        out.update({k: None for k in self.null_keys})  # given as null (ceilings on a CPU): written null
        return {"record": "environment", "schema": SCHEMA, **out}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Environment:
        _check_kind(d, "environment")
        body = {k: v for k, v in d.items() if k not in ("record", "schema", "null_keys")}
        env = super().from_json(body)
        return replace(env, null_keys=frozenset(k for k, v in body.items() if v is None and k in env.NULLABLE))

    NULLABLE: ClassVar[tuple[str, ...]] = (
        "host", "platform", "git", "multicast", "ceilings", "settings", "command", "gpus", "peaks", "shared_gpu"
    )  # fmt: skip


def _check_kind(d: Mapping[str, Any], kind: str) -> None:
    if d.get("record", kind) != kind:
        raise RecordError(f"a {d.get('record')!r} record is not a {kind} record")
    if d.get("schema", SCHEMA) != SCHEMA:
        raise RecordError(f"schema {d.get('schema')!r}, expected {SCHEMA!r}")


# Top-level keys of a result record besides the identity and the parts, each written only when set.
RESULT_FIELDS = {
    "reason": "why the case is not ok: required unless ok",
    "reclassified_from": "set by readers, not by runs: the status the file holds (ok) for a record read "
    "as unstable, its timing failing the validity rule of later versions",
    "seed": "input seed of this case",
    "index": "position in the run's plan",
    "shared_with": "the case whose measurement this record copies (dedupe; may be another kernel's)",
    "repro": "a dskbench run command line that selects this case again",
    "finished": "unix seconds when the record was written",
    "gpu_index": "sharded runs: the GPU (index into the environment's gpus) it ran on",
    "world": "collectives: processes, one per GPU",
    "ranks": "collectives: each rank's median_us, p10_us, p90_us, method",
    "detail": "collectives: the set-up's note",
    "shared_gpu": "other processes used the GPU when this case was measured: {pids, names}",
    "retried": "why this record is a case's second run (its first ran out of GPU memory beside other cases, "
    "builds or builders of its run)",
}
PARTS = {
    "check": Check,
    "traffic": Traffic,
    "timing": Timing,
    "metrics": Metrics,
    "clocks": Clocks,
    "stages": Stages,
}


@dataclass(frozen=True)
class ResultRecord:
    """One case's result. Invariants (checked on construction): a known status; a reason unless ok; an
    ok result has a timing with a finite median, an unstable one the timing found impossible. `validate_complete` adds what the engine always writes: ok and wrong results carry their check."""

    run_id: str
    status: str
    identity: Identity
    backend: BackendInfo
    reason: str | None = None
    reclassified_from: str | None = None
    seed: int | None = None
    check: Check | None = None
    traffic: Traffic | None = None
    timing: Timing | None = None
    metrics: Metrics | None = None
    clocks: Clocks | None = None
    stages: Stages | None = None
    index: int | None = None
    shared_with: str | None = None
    repro: str | None = None
    finished: float | None = None
    gpu_index: int | None = None
    world: int | None = None
    ranks: list[dict[str, Any]] | None = None
    detail: Any = None
    shared_gpu: dict[str, Any] | None = None
    retried: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise RecordError(f"status {self.status!r} is not one of {', '.join(STATUSES)}")
        if self.status != "ok" and not self.reason:
            raise RecordError(f"a {self.status} result needs a reason")
        if self.status == "ok" and (self.timing is None or not _finite(self.timing.median_us)):
            raise RecordError("an ok result needs its timing (a finite median)")
        if self.status == "unstable" and self.timing is None:
            raise RecordError("an unstable result needs the timing that was found impossible")

    def validate_complete(self) -> ResultRecord:
        """The engine's records: ok, unstable and wrong results carry the check that decided them."""
        if self.status in ("ok", "unstable", "wrong") and self.check is None:
            raise RecordError(f"a {self.status} result needs its check")
        return self

    @property
    def case_id(self) -> str:
        return self.identity.case_id

    @property
    def key(self) -> tuple[str, str]:
        """(case_id, backend): what a comparison or a resumed sweep matches records on."""
        return self.identity.case_id, self.backend.name

    @property
    def gbps(self) -> float | None:
        """Achieved GB/s: the recorded metric, else the traffic over the median."""
        return rate_of(self.metrics, self.traffic, self.timing, "gbps")

    @property
    def tflops(self) -> float | None:
        """Achieved TFLOP/s: the recorded metric, else the FLOPs over the median."""
        return rate_of(self.metrics, self.traffic, self.timing, "tflops")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"record": "result", "schema": SCHEMA, "run_id": self.run_id}
        out.update(status=self.status, **self.identity.to_json(), backend=self.backend.to_json())
        for name in PARTS:
            part = getattr(self, name)
            if part is not None:
                out[name] = part.to_json()
        for name in RESULT_FIELDS:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return {**out, **self.identity.extra, **self.extra}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ResultRecord:
        _check_kind(d, "result")
        for k in ("run_id", "status", "backend"):
            if k not in d:
                raise RecordError(f"result record lacks {k}")
        parts = {k: PARTS[k].from_json(d[k]) for k in PARTS if d.get(k) is not None}
        top = {k: d[k] for k in RESULT_FIELDS if k in d}
        known = {"record", "schema", "run_id", "status", "backend", *Identity.KEYS, *PARTS, *RESULT_FIELDS}
        return cls(
            run_id=str(d["run_id"]),
            status=d["status"],
            identity=Identity.from_json(d),
            backend=BackendInfo.from_json(d["backend"]),
            **parts,
            **top,
            extra={k: v for k, v in d.items() if k not in known},
        )

    def with_(self, **changes: Any) -> ResultRecord:
        return replace(self, **changes)


_RATES = {"gbps": ("bytes", 1e3), "tflops": ("flops", 1e6)}


def rate_of(metrics: Metrics | None, traffic: Traffic | None, timing: Timing | None, metric: str) -> float | None:
    """A rate: the recorded metric, else the traffic over the median."""
    m = getattr(metrics, metric, None)
    if _finite(m):
        return float(m)
    amount, scale = _RATES[metric]
    n, t = getattr(traffic, amount, None), getattr(timing, "median_us", None)
    return n / (t * scale) if _finite(n) and _finite(t) and t > 0 and n > 0 else None
