"""An impossible timing is never ok: the engine measures it once more, then records it `unstable` with
the validity rule's reason (the timing kept, no metrics), counts it, exits 1, and `--retry-errors`
runs it again. The measurement core is faked: each call returns the next scripted Measurement."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import tests.fake_adapters  # noqa: F401 - registers the fake kernels in this process
from dskbench.device.info import DeviceInfo
from dskbench.execution.case import execute_item
from dskbench.execution.runner import SweepOptions, plan_sweep
from dskbench.frontends import cli
from dskbench.measure import Measurement
from dskbench.results.io import read_runs
from dskbench.results.records import ResultRecord
from dskbench.shapes.cases import default_shapes
from tests.fake_adapters import registry_entry as _entry

N = len(default_shapes().values("decode_tokens", "cpu"))


def measurement(median: float, **over) -> Measurement:
    """A cold graph measurement of 40 samples; median 0 with most of them clamped: the shared-GPU case."""
    bad = median <= 0
    fields = dict(
        median_us=median,
        p10_us=0.0 if bad else median * 0.95,
        p90_us=9.8 if bad else median * 1.05,
        mean_us=4.9 if bad else median,
        min_us=0.0 if bad else median * 0.9,
        max_us=9.8 if bad else median * 1.1,
        cv=1.0 if bad else 0.02,
        noise=math.inf if bad else 0.005,
        n_samples=40,
        launches_per_sample=8,
        converged=not bad,
        wall_s=0.1,
        method="cuda-graph",
        mode="cold",
        device="cpu",
        n_sets=1,
        samples_us=[9.8, 0.0] * 20 if bad else [median] * 40,
        raw_median_us=-138.0 if bad else median + 2.0,
        launch_gap_us=2.0,
        clamped=21 if bad else 0,
        notes=["21 samples shorter than the launch gap (2.000 us), clamped at 0"] if bad else [],
        stage_s={"warmup_s": 0.01, "prepare_s": 0.01, "sampling_s": 0.05},
    )
    return Measurement(**{**fields, **over})


class Script:
    """core.measure replaced: each call returns the next scripted measurement (the last one repeats)."""

    def __init__(self, *medians: float):
        self.medians, self.calls = list(medians), 0

    def __call__(self, launchers, **kw) -> Measurement:
        self.calls += 1
        return measurement(self.medians[min(self.calls, len(self.medians)) - 1])


@pytest.fixture()
def item():
    opts = SweepOptions(device="cpu", phases=("decode",), profile="cpu")
    items, _ = plan_sweep({"fake_ok": _entry("fake_ok")}, default_shapes(), ["fake_ok"], ["fake"], opts)
    return items[0]


def _execute(item, monkeypatch, script: Script) -> dict:
    monkeypatch.setattr("dskbench.measure.measure", script)
    opts = SweepOptions(device="cpu", profile="cpu", measure_ceilings=False)
    return execute_item(item, DeviceInfo("cpu"), opts, 0, None)


def test_a_valid_measurement_is_taken_once(item, monkeypatch):
    script = Script(5.0)
    fields = _execute(item, monkeypatch, script)
    assert script.calls == 1 and fields["status"] == "ok" and fields["timing"]["median_us"] == 5.0
    assert fields["timing"]["clamped"] == 0 and fields["timing"]["notes"] == []


def test_an_impossible_measurement_is_measured_again_and_the_second_stands(item, monkeypatch):
    script = Script(0.0, 5.0)
    fields = _execute(item, monkeypatch, script)
    assert script.calls == 2
    assert fields["status"] == "ok" and fields["timing"]["median_us"] == 5.0
    assert fields["metrics"]["latency_us"] == 5.0
    (note,) = fields["timing"]["notes"]
    assert note.startswith("measured twice: the first was dropped (impossible measurement: median 0 us")


def test_impossible_twice_is_unstable_with_the_reason_and_its_timing_kept(item, monkeypatch):
    script = Script(0.0, 0.0)
    fields = _execute(item, monkeypatch, script)
    assert script.calls == 2  # once more, not forever
    assert fields["status"] == "unstable"
    reason = fields["reason"]
    assert reason.startswith("impossible measurement: median 0 us") and "\n" not in reason
    assert "raw median -138 us" in reason and "21 of 40 samples" in reason and "noise inf" in reason
    assert fields["timing"]["median_us"] == 0.0 and fields["timing"]["samples_us"][:2] == [9.8, 0.0]
    assert "metrics" not in fields  # no GB/s of an impossible median
    assert fields["check"]["error"] == 0  # checked before it was timed
    rec = ResultRecord.from_json({**fields, "run_id": "r"}).validate_complete()  # what the Recorder writes
    assert rec.status == "unstable" and rec.timing.clamped == 21


def test_a_measurement_with_no_samples_is_still_an_error_not_retried(item, monkeypatch):
    script = Script(math.nan)
    fields = _execute(item, monkeypatch, script)
    assert script.calls == 1
    assert fields["status"] == "error" and fields["reason"] == "the measurement produced no timing samples"


# -- through the command line: counted, exit 1, retried by --retry-errors ------------------------------------


def _run(tmp_path: Path, monkeypatch, *extra: str) -> tuple[int, Path]:
    reg = {"fake_ok": _entry("fake_ok")}
    monkeypatch.setattr("dskbench.frontends.cli.common.registry_and_shapes", lambda: (reg, default_shapes()))
    out = tmp_path / "r.jsonl"
    argv = ["run", "--device", "cpu", "--sweep", "decode", "--backend", "fake", "--kernel", "fake_ok"]
    argv += ["--seed", "5", "--no-isolate", "--allow-drift", "--out", str(out), *extra]
    return cli.main(argv), out


def test_a_run_with_unstable_cases_counts_them_exits_1_and_retry_errors_runs_them_again(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr("dskbench.measure.measure", Script(0.0))  # every measurement impossible
    rc, out = _run(tmp_path, monkeypatch)
    assert rc == cli.EXIT_FAIL
    stdout, stderr = capsys.readouterr()
    head, row = stdout.splitlines()[:2]
    assert head.split()[2:7] == ["ok", "wrong", "skipped", "error", "unstable"]
    assert row.split()[2:8] == ["0", "0", "0", "0", str(N), "-"]  # no median of impossible ones
    assert any(
        ln.startswith(f"{N} cases: ok 0, wrong 0, skipped 0, error 0, unstable {N}")
        for ln in stdout.splitlines()
    )
    assert stdout.splitlines()[-1].startswith("  unstable  fake_ok")  # the cases not ok end the output
    lines = [line for line in stderr.splitlines() if line.startswith("[")]
    assert len(lines) == N and all(
        "] unstable " in x and "(impossible measurement: median 0 us" in x for x in lines
    )
    assert not any(" us  fake_ok/" in x for x in lines)  # the impossible median is not shown
    (run,) = read_runs([out])
    assert {r["status"] for r in run.results} == {"unstable"}
    assert all("reclassified_from" not in r for r in run.results)  # the engine's own verdict
    capsys.readouterr()
    rc = cli.main(["run", "--device", "cpu", "--sweep", "decode", "--backend", "fake", "--kernel", "fake_ok",
                   "--seed", "5", "--allow-drift", "--out", str(out), "--resume", "--dry-run"])  # fmt: skip
    assert rc == 0 and f"{N} cases already done ({N} of them unstable, kept" in capsys.readouterr().err
    rc = cli.main(["run", "--device", "cpu", "--sweep", "decode", "--backend", "fake", "--kernel", "fake_ok",
                   "--seed", "5", "--allow-drift", "--out", str(out), "--resume", "--retry-errors",
                   "--dry-run"])  # fmt: skip
    got = capsys.readouterr()
    assert rc == 0 and f"{N} cases to run" in got.out and f"{N} unstable to run again" in got.err
