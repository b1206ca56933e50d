"""The self-contained HTML report: inline CSS, inline SVG charts, a few lines of JS; nothing fetched.

This module gathers what each part of the page shows (per machine: the overview of fastest backends, the
invalid measurements, the machine card, the changes between its last two commits, one section per kernel); the markup is in
templates/report*.html.j2 and the stylesheet, shared with the pick page, in templates/style.css.

Size stays proportional to the results (about 0.6 kB per result record): each kernel is one collapsed
<details> section, history lines carry no per-point markers, and problems are grouped by reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dskbench.analysis.over_peak import OverPeak, over_peak
from dskbench.report import svg
from dskbench.report.kernel_view import KernelView, kernel_view, short_case
from dskbench.report.model import (
    CPU_NOTE,
    DISAGREE_MARK,
    History,
    Machine,
    category_of,
    history,
    is_unmeasured,
    kernel_anchor,
    slug,
)
from dskbench.report.tables import (
    Disagreement,
    Overview,
    PeakRow,
    Problem,
    SummaryRow,
    disagreements,
    environment_facts,
    invalid,
    overview,
    peak_rows,
    peaks_note,
    summary,
)
from dskbench.report.templating import render_page
from dskbench.results.records import STATUSES

STATUS_ORDER = STATUSES


@dataclass
class Unmeasured:
    """A kernel with nothing measured (not in the model, no adapter, another GPU...): one row of a list."""

    anchor: str
    name: str
    category: str
    reasons: list[str]


@dataclass
class MachineView:
    machine: Machine
    overview: list[Overview]
    facts: list[tuple[str, str]]
    peaks: list[PeakRow]  # datasheet peaks, the measured ceilings beside them
    peaks_note: str
    over_peak: list[OverPeak]  # results above a datasheet peak: traffic-model errors
    runs: list[tuple[str, str]]  # (commit, when) of each run, when there are several
    summary: list[SummaryRow]
    kernels: list[KernelView]
    unmeasured: list[Unmeasured]
    invalid: list[tuple[str, Problem]]  # (kernel, unstable cases of one backend and reason)
    disagree: list[Disagreement] = field(default_factory=list)  # ok results whose timers disagree

    @property
    def n_invalid(self) -> int:
        return sum(len(p.cases) for _, p in self.invalid)

    @property
    def name(self) -> str:
        return self.machine.name

    @property
    def slug(self) -> str:
        return self.machine.slug

    @property
    def is_cpu(self) -> bool:
        return self.machine.is_cpu


@dataclass
class Extreme:
    """The largest slowdown or speed-up of a kernel between two commits."""

    change: str  # "+12.0%"
    case: str
    backend: str


@dataclass
class KernelChanges:
    kernel: str
    anchor: str
    series: int
    slower: int
    faster: int
    noisy: int
    worst: Extreme | None
    best: Extreme | None


@dataclass
class ChangesView:
    """The regression dashboard of one machine: what changed between its last two commits."""

    machine: str
    old: str
    new: str
    rows: list[KernelChanges]


def render(
    machines: list[Machine],
    categories: Mapping[str, str] | None,
    generated: str,
    threshold: float = 0.05,
    csv_href: str | None = None,
) -> str:
    """The page. csv_href: where the CSV of the same results lies, relative to the page (linked on top)."""
    backends = sorted({r["backend"]["name"] for m in machines for r in m.latest.values()})
    colors = svg.color_map([b for b in backends if b != "-"])
    hist = {(m.name, k): history(m, k) for m in machines for k in m.kernels()}
    views = [machine_view(m, categories, colors, hist, threshold) for m in machines]
    changes = [c for m in machines if (c := changes_view(m, hist, threshold)) is not None]
    return render_page(
        "report.html.j2",
        machines=views,
        changes=changes,
        colors=colors,
        generated=generated,
        n_runs=sum(len(m.runs) for m in machines),
        n_records=sum(len(r.results) for m in machines for r in m.runs),
        csv_href=csv_href,
        threshold=f"{threshold:.0%}",
        cpu_note=CPU_NOTE,
        statuses=STATUS_ORDER,
        kernel_anchor=kernel_anchor,
        disagree_mark=DISAGREE_MARK,
    )


def machine_view(
    m: Machine,
    categories: Mapping[str, str] | None,
    colors: dict[str, str],
    hist: dict[tuple[str, str], History | None],
    threshold: float,
) -> MachineView:
    env = m.newest
    runs = []
    if len(m.runs) > 1:
        for r in m.runs:
            git = r.environment.get("git") or {}
            commit = str(git.get("commit") or "?")[:8] + ("+dirty" if git.get("dirty") else "")
            runs.append((commit, str(r.environment.get("created", ""))[:16].replace("T", " ")))
    measured = [k for k in m.kernels() if not is_unmeasured(m.records(k))]
    return MachineView(
        machine=m,
        overview=overview(m, categories),
        facts=environment_facts(env),
        peaks=peak_rows(env),
        peaks_note=peaks_note(env),
        over_peak=over_peak(m.latest.values()),
        runs=runs,
        summary=summary(m, categories),
        kernels=[kernel_view(m, k, categories, colors, hist.get((m.name, k)), threshold) for k in measured],
        unmeasured=[_unmeasured(m, k, categories) for k in m.kernels() if k not in measured],
        invalid=invalid(m),
        disagree=disagreements(m),
    )


def _unmeasured(m: Machine, kernel: str, categories: Mapping[str, str] | None) -> Unmeasured:
    recs = m.records(kernel)
    reasons = sorted({str(r.get("reason") or "") for r in recs} - {""})
    return Unmeasured(
        kernel_anchor(m.slug, kernel), kernel, category_of(kernel, categories, recs[0]), reasons
    )


def changes_view(
    m: Machine, hist: dict[tuple[str, str], History | None], threshold: float
) -> ChangesView | None:
    rows = []
    labels = ("", "")
    for k in m.kernels():
        h = hist.get((m.name, k))
        if h is None:
            continue
        labels = (h.commits[-2][1], h.commits[-1][1])
        ch = h.changes(threshold)
        slower = [c for c in ch if c[2] in ("slower", "broke")]
        faster = [c for c in ch if c[2] in ("faster", "fixed")]
        noisy = [c for c in ch if c[2].startswith("~")]
        worst = max((c for c in slower if c[3] is not None), key=lambda c: c[3], default=None)
        best = min((c for c in faster if c[3] is not None), key=lambda c: c[3], default=None)
        rows.append(
            KernelChanges(
                k,
                f"{m.slug}--{slug(k)}",
                len(h.values),
                len(slower),
                len(faster),
                len(noisy),
                _extreme(worst),
                _extreme(best),
            )
        )
    return ChangesView(m.name, *labels, rows) if rows else None


def _extreme(c: tuple[Any, ...] | None) -> Extreme | None:
    if c is None:
        return None
    case, backend, _verdict, change, _old, _new = c
    return Extreme(f"{change:+.1%}", short_case(case), backend)
