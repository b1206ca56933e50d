"""Twins: work items that launch one implementation on the same inputs, measured once.

Within a kernel, two ops of one shape (input_layernorm and post_attention_layernorm, both [T, 7168]) or
decode and prefill at the same T build the same inputs and make the same call. Across kernels, two
registry names can resolve to the same call: an adapter says so in its own class body with
``implementation = {backend name: key}``, the same key in both adapters. The claim is read from the
class's own ``__dict__``, never inherited: a subclass measured under another name is a twin only if it
says so itself.

A claim is true only when the two backends call the same function with the same arguments on inputs
built the same way, the same check and tolerance judge the output, the same requirements gate it and
the same traffic gives its metrics (tests/test_twins.py holds every claim to that). The copy's record is
the measured one with its own identity (kernel, case, op, ...), index and repro command, and
``shared_with`` = the measured case's id (a case id starts with its kernel's name, so it names one
case across kernels). Twins keep one backend name, so (case_id, backend), what every consumer matches
records on, names exactly the measured record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from dskbench.adapters import adapters
from dskbench.execution.items import WorkItem


def declared_implementation(adapter: type, backend: str) -> str | None:
    """The implementation key the adapter class itself declares for a backend (never a parent's)."""
    own: Mapping[str, str] = vars(adapter).get("implementation") or {}
    return own.get(backend)


def twin_key(item: WorkItem, registered: Mapping[str, type] | None = None) -> tuple[Any, ...]:
    """What makes two items one measurement: the declared implementation (else the kernel), the
    backend, and the case's dims and variant."""
    cls = (adapters() if registered is None else registered).get(item.kernel)
    impl = declared_implementation(cls, item.backend) if cls is not None else None
    who = ("implementation", impl) if impl else ("kernel", item.kernel)
    c = item.case
    return (*who, item.backend, json.dumps(c["dims"], sort_keys=True), json.dumps(c.get("variant")))


def measure_once(items: Sequence[WorkItem]) -> tuple[list[WorkItem], dict[int, list[WorkItem]]]:
    """The items to run (the first of each twin group, in plan order), and for each of them (by index)
    the items whose records copy its result (sweep.Recorder)."""
    registered = adapters()
    first: dict[tuple[Any, ...], WorkItem] = {}
    run: list[WorkItem] = []
    copies: dict[int, list[WorkItem]] = {}
    for it in items:
        key = twin_key(it, registered)
        primary = first.get(key)
        if primary is None:
            first[key] = it
            run.append(it)
        else:
            copies.setdefault(primary.index, []).append(it)
    return run, copies
