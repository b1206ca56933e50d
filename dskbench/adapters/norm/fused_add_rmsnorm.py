"""`fused_add_rmsnorm`: residual add + RMSNorm, in place on the hidden states and residual.

What SGLang 0.5.16 runs for DeepSeek-R1-NVFP4 on sm90 (input/post_attention_layernorm with residual):
`sgl_kernel.fused_add_rmsnorm`, which forwards to `flashinfer.norm.fused_add_rmsnorm` (backend
"sgl_kernel.wrapper", labelled). `sglang.jit_kernel.norm.fused_add_rmsnorm` is used only for
`cast_x_before_out_mul` (not DeepSeek). The AOT kernel is reached through
`torch.ops.sgl_kernel.fused_add_rmsnorm` (backend "sgl_kernel").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import SGLANG_SM90, enable_pdl, generator, nbytes, randn
from dskbench.adapters.norm.rmsnorm import DTYPE, norm_weight, rms_eps, rms_reference
from dskbench.shapes.cases import Case


def _bind_fadd_aot(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x, r, w, eps = inputs["x"], inputs["residual"], inputs["weight"], rms_eps(case)
    pdl = enable_pdl(x)

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn(x, r, w, eps, pdl)
        return x, r

    return launch


def _bind_fadd_jit(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x, r, w, eps = inputs["x"], inputs["residual"], inputs["weight"], rms_eps(case)

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn(x, r, w, eps, cast_x_before_out_mul=False)
        return x, r

    return launch


@register
class FusedAddRMSNormAdapter(Adapter):
    """In place: residual += x; x = rmsnorm(residual) * w. The launcher returns (x, residual).

    Repeated launches keep adding the normalised output into the residual (it grows linearly, no
    overflow); the runner checks the first launch.
    """

    kernel = "fused_add_rmsnorm"
    role = "norm"
    ops = ("input_layernorm", "post_attention_layernorm")
    description = "residual add + RMSNorm, in place on the hidden states and the residual"
    backends = [
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.fused_add_rmsnorm.default",
            None,
            "aot",
            _bind_fadd_aot,
            preload=("sgl_kernel",),
            note="the AOT kernel itself (the Python wrapper would forward to flashinfer)",
        ),
        Backend(
            "sgl_kernel.wrapper",
            "sgl_kernel.elementwise:fused_add_rmsnorm",
            None,
            "cutedsl",
            _bind_fadd_aot,
            dispatches_to="flashinfer.norm.fused_add_rmsnorm",
            label=SGLANG_SM90,
        ),
        Backend("flashinfer", "flashinfer.norm:fused_add_rmsnorm", None, "cutedsl", _bind_fadd_aot),
        Backend("sglang_jit", "sglang.jit_kernel.norm:fused_add_rmsnorm", None, "jit", _bind_fadd_jit),
    ]

    def applies(self, case: Case) -> bool:
        # The q/kv latent norms (strided slices) never carry a residual.
        return "stride" not in case.dims

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, d = int(case.dims["T"]), int(case.dims["D"])
        gen = generator(seed)
        return {
            "x": randn((t, d), gen, device, DTYPE),
            "residual": randn((t, d), gen, device, DTYPE),
            "weight": norm_weight(d, gen, device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        # FusedOp.forward_native: normalise the fp32 sum, not the bf16-rounded residual.
        acc = inputs["x"].float() + inputs["residual"].float()
        return rms_reference(acc, inputs["weight"], rms_eps(case)), acc

    def traffic(self, case: Case) -> Traffic:
        t, d = int(case.dims["T"]), int(case.dims["D"])
        return Traffic(
            bytes=nbytes(4 * t * d + d, DTYPE), flops=5 * t * d, note="read x, r; write x, r; read w"
        )
