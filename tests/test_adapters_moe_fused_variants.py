"""cutlass_fused_moe, trtllm_fp8_per_tensor_scale_moe and fused_moe_kernel's fused top-k sum (down_sum) on
CPU: references against independent loops, binders with CPU stand-ins, gating and case selection."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.common import fp8
from dskbench.adapters.common.routing import grouped_topk
from dskbench.adapters.moe.inputs import ExpertWeights, fused_sum
from dskbench.adapters.moe.reference import quant_dequant_groups, routed_experts_reference
from dskbench.adapters.moe.trtllm_fp8_per_tensor import per_tensor_weights
from dskbench.device.info import DeviceInfo
from dskbench.execution.gate import why_not
from dskbench.shapes.cases import default_shapes
from tests.test_adapters_moe import moe_case

SHAPES = default_shapes()
H100 = DeviceInfo("cuda", "H100", 90, 1, 80 * 2**30)
B200 = DeviceInfo("cuda", "B200", 100, 1, 180 * 2**30)


def _layer_case(fmt_variant: str, t: int = 4, tp: int = 8):
    return moe_case("cutlass_fused_moe", t, fmt_variant, tp=tp)


def _loop_layer(x, w13, w2, ids, weights, act_q=None) -> torch.Tensor:
    """The routed experts token by token in float64 (GEMM1 rows [up; gate])."""
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64)
    inter = w13.shape[1] // 2
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = x[t].double() @ w13[e].t()
            act = torch.nn.functional.silu(h[inter:]) * h[:inter]
            if act_q is not None:
                act = act_q(act.float().unsqueeze(0)).squeeze(0).double()
            out[t] += float(weights[t, j]) * (act @ w2[e].t())
    return out


def _dense(w: ExpertWeights) -> torch.Tensor:
    """Every expert dequantised the long way: fp32 [E, N, K] (float64)."""
    if w.fmt == "bf16":
        return w.w.double()
    s = w.scale.double().repeat_interleave(128, dim=1).repeat_interleave(128, dim=2)
    return w.w.double() * s[:, : w.w.shape[1], : w.w.shape[2]]


# -- references ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["bf16", "fp8_block"])
def test_routed_experts_reference_against_loop(fmt):
    gen = torch.Generator().manual_seed(7)
    e, h, inter = 4, 256, 128
    if fmt == "bf16":
        w13 = ExpertWeights(fmt, (torch.randn(e, 2 * inter, h, generator=gen) * 0.1).to(torch.bfloat16))
        w2 = ExpertWeights(fmt, (torch.randn(e, h, inter, generator=gen) * 0.1).to(torch.bfloat16))
    else:
        w13 = ExpertWeights(fmt, *fp8.block_quant(torch.randn(e, 2 * inter, h, generator=gen) * 0.1))
        w2 = ExpertWeights(fmt, *fp8.block_quant(torch.randn(e, h, inter, generator=gen) * 0.1))
    ids = torch.tensor([[0, 3], [2, 0], [1, 2]], dtype=torch.int32)
    weights = torch.tensor([[0.6, 0.4], [0.3, 0.7], [0.5, 0.5]])
    x = torch.randn(3, h, generator=gen)
    q = quant_dequant_groups if fmt == "fp8_block" else None
    got = routed_experts_reference(x, w13, w2, ids, weights, q)
    want = _loop_layer(x, _dense(w13), _dense(w2), ids, weights, q)
    assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", ["bf16", "fp8"])
def test_cutlass_fused_moe_reference_and_self_check(variant):
    a = get_adapter("cutlass_fused_moe")
    c = _layer_case(variant)
    x = a.make_inputs(c, "cpu", 0)
    ref = a.reference(x, c)
    assert ref.shape == (4, 7168) and torch.isfinite(ref).all() and 0.05 < float(ref.std()) < 20
    fp8_case = variant == "fp8"
    w13 = ExpertWeights(c.dims["weight"], x["w13"], x.get("w13_scale"))
    w2 = ExpertWeights(c.dims["weight"], x["w2"], x.get("w2_scale"))
    # CPU weights are one slab shared by every expert: the loop dequantises expert 0 for all of them
    w13d = _dense(ExpertWeights(w13.fmt, w13.w[:1], None if w13.scale is None else w13.scale[:1]))
    w2d = _dense(ExpertWeights(w2.fmt, w2.w[:1], None if w2.scale is None else w2.scale[:1]))
    zeros = torch.zeros_like(x["topk_ids"])
    xin = quant_dequant_groups(x["x"]) if fp8_case else x["x"].float()
    want = _loop_layer(xin, w13d, w2d, zeros, x["topk_weights"], quant_dequant_groups if fp8_case else None)
    assert torch.allclose(ref.double(), want, rtol=1e-3, atol=1e-3)
    assert a.check(ref.to(torch.bfloat16), ref, c).ok
    assert not a.check((ref + ref.std()).to(torch.bfloat16), ref, c).ok


def test_trtllm_fp8_per_tensor_reference_against_loop():
    a = get_adapter("trtllm_fp8_per_tensor_scale_moe")
    c = moe_case(a.kernel, 4, tp=8)
    x = a.make_inputs(c, "cpu", 1)
    assert x["hidden_states"].dtype == torch.float8_e4m3fn and x["routing_logits"].dtype == torch.bfloat16
    assert x["w13"].shape == (256, 512, 7168) and x["w13_scale"].shape == (256,)
    out, clear = a.reference(x, c)
    assert out.shape == (4, 7168) and clear.dtype == torch.bool and torch.isfinite(out).all()
    m = c.model
    weights, ids = grouped_topk(
        x["routing_logits"].float(),
        x["routing_bias"].float(),
        8,
        int(m["n_group"]),
        int(m["topk_group"]),
        True,
        float(m["routed_scaling_factor"]),
    )
    a1, a2 = float(x["a1_scale"]), float(x["a2_scale"])
    xd = x["hidden_states"].double() * a1
    w13 = (x["w13"][0].double() * float(x["w13_scale"][0])).unsqueeze(0)  # one CPU slab for all experts
    w2 = (x["w2"][0].double() * float(x["w2_scale"][0])).unsqueeze(0)

    def q(act):
        return (act / a2).clamp(-448, 448).to(torch.float8_e4m3fn).float() * a2

    want = _loop_layer(xd, w13, w2, torch.zeros_like(ids), weights, q)
    assert torch.allclose(out.double(), want, rtol=2e-3, atol=2e-3)
    assert a.check(out.to(torch.bfloat16), (out, clear), c).ok
    assert not a.check((out * 1.1).to(torch.bfloat16), (out, clear), c).ok


def test_per_tensor_weights_are_uniform_blocks():
    w = torch.randn(2, 256, 384).to(torch.float8_e4m3fn)
    s = torch.tensor([0.5, 2.0])
    ew = per_tensor_weights(w, s)
    assert ew.scale.shape == (2, 2, 3)
    assert torch.equal(ew.dequant(1, {}), w[1].float() * 2.0)


def test_fused_sum_reference_is_the_down_reference_summed():
    a = get_adapter("fused_moe_kernel")
    down, summed = moe_case(a.kernel, 4, "down.fp8", tp=8), moe_case(a.kernel, 4, "down_sum.fp8", tp=8)
    assert fused_sum(summed) and not fused_sum(down) and summed.dims == down.dims
    x = a.make_inputs(summed, "cpu", 3)
    ref = a.reference(x, summed)
    assert ref.shape == (4, 7168)
    assert torch.allclose(ref, a.reference(x, down).sum(dim=1))
    assert a.traffic(summed).bytes == a.traffic(down).bytes - 4 * 7 * 7168 * 2  # [T, H] out, not [T, K, H]


# -- binders ----------------------------------------------------------------------------------------------


@pytest.fixture
def fake_flashinfer(monkeypatch: pytest.MonkeyPatch) -> None:
    fi = types.ModuleType("flashinfer")
    fm = types.ModuleType("flashinfer.fused_moe")
    fm.ActivationType = types.SimpleNamespace(Swiglu=3)
    fi.reorder_rows_for_gated_act_gemm = lambda t: torch.cat([t[0::2], t[1::2]])  # any row permutation
    fi.shuffle_matrix_a = lambda t, tile: t.clone()
    fi.fused_moe = fm
    monkeypatch.setitem(sys.modules, "flashinfer", fi)
    monkeypatch.setitem(sys.modules, "flashinfer.fused_moe", fm)


@pytest.mark.parametrize("variant", ["bf16", "fp8"])
def test_cutlass_fused_moe_bind(variant, fake_flashinfer):
    a = get_adapter("cutlass_fused_moe")
    c = _layer_case(variant, t=8)
    x = a.make_inputs(c, "cpu", 4)
    seen: dict[str, Any] = {}

    def fake(**kw):
        seen.update(kw)
        fmt = c.dims["weight"]
        w13 = ExpertWeights(fmt, kw["fc1_expert_weights"], None if fmt == "bf16" else kw["quant_scales"][0])
        w2 = ExpertWeights(fmt, kw["fc2_expert_weights"], None if fmt == "bf16" else kw["quant_scales"][1])
        q = quant_dequant_groups if fmt == "fp8_block" else None
        xin = q(kw["input"]) if q else kw["input"].float()
        sel, tw = kw["token_selected_experts"], kw["token_final_scales"]
        kw["output"].copy_(routed_experts_reference(xin, w13, w2, sel, tw, q))
        return [kw["output"]]

    b = next(b for b in a.backends if b.skip(c) is None)
    out = b.bind(fake, x, c)()
    assert a.check(out, a.reference(x, c), c).ok
    assert seen["input"].dtype == torch.bfloat16 and seen["output_dtype"] == torch.bfloat16
    assert seen["token_selected_experts"].dtype == torch.int32 and seen["tune_max_num_tokens"] == 8
    assert seen["activation_type"] == 3 and seen["output"].shape == (8, 7168)
    if variant == "fp8":
        assert seen["use_deepseek_fp8_block_scale"] is True
        assert [s.shape for s in seen["quant_scales"]] == [(256, 4, 56), (256, 56, 2)]
        assert seen["fc1_expert_weights"].dtype == torch.float8_e4m3fn
    else:
        assert seen["quant_scales"] is None and "use_deepseek_fp8_block_scale" not in seen


def test_trtllm_fp8_per_tensor_bind(fake_flashinfer):
    a = get_adapter("trtllm_fp8_per_tensor_scale_moe")
    c = moe_case(a.kernel, 2, tp=8)
    x = a.make_inputs(c, "cpu", 5)
    seen: dict[str, Any] = {}
    out = a.backends[0].bind(lambda **kw: seen.update(kw), x, c)()
    assert out.shape == (2, 7168) and out.dtype == torch.bfloat16 and seen["output"] is out
    a1, a2 = x["a1_scale"], x["a2_scale"]
    assert torch.allclose(seen["output1_scales_gate_scalar"], x["w13_scale"] * a1)
    assert torch.allclose(seen["output1_scales_scalar"], x["w13_scale"] * a1 / a2)
    assert torch.allclose(seen["output2_scales_scalar"], x["w2_scale"] * a2)
    assert (
        seen["gemm1_weights"].shape == (256, 512, 7168) and seen["gemm1_weights"].dtype == torch.float8_e4m3fn
    )
    g1 = seen["gemm1_weights"][0].view(torch.uint8)
    w = x["w13"][0].view(torch.uint8)
    assert torch.equal(g1[:256], w[0::2]) and torch.equal(seen["gemm2_weights"][0], x["w2"][0])
    assert seen["use_routing_scales_on_input"] is False and seen["routing_method_type"] == 2
    assert seen["intermediate_size"] == 256 and seen["routing_logits"].dtype == torch.bfloat16


# -- gating and cases -------------------------------------------------------------------------------------


def test_cutlass_fused_moe_backends_gate_by_format_and_arch():
    a = get_adapter("cutlass_fused_moe")
    by = {b.name: b for b in a.backends}
    bf16, fp8c, nv = _layer_case("bf16", 1), _layer_case("fp8", 1), _layer_case("nvfp4", 1)
    assert why_not(a, by["flashinfer.bf16"], bf16, H100) is None
    assert why_not(a, by["flashinfer.bf16"], bf16, B200) is None
    assert why_not(a, by["flashinfer.fp8_block"], fp8c, H100) is None
    assert "needs sm90" in why_not(a, by["flashinfer.fp8_block"], fp8c, B200)
    assert "needs sm100" in why_not(a, by["flashinfer.nvfp4"], nv, H100)
    assert why_not(a, by["flashinfer.nvfp4"], nv, B200) is None
    assert "this case is bf16" in why_not(a, by["flashinfer.nvfp4"], bf16, B200)
    t = get_adapter("trtllm_fp8_per_tensor_scale_moe")
    assert "needs sm100" in why_not(t, t.backends[0], moe_case(t.kernel, 1), H100)


def test_moe_layer_cases_and_down_sum_only_on_triton():
    cases = SHAPES.cases("cutlass_fused_moe", ["experts"], "moe_layer", "decode", profile="full", tp=[1])
    assert {c.variant for c in cases} == {"bf16", "fp8", "nvfp4"}
    one = next(c for c in cases if c.variant == "fp8" and c.point["T"] == 16)
    assert one.dims == {"T": 16, "H": 7168, "I": 2048, "E": 256, "K": 8, "weight": "fp8_block"}
    gemm = SHAPES.cases("x", ["experts"], "moe_gemm", "decode", profile="full", tp=[1])
    sums = [c for c in gemm if fused_sum(c)]
    assert {c.variant for c in sums} == {"down_sum.bf16", "down_sum.fp8"}
    assert all(get_adapter("fused_moe_kernel").applies(c) for c in sums)
    for k in ("fp8_blockwise_scaled_grouped_mm", "es_fp8_blockwise_scaled_grouped_mm", "cutlass_w4a8_moe_mm"):
        assert not any(get_adapter(k).applies(c) for c in sums)
