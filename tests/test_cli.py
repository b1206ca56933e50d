"""The command line's error paths and its CPU behaviour (no GPU here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dskbench import paths
from dskbench.adapters import register
from dskbench.adapters.base import Adapter
from dskbench.frontends import cli
from dskbench.frontends.cli import common as cli_common
from dskbench.registry.load import load_registry
from dskbench.shapes.cases import default_shapes

REPO = Path(__file__).resolve().parent.parent


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
    assert "cutlass_scaled_fp4_mm" in out and f"{len(load_registry())} kernels" in out


def test_list_counts_the_ops_a_kernel_is_measured_at(capsys):
    """A kernel whose registry entry names no op (BatchAttention) counts the ops its adapter is swept
    at; one whose registry names ops it has no case of (an FP4 GEMM at BF16 projections) counts those
    it has cases of: the same ops a dry run plans."""
    assert cli.main(["list", "--json"]) == 0
    rows = {r["kernel"]: r for r in json.loads(capsys.readouterr().out)}
    measured = [r for r in rows.values() if r["adapter"] and r["status"] == "benchmark"]
    assert measured and [r["kernel"] for r in measured if r["ops"] == 0] == []
    for kernel in ("BatchAttention", "cutlass_scaled_fp4_mm", "fp4_quantize", "concat_mla_absorb_q"):
        assert cli.main(["run", "--device", "cpu", "--kernel", kernel, "--sweep", "all", "--dry-run"]) == 0
        planned = {
            line.split()[0].split("/")[1].split(":")[0]
            for line in capsys.readouterr().out.splitlines()
            if line.endswith("  torch-ref")
        }
        assert rows[kernel]["ops"] == len(planned), (kernel, planned)
    assert rows["BatchAttention"]["ops"] == 1 and rows["cutlass_scaled_fp4_mm"]["ops"] == 4


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


def _results_file(path, cases: dict[str, str], reasons: dict[str, str] | None = None, **settings) -> bytes:
    """A results file holding one run of RMSNORM with these cases' statuses (and reasons); its bytes."""
    from dskbench.results.io import ResultsWriter, environment_record, result_record

    env = {"created": "2026-11-21T00:00:00+00:00", "device": {"kind": "cpu"}, "versions": {}}
    with ResultsWriter(path) as w:
        w.write(environment_record("r1", **env, settings={**CPU_SETTINGS, "flush": "write", **settings}))
        for case, status in cases.items():
            reason = (reasons or {}).get(case, "timed out after 30 s")
            fields = {"timing": {"median_us": 1.0}} if status == "ok" else {"reason": reason}
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


def test_resume_runs_the_cases_whose_build_was_deferred(tmp_path, capsys):
    cases = _planned(capsys)
    out = tmp_path / "r.jsonl"
    why = {
        cases[
            1
        ]: "build deferred: rmsnorm · torch-ref builds for 23 min or more (recorded), past this run's ...",
        cases[2]: "needs sm100/sm103 (found sm90)",  # skipped for good
    }
    _results_file(out, {cases[0]: "ok", cases[1]: "skipped", cases[2]: "skipped"}, why, seed=None)
    assert cli.main([*RMSNORM, "--out", str(out), "--resume", "--dry-run"]) == 0
    got = capsys.readouterr()
    assert _planned_in(got.out) == [cases[1], *cases[3:]]  # the deferred case runs now
    assert "2 cases already done; 1 whose build was deferred to run now" in got.err


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
    from dskbench.results.io import read_runs

    assert out.read_bytes().startswith(cut[:-50])
    lines = out.read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # every line whole: report, compare, pick read it
    first, second = read_runs([out])
    assert len(second.results) == 1 and len(first.results) + 1 == len(_planned(capsys))


def test_case_timeout_and_first_use_allowance_are_recorded_and_repeated_by_repro(tmp_path, capsys):
    from dskbench.results.io import read_runs

    out = tmp_path / "r.jsonl"
    limits = ["--case-timeout", "30", "--first-use-allowance", "5"]
    assert cli.main([*RMSNORM, "--budget", "0.01", "--no-isolate", "--out", str(out), *limits]) == 0
    (run,) = read_runs([out])
    settings = run.environment["settings"]
    assert settings["case_timeout_s"] == 30.0 and settings["first_use_allowance_s"] == 5.0
    assert all(r["repro"].endswith("--case-timeout 30 --first-use-allowance 5") for r in run.results)
    plain = tmp_path / "plain.jsonl"
    assert cli.main([*RMSNORM, "--budget", "0.01", "--no-isolate", "--out", str(plain)]) == 0
    (run,) = read_runs([plain])
    assert not any("--case-timeout" in r["repro"] or "--first-use" in r["repro"] for r in run.results)
    capsys.readouterr()
    assert cli.main([*RMSNORM, "--first-use-allowance", "-1", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "argument --first-use-allowance: expected a number of seconds >= 0, got '-1'" in err
    assert err.count("\n") == 1


# -- bad input: one line on stderr naming the file, key or value; exit 2; no traceback ------------

SHAPES_TEXT = paths.SHAPES_FILE.read_text()


def _one_line_error(rc: int, err: str) -> str:
    assert rc == cli.EXIT_USAGE
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("dskbench: "), err
    return err.strip()


@pytest.fixture()
def edit_shapes(tmp_path, monkeypatch):
    """Write an edited copy of the shapes file and make it the one dskbench reads."""

    def edit(*replacements: tuple[str, str]) -> Path:
        text = SHAPES_TEXT
        for old, new in replacements:
            assert old in text, old
            text = text.replace(old, new, 1)
        p = tmp_path / "deepseek_r1_nvfp4.yaml"
        p.write_text(text)
        monkeypatch.setattr(paths, "SHAPES_FILE", p)
        default_shapes.cache_clear()
        return p

    yield edit
    default_shapes.cache_clear()


@pytest.mark.parametrize(
    "command", [["run", "--device", "cpu", "--dry-run"], ["warm", "--device", "cpu"], ["list"]]
)
def test_a_typo_in_the_shapes_file_is_one_line_naming_file_and_key(edit_shapes, capsys, command):
    p = edit_shapes(("  q_b_proj:\n    phases:", "  q_b_proj:\n    phase:"))
    err = _one_line_error(cli.main(command), capsys.readouterr().err)
    assert err == f"dskbench: {p}: ops.q_b_proj.phase: unknown key; did you mean 'phases'?"


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        (
            "cpu:\n  decode_tokens: [1, 16]",
            "cpu:\n  decode_tokens: [1, 1.5]",
            "cpu.decode_tokens[1]: expected a positive integer, got 1.5",
        ),
        ("    Dv: 128            # v_head_dim\n", "", "model.config: missing 'Dv'"),
        (
            "  tp: [1, 4, 8]",
            "  tp: [1, 3, 8]",
            "ops.kv_b_proj.roles.gemm[0].N: 'Nh * (Dn + Dv) / tp': 32768 / 3 is not exact",
        ),
    ],
    ids=["sweep value 1.5", "missing Dv", "tp 3"],
)
def test_bad_values_in_the_shapes_file_stop_run_before_anything_runs(edit_shapes, capsys, old, new, says):
    p = edit_shapes((old, new))
    out = Path(str(p) + ".jsonl")
    args = ["run", "--device", "cpu", "--kernel", "rmsnorm", "--out", str(out)]
    err = _one_line_error(cli.main(args), capsys.readouterr().err)
    assert err.startswith(f"dskbench: {p}: {says}")
    assert not out.exists()


def test_a_bad_shapes_file_gives_no_traceback_from_the_command_line(tmp_path):
    root = tmp_path / "root"
    (root / "shapes").mkdir(parents=True)
    (root / "shapes" / "deepseek_r1_nvfp4.yaml").write_text(
        SHAPES_TEXT.replace("  tp: [1]\n", "  tp: [1]\n  tps: [1]\n")
    )
    env = {**os.environ, "DSKBENCH_ROOT": str(root)}
    for command in (["list"], ["run", "--device", "cpu", "--dry-run"]):
        r = subprocess.run(
            [sys.executable, "-m", "dskbench", *command],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 2, r.stderr
        assert r.stderr.splitlines() == [
            f"dskbench: {root}/shapes/deepseek_r1_nvfp4.yaml: cpu.tps: unknown sweep list; did you mean 'tp'?"
        ]


BAD_OPTIONS = [
    (["run", "--budget", "0"], "argument --budget: expected a number of seconds > 0, got '0'"),
    (["run", "--budget", "-1"], "argument --budget: expected a number of seconds > 0, got '-1'"),
    (["run", "--budget", "nan"], "argument --budget: expected a number of seconds > 0, got 'nan'"),
    (["run", "--budget", "inf"], "argument --budget: expected a number of seconds > 0, got 'inf'"),
    (["run", "--min-time", "0"], "argument --min-time: expected a number of seconds > 0, got '0'"),
    (["run", "--seed", "-3"], "argument --seed: expected an integer >= 0, got '-3'"),
    (["run", "--seed", "1.5"], "argument --seed: expected an integer >= 0, got '1.5'"),
    (["run", "--tp", "0"], "argument --tp: expected comma-separated positive integers, got '0'"),
    (["run", "--tp", "1,,8"], "argument --tp: expected comma-separated positive integers, got '1,,8'"),
    (["run", "--tp", "1.5"], "argument --tp: expected comma-separated positive integers, got '1.5'"),
    (["run", "--gpus", "0"], "argument --gpus: expected 'all' or a number of GPUs, got '0'"),
    (["run", "--gpus", "some"], "argument --gpus: expected 'all' or a number of GPUs, got 'some'"),
    (["warm", "--jobs", "0"], "argument --jobs: expected a positive integer, got '0'"),
    (["warm", "--tp", "-8"], "argument --tp: expected comma-separated positive integers, got '-8'"),
    (
        ["pick", "r.jsonl", "--batch", "0,8"],
        "argument --batch: expected comma-separated positive integers",
    ),
    (["pick", "r.jsonl", "--tp", "0"], "argument --tp: expected a positive integer, got '0'"),
    (
        ["pick", "r.jsonl", "--kv-len", "-4096"],
        "argument --kv-len: expected a positive integer, got '-4096'",
    ),
]


@pytest.mark.parametrize(("args", "says"), BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_bad_numeric_options_are_one_line_errors(capsys, args, says):
    # a dry run of one kernel: were an option not checked, the test would still end at once
    safe = {
        "run": ["--device", "cpu", "--kernel", "rmsnorm", "--dry-run"],
        "warm": ["--device", "cpu", "--kernel", "rmsnorm"],
    }
    err = _one_line_error(cli.main([*args, *safe.get(args[0], [])]), capsys.readouterr().err)
    assert err.startswith(f"dskbench: {says}")
    assert err.endswith(f"(see `dskbench {args[0]} --help`)")


def test_good_numeric_options_parse():
    a = cli.build_parser().parse_args(
        ["run", "--tp", "1,8,8", "--budget", "0.5", "--seed", "0", "--gpus", "all", "--min-time", "0.1"]
    )
    assert (a.tp, a.budget, a.seed, a.gpus, a.min_time) == ((1, 8), 0.5, 0, "all", 0.1)
    assert cli.build_parser().parse_args(["warm", "--jobs", "3", "--gpus", "2"]).jobs == 3
    p = cli.build_parser().parse_args(["pick", "r.jsonl", "--batch", "1,64", "--tp", "8", "--kv-len", "4096"])
    assert (p.batch, p.tp, p.kv_len) == ((1, 64), 8, 4096)


def test_a_tp_the_sweep_lacks_is_an_error_naming_the_sweep(capsys):
    err = _one_line_error(
        cli.main(["run", "--device", "cpu", "--kernel", "rmsnorm", "--tp", "1,3", "--dry-run"]),
        capsys.readouterr().err,
    )
    assert err.startswith("dskbench: --tp 3: the cpu profile sweeps tp 1 only (")
    assert err.endswith("deepseek_r1_nvfp4.yaml cpu.tp)")


def test_a_sweep_with_no_case_is_an_error_saying_why(capsys):
    # concat_mla_k serves the prefill attention only
    args = ["run", "--device", "cpu", "--kernel", "concat_mla_k", "--sweep", "decode", "--dry-run"]
    err = _one_line_error(cli.main(args), capsys.readouterr().err)
    assert err == (
        "dskbench: nothing to run: the selected kernels have no case in the decode sweep at --tp 1: "
        "they run in another sweep (--sweep all)"
    )
    assert cli.main([*args[:-2], "prefill", "--dry-run"]) == 0


@register
class _TpOnly(Adapter):
    """A kernel measured only at tp > 1 (like a TP collective)."""

    kernel = "fake_tp_only"
    role = "gemm"

    def applies(self, case):
        return case.point.get("tp", 1) > 1


def test_a_tp_with_no_case_is_an_error_naming_the_tp_values_that_have_some(edit_shapes, capsys, monkeypatch):
    edit_shapes(("  kv_lens: [1024]\n  tp: [1]\n", "  kv_lens: [1024]\n  tp: [1, 8]\n"))
    entry = SimpleNamespace(
        name="fake_tp_only",
        status="benchmark",
        status_reason="",
        op_names=["q_b_proj"],
        aliases=(),
        category="t",
    )
    monkeypatch.setattr(
        cli_common, "registry_and_shapes", lambda: ({"fake_tp_only": entry}, default_shapes())
    )
    args = ["run", "--device", "cpu", "--kernel", "fake_tp_only", "--sweep", "decode", "--dry-run"]
    err = _one_line_error(cli.main([*args, "--tp", "1"]), capsys.readouterr().err)
    assert err == (
        "dskbench: nothing to run: the selected kernels have no case in the decode sweep at --tp 1: "
        "their cases depend on tp and exist at --tp 8 only"
    )
    assert cli.main([*args, "--tp", "1,8"]) == 0
    assert "fake_tp_only/q_b_proj/decode/T=1,tp=8  torch-ref" in capsys.readouterr().out


def test_second_sigterm_ends_quietly_not_with_a_traceback():
    """The first SIGTERM raises Terminated (clean stop); the handler is then the default one, so a second
    SIGTERM during clean-up ends the process instead of raising inside an atexit hook."""
    import signal

    from dskbench.frontends.cli.common import Terminated, on_sigterm

    old = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        with pytest.raises(Terminated):
            on_sigterm(signal.SIGTERM, None)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, old)
