"""FP8 GEMM with DeepSeek's block scales (1x128 activations, 128x128 weights), the DeepSeek FP8 checkpoint's
format, measured as a what-if at every quantisable projection through each implementation SGLang can
pick (DeepGEMM, CUTLASS, flashinfer, Triton)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import SM90_ONLY, Backend, Requirement
from dskbench.adapters.base import Traffic, memo
from dskbench.adapters.common import fp8
from dskbench.adapters.common.inputs import generator, randn
from dskbench.adapters.gemm.linear import (
    BF16_OUT,
    OUT_BYTES,
    SM120,
    WEIGHT_STD,
    WhatIfLinear,
    gemm_flops,
    mnk,
    weight_bytes,
)
from dskbench.shapes.cases import Case


def _bind_cutlass_blockwise(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """(mat_a [M,K], mat_b = W.t() col-major, scales_a [M,K/128] col-major, scales_b = Ws.t(), out_dtype).

    The sm120 JIT and the retired sm90/sm100 AOT share this signature.
    """
    a, w = inputs["a"], inputs["w"]
    sa = fp8.scale_layout(inputs["a_scale"], "col")
    sb = inputs["w_scale"].t()  # [K/128, N/128] with stride(0) == 1
    return lambda: fn(a, w.t(), sa, sb, BF16_OUT)


def _bind_fi_blockscale_sm90(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """flashinfer fp8_blockscale_gemm_sm90(input BF16 [M,K], weight e4m3 [N,K], None, weight_scale
    [N/128, K/128]) as sglang's `--fp8-gemm-backend flashinfer_deepgemm` calls it: the kernel quantizes
    the activations itself (1x128 groups), so the reference (dequantized 1x128 FP8 activations) holds.

    Its FP8-input form (input_scale [M, K/128]) is not what sglang runs, and it came out far off the
    dequantized reference, while this BF16-input form was close to the unquantized product
    (a probe of the four ways to call it; results/h200-2026-11-21/README.md gives the errors)."""
    x, w, sw = inputs["x"], inputs["w"], inputs["w_scale"]
    out = torch.empty(x.shape[0], w.shape[0], dtype=BF16_OUT, device=x.device)
    return lambda: fn(x, w, None, sw, out=out, out_dtype=BF16_OUT)


def _bind_triton_blockwise(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """w8a8_block_fp8_matmul_triton(A [M,K], B [N,K], As [M,K/128] row-major, Bs, [128,128], out dtype)."""
    a, w, sa, sw = inputs["a"], inputs["w"], inputs["a_scale"], inputs["w_scale"]
    return lambda: fn(a, w, sa, sw, [fp8.GROUP, fp8.GROUP], BF16_OUT)


def _bind_deep_gemm(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """deep_gemm.fp8_gemm_nt((A, As col-major TMA-aligned), (B [N,K], Bs), out), as sglang calls it."""
    a, w, sw = inputs["a"], inputs["w"], inputs["w_scale"]
    sa = fp8.scale_layout(inputs["a_scale"], "col_tma")
    out = torch.empty(a.shape[0], w.shape[0], dtype=BF16_OUT, device=a.device)

    def launch() -> torch.Tensor:
        fn((a, sa), (w, sw), out)
        return out

    return launch


@register
class Fp8BlockwiseScaledMM(WhatIfLinear):
    kernel = "fp8_blockwise_scaled_mm"
    fmt = "block-FP8 (DeepSeek FP8 checkpoint format)"
    description = "FP8 GEMM with 1x128 activation and 128x128 weight scales (DeepSeek-V3/R1 FP8 checkpoint)"
    backends = [
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.fp8_blockwise_gemm:fp8_blockwise_scaled_mm",
            None,
            "jit",
            _bind_cutlass_blockwise,
            requires=SM120,
            label="traced kernel's current home (CUTLASS, raises unless SM120)",
        ),
        Backend(
            "sgl_kernel",
            "sgl_kernel.gemm:fp8_blockwise_scaled_mm",
            None,
            "aot",
            _bind_cutlass_blockwise,
            label="the traced AOT kernel (sgl-kernel <= 0.3.x; removed in 0.4.5)",
        ),
        Backend(
            "deep_gemm",
            "deep_gemm:fp8_gemm_nt",
            "sgl-deep-gemm",
            "jit",
            _bind_deep_gemm,
            requires=Requirement(min_sm=90),
            builds_per_shape=True,  # DeepGEMM compiles a kernel per (N, K) and block size at first launch
            label="what sglang 0.5.16 auto-selects for block-FP8 linears on Hopper when DeepGEMM is installed",
        ),
        Backend(
            "flashinfer",
            "flashinfer.gemm:fp8_blockscale_gemm_sm90",
            None,
            "jit",
            _bind_fi_blockscale_sm90,
            requires=SM90_ONLY,
            # FlashInfer's copy of DeepGEMM compiles (nvcc) a kernel per (N, K) and block size, chosen by M,
            # at its first launch, and keeps it under ~/.tensorrt_llm/cache
            builds_per_shape=True,
            label="--fp8-gemm-backend flashinfer_deepgemm (BF16 activations, quantized in-kernel, as sglang passes them)",
        ),
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.quantization.fp8_kernel:w8a8_block_fp8_matmul_triton",
            None,
            "triton",
            _bind_triton_blockwise,
            label="sglang's Hopper fallback without DeepGEMM (triton_w8a8_block_fp8_linear)",
            note="w8a8_block_fp8_matmul (the 'universal entry') forwards to DeepGEMM when enabled; this is "
            "its Triton branch",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        """a [M,K] e4m3 + a_scale [M,K/128] (row-major); w [N,K] e4m3 + w_scale [ceil(N/128), K/128]."""
        m, n, k = mnk(case)
        g = generator(seed)
        x = randn((m, k), g, device)
        w = randn((n, k), g, device, scale=WEIGHT_STD)
        a, sa = fp8.per_token_group_quant(x)
        wq, sw = fp8.block_quant(w)
        # x: the BF16 activations, for backends that quantize them in-kernel (flashinfer's sm90 one)
        return {"a": a, "a_scale": sa, "w": wq, "w_scale": sw, "x": x}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        a = fp8.dequant_per_token_group(inputs["a"], inputs["a_scale"])
        w = memo(inputs, "w", lambda: fp8.dequant_block(inputs["w"], inputs["w_scale"]), ("w", "w_scale"))
        return a @ w.t()

    def traffic(self, case: Case) -> Traffic:
        m, n, k = mnk(case)
        scales = 4 * m * (k // fp8.GROUP) + 4 * math.ceil(n / fp8.GROUP) * math.ceil(k / fp8.GROUP)
        nbytes = m * k + weight_bytes(k, n, "fp8") + scales + m * n * OUT_BYTES["bf16"]
        return Traffic(nbytes, gemm_flops(m, n, k), self.what_if_note(case), compute="fp8")

    def traffic_for(self, backend: str, case: Case) -> Traffic:
        if backend != "flashinfer":
            return self.traffic(case)
        m, n, k = mnk(case)  # BF16 activations in, no activation scales
        nbytes = (
            2 * m * k + weight_bytes(k, n, "fp8") + 4 * math.ceil(n / fp8.GROUP) * math.ceil(k / fp8.GROUP)
        )
        nbytes += m * n * OUT_BYTES["bf16"]
        return Traffic(
            nbytes,
            gemm_flops(m, n, k),
            self.what_if_note(case) + "; BF16 activations, quantized in-kernel",
            compute="fp8",
        )
