"""Sharding a sweep over the GPUs of one host (dskbench/execution/shard.py), on the CPU: the cut (balance,
determinism), and a whole sharded sweep in which DeviceInfo claims three GPUs and the fake CPU kernels
run one worker process per "GPU", each started with its own CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import os
import random

import pytest

EXTRA = "tests.fake_adapters,tests.fake_shard_adapters"
os.environ.setdefault("DSKBENCH_EXTRA_ADAPTERS", EXTRA)

import tests.fake_adapters  # noqa: E402,F401 - registers the fakes here whatever the variable held
import tests.fake_shard_adapters  # noqa: E402,F401
from dskbench.device.info import DeviceInfo  # noqa: E402
from dskbench.execution import cost as cost_model  # noqa: E402
from dskbench.execution import shard  # noqa: E402
from dskbench.execution.runner import SweepOptions, WorkItem, plan_sweep, run_sweep  # noqa: E402
from dskbench.frontends import cli  # noqa: E402
from dskbench.results.io import read_runs  # noqa: E402
from dskbench.shapes.cases import default_shapes  # noqa: E402
from tests.fake_adapters import registry_entry as _entry  # noqa: E402

DECODE_T = default_shapes().values("decode_tokens", "cpu")
N = len(DECODE_T)


def _item(index: int, kernel: str, t: int, backend: str = "a") -> WorkItem:
    case = {
        "kernel": kernel,
        "op": "input_layernorm",
        "variant": None,
        "phase": "decode",
        "point": {"T": t},
        "dims": {"T": t, "D": 7168},
    }
    return WorkItem(index, kernel, backend, case, "test")


def _plan(spec: dict[str, int]) -> list[WorkItem]:
    """spec: kernel -> number of cases; two backends per case."""
    items: list[WorkItem] = []
    for kernel, n_cases in spec.items():
        for t in range(1, n_cases + 1):
            for b in ("a", "b"):
                items.append(_item(len(items), kernel, 2**t, b))
    return items


def _cost(it: WorkItem) -> float:
    return 0.5 + it.case["point"]["T"] / 64 + (0.3 if it.backend == "a" else 0.0)


def _where(shards: list[list[WorkItem]]) -> dict[int, int]:
    return {it.index: g for g, s in enumerate(shards) for it in s}


def test_every_item_once_in_plan_order_and_balanced():
    items = _plan({f"k{i}": 1 + (i * 7) % 5 for i in range(11)})
    shards, loads = shard.shard_items(items, 3, _cost)
    assert sorted(it.index for s in shards for it in s) == [it.index for it in items]
    for s in shards:
        assert [it.index for it in s] == sorted(it.index for it in s)  # a kernel's cases stay in order
    units = shard.make_units(items, _cost, 3)
    assert max(loads) - min(loads) <= max(u.cost for u in units) + 1e-9  # the LPT bound
    assert sum(loads) == pytest.approx(sum(u.cost for u in units), abs=1e-2)
    # no kernel here is over a third of the work: each runs wholly on one GPU, backends and all
    where = _where(shards)
    for k in {it.kernel for it in items}:
        assert len({where[it.index] for it in items if it.kernel == k}) == 1, k


def test_the_cut_is_deterministic_whatever_the_plan_order():
    items = _plan({f"k{i}": 1 + (i * 3) % 4 for i in range(9)})
    first = _where(shard.shard_items(items, 4, _cost)[0])
    shuffled = items[:]
    random.Random(7).shuffle(shuffled)
    assert _where(shard.shard_items(shuffled, 4, _cost)[0]) == first
    assert _where(shard.shard_items(items, 4, _cost)[0]) == first


def test_a_kernel_over_its_share_is_cut_by_case_keeping_backends_together():
    items = _plan({"big": 12, "s1": 1, "s2": 1})  # fewer kernels than GPUs would leave GPUs idle
    shards, loads = shard.shard_items(items, 4, _cost)
    where = _where(shards)
    big = [it for it in items if it.kernel == "big"]
    assert len({where[it.index] for it in big}) >= 3  # spread over the GPUs
    for t in {it.case["point"]["T"] for it in big}:  # both backends of a case on one GPU
        assert len({where[it.index] for it in big if it.case["point"]["T"] == t}) == 1
    assert all(load > 0 for load in loads)


def test_gpus_requests_and_worker_environment():
    assert shard.parse_gpus("all", 8) == 8 and shard.parse_gpus("2", 8) == 2
    for bad, match in (("9", "shows 8"), ("0", "shows 8"), ("x", "'all' or a number")):
        with pytest.raises(shard.ShardError, match=match):
            shard.parse_gpus(bad, 8)
    with pytest.raises(shard.ShardError, match="no CUDA GPU"):
        shard.parse_gpus("all", 0)
    assert shard.visible_gpus(3, {}) == ["0", "1", "2"]
    assert shard.visible_gpus(2, {"CUDA_VISIBLE_DEVICES": "4, GPU-ab12,6"}) == ["4", "GPU-ab12"]
    with pytest.raises(shard.ShardError, match="names 1"):
        shard.visible_gpus(2, {"CUDA_VISIBLE_DEVICES": "3"})
    host = {"PATH": "/bin", "NCCL_NVLS_ENABLE": "1"}
    env = shard.worker_env("5", host)  # multicast as the host has it (here: NVLS explicitly on)
    assert env == {"PATH": "/bin", "NCCL_NVLS_ENABLE": "1", "CUDA_VISIBLE_DEVICES": "5"}
    env = shard.worker_env("5", host, no_multicast=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "5" and env["PATH"] == "/bin"
    assert {k: env[k] for k in shard.NO_MULTICAST_ENV} == {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }
    assert host == {"PATH": "/bin", "NCCL_NVLS_ENABLE": "1"}  # the caller's mapping is left as it was


def test_cost_model_skips_cost_nothing():
    h200 = DeviceInfo("cuda", "NVIDIA H200", 90, 8)
    t16 = _item(0, "fake_ok", 16)
    run = cost_model.item_cost(WorkItem(0, "fake_ok", "fake", t16.case), h200, 1.5)
    assert (
        run >= cost_model.CASE_OVERHEAD_S + cost_model.TYPICAL_SAMPLING_S
    )  # sampling: typical, not the budget
    assert (
        cost_model.item_cost(
            WorkItem(0, "fake_ok", "fake", t16.case), h200, cost_model.TYPICAL_SAMPLING_S / 2
        )
        < run
    )  # a budget below the typical sampling time
    assert cost_model.item_cost(WorkItem(1, "fake_ok", "b200", t16.case), h200, 1.5) == cost_model.SKIP_COST_S
    assert (
        cost_model.item_cost(WorkItem(2, "no_such_kernel", "x", t16.case), h200, 1.5)
        == cost_model.SKIP_COST_S
    )
    t512 = _item(3, "fake_ok", 512).case
    assert (
        cost_model.item_cost(WorkItem(3, "fake_ok", "fake", t512), h200, 1.5) > run
    )  # more bytes, more time


def test_gpus_of_different_models_are_refused():
    same = [{"device": {"name": "NVIDIA H200", "sm": 90, "memory_gib": 139.8}}] * 2
    shard.check_same_model(same, ["0", "1"])
    mixed = [*same[:1], {"device": {"name": "NVIDIA H100 80GB HBM3", "sm": 90, "memory_gib": 79.1}}]
    with pytest.raises(shard.ShardError, match="the GPUs differ"):
        shard.check_same_model(mixed, ["0", "1"])


def test_cli_gpus_needs_gpus(capsys):
    assert cli.main(["run", "--device", "cpu", "--gpus", "2"]) == cli.EXIT_USAGE
    assert "no CUDA GPU" in capsys.readouterr().err
    assert cli.main(["run", "--device", "cpu", "--gpus", "2", "--no-isolate"]) == cli.EXIT_USAGE
    assert "cannot be --no-isolate" in capsys.readouterr().err


def _fake_host(monkeypatch, visible: str) -> None:
    """A host whose CUDA_VISIBLE_DEVICES lists these fake GPUs; workers run the fake adapters."""
    real = DeviceInfo.detect.__func__
    count = len(visible.split(","))

    def detect(cls, want: str = "cuda") -> DeviceInfo:
        return DeviceInfo("cuda", "Fake GPU", 90, count) if want == "cuda" else real(cls, want)

    monkeypatch.setattr(DeviceInfo, "detect", classmethod(detect))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setenv("DSKBENCH_EXTRA_ADAPTERS", EXTRA)


def test_sharded_sweep_runs_each_case_once_on_its_gpu(tmp_path, monkeypatch):
    kernels = ["fake_ok", "fake_wrong", "fake_crash", "fake_env"]
    registry = {k: _entry(k) for k in kernels}
    _fake_host(monkeypatch, "5,6,7")
    for k in shard.NO_MULTICAST_ENV:
        monkeypatch.delenv(k, raising=False)
    opts = SweepOptions(
        device="cpu",
        phases=("decode",),
        profile="cpu",
        budget_s=0.02,
        measure_ceilings=False,
        seed=1,
        gpus=3,
        no_multicast=True,
    )
    items, skips = plan_sweep(registry, default_shapes(), kernels, ["fake"], opts)
    assert len(items) == 4 * N
    out = tmp_path / "r.jsonl"
    seen: list[int] = []
    summary = run_sweep(
        items, skips, opts, out, progress=lambda item, status, fields: seen.append(item.index)
    )

    (run,) = read_runs([out])
    recs = run.results
    assert sorted(r["index"] for r in recs) == list(range(len(items))) == sorted(seen)  # each case once
    env = run.environment
    assert env["device"]["count"] == 3
    assert [g["cuda_visible_devices"] for g in env["gpus"]] == ["5", "6", "7"]  # what each probe saw
    assert [g["index"] for g in env["gpus"]] == [0, 1, 2]
    assert sum(env["settings"]["shards"]) == len(items)
    assert env["settings"]["no_multicast"] is True
    assert env["multicast"] == {"off": True, "env": shard.NO_MULTICAST_ENV}
    gpu = {k: {r["gpu_index"] for r in recs if r["kernel"] == k} for k in kernels}
    assert all(len(gpu[k]) == 1 for k in kernels)  # a kernel wholly on one GPU
    assert {g for k in kernels for g in gpu[k]} == {0, 1, 2}  # four kernels, three GPUs: all used
    assert [k for k in kernels if k != "fake_crash" and gpu[k] == gpu["fake_crash"]]  # it shared its GPU
    for r in recs:
        k, g = r["kernel"], r["gpu_index"]
        if k == "fake_env":  # the worker saw its GPU alone, and no multicast (--no-multicast)
            assert r["status"] == "ok"
            assert r["check"]["detail"] == (
                f"CUDA_VISIBLE_DEVICES={env['gpus'][g]['cuda_visible_devices']} "
                "NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1"
            )
        elif k == "fake_crash":  # a dead worker loses its case only
            assert r["status"] == "error" and "worker process died (exit code 77)" in r["reason"]
        else:
            assert r["status"] == {"fake_ok": "ok", "fake_wrong": "wrong"}[k]
    assert summary.counts["ok"] == 2 * N and summary.counts["wrong"] == N and summary.counts["error"] == N


@pytest.mark.parametrize("no_multicast", [False, True])
def test_one_gpu_workers_get_multicast_off_only_when_asked(tmp_path, monkeypatch, no_multicast):
    """The single-GPU path: the worker's environment, and what the environment record says of it."""
    monkeypatch.setenv("DSKBENCH_EXTRA_ADAPTERS", EXTRA)
    for k in shard.NO_MULTICAST_ENV:
        monkeypatch.delenv(k, raising=False)
    opts = SweepOptions(
        device="cpu", phases=("decode",), profile="cpu", budget_s=0.02, measure_ceilings=False, seed=1
    )
    opts.no_multicast = no_multicast
    registry = {"fake_env": _entry("fake_env")}
    items, skips = plan_sweep(registry, default_shapes(), ["fake_env"], ["fake"], opts)
    out = tmp_path / "r.jsonl"
    run_sweep(items[:1], skips, opts, out)
    (run,) = read_runs([out])
    (rec,) = run.results
    seen = (
        "NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1"
        if no_multicast
        else ("NCCL_NVLS_ENABLE=None TORCH_SYMM_MEM_DISABLE_MULTICAST=None")
    )
    assert rec["status"] == "ok" and rec["check"]["detail"].endswith(seen)
    assert run.environment["settings"]["no_multicast"] is no_multicast
    unset = dict.fromkeys(shard.NO_MULTICAST_ENV)
    assert run.environment["multicast"] == (
        {"off": True, "env": shard.NO_MULTICAST_ENV} if no_multicast else {"off": False, "env": unset}
    )
    assert not any(k in os.environ for k in shard.NO_MULTICAST_ENV)  # the parent's own is untouched


def test_cli_no_multicast_flag_and_switch(tmp_path, monkeypatch):
    """--no-multicast, or DSKBENCH_NO_MULTICAST=1 (not 0, not empty), reaches the sweep's options."""
    seen: list[bool] = []

    def fake_run_sweep(items, skips, opts, out, progress=None):
        seen.append(opts.no_multicast)
        raise KeyboardInterrupt  # stop here: nothing to measure

    monkeypatch.setattr("dskbench.execution.runner.run_sweep", fake_run_sweep)
    monkeypatch.setattr(
        "dskbench.frontends.cli.common.registry_and_shapes",
        lambda: ({"fake_ok": _entry("fake_ok")}, default_shapes()),
    )
    monkeypatch.setattr("dskbench.registry.load.drift_message", lambda: None)
    base = ["run", "--device", "cpu", "--kernel", "fake_ok", "--backend", "fake"]
    for switch, flag, want in (("", False, False), ("0", False, False), ("1", False, True), ("", True, True)):
        monkeypatch.setenv("DSKBENCH_NO_MULTICAST", switch)
        out = str(tmp_path / "r.jsonl")  # not written: the sweep stops before it opens the file
        assert cli.main([*base, "--out", out, *(["--no-multicast"] if flag else [])]) == 130
        assert seen.pop() is want


def test_dry_run_prints_the_cut(monkeypatch, capsys):
    registry = {k: _entry(k) for k in ("fake_ok", "fake_wrong", "fake_raise")}
    monkeypatch.setattr(
        "dskbench.frontends.cli.common.registry_and_shapes", lambda: (registry, default_shapes())
    )
    monkeypatch.setattr(
        DeviceInfo, "detect", classmethod(lambda cls, want="cuda": DeviceInfo("cuda", "G", 90, 2))
    )
    args = ["run", "--device", "cuda", "--gpus", "all", "--dry-run", "--backend", "fake"]
    assert cli.main([*args, "--kernel", "fake_ok", "--kernel", "fake_wrong", "--kernel", "fake_raise"]) == 0
    gpu_lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("GPU ")]
    assert len(gpu_lines) == 2 and all(" cases, ~" in ln for ln in gpu_lines)
    assert sorted(k for ln in gpu_lines for k in ln.split(": ", 2)[2].split(", ")) == [
        "fake_ok",
        "fake_raise",
        "fake_wrong",
    ]


def test_sharded_sweep_copies_twins_from_the_gpu_that_measured_them(tmp_path, monkeypatch):
    registry = {"fake_ok": _entry("fake_ok")}
    registry["fake_ok"].op_names = ["input_layernorm", "post_attention_layernorm"]  # same [T, 7168]
    _fake_host(monkeypatch, "0,1")
    opts = SweepOptions(
        device="cpu", phases=("decode",), profile="cpu", budget_s=0.02, measure_ceilings=False, seed=1, gpus=2
    )
    items, skips = plan_sweep(registry, default_shapes(), ["fake_ok"], ["fake"], opts)
    out = tmp_path / "r.jsonl"
    run_sweep(items, skips, opts, out)
    (run,) = read_runs([out])
    assert sorted(r["index"] for r in run.results) == list(range(len(items)))
    assert (
        sum(run.environment["settings"]["shards"]) == N and run.environment["settings"]["copied_items"] == N
    )
    by_id = {r["case_id"]: r for r in run.results}
    twins = [r for r in run.results if "shared_with" in r]
    assert len(twins) == N
    for r in twins:
        first = by_id[r["shared_with"]]
        assert r["gpu_index"] == first["gpu_index"] and r["timing"] == first["timing"]


def test_sharded_sweep_measures_a_cross_kernel_twin_once(tmp_path, monkeypatch):
    registry = {k: _entry(k) for k in ("fake_twin_a", "fake_twin_b", "fake_ok")}
    _fake_host(monkeypatch, "0,1")
    opts = SweepOptions(
        device="cpu", phases=("decode",), profile="cpu", budget_s=0.02, measure_ceilings=False, seed=1, gpus=2
    )
    items, skips = plan_sweep(registry, default_shapes(), list(registry), ["fake"], opts)
    printed = shard.print_shards(items, opts)  # the --dry-run cut: what the sweep will measure
    assert sorted(it.kernel for s in printed for it in s) == ["fake_ok"] * N + ["fake_twin_a"] * N
    out = tmp_path / "r.jsonl"
    run_sweep(items, skips, opts, out)
    (run,) = read_runs([out])
    assert run.environment["settings"]["shards"] == [len(s) for s in printed]
    assert run.environment["settings"]["copied_items"] == N
    by_id = {r["case_id"]: r for r in run.results}
    copies = [r for r in run.results if "shared_with" in r]
    assert sorted(r["kernel"] for r in copies) == ["fake_twin_b"] * N
    for r in copies:
        first = by_id[r["shared_with"]]
        assert first["kernel"] == "fake_twin_a" and r["case_id"].startswith("fake_twin_b/")
        assert r["gpu_index"] == first["gpu_index"] and r["timing"] == first["timing"]


def test_measured_costs_cut_the_shards_and_scale_the_model_for_the_rest(tmp_path):
    from dskbench.results.io import ResultsWriter, environment_record, result_record

    items = _plan({"k1": 4, "k2": 4, "k3": 4, "k4": 4})  # by the model: four equal kernels
    heavy = [it for it in items if it.kernel == "k1"]
    p = tmp_path / "earlier.jsonl"
    with ResultsWriter(p) as w:
        w.write(
            environment_record("r", created="2026-11-21T00:00:00+00:00", device={"name": "H"}, versions={})
        )
        for it in items:
            if it.kernel == "k4":
                continue  # k4 was not in the earlier run: the model, scaled, stands in
            secs = 10.0 if it.kernel == "k1" else 0.5
            w.write(
                result_record(
                    "r",
                    "ok",
                    kernel=it.kernel,
                    case_id=it.case_id,
                    backend={"name": it.backend},
                    stages={"item_s": secs},
                    timing={"median_us": 1.0},
                )
            )
        # a twin's copy carries the original's stages: it must not count
        w.write(
            result_record(
                "r",
                "ok",
                kernel="k9",
                case_id="x",
                backend={"name": "a"},
                stages={"item_s": 99.0},
                shared_with="y",
                timing={"median_us": 1.0},
            )
        )
    known = shard.measured_costs([p])
    assert len(known) == 24 and ("x", "a") not in known
    cost = shard.blended_cost(items, _cost, known)
    assert cost(heavy[0]) == 10.0
    k4 = next(it for it in items if it.kernel == "k4")
    both = [it for it in items if it.kernel != "k4"]
    scale = sum(known[(it.case_id, it.backend)] for it in both) / sum(_cost(it) for it in both)
    assert abs(cost(k4) - _cost(k4) * scale) < 1e-9
    shards, loads = shard.shard_items(items, 2, cost)
    k1_gpu = {g for g, s in enumerate(shards) for it in s if it.kernel == "k1"}
    # k1 alone (80 s) is over half the total: it is cut by case, and no GPU ends a case's cost above the other
    assert len(k1_gpu) == 2 and abs(loads[0] - loads[1]) <= 20.0 + cost_model.UNIT_OVERHEAD_S
    assert shard.blended_cost(items, _cost, {})(k4) == _cost(k4)  # nothing measured: the model as is


def test_cli_costs_from_must_exist(capsys):
    assert (
        cli.main(["run", "--device", "cpu", "--costs-from", "/nonexistent/x.jsonl", "--dry-run"])
        == cli.EXIT_USAGE
    )
    assert "--costs-from /nonexistent/x.jsonl: no such file" in capsys.readouterr().err
