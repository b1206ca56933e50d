"""moe_sum_reduce: sum the K expert outputs of each token, times routed_scaling_factor."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import generator, randn
from dskbench.adapters.moe.inputs import topk
from dskbench.adapters.moe.reference import torch_op
from dskbench.shapes.cases import Case


def _bind_sum_reduce(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x = inputs["x"]
    out = torch.empty(x.shape[0], x.shape[2], dtype=x.dtype, device=x.device)
    factor = float(case.model["routed_scaling_factor"])

    def launch() -> torch.Tensor:
        fn(x, out, factor)
        return out

    return launch


@register
class MoeSumReduce(Adapter):
    kernel = "moe_sum_reduce"
    role = "moe"
    ops = ("experts",)
    description = "Sum the K expert outputs of each token, times routed_scaling_factor (2.5)"
    backends = [
        Backend(
            "sgl_kernel", torch_op("moe_sum_reduce"), None, "aot", _bind_sum_reduce, preload=("sgl_kernel",)
        ),
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.moe.fused_moe_triton_kernels:moe_sum_reduce_triton",
            None,
            "triton",
            _bind_sum_reduce,
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        d = case.dims
        return {"x": randn((int(d["T"]), topk(case), int(d["H"])), generator(seed), device)}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return inputs["x"].float().sum(dim=1) * float(case.model["routed_scaling_factor"])

    def traffic(self, case: Case) -> Traffic:
        t, h, k = int(case.dims["T"]), int(case.dims["H"]), topk(case)
        return Traffic(2 * t * k * h + 2 * t * h, t * k * h)
