"""The one gating rule (dskbench.execution.gate): what it checks, in which order, and that the planner,
the cost model and the case's execution ask it."""

from __future__ import annotations

from dataclasses import replace

from dskbench.adapters.backends import CPU_OK, SM100, Backend, Requirement
from dskbench.adapters.base import Traffic
from dskbench.device.info import DeviceInfo
from dskbench.execution import case as case_mod
from dskbench.execution import cost
from dskbench.execution.gate import applicable, memory_reason, why_not
from dskbench.execution.items import WorkItem
from dskbench.shapes.cases import Case

GIB = 2**30
H100 = DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", 90, 1, 80 * GIB)


class FakeAdapter:
    kernel = "fake_gate"

    def __init__(
        self,
        nbytes: int = 1 << 20,
        skip: str | None = None,
        gpus: int = 1,
        applies: bool = True,
        cpu_skip: str | None = None,
    ):
        self.nbytes, self.skip, self.gpus, self.apply, self.cpu_skip = nbytes, skip, gpus, applies, cpu_skip
        self.traffic_asked = 0
        self.scratch = 0

    def cpu_skip_reason(self, case):
        return self.cpu_skip

    def applies(self, case):
        return self.apply

    def skip_reason(self, case):
        return self.skip

    def gpus_needed(self, case):
        return self.gpus

    def traffic_for(self, backend, case):
        self.traffic_asked += 1
        return Traffic(self.nbytes)

    def scratch_bytes(self, backend, case):
        return self.scratch


def _backend(requires: Requirement = Requirement(), skip=None) -> Backend:
    return Backend("b", "m:f", None, "torch", lambda fn, i, c: fn, requires=requires, skip=skip)


CASE = Case("fake_gate", "op", "decode", {"T": 1}, {"T": 1})


def test_a_case_that_fits_runs():
    assert why_not(FakeAdapter(), _backend(), CASE, H100) is None


def test_reasons_come_in_order_first_wins():
    big = FakeAdapter(nbytes=100 * GIB, skip="adapter says no")
    assert why_not(big, _backend(SM100), CASE, H100) == "needs sm100/sm103 (found sm90)"
    assert why_not(big, _backend(), CASE, H100) == "adapter says no"
    assert why_not(FakeAdapter(nbytes=100 * GIB), _backend(skip=lambda c: "backend says no"), CASE, H100) == (
        "backend says no"
    )
    assert why_not(FakeAdapter(gpus=8), _backend(), CASE, H100) == "needs 8 GPUs (found 1)"


def test_a_reference_too_slow_for_a_cpu_is_skipped_on_a_cpu_only():
    slow = FakeAdapter(cpu_skip="too slow for a CPU reference run")
    assert why_not(slow, _backend(CPU_OK), CASE, DeviceInfo("cpu")) == "too slow for a CPU reference run"
    assert why_not(slow, _backend(), CASE, H100) is None
    both = FakeAdapter(skip="adapter says no", cpu_skip="too slow")
    assert why_not(both, _backend(CPU_OK), CASE, DeviceInfo("cpu")) == "adapter says no"


def test_the_nvfp4_routed_experts_are_skipped_by_a_cpu_reference_run():
    """Their fp32 oracle decodes NVFP4 weights expert by expert, seconds a call: on a CPU run they are
    recorded skipped with why; on a GPU they run; the BF16/FP8 MoE references still run on a CPU."""
    from dskbench.adapters import get_adapter
    from dskbench.shapes.cases import default_shapes

    shapes, cpu = default_shapes(), DeviceInfo("cpu")
    b200 = DeviceInfo("cuda", "NVIDIA B200", 100, 1, 180 * GIB)
    for kernel in ("cutlass_fp4_group_mm", "trtllm_fp4_block_scale_moe", "cutlass_fused_moe"):
        a = get_adapter(kernel)
        ref = a.reference_backend()
        cases = [
            c
            for phase in ("decode", "prefill")
            for c in shapes.cases(kernel, list(a.ops), a.role, phase, "cpu", [1])
            if applicable(a, c)
        ]
        nvfp4 = [c for c in cases if c.dims.get("weight") == "nvfp4"]
        assert nvfp4, kernel
        for c in nvfp4:
            assert why_not(a, ref, c, cpu).startswith("too slow for a CPU reference run"), c.id
            assert why_not(a, ref, c, b200) is None
        for c in cases:
            if c.dims.get("weight") != "nvfp4":
                assert why_not(a, ref, c, cpu) is None, c.id


def test_memory_is_checked_at_planning_against_the_gpus_total():
    fits, too_big = FakeAdapter(nbytes=60 * GIB), FakeAdapter(nbytes=70 * GIB)
    assert why_not(fits, _backend(), CASE, H100) is None
    assert why_not(too_big, _backend(), CASE, H100) == (
        "needs at least 70.0 GiB of GPU memory, 80.0 GiB free"
    )
    with_scratch = FakeAdapter(nbytes=40 * GIB)
    with_scratch.scratch = 30 * GIB  # a backend's workspace beside the traffic counts too
    assert (
        why_not(with_scratch, _backend(), CASE, H100)
        == "needs at least 70.0 GiB of GPU memory, 80.0 GiB free"
    )
    unknown = replace(H100, memory_bytes=None)
    assert why_not(too_big, _backend(), CASE, unknown) is None
    cpu = FakeAdapter(nbytes=10**15)
    assert memory_reason(cpu, _backend(CPU_OK), CASE, DeviceInfo("cpu")) is None
    assert cpu.traffic_asked == 0  # nothing to compare with: the traffic is not even computed


def test_not_applicable_is_not_a_reason():
    a = FakeAdapter(applies=False)
    assert not applicable(a, CASE) and applicable(FakeAdapter(), CASE)


def test_the_cost_model_and_the_case_ask_the_same_rule(monkeypatch):
    big = FakeAdapter(nbytes=70 * GIB)
    backend = _backend()
    big.all_backends = lambda: [backend]
    monkeypatch.setattr("dskbench.adapters.get_adapter", lambda name: big)
    item = WorkItem(0, "fake_gate", "b", CASE.to_json())
    assert cost.item_cost(item, H100, 1.0) == cost.SKIP_COST_S
    assert cost.item_cost(item, replace(H100, memory_bytes=None), 1.0) > cost.SKIP_COST_S
    monkeypatch.setattr(case_mod, "get_adapter", lambda name: big)
    fields, prep = case_mod.prepare_case("fake_gate", CASE, "b", H100, 0)
    assert prep is None and fields["status"] == "skipped"
    assert fields["reason"] == "needs at least 70.0 GiB of GPU memory, 80.0 GiB free"
