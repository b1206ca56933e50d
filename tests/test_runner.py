"""The runner: planning, incremental writing, crash isolation, error paths (CPU, fake kernels)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DSKBENCH_EXTRA_ADAPTERS", "tests.fake_adapters")

from dskbench.execution.runner import PlanError, SweepOptions, plan_sweep, run_sweep, select_kernels  # noqa: E402
from dskbench.results.io import read_runs  # noqa: E402
from dskbench.shapes.cases import default_shapes  # noqa: E402
from tests.fake_adapters import registry_entry as _entry  # noqa: E402

FAKES = ("fake_ok", "fake_wrong", "fake_crash", "fake_poison", "fake_raise")
DECODE_T = default_shapes().values("decode_tokens", "cpu")  # the CPU profile's decode points
N = len(DECODE_T)
N_ALL = N + len(default_shapes().values("prefill_tokens", "cpu"))


@pytest.fixture()
def registry():
    reg = {n: _entry(n) for n in FAKES}
    reg["fake_host"] = _entry("fake_host", "host-only", "host function, no GPU kernel")
    reg["fake_noadapter"] = _entry("fake_noadapter")
    return reg


def _opts(**kw) -> SweepOptions:
    base = dict(
        device="cpu", phases=("decode",), profile="cpu", budget_s=0.02, measure_ceilings=False, seed=1
    )
    base.update(kw)
    return SweepOptions(**base)


def test_unknown_kernel_is_a_clear_error(registry):
    with pytest.raises(PlanError, match="unknown kernel 'fake_okk'.*did you mean fake_ok"):
        select_kernels(registry, ["fake_okk"])


def test_unknown_backend_is_a_clear_error(registry):
    with pytest.raises(PlanError, match="unknown backend"):
        plan_sweep(registry, default_shapes(), ["fake_ok"], ["nope"], _opts())


def test_plan_skips_non_benchmark_and_adapterless_kernels(registry):
    items, skips = plan_sweep(
        registry, default_shapes(), ["fake_host", "fake_noadapter", "fake_ok"], None, _opts()
    )
    reasons = {s["kernel"]: s["reason"] for s in skips}
    assert reasons["fake_host"].startswith("host-only")
    assert reasons["fake_noadapter"] == "no adapter for this kernel yet"
    # CPU: only the torch reference runs, at the cpu profile's decode points
    assert {i.backend for i in items} == {"torch-ref"}
    assert sorted(i.case["point"]["T"] for i in items) == DECODE_T


def _run(tmp_path, registry, kernels, backends, isolate=True):
    items, skips = plan_sweep(registry, default_shapes(), kernels, backends, _opts())
    out = tmp_path / "r.jsonl"
    summary = run_sweep(items, skips, _opts(isolate=isolate), out)
    (run,) = read_runs([out])
    return summary, run


@pytest.mark.parametrize("isolate", [True, False])
def test_statuses_ok_wrong_skipped(tmp_path, registry, isolate):
    summary, run = _run(tmp_path, registry, ["fake_ok", "fake_wrong"], ["fake", "b200"], isolate)
    by = {(r["kernel"], r["backend"]["name"], r["point"]["T"]): r for r in run.results}
    ok = by[("fake_ok", "fake", 16)]
    assert ok["status"] == "ok" and ok["timing"]["median_us"] > 0 and ok["timing"]["method"] == "cpu-wall"
    assert ok["check"]["error"] < 1e-6
    assert ok["timing"]["stopping"]["name"] == "median-ci"  # the policy and its parameters, recorded
    wrong = by[("fake_wrong", "fake", 16)]
    assert wrong["status"] == "wrong" and "relative error" in wrong["reason"] and "timing" not in wrong
    sk = by[("fake_ok", "b200", 16)]
    assert sk["status"] == "skipped" and sk["reason"].startswith("needs sm100")
    assert summary.counts["ok"] == N and summary.counts["wrong"] == N and summary.counts["skipped"] == N


def test_an_ok_case_says_where_its_time_went(tmp_path, registry):
    """Every stage of an ok case is recorded; the measurement's three stages fit inside measure_s and
    the stages with other_s add up to the whole item."""
    _, run = _run(tmp_path, registry, ["fake_ok"], ["fake"])
    for rec in run.results:
        st = rec["stages"]
        before = ("setup_s", "resolve_s", "inputs_s", "reference_s", "bind_s", "first_launch_s", "check_s")
        inside = ("warmup_s", "prepare_s", "sampling_s")
        after = ("record_s", "cleanup_s")
        assert all(st[k] >= 0 for k in (*before, *inside, *after, "measure_s", "item_s", "other_s")), st
        assert sum(st[k] for k in inside) <= st["measure_s"] + 1e-3
        assert st["measure_s"] > 0 and st["item_s"] >= st["measure_s"]
        named = sum(st[k] for k in (*before, *after)) + st["measure_s"]
        assert abs(named + st["other_s"] - st["item_s"]) < 1e-3


def test_crash_loses_only_its_case(tmp_path, registry):
    summary, run = _run(tmp_path, registry, ["fake_ok", "fake_crash", "fake_poison", "fake_raise"], ["fake"])
    status = {(r["kernel"], r["point"]["T"]): r for r in run.results}
    for t in DECODE_T:
        assert status[("fake_ok", t)]["status"] == "ok"
        crash = status[("fake_crash", t)]
        assert crash["status"] == "error" and "worker process died (exit code 77)" in crash["reason"]
        assert status[("fake_poison", t)]["status"] == "error"
        assert "illegal memory access" in status[("fake_poison", t)]["reason"]
        assert status[("fake_raise", t)]["reason"] == "ValueError: shape mismatch in fake kernel"
    assert summary.counts["ok"] == N and summary.counts["error"] == 3 * N
    assert len(run.results) == 4 * N


def test_missing_backend_is_not_available(tmp_path, registry):
    _summary, run = _run(tmp_path, registry, ["fake_raise"], ["missing"])
    assert all(r["status"] == "skipped" for r in run.results)
    assert run.results[0]["reason"].startswith("not available in this install: no_such_module_xyz:fn")


def test_results_written_as_they_finish(tmp_path, registry):
    """Each record is on disk (flushed) before the next case starts, so a killed sweep keeps them."""
    items, skips = plan_sweep(registry, default_shapes(), ["fake_ok", "fake_crash"], ["fake"], _opts())
    out = tmp_path / "r.jsonl"
    seen: list[int] = []

    def progress(item, status, fields):
        seen.append(len(out.read_text().splitlines()))

    run_sweep(items, skips, _opts(), out, progress=progress)
    assert seen == list(range(2, 2 + len(items)))  # environment line + one line per finished case


def test_resume_skips_finished_cases_and_retries_errors_when_told(tmp_path, registry, monkeypatch):
    from dskbench.frontends import cli

    monkeypatch.setattr(
        "dskbench.frontends.cli.common.registry_and_shapes", lambda: (registry, default_shapes())
    )
    out = tmp_path / "r.jsonl"
    args = ["run", "--device", "cpu", "--kernel", "fake_ok", "--kernel", "fake_raise", "--backend", "fake"]
    assert cli.main([*args, "--out", str(out), "--budget", "0.02"]) == cli.EXIT_FAIL  # fake_raise: errors
    first = read_runs([out])
    assert len(first) == 1 and len(first[0].results) == 2 * N_ALL
    assert cli.main([*args, "--out", str(out), "--budget", "0.02", "--resume"]) == 0
    assert read_runs([out])[1].results == []  # every case has a record; errors stand
    assert cli.main([*args, "--out", str(out), "--budget", "0.02", "--resume", "--retry-errors"]) == 1
    runs = read_runs([out])
    assert len(runs) == 3
    # fake_ok's cases were done; fake_raise's errors are retried
    assert sorted(r["kernel"] for r in runs[2].results) == ["fake_raise"] * N_ALL


def test_clean_up_between_cases_is_periodic_unless_a_case_failed(monkeypatch):
    import gc
    import itertools

    from dskbench.device.info import DeviceInfo
    from dskbench.execution import case as runner

    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(1))
    monkeypatch.setattr(runner, "_freed", itertools.count(1))
    cpu = DeviceInfo("cpu")
    for _ in range(runner._FREE_EVERY - 1):
        runner.free_memory(cpu)
    assert calls == []  # an ok case leaves nothing worth a full collection
    runner.free_memory(cpu)
    assert len(calls) == 1  # ...but every _FREE_EVERY-th item collects anyway
    runner.free_memory(cpu, force=True)
    assert len(calls) == 2  # an error or a wrong result always cleans up


@pytest.mark.parametrize("isolate", [True, False])
def test_ops_of_one_shape_are_measured_once_and_recorded_for_each(tmp_path, registry, isolate):
    registry["fake_ok"].op_names = ["input_layernorm", "post_attention_layernorm"]  # both [T, 7168]
    items, skips = plan_sweep(registry, default_shapes(), ["fake_ok", "fake_wrong"], ["fake"], _opts())
    assert len(items) == 2 * N + N
    out = tmp_path / "r.jsonl"
    seen = []
    summary = run_sweep(
        items, skips, _opts(isolate=isolate), out, progress=lambda it, st, f: seen.append(it.index)
    )
    (run,) = read_runs([out])
    assert sorted(r["index"] for r in run.results) == sorted(seen) == list(range(len(items)))  # every item
    assert run.environment["settings"]["copied_items"] == N
    ok = {(r["op"], r["point"]["T"]): r for r in run.results if r["kernel"] == "fake_ok"}
    for t in DECODE_T:
        first, twin = ok[("input_layernorm", t)], ok[("post_attention_layernorm", t)]
        assert "shared_with" not in first and twin["shared_with"] == first["case_id"]
        assert twin["case_id"].startswith("fake_ok/post_attention_layernorm/") and twin["status"] == "ok"
        assert twin["timing"] == first["timing"]  # one measurement, two records
    assert summary.counts["ok"] == 2 * N and summary.counts["wrong"] == N  # one op each: nothing to share
    again = run_sweep(items, skips, _opts(isolate=isolate, dedupe=False), tmp_path / "all.jsonl")
    (full,) = read_runs([tmp_path / "all.jsonl"])
    assert again.counts == summary.counts and not any("shared_with" in r for r in full.results)


@pytest.mark.parametrize("isolate", [True, False])
def test_a_run_whose_cases_run_in_workers_measures_the_ceilings_in_a_process_of_their_own(
    isolate, monkeypatch
):
    """Seen on an H100: the one-GPU run's parent measured the ceilings itself and so held a 1.01 GiB CUDA
    context on the GPU for the whole run. With workers, a probe process measures them; an in-process run
    (no workers) measures them itself; a probe that cannot run falls back to that."""
    from dskbench.execution import runner, shard

    probed: list[list[str]] = []

    def probe(tokens, kind, want):
        probed.append(list(tokens))
        return [{"ceilings": {"hbm_gbps": 1.0}}]

    monkeypatch.setattr(shard, "probe_gpus", probe)
    monkeypatch.setattr(runner, "timed_ceilings", lambda: {"hbm_gbps": 2.0})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    got = runner.ceilings_for_workers(isolate)
    assert got == ({"hbm_gbps": 1.0} if isolate else {"hbm_gbps": 2.0})
    assert probed == ([["3"]] if isolate else [])  # the first visible GPU, the one the workers use

    def broken(*_a):
        raise shard.ShardError("probing GPU 3 failed")

    monkeypatch.setattr(shard, "probe_gpus", broken)
    assert runner.ceilings_for_workers(True) == {"hbm_gbps": 2.0}
