"""scripts/sweep_stats.py: counts, per-GPU wall time, and wall time without first-time JIT."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dskbench.results.io import ResultsWriter, environment_record, result_record

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("sweep_stats", ROOT / "scripts" / "sweep_stats.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_wall_per_gpu_and_jit_are_taken_from_the_records(tmp_path, capsys):
    stats = _load()
    t0 = 1_800_000_000.0
    created = "2027-01-15T08:00:00+00:00"  # = t0
    p = tmp_path / "s.jsonl"

    def ok(case, gpu, finished, first_launch):
        return result_record(
            "r1",
            "ok",
            kernel="k",
            case_id=case,
            backend={"name": "b"},
            timing={"median_us": 1.0},
            gpu_index=gpu,
            finished=finished,
            stages={"first_launch_s": first_launch, "item_s": 0.5},
        )

    with ResultsWriter(p) as w:
        w.write(environment_record("r1", created=created, device={"name": "NVIDIA H200"}, versions={}))
        w.write(ok("a", 0, t0 + 100.0, 40.0))  # JIT compile on GPU 0
        w.write(ok("b", 0, t0 + 130.0, 0.01))
        w.write(ok("c", 1, t0 + 90.0, 0.2))
        w.write(
            result_record(
                "r1",
                "error",
                kernel="k",
                case_id="d",
                backend={"name": "x"},
                reason="boom",
                gpu_index=1,
                finished=t0 + 95.0,
            )
        )
    [s] = [stats.run_stats(r) for r in stats.read_runs([p])]
    assert s["counts"] == {"ok": 3, "error": 1}
    assert s["gpus"][0] == {
        "cases": 2,
        "wall_s": 130.0,
        "jit_s": 40.0,
        "wall_without_jit_s": 90.0,
        "sum_item_s": 1.0,
    }
    assert s["gpus"][1]["wall_s"] == 95.0 and s["gpus"][1]["jit_s"] == 0.0
    assert s["wall_s"] == 130.0 and s["gpu_seconds_without_jit"] == 185.0
    assert s["errors"] == {"k · x: boom": 1}
    assert stats.main([str(p)]) == 0
    assert "gpu 0: 2 cases, wall 130.0 s, JIT 40.0 s, without JIT 90.0 s" in capsys.readouterr().out


def test_stage_breakdown_counts_a_copy_once(tmp_path, capsys):
    stats = _load()
    p = tmp_path / "r.jsonl"

    def rec(case, kernel, stages, **kw):
        return result_record(
            "r1",
            "ok",
            kernel=kernel,
            case_id=case,
            backend={"name": "b"},
            timing={"median_us": 1.0},
            stages=stages,
            **kw,
        )

    with ResultsWriter(p) as w:
        w.write(
            environment_record("r1", created="2026-11-26T00:00:00+00:00", device={"name": "G"}, versions={})
        )
        w.write(
            rec(
                "a",
                "k1",
                {"check_s": 3.0, "sampling_s": 1.0, "measure_s": 1.5, "item_s": 5.0, "other_s": 0.5},
            )
        )
        w.write(rec("a2", "k1", {"check_s": 3.0, "item_s": 5.0}, shared_with="a"))
        w.write(rec("b", "k2", {"sampling_s": 1.0, "measure_s": 1.0, "item_s": 1.0}))
    [s] = [stats.run_stats(r) for r in stats.read_runs([p])]
    assert s["stages"] == {"check_s": 3.0, "sampling_s": 2.0, "measure_s": 2.5, "other_s": 0.5, "item_s": 6.0}
    assert list(s["kernels"]) == ["k1", "k2"] and s["kernels"]["k1"]["cases"] == 1
    assert stats.main([str(p), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "item time 6.0 s: check 3.0 s (50%), sampling 2.0 s (33%), other 0.5 s (8%)" in out
    assert "k1 (1 cases) 5.0 s" in out and "k2 (" not in out


def test_a_missing_file_is_one_line(tmp_path, capsys):
    assert _load().main([str(tmp_path / "none.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sweep_stats: cannot read ") and "none.jsonl" in err[0]
