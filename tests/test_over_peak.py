"""Results above 100% of a datasheet peak are flagged (analysis, report, end of a run), and every
adapter's traffic model goes through metrics to a % the check reads the same way."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dskbench.adapters import adapters
from dskbench.analysis.over_peak import over_peak, summary
from dskbench.measure import datasheet_peaks, metrics
from dskbench.report import write_report
from dskbench.results.io import Run, result_record
from dskbench.shapes.cases import default_shapes
from tests.fake_results import COMMIT_A, _case, _ok, environment, write_runs

B200 = datasheet_peaks("NVIDIA B200")  # every rate the adapters compare with (bf16, fp8, fp4, int8)
ADAPTERS = {k: v for k, v in adapters().items() if v.__module__.startswith("dskbench.")}
SHAPES = default_shapes()


def _first_case(adapter):
    for phase in ("decode", "prefill"):
        for c in SHAPES.cases(adapter.kernel, list(adapter.ops), adapter.role, phase, "quick"):
            if adapter.applies(c):
                return c
    return None


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_each_traffic_model_at_its_floor_is_100_percent_and_above_is_flagged(name):
    """A record timed at the datasheet roofline's floor is 100% of its bounding peak: 10% faster is
    flagged for that peak, 10% slower is not (each backend's own traffic, e.g. a weight-only variant)."""
    a = ADAPTERS[name]()
    case = _first_case(a)
    if case is None:
        pytest.skip(f"{name}: no case in the quick sweep")
    for b in a.all_backends():
        t = a.traffic_for(b.name, case)
        floor = metrics(1.0, t.bytes, t.flops or None, None, B200, compute=t.compute)
        assert floor["floor_us"] and floor["bound"], (name, b.name, t)
        rec = {"status": "ok", "kernel": name, "case_id": case.id, "op": case.op, "backend": {"name": b.name}}
        fast = {
            **rec,
            "metrics": metrics(
                floor["floor_us"] / 1.1, t.bytes, t.flops or None, None, B200, compute=t.compute
            ),
        }
        found = over_peak([fast])
        assert found and max(o.pct for o in found) == pytest.approx(110.0), (name, b.name)
        assert {"memory": "bandwidth", "compute": "compute"}[floor["bound"]] in {o.quantity for o in found}
        slow = {
            **rec,
            "metrics": metrics(
                floor["floor_us"] / 0.9, t.bytes, t.flops or None, None, B200, compute=t.compute
            ),
        }
        assert over_peak([slow]) == []


def _record(kernel, backend, pct_bw=None, pct_compute=None, measured_bw=None, status="ok"):
    m = {"gbps": 5280.0, "tflops": 1128.0, "pct_bw_datasheet": pct_bw, "pct_compute_datasheet": pct_compute}
    m["pct_bw_measured"] = measured_bw
    rec = {
        "status": status,
        "kernel": kernel,
        "op": "experts",
        "variant": "down.bf16",
        "backend": {"name": backend},
    }
    return {**rec, "case_id": f"{kernel}/experts:down.bf16/prefill/T=8192", "metrics": m}


def test_only_datasheet_percentages_above_100_are_flagged():
    recs = [
        _record("fused_moe_kernel", "sglang_triton", pct_compute=114.0),
        _record("topk", "sgl_kernel", pct_bw=110.0, pct_compute=101.0),
        _record("fine", "a", pct_bw=97.0, measured_bw=121.0),  # above a low measured ceiling: fine
        _record("wrong", "a", pct_bw=300.0, status="wrong"),  # not an ok result
        _record("exactly", "a", pct_bw=100.0),
        {**_record("hot", "a", pct_bw=180.0), "timing": {"mode": "hot"}},  # L2 hits: no HBM limit
    ]
    found = over_peak(recs)
    assert [(o.kernel, o.quantity, o.pct) for o in found] == [
        ("fused_moe_kernel", "compute", 114.0),
        ("topk", "bandwidth", 110.0),
        ("topk", "compute", 101.0),
    ]
    assert found[0].op == "experts:down.bf16" and found[0].backend == "sglang_triton"
    assert found[0].line() == (
        "fused_moe_kernel · sglang_triton · experts:down.bf16: 1,128 TFLOP/s = 114% of the datasheet compute"
    )
    line = summary(found, shown=1)
    assert line is not None and line.startswith("3 result(s) above 100% of the datasheet peak")
    assert line.endswith("; … and 2 more") and summary([]) is None


def _run_with_an_impossible_record() -> Run:
    rng = random.Random(0)
    env = environment("r1", "h200", COMMIT_A, "2026-01-10T10:00:00+00:00")
    case = _case(
        "fast_topk_transform_ragged_fused", "nsa_backend.forward_extend", "prefill", {"T": 4096}, {"T": 4096}
    )
    ok = _ok(rng, "h200", case, "sgl_kernel", 50_000_000, 0, 2.0, 1.0)
    ok["metrics"] = metrics(10.6, 50_000_000, None, None, datasheet_peaks("NVIDIA H200"))  # 4,717 GB/s
    ok["metrics"]["pct_bw_datasheet"] = 110.0  # an impossible figure, as an overcounting model gives
    normal = _ok(
        rng, "h200", {**case, "case_id": case["case_id"] + "x"}, "flashinfer", 1_000_000, 0, 2.0, 0.5
    )
    return Run(env, [result_record("r1", r.pop("status"), **r) for r in (ok, normal)])


def test_report_lists_results_above_the_datasheet_peak(tmp_path: Path):
    html, md = (
        p.read_text() for p in write_report([_run_with_an_impossible_record()], tmp_path, categories={})
    )
    assert "### Above 100% of the datasheet peak (1 result)" in md
    row = next(line for line in md.splitlines() if line.startswith("| fast_topk_transform_ragged_fused |"))
    assert "| sgl_kernel |" in row and "| bandwidth |" in row and row.rstrip().endswith("| 110% |")
    assert "1 result above 100% of the datasheet peak." in html and 'class="overpeak"' in html
    # the machine card: the datasheet peak, and the measured ceiling beside it (used or not, and why)
    assert "| HBM bandwidth | 4,800 GB/s | 3,870 GB/s (Tensor.copy_ fp32), 81% of datasheet |" in md
    assert "— not used: throttled" in md  # the fake run's fp8 matmul ceiling was throttled
    assert "% of peak is of the datasheet peaks of H200 SXM" in md


def test_report_shows_no_over_peak_section_when_none(tmp_path: Path):
    run = _run_with_an_impossible_record()
    run.results[0]["metrics"]["pct_bw_datasheet"] = 98.0
    html, md = (p.read_text() for p in write_report([run], tmp_path, categories={}))
    assert "Above 100% of the datasheet peak" not in md and 'class="overpeak"' not in html


def test_end_of_run_names_results_above_the_datasheet(tmp_path: Path, capsys):
    from dskbench.frontends.cli.run import finish

    out = write_runs([_run_with_an_impossible_record()], tmp_path / "r.jsonl")
    finish(out, "summary", "cuda", {})
    err = capsys.readouterr().err
    assert err.startswith("dskbench: warning: 1 result(s) above 100% of the datasheet peak")
    assert "fast_topk_transform_ragged_fused · sgl_kernel · nsa_backend.forward_extend" in err
