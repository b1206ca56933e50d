"""One worker process, watched: its items' results as they come, and a case that hangs, crashes or
poisons the CUDA context lost alone (the next worker starts after it).

Protocol. The parent writes the plan as one JSON line on the worker's stdin and keeps stdin open;
the worker prints ``BEGIN i`` before item i, ``RESULT {json}`` when its record is ready, ``HELD i`` when
the case is prepared and waits to be timed with others, ``TIMING n`` when the n held cases are timed
together (their RESULTs follow), ``WAIT`` while it waits for a JIT build another process runs (a run
that builds ahead: each WAIT starts its limit again), and ``NEXT n`` when it ends on purpose. A worker whose stdin reaches
end-of-file exits at once: its parent is gone (killed, even with SIGKILL), and it must not go on
holding a GPU. Nothing is written to disk for a worker, so nothing is left behind on any exit path.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dskbench.device.procs import processes
from dskbench.execution.items import WorkItem
from dskbench.execution.limits import BUILD_GRACE_S, CASE_TIMED_OUT, CaseLimits

POLL_S = 0.2  # how often a waiting parent looks at the clock and the stop flag
BUILD_GAP_S = 30.0  # a build's compiler runs this far apart are one build (ninja steps, a lock handed over)
BUILD_SCAN_S = 5.0  # how often a case's worker groups are looked at for compilers before its limit
EXIT_POISONED = 3
EXIT_ORPHANED = 4
WORKER_MODULE = "dskbench.execution.worker"

Record = Callable[[WorkItem, dict[str, Any]], None]


def signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


_EXC_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b:?.*)$")


def last_words(stderr: str) -> str:
    """The line of a dead worker's stderr that says what happened: a CUDA error's own text when there
    is one (it is followed by advice lines that say nothing about this case), else the last exception
    line, else the last few lines."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        m = re.search(r"CUDA error: .*", ln)
        if m:
            return m.group(0)[:500]
    for ln in reversed(lines):
        m = _EXC_LINE.match(ln)
        if m:
            return m.group(1)[:500]
    return " | ".join(lines[-3:])[-500:]


def death_reason(code: int | None, stderr: str, who: str = "worker process") -> str:
    """Why `who` ended before the case's result: its exit code or signal, and its last words."""
    how = f"killed by {signal_name(-code)}" if code is not None and code < 0 else f"exit code {code}"
    words = last_words(stderr)
    return f"{who} died ({how}) while running this case" + (f": {words}" if words else "")


def _live_processes(proc_dir: str) -> list[tuple[int, list[str]]]:
    """(pid, the stat fields after the command name: state, ppid, pgrp, ...) of every live process."""
    return [(p.pid, p.fields) for p in processes(proc_dir) if p.live]


def compiling(pgids: int | Iterable[int], proc_dir: str = "/proc") -> bool:
    """Whether any of these workers' process groups holds another process: a compiler (nvcc, ninja,
    ptxas) that a JIT build started. A hung kernel starts none, so a build is not mistaken for a hang."""
    groups = {pgids} if isinstance(pgids, int) else set(pgids)
    names = {str(g) for g in groups}
    return any(pid not in groups and fields[2] in names for pid, fields in _live_processes(proc_dir))


class BuildWatch:
    """Whether a case past its limit is excused by a JIT build. A build is not one unbroken compiler run:
    between ninja's steps, or when one worker hands a build lock to the next, no compiler runs for a
    moment. So a case is excused while a compiler runs now or ran less than BUILD_GAP_S ago (looked for
    every BUILD_SCAN_S before the limit, at every poll after it), for at most `grace` seconds past the
    limit (the case's CaseLimits.build_grace).
    """

    def __init__(self, compiling_now: Callable[[], bool], grace: float = BUILD_GRACE_S) -> None:
        self.compiling_now = compiling_now
        self.grace = grace
        self.last_build: float | None = None
        self.last_scan: float | None = None
        self.used = False  # whether the current case went past its limit on a build

    def begin(self, grace: float = BUILD_GRACE_S) -> None:
        self.grace = grace
        self.last_build = self.last_scan = None
        self.used = False

    def look(self, now: float) -> None:
        """Before the limit: note a build now and then."""
        if self.last_scan is None or now - self.last_scan >= BUILD_SCAN_S:
            self.last_scan = now
            if self.compiling_now():
                self.last_build = now

    def excused(self, now: float, over: float) -> bool:
        """Past the limit by `over` seconds: may the case go on?"""
        if over >= self.grace:
            return False
        if self.compiling_now():
            self.last_build = now
            self.used = True
            return True
        excused = self.last_build is not None and now - self.last_build < BUILD_GAP_S
        self.used = self.used or excused
        return excused


_running: set[int] = set()  # process groups of this process's live workers (every slot of a run)
_running_lock = threading.Lock()


def running_groups() -> set[int]:
    """The process groups of every worker this process runs now. A worker that waits for another's JIT
    build (a build lock: FlashInfer, Triton and tvm-ffi caches are shared) starts no compiler itself,
    so a build anywhere among them excuses them all."""
    with _running_lock:
        return set(_running)


def child_pids(pid: int, proc_dir: str = "/proc") -> list[int]:
    """The live children of `pid`: a launcher's workers that lead process groups of their own (torchrun
    starts each rank in its own session), which a kill of the launcher's group does not reach."""
    return sorted(p for p, fields in _live_processes(proc_dir) if fields[1] == str(pid))


def kill_group(pid: int) -> None:
    """Kill the process group `pid` leads (a worker started with start_new_session, and whatever it
    started: compilers); the process alone if it leads none. Gone already: nothing to do."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@dataclass
class Progress:
    """What the parent knows of a worker's items while it runs."""

    current: int | None = None  # being prepared (or timed alone)
    held: set[int] = field(default_factory=set)  # prepared, waiting for their batch
    timing: bool = False  # the held cases are being timed together
    done: set[int] = field(default_factory=set)  # recorded
    finished: bool = False  # the worker said NEXT: it ended on purpose
    timed_out: str | None = None


class WorkerProcess:
    """Runs some items of one plan in a fresh worker; `run` returns what is left to run."""

    def __init__(
        self,
        plan: dict[str, Any],
        items: list[WorkItem],
        record: Record,
        limits: CaseLimits,
        env: Mapping[str, str] | None = None,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        label: str = "",
    ):
        self.plan, self.items, self.record, self.limits = plan, items, record, limits
        self.env, self.stop, self.clock, self.label = env, stop or threading.Event(), clock, label
        self.proc: subprocess.Popen | None = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_group(self.proc.pid)

    def run(self, todo: list[int], solo: set[int] | None = None) -> tuple[list[int], set[int]]:
        """Run the items `todo` (indices) in a fresh worker, those in `solo` timed alone. Returns the
        items still to run and the solo set for the next worker: after a crash or hang in a case, that
        case is recorded as an error and dropped; after one while a batch was timed, the batch's cases
        are run again, each alone, so that the next failure names its own case."""
        solo = set(solo or ())
        cmd = [sys.executable, "-m", WORKER_MODULE]
        lines: queue.Queue[str | None] = queue.Queue()
        plan = {**self.plan, "todo": list(todo), "solo": sorted(solo)}
        with tempfile.TemporaryFile(mode="w+") as err:
            self.proc = proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                bufsize=1,
                env=None if self.env is None else dict(self.env),
                start_new_session=True,  # its own process group: a kill reaches its compilers too
            )
            with _running_lock:
                _running.add(proc.pid)
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(json.dumps(plan, default=str) + "\n")
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass  # it died before reading: its exit code and stderr say why
            reader = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
            reader.start()
            st = Progress()
            try:
                self._follow(proc, lines, st)
            finally:
                self.kill()
                code = proc.wait()
                with _running_lock:
                    _running.discard(proc.pid)
                reader.join(5)
                try:
                    proc.stdin.close()
                except OSError:
                    pass
            if self.stop.is_set():
                return [], solo  # interrupted: the caller stops; a killed case is not a result
            left = [i for i in todo if i not in st.done]
            if st.finished or not left:
                return left, solo
            if st.current is not None:
                blamed = st.current
            elif st.timing:
                return left, solo | st.held  # the batch's cases again, each alone (solo only grows)
            elif st.done or code == EXIT_POISONED:
                blamed = None  # it ended between cases, after progress: the next was never begun
            else:
                blamed = left[0]
            if blamed is None:
                return left, solo
            err.seek(0)
            reason = st.timed_out or death_reason(code, err.read())
        item = self.items[blamed]
        self.record(item, {**item.identity(), "status": "error", "reason": reason[:2000]})
        return [i for i in left if i != blamed], solo

    def _follow(self, proc, lines, st: Progress) -> None:
        """Read the protocol until the worker ends; kill it when its current case (or batch) runs past
        its limit."""
        first_use: set[tuple[str, str, Any]] = set()
        limit = self.limits.startup_s
        deadline = None if self.limits.off else self.clock() + limit
        builds = BuildWatch(lambda: compiling(running_groups() | {proc.pid}))

        def set_limit(seconds: float) -> None:
            nonlocal limit, deadline
            limit = seconds
            deadline = None if self.limits.off else self.clock() + limit

        while True:
            try:
                line = lines.get(timeout=POLL_S)
            except queue.Empty:
                now = self.clock()
                if self.stop.is_set():
                    self.kill()
                elif deadline is not None and st.timed_out is None and now <= deadline:
                    builds.look(now)
                elif deadline is not None and st.timed_out is None:
                    if builds.excused(now, now - deadline):
                        continue  # a JIT build: its time is not the kernel's
                    st.timed_out = self._timed_out(st, limit, builds)
                    print(f"dskbench: {self.label}{st.timed_out}", file=sys.stderr, flush=True)
                    self.kill()
                continue
            if line is None:
                return
            kind, _, payload = line.rstrip("\n").partition(" ")
            if kind == "BEGIN":
                st.current = int(payload)
                it = self.items[st.current]
                key = (it.kernel, it.backend, it.case.get("variant"))
                set_limit(self.limits.for_item(it, key not in first_use))
                first_use.add(key)
                builds.begin(self.limits.build_grace(it))
            elif kind == "HELD":
                st.held.add(int(payload))
                st.current = None
                set_limit(self.limits.startup_s)
            elif kind == "TIMING":
                st.timing = True
                held = [self.items[i] for i in sorted(st.held)]
                set_limit(self.limits.startup_s + sum(self.limits.for_item(it, False) for it in held))
                builds.begin()
            elif kind == "RESULT":
                data = json.loads(payload)
                index = data["index"]
                self.record(self.items[index], data["fields"])
                st.done.add(index)
                st.held.discard(index)
                if st.current == index:
                    st.current = None
                if st.timing and not st.held:
                    st.timing = False
                if st.current is None and not st.timing:
                    set_limit(self.limits.startup_s)  # clean-up until the next BEGIN
            elif kind == "WAIT":
                set_limit(self.limits.startup_s)  # alive, between cases
            elif kind == "NEXT":
                st.finished = True

    def _timed_out(self, st: Progress, limit: float, builds: BuildWatch) -> str:
        if st.current is None and st.timing:
            return f"timed out: a batch of {len(st.held)} cases gave no result within {limit:.0f} s; the worker was killed"
        if st.current is None:
            return f"timed out: the worker gave no sign of life within {limit:.0f} s and was killed"
        built = (
            f", and its JIT build went on {builds.grace:.0f} s past that (the build grace)"
            if builds.used
            else ""
        )
        return f"{CASE_TIMED_OUT} {limit:.0f} s ({self.limits.describe()}){built}; the worker was killed"


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)
