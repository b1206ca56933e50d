"""Whether a measurement's numbers can be a kernel's time at all: the one validity rule.

A timer can return numbers no kernel has: on a GPU shared with other work, a cold measurement whose
flush took longer than the whole timed replay reads a negative raw time, the launch-gap correction
clamps most samples at 0, and the median comes out 0 us. Such a record must never be `ok`, never
win a comparison and never reach a chart. `problem` says why a timing is impossible (None: it is
possible); it reads a Measurement, a results record's Timing, or the record's timing dict alike, so
the engine (before writing a record) and the readers (for files written before this rule) apply the
same rule.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from dskbench.measure.cross_check import gross
from dskbench.measure.stats import CI_MIN_SAMPLES

# A raw median (before the launch gap is subtracted) may dip below 0 by a rounding of the CUDA event
# timer, which resolves about 0.5 us; further below it the timer read less than nothing, and no
# correction makes that a time.
RAW_MEDIAN_FLOOR_US = -0.5
# A sample shorter than the launch gap is clamped at 0. A few such samples happen for kernels about
# as short as the gap's own jitter, and their median stands; once half the samples or more are
# clamped, the median is the clamp itself (or half-way to it), not the kernel.
MAX_CLAMPED_FRACTION = 0.5
# Files written before the clamp count was a field of its own say it in a note (dskbench.measure.sampling).
_CLAMP_NOTE = re.compile(r"(\d+) samples shorter than the launch gap")


def _get(timing: Any, name: str) -> Any:
    if isinstance(timing, Mapping):
        return timing.get(name)
    return getattr(timing, name, None)


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def clamped_count(timing: Any) -> int | None:
    """Samples clamped at 0 by the launch-gap correction: the `clamped` field, else the count its note
    gives (files written before the field), else None (no correction, or not recorded)."""
    n = _get(timing, "clamped")
    if _number(n):
        return int(n)
    for note in _get(timing, "notes") or ():
        m = _CLAMP_NOTE.search(str(note))
        if m:
            return int(m.group(1))
    return None


def problems(timing: Any) -> list[str]:
    """Every reason the timing is impossible, each a short phrase; empty when it is a possible one."""
    out = []
    median = _get(timing, "median_us")
    if not (_number(median) and math.isfinite(median)):
        out.append(f"median {median!r} (not a finite number)")
    elif median <= 0:
        out.append(f"median {median:g} us")
    for name in ("p10_us", "p90_us"):
        v = _get(timing, name)
        if _number(v) and not math.isfinite(v):
            out.append(f"{name[:-3]} {v}")
        elif _number(v) and v < 0:
            out.append(f"{name[:-3]} {v:g} us")
    raw = _get(timing, "raw_median_us")
    if _number(raw) and raw < RAW_MEDIAN_FLOOR_US:
        out.append(f"raw median {raw:.3g} us")  # before the launch gap was subtracted
    n = _get(timing, "n_samples")
    clamped = clamped_count(timing)
    if clamped and _number(n) and n > 0 and clamped >= MAX_CLAMPED_FRACTION * n:
        out.append(f"{clamped} of {int(n)} samples clamped at 0")  # shorter than the launch gap
    noise = _get(timing, "noise")
    # With fewer than CI_MIN_SAMPLES samples (a slow case the budget cut short) the noise is inf by
    # definition; with more, inf or NaN means the median's interval could not be taken of the samples.
    if _number(noise) and (math.isnan(noise) or (math.isinf(noise) and _number(n) and n >= CI_MIN_SAMPLES)):
        out.append(f"noise {noise} over {int(n) if _number(n) else '?'} samples")
    # The second timer read more than twice, or less than half, what this one did, beyond the band the
    # two normally keep (dskbench.measure.cross_check): one of them is not timing the kernel, and nothing
    # says which. A smaller disagreement only flags the record.
    cc = _get(timing, "cross_check")
    if cc is not None and (why := gross(cc)):
        out.append(why)
    return out


def problem(timing: Any) -> str | None:
    """Why the timing is impossible, in one line (its problems joined), or None when it is possible.
    `timing`: a Measurement, a Timing, or a results record's timing dict."""
    found = problems(timing)
    return "impossible measurement: " + "; ".join(found) if found else None
