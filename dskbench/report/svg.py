"""Small inline-SVG line charts: log or linear axes, error bars, marked points, no dependencies.

Why our own: the report must open offline (no CDN) and stay small with a few hundred charts; a chart
here is one path per series, one path for its error bars and one circle per point (with a tooltip).
The classes it writes are styled by the pages' shared stylesheet (templates/style.css).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

# Colour-blind-safe palette (Okabe-Ito, then Tableau extras); a backend keeps its colour across charts.
PALETTE = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#56B4E9",
    "#D55E00",
    "#7F7F7F",
    "#9467BD",
    "#8C564B",
    "#BCBD22",
)
WARN = "#D62728"


@dataclass
class Point:
    x: float
    y: float
    lo: float | None = None  # error bar (p10)
    hi: float | None = None  # error bar (p90)
    hollow: bool = False  # e.g. a measurement that did not converge
    ring: bool = False  # e.g. throttled clocks
    tip: str = ""


@dataclass
class Series:
    name: str
    color: str
    points: list[Point] = field(default_factory=list)
    width: float = 1.8
    opacity: float = 1.0
    markers: bool = True


@dataclass
class Axis:
    label: str
    log: bool = False
    labels: list[str] | None = None  # categorical: x = 0..n-1 shown with these labels


def color_map(names: list[str]) -> dict[str, str]:
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}


def fmt_tick(v: float) -> str:
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1e6 and v == int(v):
        return f"{v / 1e6:g}M"
    if a >= 1024 and v == int(v) and int(v) % 1024 == 0:
        return f"{int(v) // 1024}k" if int(v) % (1024 * 1024) else f"{int(v) // (1024 * 1024)}M"
    if a >= 1000 and v == int(v) and int(v) % 1000 == 0:
        return f"{int(v) // 1000}k"
    if a >= 1:
        return f"{v:g}"
    return f"{v:.2g}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1-2-5 steps)."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = [round(start, 12)]
    while ticks[-1] < hi - step * 1e-9:  # the last tick covers hi: nothing is drawn off the axis
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def log_ticks(lo: float, hi: float) -> list[float]:
    """Decades in [lo, hi]; with 1-2-5 steps when the range spans fewer than three decades."""
    k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    mults = (1,) if k1 - k0 > 3 else ((1, 2, 5) if k1 - k0 > 1 else (1, 2, 3, 5))
    out = [m * 10.0**k for k in range(k0, k1 + 1) for m in mults]
    inside = [t for t in out if lo * 0.999 <= t <= hi * 1.001]
    if not inside:
        return [lo, hi]
    if inside[0] > lo * 3:  # no label near the bottom: extend down to the next 1-2-5 value
        below = [m * 10.0**k for k in range(k0 - 1, k0 + 1) for m in (1, 2, 5) if m * 10.0**k <= lo]
        inside.insert(0, max(below))
    return inside


def x_ticks_from_data(xs: list[float], max_ticks: int = 9) -> list[float]:
    uniq = sorted(set(xs))
    if len(uniq) <= max_ticks:
        return uniq
    step = math.ceil(len(uniq) / max_ticks)
    picked = uniq[::step]
    if picked[-1] != uniq[-1]:
        picked[-1] = uniq[-1]
    return picked


class _Scale:
    def __init__(self, lo: float, hi: float, a: float, b: float, log: bool):
        self.log = log
        if log:
            lo, hi = math.log10(lo), math.log10(hi)
        if hi == lo:
            lo, hi = lo - 0.5, hi + 0.5
        self.lo, self.hi, self.a, self.b = lo, hi, a, b

    def __call__(self, v: float) -> float:
        if self.log:
            v = math.log10(v)
        return self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)


def line_chart(
    series: list[Series],
    title: str,
    x: Axis,
    y: Axis,
    width: int = 500,
    height: int = 290,
    y_zero: bool = True,
    ref_line: float | None = None,
    y_include: tuple[float, ...] = (),
    ref_label: str = "",
) -> str:
    """An SVG line chart; `ref_line` draws a dashed level (a peak, 1.0) named `ref_label`, `y_include`
    widens the y range."""
    ml, mr, mt, mb = 56, 14, 26, 38
    pw, ph = width - ml - mr, height - mt - mb
    pts = [p for s in series for p in s.points if _finite(p.y) and (not y.log or p.y > 0)]
    head = (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" data-series="{len(series)}" data-points="{len(pts)}">'
        f"<title>{escape(title)}</title>"
        f'<text class="ttl" x="{ml}" y="16">{escape(title)}</text>'
    )
    if not pts:
        return head + f'<text class="empty" x="{width / 2}" y="{height / 2}">no data</text></svg>'
    xs = [p.x for p in pts]
    # The range follows the points; error bars widen it by at most 3x (a wild p90 on a noisy machine
    # would squash every line into the floor), and are clipped at the plot's edge beyond that.
    centres = [p.y for p in pts]
    lo_cap, hi_cap = min(centres) / 3 if min(centres) > 0 else -math.inf, max(centres) * 3
    bars = [v for p in pts for v in (p.lo, p.hi) if _finite(v) and (not y.log or v > 0)]  # type: ignore[arg-type]
    ys = centres + [v for v in bars if lo_cap <= v <= hi_cap]  # type: ignore[operator]
    if ref_line is not None:
        ys.append(ref_line)
    ys.extend(v for v in y_include if not y.log or v > 0)
    if x.labels is not None:
        x_lo, x_hi = -0.5, len(x.labels) - 0.5
    else:
        x_lo, x_hi = min(xs), max(xs)
    if y.log:
        y_lo, y_hi = min(ys), max(ys)
        y_t = log_ticks(y_lo / 1.15, y_hi * 1.15)
        y_lo, y_hi = min(y_lo / 1.15, y_t[0]), max(y_hi * 1.15, y_t[-1])
    else:
        y_lo = 0.0 if y_zero and min(ys) >= 0 else min(ys)
        y_t = nice_ticks(y_lo, max(ys) * 1.05 if max(ys) > 0 else 1.0)
        y_lo, y_hi = y_t[0], y_t[-1]
    pad = 10 if x.labels is None else 0
    sx = _Scale(x_lo, x_hi, ml + pad, ml + pw - pad, x.log and x.labels is None)
    sy = _Scale(y_lo, y_hi, mt + ph, mt, y.log)
    parts = [head, f'<rect class="plot" x="{ml}" y="{mt}" width="{pw}" height="{ph}"/>']
    # grid and ticks
    for t in y_t:
        yy = sy(t)
        parts.append(f'<path class="grid" d="M{ml} {yy:.1f}H{ml + pw}"/>')
        parts.append(f'<text class="yt" x="{ml - 5}" y="{yy + 3.5:.1f}">{fmt_tick(t)}</text>')
    if x.labels is not None:
        x_t = list(range(len(x.labels)))
        x_txt = x.labels
    else:
        x_t = x_ticks_from_data(xs)
        x_txt = [fmt_tick(v) for v in x_t]
    for t, label in zip(x_t, x_txt, strict=True):
        xx = sx(t)
        parts.append(f'<path class="grid" d="M{xx:.1f} {mt}V{mt + ph}"/>')
        parts.append(f'<text class="xt" x="{xx:.1f}" y="{mt + ph + 13}">{escape(label)}</text>')
    if ref_line is not None:
        parts.append(f'<path class="ref" d="M{ml} {sy(ref_line):.1f}H{ml + pw}"/>')
        if ref_label:
            parts.append(
                f'<text class="refl" x="{ml + pw - 4}" y="{sy(ref_line) - 4:.1f}">{escape(ref_label)}</text>'
            )
    parts.append(f'<text class="xl" x="{ml + pw / 2}" y="{height - 6}">{escape(x.label)}</text>')
    parts.append(
        f'<text class="yl" transform="translate(13 {mt + ph / 2}) rotate(-90)">{escape(y.label)}</text>'
    )
    for s in series:
        parts.append(_series(s, sx, sy, y.log, (mt, mt + ph)))
    parts.append("</svg>")
    return "".join(parts)


def _clamp(v: float, bounds: tuple[float, float]) -> float:
    return min(max(v, bounds[0]), bounds[1])


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def _series(s: Series, sx: _Scale, sy: _Scale, log_y: bool, clip: tuple[float, float]) -> str:
    ok = [p for p in sorted(s.points, key=lambda p: p.x) if _finite(p.y) and (not log_y or p.y > 0)]
    if not ok:
        return ""
    op = f' opacity="{s.opacity}"' if s.opacity < 1 else ""
    out = [f'<g class="s" color="{s.color}"{op}>']  # children paint with currentColor: smaller markup
    d = "".join(f"{'M' if i == 0 else 'L'}{sx(p.x):.1f} {sy(p.y):.1f}" for i, p in enumerate(ok))
    out.append(
        f'<path class="series" d="{d}" stroke-width="{s.width}"><title>{escape(s.name)}</title></path>'
    )
    bars = [
        f"M{sx(p.x):.1f} {_clamp(sy(p.lo), clip):.1f}V{_clamp(sy(p.hi), clip):.1f}"
        for p in ok
        if _finite(p.lo) and _finite(p.hi) and (not log_y or (p.lo > 0 and p.hi > 0))  # type: ignore[operator]
    ]
    if bars:
        out.append(f'<path class="err" d="{"".join(bars)}"/>')
    if s.markers:
        for p in ok:
            cx, cy = sx(p.x), sy(p.y)
            cls = ' class="h"' if p.hollow else ""
            if p.tip:
                out.append(
                    f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3"{cls}><title>{escape(p.tip)}</title></circle>'
                )
            else:
                out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3"{cls}/>')
            if p.ring:
                out.append(f'<circle class="thr" cx="{cx:.1f}" cy="{cy:.1f}" r="7.5"/>')
    out.append("</g>")
    return "".join(out)
