"""scripts/run_to_run.py (spread of two sweeps) and scripts/pack_results.py (results packed for
committing): the figures the issue notes quote come from these, so they are checked on known files."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from dskbench.results import ResultsWriter, environment_record, read_runs, result_record

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(path: Path, medians: dict[str, float], extra: list[dict] = ()) -> Path:
    with ResultsWriter(path) as w:
        w.write(
            environment_record("r", created="2026-11-21T00:00:00+00:00", device={"name": "H200"}, versions={})
        )
        for case, us in medians.items():
            w.write(
                result_record(
                    "r",
                    "ok",
                    kernel="k",
                    case_id=case,
                    backend={"name": "b"},
                    timing={"median_us": us, "samples_us": [us * 1.0000001234, us]},
                )
            )
        for rec in extra:
            w.write(result_record("r", rec.pop("status"), **rec))
    return path


def test_run_to_run_pairs_ok_cases_and_leaves_copies_out(tmp_path, capsys):
    r2r = _load("run_to_run")
    a = _write(tmp_path / "a.jsonl", {"c1": 2.0, "c2": 10.0, "c3": 100.0, "c4": 1.0})
    copy = {"status": "ok", "kernel": "k", "case_id": "c5", "backend": {"name": "b"}, "shared_with": "c1"}
    copy["timing"] = {"median_us": 1.0}
    wrong = {"status": "wrong", "kernel": "k", "case_id": "c4", "backend": {"name": "b"}, "reason": "x"}
    b = _write(tmp_path / "b.jsonl", {"c1": 2.2, "c2": 9.9, "c3": 100.0}, [copy, wrong])
    out = tmp_path / "r.json"
    assert r2r.main([str(a), str(b), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["all"]["pairs"] == 3  # c4 is wrong in b; c5 is a copy of c1's measurement
    assert doc["all"]["median_abs_pct"] == 1.0 and doc["all"]["max_abs_pct"] == 10.0
    assert doc["bands"]["0-5 us"]["pairs"] == 1 and doc["bands"]["100-1000 us"]["median_abs_pct"] == 0.0
    assert doc["largest"][0]["case"] == "c1" and doc["largest"][0]["delta_pct"] == 10.0
    assert "3 pairs: median |delta| 1.0%" in capsys.readouterr().out
    only = tmp_path / "only.jsonl"
    _write(only, {"c2": 1.0})
    assert r2r.main([str(a), str(b), "--only-common", str(only), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["all"]["pairs"] == 1
    with pytest.raises(SystemExit, match="no \\(case, backend\\)"):
        r2r.main([str(a), str(_write(tmp_path / "e.jsonl", {}))])


def test_pack_rounds_samples_only_and_the_reader_reads_it(tmp_path, capsys):
    pack = _load("pack_results")
    src = _write(tmp_path / "a.jsonl", {"c1": 2.7850000858306885})
    dst = tmp_path / "a.jsonl.gz"
    assert pack.main([str(src), str(dst)]) == 0
    before = [json.loads(x) for x in src.read_text().splitlines()]
    after = [json.loads(x) for x in gzip.open(dst, "rt")]
    assert len(after) == len(before)
    assert after[1]["timing"]["samples_us"] == [2.785, 2.785]
    assert after[1]["timing"]["median_us"] == before[1]["timing"]["median_us"]  # not rounded
    for b, a in zip(before, after, strict=True):
        b.get("timing", {}).pop("samples_us", None)
        a.get("timing", {}).pop("samples_us", None)
        assert a == b
    (run,) = read_runs([dst])
    assert run.results[0]["case_id"] == "c1"
    assert pack.main([str(src), str(tmp_path / "x.jsonl")]) == 2  # must be written gzipped
