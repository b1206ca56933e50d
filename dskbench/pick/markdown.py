"""A Pick as Markdown (the terminal, PRs) and as the short summary `dskbench pick --out` prints."""

from __future__ import annotations

from dskbench.pick.choose import Pick
from dskbench.pick.index import batch_var
from dskbench.pick.tables import RULE, details, disagreements, launch_notes, tables, total_text

DISAGREE_NOTE = (
    "A second timer read these outside the band the two timers normally keep (docs/measurement.md): the "
    "pick uses their recorded numbers, but one of the timers may not be timing the kernel alone."
)


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    def c(s: str) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(c(h) for h in head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    return out + ["| " + " | ".join(c(x) for x in r) + " |" for r in rows] + [""]


def _header(p: Pick) -> list[str]:
    return [
        f"# Backend pick: {p.device}, tp={p.tp}",
        "",
        f"Inputs: {', '.join(p.inputs) or '-'} ({len(p.runs)} run{'s' if len(p.runs) != 1 else ''}). "
        "Candidates and paths: shapes/deployment.yaml.",
        "",
        "Rule: " + RULE,
        "",
    ]


def render_markdown(p: Pick) -> str:
    out = _header(p)
    if p.launch is not None:
        out += ["## Launch command", "", "```sh", p.launch.command, "```", ""]
        out += [line + "\n" for line in launch_notes(p.launch)]
    for pp in p.phases:
        out += [f"## {pp.phase}", ""]
        if not pp.batches:
            out += ["No measurement for this phase.", ""]
            continue
        for title, head, rows, note in tables(pp, pp.picker.dep.layer_counts):
            out += [f"### {title}", ""] + _md_table(head, rows)
            if note:
                out += [note, ""]
        det = details(pp)
        if det:
            out += ["### Excluded, skipped and unmeasured candidates", ""]
            for label, lines in det:
                out.append(f"- **{label}**")
                out += [f"  - {line}" for line in lines]
            out.append("")
        if pp.unassigned:
            out += ["### Results no row uses", "", "; ".join(pp.unassigned), ""]
        if found := disagreements(pp):
            out += ["### Picked results whose timers disagree", "", DISAGREE_NOTE, ""]
            out += [f"- {line}" for line in found] + [""]
    return "\n".join(out).rstrip() + "\n"


def render_summary(p: Pick, written: list[str]) -> str:
    """The short stdout of `dskbench pick --out`: the launch command, the step estimate per batch, and
    the files that hold the rest."""
    out = [f"Backend pick: {p.device}, tp={p.tp}"]
    if p.launch is not None:
        out += ["", "Launch command:", "  " + p.launch.command]
        out += ["  " + line for line in launch_notes(p.launch)]
    for pp in p.phases:
        if not pp.batches:
            out += ["", f"{pp.phase}: no measurement"]
            continue
        counts = pp.picker.dep.layer_counts
        layers = f"{counts.get('dense', 0)} dense + {counts.get('moe', 0)} MoE layers + per step"
        out += ["", f"Step estimate, {pp.phase} (µs; {layers}):"]
        v = batch_var(pp.phase)
        width = max(len(f"{v}={e.batch}") for e in pp.estimates)
        out += [f"  {f'{v}={e.batch}':<{width}}  {total_text(e.step)}" for e in pp.estimates]
        if found := disagreements(pp):
            out.append(
                f"  {len(found)} picked results of {pp.phase} have timers that disagree (see the pick's files)"
            )
    out += ["", "Wrote " + ", ".join(written)]
    return "\n".join(out) + "\n"
