"""flashinfer.nvfp4_block_scale_interleave: the load-time 128x4 swizzle of NVFP4 weight scales, a plain
index kernel that runs on sm90 too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common import nvfp4 as fp4
from dskbench.adapters.common.inputs import generator
from dskbench.adapters.common.nvfp4_adapter import SM90_PLUS
from dskbench.adapters.common.nvfp4_inputs import nvfp4_weight
from dskbench.adapters.gemm.linear import mnk
from dskbench.shapes.cases import Case


def _bind_block_scale_interleave(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    sf = inputs["w_sf"]
    return lambda: fn(sf)


@register
class Nvfp4BlockScaleInterleave(Adapter):
    """flashinfer.nvfp4_block_scale_interleave: the load-time 128x4 swizzle of NVFP4 weight scales (trace
    001). A plain index kernel, so it runs on sm90. Weight prep does not depend on T: measured once per
    weight, at the decode T=1 case."""

    kernel = "nvfp4_block_scale_interleave"
    role = "gemm"
    ops = ("o_proj", "gate_up_proj", "down_proj", "shared_experts")
    description = "e4m3 weight scales [N, K/16] (uint8) -> flat 128x4-swizzled buffer, zero padded"
    backends: ClassVar[list[Backend]] = [
        Backend(
            "flashinfer",
            "flashinfer:nvfp4_block_scale_interleave",
            "flashinfer-python",
            "jit",
            _bind_block_scale_interleave,
            requires=SM90_PLUS,
            fallbacks=("flashinfer.quantization.fp4_quantization:block_scale_interleave",),
        )
    ]

    def applies(self, case: Case) -> bool:
        return (
            case.dims.get("weight") == "nvfp4"
            and case.phase.startswith("decode")
            and case.point.get("T") == 1
        )

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        _, n, k = mnk(case)
        _, sf, _ = nvfp4_weight((n, k), generator(seed), device)
        return {"w_sf": sf.view(torch.uint8)}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return fp4.swizzle_scales(inputs["w_sf"]).flatten()

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        got = out.view(torch.uint8).flatten().cpu()
        want = ref.cpu()
        if got.shape != want.shape:
            return Check(False, float("inf"), 0.0, f"shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        wrong = (got != want).float().mean().item()
        return Check(wrong == 0.0, wrong, 0.0, f"fraction of bytes misplaced {wrong:.2%} (must be exact)")

    def traffic(self, case: Case) -> Traffic:
        _, n, k = mnk(case)
        rp, cp = fp4.swizzled_shape(n, k // 16)
        return Traffic(n * (k // 16) + rp * cp, 0, "reads the scales, writes the padded swizzled buffer")
