"""Typed result records: invariants, round trips, the published JSON Schema, and every committed results
file read through the types."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from dskbench import paths
from dskbench.results.access import part_of, rate
from dskbench.results.io import ResultsError, iter_records, read_runs
from dskbench.results.records import (
    BackendInfo,
    Environment,
    Identity,
    RecordError,
    ResultRecord,
    Timing,
)
from dskbench.results.schema import SCHEMA_FILE, results_schema, schema_text

IDENT = {
    "case_id": "rmsnorm/input_layernorm/decode/T=1",
    "kernel": "rmsnorm",
    "category": "normalization",
    "op": "input_layernorm",
    "variant": None,
    "phase": "decode",
    "point": {"T": 1},
    "dims": {"T": 1, "K": 7168},
}
CHECK = {"error": 1e-3, "tolerance": 2e-2, "detail": ""}


def result(status: str, **fields: Any) -> dict[str, Any]:
    base = {"record": "result", "schema": "dskbench.results/1", "run_id": "r", "status": status}
    return {**base, **IDENT, "backend": {"name": "b"}, **fields}


def test_status_invariants():
    ResultRecord.from_json(result("ok", check=CHECK, timing={"median_us": 2.0})).validate_complete()
    ResultRecord.from_json(result("skipped", reason="needs sm100"))
    with pytest.raises(RecordError, match="status"):
        ResultRecord.from_json(result("fine", reason="x"))
    for status in ("wrong", "error", "skipped"):
        with pytest.raises(RecordError, match="needs a reason"):
            ResultRecord.from_json(result(status))
    with pytest.raises(RecordError, match="timing"):
        ResultRecord.from_json(result("ok", check=CHECK))
    with pytest.raises(RecordError, match="finite median"):
        ResultRecord.from_json(result("ok", check=CHECK, timing={"median_us": math.nan}))
    with pytest.raises(RecordError, match="needs its check"):  # what the engine writes: ok and wrong checked
        ResultRecord.from_json(
            result("wrong", reason="relative error 1 > tolerance 0.02")
        ).validate_complete()
    with pytest.raises(RecordError, match="kernel"):
        ResultRecord.from_json({"run_id": "r", "status": "skipped", "reason": "x", "backend": {"name": "-"}})


def test_stopping_policy_round_trips_and_is_optional():
    stop = {"name": "noise", "target": 0.01, "max_time_s": 2.0}
    t = Timing.from_json({"median_us": 1.0, "stopping": stop})
    assert t.stopping == stop and t.to_json()["stopping"] == stop
    assert "stopping" not in Timing(median_us=1.0).to_json()
    with pytest.raises(RecordError, match="stopping"):
        Timing.from_json({"median_us": 1.0, "stopping": {"target": 0.01}})


def test_parts_write_the_keys_of_today():
    # a kernel skipped at planning: its name only, no case fields, no backend ('-')
    assert Identity("k", "k").to_json() == {"case_id": "k", "kernel": "k"}
    assert Identity.from_json(IDENT).to_json() == IDENT  # a case: every field, nulls included
    assert BackendInfo("b").to_json() == {"name": "b"}
    declared = BackendInfo("b", "aot", "m:f", "sgl", None, None, True)
    assert set(declared.to_json()) == {"name", *BackendInfo.DECLARED}
    resolved = declared.with_resolution("m2:f", "sglang-kernel", "0.3")
    assert resolved.to_json()["resolved_target"] == "m2:f" and resolved.to_json()["version"] == "0.3"
    assert resolved.to_json()["package"] == "sglang-kernel"
    # keys a type does not know are kept, in parts and at the top level
    rec = result("ok", check=CHECK, timing={"median_us": 2.0, "new_stat": 3}, future={"x": 1})
    again = ResultRecord.from_json(rec).to_json()
    assert again["timing"]["new_stat"] == 3 and again["future"] == {"x": 1}
    env = {"run_id": "r", "created": "t", "device": {}, "versions": {}, "ceilings": None, "extra_key": 1}
    assert Environment.from_json(env).to_json() == {
        "record": "environment",
        "schema": "dskbench.results/1",
        **env,
    }


def test_rates_from_metrics_or_traffic():
    rec = result("ok", timing={"median_us": 2.0}, traffic={"bytes": 2_000_000, "flops": 4_000_000})
    assert rate(rec, "gbps") == pytest.approx(1000.0) and rate(rec, "tflops") == pytest.approx(2.0)
    assert rate({**rec, "metrics": {"gbps": 5.0}}, "gbps") == 5.0
    assert rate(result("skipped", reason="x"), "gbps") is None
    assert ResultRecord.from_json({**rec, "check": CHECK}).gbps == pytest.approx(1000.0)
    assert part_of(rec, "clocks") is None and part_of({"timing": {"cv": 1}}, "timing") is None


def test_committed_schema_is_generated():
    committed = (paths.REPO_ROOT / SCHEMA_FILE).read_text(encoding="utf-8")
    assert committed == schema_text(), "regenerate it: python -m dskbench.results.schema"


def _results_files() -> list[Path]:
    files = sorted((paths.REPO_ROOT / "results").rglob("*.jsonl*"))
    return [f for f in files if f.name.endswith((".jsonl", ".jsonl.gz"))]


def _readable(f: Path) -> bool:
    try:
        next(iter_records(f), None)
    except ResultsError:  # not a results file (another tool's log kept beside them)
        return False
    return True


def test_every_committed_results_file_reads_through_the_types():
    files = [f for f in _results_files() if _readable(f)]
    assert len(files) >= 20
    schema = results_schema()
    n = 0
    for f in files:
        for run in read_runs([f]):
            env = Environment.from_json(run.environment)
            assert env.to_json() == run.environment, f
            _validate(run.environment, schema["$defs"]["EnvironmentRecord"], schema, f)
            for rec in run.results:
                typed = ResultRecord.from_json(rec)
                again = typed.to_json()
                assert _same_but_nulls(rec, again), (f, rec.get("case_id"))
                _validate(rec, schema["$defs"]["ResultRecord"], schema, f)
                n += 1
    assert n > 1000


def _same_but_nulls(old: Any, new: Any) -> bool:
    """The same values; a key the types always write may be added as null (files of older writers)."""
    if isinstance(old, dict) and isinstance(new, dict):
        added = set(new) - set(old)
        return (
            set(old) <= set(new)
            and all(new[k] is None for k in added)
            and all(_same_but_nulls(old[k], new[k]) for k in old)
        )
    nans = isinstance(old, float) and isinstance(new, float) and math.isnan(old) and math.isnan(new)
    return old == new or nans


_TYPES = {
    "string": str,
    "boolean": bool,
    "integer": int,
    "number": (int, float),
    "null": type(None),
    "object": dict,
    "array": list,
}


def _validate(value: Any, node: dict[str, Any], root: dict[str, Any], where: Any) -> None:
    """The subset of JSON Schema the generated schema uses: $ref, anyOf, type, const, enum, required,
    properties, items, allOf with if/then."""
    if "$ref" in node:
        node = root["$defs"][node["$ref"].rsplit("/", 1)[1]]
    if "anyOf" in node:
        errors = []
        for sub in node["anyOf"]:
            try:
                return _validate(value, sub, root, where)
            except AssertionError as e:
                errors.append(str(e))
        raise AssertionError(f"{where}: {value!r} matches none of {errors}")
    if "type" in node:
        kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
        ok = any(
            isinstance(value, _TYPES[k]) and not (k in ("integer", "number") and isinstance(value, bool))
            for k in kinds
        )
        assert ok, f"{where}: {value!r} is not {kinds}"
    if "const" in node:
        assert value == node["const"], f"{where}: {value!r} != {node['const']!r}"
    if "enum" in node:
        assert value in node["enum"], f"{where}: {value!r} not in {node['enum']}"
    if isinstance(value, dict):
        for k in node.get("required", ()):
            assert k in value, f"{where}: lacks {k}"
        for k, sub in node.get("properties", {}).items():
            if k in value:
                _validate(value[k], sub, root, f"{where}:{k}")
        for cond in node.get("allOf", ()):
            try:
                _validate(value, cond["if"], root, where)
            except AssertionError:
                continue
            _validate(value, cond["then"], root, where)
    if isinstance(value, list) and "items" in node:
        for x in value:
            _validate(x, node["items"], root, where)


def test_stages_other_is_what_no_stage_accounts_for():
    from dskbench.results.records import Stages

    st = Stages.from_json(
        {"inputs_s": 1.0, "check_s": 0.5, "measure_s": 5.0, "warmup_s": 1.0, "item_s": 10.0}
    )
    assert st.with_other().other_s == 3.5  # measure_s counts once, its warm-up inside it
    named = {"setup_s": 0.5, "record_s": 0.25, "cleanup_s": 0.25}
    assert Stages.from_json({**st.to_json(), **named}).with_other().other_s == 2.5  # before and after too
    assert Stages.from_json({"inputs_s": 2.0, "item_s": 1.0}).with_other().other_s == 0.0  # never negative
    assert Stages.from_json({"inputs_s": 1.0}).with_other().other_s is None  # no item_s: unknown
    d = {"inputs_s": 1.0, "item_s": 2.0, "future_s": 7.0}
    assert Stages.from_json(d).to_json() == d  # unknown stages kept as read
