"""The CUTLASS grouped expert GEMMs over expert-ordered rows: block-FP8
fp8_blockwise_scaled_grouped_mm and its expert-specialised twin, and the Hopper W4A8 cutlass_w4a8_moe_mm.

Rows come in expert order with the offsets and problem sizes prepare_moe_input would produce for the
case's routing. These serve FP8-block and W4A8 checkpoints, not the NVFP4 one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import SM90_ONLY, Backend, Requirement
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common import fp8
from dskbench.adapters.common.inputs import generator, normal
from dskbench.adapters.common.routing import expert_counts, sorted_by_expert
from dskbench.adapters.moe.inputs import (
    BF16,
    GROUP,
    fused_sum,
    interleave_w4a8_scales,
    make_expert_weights,
    moe_gemm_dims,
    n_active,
    routing,
    topk,
    weight_bytes,
    weights_inputs,
    weights_of,
)
from dskbench.adapters.moe.reference import grouped_gemm_reference, torch_op
from dskbench.shapes.cases import Case

CUTLASS_FP8_WORKSPACE_BYTES = 90000  # sglang Fp8MoEMethod._ensure_cutlass_buffers_initialized
SM90_OR_SM100 = Requirement(sm=(90, 100, 103))  # sgl-kernel's CUTLASS grouped GEMM has sm90 and sm100 paths


def _grouped_problem(case: Case, device: str, seed: int, swapped: bool) -> dict[str, Any]:
    """Expert-ordered rows and the routing bookkeeping prepare_moe_input would produce for this case."""
    t, e, k_top, n, k, _gate_up = moe_gemm_dims(case)
    route = routing(case, "cpu", seed)
    counts = expert_counts(route.topk_ids, e).to(torch.int32)
    _, offsets = sorted_by_expert(route.topk_ids, e)
    cols = (torch.full_like(counts, n), counts) if swapped else (counts, torch.full_like(counts, n))
    sizes = torch.stack([*cols, torch.full_like(counts, k)], dim=1).contiguous()
    return {
        "problem_sizes": sizes.to(device),
        "expert_offsets": offsets.to(torch.int32).to(device),
        "rows": t * k_top,
    }


def _bind_fp8_grouped(expert_specialised: bool) -> Callable[[Any, dict[str, Any], Case], Callable[[], Any]]:
    def bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        a, scales_a, w, w_scale = inputs["a"], inputs["a_scale"], inputs["w"], inputs["w_scale"]
        e, n, k = w.shape
        dev = a.device
        b = w.transpose(1, 2)  # [E, K, N], column-major per expert, as cutlass_fused_experts_fp8 passes
        scales_b = w_scale.transpose(1, 2)
        stride_a = torch.full((e,), k, dtype=torch.int64, device=dev)
        stride_c = torch.full((e,), n, dtype=torch.int64, device=dev)
        offsets = inputs["expert_offsets"][:-1]
        sizes = inputs["problem_sizes"]
        workspace = torch.empty(CUTLASS_FP8_WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        out = torch.empty(a.shape[0], n, dtype=BF16, device=dev)
        if expert_specialised:

            def launch() -> torch.Tensor:
                fn(out, a, b, scales_a, scales_b, stride_a, stride_a, stride_c, sizes, offsets, workspace)
                return out

            return launch
        ptrs = [torch.empty(e, dtype=torch.int64, device=dev) for _ in range(5)]
        layouts = [torch.empty(e, 5, dtype=torch.int32, device=dev) for _ in range(2)]

        def launch_ptr_array() -> torch.Tensor:
            fn(
                out,
                *ptrs,
                a,
                b,
                scales_a,
                scales_b,
                stride_a,
                stride_a,
                stride_c,
                *layouts,
                sizes,
                offsets,
                workspace,
            )
            return out

        return launch_ptr_array

    return bind


class _Fp8GroupedMm(Adapter):
    """Shared by the CUTLASS block-FP8 grouped GEMMs: expert-ordered FP8 rows x [E, N, K] FP8 weights."""

    role = "moe_gemm"
    ops = ("experts",)

    def applies(self, case: Case) -> bool:
        return case.dims.get("weight") == "fp8_block" and not fused_sum(case)

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        _t, e, _topk_, n, k, _ = moe_gemm_dims(case)
        prob = _grouped_problem(case, device, seed, swapped=False)
        gen = generator(seed)
        a, a_scale = fp8.per_token_group_quant(normal((prob.pop("rows"), k), gen, device), GROUP)
        return {
            "a": a,
            "a_scale": a_scale,
            **weights_inputs(make_expert_weights(e, n, k, "fp8_block", device, gen)),
            **prob,
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        a = fp8.dequant_per_token_group(inputs["a"], inputs["a_scale"], GROUP)
        return grouped_gemm_reference(a, inputs["expert_offsets"].cpu(), weights_of(inputs, "fp8_block"))

    def traffic(self, case: Case) -> Traffic:
        t, e, k_top, n, k, _ = moe_gemm_dims(case)
        rows = t * k_top
        a = rows * k + rows * (k // GROUP) * 4
        b = a + n_active(case) * weight_bytes(n, k, "fp8_block") + rows * n * 2 + 4 * (4 * e + 1)
        note = f"weights of {n_active(case)} active experts (seed-0 routing)"
        return Traffic(b, 2 * rows * n * k, note, compute="fp8")


@register
class Fp8BlockwiseScaledGroupedMm(_Fp8GroupedMm):
    kernel = "fp8_blockwise_scaled_grouped_mm"
    description = "CUTLASS ptr-array grouped GEMM, FP8 1x128 activations x FP8 128x128-block weights"
    backends = [
        Backend(
            "sgl_kernel",
            torch_op("fp8_blockwise_scaled_grouped_mm"),
            None,
            "aot",
            _bind_fp8_grouped(False),
            requires=SM90_OR_SM100,
            preload=("sgl_kernel",),
            label="FP8-block DeepSeek checkpoints (--moe-runner-backend cutlass); not this NVFP4 checkpoint",
        )
    ]


@register
class EsFp8BlockwiseScaledGroupedMm(_Fp8GroupedMm):
    kernel = "es_fp8_blockwise_scaled_grouped_mm"
    description = (
        "Expert-specialised CUTLASS grouped GEMM (sm90), same problem as fp8_blockwise_scaled_grouped_mm"
    )
    backends = [
        Backend(
            "sgl_kernel",
            torch_op("es_fp8_blockwise_scaled_grouped_mm"),
            None,
            "aot",
            _bind_fp8_grouped(True),
            requires=SM90_ONLY,
            preload=("sgl_kernel",),
            label="FP8-block DeepSeek checkpoints (cutlass runner, enable_es on sm90)",
        )
    ]


def _bind_w4a8(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    a, w = inputs["a"], inputs["w"]
    e, n, _half_k = w.shape
    k, dev = a.shape[1], a.device
    a_strides = torch.full((e, 3), k, dtype=torch.int64, device=dev)  # sglang W4AFp8MoEMethod.create_weights
    d_strides = torch.full((e, 3), n, dtype=torch.int64, device=dev)
    offsets, sizes = inputs["expert_offsets"][:-1], inputs["problem_sizes"]
    out = torch.empty(a.shape[0], n, dtype=BF16, device=dev)
    k_top = topk(case)

    def launch() -> torch.Tensor:
        fn(
            out,
            a,
            w,
            inputs["a_scale"],
            inputs["w_scale"],
            offsets,
            sizes,
            a_strides,
            a_strides,
            d_strides,
            d_strides,
            128,
            k_top,
        )
        return out

    return launch


@register
class CutlassW4a8MoeMm(Adapter):
    kernel = "cutlass_w4a8_moe_mm"
    role = "moe_gemm"
    ops = ("experts",)
    description = (
        "Hopper mixed-input grouped GEMM: per-tensor FP8 activations x signed INT4 weights (two per byte, "
        "low nibble first) with bf16 group-128 scales interleaved by 4; problem sizes (N, M, K)"
    )
    backends = [
        Backend(
            "sgl_kernel",
            torch_op("cutlass_w4a8_moe_mm"),
            None,
            "aot",
            _bind_w4a8,
            requires=SM90_ONLY,
            preload=("sgl_kernel",),
            label="W4A8 checkpoints (DeepSeek-W4AFP8); not this NVFP4 checkpoint",
        )
    ]

    def applies(self, case: Case) -> bool:
        return case.dims.get("weight") == "w4a8" and not fused_sum(case)

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        _t, e, _topk_, n, k, _ = moe_gemm_dims(case)
        prob = _grouped_problem(case, device, seed, swapped=True)
        gen = generator(seed)
        a, a_scale = fp8.per_tensor_quant(normal((prob.pop("rows"), k), gen, device))
        w = make_expert_weights(e, n, k, "w4a8", device, gen)
        assert w.scale is not None
        return {
            "a": a,
            "a_scale": a_scale,
            "w": w.w,
            "w_scale": interleave_w4a8_scales(w.scale),
            "w_scale_plain": w.scale,  # reference only: [E, N, K/128] before interleaving
            **prob,
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        a = fp8.dequant(inputs["a"], inputs["a_scale"])
        return grouped_gemm_reference(a, inputs["expert_offsets"].cpu(), weights_of(inputs, "w4a8"))

    def traffic(self, case: Case) -> Traffic:
        t, e, k_top, n, k, _ = moe_gemm_dims(case)
        rows = t * k_top
        b = rows * k + 4 + n_active(case) * weight_bytes(n, k, "w4a8") + rows * n * 2 + 4 * (4 * e + 1)
        note = f"weights of {n_active(case)} active experts (seed-0 routing)"
        return Traffic(b, 2 * rows * n * k, note, compute="fp8")  # int4 weights run as FP8 MMAs
