"""Cases timed in batches: the worker protocol when a batch dies (its cases run again, each alone), the
fall-back to the per-case timer, and reading a batch's CUPTI activities back as spans (no GPU needed)."""

from __future__ import annotations

import collections
import math

import pytest

from dskbench.measure.batch_spans import MARKER, ChunkMismatch, device_activities, per_case, split_groups

EXTRA = "tests.fake_adapters,tests.fake_shard_adapters,tests.fake_batch"

F = f"void at::native::vectorized_elementwise_kernel<4, at::native::{MARKER}>>"  # a flush, as CUPTI names it


# -- spans from activities ------------------------------------------------------------------------------


def test_each_group_spans_its_own_activities_and_never_the_flush():
    acts = [
        (F, 0, 30_000),
        ("k1", 30_500, 32_000),
        (F, 33_000, 60_000),
        ("k2a", 60_400, 61_000),
        ("k2b", 61_200, 65_000),  # a case of two kernels: its internal gap is part of it
        ("Activity Buffer Request", 61_000, 61_100),  # the profiler's own: ignored
    ]
    g1, g2 = split_groups(acts, 2)
    assert g1.span_ns == 1_500 and g1.flush_ns == 30_000 and g1.activities == 1
    assert g2.span_ns == 4_600 and g2.activities == 2 and g2.flush_us == 27.0
    assert [a[0] for a in device_activities(acts)] == [F, "k1", F, "k2a", "k2b"]


def test_a_kernel_started_before_its_flush_ended_is_counted_from_the_flush_end():
    # programmatic dependent launch: the kernel's blocks start (and wait) while the flush drains
    (g,) = split_groups([(F, 0, 30_000), ("pdl", 29_800, 31_000)], 1)
    assert g.span_ns == 1_000 and g.early_ns == 200


def test_a_group_with_nothing_of_its_own_and_a_chunk_that_does_not_add_up():
    assert split_groups([(F, 0, 10), (F, 20, 30), ("k", 31, 40)], 2) == [
        None,
        split_groups([(F, 20, 30), ("k", 31, 40)], 1)[0],
    ]
    with pytest.raises(ChunkMismatch, match="1 flushes for 2 groups"):
        split_groups([(F, 0, 10), ("k", 11, 20)], 2)


def test_groups_go_back_to_the_cases_that_queued_them():
    acts = []
    t = 0
    for dur in (1, 5, 2, 6, 3):  # round 1: cases 0 and 1; round 2: 0 and 1; round 3: case 0 alone
        acts += [(F, t, t + 10), ("k", t + 11, t + 11 + dur)]
        t += 100
    spans = per_case(split_groups(acts, 5), [0, 1, 0, 1, 0], 2)
    assert [g.span_ns for g in spans[0]] == [1, 2, 3] and [g.span_ns for g in spans[1]] == [5, 6]
    with pytest.raises(ChunkMismatch):
        per_case(split_groups(acts, 5), [0, 1], 2)


# -- the engine ---------------------------------------------------------------------------------------


@pytest.fixture()
def fake_batches(monkeypatch):
    monkeypatch.setenv("DSKBENCH_EXTRA_ADAPTERS", EXTRA)
    monkeypatch.setenv("FAKE_BATCH", "1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    import tests.fake_batch  # noqa: F401 - registers fake_batch_crash in this process too


def _sweep(tmp_path, kernels):
    from dskbench.execution.items import SweepOptions
    from dskbench.execution.runner import plan_sweep, run_sweep
    from dskbench.results.io import read_runs
    from dskbench.shapes.cases import default_shapes
    from tests.test_shard import _entry

    opts = SweepOptions(
        device="cpu", phases=("decode",), profile="cpu", budget_s=0.02, measure_ceilings=False, seed=1
    )
    items, skips = plan_sweep({k: _entry(k) for k in kernels}, default_shapes(), kernels, ["fake"], opts)
    out = tmp_path / "r.jsonl"
    run_sweep(items, skips, opts, out)
    (run,) = read_runs([out])
    return items, run.results


def _batched(rec) -> bool:
    from tests.fake_batch import BATCH_NOTE

    return BATCH_NOTE in ((rec.get("timing") or {}).get("notes") or [])


def test_cases_are_timed_in_batches_and_each_is_recorded_once(tmp_path, fake_batches):
    items, recs = _sweep(tmp_path, ["fake_ok"])
    assert collections.Counter(r["case_id"] for r in recs) == collections.Counter(i.case_id for i in items)
    assert all(r["status"] == "ok" for r in recs) and all(_batched(r) for r in recs)


def test_a_batch_whose_worker_dies_is_run_again_case_by_case(tmp_path, fake_batches):
    # two cases a kernel, three a batch: [crash, crash, ok] dies; the last ok case is batched alone
    items, recs = _sweep(tmp_path, ["fake_batch_crash", "fake_ok"])
    keys = [(r["kernel"], r["case_id"]) for r in recs]
    assert sorted(keys) == sorted((i.kernel, i.case_id) for i in items)  # every case once, none lost
    assert all(r["status"] == "ok" for r in recs)  # the kernel is fine alone: no case is blamed
    crash = [r for r in recs if r["kernel"] == "fake_batch_crash"]
    assert crash and not any(_batched(r) for r in crash)
    assert any(_batched(r) for r in recs if r["kernel"] == "fake_ok")  # batches without it still ran


def test_a_poisoning_error_while_cases_are_held_loses_none_of_them(tmp_path, fake_batches):
    items, recs = _sweep(tmp_path, ["fake_ok", "fake_poison"])
    by_kernel = collections.defaultdict(list)
    for r in recs:
        by_kernel[r["kernel"]].append(r)
    assert len(recs) == len(items)
    assert all(r["status"] == "ok" for r in by_kernel["fake_ok"])
    assert all(
        r["status"] == "error" and "illegal memory access" in r["reason"] for r in by_kernel["fake_poison"]
    )


def test_a_case_out_of_memory_beside_held_cases_runs_again_once_they_are_timed(tmp_path, fake_batches):
    """The worker holds prepared cases for a batch; a case that then runs out of memory has the held ones
    timed and freed first, and runs again, timed alone: every case recorded once, all ok, the second run
    said so."""
    items, recs = _sweep(tmp_path, ["fake_ok", "fake_oom_once"])
    assert collections.Counter(r["case_id"] for r in recs) == collections.Counter(i.case_id for i in items)
    assert all(r["status"] == "ok" for r in recs)
    (again,) = [r for r in recs if r.get("retried")]
    assert again["kernel"] == "fake_oom_once" and "beside held cases" in again["retried"]


# -- falling back to the per-case timer ------------------------------------------------------------------


def test_an_impossible_or_missing_batch_measurement_is_timed_alone(monkeypatch):
    from dskbench.device.info import DeviceInfo
    from dskbench.execution import batching
    from dskbench.execution.case import prepare_item
    from dskbench.execution.items import SweepOptions
    from dskbench.execution.runner import plan_sweep
    from dskbench.measure.settings import Measurement
    from dskbench.shapes.cases import default_shapes
    from tests.test_shard import _entry

    monkeypatch.setenv("DSKBENCH_EXTRA_ADAPTERS", EXTRA)
    import tests.fake_adapters  # noqa: F401

    opts = SweepOptions(
        device="cpu", phases=("decode",), profile="cpu", budget_s=0.02, measure_ceilings=False
    )
    items, _ = plan_sweep({"fake_ok": _entry("fake_ok")}, default_shapes(), ["fake_ok"], ["fake"], opts)
    cpu = DeviceInfo("cpu")
    monkeypatch.setattr(batching, "eligible", lambda o, p: True)
    bad = Measurement(
        median_us=0.0,
        p10_us=0.0,
        p90_us=0.0,
        mean_us=0.0,
        min_us=0.0,
        max_us=0.0,
        cv=math.inf,
        noise=math.inf,
        n_samples=50,
        launches_per_sample=1,
        converged=False,
        wall_s=0.1,
        method="cupti-graph",
        mode="cold",
        device="cuda:0",
        n_sets=1,
    )
    monkeypatch.setattr(batching, "timed_together", lambda entries, s: [bad, "graph capture failed: no"])
    alone = []

    def time_prepared(base, prep, device, o, ceilings):
        alone.append(prep.case.id)
        return {**base, "status": "ok", "timing": {"median_us": 1.0, "n_samples": 3, "notes": []}}

    monkeypatch.setattr(batching, "time_prepared", time_prepared)
    b = batching.Batcher(cpu, opts, None)
    for it in items[:2]:
        base, prep = prepare_item(it, cpu, opts, 1)
        assert b.offer(it, base, prep, 0.01)
    got = []
    b.time_all(lambda item, fields: got.append(fields))
    assert alone == [items[0].case_id, items[1].case_id] and not b.held
    notes = [n for f in got for n in f["timing"]["notes"]]
    assert any("impossible" in n for n in notes) and any("graph capture failed" in n for n in notes)


def test_a_batch_begun_beside_another_process_flags_every_case_it_timed(monkeypatch):
    from dskbench.device.info import DeviceInfo
    from dskbench.execution import batching, shared_gpu
    from dskbench.execution.case import prepare_item
    from dskbench.execution.items import SweepOptions
    from dskbench.execution.runner import plan_sweep
    from dskbench.measure import measure
    from dskbench.shapes.cases import default_shapes
    from tests.test_shard import _entry

    monkeypatch.setenv("DSKBENCH_EXTRA_ADAPTERS", EXTRA)
    import tests.fake_adapters  # noqa: F401

    opts = SweepOptions(
        device="cpu", phases=("decode",), profile="cpu", budget_s=0.02, measure_ceilings=False
    )
    items, _ = plan_sweep({"fake_ok": _entry("fake_ok")}, default_shapes(), ["fake_ok"], ["fake"], opts)
    monkeypatch.setattr(batching, "eligible", lambda o, p: True)
    monkeypatch.setattr(
        batching, "timed_together", lambda entries, s: [measure(f, device="cpu", settings=s) for f in entries]
    )
    asked = []

    def sharing(device, fresh=False):
        asked.append(fresh)
        return {"shared_gpu": {"pids": [4242], "names": ["python3"]}} if fresh else {}

    monkeypatch.setattr(shared_gpu, "record_fields", sharing)
    cpu = DeviceInfo("cpu")
    b = batching.Batcher(cpu, opts, None)
    for it in items[:2]:
        base, prep = prepare_item(it, cpu, opts, 1)
        b.offer(it, base, prep, 0.01)
    got = []
    b.time_all(lambda item, fields: got.append(fields))
    assert asked[0] is True  # asked afresh as the batch began, not from a cache
    assert [f["shared_gpu"]["pids"] for f in got] == [[4242], [4242]]


def test_a_batch_is_timed_with_the_runs_calibrated_gap(monkeypatch):
    """The batched timer subtracts its own launch gap, calibrated once per run like the event timers'."""
    from dskbench.device.info import DeviceInfo
    from dskbench.execution import batching
    from dskbench.execution.items import SweepOptions

    opts = SweepOptions(device="cuda", phases=("decode",), profile="full")
    ceilings = {"launch_gap": {"cold_us": 0.4, "batch_cold_us": 0.37, "hot_us": 0.3}}
    s = batching.Batcher(DeviceInfo("cuda", "GPU", 90, 1), opts, ceilings).settings()
    assert s.launch_gap_us == {"cold": 0.4, "batch_cold": 0.37}
    assert batching.Batcher(DeviceInfo("cuda", "GPU", 90, 1), opts, None).settings().launch_gap_us is None
