"""`dskbench warm`: one item per (kernel, backend, variant) prepared in parallel worker processes,
nothing timed; crashes and wrong results reported per item. Run on the CPU with the fake kernels."""

from __future__ import annotations

import json
import os

import pytest

EXTRA = "tests.fake_adapters,tests.fake_shard_adapters"
os.environ.setdefault("DSKBENCH_EXTRA_ADAPTERS", EXTRA)

import tests.fake_adapters  # noqa: E402,F401 - registers the fakes here whatever the variable held
import tests.fake_shard_adapters  # noqa: E402,F401
from dskbench.device.info import DeviceInfo  # noqa: E402
from dskbench.execution import warm  # noqa: E402
from dskbench.execution.build_memory import BuildMemory  # noqa: E402
from dskbench.execution.build_times import WarmError, read_build_times  # noqa: E402
from dskbench.execution.runner import SweepOptions, WorkItem, execute_item, plan_sweep  # noqa: E402
from dskbench.frontends import cli  # noqa: E402
from dskbench.shapes.cases import default_shapes  # noqa: E402
from tests.test_shard import _entry, _item  # noqa: E402


def test_one_item_per_kernel_backend_variant_first_in_plan_order():
    items = [_item(0, "k", 1, "a"), _item(1, "k", 1, "b"), _item(2, "k", 8, "a"), _item(3, "j", 8, "a")]
    fp8 = WorkItem(4, "k", "a", {**items[2].case, "variant": "fp8"}, "test")
    picked = warm.warm_items([*items, fp8], per_shape=lambda k, b: False)
    assert [it.index for it in picked] == [0, 1, 3, 4]


def test_a_build_whose_first_case_its_backend_skips_takes_the_next_one():
    # FlashInfer's merge_state rejects 128 heads (tp 1) and builds at 32 (tp 4): its tp-1 item would
    # build nothing, and the sweep's first tp-4 case would then compile in the measuring process
    items = [_item(0, "k", 1, "a"), _item(1, "k", 1, "b"), _item(2, "k", 8, "a"), _item(3, "k", 8, "b")]
    picked = warm.warm_items(items, per_shape=lambda k, b: False, skipped=lambda it: it.index == 1)
    assert [(it.index, it.backend, it.checked) for it in picked] == [(0, "a", True), (3, "b", True)]
    everything = warm.warm_items(items, per_shape=lambda k, b: False, skipped=lambda it: True)
    assert [it.index for it in everything] == [0, 1]  # all skipped: the first stays, to record why
    assert warm.skipped_by_case(items[0]) is False  # no adapter of that name: nothing skips it


def test_a_backend_that_compiles_per_shape_is_warmed_at_every_shape():
    items = [_item(0, "k", 1, "a"), _item(1, "k", 1, "b"), _item(2, "k", 8, "a"), _item(3, "k", 8, "b")]
    twin = WorkItem(4, "k", "b", dict(items[3].case), "test")  # same shape again: one build
    picked = warm.warm_items([*items, twin], per_shape=lambda k, b: b == "b")
    assert [it.index for it in picked] == [0, 1, 3]  # "a" once; "b" at T=1 and at T=8
    assert [it.checked for it in picked] == [True, True, False]  # b's later shape: built, not checked
    assert warm.builds_per_shape("fake_ok", "fake") is False  # the fakes are torch: one build


def test_a_jit_that_compiles_per_shape_says_so_and_is_warmed_per_shape():
    # FlashInfer's and sglang's DeepGEMM compile a kernel per GEMM shape at first launch: a "jit" kind,
    # flagged, where the rest of that kernel's JIT backends build once per op
    assert warm.builds_per_shape("fp8_blockwise_scaled_mm", "flashinfer") is True
    assert warm.builds_per_shape("fp8_blockwise_scaled_mm", "deep_gemm") is True
    assert warm.builds_per_shape("fp8_blockwise_scaled_mm", "sglang_triton") is True  # by its kind
    assert warm.builds_per_shape("fp8_blockwise_scaled_mm", "sgl_kernel") is False
    assert warm.builds_per_shape("rmsnorm", "sglang_jit") is False  # a JIT module per op
    # FlashInfer's fused MoE: its block-FP8 grouped GEMMs are DeepGEMM's too; its BF16 path is the module alone
    assert warm.builds_per_shape("cutlass_fused_moe", "flashinfer.fp8_block") is True
    assert warm.builds_per_shape("cutlass_fused_moe", "flashinfer.bf16") is False


def test_an_unchecked_item_is_launched_without_its_reference(monkeypatch):
    """A warm-up's later shape: inputs, bind and one launch; no reference computed, no check."""
    import dataclasses

    from dskbench.adapters import get_adapter
    from dskbench.execution import case as case_mod
    from dskbench.execution.reference_cache import REFERENCES

    plan_opts = SweepOptions(device="cpu", phases=("decode",), profile="cpu")
    item = plan_sweep({"fake_ok": _entry("fake_ok")}, default_shapes(), ["fake_ok"], ["fake"], plan_opts)[0][
        0
    ]
    adapter = get_adapter("fake_ok")
    monkeypatch.setattr(case_mod, "get_adapter", lambda name: adapter)
    monkeypatch.setattr(adapter, "reference", lambda inputs, case: pytest.fail("reference computed"))
    REFERENCES.clear()
    opts = SweepOptions(device="cpu", profile="cpu", warm_only=True, measure_ceilings=False)
    fields = execute_item(dataclasses.replace(item, checked=False), DeviceInfo("cpu"), opts, 0, None)
    assert fields["status"] == "ok" and "check" not in fields and "reference_s" not in fields["stages"]
    assert fields["stages"]["first_launch_s"] >= 0


def test_default_jobs_is_half_the_cores_within_memory():
    gib = 2**30
    assert warm.default_jobs(1, 512 * gib) == 1
    assert warm.default_jobs(2, 512 * gib) == 1
    assert warm.default_jobs(16, 128 * gib) == 8
    assert warm.default_jobs(64, 512 * gib) == 32  # no fixed cap: a big host runs more builds
    assert warm.default_jobs(64, 48 * gib) == 8  # ...unless its memory holds fewer
    assert warm.default_jobs(16, 2 * gib) == 1


def test_cores_are_those_this_process_may_run_on(monkeypatch):
    """A job queue or taskset that grants 4 cores of a 64-core host: warm sizes its jobs by the 4."""
    import os

    from dskbench.device import info

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert info.usable_cores() == 4
    assert warm.default_jobs(None, 512 * 2**30) == 2


def test_the_longest_builds_of_an_earlier_warm_start_first(tmp_path):
    groups = [[_item(0, "short", 1, "a")], [_item(1, "marlin", 1, "a")], [_item(2, "new", 1, "a")]]
    (tmp_path / "w.json").write_text(
        json.dumps(
            {
                "results": [
                    {"kernel": "marlin", "backend": "a", "first_launch_s": 420.0},
                    # a wrapper that builds in bind: its build seconds, not its first launch, order it
                    {"kernel": "short", "backend": "a", "first_launch_s": 3.0, "build_s": 900.0},
                    {"kernel": "short", "backend": "a", "first_launch_s": 3.0},
                ]
            }
        )
    )
    build_s = read_build_times(tmp_path / "w.json")
    assert build_s == {("marlin", "a"): 420.0, ("short", "a"): 900.0}
    assert [g[0].kernel for g in warm.longest_first(groups, build_s)] == ["short", "marlin", "new"]
    (tmp_path / "bad.json").write_text("[]")
    try:
        read_build_times(tmp_path / "bad.json")
    except WarmError as e:
        assert str(e).startswith(f"{tmp_path / 'bad.json'}: not a `dskbench warm --out` file")
    else:
        raise AssertionError("a file without results was read")


def test_warm_only_prepares_and_checks_but_times_nothing():
    plan_opts = SweepOptions(device="cpu", phases=("decode",), profile="cpu")
    item = plan_sweep({"fake_ok": _entry("fake_ok")}, default_shapes(), ["fake_ok"], ["fake"], plan_opts)[0][
        0
    ]
    opts = SweepOptions(device="cpu", profile="cpu", warm_only=True, measure_ceilings=False)
    fields = execute_item(item, DeviceInfo("cpu"), opts, 0, None)
    assert fields["status"] == "ok"
    assert "timing" not in fields and "measure_s" not in fields["stages"]
    assert fields["stages"]["first_launch_s"] >= 0 and fields["check"]["error"] == 0


def test_parallel_warm_reports_every_build_and_survives_a_crash(monkeypatch, tmp_path):
    monkeypatch.setenv("DSKBENCH_EXTRA_ADAPTERS", EXTRA)
    kernels = ["fake_ok", "fake_wrong", "fake_crash", "fake_env"]
    registry = {k: _entry(k) for k in kernels}
    opts = SweepOptions(device="cpu", phases=("decode",), profile="cpu", seed=0, measure_ceilings=False)
    items, _ = plan_sweep(registry, default_shapes(), kernels, ["fake"], opts)
    assert len(items) > len(kernels)  # several cases each: warm takes one
    seen = []
    caches = {"triton": tmp_path / "triton"}
    caches["triton"].mkdir()
    (caches["triton"] / "k.cubin").write_bytes(b"x")
    memory = BuildMemory(tmp_path / "builds.json", caches)
    results = warm.run_warm(items, opts, jobs=3, gpu_tokens=["4", "5"], progress=seen.append, memory=memory)
    assert [r.kernel for r in results] == kernels  # plan order, one each
    # what built is remembered for a later run's builders; the wrong and the crashed are not
    remembered = BuildMemory(tmp_path / "builds.json", caches).keys
    assert {k.split(" · ")[0] for k in remembered} == {"fake_ok", "fake_env"}
    assert len(seen) == len(kernels)
    by = {r.kernel: r for r in results}
    assert by["fake_ok"].status == "ok" and by["fake_ok"].first_launch_s is not None
    assert by["fake_wrong"].status == "wrong" and "relative error" in by["fake_wrong"].reason
    assert (
        by["fake_crash"].status == "error" and "worker process died (exit code 77)" in by["fake_crash"].reason
    )
    assert by["fake_crash"].first_launch_s is None
    assert by["fake_env"].status == "ok"


def test_cli_warm_writes_json_and_rejects_bad_input(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("DSKBENCH_EXTRA_ADAPTERS", EXTRA)
    out = tmp_path / "warm.json"
    assert cli.main(["warm", "--device", "cpu", "--kernel", "rmsnorm", "--jobs", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["results"] and all(r["kernel"] == "rmsnorm" for r in doc["results"])
    assert doc["environment"]["device"]["kind"] == "cpu" and "torch" in doc["environment"]["versions"]
    assert {r["backend"] for r in doc["results"]} == {"torch-ref"}  # a CPU can run the reference only
    assert all(r["status"] == "ok" for r in doc["results"])
    assert "warmed" in capsys.readouterr().out
    assert cli.main(["warm", "--device", "cpu", "--kernel", "no_such_kernel"]) == cli.EXIT_USAGE
    assert "unknown kernel" in capsys.readouterr().err
    assert cli.main(["warm", "--device", "cpu", "--jobs", "0"]) == cli.EXIT_USAGE
    assert cli.main(["warm", "--device", "cpu", "--gpus", "2"]) == cli.EXIT_USAGE
    assert "no CUDA GPU" in capsys.readouterr().err


def test_warm_quick_builds_for_the_quick_profile_and_the_plan_shrinks():
    """The main job times `run --quick`: its warm-up builds for those shapes, not the full profile's."""
    from dskbench.execution.items import SweepOptions
    from dskbench.execution.runner import plan_sweep
    from dskbench.frontends.cli.common import registry_and_shapes
    from dskbench.frontends.cli.warm import warm_profile

    assert warm_profile("cuda", True) == "quick" and warm_profile("cuda", False) == "full"
    assert warm_profile("cpu", True) == "cpu"
    reg, shapes = registry_and_shapes()
    per_shape = lambda k, b: b == "sglang_triton"  # noqa: E731 - Triton compiles per shape
    sizes = {}
    for profile in ("quick", "full"):
        items, _ = plan_sweep(dict(reg), shapes, ["fp8_scaled_mm"], None, SweepOptions(profile=profile))
        sizes[profile] = len(warm.warm_items(items, per_shape=per_shape))
    assert 0 < sizes["quick"] < sizes["full"] / 2


def test_flashinfer_merge_state_is_built_at_a_head_count_it_takes():
    from dskbench.frontends.cli.common import registry_and_shapes

    reg, shapes = registry_and_shapes()
    opts = SweepOptions(device="cuda", phases=("prefill",), profile="full", tp=(1, 4, 8))
    items, _ = plan_sweep(dict(reg), shapes, ["merge_state"], ["flashinfer"], opts)
    assert warm.skipped_by_case(items[0])  # tp 1: 128 heads in one block, rejected
    picked = warm.warm_items(items)
    assert len(picked) == 1 and not warm.skipped_by_case(picked[0])
    assert picked[0].case["point"]["tp"] in (4, 8)


def test_a_kernel_with_many_shapes_is_built_by_several_processes_its_module_first():
    """40 per-shape builds of one kernel become three units; the one holding the module's first build
    starts first, the other pieces after every longer build, before the short ones."""
    shapes = [_item(i, "tri", 1 + i, "triton") for i in range(40)]
    other = [_item(40, "marlin", 1, "a"), _item(41, "small", 1, "a")]
    units = warm.build_units(shapes + other, size=16)
    assert [len(u) for u in units] == [16, 16, 8, 1, 1]
    build_s = {("tri", "triton"): 100.0, ("marlin", "a"): 400.0, ("small", "a"): 5.0}
    order = warm.longest_first(units, build_s)
    assert [(u[0].kernel, len(u)) for u in order] == [
        ("marlin", 1),
        ("tri", 16),  # 100 s + 15 more shapes
        ("tri", 16),  # 16 shapes at PER_SHAPE_S
        ("tri", 8),
        ("small", 1),
    ]
    assert warm.jobs_for(shapes + other, 64) <= len(units)


def test_a_unit_expected_to_build_long_runs_less_nice_than_the_other_builders():
    marlin = [_item(0, "marlin", 1, "a"), _item(1, "marlin", 8, "a")]
    short = [_item(2, "short", 1, "a")]
    extra = warm.critical_plan([marlin, short], {("marlin", "a"): 800.0, ("short", "a"): 30.0})
    assert extra(marlin) == {"nice": warm.CRITICAL_NICE} == extra(marlin[1:])  # found by any of its items
    assert extra(short) == {} and extra([]) == {}
    assert 0 < warm.CRITICAL_NICE < warm.BUILD_NICE  # nicer than the measuring worker, less than builders


def test_the_pool_gives_a_units_plan_keys_to_its_worker(monkeypatch):
    from dskbench.execution import pool as pool_mod
    from dskbench.execution.limits import CaseLimits

    plans = []

    class Recorder:
        def __init__(self, plan, local, *args, **kwargs):
            plans.append(plan)

        def run(self, todo, solo):
            return [], set()

    monkeypatch.setattr(pool_mod, "WorkerProcess", Recorder)
    units = [[_item(0, "long", 1)], [_item(1, "short", 1)]]
    p = pool_mod.Pool(
        [pool_mod.Slot("build 0", {"nice": warm.BUILD_NICE, "threads": 2})],
        lambda *_: None,
        CaseLimits(flat_s=0.0),
        shared=units,
        unit_plan=lambda unit: {"nice": 5} if unit[0].kernel == "long" else {},
    )
    p.run()
    assert [(pl["nice"], pl["threads"], len(pl["items"])) for pl in plans] == [
        (5, 2, 1),
        (warm.BUILD_NICE, 2, 1),
    ]


def test_builds_the_device_skips_are_cut_to_one_per_backend_which_says_why():
    kernels = ["fake_ok"]
    opts = SweepOptions(device="cpu", phases=("decode",), profile="cpu", seed=0, measure_ceilings=False)
    items, _ = plan_sweep({k: _entry(k) for k in kernels}, default_shapes(), kernels, ["fake", "b200"], opts)
    per_shape = lambda k, b: True  # noqa: E731 - a build per shape: many keys per backend
    every = warm.warm_items(items, per_shape)
    assert sum(it.backend == "b200" for it in every) > 1
    cut = warm.warm_plan(items, DeviceInfo("cpu"), per_shape)
    assert [it.backend for it in cut].count("b200") == 1  # needs sm100: one item records why
    assert [it for it in cut if it.backend == "fake"] == [it for it in every if it.backend == "fake"]
    assert warm.warm_plan(items, None, per_shape) == every
    results = warm.run_warm(items, opts, jobs=1, device=DeviceInfo("cpu"))
    b200 = [r for r in results if r.backend == "b200"]
    assert len(b200) == 1 and b200[0].status == "skipped" and "sm100" in b200[0].reason


def test_cheap_neighbouring_units_share_a_process_and_a_long_build_keeps_its_own():
    a = [_item(0, "a", 1), _item(1, "a", 8)]
    b = [_item(2, "b", 1)]
    marlin = [_item(3, "marlin", 1)]
    c = [_item(4, "c", 1), _item(5, "c", 8)]
    full = [_item(6 + i, "tri", 1 + i) for i in range(warm.UNIT_ITEMS)]  # a per-shape unit, full already
    d = [_item(40, "d", 1)]
    units = [a, b, marlin, c, full, d]
    out = warm.packed(units, {("marlin", "a"): 600.0})
    assert [[it.index for it in u] for u in out] == [[0, 1, 2], [3], [4, 5], [it.index for it in full], [40]]
    assert [it for u in out for it in u] == [it for u in units for it in u]  # plan order kept
    assert warm.packed(units, {}, size=3)[0] == [*a, *b]


def test_a_build_out_of_memory_beside_the_others_is_built_again_at_the_end_alone(monkeypatch):
    """Seen on an H100 with 14 builds sharing the GPU: three ran out of memory twice while the others
    held theirs, and the sweep's builder then built them beside the measuring. Once the pool is done,
    such a build runs again in a pool of one, with the GPU to itself; other failures are not retried."""
    from tests.test_shard import _item

    items = [_item(0, "k_big", 1), _item(1, "k_ok", 1), _item(2, "k_wrong", 1)]
    pools: list[tuple[int, list[str]]] = []
    oom = "out of memory: OutOfMemoryError: CUDA out of memory. Tried to allocate 14.00 GiB."

    def pool(todo, _opts, jobs, record, *_rest):
        pools.append((jobs, [it.kernel for it in todo]))
        first = len(pools) == 1

        def run() -> None:
            for it in todo:
                bad = {
                    "k_big": {"status": "error", "reason": oom},
                    "k_wrong": {"status": "wrong", "reason": "x"},
                }
                record(it, bad.get(it.kernel, {"status": "ok"}) if first else {"status": "ok"})

        return type("P", (), {"run": staticmethod(run)})()

    monkeypatch.setattr(warm, "warm_pool", pool)
    got = warm.run_warm(items, SweepOptions(device="cpu"), jobs=3)
    assert pools == [(3, ["k_big", "k_ok", "k_wrong"]), (1, ["k_big"])]
    assert [r.status for r in got] == ["ok", "ok", "wrong"]
    pools.clear()
    warm.run_warm(items, SweepOptions(device="cpu"), jobs=1)  # alone already: no second pass
    assert pools == [(1, ["k_big", "k_ok", "k_wrong"])]
