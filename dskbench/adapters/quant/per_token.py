"""`sgl_per_token_quant_fp8`: per-token (row) FP8 quantisation with one fp32 scale per row.

Not on DeepSeek-R1-NVFP4's default path; SGLang 0.5.16 calls it for FP8 checkpoints with dynamic
per-token scales (`fp8_utils.apply_fp8_linear` -> `sglang_per_token_quant_fp8` -> the sgl-kernel AOT op).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common.inputs import FP8, SGLANG_SM90, generator, nbytes
from dskbench.adapters.quant.rounding import (
    DTYPE,
    activations,
    check_quant,
    dims,
    own_op,
    quantize_ref_with_ties,
)
from dskbench.shapes.cases import Case


def _bind_per_token(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x = inputs["x"]
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    s = torch.empty((x.shape[0], 1), dtype=torch.float32, device=x.device)

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn(x, q, s)
        return q, s

    return launch


@register
class PerTokenQuantFp8Adapter(Adapter):
    kernel = "sgl_per_token_quant_fp8"
    role = "quant"
    ops = ("per_token_quant_fp8",)
    description = "per-token (row) FP8 quant with one fp32 scale per row"
    backends = [
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.sgl_per_token_quant_fp8.default",
            None,
            "aot",
            _bind_per_token,
            preload=("sgl_kernel",),
            label=SGLANG_SM90,
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        m, k = dims(case)
        return {"x": activations(m, k, generator(seed), device)}

    def applies(self, case: Case) -> bool:
        return own_op(self, case)

    def reference(
        self, inputs: dict[str, Any], case: Case
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = inputs["x"]
        return quantize_ref_with_ties(x, x.shape[1], FP8)

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return check_quant(out, ref, case)

    def traffic(self, case: Case) -> Traffic:
        m, k = dims(case)
        return Traffic(
            bytes=nbytes(m * k, DTYPE) + nbytes(m * k, FP8) + nbytes(m, torch.float32),
            flops=3 * m * k,
            note="read bf16, write e4m3 + one fp32 scale per row",
        )
