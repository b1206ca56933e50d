"""Reading a batched replay's CUPTI activities back as one span per case (pure: tested without a GPU).

A batched round replays, for each case in turn, one graph of [flush, launch]: the flush empties L2 and,
being a kernel no benchmarked kernel launches (a fill of a complex64 buffer), also says where the case
begins. In time order the device activities of a chunk therefore read: flush, the case's activities,
flush, the next case's, ... A case's span runs from the start of its first activity after its flush to
the end of its last one before the next flush; the flush itself is never part of it, so no flush time is
subtracted from anything. A chunk whose flush count differs from the groups queued is not trusted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MARKER = "FillFunctor<c10::complex<float>"  # the flush's kernel: zero_ of a complex64 buffer
# Device activities that are the profiler's own, never a kernel's
PROFILER_NAMES = ("Activity Buffer", "Buffer Request", "cudaProfiler")

Activity = tuple[str, int, int]  # (name, start_ns, end_ns) of one device activity
# A record's note when some of its samples began while their flush still ran (programmatic dependent
# launch): such a sample counts from the flush's end, and the kernel read that way can be shorter.
EARLY_NOTE = (
    "{n} samples started before the flush ended (programmatic dependent launch): counted from its end"
)
_EARLY = re.compile(r"^(\d+) samples started before the flush ended")


def early_starts(notes: Iterable[object]) -> int:
    """How many samples a record's notes say began during their flush (0: none, or not batched)."""
    for note in notes:
        m = _EARLY.match(str(note))
        if m:
            return int(m.group(1))
    return 0


@dataclass(frozen=True)
class GroupSpan:
    """One case's launch in one round, as CUPTI saw it."""

    span_ns: int  # first activity's start (not before the flush's end) to last activity's end
    activities: int
    flush_ns: int  # the flush before it (its own activity)
    early_ns: int = 0  # how long its first activity had started before the flush ended

    @property
    def span_us(self) -> float:
        return self.span_ns / 1000.0

    @property
    def flush_us(self) -> float:
        return self.flush_ns / 1000.0


class ChunkMismatch(ValueError):
    """The activities do not split into the expected groups (markers missing or extra)."""


def device_activities(acts: Iterable[Activity]) -> list[Activity]:
    """The kernels, copies and sets of a profile in start order, without the profiler's own."""
    out = [a for a in acts if not any(p in a[0] for p in PROFILER_NAMES)]
    out.sort(key=lambda a: (a[1], a[2]))
    return out


def split_groups(acts: Sequence[Activity], n_groups: int) -> list[GroupSpan | None]:
    """The span of each of `n_groups` [flush, launch] groups, in order; None for a group with no activity
    of its own. Raises ChunkMismatch when the flushes do not number `n_groups`."""
    acts = device_activities(acts)
    marks = [i for i, a in enumerate(acts) if MARKER in a[0]]
    if len(marks) != n_groups:
        raise ChunkMismatch(f"{len(marks)} flushes for {n_groups} groups")
    out: list[GroupSpan | None] = []
    for k, m in enumerate(marks):
        flush = acts[m]
        end = marks[k + 1] if k + 1 < len(marks) else len(acts)  # the next group's flush ends it
        own = acts[m + 1 : end]
        if not own:
            out.append(None)
            continue
        # A kernel launched with programmatic dependent launch may start (and wait) before the flush
        # ends; stream order starts its work at the flush's end, so that is where its span begins.
        first = min(a[1] for a in own)
        start = max(first, flush[2])
        last = max(a[2] for a in own)
        out.append(GroupSpan(max(0, last - start), len(own), flush[2] - flush[1], start - first))
    return out


JITTER_NS = 3  # how far a duration strays from its clock level (timestamps converted to the host's clock)
MIN_LEVELS = 4  # levels a clock step is read from
ON_STEP_SHARE = 0.8  # share of the gaps between levels that must be whole steps


def clock_step_ns(durations: Iterable[int]) -> int | None:
    """The step of the clock that timed these durations, or None where they show none.

    CUPTI's device timestamps advance in steps (32 ns on Hopper), and converting them to the host's
    clock blurs each by a nanosecond or two: durations fall on levels one step apart. Values within
    JITTER_NS of each other are one level; the step is the smallest distance between neighbouring
    levels, accepted when most distances are whole multiples of it. A clock of nanosecond steps gives
    one blurred level or scattered values, and None."""
    levels: list[list[int]] = []
    for v in sorted(set(durations)):
        if levels and v - levels[-1][-1] <= JITTER_NS:
            levels[-1].append(v)
        else:
            levels.append([v])
    if len(levels) < MIN_LEVELS:
        return None
    centres = [(lv[0] + lv[-1]) / 2 for lv in levels]
    gaps = [b - a for a, b in zip(centres, centres[1:], strict=False)]
    step = min(gaps)
    if step <= 2 * JITTER_NS:
        return None
    on_step = sum(1 for g in gaps if abs(g - step * round(g / step)) <= JITTER_NS)
    return round(step) if on_step >= ON_STEP_SHARE * len(gaps) else None


def per_case(groups: Sequence[GroupSpan | None], order: Sequence[int], n_cases: int) -> list[list[GroupSpan]]:
    """The groups regrouped per case: `order[i]` is the case that queued group i. Empty groups dropped."""
    if len(groups) != len(order):
        raise ChunkMismatch(f"{len(groups)} groups for {len(order)} launches queued")
    out: list[list[GroupSpan]] = [[] for _ in range(n_cases)]
    for case, g in zip(order, groups, strict=True):
        if g is not None:
            out[case].append(g)
    return out
