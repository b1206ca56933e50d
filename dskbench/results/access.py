"""Reading parts of a record's JSON that may be incomplete (a front end's, a test's): the typed part,
and a rate recorded or derived from the traffic and the median."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dskbench.results.records import PARTS, rate_of


def part_of(rec: Mapping[str, Any], name: str) -> Any:
    """The typed `name` part (check, traffic, timing, metrics, clocks) of a record's JSON, or None when
    the record has none (a timing without its median counts as none)."""
    d = rec.get(name)
    if not isinstance(d, Mapping) or not d or (name == "timing" and "median_us" not in d):
        return None
    return PARTS[name].from_json(d)


def rate(rec: Mapping[str, Any], metric: str) -> float | None:
    """`gbps` or `tflops` of a record's JSON: the recorded metric, else the traffic over the median."""
    return rate_of(part_of(rec, "metrics"), part_of(rec, "traffic"), part_of(rec, "timing"), metric)
