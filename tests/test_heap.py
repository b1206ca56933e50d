"""The worker freezes the imported libraries' objects out of the cycle collector's reach, after collecting
what is garbage at that moment."""

from __future__ import annotations

import gc
import importlib
import sys
import weakref

from dskbench.execution import heap


class _Node:
    pass


def test_it_collects_then_freezes_only_when_modules_were_imported(monkeypatch):
    gc.unfreeze()
    try:
        heap.freeze_after_imports()  # whatever this process imported so far
        assert heap.freeze_after_imports() is False  # nothing new: no collection, no freeze

        a, b = _Node(), _Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        dead = weakref.ref(a)
        del a, b
        sys.modules.pop("colorsys", None)
        importlib.import_module("colorsys")  # a new import
        assert heap.freeze_after_imports() is True
        assert dead() is None  # the garbage was collected, not frozen
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
