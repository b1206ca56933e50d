"""The MoE with the shared expert fused in (op experts_fused_shared, SGLang's shared experts fusion) on CPU:
the planned cases, the routing of the shared slot (the last top-k slot of every token is expert E - 1 with
weight sum(routed weights) / routed_scaling_factor), and the references with it (the shared expert counts
exactly once, at weight 1)."""

from __future__ import annotations

import pytest
import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.common import nvfp4 as fp4
from dskbench.adapters.common.routing import deepseek_routing, fuse_shared_experts
from dskbench.adapters.moe import nvfp4_common
from dskbench.adapters.moe.inputs import ROUTING_SEED, n_active, routing
from dskbench.shapes.cases import Case, default_shapes

SHAPES = default_shapes()
MODEL = dict(SHAPES.config)
RSF = MODEL["routed_scaling_factor"]
KERNELS = (
    "cutlass_fp4_group_mm",
    "moe_align_block_size",
    "fused_moe_kernel",
    "silu_and_mul",
    "moe_sum_reduce",
)


def planned(kernel: str, profile: str = "quick") -> list[Case]:
    a = get_adapter(kernel)
    cases = SHAPES.cases(kernel, ["experts_fused_shared"], a.role, "decode", profile, tp=[1, 8])
    return [c for c in cases if a.applies(c)]


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_fusing_kernels_are_planned_at_257_experts_and_top_9(kernel):
    from dskbench.registry.load import load_registry

    assert "experts_fused_shared" in load_registry()[kernel].op_names
    cases = planned(kernel)
    assert cases
    for c in cases:
        if kernel == "silu_and_mul":
            assert c.dims["T"] == 9 * c.point["T"]  # one row per (token, slot), the shared slot included
            continue
        k = c.dims.get("topk", c.dims.get("K"))
        assert (c.dims["E"], k, c.dims["shared"]) == (257, 9, 1), c.id
        if kernel == "fused_moe_kernel":
            assert c.dims["weight"] == "bf16"  # the NextN draft layer's BF16 Triton MoE only


def test_fuse_shared_experts_appends_the_shared_slot_as_sglang_pads_it():
    w = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.4, 0.0]])
    ids = torch.tensor([[3, 1, 0], [2, 0, 1]], dtype=torch.int32)
    fw, fids = fuse_shared_experts(w, ids, 4, 1, 2.5)
    assert fids.dtype == torch.int32 and fids.tolist() == [[3, 1, 0, 4], [2, 0, 1, 4]]
    assert fw.dtype == torch.float32 and torch.allclose(fw[:, :3], w)
    assert torch.allclose(fw[:, 3], w.sum(1) / 2.5)  # 1 / routed_scaling_factor for renormalised weights


def test_moe_inputs_route_the_last_slot_to_the_shared_expert():
    case = next(c for c in planned("fused_moe_kernel") if c.point["T"] == 64)
    r = routing(case, "cpu", 5)
    ids, w = r.topk_ids, r.topk_weights
    assert ids.shape == (64, 9) and (ids[:, 8] == 256).all() and (ids[:, :8] < 256).all()
    assert torch.allclose(w[:, 8], w[:, :8].sum(1) / RSF) and torch.allclose(w[:, :8].sum(1), torch.ones(64))
    # the routed slots are the routing the unfused MoE sees (the case's own, whatever the seed)
    plain = deepseek_routing(64, 256, 8, MODEL["n_group"], MODEL["topk_group"], seed=ROUTING_SEED)
    assert torch.equal(ids[:, :8], plain.topk_ids) and torch.equal(w[:, :8], plain.topk_weights)
    unfused = Case(
        case.kernel, "experts", "decode", case.point, {**case.dims, "E": 256, "topk": 8}, model=MODEL
    )
    del unfused.dims["shared"]
    assert n_active(case) == n_active(unfused) + 1  # traffic counts the shared expert's weights too


def small_fused_case(kernel: str, t: int = 5) -> Case:
    """16 routed experts in 8 groups (2 each) + the shared one, top-8 + 1."""
    dims = {"T": t, "H": 128, "I": 64, "E": 17, "K": 9, "shared": 1, "weight": "nvfp4"}
    return Case(kernel, "experts_fused_shared", "decode", {"T": t}, dims, model=MODEL)


def _shared_mlp(x: dict, e: int) -> torch.Tensor:
    """The shared expert in float64 from its NVFP4 weights, W4A16: down(silu(gate x) * up x)."""
    w1 = fp4.dequantize_nvfp4(x["w13"][e], x["w13_sf"][e]).double() * float(x["w13_ws2"][e])
    w2 = fp4.dequantize_nvfp4(x["w2"][e], x["w2_sf"][e]).double() * float(x["w2_ws2"][e])
    h = x["x"].double() @ w1.T
    i = h.shape[1] // 2
    return (torch.nn.functional.silu(h[:, :i]) * h[:, i:]) @ w2.T


def test_the_fused_reference_adds_the_shared_expert_once_at_weight_one():
    a = get_adapter("cutlass_fp4_group_mm")
    case = small_fused_case(a.kernel)
    x = a.make_inputs(case, "cpu", 11)
    ids, w = x["topk_ids"], x["topk_weights"]
    assert (ids[:, 8] == 16).all() and torch.allclose(w[:, 8], w[:, :8].sum(1) / RSF)
    assert x["w13_ws2"].shape == (17,) and x["routing_logits"].shape == (5, 16)  # the router scores 16
    ref = a.reference(x, case)
    routed = nvfp4_common.moe_refs({**x, "topk_ids": ids[:, :8], "topk_weights": w[:, :8]})
    shared = _shared_mlp(x, 16)
    got = ref.get("w4a16").double() - routed.get("w4a16").double()
    assert (got - shared).norm() / shared.norm() < 1e-5  # rsf x (sum/rsf) = 1: the shared MLP, once
    # W4A4: the same split (each slot's activations are quantised on their own)
    alone = nvfp4_common.moe_refs({**x, "topk_ids": ids[:, 8:], "topk_weights": torch.full((5, 1), 1 / RSF)})
    want = routed.get("w4a4").double() + alone.get("w4a4").double()
    assert (ref.get("w4a4").double() - want).norm() / want.norm() < 1e-5
    # the check tells the fused output from one that forgot the shared expert
    assert a.check(ref.get("w4a4").bfloat16(), ref, case).ok
    assert not a.check(routed.get("w4a4").bfloat16(), ref, case).ok


def test_fused_nvfp4_traffic_counts_the_shared_expert():
    a = get_adapter("cutlass_fp4_group_mm")
    fused = small_fused_case(a.kernel, t=7)
    unfused = Case(a.kernel, "experts", "decode", {"T": 7}, {**fused.dims, "E": 16, "K": 8}, model=MODEL)
    del unfused.dims["shared"]
    wf, ff, nf = a.weights_and_flops(fused)
    wu, fu, nu = a.weights_and_flops(unfused)
    assert nf == nu + 1 and wf == wu * nf // nu and ff * 8 == fu * 9


def test_fused_triton_down_gemm_weighs_the_shared_slot():
    a = get_adapter("fused_moe_kernel")
    dims = {"T": 3, "N": 32, "K": 64, "E": 17, "topk": 9, "shared": 1, "weight": "bf16"}
    case = Case(a.kernel, "experts_fused_shared", "decode", {"T": 3}, dims, "down.bf16", MODEL)
    x = a.make_inputs(case, "cpu", 2)
    out = a.reference(x, case)
    assert out.shape == (3, 9, 32) and (x["topk_ids"][:, 8] == 16).all()
    rows = x["a"].float().view(3, 9, 64)[:, 8]
    want = x["topk_weights"][:, 8:9] * (rows @ x["w"][16].float().T)
    assert torch.allclose(out[:, 8], want, rtol=1e-5, atol=1e-6)


def test_fused_align_gives_the_shared_expert_one_row_per_token():
    a = get_adapter("moe_align_block_size")
    case = next(c for c in planned(a.kernel) if c.point["T"] == 16)
    x = a.make_inputs(case, "cpu", 4)
    sorted_ids, expert_ids, _ = a.reference(x, case)
    bs = a.block_size(case)
    blocks = (expert_ids == 256).nonzero().squeeze(1)
    rows = torch.cat([sorted_ids[b * bs : (b + 1) * bs] for b in blocks.tolist()])
    real = rows[rows < 16 * 9]
    assert sorted(real.tolist()) == [t * 9 + 8 for t in range(16)]  # every token's 9th slot
