"""`dskbench compare`: which cases got slower between two sets of results (ours or asv's), judged against
run-to-run noise.

    dskbench compare OLD NEW
    dskbench compare OLD1 OLD2 ... -- NEW1 NEW2 ...      (several runs per side; folders work too)

The rule is dskbench.analysis.verdict's (the same for the report's marks and pick's ties); the noise floors are
dskbench.analysis.noise's. Inputs are read by dskbench.analysis.compare_inputs. Each measurement counts once: a
``shared_with`` twin is listed under its measured case (``-v``), never as a second change.
Exit status: 1 when a measurement regressed (slower, or broke), 2 on bad input, else 0.
"""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dskbench.analysis.compare_inputs import (
    Key,
    Obs,
    RunInfo,
    Settings,
    Side,
    add_runs,
    device_name,
    load_side,
    load_stats,
    stat_from_record,
    stats_from_runs,
)
from dskbench.analysis.noise import Prior, PriorError, load_prior
from dskbench.analysis.verdict import (
    DEFAULT_THRESHOLD,
    Stat,
    Verdict,
    default_prior,
    judge,
    mann_whitney_p,
)
from dskbench.results.io import ResultsError, Run

__all__ = [
    "Change",
    "Comparison",
    "Key",
    "Stat",
    "cli_compare",
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

VERDICT_ORDER = (
    "broke",
    "slower",
    "~slower",
    "now skipped",
    "missing",
    "still failing",
    "now failing",
    "fixed",
    "now measured",
    "faster",
    "~faster",
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
    if s.lo is not None and s.hi is not None and s.value:
        return f"{v}{unit} ±{(s.hi - s.lo) / 2 / abs(s.value):.1%}{runs}"
    return f"{v}{unit}{runs}"


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
    twins = {**old.twins(), **new.twins()}
    own_runs = set(old.runs) | set(new.runs)
    out = Comparison(threshold)
    for key in sorted(set(old_stats) | set(new_stats), key=_row_order_key):
        hist = history.history(key, own_runs) if history is not None else []
        v = judge(old_stats.get(key), new_stats.get(key), threshold, prior, hist)
        out.changes.append(Change(key, old_stats.get(key), new_stats.get(key), v, twins.get(key)))
    return out


def _row_order_key(k: Key) -> tuple:
    return (k.machine, k.kernel, natural_key(k.case), k.backend)


# -- the command -------------------------------------------------------------------------------------------


def describe_side(name: str, side: Side, machines: Sequence[str]) -> list[str]:
    lines = []
    for m in machines:
        runs = side.runs_on(m)
        if not runs:
            continue
        commits = sorted({r.commit[:8] or "unknown" for r in runs})
        settings = sorted({r.settings.describe() for r in runs})
        lines.append(
            f"{name}: {len(runs)} run{'s' if len(runs) != 1 else ''} on {m} "
            f"(commit {', '.join(commits)}; {' | '.join(settings)})"
        )
    return lines


def notes(old: Side, new: Side, machines: Sequence[str], prior: Prior, history: Side | None) -> list[str]:
    """What the reader must know to trust the verdicts: settings that differ, where floors come from."""
    out = []
    for m in machines:
        a = {r.settings for r in old.runs_on(m)}
        b = {r.settings for r in new.runs_on(m)}
        diff = _settings_diff(a, b)
        if diff:
            out.append(
                f"note: on {m} the sides were measured with different settings ({diff}): not like for like"
            )
        for name, s in (("old", a), ("new", b)):
            inner = _settings_diff({next(iter(s))}, s) if len(s) > 1 else ""
            if inner:
                out.append(f"note: the {name} side's runs on {m} differ in settings ({inner})")
    n_old = max((len(old.runs_on(m)) for m in machines), default=1)
    n_new = max((len(new.runs_on(m)) for m in machines), default=1)
    hist = history is not None and any(history.runs_on(m) for m in machines)
    if n_old < 2 and n_new < 2 and not hist:
        out.append(
            f"noise floors: one run per side, so each case's floor is the band prior ({prior.describe()}); "
            "give two or more runs per side (OLD1 OLD2 -- NEW1 NEW2) or --history for each case's own"
        )
    else:
        what = []
        if n_old > 1 or n_new > 1:
            what.append(f"{n_old} old and {n_new} new runs: verdicts use run-level medians")
        if hist:
            what.append("--history runs")
        out.append(
            "noise floors: each case's own run-to-run spread (" + "; ".join(what) + "), blended with the "
            f"band prior ({prior.describe()}) where it has few runs"
        )
    runs = [r for side in (old, new) for m in machines for r in side.runs_on(m)]
    for setting in ("mode", "flush"):
        odd = sorted(
            {
                getattr(r.settings, setting)
                for r in runs
                if prior.unmeasured(setting, getattr(r.settings, setting))
            }
        )
        if odd:
            out.append(
                f"note: the band prior was measured with {setting} {_known(prior.measured_with[setting])}, "
                f"these runs used {setting} {'/'.join(odd)}: its floors may be too narrow for them; "
                "several runs per side or --history give each case's own"
            )
    gpus = sorted({r.gpu or r.machine for r in runs})
    strangers = [g for g in gpus if prior.measured_on and g not in prior.measured_on]
    if strangers:
        out.append(
            f"note: the band prior was measured on {', '.join(prior.measured_on)}, not on "
            f"{', '.join(strangers)}; --history runs of that GPU give floors of its own"
        )
    return out


def _known(values: Sequence[str]) -> str:
    return "/".join(v for v in values if v != "unrecorded") or "unrecorded"


def median_only_note(result: Comparison) -> str:
    """Say when cases could only be judged on medians (no p10: asv results saved without samples)."""
    n = sum(1 for c in result.measured if c.judged.statistic == "median" and c.judged.floor is not None)
    if not n:
        return ""
    return (
        f"note: {n} measurements judged on medians alone, whose floors are wide below 5 us (the results "
        "hold no p10: asv keeps samples with `asv run --record-samples`)"
    )


def _settings_diff(a: set, b: set) -> str:
    parts = []
    for f in ("mode", "flush", "seeds"):
        va = sorted({getattr(s, f) or "unrecorded" for s in a})
        vb = sorted({getattr(s, f) or "unrecorded" for s in b})
        if va != vb:
            label = "inputs" if f == "seeds" else f
            parts.append(f"{label} {'/'.join(va)} vs {'/'.join(vb)}")
    return "; ".join(parts)


def cli_compare(
    old_paths: Sequence[str | Path],
    new_paths: Sequence[str | Path],
    threshold: float = DEFAULT_THRESHOLD,
    fail_on_regression: bool = True,
    verbose: bool = False,
    history_paths: Sequence[str | Path] = (),
    prior_path: str | Path | None = None,
) -> int:
    """Print the comparison; 1 when something regressed (and that should fail), 2 on bad input."""
    if not 0 <= threshold < 10:
        print(f"dskbench compare: threshold {threshold} is not a fraction (5% is 0.05)", file=sys.stderr)
        return 2
    try:
        prior = load_prior(prior_path) if prior_path is not None else default_prior()
        old, new = load_side(old_paths), load_side(new_paths)
        history = load_side(history_paths, every_commit=True) if history_paths else None
    except (ResultsError, PriorError) as e:
        print(f"dskbench compare: {e}", file=sys.stderr)
        return 2
    if not old or not new:
        side = "old" if not old else "new"
        print(f"dskbench compare: no results in the {side} input", file=sys.stderr)
        return 2
    machines = sorted(set(old.machines()) & set(new.machines()))
    if not machines:
        print(
            "dskbench compare: the sides were measured on different machines (old: "
            f"{', '.join(old.machines())}; new: {', '.join(new.machines())}); timings of two GPU models "
            "are never compared",
            file=sys.stderr,
        )
        return 2
    if not set(old.obs) & set(new.obs):
        print(f"dskbench compare: no case in common on {', '.join(machines)}", file=sys.stderr)
        return 2
    result = compare(old, new, threshold, prior, history)
    for line in describe_side("old", old, machines) + describe_side("new", new, machines):
        print(line)
    for line in notes(old, new, machines, prior, history):
        print(line)
    if median_only_note(result):
        print(median_only_note(result))
    print(result.format_table(verbose=verbose))
    lines = result.by_kernel()
    if lines:
        print("by kernel (each measurement once):")
        print("\n".join(lines))
    floors = result.floors()
    if floors:
        print("noise floors used: " + ", ".join(f"{k} {n}" for k, n in floors.most_common()))
    print(result.summary())
    bad = result.regressions
    if bad:
        print(f"{len(bad)} regression(s)", file=sys.stderr)
        return 1 if fail_on_regression else 0
    return 0
