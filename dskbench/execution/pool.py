"""The worker pool: slots (one per GPU, or one per build job) that run units of items, each in
watched worker processes (process.py), until the units run out or the run is interrupted.

Units come from each slot's own list (a sharded sweep: the cut is decided beforehand) or from one
shared queue (warm: whichever slot is free takes the next). A slot whose driver fails stops the
others; an interrupt (Ctrl-C, SIGTERM) kills every worker and starts no more.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dskbench.execution.items import WorkItem
from dskbench.execution.limits import CaseLimits
from dskbench.execution.process import WorkerProcess

JOIN_POLL_S = 0.2


@dataclass
class Slot:
    """Where workers run: their environment (a GPU's CUDA_VISIBLE_DEVICES), and what every plan they
    read carries besides its items (options, run seed, this GPU's ceilings)."""

    name: str
    plan: dict[str, Any]
    env: Mapping[str, str] | None = None
    units: list[list[WorkItem]] = field(default_factory=list)  # this slot's own units, in order


OnResult = Callable[[int, WorkItem, dict[str, Any]], None]


def clock_for(slot: Slot) -> Callable[[], float]:
    """The clock a slot's hang watch reads: monotonic seconds (tests put one they drive here)."""
    return time.monotonic


class Pool:
    def __init__(
        self,
        slots: Sequence[Slot],
        on_result: OnResult,
        limits: CaseLimits,
        shared: Sequence[list[WorkItem]] = (),
        admit: Callable[[WorkItem], bool] | None = None,
        on_drop: Callable[[WorkItem], None] | None = None,
        unit_plan: Callable[[list[WorkItem]], Mapping[str, Any]] | None = None,
    ):
        """admit: asked of each item when its unit is taken; an item it refuses is not run but given to
        on_drop (a build found pointless meanwhile), and a unit left empty takes no worker. unit_plan:
        keys a unit's worker plan takes over its slot's (a long build's niceness)."""
        self.slots, self.on_result, self.limits = list(slots), on_result, limits
        self.admit, self.on_drop, self.unit_plan = admit, on_drop, unit_plan
        self.shared: queue.Queue[list[WorkItem]] = queue.Queue()
        for unit in shared:
            self.shared.put(unit)
        self.stop = threading.Event()
        self._workers: set[WorkerProcess] = set()
        self._lock = threading.Lock()

    def _take(self, own: list[list[WorkItem]]) -> list[WorkItem] | None:
        if own:
            return own.pop(0)
        try:
            return self.shared.get_nowait()
        except queue.Empty:
            return None

    def _next_unit(self, own: list[list[WorkItem]]) -> list[WorkItem] | None:
        while (unit := self._take(own)) is not None:
            if self.admit is None:
                return unit
            kept: list[WorkItem] = []
            for it in unit:
                if self.admit(it):
                    kept.append(it)
                elif self.on_drop is not None:
                    self.on_drop(it)
            if kept:
                return kept
        return None

    def _drive(self, s: int) -> None:
        slot = self.slots[s]
        own = list(slot.units)
        label = f"{slot.name}: " if slot.name else ""
        clock = clock_for(slot)
        while not self.stop.is_set():
            unit = self._next_unit(own)
            if unit is None:
                return
            local = [dataclasses.replace(it, index=j) for j, it in enumerate(unit)]
            extra = self.unit_plan(unit) if self.unit_plan else {}
            plan = {**slot.plan, **extra, "items": [dataclasses.asdict(it) for it in local]}

            def record(item: WorkItem, fields: dict[str, Any], unit=unit) -> None:
                self.on_result(s, unit[item.index], fields)

            worker = WorkerProcess(plan, local, record, self.limits, slot.env, self.stop, clock, label=label)
            with self._lock:
                self._workers.add(worker)
            try:
                todo, solo = list(range(len(local))), set()
                while todo and not self.stop.is_set():
                    todo, solo = worker.run(todo, solo)
            finally:
                with self._lock:
                    self._workers.discard(worker)

    def run(self) -> None:
        """Drive every slot in its own thread; returns when all units are done. On an interrupt (or a
        slot's failure) every worker is killed and the exception re-raised here."""
        errors: list[BaseException] = []

        def body(s: int) -> None:
            try:
                self._drive(s)
            except BaseException as e:  # noqa: BLE001 - re-raised in the calling thread
                errors.append(e)
                self.stop.set()

        threads = [
            threading.Thread(target=body, args=(s,), name=f"dskbench-slot{s}", daemon=True)
            for s in range(len(self.slots))
        ]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(JOIN_POLL_S)
        except BaseException:
            self.stop.set()
            self.kill_all()
            for t in threads:
                t.join(10)
            raise
        if errors:
            raise errors[0]

    def kill_all(self) -> None:
        with self._lock:
            workers = list(self._workers)
        for w in workers:
            w.kill()
