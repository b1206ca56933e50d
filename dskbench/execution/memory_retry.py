"""A case that runs out of GPU memory beside other processes of its run is run once more.

Builders share the measuring worker's GPU and hold their own inputs while they compile, so a large case
(a 36 GiB KV cache) can find the GPU full of theirs. The measuring worker runs it again holding the GPU
lock: no builder makes new inputs meanwhile, and those they hold are freed as their items end.

A builder (`run --build-ahead`, or one of `dskbench warm`'s jobs sharing a GPU) waits without the lock
and runs its case again without it. The memory it lacks may be the measuring worker's, which needs the
lock to finish the cases it holds and free them: a builder that waited holding the lock would stop the
measuring until its wait ran out. A builder's second try may find the memory taken again; its build is
then an error, and the measured case builds in its own first launch, which is never timed."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from typing import Any

from dskbench.execution import gpu_lock

MEMORY_WAIT_S = 300.0  # the longest a case short of memory beside builders waits for them to free it
# GPU memory outside this process's pool that no wait frees: CUDA contexts (its own, 0.75 GiB in a worker
# on an H100; another process's, 1 GiB with torch's state). A case that lacks no more
# than others hold beyond this is too large here: without it, a 32 GiB allocation 1.6 GiB short waited
# the full limit for contexts that are never freed.
CONTEXTS_BYTES = 2 * 2**30
_ALLOCATION = re.compile(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)")
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def out_of_memory(fields: dict[str, Any]) -> bool:
    """Whether a case's record fields say it ran out of memory (and left the CUDA context usable)."""
    return (
        not fields.get("poisoned")
        and fields.get("status") == "error"
        and str(fields.get("reason", "")).startswith("out of memory")
    )


def short_beside_builders(fields: dict[str, Any], device_kind: str, builder: bool = False) -> bool:
    """Whether a case's record fields say it ran out of GPU memory while other processes of its run
    share its GPU: builders beside the measuring worker, or (`builder`) other builds and the measuring."""
    return device_kind == "cuda" and (gpu_lock.shared() or builder) and out_of_memory(fields)


def allocation_bytes(reason: str) -> int | None:
    """The allocation an out-of-memory error names ("Tried to allocate 36.00 GiB"), in bytes."""
    m = _ALLOCATION.search(reason)
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else None


def again_beside_builders(
    fields: dict[str, Any],
    run: Callable[[], dict[str, Any] | None],
    free_bytes: Callable[[], int] | None = None,
    wait_s: float = MEMORY_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    alive: Callable[[], None] | None = None,
    builder: bool = False,
    others_bytes: Callable[[], int] | None = None,
) -> dict[str, Any] | None:
    """Run a case that ran out of memory again once the GPU has the allocation that failed free (at most
    `wait_s` later), saying it is alive each second it waits (the worker's WAIT: the hang watch's limit
    starts again); its record says it was run twice. Before it waits it gives back what its own
    allocator caches (`release`). It does not wait while other processes hold too little for their
    freeing it to be enough (`others_bytes`: the GPU's memory neither free nor this process's, less the
    contexts no wait frees, CONTEXTS_BYTES): the case is then too large here, and its second error
    stands. The measuring worker holds the GPU lock throughout: no builder makes new inputs meanwhile,
    and those it holds are freed as its items end. A `builder` never holds it (the module's docstring
    says why)."""
    need = allocation_bytes(str(fields.get("reason", "")))
    if free_bytes is None:
        free_bytes, others_bytes = _free_gpu_bytes, others_bytes or _others_gpu_bytes
        release()  # what this process's allocator keeps cached is not the others' to free
    alive = alive or _say_waiting

    def short() -> bool:
        free = free_bytes()
        if need is None or free >= need:
            return False
        return others_bytes is None or free + others_bytes() - CONTEXTS_BYTES >= need

    with contextlib.nullcontext() if builder else gpu_lock.held():
        waited = 0.0
        while short() and waited < wait_s:
            alive()
            sleep(1.0)
            waited += 1.0
        again = run()
    if again is None:
        return None
    beside = "other processes of the run" if builder else "the run's builders"
    again["retried"] = f"the first run ran out of memory beside {beside}: {fields.get('reason', '')}"[:300]
    return again


def _say_waiting() -> None:
    """The worker protocol's WAIT (execution/process.py): alive, waiting on the builders."""
    print("WAIT memory", flush=True)


def release() -> None:
    """Give the GPU memory this process's allocator caches back to the driver: a process that waits for
    memory must not be holding what another process waits for."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _free_gpu_bytes() -> int:
    import torch

    return int(torch.cuda.mem_get_info()[0])


def _others_gpu_bytes() -> int:
    """The GPU memory neither free nor reserved by this process: other processes' (and the contexts')."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return max(0, int(total) - int(free) - int(torch.cuda.memory_reserved()))
