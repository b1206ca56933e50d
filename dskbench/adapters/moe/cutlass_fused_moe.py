"""flashinfer's cutlass_fused_moe: the whole routed-expert layer from top-k ids and weights (permute, both
grouped GEMMs, SwiGLU, finalize) in one call, SGLang's ``--moe-runner-backend flashinfer_cutlass``.

One backend per weight format its modules run, each on the GPUs that have it: BF16 (sm90 and sm100
modules), DeepSeek FP8 block-scale (BF16 activations quantised 1x128 inside, 128x128 weight blocks; the
sm90 module only, flashinfer refuses it elsewhere) and NVFP4 (sm100, as cutlass_fp4_group_mm's flashinfer
row). The ``moe_layer`` role gives one case per format; a backend of another format says so.
GEMM1 rows are [up; gate], the order SGLang loads for flashinfer (w3 before w1).
routed_scaling_factor: SGLang applies it after the call for BF16/FP8 (not measured here, not in the
reference); the NVFP4 binder folds it into the top-k weights, and its reference includes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import SM90_ONLY, SM100, Backend, Requirement
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import generator, randn
from dskbench.adapters.common.nvfp4_adapter import next_pow2
from dskbench.adapters.moe.inputs import (
    BF16,
    ExpertWeights,
    make_expert_weights,
    n_active,
    routing,
    weight_bytes,
)
from dskbench.adapters.moe.nvfp4_common import (
    CPU_TOO_SLOW,
    expert_weight_bytes,
    make_moe_inputs,
    moe_config,
    moe_refs,
    routed_active_experts,
)
from dskbench.adapters.moe.nvfp4_group_mm import bind_cutlass_fused_moe_nvfp4
from dskbench.adapters.moe.reference import quant_dequant_groups, routed_experts_reference
from dskbench.shapes.cases import Case

FORMATS = ("bf16", "fp8_block", "nvfp4")
# The cutlass fused-MoE modules flashinfer builds (get_cutlass_fused_moe_module): sm89, sm90, sm100-103,
# sm110, sm120/121. BF16 runs on each.
CUTLASS_MOE = Requirement(min_sm=89)
TARGET = "flashinfer.fused_moe:cutlass_fused_moe"
FALLBACKS = ("flashinfer:cutlass_fused_moe",)


def _dims(case: Case) -> tuple[int, int, int, int, int]:
    """(T, H, I, E, K) of a moe_layer case."""
    d = case.dims
    return int(d["T"]), int(d["H"]), int(d["I"]), int(d["E"]), int(d["K"])


def only(fmt: str) -> Callable[[Case], str | None]:
    """A backend's per-case reason: it runs `fmt` weights, the case has another format."""

    def reason(case: Case) -> str | None:
        got = case.dims.get("weight")
        return None if got == fmt else f"runs {fmt} weights; this case is {got}"

    return reason


def _bind_cutlass(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """BF16 or DeepSeek-FP8 as flashinfer_cutlass's runner calls it: bf16 x, int32 ids, fp32 weights,
    output preallocated, tune_max_num_tokens = next_power_of_2(T); FP8: quant_scales = the two fp32
    [E, N/128, K/128] weight-block scales with use_deepseek_fp8_block_scale."""
    from flashinfer.fused_moe import ActivationType

    x = inputs["x"]
    out = torch.empty_like(x)
    if "w13_scale" in inputs:
        quant: dict[str, Any] = {
            "quant_scales": [inputs["w13_scale"], inputs["w2_scale"]],
            "use_deepseek_fp8_block_scale": True,
        }
    else:
        quant = {"quant_scales": None}
    tune = next_pow2(x.shape[0])

    def launch() -> torch.Tensor:
        return fn(
            input=x,
            token_selected_experts=inputs["topk_ids"],
            token_final_scales=inputs["topk_weights"],
            fc1_expert_weights=inputs["w13"],
            fc2_expert_weights=inputs["w2"],
            output_dtype=BF16,
            output=out,
            tune_max_num_tokens=tune,
            activation_type=ActivationType.Swiglu,
            **quant,
        )[0]

    return launch


@register
class CutlassFusedMoe(Adapter):
    kernel = "cutlass_fused_moe"
    role = "moe_layer"
    ops = ("experts",)
    description = (
        "flashinfer CUTLASS fused MoE from top-k ids: permute + GEMM1 + SwiGLU + GEMM2 + finalize, "
        "out = sum_k w_k * down_e(silu(gate_e x) * up_e x); BF16, DeepSeek FP8 block-scale (sm90), NVFP4 (sm100)"
    )
    backends = [
        Backend(
            "flashinfer.bf16",
            TARGET,
            "flashinfer-python",
            "jit",
            _bind_cutlass,
            requires=CUTLASS_MOE,
            fallbacks=FALLBACKS,
            skip=only("bf16"),
            label="BF16 experts (unquantised checkpoints); not this NVFP4 checkpoint",
            note="SGLang --moe-runner-backend flashinfer_cutlass",
        ),
        Backend(
            "flashinfer.fp8_block",
            TARGET,
            "flashinfer-python",
            "jit",
            _bind_cutlass,
            requires=SM90_ONLY,
            fallbacks=FALLBACKS,
            skip=only("fp8_block"),
            # its grouped GEMMs are FlashInfer's copy of DeepGEMM, compiled per shape at first launch (2-5 s
            # a shape after the module is built), so warm builds each case's shape
            builds_per_shape=True,
            label="DeepSeek FP8 block-scale checkpoints (sm90 module only); not this NVFP4 checkpoint",
        ),
        Backend(
            "flashinfer.nvfp4",
            TARGET,
            "flashinfer-python",
            "jit",
            bind_cutlass_fused_moe_nvfp4,
            requires=SM100,
            fallbacks=FALLBACKS,
            skip=only("nvfp4"),
            label="NVFP4 (this checkpoint; the same call as cutlass_fp4_group_mm's flashinfer row)",
            note="SGLang --moe-runner-backend flashinfer_cutlass",
        ),
    ]

    def applies(self, case: Case) -> bool:
        return case.dims.get("weight") in FORMATS

    def cpu_skip_reason(self, case: Case) -> str | None:
        return CPU_TOO_SLOW if case.dims["weight"] == "nvfp4" else None

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        fmt = case.dims["weight"]
        if fmt == "nvfp4":
            return make_moe_inputs(case, device, seed)
        t, h, inter, e, _k = _dims(case)
        route = routing(case, device, seed)
        gen = generator(seed)
        x = randn((t, h), gen, device)
        w13 = make_expert_weights(e, 2 * inter, h, fmt, device, gen)  # rows [up; gate]
        w2 = make_expert_weights(e, h, inter, fmt, device, gen)
        out = {
            "x": x,
            "topk_ids": route.topk_ids,
            "topk_weights": route.topk_weights,
            "w13": w13.w,
            "w2": w2.w,
        }
        if fmt == "fp8_block":
            out |= {"w13_scale": w13.scale, "w2_scale": w2.scale}
        return out

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        fmt = case.dims["weight"]
        if fmt == "nvfp4":
            return moe_refs(inputs).get("w4a4")  # NVFP4 x and SwiGLU output, routed_scaling_factor applied
        w13 = ExpertWeights(fmt, inputs["w13"], inputs.get("w13_scale"))
        w2 = ExpertWeights(fmt, inputs["w2"], inputs.get("w2_scale"))
        if fmt == "fp8_block":  # activations quantised 1x128 before each GEMM, inside the call
            x, act_quant = quant_dequant_groups(inputs["x"]), quant_dequant_groups
        else:
            x, act_quant = inputs["x"].float(), None
        return routed_experts_reference(x, w13, w2, inputs["topk_ids"], inputs["topk_weights"], act_quant)

    def tolerance(self, out: Any, case: Case) -> float:
        # FP8: the kernel rounds GEMM1's output to bf16 before its 1x128 re-quantisation; NVFP4: as
        # Nvfp4Moe's W4A4 tolerance (intermediate codes flip against the fp32 oracle).
        return {"bf16": 2e-2, "fp8_block": 3e-2, "nvfp4": 5e-2}[case.dims["weight"]]

    def traffic(self, case: Case) -> Traffic:
        t, h, inter, e, k = _dims(case)
        fmt = case.dims["weight"]
        if fmt == "nvfp4":  # the NVFP4 inputs route on their own logits (seed-0 count)
            n_act: float = routed_active_experts(moe_config(case))
            wbytes = int(round(n_act * expert_weight_bytes(h, inter)))
        else:
            n_act = n_active(case)
            wbytes = int(n_act) * (weight_bytes(2 * inter, h, fmt) + weight_bytes(h, inter, fmt))
        b = wbytes + 2 * t * h * 2 + t * k * (4 + 4)
        flops = 2 * t * k * 3 * inter * h
        compute = {"bf16": "bf16", "fp8_block": "fp8", "nvfp4": "fp4"}[fmt]
        note = f"weights of ~{n_act:.1f} active experts + bf16 x in/out + top-k ids/weights"
        return Traffic(b, flops, note, compute=compute)
