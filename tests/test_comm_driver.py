"""`dskbench comm --nproc N` on the CPU: the driver runs one torchrun per backend, builds the later
backends' JIT modules in the background, stops a torchrun past its limit with its ranks (a rank's JIT
build not counted), and records the case a failed torchrun was on with why, in the engine's words."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dskbench.execution import comm_launch, comm_plan
from dskbench.frontends.cli import main
from dskbench.results.environment import NO_MULTICAST_ENV
from dskbench.results.io import read_runs
from tests.comm_ranks import COMM, REPO


@pytest.fixture(autouse=True)
def _rank_environment(monkeypatch):
    """The variables `dskbench comm` sets in its process, restored after each test."""
    for k in (*NO_MULTICAST_ENV, "SGLANG_SKIP_P2P_CHECK", "DSKBENCH_NO_MULTICAST"):
        monkeypatch.setenv(k, "x")
        monkeypatch.delenv(k)


def test_comm_driver_runs_one_torchrun_per_backend(tmp_path):
    out = tmp_path / "driver.jsonl"
    args = ["--nproc", "2", "--device", "cpu", "--kernel", "custom_all_reduce", "--tokens", "1"]
    args += ["--sweep", "decode", "--budget", "0.05", "--seed", "3", "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([*COMM, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = read_runs([out])
    assert [[r["backend"]["name"] for r in run.results] for run in runs] == [
        ["nccl"],
        ["sgl_kernel"],
        ["sglang_jit"],
    ]  # one run (one torchrun) per backend, in BACKEND_ORDER
    assert runs[0].results[0]["status"] == "ok" and runs[1].results[0]["status"] == "skipped"


def test_driver_background_builds(monkeypatch, capsys):
    for code in comm_launch.PRECOMPILE.values():  # the build snippets are valid Python for any world size
        compile(code.format(world=2), "<precompile>", "exec")
    assert set(comm_launch.PRECOMPILE) <= set(comm_plan.BACKEND_ORDER)
    monkeypatch.setattr(
        comm_launch,
        "PRECOMPILE",
        {"sglang_jit": "print('built')", "flashinfer": "import sys; print('nvcc died'); sys.exit(3)"},
    )
    procs = comm_launch.start_precompile(["nccl", "sglang_jit", "flashinfer"], 2)
    assert [name for name, _p, _log in procs] == ["sglang_jit", "flashinfer"]  # nccl builds nothing
    for _name, proc, _log in procs:
        proc.wait(timeout=60)
    comm_launch.stop_precompile(procs)
    out = capsys.readouterr().out
    assert "background JIT build for flashinfer failed (3): nvcc died" in out
    assert "for sglang_jit failed" not in out


# A stand-in for torchrun: it starts a "rank" in a session of its own (as torchrun does) and a helper in
# its own process group, then says so in a ready file and waits; with "build" the rank runs a
# "compiler" in its group. It and what it starts ignore SIGTERM, so only the kill of the groups ends them.
FAKE_LAUNCHER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by what it starts
ready, mode = sys.argv[1], sys.argv[2]
sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
rank_code = "import subprocess, sys, time\\n"
if mode == "build":
    rank_code += "c = subprocess.Popen(%r); print(c.pid, flush=True)\\n" % (sleep,)
else:
    rank_code += "print(0, flush=True)\\n"
rank_code += "time.sleep(600)\\n"
rank = subprocess.Popen([sys.executable, "-c", rank_code], stdout=subprocess.PIPE, text=True,
                        start_new_session=True)
compiler = int(rank.stdout.readline())
helper = subprocess.Popen(sleep)
with open(ready + ".tmp", "w") as fh:
    fh.write(f"{rank.pid} {helper.pid} {compiler}")
import os; os.rename(ready + ".tmp", ready)
time.sleep(600)
"""


class ReadyClock:
    """Stands still (0) until the fake launcher's ready file exists (waiting on it is bounded by a
    generous real limit, not a race), then reads `after[0]`, `after[1]`, ... (the last one repeated)."""

    def __init__(self, ready: Path, after: list[float]):
        self.ready, self.after, self.served = ready, after, []
        self.give_up = time.monotonic() + 120

    def __call__(self) -> float:
        if not self.ready.exists() and time.monotonic() < self.give_up:
            return 0.0
        value = self.after[min(len(self.served), len(self.after) - 1)]
        self.served.append(value)
        return value


def _gone(pid: int, wait_s: float = 60) -> bool:
    """Whether `pid` has ended (a zombie awaiting its reaper has), waiting up to wait_s for a kill's
    delivery."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_driver_kills_a_hung_launcher_with_its_ranks_and_says_why(monkeypatch, tmp_path, capsys):
    prog, ready = tmp_path / "launcher.py", tmp_path / "ready"
    prog.write_text(FAKE_LAUNCHER)
    clock = ReadyClock(ready, [100.0 + 1])  # past the limit as soon as the launcher is ready
    code, why = comm_launch.run_child(
        [sys.executable, str(prog), str(ready), "hang"], 100, "a test", 0.1, clock
    )
    assert code == comm_plan.EXIT_HUNG
    assert why == "timed out: no result within 100 s (a test); the torchrun and its ranks were killed"
    assert f"dskbench comm: {why}" in capsys.readouterr().err
    rank, helper, _ = (int(x) for x in ready.read_text().split())
    assert _gone(rank) and _gone(helper)  # its own group's and the rank's own session's processes


def test_driver_does_not_count_a_ranks_jit_build_against_the_limit(monkeypatch, tmp_path):
    prog, ready = tmp_path / "launcher.py", tmp_path / "ready"
    prog.write_text(FAKE_LAUNCHER)
    late = 100.0 + comm_launch.BUILD_GRACE_S + 1
    clock = ReadyClock(ready, [101.0] * 5 + [late])  # past the limit, a compiler runs; later past the grace
    code, why = comm_launch.run_child(
        [sys.executable, str(prog), str(ready), "build"], 100, "a test", 0.1, clock
    )
    assert code == comm_plan.EXIT_HUNG and why.startswith("timed out: no result within 100 s")
    assert clock.served[-1] == late and clock.served.count(101.0) == 5  # not killed while building
    rank, helper, compiler = (int(x) for x in ready.read_text().split())
    assert _gone(rank) and _gone(helper) and _gone(compiler)


def test_driver_reason_for_a_dead_launcher_is_the_engines(monkeypatch):
    crash = (
        "import sys; print('Traceback (most recent call last):', file=sys.stderr); "
        "print('RuntimeError: CUDA error: an illegal memory access was encountered', file=sys.stderr); "
        "print('CUDA kernel errors might be asynchronously reported at some other API call', file=sys.stderr); "
        "sys.exit(1)"
    )
    assert comm_launch.run_child([sys.executable, "-c", crash], None) == (
        1,
        "torchrun died (exit code 1) while running this case: "
        "CUDA error: an illegal memory access was encountered",
    )
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert comm_launch.run_child([sys.executable, "-c", killed], 1000) == (
        -9,
        "torchrun died (killed by SIGKILL) while running this case",
    )
    assert comm_launch.run_child([sys.executable, "-c", "pass"], 1000) == (0, None)


SEGV_RANK = """
import os, signal, time
if os.environ["RANK"] == "1":
    os.kill(os.getpid(), signal.SIGSEGV)
time.sleep(60)
"""


def test_driver_reason_names_the_rank_torchrun_lost(monkeypatch, tmp_path):
    """A real torchrun whose rank 1 dies of SIGSEGV: the reason says so, not torchrun's own traceback."""
    prog = tmp_path / "segv.py"
    prog.write_text(SEGV_RANK)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):  # run_child passes this process's environment on
        monkeypatch.delenv(k, raising=False)
    code, why = comm_launch.run_child([*comm_launch.TORCHRUN, "--nproc-per-node", "2", str(prog)], None)
    assert code == 1
    assert (
        why
        == "torchrun died (exit code 1) while running this case: ChildFailedError: rank 1 killed by SIGSEGV"
    )


# A stand-in for one backend's torchrun in driver mode: it writes a run to --out as rank 0 would (one
# case recorded), then fails as told.
FAKE_TORCHRUN = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from dskbench.results.io import ResultsWriter, environment_record, result_record
mode, ready, argv = sys.argv[2], sys.argv[3], sys.argv[4:]
out = argv[argv.index("--out") + 1]
if mode == "nothing":
    print("RuntimeError: the rendezvous failed", file=sys.stderr)
    sys.exit(1)
cid = "custom_all_reduce/all_reduce/decode/T={},tp=2".format
ident = dict(kernel="custom_all_reduce", op="all_reduce", variant=None, phase="decode", backend={"name": "nccl"})
with ResultsWriter(out) as w:
    w.write(environment_record("fake-run", created="now", device={"kind": "cpu"}, versions={}))
    w.write(result_record("fake-run", "wrong", case_id=cid(1), index=0, reason="fake", **ident))
    if mode == "watchdog":
        w.write(result_record("fake-run", "error", case_id=cid(4), index=1, reason="timed out: fake", **ident))
if mode == "hang":
    open(ready, "w").close()
    time.sleep(600)
print("RuntimeError: CUDA error: an illegal memory access was encountered", file=sys.stderr)
sys.exit(1)
"""


@pytest.mark.parametrize("mode", ["crash", "hang", "watchdog", "nothing"])
def test_driver_records_the_case_a_failed_torchrun_was_on(monkeypatch, tmp_path, capsys, mode):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "DSKBENCH_CASE_TIMEOUT_S"):
        monkeypatch.delenv(k, raising=False)
    prog, ready, out = tmp_path / "torchrun.py", tmp_path / "ready", tmp_path / "driver.jsonl"
    prog.write_text(FAKE_TORCHRUN)
    monkeypatch.setattr(comm_launch, "TORCHRUN", [sys.executable, str(prog), str(REPO), mode, str(ready)])
    monkeypatch.setattr(comm_launch, "CLOCK", ReadyClock(ready, [1e9]))
    args = ["--nproc", "2", "--device", "cpu", "--kernel", "custom_all_reduce", "--backend", "nccl"]
    args += ["--tokens", "1,4,16", "--sweep", "decode", "--out", str(out)]
    assert main(["comm", *args]) == 1
    err = capsys.readouterr().err
    if mode == "nothing":
        assert not out.exists()
        assert "custom_all_reduce · nccl: torchrun died (exit code 1) while running this case: " in err
        assert "the rendezvous failed; it recorded no run" in err
        return
    (run,) = read_runs([out])
    got = {r["case_id"].split("/")[-1]: (r["status"], r["reason"]) for r in run.results}
    if mode == "watchdog":  # its watchdog recorded the hang: nothing more to say
        assert got == {"T=1,tp=2": ("wrong", "fake"), "T=4,tp=2": ("error", "timed out: fake")}
        return
    if mode == "crash":
        why = "torchrun died (exit code 1) while running this case: CUDA error: an illegal memory access was encountered"
    else:
        limit = (
            comm_plan.SETUP_TIMEOUT_S
            + 3 * comm_plan.CASE_TIMEOUT_S
            + 2 * comm_plan.TEARDOWN_S
            + comm_plan.START_S
        )
        why = (
            f"timed out: no result within {limit:g} s (--setup-timeout 480 s + 3 cases x --case-timeout 240 s"
            " + start and teardown); the torchrun and its ranks were killed"
        )
    # the case it was on has its error; the one after it has no record, so --resume runs it
    assert got == {"T=1,tp=2": ("wrong", "fake"), "T=4,tp=2": ("error", why)}
    lost = run.results[-1]
    assert lost["index"] == 1 and lost["world"] == 2 and lost["backend"] == {"name": "nccl"}
    assert f"dskbench comm: custom_all_reduce/all_reduce/decode/T=4,tp=2 · nccl: error: {why}" in err
