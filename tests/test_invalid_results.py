"""Results files written before the validity rule: an `ok` record whose timing is impossible (the shared-GPU
record: median 0 us, raw median -138 us, most samples clamped) is read as `unstable`, once, where every
reader loads results; the report, compare and pick then never use it as a number."""

from __future__ import annotations

import csv
import math
import random
import re
from pathlib import Path

import pytest
from fake_results import COMMIT_A, COMMIT_B, _case, _ok, environment, write_runs

from dskbench.analysis.compare import compare
from dskbench.analysis.compare_inputs import load_side
from dskbench.frontends import cli
from dskbench.pick.choose import Picker, ResultIndex, load_runs, pick
from dskbench.pick.deployment import load_deployment
from dskbench.pick.markdown import render_markdown
from dskbench.results.io import Run, finished_cases, iter_records, read_runs, result_record
from dskbench.shapes.cases import default_shapes
from tests.test_pick import DEPLOYMENT
from tests.test_pick import rec as pick_rec
from tests.test_pick import run_of as pick_run

H = 7168
OBSERVED = {  # as a cold graph measurement on a shared GPU recorded it, ok
    "median_us": 0.0,
    "p10_us": 0.0,
    "p90_us": 9.8,
    "mean_us": 4.9,
    "min_us": 0.0,
    "max_us": 9.8,
    "cv": 1.0,
    "noise": math.inf,
    "n_samples": 110,
    "launches_per_sample": 8,
    "converged": False,
    "method": "cuda-graph",
    "mode": "cold",
    "device": "cuda",
    "n_sets": 1,
    "samples_us": [9.8, 0.0] * 55,
    "raw_median_us": -138.0,
    "launch_gap_us": 2.1,
    "notes": ["55 samples shorter than the launch gap (2.100 us), clamped at 0"],
}
INVALID = {("flashinfer", 1), ("sgl_kernel", 2), ("flashinfer", 2)}  # T=2: no valid number at all


def rmsnorm_run(run_id: str, commit: str, created: str, invalid: set, seed: int) -> Run:
    """rmsnorm at decode T=1, 2, 4 on an H200, sgl_kernel and flashinfer (the faster one, when valid)."""
    rng = random.Random(seed)
    recs = []
    for t in (1, 2, 4):
        case = _case("rmsnorm", "input_layernorm", "decode", {"T": t}, {"T": t, "hidden": H})
        for b, eff in (("sgl_kernel", 0.8), ("flashinfer", 0.85)):
            r = _ok(rng, "h200", case, b, 4 * t * H + 2 * H, 0, 2.1, eff)
            if (b, t) in invalid:
                r["timing"] = dict(OBSERVED)
            recs.append(result_record(run_id, r.pop("status"), **r))
    return Run(environment(run_id, "h200", commit, created), recs)


@pytest.fixture()
def old_file(tmp_path) -> Path:
    return write_runs(
        [rmsnorm_run("r2", COMMIT_B, "2026-01-12T10:00:00+00:00", INVALID, 2)], tmp_path / "old.jsonl"
    )


@pytest.fixture()
def valid_file(tmp_path) -> Path:
    return write_runs(
        [rmsnorm_run("r1", COMMIT_A, "2026-01-10T10:00:00+00:00", set(), 1)], tmp_path / "ok.jsonl"
    )


def _key(r: dict) -> tuple[str, int]:
    return r["backend"]["name"], r["point"]["T"]


def test_an_old_ok_record_with_an_impossible_timing_is_read_as_unstable_with_the_reason(old_file):
    assert {r["status"] for r in iter_records(old_file) if r["record"] == "result"} == {"ok"}  # as written
    (run,) = read_runs([old_file])
    by = {_key(r): r for r in run.results}
    for key, r in by.items():
        if key in INVALID:
            assert r["status"] == "unstable" and r["reclassified_from"] == "ok"
            assert r["reason"].startswith("impossible measurement: median 0 us")
            assert "raw median -138 us" in r["reason"] and "55 of 110 samples" in r["reason"]
            assert r["timing"] == OBSERVED  # kept as the file has it
        else:
            assert r["status"] == "ok" and "reclassified_from" not in r
    assert len(finished_cases([run], retry_errors=True)) == 6 - len(INVALID)  # --retry-errors runs them again


def test_the_report_shows_no_invalid_number_and_lists_each_with_its_reason(old_file, tmp_path, capsys):
    out = tmp_path / "rep"
    assert cli.main(["report", str(old_file), "--out", str(out)]) == 0
    page = (out / "index.html").read_text(encoding="utf-8")
    overview = page[page.index('class="card overview"') : page.index('class="card invalid"')]
    cells = re.findall(r'<td class="w[^"]*"[^>]*>(.*?)</td>', overview, re.S)
    assert len(cells) == 3  # T=1, 2, 4
    assert "sgl_kernel" in cells[0] and "flashinfer" not in cells[0]  # not "flashinfer 0 µs"
    assert "no valid measurement" in cells[1] and "µs" not in cells[1]
    assert "<b>" in cells[2] and "µs" in cells[2]  # both valid there: a number
    card = page[page.index('class="card invalid"') :]
    card = card[: card.index("</div>")]
    assert "Invalid measurements on NVIDIA H200: 3" in card
    assert (
        card.count("impossible measurement: median 0 us") == 2
    )  # per backend: flashinfer T=1,2; sgl_kernel T=2
    assert "recorded ok by an earlier version" in card and "T=1, T=2" in card
    section = page[page.index('<details class="kernel"') :]
    table = section[section.index('<table class="res">') : section.index("</table>")]
    assert table.count("<tr class=") == 6 - len(INVALID)  # only valid numbers in the results table
    assert "(invalid measurement at T=1, T=2)" in section and "<h4>Invalid measurements</h4>" in section
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "### Invalid measurements (3)" in md and "impossible measurement: median 0 us" in md
    ov = next(line for line in md.splitlines() if line.startswith("| input_layernorm"))
    assert "no valid measurement (unstable)" in ov and "flashinfer 0 " not in ov
    with (out / "results.csv").open(encoding="utf-8") as fh:
        rows = {(r["backend"], int(r["point"].split("=")[1])): r for r in csv.DictReader(fh)}
    for key in INVALID:
        assert rows[key]["status"] == "unstable" and rows[key]["median_us"] == ""
        assert rows[key]["reason"].startswith("impossible measurement")


def test_compare_calls_no_verdict_on_an_invalid_side(old_file, valid_file, capsys):
    for old, new in ((valid_file, old_file), (old_file, valid_file)):
        result = compare(load_side([old]), load_side([new]))
        verdicts = {(c.key.backend, int(c.key.case.rsplit("=", 1)[1])): c for c in result.changes}
        for key in INVALID:
            assert verdicts[key].verdict == "invalid" and "impossible measurement" in verdicts[key].note
            assert not verdicts[key].is_regression and not verdicts[key].is_improvement
        assert {c.verdict for k, c in verdicts.items() if k not in INVALID} <= {"same", "~slower", "~faster"}
        assert "3 invalid" in result.summary()
    assert cli.main(["compare", str(valid_file), str(old_file)]) == 0  # nothing regressed: exit 0
    shown = capsys.readouterr().out
    line = next(x for x in shown.splitlines() if "decode/T=2" in x and "flashinfer" in x)
    assert "unstable" in line and "invalid (new: impossible measurement" in line


def test_pick_takes_an_invalid_record_for_no_measurement(tmp_path):
    records = [
        pick_rec("normk", "input_layernorm", "b_ok", 1, 2.0),
        pick_rec("normk", "input_layernorm", "b_zero", 1, 0.0),  # impossible, yet "fastest"
        pick_rec("normk", "input_layernorm", "b_zero", 16, 0.0),
    ]
    path = write_runs([pick_run(records)], tmp_path / "pick.jsonl")
    (dep_file := tmp_path / "deployment.yaml").write_text(DEPLOYMENT)
    dep = load_deployment(default_shapes(), dep_file)
    runs, device = load_runs([path])
    picker = Picker(ResultIndex(runs, "decode", 1), dep, "decode", 1)
    row = next(r for r in picker.rows if r.name == "input_layernorm")
    one = picker.cell(row, 1, None)
    assert one.winner.name == "b_ok" and [o.name for o in one.ranked] == ["b_ok"]
    sixteen = picker.cell(row, 16, None)
    assert sixteen.winner is None and not sixteen.excluded
    (invalid,) = [o for o in sixteen.missing if o.name == "b_zero"]
    assert (
        invalid.status == "invalid" and "normk/b_zero: impossible measurement: median 0 us" in invalid.reason
    )
    md = render_markdown(pick(runs, device, phases=["decode"], batches=[1, 16], dep=dep))
    assert "| input_layernorm | **b_ok** 2.00 | no valid measurement |" in md
    assert "b_zero: no valid measurement at every point — normk/b_zero: impossible measurement" in md
