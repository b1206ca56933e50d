"""W8A8 GEMMs with per-token activation x per-channel weight scales (INT8 and FP8), measured as what-ifs
at every quantisable projection; the FP8 one also carries the BF16 cuBLAS row the checkpoint runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import ANY_CUDA, Backend
from dskbench.adapters.base import Traffic, memo
from dskbench.adapters.common import fp8
from dskbench.adapters.common.inputs import generator, randn
from dskbench.adapters.common.matmul_precision import tf32_for_exact_operands
from dskbench.adapters.gemm.linear import (
    BF16_OUT,
    OUT_BYTES,
    WEIGHT_STD,
    WhatIfLinear,
    gemm_flops,
    mnk,
    weight_bytes,
)
from dskbench.shapes.cases import Case


def _scaled_mm_inputs(case: Case, device: str, seed: int, dtype: torch.dtype) -> dict[str, Any]:
    """mat_a [M,K] row-major, mat_b = W.t() [K,N] column-major, scales [M,1] / [N,1] fp32 (sglang)."""
    m, n, k = mnk(case)
    g = generator(seed)
    x = randn((m, k), g, device)
    w = randn((n, k), g, device, scale=WEIGHT_STD)
    a, sa = fp8.per_token_quant(x, dtype)
    wq, sw = fp8.per_token_quant(w, dtype)
    return {"mat_a": a, "mat_b": wq.t(), "scales_a": sa, "scales_b": sw}


def _scaled_mm_reference(inputs: dict[str, Any]) -> torch.Tensor:
    """The FP8 or INT8 product in fp32, then the per-token and per-channel scales: the operands are
    unscaled FP8/INT8 values, exact in TF32, so the product may run on the tensor cores."""
    a, b = inputs["mat_a"].float(), memo(inputs, "b", lambda: inputs["mat_b"].float(), ("mat_b",))
    with tf32_for_exact_operands():
        prod = a @ b
    return prod * inputs["scales_a"].float().view(-1, 1) * inputs["scales_b"].float().view(1, -1)


def _scaled_mm_traffic(case: Case, fmt: str, note: str) -> Traffic:
    m, n, k = mnk(case)
    nbytes = m * k + weight_bytes(k, n, fmt) + 4 * (m + n) + m * n * OUT_BYTES["bf16"]
    return Traffic(nbytes, gemm_flops(m, n, k), note, compute=fmt)  # int8 / fp8 tensor cores


def _bind_scaled_mm(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """sgl_kernel int8_scaled_mm / fp8_scaled_mm(mat_a, mat_b, scales_a, scales_b, out_dtype)."""
    a, b, sa, sb = inputs["mat_a"], inputs["mat_b"], inputs["scales_a"], inputs["scales_b"]
    return lambda: fn(a, b, sa, sb, BF16_OUT)


def _bind_triton_scaled_mm(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """triton_scaled_mm(input [M,K], weight [K,N], scale_a [M,1], scale_b [N,1], out_dtype)."""
    a, b, sa, sb = inputs["mat_a"], inputs["mat_b"], inputs["scales_a"], inputs["scales_b"]
    return lambda: fn(a, b, sa, sb, BF16_OUT)


def _bind_torch_mm_bf16(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """torch.mm in BF16 (cuBLAS) on the dequantised operands: what a BF16 projection of the checkpoint
    runs (UnquantizedLinearMethod -> F.linear), at the same shapes as the FP8 rows."""
    x = (inputs["mat_a"].float() * inputs["scales_a"].float().view(-1, 1)).to(torch.bfloat16)
    wt = (inputs["mat_b"].float() * inputs["scales_b"].float().view(1, -1)).to(
        torch.bfloat16
    )  # [K,N] col-major
    out = torch.empty(x.shape[0], wt.shape[1], dtype=torch.bfloat16, device=x.device)
    return lambda: fn(x, wt, out=out)


def _bf16_linear_traffic(case: Case) -> Traffic:
    m, n, k = mnk(case)
    nbytes = 2 * m * k + weight_bytes(k, n, "bf16") + m * n * OUT_BYTES["bf16"]
    return Traffic(nbytes, gemm_flops(m, n, k), f"BF16 {case.op} (cuBLAS): BF16 activations, weight, output")


_TRITON_SCALED_MM = "sglang.kernels.ops.quantization.fp8_kernel:triton_scaled_mm"


@register
class Int8ScaledMM(WhatIfLinear):
    kernel = "int8_scaled_mm"
    fmt = "W8A8-INT8"
    description = "W8A8 INT8 GEMM, per-token x per-channel scales (--quantization w8a8_int8)"
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.gemm:int8_scaled_mm",
            None,
            "aot",
            _bind_scaled_mm,
            label="what-if: this projection in W8A8-INT8 (CUTLASS, what sglang's w8a8_int8 runs)",
        ),
        Backend(
            "sglang_triton",
            _TRITON_SCALED_MM,
            None,
            "triton",
            _bind_triton_scaled_mm,
            label="what-if W8A8-INT8 through sglang's Triton scaled_mm (int32 accumulate; not sglang's INT8 path)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return _scaled_mm_inputs(case, device, seed, torch.int8)

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return _scaled_mm_reference(inputs)

    def traffic(self, case: Case) -> Traffic:
        return _scaled_mm_traffic(case, "int8", self.what_if_note(case))


@register
class Fp8ScaledMM(WhatIfLinear):
    kernel = "fp8_scaled_mm"
    fmt = "W8A8-FP8 (per-token x per-channel)"
    description = "FP8 e4m3 GEMM, per-token activation x per-channel weight scales"
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.gemm:fp8_scaled_mm",
            None,
            "aot",
            _bind_scaled_mm,
            label="what-if: this projection in per-channel FP8 (CUTLASS; sglang's apply_fp8_linear path)",
            note="sglang.kernels.ops.gemm:fp8_scaled_mm is a registry wrapper over this same AOT kernel",
        ),
        Backend(
            "sglang_triton",
            _TRITON_SCALED_MM,
            None,
            "triton",
            _bind_triton_scaled_mm,
            label="what-if per-channel FP8 via Triton scaled_mm (sglang's fallback without CUTLASS FP8)",
        ),
        Backend(
            "torch.mm.bf16",
            "torch:mm",
            "torch",
            "torch",
            _bind_torch_mm_bf16,
            requires=ANY_CUDA,
            label="BF16 cuBLAS: what NVFP4-v2 runs at its BF16 projections (q_b_proj, kv_b_proj, ...)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return _scaled_mm_inputs(case, device, seed, fp8.FP8_DTYPE)

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return _scaled_mm_reference(inputs)

    def traffic(self, case: Case) -> Traffic:
        return _scaled_mm_traffic(case, "fp8", self.what_if_note(case))

    def traffic_for(self, backend: str, case: Case) -> Traffic:
        return _bf16_linear_traffic(case) if backend == "torch.mm.bf16" else self.traffic(case)
