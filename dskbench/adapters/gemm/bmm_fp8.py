"""FP8 batched GEMM of MLA weight absorption (q_nope x w_kc, attn x w_vc; per-tensor scales), which FP8
DeepSeek checkpoints run, beside the BF16 torch.bmm the NVFP4-v2 checkpoint runs there."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import ANY_CUDA, Backend, Requirement
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common import fp8
from dskbench.adapters.common.inputs import generator, randn
from dskbench.adapters.gemm.linear import BF16_OUT, OUT_BYTES, SM100_FAMILY, WEIGHT_STD, gemm_flops
from dskbench.shapes.cases import Case


def _bind_sgl_bmm_fp8(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """sgl_kernel.bmm_fp8(A, B, A_scale, B_scale, dtype, out) (cuBLASLt, cached 32 MiB workspace)."""
    a, b = inputs["A"], inputs["B"]
    out = torch.empty(a.shape[0], a.shape[1], b.shape[2], dtype=BF16_OUT, device=a.device)
    sa, sb = inputs["A_scale"], inputs["B_scale"]
    return lambda: fn(a, b, sa, sb, BF16_OUT, out)


def _bind_fi_bmm_fp8(fn: Any, inputs: dict[str, Any], case: Case, backend: str) -> Callable[[], Any]:
    a, b = inputs["A"], inputs["B"]
    out = torch.empty(a.shape[0], a.shape[1], b.shape[2], dtype=BF16_OUT, device=a.device)
    sa, sb = inputs["A_scale"], inputs["B_scale"]
    return lambda: fn(a, b, sa, sb, BF16_OUT, out=out, backend=backend)


def _bind_torch_bmm_bf16(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """torch.bmm in BF16 as sglang runs it for the NVFP4-v2 checkpoint (BF16 w_kc / w_vc).

    A is the transposed view of the [T, heads, K] activation, B keeps the column-major weight.
    """
    a = (
        fp8.dequant(inputs["A"], inputs["A_scale"])
        .to(torch.bfloat16)
        .transpose(0, 1)
        .contiguous()
        .transpose(0, 1)
    )
    b = fp8.dequant(inputs["B"], inputs["B_scale"]).to(torch.bfloat16)
    b = b.transpose(-2, -1).contiguous().transpose(-2, -1)
    return lambda: fn(a, b)


@register
class BmmFp8(Adapter):
    kernel = "bmm_fp8"
    role = "bmm"
    ops = ("forward_absorb_prepare", "forward_absorb_core")
    description = "FP8 batched GEMM of MLA weight absorption (per-tensor scales; FP8 checkpoints only)"
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.gemm:bmm_fp8",
            None,
            "aot",
            _bind_sgl_bmm_fp8,
            label="what FP8 DeepSeek checkpoints run (forward_mla.py)",
        ),
        Backend(
            "flashinfer.cublas",
            "flashinfer.gemm:bmm_fp8",
            None,
            "jit",
            functools.partial(_bind_fi_bmm_fp8, backend="cublas"),
            requires=Requirement(min_sm=89),
        ),
        Backend(
            "flashinfer.cudnn",
            "flashinfer.gemm:bmm_fp8",
            None,
            "jit",
            functools.partial(_bind_fi_bmm_fp8, backend="cudnn"),
            requires=Requirement(min_sm=89),
            preload=("cudnn",),  # flashinfer raises at call time without it; say so at resolve time
            note="needs the cudnn Python package (nvidia-cudnn-frontend)",
        ),
        Backend(
            "flashinfer.cutlass",
            "flashinfer.gemm:bmm_fp8",
            None,
            "jit",
            functools.partial(_bind_fi_bmm_fp8, backend="cutlass"),
            requires=SM100_FAMILY,
        ),
        Backend(
            "torch.bmm.bf16",
            "torch:bmm",
            "torch",
            "torch",
            _bind_torch_bmm_bf16,
            requires=ANY_CUDA,
            label="what NVFP4-v2 runs here: torch.bmm in BF16 (kv_b_proj is BF16)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        """A [b,M,K] e4m3 contiguous, B [b,K,N] e4m3 column-major in the last two dims, fp32 [1] scales."""
        d = case.dims
        b, m, k, n = int(d["b"]), int(d["M"]), int(d["K"]), int(d["N"])
        g = generator(seed)
        x = randn((m, b, k), g, device).transpose(0, 1)  # q_nope.transpose(0, 1)
        w = randn((b, n, k), g, device, scale=WEIGHT_STD)
        a, sa = fp8.per_tensor_quant(x.contiguous())
        wq, sw = fp8.per_tensor_quant(w)
        return {"A": a, "B": wq.transpose(-2, -1), "A_scale": sa, "B_scale": sw}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        a = fp8.dequant(inputs["A"], inputs["A_scale"])
        b = fp8.dequant(inputs["B"], inputs["B_scale"])
        return torch.bmm(a, b)

    def traffic(self, case: Case) -> Traffic:
        d = case.dims
        b, m, k, n = int(d["b"]), int(d["M"]), int(d["K"]), int(d["N"])
        nbytes = b * m * k + b * k * n + 2 * 4 + b * m * n * OUT_BYTES["bf16"]
        return Traffic(nbytes, gemm_flops(m, n, k, b), "per-tensor FP8 A and B; BF16 out", compute="fp8")

    def traffic_for(self, backend: str, case: Case) -> Traffic:
        if backend != "torch.bmm.bf16":
            return self.traffic(case)
        d = case.dims
        b, m, k, n = int(d["b"]), int(d["M"]), int(d["K"]), int(d["N"])
        nbytes = 2 * (b * m * k + b * k * n) + b * m * n * OUT_BYTES["bf16"]
        return Traffic(nbytes, gemm_flops(m, n, k, b), "BF16 A and B (torch.bmm); BF16 out")
