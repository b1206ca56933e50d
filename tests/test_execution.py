"""The execution engine (dskbench/execution/) on the CPU with fake kernels: a case that hangs, crashes,
dies with a CUDA error or poisons the context loses only itself, in every path (one GPU, several, warm);
limits; interrupts (SIGTERM, SIGKILL of the parent) leave whole files and no processes behind.

No test here depends on how fast this machine is: a hung case is detected through a clock the test
drives (it jumps when the fake kernel says it hangs), and the process tests wait with generous limits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXTRA = "tests.fake_adapters,tests.fake_shard_adapters"
os.environ.setdefault("DSKBENCH_EXTRA_ADAPTERS", EXTRA)

import tests.fake_adapters  # noqa: E402,F401
import tests.fake_shard_adapters  # noqa: E402,F401
from dskbench.device.info import DeviceInfo  # noqa: E402
from dskbench.execution import case as case_mod  # noqa: E402
from dskbench.execution import pool as pool_mod  # noqa: E402
from dskbench.execution import warm  # noqa: E402
from dskbench.execution.items import SweepOptions  # noqa: E402
from dskbench.execution.limits import (  # noqa: E402
    FIRST_USE_S,
    FLOOR_S,
    CaseLimits,
    LimitError,
    first_use_allowance,
    timeout_from_env,
)
from dskbench.execution.process import death_reason, last_words  # noqa: E402
from dskbench.execution.runner import case_limits, plan_sweep, run_sweep  # noqa: E402
from dskbench.results.io import read_runs  # noqa: E402
from dskbench.shapes.cases import default_shapes  # noqa: E402
from tests.fake_shard_adapters import HANG_DIR_ENV, hang_marker  # noqa: E402
from tests.test_shard import _entry, _fake_host  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
N = len(default_shapes().values("decode_tokens", "cpu"))


def _opts(**kw) -> SweepOptions:
    base = dict(
        device="cpu", phases=("decode",), profile="cpu", budget_s=0.02, measure_ceilings=False, seed=1
    )
    return SweepOptions(**{**base, **kw})


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie awaiting its reaper has exited


@pytest.fixture()
def hang_clock(tmp_path, monkeypatch):
    """Each slot's hang watch reads a clock that leaps a million seconds at every reading while that
    slot's worker says it hangs (the fake kernel's marker file names its pid) and the worker lives: the
    watch fires at its next look, whatever the machine's load, and the clock stands still again once
    the worker is gone."""
    folder = tmp_path / "hang"
    folder.mkdir()
    monkeypatch.setenv(HANG_DIR_ENV, str(folder))
    monkeypatch.setenv("DSKBENCH_EXTRA_ADAPTERS", EXTRA)  # the workers load fake_hang, whatever ran before

    def clock_for(slot):
        marker = hang_marker(folder, (slot.env or os.environ).get("CUDA_VISIBLE_DEVICES"))
        leaps = [0]

        def clock() -> float:
            try:
                pid = int(marker.read_text() or 0)
            except (FileNotFoundError, ValueError):
                pid = 0
            if pid and _alive(pid):
                leaps[0] += 1
            return time.monotonic() + 1e6 * leaps[0]

        return clock

    monkeypatch.setattr(pool_mod, "clock_for", clock_for)
    return folder


def _sweep(tmp_path, kernels, **kw):
    registry = {k: _entry(k) for k in kernels}
    opts = _opts(**kw)
    items, skips = plan_sweep(registry, default_shapes(), kernels, ["fake"], opts)
    out = tmp_path / "r.jsonl"
    summary = run_sweep(items, skips, opts, out)
    (run,) = read_runs([out])
    return items, summary, run


# -- reasons and limits ----------------------------------------------------------------------------------


def test_a_dead_workers_reason_is_the_cuda_error_not_the_advice_after_it():
    stderr = (
        "Traceback (most recent call last):\n  File 'x.py', line 1\n"
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call.\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    )
    assert last_words(stderr) == "CUDA error: an illegal memory access was encountered"
    assert last_words("noise\nValueError: bad shape\n") == "ValueError: bad shape"
    assert last_words("a\nb\nc\nd\n") == "b | c | d"
    assert death_reason(-9, "").startswith("worker process died (killed by SIGKILL)")
    assert death_reason(77, "") == "worker process died (exit code 77) while running this case"


def test_limits_scale_with_the_expected_time_and_leave_room_for_a_first_build():
    limits = CaseLimits(expected_s=lambda it: it)
    assert limits.for_item(0.1, first_use=False) == FLOOR_S
    assert limits.for_item(30.0, first_use=False) == 300.0
    assert limits.for_item(0.1, first_use=True) == FLOOR_S + FIRST_USE_S
    assert CaseLimits(expected_s=lambda it: 1 / 0).for_item(1, False) == FLOOR_S  # a broken estimate
    assert CaseLimits(flat_s=0.0).off
    assert limits.describe() == "max(60 s, 10 x expected) per case, +120 s for a first use"


def test_a_flat_case_timeout_means_what_it_says_unless_a_first_use_allowance_is_asked():
    """--case-timeout 30 kills a hung first case at 30 s, not 150 s; --first-use-allowance adds its
    seconds to the first case only, and is the run's own (scaled limits keep 120 s by default)."""
    assert first_use_allowance(None, None) == FIRST_USE_S
    assert first_use_allowance(30.0, None) == 0.0
    assert first_use_allowance(30.0, 45.0) == 45.0 and first_use_allowance(None, 0.0) == 0.0
    flat = CaseLimits(expected_s=lambda it: 1e6, flat_s=30.0, first_use_s=first_use_allowance(30.0, None))
    assert flat.for_item(0, False) == 30.0 and flat.for_item(0, True) == 30.0 and not flat.off
    assert flat.describe() == "30 s per case"
    given = CaseLimits(flat_s=30.0, first_use_s=first_use_allowance(30.0, 45.0))
    assert given.for_item(0, True) == 75.0 and given.for_item(0, False) == 30.0
    assert given.describe() == "30 s per case, +45 s for a first use"
    opts = _opts(case_timeout_s=30.0)
    assert case_limits(opts, DeviceInfo("cpu")).for_item(None, True) == 30.0
    opts = _opts(case_timeout_s=30.0, first_use_allowance_s=10.0)
    assert case_limits(opts, DeviceInfo("cpu")).for_item(None, True) == 40.0
    assert timeout_from_env({"DSKBENCH_CASE_TIMEOUT_S": "45"}) == 45.0
    assert timeout_from_env({}) is None
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(LimitError, match="DSKBENCH_CASE_TIMEOUT_S: expected seconds"):
            timeout_from_env({"DSKBENCH_CASE_TIMEOUT_S": bad})


def test_an_error_raised_while_cleaning_up_is_the_cases_error(monkeypatch):
    registry = {"fake_ok": _entry("fake_ok")}
    item = plan_sweep(registry, default_shapes(), ["fake_ok"], ["fake"], _opts())[0][0]

    def late(device, force=False):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(case_mod, "free_memory", late)
    fields = case_mod.run_one(item, DeviceInfo("cpu"), _opts(), 1, None)
    assert fields["status"] == "error" and fields["poisoned"]
    assert fields["reason"] == "RuntimeError: CUDA error: an illegal memory access was encountered"


# -- every path survives hung and dying cases ------------------------------------------------------------


def test_one_gpu_sweep_a_hung_case_is_killed_and_the_sweep_goes_on(tmp_path, hang_clock, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    kernels = ["fake_ok", "fake_hang", "fake_abort", "fake_wrong"]
    items, summary, run = _sweep(tmp_path, kernels)
    assert sorted(r["index"] for r in run.results) == list(range(len(items)))
    by = {k: [r for r in run.results if r["kernel"] == k] for k in kernels}
    assert all(r["status"] == "ok" for r in by["fake_ok"]) and len(by["fake_ok"]) == N
    assert all(r["status"] == "wrong" for r in by["fake_wrong"])
    assert all(r["status"] == "error" for r in by["fake_hang"]) and len(by["fake_hang"]) == N
    first, *rest = by["fake_hang"]
    assert first["reason"].startswith(f"timed out: no result within {FLOOR_S + FIRST_USE_S:.0f} s")
    assert all(r["reason"].startswith("timed out: no result within") for r in rest)
    assert all("the worker was killed" in r["reason"] for r in by["fake_hang"])
    assert all(
        r["reason"] == "worker process died (exit code 1) while running this case: "
        "CUDA error: an illegal memory access was encountered"
        for r in by["fake_abort"]
    )
    assert run.environment["settings"]["case_timeout"].startswith("max(60 s")
    assert summary.counts == {"ok": N, "wrong": N, "error": 2 * N}


def test_sharded_sweep_a_hung_case_loses_itself_not_its_gpu(tmp_path, hang_clock, monkeypatch):
    _fake_host(monkeypatch, "0,1")
    items, summary, run = _sweep(tmp_path, ["fake_ok", "fake_hang", "fake_crash"], gpus=2)
    assert sorted(r["index"] for r in run.results) == list(range(len(items)))
    hung = [r for r in run.results if r["kernel"] == "fake_hang"]
    assert len(hung) == N and all(r["reason"].startswith("timed out: no result within") for r in hung)
    assert all(r["status"] == "ok" for r in run.results if r["kernel"] == "fake_ok")
    crash = [r for r in run.results if r["kernel"] == "fake_crash"]
    assert all("worker process died (exit code 77)" in r["reason"] for r in crash)
    assert {r["gpu_index"] for r in run.results} == {0, 1}


def test_warm_a_hung_build_is_killed_and_the_others_are_built(tmp_path, hang_clock, monkeypatch):
    monkeypatch.setenv("DSKBENCH_EXTRA_ADAPTERS", EXTRA)
    kernels = ["fake_ok", "fake_hang", "fake_wrong"]
    registry = {k: _entry(k) for k in kernels}
    opts = SweepOptions(device="cpu", phases=("decode",), profile="cpu", seed=0, measure_ceilings=False)
    items, _ = plan_sweep(registry, default_shapes(), kernels, ["fake"], opts)
    results = warm.run_warm(items, opts, jobs=2, gpu_tokens=["4", "5"])
    by = {r.kernel: r for r in results}
    assert [r.kernel for r in results] == kernels
    assert by["fake_hang"].status == "error" and by["fake_hang"].reason.startswith("timed out")
    assert by["fake_ok"].status == "ok" and by["fake_wrong"].status == "wrong"


def test_a_failing_result_handler_stops_the_pool_and_raises(tmp_path):
    registry = {"fake_ok": _entry("fake_ok")}
    items, _ = plan_sweep(registry, default_shapes(), ["fake_ok"], ["fake"], _opts())
    slots = [
        pool_mod.Slot(f"s{i}", {"opts": _opts().__dict__, "run_seed": 1, "ceilings": None}) for i in range(2)
    ]

    def broken(slot, item, fields):
        raise ValueError("the results disk is gone")

    p = pool_mod.Pool(slots, broken, CaseLimits(), shared=[[it] for it in items])
    with pytest.raises(ValueError, match="results disk is gone"):
        p.run()
    assert p.stop.is_set()


# -- interrupts: whole files, no leftovers ---------------------------------------------------------------


def _start_cli(tmp_path: Path, out: Path) -> tuple[subprocess.Popen, Path, Path]:
    hang, tmp = tmp_path / "hang", tmp_path / "tmp"
    hang.mkdir()
    tmp.mkdir()
    env = {
        **os.environ,
        "DSKBENCH_EXTRA_ADAPTERS": EXTRA,
        HANG_DIR_ENV: str(hang),
        "TMPDIR": str(tmp),
        "PYTHONPATH": str(REPO),
    }
    cmd = [sys.executable, "-m", "tests.cli_with_fakes", "run", "--device", "cpu", "--sweep", "decode"]
    cmd += ["--kernel", "fake_ok", "--kernel", "fake_hang", "--backend", "fake", "--seed", "1"]
    cmd += ["--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, hang, tmp


def _wait_for_hang(proc: subprocess.Popen, hang: Path, limit_s: float = 300.0) -> int:
    """The hung worker's pid, once it hangs (generous: start-up on a busy machine)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        markers = list(hang.iterdir())
        if markers:
            return int(markers[0].read_text() or 0)
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the fake kernel never started hanging")


def _gone(pid: int, limit_s: float = 60.0) -> bool:
    """The process has exited within the limit (generous)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_sigterm_stops_the_run_with_a_message_a_whole_file_and_nothing_left(tmp_path):
    out = tmp_path / "r.jsonl"
    proc, hang, tmp = _start_cli(tmp_path, out)
    worker = _wait_for_hang(proc, hang)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143
    assert "interrupted (SIGTERM)" in err and f"--out {out} --resume" in err and "Traceback" not in err
    (run,) = read_runs([out])  # every line whole
    assert [r["status"] for r in run.results] == ["ok"] * N  # fake_ok ran before the hang; nothing else
    assert _gone(worker)
    assert list(tmp.iterdir()) == []  # no temporary folder or file left behind


def test_a_killed_run_takes_its_workers_with_it(tmp_path):
    out = tmp_path / "r.jsonl"
    proc, hang, tmp = _start_cli(tmp_path, out)
    worker = _wait_for_hang(proc, hang)
    proc.kill()  # SIGKILL: no handler runs in the parent
    proc.communicate(timeout=60)
    assert _gone(worker), "an orphaned worker kept running"
    (run,) = read_runs([out])
    assert len(run.results) == N
    assert list(tmp.iterdir()) == []


def test_a_build_is_seen_in_the_workers_process_group(tmp_path):
    from dskbench.execution.process import compiling

    proc = tmp_path / "proc"
    for pid, state, pgrp in ((100, "S", 100), (101, "R", 100), (102, "S", 7), (103, "Z", 100)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(f"{pid} (n v c) {state} 1 {pgrp} {pgrp} 0\n")
    assert compiling(100, str(proc))  # 101 is in the worker's group: a compiler
    (proc / "101" / "stat").write_text("101 (nvcc) S 1 7 7 0\n")
    assert not compiling(100, str(proc))  # the worker alone, another group, and a zombie
    assert not compiling(100, str(tmp_path / "no-proc"))


def test_a_runs_recorder_writes_through_one_writer_and_drops_reports_after_the_run(tmp_path):
    """sweep.recording: the sweep's and `dskbench comm`'s rank 0's way to a results file."""
    from dskbench.execution.items import WorkItem
    from dskbench.execution.sweep import recording
    from dskbench.shapes.cases import Case

    item = WorkItem(0, "k", "b", Case("k", "op", "decode", {"T": 1}, {"T": 1}).to_json())
    env = {"run_id": "r1", "created": "now", "device": {"kind": "cpu"}, "versions": {}}
    seen, out = [], tmp_path / "r.jsonl"
    with pytest.raises(KeyboardInterrupt):
        with recording(out, env, progress=lambda it, status, f: seen.append(status)) as record:
            record(item, {**item.identity(), "status": "skipped", "reason": "x"})
            raise KeyboardInterrupt  # an interrupt: the records so far stay, the file is closed
    record(item, {**item.identity(), "status": "error", "reason": "a dying worker's late report"})
    (run,) = read_runs([out])
    assert run.run_id == "r1" and [r["status"] for r in run.results] == ["skipped"] and seen == ["skipped"]
    assert record.counts == {"skipped": 1} and run.results[0]["index"] == 0


def test_a_build_in_any_workers_group_excuses_them_all(tmp_path):
    """A worker waiting on another's JIT build lock runs no compiler itself: a build in any of the
    run's worker groups counts."""
    from dskbench.execution.process import compiling

    proc = tmp_path / "proc"
    for pid, pgrp in ((100, 100), (200, 200), (201, 200)):  # worker 100 waits; worker 200 runs nvcc (201)
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(f"{pid} (x) S 1 {pgrp} {pgrp} 0\n")
    assert not compiling(100, str(proc))
    assert compiling({100, 200}, str(proc))


def test_the_stopping_policy_reaches_the_measurement_and_the_repro_command():
    from dskbench.execution.case import measure_settings
    from dskbench.execution.selection import repro_command

    assert measure_settings(SweepOptions(device="cpu")).stopping == "median-ci"
    assert measure_settings(SweepOptions(device="cpu", stopping="fixed")).stopping == "fixed"
    rec = {"kernel": "k", "backend": {"name": "b"}, "op": "o", "phase": "decode", "point": {"T": 1}}
    assert "--stopping" not in repro_command(rec, {"device": "cpu"})
    assert repro_command(rec, {"device": "cpu", "stopping": "stdrel"}).endswith("--stopping stdrel")


def test_min_time_reaches_the_measurement_and_the_repro_command():
    from dskbench.execution.case import measure_settings
    from dskbench.execution.selection import repro_command
    from dskbench.measure import MeasureSettings

    assert measure_settings(SweepOptions(device="cuda")).min_time_s == MeasureSettings().min_time_s
    assert measure_settings(SweepOptions(device="cuda", min_time_s=0.1)).min_time_s == 0.1
    assert (
        measure_settings(SweepOptions(device="cuda", min_time_s=9.0)).min_time_s == 1.5
    )  # within the budget
    rec = {"kernel": "k", "backend": {"name": "b"}, "op": "o", "phase": "decode", "point": {"T": 1}}
    assert "--min-time" not in repro_command(rec, {"device": "cuda"})
    assert repro_command(rec, {"device": "cuda", "min_time_s": 0.1}).endswith("--min-time 0.1")


def test_build_watch_excuses_a_case_across_the_gaps_of_one_build():
    """Past its limit a case goes on while a compiler runs in any worker group, or ran less than
    BUILD_GAP_S ago (ninja's steps, a build lock handed over); not after the gap, never past the grace."""
    from dskbench.execution.process import BUILD_GAP_S, BUILD_GRACE_S, BUILD_SCAN_S, BuildWatch

    state = {"compiling": True}
    watch = BuildWatch(lambda: state["compiling"])
    watch.look(0.0)  # before the limit: a build is seen
    state["compiling"] = False
    watch.look(BUILD_SCAN_S / 2)  # not looked again so soon
    assert watch.excused(10.0, 1.0)  # past the limit, no compiler now, but one 10 s ago
    assert not watch.excused(BUILD_GAP_S + 0.1, 5.0)  # the gap is over: a hang
    state["compiling"] = True
    assert watch.excused(100.0, 50.0)  # a compiler again
    assert not watch.excused(101.0, BUILD_GRACE_S)  # never past the grace
    watch.begin()  # the next case starts with nothing seen
    state["compiling"] = False
    assert not watch.excused(1.0, 0.5)
    # a case whose module is known to build long gets a longer grace
    state["compiling"] = True
    watch.begin(grace=3 * BUILD_GRACE_S)
    assert watch.excused(200.0, 2 * BUILD_GRACE_S) and watch.used
    assert not watch.excused(201.0, 3 * BUILD_GRACE_S)


def test_a_long_recorded_build_gets_a_grace_in_proportion():
    """The grace past a case's limit is BUILD_GRACE_S, or BUILD_GRACE_FACTOR times the recorded build
    seconds of its (kernel, backend) where longer: FlashInfer's CUTLASS fused MoE (shipped as at least 23
    minutes) is not killed at the fixed grace; a broken estimate falls back to the fixed one."""
    from dskbench.execution.items import WorkItem
    from dskbench.execution.limits import BUILD_GRACE_FACTOR, BUILD_GRACE_S, CaseLimits

    short = WorkItem(0, "rmsnorm", "flashinfer", {"case_id": "c"})
    moe = WorkItem(1, "cutlass_fused_moe", "flashinfer.bf16", {"case_id": "c"})
    limits = case_limits(SweepOptions(device="cpu"), DeviceInfo("cpu"))
    assert limits.build_grace(short) == BUILD_GRACE_S
    assert limits.build_grace(moe) >= BUILD_GRACE_FACTOR * 1200 > BUILD_GRACE_S
    broken = CaseLimits(build_s=lambda it: 1 / 0)
    assert broken.build_grace(moe) == BUILD_GRACE_S
