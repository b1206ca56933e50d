"""dskbench.frontends.suite (shared by the asv and pytest-benchmark front ends) and the pytest-benchmark suite in
bench/, on the CPU with the fake kernels of tests/fake_adapters.py."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from dskbench.execution.config import RunConfig
from dskbench.frontends.pytest_bench.replay import ReplayClock
from dskbench.frontends.suite import config as suite_config
from dskbench.frontends.suite import measure, plan_cache
from dskbench.frontends.suite import plan as suite_plan
from dskbench.results.io import read_runs
from dskbench.shapes.cases import default_shapes
from tests.suite_helpers import REPO, make_fake_root, run_pytest, write_registry


@pytest.fixture()
def fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return make_fake_root(tmp_path, monkeypatch)


def cpu_selection(**kw) -> RunConfig:
    base = dict(device="cpu", sweep="decode", budget="0.02")
    base.update(kw)
    return suite_config.parse_config(**base)


# -- the run configuration -------------------------------------------------------------------------------


def test_config_from_env_parses_every_knob():
    env = {
        "DSKBENCH_DEVICE": "cpu",
        "DSKBENCH_ASV_KERNELS": "rmsnorm, fused_add_rmsnorm",
        "DSKBENCH_ASV_BACKENDS": "torch-ref",
        "DSKBENCH_ASV_SWEEP": "all",
        "DSKBENCH_ASV_QUICK": "1",
        "DSKBENCH_ASV_TP": "1,8",
        "DSKBENCH_ASV_MODE": "hot",
        "DSKBENCH_ASV_MODEL": "DeepSeek-V3.2",
    }
    config = suite_config.config_from_env(env)
    assert config.models == ("deepseek-v3.2",)
    assert config.kernels == ("rmsnorm", "fused_add_rmsnorm") and config.backends == ("torch-ref",)
    assert config.phases == suite_config.SWEEPS and config.tp == (1, 8) and config.options.mode == "hot"
    assert config.profile == "cpu" and config.options.budget_s == 0.2  # a CPU run: the capped CPU sweep
    assert "CPU" in suite_config.label(config) and "not GPU" in suite_config.label(config)
    opts = config.options
    assert opts.device == "cpu" and opts.isolate and opts.phases == suite_config.SWEEPS
    assert RunConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    info = suite_config.selection_info(config)
    assert (
        info["kernels"] == ["rmsnorm", "fused_add_rmsnorm"] and info["mode"] == "hot" and info["tp"] == [1, 8]
    )
    assert info["models"] == ["deepseek-v3.2"]


def test_config_defaults_and_gpu_profiles():
    config = suite_config.parse_config(device="cuda")
    assert config.phases == ("decode", "prefill") and config.profile == "full"
    assert config.options.budget_s is None
    quick = suite_config.parse_config(device="cuda", quick="yes")
    assert quick.profile == "quick" and suite_config.selection_info(quick)["quick"] is True
    # no NVML on this machine: auto means the CPU
    assert suite_config.config_from_env({}).device == "cpu"


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"sweep": "decoed"}, "sweep decoed"),
        ({"mode": "warm"}, "mode 'warm'"),
        ({"device": "tpu"}, "device 'tpu'"),
        ({"tp": "1,x"}, "tp"),
        ({"budget": "fast"}, "budget"),
        (
            {"models": "deepseek-v4"},
            "model: unknown model 'deepseek-v4'; known models: deepseek-r1, deepseek-v3.2",
        ),
    ],
)
def test_config_rejects_bad_values(kw, match):
    with pytest.raises(suite_config.SuiteError, match=match):
        suite_config.parse_config(**kw)


# -- results as the front ends see them -------------------------------------------------------------------


def test_case_result_flattens_a_record():
    rec = {
        "status": "ok",
        "backend": {"name": "sgl_kernel"},
        "traffic": {"bytes": 2_000_000, "flops": 4_000_000},
        "timing": {
            "median_us": 2.0,
            "samples_us": [1.0, 2.0, 4.0],
            "method": "cuda-graph",
            "clocks_before": {},
        },
        "metrics": {"gbps": 1000.0, "tflops": 2.0, "pct_bw_datasheet": 20.8},
        "clocks": {"throttled": False},
    }
    c = measure.case_result(rec)
    assert c["samples_s"] == [1e-6, 2e-6, 4e-6] and c["median_s"] == 2e-6
    assert c["gbps"] == 1000.0 and c["tflops"] == 2.0 and c["metrics"]["pct_bw_datasheet"] == 20.8
    assert "samples_us" not in c["timing"] and "clocks_before" not in c["timing"] and c["throttled"] is False
    # no metrics from the core: bandwidth from the bytes and the median
    rec2 = {**rec, "metrics": {}}
    assert measure.case_result(rec2)["gbps"] == pytest.approx(1000.0)
    skipped = measure.case_result({"status": "skipped", "reason": "needs sm100", "backend": {"name": "x"}})
    assert skipped["samples_s"] == [] and skipped["reason"] == "needs sm100" and skipped["gbps"] is None


# -- plan ------------------------------------------------------------------------------------------------


def test_load_plan_plans_in_a_subprocess_then_reads_the_cache(fake_root, monkeypatch):
    sel = cpu_selection()
    fingerprint = plan_cache.plan_fingerprint(sel)
    plan = plan_cache.load_plan(sel)
    assert sorted(plan.kernels) == ["fake_ok", "fake_wrong"]
    assert plan.keys("fake_ok") == [
        f"fake_ok/input_layernorm/decode/T={t}|torch-ref"
        for t in default_shapes().values("decode_tokens", "cpu")
    ]
    assert {s["kernel"]: s["reason"] for s in plan.skipped}["fake_host"].startswith("host-only")
    assert plan.kernel_of()["fake_wrong/input_layernorm/decode/T=16|torch-ref"] == "fake_wrong"

    def no_subprocess(*a, **k):
        raise AssertionError("the cached plan should have been used")

    # (pinned: dskbench's own sources are part of the fingerprint, and may be edited meanwhile)
    monkeypatch.setattr(plan_cache, "plan_fingerprint", lambda s: fingerprint)
    monkeypatch.setattr(subprocess, "run", no_subprocess)
    assert plan_cache.load_plan(sel).to_json() == plan.to_json()
    monkeypatch.undo()


def test_plan_fingerprint_covers_selection_registry_and_extra_adapters(fake_root, monkeypatch):
    sel = cpu_selection()
    before = plan_cache.plan_fingerprint(sel)
    write_registry(fake_root, {"fake_raise": "benchmark"})
    after = plan_cache.plan_fingerprint(sel)
    assert after != before
    assert plan_cache.plan_fingerprint(cpu_selection(sweep="prefill")) != after
    monkeypatch.setenv("DSKBENCH_EXTRA_ADAPTERS", "")
    assert plan_cache.plan_fingerprint(sel) != after


def test_plan_all_backends_and_errors(fake_root):
    import tests.fake_adapters  # noqa: F401 - registers the fakes in this process too

    plan = suite_plan.make_plan(cpu_selection(kernels="fake_ok", all_backends=True))
    assert {k.split("|")[1] for k in plan.keys("fake_ok")} == {"fake", "b200", "torch-ref"}
    with pytest.raises(suite_config.SuiteError, match="unknown backend"):
        suite_plan.make_plan(cpu_selection(backends="nope"))
    with pytest.raises(
        suite_config.SuiteError, match="(?s)planning failed.*unknown kernel 'fake_okk'.*did you mean fake_ok"
    ):
        plan_cache.load_plan(cpu_selection(kernels="fake_okk"))


# -- measuring -------------------------------------------------------------------------------------------


def test_measure_kernel_returns_plain_dicts_and_keeps_the_jsonl(fake_root, tmp_path):
    import pickle

    import tests.fake_adapters  # noqa: F401

    sel = cpu_selection(kernels="fake_ok,fake_wrong", all_backends=True)
    plan = suite_plan.make_plan(sel)
    keys = {f"fake_ok/input_layernorm/decode/T=16|{b}" for b in ("fake", "b200")}
    items = plan.items("fake_ok", keys) + plan.items(
        "fake_wrong", {"fake_wrong/input_layernorm/decode/T=1|fake"}
    )
    out = measure.measure_kernel("fake_ok", items, sel, keep_dir=tmp_path / "kept")
    cases = out["cases"]
    assert set(cases) == {suite_plan.item_key(i) for i in items}
    ok = cases["fake_ok/input_layernorm/decode/T=16|fake"]
    assert ok["status"] == "ok" and ok["timing"]["method"] == "cpu-wall" and ok["samples_s"]
    assert ok["gbps"] == pytest.approx(ok["bytes"] / ok["median_s"] / 1e9)
    assert cases["fake_ok/input_layernorm/decode/T=16|b200"]["reason"].startswith("needs sm100")
    assert cases["fake_wrong/input_layernorm/decode/T=1|fake"]["status"] == "wrong"
    # the kept file is the runner's, and the samples are its samples, converted to seconds
    (run,) = read_runs([out["jsonl"]])
    rec = next(r for r in run.results if r["case_id"].endswith("T=16") and r["backend"]["name"] == "fake")
    assert ok["samples_s"] == [x * 1e-6 for x in rec["timing"]["samples_us"]]
    assert pickle.loads(pickle.dumps(out)) == out  # asv pickles what setup_cache returns


def test_child_env_puts_this_dskbench_first(monkeypatch):
    """Planner and workers import the same dskbench as the front end, installed or not."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = plan_cache.child_env()
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
    assert "PYTHONPATH" not in os.environ


# -- pytest-benchmark ------------------------------------------------------------------------------------


def test_replay_clock_yields_each_sample_exactly():
    clock = ReplayClock()
    clock.load([3e-6, 1e-6])
    got = []
    for _ in range(2):  # what pytest-benchmark's runner does per round
        start = clock()
        clock.step()
        got.append(clock() - start)
    assert got == [3e-6, 1e-6]
    with pytest.raises(RuntimeError, match="more rounds than samples"):
        clock.step()


NO_CPUINFO = """
def pytest_benchmark_generate_machine_info():
    return {"node": "test"}  # py-cpuinfo takes 1.5 s
"""


def test_replay_feeds_pytest_benchmark_statistics(tmp_path):
    """Unit check of the trick itself: the JSON holds the given samples, not host time."""
    (tmp_path / "test_replay.py").write_text(
        textwrap.dedent(
            """
            import time
            import pytest
            from dskbench.frontends.pytest_bench.replay import REPLAY_CLOCK, replay

            @pytest.mark.benchmark(timer=REPLAY_CLOCK)
            def test_it(benchmark):
                benchmark.extra_info["bytes"] = 123
                replay(benchmark, [5e-6, 1e-6, 3e-6])

            def test_needs_the_marker(benchmark):
                with pytest.raises(RuntimeError, match="REPLAY_CLOCK"):
                    replay(benchmark, [1e-6])
                benchmark(time.sleep, 0)
            """
        )
    )
    (tmp_path / "conftest.py").write_text(NO_CPUINFO)
    out = tmp_path / "b.json"
    p = run_pytest(["test_replay.py", f"--benchmark-json={out}"], tmp_path, plan_cache.child_env())
    assert p.returncode == 0, p.stdout + p.stderr
    bench = {b["name"]: b for b in json.loads(out.read_text())["benchmarks"]}["test_it"]
    assert bench["stats"]["data"] == [5e-6, 1e-6, 3e-6] and bench["stats"]["median"] == 3e-6
    assert bench["options"]["timer"] == "dskbench_gpu_replay_clock" and bench["extra_info"] == {"bytes": 123}


# -- the same default tp as `dskbench run` ---------------------------------------------------------------


def test_the_suites_default_tp_is_runs():
    """No DSKBENCH_ASV_TP / --dskbench-tp: the degrees `dskbench run` measures by default (1, 4, 8, cut to
    the profile's at planning); an explicit one is kept."""
    from dskbench.execution.items import DEFAULT_TP, SweepOptions

    assert suite_config.parse_config(device="cuda").tp == DEFAULT_TP == SweepOptions().tp
    assert suite_config.config_from_env({"DSKBENCH_ASV_TP": "1"}).tp == (1,)
    assert suite_config.parse_config(device="cuda", tp="8").tp == (8,)


@pytest.mark.parametrize(
    "kw, tps", [({"device": "cuda"}, (1, 4, 8)), ({"device": "cuda", "quick": "1"}, (1, 8)), ({}, (1,))]
)
def test_the_suites_plan_is_runs_plan(kw, tps):
    """The asv / pytest-benchmark plan of a tp-dependent kernel holds the cases `dskbench run` plans with
    the same selection, at the same tp degrees, and records the tp it measures."""
    from dskbench import paths
    from dskbench.frontends.cli.plan import plan as cli_plan
    from dskbench.registry.load import load_registry
    from dskbench.shapes.cases import default_shapes

    config = suite_config.parse_config(
        **{"device": "cpu", **kw, "kernels": "silu_and_mul", "sweep": "decode"}
    )
    got = suite_plan.make_plan(config)
    assert got.config.tp == tps
    items, _ = cli_plan(config, load_registry(paths.REGISTRY_DIR), default_shapes())
    assert sorted(got.keys("silu_and_mul")) == sorted(
        {suite_plan.item_key(dataclasses.asdict(i)) for i in items}
    )
    assert {it["case"]["point"].get("tp") for it in got.items("silu_and_mul")} == set(tps)
