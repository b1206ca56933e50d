"""Every registered adapter: well-formed backends, planned cases, and byte/FLOP counts at every case."""

from __future__ import annotations

import pytest

from dskbench.adapters import adapters
from dskbench.adapters.backends import KINDS
from dskbench.device.info import DeviceInfo
from dskbench.registry.load import load_registry
from dskbench.shapes.cases import default_shapes

REGISTRY = load_registry()
SHAPES = default_shapes()
# the product's adapters (other test files register fake kernels through DSKBENCH_EXTRA_ADAPTERS)
ADAPTERS = {k: v for k, v in adapters().items() if v.__module__.startswith("dskbench.")}
H100 = DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", 90, 1)


def _cases(name: str):
    a = ADAPTERS[name]()
    entry = REGISTRY[name]
    ops = [o for o in entry.op_names if SHAPES.ops.get(o) and SHAPES.ops[o].roles.get(a.role)] or list(a.ops)
    return a, [
        c
        for ph in ("decode", "prefill")
        for c in SHAPES.cases(name, ops, a.role, ph, "quick")
        if a.applies(c)
    ]


def test_every_adapter_is_a_registry_kernel_to_benchmark():
    for name in ADAPTERS:
        assert name in REGISTRY, f"adapter for {name!r}, which the traces do not name"
        # multi-GPU kernels have adapters for their torchrun benchmark (`dskbench comm`)
        assert REGISTRY[name].status in ("benchmark", "needs-multi-gpu"), name
    # the kernels to benchmark without an adapter are few and known; the Triton kernels of the files the
    # traces name (traces/triton_kernels.yaml) that have none yet are listed here by name
    missing = sorted(n for n, e in REGISTRY.items() if e.status == "benchmark" and n not in ADAPTERS)
    from_files = {n for n in missing if "triton_kernels.yaml" in REGISTRY[n].status_reason}
    assert len(set(missing) - from_files) <= 5, missing
    assert from_files <= TRITON_FILE_KERNELS_WITHOUT_ADAPTER, sorted(
        from_files - TRITON_FILE_KERNELS_WITHOUT_ADAPTER
    )


TRITON_FILE_KERNELS_WITHOUT_ADAPTER: set[str] = set()


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_backends_are_well_formed(name):
    a = ADAPTERS[name]()
    names = [b.name for b in a.all_backends()]
    assert len(names) == len(set(names)), f"duplicate backend names in {name}: {names}"
    for b in a.backends:
        assert b.kind in KINDS
        assert b.target and (":" in b.target or b.target.startswith("torch.ops.")), (name, b.target)
        reason = b.requires.reason_unmet(H100)
        assert reason is None or reason.startswith("needs "), (name, b.name, reason)


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_every_case_has_traffic(name):
    a, cases = _cases(name)
    assert cases, f"{name}: no case in the quick sweep"
    for c in cases:
        t = a.traffic(c)
        assert t.bytes > 0 and t.flops >= 0, (c.id, t)
        assert t.compute in ("bf16", "fp8", "fp4", "int8"), (c.id, t.compute)


def test_memo_computes_once_and_follows_its_sources():
    import torch

    from dskbench.adapters.base import input_bytes, memo

    calls = []
    inputs = {"w": torch.ones(4)}

    def deq():
        calls.append(1)
        return inputs["w"] * 2

    assert memo(inputs, "w2", deq, ("w",)).tolist() == [2.0] * 4
    memo(inputs, "w2", deq, ("w",))
    assert len(calls) == 1  # cached
    inputs["w"].mul_(3)  # modified in place: stale
    assert memo(inputs, "w2", deq, ("w",)).tolist() == [6.0] * 4 and len(calls) == 2
    inputs["w"] = torch.zeros(4)  # another tensor: stale
    assert memo(inputs, "w2", deq, ("w",)).tolist() == [0.0] * 4 and len(calls) == 3
    assert input_bytes(inputs) == 16  # the memo is not an input
