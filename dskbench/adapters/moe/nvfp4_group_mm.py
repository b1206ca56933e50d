"""The routed experts of an NVFP4 MoE layer as one unit: flashinfer's cutlass_fused_moe on sm100 (the
successor of the traced cutlass_fp4_group_mm) and the Marlin W4A16 rows SGLang 0.5.16 runs on Hopper
(moe_align_block_size + moe_wna16_marlin_gemm x2 + silu_and_mul + moe_sum_reduce, kernel by kernel, and its
fused_marlin_moe driver), with the expert weights prepared as prepare_moe_nvfp4_layer_for_marlin does."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import SM100, Backend
from dskbench.adapters.base import Traffic
from dskbench.adapters.common import marlin
from dskbench.adapters.common import nvfp4 as fp4
from dskbench.adapters.common.nvfp4_adapter import HOPPER_MOE, MARLIN, Tagged, next_pow2
from dskbench.adapters.moe.nvfp4_common import Nvfp4Moe, moe_config
from dskbench.shapes.cases import Case


def _swap_halves(t: torch.Tensor) -> torch.Tensor:
    """[E, 2I, ...] gate-first -> up-first (flashinfer CUTLASS MoE loads w3 before w1)."""
    b = t.view(torch.uint8)  # index ops on uint8: float8 kernels are not implemented for every op
    e, r = b.shape[0], b.shape[1]
    return b.reshape(e, 2, r // 2, *b.shape[2:]).flip(1).reshape(b.shape).contiguous().view(t.dtype)


def bind_cutlass_fused_moe_nvfp4(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """flashinfer cutlass_fused_moe as SGLang's flashinfer_cutlass MoE runner calls it for NVFP4
    (ModelOptNvFp4FusedMoEMethod: w13 up-first, 128x4-swizzled block scales viewed as int32)."""
    from flashinfer.fused_moe import ActivationType

    x, ids = inputs["x"], inputs["topk_ids"]
    w13 = _swap_halves(inputs["w13"]).view(torch.long)
    w13_sf = fp4.swizzle_scales(_swap_halves(inputs["w13_sf"])).view(torch.int32)
    w2 = inputs["w2"].view(torch.long)
    w2_sf = fp4.swizzle_scales(inputs["w2_sf"]).view(torch.int32)
    a1, a2 = inputs["a1_scale"], inputs["a2_scale"]
    quant_scales = [
        (1.0 / a1).float(),  # w13_input_scale_quant
        w13_sf,
        (a1 * inputs["w13_ws2"]).float(),  # g1_alphas
        (1.0 / a2).float(),  # w2_input_scale_quant
        w2_sf,
        (a2 * inputs["w2_ws2"]).float(),  # g2_alphas
    ]
    # SGLang applies routed_scaling_factor outside this kernel for NVFP4; folded into the weights here so
    # the output matches the other backends.
    scales = (inputs["topk_weights"] * inputs["routed_scaling_factor"]).float()
    out = torch.empty_like(x)
    tune = next_pow2(x.shape[0])

    def launch() -> torch.Tensor:
        return fn(
            input=x,
            token_selected_experts=ids,
            token_final_scales=scales,
            fc1_expert_weights=w13,
            fc2_expert_weights=w2,
            output_dtype=torch.bfloat16,
            quant_scales=quant_scales,
            input_sf=None,
            output=out,
            tune_max_num_tokens=tune,
            activation_type=ActivationType.Swiglu,
        )[0]

    return launch


def _marlin_moe_weights(inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """prepare_moe_nvfp4_layer_for_marlin (gated, group 16, bf16 params): per-expert repack; the scales of
    all experts in one pass (the same values as expert by expert, without a launch sequence each)."""
    from sglang.jit_kernel.gptq_marlin_repack import gptq_marlin_repack

    out: dict[str, torch.Tensor] = {}
    for name in ("w13", "w2"):
        packed, sf, ws2 = inputs[name], inputs[f"{name}_sf"], inputs[f"{name}_ws2"]
        out[name] = torch.stack([marlin.marlin_repack_weight(p, gptq_marlin_repack) for p in packed])
        out[f"{name}_scale"] = marlin.marlin_weight_scales(sf)
        out[f"{name}_gs"] = marlin.nvfp4_marlin_process_global_scale(ws2.to(torch.bfloat16))
    return out


def _marlin_block_size(m: int, topk: int, e: int) -> int:
    """fused_marlin_moe's M-block choice."""
    for block in (8, 16, 32, 48, 64):
        if m * topk / e / block < 0.9:
            return block
    return 64


def _bind_marlin_moe(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """The Marlin MoE sequence of sglang 0.5.16 fused_marlin_moe (NVFP4, gated SiLU, no EP), kernel by kernel."""
    from sgl_kernel.moe import moe_align_block_size, moe_sum_reduce
    from sgl_kernel.scalar_type import scalar_types
    from sglang.jit_kernel.activation import silu_and_mul

    w = _marlin_moe_weights(inputs)
    x, ids, weights = inputs["x"], inputs["topk_ids"], inputs["topk_weights"]
    m, h = x.shape
    e, topk = inputs["w13"].shape[0], ids.shape[1]
    n = inputs["w2"].shape[2] * 2  # intermediate size I
    block = _marlin_block_size(m, topk, e)
    numel = ids.numel()
    max_pad = numel * block if numel < e + 1 else numel + (e + 1) * (block - 1)
    dev = x.device
    sms = marlin.sms(dev)
    atomic = torch.cuda.get_device_capability(dev)[0] >= 9  # bf16 activations
    fp4_type = scalar_types.float4_e2m1f
    rsf = inputs["routed_scaling_factor"]

    def launch() -> Tagged:
        sorted_ids = torch.empty((max_pad,), dtype=torch.int32, device=dev)
        expert_ids = torch.empty((-(-max_pad // block),), dtype=torch.int32, device=dev)
        num_post = torch.empty((1,), dtype=torch.int32, device=dev)
        cumsum = torch.empty((e + 2,), dtype=torch.int32, device=dev)
        moe_align_block_size(ids, e + 1, block, sorted_ids, expert_ids, num_post, cumsum, True, False)
        workspace = torch.zeros(sms * 4, dtype=torch.int, device=dev)  # per call, as the Marlin runner does
        cache2 = torch.empty((m * topk, n), dtype=x.dtype, device=dev)
        cache13 = torch.zeros((m * topk * max(2 * n, h),), dtype=x.dtype, device=dev)
        cache1 = cache13[: m * topk * 2 * n].view(-1, 2 * n)
        cache3 = cache13[: m * topk * h].view(-1, h)
        common = dict(
            workspace=workspace,
            sorted_token_ids=sorted_ids,
            expert_ids=expert_ids,
            num_tokens_post_padded=num_post,
            topk_weights=weights,
            moe_block_size=block,
            is_ep=False,
            b_q_type=fp4_type,
            is_k_full=True,
            use_atomic_add=atomic,
            use_fp32_reduce=True,
            is_zp_float=False,
        )
        cache1 = fn(
            x,
            cache1,
            w["w13"],
            None,
            w["w13_scale"],
            w["w13_gs"],
            None,
            None,
            None,
            top_k=topk,
            mul_topk_weights=False,
            size_m=m,
            size_n=2 * n,
            size_k=h,
            **common,
        )
        silu_and_mul(cache1.view(-1, 2 * n), cache2)
        cache3 = fn(
            cache2,
            cache3,
            w["w2"],
            None,
            w["w2_scale"],
            w["w2_gs"],
            None,
            None,
            None,
            top_k=1,
            mul_topk_weights=True,
            size_m=m * topk,
            size_n=h,
            size_k=n,
            **common,
        ).view(-1, topk, h)
        out = torch.empty_like(x)
        moe_sum_reduce(cache3, out, rsf)
        return Tagged(out, "w4a16")

    return launch


def _bind_fused_marlin_moe(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """sglang's own driver, called as the Marlin MoE runner (fused_experts_none_to_marlin) calls it."""
    w = _marlin_moe_weights(inputs)
    x = inputs["x"]
    sms = marlin.sms(x.device)

    def launch() -> Tagged:
        out = fn(
            hidden_states=x,
            w1=w["w13"],
            w2=w["w2"],
            w1_scale=w["w13_scale"],
            w2_scale=w["w2_scale"],
            gating_output=inputs["routing_logits"],
            topk_weights=inputs["topk_weights"],
            topk_ids=inputs["topk_ids"],
            global_num_experts=inputs["w13"].shape[0],
            expert_map=None,
            w1_global_scale=w["w13_gs"],
            w2_global_scale=w["w2_gs"],
            workspace=torch.zeros(sms * 4, dtype=torch.int, device=x.device),
            num_bits=4,
            is_k_full=True,
            inplace=False,
            routed_scaling_factor=inputs["routed_scaling_factor"],
        )
        return Tagged(out, "w4a16")

    return launch


@register
class CutlassFp4GroupMm(Nvfp4Moe):
    """The routed experts of an NVFP4 MoE layer. The traced sgl-kernel grouped GEMM (one of the two GEMMs
    of the removed cutlass_moe_fp4 path) has no standalone successor: flashinfer's cutlass_fused_moe does
    permute + act quant + both grouped GEMMs + SwiGLU + finalize in one call, so the unit measured here is
    the whole routed-expert computation [T, H] -> [T, H] from precomputed top-k ids and weights."""

    kernel = "cutlass_fp4_group_mm"
    description = "routed experts, out = 2.5 * sum_k w_k * down_e(silu(gate_e x) * up_e x), NVFP4 weights"
    backends: ClassVar[list[Backend]] = [
        Backend(
            "flashinfer.cutlass_fused_moe",
            "flashinfer.fused_moe:cutlass_fused_moe",
            "flashinfer-python",
            "jit",
            bind_cutlass_fused_moe_nvfp4,
            requires=SM100,
            fallbacks=("flashinfer:cutlass_fused_moe",),
            label="fused MoE (replaces scaled_fp4_experts_quant + 2x cutlass_fp4_group_mm)",
            note="SGLang --moe-runner-backend flashinfer_cutlass",
        ),
        Backend(
            "sglang_jit.marlin_moe",
            "sglang.jit_kernel.moe_wna16_marlin:moe_wna16_marlin_gemm",
            "sglang",
            "jit",
            _bind_marlin_moe,
            requires=MARLIN,
            label=HOPPER_MOE,
            extra={"numerics": "w4a16", "unit": "whole path"},
        ),
        Backend(
            "sglang.fused_marlin_moe",
            "sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe:fused_marlin_moe",
            "sglang",
            "jit",
            _bind_fused_marlin_moe,
            requires=MARLIN,
            label=HOPPER_MOE + " (sglang's fused_marlin_moe driver)",
            extra={"numerics": "w4a16", "unit": "whole path"},
        ),
    ]

    def traffic(self, case: Case) -> Traffic:
        c = moe_config(case)
        wbytes, flops, n_act = self.weights_and_flops(case)
        t, h, k = c["T"], c["H"], c["K"]
        acts = 2 * t * h + 2 * t * h + t * k * (4 + 4)
        return Traffic(
            wbytes + acts,
            flops,
            f"NVFP4 weights of the {n_act} experts the seed-0 routing hits + bf16 x in/out + "
            "top-k ids/weights; intermediates not counted (same minimum for W4A4 and the W4A16 Hopper row)",
            compute="fp4",
        )

    def traffic_w4a16(self, case: Case) -> Traffic:
        return dataclasses.replace(self.traffic(case), compute="bf16")
