"""Renders a Pick: Markdown (terminal, PRs), a standalone HTML page, and JSON for machines.

The tables are built once (`tables()`) and written out by both text renderers, so they always agree.
"""

from __future__ import annotations

import re
from collections import defaultdict
from html import escape
from typing import Any

from dskbench.analysis.compare import format_number
from dskbench.analysis.pick import (
    Cell,
    Estimate,
    FlagChoice,
    Launch,
    Outcome,
    PhasePick,
    Pick,
    RowPick,
    Total,
)

SCHEMA = "dskbench.pick/1"
RULE = (
    "winner = lowest median among correct (status ok) candidates; a path sums its kernels' medians and "
    "combines their p10-p90 half-widths in quadrature. 'tie' unless the runner-up is slower beyond "
    "run-to-run noise, dskbench compare's rule: its p10 is above the winner's by more than the noise floor "
    "of the winner's latency band (dskbench/analysis/noise_prior.json) and, when both kept >= 8 raw samples, a "
    "two-sided Mann-Whitney U test gives p < 0.001."
)
SCOPE_NAMES = {
    "step": "once per step",
    "nextn": "NextN layer (speculative decoding)",
    "spec": "EAGLE, per step",
}


def us(x: float) -> str:
    return format_number(x)


def _var(phase: str) -> str:
    return "B" if phase == "decode" else "T"


def _short(s: str, n: int = 140) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 1] + "…"


def cell_text(c: Cell) -> str:
    w, r = c.winner, c.runner_up
    if w is None:
        if not c.excluded and not c.skipped:
            return "no measurement"
        n = [(len(c.excluded), "wrong/error"), (len(c.skipped), "skipped"), (len(c.missing), "unmeasured")]
        return "✗ none correct: " + ", ".join(f"{k} {what}" for k, what in n if k)
    s = f"**{w.name}** {us(w.median)}"
    if r is not None:
        sign = "≈" if c.tie else "›"
        s += f" {sign} {r.name} +{c.margin:.1%}" + (" tie" if c.tie else "")
    return s


def total_text(t: Total, names: int = 3) -> str:
    """A sum, or, when rows lack a measurement, the partial sum marked incomplete with what it lacks
    (the first `names` of them; the step table's note lists them all)."""
    if t.complete:
        return us(t.us)
    n = len(t.missing)
    shown = ", ".join(t.missing[:names]) + (", …" if n > names else "")
    what = f"incomplete: lacks {n} op{'s' if n != 1 else ''}: {shown}"
    return f"≥ {us(t.us)} ({what})" if t.us else f"– ({what})"


def tables(pp: PhasePick, layer_counts: dict[str, int]) -> list[tuple[str, list[str], list[list[str]], str]]:
    """(title, head, rows, note) of every table of one phase."""
    v = _var(pp.phase)
    cols = [f"{v}={b}" for b in pp.batches]
    out = []
    pick_rows = []
    last_scope = "layer"
    for rp in pp.rows:
        if rp.row.scope != last_scope:
            pick_rows.append([f"*{SCOPE_NAMES.get(rp.row.scope, rp.row.scope)}*"] + [""] * len(cols))
            last_scope = rp.row.scope
        kind = (
            {"dense": " [dense]", "moe": " [MoE]"}.get(rp.row.layers or "", "")
            if rp.row.scope == "layer"
            else ""
        )
        pick_rows.append([rp.label + kind] + [cell_text(rp.cells[b]) for b in pp.batches])
    out.append(
        (
            "Fastest correct backend per op (median µs)",
            ["op"] + cols,
            pick_rows,
            "› runner-up and how much slower; ≈ … tie: inside run-to-run noise. [dense]/[MoE]: rows of "
            "those layers only.",
        )
    )
    n_dense, n_moe = layer_counts.get("dense", 0), layer_counts.get("moe", 0)
    ests = pp.estimates
    kv = ests[0].kv_len if ests else None
    est_rows = [
        [f"dense layer (×{n_dense})"] + [total_text(e.dense_layer) for e in ests],
        [f"MoE layer (×{n_moe})"] + [total_text(e.moe_layer) for e in ests],
    ]
    if any(e.per_step.us or e.per_step.missing for e in ests):
        est_rows.append(["once per step"] + [total_text(e.per_step) for e in ests])
    est_rows.append(
        [f"**step** ({n_dense} dense + {n_moe} MoE layers + per step)"]
        + [f"**{total_text(e.step)}**" for e in ests]
    )
    if any(e.spec_step is not None for e in ests):
        est_rows.append(
            ["step with NextN speculative decoding"]
            + [total_text(e.spec_step) if e.spec_step else "–" for e in ests]
        )
    lacking = _lacking(ests, pp.phase)
    note = f"µs; attention read at kv_len={kv}. " + (
        "Sums of the winners above. A sum that lacks an op's measurement is a lower bound, marked "
        "≥ … (incomplete: lacks …), never a total. "
    )
    if ests and ests[0].spec_note:
        note += "Speculative: " + ests[0].spec_note + ". "
    out.append((f"Step estimate ({pp.phase})", [""] + cols, est_rows, note + lacking))
    share_rows = []
    for rp in pp.rows:
        if rp.row.scope not in ("layer", "step") or (rp.kv_len is not None and rp.kv_len != kv):
            continue
        cells = []
        for e in ests:
            x = e.contributions.get(rp.row.name)
            cells.append(f"{us(x)} ({x / e.step.us:.1%})" if x is not None and e.step.us else "–")
        share_rows.append([rp.row.name] + cells)
    share_note = (
        "Where the step is incomplete, the shares are of its measured rows only."
        if any(not e.step.complete for e in ests)
        else ""
    )
    out.append(
        (
            "Where the step goes (µs per step, share of the measured step)",
            ["op"] + cols,
            share_rows,
            share_note,
        )
    )
    flag_rows = []
    flags = sorted({f.flag for b in pp.batches for f in pp.flags.get(b, [])})
    for flag in flags:
        cells = []
        for b in pp.batches:
            fc = next((f for f in pp.flags.get(b, []) if f.flag == flag), None)
            cells.append(_flag_cell(fc))
        flag_rows.append([f"`{flag}`"] + cells)
    if flag_rows:
        out.append(
            (
                "SGLang server flags",
                ["flag"] + cols,
                flag_rows,
                "The value with the lowest per-step total over every row the flag sets (one flag sets them "
                "all); rows whose own winner wants another value are named.",
            )
        )
    return out


def _flag_cell(fc: FlagChoice | None) -> str:
    if fc is None:
        return "–"
    if fc.value is None:
        return "no value measured for every row"
    s = fc.value
    if fc.disagree:
        s += " (not the winner of " + ", ".join(fc.disagree) + ")"
    return s


def _lacking(ests: list[Estimate], phase: str) -> str:
    by_row: dict[str, list[int]] = defaultdict(list)
    for e in ests:
        for m in e.step.missing:
            by_row[m].append(e.batch)
    if not by_row:
        return ""
    v = _var(phase)
    parts = [f"{r} ({v}={','.join(map(str, bs))})" if len(bs) < len(ests) else r for r, bs in by_row.items()]
    return f"Lacking ({len(by_row)} ops): " + "; ".join(parts) + "."


def details(pp: PhasePick) -> list[tuple[str, list[str]]]:
    """Per row: wrong/error (excluded), skipped and unmeasured candidates with the batch points and the
    first reason, and the fastest what-if where it beats the pick."""
    v = _var(pp.phase)

    def at(bs: list[int]) -> str:
        return "at every point" if len(bs) == len(pp.batches) else f"at {v}={','.join(map(str, bs))}"

    out = []
    for rp in pp.rows:
        empty = [
            b
            for b in pp.batches
            if not (c := rp.cells[b]).ranked and not c.what_if and not c.excluded and not c.skipped
        ]
        groups: dict[tuple[str, str], list[int]] = defaultdict(list)
        first: dict[tuple[str, str], str] = {}
        faster = []
        for b in pp.batches:
            c = rp.cells[b]
            for o in (*c.excluded, *c.skipped, *([] if b in empty else c.missing)):
                groups[(o.name, o.status)].append(b)
                first.setdefault((o.name, o.status), o.reason)
            w = c.winner
            best = c.what_if[0] if c.what_if else None
            if best is not None and (w is None or best.median < w.median):
                than = f" (pick {us(w.median)})" if w else ""
                faster.append(f"{v}={b}: {best.name} {us(best.median)}{than}")
        lines = [f"no measurement {at(empty)}"] if empty else []
        for (name, status), bs in groups.items():
            word = "no measurement" if status == "missing" else status
            reason = first[(name, status)]
            if status == "missing" and not any(len(c.parts) > 1 for c in rp.candidates if c.name == name):
                reason = ""  # one kernel: its name says it all
            lines.append(f"{name}: {word} {at(bs)}" + (f" — {_short(reason, 200)}" if reason else ""))
        if faster:
            lines.append("what-if faster than the pick: " + "; ".join(faster))
        if lines:
            out.append((rp.label, lines))
    return out


# -- Markdown ----------------------------------------------------------------------------------------------


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
        "Candidates and paths: dskbench/data/shapes/deployment.yaml.",
        "",
        "Rule: " + RULE,
        "",
    ]


def launch_notes(launch: Launch) -> list[str]:
    """What the one command leaves open: flags whose choice depends on the load, flags left unset."""
    out = []
    if launch.varies:
        out.append(
            "The choice depends on the batch (the command takes the most frequent one; "
            "`dskbench pick --batch N` picks for one load): " + "; ".join(launch.varies) + "."
        )
    if launch.unset:
        out.append(
            "Not set (no value has a measurement for every row it sets; SGLang's default applies): "
            + ", ".join(launch.unset)
            + "."
        )
    return out


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
        v = _var(pp.phase)
        width = max(len(f"{v}={e.batch}") for e in pp.estimates)
        out += [f"  {f'{v}={e.batch}':<{width}}  {total_text(e.step)}" for e in pp.estimates]
    out += ["", "Wrote " + ", ".join(written)]
    return "\n".join(out) + "\n"


# -- HTML --------------------------------------------------------------------------------------------------


def _h(s: str) -> str:
    x = escape(str(s))
    x = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", x)
    x = re.sub(r"`(.+?)`", r"<code>\1</code>", x)
    return re.sub(r"^\*(.+)\*$", r"<i>\1</i>", x)


def _html_cell(s: str) -> str:
    cls = (
        ' class="incomplete"'
        if "(incomplete: " in s
        else ' class="tie"'
        if s.endswith(" tie")
        else ' class="none"'
        if s.startswith(("✗", "no measurement", "not run"))
        else ""
    )
    return f"<td{cls}>{_h(s)}</td>"


def render_html(p: Pick) -> str:
    body = [
        f"<header><h1>{escape(f'Backend pick: {p.device}, tp={p.tp}')}</h1>",
        f'<p class="sub">{escape(", ".join(p.inputs))} · {len(p.runs)} runs</p></header><main>',
        f'<p class="note">{escape(RULE)}</p>',
    ]
    if p.launch is not None:
        body.append(f"<h2>Launch command</h2><pre>{escape(p.launch.command)}</pre>")
        body += [f'<p class="note">{_h(line)}</p>' for line in launch_notes(p.launch)]
    for pp in p.phases:
        body.append(f"<h2>{escape(pp.phase)}</h2>")
        if not pp.batches:
            body.append("<p>No measurement for this phase.</p>")
            continue
        for title, head, rows, note in tables(pp, pp.picker.dep.layer_counts):
            body.append(
                f"<h3>{escape(title)}</h3><table><tr>" + "".join(f"<th>{_h(h)}</th>" for h in head) + "</tr>"
            )
            for r in rows:
                body.append("<tr>" + f"<th>{_h(r[0])}</th>" + "".join(_html_cell(x) for x in r[1:]) + "</tr>")
            body.append("</table>")
            if note:
                body.append(f'<p class="note">{escape(note)}</p>')
        det = details(pp)
        if det:
            body.append("<h3>Excluded, skipped and unmeasured candidates</h3><ul>")
            for label, lines in det:
                items = "".join(f"<li>{escape(line)}</li>" for line in lines)
                body.append(f"<li><b>{escape(label)}</b><ul>{items}</ul></li>")
            body.append("</ul>")
        if pp.unassigned:
            body.append(f'<h3>Results no row uses</h3><p class="note">{escape("; ".join(pp.unassigned))}</p>')
    body.append("</main>")
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>dskbench pick</title>'
        f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n"
    )


CSS = """
body{margin:0;background:#f4f5f7;color:#1d2127;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
header{background:#1f2937;color:#fff;padding:16px 26px}header h1{margin:0;font-size:21px}
header .sub{margin:4px 0 0;color:#cbd5e1;font-size:13px}
main{max-width:1500px;margin:0 auto;padding:14px 24px 40px}
table{border-collapse:collapse;font-size:12.5px;margin:4px 0 8px;background:#fff}
th{background:#f1f3f6;text-align:left;font-weight:600;padding:4px 8px;border-bottom:1px solid #d9dde3;white-space:nowrap}
td{padding:3px 8px;border-bottom:1px solid #eef0f3;white-space:nowrap}
td.tie{background:#fff7e6}td.incomplete{background:#fdecec;color:#7f1d1d}td.none{color:#6b7280}
code{font:12px ui-monospace,Menlo,monospace;background:#eef0f3;padding:1px 4px;border-radius:3px}
.note{color:#4b5563;font-size:12.5px;max-width:1100px}
li{font-size:12.5px}
pre{font:12.5px ui-monospace,Menlo,monospace;background:#1f2937;color:#f9fafb;padding:10px 14px;border-radius:4px;white-space:pre-wrap;word-break:break-all}
"""


# -- JSON --------------------------------------------------------------------------------------------------


def _outcome_json(o: Outcome) -> dict[str, Any]:
    d: dict[str, Any] = {"backend": o.name, "status": o.status, "flags": dict(o.path.flags)}
    if o.stat is not None:
        d.update(median_us=o.stat.value, p10_us=o.stat.lo, p90_us=o.stat.hi)
    if o.reason:
        d["reason"] = o.reason
    if o.path.what_if:
        d["what_if"] = o.path.what_if
    if o.path.note:
        d["note"] = o.path.note
    parts = []
    for pr in o.parts:
        m = pr.chosen
        part = {
            "op": pr.part.op,
            "kernels": list(pr.part.kernels),
            "variant": pr.part.variant,
            "status": pr.status,
        }
        if m is not None:
            part.update(
                kernel=m.kernel,
                backend=m.backend,
                case_id=m.record.get("case_id"),
                median_us=m.stat.value,
                label=(m.record.get("backend") or {}).get("label"),
            )
        parts.append(part)
    d["parts"] = parts
    return d


def _cell_json(c: Cell) -> dict[str, Any]:
    w = c.winner
    d: dict[str, Any] = {"status": "ok" if w else "none"}
    if w is not None:
        d.update(_outcome_json(w))
        r = c.runner_up
        d["runner_up"] = _outcome_json(r) if r else None
        d["margin"] = c.margin
        d["tie"] = c.tie
        d["tie_rule"] = c.how
    d["excluded"] = [{"backend": o.name, "status": o.status, "reason": o.reason} for o in c.excluded]
    d["skipped"] = [{"backend": o.name, "reason": o.reason} for o in c.skipped]
    d["no_measurement"] = [{"backend": o.name, "reason": o.reason} for o in c.missing]
    d["what_if"] = [_outcome_json(o) for o in c.what_if]
    return d


def _total_json(t: Total | None) -> dict[str, Any] | None:
    return None if t is None else {"us": t.us, "complete": t.complete, "missing": list(t.missing)}


def _row_json(rp: RowPick) -> dict[str, Any]:
    r = rp.row
    return {
        "row": r.name,
        "op": r.op,
        "ops": list(r.ops),
        "variant": r.variant,
        "kv_len": rp.kv_len,
        "scope": r.scope,
        "layers": r.layers,
        "calls": r.calls,
        "picks": {str(b): _cell_json(c) for b, c in rp.cells.items()},
    }


def render_json(p: Pick) -> dict[str, Any]:
    phases: dict[str, Any] = {}
    for pp in p.phases:
        phases[pp.phase] = {
            "batch_var": _var(pp.phase),
            "batches": pp.batches,
            "rows": [_row_json(rp) for rp in pp.rows],
            "estimate": {
                str(e.batch): {
                    "kv_len": e.kv_len,
                    "dense_layer": _total_json(e.dense_layer),
                    "moe_layer": _total_json(e.moe_layer),
                    "per_step": _total_json(e.per_step),
                    "step": _total_json(e.step),
                    "spec_step": _total_json(e.spec_step),
                    "spec_note": e.spec_note,
                    "contributions_us": e.contributions,
                }
                for e in pp.estimates
            },
            "server_flags": {
                str(b): [
                    {
                        "flag": f.flag,
                        "value": f.value,
                        "totals": {v: {"us": t[0], "missing": t[1]} for v, t in f.totals.items()},
                        "disagree": f.disagree,
                    }
                    for f in fcs
                ]
                for b, fcs in pp.flags.items()
            },
            "layer_counts": dict(pp.picker.dep.layer_counts),
            "unassigned": pp.unassigned,
        }
    return {
        "schema": SCHEMA,
        "device": p.device,
        "tp": p.tp,
        "kv_len": p.kv_len,
        "inputs": p.inputs,
        "runs": p.runs,
        "rule": RULE,
        "threshold": p.threshold,
        "launch": None
        if p.launch is None
        else {
            "command": p.launch.command,
            "argv": p.launch.argv,
            "varies": p.launch.varies,
            "unset": p.launch.unset,
        },
        "phases": phases,
    }
