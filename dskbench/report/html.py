"""The self-contained HTML page: inline CSS, inline SVG charts, a few lines of JS; nothing fetched.

Size stays proportional to the results (about 0.6 kB per result record): each kernel is one collapsed
<details> section, history lines carry no per-point markers, and problems are grouped by reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from html import escape
from typing import Any

from dskbench.analysis.compare import Stat, format_number
from dskbench.report import svg
from dskbench.report.model import (
    CPU_NOTE,
    History,
    Machine,
    Panel,
    category_of,
    flags,
    gbps,
    history,
    is_unmeasured,
    kernel_anchor,
    panels,
    slug,
    status_counts,
)
from dskbench.report.tables import (
    Problem,
    Row,
    ceiling_facts,
    environment_facts,
    fmt_num,
    fmt_pct,
    overview,
    panel_rows,
    problems,
    summary,
)

STATUS_ORDER = ("ok", "wrong", "skipped", "error")
COMPUTE_INTENSITY = 4.0  # FLOPs per byte above which the compute chart is drawn
OPEN_TABLE_ROWS = 12  # longer tables start collapsed, so the charts of a kernel stay in view
X_LABELS = {"T": "T (tokens)", "B": "B (requests)", "kv_len": "kv_len (tokens)", "tp": "TP degree"}


def e(x: Any) -> str:
    return escape(str(x), quote=True)


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
    n_records = sum(len(r.results) for m in machines for r in m.runs)
    n_runs = sum(len(m.runs) for m in machines)
    hist = {(m.name, k): history(m, k) for m in machines for k in m.kernels()}
    body = [
        "<header><h1>dskbench report</h1>",
        f'<p class="sub">DeepSeek-V3/R1 kernel microbenchmarks · generated {e(generated)} · '
        f"{n_runs} run{'s' if n_runs != 1 else ''} · {n_records} result records · "
        f"{len(machines)} machine{'s' if len(machines) != 1 else ''}"
        + (f' · <a class="csv" href="{e(csv_href)}">all results as CSV</a>' if csv_href else "")
        + "</p></header><main>",
    ]
    for m in machines:
        body.append(_overview(m, categories, colors))
    body.append('<section class="machines">')
    for m in machines:
        body.append(_machine_card(m, categories))
    body.append("</section>")
    body.append(_changes_section(machines, hist, threshold))
    body.append(
        '<div class="toolbar"><input id="flt" type="search" placeholder="filter kernels (name or category)">'
        '<label><input id="onlyprob" type="checkbox"> only kernels with wrong/error results</label>'
        '<button id="expand">expand all</button><button id="collapse">collapse all</button></div>'
    )
    for m in machines:
        body.append(f'<section class="kernels"><h2 id="k-{m.slug}">Kernels on {e(m.name)}</h2>')
        if m.is_cpu:
            body.append(f'<div class="banner">{e(CPU_NOTE)}</div>')
        unmeasured = [k for k in m.kernels() if is_unmeasured(m.records(k))]
        for k in m.kernels():
            if k not in unmeasured:
                body.append(_kernel_section(m, k, categories, colors, hist.get((m.name, k)), threshold))
        if unmeasured:
            body.append(_unmeasured_list(m, unmeasured, categories))
        body.append("</section>")
    body.append(
        "<footer>Latency is the median per launch; bars span p10–p90 of the samples. "
        "GB/s and TFLOP/s use the minimum traffic of each case. ★ marks the fastest backend at a point; "
        '<span class="thr">◯</span> a throttled measurement; hollow points did not converge. '
        "wrong results are never plotted.</footer></main>"
    )
    return _page("".join(body))


def _page(body: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">'
        f"<title>dskbench report</title><style>{CSS}{svg.CSS}</style></head><body>{body}"
        f"<script>{JS}</script></body></html>\n"
    )


# -- the landing overview --------------------------------------------------------------------------------


def _overview(m: Machine, categories: Mapping[str, str] | None, colors: dict[str, str]) -> str:
    """Which backend is fastest where: per op and decode batch size, the fastest correct backend."""
    tables = overview(m, categories)
    if not tables:
        return ""
    out = [
        f'<div class="card overview" id="o-{m.slug}"><h2>Fastest backend on {e(m.name)} (decode)</h2>'
        '<p class="note">Per op and batch size: the backend with the lowest median latency among the correct '
        "ones (wrong results never win), its median in µs and its % of the peak that bounds the case. "
        "Each cell links to the op's charts; hover for the other backends.</p>"
    ]
    if m.is_cpu:
        out.append(f'<div class="banner">{e(CPU_NOTE)}</div>')
    for t in tables:
        out.append(
            f'<div class="ovwrap"><table class="ov" data-x="{e(t.x_var)}"><thead><tr><th>op</th><th>kernel</th>'
            + "".join(f"<th class=n>{e(t.x_var)}={_x(x)}</th>" for x in t.xs)
            + "</tr></thead><tbody>"
        )
        last = None
        for row in t.rows:
            fixed = "".join(f" <small>{e(k)}={e(v)}</small>" for k, v in row.fixed.items())
            first = row.names != last  # an op's rows (one per kernel) under one name
            last = row.names
            cells = []
            for x in t.xs:
                c = row.cells.get(x)
                if c is None:
                    st = row.failed.get(x)
                    cells.append(
                        f'<td class="w st-{e(st.split("/")[0])}" title="no correct result">'
                        f'<a href="#{e(row.anchor)}">no correct result<br>{e(st)}</a></td>'
                        if st
                        else "<td></td>"
                    )
                    continue
                tip = f"{c.backend}: {fmt_num(c.median)} µs" + "".join(
                    f" · {b}: {fmt_num(v)} µs" for b, v in c.others
                )
                pct = f"<small>{fmt_pct(c.pct)}</small>" if c.pct is not None else ""
                cells.append(
                    f'<td class="w" title="{e(tip)}"><a href="#{e(row.anchor)}">'
                    f'<i style="background:{colors.get(c.backend, "#333")}"></i>{e(c.backend)}'
                    f"<br><b>{fmt_num(c.median)}</b> µs {pct}</a></td>"
                )
            out.append(
                f'<tr{" class=first" if first else ""}><td class="op">{e(row.names) if first else ""}{fixed}</td>'
                f'<td><a href="#{e(kernel_anchor(m.slug, row.kernel))}">{e(row.kernel)}</a></td>'
                f"{''.join(cells)}</tr>"
            )
        out.append("</tbody></table></div>")
    out.append("</div>")
    return "".join(out)


def _x(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _unmeasured_list(m: Machine, kernels: list[str], categories: Mapping[str, str] | None) -> str:
    """Kernels with nothing measured (not in the model, no adapter, another GPU...), folded into one list."""
    out = [
        f'<details class="unmeasured" id="u-{m.slug}"><summary>{len(kernels)} kernel'
        f"{'s' if len(kernels) != 1 else ''} not measured (skipped)</summary>"
        "<table><thead><tr><th>kernel</th><th>category</th><th>why</th></tr></thead><tbody>"
    ]
    for k in kernels:
        recs = m.records(k)
        reasons = sorted({str(r.get("reason") or "") for r in recs} - {""})
        out.append(
            f'<tr id="{kernel_anchor(m.slug, k)}"><td class="kname">{e(k)}</td>'
            f"<td>{e(category_of(k, categories, recs[0]))}</td>"
            f'<td class="why">{"<br>".join(e(r) for r in reasons)}</td></tr>'
        )
    out.append("</tbody></table></details>")
    return "".join(out)


# -- header ----------------------------------------------------------------------------------------------


def _machine_card(m: Machine, categories: Mapping[str, str] | None) -> str:
    env = m.newest
    out = [f'<div class="card machine" id="m-{m.slug}"><h2>{e(m.name)}</h2>']
    if m.is_cpu:
        out.append(f'<div class="banner">{e(CPU_NOTE)}</div>')
    out.append('<div class="cols"><dl>')
    for k, v in environment_facts(env):
        out.append(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>")
    out.append("</dl>")
    ceil = ceiling_facts(env.get("ceilings"))
    if ceil:
        out.append('<dl class="ceil"><dt class="h">measured ceilings</dt><dd></dd>')  # % peak uses these
        for k, v in ceil:
            out.append(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>")
        out.append("</dl>")
    out.append("</div>")
    if len(m.runs) > 1:
        out.append('<p class="runs">runs: ')
        items = []
        for r in m.runs:
            git = r.environment.get("git") or {}
            c = str(git.get("commit") or "?")[:8] + ("+dirty" if git.get("dirty") else "")
            items.append(
                f"<code>{e(c)}</code> {e(str(r.environment.get('created', ''))[:16].replace('T', ' '))}"
            )
        out.append(" → ".join(items) + " (tables show the latest result of each case)</p>")
    out.append(_summary_table(m, categories))
    out.append("</div>")
    return "".join(out)


def _summary_table(m: Machine, categories: Mapping[str, str] | None) -> str:
    out = [
        '<table class="summary"><thead><tr><th>category</th><th>kernels</th><th>cases</th><th>backends</th>'
        + "".join(f'<th class="st-{s}">{s}</th>' for s in STATUS_ORDER)
        + "</tr></thead><tbody>"
    ]
    for row in summary(m, categories):
        cls = ' class="total"' if row.category == "total" else ""
        cells = "".join(
            f'<td class="n{" st-" + s if row.counts.get(s) and s != "ok" else ""}">{row.counts.get(s, 0)}</td>'
            for s in STATUS_ORDER
        )
        out.append(
            f"<tr{cls}><td>{e(row.category)}</td><td class=n>{row.kernels}</td><td class=n>{row.cases}</td>"
            f"<td class=n>{row.backends}</td>{cells}</tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def _changes_section(
    machines: list[Machine], hist: dict[tuple[str, str], History | None], threshold: float
) -> str:
    """The regression dashboard: per machine, what changed between its last two commits."""
    parts = []
    for m in machines:
        rows = []
        labels = None
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
            rows.append((k, len(h.values), slower, faster, noisy, worst, best))
        if not rows:
            continue
        parts.append(
            f'<div class="card"><h2>Changes on {e(m.name)}: <code>{e(labels[0])}</code> → '  # type: ignore[index]
            f"<code>{e(labels[1])}</code></h2>"  # type: ignore[index]
            f'<p class="note">A change counts when the median moves by more than {threshold:.0%} and the p10 '
            "moves beyond the case's run-to-run noise floor (its history at earlier commits, else the "
            "band prior of its latency), with a rank test on the samples agreeing: dskbench compare's rule "
            "(dskbench/analysis/verdict.py). Each measurement once: shared_with twins are not counted.</p>"
            '<table class="changes"><thead><tr><th>kernel</th><th>series</th><th>slower / broke</th>'
            "<th>faster / fixed</th><th>within noise</th><th>largest slowdown</th><th>largest speed-up</th>"
            "</tr></thead><tbody>"
        )
        for k, n, slower, faster, noisy, worst, best in rows:
            anchor = f"{m.slug}--{slug(k)}"
            parts.append(
                f'<tr><td><a href="#{anchor}">{e(k)}</a></td><td class=n>{n}</td>'
                f'<td class="n{" bad" if slower else ""}">{len(slower)}</td>'
                f'<td class="n{" good" if faster else ""}">{len(faster)}</td><td class=n>{len(noisy)}</td>'
                f"<td>{_change_cell(worst)}</td><td>{_change_cell(best)}</td></tr>"
            )
        parts.append("</tbody></table></div>")
    return "".join(parts)


def _change_cell(c: tuple | None) -> str:
    if c is None:
        return ""
    case, backend, _verdict, change, _old, _new = c
    return f"{change:+.1%} <small>{e(_short_case(case))} · {e(backend)}</small>"


def _short_case(case: str) -> str:
    return case.split("/", 1)[1] if "/" in case else case


# -- one kernel ------------------------------------------------------------------------------------------


def _kernel_section(
    m: Machine,
    kernel: str,
    categories: Mapping[str, str] | None,
    colors: dict[str, str],
    h: History | None,
    threshold: float,
) -> str:
    recs = m.records(kernel)
    counts = status_counts(recs)
    cat = category_of(kernel, categories, recs[0] if recs else None)
    probs = problems(recs)
    bad = counts["wrong"] + counts["error"]
    badges = "".join(f'<span class="b st-{s}">{s} {counts[s]}</span>' for s in STATUS_ORDER if counts[s])
    backends = sorted({r["backend"]["name"] for r in recs if r["status"] == "ok"})
    regress = ""
    if h is not None:
        n_slow = sum(1 for c in h.changes(threshold) if c[2] in ("slower", "broke"))
        if n_slow:
            regress = f'<span class="b bad">{n_slow} regressions vs {e(h.commits[-2][1])}</span>'
    out = [
        f'<details class="kernel" id="{kernel_anchor(m.slug, kernel)}" data-name="{e(kernel.lower())} {e(cat.lower())}"'
        f' data-bad="{1 if bad else 0}"><summary><span class="kname">{e(kernel)}</span>'
        f'<span class="cat">{e(cat)}</span>{badges}{regress}'
        f'<span class="bk">{e(", ".join(backends))}</span></summary><div class="body">'
    ]
    for p in panels(recs):
        out.append(_panel(p, colors, m.is_cpu, recs, p.anchor(kernel_anchor(m.slug, kernel))))
    if probs:
        out.append(_problems_table(probs))
    if h is not None:
        out.append(_history_block(h, colors, threshold))
    out.append("</div></details>")
    return "".join(out)


def _panel(
    p: Panel, colors: dict[str, str], is_cpu: bool, all_recs: list[dict[str, Any]], anchor: str = ""
) -> str:
    rows = panel_rows(p)
    wrong_at = _wrong_points(p, all_recs)
    lat_series, bw_series, tf_series = [], [], []
    for backend, recs in p.ok.items():
        color = colors.get(backend, "#333")
        lat, bw, tf = [], [], []
        for r in recs:
            t = r["timing"]
            fl = flags(r)
            hollow = t.get("converged") is False
            ring = bool((r.get("clocks") or {}).get("throttled"))
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
    legend = []
    for backend, recs in p.ok.items():
        b = recs[0]["backend"]
        title = " · ".join(str(x) for x in (b.get("kind"), b.get("package"), b.get("version")) if x)
        if b.get("dispatches_to"):
            title += f" · dispatches to {b['dispatches_to']}"
        warn = f' <span class="warn">(wrong at {wrong_at[backend]})</span>' if backend in wrong_at else ""
        legend.append(
            f'<span class="lg" title="{e(title)}"><i style="background:{colors.get(backend, "#333")}"></i>'
            f"{e(backend)}{warn}</span>"
        )
    twins = ' <span class="twins">same shapes, measured once</span>' if p.twins else ""
    head = f"<h4>{e(p.title)}{' <small>CPU reference</small>' if is_cpu else ''}{twins}</h4>"
    pid = f' id="{e(anchor)}"' if anchor else ""
    return (
        f'<div class="panel"{pid}>{head}<div class="legend">{"".join(legend)}</div>'
        f'<div class="charts">{"".join(charts)}</div>{_results_table(p, rows)}</div>'
    )


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
    """The measured bandwidth peak the metrics were computed against (gbps / pct), when recorded."""
    vals = sorted(r.gbps * 100 / r.pct_bw for r in rows if r.gbps and r.pct_bw and r.pct_bw > 0)
    return vals[len(vals) // 2] if vals else None


def _flop_ceiling(rows: list[Row]) -> float | None:
    """The compute peak the % of compute was taken against (TFLOP/s / pct): measured, else datasheet."""
    vals = sorted(r.tflops * 100 / r.pct_flops for r in rows if r.tflops and r.pct_flops and r.pct_flops > 0)
    return vals[len(vals) // 2] if vals else None


def _peak_label(v: float | None, unit: str) -> str:
    return f"peak {fmt_num(v)} {unit}" if v else ""


def _wrong_points(p: Panel, recs: list[dict[str, Any]]) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    for r in recs:
        if r["status"] == "wrong" and r.get("op") == p.op and r.get("variant") == p.variant:
            pt = r.get("point") or {}
            if all(pt.get(k) == v for k, v in p.fixed.items()):
                out.setdefault(r["backend"]["name"], []).append(f"{p.x_var}={pt.get(p.x_var)}")
    return {b: ", ".join(v) for b, v in out.items()}


def _results_table(p: Panel, rows: list[Row]) -> str:
    multi_phase = len(p.phases) > 1
    out = [
        f'<details class="tbl"{" open" if len(rows) <= OPEN_TABLE_ROWS else ""}><summary>table · {len(rows)} results</summary><table class="res"><thead><tr>'
        + ("<th>phase</th>" if multi_phase else "")
        + f"<th>{e(p.x_var)}</th><th>backend</th><th>µs</th><th>p10–p90</th><th>GB/s</th><th>TFLOP/s</th>"
        "<th>% BW peak</th><th>% compute peak</th><th>notes</th></tr></thead><tbody>"
    ]
    group, last_x = 0, None
    for r in rows:
        if r.x != last_x:
            group ^= 1
            last_x = r.x
        x_val = r.rec["point"].get(p.x_var, "")
        star = " ★" if r.fastest else ""
        note = " ".join(
            f'<span class="{"thr" if f.startswith("throttled") else "nc"}">{e(f)}</span>' for f in r.flags
        )
        spread = f"{fmt_num(r.p10)}–{fmt_num(r.p90)}" if r.p10 is not None and r.p90 is not None else "–"
        out.append(
            f'<tr class="g{group}">'
            + (f"<td>{e(r.phase)}</td>" if multi_phase else "")
            + f"<td class=n>{e(x_val)}</td><td{' class=best' if r.fastest else ''}>{e(r.backend)}{star}</td>"
            f"<td class=n>{fmt_num(r.median)}</td><td class=n>{spread}</td><td class=n>{fmt_num(r.gbps)}</td>"
            f"<td class=n>{fmt_num(r.tflops) if r.tflops else '–'}</td><td class=n>{fmt_pct(r.pct_bw)}</td>"
            f"<td class=n>{fmt_pct(r.pct_flops)}</td><td>{note}</td></tr>"
        )
    out.append("</tbody></table></details>")
    return "".join(out)


def _problems_table(probs: list[Problem]) -> str:
    out = [
        '<div class="problems"><h4>Not measured</h4><table><thead><tr><th>status</th><th>backend</th>'
        "<th>reason</th><th>cases</th></tr></thead><tbody>"
    ]
    for pr in probs:
        out.append(
            f'<tr><td><span class="b st-{pr.status}">{pr.status}</span></td><td>{e(pr.backend)}</td>'
            f'<td class="why">{e(pr.reason)}</td><td>{e(pr.where())}</td></tr>'
        )
    out.append("</tbody></table></div>")
    return "".join(out)


def _history_block(h: History, colors: dict[str, str], threshold: float) -> str:
    labels = [label for _, label, _ in h.commits]
    thin: list[svg.Series] = []
    per_backend: dict[str, list[list[float | None]]] = {}
    for (case, backend), stats in h.values.items():
        ratios = _ratios(stats)
        per_backend.setdefault(backend, []).append(ratios)
        pts = [svg.Point(i, r) for i, r in enumerate(ratios) if r is not None]
        thin.append(
            svg.Series(f"{_short_case(case)} · {backend}", colors.get(backend, "#333"), pts, 1.0, 0.35, False)
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
        "latency per commit, relative to the first commit measured",
        svg.Axis("commit (oldest → newest)", labels=labels),
        svg.Axis("× latency at first commit"),
        width=640,
        height=300,
        y_zero=False,
        ref_line=1.0,
        y_include=(0.95, 1.05),  # +-2% of noise must not look like a trend
    )
    changes = h.changes(threshold)
    out = [
        f'<div class="history"><h4>History across {len(labels)} commits</h4><div class="charts">{chart}</div>'
    ]
    if changes:
        out.append(
            f'<table class="res"><thead><tr><th>case</th><th>backend</th><th>{e(labels[-2])} µs</th>'
            f"<th>{e(labels[-1])} µs</th><th>change</th><th>verdict</th></tr></thead><tbody>"
        )
        for case, backend, verdict, change, old, new in changes[:60]:
            cls = (
                "bad" if verdict in ("slower", "broke") else "good" if verdict in ("faster", "fixed") else ""
            )
            out.append(
                f"<tr><td>{e(_short_case(case))}</td><td>{e(backend)}</td><td class=n>{_stat(old)}</td>"
                f"<td class=n>{_stat(new)}</td><td class=n>{'' if change is None else f'{change:+.1%}'}</td>"
                f'<td class="{cls}">{e(verdict)}</td></tr>'
            )
        out.append("</tbody></table>")
        if len(changes) > 60:
            out.append(
                f'<p class="note">… and {len(changes) - 60} more (dskbench compare lists them all)</p>'
            )
    else:
        out.append(f'<p class="note">No change beyond {threshold:.0%} at the latest commit.</p>')
    out.append("</div>")
    return "".join(out)


def _ratios(stats: list[Stat | None]) -> list[float | None]:
    base = next((s.value for s in stats if s is not None and s.status == "ok" and s.value), None)
    return [
        s.value / base if base and s is not None and s.status == "ok" and s.value else None for s in stats
    ]


def _stat(s: Stat) -> str:
    if s.status != "ok" or s.value is None:
        return e(s.status)
    return format_number(s.value)


# -- assets ----------------------------------------------------------------------------------------------

CSS = """
*{box-sizing:border-box}
body{margin:0;background:#f4f5f7;color:#1d2127;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
header{background:#1f2937;color:#fff;padding:18px 28px}
header h1{margin:0;font-size:22px;font-weight:650}
header .sub{margin:4px 0 0;color:#cbd5e1;font-size:13px}
main{max-width:1340px;margin:0 auto;padding:18px 24px 40px}
h2{font-size:17px;margin:6px 0 10px}
h4{margin:16px 0 4px;font-size:14px}
h4 small{color:#b45309;font-weight:500}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;background:#eef0f3;padding:1px 4px;border-radius:3px}
.card{background:#fff;border:1px solid #e0e3e8;border-radius:8px;padding:14px 18px;margin-bottom:16px}
.machines{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:16px}
.machines .card{margin:0}
.cols{display:flex;gap:4px 28px;flex-wrap:wrap}
dl{display:grid;grid-template-columns:max-content 1fr;align-content:start;gap:2px 12px;margin:0 0 10px;font-size:13px;flex:1;min-width:260px}
dt{color:#6b7280}dd{margin:0;word-break:break-word}
dl.ceil{flex:0 1 360px}dt.h{font-weight:600;color:#374151}
.banner{background:#fff7e6;border:1px solid #f5c26b;color:#8a5300;padding:6px 10px;border-radius:6px;margin:6px 0 10px;font-weight:600}
.runs{font-size:12px;color:#4b5563;margin:0 0 8px}
table{border-collapse:collapse;font-size:12.5px;margin:4px 0}
th{background:#f1f3f6;text-align:left;font-weight:600;padding:4px 8px;border-bottom:1px solid #d9dde3;white-space:nowrap}
td{padding:3px 8px;border-bottom:1px solid #eef0f3;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.total td{font-weight:600;border-top:1px solid #c9ccd1}
tr.g1 td{background:#fafbfc}
td.best{font-weight:600}
td.st-wrong,th.st-wrong{color:#7e22ce}td.st-error,th.st-error{color:#b91c1c}td.st-skipped,th.st-skipped{color:#6b7280}
.b{display:inline-block;font-size:11.5px;padding:0 7px;border-radius:9px;margin-left:6px;background:#eef0f3;color:#374151}
.b.st-ok{background:#e7f6ec;color:#166534}.b.st-wrong{background:#f3e8ff;color:#6b21a8}
.b.st-error{background:#fde8e8;color:#991b1b}.b.st-skipped{background:#eef0f3;color:#4b5563}
.b.bad,.bad{color:#b91c1c;font-weight:600}.b.bad{background:#fde8e8}.good{color:#15803d;font-weight:600}
.toolbar{position:sticky;top:0;z-index:2;background:#f4f5f7;padding:8px 0;display:flex;gap:14px;align-items:center;flex-wrap:wrap;font-size:13px}
.toolbar input[type=search]{padding:5px 9px;border:1px solid #c9ccd1;border-radius:6px;width:280px}
.toolbar button{padding:4px 10px;border:1px solid #c9ccd1;background:#fff;border-radius:6px;cursor:pointer}
details.kernel{background:#fff;border:1px solid #e0e3e8;border-radius:8px;margin:8px 0}
details.kernel>summary{cursor:pointer;padding:9px 14px;list-style-position:inside}
details.kernel[open]>summary{border-bottom:1px solid #e8eaee}
.kname{font-weight:650;font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:13.5px}
.cat{color:#6b7280;font-size:12px;margin-left:10px}
.bk{color:#6b7280;font-size:12px;margin-left:12px}
.body{padding:4px 16px 14px}
.panel{border-bottom:1px dashed #e3e6ea;padding-bottom:8px}
.legend{display:flex;gap:14px;flex-wrap:wrap;font-size:12.5px;margin:2px 0 4px}
.lg i{display:inline-block;width:18px;height:4px;border-radius:2px;vertical-align:middle;margin-right:5px}
.warn{color:#7e22ce}
.charts{display:flex;gap:10px;flex-wrap:wrap}
details.tbl>summary{cursor:pointer;color:#4b5563;font-size:12.5px;margin:4px 0}
.thr{color:#D62728}.nc{color:#b45309}
td.why{max-width:520px;word-break:break-word}
.note{color:#6b7280;font-size:12.5px;margin:4px 0}
footer{color:#6b7280;font-size:12px;margin-top:22px}
.hide{display:none}
header a.csv{color:#93c5fd}
.ovwrap{overflow-x:auto}
table.ov td{white-space:nowrap;font-size:11.5px;border-bottom:none}
table.ov tr.first td{border-top:1px solid #e3e6ea}
table.ov td.op{white-space:normal;max-width:300px;font-weight:600}
table.ov td.w a{color:inherit;text-decoration:none;display:block}
table.ov td.w:hover{background:#eef4ff}
table.ov td.w i{display:inline-block;width:9px;height:9px;border-radius:2px;margin-right:4px}
table.ov small{color:#6b7280;font-weight:400}
.twins{color:#6b7280;font-weight:400;font-size:12px;margin-left:8px}
details.unmeasured{background:#fff;border:1px solid #e0e3e8;border-radius:8px;margin:14px 0;padding:6px 14px}
details.unmeasured>summary{cursor:pointer;color:#4b5563}
"""

JS = """
(function(){
const ks=[...document.querySelectorAll('details.kernel')];
const f=document.getElementById('flt'),p=document.getElementById('onlyprob');
function apply(){const q=f.value.trim().toLowerCase();
 ks.forEach(k=>{const show=(!q||k.dataset.name.includes(q))&&(!p.checked||k.dataset.bad==='1');
 k.classList.toggle('hide',!show);});}
f.addEventListener('input',apply);p.addEventListener('change',apply);
document.getElementById('expand').onclick=()=>ks.forEach(k=>{if(!k.classList.contains('hide'))k.open=true;});
document.getElementById('collapse').onclick=()=>ks.forEach(k=>k.open=false);
function openHash(){const id=decodeURIComponent(location.hash.slice(1));const el=id&&document.getElementById(id);
 if(!el)return;for(let d=el;d;d=d.parentElement){if(d.tagName==='DETAILS'){d.open=true;d.classList.remove('hide');}}
 el.scrollIntoView();}
window.addEventListener('hashchange',openHash);openHash();
})();
"""
