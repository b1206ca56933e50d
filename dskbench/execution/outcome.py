"""What a run's records mean when it ends: which cases that are not `ok` fail the run, and one line for
each, so that the end of a long log says what went wrong.

The rule: a `wrong`, `error` or `unstable` record fails the run, except a time-out on a CPU reference run. There the
torch references are timed on a CPU, where a large one may take longer than the hang limit allows on
a slow or busy machine: the case is recorded `error` with its reason (the results keep it) and the run
goes on, but a case running past its limit is an expected outcome of timing references on a CPU, not
a failure. A time-out on a GPU (a hung kernel), a crash, an exception or a wrong result fails it
wherever it happens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dskbench.execution.limits import CASE_TIMED_OUT

FAILING = ("wrong", "error", "unstable")  # unstable: a timing found impossible twice (a shared GPU)
MAX_SKIP_LINES = 20  # skipped groups listed at the end; the results file holds the rest
REASON_CHARS = 160


def expected_timeout(rec: Mapping[str, Any], device: str) -> bool:
    """A CPU reference run's case that ran past its time limit (its worker killed)."""
    return (
        device == "cpu"
        and rec.get("status") == "error"
        and str(rec.get("reason") or "").startswith(CASE_TIMED_OUT)
    )


def failing(results: Iterable[Mapping[str, Any]], device: str) -> list[Mapping[str, Any]]:
    """The records that fail the run: wrong or error, a CPU reference time-out excepted."""
    return [r for r in results if r.get("status") in FAILING and not expected_timeout(r, device)]


def _one_line(text: Any) -> str:
    line = " ".join(str(text or "").split())
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 3] + "..."


def _where(rec: Mapping[str, Any]) -> str:
    """`op[:variant] phase point`, or `(planning)` for a kernel skipped before any case."""
    if rec.get("op") is None:
        return "(planning)"
    op = f"{rec['op']}:{rec['variant']}" if rec.get("variant") else rec["op"]
    point = ",".join(f"{k}={v}" for k, v in (rec.get("point") or {}).items())
    return f"{op} {rec.get('phase', '')} {point}".strip()


def case_line(rec: Mapping[str, Any], device: str) -> str:
    """`error    kernel · backend  op phase point  reason` (reason cut to one line)."""
    backend = (rec.get("backend") or {}).get("name", "-")
    note = " [expected on a CPU reference run: not a failure]" if expected_timeout(rec, device) else ""
    return f"  {rec['status']:7}  {rec['kernel']} · {backend}  {_where(rec)}  {_one_line(rec.get('reason'))}{note}"


def not_ok_lines(results: Sequence[Mapping[str, Any]], device: str) -> list[str]:
    """The lines a run ends with: a head line with the counts, then the skipped cases grouped by kernel,
    backend and reason (at most MAX_SKIP_LINES), then every wrong, error and unstable case, one line each, the
    CPU reference time-outs first and what fails the run last. Empty when every case is ok."""
    bad = [r for r in results if r.get("status") != "ok"]
    if not bad:
        return []
    counts = Counter(r["status"] for r in bad)
    head = ", ".join(f"{counts[s]} {s}" for s in ("skipped", *FAILING) if counts[s])
    lines = [f"not ok ({head}):"]
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for r in bad:
        if r["status"] == "skipped":
            key = (r["kernel"], (r.get("backend") or {}).get("name", "-"), _one_line(r.get("reason")))
            groups.setdefault(key, []).append(r)
    for (kernel, backend, reason), recs in list(groups.items())[:MAX_SKIP_LINES]:
        where = _where(recs[0]) if len(recs) == 1 else f"({len(recs)} cases)"
        lines.append(f"  {'skipped':7}  {kernel} · {backend}  {where}  {reason}")
    if len(groups) > MAX_SKIP_LINES:
        more = sum(len(v) for v in list(groups.values())[MAX_SKIP_LINES:])
        lines.append(
            f"  ... {more} more skipped cases ({len(groups) - MAX_SKIP_LINES} groups): see the results file"
        )

    def last_the_failures(r: Mapping[str, Any]) -> tuple[bool, bool]:
        return not expected_timeout(r, device), r["status"] == "error"

    for r in sorted((r for r in bad if r["status"] in FAILING), key=last_the_failures):
        lines.append(case_line(r, device))
    return lines
