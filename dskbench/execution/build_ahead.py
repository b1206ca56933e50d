"""A run that builds its JIT modules while it measures (`dskbench run --build-ahead`).

Why: on a fresh box a few builds (Marlin's, FlashInfer's top-k transforms) take ten minutes or more, and a
warm-up before the sweep makes the box's first run the sum of the longest build and the measuring. Here
the run starts `dskbench warm`'s builders (warm.py: one item per build, longest builds first, many
processes) beside its measuring worker, and the measuring worker takes the cases whose build is done
first: the first run takes about the longer of the two.

How the two sides meet:

* The parent gives each item the key of the build it waits for (`WorkItem.build`, warm.build_key) and
  appends each key to a file as its builder finishes it (whatever the outcome: a failed build is the
  measuring worker's to meet and record), then "*" when no builder is left.
* The measuring worker (worker.py) goes through its items in plan order but skips, for now, those whose
  build is not done (`build_order`); with nothing ready it times the cases it holds, says WAIT (the
  parent's hang watch sees it alive) and looks again.
* The builders share the GPU with the measuring worker, so a GPU lock (gpu_lock.py) keeps the bulk of
  their GPU work out of its sampling: the measuring worker holds it while it samples, a builder while it
  makes inputs. What may compile (bind, first launch) runs without it. Builds run their items
  unchecked: the sweep checks every case itself.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dskbench.adapters.backends import UNAVAILABLE
from dskbench.device.info import DeviceInfo
from dskbench.execution.build_memory import BuildMemory
from dskbench.execution.build_times import deferred_builds, packaged_build_times
from dskbench.execution.gpu_lock import LOCK_ENV
from dskbench.execution.items import SweepOptions, WorkItem

ALL_DONE = "*"  # the ready file's last line: no builder is left
POLL_S = 0.5  # how often a measuring worker with nothing ready looks at the ready file again
READY_KEY = "builds_ready"  # the worker plan's key: the ready file's path


class ReadyFile:
    """The measuring worker's view of the builds done: the parent's ready file, read again when it grows."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.done: set[str] = set()
        self.all_done = False
        self._size = -1

    def refresh(self) -> None:
        try:
            size = self.path.stat().st_size
        except OSError:
            return
        if size == self._size:
            return
        self._size = size
        lines = self.path.read_text(encoding="utf-8").splitlines()
        self.done.update(lines)
        self.all_done = ALL_DONE in self.done

    def ready(self, key: str | None) -> bool:
        return key is None or self.all_done or key in self.done


def build_order(
    todo: Sequence[int],
    items: Sequence[WorkItem],
    ready: ReadyFile,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[int | None]:
    """The item indices of `todo`, in plan order among those whose build is done. None when none is: the
    caller times what it holds and says it waits; then, after POLL_S, the file is read again."""
    pending = list(todo)
    while pending:
        ready.refresh()
        for j, idx in enumerate(pending):
            if ready.ready(items[idx].build):
                del pending[j]
                yield idx
                break
        else:
            yield None
            sleep(POLL_S)


def with_builds(items: Sequence[WorkItem], keys: Sequence[str]) -> list[WorkItem]:
    """The items, each naming the build it waits for."""
    return [dataclasses.replace(it, build=k) for it, k in zip(items, keys, strict=True)]


class Builder:
    """The builders of a run: `dskbench warm`'s pool in a thread of the parent, writing the ready file.

    Use: `b = Builder(...)`, give the measuring workers `b.plan_extra()` and `b.env_for(token)`, then
    `b.start()` once the run's own start-up GPU work (ceilings) is done, and `b.stop()` at its end."""

    def __init__(
        self,
        items: Sequence[WorkItem],
        opts: SweepOptions,
        gpu_tokens: Sequence[str] | None,
        jobs: int | None = None,
        build_s: dict[tuple[str, str], float] | None = None,
        per_shape: Callable[[str, str], bool] | None = None,
        memory: BuildMemory | None = None,
        device: DeviceInfo | None = None,
    ) -> None:
        from dskbench.device.info import usable_cores
        from dskbench.execution import warm

        keys = warm.build_keys(items, per_shape) if per_shape else warm.build_keys(items)
        self.items = with_builds(items, keys)
        # a build the run's device skips (architecture, GPU count, memory) is no build: the measuring
        # worker records those cases as skipped at once
        gated = warm.gated_here(device) if device is not None else (lambda _it: None)
        picked = warm.warm_items(self.items, per_shape or warm.builds_per_shape, warm.skipped_or_gated(gated))
        # the builds this box has done before for its GPU and stack are ready from the start
        self.memory = (
            memory if memory is not None else (BuildMemory.here() if opts.device == "cuda" else None)
        )
        known = self.memory.known(it.build or "" for it in picked) if self.memory else set()
        self.already = len(known)
        no_build = {it.build or "" for it in picked if gated(it)}
        self.gated = len(no_build - known)
        known |= no_build
        # builds of a backend whose package this install lacks: no builder is started to find that out
        absent = {it.build or "" for it in picked if _not_installed(it.kernel, it.backend)} - known
        known |= absent
        # every build unchecked: the measuring worker checks each case before it times it
        self.picked = [dataclasses.replace(it, checked=False) for it in picked if it.build not in known]
        self.build_s = build_s if build_s is not None else packaged_build_times()
        # builds too long for this run (--defer-builds-over): not made; their cases recorded skipped
        self.deferred_why = deferred_builds(self.picked, self.build_s, opts.defer_builds_over_s)
        self.picked = [it for it in self.picked if it.build not in self.deferred_why]
        self.deferred = [it for it in self.items if it.build in self.deferred_why]
        self.items = [it for it in self.items if it.build not in self.deferred_why]
        # (kernel, backend)s found missing from this install by a build: their other builds are dropped
        self.unavailable: set[tuple[str, str]] = set()
        self.dropped = len(absent)
        self.opts, self.tokens = opts, list(gpu_tokens or [])
        # one core for the measuring worker, half the rest for builds (warm.default_jobs)
        self.jobs = jobs or warm.default_jobs(max(1, usable_cores() - 2))
        self.jobs = max(1, min(self.jobs, len(warm.build_units(self.picked))))
        self.folder = Path(tempfile.mkdtemp(prefix="dskbench-builds-"))
        self.ready_path = self.folder / "ready"
        self.ready_path.write_text("".join(f"{k}\n" for k in sorted(known)), encoding="utf-8")
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pool: Any = None
        self._t0 = time.monotonic()  # reset by start(): the builds' clock in their log lines
        self._ended: float | None = None
        self.results: list[Any] = []
        self.failure: BaseException | None = None
        if not self.tokens:  # one GPU, this process's: every worker it starts inherits the lock's name
            os.environ.update(self.env_for(None))

    def deferred_records(self) -> list[tuple[WorkItem, dict[str, Any]]]:
        """Each case of a deferred build with its record fields: skipped, and why."""
        return [
            (
                it,
                {
                    **it.identity(),
                    "category": it.category,
                    "status": "skipped",
                    "reason": self.deferred_why[it.build],
                },
            )
            for it in self.deferred
            if it.build
        ]

    def plan_extra(self) -> dict[str, Any]:
        return {READY_KEY: str(self.ready_path)}

    def env_for(self, token: str | None) -> dict[str, str]:
        """The GPU lock's variable for a worker on GPU `token` (None: the one GPU of the run)."""
        return {LOCK_ENV: str(self.folder / f"gpu-{token or 'only'}.lock")}

    def _mark(self, key: str) -> None:
        with self._lock, self.ready_path.open("a", encoding="utf-8") as fh:
            fh.write(key + "\n")

    def _done(self, item: WorkItem, fields: dict[str, Any]) -> None:
        from dskbench.execution import warm

        r = warm.warm_result(item, fields)
        self.results.append(r)
        print(build_line(r, time.monotonic() - self._t0), file=sys.stderr, flush=True)
        if self.memory is not None:
            self.memory.add(item.build or "", r.status)
        if r.status == "skipped" and str(r.reason or "").startswith(UNAVAILABLE):
            self.unavailable.add((item.kernel, item.backend))  # every other case of it would say the same
        self._mark(item.build or "")

    def _admit(self, item: WorkItem) -> bool:
        return (item.kernel, item.backend) not in self.unavailable

    def _drop(self, item: WorkItem) -> None:
        """A build left out (its backend is missing here): its cases are the measuring worker's to skip."""
        self.dropped += 1
        self._mark(item.build or "")

    def start(self) -> None:
        from dskbench.execution import warm

        self._t0 = time.monotonic()
        if not self.picked:  # every build done before on this box
            self._mark(ALL_DONE)
            return
        env_for = self.env_for if self.tokens else None
        self._pool = warm.warm_pool(
            self.picked,
            self.opts,
            self.jobs,
            self._done,
            self.tokens or None,
            self.build_s,
            env_for,
            admit=self._admit,
            on_drop=self._drop,
        )

        def body() -> None:
            try:
                self._pool.run()
            except BaseException as e:  # noqa: BLE001 - the measuring goes on without builders
                self.failure = e
            finally:
                self._mark(ALL_DONE)

        self._thread = threading.Thread(target=body, name="dskbench-builds", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the builders (a run that ends first kills those left) and remove the folder."""
        self._ended = time.monotonic()
        if self._pool is not None:
            self._pool.stop.set()
            self._pool.kill_all()
        if self._thread is not None:
            self._thread.join(30)
        if not self.tokens:
            os.environ.pop(LOCK_ENV, None)
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.memory is not None:
            self.memory.save()

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for r in self.results:
            counts[r.status] = counts.get(r.status, 0) + 1
        longest = max((r.build_s or 0.0 for r in self.results), default=0.0)
        parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        already = f"; {self.already} built before on this box" if self.already else ""
        already += f"; {self.gated} not for this GPU" if self.gated else ""
        already += f"; {self.dropped} left out (backend not installed)" if self.dropped else ""
        already += deferred_text(self.deferred_why, self.deferred)
        if not self.picked:
            return f"built ahead: nothing to build{already}"
        forgotten = self.memory.why_forgotten if self.memory is not None else None
        wall = (self._ended or time.monotonic()) - self._t0
        return (
            f"built ahead: {len(self.results)} of {len(self.picked)} builds ({parts}) in {self.jobs} jobs; "
            f"longest {longest:.0f} s{busy_text(self.results, self.jobs, wall)}{already}"
            + (f" (builds not remembered: {forgotten})" if forgotten else "")
        )


@functools.cache
def _not_installed(kernel: str, backend: str) -> bool:
    from dskbench.adapters.backends import absent_package
    from dskbench.execution.warm import adapter_and_backend

    b = adapter_and_backend(kernel, backend)[1]
    return b is not None and absent_package(b) is not None


def deferred_text(why: dict[str, str], cases: Sequence[WorkItem]) -> str:
    """'; N builds deferred (K cases skipped: kernel · backend, ...)' for the run's last line, or ''."""
    if not why:
        return ""
    names = ", ".join(sorted({f"{it.kernel} · {it.backend}" for it in cases}))
    return f"; {len(why)} builds deferred ({len(cases)} cases skipped: {names})"


def busy_text(results: Sequence[Any], jobs: int, wall_s: float) -> str:
    """'; N% of J x W s in build items': how much of the builders' time went to items (the rest: process
    starts, imports, waiting for work). Empty when there is nothing to say."""
    spent = sum(r.item_s or 0.0 for r in results)
    if wall_s <= 0 or jobs <= 0 or not spent:
        return ""
    return f"; {100 * spent / (jobs * wall_s):.0f}% of {jobs} x {wall_s:.0f} s in build items"


def build_line(r: Any, at_s: float) -> str:
    """One finished build for the run's log: its status, the compile (bind and first launch), the whole
    item (a builder's process start is not in it) and when it ended on the builds' clock. Summed over a
    run, the item seconds against jobs x wall say how busy the builders were."""
    took = f"{r.build_s:7.1f} s" if r.build_s is not None else " " * 9
    item = f"item {r.item_s:6.1f} s" if r.item_s is not None else " " * 13
    return f"build: {r.status:7} {took}  {r.kernel} · {r.backend}  ({item}{_most(r)}, at {at_s:6.0f} s)"


def _most(r: Any) -> str:
    """', most in STAGE N s' when a stage other than the build's own took most of a long item."""
    parts = {k: v for k, v in r.stages.items() if k not in ("item_s", "bind_s", "first_launch_s")}
    if not parts or r.item_s is None or r.item_s < 5.0:
        return ""
    name, secs = max(parts.items(), key=lambda kv: kv[1])
    return f", most in {name.removesuffix('_s')} {secs:.1f} s" if secs > (r.build_s or 0.0) else ""


def start_builder(
    items: list[WorkItem], opts: SweepOptions, tokens: list[str] | None, device: DeviceInfo | None = None
) -> Builder | None:
    """The run's builders when it builds ahead, not started yet; else None. device: the GPU the cases
    are gated for (builds it skips are left out). An in-process run (--no-isolate) builds as it goes."""
    if not (opts.build_ahead and opts.isolate and items):
        return None
    return Builder(items, opts, tokens, opts.build_jobs, device=device)


@contextmanager
def building(builder: Builder | None) -> Iterator[None]:
    """The builders running for the block (none: nothing), stopped at its end on every path."""
    if builder is None:
        yield
        return
    try:
        builder.start()
        yield
    finally:
        builder.stop()
        print(f"dskbench: {builder.summary()}", file=sys.stderr)
