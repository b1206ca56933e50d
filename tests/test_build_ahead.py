"""A run that builds its JIT modules beside its measuring worker (`dskbench run --build-ahead`): cases
wait for their build, not for all builds; builders and the measuring worker never hold the GPU at once.
On the CPU with fake kernels."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys

EXTRA = "tests.fake_adapters,tests.fake_build_adapters"
os.environ.setdefault("DSKBENCH_EXTRA_ADAPTERS", EXTRA)

import tests.fake_adapters  # noqa: E402,F401 - registers the fakes here whatever the variable held
import tests.fake_build_adapters  # noqa: E402,F401
from dskbench.execution import build_ahead, gpu_lock, warm, warm_report  # noqa: E402
from dskbench.execution.runner import SweepOptions, plan_sweep, run_sweep  # noqa: E402
from dskbench.frontends import cli  # noqa: E402
from dskbench.results.io import iter_records  # noqa: E402
from dskbench.shapes.cases import default_shapes  # noqa: E402
from tests.test_shard import _entry, _item  # noqa: E402


def _items_with(builds: list[str | None]):
    return [
        build_ahead.with_builds([_item(i, "k", 1 + i)], [b])[0] if b else _item(i, "k", 1 + i)
        for i, b in enumerate(builds)
    ]


def test_cases_whose_build_is_done_go_first_in_plan_order(tmp_path):
    items = _items_with(["marlin", "small", None, "marlin", "small"])
    ready_path = tmp_path / "ready"
    ready_path.write_text("small\n")
    ready = build_ahead.ReadyFile(ready_path)
    waits = []

    def sleep(_s: float) -> None:  # the builders finish marlin while the worker waits
        waits.append(len(waits))
        ready_path.write_text("small\nmarlin\n")

    got = list(build_ahead.build_order([0, 1, 2, 3, 4], items, ready, sleep=sleep))
    assert got == [1, 2, 4, None, 0, 3]  # small and the build-free case first; one wait; then marlin's
    assert waits == [0]


def test_all_done_releases_every_case_and_a_missing_file_waits(tmp_path):
    items = _items_with(["never", "never"])
    ready = build_ahead.ReadyFile(tmp_path / "absent")
    order = build_ahead.build_order([0, 1], items, ready, sleep=lambda s: None)
    assert next(order) is None  # no file yet: nothing is ready
    (tmp_path / "absent").write_text(f"x\n{build_ahead.ALL_DONE}\n")
    assert list(order) == [0, 1]


def test_each_item_names_its_build_and_each_build_is_one_unchecked_item():
    items = [_item(0, "k", 1, "a"), _item(1, "k", 8, "a"), _item(2, "k", 1, "b"), _item(3, "k", 8, "b")]
    b = build_ahead.Builder(
        items, SweepOptions(device="cpu"), None, jobs=2, build_s={}, per_shape=lambda k, be: be == "b"
    )
    try:
        assert b.items[0].build == b.items[1].build != b.items[2].build != b.items[3].build
        assert [it.index for it in b.picked] == [0, 2, 3]
        assert not any(it.checked for it in b.picked)  # the measuring worker checks every case
        assert os.environ[gpu_lock.LOCK_ENV].startswith(str(b.folder))
    finally:
        b.stop()
    assert gpu_lock.LOCK_ENV not in os.environ and not b.folder.exists()
    assert warm.build_key(items[3], True) != warm.build_key(items[1], True)
    assert warm.build_key(items[3], False) == "k · b · - · input_layernorm"
    other_op = type(items[1])(4, "k", "a", {**items[1].case, "op": "q_a_layernorm"}, "test")
    assert warm.build_key(other_op, False) != warm.build_key(items[1], False)  # a JIT module per op's sizes


def test_the_gpu_lock_keeps_another_process_out_while_held(tmp_path, monkeypatch):
    path = tmp_path / "gpu.lock"
    monkeypatch.setenv(gpu_lock.LOCK_ENV, str(path))
    probe = (
        "import fcntl, sys\n"
        "fh = open(sys.argv[1], 'a')\n"
        "try:\n    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n    sys.exit(9)\n"
    )
    with gpu_lock.held():
        with gpu_lock.held():  # nested: held once, no self-deadlock
            pass
        held = subprocess.run([sys.executable, "-c", probe, str(path)]).returncode
    free = subprocess.run([sys.executable, "-c", probe, str(path)]).returncode
    assert (held, free) == (9, 0)
    monkeypatch.delenv(gpu_lock.LOCK_ENV)
    with gpu_lock.held():  # no lock named: no lock
        fh = open(path, "a")
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fh.close()


def _run_building_ahead(tmp_path, monkeypatch, kernels, **opts):
    """A CPU sweep of the fake kernels that builds ahead (2 builders): its items, results file, summary."""
    monkeypatch.setenv("DSKBENCH_EXTRA_ADAPTERS", EXTRA)
    monkeypatch.setenv(tests.fake_build_adapters.DIR_ENV, str(tmp_path))
    options = SweepOptions(
        device="cpu",
        phases=("decode",),
        profile="cpu",
        seed=0,
        measure_ceilings=False,
        build_ahead=True,
        build_jobs=2,
        **opts,
    )
    items, skips = plan_sweep({k: _entry(k) for k in kernels}, default_shapes(), kernels, ["fake"], options)
    out = tmp_path / "r.jsonl"
    return items, out, run_sweep(items, skips, options, out)


def test_a_run_building_ahead_measures_each_case_once_its_build_is_done(tmp_path, monkeypatch):
    """The slow build comes first in the plan: the measuring worker takes fake_ok's cases while it builds,
    and never starts a slow-build case before its builder is done (one build, found by the worker)."""
    kernels = ["fake_slow_build", "fake_ok"]
    items, out, summary = _run_building_ahead(tmp_path, monkeypatch, kernels)
    assert summary.counts["ok"] == len(items) > 2
    log = [line.split() for line in (tmp_path / "log").read_text().splitlines()]
    built = [(int(pid), int(nice)) for w, pid, nice in log if w == "built"]
    cached = {(int(pid), int(nice)) for w, pid, nice in log if w == "cached"}
    assert len(built) == 1  # the builder's; the worker found the cache
    assert cached and built[0][0] not in {pid for pid, _ in cached}
    # the builder and its compilers run nicer than the measuring worker, which keeps this process's
    here = os.nice(0)
    assert built[0][1] == min(19, here + warm.BUILD_NICE) and {n for _, n in cached} == {here}
    records = [r for r in iter_records(out) if r.get("status")]
    assert {r["kernel"] for r in records} == set(kernels)
    assert all(r["settings"]["build_ahead"] for r in iter_records(out) if r.get("kind") == "environment")


def test_cli_build_jobs_needs_build_ahead(capsys):
    assert cli.main(["run", "--device", "cpu", "--kernel", "rmsnorm", "--build-jobs", "2"]) == cli.EXIT_USAGE
    assert "--build-jobs applies only with --build-ahead" in capsys.readouterr().err


def test_a_build_line_gives_the_compile_the_whole_item_and_when_it_ended():
    stages = {"bind_s": 2.0, "first_launch_s": 10.34, "item_s": 15.0}
    done = warm.warm_result(_item(0, "k", 1, "b"), {"status": "ok", "stages": stages})
    assert (
        done.build_s == 12.34
    )  # a FlashInfer wrapper builds in bind (its plan), most others at first launch
    assert (
        build_ahead.build_line(done, 61.6) == "build: ok         12.3 s  k · b  (item   15.0 s, at     62 s)"
    )
    slow = {"resolve_s": 30.2, "inputs_s": 2.0, "bind_s": 0.0, "first_launch_s": 3.0, "item_s": 36.0}
    waited = warm.warm_result(_item(0, "k", 1, "b"), {"status": "ok", "stages": slow})
    assert build_ahead.build_line(waited, 5.0).endswith(
        "(item   36.0 s, most in resolve 30.2 s, at      5 s)"
    )
    crashed = warm.WarmResult("k", "b", None, "c", "error", "boom", first_launch_s=None, item_s=None)
    line = build_ahead.build_line(crashed, 3.0)
    assert line.startswith("build: error") and "k · b" in line and line.endswith("at      3 s)")


def test_a_pool_leaves_out_what_admit_refuses_and_an_emptied_unit_takes_no_worker():
    from dskbench.execution.limits import CaseLimits
    from dskbench.execution.pool import Pool

    a, b, c, d = (_item(i, "k", 1 + i, be) for i, be in enumerate(["ok", "gone", "gone", "ok"]))
    dropped: list = []
    pool = Pool(
        [],
        lambda *_: None,
        CaseLimits(flat_s=0.0),
        shared=[[a, b], [c], [d]],
        admit=lambda it: it.backend != "gone",
        on_drop=dropped.append,
    )
    assert pool._next_unit([]) == [a]
    assert pool._next_unit([]) == [d]  # the unit of c alone is skipped whole
    assert pool._next_unit([]) is None
    assert dropped == [b, c]


def test_builds_the_device_cannot_run_are_ready_at_once_and_a_missing_backend_drops_its_other_builds(
    tmp_path,
):
    from dskbench.device.info import DeviceInfo

    kernels = ["fake_ok"]
    opts = SweepOptions(device="cpu", phases=("decode",), profile="cpu", seed=0, measure_ceilings=False)
    items, _ = plan_sweep({k: _entry(k) for k in kernels}, default_shapes(), kernels, ["fake", "b200"], opts)
    per_shape = lambda k, b: True  # noqa: E731 - one build per case, so dropping shows per item
    builder = build_ahead.Builder(items, opts, None, jobs=1, per_shape=per_shape, device=DeviceInfo("cpu"))
    try:
        b200 = {it.build for it in builder.items if it.backend == "b200"}
        assert b200 and builder.gated == len(b200)  # needs sm100: no builder process for them
        assert {it.backend for it in builder.picked} == {"fake"}
        ready = build_ahead.ReadyFile(builder.ready_path)
        ready.refresh()
        assert b200 <= ready.done
        # a build finds the backend missing from this install: its other builds are dropped, marked done
        first, *rest = builder.picked
        builder._done(first, {"status": "skipped", "reason": "not available in this install: no module x"})
        assert rest and not any(builder._admit(it) for it in rest)
        for it in rest:
            builder._drop(it)
        ready.refresh()
        assert {it.build for it in builder.picked} <= ready.done
        assert f"{len(b200)} not for this GPU" in builder.summary()
        assert f"{len(rest)} left out (backend not installed)" in builder.summary()
    finally:
        builder.stop()


def test_the_summary_says_how_much_of_the_builders_time_went_to_items():
    done = [
        warm.warm_result(
            _item(i, "k", 1, "b"), {"status": "ok", "stages": {"item_s": 30.0, "first_launch_s": 1.0}}
        )
        for i in range(2)
    ]
    assert build_ahead.busy_text(done, 2, 100.0) == "; 30% of 2 x 100 s in build items"
    assert build_ahead.busy_text([], 2, 100.0) == "" and build_ahead.busy_text(done, 2, 0.0) == ""


def test_a_build_recorded_past_the_runs_limit_is_deferred_and_its_cases_recorded_skipped(
    tmp_path, monkeypatch
):
    """--defer-builds-over: fake_slow_build's build is recorded at 600 s, past the run's 300 s, so no
    builder makes it and each of its cases is recorded skipped with the command that builds it; the
    rest of the run is measured as usual."""
    monkeypatch.setattr(build_ahead, "packaged_build_times", lambda: {("fake_slow_build", "fake"): 600.0})
    kernels = ["fake_slow_build", "fake_ok"]
    items, out, summary = _run_building_ahead(tmp_path, monkeypatch, kernels, defer_builds_over_s=300.0)
    records = [r for r in iter_records(out) if r.get("status")]
    slow = [r for r in records if r["kernel"] == "fake_slow_build"]
    n_slow = sum(it.kernel == "fake_slow_build" for it in items)
    assert len(slow) == n_slow > 1 and {r["status"] for r in slow} == {"skipped"}
    assert all(
        r["reason"].startswith("build deferred: fake_slow_build · fake builds for 10 min or more")
        and "`dskbench warm --kernel fake_slow_build --backend fake` builds it" in r["reason"]
        for r in slow
    )
    assert {r["status"] for r in records if r["kernel"] == "fake_ok"} == {"ok"}
    assert summary.counts["ok"] == len(items) - n_slow and summary.counts["skipped"] == n_slow
    log = (tmp_path / "log").read_text() if (tmp_path / "log").exists() else ""
    assert "built" not in log  # the slow build never ran, in a builder or in the measuring worker


def test_a_build_done_before_on_this_box_is_not_deferred_and_none_is_without_a_limit():
    class Remembers:
        why_forgotten = None

        def __init__(self, keys):
            self.keys = set(keys)

        def known(self, keys):
            return {k for k in keys if k in self.keys}

        def add(self, key, status):
            pass

        def save(self):
            pass

    items = [_item(0, "k", 1, "a"), _item(1, "k", 8, "a"), _item(2, "k", 1, "b")]
    times = {("k", "a"): 1000.0, ("k", "b"): 10.0}
    opts = SweepOptions(device="cpu", defer_builds_over_s=900.0)
    b = build_ahead.Builder(items, opts, None, jobs=1, build_s=times, memory=Remembers([]))
    try:
        assert [it.index for it in b.deferred] == [0, 1]  # both cases of the one long build
        assert [it.index for it in b.items] == [2] and [it.index for it in b.picked] == [2]
        assert [f["status"] for _, f in b.deferred_records()] == ["skipped", "skipped"]
        assert "1 builds deferred (2 cases skipped: k · a)" in b.summary()
    finally:
        b.stop()
    key_a = warm.build_key(items[0], False)
    b = build_ahead.Builder(items, opts, None, jobs=1, build_s=times, memory=Remembers([key_a]))
    try:
        assert b.deferred == [] and len(b.items) == 3  # built before here: ready, nothing to defer
    finally:
        b.stop()
    assert build_ahead.deferred_builds(b.items, times, None) == {}


def test_cli_defer_builds_over_needs_build_ahead(capsys):
    args = ["run", "--device", "cpu", "--kernel", "rmsnorm", "--defer-builds-over", "900"]
    assert cli.main(args) == cli.EXIT_USAGE
    assert "--defer-builds-over applies only with --build-ahead" in capsys.readouterr().err


def _items_of(kernels):
    options = SweepOptions(device="cpu", phases=("decode",), profile="cpu", seed=0, measure_ceilings=False)
    return plan_sweep({k: _entry(k) for k in kernels}, default_shapes(), kernels, ["fake"], options)[0]


def _warm_fakes(tmp_path, monkeypatch, memory, **opts):
    """`dskbench warm` of fake_slow_build (recorded at 600 s) and fake_ok on the CPU: results, summary."""
    from dskbench.device.info import DeviceInfo

    monkeypatch.setenv("DSKBENCH_EXTRA_ADAPTERS", EXTRA)
    monkeypatch.setenv(tests.fake_build_adapters.DIR_ENV, str(tmp_path))
    items = _items_of(["fake_slow_build", "fake_ok"])
    options = SweepOptions(device="cpu", profile="cpu", seed=0, measure_ceilings=False, **opts)
    times = {("fake_slow_build", "fake"): 600.0}
    results = warm.run_warm(items, options, 2, build_s=times, memory=memory, device=DeviceInfo("cpu"))
    return {r.kernel: r for r in results}, warm_report.summary_lines(results, 1.0, 2)


def test_warm_defers_a_build_recorded_past_its_limit_and_makes_it_without_one(tmp_path, monkeypatch):
    """`warm --defer-builds-over 300`: fake_slow_build (600 s recorded) is never built, reported skipped
    with run's reason and the command that builds it, and not remembered; without the limit it is built."""
    from dskbench.execution.build_memory import BuildMemory
    from dskbench.results.io import DEFERRED

    memory = BuildMemory(tmp_path / "builds.json", {})
    by, lines = _warm_fakes(tmp_path, monkeypatch, memory, defer_builds_over_s=300.0)
    slow = by["fake_slow_build"]
    assert slow.status == "skipped" and slow.reason.startswith(
        f"{DEFERRED}fake_slow_build · fake builds for 10 min or more (recorded)"
    )
    assert "`dskbench warm --kernel fake_slow_build --backend fake` builds it" in slow.reason
    assert by["fake_ok"].status == "ok"
    assert not (tmp_path / "log").exists()  # its builder never ran
    assert {k.split(" · ")[0] for k in memory.keys} == {"fake_ok"}  # the deferred build is not remembered
    assert any(slow.reason in line for line in lines)  # the table keeps the command
    assert lines[-1].endswith("; 1 builds deferred (fake_slow_build · fake)")

    by, lines = _warm_fakes(tmp_path, monkeypatch, None)
    assert by["fake_slow_build"].status == "ok" and "deferred" not in lines[-1]
    assert [line.split()[0] for line in (tmp_path / "log").read_text().splitlines()] == ["built"]


def test_warm_does_not_defer_a_build_this_box_has_done(tmp_path, monkeypatch):
    from dskbench.execution.build_memory import BuildMemory

    memory = BuildMemory(tmp_path / "builds.json", {})
    slow = _items_of(["fake_slow_build"])[0]
    memory.add(warm.build_key(slow, False), "ok")
    by, lines = _warm_fakes(tmp_path, monkeypatch, memory, defer_builds_over_s=300.0)
    assert by["fake_slow_build"].status == "ok" and "deferred" not in lines[-1]


def test_cli_warm_defers_by_the_build_times_it_is_given_and_rejects_bad_values(tmp_path, capsys):
    import json

    times = tmp_path / "times.json"
    times.write_text(
        json.dumps({"results": [{"kernel": "rmsnorm", "backend": "torch-ref", "build_s": 1000}]})
    )
    out = tmp_path / "warm.json"
    args = ["warm", "--device", "cpu", "--kernel", "rmsnorm", "--build-times", str(times), "--out", str(out)]
    assert cli.main([*args, "--defer-builds-over", "900"]) == cli.EXIT_OK
    rows = json.loads(out.read_text())["results"]
    assert rows and {r["status"] for r in rows} == {"skipped"}
    assert all("`dskbench warm --kernel rmsnorm --backend torch-ref` builds it" in r["reason"] for r in rows)
    assert f"; {len(rows)} builds deferred (rmsnorm · torch-ref)" in capsys.readouterr().out
    for bad in ("-5", "abc", "0"):  # as run's: seconds > 0
        assert cli.main(["warm", "--device", "cpu", "--defer-builds-over", bad]) == cli.EXIT_USAGE
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "expected a number of seconds > 0" in err


def test_a_backend_whose_package_is_not_installed_starts_no_builder(tmp_path):
    """fake_raise's `missing` backend names a package this install lacks: found without importing, its
    builds are ready at once (the measuring worker records its cases skipped with resolve's reason)."""
    from dskbench.adapters.backends import absent_package
    from dskbench.device.info import DeviceInfo
    from tests.fake_adapters import FakeRaise

    by_name = {b.name: b for b in FakeRaise.backends}
    assert (
        absent_package(by_name["missing"]) == "no_such_module_xyz" and absent_package(by_name["fake"]) is None
    )
    kernels = ["fake_raise"]
    opts = SweepOptions(device="cpu", phases=("decode",), profile="cpu", seed=0, measure_ceilings=False)
    items, _ = plan_sweep(
        {k: _entry(k) for k in kernels}, default_shapes(), kernels, ["fake", "missing"], opts
    )
    builder = build_ahead.Builder(items, opts, None, jobs=1, device=DeviceInfo("cpu"))
    try:
        missing = {it.build for it in builder.items if it.backend == "missing"}
        assert missing and {it.backend for it in builder.picked} == {"fake"}
        ready = build_ahead.ReadyFile(builder.ready_path)
        ready.refresh()
        assert missing <= ready.done
        assert f"{len(missing)} left out (backend not installed)" in builder.summary()
    finally:
        builder.stop()


def test_absent_package_looks_at_every_candidate_and_the_preloads():
    from dskbench.adapters.backends import Backend, absent_package

    def backend(target, **kw):
        return Backend("b", target, None, "aot", lambda *a: None, **kw)

    assert absent_package(backend("torch.ops.aten.mm")) is None
    assert absent_package(backend("no_such_pkg_a.x:f", fallbacks=("dskbench.shapes.cases:Case",))) is None
    assert (
        absent_package(backend("dskbench.shapes.cases:Case", preload=("no_such_pkg_b",))) == "no_such_pkg_b"
    )
    assert absent_package(backend(None)) is None
