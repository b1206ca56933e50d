"""flashinfer's trtllm-gen fused NVFP4 MoE (SGLang --moe-runner-backend flashinfer_trtllm, the sm100 default
for nvidia/DeepSeek-R1-NVFP4-v2): DeepSeek-V3 routing from the router logits + both GEMMs + SwiGLU + finalize."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import SM100, Backend
from dskbench.adapters.base import Traffic
from dskbench.adapters.common import nvfp4 as fp4
from dskbench.adapters.common.nvfp4_adapter import next_pow2
from dskbench.adapters.moe.nvfp4_common import Nvfp4Moe, moe_config
from dskbench.shapes.cases import Case


def _bind_trtllm_fp4_moe(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """flashinfer trtllm_fp4_block_scale_moe as SGLang's flashinfer_trtllm FP4 runner calls it, with weights
    prepared as align_fp4_moe_weights_for_flashinfer_trtllm / prepare_static_weights_for_trtllm_fp4_moe."""
    from flashinfer import nvfp4_block_scale_interleave
    from flashinfer.fused_moe.core import (
        _maybe_get_cached_w3_w1_permute_indices,
        get_w2_permute_indices_with_cache,
    )

    e, h = inputs["w13"].shape[0], inputs["w13"].shape[2] * 2
    i = inputs["w2"].shape[2] * 2
    if i % 16:
        raise ValueError(f"trtllm FP4 MoE needs intermediate size % 16 == 0, got {i}")
    cache: dict[Any, torch.Tensor] = {}

    def shuffle(
        weights: torch.Tensor, scales: torch.Tensor, gated: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        w8, s8 = weights.view(torch.uint8), scales.view(torch.uint8)
        w_out = torch.empty_like(w8)
        s_out = torch.empty((e, s8[0].numel()), dtype=torch.uint8, device=w8.device)
        for j in range(e):
            if gated:
                pw = _maybe_get_cached_w3_w1_permute_indices(cache, w8[j], 128, is_gated_act_gemm=True)
                ps = _maybe_get_cached_w3_w1_permute_indices(
                    cache, s8[j], 128, num_elts_per_sf=16, is_gated_act_gemm=True
                )
            else:
                pw = get_w2_permute_indices_with_cache(cache, w8[j], 128)
                ps = get_w2_permute_indices_with_cache(cache, s8[j], 128, num_elts_per_sf=16)
            w_out[j] = w8[j][pw.to(w8.device)]
            s_out[j] = nvfp4_block_scale_interleave(s8[j][ps.to(s8.device)].contiguous())
        return w_out, s_out.view(torch.float8_e4m3fn).reshape(scales.shape)

    g1_w, g1_s = shuffle(inputs["w13"], inputs["w13_sf"], gated=True)
    g2_w, g2_s = shuffle(inputs["w2"], inputs["w2_sf"], gated=False)
    a1, a2 = inputs["a1_scale"], inputs["a2_scale"]
    g1_alphas = (a1 * inputs["w13_ws2"]).float()
    g1_scale_c = ((1.0 / a2) * g1_alphas).float()  # w2_input_scale_quant * g1_alphas_up
    g2_alphas = (a2 * inputs["w2_ws2"]).float()
    x_fp4, x_sf = inputs["x_fp4"], inputs["x_sf"]  # linear scales [T, H/16] (quantize_hidden_states_fp4)
    t = x_fp4.shape[0]
    out = torch.empty((t, h), dtype=torch.bfloat16, device=x_fp4.device)
    top_k = inputs["topk_ids"].shape[1]

    def launch() -> torch.Tensor:
        return fn(
            routing_logits=inputs["routing_logits"],
            routing_bias=inputs["routing_bias"],
            hidden_states=x_fp4,
            hidden_states_scale=x_sf,
            gemm1_weights=g1_w,
            gemm1_weights_scale=g1_s,
            gemm1_bias=None,
            gemm1_alpha=None,
            gemm1_beta=None,
            gemm1_clamp_limit=None,
            gemm2_weights=g2_w,
            gemm2_weights_scale=g2_s,
            gemm2_bias=None,
            output1_scale_scalar=g1_scale_c,
            output1_scale_gate_scalar=g1_alphas,
            output2_scale_scalar=g2_alphas,
            num_experts=e,
            top_k=top_k,
            n_group=inputs["n_group"],
            topk_group=inputs["topk_group"],
            intermediate_size=i,
            local_expert_offset=0,
            local_num_experts=e,
            routed_scaling_factor=inputs["routed_scaling_factor"],
            routing_method_type=2,  # RoutingMethodType.DeepSeekV3
            do_finalize=True,
            activation_type=3,  # ActivationType.Swiglu
            tune_max_num_tokens=next_pow2(t),
            output=out,
        )[0]

    return launch


@register
class TrtllmFp4BlockScaleMoe(Nvfp4Moe):
    """flashinfer's trtllm-gen fused NVFP4 MoE (SGLang --moe-runner-backend flashinfer_trtllm, the sm100
    default for this checkpoint): DeepSeek-V3 routing from the router logits + both GEMMs + SwiGLU +
    finalize. The Hopper row for the experts op is on cutlass_fp4_group_mm (Marlin takes top-k ids)."""

    kernel = "trtllm_fp4_block_scale_moe"
    description = "routing (DeepSeekV3) + routed experts, NVFP4 hidden states in, bf16 out"
    backends: ClassVar[list[Backend]] = [
        Backend(
            "flashinfer",
            "flashinfer.fused_moe:trtllm_fp4_block_scale_moe",
            "flashinfer-python",
            "cubin",
            _bind_trtllm_fp4_moe,
            requires=SM100,
            fallbacks=("flashinfer:trtllm_fp4_block_scale_moe",),
            note="trtllm-gen cubins must be available offline (flashinfer-cubin or FLASHINFER_CUBIN_DIR)",
        )
    ]

    def traffic(self, case: Case) -> Traffic:
        c = moe_config(case)
        wbytes, flops, n_act = self.weights_and_flops(case)
        t, h, e = c["T"], c["H"], c["E"]
        acts = fp4.nvfp4_bytes(t * h) + 4 * t * e + 2 * e + 2 * t * h
        return Traffic(
            wbytes + acts,
            flops,
            f"NVFP4 weights of the {n_act} experts the seed-0 routing hits + NVFP4 x + fp32 "
            "logits + bf16 out; intermediates not counted",
            compute="fp4",
        )
