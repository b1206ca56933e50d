"""Evaluating a row's candidates at one batch point: each path from its parts' records (correct only with
status ok), then the ranking with the tie rule of dskbench.analysis.verdict."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from dskbench.analysis.verdict import Stat, judge
from dskbench.pick.deployment import Part, PathSpec
from dskbench.pick.index import REFERENCE, Measured, ResultIndex

FAIL_ORDER = ("wrong", "error", "skipped", "invalid", "missing")


@dataclass(frozen=True)
class PartResult:
    part: Part
    status: str  # ok | wrong | error | skipped | invalid (only unstable records: none valid) | missing
    chosen: Measured | None = None  # the fastest correct record (ok)
    reason: str = ""


@dataclass(frozen=True)
class Outcome:
    """A candidate at one batch point."""

    path: PathSpec
    status: str
    stat: Stat | None = None
    parts: tuple[PartResult, ...] = ()
    reason: str = ""
    # rows whose winners were added to this candidate: the rows its siblings fuse, which it leaves to run
    # on their own (so every candidate of the row is priced for the same work)
    separate: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def median(self) -> float:
        return float(self.stat.value) if self.stat and self.stat.value is not None else math.inf


def combine(stats: Sequence[Stat]) -> Stat:
    """A path's Stat: medians summed; p10/p90 half-widths combined in quadrature (independent parts).

    One part keeps its raw samples (so the rank test can run); a sum of several has none.
    """
    value = sum(float(s.value or 0.0) for s in stats)
    if all(s.lo is not None and s.hi is not None and s.value is not None for s in stats):
        lo = value - math.sqrt(sum((float(s.value) - float(s.lo)) ** 2 for s in stats))  # type: ignore[arg-type]
        hi = value + math.sqrt(sum((float(s.hi) - float(s.value)) ** 2 for s in stats))  # type: ignore[arg-type]
    else:
        lo = hi = None
    samples = stats[0].samples if len(stats) == 1 else ()
    p10 = p90 = None
    if all(s.p10 is not None and s.p90 is not None and s.value is not None for s in stats):
        p10 = value - math.sqrt(sum((float(s.value) - float(s.p10)) ** 2 for s in stats))  # type: ignore[arg-type]
        p90 = value + math.sqrt(sum((float(s.p90) - float(s.value)) ** 2 for s in stats))  # type: ignore[arg-type]
    gap = sum(s.gap_us for s in stats)  # a path's raw time is the sum of its parts' raw times
    return Stat(value=value, lo=lo, hi=hi, spread="p10-p90", samples=samples, p10=p10, p90=p90, gap_us=gap)


def eval_part(idx: ResultIndex, part: Part, batch: int, kv: int | None) -> PartResult:
    ok: list[Measured] = []
    bad: list[Measured] = []
    for kernel, backend in idx.pairs(part.op, part.variant):
        if backend == REFERENCE or not part.matches(kernel, backend):
            continue
        m = idx.get(part.op, part.variant, kernel, backend, batch, kv)
        if m is None:
            continue
        (ok if m.status == "ok" and m.stat.value is not None else bad).append(m)
    if ok:
        return PartResult(part, "ok", min(ok, key=lambda m: float(m.stat.value)))  # type: ignore[arg-type]
    for status in ("wrong", "error", "skipped"):
        hits = [m for m in bad if m.status == status]
        if hits:
            return PartResult(part, status, reason=_reasons(hits))
    invalid = [m for m in bad if m.status == "unstable"]  # an impossible timing is no measurement
    if invalid:
        return PartResult(part, "invalid", reason=_reasons(invalid))
    planned = [f"{k}: {idx.plan_skips[k]}" for k in part.kernels if k in idx.plan_skips]
    if planned:
        return PartResult(part, "skipped", reason="; ".join(planned))
    return PartResult(part, "missing", reason=f"no measurement of {part.label}")


def _reasons(hits: list[Measured]) -> str:
    """`kernel/b1, b2: reason; ...`: backends that failed for the same reason share one phrase."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for m in hits:
        by_reason[m.reason].append(f"{m.kernel}/{m.backend}")
    return "; ".join(f"{', '.join(who)}: {why}" for why, who in by_reason.items())


def eval_path(idx: ResultIndex, path: PathSpec, batch: int, kv: int | None) -> Outcome:
    parts = tuple(eval_part(idx, p, batch, kv) for p in path.parts)
    if all(p.status == "ok" for p in parts):
        return Outcome(path, "ok", combine([p.chosen.stat for p in parts]), parts)  # type: ignore[union-attr]
    status = next(s for s in FAIL_ORDER if any(p.status == s for p in parts))
    reason = "; ".join(p.reason for s in FAIL_ORDER for p in parts if p.status == s)
    return Outcome(path, status, None, parts, reason)


@dataclass
class Cell:
    """One row at one batch point: the ranking of correct candidates and everything left out."""

    batch: int
    kv_len: int | None
    ranked: list[Outcome] = field(default_factory=list)  # ok, not what-if, fastest first
    what_if: list[Outcome] = field(default_factory=list)  # ok what-if candidates, fastest first
    excluded: list[Outcome] = field(default_factory=list)  # wrong / error
    skipped: list[Outcome] = field(default_factory=list)
    missing: list[Outcome] = field(default_factory=list)  # no measurement, or no valid one (invalid)
    tie: bool = False
    how: str = ""

    @property
    def winner(self) -> Outcome | None:
        return self.ranked[0] if self.ranked else None

    @property
    def runner_up(self) -> Outcome | None:
        return self.ranked[1] if len(self.ranked) > 1 else None

    @property
    def margin(self) -> float | None:
        """How much slower the runner-up is than the winner (0.05 = 5%)."""
        w, r = self.winner, self.runner_up
        if w is None or r is None or not w.median:
            return None
        return r.median / w.median - 1.0


def judge_cell(outcomes: list[Outcome], batch: int, kv: int | None, threshold: float = 0.0) -> Cell:
    """Rank the correct candidates; winner and runner-up tie unless dskbench.analysis.verdict.judge calls the
    runner-up slower (the margin above `threshold`, its p10 beyond the noise floor, the U test)."""
    cell = Cell(batch, kv)
    for o in outcomes:
        if o.status == "ok":
            (cell.what_if if o.path.what_if else cell.ranked).append(o)
        elif o.status in ("wrong", "error"):
            cell.excluded.append(o)
        elif o.status == "skipped":
            cell.skipped.append(o)
        else:
            cell.missing.append(o)
    cell.ranked.sort(key=lambda o: (o.median, o.name))
    cell.what_if.sort(key=lambda o: (o.median, o.name))
    w, r = cell.winner, cell.runner_up
    if w is not None and r is not None:
        v = judge(w.stat, r.stat, threshold)
        cell.tie = v.verdict != "slower"
        cell.how = f"margin under {threshold:.0%}" if v.verdict == "same" else v.note
    return cell
