"""The worker freezes the imported libraries' objects out of the cycle collector's reach, after collecting
what is garbage at that moment."""

from __future__ import annotations

import gc
import importlib
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

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


def _many_containers() -> list[list[int]]:
    """More new long-lived containers than the collector's rule for a full collection asks (a quarter of
    those already long-lived), whatever this process holds already."""
    return [[n] for n in range(len(gc.get_objects()) + 300_000)]


@contextmanager
def _collections_seen() -> Iterator[tuple[list[int], tuple[int, int, int]]]:
    """The generation of each collection that starts inside the block, and the thresholds before it
    (restored after it, with the callback removed)."""
    saved = gc.get_threshold()
    generations: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            generations.append(info["generation"])

    gc.collect()
    gc.callbacks.append(seen)
    try:
        yield generations, saved
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*saved)


def test_deferred_full_collections_run_only_when_asked():
    """With full collections deferred, many long-lived new objects (a new backend's imports) start no full
    collection on their own; young ones go on, and an explicit collect (the worker's clean-up) still walks
    them all."""
    with _collections_seen() as (generations, saved):
        heap.defer_full_collections()
        assert gc.get_threshold()[:2] == saved[:2] and gc.get_threshold()[2] == heap.DEFERRED_FULL
        kept = _many_containers()  # long-lived: each young collection promotes them
        assert generations and 2 not in generations  # young collections ran, no full one
        gc.collect()
        assert generations[-1] == 2  # the clean-up's own full collection
        del kept


def test_without_the_deferral_the_same_objects_start_a_full_collection():
    """The test above can fail: with the default thresholds the same allocations do start full collections."""
    with _collections_seen() as (generations, _):
        gc.set_threshold(700, 10, 10)  # CPython's defaults
        kept = _many_containers()
        assert 2 in generations
        del kept
