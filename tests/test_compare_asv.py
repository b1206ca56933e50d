"""dskbench compare on asv's results: two commits of the suite, cases matched and twins counted once."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from dskbench.analysis.compare import Key, compare, load_stats
from dskbench.analysis.compare_inputs import load_side
from dskbench.frontends.cli.compare import cli_compare
from tests.test_compare import H200X4, PRIOR

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
    lat, smp, bw = [], [], []
    for backend, t in combos:
        base = (2.0 if t == "1" else 6.0) * 1e-6
        if backend == "'sgl_kernel'" and t == "64":
            base *= slow
        if backend == "'flashinfer'" and t == "1":
            lat.append(float("nan"))  # skipped in setup (NotImplementedError)
            smp.append(None)
            bw.append(float("nan"))
            continue
        s = [base * (1 + rng.gauss(0, 0.01)) for _ in range(30)]
        lat.append(sorted(s)[15])
        smp.append(s)
        bw.append(1000.0 / (base * 1e6) / (slow if backend == "'sgl_kernel'" and t == "64" else 1))
    params = [["'sgl_kernel'", "'flashinfer'"], ["1", "64"]]
    numbers = [1 if s else None for s in smp]
    res.add_result(
        {"name": "benchmarks.RMSNorm.track_latency", "version": "1", "params": params},
        BenchmarkResult(lat, smp, numbers, 0, "", None),
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
    _asv_results(results, c1, slow=1.3, fail_gemm=False)
    _asv_results(results, c2, slow=1.3 * 1.3, fail_gemm=True)
    files = sorted((results / "gpu-box").glob("*.json"))
    assert [f.name for f in files] == ["11111111-existing-py.json", "22222222-existing-py.json"]

    old, new = load_stats([f"{results}@{c1[:8]}"]), load_stats([files[1]])
    lat_key = Key("gpu-box", "RMSNorm", "benchmarks.RMSNorm.track_latency(T=64)", "sgl_kernel")
    assert old[lat_key].unit == "us" and old[lat_key].spread == "q25-q75" and len(old[lat_key].samples) == 30
    assert old[lat_key].value == pytest.approx(7.8, rel=0.05) and old[lat_key].p10 < old[lat_key].value
    c = compare(old, new, prior=PRIOR)
    verdicts = {(ch.key.case, ch.key.backend): ch for ch in c.changes}
    slow = verdicts[("benchmarks.RMSNorm.track_latency(T=64)", "sgl_kernel")]
    assert slow.verdict == "slower" and slow.judged.statistic == "p10"  # from the samples asv kept
    assert verdicts[("benchmarks.RMSNorm.track_latency(T=1)", "sgl_kernel")].verdict == "same"
    assert verdicts[("benchmarks.RMSNorm.track_latency(T=1)", "flashinfer")].verdict == "skipped"
    bw = verdicts[("benchmarks.RMSNorm.track_bandwidth(T=64)", "sgl_kernel")]
    assert bw.verdict == "slower" and bw.judged.statistic == "median"  # GB/s -41%: beyond the widest 25%
    assert verdicts[("benchmarks.Gemm.time_fp8", "existing-py")].verdict == "broke"

    assert cli_compare([f"{results}@{c1[:8]}"], [f"{results}@{c2[:8]}"]) == 1
    assert "benchmarks.RMSNorm.track_latency(T=64)" in capsys.readouterr().out
    assert cli_compare([f"{results}@{c1[:8]}"], [files[0]]) == 0
    assert cli_compare([results], [files[1]]) == 2  # a folder of two commits needs @COMMIT
    assert "pick one with" in capsys.readouterr().err
    assert cli_compare([f"{results}@deadbeef"], [files[1]]) == 2


def test_asv_results_of_the_dskbench_suite_match_cases_and_count_twins_once():
    """The suite's parameter is 'case_id|backend'; rows the suite measured once for several ops carry
    identical numbers (twins), and GB/s rows derive from the latency rows."""
    results = H200X4 / "asv" / "results"
    side = load_side([f"{results}@a2ca6ec0"])
    stats = side.stats()
    key = Key("nvidia-h200_vm", "rmsnorm", "rmsnorm/input_layernorm/decode/T=1", "sgl_kernel")
    assert stats[key].unit == "us" and stats[key].status == "ok"
    twins = side.twins()
    bw = Key(key.machine, key.kernel, key.case + " [track_bandwidth]", key.backend)
    assert twins[bw] == key
    enorm = Key(key.machine, key.kernel, "rmsnorm/enorm/decode/T=1", "sgl_kernel")
    copy, first = (enorm, key) if enorm in twins else (key, enorm)
    assert twins[copy] == first and stats[copy].value == stats[first].value
    c = compare(load_side([f"{results}@f35bb0e6"]), side)
    assert len(c.measured) == 108 and len(c.changes) == 376
