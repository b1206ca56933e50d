"""Keep Python's cycle collector off the imported libraries.

A worker imports torch, Triton, FlashInfer and sglang: about a million long-lived objects that every full
collection walks again (a few hundred milliseconds each time, charged to whichever case it lands in). Once
the imports of a new backend are done, the worker collects what is garbage now and freezes the rest
(`gc.freeze`): later collections look at new objects only. Freezing happens only between cases, with no
case's inputs alive, so nothing a case allocates is ever frozen."""

from __future__ import annotations

import gc
import sys

_modules_at_freeze = 0


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
