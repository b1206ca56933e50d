"""moe_fused_gate: DeepSeek-V3/R1's biased grouped top-k, [T, 256] router logits -> top-8.

DeepSeek-V3/R1 routes with sigmoid scores + e_score_correction_bias, 8 groups of 32 experts, the best
4 groups by the sum of their top-2 biased scores, then the top 8 experts of those groups; weights are
the *unbiased* sigmoid scores of the chosen experts, renormalised and (NVFP4 MoE:
``should_fuse_routed_scaling_factor_in_topk``) multiplied by routed_scaling_factor 2.5. The reference is
dskbench.adapters.common.routing in float64; the check tolerates ties (dskbench.adapters.routing.check).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend, Requirement
from dskbench.adapters.base import Check, Traffic
from dskbench.adapters.common.routing import grouped_choice, select_experts
from dskbench.adapters.routing.check import check_topk
from dskbench.adapters.routing.topk import (
    TopKAdapter,
    routed_scaling_factor,
    router_inputs,
    routing_traffic,
    topk_outputs,
)
from dskbench.shapes.cases import Case

FLASHINFER_DSV3_ROUTING = Requirement(sm=(89, 90, 100, 103, 120, 121))  # fused_routing_dsv3 cc list


def _bind_fused_topk_deepseek(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """flashinfer fused_topk_deepseek(scores, bias, n_group, topk_group, topk, scale, values, indices).

    It always renormalises and multiplies by its scale; sglang passes routed_scaling_factor when the MoE
    fuses it into top-k (NVFP4 MoE), else 1.0.
    """
    logits, bias, d = inputs["gating_output"], inputs["correction_bias"], case.dims
    w, ids = topk_outputs(inputs, case)
    args = (
        logits,
        bias,
        int(d["n_group"]),
        int(d["topk_group"]),
        int(d["K"]),
        routed_scaling_factor(case),
        w,
        ids,
    )

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn(*args, launch_with_pdl=True)
        return w, ids

    return launch


def _bind_grouped_router(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """sglang's Triton router moe_fused_gate(scores, bias, topk, ...) -> (weights, ids); or the retired
    AOT moe_fused_gate(input_tensor, bias, num_expert_group, topk_group, topk, ...)."""
    logits, bias, d = inputs["gating_output"], inputs["correction_bias"], case.dims
    k, n_group, topk_group, scale = (
        int(d["K"]),
        int(d["n_group"]),
        int(d["topk_group"]),
        routed_scaling_factor(case),
    )
    if _takes_first(fn, "input_tensor"):  # sgl-kernel <= 0.3.x signature
        return lambda: fn(logits, bias, n_group, topk_group, k, 0, scale, True)
    return lambda: fn(
        logits,
        bias,
        k,
        scoring_func="sigmoid",
        renormalize=True,
        routed_scaling_factor=scale,
        apply_routed_scaling_factor_on_output=True,
        num_expert_group=n_group,
        topk_group=topk_group,
    )


def _takes_first(fn: Any, name: str) -> bool:
    """Whether `fn`'s first parameter is `name` (tells the retired AOT signature from the current one)."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0] == name


@register
class MoeFusedGate(TopKAdapter):
    kernel = "moe_fused_gate"
    description = "DeepSeek biased grouped top-k: sigmoid + bias, 4 of 8 groups, top-8 of 256, x2.5"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.fused_moe:fused_topk_deepseek",
            None,
            "jit",
            _bind_fused_topk_deepseek,
            requires=FLASHINFER_DSV3_ROUTING,
            label="sglang 0.5.16 default for DeepSeek on sm89+ (biased_grouped_topk_gpu)",
        ),
        Backend(
            "sglang_triton",
            "sglang.jit_kernel.moe_fused_gate:moe_fused_gate",
            None,
            "triton",
            _bind_grouped_router,
            fallbacks=("sgl_kernel.moe:moe_fused_gate",),
            label="unified Triton router: sglang's fallback / SGLANG_OPT_USE_JIT_KERNEL_GROUPED_TOPK",
            note="replaces the AOT moe_fused_gate retired from sgl-kernel 0.4.5 (kept as fallback target)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return router_inputs(case, device, seed)

    def reference(
        self, inputs: dict[str, Any], case: Case
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(weights fp32, ids int32, biased scores float64 — what check() compares selections by)."""
        d = case.dims
        scores, biased, masked = grouped_choice(
            inputs["gating_output"],
            inputs["correction_bias"],
            int(d["n_group"]),
            int(d["topk_group"]),
            torch.float64,
        )
        w, ids = select_experts(scores, masked, int(d["K"]), scale=routed_scaling_factor(case), sorted=True)
        return w, ids, biased

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        groups = (int(case.dims["n_group"]), int(case.dims["topk_group"]))
        return check_topk(out, ref, ref[2], self.tolerance(out, case), groups)

    def traffic(self, case: Case) -> Traffic:
        return routing_traffic(case, True, 6)
