"""`dskbench stats`: counts, per-GPU wall time, wall time without first-time JIT, the stage breakdown."""

from __future__ import annotations

import json

from dskbench.analysis import sweep_stats as stats
from dskbench.frontends.cli import EXIT_USAGE, main
from dskbench.results.io import ResultsWriter, environment_record, read_runs, result_record


def test_wall_per_gpu_and_jit_are_taken_from_the_records(tmp_path, capsys):
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
    [s] = [stats.run_stats(r) for r in read_runs([p])]
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
    out = tmp_path / "stats.json"
    assert main(["stats", str(p), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(
        "run r1 on NVIDIA H200: 4 records — ok 3, wrong 0, skipped 0, error 1; wall 130.0 s"
    )
    assert "gpu 0: 2 cases, wall 130.0 s, JIT 40.0 s, without JIT 90.0 s" in printed
    assert "  error x1: k · x: boom" in printed
    assert json.loads(out.read_text())[0]["gpu_seconds_without_jit"] == 185.0


def test_stage_breakdown_counts_a_copy_once(tmp_path, capsys):
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
    [s] = [stats.run_stats(r) for r in read_runs([p])]
    assert s["stages"] == {"check_s": 3.0, "sampling_s": 2.0, "measure_s": 2.5, "other_s": 0.5, "item_s": 6.0}
    assert list(s["kernels"]) == ["k1", "k2"] and s["kernels"]["k1"]["cases"] == 1
    assert main(["stats", str(p), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "item time 6.0 s: check 3.0 s (50%), sampling 2.0 s (33%), other 0.5 s (8%)" in out
    assert "k1 (1 cases) 5.0 s" in out and "k2 (" not in out


def test_a_missing_file_or_a_bad_option_is_one_line(tmp_path, capsys):
    assert main(["stats", str(tmp_path / "none.jsonl")]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dskbench: cannot read ") and "none.jsonl" in err[0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert main(["stats", str(bad)]) == EXIT_USAGE
    assert capsys.readouterr().err == f"dskbench: {bad}:1: not JSON: Expecting value\n"
    assert main(["stats", str(bad), "--top", "0"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--top: expected a positive integer, got '0'" in err


def test_trust_counts_peaks_impossible_shares_and_flags_once_per_measured_case(tmp_path, capsys):
    p = tmp_path / "t.jsonl"

    def rec(case, kernel, bw, agrees, **kw):
        cross = {} if agrees is None else {"cross_check": {"agrees": agrees}}
        return result_record(
            "r1",
            kw.pop("status", "ok"),
            kernel=kernel,
            case_id=case,
            backend={"name": "b"},
            timing={"median_us": 1.0, **cross},
            metrics={"pct_bw_datasheet": bw, "pct_compute_datasheet": None},
            **kw,
        )

    with ResultsWriter(p) as w:
        w.write(
            environment_record("r1", created="2026-11-27T00:00:00+00:00", device={"name": "G"}, versions={})
        )
        w.write(rec("a", "gemm", 80.0, False))
        w.write(rec("a2", "gemm", 80.0, False, shared_with="a"))  # a copy: counted once
        w.write(rec("b", "gemm", 91.5, True))
        w.write(rec("c", "norm", 104.0, False))  # impossible: over the datasheet
        w.write(rec("d", "norm", 50.0, None))  # not cross-checked
        w.write(rec("e", "norm", 150.0, False, status="wrong", reason="off"))  # not ok: not counted
    [s] = [stats.run_stats(r) for r in read_runs([p])]
    t = s["trust"]
    assert t["ok"] == 4 and t["over_100"] == 1 and t["cross_checked"] == 3
    assert t["flagged"] == 2 and t["flagged_by"] == {"gemm · b": 1, "norm · b": 1}
    assert t["highest"] == {"pct_bw_datasheet": {"pct": 104.0, "case": "c · b"}}
    assert main(["stats", str(p)]) == 0
    out = capsys.readouterr().out
    assert "trust: at most 104.0% of datasheet bandwidth (c · b); 1 over 100%" in out
    assert "second timer: 2 of 3 cross-checked ok records flagged (most: gemm · b 1, norm · b 1)" in out
