"""The MoE adapters' traffic and backends: minimum bytes and FLOPs against the model's figures, the declared
backends, the shapes' role variants, the model constants a case carries."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dskbench.adapters import adapters, get_adapter
from dskbench.adapters.backends import SM90_ONLY, SM100
from dskbench.adapters.common.routing import (
    active_experts,
    expert_counts,
)
from dskbench.adapters.moe.inputs import (
    weight_bytes,
)
from tests.test_adapters_moe import (
    ALL,
    LAYER_FLOPS_PER_TOKEN,
    LAYER_KERNELS,
    PER_EXPERT_BF16,
    SHAPES,
    TARGET,
    moe_case,
)

# -- traffic ---------------------------------------------------------------------------------------------


def test_traffic_is_the_minimum_traffic():
    fused = get_adapter("fused_moe_kernel")
    up, down = (
        fused.traffic(moe_case("fused_moe_kernel", 1, "gate_up.bf16")),
        fused.traffic(moe_case("fused_moe_kernel", 1, "down.bf16")),
    )
    assert up.flops + down.flops == LAYER_FLOPS_PER_TOKEN
    act = 7168 * 2 + 8 * 4096 * 2 + 8 * 4  # A in, C out, topk ids
    assert up.bytes == 8 * 4096 * 7168 * 2 + act
    assert up.bytes + down.bytes > 8 * PER_EXPERT_BF16
    fp8_per_expert = weight_bytes(4096, 7168, "fp8_block") + weight_bytes(7168, 2048, "fp8_block")
    assert fp8_per_expert == 44_040_192 + 4 * (32 * 56 + 56 * 16)
    assert weight_bytes(4096, 7168, "w4a8") == 4096 * 7168 // 2 + 4096 * 56 * 2
    layer = get_adapter("trtllm_bf16_moe").traffic(moe_case("trtllm_bf16_moe", 16))
    assert layer.flops == 16 * LAYER_FLOPS_PER_TOKEN
    assert layer.bytes - active_experts(16) * PER_EXPERT_BF16 == 16 * 256 * 4 + 256 * 2 + 2 * 16 * 7168 * 2
    assert get_adapter("moe_sum_reduce").traffic(moe_case("moe_sum_reduce", 16)).bytes == 129_024 * 16
    assert (
        get_adapter("apply_shuffle_mul_sum").traffic(moe_case("apply_shuffle_mul_sum", 16)).bytes
        == 129_072 * 16
    )
    g = get_adapter("fp8_blockwise_scaled_grouped_mm").traffic(
        moe_case("fp8_blockwise_scaled_grouped_mm", 1, "gate_up.fp8")
    )
    assert g.flops == 2 * 8 * 4096 * 7168
    tp8 = fused.traffic(moe_case("fused_moe_kernel", 1, "down.bf16", tp=8))
    assert tp8.flops == 2 * 8 * 7168 * 256  # I / tp


# -- backends --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", ALL)
def test_backends_declared(kernel):
    cls = adapters()[kernel]
    assert cls.role in ("moe", "moe_gemm") and cls.ops == ("experts",)
    names = [b.name for b in cls.backends]
    assert names and len(names) == len(set(names))
    for b in cls.backends:
        for t in (b.target, *b.fallbacks):
            assert TARGET.match(t), t
        if b.target.startswith("torch.ops."):
            assert b.preload == ("sgl_kernel",)
    if kernel in LAYER_KERNELS:
        assert all(b.requires == SM100 for b in cls.backends)
    if kernel in ("es_fp8_blockwise_scaled_grouped_mm", "cutlass_w4a8_moe_mm"):
        assert all(b.requires == SM90_ONLY for b in cls.backends)


def test_moe_gemm_role_variants_in_shapes():
    cases = SHAPES.cases("x", ["experts"], "moe_gemm", "decode", profile="full", tp=[1])
    assert {c.variant for c in cases} == {
        f"{g}.{w}" for g in ("gate_up", "down") for w in ("bf16", "fp8", "w4a8")
    } | {"down_sum.bf16", "down_sum.fp8"}
    up = next(c for c in cases if c.variant == "gate_up.bf16" and c.point["T"] == 16)
    assert up.dims == {"T": 16, "N": 4096, "K": 7168, "E": 256, "topk": 8, "weight": "bf16"}


def test_fp8_expert_gemms_compare_with_the_fp8_rate():
    for kernel, want in (
        ("fp8_blockwise_scaled_grouped_mm", {"fp8"}),
        ("cutlass_w4a8_moe_mm", {"fp8"}),
        ("trtllm_fp8_block_scale_moe", {"fp8"}),
        ("trtllm_bf16_moe", {"bf16"}),
    ):
        a = get_adapter(kernel)
        cases = [
            c for c in SHAPES.cases(kernel, list(a.ops), a.role, "decode", profile="cpu") if a.applies(c)
        ]
        assert cases and {a.traffic_for(a.backends[0].name, c).compute for c in cases} == want, kernel
    fused = get_adapter("fused_moe_kernel")
    assert (
        fused.traffic_for("sglang_triton", moe_case("fused_moe_kernel", variant="gate_up.fp8")).compute
        == "fp8"
    )
    assert (
        fused.traffic_for("sglang_triton", moe_case("fused_moe_kernel", variant="gate_up.bf16")).compute
        == "bf16"
    )


def test_model_constants_come_from_the_case():
    """A case alone decides an adapter's inputs: routing groups and routed_scaling_factor are its model's."""
    c = moe_case("moe_sum_reduce", t=16)
    a = get_adapter("moe_sum_reduce")
    x = a.make_inputs(c, "cpu", 0)
    other = dataclasses.replace(c, model={**c.model, "routed_scaling_factor": 1.0})
    assert torch.allclose(a.reference(x, c), a.reference(x, other) * 2.5)
    factors = []
    a.backends[0].bind(lambda inp, out, f: factors.append(f), x, other)()
    assert factors == [1.0]
    p = get_adapter("prepare_moe_input")
    flat = dataclasses.replace(c, model={**c.model, "n_group": 1, "topk_group": 1})  # no group restriction
    ids, ids_flat = p.make_inputs(c, "cpu", 0)["topk_ids"], p.make_inputs(flat, "cpu", 0)["topk_ids"]
    assert int(((ids // 32).long().sort(-1).values.diff(dim=-1) != 0).sum(-1).max()) <= 3  # <= 4 groups
    assert not torch.equal(ids.sort(-1).values, ids_flat.sort(-1).values)


def test_a_cases_routing_is_its_own_so_traffic_counts_the_experts_its_kernel_reads():
    """Fresh activations every run, the same routing: the experts a MoE kernel reads are the ones its
    traffic counts (a fresh routing per run read a few experts more or fewer, above 100% of the peak)."""
    from dskbench.adapters.moe.inputs import n_active, routing

    cases = SHAPES.cases("x", ["experts"], "moe_gemm", "decode", profile="full", tp=[1])
    for case in [c for c in cases if c.dims["T"] in (8, 64)][:2]:
        touched = {
            int((expert_counts(routing(case, "cpu", s).topk_ids, case.dims["E"]) > 0).sum()) for s in (1, 2)
        }
        assert touched == {n_active(case)}
        a, b = (
            get_adapter("fp8_blockwise_scaled_grouped_mm").make_inputs(case, "cpu", s)["a"] for s in (1, 2)
        )
        assert not torch.equal(a.float(), b.float())  # the activations are still drawn fresh
