"""The two min-latency DeepSeek GEMMs (BF16): dsv3_fused_a_gemm (fused_qkv_a_proj_with_mqa) and
dsv3_router_gemm (the MoE gate), which SGLang calls only for T <= 16, beside the cuBLAS GEMM it runs above.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend, Requirement
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import generator, randn
from dskbench.adapters.gemm.linear import OUT_BYTES, WEIGHT_STD, gemm_flops, mnk, takes, weight_bytes
from dskbench.shapes.cases import Case

FUSED_A_MAX_T = 16  # linear_with_fused_a_gemm: 1 <= T <= 16
ROUTER_MAX_T = 16  # DeepseekV2MoEGate: dsv3_router_gemm for T <= 16 on sm90 (4 on sm100/103)


def _fused_a_t(case: Case) -> str | None:
    m = int(case.dims["M"])
    if not 1 <= m <= FUSED_A_MAX_T:
        return f"sglang calls dsv3_fused_a_gemm only for 1 <= T <= {FUSED_A_MAX_T} (T={m})"
    return None


def _router_t(case: Case) -> str | None:
    m = int(case.dims["M"])
    if not 1 <= m <= ROUTER_MAX_T:
        return f"sglang calls dsv3_router_gemm only for 1 <= T <= {ROUTER_MAX_T} on sm90 (T={m})"
    return None


def _bind_fused_a(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """(mat_a [M,K] bf16 row-major, mat_b = weight.t() [K,N] column-major) -> [M,N] bf16."""
    a, b = inputs["mat_a"], inputs["mat_b"]
    if takes(fn, "backend"):  # the 0.5.16 dispatcher: let it choose as sglang does (auto)
        return lambda: fn(a, b, backend="auto")
    return lambda: fn(a, b)


def _bind_linear(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """torch.nn.functional.linear(x, weight [N,K]) -> cuBLAS BF16 GEMM."""
    a, w = inputs["mat_a"], inputs["mat_b"].t()
    return lambda: fn(a, w)


@register
class Dsv3FusedAGemm(Adapter):
    kernel = "dsv3_fused_a_gemm"
    role = "gemm"
    ops = ("fused_qkv_a_proj_with_mqa",)
    description = "min-latency BF16 GEMM for fused_qkv_a_proj_with_mqa ([T<=16, 7168] x [7168, 2112])"
    backends = [
        Backend(
            "sglang.fused_a_gemm",
            "sglang.jit_kernel.fused_a_gemm:dsv3_fused_a_gemm",
            None,
            "jit",
            _bind_fused_a,
            requires=Requirement(min_sm=90),
            skip=_fused_a_t,
            dispatches_to="sglang.jit_kernel.dsv3_fused_a_gemm (auto below SM120; CuTe-DSL on SM120+)",
            label="what sglang 0.5.16 calls (linear_with_fused_a_gemm)",
        ),
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.dsv3_fused_a_gemm:dsv3_fused_a_gemm",
            None,
            "jit",
            _bind_fused_a,
            requires=Requirement(min_sm=90),
            skip=_fused_a_t,
        ),
        Backend(
            "sgl_kernel",
            "sgl_kernel.gemm:dsv3_fused_a_gemm",
            None,
            "aot",
            _bind_fused_a,
            requires=Requirement(min_sm=90),
            skip=_fused_a_t,
        ),
        Backend(
            "sglang_cutedsl",
            "sglang.jit_kernel.cutedsl_dsv3_fused_a_gemm:dsv3_fused_a_gemm",
            None,
            "cutedsl",
            _bind_fused_a,
            requires=Requirement(min_sm=90),
            skip=_fused_a_t,
            label="CuTe-DSL variant (sglang auto-selects it only on SM120+; its source accepts SM90+)",
            note="needs nvidia-cutlass-dsl; N in {2112, 6144}, K % 1024 == 0",
        ),
        Backend(
            "torch.linear",
            "torch.nn.functional:linear",
            "torch",
            "torch",
            _bind_linear,
            label="cuBLAS BF16 F.linear: what sglang runs for this projection when T > 16",
        ),
    ]

    def applies(self, case: Case) -> bool:
        return case.op == "fused_qkv_a_proj_with_mqa"

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        m, n, k = mnk(case)
        g = generator(seed)
        x = randn((m, k), g, device)
        w = randn((n, k), g, device, scale=WEIGHT_STD)
        return {"mat_a": x, "mat_b": w.t()}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return (inputs["mat_a"].double() @ inputs["mat_b"].double()).float()

    def traffic(self, case: Case) -> Traffic:
        """FLOPs 2·M·N·K: M is the case's token count, every row a real token (the kernels' tile padding
        of M is not counted). Bytes: the BF16 weight N·K·2, the activations M·K·2 and the output M·N·2,
        each once. Both are floors (nothing here is counted that the kernels skip), so a torch.linear
        result at large M near the dense datasheet rate is cuBLAS doing well, not an overcount: it reads
        "above 100%" only against a measured ceiling that fell short of the datasheet."""
        m, n, k = mnk(case)
        nbytes = weight_bytes(k, n, "bf16") + 2 * m * k + 2 * m * n
        return Traffic(nbytes, gemm_flops(m, n, k), "BF16 weight")


# -- dsv3_router_gemm: MoE gate logits ----------------------------------------------------------------


def _bind_router_jit(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """dsv3_router_gemm(hidden [T,K], weight [E,K], out_dtype=float32[, output]) as 0.5.16 calls it."""
    h, w = inputs["hidden_states"], inputs["router_weights"]
    if takes(fn, "output"):
        out = torch.empty(h.shape[0], w.shape[0], dtype=torch.float32, device=h.device)
        return lambda: fn(h, w, torch.float32, out)
    return lambda: fn(h, w, torch.float32)  # the retired AOT (sgl-kernel 0.3.x) had no `output`


def _bind_router_flashinfer(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """mm_M1_16_K7168_N256(mat_a [T,7168], mat_b [7168,256] column-major, out fp32)."""
    h, w = inputs["hidden_states"], inputs["router_weights"]
    out = torch.empty(h.shape[0], w.shape[0], dtype=torch.float32, device=h.device)

    def launch() -> torch.Tensor:
        fn(h, w.t(), out, launch_with_pdl=True)
        return out

    return launch


def _bind_router_cublas(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """linear_bf16_fp32(x [T,K], y [E,K]) = torch.mm(x, y.t(), out_dtype=float32)."""
    h, w = inputs["hidden_states"], inputs["router_weights"]
    return lambda: fn(h, w)


@register
class Dsv3RouterGemm(Adapter):
    kernel = "dsv3_router_gemm"
    role = "gemm"
    ops = ("gate",)
    description = "router logits [T<=16, 7168] x [256, 7168]^T -> fp32 (DeepSeek MoE gate)"
    backends = [
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.dsv3_router_gemm:dsv3_router_gemm",
            None,
            "jit",
            _bind_router_jit,
            requires=Requirement(min_sm=90),
            skip=_router_t,
            fallbacks=("sgl_kernel.gemm:dsv3_router_gemm",),
            label="what sglang 0.5.16 calls for T <= 16 (out_dtype=float32)",
            note="sglang.kernels.ops.gemm:dsv3_router_gemm is a registry wrapper over this JIT kernel",
        ),
        Backend(
            "flashinfer",
            "flashinfer.gemm:mm_M1_16_K7168_N256",
            None,
            "jit",
            _bind_router_flashinfer,
            requires=Requirement(sm=(100, 103)),
            skip=_router_t,
        ),
        Backend(
            "cublas",
            "sglang.jit_kernel.dsv4.gemm:linear_bf16_fp32",
            None,
            "torch",
            _bind_router_cublas,
            label="cuBLAS bf16->fp32 (torch.mm out_dtype): sglang's router GEMM for T > 16",
        ),
    ]

    def applies(self, case: Case) -> bool:
        return case.op == "gate"

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        m, n, k = mnk(case)
        g = generator(seed)
        h = randn((m, k), g, device)
        w = randn((n, k), g, device, scale=WEIGHT_STD)
        return {"hidden_states": h, "router_weights": w}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        """In float64: the fp32 output's tolerance (1e-4) must hold even if TF32 matmul is enabled."""
        return (inputs["hidden_states"].double() @ inputs["router_weights"].double().t()).float()

    def traffic(self, case: Case) -> Traffic:
        m, n, k = mnk(case)
        nbytes = weight_bytes(k, n, "bf16") + 2 * m * k + OUT_BYTES["fp32"] * m * n
        return Traffic(nbytes, gemm_flops(m, n, k), "BF16 weight, fp32 logits")
