"""The commands beside run/report/compare/pick on the CPU: `dskbench noise-prior` fits a prior that
compare then reads; `insitu`, `fidelity` and `selftest` check their input and say in one line that they
need a GPU; `pack` refuses what it cannot pack without leaving a file behind. (`stats`, `plan-stats`,
`run-to-run`, `pack` and `comm` have their own files: test_sweep_stats.py, test_plan_stats.py,
test_evidence_scripts.py, test_comm_command.py, test_comm_driver.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from dskbench.analysis.noise import load_prior
from dskbench.frontends.cli import EXIT_USAGE, main
from tests.fake_results import COMMIT_A, make_run, write_runs

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a CPU-only box gets")


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def _pair(tmp_path):
    """Two runs of the same code and cases on one H200 (different input seeds): an unchanged pair."""
    a = write_runs(
        [make_run("a", "h200", COMMIT_A, "2026-01-10T10:00:00+00:00", seed=1)], tmp_path / "a.jsonl"
    )
    b = write_runs(
        [make_run("b", "h200", COMMIT_A, "2026-01-10T11:00:00+00:00", seed=2)], tmp_path / "b.jsonl"
    )
    return a, b


def test_noise_prior_fits_a_prior_compare_reads(tmp_path, capsys):
    a, b = _pair(tmp_path)
    out = tmp_path / "prior.json"
    assert main(["noise-prior", "--pair", "h200 twice", str(a), str(b), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["generated_by"] == "dskbench noise-prior (custom pairs)"
    ((pair),) = doc["pairs"]
    assert pair["name"] == "h200 twice" and pair["cases"] > 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"{out}: {pair['cases']} cases from 1 pairs"
    assert len(printed) == 1 + len(doc["bands"]) and all(" us: " in ln for ln in printed[1:])
    prior = load_prior(out)  # the file compare's --prior reads
    assert [b.median_floor for b in prior.bands] == [b["median_floor"] for b in doc["bands"]]


def test_noise_prior_bad_input_is_one_line(tmp_path, capsys):
    a, _b = _pair(tmp_path)
    missing = tmp_path / "none.jsonl"
    out = tmp_path / "prior.json"
    assert main(["noise-prior", "--pair", "x", str(a), str(missing), "--out", str(out)]) == EXIT_USAGE
    assert _one_line(capsys) == f"dskbench: {missing}: no such file or folder"
    empty = write_runs([], tmp_path / "empty.jsonl")
    assert main(["noise-prior", "--pair", "x", str(empty), str(empty), "--out", str(out)]) == EXIT_USAGE
    assert "nothing to fit" in _one_line(capsys)
    assert main(["noise-prior", "--quantile", "2"]) == EXIT_USAGE
    assert "--quantile: expected a quantile between 0 and 1, e.g. 0.999, got '2'" in _one_line(capsys)
    assert not out.exists()  # nothing written on bad input


def test_insitu_checks_its_results_before_the_gpu(tmp_path, capsys):
    missing = tmp_path / "none.jsonl"
    assert main(["insitu", str(missing)]) == EXIT_USAGE
    assert _one_line(capsys) == f"dskbench: cannot read {missing}: No such file or directory"
    runs = [make_run(r, d, COMMIT_A, "2026-01-10T10:00:00+00:00") for r, d in (("a", "h200"), ("b", "b200"))]
    results = write_runs(runs, tmp_path / "r.jsonl")
    assert main(["insitu", str(results)]) == EXIT_USAGE  # one pick is of one device
    assert _one_line(capsys).startswith("dskbench: results of several devices (")
    assert main(["insitu", str(results), "--batch", "1,0"]) == EXIT_USAGE
    assert "--batch: expected comma-separated positive integers, got '1,0'" in _one_line(capsys)


@no_gpu
def test_gpu_commands_say_in_one_line_that_they_need_a_gpu(tmp_path, capsys):
    results = write_runs([make_run("a", "h200", COMMIT_A, "2026-01-10T10:00:00+00:00")], tmp_path / "r.jsonl")
    out = tmp_path / "o.json"
    for argv in (
        ["insitu", str(results), "--out", str(out)],
        ["fidelity", "--out", str(out)],
        ["selftest", str(out)],
    ):
        assert main(argv) == EXIT_USAGE
        assert _one_line(capsys) == (
            f"dskbench: {argv[0]} needs a CUDA GPU, and torch sees none (torch.cuda.is_available() is False)"
        )
    assert not out.exists()


def test_pack_refuses_what_it_cannot_pack_and_leaves_no_file(tmp_path, capsys):
    missing, out = tmp_path / "none.jsonl", tmp_path / "out.jsonl.gz"
    assert main(["pack", str(missing), str(out)]) == EXIT_USAGE
    assert _one_line(capsys).startswith(f"dskbench: cannot pack {missing} into {out}: ")
    assert not out.exists()
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"record": "environment"}\nnot json\n')
    assert main(["pack", str(broken), str(out)]) == EXIT_USAGE
    assert _one_line(capsys) == f"dskbench: {broken}:2: not JSON: Expecting value"
    assert not out.exists()
    assert main(["pack", str(broken), str(broken)]) == EXIT_USAGE
    assert "the packed file must not be the file it packs" in _one_line(capsys)


def test_fidelity_judges_each_timer_against_cupti():
    """Per timer (per-case cold, batched cold, hot): the delta to CUPTI's reading and whether it is within
    3% from 5 us up, 0.3 us below; rows not ok, or missing a reading, are not counted; the table's last
    line gives both counts."""
    from dskbench.execution.fidelity import judge, table

    rows = [
        {
            "kernel": "a",
            "op": "o",
            "backend": "b",
            "status": "ok",
            "case_id": "a/1",
            "ours_cold_us": 2.2,
            "batched_cold_us": 2.6,
            "cupti_cold_us": 2.53,
            "ours_hot_us": 100.0,
            "cupti_hot_us": 104.0,
        },
        {
            "kernel": "c",
            "op": "o",
            "backend": "b",
            "status": "ok",
            "case_id": "c/1",
            "ours_cold_us": 50.0,
            "cupti_cold_us": 50.5,
            "ours_hot_us": 40.0,
            "cupti_hot_us": 40.2,
        },
        {"kernel": "d", "op": "o", "backend": "b", "status": "skipped: needs sm100"},
    ]
    counts = judge(rows)
    assert counts == {"cold": (1, 2), "batched": (1, 1), "hot": (1, 2)}
    assert rows[0]["cold_within_target"] is False  # 0.33 us below CUPTI under 5 us
    assert rows[0]["batched_within_target"] is True and "batched_delta_pct" not in rows[1]
    assert rows[0]["hot_within_target"] is False  # 3.8% at 104 us
    text = table(rows, counts)
    assert text.splitlines()[-1] == (
        "2 cases measured; 2/4 mode comparisons within target (3% >= 5 us, 0.3 us below); the batched cold timer: 1/1"
    )
    assert "skipped: needs sm100" in text
