"""Results files: JSON lines with a versioned schema, written as each case finishes.

A file holds one or more runs. Each run starts with an ``environment`` record; every case then writes
one ``result`` record. Records are appended and flushed one by one, so an interrupted sweep keeps
everything it finished. Before appending, a writer checks that an existing file is ours and cuts off a
last line that a killed process left unfinished (prepare_append). docs/results-schema.md describes
every field.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dskbench.measure.validity import problem
from dskbench.results.records import SCHEMA, STATUSES, TIMED, Environment, RecordError, ResultRecord


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
    """Appends records to a JSON-lines file, flushing and fsyncing each one.

    An existing file must be a dskbench results file; an unfinished last line is cut off first
    (prepare_append), so that the new records start on a line of their own.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.name.endswith(".gz"):
            raise ResultsError(
                f"{self.path}: results are written as plain JSON lines (gzip the file afterwards)"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        prepare_append(self.path)
        try:
            self._fh = self.path.open("a", encoding="utf-8")
        except OSError as e:
            raise ResultsError(f"cannot write {self.path}: {e.strerror or e}") from None

    def write(self, record: dict[str, Any] | ResultRecord | Environment) -> None:
        if isinstance(record, ResultRecord | Environment):
            record = record.to_json()
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


_LINE_MAX = 1 << 24  # longer than any record we write (an environment record is tens of kilobytes)


def prepare_append(path: Path, repair: bool = True) -> int:
    """Make an existing results file safe to append to; return the bytes of an unfinished last line.

    A missing or empty file is fine. Any other file must start with a dskbench environment record of
    this schema, or ResultsError is raised and the file is left as it is: `--out README.md` must not
    gain JSON lines. A last line without its newline is what a process killed mid-write (or a full
    disk) leaves: readers skip it, but appending onto it would glue the next record to it and damage
    the file for every later reader. With `repair` it is cut off and the user told on stderr; a last
    line that holds a whole record and lacks only its newline gets the newline instead. Nothing but
    that last line is ever changed.
    """
    try:
        if not path.exists() or path.stat().st_size == 0:
            return 0
        with path.open("r+b") as fh:
            _check_first_line(path, fh.readline(_LINE_MAX))
            size = fh.seek(0, os.SEEK_END)
            start = _last_line_start(fh, size)
            if start == size:
                return 0
            fh.seek(start)
            if _is_record(fh.read(_LINE_MAX + 1)):
                if repair:
                    fh.seek(0, os.SEEK_END)
                    fh.write(b"\n")
                    _sync(fh)
                return 0
            if repair:
                fh.truncate(start)
                _sync(fh)
                print(
                    f"dskbench: {path}: cut off its unfinished last line ({size - start} bytes, "
                    "a record a stopped run never completed) before appending",
                    file=sys.stderr,
                )
            return size - start
    except OSError as e:
        raise ResultsError(f"cannot open {path}: {e.strerror or e}") from None


def _check_first_line(path: Path, line: bytes) -> None:
    """Refuse a file that does not start with one of our environment records."""
    rec = _parse(line)
    if not (isinstance(rec, dict) and rec.get("record") == "environment"):
        raise ResultsError(
            f"{path} is not a dskbench results file (its first line is not a dskbench environment "
            "record); refusing to append to it, choose another file"
        )
    if rec.get("schema") != SCHEMA:
        raise ResultsError(
            f"{path} holds results of schema {rec.get('schema')!r}, not {SCHEMA!r}; "
            "refusing to append to it, choose another file"
        )


def _last_line_start(fh: Any, size: int) -> int:
    """The offset just after the file's last newline (0 if it has none)."""
    end = size
    while end > 0:
        begin = max(0, end - 65536)
        fh.seek(begin)
        i = fh.read(end - begin).rfind(b"\n")
        if i >= 0:
            return begin + i + 1
        end = begin
    return 0


def _parse(line: bytes) -> Any:
    try:
        return json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


def _is_record(line: bytes) -> bool:
    rec = _parse(line) if len(line) <= _LINE_MAX else None
    if not isinstance(rec, dict):
        return False
    try:
        validate_record(rec)
    except ResultsError:
        return False
    return True


def _sync(fh: Any) -> None:
    fh.flush()
    os.fsync(fh.fileno())


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, set | tuple):
        return list(x)
    return str(x)


def environment_record(run_id: str, **fields: Any) -> dict[str, Any]:
    """An environment record's JSON (dskbench.results.records.Environment)."""
    try:
        return Environment.from_json({"run_id": run_id, **fields}).to_json()
    except RecordError as e:
        raise ResultsError(f"environment record: {e}") from None


def result_record(run_id: str, status: str, **fields: Any) -> dict[str, Any]:
    """A result record's JSON as given, checked against the schema's rules (ResultRecord)."""
    rec = {"record": "result", "schema": SCHEMA, "run_id": run_id, "status": status, **fields}
    validate_record(rec)
    try:
        ResultRecord.from_json(rec)
    except RecordError as e:
        raise ResultsError(str(e)) from None
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
        if rec["status"] != "ok" and not rec.get("reason"):
            raise ResultsError(f"a {rec['status']} result needs a reason")
        if rec["status"] in TIMED and not rec.get("timing"):
            raise ResultsError(f"an {rec['status']} result needs its timing")


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


def results_files(paths: Iterable[str | Path]) -> list[Path]:
    """The files given, a folder standing for the results files in it (`*.jsonl`, `*.jsonl.gz`, by name:
    the parts of a sharded job, say)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith((".jsonl", ".jsonl.gz")))
        else:
            out.append(p)
    return out


def read_runs(paths: Iterable[str | Path]) -> list[Run]:
    """Every run in the files (a folder: the results files in it), in order; results attach to the
    environment with their run_id."""
    runs: dict[str, Run] = {}
    order: list[str] = []
    for path in results_files(paths):
        for rec in iter_records(path):
            rid = rec["run_id"]
            if rec["record"] == "environment":
                if rid not in runs:
                    runs[rid] = Run(rec)
                    order.append(rid)
            else:
                if rid not in runs:
                    raise ResultsError(f"{path}: result for run {rid} before its environment record")
                runs[rid].results.append(as_read(rec))
    return [runs[r] for r in order]


def as_read(rec: dict[str, Any]) -> dict[str, Any]:
    """An `ok` result as today's rules read it, so that every reader (report, compare, pick, resume)
    sees the same status. With no finite median it is an error (early versions could write such
    records: the budget ended sampling of a slow kernel before its first sample). With an impossible
    timing (dskbench.measure.validity: a median of 0 us, most samples clamped, ...) it is `unstable`,
    marked `reclassified_from: ok` (files written before the engine applied that rule)."""
    if rec["status"] != "ok":
        return rec
    med = (rec.get("timing") or {}).get("median_us")
    if not (isinstance(med, int | float) and math.isfinite(med)):
        return {**rec, "status": "error", "reason": "the measurement produced no timing samples"}
    why = problem(rec["timing"])
    if why:
        return {**rec, "status": "unstable", "reason": why, "reclassified_from": "ok"}
    return rec


def latest_by_case(runs: Iterable[Run]) -> dict[tuple[str, str], dict[str, Any]]:
    """(case_id, backend) -> the last result recorded for it."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for run in runs:
        for rec in run.results:
            out[(rec.get("case_id", rec["kernel"]), rec["backend"]["name"])] = rec
    return out


def finished_cases(runs: Iterable[Run], retry_errors: bool = False) -> set[tuple[str, str]]:
    """(case_id, backend) pairs a resumed sweep does not run again: every case with a record.

    The latest record of a case decides. An `error` or `unstable` record stands like ok, wrong and
    skipped (a kernel that hung or crashed its worker would do so again) unless `retry_errors`. A case
    stopped by an interrupt has no record, so it runs again; so does one whose build was deferred
    (`run --defer-builds-over`): it was left for later, not found wanting.
    """
    return {
        key
        for key, rec in latest_by_case(runs).items()
        if not (retry_errors and rec["status"] in RETRIED) and not deferred(rec)
    }


RETRIED = ("error", "unstable")  # what --retry-errors runs again
DEFERRED = "build deferred: "  # how a skipped record whose build a run left out starts its reason


def deferred(rec: Mapping[str, Any]) -> bool:
    """Whether a record is a case skipped because its run deferred its build (a resume runs it)."""
    return rec.get("status") == "skipped" and str(rec.get("reason") or "").startswith(DEFERRED)


# The settings a resumed sweep must share with the file's earlier runs: what a case measures and how.
# The seed is compared as a policy: a fixed --seed must be the same; fresh inputs (no --seed) match
# fresh inputs, since every run of that policy draws new ones anyway. The time budget, dedupe and the
# GPU count change how long a sweep takes, not what a record means, so they may differ.
RESUME_SETTINGS = ("device", "profile", "phases", "tp", "mode", "flush", "seed")
# Settings that were fixed before they became options: a file that does not record them used these.
_BEFORE_RECORDED = {"flush": "write"}  # cold mode always flushed L2 by writing a buffer


def settings_differences(runs: Iterable[Run], settings: dict[str, Any]) -> list[str]:
    """How the runs' recorded settings differ from `settings` (a sweep's options), one phrase per key,
    e.g. "mode cold in the file, hot now". Empty when a resumed sweep may add to these runs."""
    now = {k: _shown(k, settings.get(k)) for k in RESUME_SETTINGS}
    earlier: dict[str, list[str]] = {k: [] for k in RESUME_SETTINGS}
    for run in runs:
        recorded = {**_BEFORE_RECORDED, **(run.environment.get("settings") or {})}
        for k in RESUME_SETTINGS:
            old = _shown(k, recorded[k]) if k in recorded else "not recorded"
            if old != now[k] and old not in earlier[k]:
                earlier[k].append(old)
    return [f"{k} {' and '.join(v)} in the file, {now[k]} now" for k, v in earlier.items() if v]


def _shown(key: str, value: Any) -> str:
    """A setting as the user would give it; lists as sets (--sweep decode,prefill = prefill,decode)."""
    if key == "seed" and value is None:
        return "fresh"
    if isinstance(value, list | tuple):
        try:
            return ",".join(str(v) for v in sorted(set(value)))
        except TypeError:  # not a list of names or numbers: shown as it is
            return str(value)
    return str(value)
