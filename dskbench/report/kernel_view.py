"""One kernel's section of the HTML report, ready for its template: per panel the legend, the inline SVG
charts (latency, bandwidth, compute) and the results table; the problems; the history across commits.

The charts are built here (dskbench.report.svg) and passed to the template as markup; everything else is
data the template (templates/report_kernel.html.j2) writes out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup

from dskbench.analysis.compare import Stat, format_number
from dskbench.report import svg
from dskbench.report.model import (
    History,
    Machine,
    Panel,
    category_of,
    flags,
    gbps,
    kernel_anchor,
    panels,
    status_counts,
)
from dskbench.report.tables import Problem, Row, fmt_num, panel_rows, problems
from dskbench.results.records import STATUSES

STATUS_ORDER = STATUSES
COMPUTE_INTENSITY = 4.0  # FLOPs per byte above which the compute chart is drawn
OPEN_TABLE_ROWS = 12  # longer tables start collapsed, so the charts of a kernel stay in view
HISTORY_ROWS = 60  # changes listed under the history chart; dskbench compare lists them all
X_LABELS = {"T": "T (tokens)", "B": "B (requests)", "kv_len": "kv_len (tokens)", "tp": "TP degree"}


@dataclass
class LegendEntry:
    backend: str
    color: str
    title: str  # kind · package · version · dispatches to
    wrong_at: str = ""  # points where this backend was wrong
    invalid_at: str = ""  # points where its timing was impossible (unstable)


@dataclass
class TableRow:
    row: Row
    x: Any  # the point's value of the panel's variable, as recorded
    group: int  # 0/1, alternating with x


@dataclass
class PanelView:
    anchor: str
    title: str
    x_var: str
    cpu: bool
    twins: bool
    multi_phase: bool
    legend: list[LegendEntry]
    charts: list[Markup]
    rows: list[TableRow]

    @property
    def open(self) -> bool:
        return len(self.rows) <= OPEN_TABLE_ROWS


@dataclass
class HistoryChange:
    case: str
    backend: str
    verdict: str
    change: str  # "+12.0%", or "" when not comparable
    old: str
    new: str
    cls: str  # bad | good | ""


@dataclass
class HistoryView:
    labels: list[str]
    chart: Markup
    changes: list[HistoryChange]  # the first HISTORY_ROWS
    more: int  # changes not listed


@dataclass
class KernelView:
    anchor: str
    name: str
    category: str
    counts: dict[str, int]  # status -> results, in STATUS_ORDER, nonzero only
    bad: bool  # some wrong or error result
    backends: list[str]  # those with an ok result
    regressions: int
    since: str  # the commit the regressions are against
    panels: list[PanelView] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)  # wrong, error, skipped
    invalid: list[Problem] = field(default_factory=list)  # unstable: timed, the timing impossible
    history: HistoryView | None = None


def short_case(case: str) -> str:
    return case.split("/", 1)[1] if "/" in case else case


def kernel_view(
    m: Machine,
    kernel: str,
    categories: Mapping[str, str] | None,
    colors: dict[str, str],
    h: History | None,
    threshold: float,
) -> KernelView:
    recs = m.records(kernel)
    counts = status_counts(recs)
    anchor = kernel_anchor(m.slug, kernel)
    n_slow = sum(1 for c in h.changes(threshold) if c[2] in ("slower", "broke")) if h is not None else 0
    probs = problems(recs)
    return KernelView(
        anchor=anchor,
        name=kernel,
        category=category_of(kernel, categories, recs[0] if recs else None),
        counts={s: counts[s] for s in STATUS_ORDER if counts[s]},
        bad=bool(counts["wrong"] + counts["error"]),
        backends=sorted({r["backend"]["name"] for r in recs if r["status"] == "ok"}),
        regressions=n_slow,
        since=h.commits[-2][1] if h is not None else "",
        panels=[panel_view(p, colors, m.is_cpu, recs, p.anchor(anchor)) for p in panels(recs)],
        problems=[p for p in probs if p.status != "unstable"],
        invalid=[p for p in probs if p.status == "unstable"],
        history=history_view(h, colors, threshold) if h is not None else None,
    )


# -- a panel ---------------------------------------------------------------------------------------------


def panel_view(p: Panel, colors: dict[str, str], is_cpu: bool, all_recs: list[dict[str, Any]], anchor: str):
    rows = panel_rows(p)
    wrong_at = _points(p, all_recs, "wrong")
    invalid_at = _points(p, all_recs, "unstable")
    legend = []
    for backend, recs in p.ok.items():
        b = recs[0]["backend"]
        title = " · ".join(str(x) for x in (b.get("kind"), b.get("package"), b.get("version")) if x)
        if b.get("dispatches_to"):
            title += f" · dispatches to {b['dispatches_to']}"
        legend.append(
            LegendEntry(
                backend,
                colors.get(backend, "#333"),
                title,
                wrong_at.get(backend, ""),
                invalid_at.get(backend, ""),
            )
        )
    table, group, last_x = [], 0, None
    for r in rows:
        if r.x != last_x:
            group ^= 1
            last_x = r.x
        table.append(TableRow(r, r.rec["point"].get(p.x_var, ""), group))
    return PanelView(
        anchor=anchor,
        title=p.title,
        x_var=p.x_var,
        cpu=is_cpu,
        twins=bool(p.twins),
        multi_phase=len(p.phases) > 1,
        legend=legend,
        charts=_charts(p, rows, colors),
        rows=table,
    )


def _charts(p: Panel, rows: list[Row], colors: dict[str, str]) -> list[Markup]:
    """Latency always; bandwidth where some case has GB/s; compute where some case is compute-heavy."""
    lat_series, bw_series, tf_series = [], [], []
    for backend, recs in p.ok.items():
        color = colors.get(backend, "#333")
        lat, bw, tf = [], [], []
        for r in recs:
            t = r["timing"]
            fl = flags(r)
            hollow = t.get("converged") is False
            ring = bool((r.get("clocks") or {}).get("throttled")) or bool(r.get("shared_gpu"))
            g = gbps(r)
            tip = (
                f"{backend} · {p.x_var}={r['point'].get(p.x_var)} · {fmt_num(t['median_us'])} µs "
                f"(p10 {fmt_num(t.get('p10_us'))} – p90 {fmt_num(t.get('p90_us'))})"
                + (f" · {fmt_num(g)} GB/s" if g else "")
                + ("".join(f" · {f}" for f in fl))
            )
            x = p.x(r)
            lat.append(svg.Point(x, t["median_us"], t.get("p10_us"), t.get("p90_us"), hollow, ring, tip))
            if g:
                lo = g * t["median_us"] / t["p90_us"] if t.get("p90_us") else None
                hi = g * t["median_us"] / t["p10_us"] if t.get("p10_us") else None
                bw.append(svg.Point(x, g, lo, hi, hollow, ring))
            tfl = (r.get("metrics") or {}).get("tflops")
            if isinstance(tfl, int | float) and tfl > 0:
                tf.append(svg.Point(x, float(tfl), None, None, hollow, ring))
        lat_series.append(svg.Series(backend, color, lat))
        bw_series.append(svg.Series(backend, color, bw))
        tf_series.append(svg.Series(backend, color, tf))
    xlog = _log_ok([pt.x for s in lat_series for pt in s.points])
    x_axis = svg.Axis(X_LABELS.get(p.x_var, p.x_var), log=xlog)
    lat_vals = [pt.y for s in lat_series for pt in s.points if pt.y > 0]
    lat_log = bool(lat_vals) and max(lat_vals) / min(lat_vals) > 10
    charts = [
        svg.line_chart(
            lat_series, "latency", x_axis, svg.Axis("µs (median, p10–p90)", log=lat_log), width=400
        )
    ]
    if any(s.points for s in bw_series):
        ceiling = _bw_ceiling(rows)
        charts.append(
            svg.line_chart(
                bw_series,
                "bandwidth",
                x_axis,
                svg.Axis("GB/s"),
                width=400,
                ref_line=ceiling,
                ref_label=_peak_label(ceiling, "GB/s"),
            )
        )
    if any(s.points for s in tf_series) and _compute_heavy(rows):
        peak = _flop_ceiling(rows)
        charts.append(
            svg.line_chart(
                tf_series,
                "compute",
                x_axis,
                svg.Axis("TFLOP/s"),
                width=400,
                ref_line=peak,
                ref_label=_peak_label(peak, "TFLOP/s"),
            )
        )
    return [Markup(c) for c in charts]  # svg.py escapes every text it writes


def _compute_heavy(rows: list[Row]) -> bool:
    """Whether a TFLOP/s chart says anything: some case does >= 4 FLOPs per byte (GEMM, attention),
    not the nominal FLOPs of an elementwise kernel."""
    for r in rows:
        t = r.rec.get("traffic") or {}
        if (t.get("flops") or 0) >= COMPUTE_INTENSITY * max(t.get("bytes") or 0, 1):
            return True
    return False


def _log_ok(xs: list[float]) -> bool:
    pos = [x for x in xs if x > 0]
    return len(pos) == len(xs) and len(set(pos)) > 2 and max(pos) / min(pos) >= 8


def _bw_ceiling(rows: list[Row]) -> float | None:
    """The datasheet bandwidth the % was taken against (gbps / pct), when recorded."""
    vals = sorted(r.gbps * 100 / r.pct_bw for r in rows if r.gbps and r.pct_bw and r.pct_bw > 0)
    return vals[len(vals) // 2] if vals else None


def _flop_ceiling(rows: list[Row]) -> float | None:
    """The datasheet compute rate the % of compute was taken against (TFLOP/s / pct), when recorded."""
    vals = sorted(r.tflops * 100 / r.pct_flops for r in rows if r.tflops and r.pct_flops and r.pct_flops > 0)
    return vals[len(vals) // 2] if vals else None


def _peak_label(v: float | None, unit: str) -> str:
    return f"datasheet {fmt_num(v)} {unit}" if v else ""


def _points(p: Panel, recs: list[dict[str, Any]], status: str) -> dict[str, str]:
    """Backend -> the panel's points where its result has `status`: `T=1, T=4`."""
    out: dict[str, list[str]] = {}
    for r in recs:
        if r["status"] == status and r.get("op") == p.op and r.get("variant") == p.variant:
            pt = r.get("point") or {}
            if all(pt.get(k) == v for k, v in p.fixed.items()):
                out.setdefault(r["backend"]["name"], []).append(f"{p.x_var}={pt.get(p.x_var)}")
    return {b: ", ".join(v) for b, v in out.items()}


# -- history ---------------------------------------------------------------------------------------------


def history_view(h: History, colors: dict[str, str], threshold: float) -> HistoryView:
    labels = [label for _, label, _ in h.commits]
    thin: list[svg.Series] = []
    per_backend: dict[str, list[list[float | None]]] = {}
    for (case, backend), stats in h.values.items():
        ratios = _ratios(stats)
        per_backend.setdefault(backend, []).append(ratios)
        pts = [svg.Point(i, r) for i, r in enumerate(ratios) if r is not None]
        thin.append(
            svg.Series(f"{short_case(case)} · {backend}", colors.get(backend, "#333"), pts, 1.0, 0.35, False)
        )
    thick = []
    for backend, rows in sorted(per_backend.items()):
        pts = []
        for i in range(len(labels)):
            vals = [r[i] for r in rows if r[i] is not None and r[i] > 0]
            if vals:
                gm = math.exp(sum(math.log(v) for v in vals) / len(vals))
                pts.append(
                    svg.Point(
                        i, gm, tip=f"{backend} at {labels[i]}: geometric mean ×{gm:.3f} ({len(vals)} cases)"
                    )
                )
        thick.append(svg.Series(f"{backend} (geometric mean)", colors.get(backend, "#333"), pts, 2.6))
    chart = svg.line_chart(
        thin + thick,
        "latency per point (commit or release), relative to the first point measured",
        svg.Axis("point (oldest → newest)", labels=labels),
        svg.Axis("× latency at the first point"),
        width=640,
        height=300,
        y_zero=False,
        ref_line=1.0,
        y_include=(0.95, 1.05),  # +-2% of noise must not look like a trend
    )
    changes = h.changes(threshold)
    listed = [
        HistoryChange(
            short_case(case),
            backend,
            verdict,
            "" if change is None else f"{change:+.1%}",
            _stat(old),
            _stat(new),
            "bad" if verdict in ("slower", "broke") else "good" if verdict in ("faster", "fixed") else "",
        )
        for case, backend, verdict, change, old, new in changes[:HISTORY_ROWS]
    ]
    return HistoryView(labels, Markup(chart), listed, max(len(changes) - HISTORY_ROWS, 0))


def _ratios(stats: list[Stat | None]) -> list[float | None]:
    base = next((s.value for s in stats if s is not None and s.status == "ok" and s.value), None)
    return [
        s.value / base if base and s is not None and s.status == "ok" and s.value else None for s in stats
    ]


def _stat(s: Stat) -> str:
    if s.status != "ok" or s.value is None:
        return s.status
    return format_number(s.value)
