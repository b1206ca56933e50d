"""The results schema: round trip, validation, crash-truncated files, damaged files."""

from __future__ import annotations

import json

import pytest

from dskbench.results import (
    SCHEMA,
    ResultsError,
    ResultsWriter,
    environment_record,
    latest_by_case,
    read_runs,
    result_record,
)

ENV = {"created": "2026-11-21T00:00:00+00:00", "device": {"kind": "cpu"}, "versions": {"torch": "x"}}


def _ok(case: str, us: float, run: str = "r1") -> dict:
    return result_record(run, "ok", kernel="k", case_id=case, backend={"name": "b"}, timing={"median_us": us})


def test_round_trip(tmp_path):
    p = tmp_path / "r.jsonl"
    with ResultsWriter(p) as w:
        w.write(environment_record("r1", **ENV))
        w.write(_ok("k/op/decode/T=1", 1.5))
        w.write(
            result_record(
                "r1",
                "skipped",
                kernel="k",
                case_id="k/op/decode/T=2",
                backend={"name": "b"},
                reason="needs sm100 (found sm90)",
            )
        )
    with ResultsWriter(p) as w:  # a second run appended to the same file
        w.write(environment_record("r2", **ENV))
        w.write(_ok("k/op/decode/T=1", 1.2, "r2"))
    runs = read_runs([p])
    assert [r.run_id for r in runs] == ["r1", "r2"]
    assert runs[0].environment["schema"] == SCHEMA and len(runs[0].results) == 2
    assert runs[0].results[0]["timing"]["median_us"] == 1.5
    latest = latest_by_case(runs)
    assert latest[("k/op/decode/T=1", "b")]["timing"]["median_us"] == 1.2


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"status": "ok"}, "needs its timing"),
        ({"status": "wrong"}, "needs a reason"),
        ({"status": "weird"}, "is not one of"),
    ],
)
def test_invalid_results_are_refused(fields, message):
    with pytest.raises(ResultsError, match=message):
        result_record("r", kernel="k", backend={"name": "b"}, **fields)


def test_a_line_cut_off_by_a_crash_is_ignored(tmp_path):
    p = tmp_path / "r.jsonl"
    lines = [json.dumps(environment_record("r1", **ENV)), json.dumps(_ok("c", 1.0))]
    p.write_text("\n".join(lines) + "\n" + lines[1][:20])  # the last write never finished
    (run,) = read_runs([p])
    assert len(run.results) == 1


def test_damage_names_file_and_line(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text(
        json.dumps(environment_record("r1", **ENV)) + "\n{not json\n" + json.dumps(_ok("c", 1.0)) + "\n"
    )
    with pytest.raises(ResultsError, match=r"r\.jsonl:2: not JSON"):
        read_runs([p])
    p.write_text(json.dumps({"record": "result", "schema": "other/9", "run_id": "x"}) + "\n")
    with pytest.raises(ResultsError, match=r"r\.jsonl:1: schema"):
        read_runs([p])
    p.write_text(json.dumps(_ok("c", 1.0)) + "\n")
    with pytest.raises(ResultsError, match="before its environment record"):
        read_runs([p])


def test_ok_without_a_median_reads_as_an_error(tmp_path):
    p = tmp_path / "r.jsonl"
    bad = _ok("c", 1.0)
    bad["timing"]["median_us"] = float("nan")
    p.write_text(json.dumps(environment_record("r1", **ENV)) + "\n" + json.dumps(bad) + "\n")
    (run,) = read_runs([p])
    assert run.results[0]["status"] == "error" and "no timing samples" in run.results[0]["reason"]


def test_git_state_records_the_commit_and_a_launcher_given_one(monkeypatch):
    from unittest import mock

    import dskbench.environment as env

    state = env.git_state()
    assert state["commit"] and len(state["commit"]) == 40  # this checkout's HEAD
    monkeypatch.setenv("DSKBENCH_GIT_COMMIT", "0123abc")
    with mock.patch.object(env.subprocess, "run", side_effect=OSError("no git here")):
        got = env.git_state()
    assert got == {
        "commit": "0123abc",
        "dirty": None,
        "source": "DSKBENCH_GIT_COMMIT",
        "git_said": {"commit": None, "dirty": None},
    }
    # a copied tree whose .git is stale: the launcher's commit wins, git's answer is kept beside it
    got = env.git_state()
    assert got["commit"] == "0123abc" and got["git_said"]["commit"] == state["commit"]
    monkeypatch.setenv("DSKBENCH_GIT_COMMIT", state["commit"])  # the same commit: git's own record
    assert env.git_state()["commit"] == state["commit"] and "source" not in env.git_state()


def test_gzipped_results_read_like_plain_ones_and_are_never_appended_to(tmp_path):
    import gzip
    import shutil

    plain = tmp_path / "r.jsonl"
    with ResultsWriter(plain) as w:
        w.write(environment_record("r1", **ENV))
        w.write(_ok("k/op/decode/T=1", 1.5))
    packed = tmp_path / "r.jsonl.gz"
    with plain.open("rb") as src, gzip.open(packed, "wb") as dst:
        shutil.copyfileobj(src, dst)
    [run] = read_runs([packed])
    assert [r["timing"]["median_us"] for r in run.results] == [1.5]
    with pytest.raises(ResultsError, match="plain JSON lines"):
        ResultsWriter(packed)
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(ResultsError, match="cannot read"):
        read_runs([tmp_path / "bad.jsonl.gz"])
