"""Communication kernels on the CPU: the reference math and bandwidth formulas, the runner's multi-GPU
skips, the collective timing's agreement (two gloo processes, and the CUDA path on the simulated GPU),
and the rank set-ups' own rules (`dskbench comm` itself: test_comm_command.py, test_comm_driver.py). The NCCL and custom all-reduce kernels themselves need
several GPUs: they are not run here."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dskbench.adapters.comm.allreduce import (
    CustomAllReduce,
    FlashInferCommFusion,
    algbw_gbps,
    bus_bytes,
    busbw_gbps,
    comm_cases,
)
from dskbench.adapters.comm.setups import RANK_SETUPS
from dskbench.device.info import DeviceInfo
from dskbench.execution.runner import SweepOptions, WorkItem, plan_sweep, prepare_case, run_one
from dskbench.measure.collective import Agreement, measure_collective
from dskbench.registry.load import load_registry
from dskbench.shapes.cases import Case, default_shapes
from tests.comm_ranks import ranks as _ranks
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
    assert "dskbench comm --nproc 4" in fields["reason"]
    # a shard's worker sees one GPU; the host's count decides
    item = WorkItem(0, "custom_all_reduce", "nccl", case.to_json())
    opts = SweepOptions(device="cuda", host_gpus=8)
    assert "dskbench comm" in run_one(item, H200, opts, 1, None)["reason"]


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


# -- the rank set-ups' own rules ------------------------------------------------------------------------


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


def test_the_gating_chain_lets_a_process_group_run_its_collective():
    from dskbench.execution.gate import why_not

    case = _case("custom_all_reduce", 16, 4)
    adapter = CustomAllReduce()
    nccl = {b.name: b for b in adapter.backends}["nccl"]
    four = DeviceInfo("cuda", "NVIDIA H200", 90, 4)
    assert "dskbench comm --nproc 4" in why_not(adapter, nccl, case, four)  # the sweep's worker
    assert why_not(adapter, nccl, case, four, ranks=4) is None  # dskbench comm's four ranks
    assert why_not(adapter, nccl, case, DeviceInfo("cpu"), ranks=4) is None  # gloo ranks
    assert why_not(adapter, nccl, case, DeviceInfo("cpu"), ranks=2) == "needs 4 GPUs (found 0)"
    sgl = {b.name: b for b in adapter.backends}["sgl_kernel"]
    assert why_not(adapter, sgl, case, DeviceInfo("cpu"), ranks=4) == "needs a CUDA GPU (found no CUDA GPU)"
