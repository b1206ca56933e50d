"""One pytest-benchmark test per (kernel case, backend) of the plan; see conftest.py for how it works."""

from __future__ import annotations

from typing import Any

import pytest

from dskbench.execution.config import RunConfig
from dskbench.frontends.pytest_bench.replay import REPLAY_CLOCK, replay
from dskbench.frontends.suite.config import label
from dskbench.frontends.suite.plan import KEY_SEP


@pytest.mark.benchmark(timer=REPLAY_CLOCK)
def test_kernel(benchmark: Any, dsk_case: str, dsk_result: dict[str, Any], dsk_config: RunConfig) -> None:
    rec = dsk_result
    if rec["status"] == "skipped":
        pytest.skip(rec["reason"])
    if rec["status"] != "ok":  # wrong (failed the reference check), error or unstable (impossible timing)
        pytest.fail(f"{rec['status']}: {rec['reason']}", pytrace=False)
    case_id, backend = dsk_case.rsplit(KEY_SEP, 1)
    cpu = dsk_config.device == "cpu"
    benchmark.group = f"{'CPU reference: ' if cpu else ''}{case_id}"
    # Mutate, never reassign: pytest-benchmark's stats keep a reference to this dict.
    benchmark.extra_info.update(
        {
            "case_id": case_id,
            "backend": backend,
            "device": dsk_config.device,
            "label": label(dsk_config),
            "timing_method": rec["timing"].get("method"),
            "median_us": rec["median_s"] * 1e6 if rec["median_s"] else None,
            "bytes": rec["bytes"],
            "flops": rec["flops"],
            "gbps": rec["gbps"],
            "tflops": rec["tflops"],
            "metrics": rec["metrics"],
            "samples": len(rec["samples_s"]),
            "converged": rec["timing"].get("converged"),
            "throttled": rec["throttled"],
            "resolved": rec["backend"].get("resolved_target"),
            "version": rec["backend"].get("version"),
            "jsonl": rec["jsonl"],
        }
    )
    replay(benchmark, rec["samples_s"])
