"""A Pick as a standalone HTML page (pick.html): the tables of dskbench.pick.tables, written out by
templates/pick.html.j2 with the stylesheet every dskbench page shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from dskbench.pick.choose import PhasePick, Pick
from dskbench.pick.tables import RULE, details, disagreements, launch_notes, tables
from dskbench.report.templating import render_page


@dataclass
class HtmlTable:
    title: str
    head: list[str]
    rows: list[tuple[str, list[tuple[str, str]]]]  # (row head, [(cell text, css class)])
    note: str


@dataclass
class PhaseView:
    phase: str
    measured: bool
    tables: list[HtmlTable]
    details: list[tuple[str, list[str]]]
    unassigned: list[str]
    disagree: list[str] = field(default_factory=list)  # picked results whose timers disagree


def cell_class(text: str) -> str:
    """How a cell is marked: an incomplete sum, a tie, or no correct candidate."""
    if "(incomplete: " in text:
        return "incomplete"
    if text.endswith(" tie"):
        return "tie"
    if text.startswith(("✗", "no measurement", "no valid measurement", "not run")):
        return "none"
    return ""


def phase_view(pp: PhasePick) -> PhaseView:
    if not pp.batches:
        return PhaseView(pp.phase, False, [], [], [])
    out = []
    for title, head, rows, note in tables(pp, pp.picker.dep.layer_counts):
        cells = [(r[0], [(x, cell_class(x)) for x in r[1:]]) for r in rows]
        out.append(HtmlTable(title, head, cells, note))
    return PhaseView(pp.phase, True, out, details(pp), pp.unassigned, disagreements(pp))


def render_html(p: Pick) -> str:
    return render_page(
        "pick.html.j2",
        body_class="pick",
        pick=p,
        rule=RULE,
        launch_notes=launch_notes(p.launch) if p.launch is not None else [],
        phases=[phase_view(pp) for pp in p.phases],
    )
