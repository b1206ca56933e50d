"""The pytest-benchmark suite in bench/, end to end on the CPU: two pytest runs in subprocesses."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dskbench.frontends.suite.plan_cache import child_env
from dskbench.results.io import read_runs
from tests.suite_helpers import REPO, make_fake_root, run_pytest, write_registry


@pytest.fixture()
def fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return make_fake_root(tmp_path, monkeypatch)


SLEEP_ADAPTER = '''
"""A fake kernel whose reference sleeps FAKE_SLEEP_US microseconds (a deterministic slowdown)."""
import os, time
import torch
from dskbench.adapters import register
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.backends import SM100, Backend

@register
class FakeSleep(Adapter):
    kernel = "fake_sleep"
    role = "norm"
    backends = [Backend("b200", "math:sqrt", None, "aot", lambda fn, inputs, case: fn, requires=SM100)]

    def make_inputs(self, case, device, seed):
        return {"x": torch.ones(case.dims["T"], 8)}

    def reference(self, inputs, case):
        time.sleep(float(os.environ.get("FAKE_SLEEP_US", "0")) * 1e-6)
        return inputs["x"] * 2

    def traffic(self, case):
        return Traffic(bytes=64 * case.dims["T"], flops=8 * case.dims["T"])
'''


def test_pytest_benchmark_suite_on_cpu(fake_root, tmp_path):
    """bench/ end to end on the CPU: JSON with our samples and extra_info; compare-fail on a slowdown."""
    write_registry(fake_root, {"fake_sleep": "benchmark"})
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "fake_sleep_adapter.py").write_text(SLEEP_ADAPTER)
    env = child_env()
    env["PYTHONPATH"] += os.pathsep + str(tmp_path / "mods")
    env["DSKBENCH_EXTRA_ADAPTERS"] = "fake_sleep_adapter"
    storage = tmp_path / "storage"
    common = [
        str(REPO / "bench"),
        "--dskbench-device=cpu",
        "--dskbench-sweep=decode",
        "--dskbench-kernel=fake_sleep",
        "--dskbench-budget=0.05",
        f"--dskbench-jsonl-dir={tmp_path / 'jsonl'}",
        "-k",
        "not 64",
        f"--benchmark-storage=file://{storage}",
        "-rs",
    ]
    out = tmp_path / "run1.json"
    p = run_pytest(
        [*common, f"--benchmark-json={out}", "--benchmark-autosave"], REPO, {**env, "FAKE_SLEEP_US": "300"}
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "dskbench: CPU: torch reference" in p.stdout
    assert (
        "needs sm100 (found no CUDA GPU)" in p.stdout
    )  # GPU-only parametrisations: skipped, with the reason
    data = json.loads(out.read_text())
    assert data["machine_info"]["dskbench"]["device"] == "cpu" and data["machine_info"]["gpu"] is None
    assert data["machine_info"]["dskbench"]["selection"]["tp"] == [1]  # run's default on a CPU (as measured)
    benches = {b["param"]: b for b in data["benchmarks"]}
    assert set(benches) == {f"fake_sleep/input_layernorm/decode/T={t}|torch-ref" for t in (1, 16)}
    b = benches["fake_sleep/input_layernorm/decode/T=16|torch-ref"]
    assert b["group"].startswith("CPU reference: ") and b["options"]["timer"] == "dskbench_gpu_replay_clock"
    assert b["extra_info"]["bytes"] == 64 * 16 and b["extra_info"]["timing_method"] == "cpu-wall"
    assert b["extra_info"]["gbps"] == pytest.approx(64 * 16 / b["extra_info"]["median_us"] / 1e3)
    # the statistics are the core's samples, exactly (host time around the replay would differ)
    (run,) = read_runs([b["extra_info"]["jsonl"]])
    rec = next(r for r in run.results if f"{r['case_id']}|{r['backend']['name']}" == b["param"])
    assert b["stats"]["data"] == [x * 1e-6 for x in rec["timing"]["samples_us"]]
    assert b["stats"]["median"] > 300e-6

    # a 10x slower kernel fails --benchmark-compare-fail against the saved run
    p2 = run_pytest(
        [
            *common,
            "-k",
            "fake_sleep and not 64",
            "--benchmark-compare",
            "--benchmark-compare-fail=median:50%",
        ],
        REPO,
        {**env, "FAKE_SLEEP_US": "3000"},
    )
    assert p2.returncode != 0 and "Performance has regressed" in p2.stdout + p2.stderr, p2.stdout[-3000:]
