"""NVFP4 dense GEMM of nvidia/DeepSeek-R1-NVFP4-v2 (o_proj, dense gate_up/down, shared expert): W4A4
flashinfer.mm_fp4 on sm100, and the Marlin W4A16 row SGLang 0.5.16 runs on Hopper at the same shapes.

Inputs: the activation is quantised in ``make_inputs`` (dskbench.adapters.common.nvfp4, the same arithmetic
as the flashinfer kernel, so kernel and oracle read identical bytes); ``bind`` only converts layouts the way
SGLang does at load time (128x4 swizzle, trtllm shuffles, Marlin repack).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import SM100, Backend
from dskbench.adapters.base import Traffic, memo
from dskbench.adapters.common import marlin
from dskbench.adapters.common import nvfp4 as fp4
from dskbench.adapters.common.inputs import generator, randn
from dskbench.adapters.common.matmul_precision import exact_fp32_matmul
from dskbench.adapters.common.nvfp4_adapter import FI_FP4, HOPPER_GEMM, MARLIN, NumericsAdapter, Refs, Tagged
from dskbench.adapters.common.nvfp4_inputs import nvfp4_weight, quantized_activation
from dskbench.adapters.gemm.linear import mnk
from dskbench.shapes.cases import Case


def gemm_traffic_w4a4(m: int, n: int, k: int) -> int:
    """Bytes of an NVFP4 W4A4 GEMM: both operands at 0.5625 B/elem (0.5 packed + 1/16 e4m3 scale), bf16 out.

    Scales are counted unpadded: the 128-row / 4-column swizzle padding is not traffic the op needs,
    although at M < 128 the kernels do read the padded activation-scale tile."""
    return fp4.nvfp4_bytes(m * k) + fp4.nvfp4_bytes(n * k) + 2 * m * n


def gemm_traffic_w4a16(m: int, n: int, k: int) -> int:
    """Bytes of the Marlin W4A16 GEMM: NVFP4 weight, bf16 activation in and out."""
    return fp4.nvfp4_bytes(n * k) + 2 * m * k + 2 * m * n


def _bind_mm_fp4(backend: str) -> Callable[[Any, dict[str, Any], Case], Callable[[], Any]]:
    """flashinfer.mm_fp4 as SGLang's ModelOptFp4LinearMethod.apply calls it (fp4_gemm)."""

    def bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        x_fp4, w = inputs["x_fp4"], inputs["w"]
        m, n = x_fp4.shape[0], w.shape[0]
        x_sf = fp4.swizzle_scales(inputs["x_sf"]).view(torch.uint8)  # fp4_quantize's swizzled uint8 view
        if backend == "trtllm":
            # process_weights_after_loading, flashinfer_trtllm branch (N % 128 and K/16 % 4 hold here)
            from flashinfer import shuffle_matrix_a, shuffle_matrix_sf_a

            if n % 128 or inputs["w_sf"].shape[1] % 4:
                raise ValueError(f"trtllm mm_fp4 path expects N % 128 == 0 and K/16 % 4 == 0 (N={n})")
            w = shuffle_matrix_a(w.view(torch.uint8), 128)
            w_sf = (
                shuffle_matrix_sf_a(inputs["w_sf"].view(torch.uint8), 128)
                .reshape(inputs["w_sf"].shape)
                .view(torch.float8_e4m3fn)
            )
        else:
            w_sf = fp4.swizzle_scales(inputs["w_sf"])  # weight_scale_interleaved, e4m3 [Np, Kp]
        out = torch.empty((m, n), dtype=torch.bfloat16, device=x_fp4.device)
        alpha = inputs["alpha"]
        b, b_sf = w.T, w_sf.T
        return lambda: fn(x_fp4, b, x_sf, b_sf, alpha, torch.bfloat16, out, backend=backend)

    return bind


def _bind_aot_fp4_mm(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """sgl-kernel <= 0.3.21 cutlass_scaled_fp4_mm(a [M,K/2], b [N,K/2], sf_a, sf_b swizzled e4m3, alpha, dtype)."""
    x_fp4, w = inputs["x_fp4"], inputs["w"]
    x_sf = fp4.swizzle_scales(inputs["x_sf"])
    w_sf = fp4.swizzle_scales(inputs["w_sf"])
    alpha = inputs["alpha"]
    return lambda: fn(x_fp4, w, x_sf, w_sf, alpha, torch.bfloat16)


def _bind_marlin_gemm(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """apply_fp4_marlin_linear after prepare_nvfp4_layer_for_marlin (SGLang 0.5.16, fp4 gemm backend marlin)."""
    from sgl_kernel.scalar_type import scalar_types
    from sglang.jit_kernel.gptq_marlin_repack import gptq_marlin_repack

    x, w = inputs["x"], inputs["w"]
    m, k = x.shape
    n = w.shape[0]
    q, s, gs = marlin.marlin_prepare_weight(w, inputs["w_sf"], inputs["weight_scale_2"], gptq_marlin_repack)
    workspace = torch.zeros(marlin.sms(x.device), dtype=torch.int, device=x.device)  # marlin_make_workspace
    major, minor = torch.cuda.get_device_capability(x.device)
    atomic = marlin.should_use_atomic_add_reduce(m, n, k, major * 10 + minor, x.dtype)
    b_q_type = scalar_types.float4_e2m1f

    def launch() -> Tagged:
        out = fn(
            a=x,
            c=None,
            b_q_weight=q,
            b_scales=s,
            global_scale=gs,
            b_zeros=None,
            g_idx=None,
            perm=None,
            workspace=workspace,
            b_q_type=b_q_type,
            size_m=m,
            size_n=n,
            size_k=k,
            is_k_full=True,
            use_atomic_add=atomic,
            use_fp32_reduce=True,
        )
        return Tagged(out, "w4a16")

    return launch


# flashinfer.mm_fp4, one backend per implementation (SGLang 0.5.16 --fp4-gemm-backend flashinfer_*).
MM_FP4_BACKENDS: list[Backend] = [
    Backend(
        "flashinfer.cute-dsl",
        "flashinfer.gemm:mm_fp4",
        "flashinfer-python",
        "cutedsl",
        _bind_mm_fp4("cute-dsl"),
        requires=SM100,
        fallbacks=("flashinfer:mm_fp4",),
        note="SGLang 0.5.16 default on sm100 (--fp4-gemm-backend auto -> flashinfer_cutedsl)",
    ),
    Backend(
        "flashinfer.cutlass",
        "flashinfer.gemm:mm_fp4",
        "flashinfer-python",
        "jit",
        _bind_mm_fp4("cutlass"),
        requires=FI_FP4,
        fallbacks=("flashinfer:mm_fp4",),
    ),
    Backend(
        "flashinfer.cudnn",
        "flashinfer.gemm:mm_fp4",
        "flashinfer-python",
        "aot",
        _bind_mm_fp4("cudnn"),
        requires=FI_FP4,
        preload=("cudnn",),
        fallbacks=("flashinfer:mm_fp4",),
        note="cuDNN engine (needs the cudnn python frontend)",
    ),
    Backend(
        "flashinfer.trtllm",
        "flashinfer.gemm:mm_fp4",
        "flashinfer-python",
        "cubin",
        _bind_mm_fp4("trtllm"),
        requires=SM100,
        fallbacks=("flashinfer:mm_fp4",),
        note="weights shuffled (shuffle_matrix_a / shuffle_matrix_sf_a, epilogue tile 128) in bind",
    ),
]


# The four MM_FP4_BACKENDS as cutlass_scaled_fp4_mm and mm_fp4 both run them (one call, same inputs and
# check): each adapter declares them in its own body, so a case of one is measured once for both.
MM_FP4_IMPLEMENTATION = {
    "flashinfer.cute-dsl": "flashinfer.mm_fp4[cute-dsl]",
    "flashinfer.cutlass": "flashinfer.mm_fp4[cutlass]",
    "flashinfer.cudnn": "flashinfer.mm_fp4[cudnn]",
    "flashinfer.trtllm": "flashinfer.mm_fp4[trtllm]",
}


@register
class CutlassScaledFp4Mm(NumericsAdapter):
    """NVFP4 W4A4 dense GEMM (o_proj, dense gate_up/down, shared expert). sgl-kernel's CUTLASS kernel is
    gone in 0.4.5; SGLang 0.5.16 calls flashinfer.mm_fp4 (cute-dsl by default on sm100) and, on sm80-90,
    Marlin W4A16 at the same shapes."""

    kernel = "cutlass_scaled_fp4_mm"
    role = "gemm"
    ops = ("o_proj", "gate_up_proj", "down_proj", "shared_experts")
    description = "NVFP4 x NVFP4 GEMM, out = (deq(x) @ deq(W).T) * alpha, bf16"
    backends: ClassVar[list[Backend]] = [
        *MM_FP4_BACKENDS,
        Backend(
            "sgl_kernel",
            "sgl_kernel:cutlass_scaled_fp4_mm",
            "sglang-kernel",
            "aot",
            _bind_aot_fp4_mm,
            requires=SM100,
            fallbacks=("sgl_kernel.gemm:cutlass_scaled_fp4_mm",),
            note="the traced kernel; removed from sglang-kernel 0.4.5 (present up to 0.3.21)",
        ),
        Backend(
            "sglang_jit.marlin",
            "sglang.jit_kernel.gptq_marlin:gptq_marlin_gemm",
            "sglang",
            "jit",
            _bind_marlin_gemm,
            requires=MARLIN,
            label=HOPPER_GEMM,
            extra={"numerics": "w4a16"},
        ),
    ]
    implementation = MM_FP4_IMPLEMENTATION

    def applies(self, case: Case) -> bool:
        return case.dims.get("weight") == "nvfp4"

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        m, n, k = mnk(case)
        gen = generator(seed)
        x = randn((m, k), gen, device)
        x_fp4, x_sf, input_scale, _ = quantized_activation(x)
        w, w_sf, ws2 = nvfp4_weight((n, k), gen, device)
        return {
            "x": x,
            "x_fp4": x_fp4,
            "x_sf": x_sf,
            "input_scale": input_scale,
            "w": w,
            "w_sf": w_sf,
            "weight_scale_2": ws2,
            "alpha": (input_scale * ws2).float(),  # ModelOptFp4LinearMethod: input_scale_2 * weight_scale_2
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> Refs:
        def w4a4() -> torch.Tensor:
            a = fp4.dequantize_nvfp4(inputs["x_fp4"], inputs["x_sf"])
            w = memo(
                inputs, "w_deq", lambda: fp4.dequantize_nvfp4(inputs["w"], inputs["w_sf"]), ("w", "w_sf")
            )
            with exact_fp32_matmul():
                out = a @ w.T
            return out * torch.as_tensor(inputs["alpha"], dtype=torch.float32, device=out.device)

        def w4a16() -> torch.Tensor:
            w = memo(
                inputs,
                "w_deq16",
                lambda: fp4.dequantize_nvfp4(inputs["w"], inputs["w_sf"], 1.0 / inputs["weight_scale_2"]),
                ("w", "w_sf", "weight_scale_2"),
            )
            with exact_fp32_matmul():
                return inputs["x"].float() @ w.T

        return Refs("w4a4", {"w4a4": w4a4, "w4a16": w4a16})

    def traffic(self, case: Case) -> Traffic:
        m, n, k = mnk(case)
        return Traffic(
            gemm_traffic_w4a4(m, n, k),
            2 * m * n * k,
            f"W4A4: NVFP4 x and W at 0.5625 B/elem (scale padding not counted), bf16 out; "
            f"the Hopper Marlin W4A16 row moves {gemm_traffic_w4a16(m, n, k)} B (bf16 x)",
            compute="fp4",
        )

    def traffic_w4a16(self, case: Case) -> Traffic:
        m, n, k = mnk(case)
        return Traffic(gemm_traffic_w4a16(m, n, k), 2 * m * n * k, "W4A16: NVFP4 W, bf16 x and out")


@register
class MmFp4(CutlassScaledFp4Mm):
    """flashinfer.mm_fp4 (trace 001), the current home of cutlass_scaled_fp4_mm: same op, shapes and
    checks; the Hopper Marlin row lives on cutlass_scaled_fp4_mm."""

    kernel = "mm_fp4"
    description = "flashinfer NVFP4 x NVFP4 GEMM (cute-dsl / cutlass / cudnn / trtllm), bf16 out"
    backends: ClassVar[list[Backend]] = list(MM_FP4_BACKENDS)
    implementation = MM_FP4_IMPLEMENTATION
