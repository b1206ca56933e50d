"""topk_softmax / topk_sigmoid: the flat gates of other MoE models, measured at DeepSeek's
routing shapes ([T, 256] logits -> top-8), with the same tie-tolerant check as moe_fused_gate."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Check, Traffic
from dskbench.adapters.common.routing import select_experts
from dskbench.adapters.routing.check import check_topk
from dskbench.adapters.routing.topk import TopKAdapter, router_inputs, routing_traffic, topk_outputs
from dskbench.shapes.cases import Case


def _bind_topk_inplace(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """topk_softmax / topk_sigmoid(topk_weights, topk_ids, gating_output, renormalize[, correction_bias])."""
    logits, bias = inputs["gating_output"], inputs.get("correction_bias")
    w, ids = topk_outputs(inputs, case)
    args = (w, ids, logits, True) if bias is None else (w, ids, logits, True, bias)

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn(*args)
        return w, ids

    return launch


def _bind_flat_router(fn: Any, inputs: dict[str, Any], case: Case, scoring: str) -> Callable[[], Any]:
    """Triton moe_fused_gate / CUDA moe_fused_gate_jit, ungrouped: (scores, bias, topk, scoring_func, ...)."""
    logits, k = inputs["gating_output"], int(case.dims["K"])
    bias = inputs.get("correction_bias")
    if bias is None:  # sglang passes zeros for softmax gates
        bias = torch.zeros(logits.shape[1], dtype=torch.float32, device=logits.device)
    return lambda: fn(logits, bias, k, scoring_func=scoring, renormalize=True)


@register
class TopkSoftmax(TopKAdapter):
    kernel = "topk_softmax"
    description = "softmax top-8 of 256 with renormalisation (not used by DeepSeek; Mixtral-style gate)"
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.moe:topk_softmax",
            None,
            "aot",
            _bind_topk_inplace,
            label="what sglang 0.5.16 runs for softmax gates (via sglang.kernels.ops.moe:topk_softmax)",
        ),
        Backend(
            "sglang_triton",
            "sglang.jit_kernel.moe_fused_gate:moe_fused_gate",
            None,
            "triton",
            functools.partial(_bind_flat_router, scoring="softmax"),
            label="unified Triton router (SGLANG_OPT_USE_JIT_KERNEL_FUSED_TOPK)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return {"gating_output": router_inputs(case, device, seed)["gating_output"]}

    def reference(
        self, inputs: dict[str, Any], case: Case
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        probs = inputs["gating_output"].double().softmax(dim=-1)
        w, ids = select_experts(probs, probs, int(case.dims["K"]), sorted=True)
        return w, ids, probs

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return check_topk(out, ref, ref[2], self.tolerance(out, case))

    def traffic(self, case: Case) -> Traffic:
        return routing_traffic(case, False, 4)


@register
class TopkSigmoid(TopKAdapter):
    kernel = "topk_sigmoid"
    description = "flat sigmoid top-8 of 256 with correction bias (no groups; not DeepSeek's routing)"
    backends = [
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.moe_topk_sigmoid:topk_sigmoid",
            None,
            "jit",
            _bind_topk_inplace,
            label="what sglang 0.5.16 runs for sigmoid gates on CUDA",
        ),
        Backend("sgl_kernel", "sgl_kernel.moe:topk_sigmoid", None, "aot", _bind_topk_inplace),
        Backend(
            "sglang_triton",
            "sglang.jit_kernel.moe_fused_gate:moe_fused_gate",
            None,
            "triton",
            functools.partial(_bind_flat_router, scoring="sigmoid"),
            label="unified Triton router (SGLANG_OPT_USE_JIT_KERNEL_FUSED_TOPK)",
        ),
        Backend(
            "sglang_jit.fused_gate",
            "sglang.jit_kernel.moe_fused_gate:moe_fused_gate_jit",
            None,
            "jit",
            functools.partial(_bind_flat_router, scoring="sigmoid"),
            label="CUDA flat router (present in sglang 0.5.16, not called by it)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return router_inputs(case, device, seed)

    def reference(
        self, inputs: dict[str, Any], case: Case
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        scores = inputs["gating_output"].double().sigmoid()
        biased = scores + inputs["correction_bias"].double().unsqueeze(0)
        w, ids = select_experts(scores, biased, int(case.dims["K"]), sorted=True)
        return w, ids, biased

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return check_topk(out, ref, ref[2], self.tolerance(out, case))

    def traffic(self, case: Case) -> Traffic:
        return routing_traffic(case, True, 4)
