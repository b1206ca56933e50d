"""A Pick as JSON for machines (pick.json, schema dskbench.pick/1): every cell with its winner, runner-up,
margin and tie rule, what was left out and why, the step estimate and the server flag choices."""

from __future__ import annotations

from typing import Any

from dskbench.pick.choose import Cell, Outcome, Pick, RowPick, Total
from dskbench.pick.index import batch_var
from dskbench.pick.tables import RULE, disagreements

SCHEMA = "dskbench.pick/1"


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
    if o.path.fuses:
        d["fuses"] = list(o.path.fuses)
    if o.separate:
        d["separate_rows"] = list(o.separate)  # their winners are in median_us
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
            "batch_var": batch_var(pp.phase),
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
                    "folded": e.folded,
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
            "timers_disagree": disagreements(pp),
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
            "speculative": p.launch.speculative,
        },
        "phases": phases,
    }
