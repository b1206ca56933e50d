"""The noise-aware comparison of two result sets: the rule, our results, asv results, the CLI contract."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from fake_results import COMMIT_A, COMMIT_B, fake_runs, make_run, write_runs

from dskbench.compare import (
    Key,
    Stat,
    cli_compare,
    compare,
    judge,
    load_stats,
    mann_whitney_p,
)


def ok(value: float, spread: float = 0.02, samples: tuple[float, ...] = ()) -> Stat:
    return Stat(
        value=value, lo=value * (1 - spread), hi=value * (1 + spread), spread="p10-p90", samples=samples
    )


# -- the rule ----------------------------------------------------------------------------------------------


def test_a_regression_needs_the_threshold_and_to_leave_the_noise():
    assert judge(ok(10.0), ok(12.0))[0] == "slower"  # +20%, spreads disjoint
    assert judge(ok(10.0, 0.3), ok(12.0, 0.3))[0] == "~slower"  # +20% but inside a ±30% spread
    assert judge(ok(10.0, 0.001), ok(10.3, 0.001))[0] == "same"  # clearly different, but under 5%
    assert judge(ok(10.0), ok(8.0))[0] == "faster"
    assert judge(ok(10.0, 0.3), ok(8.0, 0.3))[0] == "~faster"
    verdict, change, _ = judge(ok(10.0), ok(12.0), threshold=0.25)
    assert verdict == "same" and change == pytest.approx(0.2)
    # no spread recorded: the threshold alone decides (as asv does with one sample)
    assert judge(Stat(value=10.0), Stat(value=11.0))[0] == "slower"


def test_the_rank_test_decides_when_spreads_overlap():
    rng = random.Random(0)
    old = tuple(10 * (1 + rng.gauss(0, 0.05)) for _ in range(200))
    new = tuple(10.8 * (1 + rng.gauss(0, 0.05)) for _ in range(200))
    same = tuple(10 * (1 + rng.gauss(0, 0.05)) for _ in range(200))
    wide = 0.08  # p10-p90 of ±8% overlap for an 8% shift
    verdict, _, note = judge(ok(10.0, wide, old), ok(10.8, wide, new))
    assert verdict == "slower" and "U test" in note
    verdict, _, _ = judge(
        ok(10.0, wide, old), ok(10.8, wide, same)
    )  # the median says +8%, the samples do not
    assert verdict == "~slower"


def test_mann_whitney_matches_scipy():
    # scipy.stats.mannwhitneyu(..., alternative="two-sided", method="asymptotic") gives these p-values
    assert mann_whitney_p([1, 2, 3], [4, 5, 6]) == pytest.approx(0.08085559837005224, rel=1e-9)
    assert mann_whitney_p([1, 2, 2, 3, 5], [2, 4, 5, 6, 7, 7]) == pytest.approx(0.06414661873440437, rel=1e-9)
    assert mann_whitney_p([1.0] * 10, [1.0] * 10) == 1.0


def test_status_changes():
    err = Stat(status="error", reason="illegal memory access")
    wrong = Stat(status="wrong", reason="relative error 0.3")
    skip = Stat(status="skipped", reason="needs sm100")
    assert judge(ok(1.0), wrong)[0] == "broke"
    assert judge(ok(1.0), err)[0] == "broke"
    assert judge(err, ok(1.0))[0] == "fixed"
    assert judge(wrong, err)[0] == "still failing"
    assert judge(ok(1.0), skip)[0] == "now skipped"
    assert judge(skip, skip)[0] == "skipped"
    assert judge(skip, err)[0] == "now failing"
    assert judge(skip, ok(1.0))[0] == "now measured"
    assert not any(judge(skip, x)[0] in ("broke", "slower") for x in (err, wrong, ok(1.0)))
    assert judge(None, ok(1.0))[0] == "added"
    assert judge(ok(1.0), None)[0] == "missing"


def test_higher_is_better_units():
    gbps = Stat(value=100.0, unit="GB/s", higher_is_better=True)
    assert judge(gbps, Stat(value=70.0, unit="GB/s", higher_is_better=True))[0] == "slower"
    assert judge(gbps, Stat(value=130.0, unit="GB/s", higher_is_better=True))[0] == "faster"


# -- our results ---------------------------------------------------------------------------------------


def test_compare_our_runs_by_machine_case_and_backend():
    r1, r2, r3, _cpu = fake_runs()
    c = compare([r1], [r2])
    by = {(ch.key.kernel, ch.key.backend): set() for ch in c.changes}
    for ch in c.changes:
        by[(ch.key.kernel, ch.key.backend)].add(ch.verdict)
    assert by[("rmsnorm", "sgl_kernel")] == {"slower"}
    assert by[("silu_and_mul", "flashinfer")] == {"faster"}
    assert by[("silu_and_mul", "sglang_jit")] == {"broke"}
    assert by[("fp8_blockwise_scaled_mm", "sglang_triton")] == {"same", "still failing"}
    assert by[("cutlass_scaled_fp4_mm", "sgl_kernel")] == {"skipped"}
    assert len(c.regressions) == 28 and len(c.improvements) == 14
    throttled = [ch for ch in c.changes if "throttled new run" in ch.note]
    assert len(throttled) == 1 and throttled[0].key.case.endswith("T=64")
    # another GPU is another machine: nothing matches across H200 and B200
    across = compare([r1], [r3])
    assert {ch.verdict for ch in across.changes} == {"added", "missing"}


def test_table_is_per_kernel_and_readable():
    r1, r2, *_ = fake_runs()
    text = compare([r1], [r2]).format_table(verbose=True)
    lines = text.splitlines()
    assert lines[0].split() == ["kernel", "case", "backend", "old", "new", "change", "verdict"]
    assert "-- rmsnorm on NVIDIA H200" in lines
    row = next(line for line in lines if "input_layernorm/decode/T=64" in line and "sgl_kernel" in line)
    assert "±" in row and "slower" in row and "%" in row
    t2 = lines.index(next(x for x in lines if "input_layernorm/decode/T=2 " in x))
    t16 = lines.index(next(x for x in lines if "input_layernorm/decode/T=16 " in x))
    assert t2 < t16  # natural order of sweep points
    quiet = compare([r1], [r2]).format_table(max_quiet_rows=10)
    assert " same" not in quiet and "unchanged or skipped cases not shown" in quiet


def test_cli_compare_exit_codes(tmp_path: Path, capsys):
    r1, r2, r3, _ = fake_runs()
    old, new = write_runs([r1], tmp_path / "old.jsonl"), write_runs([r2], tmp_path / "new.jsonl")
    assert cli_compare([old], [new], 0.05) == 1
    out = capsys.readouterr().out
    assert "rmsnorm" in out and "slower" in out and "regression" not in out.splitlines()[0]
    assert cli_compare([old], [new], 0.05, fail_on_regression=False) == 0
    assert cli_compare([old], [old], 0.05) == 0
    assert (
        cli_compare([new], [old], 0.05) == 1
    )  # the improvement reversed is a regression; broke reversed is fixed
    assert cli_compare([old], [new], 0.5) == 1  # status changes fail whatever the threshold
    b200 = write_runs([r3], tmp_path / "b200.jsonl")
    assert cli_compare([old], [b200], 0.05) == 2  # nothing in common
    assert "no case in common" in capsys.readouterr().err
    assert cli_compare([tmp_path / "nope.jsonl"], [new], 0.05) == 2
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n{}\n")
    assert cli_compare([garbage], [new], 0.05) == 2
    assert cli_compare([old], [new], 5.0 * 100) == 2


def test_cli_compare_reads_folders_and_latest_run(tmp_path: Path):
    r_old = make_run("a", "h200", COMMIT_A, "2026-01-01T00:00:00+00:00", seed=1)
    r_new = make_run("b", "h200", COMMIT_B, "2026-01-02T00:00:00+00:00", second=True, seed=2)
    (tmp_path / "old").mkdir()
    write_runs([r_old], tmp_path / "old" / "run.jsonl")
    both = write_runs([r_old, r_new], tmp_path / "both.jsonl")  # the later run wins per case
    stats = load_stats([both])
    key = Key("NVIDIA H200", "silu_and_mul", "silu_and_mul/mlp.act_fn/decode/T=1", "sglang_jit")
    assert stats[key].status == "error" and stats[key].commit == COMMIT_B
    assert cli_compare([tmp_path / "old"], [both], 0.05) == 1


# -- asv results -----------------------------------------------------------------------------------------


def _asv_results(root: Path, commit: str, slow: float, fail_gemm: bool) -> None:
    """asv results written by asv 0.6.6 itself (stats computed by asv_runner from the samples)."""
    asv_results = pytest.importorskip("asv.results", reason="asv is a test dependency (pip install .[test])")
    from asv.runner import BenchmarkResult

    rng = random.Random(commit)
    res = asv_results.Results(
        {"machine": "gpu-box", "gpu": "H200"}, {}, commit, 1767225600000, "3.11", "existing-py", {}
    )
    combos = [("'sgl_kernel'", "1"), ("'sgl_kernel'", "64"), ("'flashinfer'", "1"), ("'flashinfer'", "64")]
    lat, samples, bw = [], [], []
    for backend, t in combos:
        base = (2.0 if t == "1" else 6.0) * 1e-6
        if backend == "'sgl_kernel'" and t == "64":
            base *= slow
        if backend == "'flashinfer'" and t == "1":
            lat.append(float("nan"))  # skipped in setup (NotImplementedError)
            samples.append(None)
            bw.append(float("nan"))
            continue
        s = [base * (1 + rng.gauss(0, 0.01)) for _ in range(30)]
        lat.append(sorted(s)[15])
        samples.append(s)
        bw.append(1000.0 / (base * 1e6) / (slow if backend == "'sgl_kernel'" and t == "64" else 1))
    params = [["'sgl_kernel'", "'flashinfer'"], ["1", "64"]]
    numbers = [1 if s else None for s in samples]
    res.add_result(
        {"name": "benchmarks.RMSNorm.track_latency", "version": "1", "params": params},
        BenchmarkResult(lat, samples, numbers, 0, "", None),
        record_samples=True,
    )
    res.add_result(
        {"name": "benchmarks.RMSNorm.track_bandwidth", "version": "1", "params": params},
        BenchmarkResult(bw, [None] * 4, [None] * 4, 0, "", None),
    )
    gemm = [None] if fail_gemm else [5e-6]
    res.add_result(
        {"name": "benchmarks.Gemm.time_fp8", "version": "1", "params": []},
        BenchmarkResult(gemm, [None], [None], 1 if fail_gemm else 0, "", None),
    )
    res.save(str(root))
    meta = {
        "version": 2,
        "benchmarks.RMSNorm.track_latency": {
            "param_names": ["backend", "T"],
            "unit": "seconds",
            "params": params,
        },
        "benchmarks.RMSNorm.track_bandwidth": {
            "param_names": ["backend", "T"],
            "unit": "GB/s",
            "params": params,
        },
        "benchmarks.Gemm.time_fp8": {"param_names": [], "unit": "seconds", "params": []},
    }
    (root / "benchmarks.json").write_text(json.dumps(meta))


def test_compare_asv_results_of_two_commits(tmp_path: Path, capsys):
    results = tmp_path / "results"
    c1, c2 = "1" * 40, "2" * 40
    _asv_results(results, c1, slow=1.0, fail_gemm=False)
    _asv_results(results, c2, slow=1.3, fail_gemm=True)
    files = sorted((results / "gpu-box").glob("*.json"))
    assert [f.name for f in files] == ["11111111-existing-py.json", "22222222-existing-py.json"]

    old, new = load_stats([f"{results}@{c1[:8]}"]), load_stats([files[1]])
    lat_key = Key("gpu-box", "RMSNorm", "benchmarks.RMSNorm.track_latency(T=64)", "sgl_kernel")
    assert old[lat_key].unit == "us" and old[lat_key].spread == "q25-q75"
    assert old[lat_key].value == pytest.approx(6.0, rel=0.05) and len(old[lat_key].samples) == 30
    c = compare(old, new)
    verdicts = {(ch.key.case, ch.key.backend): ch.verdict for ch in c.changes}
    assert verdicts[("benchmarks.RMSNorm.track_latency(T=64)", "sgl_kernel")] == "slower"
    assert verdicts[("benchmarks.RMSNorm.track_latency(T=1)", "sgl_kernel")] == "same"
    assert verdicts[("benchmarks.RMSNorm.track_latency(T=1)", "flashinfer")] == "skipped"
    assert verdicts[("benchmarks.RMSNorm.track_bandwidth(T=64)", "sgl_kernel")] == "slower"  # GB/s fell
    assert verdicts[("benchmarks.Gemm.time_fp8", "existing-py")] == "broke"

    assert cli_compare([f"{results}@{c1[:8]}"], [f"{results}@{c2[:8]}"], 0.05) == 1
    assert "benchmarks.RMSNorm.track_latency(T=64)" in capsys.readouterr().out
    assert cli_compare([f"{results}@{c1[:8]}"], [files[0]], 0.05) == 0
    assert cli_compare([results], [files[1]], 0.05) == 2  # a folder of two commits needs @COMMIT
    assert "pick one with" in capsys.readouterr().err
    assert cli_compare([f"{results}@deadbeef"], [files[1]], 0.05) == 2
