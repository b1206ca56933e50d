"""Communication kernels on the CPU: the reference math and bandwidth formulas, the runner's multi-GPU
skips, the collective timing's agreement (two gloo processes, and the CUDA path on the simulated GPU),
and scripts/comm_bench.py end to end over gloo. The NCCL and custom all-reduce kernels themselves need
several GPUs: they are not run here."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dskbench.adapters.backends import DeviceInfo
from dskbench.adapters.comm.allreduce import (
    CustomAllReduce,
    FlashInferCommFusion,
    algbw_gbps,
    bus_bytes,
    busbw_gbps,
    comm_cases,
)
from dskbench.adapters.comm.setups import RANK_SETUPS
from dskbench.execution import shard
from dskbench.execution.runner import SweepOptions, WorkItem, plan_sweep, prepare_case, run_one
from dskbench.measure.collective import Agreement, measure_collective
from dskbench.registry.load import load_registry
from dskbench.results.environment import multicast_block
from dskbench.results.io import read_runs
from dskbench.shapes.cases import Case, default_shapes
from tests.test_measure_cuda_sim import KERNEL_US, SETTINGS, launchers, sim  # noqa: F401 - the fixture

REPO = Path(__file__).resolve().parents[1]
SHAPES = default_shapes()
H200 = DeviceInfo("cuda", "NVIDIA H200", 90, 1)


def _case(kernel: str, t: int, world: int, h: int = 7168) -> Case:
    dims = {"T": t, "H": h, "world": world}
    return Case(kernel, "all_reduce", "decode", {"T": t, "tp": world}, dims, model=SHAPES.config)


# -- formulas and references ------------------------------------------------------------------------------


def test_bandwidth_formulas():
    payload = 16 * 7168 * 2
    assert algbw_gbps(payload, 10.0) == pytest.approx(payload / 10e-6 / 1e9)
    assert busbw_gbps(payload, 2, 10.0) == pytest.approx(algbw_gbps(payload, 10.0))  # 2(n-1)/n = 1 at n=2
    assert busbw_gbps(payload, 8, 10.0) == pytest.approx(1.75 * algbw_gbps(payload, 10.0))
    assert bus_bytes(payload, 4) == 1.5 * payload
    t = CustomAllReduce().traffic(_case("custom_all_reduce", 16, 8))
    assert t.bytes == int(1.75 * payload) and "2(n-1)/n" in t.note


def test_all_reduce_reference_is_the_sum_over_ranks():
    a, case = CustomAllReduce(), _case("custom_all_reduce", 3, 4, h=64)
    inputs = a.make_inputs(case, "cpu", 5)
    x = inputs["x"]
    assert x.shape == (4, 3, 64) and x.dtype == torch.bfloat16
    assert len({float(x[r].float().sum()) for r in range(4)}) == 4  # every rank contributes its own
    assert torch.equal(a.make_inputs(case, "cpu", 5)["x"], x) and not torch.equal(
        a.make_inputs(case, "cpu", 6)["x"], x
    )
    ranks = [a.rank_inputs(inputs, r)["x"] for r in range(4)]
    ranks[0].add_(1)  # a rank's tensors are its own copies: in-place baselines do not touch the others
    assert torch.equal(inputs["x"][0], x[0]) and not torch.equal(ranks[0], x[0])
    ref = a.reference(inputs, case)
    assert ref.dtype == torch.float32
    assert torch.allclose(ref, x[0].float() + x[1].float() + x[2].float() + x[3].float())
    chk = a.check(ref.to(torch.bfloat16), ref, case)  # a bf16 result of the right sum passes
    assert chk.ok and chk.tolerance == pytest.approx(1.6e-2)
    assert not a.check((ref - x[3].float()).to(torch.bfloat16), ref, case).ok  # a rank left out fails


def test_fusion_reference_is_all_reduce_then_residual_add_then_rmsnorm():
    a, case = FlashInferCommFusion(), _case("flashinfer_communication_fusion", 5, 2, h=128)
    inputs = a.make_inputs(case, "cpu", 3)
    norm_out, residual_out = a.reference(inputs, case)
    r = inputs["x"][0].float() + inputs["x"][1].float() + inputs["residual"].float()
    assert torch.allclose(residual_out, r)
    want = torch.nn.functional.rms_norm(r, (128,), weight=inputs["gamma"].float(), eps=1e-6)
    assert torch.allclose(norm_out, want, rtol=1e-5, atol=1e-5)
    assert set(a.rank_inputs(inputs, 1)) == {"x", "residual", "gamma"}
    # eps is the case's model's rms_norm_eps, not a constant
    loose = replace(case, model={**case.model, "rms_norm_eps": 1.0})
    want_loose = torch.nn.functional.rms_norm(r, (128,), weight=inputs["gamma"].float(), eps=1.0)
    assert torch.allclose(a.reference(inputs, loose)[0], want_loose, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(want_loose, want, rtol=1e-3, atol=1e-3)


def test_adapters_need_their_tp_degree_and_use_the_shapes_file_cases():
    a = CustomAllReduce()
    assert not a.applies(_case("custom_all_reduce", 1, 1)) and a.applies(_case("custom_all_reduce", 1, 2))
    assert a.gpus_needed(_case("custom_all_reduce", 1, 8)) == 8
    ours = comm_cases(SHAPES, "custom_all_reduce", 8, ("decode", "prefill"), "quick")
    runner = [
        c
        for ph in ("decode", "prefill")
        for c in SHAPES.cases("custom_all_reduce", ["all_reduce"], "allreduce", ph, "quick", [8])
    ]
    assert [(c.id, c.dims) for c in ours] == [(c.id, c.dims) for c in runner]  # one case id, either way
    assert {c.dims["H"] for c in ours} == {7168}
    tp2 = comm_cases(SHAPES, "custom_all_reduce", 2, ("decode",), "full", tokens=[1, 512])
    assert [c.id for c in tp2] == [
        "custom_all_reduce/all_reduce/decode/T=1,tp=2",
        "custom_all_reduce/all_reduce/decode/T=512,tp=2",
    ]
    names = {(k.kernel, b.name) for k in (CustomAllReduce, FlashInferCommFusion) for b in k.backends}
    assert set(RANK_SETUPS) == names


# -- the runner on one GPU ---------------------------------------------------------------------------------


def test_runner_skips_collectives_with_the_gpus_they_need():
    case = _case("custom_all_reduce", 16, 4)
    fields, prep = prepare_case("custom_all_reduce", case, "sgl_kernel", H200, seed=1)
    assert prep is None and fields["status"] == "skipped" and fields["reason"] == "needs 4 GPUs (found 1)"
    eight = DeviceInfo("cuda", "NVIDIA H200", 90, 8)
    fields, _ = prepare_case(
        "flashinfer_communication_fusion", _case("x", 16, 4), "flashinfer", eight, seed=1
    )
    assert "torchrun --nproc-per-node 4 scripts/comm_bench.py" in fields["reason"]
    # a shard's worker sees one GPU; the host's count decides
    item = WorkItem(0, "custom_all_reduce", "nccl", case.to_json())
    opts = SweepOptions(device="cuda", host_gpus=8)
    assert "comm_bench.py" in run_one(item, H200, opts, 1, None)["reason"]


def test_plan_has_collective_cases_at_tp_above_one_else_one_skip():
    reg = load_registry()
    kernels = ["custom_all_reduce", "flashinfer_communication_fusion"]
    assert {reg[k].status for k in kernels} == {"needs-multi-gpu"}
    items, skips = plan_sweep(reg, SHAPES, kernels, None, SweepOptions(device="cuda", tp=(1,)))
    assert items == [] and sorted(s["kernel"] for s in skips) == kernels
    assert all(s["reason"].startswith("needs-multi-gpu") for s in skips)
    items, skips = plan_sweep(
        reg, SHAPES, kernels, None, SweepOptions(device="cuda", tp=(4, 8), profile="full")
    )
    assert skips == [] and {i.case["point"]["tp"] for i in items} == {4, 8}
    assert {i.backend for i in items} == {b for _k, b in RANK_SETUPS}


# -- the collective timing ---------------------------------------------------------------------------------


class Scripted(Agreement):
    """One rank whose peers' decisions are scripted: value() returns rank 0's choice where one is given
    (None: this rank's own), all() ANDs in the other ranks' flags."""

    def __init__(self, values=(), alls=()):
        self.group, self.active, self.rank, self.size = None, False, 0, 2
        self.values, self.alls = list(values), list(alls)
        self.asked: list[float] = []

    def value(self, x):
        self.asked.append(x)
        v = self.values.pop(0) if self.values else None
        return x if v is None else v

    def all(self, flag):
        return bool(flag) and (self.alls.pop(0) if self.alls else True)


def test_collective_graph_timing_on_the_simulated_gpu(sim):  # noqa: F811
    m = measure_collective(launchers(sim, 1), agree=Agreement(), mode="hot", settings=SETTINGS)
    assert m.method == "cuda-graph" and m.fallback_reason is None
    assert m.median_us == pytest.approx(KERNEL_US, rel=0.03)
    assert any("collective" in n for n in m.notes)
    cold = measure_collective(launchers(sim, 1), agree=Agreement(), mode="cold", settings=SETTINGS)
    assert cold.median_us == pytest.approx(KERNEL_US + 1.5, rel=0.05) and cold.flush_us is not None


def test_collective_follows_rank_zero_and_the_other_ranks_capture(sim):  # noqa: F811
    agree = Scripted(values=[24, 5])  # rank 0's launches per graph and replays per batch
    m = measure_collective(launchers(sim, 1), agree=agree, mode="hot", settings=SETTINGS)
    assert m.method == "cuda-graph" and m.launches_per_sample == 24 and agree.asked[0] != 24
    entered = []

    class Ctx:
        def __enter__(self):
            entered.append(1)

        def __exit__(self, *exc):
            return False

    failed = Scripted(alls=[False])  # capture worked here, not on another rank: all time eagerly
    m = measure_collective(
        launchers(sim, 1), agree=failed, mode="hot", settings=SETTINGS, capture_context=Ctx
    )
    assert m.method == "cuda-eager" and "another rank" in m.fallback_reason and entered == [1]
    assert m.median_us == pytest.approx(KERNEL_US, rel=0.03)
    broken = Scripted(alls=[False, False])  # another rank's capture broke its context: no eager fallback
    with pytest.raises(RuntimeError, match="graph capture broke on another rank"):
        measure_collective(launchers(sim, 1), agree=broken, mode="hot", settings=SETTINGS)
    eager = Scripted(values=[None, 3, 10])  # n, then rank 0's samples per batch and group size
    m = measure_collective(launchers(sim, 2), agree=eager, mode="hot", capturable=False, settings=SETTINGS)
    assert m.method == "cuda-eager" and m.launches_per_sample == 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(cmd: list[str], n: int = 2, timeout: float = 120) -> list[subprocess.CompletedProcess]:
    """Run cmd as n gloo ranks (the variables torchrun sets), in parallel."""
    port = str(_free_port())
    procs = []
    for r in range(n):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(n)}
        env.update(RANK=str(r), LOCAL_RANK=str(r), PYTHONPATH=str(REPO))
        procs.append(
            subprocess.Popen(
                cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr))
    return out


AGREEMENT_PROGRAM = """
import json, torch, torch.distributed as dist
from dskbench.measure import MeasureSettings
from dskbench.measure.collective import Agreement, drive_collective
dist.init_process_group("gloo")
agree = Agreement(dist.new_group(backend="gloo"))
rank = agree.rank

class Timer:
    batch_gpu_us, batches = 0.0, 0
    def batch(self, busy):
        self.batches += 1
        dist.all_reduce(torch.ones(1))  # a collective per batch: uneven counts would hang
        return [10.0] * 4 if rank == 0 else [10.0 + i % 7 for i in range(4)]

s = MeasureSettings(target_noise=0.01, min_samples=8, max_samples=400, min_time_s=0.0, max_time_s=20.0,
                    cooldown=0.0)
timer = Timer()
st = drive_collective(timer, s, agree)
print("RESULT " + json.dumps({"batches": timer.batches, "n": len(st.samples), "value": agree.value(41 + rank),
      "all": agree.all(rank == 0), "gather": agree.gather(10 * rank)}), flush=True)
dist.barrier()
dist.destroy_process_group()  # else gloo's threads can abort the exit
"""


def test_agreement_keeps_two_gloo_ranks_in_step(tmp_path):
    prog = tmp_path / "agree.py"
    prog.write_text(AGREEMENT_PROGRAM)
    done = _ranks([sys.executable, str(prog)])
    res = []
    for d in done:
        assert d.returncode == 0, d.stderr[-2000:]
        res.append(json.loads(d.stdout.split("RESULT ", 1)[1]))
    assert res[0]["batches"] == res[1]["batches"] > 2  # rank 0 converged at once, kept launching in step
    assert res[0]["n"] == 8 and res[1]["n"] > 8  # ... and ignored the samples after its own stop
    assert [r["value"] for r in res] == [41.0, 41.0] and [r["all"] for r in res] == [False, False]
    assert res[0]["gather"] == res[1]["gather"] == [0, 10]


# -- scripts/comm_bench.py ---------------------------------------------------------------------------------

SCRIPT = REPO / "scripts" / "comm_bench.py"


def _script(monkeypatch, no_multicast: str | None = None):
    """Import comm_bench.py as its ranks do; no_multicast: the DSKBENCH_NO_MULTICAST it sees."""
    for k in shard.NO_MULTICAST_ENV:  # importing the script may set them: restore afterwards
        monkeypatch.setenv(k, "unset")
    if no_multicast is None:
        monkeypatch.delenv("DSKBENCH_NO_MULTICAST", raising=False)
    else:
        monkeypatch.setenv("DSKBENCH_NO_MULTICAST", no_multicast)
    monkeypatch.delenv("SGLANG_SKIP_P2P_CHECK", raising=False)
    spec = importlib.util.spec_from_file_location("comm_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "comm_bench", mod)  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


def test_comm_bench_arguments(monkeypatch, capsys):
    for switch, off in ((None, False), ("0", False), ("1", True)):  # multicast off only when asked
        cb = _script(monkeypatch, switch)
        seen = {k: os.environ[k] for k in shard.NO_MULTICAST_ENV}
        assert seen == (shard.NO_MULTICAST_ENV if off else dict.fromkeys(shard.NO_MULTICAST_ENV, "unset"))
    assert cb.NO_MULTICAST_ENV == shard.NO_MULTICAST_ENV
    assert os.environ["SGLANG_SKIP_P2P_CHECK"] == "1"  # else sglang's P2P test fails every custom AR set-up
    for k in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(k, raising=False)
    assert cb.main(["--out", "x.jsonl"]) == cb.EXIT_USAGE
    assert "torchrun --nproc-per-node N" in capsys.readouterr().err
    assert cb.main(["--dry-run", "--world", "4", "--quick", "--backend", "nope"]) == cb.EXIT_USAGE
    assert "unknown backend(s) nope" in capsys.readouterr().err
    assert cb.main(["--dry-run", "--world", "8", "--kernel", "custom_all_reduce", "--tokens", "1,4096"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "12 cases at TP 8"  # 2 tokens x decode and prefill x 3 backends
    assert "custom_all_reduce/all_reduce/prefill/T=4096,tp=8  sglang_jit" in lines
    assert cb.main(["--dry-run", "--world", "2", "--tokens", "1"]) == 0
    order = []
    for ln in capsys.readouterr().out.splitlines()[:-1]:
        if ln.split()[-1] not in order:
            order.append(ln.split()[-1])
    assert order == list(cb.BACKEND_ORDER)  # the baselines and the AOT kernel before the JIT builds


def test_comm_bench_two_gloo_ranks_end_to_end(tmp_path):
    out = tmp_path / "comm.jsonl"
    args = ["--device", "cpu", "--tokens", "1,16", "--sweep", "decode", "--budget", "0.05", "--seed", "3"]
    done = _ranks([sys.executable, str(SCRIPT), *args, "--out", str(out)])
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
    done = _ranks([sys.executable, str(SCRIPT), *args, "--out", str(out), "--resume"])
    assert all(d.returncode == 0 for d in done)
    runs = read_runs([out])
    assert len(runs) == 2 and runs[1].results == []


def test_comm_bench_numeric_visible_devices(monkeypatch):
    cb = _script(monkeypatch)
    index = {"GPU-aaaa-1111": 3, "GPU-bbbb-2222": 5}.__getitem__
    env = {"CUDA_VISIBLE_DEVICES": "GPU-bbbb-2222, GPU-aaaa-1111"}
    assert cb.numeric_visible_devices(env, index) == "5,3"  # order kept: device 0 stays the first named
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
        assert cb.numeric_visible_devices(unchanged, index) is None and unchanged == before


def test_custom_all_reduce_setups_trust_the_driver_p2p(monkeypatch):
    from dskbench.adapters.comm.rank import trust_driver_p2p

    monkeypatch.delenv("SGLANG_SKIP_P2P_CHECK", raising=False)
    trust_driver_p2p()
    assert os.environ["SGLANG_SKIP_P2P_CHECK"] == "1"
    monkeypatch.setenv("SGLANG_SKIP_P2P_CHECK", "0")  # an explicit choice stands
    trust_driver_p2p()
    assert os.environ["SGLANG_SKIP_P2P_CHECK"] == "0"


def test_sglang_jit_skips_a_size_either_config_hands_to_nccl():
    from dskbench.adapters.comm.custom_allreduce import SglangJitAllReduce

    mib = 2**20
    limits = {True: 16 * mib, False: 4 * mib}  # graph config, eager config

    def pick(nbytes, can_use_graph):
        algo = SimpleNamespace(algo_name="1shot_push") if nbytes <= limits[can_use_graph] else None
        return algo, None

    setup = SglangJitAllReduce.__new__(SglangJitAllReduce)
    setup.ca = SimpleNamespace(_pick_algo=pick, max_size=16 * mib)
    x = lambda t: {"x": torch.empty(t, 7168, dtype=torch.bfloat16)}  # noqa: E731
    assert setup.skip(x(256), None) is None and setup.detail(x(256), None) == "algo 1shot_push"
    assert "eager config" in setup.skip(x(512), None)  # 7 MiB: an eager launch would assert
    assert "graph config" in setup.skip(x(2048), None)


def test_fusion_runs_only_where_sglang_fuses():
    from dskbench.adapters.comm.fusion import FUSION_MAX_TOKENS, FlashInferFusion

    setup = FlashInferFusion.__new__(FlashInferFusion)
    fits = {"yes": True}
    setup.world, setup.ws = 2, SimpleNamespace(is_buffer_size_sufficient=lambda *a: fits["yes"])
    x = lambda t: {"x": torch.empty(t, 64, dtype=torch.bfloat16)}  # noqa: E731
    assert FUSION_MAX_TOKENS == 2048
    assert setup.skip(x(2048), None) is None
    assert "2048-token fusion limit" in setup.skip(x(4096), None)
    fits["yes"] = False
    assert "does not fit" in setup.skip(x(16), None)


def test_watchdog_ends_the_process_after_recording(monkeypatch):
    import threading
    import time

    cb = _script(monkeypatch)
    ended, recorded = threading.Event(), []
    codes: list[int] = []

    def fake_exit(code):
        codes.append(code)
        ended.set()

    wd = cb.Watchdog(exit=fake_exit, period=0.01, backstop=False)
    wd.arm(5.0, "a case")
    wd.disarm()  # disarmed in time: nothing happens
    wd.arm(0.05, "a case", on_expire=lambda: recorded.append("timed out"))
    assert ended.wait(5) and codes == [cb.EXIT_HUNG] and recorded == ["timed out"] and wd.fired == "a case"
    quiet = cb.Watchdog(exit=fake_exit, period=0.01, backstop=False)
    quiet.arm(0.05, "x")
    quiet.disarm()
    time.sleep(0.2)
    assert codes == [cb.EXIT_HUNG]
    teardown = cb.Watchdog(exit=fake_exit, period=0.01, backstop=False)
    ended.clear()
    teardown.arm(0.02, "the end of the run", code=0)  # a hang after every record is written: success
    assert ended.wait(5) and codes == [cb.EXIT_HUNG, 0]


FAILURES_PROGRAM = """
import importlib.util, os, sys, time
import torch.distributed as dist
spec = importlib.util.spec_from_file_location("comm_bench", sys.argv[1])
cb = importlib.util.module_from_spec(spec)
sys.modules["comm_bench"] = cb
spec.loader.exec_module(cb)
from dskbench.adapters.comm import rank, setups

MODE = sys.argv[2]
cb.RANK_GRACE_S = 1.0

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
code = cb.main(sys.argv[3:])
sys.stdout.flush()
os._exit(code)
"""


def test_comm_bench_failures_are_agreed_and_recorded(tmp_path):
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
    done = _ranks([sys.executable, str(prog), str(SCRIPT), "fail", *args, "--out", str(out)])
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


def test_comm_bench_watchdog_records_a_hang_and_ends_the_ranks(tmp_path):
    prog = tmp_path / "hang.py"
    prog.write_text(FAILURES_PROGRAM)
    out = tmp_path / "hang.jsonl"
    args = ["--device", "cpu", "--tokens", "1,4", "--sweep", "decode", "--budget", "0.05", "--seed", "3"]
    args += ["--kernel", "custom_all_reduce", "--backend", "nccl", "--case-timeout", "3"]
    done = _ranks([sys.executable, str(prog), str(SCRIPT), "hang", *args, "--out", str(out)], timeout=90)
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
        "comm_bench.py: timed out: custom_all_reduce/all_reduce/decode/T=4,tp=2 · nccl gave no result "
        "within 3 s; ending this process" in done[0].stderr
    )


def test_comm_bench_driver_runs_one_torchrun_per_backend(tmp_path):
    out = tmp_path / "driver.jsonl"
    args = ["--nproc", "2", "--device", "cpu", "--kernel", "custom_all_reduce", "--tokens", "1"]
    args += ["--sweep", "decode", "--budget", "0.05", "--seed", "3", "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = read_runs([out])
    assert [[r["backend"]["name"] for r in run.results] for run in runs] == [
        ["nccl"],
        ["sgl_kernel"],
        ["sglang_jit"],
    ]  # one run (one torchrun) per backend, in BACKEND_ORDER
    assert runs[0].results[0]["status"] == "ok" and runs[1].results[0]["status"] == "skipped"


def test_driver_background_builds(monkeypatch, capsys):
    cb = _script(monkeypatch)
    for code in cb.PRECOMPILE.values():  # the build snippets are valid Python for any world size
        compile(code.format(world=2), "<precompile>", "exec")
    assert set(cb.PRECOMPILE) <= set(cb.BACKEND_ORDER)
    monkeypatch.setattr(
        cb,
        "PRECOMPILE",
        {"sglang_jit": "print('built')", "flashinfer": "import sys; print('nvcc died'); sys.exit(3)"},
    )
    procs = cb.start_precompile(["nccl", "sglang_jit", "flashinfer"], 2)
    assert [name for name, _p, _log in procs] == ["sglang_jit", "flashinfer"]  # nccl builds nothing
    for _name, proc, _log in procs:
        proc.wait(timeout=60)
    cb.stop_precompile(procs)
    out = capsys.readouterr().out
    assert "background JIT build for flashinfer failed (3): nvcc died" in out
    assert "for sglang_jit failed" not in out


def test_fusion_needs_peer_access_on_every_rank_first():
    from dskbench.adapters.backends import Unavailable
    from dskbench.adapters.comm.rank import RankContext, need_peer_access

    ctx = RankContext(1, 2, torch.device("cuda", 1), None, None, 1, 7168)
    votes = []

    def all_ranks(flag, others=True):
        votes.append(flag)
        return flag and others

    need_peer_access(ctx, can_access=lambda a, b: True, all_ranks=all_ranks)
    with pytest.raises(Unavailable, match="GPU 1 has no peer access to GPU 0"):
        need_peer_access(ctx, can_access=lambda a, b: False, all_ranks=all_ranks)
    with pytest.raises(Unavailable, match="another GPU"):  # this one is fine, a peer is not: all give up
        need_peer_access(ctx, can_access=lambda a, b: True, all_ranks=lambda f: all_ranks(f, others=False))
    assert votes == [True, False, True]  # every rank votes before any of them gives up
    cpu = RankContext(0, 2, torch.device("cpu"), None, None, 1, 7168)
    need_peer_access(cpu, can_access=lambda a, b: False, all_ranks=all_ranks)  # gloo runs: no check


def test_comm_bench_eight_gloo_ranks_run_the_tp8_path(tmp_path):
    """TP=8 with no 8-GPU machine at hand: the same code with 8 CPU ranks: the plan,
    the rank agreement, NCCL's stand-in all-reduce checked on every rank, and the bus-bandwidth
    factor 2(n-1)/n with n = 8."""
    out = tmp_path / "comm8.jsonl"
    args = ["--device", "cpu", "--tokens", "4", "--sweep", "decode", "--budget", "0.02", "--seed", "5"]
    args += ["--kernel", "custom_all_reduce", "--backend", "nccl"]
    done = _ranks([sys.executable, str(SCRIPT), *args, "--out", str(out)], n=8, timeout=300)
    for d in done:
        assert d.returncode == 0, d.stderr[-3000:]
    (run,) = read_runs([out])
    assert len(run.environment["gpus"]) == 8 and run.environment["settings"]["world"] == 8
    (rec,) = run.results
    assert rec["case_id"] == "custom_all_reduce/all_reduce/decode/T=4,tp=8" and rec["status"] == "ok"
    assert rec["world"] == 8 and len(rec["ranks"]) == 8 and rec["check"]["error"] < 1e-2
    m = rec["metrics"]
    assert m["busbw_gbps"] == pytest.approx(m["algbw_gbps"] * 2 * 7 / 8)


# -- the engine's pieces in scripts/comm_bench.py: limits, --out, the driver's watch ---------------------


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_comm_bench_bad_limits_and_out_are_one_line_usage_errors(monkeypatch, capsys, tmp_path):
    cb = _script(monkeypatch)
    monkeypatch.delenv("DSKBENCH_CASE_TIMEOUT_S", raising=False)
    for flag, bad in (("--case-timeout", "soon"), ("--case-timeout", "-1"), ("--setup-timeout", "nan")):
        assert cb.main(["--dry-run", "--world", "2", flag, bad]) == cb.EXIT_USAGE
        assert _one_line_error(capsys) == (
            f"comm_bench.py: {flag}: expected seconds (a number >= 0, 0 = no limit), got {bad!r}"
        )
    monkeypatch.setenv("DSKBENCH_CASE_TIMEOUT_S", "inf")
    assert cb.main(["--dry-run", "--world", "2"]) == cb.EXIT_USAGE
    assert _one_line_error(capsys).startswith("comm_bench.py: DSKBENCH_CASE_TIMEOUT_S: expected seconds")
    monkeypatch.delenv("DSKBENCH_CASE_TIMEOUT_S")
    readme = tmp_path / "README.md"
    readme.write_text("# not results\n")
    for world in ({"WORLD_SIZE": "2", "RANK": "0"}, {}):  # a rank (before its process group), the driver
        for k in ("WORLD_SIZE", "RANK"):
            monkeypatch.delenv(k, raising=False)
        for k, v in world.items():
            monkeypatch.setenv(k, v)
        args = ["--device", "cpu", "--out", str(readme)] + ([] if world else ["--nproc", "2"])
        assert cb.main(args) == cb.EXIT_USAGE
        assert _one_line_error(capsys).startswith(f"comm_bench.py: {readme} is not a dskbench results file")
    assert readme.read_text() == "# not results\n"


def test_comm_bench_limits_default_from_the_environment(monkeypatch):
    cb = _script(monkeypatch)

    def limits(argv, environ):
        args = cb.build_parser().parse_args(argv)
        cb.hang_limits(args, environ)
        return args.case_timeout, args.setup_timeout

    assert limits([], {}) == (cb.CASE_TIMEOUT_S, cb.SETUP_TIMEOUT_S) == (240.0, 480.0)
    assert limits([], {"DSKBENCH_CASE_TIMEOUT_S": "30"}) == (30.0, 480.0)
    assert limits([], {"DSKBENCH_CASE_TIMEOUT_S": "0"}) == (0.0, 0.0)  # the watch off, as for dskbench run
    flags = ["--case-timeout", "12.5", "--setup-timeout", "0"]
    assert limits(flags, {"DSKBENCH_CASE_TIMEOUT_S": "30"}) == (12.5, 0.0)  # flags win
    with pytest.raises(cb.LimitError, match="DSKBENCH_CASE_TIMEOUT_S"):
        limits(flags, {"DSKBENCH_CASE_TIMEOUT_S": "x"})  # a bad setting is an error even when unused


def test_the_gating_chain_lets_a_process_group_run_its_collective():
    from dskbench.execution.gate import why_not

    case = _case("custom_all_reduce", 16, 4)
    adapter = CustomAllReduce()
    nccl = {b.name: b for b in adapter.backends}["nccl"]
    four = DeviceInfo("cuda", "NVIDIA H200", 90, 4)
    assert "torchrun --nproc-per-node 4" in why_not(adapter, nccl, case, four)  # the sweep's worker
    assert why_not(adapter, nccl, case, four, ranks=4) is None  # comm_bench's four ranks
    assert why_not(adapter, nccl, case, DeviceInfo("cpu"), ranks=4) is None  # gloo ranks
    assert why_not(adapter, nccl, case, DeviceInfo("cpu"), ranks=2) == "needs 4 GPUs (found 0)"
    sgl = {b.name: b for b in adapter.backends}["sgl_kernel"]
    assert why_not(adapter, sgl, case, DeviceInfo("cpu"), ranks=4) == "needs a CUDA GPU (found no CUDA GPU)"


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
    cb = _script(monkeypatch)
    prog, ready = tmp_path / "launcher.py", tmp_path / "ready"
    prog.write_text(FAKE_LAUNCHER)
    clock = ReadyClock(ready, [100.0 + 1])  # past the limit as soon as the launcher is ready
    code, why = cb.run_child([sys.executable, str(prog), str(ready), "hang"], 100, "a test", 0.1, clock)
    assert code == cb.EXIT_HUNG
    assert why == "timed out: no result within 100 s (a test); the torchrun and its ranks were killed"
    assert f"comm_bench.py: {why}" in capsys.readouterr().err
    rank, helper, _ = (int(x) for x in ready.read_text().split())
    assert _gone(rank) and _gone(helper)  # its own group's and the rank's own session's processes


def test_driver_does_not_count_a_ranks_jit_build_against_the_limit(monkeypatch, tmp_path):
    cb = _script(monkeypatch)
    prog, ready = tmp_path / "launcher.py", tmp_path / "ready"
    prog.write_text(FAKE_LAUNCHER)
    late = 100.0 + cb.BUILD_GRACE_S + 1
    clock = ReadyClock(ready, [101.0] * 5 + [late])  # past the limit, a compiler runs; later past the grace
    code, why = cb.run_child([sys.executable, str(prog), str(ready), "build"], 100, "a test", 0.1, clock)
    assert code == cb.EXIT_HUNG and why.startswith("timed out: no result within 100 s")
    assert clock.served[-1] == late and clock.served.count(101.0) == 5  # not killed while building
    rank, helper, compiler = (int(x) for x in ready.read_text().split())
    assert _gone(rank) and _gone(helper) and _gone(compiler)


def test_driver_reason_for_a_dead_launcher_is_the_engines(monkeypatch):
    cb = _script(monkeypatch)
    crash = (
        "import sys; print('Traceback (most recent call last):', file=sys.stderr); "
        "print('RuntimeError: CUDA error: an illegal memory access was encountered', file=sys.stderr); "
        "print('CUDA kernel errors might be asynchronously reported at some other API call', file=sys.stderr); "
        "sys.exit(1)"
    )
    assert cb.run_child([sys.executable, "-c", crash], None) == (
        1,
        "torchrun died (exit code 1) while running this case: "
        "CUDA error: an illegal memory access was encountered",
    )
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert cb.run_child([sys.executable, "-c", killed], 1000) == (
        -9,
        "torchrun died (killed by SIGKILL) while running this case",
    )
    assert cb.run_child([sys.executable, "-c", "pass"], 1000) == (0, None)


SEGV_RANK = """
import os, signal, time
if os.environ["RANK"] == "1":
    os.kill(os.getpid(), signal.SIGSEGV)
time.sleep(60)
"""


def test_driver_reason_names_the_rank_torchrun_lost(monkeypatch, tmp_path):
    """A real torchrun whose rank 1 dies of SIGSEGV: the reason says so, not torchrun's own traceback."""
    cb = _script(monkeypatch)
    prog = tmp_path / "segv.py"
    prog.write_text(SEGV_RANK)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):  # run_child passes this process's environment on
        monkeypatch.delenv(k, raising=False)
    code, why = cb.run_child([*cb.TORCHRUN, "--nproc-per-node", "2", str(prog)], None)
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
    cb = _script(monkeypatch)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "DSKBENCH_CASE_TIMEOUT_S"):
        monkeypatch.delenv(k, raising=False)
    prog, ready, out = tmp_path / "torchrun.py", tmp_path / "ready", tmp_path / "driver.jsonl"
    prog.write_text(FAKE_TORCHRUN)
    monkeypatch.setattr(cb, "TORCHRUN", [sys.executable, str(prog), str(REPO), mode, str(ready)])
    monkeypatch.setattr(cb, "CLOCK", ReadyClock(ready, [1e9]))
    args = ["--nproc", "2", "--device", "cpu", "--kernel", "custom_all_reduce", "--backend", "nccl"]
    args += ["--tokens", "1,4,16", "--sweep", "decode", "--out", str(out)]
    assert cb.main(args) == 1
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
        limit = cb.SETUP_TIMEOUT_S + 3 * cb.CASE_TIMEOUT_S + 2 * cb.TEARDOWN_S + cb.START_S
        why = (
            f"timed out: no result within {limit:g} s (--setup-timeout 480 s + 3 cases x --case-timeout 240 s"
            " + start and teardown); the torchrun and its ranks were killed"
        )
    # the case it was on has its error; the one after it has no record, so --resume runs it
    assert got == {"T=1,tp=2": ("wrong", "fake"), "T=4,tp=2": ("error", why)}
    lost = run.results[-1]
    assert lost["index"] == 1 and lost["world"] == 2 and lost["backend"] == {"name": "nccl"}
    assert f"comm_bench.py: custom_all_reduce/all_reduce/decode/T=4,tp=2 · nccl: error: {why}" in err
