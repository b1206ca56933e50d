"""Other processes on the run's GPUs (dskbench.measure.sharing), where a run meets them.

- At the start of a run: each GPU's finding goes into the environment record (`shared_gpu`), and a GPU
  in use by another process gets a one-line warning on stderr naming it.
- After each case's measurement: a result timed while other processes used the GPU carries
  `shared_gpu: {pids, names}` (NVML asked at most every few seconds per worker).
- `dskbench run --exclusive` refuses to start on a GPU in use (or one it cannot check), and
  `--wait-exclusive S` waits up to S seconds for it to be free first.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from dskbench.measure.sharing import RUN_PID_ENV, Sharing, SharingWatch, gpu_sharing, run_pids

POLL_S = 5.0  # how often --wait-exclusive looks again

_watch: SharingWatch | None = None  # this worker's cached view of its GPU


def start_check(n_gpus: int, kind: str, stream: IO[str] | None = None) -> list[dict[str, Any]] | None:
    """Each GPU's finding for the environment record (None on a CPU run); a warning line per GPU in use
    by others. Marks this process as the run's root, so its workers know their siblings for ours."""
    if kind != "cuda":
        return None
    os.environ[RUN_PID_ENV] = str(os.getpid())
    ours = run_pids()
    found = [gpu_sharing(i, ours) for i in range(max(1, n_gpus))]
    for s in found:
        if s.shared:
            print(
                f"dskbench: warning: {s.describe()}; its timings are not this GPU's alone",
                file=stream or sys.stderr,
            )
    return [s.to_json() for s in found]


def record_fields(device: str, fresh: bool = False) -> dict[str, Any]:
    """`{"shared_gpu": {...}}` for a result measured now while other processes use the GPU, else {}.
    `fresh`: ask NVML now rather than take a finding of the last few seconds (a batch's start)."""
    global _watch
    if device != "cuda":
        return {}
    if _watch is None:
        _watch = SharingWatch()
    field = (_watch.refresh() if fresh else _watch.current()).record_field()
    return {"shared_gpu": field} if field else {}


def exclusive_problem(
    n_gpus: int,
    wait_s: float | None = None,
    *,
    stream: IO[str] | None = None,
    probe: Callable[[int], Sharing] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str | None:
    """None when no other process uses any of the run's GPUs; else why the run must not start. With
    `wait_s`, wait up to that long for them to leave, saying what it waits for whenever that changes."""
    probe = probe or (lambda i: gpu_sharing(i, run_pids()))
    deadline = clock() + (wait_s or 0.0)
    said: set[tuple[int, int]] | None = None
    while True:
        found = [probe(i) for i in range(max(1, n_gpus))]
        unknown = next((s for s in found if s.state == "unknown"), None)
        if unknown is not None:
            return f"--exclusive: {unknown.describe()}"
        busy = [s for s in found if s.shared]
        if not busy:
            return None
        what = "; ".join(s.describe() for s in busy)
        left = deadline - clock()
        if wait_s is None or left <= 0:
            return f"--exclusive: {what}" + (f" (still, after waiting {wait_s:g} s)" if wait_s else "")
        now = {(s.gpu, p.pid) for s in busy for p in s.others}
        if now != said:
            print(
                f"dskbench: waiting up to {left:.0f} s for the GPU to be free: {what}",
                file=stream or sys.stderr,
            )
            said = now
        sleep(min(POLL_S, left))
