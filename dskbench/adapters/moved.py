"""Modules that later releases of a kernel library moved: a backend's target names where the pinned
release keeps its kernel, and `backends.resolve` tries the new place after it, so one adapter serves
both releases and the record's `backend.target` says which it found.

The table is data: one line per module, checked against the newer release's wheel (its module defines
the same function). A kernel whose function was renamed or given another signature is not listed: its
backend stays `skipped` ("not available in this install") under the newer release.
"""

from __future__ import annotations

# old module -> new module
MOVED: dict[str, str] = {
    # sglang 0.5.17 moved its JIT kernels out of sglang.jit_kernel: the CUDA sources to
    # sglang/kernels/jit/, the Python functions to sglang/kernels/ops/. Not listed:
    # per_token_group_quant_8bit (0.5.17 has per_token_group_quant, another signature).
    "sglang.jit_kernel.activation": "sglang.kernels.ops.activation.activation",
    "sglang.jit_kernel.all_reduce": "sglang.kernels.ops.communication.all_reduce",
    "sglang.jit_kernel.concat_mla": "sglang.kernels.ops.attention.concat_mla",
    "sglang.jit_kernel.dsv3_router_gemm": "sglang.kernels.ops.gemm.dsv3_router_gemm",
    "sglang.jit_kernel.dsv4.gemm": "sglang.kernels.ops.attention.dsv4.gemm",
    "sglang.jit_kernel.fp8_blockwise_gemm": "sglang.kernels.ops.gemm.fp8_blockwise_gemm",
    "sglang.jit_kernel.fp8_quantize": "sglang.kernels.ops.quantization.fp8_quantize",
    "sglang.jit_kernel.fused_a_gemm": "sglang.kernels.ops.gemm.fused_a_gemm",
    "sglang.jit_kernel.dsv3_fused_a_gemm": "sglang.kernels.ops.gemm.dsv3_fused_a_gemm",
    "sglang.jit_kernel.cutedsl_dsv3_fused_a_gemm": "sglang.kernels.ops.gemm.cutedsl_dsv3_fused_a_gemm",
    "sglang.jit_kernel.gptq_marlin": "sglang.kernels.ops.quantization.gptq_marlin",
    "sglang.jit_kernel.hadamard": "sglang.kernels.ops.quantization.hadamard",
    "sglang.jit_kernel.moe_align": "sglang.kernels.ops.moe.moe_align",
    "sglang.jit_kernel.moe_fused_gate": "sglang.kernels.ops.moe.moe_fused_gate",
    "sglang.jit_kernel.moe_topk_sigmoid": "sglang.kernels.ops.moe.moe_topk_sigmoid",
    "sglang.jit_kernel.moe_wna16_marlin": "sglang.kernels.ops.moe.moe_wna16_marlin",
    "sglang.jit_kernel.norm": "sglang.kernels.ops.layernorm.norm",
    "sglang.jit_kernel.per_token_group_quant_8bit_v2": "sglang.kernels.ops.quantization.per_token_group_quant_8bit_v2",
    "sglang.jit_kernel.rope": "sglang.kernels.ops.attention.rope",
    "sglang.jit_kernel.set_mla_kv_buffer": "sglang.kernels.ops.kvcache.set_mla_kv_buffer",
    # sglang 0.5.17: the Triton elementwise norms left layernorm/
    "sglang.kernels.ops.layernorm.elementwise": "sglang.kernels.ops.elementwise.elementwise",
}


def moved(target: str, table: dict[str, str] | None = None) -> str | None:
    """The target at its module's new place, or None when its module did not move."""
    mod, sep, attr = target.partition(":")
    new = (MOVED if table is None else table).get(mod)
    return f"{new}:{attr}" if new and sep else None
