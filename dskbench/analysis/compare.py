"""Which cases got slower between two sets of results (ours or asv's), judged against run-to-run noise:
the comparison itself, and the formatting the report and pick share. `dskbench compare` prints it
(dskbench.frontends.cli.compare).

The rule is dskbench.analysis.verdict's (the same for the report's marks and pick's ties); the noise floors are
dskbench.analysis.noise's. Inputs are read by dskbench.analysis.compare_inputs. Each measurement counts once: a
``shared_with`` twin is listed under its measured case, never as a second change.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dskbench.analysis.compare_inputs import (
    Key,
    Obs,
    RunInfo,
    Settings,
    Side,
    add_runs,
    device_name,
    load_stats,
    stat_from_record,
    stats_from_runs,
)
from dskbench.analysis.noise import Prior
from dskbench.analysis.verdict import DEFAULT_THRESHOLD, Stat, Verdict, default_prior, judge, mann_whitney_p
from dskbench.results.io import Run

__all__ = [
    "Change",
    "Comparison",
    "Key",
    "Stat",
    "compare",
    "device_name",
    "format_number",
    "format_stat",
    "judge",
    "load_stats",
    "mann_whitney_p",
    "natural_key",
    "stat_from_record",
    "stats_from_runs",
]

DISAGREE_MARK = "≠"  # a side whose second timer disagreed (dskbench.measure.cross_check)

VERDICT_ORDER = (
    "broke",
    "slower",
    "~slower",
    "now skipped",
    "missing",
    "invalid",
    "still failing",
    "now failing",
    "fixed",
    "now measured",
    "faster",
    "~faster",
    "not judged",
    "added",
    "same",
    "skipped",
)


@dataclass(frozen=True)
class Change:
    key: Key
    old: Stat | None
    new: Stat | None
    judged: Verdict
    twin_of: Key | None = None  # this row copies that measurement: shown, not counted

    @property
    def verdict(self) -> str:
        return self.judged.verdict

    @property
    def change(self) -> float | None:
        return self.judged.change

    @property
    def note(self) -> str:
        return self.judged.note

    @property
    def is_regression(self) -> bool:
        return self.twin_of is None and self.judged.is_regression

    @property
    def is_improvement(self) -> bool:
        return self.twin_of is None and self.judged.is_improvement


@dataclass
class Comparison:
    threshold: float
    changes: list[Change] = field(default_factory=list)

    @property
    def measured(self) -> list[Change]:
        """One row per measurement: twins left out."""
        return [c for c in self.changes if c.twin_of is None]

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.is_regression]

    @property
    def improvements(self) -> list[Change]:
        return [c for c in self.changes if c.is_improvement]

    def disagreements(self) -> list[str]:
        """One line per compared measurement whose two timers disagree on a side (its number marked)."""
        out = []
        for c in sorted(self.measured, key=_row_order):
            for side, s in (("old", c.old), ("new", c.new)):
                if s is not None and s.status == "ok" and s.disagree:
                    out.append(
                        f"  {c.key.kernel} {_short_case(c.key)} {c.key.backend} ({side}): {s.disagree}"
                    )
        return out

    def counts(self) -> Counter:
        return Counter(c.verdict for c in self.measured)

    def floors(self) -> Counter:
        return Counter(c.judged.floor.source for c in self.measured if c.judged.floor is not None)

    def summary(self) -> str:
        n = self.counts()
        parts = [f"{n[v]} {v}" for v in VERDICT_ORDER if n.get(v)]
        twins = len(self.changes) - len(self.measured)
        head = f"{len(self.measured)} measurements compared"
        if twins:
            head += f" ({twins} twin rows not counted again)"
        return head + f", threshold {self.threshold:.0%}: " + ", ".join(parts)

    def by_kernel(self) -> list[str]:
        """One line per kernel with something other than same/skipped, counted once per measurement."""
        per: dict[tuple[str, str], Counter] = defaultdict(Counter)
        twins: Counter = Counter()
        for c in self.changes:
            if c.twin_of is None:
                per[(c.key.machine, c.key.kernel)][c.verdict] += 1
            else:
                twins[(c.key.machine, c.key.kernel)] += 1
        lines = []
        machines = {m for m, _ in per}
        for (machine, kernel), n in sorted(per.items(), key=lambda kv: (kv[0][0], kv[0][1].lower())):
            shown = [f"{n[v]} {v}" for v in VERDICT_ORDER if n.get(v) and v not in ("same", "skipped")]
            if not shown:
                continue
            where = f" on {machine}" if len(machines) > 1 else ""
            total = sum(n.values())
            extra = f", {twins[(machine, kernel)]} twins" if twins[(machine, kernel)] else ""
            lines.append(f"  {kernel}{where}: {', '.join(shown)} (of {total} measured{extra})")
        return lines

    def format_table(self, verbose: bool = False, max_quiet_rows: int = 200) -> str:
        """A per-kernel table; with many rows, unchanged ones are left out unless verbose; twins only
        with verbose."""
        rows = sorted(self.changes if verbose else self.measured, key=_row_order)
        hide_same = not verbose and len(rows) > max_quiet_rows
        shown = [c for c in rows if not (hide_same and c.verdict in ("same", "skipped"))]
        cells = [("kernel", "case", "backend", "old", "new", "change", "shift ±floor", "verdict")]
        for c in shown:
            note = f"twin of {_short_case(c.twin_of)}" if c.twin_of else c.note
            cells.append(
                (
                    c.key.kernel,
                    _short_case(c.key),
                    c.key.backend,
                    format_stat(c.old),
                    format_stat(c.new),
                    f"{c.change:+.1%}" if c.change is not None else "",
                    c.judged.effect(),
                    c.verdict + (f" ({note})" if note else ""),
                )
            )
        widths = [min(max(len(r[i]) for r in cells), 60) for i in range(len(cells[0]) - 1)] + [0]
        lines = []
        last_group = None
        for i, r in enumerate(cells):
            if i > 0:
                group = (shown[i - 1].key.machine, shown[i - 1].key.kernel)
                if group != last_group:
                    lines.append(f"-- {group[1]} on {group[0]}")
                    last_group = group
            lines.append("  ".join(_fit(v, w) for v, w in zip(r, widths, strict=True)).rstrip())
        if hide_same:
            lines.append(f"({len(rows) - len(shown)} unchanged or skipped measurements not shown)")
        return "\n".join(lines)


def _fit(s: str, w: int) -> str:
    if not w:
        return s
    return s.ljust(w) if len(s) <= w else s[: w - 1] + "~"


def _short_case(key: Key) -> str:
    prefix = key.kernel + "/"
    return key.case[len(prefix) :] if key.case.startswith(prefix) else key.case


def _row_order(c: Change) -> tuple:
    return (c.key.machine, c.key.kernel, natural_key(c.key.case), c.key.backend)


def natural_key(s: str) -> tuple:
    """Sort key that orders embedded numbers by value (T=2 before T=128)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", s))


def format_stat(s: Stat | None) -> str:
    """`12.3 us ±2.1%` (half the spread, relative to the median) or the status; `(3 runs)` for a side
    of several runs."""
    if s is None:
        return "-"
    if s.status != "ok" or s.value is None:
        return s.status
    v = format_number(s.value)
    unit = "" if s.unit == "us" else f" {s.unit}"
    runs = f" ({s.n_runs} runs)" if s.n_runs > 1 else ""
    mark = f" {DISAGREE_MARK}" if s.disagree else ""
    if s.lo is not None and s.hi is not None and s.value:
        return f"{v}{unit} ±{(s.hi - s.lo) / 2 / abs(s.value):.1%}{runs}{mark}"
    return f"{v}{unit}{runs}{mark}"


def format_number(x: float) -> str:
    a = abs(x)
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


# -- comparing ---------------------------------------------------------------------------------------------


def _as_side(x: Side | Sequence[Run] | Mapping[Key, Stat]) -> Side:
    if isinstance(x, Side):
        return x
    side = Side()
    if isinstance(x, Mapping):
        info = RunInfo("given", "", "", "", Settings(), "")
        for k, s in x.items():
            side.add(Obs(k, s, "given", "", Settings()), info)
        return side
    add_runs(side, x)
    return side


def compare(
    old_runs: Side | Sequence[Run] | Mapping[Key, Stat],
    new_runs: Side | Sequence[Run] | Mapping[Key, Stat],
    threshold: float = DEFAULT_THRESHOLD,
    prior: Prior | None = None,
    history: Side | None = None,
) -> Comparison:
    """Match old and new by (machine, case, backend) and judge each pair (dskbench.analysis.verdict.judge)."""
    old, new = _as_side(old_runs), _as_side(new_runs)
    old_stats, new_stats = old.stats(), new.stats()
    apart = {key for key in set(old_stats) & set(new_stats) if timed_apart(old.timers(key), new.timers(key))}
    for key in apart:
        old_stats[key], new_stats[key] = old.kernel_stat(key), new.kernel_stat(key)
    twins = {**old.twins(), **new.twins()}
    own_runs = set(old.runs) | set(new.runs)
    out = Comparison(threshold)
    prior = prior or default_prior()
    own = {m: own_prior(prior, old, new, m) for m in {*old.machines(), *new.machines()}}
    for key in sorted(set(old_stats) | set(new_stats), key=_row_order_key):
        hist = history.history(key, own_runs) if history is not None else []
        v = judge(
            old_stats.get(key), new_stats.get(key), threshold, prior, hist, own[key.machine], key in apart
        )
        out.changes.append(Change(key, old_stats.get(key), new_stats.get(key), v, twins.get(key)))
    return out


def timed_apart(old: set[str], new: set[str]) -> bool:
    """Whether two sides' runs were timed by different timers (each side known and of one timer)."""
    return len(old) == len(new) == 1 and "" not in old | new and old != new


def own_prior(prior: Prior, old: Side, new: Side, machine: str) -> bool:
    """Whether the prior was measured on this machine's device (its GPU model, else the machine's name;
    the shipped prior was measured on H200s): another device's noise is not this one's. Statistics given
    without their runs (a mapping of Stats) name no device: the caller chose the prior for them."""
    gpus = {r.gpu or r.machine for side in (old, new) for r in side.runs_on(machine)}
    return all(prior.covers(g) for g in gpus)


def _row_order_key(k: Key) -> tuple:
    return (k.machine, k.kernel, natural_key(k.case), k.backend)
