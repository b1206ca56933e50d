"""The Markdown report: the same tables as the HTML page, without charts (for PRs and terminals)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from dskbench.analysis.compare import format_number
from dskbench.analysis.over_peak import over_peak
from dskbench.report.model import (
    CPU_NOTE,
    DISAGREE_MARK,
    History,
    Machine,
    category_of,
    history,
    is_unmeasured,
    panels,
    run_points,
    status_counts,
)
from dskbench.report.tables import (
    disagreements,
    environment_facts,
    fmt_num,
    fmt_pct,
    invalid,
    overview,
    panel_rows,
    peak_rows,
    peaks_note,
    problems,
    summary,
)
from dskbench.results.records import STATUSES

STATUS_ORDER = STATUSES


def cell(s: object) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def table(head: list[str], rows: list[list[str]], right: set[int] | None = None) -> list[str]:
    right = right or set()
    align = ["---:" if i in right else "---" for i in range(len(head))]
    out = ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return out + [""]


def render(
    machines: list[Machine], categories: Mapping[str, str] | None, generated: str, threshold: float = 0.05
) -> str:
    out = ["# dskbench report", "", f"Generated {generated}. Latency: median per launch, p10–p90 spread.", ""]
    for m in machines:
        out += _machine(m, categories, threshold)
    return "\n".join(out).rstrip() + "\n"


def _machine(m: Machine, categories: Mapping[str, str] | None, threshold: float) -> list[str]:
    out = [f"## {m.name}", ""]
    if m.is_cpu:
        out += [f"> **{CPU_NOTE}**", ""]
    env = m.newest
    out += table(["", ""], [[f"**{k}**", v] for k, v in environment_facts(env)])
    peaks = peak_rows(env)
    if peaks:
        head = ["peak", "datasheet (the % of peak)", "measured ceilings (this run)"]
        out += table(head, [[p.label, p.datasheet, p.measured] for p in peaks], {1})
    if note := peaks_note(env):
        out += [note, ""]
    out += _over_peak(m)
    if len(m.runs) > 1:
        labels = [label for _, label in run_points(m.runs)]
        out += [
            f"Runs (oldest first): {' → '.join(labels)}; tables show the latest result of each case.",
            "",
        ]
    rows = [
        [r.category, str(r.kernels), str(r.cases), str(r.backends)]
        + [str(r.counts.get(s, 0)) for s in STATUS_ORDER]
        for r in summary(m, categories)
    ]
    out += ["### Summary", ""]
    out += table(
        ["category", "kernels", "cases", "backends", *STATUS_ORDER],
        rows,
        set(range(1, 4 + len(STATUS_ORDER))),
    )
    out += _overview(m, categories)
    out += _invalid(m)
    out += _disagreements(m)
    hist = {k: history(m, k) for k in m.kernels()}
    out += _changes(hist, threshold)
    unmeasured = [k for k in m.kernels() if is_unmeasured(m.records(k))]
    for k in m.kernels():
        if k not in unmeasured:
            out += _kernel(m, k, categories, hist.get(k), threshold)
    if unmeasured:
        out += [f"### Not measured ({len(unmeasured)} kernels, skipped)", ""]
        for k in unmeasured:
            reasons = sorted({str(r.get("reason") or "") for r in m.records(k)} - {""})
            out.append(f"- **{k}** — {'; '.join(reasons)}")
        out.append("")
    return out


def _over_peak(m: Machine) -> list[str]:
    """Results above 100% of a datasheet peak: traffic-model errors to fix in their adapters."""
    found = over_peak(m.latest.values())
    if not found:
        return []
    out = [
        f"### Above 100% of the datasheet peak ({len(found)} result{'s' if len(found) != 1 else ''})",
        "",
        "No kernel beats the datasheet: each of these counts bytes or FLOPs its kernel does not move or "
        "compute; its adapter's traffic model needs fixing.",
        "",
    ]
    rows = [
        [o.kernel, o.backend, o.op, o.case_id, o.quantity, f"{fmt_num(o.achieved)} {o.unit}", fmt_pct(o.pct)]
        for o in found
    ]
    head = ["kernel", "backend", "op", "case", "peak", "achieved", "% of datasheet"]
    return out + table(head, rows, {5, 6})


def _overview(m: Machine, categories: Mapping[str, str] | None) -> list[str]:
    """The fastest correct backend per op and decode batch size: backend, median µs, % of peak."""
    out = []
    for t in overview(m, categories):
        xs = [f"{t.x_var}={int(x) if float(x).is_integer() else x}" for x in t.xs]
        rows = []
        for r in t.rows:
            fixed = " ".join(f"{k}={v}" for k, v in r.fixed.items())
            cells = []
            for x in t.xs:
                c = r.cells.get(x)
                pct = f" ({fmt_pct(c.pct)})" if c is not None and c.pct is not None else ""
                if c is None:
                    cells.append(f"{r.failed_text(x)} ({r.failed[x]})" if x in r.failed else "")
                else:
                    cells.append(f"{c.backend} {fmt_num(c.median)}{pct}")
            rows.append([f"{r.names} {fixed}".strip(), r.kernel, *cells])
        out += [f"### Fastest correct backend at decode, by {t.x_var} (µs, % of datasheet peak)", ""]
        out += table(["op", "kernel", *xs], rows)
    return out


def _invalid(m: Machine) -> list[str]:
    """Every unstable result: timed, but the timing is impossible, so shown nowhere as a number."""
    found = invalid(m)
    if not found:
        return []
    n = sum(len(p.cases) for _, p in found)
    out = [
        f"### Invalid measurements ({n})",
        "",
        "Timed, but the timing is impossible (measured twice; results files written before that rule "
        "hold them as ok): never in a table, chart or the overview. `dskbench run --resume "
        "--retry-errors` measures them again.",
        "",
    ]
    for kernel, p in found:
        old = f" ({p.reclassified} recorded ok by an earlier version)" if p.reclassified else ""
        out.append(f"- **{kernel}** · {p.backend} · {p.reason}{old} — {p.where()}")
    return out + [""]


def _disagreements(m: Machine) -> list[str]:
    """Every ok result whose second timer disagreed: kept and shown, its number marked."""
    found = disagreements(m)
    if not found:
        return []
    out = [
        f"### Timers disagree ({len(found)})",
        "",
        f"Each case is read briefly by a second timer (CUDA events for a case CUPTI timed, CUPTI for one "
        f"the events timed). These read outside the band the two normally keep: the number stands, marked "
        f"{DISAGREE_MARK}, but one of the timers may not be timing the kernel alone (docs/measurement.md).",
        "",
    ]
    for d in found:
        out.append(f"- **{d.kernel}** · {d.backend} · {d.case_id} · {fmt_num(d.median)} µs — {d.note}")
    return out + [""]


def _changes(hist: dict[str, History | None], threshold: float) -> list[str]:
    rows = []
    labels = None
    for k, h in hist.items():
        if h is None:
            continue
        labels = (h.commits[-2][1], h.commits[-1][1])
        for case, backend, verdict, change, old, new in h.changes(threshold):
            if verdict in ("slower", "broke", "faster", "fixed"):
                pct = "" if change is None else f"{change:+.1%}"
                rows.append([k, case.split("/", 1)[-1], backend, _v(old), _v(new), pct, verdict])
    if labels is None:
        return []
    out = [f"### Changes {labels[0]} → {labels[1]}", ""]
    if not rows:
        return out + [f"No change beyond {threshold:.0%} outside the noise.", ""]
    return out + table(
        ["kernel", "case", "backend", "old µs", "new µs", "change", "verdict"], rows, {3, 4, 5}
    )


def _v(s) -> str:
    return s.status if s.status != "ok" or s.value is None else format_number(s.value)


def _kernel(m: Machine, kernel: str, categories, h: History | None, threshold: float) -> list[str]:
    recs = m.records(kernel)
    c = status_counts(recs)
    cat = category_of(kernel, categories, recs[0] if recs else None)
    counts = ", ".join(f"{s} {c[s]}" for s in STATUS_ORDER if c[s])
    out = [f"### {kernel} ({cat}) — {counts}", ""]
    for p in panels(recs):
        rows = panel_rows(p)
        multi = len(p.phases) > 1
        head = (["phase"] if multi else []) + [
            p.x_var,
            "backend",
            "µs",
            "p10–p90",
            "GB/s",
            "TFLOP/s",
            "% datasheet BW",
            "% datasheet compute",
            "notes",
        ]
        body = []
        for r in rows:
            spread = f"{fmt_num(r.p10)}–{fmt_num(r.p90)}" if r.p10 is not None and r.p90 is not None else "–"
            body.append(
                ([r.phase] if multi else [])
                + [
                    str(r.rec["point"].get(p.x_var, "")),
                    f"**{r.backend}** ★" if r.fastest else r.backend,
                    fmt_num(r.median) + (f" {DISAGREE_MARK}" if r.disagree else ""),
                    spread,
                    fmt_num(r.gbps),
                    fmt_num(r.tflops) if r.tflops else "–",
                    fmt_pct(r.pct_bw),
                    fmt_pct(r.pct_flops),
                    "; ".join(
                        ("⚠ " if f.startswith(("throttled", "shared GPU")) else "") + f for f in r.flags
                    ),
                ]
            )
        off = 1 if multi else 0
        out += [f"#### {p.title}", ""] + table(
            head, body, {off, off + 2, off + 3, off + 4, off + 5, off + 6, off + 7}
        )
    probs = [p for p in problems(recs) if p.status != "unstable"]  # those are listed above
    if probs:
        out += ["Not measured:", ""]
        out += [f"- **{pr.status}** · {pr.backend} · {pr.reason} — {pr.where()}" for pr in probs] + [""]
    if h is not None:
        out += _history(h, threshold)
    return out


def _history(h: History, threshold: float) -> list[str]:
    labels = [label for _, label, _ in h.commits]
    per_backend: dict[str, list[list[float | None]]] = {}
    for (_case, backend), stats in h.values.items():
        base = next((s.value for s in stats if s is not None and s.status == "ok" and s.value), None)
        ratios = [s.value / base if base and s and s.status == "ok" and s.value else None for s in stats]
        per_backend.setdefault(backend, []).append(ratios)
    rows = []
    for backend, series in sorted(per_backend.items()):
        row = [backend]
        for i in range(len(labels)):
            vals = [r[i] for r in series if r[i]]
            row.append(f"×{math.exp(sum(math.log(v) for v in vals) / len(vals)):.3f}" if vals else "–")
        rows.append(row)
    out = [
        f"History (geometric mean of latency relative to each series' first point, {len(h.values)} series):",
        "",
    ]
    out += table(["backend", *labels], rows, set(range(1, len(labels) + 1)))
    changes = [c for c in h.changes(threshold) if c[2] in ("slower", "broke", "faster", "fixed")]
    if changes:
        out += [f"Changed at {labels[-1]}: " + ", ".join(
            f"{case.split('/', 1)[-1]} · {b} {'' if ch is None else f'{ch:+.1%}'} ({v})"
            for case, b, v, ch, _o, _n in changes[:20]
        ) + (f" … and {len(changes) - 20} more" if len(changes) > 20 else ""), ""]  # fmt: skip
    return out
