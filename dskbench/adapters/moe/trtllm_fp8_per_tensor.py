"""flashinfer's trtllm_fp8_per_tensor_scale_moe (sm100): the TRT-LLM fused MoE layer for FP8 per-tensor
checkpoints (SGLang Fp8MoEMethod / ModelOpt FP8 with --moe-runner-backend flashinfer_trtllm), from router
logits: DeepSeekV3 routing + GEMM1 + SwiGLU + GEMM2 + finalize.

Numerics as SGLang sets them up (align_fp8_moe_weights_for_flashinfer_trtllm): the hidden states are
quantised with the static input scale a1; GEMM1's gate is dequantised by w13_scale * a1 and its up half by
w13_scale * a1 / a2, so the SwiGLU output leaves GEMM1 as FP8 at the static scale a2; GEMM2 is dequantised
by a2 * w2_scale. The reference applies the same two quantisations in fp32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import SM100, Backend
from dskbench.adapters.base import Traffic
from dskbench.adapters.common import fp8
from dskbench.adapters.common.inputs import generator, randn, uniform
from dskbench.adapters.common.routing import grouped_topk, routing_margin
from dskbench.adapters.moe.inputs import (
    BF16,
    FP8_WEIGHT_STD,
    ExpertWeights,
    fp8_values,
    n_active,
    per_expert,
    routing,
)
from dskbench.adapters.moe.reference import routed_experts_reference
from dskbench.adapters.moe.trtllm import (
    ROUTING_TIE_MARGIN,
    FusedMoeLayer,
    layer_routing,
    moe_layer_dims,
    trtllm_kwargs,
)
from dskbench.shapes.cases import Case

EPILOGUE_TILE_M = 128  # shuffle_matrix_a's tile, as SGLang passes it
CALIBRATION_TOKENS = 64  # tokens of one expert that set the static SwiGLU-output scale a2


def _fp8_weight(
    e: int, n: int, k: int, gen: torch.Generator, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random e4m3 [E, N, K] and one fp32 scale per expert [E] (dequantised std ~ 1/sqrt(K)); on the CPU
    one expert's weight and scale shared by all (inputs.per_expert)."""
    w = per_expert(lambda m: fp8_values((m, n, k), gen, device), e, device)
    lo, hi = 0.75 / math.sqrt(k) / FP8_WEIGHT_STD, 1.25 / math.sqrt(k) / FP8_WEIGHT_STD
    return w, per_expert(lambda m: uniform((m,), gen, device, lo, hi), e, device)


def per_tensor_weights(w: torch.Tensor, scale: torch.Tensor) -> ExpertWeights:
    """A per-expert-scaled FP8 weight as the reference's ExpertWeights (its scale as uniform 128x128
    blocks: a stride-0 view, no copy)."""
    e, n, k = w.shape
    blocks = scale.float().unsqueeze(-1).unsqueeze(-1).expand(e, math.ceil(n / 128), math.ceil(k / 128))
    return ExpertWeights("fp8_block", w, blocks)


def _calibrate_a2(x: torch.Tensor, ids: torch.Tensor, w13: ExpertWeights) -> torch.Tensor:
    """The static GEMM2 input scale: 2x the amax of one expert's SwiGLU output on up to 64 of its tokens,
    over the e4m3 range (a calibrated checkpoint scale; rare outliers saturate, in kernel and reference)."""
    e = int(ids.reshape(-1)[0])
    tok = (ids == e).any(dim=1).nonzero().squeeze(1)[:CALIBRATION_TOKENS]
    h = x[tok] @ w13.dequant(e, {}).t()
    inter = h.shape[1] // 2
    act = torch.nn.functional.silu(h[:, inter:]) * h[:, :inter]
    return (2.0 * act.abs().amax() / fp8.FP8_MAX).clamp_min(1e-12).float()


def _bind_trtllm_fp8_per_tensor(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """Weights as align_fp8_moe_weights_for_flashinfer_trtllm leaves them (w13 [up; gate] rows reordered
    for the gated GEMM, both shuffled for the transposed MMA; no padding at I % 16 == 0) and the three
    per-expert output scales it precomputes; the call as the flashinfer_trtllm FP8 per-tensor runner."""
    from flashinfer import reorder_rows_for_gated_act_gemm, shuffle_matrix_a

    def prepare(w: torch.Tensor, gated: bool) -> torch.Tensor:
        out = torch.empty_like(w)
        for i in range(w.shape[0]):
            u8 = w[i].view(torch.uint8)  # a row permutation: the same bytes as on the fp8 view
            if gated:
                u8 = reorder_rows_for_gated_act_gemm(u8)
            out[i] = shuffle_matrix_a(u8.contiguous(), EPILOGUE_TILE_M).view(w.dtype)
        return out

    g1, g2 = prepare(inputs["w13"], True), prepare(inputs["w2"], False)
    a1, a2 = inputs["a1_scale"], inputs["a2_scale"]
    out1_gate = (inputs["w13_scale"] * a1).float()
    out1 = (out1_gate / a2).float()
    out2 = (a2 * inputs["w2_scale"]).float()
    kw = trtllm_kwargs(case)
    x = inputs["hidden_states"]
    out = torch.empty(x.shape, dtype=BF16, device=x.device)

    def launch() -> torch.Tensor:
        fn(
            routing_logits=inputs["routing_logits"],
            routing_bias=inputs["routing_bias"],
            hidden_states=x,
            gemm1_weights=g1,
            output1_scales_scalar=out1,
            output1_scales_gate_scalar=out1_gate,
            gemm2_weights=g2,
            output2_scales_scalar=out2,
            use_routing_scales_on_input=False,
            output=out,
            **kw,
        )
        return out

    return launch


@register
class TrtllmFp8PerTensorScaleMoe(FusedMoeLayer):
    kernel = "trtllm_fp8_per_tensor_scale_moe"
    fmt = "fp8_per_tensor"
    description = (
        "TRT-LLM fused MoE, FP8 per-tensor (static input scales, one weight scale per expert): DeepSeekV3 "
        "routing + GEMM1 + SwiGLU + GEMM2 + finalize (sm100)"
    )
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.fused_moe:trtllm_fp8_per_tensor_scale_moe",
            None,
            "cubin",
            _bind_trtllm_fp8_per_tensor,
            requires=SM100,
            label="FP8 per-tensor checkpoints; not this NVFP4 checkpoint",
            note="trtllm-gen cubins must be available offline (flashinfer-cubin or FLASHINFER_CUBIN_DIR)",
        )
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, h, inter, e, _k = moe_layer_dims(case)
        route = routing(case, device, seed)
        gen = generator(seed)
        x = randn((t, h), gen, device)
        a1 = (x.float().abs().amax() / fp8.FP8_MAX).clamp_min(1e-12)  # static input scale
        x_q = fp8.quantize(x, a1)  # scaled_fp8_quant(x, w13_input_scale)
        w13, w13_scale = _fp8_weight(e, 2 * inter, h, gen, device)  # rows [up; gate]
        w2, w2_scale = _fp8_weight(e, h, inter, gen, device)
        a2 = _calibrate_a2(fp8.dequant(x_q, a1), route.topk_ids, per_tensor_weights(w13, w13_scale))
        return {
            "routing_logits": route.logits.to(BF16),  # SGLang hands this kernel bf16 logits
            "routing_bias": route.bias.to(BF16),
            "hidden_states": x_q,
            "a1_scale": a1,
            "a2_scale": a2,
            "w13": w13,
            "w13_scale": w13_scale,
            "w2": w2,
            "w2_scale": w2_scale,
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        top_k, n_group, topk_group, rsf = layer_routing(case)
        logits, bias = inputs["routing_logits"].float(), inputs["routing_bias"].float()
        weights, ids = grouped_topk(logits, bias, top_k, n_group, topk_group, True, rsf)
        a2 = inputs["a2_scale"]
        out = routed_experts_reference(
            fp8.dequant(inputs["hidden_states"], inputs["a1_scale"]),
            per_tensor_weights(inputs["w13"], inputs["w13_scale"]),
            per_tensor_weights(inputs["w2"], inputs["w2_scale"]),
            ids,
            weights,
            lambda act: fp8.dequant(fp8.quantize(act, a2), a2),
        )
        return out, routing_margin(logits, bias, top_k, n_group, topk_group) >= ROUTING_TIE_MARGIN

    def tolerance(self, out: Any, case: Case) -> float:
        return 3e-2  # the SwiGLU output is re-quantised to FP8; rounding ties may land differently

    def traffic(self, case: Case) -> Traffic:
        t, h, inter, e, k = moe_layer_dims(case)
        n_act = n_active(case)
        weights = n_act * (2 * inter * h + h * inter + 2 * 4)
        b = t * e * 2 + e * 2 + t * h + weights + t * h * 2
        flops = 2 * t * k * 3 * inter * h
        note = f"FP8 weights of {n_act} active experts (seed-0 routing); routing FLOPs excluded"
        return Traffic(b, flops, note, compute="fp8")
