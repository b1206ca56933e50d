"""What the engine runs: a work item (kernel x case x backend) and the options of a run."""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from typing import Any

from dskbench.results.records import BackendInfo, Identity
from dskbench.shapes.cases import Case

MODES = ("cold", "hot", "rotate")


@dataclass(frozen=True)
class WorkItem:
    index: int
    kernel: str
    backend: str
    case: dict[str, Any]
    category: str | None = None
    # False: run once unchecked (no torch reference): a warm-up's later shapes of a backend that compiles
    # per shape, which build its kernel again and have nothing new to check before the sweep does
    checked: bool = True
    # the JIT build this item waits for in a run that builds ahead (execution/build_ahead.py): measured
    # once that build is done; None: nothing to wait for
    build: str | None = None

    @property
    def case_id(self) -> str:
        return Case.from_json(self.case).id

    def record_identity(self) -> Identity:
        """What names this item in every record, whatever happened to it."""
        c = self.case
        return Identity(
            self.case_id,
            self.kernel,
            self.category,
            c["op"],
            c.get("variant"),
            c["phase"],
            c["point"],
            c["dims"],
        )

    def identity(self) -> dict[str, Any]:
        """The record fields of record_identity, with the backend's name."""
        return {**self.record_identity().to_json(), "backend": BackendInfo(self.backend).to_json()}


# Tensor-parallel degrees a default sweep measures: DeepSeek-R1-NVFP4 is served at TP 4 or 8, and the
# per-rank shapes of each degree run on one GPU (tp 1 is the unsharded reference).
DEFAULT_TP: tuple[int, ...] = (1, 4, 8)


@dataclass
class SweepOptions:
    """How a run measures: what its workers are told and what its results file records as `settings`
    (which cases run is RunConfig's selection, dskbench.execution.config)."""

    device: str = "cuda"  # "cuda" or "cpu"
    phases: tuple[str, ...] = ("decode", "prefill")
    profile: str = "full"  # full | quick | cpu
    tp: tuple[int, ...] = DEFAULT_TP  # of these, a profile measures the degrees it sweeps
    mode: str = "cold"
    flush: str = "write"  # cold mode's L2 flush: "write" (zero_) or "read" (MeasureSettings.flush_kind)
    seed: int | None = None  # None: fresh inputs every run
    isolate: bool = True
    budget_s: float | None = None  # per-case time budget override
    min_time_s: float | None = None  # per-case minimum sampling time override
    stopping: str = "median-ci"  # the stopping policy (dskbench.measure.stopping)
    measure_ceilings: bool = True
    batch: bool = True  # cold cases sampled together, timed by CUPTI (execution/batching.py)
    cross_check: bool = True  # each case read briefly by the other timer too (measure/cross_check.py)
    dedupe: bool = True  # measure twins once, their records copy it (dskbench.execution.twins)
    gpus: int = (
        1  # >1: shard the items over this many GPUs, one worker process each (dskbench/execution/shard.py)
    )
    host_gpus: int | None = None  # GPUs of the host when a worker sees only its own (multi-GPU gating)
    warm_only: bool = False  # prepare (build, first launch, check) but time nothing: dskbench warm
    build_ahead: bool = False  # build the JIT modules in worker processes beside the measuring one
    build_jobs: int | None = None  # those builders; None: by the cores (warm.default_jobs)
    # with build_ahead: builds recorded as taking this many seconds or more are left out and their cases
    # recorded skipped (execution/build_ahead.py: deferred); None: every build is made
    defer_builds_over_s: float | None = None
    costs_from: tuple[str, ...] = ()  # results files whose item times cut a sharded sweep (shard.py)
    case_timeout_s: float | None = None  # hang limit per case; None: scaled from its expected time; 0: off
    first_use_allowance_s: float | None = None  # added on a first use; None: 120 s unless case_timeout_s
    no_multicast: bool = False  # NVLink multicast off in the workers (environment.NO_MULTICAST_ENV)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SweepOptions:
        """The options as a worker reads them back from its plan (lists become tuples again)."""
        d = dict(d)
        for k in ("phases", "tp", "costs_from"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)


def case_seed(run_seed: int, case_id: str) -> int:
    """The inputs' seed of one case: the same for all its backends, so they run on equal inputs and its
    torch reference is computed once for all of them (execution/reference_cache.py)."""
    return (run_seed + zlib.crc32(case_id.encode())) % 2**31


def sweep_seed(opts: SweepOptions) -> int:
    """The run's input seed: --seed, or a fresh one (recorded with the run either way)."""
    return opts.seed if opts.seed is not None else int.from_bytes(os.urandom(4), "little") % 2**31


class PlanError(ValueError):
    """A sweep request that names something that does not exist."""
