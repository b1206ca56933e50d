"""How a run ends: which cases that are not ok fail it (a CPU reference run's time-outs do not), and the
lines its output ends with, one per case that was not ok."""

from __future__ import annotations

from dskbench.execution.outcome import MAX_SKIP_LINES, expected_timeout, failing, not_ok_lines
from dskbench.frontends import cli
from dskbench.frontends.cli import common
from dskbench.shapes.cases import default_shapes
from tests.test_execution import EXTRA, N, _entry, hang_clock  # noqa: F401 - hang_clock is a fixture

TIMED_OUT = "timed out: no result within 60 s (max(60 s, 10 x expected) per case); the worker was killed"


def rec(status: str, kernel: str = "k", reason: str | None = None, backend: str = "torch-ref", **kw) -> dict:
    base = {"kernel": kernel, "backend": {"name": backend}, "op": "experts", "phase": "prefill"}
    return {**base, "point": {"T": 2, "tp": 1}, "status": status, "reason": reason, **kw}


def test_a_time_out_fails_a_gpu_run_but_not_a_cpu_reference_run():
    hung = rec("error", reason=TIMED_OUT)
    assert expected_timeout(hung, "cpu") and not expected_timeout(hung, "cuda")
    assert failing([hung], "cpu") == [] and failing([hung], "cuda") == [hung]
    crash = rec("error", reason="worker process died (killed by SIGSEGV) while running this case")
    assert failing([hung, crash, rec("wrong", reason="rel err 0.3"), rec("ok")], "cpu") == [
        crash,
        rec("wrong", reason="rel err 0.3"),
    ]
    slow_start = rec("error", reason="timed out: the worker gave no sign of life within 300 s and was killed")
    assert failing([slow_start], "cpu") == [slow_start]  # not a case past its limit: a broken worker
    assert failing([rec("skipped", reason="needs sm100")], "cuda") == []


def test_the_end_lines_group_skips_and_put_what_fails_the_run_last():
    results = [
        rec("ok"),
        rec("error", "moe", "RuntimeError: boom\n  at line 3"),
        rec("error", "ref", TIMED_OUT),
        rec("wrong", "gemm", "rel err 0.3 > 0.02", variant="fp8"),
        *[rec("skipped", "fa3", "needs sm90/sm100 (found cpu)", backend="sgl_kernel", point={"T": t}) for t in (1, 2)],
        {"kernel": "BatchAttention", "backend": {"name": "-"}, "status": "skipped", "reason": "no adapter yet"},
    ]  # fmt: skip
    lines = not_ok_lines(results, "cpu")
    assert lines[0] == "not ok (3 skipped, 1 wrong, 2 error):"
    assert lines[1] == "  skipped  fa3 · sgl_kernel  (2 cases)  needs sm90/sm100 (found cpu)"
    assert lines[2] == "  skipped  BatchAttention · -  (planning)  no adapter yet"
    assert lines[3].startswith(
        "  error    ref · torch-ref  experts prefill T=2,tp=1  timed out: no result within 60 s"
    )
    assert lines[3].endswith("[expected on a CPU reference run: not a failure]")
    assert lines[4] == "  wrong    gemm · torch-ref  experts:fp8 prefill T=2,tp=1  rel err 0.3 > 0.02"
    assert lines[5] == "  error    moe · torch-ref  experts prefill T=2,tp=1  RuntimeError: boom at line 3"
    assert len(lines) == 6 and not_ok_lines([rec("ok")], "cpu") == []
    assert "[expected" not in "".join(not_ok_lines(results, "cuda"))  # a GPU's time-out is a failure
    many = [rec("skipped", f"k{i}", "needs sm100") for i in range(MAX_SKIP_LINES + 5)]
    cut = not_ok_lines([*many, rec("error", reason="x" * 500)], "cuda")
    assert cut[-2] == "  ... 5 more skipped cases (5 groups): see the results file"
    assert cut[-1].endswith("x...") and len(cut[-1]) < 250  # a reason cut to one short line


def _run(tmp_path, monkeypatch, kernels: list[str]) -> int:
    """`dskbench run` on the CPU over fake kernels (fake_hang: its hang watch fires at once)."""
    registry = {k: _entry(k) for k in kernels}
    monkeypatch.setattr(common, "registry_and_shapes", lambda: (registry, default_shapes()))
    argv = [
        "run",
        "--device",
        "cpu",
        "--sweep",
        "decode",
        "--backend",
        "fake",
        "--seed",
        "1",
        "--budget",
        "0.02",
    ]
    argv += [a for k in kernels for a in ("--kernel", k)] + ["--out", str(tmp_path / "r.jsonl")]
    return cli.main(argv)


def test_a_cpu_run_with_only_time_outs_exits_0_and_ends_with_them(tmp_path, hang_clock, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setenv("DSKBENCH_EXTRA_ADAPTERS", EXTRA)
    rc = _run(tmp_path, monkeypatch, ["fake_ok", "fake_hang"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    assert out[-N - 2] == f"{N} cases ran past the time limit: expected on a CPU reference run, not a failure " \
        "(--case-timeout S gives them longer)"  # fmt: skip
    assert out[-N - 1] == f"not ok ({N} error):"
    assert all(line.startswith("  error    fake_hang · fake  input_layernorm decode T=") for line in out[-N:])
    assert all(line.endswith("[expected on a CPU reference run: not a failure]") for line in out[-N:])


def test_a_wrong_case_still_fails_a_cpu_run_and_ends_its_output(tmp_path, hang_clock, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setenv("DSKBENCH_EXTRA_ADAPTERS", EXTRA)
    rc = _run(tmp_path, monkeypatch, ["fake_hang", "fake_wrong"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 1
    assert out[-1].startswith("  wrong    fake_wrong · fake  ")
    assert f"not ok ({N} wrong, {N} error):" in out
