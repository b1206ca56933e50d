"""`dskbench comm` under torchrun, on the CPU: gloo ranks run the command end to end (the plan, the rank
agreement, the check, the timing, rank 0's records), failures agreed and recorded, the watchdog's
time-out, the environment each rank prepares, and one-line usage errors."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from dskbench.execution import comm_plan
from dskbench.execution.comm_env import numeric_visible_devices, prepare_rank_environment
from dskbench.execution.comm_plan import BACKEND_ORDER, EXIT_HUNG, hang_limits
from dskbench.execution.comm_watchdog import Watchdog
from dskbench.execution.limits import LimitError
from dskbench.frontends.cli import EXIT_USAGE, build_parser, main
from dskbench.results.environment import NO_MULTICAST_ENV, multicast_block
from dskbench.results.io import read_runs
from tests.comm_ranks import COMM
from tests.comm_ranks import ranks as _ranks


@pytest.fixture(autouse=True)
def _rank_environment(monkeypatch):
    """The variables `dskbench comm` sets in its process, restored after each test."""
    for k in (*NO_MULTICAST_ENV, "SGLANG_SKIP_P2P_CHECK", "DSKBENCH_NO_MULTICAST"):
        monkeypatch.setenv(k, "x")
        monkeypatch.delenv(k)


def test_each_rank_prepares_its_environment_before_torch():
    for switch, off in ((None, False), ("0", False), ("1", True)):  # multicast off only when asked
        env = {} if switch is None else {"DSKBENCH_NO_MULTICAST": switch}
        prepare_rank_environment(env)
        seen = {k: env.get(k) for k in NO_MULTICAST_ENV}
        assert seen == (NO_MULTICAST_ENV if off else dict.fromkeys(NO_MULTICAST_ENV))
        assert env["SGLANG_SKIP_P2P_CHECK"] == "1"  # else sglang's P2P test fails every custom AR set-up
    kept = {"SGLANG_SKIP_P2P_CHECK": "0"}
    prepare_rank_environment(kept)
    assert kept == {"SGLANG_SKIP_P2P_CHECK": "0"}  # an explicit choice stands


def test_comm_arguments(monkeypatch, capsys):
    for k in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(k, raising=False)
    assert main(["comm", "--out", "x.jsonl"]) == EXIT_USAGE
    assert "torchrun --nproc-per-node N -m dskbench comm" in capsys.readouterr().err
    assert main(["comm", "--dry-run", "--world", "4", "--quick", "--backend", "nope"]) == EXIT_USAGE
    assert "unknown backend(s) nope" in capsys.readouterr().err
    assert main(["comm", "--nproc", "1", "--out", "x.jsonl"]) == EXIT_USAGE
    assert _one_line_error(capsys) == "dskbench: --nproc 1: expected at least 2 processes"
    dry = ["comm", "--dry-run", "--world", "8", "--kernel", "custom_all_reduce", "--tokens", "1,4096"]
    assert main(dry) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "12 cases at TP 8"  # 2 tokens x decode and prefill x 3 backends
    assert "custom_all_reduce/all_reduce/prefill/T=4096,tp=8  sglang_jit" in lines
    assert main(["comm", "--dry-run", "--world", "2", "--tokens", "1"]) == 0
    order = []
    for ln in capsys.readouterr().out.splitlines()[:-1]:
        if ln.split()[-1] not in order:
            order.append(ln.split()[-1])
    assert order == list(BACKEND_ORDER)  # the baselines and the AOT kernel before the JIT builds


def test_comm_two_gloo_ranks_end_to_end(tmp_path):
    out = tmp_path / "comm.jsonl"
    args = ["--device", "cpu", "--tokens", "1,16", "--sweep", "decode", "--budget", "0.05", "--seed", "3"]
    done = _ranks([*COMM, *args, "--out", str(out)])
    for d in done:
        assert d.returncode == 0, d.stderr[-3000:]
    (run,) = read_runs([out])  # rank 0 alone wrote: one environment record, one result per case
    assert len(run.environment["gpus"]) == 2 and run.environment["settings"]["world"] == 2
    assert run.environment["multicast"] == multicast_block()  # the ranks' variables, as this process has them
    recs = {(r["case_id"], r["backend"]["name"]): r for r in run.results}
    assert len(recs) == len(run.results) == 2 * (3 + 2)
    for t in (1, 16):
        ok = recs[(f"custom_all_reduce/all_reduce/decode/T={t},tp=2", "nccl")]
        assert ok["status"] == "ok" and ok["check"]["error"] < 1e-2 and ok["world"] == 2
        m, timing = ok["metrics"], ok["timing"]
        assert timing["method"] == "cpu-wall" and timing["median_us"] == max(
            r["median_us"] for r in ok["ranks"]
        )
        assert m["latency_us"] == timing["median_us"] and m["payload_bytes"] == t * 7168 * 2
        assert m["busbw_gbps"] == pytest.approx(m["algbw_gbps"])  # n = 2
        assert m["gbps"] == pytest.approx(m["busbw_gbps"])
        sk = recs[(f"custom_all_reduce/all_reduce/decode/T={t},tp=2", "sgl_kernel")]
        assert sk["status"] == "skipped" and sk["reason"] == "needs a CUDA GPU (found no CUDA GPU)"
        fu = recs[(f"flashinfer_communication_fusion/all_reduce/decode/T={t},tp=2", "flashinfer")]
        assert fu["status"] == "skipped" and fu["reason"].startswith("needs sm90")
    # --resume: every case already has a final result, so a second run adds an empty run
    done = _ranks([*COMM, *args, "--out", str(out), "--resume"])
    assert all(d.returncode == 0 for d in done)
    runs = read_runs([out])
    assert len(runs) == 2 and runs[1].results == []


def test_comm_numeric_visible_devices():
    index = {"GPU-aaaa-1111": 3, "GPU-bbbb-2222": 5}.__getitem__
    env = {"CUDA_VISIBLE_DEVICES": "GPU-bbbb-2222, GPU-aaaa-1111"}
    assert numeric_visible_devices(env, index) == "5,3"  # order kept: device 0 stays the first named
    assert env == {"CUDA_VISIBLE_DEVICES": "5,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # NVML's numbering
    for unchanged in (
        {},
        {"CUDA_VISIBLE_DEVICES": "0,1"},
        {"CUDA_VISIBLE_DEVICES": "1,GPU-aaaa-1111"},  # mixed: a bare index means another order
        {"CUDA_VISIBLE_DEVICES": "MIG-aaaa"},
        {"CUDA_VISIBLE_DEVICES": "GPU-aaaa-1111", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"},
        {"CUDA_VISIBLE_DEVICES": "GPU-cccc"},  # the lookup fails: left as it is
    ):
        before = dict(unchanged)
        assert numeric_visible_devices(unchanged, index) is None and unchanged == before


def test_watchdog_ends_the_process_after_recording():
    ended, recorded = threading.Event(), []
    codes: list[int] = []

    def fake_exit(code):
        codes.append(code)
        ended.set()

    wd = Watchdog(exit=fake_exit, period=0.01, backstop=False)
    wd.arm(5.0, "a case")
    wd.disarm()  # disarmed in time: nothing happens
    wd.arm(0.05, "a case", on_expire=lambda: recorded.append("timed out"))
    assert ended.wait(5) and codes == [EXIT_HUNG] and recorded == ["timed out"] and wd.fired == "a case"
    quiet = Watchdog(exit=fake_exit, period=0.01, backstop=False)
    quiet.arm(0.05, "x")
    quiet.disarm()
    time.sleep(0.2)
    assert codes == [EXIT_HUNG]
    teardown = Watchdog(exit=fake_exit, period=0.01, backstop=False)
    ended.clear()
    teardown.arm(0.02, "the end of the run", code=0)  # a hang after every record is written: success
    assert ended.wait(5) and codes == [EXIT_HUNG, 0]


FAILURES_PROGRAM = """
import os, sys, time
import torch.distributed as dist
from dskbench.adapters.comm import rank, setups
from dskbench.execution import comm_rank
from dskbench.frontends.cli import main

MODE = sys.argv[1]
comm_rank.RANK_GRACE_S = 1.0

class Flaky(rank.TorchAllReduce):
    def bind(self, inputs, case):
        t, rank = int(case.dims["T"]), dist.get_rank()
        if MODE == "fail" and t == 1 and rank == 1:
            raise ValueError("bind broke on rank 1 only")
        if MODE == "fail" and t == 16:
            def poison():
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return poison
        if MODE == "hang" and t == 4 and rank == 1:
            def hang():
                time.sleep(600)
            return hang
        return super().bind(inputs, case)

setups.RANK_SETUPS[("custom_all_reduce", "nccl")] = Flaky
code = main(["comm", *sys.argv[2:]])
sys.stdout.flush()
os._exit(code)
"""


def test_comm_failures_are_agreed_and_recorded(tmp_path):
    prog = tmp_path / "failures.py"
    prog.write_text(FAILURES_PROGRAM)
    out = tmp_path / "fail.jsonl"
    args = [
        "--device",
        "cpu",
        "--tokens",
        "1,4,16,64",
        "--sweep",
        "decode",
        "--budget",
        "0.05",
        "--seed",
        "3",
    ]
    done = _ranks([sys.executable, str(prog), "fail", *args, "--out", str(out)])
    for d in done:
        assert d.returncode == 0, d.stderr[-3000:]
    (run,) = read_runs([out])
    recs = {(r["case_id"], r["backend"]["name"]): r for r in run.results}
    assert len(recs) == len(run.results) == 4 * 5  # every case of every backend has one record
    cid = "custom_all_reduce/all_reduce/decode/T={},tp=2".format
    one = recs[(cid(1), "nccl")]  # failed on one rank only: agreed, recorded, and the run went on
    assert one["status"] == "error" and one["reason"] == "rank 1: ValueError: bind broke on rank 1 only"
    assert recs[(cid(4), "nccl")]["status"] == "ok"
    poison = recs[(cid(16), "nccl")]
    assert poison["status"] == "error" and "illegal memory access" in poison["reason"]
    # a poisoned context ends the run: what is left is recorded as not run (an error: --resume keeps it)
    left = [r for (c, b), r in recs.items() if (c, b) != (cid(16), "nccl") and r["status"] == "error"]
    assert {r["case_id"] for r in left if r["backend"]["name"] == "nccl"} == {cid(1), cid(64)}
    not_run = [r for r in left if r["reason"].startswith("not run: ")]
    assert len(not_run) == 1 + 4 * 4 and all("poisoned the CUDA context" in r["reason"] for r in not_run)


def test_comm_watchdog_records_a_hang_and_ends_the_ranks(tmp_path):
    prog = tmp_path / "hang.py"
    prog.write_text(FAILURES_PROGRAM)
    out = tmp_path / "hang.jsonl"
    args = ["--device", "cpu", "--tokens", "1,4", "--sweep", "decode", "--budget", "0.05", "--seed", "3"]
    args += ["--kernel", "custom_all_reduce", "--backend", "nccl", "--case-timeout", "3"]
    done = _ranks([sys.executable, str(prog), "hang", *args, "--out", str(out)], timeout=90)
    assert [d.returncode for d in done] == [124, 124]
    (run,) = read_runs([out])
    by_case = {r["case_id"]: r for r in run.results}
    assert by_case["custom_all_reduce/all_reduce/decode/T=1,tp=2"]["status"] == "ok"
    hung = by_case["custom_all_reduce/all_reduce/decode/T=4,tp=2"]
    assert hung["status"] == "error" and hung["reason"] == (  # worded as the engine's time-outs
        "timed out: no result within 3 s (--case-timeout); a rank hung in a collective or a kernel, "
        "and the ranks were ended"
    )
    assert (
        "dskbench comm: timed out: custom_all_reduce/all_reduce/decode/T=4,tp=2 · nccl gave no result "
        "within 3 s; ending this process" in done[0].stderr
    )


def test_comm_eight_gloo_ranks_run_the_tp8_path(tmp_path):
    """TP=8 without an 8-GPU machine: the same code with 8 CPU ranks: the plan,
    the rank agreement, NCCL's stand-in all-reduce checked on every rank, and the bus-bandwidth
    factor 2(n-1)/n with n = 8."""
    out = tmp_path / "comm8.jsonl"
    args = ["--device", "cpu", "--tokens", "4", "--sweep", "decode", "--budget", "0.02", "--seed", "5"]
    args += ["--kernel", "custom_all_reduce", "--backend", "nccl"]
    done = _ranks([*COMM, *args, "--out", str(out)], n=8, timeout=300)
    for d in done:
        assert d.returncode == 0, d.stderr[-3000:]
    (run,) = read_runs([out])
    assert len(run.environment["gpus"]) == 8 and run.environment["settings"]["world"] == 8
    (rec,) = run.results
    assert rec["case_id"] == "custom_all_reduce/all_reduce/decode/T=4,tp=8" and rec["status"] == "ok"
    assert rec["world"] == 8 and len(rec["ranks"]) == 8 and rec["check"]["error"] < 1e-2
    m = rec["metrics"]
    assert m["busbw_gbps"] == pytest.approx(m["algbw_gbps"] * 2 * 7 / 8)


# -- one-line usage errors, the hang limits -------------------------------------------------------------


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_comm_bad_limits_and_out_are_one_line_usage_errors(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("DSKBENCH_CASE_TIMEOUT_S", raising=False)
    for flag, bad in (("--case-timeout", "soon"), ("--case-timeout", "-1"), ("--setup-timeout", "nan")):
        assert main(["comm", "--dry-run", "--world", "2", flag, bad]) == EXIT_USAGE
        assert _one_line_error(capsys) == (
            f"dskbench: {flag}: expected seconds (a number >= 0, 0 = no limit), got {bad!r}"
        )
    monkeypatch.setenv("DSKBENCH_CASE_TIMEOUT_S", "inf")
    assert main(["comm", "--dry-run", "--world", "2"]) == EXIT_USAGE
    assert _one_line_error(capsys).startswith("dskbench: DSKBENCH_CASE_TIMEOUT_S: expected seconds")
    monkeypatch.delenv("DSKBENCH_CASE_TIMEOUT_S")
    readme = tmp_path / "README.md"
    readme.write_text("# not results\n")
    for world in ({"WORLD_SIZE": "2", "RANK": "0"}, {}):  # a rank (before its process group), the driver
        for k in ("WORLD_SIZE", "RANK"):
            monkeypatch.delenv(k, raising=False)
        for k, v in world.items():
            monkeypatch.setenv(k, v)
        args = ["--device", "cpu", "--out", str(readme)] + ([] if world else ["--nproc", "2"])
        assert main(["comm", *args]) == EXIT_USAGE
        assert _one_line_error(capsys).startswith(f"dskbench: comm: {readme} is not a dskbench results file")
    assert readme.read_text() == "# not results\n"


def test_comm_limits_default_from_the_environment(monkeypatch):
    def limits(argv, environ):
        args = build_parser().parse_args(["comm", *argv])
        hang_limits(args, environ)
        return args.case_timeout, args.setup_timeout

    assert limits([], {}) == (comm_plan.CASE_TIMEOUT_S, comm_plan.SETUP_TIMEOUT_S) == (240.0, 480.0)
    assert limits([], {"DSKBENCH_CASE_TIMEOUT_S": "30"}) == (30.0, 480.0)
    assert limits([], {"DSKBENCH_CASE_TIMEOUT_S": "0"}) == (0.0, 0.0)  # the watch off, as for dskbench run
    flags = ["--case-timeout", "12.5", "--setup-timeout", "0"]
    assert limits(flags, {"DSKBENCH_CASE_TIMEOUT_S": "30"}) == (12.5, 0.0)  # flags win
    with pytest.raises(LimitError, match="DSKBENCH_CASE_TIMEOUT_S"):
        limits(flags, {"DSKBENCH_CASE_TIMEOUT_S": "x"})  # a bad setting is an error even when unused
