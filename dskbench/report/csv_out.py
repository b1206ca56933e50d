"""`results.csv` beside the report: one row per case x backend, for a spreadsheet, pandas or a diff.

A case measured more than once (a resumed run, a run repeated on the same GPU) keeps its latest
record; the same case on two GPUs gives two rows, told apart by `device`. Each row ends with the
`dskbench run` command that measures that case alone again (the record's `repro`; for records written
before they carried one, rebuilt from the run's settings). Only an `ok` row has numbers: an `unstable`
one's timing is impossible (its reason says why; the results file keeps the timing). `pct_of_datasheet`
is the % of the datasheet peak that bounds the case; `shared_gpu` lists the other processes' PIDs on the
GPU when it was timed.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from dskbench.execution.selection import op_text, point_text, repro_command
from dskbench.report.tables import pct_of_bound
from dskbench.results.io import Run

COLUMNS = (
    "device",
    "kernel",
    "op",
    "phase",
    "point",
    "backend",
    "status",
    "median_us",
    "p10_us",
    "p90_us",
    "gbps",
    "tflops",
    "pct_of_datasheet",
    "bound",
    "throttled",
    "shared_gpu",
    "reason",
    "case_id",
    "run_id",
    "repro",
)


def rows(runs: list[Run]) -> list[dict[str, str]]:
    """The CSV's rows, in the order the cases were first recorded."""
    latest: dict[tuple[str, str, str], dict[str, str]] = {}
    for run in runs:
        env = run.environment
        device = str((env.get("device") or {}).get("name") or (env.get("device") or {}).get("kind") or "")
        for rec in run.results:
            row = _row(rec, device, env.get("settings"))
            latest[(device, row["case_id"], row["backend"])] = row
    return list(latest.values())


def _row(rec: dict[str, Any], device: str, settings: dict[str, Any] | None) -> dict[str, str]:
    ok = rec["status"] == "ok"  # an unstable record's timing is impossible: no number in the table
    timing = (rec.get("timing") or {}) if ok else {}
    metrics = (rec.get("metrics") or {}) if ok else {}
    throttled = (rec.get("clocks") or {}).get("throttled")
    op = rec.get("op")
    return {
        "device": device,
        "kernel": rec["kernel"],
        "op": op_text(op, rec.get("variant")) if op else "",
        "phase": rec.get("phase") or "",
        "point": point_text(rec["point"]) if rec.get("point") else "",
        "backend": rec["backend"]["name"],
        "status": rec["status"],
        "median_us": _num(timing.get("median_us")),
        "p10_us": _num(timing.get("p10_us")),
        "p90_us": _num(timing.get("p90_us")),
        "gbps": _num(metrics.get("gbps")),
        "tflops": _num(metrics.get("tflops")),
        "pct_of_datasheet": _num(pct_of_bound(rec)),
        "bound": metrics.get("bound") or "",
        "throttled": "" if throttled is None else str(bool(throttled)).lower(),
        "shared_gpu": " ".join(str(p) for p in (rec.get("shared_gpu") or {}).get("pids") or []),
        "reason": "" if ok else str(rec.get("reason") or ""),
        "case_id": rec.get("case_id") or rec["kernel"],
        "run_id": rec["run_id"],
        "repro": rec.get("repro") or repro_command(rec, settings) or "",
    }


def _num(x: Any) -> str:
    """Six significant digits; empty where there is no finite number."""
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return ""
    return f"{x:.6g}"


def write_csv(runs: list[Run], path: str | Path) -> Path:
    """Write the rows to `path` (UTF-8, a header line, the csv module's quoting)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows(runs))
    return p
