"""Results files: JSON lines with a versioned schema, written as each case finishes.

A file holds one or more runs. Each run starts with an ``environment`` record; every case then writes
one ``result`` record. Records are appended and flushed one by one, so an interrupted sweep keeps
everything it finished. docs/results-schema.md describes every field.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "dskbench.results/1"
STATUSES = ("ok", "wrong", "skipped", "error")


class ResultsError(ValueError):
    """A results file that is not ours or is damaged (the message names the file and line)."""


@dataclass
class Run:
    environment: dict[str, Any]
    results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return str(self.environment.get("run_id", ""))


class ResultsWriter:
    """Appends records to a JSON-lines file, flushing and fsyncing each one."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.name.endswith(".gz"):
            raise ResultsError(
                f"{self.path}: results are written as plain JSON lines (gzip the file afterwards)"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        validate_record(record)
        self._fh.write(json.dumps(record, sort_keys=True, default=_json_default) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, set | tuple):
        return list(x)
    return str(x)


def environment_record(run_id: str, **fields: Any) -> dict[str, Any]:
    return {"record": "environment", "schema": SCHEMA, "run_id": run_id, **fields}


def result_record(run_id: str, status: str, **fields: Any) -> dict[str, Any]:
    rec = {"record": "result", "schema": SCHEMA, "run_id": run_id, "status": status, **fields}
    validate_record(rec)
    return rec


_REQUIRED = {
    "environment": ("run_id", "created", "device", "versions"),
    "result": ("run_id", "status", "kernel", "backend"),
}


def validate_record(rec: dict[str, Any]) -> None:
    kind = rec.get("record")
    if kind not in _REQUIRED:
        raise ResultsError(f"unknown record type {kind!r}")
    if rec.get("schema") != SCHEMA:
        raise ResultsError(f"schema {rec.get('schema')!r}, expected {SCHEMA!r}")
    missing = [k for k in _REQUIRED[kind] if k not in rec]
    if missing:
        raise ResultsError(f"{kind} record lacks {', '.join(missing)}")
    if kind == "result":
        if rec["status"] not in STATUSES:
            raise ResultsError(f"status {rec['status']!r} is not one of {', '.join(STATUSES)}")
        if rec["status"] in ("skipped", "error", "wrong") and not rec.get("reason"):
            raise ResultsError(f"a {rec['status']} result needs a reason")
        if rec["status"] == "ok" and not rec.get("timing"):
            raise ResultsError("an ok result needs its timing")


def is_results_file(path: Path) -> bool:
    """Results files are JSON lines, plain (being written) or gzipped (committed: a full sweep's
    records run to megabytes, and the repository travels to the GPU box on every call)."""
    return path.name.endswith((".jsonl", ".jsonl.gz"))


def iter_records(path: str | Path) -> Iterator[dict[str, Any]]:
    p = Path(path)
    try:
        if p.name.endswith(".gz"):
            with gzip.open(p, "rt", encoding="utf-8") as fh:
                lines = fh.readlines()
        else:
            with p.open(encoding="utf-8") as fh:
                lines = fh.readlines()
    except (OSError, EOFError) as e:
        raise ResultsError(f"cannot read {p}: {getattr(e, 'strerror', None) or e}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            # A line cut off by a crash while writing is the only damage we tolerate: the last one.
            if n == len(lines) and not line.endswith("\n"):
                return
            raise ResultsError(f"{p}:{n}: not JSON: {e.msg}") from None
        try:
            validate_record(rec)
        except ResultsError as e:
            raise ResultsError(f"{p}:{n}: {e}") from None
        yield rec


def read_runs(paths: Iterable[str | Path]) -> list[Run]:
    """Every run in the files, in order; results attach to the environment with their run_id."""
    runs: dict[str, Run] = {}
    order: list[str] = []
    for path in paths:
        for rec in iter_records(path):
            rid = rec["run_id"]
            if rec["record"] == "environment":
                if rid not in runs:
                    runs[rid] = Run(rec)
                    order.append(rid)
            else:
                if rid not in runs:
                    raise ResultsError(f"{path}: result for run {rid} before its environment record")
                runs[rid].results.append(_without_empty_timing(rec))
    return [runs[r] for r in order]


def _without_empty_timing(rec: dict[str, Any]) -> dict[str, Any]:
    """An `ok` result with no finite median is an error (files from before 2026-11-21 evening could
    hold such records: the budget ended sampling of a slow kernel before its first sample)."""
    med = (rec.get("timing") or {}).get("median_us")
    if rec["status"] == "ok" and not (isinstance(med, int | float) and math.isfinite(med)):
        return {**rec, "status": "error", "reason": "the measurement produced no timing samples"}
    return rec


def latest_by_case(runs: Iterable[Run]) -> dict[tuple[str, str], dict[str, Any]]:
    """(case_id, backend) -> the last result recorded for it."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for run in runs:
        for rec in run.results:
            out[(rec.get("case_id", rec["kernel"]), rec["backend"]["name"])] = rec
    return out
