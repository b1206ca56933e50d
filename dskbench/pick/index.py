"""The results `dskbench pick` reads, indexed: the latest record per kernel, backend, op, variant and point of
one phase family and tp degree, reduced to what a pick compares."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dskbench.analysis.compare_inputs import stat_from_record
from dskbench.analysis.verdict import Stat
from dskbench.results.io import Run

PHASES = ("decode", "prefill")
REFERENCE = "torch-ref"  # the oracle: never a contender


@dataclass(frozen=True)
class Measured:
    """One result record, reduced to what a pick needs (the record is kept for the in-situ script)."""

    kernel: str
    backend: str
    op: str
    variant: str | None
    batch: int
    kv_len: int | None
    status: str
    stat: Stat
    reason: str
    record: dict[str, Any] = field(compare=False, repr=False)


def batch_of(point: dict[str, Any]) -> int | None:
    v = point.get("T", point.get("B"))
    return int(v) if v is not None else None


class ResultIndex:
    """The latest result per (kernel, backend, op, variant, batch, kv_len) of one phase family and tp."""

    def __init__(self, runs: Iterable[Run], phase: str, tp: int):
        self.phase, self.tp = phase, tp
        self.plan_skips: dict[str, str] = {}
        latest: dict[tuple, Measured] = {}
        for run in sorted(runs, key=lambda r: str(r.environment.get("created", ""))):
            for rec in run.results:
                point = rec.get("point")
                if not point or not rec.get("op"):
                    if rec["status"] != "ok":
                        self.plan_skips[rec["kernel"]] = str(rec.get("reason") or rec["status"])
                    continue
                if phase_family(str(rec.get("phase") or "")) != phase:
                    continue
                if "tp" in point and int(point["tp"]) != tp:
                    continue
                batch = batch_of(point)
                if batch is None:
                    continue
                kv = point.get("kv_len")
                m = Measured(
                    kernel=rec["kernel"],
                    backend=rec["backend"]["name"],
                    op=rec["op"],
                    variant=rec.get("variant"),
                    batch=batch,
                    kv_len=int(kv) if kv is not None else None,
                    status=rec["status"],
                    stat=stat_from_record(rec),
                    reason=str(rec.get("reason") or ""),
                    record=rec,
                )
                key = (m.kernel, m.backend, m.op, m.variant, m.batch, m.kv_len)
                if m.status == "skipped" and key in latest and latest[key].status != "skipped":
                    continue  # a later run that could not run the case here (too few GPUs) measured nothing
                latest[key] = m
        self._by_opv: dict[tuple[str, str | None], dict[tuple, Measured]] = defaultdict(dict)
        for (k, b, op, v, batch, kv), m in latest.items():
            self._by_opv[(op, v)][(k, b, batch, kv)] = m

    def pairs(self, op: str, variant: str | None) -> list[tuple[str, str]]:
        """(kernel, backend) measured at an op and variant, in name order."""
        return sorted({(k, b) for (k, b, _, _) in self._by_opv.get((op, variant), {})})

    def get(self, op: str, variant: str | None, kernel: str, backend: str, batch: int, kv: int | None):
        table = self._by_opv.get((op, variant), {})
        return table.get((kernel, backend, batch, kv)) or table.get((kernel, backend, batch, None))

    def points(self, op: str, variant: str | None, kernels: Iterable[str] | None = None) -> set:
        ks = set(kernels) if kernels is not None else None
        return {
            (batch, kv) for (k, _, batch, kv) in self._by_opv.get((op, variant), {}) if ks is None or k in ks
        }

    def all_keys(self) -> set[tuple[str, str, str | None, str]]:
        """(kernel, op, variant, backend) of every record."""
        return {(k, op, v, b) for (op, v), t in self._by_opv.items() for (k, b, _, _) in t}


def phase_family(phase: str) -> str:
    """decode-like phases (decode, decode_spec, ...) pick together; others by their own name."""
    return "decode" if phase.startswith("decode") else phase


def batch_var(phase: str) -> str:
    """The batch variable of a phase: B (requests) for decode, T (tokens) otherwise."""
    return "B" if phase == "decode" else "T"


def measured_tps(runs: Iterable[Run], phases: Sequence[str] = PHASES) -> set[int]:
    """The tp degrees of the tp-dependent records (a point with a `tp` value) of the given phases."""
    out: set[int] = set()
    for run in runs:
        for rec in run.results:
            point = rec.get("point") or {}
            if "tp" in point and phase_family(str(rec.get("phase") or "")) in phases:
                out.add(int(point["tp"]))
    return out
