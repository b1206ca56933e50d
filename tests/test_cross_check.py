"""The cross-check of each record by a second timer, as the engine records it and the readers show it: a
CPU run says why it has none, `--no-cross-check` says it was turned off, a flagged record stays ok and is
marked by report, compare and pick, a gross disagreement ends unstable, and files written before the
field read as before."""

from __future__ import annotations

import copy
import json

import pytest

pytest.importorskip("torch")

import tests.fake_adapters  # noqa: E402,F401 - registers the fakes
from dskbench import measure as core  # noqa: E402
from dskbench.analysis.compare_inputs import stat_from_record  # noqa: E402
from dskbench.execution.case import measure_settings  # noqa: E402
from dskbench.execution.runner import SweepOptions, plan_sweep, run_sweep  # noqa: E402
from dskbench.frontends import cli  # noqa: E402
from dskbench.frontends.cli.compare import cli_compare  # noqa: E402
from dskbench.measure import cross_check  # noqa: E402
from dskbench.report import write_report  # noqa: E402
from dskbench.results.io import read_runs  # noqa: E402
from dskbench.results.records import CrossCheck, ResultRecord  # noqa: E402
from dskbench.shapes.cases import default_shapes  # noqa: E402
from tests.fake_adapters import registry_entry  # noqa: E402
from tests.fake_results import fake_runs, write_runs  # noqa: E402


def _opts(**kw) -> SweepOptions:
    base = dict(
        device="cpu", phases=("decode",), profile="cpu", budget_s=0.02, measure_ceilings=False, seed=1
    )
    return SweepOptions(**{**base, **kw})


def _sweep(tmp_path, **kw):
    registry = {"fake_ok": registry_entry("fake_ok")}
    opts = _opts(isolate=False, **kw)
    items, skips = plan_sweep(registry, default_shapes(), ["fake_ok"], ["fake"], opts)
    run_sweep(items[:2], skips, opts, tmp_path / "r.jsonl")
    (run,) = read_runs([tmp_path / "r.jsonl"])
    return run


def test_a_cpu_run_records_why_it_has_no_second_timer(tmp_path):
    run = _sweep(tmp_path)
    assert run.environment["settings"]["cross_check"] is True
    for r in run.results:
        assert r["status"] == "ok"
        assert r["timing"]["cross_check"] == {
            "method": None,
            "agrees": None,
            "skipped": "a CPU run: wall-clock timing has no second timer",
        }


def test_the_option_turns_it_off_and_the_record_says_so(tmp_path, monkeypatch):
    run = _sweep(tmp_path, cross_check=False)
    assert run.environment["settings"]["cross_check"] is False
    for r in run.results:
        assert r["timing"]["cross_check"]["skipped"] == cross_check.SKIPPED_BY_OPTION
        assert "--no-cross-check" in r["repro"]
    assert measure_settings(_opts(device="cuda")).cross_check is True  # a GPU sweep asks for it
    assert measure_settings(_opts(device="cuda", cross_check=False)).cross_check is False
    assert core.MeasureSettings().cross_check is False  # the core alone (asv, calibration) does not

    seen = []

    def fake_run_sweep(items, skips, opts, out, progress=None):
        seen.append(opts.cross_check)
        raise KeyboardInterrupt

    monkeypatch.setattr("dskbench.execution.runner.run_sweep", fake_run_sweep)
    monkeypatch.setattr(
        "dskbench.frontends.cli.common.registry_and_shapes",
        lambda: ({"fake_ok": registry_entry("fake_ok")}, default_shapes()),
    )
    monkeypatch.setattr("dskbench.registry.load.drift_message", lambda: None)
    base = [
        "run",
        "--device",
        "cpu",
        "--kernel",
        "fake_ok",
        "--backend",
        "fake",
        "--out",
        str(tmp_path / "x.jsonl"),
    ]
    for extra, want in (([], True), (["--no-cross-check"], False)):
        assert cli.main([*base, *extra]) == 130
        assert seen.pop() is want


def _measured_with(cc: dict):
    real = core.measure

    def measure(*a, **kw):
        m = real(*a, **kw)
        m.cross_check = dict(cc, main_us=m.median_us, median_us=m.median_us / cc["ratio"])
        return m

    return measure


def test_a_disagreeing_record_stays_ok_and_a_gross_one_ends_unstable(tmp_path, monkeypatch):
    flagged = {
        "method": "cupti",
        "ratio": 1.4,
        "band": [0.9, 1.2],
        "agrees": False,
        "note": "CUPTI read less",
    }
    monkeypatch.setattr(core, "measure", _measured_with(flagged))
    run = _sweep(tmp_path / "a")
    for r in run.results:
        assert r["status"] == "ok" and r["timing"]["cross_check"]["agrees"] is False
        assert ResultRecord.from_json(r).timing.cross_check.flagged
    monkeypatch.setattr(core, "measure", _measured_with({**flagged, "ratio": 3.0}))
    run = _sweep(tmp_path / "b")
    for r in run.results:
        assert r["status"] == "unstable" and "timers disagree: cupti read" in r["reason"]
        assert "measured twice" in r["timing"]["notes"][-1]


def _with_flag(runs, ratio=1.3):
    """The fake runs with one ok H200 record of the newest run flagged (its timers disagree)."""
    runs = copy.deepcopy(runs)
    newest = max(
        (r for r in runs if "H200" in str(r.environment["device"])), key=lambda r: r.environment["created"]
    )
    rec = next(r for r in newest.results if r["status"] == "ok" and r["kernel"] == "rmsnorm")
    rec["timing"]["cross_check"] = {
        "method": "cuda-events",
        "agrees": False,
        "median_us": 9.9,
        "main_us": 1.0,
        "ratio": ratio,
        "band": [0.6, 1.2],
        "samples": 16,
        "note": "events read 9.9 us against 1.0 us",
    }
    return runs, rec


def test_report_marks_the_number_and_lists_the_flagged_records(tmp_path):
    old = fake_runs()
    assert not any("cross_check" in (r.get("timing") or {}) for run in old for r in run.results)
    html, md = (p.read_text(encoding="utf-8") for p in write_report(old, tmp_path / "old"))
    assert "Timers disagree" not in md and "Timers disagree" not in html  # files before the field
    runs, rec = _with_flag(old)
    html, md = (p.read_text(encoding="utf-8") for p in write_report(runs, tmp_path / "new"))
    assert "### Timers disagree (1)" in md
    line = next(x for x in md.splitlines() if x.startswith("- **rmsnorm**") and "events read 9.9" in x)
    assert rec["case_id"] in line
    assert sum(1 for x in md.splitlines() if x.startswith("|") and " ≠ |" in x) == 1  # beside its number
    assert "Timers disagree on NVIDIA H200: 1" in html and 'title="timers disagree: events read 9.9' in html


def test_compare_reads_old_files_and_names_the_flagged_records(tmp_path, capsys):
    runs = fake_runs()
    older = [r for r in runs if "H200" in str(r.environment["device"])]
    older.sort(key=lambda r: r.environment["created"])
    a = write_runs([older[0]], tmp_path / "a.jsonl")
    b = write_runs([older[1]], tmp_path / "b.jsonl")
    cli_compare([a], [b], fail_on_regression=False)
    assert "timers disagree" not in capsys.readouterr().out  # neither file has the field
    flagged, rec = _with_flag([older[1]])
    c = write_runs(flagged, tmp_path / "c.jsonl")
    cli_compare([a], [c], fail_on_regression=False)
    out = capsys.readouterr().out
    assert "timers disagree (1, marked ≠" in out
    short = rec["case_id"].split("/", 1)[1]
    assert f"rmsnorm {short} {rec['backend']['name']} (new): events read 9.9 us" in out
    assert stat_from_record(rec).disagree == "events read 9.9 us against 1.0 us"
    assert json.loads(json.dumps(rec["timing"]["cross_check"]))["ratio"] == 1.3


def test_old_records_read_without_a_cross_check_and_new_ones_round_trip():
    (old,) = [r for run in fake_runs()[:1] for r in run.results if r["status"] == "ok"][:1]
    rec = ResultRecord.from_json(old)
    assert rec.timing.cross_check is None and "cross_check" not in rec.to_json()["timing"]
    new = dict(old, timing={**old["timing"], "cross_check": cross_check.skipped("x")})
    back = ResultRecord.from_json(new)
    assert back.timing.cross_check == CrossCheck(method=None, agrees=None, skipped="x")
    assert back.to_json()["timing"]["cross_check"] == {"method": None, "agrees": None, "skipped": "x"}
    assert ResultRecord.from_json(back.to_json()) == back


def test_pick_names_the_picked_results_whose_timers_disagree(tmp_path):
    from dskbench.pick.choose import pick
    from dskbench.pick.deployment import load_deployment
    from dskbench.pick.json_out import render_json
    from dskbench.pick.markdown import render_markdown, render_summary
    from tests.test_pick import DEPLOYMENT, rec, run_of, scenario

    p = tmp_path / "deployment.yaml"
    p.write_text(DEPLOYMENT)
    dep = load_deployment(default_shapes(), p)
    records = scenario()
    plain = pick([run_of(records)], "NVIDIA H200", phases=["decode"], batches=[1, 16], dep=dep, inputs=["x"])
    assert "timers disagree" not in render_markdown(plain)
    flagged = rec("normk", "input_layernorm", "b_ok", 16, 2.0)
    flagged["timing"]["cross_check"] = {
        "method": "cupti",
        "agrees": False,
        "ratio": 1.5,
        "note": "CUPTI read 6.7 us",
    }
    records = [r for r in records if r["case_id"] != flagged["case_id"] or r["backend"] != flagged["backend"]]
    records.append(flagged)
    got = pick([run_of(records)], "NVIDIA H200", phases=["decode"], batches=[1, 16], dep=dep, inputs=["x"])
    md = render_markdown(got)
    assert "### Picked results whose timers disagree" in md
    assert "- normk · b_ok · input_layernorm at T=16: CUPTI read 6.7 us" in md
    assert "1 picked results of decode have timers that disagree" in render_summary(got, ["x"])
    assert render_json(got)["phases"]["decode"]["timers_disagree"] == [
        "normk · b_ok · input_layernorm at T=16: CUPTI read 6.7 us"
    ]
