"""The results schema: round trip, validation, crash-truncated files, damaged files."""

from __future__ import annotations

import json

import pytest

from dskbench.results.io import (
    SCHEMA,
    ResultsError,
    ResultsWriter,
    Run,
    environment_record,
    finished_cases,
    latest_by_case,
    prepare_append,
    read_runs,
    result_record,
    settings_differences,
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

    import dskbench.results.environment as env

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
        "source_tree": state["source_tree"],  # the files' own id: known without git
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


# -- appending safely --------------------------------------------------------------------------------------


def _file_with(tmp_path, *records: dict, tail: bytes = b"") -> tuple:
    p = tmp_path / "r.jsonl"
    p.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records) + tail)
    return p, p.read_bytes()


def test_an_unfinished_last_line_is_cut_off_before_appending_and_the_user_told(tmp_path, capsys):
    whole = json.dumps(_ok("c2", 2.0)).encode()
    p, before = _file_with(tmp_path, environment_record("r1", **ENV), _ok("c1", 1.0), tail=whole[:37])
    with ResultsWriter(p) as w:  # a resumed sweep's writer
        w.write(environment_record("r2", **ENV))
        w.write(_ok("c2", 2.0, "r2"))
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(p) in err and "37 bytes" in err  # one line: the file and what went
    after = p.read_bytes()
    assert after.startswith(before[:-37])  # the whole records before the cut, byte for byte
    lines = after.split(b"\n")
    assert len(lines) == 5 and lines[-1] == b"" and all(json.loads(line) for line in lines[:-1])
    runs = read_runs([p])
    assert [r.run_id for r in runs] == ["r1", "r2"]
    assert [r["case_id"] for run in runs for r in run.results] == ["c1", "c2"]


def test_only_the_unfinished_last_line_is_ever_cut(tmp_path, capsys):
    env, ok = environment_record("r1", **ENV), _ok("c1", 1.0)
    # NUL bytes a lost write can leave: cut, everything before them kept byte for byte
    p, before = _file_with(tmp_path, env, ok, tail=b"\0" * 4096)
    assert prepare_append(p, repair=False) == 4096 and p.read_bytes() == before  # a dry run: told, not cut
    assert prepare_append(p) == 4096 and p.read_bytes() == before[:-4096]
    assert "4096 bytes" in capsys.readouterr().err
    # a whole record that lacks only its newline is kept and completed, silently
    p, before = _file_with(tmp_path, env, tail=json.dumps(ok).encode())
    assert prepare_append(p) == 0 and p.read_bytes() == before + b"\n"
    assert capsys.readouterr().err == ""
    p.write_bytes(json.dumps(env).encode())  # killed right after its first record's last brace
    assert prepare_append(p) == 0 and read_runs([p])[0].run_id == "r1" and p.read_bytes().endswith(b"}\n")
    # a damaged line that did end (a middle line, or the last one with its newline) is not ours to cut
    p, before = _file_with(tmp_path, env, ok, tail=b"{damaged\n")
    assert prepare_append(p) == 0 and p.read_bytes() == before
    # a file that ends properly is left alone
    p, before = _file_with(tmp_path, env, ok)
    assert prepare_append(p) == 0 and p.read_bytes() == before


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"# dskbench\n\nA benchmark suite.\n", "not a dskbench results file"),
        (b"just one line, no newline", "not a dskbench results file"),  # never 'repaired' to nothing
        (b'{"a": 1}\n{"b": 2}\n', "not a dskbench results file"),  # JSON lines, someone else's
        (json.dumps(_ok("c", 1.0)).encode() + b"\n", "not a dskbench results file"),  # no environment first
        (b'{"record": "environment", "schema": "dskbench.results/9", "run_id": "x"}\n', "schema"),
        (b"\xff\xfe\x00binary\n", "not a dskbench results file"),
    ],
)
def test_a_file_that_is_not_ours_is_refused_and_left_untouched(tmp_path, content, message):
    p = tmp_path / "notes.jsonl"
    p.write_bytes(content)
    with pytest.raises(ResultsError, match=message) as e:
        ResultsWriter(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)
    assert p.read_bytes() == content


def test_new_and_empty_files_are_written(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    for name in ("empty.jsonl", "sub/new.jsonl"):
        with ResultsWriter(tmp_path / name) as w:
            w.write(environment_record("r1", **ENV))
        assert len(read_runs([tmp_path / name])) == 1


def test_a_folder_is_refused_in_one_line(tmp_path):
    (tmp_path / "out.jsonl").mkdir()
    with pytest.raises(ResultsError, match="out.jsonl"):
        ResultsWriter(tmp_path / "out.jsonl")


# -- resuming ----------------------------------------------------------------------------------------------


def _run(run_id: str, results: list[dict], **settings) -> Run:
    return Run(environment_record(run_id, **ENV, settings=settings), results)


def _rec(case: str, status: str, run: str = "r1") -> dict:
    if status == "ok":
        return _ok(case, 1.0, run)
    return result_record(
        run, status, kernel="k", case_id=case, backend={"name": "b"}, reason="timed out after 30 s"
    )


def test_finished_cases_keep_errors_unless_told_to_retry(tmp_path):
    runs = [
        _run("r1", [_rec("ok", "ok"), _rec("hung", "error"), _rec("wrong", "wrong"), _rec("fixed", "error")]),
        _run("r2", [_rec("fixed", "ok", "r2"), _rec("broke", "ok", "r2"), _rec("broke", "error", "r2")]),
    ]
    every = {(c, "b") for c in ("ok", "hung", "wrong", "fixed", "broke")}
    assert finished_cases(runs) == every  # a hung case is not started again
    # the latest record of a case decides: 'fixed' is done, 'broke' (ok, then an error) runs again
    assert finished_cases(runs, retry_errors=True) == every - {("hung", "b"), ("broke", "b")}
    assert finished_cases([]) == set()


SAME = {"device": "cpu", "profile": "cpu", "phases": ["decode", "prefill"], "tp": [1], "mode": "cold"}


def test_settings_differences_name_each_key_and_both_values():
    runs = [_run("r1", [], **SAME, flush="write", seed=None, budget_s=0.2, gpus=1)]
    now = {
        **SAME,
        "phases": ("prefill", "decode"),
        "flush": "write",
        "seed": None,
        "budget_s": 1.0,
        "gpus": 4,
    }
    assert settings_differences(runs, now) == []  # sweep order, budget and GPU count do not matter
    assert settings_differences(runs, {**now, "mode": "hot", "seed": 7}) == [
        "mode cold in the file, hot now",
        "seed fresh in the file, 7 now",
    ]
    fixed = [_run("r1", [], **SAME, flush="write", seed=7), _run("r2", [], **SAME, flush="read", seed=8)]
    assert settings_differences(fixed, {**now, "seed": 7}) == [
        "flush read in the file, write now",
        "seed 8 in the file, 7 now",
    ]
    assert settings_differences(fixed[:1], {**now, "seed": 7}) == []  # the same fixed seed
    # a file from before --flush existed flushed by writing; a key never recorded at all is named so
    old = [_run("r0", [], **SAME)]
    assert settings_differences(old, now) == ["seed not recorded in the file, fresh now"]
    assert settings_differences(old, {**now, "flush": "read"})[0] == "flush write in the file, read now"
