"""FlashInfer's TRT-LLM fused MoE (sm100): trtllm_bf16_moe and trtllm_fp8_block_scale_moe,
a whole routed-expert layer from router logits (DeepSeekV3 routing + GEMM1 + SwiGLU + GEMM2 + finalize).

The reference routes with dskbench.adapters.common.routing's grouped_topk; tokens whose expert choice is
within ROUTING_TIE_MARGIN of a tie are left out of the check (a kernel may round them the other way).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import SM100, Backend
from dskbench.adapters.base import Adapter, Check, Traffic, rel_error
from dskbench.adapters.common import fp8
from dskbench.adapters.common.inputs import generator, randn
from dskbench.adapters.common.routing import grouped_topk, routing_margin
from dskbench.adapters.moe.inputs import (
    BF16,
    GROUP,
    ExpertWeights,
    make_expert_weights,
    n_active,
    routing,
    topk,
    weight_bytes,
)
from dskbench.adapters.moe.reference import quant_dequant_groups, routed_experts_reference
from dskbench.shapes.cases import Case

TRTLLM_DEEPSEEK_ROUTING = 2  # flashinfer.tllm_enums.RoutingMethodType.DeepSeekV3
ROUTING_TIE_MARGIN = 1e-4  # fused-routing checks skip tokens whose expert choice is closer to a tie


def moe_layer_dims(case: Case) -> tuple[int, int, int, int, int]:
    d = case.dims
    return int(d["T"]), int(d["H"]), int(d["I"]), int(d["E"]), topk(case)


def _layer_common_inputs(case: Case, device: str, seed: int) -> tuple[dict[str, Any], torch.Generator]:
    route = routing(case, device, seed)
    return {"routing_logits": route.logits, "routing_bias": route.bias.to(BF16)}, generator(seed)


def moe_layer_reference(
    x: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
    logits: torch.Tensor,
    bias: torch.Tensor,
    routing: tuple[int, int, int, float],
    fp8_intermediate: bool = False,
) -> torch.Tensor:
    """DeepSeek routed-expert layer in fp32, TRT-LLM convention: GEMM1 rows are [up; gate].

    ``routing`` = (top_k, n_group, topk_group, routed_scaling_factor).

    out[t] = sum_j w[t, j] * down_e(silu(x W1_gate^T) * (x W1_up^T)), w = renormalised sigmoid scores x
    routed_scaling_factor; ``fp8_intermediate`` passes the activation through a 1x128 FP8 quantisation
    (DeepSeek-FP8 GEMM2 input).
    """
    top_k, n_group, topk_group, scale = routing
    weights, ids = grouped_topk(logits, bias, top_k, n_group, topk_group, True, scale)
    act_quant = quant_dequant_groups if fp8_intermediate else None
    return routed_experts_reference(x, w13, w2, ids, weights, act_quant)


def layer_routing(case: Case) -> tuple[int, int, int, float]:
    m = case.model
    return topk(case), int(m["n_group"]), int(m["topk_group"]), float(m["routed_scaling_factor"])


def trtllm_kwargs(case: Case) -> dict[str, Any]:
    t, _h, inter, e, k = moe_layer_dims(case)
    m = case.model
    return {
        "num_experts": e,
        "top_k": k,
        "n_group": int(m["n_group"]),
        "topk_group": int(m["topk_group"]),
        "intermediate_size": inter,
        "local_expert_offset": 0,
        "local_num_experts": e,
        "routed_scaling_factor": float(m["routed_scaling_factor"]),
        "routing_method_type": TRTLLM_DEEPSEEK_ROUTING,
        "tune_max_num_tokens": 1 << max(t - 1, 0).bit_length(),  # next_power_of_2(T), as sglang passes
    }


def _moe_layer_traffic(case: Case, fmt: str, act_bytes: int) -> Traffic:
    t, h, inter, e, k = moe_layer_dims(case)
    n_act = n_active(case)
    weights = n_act * (weight_bytes(2 * inter, h, fmt) + weight_bytes(h, inter, fmt))
    x = t * h * act_bytes + (t * (h // GROUP) * 4 if act_bytes == 1 else 0)
    b = t * e * 4 + e * 2 + x + weights + t * h * 2
    flops = 2 * t * k * (2 * inter * h + inter * h)
    note = f"weights of {n_act} active experts (seed-0 routing); routing FLOPs excluded"
    return Traffic(b, flops, note, compute="fp8" if act_bytes == 1 else "bf16")


class FusedMoeLayer(Adapter):
    """A whole routed-expert layer from router logits (the kernel routes itself): reference and check."""

    role = "moe"
    ops = ("experts",)
    fmt = "bf16"

    def _layer_reference(
        self, x: torch.Tensor, w13: ExpertWeights, w2: ExpertWeights, inputs: dict[str, Any], case: Case
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(output fp32 [T, H], tokens whose routing is clear of ties [T] bool)."""
        routing = layer_routing(case)
        logits, bias = inputs["routing_logits"], inputs["routing_bias"]
        out = moe_layer_reference(x, w13, w2, logits, bias, routing, fp8_intermediate=self.fmt != "bf16")
        return out, routing_margin(logits, bias, *routing[:3]) >= ROUTING_TIE_MARGIN

    def reference_output(self, ref: Any) -> Any:
        return ref[0]  # the MoE output (the near-tie mask is for the check)

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        ref_out, clear = ref
        clear = clear.to(out.device)
        tol = self.tolerance(out, case)
        err = rel_error(out[clear], ref_out[clear])
        skipped = int((~clear).sum())
        detail = f"{skipped}/{clear.numel()} tokens with a routing near-tie (< {ROUTING_TIE_MARGIN:g}) not compared"
        return Check(err <= tol, err, tol, detail)

    def traffic(self, case: Case) -> Traffic:
        return _moe_layer_traffic(case, self.fmt, act_bytes=2 if self.fmt == "bf16" else 1)


def _bind_trtllm_bf16(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """Shuffle the weights into the BlockMajorK layout as SGLang's unquantised MoE method does (copies)."""
    from flashinfer.fused_moe.core import (
        _maybe_get_cached_w3_w1_permute_indices,
        convert_to_block_layout,
        get_w2_permute_indices_with_cache,
    )

    cache: dict[Any, torch.Tensor] = {}

    def shuffle(w: torch.Tensor, gated: bool) -> torch.Tensor:
        out: torch.Tensor | None = None
        for i in range(w.shape[0]):
            u8 = w[i].view(torch.uint8)
            if gated:
                perm = _maybe_get_cached_w3_w1_permute_indices(cache, u8, 128, is_gated_act_gemm=True)
            else:
                perm = get_w2_permute_indices_with_cache(cache, u8, 128)
            blocked = convert_to_block_layout(u8[perm.to(u8.device)].contiguous(), 128).view(BF16)
            if out is None:  # filled expert by expert: one extra copy of the weights, not two
                out = torch.empty((w.shape[0], *blocked.shape), dtype=BF16, device=w.device)
            out[i] = blocked
        assert out is not None
        return out

    g1, g2 = shuffle(inputs["w13"], True), shuffle(inputs["w2"], False)
    kw = trtllm_kwargs(case)

    def launch() -> torch.Tensor:
        return fn(
            routing_logits=inputs["routing_logits"],
            routing_bias=inputs["routing_bias"],
            hidden_states=inputs["hidden_states"],
            gemm1_weights=g1,
            gemm2_weights=g2,
            **kw,
        )

    return launch


@register
class TrtllmBf16Moe(FusedMoeLayer):
    kernel = "trtllm_bf16_moe"
    description = "TRT-LLM fused MoE, BF16: DeepSeekV3 routing + GEMM1 + SwiGLU + GEMM2 + finalize (sm100)"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.fused_moe:trtllm_bf16_moe",
            None,
            "cubin",
            _bind_trtllm_bf16,
            requires=SM100,
            label="BF16 experts (unquantised checkpoints); weights shuffled to BlockMajorK in bind",
        )
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, h, inter, e, _k = moe_layer_dims(case)
        common, gen = _layer_common_inputs(case, device, seed)
        return {
            **common,
            "hidden_states": randn((t, h), gen, device),
            "w13": make_expert_weights(e, 2 * inter, h, "bf16", device, gen).w,  # rows [up; gate]
            "w2": make_expert_weights(e, h, inter, "bf16", device, gen).w,
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        w13, w2 = ExpertWeights("bf16", inputs["w13"]), ExpertWeights("bf16", inputs["w2"])
        return self._layer_reference(inputs["hidden_states"].float(), w13, w2, inputs, case)


def _bind_trtllm_fp8(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """DeepSeek-FP8 block path as SGLang calls it: MajorK weights, no shuffle, scales [H/128, T]."""
    kw = trtllm_kwargs(case)
    x_scale_t = inputs["hidden_states_scale"].t().contiguous()
    out = torch.empty(inputs["hidden_states"].shape, dtype=BF16, device=inputs["hidden_states"].device)

    def launch() -> torch.Tensor:
        fn(
            routing_logits=inputs["routing_logits"],
            routing_bias=inputs["routing_bias"],
            hidden_states=inputs["hidden_states"],
            hidden_states_scale=x_scale_t,
            gemm1_weights=inputs["w13"],
            gemm1_weights_scale=inputs["w13_scale"],
            gemm2_weights=inputs["w2"],
            gemm2_weights_scale=inputs["w2_scale"],
            use_shuffled_weight=False,
            weight_layout=0,  # MajorK
            output=out,
            **kw,
        )
        return out

    return launch


@register
class TrtllmFp8BlockScaleMoe(FusedMoeLayer):
    kernel = "trtllm_fp8_block_scale_moe"
    fmt = "fp8_block"
    description = "TRT-LLM fused MoE, DeepSeek FP8 (1x128 activations, 128x128 weight blocks) (sm100)"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.fused_moe:trtllm_fp8_block_scale_moe",
            None,
            "cubin",
            _bind_trtllm_fp8,
            requires=SM100,
            label="FP8-block DeepSeek checkpoints; not this NVFP4 checkpoint",
        )
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, h, inter, e, _k = moe_layer_dims(case)
        common, gen = _layer_common_inputs(case, device, seed)
        x, x_scale = fp8.per_token_group_quant(randn((t, h), gen, device), GROUP)  # scale [T, H/128]
        w13 = make_expert_weights(e, 2 * inter, h, "fp8_block", device, gen)
        w2 = make_expert_weights(e, h, inter, "fp8_block", device, gen)
        return {
            **common,
            "hidden_states": x,
            "hidden_states_scale": x_scale,  # bind passes it transposed, [H/128, T]
            "w13": w13.w,
            "w13_scale": w13.scale,
            "w2": w2.w,
            "w2_scale": w2.scale,
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        x = fp8.dequant_per_token_group(inputs["hidden_states"], inputs["hidden_states_scale"], GROUP)
        w13 = ExpertWeights("fp8_block", inputs["w13"], inputs["w13_scale"])
        w2 = ExpertWeights("fp8_block", inputs["w2"], inputs["w2_scale"])
        return self._layer_reference(x, w13, w2, inputs, case)

    def tolerance(self, out: Any, case: Case) -> float:
        return 3e-2  # the kernel re-quantises the SwiGLU output to FP8; rounding ties may land differently
