"""What the routing adapters share: router inputs, output buffers, traffic and their base class.

Router logits and bias come from dskbench.adapters.common.routing, the generator the MoE adapters route
with, so a routing kernel and the MoE kernels after it see one routing.
"""

from __future__ import annotations

from typing import Any

import torch

from dskbench.adapters.base import TOLERANCES, Adapter, Traffic
from dskbench.adapters.common.routing import deepseek_routing
from dskbench.shapes.cases import Case

TOPK_OPS = ("topk",)


def routed_scaling_factor(case: Case) -> float:
    return float(case.model["routed_scaling_factor"])


def router_inputs(case: Case, device: str, seed: int) -> dict[str, Any]:
    """fp32 logits [T, E] and e_score_correction_bias [E] with uneven expert popularity."""
    d = case.dims
    r = deepseek_routing(
        int(d["T"]),
        int(d["E"]),
        int(d["K"]),
        int(d["n_group"]),
        int(d["topk_group"]),
        seed=seed,
        device=device,
    )
    return {"gating_output": r.logits, "correction_bias": r.bias}


def routing_traffic(case: Case, has_bias: bool, flops_per_score: int) -> Traffic:
    """Logits read once (+ bias), fp32 weights and int32 ids written once; FLOPs nominal."""
    t, e, k = int(case.dims["T"]), int(case.dims["E"]), int(case.dims["K"])
    nbytes = 4 * t * e + (4 * e if has_bias else 0) + t * k * (4 + 4)
    return Traffic(nbytes, flops_per_score * t * e, "nominal FLOPs (elementwise + selection)")


def topk_outputs(inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty (weights fp32 [T, K], ids int32 [T, K]) for the kernels that write into given buffers."""
    logits = inputs["gating_output"]
    t, k = logits.shape[0], int(case.dims["K"])
    return (
        torch.empty(t, k, dtype=torch.float32, device=logits.device),
        torch.empty(t, k, dtype=torch.int32, device=logits.device),
    )


class TopKAdapter(Adapter):
    """A routing kernel at the `topk` op: fp32 weights checked at the fp32 tolerance."""

    role = "topk"
    ops = TOPK_OPS

    def tolerance(self, out: Any, case: Case) -> float:
        return TOLERANCES["float32"]
