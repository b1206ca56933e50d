"""A GPU shared with other processes: NVML's process lists (a fake pynvml), the warning and environment
field at the start of a run, the field on results, and `dskbench run --exclusive`."""

from __future__ import annotations

import io
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from dskbench.execution import shared_gpu
from dskbench.measure import nvml, sharing
from dskbench.measure.sharing import Sharing, SharingWatch, gpu_sharing, run_pids


class FakeNVML:
    """The pynvml calls sharing.py makes, over set lists of processes."""

    def __init__(self, compute=(), graphics=(), mps=(), mig=0, names=None, minor=0, fail=None) -> None:
        self.lists = {"compute": list(compute), "graphics": list(graphics), "mps": list(mps)}
        self.mig, self.names, self.minor, self.fail = mig, names or {}, minor, fail

    @staticmethod
    def proc(pid: int, used: int | None = 2**30) -> SimpleNamespace:
        return SimpleNamespace(pid=pid, usedGpuMemory=used)

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("h", i)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        if self.fail:
            raise self.fail
        return self.lists["compute"]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return self.lists["graphics"]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h):
        return self.lists["mps"]

    def nvmlDeviceGetMigMode(self, h):
        if self.mig is None:
            raise type("NVMLError_NotSupported", (Exception,), {})("Not Supported")
        return [self.mig, self.mig]

    def nvmlDeviceGetMinorNumber(self, h):
        return self.minor

    def nvmlSystemGetProcessName(self, pid):
        if pid not in self.names:
            raise RuntimeError("not found")
        return self.names[pid].encode()


def fake_proc(root: Path, procs: dict[int, tuple[int, str]], device_fds: dict[int, str] | None = None) -> str:
    """A /proc with `procs` (pid -> (ppid, name)) and, per pid, one fd linked to a device path."""
    for pid, (ppid, name) in procs.items():
        d = root / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "comm").write_text(name + "\n")
        (d / "stat").write_text(f"{pid} ({name}) S {ppid} {pid} {pid} 0 -1\n")
    for pid, target in (device_fds or {}).items():
        os.symlink(target, root / str(pid) / "fd" / "3")
    return str(root)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(nvml, "_handles", {})
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(shared_gpu, "_watch", None)


def test_other_processes_are_listed_and_ours_ignored(tmp_path):
    proc = fake_proc(tmp_path, {100: (1, "dskbench"), 101: (100, "python"), 555: (1, "sglang::sched")})
    lib = FakeNVML(
        compute=[FakeNVML.proc(101), FakeNVML.proc(555, 20 * 2**30)], graphics=[FakeNVML.proc(555)]
    )
    s = gpu_sharing(0, {100, 101}, lib=lib, proc_dir=proc)
    assert s.state == "shared" and s.count == 1 and s.mig is False and s.mps is False
    assert s.others[0].to_json() == {"pid": 555, "name": "sglang::sched", "used_mib": 20480.0}
    assert s.record_field() == {"pids": [555], "names": ["sglang::sched"]}
    assert "GPU 0 is in use by 1 other process: pid 555 (sglang::sched, 20,480 MiB)" == s.describe()
    alone = gpu_sharing(0, {100, 101}, lib=FakeNVML(compute=[FakeNVML.proc(101)]), proc_dir=proc)
    assert alone.state == "exclusive" and alone.others == () and alone.record_field() is None


def test_name_from_nvml_when_proc_lacks_it_and_unknown_memory(tmp_path):
    lib = FakeNVML(compute=[FakeNVML.proc(7, None)], names={7: "/usr/bin/python3"}, mig=1)
    s = gpu_sharing(0, {1}, lib=lib, proc_dir=str(tmp_path))
    assert s.others[0].name == "python3" and s.others[0].used_mib is None and s.mig is True
    s = gpu_sharing(0, {1}, lib=FakeNVML(compute=[FakeNVML.proc(8)], mig=None), proc_dir=str(tmp_path))
    assert s.others[0].name is None and s.mig is False  # "not supported": a GPU without MIG


def test_mps_server_is_not_a_tenant_but_marks_mps(tmp_path):
    proc = fake_proc(tmp_path, {50: (1, sharing.MPS_SERVER)})
    s = gpu_sharing(0, {99}, lib=FakeNVML(compute=[FakeNVML.proc(50)]), proc_dir=proc)
    assert s.state == "exclusive" and s.mps is True
    client = gpu_sharing(0, {99}, lib=FakeNVML(mps=[FakeNVML.proc(60)]), proc_dir=proc)
    assert client.state == "shared" and client.mps is True and [p.pid for p in client.others] == [60]


def test_no_nvml_or_a_failing_one_is_unknown_never_an_error(monkeypatch, tmp_path):
    monkeypatch.setattr(nvml, "_lib", None)
    monkeypatch.setattr(nvml, "_lib_tried", True)
    s = gpu_sharing(0, {1})
    assert s.state == "unknown" and "NVML not available" in (s.note or "") and not s.shared
    assert s.to_json()["state"] == "unknown" and s.record_field() is None
    broken = gpu_sharing(0, {1}, lib=FakeNVML(fail=RuntimeError("GPU is lost")), proc_dir=str(tmp_path))
    assert broken.state == "unknown" and "GPU is lost" in broken.describe()


def test_pids_of_another_namespace_count_ours_holding_the_device(tmp_path):
    # in a container NVML may list host PIDs (9001: our worker as the host sees it; 9002: a neighbour)
    proc = fake_proc(
        tmp_path, {10: (1, "dskbench"), 11: (10, "python")}, {11: "/dev/nvidia0", 10: "/dev/null"}
    )
    lib = FakeNVML(compute=[FakeNVML.proc(9001)])
    s = gpu_sharing(0, {10, 11}, lib=lib, proc_dir=proc)
    assert s.state == "exclusive" and s.count == 0 and "another PID namespace" in (s.note or "")
    lib = FakeNVML(compute=[FakeNVML.proc(9001), FakeNVML.proc(9002)])
    s = gpu_sharing(0, {10, 11}, lib=lib, proc_dir=proc)
    assert s.state == "shared" and s.count == 1 and len(s.others) == 2  # which one is ours: unknown
    assert s.record_field() == {"pids": [9001, 9002], "names": [None, None], "count": 1}
    # a process of ours holding another GPU's device file is not on this one
    other_gpu = gpu_sharing(0, {10, 11}, lib=FakeNVML(compute=[FakeNVML.proc(9001)], minor=1), proc_dir=proc)
    assert other_gpu.state == "shared"


def test_run_pids_is_the_run_root_and_its_descendants(tmp_path):
    me = os.getpid()
    proc = fake_proc(
        tmp_path, {500: (1, "dskbench"), 501: (500, "worker"), 502: (501, "nvcc"), 600: (1, "other")}
    )
    assert run_pids(proc, {sharing.RUN_PID_ENV: "500"}) == {me, 500, 501, 502}
    assert run_pids(proc, {}) == {me}


def test_watch_asks_nvml_at_most_every_period():
    calls, now = [], [0.0]

    def probe() -> Sharing:
        calls.append(now[0])
        return Sharing("exclusive")

    w = SharingWatch(period_s=5.0, probe=probe, clock=lambda: now[0])
    for t in (0.0, 1.0, 4.9, 5.0, 7.0, 10.5):
        now[0] = t
        w.current()
    assert calls == [0.0, 5.0, 10.5]


def _shared(gpu: int = 0, pids=(555,)) -> Sharing:
    others = tuple(sharing.GpuProcess(p, "python", 1024.0) for p in pids)
    return Sharing("shared", gpu, others, len(others), False, False)


def test_results_measured_while_shared_carry_the_field(monkeypatch):
    monkeypatch.setattr(shared_gpu, "_watch", SharingWatch(probe=lambda: _shared(pids=(555, 556))))
    assert shared_gpu.record_fields("cuda") == {
        "shared_gpu": {"pids": [555, 556], "names": ["python", "python"]}
    }
    assert shared_gpu.record_fields("cpu") == {}  # CPU timings do not share a GPU
    monkeypatch.setattr(shared_gpu, "_watch", SharingWatch(probe=lambda: Sharing("exclusive")))
    assert shared_gpu.record_fields("cuda") == {}


def test_a_case_measured_on_a_shared_gpu_records_it(monkeypatch):
    """execute_item adds the helper's field to an ok record, and the record type keeps it."""
    os.environ.setdefault("DSKBENCH_EXTRA_ADAPTERS", "tests.fake_adapters")
    import tests.fake_adapters  # noqa: F401 - registers the fakes
    from dskbench.device.info import DeviceInfo
    from dskbench.execution import case as case_mod
    from dskbench.execution.items import SweepOptions, WorkItem
    from dskbench.results.records import ResultRecord
    from dskbench.shapes.cases import default_shapes

    monkeypatch.setattr(
        shared_gpu, "record_fields", lambda device: {"shared_gpu": {"pids": [9], "names": ["x"]}}
    )
    c = default_shapes().cases("fake_ok", ["input_layernorm"], "norm", "decode", "cpu")[0]
    opts = SweepOptions(
        device="cpu", phases=("decode",), profile="cpu", budget_s=0.01, measure_ceilings=False
    )
    fields = case_mod.execute_item(
        WorkItem(0, "fake_ok", "torch-ref", c.to_json(), "test"), DeviceInfo("cpu"), opts, 1, None
    )
    assert fields["status"] == "ok" and fields["shared_gpu"] == {"pids": [9], "names": ["x"]}
    rec = ResultRecord.from_json({**fields, "run_id": "r"})
    assert rec.shared_gpu == {"pids": [9], "names": ["x"]} and rec.to_json()["shared_gpu"]["pids"] == [9]


def test_start_check_warns_and_returns_the_environment_field(monkeypatch):
    monkeypatch.delenv(sharing.RUN_PID_ENV, raising=False)
    found = {0: Sharing("exclusive", 0), 1: _shared(1)}
    monkeypatch.setattr(shared_gpu, "gpu_sharing", lambda i, ours: found[i])
    err = io.StringIO()
    env = shared_gpu.start_check(2, "cuda", err)
    assert [e["state"] for e in env] == ["exclusive", "shared"] and env[1]["others"][0]["pid"] == 555
    assert err.getvalue().splitlines() == [
        "dskbench: warning: GPU 1 is in use by 1 other process: pid 555 (python, 1,024 MiB); "
        "its timings are not this GPU's alone"
    ]
    assert os.environ[sharing.RUN_PID_ENV] == str(os.getpid())  # the workers know the run's root
    assert shared_gpu.start_check(1, "cpu", err) is None
    from dskbench.results.io import environment_record

    rec = environment_record("r", created="t", device={"kind": "cuda"}, versions={}, shared_gpu=env)
    assert rec["shared_gpu"] == env


def test_exclusive_refuses_a_shared_or_unknown_gpu():
    assert shared_gpu.exclusive_problem(1, probe=lambda i: Sharing("exclusive", i)) is None
    msg = shared_gpu.exclusive_problem(2, probe=lambda i: _shared(i) if i == 1 else Sharing("exclusive", i))
    assert msg == "--exclusive: GPU 1 is in use by 1 other process: pid 555 (python, 1,024 MiB)"
    unknown = shared_gpu.exclusive_problem(
        1, probe=lambda i: Sharing("unknown", i, note="NVML not available")
    )
    assert unknown == "--exclusive: GPU 0: cannot tell whether other processes use it (NVML not available)"


def test_wait_exclusive_waits_for_the_gpu_and_says_for_what():
    now, states = [0.0], [_shared(), _shared(), _shared(pids=(556,)), Sharing("exclusive")]
    out = io.StringIO()

    def sleep(s: float) -> None:
        now[0] += s

    probe = lambda i: states.pop(0)  # noqa: E731
    assert (
        shared_gpu.exclusive_problem(1, 60.0, stream=out, probe=probe, sleep=sleep, clock=lambda: now[0])
        is None
    )
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "pid 555" in lines[0] and "pid 556" in lines[1]  # said again when it changed
    assert lines[0].startswith("dskbench: waiting up to 60 s for the GPU to be free")
    now[0] = 0.0
    late = shared_gpu.exclusive_problem(
        1, 12.0, stream=io.StringIO(), probe=lambda i: _shared(), sleep=sleep, clock=lambda: now[0]
    )
    assert late is not None and late.endswith("(still, after waiting 12 s)") and now[0] == pytest.approx(12.0)


def test_cli_exclusive_exits_2_with_one_line(monkeypatch, tmp_path, capsys):
    from dskbench.frontends import cli
    from dskbench.frontends.cli import common

    args = ["run", "--kernel", "rmsnorm", "--sweep", "decode", "--out", str(tmp_path / "r.jsonl")]
    assert cli.main([*args, "--device", "cpu", "--exclusive"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "dskbench: --exclusive and --wait-exclusive apply to GPU runs (--device cuda)"
    )
    monkeypatch.setattr(common, "device_choice", lambda asked: ("cuda", None))
    seen = []

    def problem(n, wait_s=None):
        seen.append((n, wait_s))
        return "--exclusive: GPU 0 is in use by 1 other process: pid 555 (python, 1,024 MiB)"

    monkeypatch.setattr(shared_gpu, "exclusive_problem", problem)
    assert cli.main([*args, "--wait-exclusive", "30"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "dskbench: --exclusive: GPU 0 is in use by 1 other process: pid 555 (python, 1,024 MiB)"
    assert seen == [(1, 30.0)] and not (tmp_path / "r.jsonl").exists()  # nothing ran


def test_run_sweep_writes_the_start_finding_into_the_environment(monkeypatch, tmp_path):
    os.environ.setdefault("DSKBENCH_EXTRA_ADAPTERS", "tests.fake_adapters")
    from dskbench.execution import runner
    from dskbench.results.io import read_runs
    from dskbench.shapes.cases import default_shapes
    from tests.fake_adapters import registry_entry

    asked = []
    monkeypatch.setattr(
        runner, "start_check", lambda n, kind: asked.append((n, kind)) or [_shared().to_json()]
    )
    opts = runner.SweepOptions(
        device="cpu", phases=("decode",), profile="cpu", budget_s=0.01, measure_ceilings=False, isolate=False
    )
    items, skips = runner.plan_sweep(
        {"fake_ok": registry_entry("fake_ok")}, default_shapes(), ["fake_ok"], None, opts
    )
    runner.run_sweep(items[:1], skips, opts, tmp_path / "r.jsonl")
    (run,) = read_runs([tmp_path / "r.jsonl"])
    assert asked == [(1, "cpu")]
    assert run.environment["shared_gpu"][0]["state"] == "shared"
    assert run.environment["shared_gpu"][0]["others"][0]["pid"] == 555
    assert "peaks" not in run.environment  # a CPU run has no datasheet
