"""The table `dskbench run` prints when it ends: per kernel x backend, how many cases ended in each
status and the median of their medians, so that a run's outcome reads at a glance (as nvbench's
does) before the details in the results file and the report."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from dskbench.results.io import STATUSES


def run_table(results: Iterable[dict[str, Any]]) -> str:
    """Rows sorted by kernel and backend; pairs whose every case was skipped are folded into a count
    (a backend for another GPU, a kernel without an adapter): the results file says why."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["kernel"], r["backend"]["name"]), []).append(r)
    rows, all_skipped = [], 0
    for (kernel, backend), recs in sorted(groups.items()):
        counts = {s: sum(1 for r in recs if r["status"] == s) for s in STATUSES}
        if counts["skipped"] == len(recs):
            all_skipped += 1
            continue
        medians = [r["timing"]["median_us"] for r in recs if r["status"] == "ok"]
        med = f"{statistics.median(medians):.2f}" if medians else "-"
        rows.append([kernel, backend, *(str(counts[s]) for s in STATUSES), med])
    head = ["kernel", "backend", *STATUSES, "median us"]
    lines = []
    if rows:
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        for r in [head, *rows]:
            cells = [
                c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            ]
            lines.append("  ".join(cells).rstrip())
    if all_skipped:
        lines.append(f"({all_skipped} kernel x backend pairs with every case skipped are not shown)")
    return "\n".join(lines)
