"""Table contents shared by the HTML and Markdown reports: rows, problem lists, summaries, formats."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dskbench.analysis.compare import natural_key
from dskbench.report.model import (
    Machine,
    Panel,
    category_of,
    disagreement,
    flags,
    gbps,
    is_plan_skip,
    pct_of_peak,
    status_counts,
    tflops,
)

PROBLEM_ORDER = {"wrong": 0, "error": 1, "unstable": 2, "skipped": 3}


def fmt_num(x: float | None, digits: int = 3) -> str:
    """Three significant digits, thousands separated; '–' for nothing."""
    if x is None or not math.isfinite(x):
        return "–"
    a = abs(x)
    if a >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    if a == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(a)))
    return f"{x:.{min(decimals, 4)}f}"


def fmt_pct(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.0f}%" if x >= 10 else f"{x:.1f}%"


def point_label(point: Mapping[str, Any] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in (point or {}).items())


@dataclass
class Row:
    rec: dict[str, Any]
    phase: str
    x: float
    backend: str
    median: float
    p10: float | None
    p90: float | None
    gbps: float | None
    tflops: float | None
    pct_bw: float | None
    pct_flops: float | None
    flags: list[str]
    fastest: bool = False
    disagree: str = ""  # the two timers disagree: why (its number carries model.DISAGREE_MARK)


def panel_rows(panel: Panel) -> list[Row]:
    """Rows sorted by sweep value then latency; the fastest backend at each value is marked."""
    rows = []
    for backend, recs in panel.ok.items():
        for r in recs:
            t = r.get("timing") or {}
            bw, fl = pct_of_peak(r.get("metrics"))
            rows.append(
                Row(
                    r,
                    str(r.get("phase") or ""),
                    panel.x(r),
                    backend,
                    float(t["median_us"]),
                    t.get("p10_us"),
                    t.get("p90_us"),
                    gbps(r),
                    tflops(r),
                    bw,
                    fl,
                    flags(r),
                    disagree=disagreement(r) or "",
                )
            )
    rows.sort(key=lambda r: (r.x, r.median))
    best: dict[float, Row] = {}
    for r in rows:
        if r.x not in best:
            best[r.x] = r
    if len(panel.ok) > 1:
        for r in best.values():
            r.fastest = True
    return rows


@dataclass
class Problem:
    status: str
    backend: str
    reason: str
    cases: list[dict[str, Any]] = field(default_factory=list)

    @property
    def reclassified(self) -> int:
        """Cases a file holds as ok whose timing the validity rule finds impossible (read as unstable)."""
        return sum(1 for r in self.cases if r.get("reclassified_from"))

    def where(self, limit: int = 12) -> str:
        """The cases, compressed: `input_layernorm · decode · T=1, 2, 4`."""
        groups: dict[str, list[str]] = defaultdict(list)
        for r in self.cases:
            if "point" not in r:
                groups[str(r.get("case_id") or r["kernel"])].append("")
                continue
            op = f"{r.get('op')}:{r['variant']}" if r.get("variant") else str(r.get("op"))
            groups[f"{op} · {r.get('phase')}"].append(point_label(r.get("point")))
        parts = []
        for head, pts in groups.items():
            pts = [p for p in pts if p]
            shown = ", ".join(pts[:limit]) + (f", … ({len(pts)} cases)" if len(pts) > limit else "")
            parts.append(f"{head} · {shown}" if pts else head)
        return "; ".join(parts)


def problems(records: list[dict[str, Any]]) -> list[Problem]:
    """wrong/error/skipped results grouped by (status, backend, reason)."""
    groups: dict[tuple[str, str, str], Problem] = {}
    for r in records:
        if r["status"] == "ok":
            continue
        key = (r["status"], r["backend"]["name"], str(r.get("reason") or ""))
        groups.setdefault(key, Problem(*key)).cases.append(r)
    for p in groups.values():
        p.cases.sort(key=lambda r: natural_key(str(r.get("case_id") or "")))
    return sorted(groups.values(), key=lambda p: (PROBLEM_ORDER.get(p.status, 9), p.backend, p.reason))


def invalid(machine: Machine) -> list[tuple[str, Problem]]:
    """(kernel, cases of one backend and reason) of every unstable result: timed, but the timing is
    impossible (dskbench.measure.validity), so no table, chart or overview shows it as a number."""
    return [
        (kernel, p)
        for kernel in machine.kernels()
        for p in problems(machine.records(kernel))
        if p.status == "unstable"
    ]


@dataclass
class Disagreement:
    """An ok record whose second timer read it outside the normal band (dskbench.measure.cross_check)."""

    kernel: str
    backend: str
    case_id: str
    median: float | None
    note: str


def disagreements(machine: Machine) -> list[Disagreement]:
    """Every latest ok record of the machine whose two timers disagree, in kernel and case order."""
    out = []
    for kernel in machine.kernels():
        for r in machine.records(kernel):
            if r["status"] == "ok" and (why := disagreement(r)):
                median = (r.get("timing") or {}).get("median_us")
                out.append(
                    Disagreement(kernel, r["backend"]["name"], str(r.get("case_id") or kernel), median, why)
                )
    return out


@dataclass
class SummaryRow:
    category: str
    kernels: int
    cases: int
    counts: dict[str, int]
    backends: int = 0


def summary(machine: Machine, categories: Mapping[str, str] | None) -> list[SummaryRow]:
    """Per category: kernels, distinct cases, and result counts by status; a total row last."""
    per: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in machine.records():
        per[category_of(r["kernel"], categories, r)].append(r)
    rows = [_summary_row(cat, recs) for cat, recs in sorted(per.items())]
    rows.append(_summary_row("total", [r for recs in per.values() for r in recs]))
    return rows


def _summary_row(cat: str, recs: list[dict[str, Any]]) -> SummaryRow:
    cases = {r.get("case_id") for r in recs if not is_plan_skip(r)}
    backends = {r["backend"]["name"] for r in recs if not is_plan_skip(r)}
    return SummaryRow(
        cat, len({r["kernel"] for r in recs}), len(cases), dict(status_counts(recs)), len(backends)
    )


def environment_facts(env: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Label/value pairs for the header: machine, driver, library versions, commit, date."""
    dev = env.get("device") or {}
    out: list[tuple[str, str]] = []
    if dev.get("kind") == "cuda":
        sm = dev.get("sm")
        gpu = f"{dev.get('name')} (sm{sm})" if sm else str(dev.get("name"))
        if dev.get("count", 1) and int(dev.get("count") or 1) > 1:
            gpu += f" ×{dev['count']}"
        out.append(("GPU", gpu))
        mem = dev.get("memory_gib") or dev.get("memory_total_gb")
        extra = [
            f"{mem} GiB" if mem else "",
            f"{dev['multiprocessors']} SMs" if dev.get("multiprocessors") else "",
        ]
        if any(extra):
            out.append(("memory / SMs", " · ".join(e for e in extra if e)))
        drv = dev.get("driver_version")
        cuda = dev.get("cuda_driver_version")
        if drv or cuda:
            out.append(("driver", " · ".join(x for x in (drv and f"{drv}", cuda and f"CUDA {cuda}") if x)))
    else:
        cores = f", {dev['cores']} cores" if dev.get("cores") else ""
        out.append(("CPU", f"{dev.get('cpu') or dev.get('name') or 'cpu'}{cores}"))
    if env.get("host"):
        out.append(("host", str(env["host"])))
    versions = env.get("versions") or {}
    shown = [f"{k} {v}" for k, v in versions.items() if v and k not in ("dskbench",)]
    if shown:
        out.append(("versions", " · ".join(shown)))
    git = env.get("git") or {}
    if git.get("commit"):
        out.append(("commit", str(git["commit"])[:12] + (" (dirty)" if git.get("dirty") else "")))
    if env.get("created"):
        out.append(("date", str(env["created"]).replace("T", " ")))
    settings = env.get("settings") or {}
    if settings:
        keys = ("profile", "mode", "phases", "tp", "seed")
        shown_settings = [f"{k} {_short(settings[k])}" for k in keys if settings.get(k) not in (None, "", [])]
        if shown_settings:
            out.append(("settings", " · ".join(shown_settings)))
    return out


CEILING_LABELS = {
    "bandwidth_gbps": ("copy bandwidth", "GB/s"),
    "bf16_tflops": ("bf16 matmul", "TFLOP/s"),
    "fp8_tflops": ("fp8 matmul", "TFLOP/s"),
    "fp4_tflops": ("fp4 matmul", "TFLOP/s"),
}


def ceiling_facts(ceilings: Any) -> list[tuple[str, str]]:
    """The run's measured ceilings, each with how it was measured and whether to trust it.

    Layout of dskbench.measure.ceilings: scalar ``*_gbps``/``*_tflops`` values plus one detail dict per
    measurement (``copy``, ``bf16_matmul``...) holding the same number, its op and its flags; a detail
    with ``error`` is a ceiling that could not be measured. Unknown scalars are shown as they are.
    """
    if not isinstance(ceilings, Mapping):
        return []
    details = {k: v for k, v in ceilings.items() if isinstance(v, Mapping)}
    used: set[str] = set()
    out: list[tuple[str, str]] = []
    for k, v in ceilings.items():
        if k in ("gpu", "sm") or isinstance(v, Mapping) or v is None or isinstance(v, bool):
            continue
        label, unit = CEILING_LABELS.get(k, (k, ""))
        if not isinstance(v, int | float):
            out.append((label, str(v)))
            continue
        text = f"{fmt_num(float(v))} {unit}".strip()
        for name, d in details.items():
            if name not in used and v in (d.get("gbps"), d.get("tflops")):
                used.add(name)
                text += _detail_note(d)
                break
        out.append((label, text))
    for name, d in details.items():
        if name in used:
            continue
        if d.get("error"):
            out.append((name.replace("_", " "), f"not measured: {d['error']}"))
        elif isinstance(d.get("gbps") or d.get("tflops"), int | float):
            val = d.get("gbps") or d.get("tflops")
            out.append((name.replace("_", " "), f"{fmt_num(float(val))}{_detail_note(d)}"))
    return out


# (row, datasheet key, measured ceiling key, unit)
PEAK_ROWS = (
    ("HBM bandwidth", "hbm_gbps", "bandwidth_gbps", "GB/s"),
    ("bf16 dense", "bf16_tflops", "bf16_tflops", "TFLOP/s"),
    ("fp8 dense", "fp8_tflops", "fp8_tflops", "TFLOP/s"),
    ("fp4 dense", "fp4_tflops", "fp4_tflops", "TFLOP/s"),
)


@dataclass
class PeakRow:
    """One peak of a machine: the datasheet figure every % of peak is taken against, and beside it the
    run's measured ceiling with how it was measured and whether metrics used it."""

    label: str
    datasheet: str
    measured: str


def machine_peaks(env: Mapping[str, Any]) -> dict[str, Any] | None:
    """The datasheet peaks of a run: as its environment recorded them, else looked up by device name."""
    from dskbench.measure.peaks import datasheet_peaks

    if isinstance(env.get("peaks"), Mapping):
        return dict(env["peaks"])
    device = env.get("device") or {}
    return datasheet_peaks(device.get("name")) if device.get("kind") == "cuda" else None


def peaks_note(env: Mapping[str, Any]) -> str:
    """What the machine's % of peak is a percentage of."""
    if (env.get("device") or {}).get("kind") != "cuda":
        return ""
    peaks = machine_peaks(env)
    if not peaks:
        return (
            "No datasheet entry for this GPU: no % of peak (dskbench/data/peaks/datasheet.yaml lists them)."
        )
    return f"% of peak is of the datasheet peaks of {peaks.get('name')} ({peaks.get('source', '')})."


def peak_rows(env: Mapping[str, Any]) -> list[PeakRow]:
    """The datasheet peaks with the run's measured ceilings beside them; other measured facts after."""
    from dskbench.measure.ceilings import usable_ceilings

    peaks = machine_peaks(env) or {}
    ceilings = env.get("ceilings") if isinstance(env.get("ceilings"), Mapping) else {}
    measured = dict(ceiling_facts(ceilings))
    _, unused = usable_ceilings(ceilings)
    rows, shown = [], set()
    for label, sheet_key, ceil_key, unit in PEAK_ROWS:
        sheet, clabel = peaks.get(sheet_key), CEILING_LABELS[ceil_key][0]
        text = measured.get(clabel)
        if sheet is None and text is None:
            continue
        shown.add(clabel)
        value = ceilings.get(ceil_key)
        if text and sheet and isinstance(value, int | float) and not isinstance(value, bool):
            text += f", {100 * value / sheet:.0f}% of datasheet"
        if text and ceil_key in unused:
            text += f" — not used: {unused[ceil_key]}"
        rows.append(PeakRow(label, f"{fmt_num(sheet)} {unit}" if sheet else "–", text or "–"))
    return rows + [PeakRow(k, "–", v) for k, v in measured.items() if k not in shown]


def _detail_note(d: Mapping[str, Any]) -> str:
    notes = [str(d["op"])] if d.get("op") else []
    if d.get("throttled"):
        notes.append("⚠ throttled")
    if d.get("converged") is False:
        notes.append("not converged")
    return f" ({'; '.join(notes)})" if notes else ""


def _short(v: Any) -> str:
    if isinstance(v, float):
        return fmt_num(v, 4)
    if isinstance(v, list | tuple):
        return ",".join(str(x) for x in v)
    return str(v)


# -- the landing overview ------------------------------------------------------------------------------

OVERVIEW_X = ("T", "B")  # the batch variables of decode: tokens, or requests (attention, sampling)


@dataclass
class Cell:
    """The fastest correct backend at one point, and the others measured there (for a tooltip)."""

    backend: str
    median: float
    pct: float | None
    others: list[tuple[str, float]]  # (backend, median µs), fastest first


@dataclass
class OverviewRow:
    kernel: str
    category: str
    names: str  # the op and its same-shape twins
    fixed: dict[str, Any]
    anchor: str  # the panel's id in the page
    cells: dict[float, Cell]
    failed: dict[float, str] = field(default_factory=dict)  # points measured with no correct result: status

    def failed_text(self, x: float) -> str:
        """What a point without a number says: no valid measurement (its timings were all impossible), or
        no correct result (some were wrong or failed)."""
        return "no valid measurement" if self.failed.get(x) == "unstable" else "no correct result"


@dataclass
class Overview:
    x_var: str
    xs: list[float]
    rows: list[OverviewRow]


def pct_of_bound(rec: dict[str, Any]) -> float | None:
    """% of the datasheet peak that bounds the case: the larger of its % of datasheet bandwidth and
    compute (the roofline's floor over the latency; records of any age carry both)."""
    vals = [x for x in pct_of_peak(rec.get("metrics")) if x is not None]
    return max(vals) if vals else None


def overview(machine: Machine, categories: Mapping[str, str] | None) -> list[Overview]:
    """Per decode batch variable, one row per (kernel, op) panel: the fastest correct backend at each point.

    Only decode panels swept over T or B; with other variables fixed (kv_len, tp), one row per tp and the
    middle value of the others (the kernel's section has them all)."""
    from dskbench.report.model import kernel_anchor, panels

    chosen: dict[tuple, Panel] = {}
    order: list[tuple] = []
    by_key: dict[tuple, list[Panel]] = defaultdict(list)
    kernel_of: dict[tuple, str] = {}
    for kernel in machine.kernels():
        for p in panels(machine.records(kernel)):
            if "decode" not in p.phases or p.x_var not in OVERVIEW_X:
                continue
            key = (kernel, p.name, p.x_var, p.fixed.get("tp"))
            if key not in by_key:
                order.append(key)
            by_key[key].append(p)
            kernel_of[key] = kernel
    for key in order:
        cands = sorted(by_key[key], key=lambda p: tuple(sorted(p.fixed.items())))
        chosen[key] = cands[(len(cands) - 1) // 2]
    tables: dict[str, Overview] = {}
    for key in order:
        p, kernel = chosen[key], kernel_of[key]
        per_x: dict[float, list[tuple[float, str, dict[str, Any]]]] = defaultdict(list)
        for backend, recs in p.ok.items():
            for r in recs:
                if r.get("phase") == "decode":
                    per_x[p.x(r)].append((float(r["timing"]["median_us"]), backend, r))
        if not per_x:
            continue
        cells = {}
        for x, items in per_x.items():
            items.sort(key=lambda t: (t[0], t[1]))
            med, backend, rec = items[0]
            cells[x] = Cell(backend, med, pct_of_bound(rec), [(b, m) for m, b, _ in items[1:]])
        failed: dict[float, set[str]] = defaultdict(set)
        for r in machine.records(kernel):
            pt = r.get("point") or {}
            if (
                r["status"] != "ok"
                and r.get("phase") == "decode"
                and (r.get("op"), r.get("variant")) == (p.op, p.variant)
                and p.x_var in pt
                and all(pt.get(k) == v for k, v in p.fixed.items())
                and float(pt[p.x_var]) not in cells
            ):
                failed[float(pt[p.x_var])].add(r["status"])
        first = next(iter(p.ok.values()))[0]
        row = OverviewRow(
            kernel,
            category_of(kernel, categories, first),
            p.names,
            dict(p.fixed),
            p.anchor(kernel_anchor(machine.slug, kernel)),
            cells,
            {x: "/".join(sorted(st, key=lambda q: PROBLEM_ORDER.get(q, 9))) for x, st in failed.items()},
        )
        tables.setdefault(p.x_var, Overview(p.x_var, [], [])).rows.append(row)
    out = []
    for x_var in OVERVIEW_X:
        if x_var in tables:
            t = tables[x_var]
            t.xs = sorted({x for r in t.rows for x in [*r.cells, *r.failed]})
            t.rows.sort(key=lambda r: (natural_key(r.names), r.kernel.lower(), str(r.fixed)))
            out.append(t)
    return out
