"""A sweep's execution, whatever the front end: open the results file, write the environment record,
run the items through the pool (or in this process for debugging), record each result as it finishes.

The single-GPU sweep (runner.run_sweep), the sharded one (shard.run_sharded), and through them the asv
and pytest-benchmark suites all end here; `dskbench warm` uses the same pool and worker protocol. The
collective benchmarks (`dskbench comm`: one process per GPU under torchrun, not a pool) record
through the same `recording`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dskbench.device.info import DeviceInfo
from dskbench.execution.build_times import packaged_build_times
from dskbench.execution.case import measure_settings, run_one
from dskbench.execution.cost import item_cost
from dskbench.execution.items import SweepOptions, WorkItem
from dskbench.execution.limits import CaseLimits, first_use_allowance, timeout_from_env
from dskbench.execution.pool import Pool, Slot
from dskbench.execution.selection import repro_command
from dskbench.results.io import ResultsWriter, environment_record
from dskbench.results.records import STATUSES, ResultRecord


@dataclass
class SweepSummary:
    out: Path
    counts: Counter
    wall_s: float
    items: int

    def line(self) -> str:
        parts = ", ".join(f"{k} {self.counts.get(k, 0)}" for k in STATUSES)
        return f"{self.items} cases: {parts} in {self.wall_s:.1f} s -> {self.out}"


class Recorder:
    """The one writer of a sweep's result records: thread-safe, so that the workers of several GPUs
    record through it as their cases finish. Counts statuses and reports progress."""

    def __init__(
        self,
        writer: ResultsWriter,
        run_id: str,
        progress: Any = None,
        copies: dict[int, list[WorkItem]] | None = None,
        settings: dict[str, Any] | None = None,
    ):
        self.writer, self.run_id, self.progress = writer, run_id, progress
        self.copies = copies or {}  # item index -> items whose records copy its result (twins.measure_once)
        self.settings = (
            settings  # the run's settings: each record's repro command (dskbench.execution.selection)
        )
        self.counts: Counter = Counter()
        self.closed = False  # set once the sweep ends (an interrupted worker may still report)
        self._lock = threading.Lock()

    def close(self) -> None:
        """No record after this one: a report still in flight is written whole first, later ones are
        dropped (a dying worker's, a watchdog's), so the file can be closed under them."""
        with self._lock:
            self.closed = True

    def skip(self, s: dict[str, Any]) -> None:
        """A kernel skipped at planning: its name, no backend ('-'), the reason."""
        with self._lock:
            if self.closed:
                return
            rec = ResultRecord.from_json(
                {"backend": {"name": "-"}, **s, "run_id": self.run_id, "status": "skipped"}
            )
            self.writer.write(rec.with_(repro=self._repro(s)))
            self.counts["skipped"] += 1

    def __call__(self, item: WorkItem, fields: dict[str, Any], **extra: Any) -> None:
        fields = {**fields, **extra}
        fields.pop("poisoned", None)
        with self._lock:
            if self.closed:
                return
            fields.setdefault("finished", round(time.time(), 3))  # unix seconds: sweep rate, wall per GPU
            rec = ResultRecord.from_json(
                {**fields, "run_id": self.run_id, "index": item.index, "repro": self._repro(item.identity())}
            ).validate_complete()
            self._write(item, rec)
            for twin in self.copies.get(item.index, ()):
                # the twin's own identity (another kernel's, for a cross-kernel twin), the measurement's rest
                own = twin.record_identity()
                ident = dataclasses.replace(rec.identity, **{k: getattr(own, k) for k in own.KEYS})
                repro = self._repro(twin.identity())
                self._write(
                    twin, rec.with_(identity=ident, index=twin.index, repro=repro, shared_with=item.case_id)
                )

    def _write(self, item: WorkItem, rec: ResultRecord) -> None:
        fields = rec.to_json()
        self.writer.write(fields)
        self.counts[rec.status] += 1
        if self.progress:
            self.progress(item, rec.status, fields)

    def _repro(self, identity: dict[str, Any]) -> str | None:
        return repro_command(identity, self.settings) or None


@contextmanager
def recording(
    out: Path,
    environment: dict[str, Any],
    progress: Any = None,
    copies: dict[int, list[WorkItem]] | None = None,
    repro: bool = False,
) -> Iterator[Recorder]:
    """A run's records: open the results file (append-safe), write the run's environment record
    (`environment` holds its run_id), and give the Recorder every result goes through. On every exit
    path the Recorder is closed before the file. The sweep (execute) and the collective benchmarks'
    rank 0 (`dskbench comm`) record through it. With `repro` (a `dskbench run` sweep) each record
    gets the command line that selects its case again, from the run's settings."""
    with ResultsWriter(out) as w:
        w.write(environment_record(**environment))
        record = Recorder(
            w, environment["run_id"], progress, copies, environment["settings"] if repro else None
        )
        try:
            yield record
        finally:
            record.close()


def case_limits(
    opts: SweepOptions, device: DeviceInfo, build_s: Mapping[tuple[str, str], float] | None = None
) -> CaseLimits:
    """The hang limits of a run: --case-timeout / DSKBENCH_CASE_TIMEOUT_S, else scaled per case; a first
    use's allowance as --first-use-allowance asks (limits.first_use_allowance); a build's grace from
    `build_s` (a warm-up's --build-times) where it names the build, else the seconds shipped with dskbench."""
    flat = opts.case_timeout_s if opts.case_timeout_s is not None else timeout_from_env()
    budget = measure_settings(opts).max_time_s
    shipped, given = packaged_build_times(), build_s or {}
    return CaseLimits(
        expected_s=lambda it: item_cost(it, device, budget),
        flat_s=flat,
        first_use_s=first_use_allowance(flat, opts.first_use_allowance_s),
        build_s=lambda it: given.get((it.kernel, it.backend)) or shipped.get((it.kernel, it.backend), 0.0),
    )


def worker_plan(opts: SweepOptions, run_seed: int, ceilings: Any) -> dict[str, Any]:
    """What every worker's plan carries besides its items."""
    return {"opts": dataclasses.asdict(opts), "run_seed": run_seed, "ceilings": ceilings}


def execute(
    out: Path,
    environment: dict[str, Any],
    skips: Sequence[dict[str, Any]],
    slots: Sequence[Slot],
    limits: CaseLimits,
    copies: dict[int, list[WorkItem]],
    progress: Any = None,
    in_process: Callable[[Callable[[WorkItem, dict[str, Any]], None]], None] | None = None,
    tag: Callable[[int], dict[str, Any]] = lambda s: {},
    settled: Sequence[tuple[WorkItem, dict[str, Any]]] = (),
) -> SweepSummary:
    """Write the environment record, the planning skips, the items `settled` before running (their
    record fields: a deferred build's cases), then every item's record as it finishes.

    `slots` hold the units to run (the pool's); `in_process` instead runs them here, no isolation
    (debugging). `tag(s)` adds fields to the records of slot s (a sharded sweep's gpu_index). On an
    interrupt the records written stay, later reports from dying workers are dropped, and the
    exception goes on to the caller."""
    t0 = time.monotonic()
    n_items = environment.get("settings", {}).get("items", 0)
    with recording(out, environment, progress, copies, repro=True) as record:
        for s in skips:
            record.skip(s)
        for item, fields in settled:
            record(item, fields)
        if in_process is not None:
            in_process(record)
        else:
            pool = Pool(slots, lambda s, it, f: record(it, f, **tag(s)), limits)
            pool.run()
    return SweepSummary(out, record.counts, time.monotonic() - t0, n_items + len(skips))


def run_in_process(
    items: Sequence[WorkItem], device: DeviceInfo, opts: SweepOptions, run_seed: int, ceilings: Any
) -> Callable[[Callable[[WorkItem, dict[str, Any]], None]], None]:
    """The items run one after another in this process: no crash isolation, no hang watch (the
    --no-isolate debugging mode)."""

    def go(record: Callable[[WorkItem, dict[str, Any]], None]) -> None:
        for item in items:
            record(item, run_one(item, device, opts, run_seed, ceilings))

    return go


def interrupted_message(out: Path, signame: str) -> str:
    return (
        f"dskbench: interrupted ({signame}); every finished case is in {out} "
        f"(continue with --out {out} --resume)"
    )
