"""Conventional outputs: --version, a closed pipe, exit codes, progress off a terminal, the end-of-run
table, results.csv, and the repro command every record carries (CPU, fake kernels and torch-ref)."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import tests.fake_adapters  # noqa: F401 - registers the fake kernels in this process
from dskbench.execution.progress import Progress
from dskbench.execution.runner import SweepOptions
from dskbench.execution.selection import parse_point, repro_command
from dskbench.frontends import cli
from dskbench.results.io import ResultsWriter, environment_record, read_runs, result_record
from dskbench.shapes.cases import default_shapes
from tests.fake_adapters import registry_entry as _entry

REPO = Path(__file__).resolve().parent.parent
DECODE_T = default_shapes().values("decode_tokens", "cpu")
N = len(DECODE_T)


@pytest.fixture()
def fakes(monkeypatch):
    """The command line with the fake kernels as its registry (in this process: --no-isolate)."""
    reg = {k: _entry(k) for k in ("fake_ok", "fake_wrong", "fake_raise")}
    reg["fake_ok"].op_names = ["input_layernorm", "post_attention_layernorm"]  # two ops, one shape
    monkeypatch.setattr("dskbench.frontends.cli.common.registry_and_shapes", lambda: (reg, default_shapes()))
    return reg


def _run_fakes(tmp_path: Path, *kernels: str, extra: tuple[str, ...] = ()) -> tuple[int, Path]:
    out = tmp_path / "r.jsonl"
    argv = ["run", "--device", "cpu", "--sweep", "decode", "--backend", "fake", "--seed", "5"]
    argv += ["--budget", "0.01", "--no-isolate", "--allow-drift", "--out", str(out), *extra]
    for k in kernels:
        argv += ["--kernel", k]
    return cli.main(argv), out


# -- --version -------------------------------------------------------------------------------------------


def test_version_prints_the_package_version(capsys, monkeypatch):
    from importlib import metadata

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"dskbench {metadata.version('dskbench')}\n"

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)  # run from a source tree, not installed
    from dskbench import __version__

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"dskbench {__version__}\n"


# -- a closed pipe ---------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.mark.parametrize(
    "args",
    [["list"], ["run", "--device", "cpu", "--kernel", "rmsnorm", "--dry-run", "--allow-drift"]],
)
def test_a_reader_that_closed_the_pipe_ends_the_command_quietly(args):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line: every write meets a closed pipe
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "dskbench", *args],
            cwd=REPO,
            env=_env(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == cli.EXIT_PIPE, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr


def test_list_into_head_prints_its_lines_and_no_traceback():
    proc = subprocess.run(
        ["bash", "-c", f"{shlex.quote(sys.executable)} -m dskbench list | head -3"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 3
    assert proc.stdout.startswith("kernel") and "Traceback" not in proc.stderr


# -- exit codes, progress, the end-of-run table -----------------------------------------------------------


def test_all_ok_exits_0_with_a_table_and_plain_progress_lines(tmp_path, fakes, capsys):
    rc, out = _run_fakes(tmp_path, "fake_ok")
    assert rc == cli.EXIT_OK
    stdout, stderr = capsys.readouterr()
    lines = stdout.splitlines()
    head = ["kernel", "backend", "ok", "wrong", "skipped", "error", "unstable", "median", "us"]
    assert lines[0].split() == head
    assert lines[1].split()[:7] == ["fake_ok", "fake", str(2 * N), "0", "0", "0", "0"]
    assert lines[-1].startswith(f"{2 * N} cases: ok {2 * N}, wrong 0")
    # off a terminal (stderr is captured): one line per case, no bar redrawn, a count and an ETA
    progress = [line for line in stderr.splitlines() if line.startswith("[")]
    assert len(progress) == 2 * N and "\r" not in stderr and "#" not in stderr
    assert progress[0].startswith(f"[1/{2 * N} eta ") and progress[-1].startswith(f"[{2 * N}/{2 * N}] ok ")
    assert all(" us  fake_ok/" in line and line.endswith(" · fake") for line in progress)


def test_a_wrong_case_exits_1(tmp_path, fakes, capsys):
    rc, out = _run_fakes(tmp_path, "fake_ok", "fake_wrong")
    assert rc == cli.EXIT_FAIL
    stdout, stderr = capsys.readouterr()
    row = next(line for line in stdout.splitlines() if line.startswith("fake_wrong"))
    assert row.split() == ["fake_wrong", "fake", "0", str(N), "0", "0", "0", "-"]
    wrong = [line for line in stderr.splitlines() if "fake_wrong/" in line]
    assert len(wrong) == N and all("] wrong " in w and "(relative error" in w for w in wrong)


def test_an_error_alone_exits_1(tmp_path, fakes, capsys):
    rc, _ = _run_fakes(tmp_path, "fake_raise")
    assert rc == cli.EXIT_FAIL
    assert f"error {N}" in capsys.readouterr().out


def test_a_wrong_case_exits_1_from_the_isolated_command(tmp_path):
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "tests.cli_with_fakes", "run", "--device", "cpu", "--sweep", "decode"]
    cmd += ["--kernel", "fake_wrong", "--backend", "fake", "--budget", "0.01", "--out", str(out)]
    env = {**_env(), "DSKBENCH_EXTRA_ADAPTERS": "tests.fake_adapters"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    summary = next(i for i, line in enumerate(lines) if " cases: ok " in line)
    assert f"wrong {N}" in lines[summary] and "Traceback" not in proc.stderr and len(lines) == summary + 2 + N
    assert (
        lines[summary + 1 :]
        == [f"not ok ({N} wrong):"]
        + [  # the output ends with the wrong cases
            line
            for line in lines[summary + 2 :]
            if line.startswith("  wrong    fake_wrong · fake  input_layernorm")
        ]
    )


def test_progress_on_a_terminal_shows_rate_and_eta():
    stream = io.StringIO()
    p = Progress(3, stream=stream, tty=True)
    item = SimpleNamespace(case_id="k/op/decode/T=1", backend="b")
    p(item, "ok", {"timing": {"median_us": 2.5}})
    p(item, "wrong", {"reason": "relative error 0.5 > tolerance 0.01"})
    p(item, "ok", {"timing": {"median_us": 2.5}})
    p.close()
    text = stream.getvalue()
    assert "3/3" in text and ("case/s" in text or "s/case" in text)  # the rate
    assert "<" in text  # elapsed<remaining
    assert re.search(r"\rwrong +k/op/decode/T=1 · b  \(relative error 0.5 > tolerance 0.01\)\n", text)


def test_progress_off_a_terminal_estimates_the_time_left_from_its_clock():
    now = [100.0]
    stream = io.StringIO()
    p = Progress(4, stream=stream, tty=False, clock=lambda: now[0])
    item = SimpleNamespace(case_id="k/op/decode/T=1", backend="b")
    for _ in range(4):
        now[0] += 30.0  # 30 s per case
        p(item, "ok", {"timing": {"median_us": 1.0}})
    lines = stream.getvalue().splitlines()
    assert [line.split("]")[0] for line in lines] == [
        "[1/4 eta 01:30",
        "[2/4 eta 01:00",
        "[3/4 eta 00:30",
        "[4/4",
    ]


def test_a_closed_stderr_silences_progress_without_stopping_the_run():
    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError

    p = Progress(2, stream=Closed(), tty=False)
    item = SimpleNamespace(case_id="c", backend="b")
    p(item, "ok", {"timing": {"median_us": 1.0}})
    p(item, "ok", {"timing": {"median_us": 1.0}})
    assert p.done == 2 and p.quiet


# -- repro ------------------------------------------------------------------------------------------------


def _dry(argv: list[str]) -> list[tuple[str, str]]:
    """The (case id, backend) pairs a dry run of argv plans."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main([*argv, "--dry-run"])
    assert rc == 0, (argv, err.getvalue())
    return [tuple(line.split("  ")) for line in out.getvalue().splitlines() if line.count("  ") == 1]


def test_every_record_carries_a_repro_that_selects_exactly_its_case(tmp_path, fakes, capsys):
    rc, out = _run_fakes(tmp_path, "fake_ok", "fake_wrong")
    assert rc == cli.EXIT_FAIL
    (run,) = read_runs([out])
    assert len(run.results) == 3 * N and all(r.get("repro") for r in run.results)
    twins = [r for r in run.results if r.get("shared_with")]
    assert len(twins) == N and all("--op post_attention_layernorm" in r["repro"] for r in twins)
    for r in run.results:
        args = shlex.split(r["repro"])
        assert args[:2] == ["dskbench", "run"] and args[args.index("--seed") + 1] == "5"
        assert _dry(args[1:]) == [(r["case_id"], r["backend"]["name"])]


def test_the_repro_of_every_op_variant_and_sweep_selects_exactly_its_case(monkeypatch):
    """Over the real registry's CPU plan: one case per (op, variant, sweep), tp points included."""
    monkeypatch.setattr("dskbench.registry.load.drift_message", lambda *a, **k: None)  # checked elsewhere
    from dskbench.execution.config import RunConfig
    from dskbench.frontends.cli.common import registry_and_shapes
    from dskbench.frontends.cli.plan import plan

    reg, shapes = registry_and_shapes()
    opts = SweepOptions(device="cpu", phases=cli.SWEEPS, profile="cpu", budget_s=0.2)
    items, _ = plan(RunConfig(options=opts), reg, shapes)
    one_each = {}
    for it in items:
        one_each.setdefault((it.case["op"], it.case.get("variant"), it.case["phase"]), it)
    assert any(it.case.get("variant") for it in one_each.values())
    assert any("tp" in it.case["point"] for it in one_each.values())
    settings = {**dataclasses.asdict(opts), "run_seed": 9}
    for it in one_each.values():
        args = shlex.split(repro_command(it.identity(), settings))
        assert _dry(args[1:]) == [(it.case_id, it.backend)], args


def test_repro_carries_the_runs_settings():
    ident = {
        "kernel": "k",
        "backend": {"name": "sgl_kernel"},
        "op": "experts",
        "variant": "gate_up.fp8",
        "phase": "prefill",
        "point": {"T": 64, "tp": 8},
    }
    settings = {"device": "cuda", "profile": "quick", "mode": "cold", "flush": "read", "seed": None}
    assert repro_command(ident, {**settings, "run_seed": 42, "no_multicast": True}) == (
        "dskbench run --device cuda --kernel k --backend sgl_kernel --sweep prefill --op experts:gate_up.fp8 "
        "--point T=64,tp=8 --tp 8 --quick --flush read --no-multicast --seed 42"
    )
    skipped = {"kernel": "k", "backend": {"name": "-"}, "case_id": "k"}
    assert repro_command(skipped, {"device": "cuda", "mode": "hot", "budget_s": 0.5}) == (
        "dskbench run --device cuda --kernel k"
    )
    assert repro_command(ident, None) is None


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--op", "input_layernorn"], "unknown op 'input_layernorn'; did you mean input_layernorm"),
        (["--op", "input_layernorm:nosuch"], "no planned case matches --op input_layernorm:nosuch"),
        (["--point", "T=3"], "no planned case matches --point T=3; planned points: T in"),
        (["--point", "T=1,tp=4"], "--point T=1,tp=4: the cases at tp 4 are planned only with --tp 4"),
        (["--point", "T=one"], "argument --point: expected K=V[,K=V] with whole-number values"),
    ],
)
def test_selection_mistakes_are_one_line_errors(capsys, args, says):
    base = ["run", "--device", "cpu", "--kernel", "rmsnorm", "--sweep", "decode", "--allow-drift"]
    assert cli.main([*base, *args, "--dry-run"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("dskbench: ") and says in err and err.count("\n") == 1


def test_warm_takes_the_same_filters(capsys):
    assert cli.main(["warm", "--device", "cpu", "--kernel", "rmsnorm", "--op", "nosuch_op"]) == 2
    assert "unknown op 'nosuch_op'" in capsys.readouterr().err


def test_parse_point():
    assert parse_point("B=1, kv_len=1024,tp=1") == {"B": 1, "kv_len": 1024, "tp": 1}
    for bad in ("", "B", "B=", "B=1,B=2", "1=2", "B=-1"):
        with pytest.raises(ValueError):
            parse_point(bad)


# -- results.csv -------------------------------------------------------------------------------------------


def test_report_writes_one_csv_row_per_case_and_backend(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    env = {"created": "2026-11-21T00:00:00+00:00", "versions": {}, "device": {"kind": "cuda", "name": "H100"}}
    settings = {"device": "cuda", "profile": "full", "mode": "cold", "seed": None, "run_seed": 7}
    case = {"kernel": "rmsnorm", "op": "input_layernorm", "variant": None, "phase": "decode"}
    ok = {
        "timing": {"median_us": 4.125, "p10_us": 4.0, "p90_us": 4.5},
        "metrics": {"gbps": 1234.5678, "tflops": None, "pct_bw_datasheet": 37.5, "bound": "memory"},
        "clocks": {"throttled": False},
        "shared_gpu": {"pids": [4242, 4343], "names": ["python", None]},
    }
    with ResultsWriter(path) as w:
        w.write(environment_record("r1", **env, settings=settings))
        for t, status in ((1, "error"), (8, "ok")):
            extra = ok if status == "ok" else {"reason": "timed out after 60 s"}
            w.write(
                result_record(
                    "r1", status, **case, case_id=f"rmsnorm/input_layernorm/decode/T={t}",
                    point={"T": t}, backend={"name": "sgl_kernel"}, **extra,
                )
            )  # fmt: skip
        w.write(result_record("r1", "skipped", kernel="BatchAttention", case_id="BatchAttention",
                              backend={"name": "-"}, reason="no adapter for this kernel yet"))  # fmt: skip
        w.write(environment_record("r2", **env, settings=settings))  # --resume --retry-errors: T=1 again
        w.write(
            result_record(
                "r2", "wrong", **case, case_id="rmsnorm/input_layernorm/decode/T=1", point={"T": 1},
                backend={"name": "sgl_kernel"}, reason="relative error 0.5 > tolerance 0.01",
                repro="dskbench run --its-own-command",
            )
        )  # fmt: skip
    assert cli.main(["report", str(path), "--out", str(tmp_path / "rep")]) == 0
    assert str(tmp_path / "rep" / "results.csv") in capsys.readouterr().out
    with (tmp_path / "rep" / "results.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["case_id"], r["status"], r["run_id"]) for r in rows] == [
        ("rmsnorm/input_layernorm/decode/T=1", "wrong", "r2"),  # the latest record of the case
        ("rmsnorm/input_layernorm/decode/T=8", "ok", "r1"),
        ("BatchAttention", "skipped", "r1"),
    ]
    wrong, good, skipped = rows
    assert good == {
        "device": "H100",
        "kernel": "rmsnorm",
        "op": "input_layernorm",
        "phase": "decode",
        "point": "T=8",
        "backend": "sgl_kernel",
        "status": "ok",
        "median_us": "4.125",
        "p10_us": "4",
        "p90_us": "4.5",
        "gbps": "1234.57",
        "tflops": "",
        "pct_of_datasheet": "37.5",
        "bound": "memory",
        "throttled": "false",
        "shared_gpu": "4242 4343",
        "reason": "",
        "case_id": "rmsnorm/input_layernorm/decode/T=8",
        "run_id": "r1",
        "repro": "dskbench run --device cuda --kernel rmsnorm --backend sgl_kernel --sweep decode "
        "--op input_layernorm --point T=8 --seed 7",  # rebuilt from the run's settings
    }
    assert wrong["repro"] == "dskbench run --its-own-command" and wrong["reason"].startswith("relative")
    assert skipped["repro"] == "dskbench run --device cuda --kernel BatchAttention" and skipped["op"] == ""
