"""Run-to-run spread of two sweeps of the same cases: median, p90 and max of |delta| of the medians.

    dskbench run-to-run A.jsonl[.gz] B.jsonl[.gz] [--json OUT] [--only-common FILE...]

Pairs every (case, backend) measured `ok` in both (twin records copied from another op's measurement,
`shared_with`, are left out: they would count one measurement twice), and prints the spread over all
pairs and by latency band (the small cold kernels are where it is widest), plus the pairs that moved
most. The target: median |delta| under 2% between two back-to-back sweeps on one machine.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from dskbench.measure.stats import quantile
from dskbench.results.io import Run

BANDS = ((0.0, 5.0), (5.0, 20.0), (20.0, 100.0), (100.0, 1000.0), (1000.0, float("inf")))


class NoPairs(ValueError):
    """The two sides have no (case, backend) measured ok in both."""


def medians(runs: Iterable[Run]) -> dict[tuple[str, str], float]:
    """(case, backend) -> median of every measured ok record (copies of a twin left out)."""
    out = {}
    for run in runs:
        for r in run.results:
            if r.get("status") == "ok" and not r.get("shared_with") and "timing" in r:
                out[(r["case_id"], r["backend"]["name"])] = float(r["timing"]["median_us"])
    return out


def spread(deltas: list[float]) -> dict[str, float]:
    a = [abs(d) for d in deltas]
    return {
        "pairs": len(a),
        "median_abs_pct": round(100 * statistics.median(a), 2),
        "p90_abs_pct": round(100 * quantile(sorted(a), 0.9), 2),
        "max_abs_pct": round(100 * max(a), 2),
        "mean_signed_pct": round(100 * statistics.fmean(deltas), 2),
    }


def compare(a: dict, b: dict) -> dict:
    """The spread of the medians both sides hold; raises NoPairs when they share none."""
    pairs = [(k, a[k], b[k]) for k in sorted(a.keys() & b.keys()) if a[k] > 0]
    if not pairs:
        raise NoPairs("no (case, backend) is measured ok in both files: nothing to compare")
    deltas = [(k, x, y, y / x - 1) for k, x, y in pairs]
    doc = {"all": spread([d for *_, d in deltas]), "bands": {}, "largest": []}
    for lo, hi in BANDS:
        band = [d for _, x, _, d in deltas if lo <= x < hi]
        if band:
            doc["bands"][f"{lo:g}-{hi:g} us"] = spread(band)
    for (case, backend), x, y, d in sorted(deltas, key=lambda t: -abs(t[3]))[:15]:
        doc["largest"].append(
            {"case": case, "backend": backend, "a_us": x, "b_us": y, "delta_pct": round(100 * d, 2)}
        )
    return doc


def report_lines(doc: dict[str, Any]) -> list[str]:
    """The spread as printed: all pairs, each latency band, the pairs that moved most."""
    s = doc["all"]
    lines = [
        f"{s['pairs']} pairs: median |delta| {s['median_abs_pct']}%, p90 {s['p90_abs_pct']}%, "
        f"max {s['max_abs_pct']}%, mean signed {s['mean_signed_pct']}%"
    ]
    for band, b in doc["bands"].items():
        lines.append(
            f"  {band:>14}: {b['pairs']:5} pairs, median {b['median_abs_pct']}%, p90 {b['p90_abs_pct']}%"
        )
    lines.append("largest:")
    for x in doc["largest"][:8]:
        lines.append(
            f"  {x['delta_pct']:+7.2f}%  {x['a_us']:10.2f} -> {x['b_us']:10.2f} us  {x['case']} · {x['backend']}"
        )
    return lines
