"""Keep Python's cycle collector off the imported libraries, and its full walks out of the cases.

A worker imports torch, Triton, FlashInfer and sglang: about a million long-lived objects that every full
collection walks again (a few hundred milliseconds each time, charged to whichever case it lands in). Once
the imports of a new backend are done, the worker collects what is garbage now and freezes the rest
(`gc.freeze`): later collections look at new objects only. Freezing happens only between cases, with no
case's inputs alive, so nothing a case allocates is ever frozen."""

from __future__ import annotations

import gc
import sys

_modules_at_freeze = 0
# CPython's generational collector runs a full collection on its own after enough young ones; set this high,
# it runs none: full collections happen where the worker asks for them (defer_full_collections).
DEFERRED_FULL = 1 << 30


def defer_full_collections() -> None:
    """Leave full collections to the worker's own, between cases: its periodic clean-up (case.free_memory,
    every few dozen items and after each timed batch) and its freezes here. An automatic one walks every
    object not frozen. Right after a new backend's imports while cases are held for a batch (so nothing is
    frozen yet), that is most of the heap: a few hundred milliseconds charged to whatever stage was
    allocating then, a kernel's first launch say. Young collections go on as before, and cyclic garbage
    waits at most until the next clean-up. (A collector without generations ignores the threshold.)"""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, DEFERRED_FULL)


def freeze_after_imports() -> bool:
    """Collect, then freeze every surviving object, if modules were imported since the last freeze.
    Returns whether it froze."""
    global _modules_at_freeze
    n = len(sys.modules)
    if n == _modules_at_freeze:
        return False
    gc.collect()
    gc.freeze()
    _modules_at_freeze = n
    return True
