"""One GPU's timing lock, for a run that builds its JIT modules while it measures (build_ahead.py).

The measuring worker holds it while it samples (a case alone, or a batch); a builder holds it while it
makes a case's inputs (random tensors, quantised weights: the bulk of its GPU work). Nothing that may
compile runs under it: a builder's bind and first launch (the JIT build, then one launch; a FlashInfer
wrapper's plan builds its module) run without it, so a long build never stops the measuring; their
GPU work is one launch. The lock is an flock on a file named by DSKBENCH_GPU_LOCK (one file per GPU, set by the
run in its workers' environment); the kernel releases it when its holder dies. Unset, it is no lock.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

LOCK_ENV = "DSKBENCH_GPU_LOCK"
_depth = 0  # blocks of this process that hold it now: an inner block holds it already


def shared() -> bool:
    """Whether builders share this process's GPU (a run that builds ahead names its lock)."""
    return bool(os.environ.get(LOCK_ENV))


@contextmanager
def held() -> Iterator[None]:
    """Hold this GPU's lock for the block (a no-op when the run builds nothing beside its measuring)."""
    global _depth
    path = os.environ.get(LOCK_ENV)
    if not path or _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
            fcntl.flock(fh, fcntl.LOCK_UN)
