"""The injected-delay check (tests/gpu_delay_check.py, tests/delay_adapters.py) on the CPU: the delay
reaches exactly the chosen cases' launchers, and the script's outputs are complete. Whether a delay is
caught depends on timing, so nothing here asserts a verdict."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest

from dskbench import paths
from dskbench.adapters import get_adapter
from dskbench.shapes.cases import Case

REPO = paths.REPO_ROOT


def test_the_delay_wraps_only_the_named_backend_and_cases(monkeypatch, tmp_path: Path):
    extra = [m for m in os.environ.get("DSKBENCH_EXTRA_ADAPTERS", "").split(",") if m]
    monkeypatch.setenv("DSKBENCH_EXTRA_ADAPTERS", ",".join({*extra, "tests.fake_adapters"}))
    delay_adapters = importlib.import_module("tests.delay_adapters")  # as the runner imports it
    cls = type(get_adapter("fake_ok"))
    monkeypatch.setattr(cls, "backends", list(cls.backends))  # install() replaces them: undone after
    monkeypatch.setattr(cls, "reference_backend", cls.reference_backend)
    calls = []
    monkeypatch.setattr(delay_adapters, "spin", lambda us: calls.append(us))
    chosen = Case("fake_ok", "op", "decode", {"T": 4}, {"T": 4, "D": 8})
    other = Case("fake_ok", "op", "decode", {"T": 8}, {"T": 8, "D": 8})
    log = tmp_path / "bound.jsonl"
    spec = {
        "delays": [
            {"kernel": "fake_ok", "backend": "fake", "case_id": chosen.id, "cycles": 0, "us": 7.0},
            {"kernel": "fake_ok", "backend": "torch-ref", "case_id": chosen.id, "cycles": 0, "us": 3.0},
        ],
        "bound_log": str(log),
    }
    assert sorted(delay_adapters.install(spec)) == ["fake_ok/fake", "fake_ok/torch-ref"]
    adapter = get_adapter("fake_ok")
    backends = {b.name: b for b in adapter.all_backends()}
    inputs = adapter.make_inputs(chosen, "cpu", 0)
    backends["fake"].bind(None, inputs, chosen)()
    backends["torch-ref"].bind(None, inputs, chosen)()
    backends["fake"].bind(None, adapter.make_inputs(other, "cpu", 0), other)()
    backends["b200"].bind(None, inputs, chosen)()  # another backend of the same kernel
    assert calls == [7.0, 3.0]
    bound = [json.loads(x) for x in log.read_text().splitlines()]
    assert [b["case_id"] for b in bound] == [chosen.id, chosen.id] and not any(b["gpu"] for b in bound)


def test_gpu_delay_check_runs_end_to_end_on_the_cpu(tmp_path: Path):
    from tests import gpu_delay_check

    out = tmp_path / "out"
    rc = gpu_delay_check.main(["--out", str(out), "--device", "cpu", "--sweep", "decode"])
    assert rc in (0, 1)  # caught or not is the CPU's timing noise
    for name in ("base.jsonl", "delayed.jsonl", "delays.json", "verdicts.json", "summary.txt", "compare.txt"):
        assert (out / name).is_file(), name
    doc = json.loads((out / "verdicts.json").read_text())
    spec = json.loads((out / "delays.json").read_text())
    delayed = {d["case_id"] for d in spec["delays"]}
    assert delayed and set(doc["delays_bound"]) == delayed  # the measuring process wrapped exactly those
    assert [r["threshold"] for r in doc["results"]] == [0.05, 0.0]
    for res in doc["results"]:
        assert {r["case_id"] for r in res["delayed"]} == delayed
        # a CPU has no noise prior of its own: one run per side leaves a change beyond the threshold unjudged
        verdicts = ("slower", "~slower", "same", "~faster", "faster", "not judged")
        assert all(r["verdict"] in verdicts for r in res["delayed"])
        assert res["controls"] >= len(delayed) - 1
    summary = (out / "summary.txt").read_text()
    assert f"delays bound in the measuring process: {len(delayed)} of {len(delayed)} cases" in summary
    assert summary.count("target +") >= len(delayed) and "unchanged cases flagged" in summary
    assert "plumbing, not the verdicts" in summary


@pytest.mark.parametrize("bad", [["--device", "tpu"], []])
def test_gpu_delay_check_usage_errors(bad, capsys):
    from tests import gpu_delay_check

    with pytest.raises(SystemExit) as e:
        gpu_delay_check.main(bad)
    assert e.value.code == 2
