"""The command line's error paths and its CPU behaviour (no GPU here)."""

from __future__ import annotations

import json

import pytest

from dskbench import cli


def test_unknown_kernel_exits_2_with_a_hint(capsys):
    assert cli.main(["run", "--device", "cpu", "--kernel", "rmsnorn", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "unknown kernel 'rmsnorn'" in err and "rmsnorm" in err


def test_cuda_requested_without_a_gpu_explains(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--device", "cuda", "--kernel", "rmsnorm", "--dry-run"])
    assert "no CUDA GPU is visible" in str(e.value) and "--device cpu" in str(e.value)


def test_no_device_falls_back_to_cpu_references(capsys):
    assert cli.main(["run", "--kernel", "rmsnorm", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "no CUDA GPU found: timing the torch reference" in err
    assert "torch-ref" in out and "sgl_kernel" not in out


def test_malformed_trace_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.md"
    bad.write_text("# Traces\n\n| Kernel | Source |\n|---|---|\n| a | b | c |\n")
    assert cli.main(["registry", "generate", "--traces", str(bad), "--out", str(tmp_path / "reg")]) == 2
    captured = capsys.readouterr()
    assert "bad.md:5" in captured.err + captured.out  # the file and the line


def test_list_shows_every_kernel(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "cutlass_scaled_fp4_mm" in out and "85 kernels" in out


# -- --out and --resume --------------------------------------------------------------------------------------

RMSNORM = ["run", "--device", "cpu", "--kernel", "rmsnorm", "--sweep", "decode"]
CPU_SETTINGS = {"device": "cpu", "profile": "cpu", "phases": ["decode"], "tp": [1], "mode": "cold"}


def _planned_in(out: str) -> list[str]:
    """The case ids a dry run printed, in order."""
    return [line.split()[0] for line in out.splitlines() if "  torch-ref" in line]


def _planned(capsys) -> list[str]:
    """The case ids a dry run of RMSNORM would run, in order."""
    assert cli.main([*RMSNORM, "--dry-run"]) == 0
    return _planned_in(capsys.readouterr().out)


def _results_file(path, cases: dict[str, str], **settings) -> bytes:
    """A results file holding one run of RMSNORM with these cases' statuses; its bytes."""
    from dskbench.results import ResultsWriter, environment_record, result_record

    env = {"created": "2026-11-21T00:00:00+00:00", "device": {"kind": "cpu"}, "versions": {}}
    with ResultsWriter(path) as w:
        w.write(environment_record("r1", **env, settings={**CPU_SETTINGS, "flush": "write", **settings}))
        for case, status in cases.items():
            fields = {"timing": {"median_us": 1.0}} if status == "ok" else {"reason": "timed out after 30 s"}
            w.write(
                result_record(
                    "r1", status, kernel="rmsnorm", case_id=case, backend={"name": "torch-ref"}, **fields
                )
            )
    return path.read_bytes()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--resume"], "--resume needs --out"),
        (["--retry-errors"], "--retry-errors applies only with --resume"),
        (["--allow-mixed-settings", "--out", "x.jsonl"], "--allow-mixed-settings applies only with --resume"),
    ],
)
def test_resume_flags_without_what_they_need_exit_2(capsys, args, message):
    assert cli.main([*RMSNORM, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_out_refuses_a_file_that_is_not_a_results_file(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# My project\n\nNotes that must survive.\n")
    before = readme.read_bytes()
    assert cli.main([*RMSNORM, "--budget", "0.01", "--out", str(readme)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("dskbench: ") and "README.md is not a dskbench results file" in err and "\n" not in err
    )
    assert readme.read_bytes() == before


def test_resume_keeps_error_records_unless_retry_errors(tmp_path, capsys):
    cases = _planned(capsys)
    out = tmp_path / "r.jsonl"
    before = _results_file(out, {cases[0]: "ok", cases[1]: "error"}, seed=None)
    assert cli.main([*RMSNORM, "--out", str(out), "--resume", "--dry-run"]) == 0
    got = capsys.readouterr()
    assert _planned_in(got.out) == cases[2:]  # the hung case is not started again
    assert "2 cases already done (1 of them errors, kept: --retry-errors runs them again)" in got.err
    assert cli.main([*RMSNORM, "--out", str(out), "--resume", "--retry-errors", "--dry-run"]) == 0
    assert _planned_in(capsys.readouterr().out) == cases[1:]
    assert out.read_bytes() == before


def test_resume_refuses_other_settings_unless_told_to_mix(tmp_path, capsys):
    cases = _planned(capsys)
    out = tmp_path / "r.jsonl"
    before = _results_file(out, {cases[0]: "ok"}, seed=None)
    assert cli.main([*RMSNORM, "--out", str(out), "--resume", "--mode", "hot", "--seed", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dskbench: cannot resume {out}") and "\n" not in err
    assert "mode cold in the file, hot now" in err and "seed fresh in the file, 3 now" in err
    assert "--allow-mixed-settings" in err and out.read_bytes() == before
    # a fresh-seed file resumed with fresh inputs is fine (every run of that policy draws new ones)
    assert cli.main([*RMSNORM, "--out", str(out), "--resume", "--dry-run"]) == 0
    capsys.readouterr()
    args = [*RMSNORM, "--out", str(out), "--resume", "--mode", "hot", "--allow-mixed-settings", "--dry-run"]
    assert cli.main(args) == 0
    got = capsys.readouterr()
    assert "with other settings than its earlier runs (mode cold in the file, hot now)" in got.err
    assert _planned_in(got.out) == cases[1:]


def test_resume_after_a_killed_write_repairs_the_file_and_reruns_the_lost_case(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    run = [*RMSNORM, "--budget", "0.01", "--no-isolate", "--out", str(out)]
    assert cli.main(run) == 0
    whole = out.read_bytes()
    cut = whole[: whole.rindex(b"\n", 0, len(whole) - 1) + 1 + 50]  # the last record, 50 bytes of it
    out.write_bytes(cut)
    capsys.readouterr()
    assert cli.main([*run, "--resume", "--dry-run"]) == 0  # a dry run says so and changes nothing
    got = capsys.readouterr()
    assert "(50 bytes) would be cut off" in got.err and len(_planned_in(got.out)) == 1
    assert out.read_bytes() == cut
    assert cli.main([*run, "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"dskbench: {out}: cut off its unfinished last line (50 bytes" in err
    from dskbench.results import read_runs

    assert out.read_bytes().startswith(cut[:-50])
    lines = out.read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # every line whole: report, compare, pick read it
    first, second = read_runs([out])
    assert len(second.results) == 1 and len(first.results) + 1 == len(_planned(capsys))
