"""NVFP4 / MXFP4 activation quantisation of the NVFP4 linears' inputs ([T, K] bf16 -> packed codes +
128x4-swizzled block scales): the traced sgl-kernel scaled_fp4_quant and flashinfer's fp4_quantize /
mxfp4_quantize. sm100 only: on Hopper, Marlin keeps the activations BF16, so these have no Hopper row."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import SM100, Backend
from dskbench.adapters.base import Adapter, Check, Traffic, rel_error
from dskbench.adapters.common import nvfp4 as fp4
from dskbench.adapters.common.inputs import generator, randn
from dskbench.adapters.common.nvfp4_adapter import FI_FP4, Refs, untag
from dskbench.adapters.common.nvfp4_inputs import calibrated_input_scale
from dskbench.shapes.cases import Case


def _quant_dims(case: Case) -> tuple[int, int]:
    return int(case.dims["T"]), int(case.dims["K"])


def _bind_fi_fp4_quantize(backend: str) -> Callable[[Any, dict[str, Any], Case], Callable[[], Any]]:
    """flashinfer.fp4_quantize(x, input_scale_inv) with SGLang's defaults (sf 16, e4m3, 128x4 swizzled)."""

    def bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        x, gs = inputs["x"], inputs["global_scale"]
        return lambda: fn(x, gs, 16, False, True, backend=backend)

    return bind


def _bind_aot_scaled_fp4_quant(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """sgl-kernel <= 0.3.21 scaled_fp4_quant(input, input_global_scale) -> (uint8, swizzled e4m3 scales)."""
    x, gs = inputs["x"], inputs["global_scale"]
    return lambda: fn(x, gs)


class _QuantBase(Adapter):
    """NVFP4 activation quantisation of the NVFP4 linears' inputs ([T, K] bf16 -> packed + swizzled scales)."""

    role = "quant"
    ops = ("o_proj", "gate_up_proj", "down_proj", "shared_experts")
    tolerance_value: ClassVar[float] = 1e-2

    def applies(self, case: Case) -> bool:
        # the quant role carries no weight format: the shapes file says which ops store NVFP4 weights
        return case.model.get("weight_format") == "nvfp4"

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, k = _quant_dims(case)
        x = randn((t, k), generator(seed), device)
        input_scale = calibrated_input_scale(x)
        return {"x": x, "global_scale": (1.0 / input_scale).reshape(1).float()}

    def reference(self, inputs: dict[str, Any], case: Case) -> Refs:
        x, gs = inputs["x"], inputs["global_scale"]
        return Refs("w4a4", {"w4a4": lambda: fp4.quantize_nvfp4(x, gs)})

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        value, _, layout = untag(out, "w4a4")
        rows, k = _quant_dims(case)
        packed = value[0].view(torch.uint8).reshape(rows, k // 2)
        sf = value[1] if layout == "linear" else fp4.unswizzle_scales(value[1], rows, k // fp4.NVFP4_BLOCK)
        ref_packed, ref_sf = ref.get("w4a4")
        got = fp4.dequantize_nvfp4(packed.cpu(), sf.cpu())
        want = fp4.dequantize_nvfp4(ref_packed.cpu(), ref_sf.cpu())
        err = rel_error(got, want)
        differ = (packed.cpu() != ref_packed.cpu()).float().mean().item()
        sf_differ = (sf.cpu().view(torch.uint8) != ref_sf.cpu().view(torch.uint8)).float().mean().item()
        tol = self.tolerance_value
        detail = f"dequantised rel err {err:.2e}; bytes differing: data {differ:.2%}, scales {sf_differ:.2%}"
        return Check(err <= tol, err, tol, detail)

    def traffic(self, case: Case) -> Traffic:
        t, k = _quant_dims(case)
        return Traffic(2 * t * k + fp4.nvfp4_bytes(t * k), 4 * t * k, "bf16 in, NVFP4 out (scales unpadded)")


# flashinfer.fp4_quantize as _bind_fi_fp4_quantize calls it, on _QuantBase's inputs: scaled_fp4_quant and
# fp4_quantize both declare it in their own bodies, so a case of one is measured once for both.
FP4_QUANTIZE_IMPLEMENTATION = {
    "flashinfer.cuda": "flashinfer.fp4_quantize[cuda]",
    "flashinfer.cute-dsl": "flashinfer.fp4_quantize[cute-dsl]",
}


@register
class ScaledFp4Quant(_QuantBase):
    """The W4A4 linears' activation quantiser (sgl-kernel scaled_fp4_quant; SGLang 0.5.16 calls
    flashinfer.fp4_quantize, CuTe-DSL backend on sm100). No Hopper equivalent: Marlin keeps BF16 inputs."""

    kernel = "scaled_fp4_quant"
    description = "bf16 [T, K] -> NVFP4 (uint8 [T, K/2] + 128x4-swizzled e4m3 scales)"
    backends: ClassVar[list[Backend]] = [
        Backend(
            "flashinfer.cute-dsl",
            "flashinfer:fp4_quantize",
            "flashinfer-python",
            "cutedsl",
            _bind_fi_fp4_quantize("cute-dsl"),
            requires=FI_FP4,
            fallbacks=("flashinfer.quantization.fp4_quantization:fp4_quantize",),
            note="what sglang.srt.layers.quantization.fp4_utils.fp4_quantize runs on sm100",
        ),
        Backend(
            "flashinfer.cuda",
            "flashinfer:fp4_quantize",
            "flashinfer-python",
            "jit",
            _bind_fi_fp4_quantize("cuda"),
            requires=FI_FP4,
            fallbacks=("flashinfer.quantization.fp4_quantization:fp4_quantize",),
        ),
        Backend(
            "sgl_kernel",
            "sgl_kernel:scaled_fp4_quant",
            "sglang-kernel",
            "aot",
            _bind_aot_scaled_fp4_quant,
            requires=SM100,
            fallbacks=("sgl_kernel.gemm:scaled_fp4_quant",),
            note="the traced kernel; removed from sglang-kernel 0.4.5",
        ),
    ]
    implementation = FP4_QUANTIZE_IMPLEMENTATION


@register
class Fp4Quantize(_QuantBase):
    """flashinfer.fp4_quantize itself (trace 001), at the NVFP4 linears' input shapes."""

    kernel = "fp4_quantize"
    description = "flashinfer NVFP4 quantisation, sf_vec_size 16, e4m3 scales, 128x4 swizzled"
    backends: ClassVar[list[Backend]] = [
        Backend(
            "flashinfer.cuda",
            "flashinfer:fp4_quantize",
            "flashinfer-python",
            "jit",
            _bind_fi_fp4_quantize("cuda"),
            requires=FI_FP4,
            fallbacks=("flashinfer.quantization.fp4_quantization:fp4_quantize",),
        ),
        Backend(
            "flashinfer.cute-dsl",
            "flashinfer:fp4_quantize",
            "flashinfer-python",
            "cutedsl",
            _bind_fi_fp4_quantize("cute-dsl"),
            requires=FI_FP4,
            fallbacks=("flashinfer.quantization.fp4_quantization:fp4_quantize",),
        ),
    ]
    implementation = FP4_QUANTIZE_IMPLEMENTATION


def _bind_fi_mxfp4_quantize(backend: str) -> Callable[[Any, dict[str, Any], Case], Callable[[], Any]]:
    def bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        x = inputs["x"]
        return lambda: fn(x, backend=backend)

    return bind


@register
class Mxfp4Quantize(_QuantBase):
    """flashinfer.mxfp4_quantize (trace 001: SGLang's MXFP4 path for GPT-OSS-style checkpoints). Not on
    DeepSeek-R1-NVFP4's path; measured at the NVFP4 linears' input shapes."""

    kernel = "mxfp4_quantize"
    description = "bf16 [T, K] -> MXFP4 (uint8 [T, K/2] + 128x4-swizzled UE8M0 scales, one per 32)"
    backends: ClassVar[list[Backend]] = [
        Backend(
            "flashinfer.cuda",
            "flashinfer:mxfp4_quantize",
            "flashinfer-python",
            "jit",
            _bind_fi_mxfp4_quantize("cuda"),
            requires=FI_FP4,
            fallbacks=("flashinfer.quantization.fp4_quantization:mxfp4_quantize",),
        ),
        Backend(
            "flashinfer.cute-dsl",
            "flashinfer:mxfp4_quantize",
            "flashinfer-python",
            "cutedsl",
            _bind_fi_mxfp4_quantize("cute-dsl"),
            requires=FI_FP4,
            fallbacks=("flashinfer.quantization.fp4_quantization:mxfp4_quantize",),
        ),
    ]

    def reference(self, inputs: dict[str, Any], case: Case) -> Refs:
        x = inputs["x"]
        return Refs("w4a4", {"w4a4": lambda: fp4.quantize_mxfp4(x)})

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        value, _, layout = untag(out, "w4a4")
        rows, k = _quant_dims(case)
        packed = value[0].view(torch.uint8).reshape(rows, k // 2).cpu()
        sf = value[1] if layout == "linear" else fp4.unswizzle_scales(value[1], rows, k // fp4.MXFP4_BLOCK)
        ref_packed, ref_sf = ref.get("w4a4")
        got = fp4.dequantize_mxfp4(packed, sf.view(torch.uint8).cpu())
        want = fp4.dequantize_mxfp4(ref_packed.cpu(), ref_sf.cpu())
        err = rel_error(got, want)
        differ = (packed != ref_packed.cpu()).float().mean().item()
        tol = self.tolerance_value
        return Check(
            err <= tol, err, tol, f"dequantised rel err {err:.2e}; data bytes differing {differ:.2%}"
        )

    def traffic(self, case: Case) -> Traffic:
        t, k = _quant_dims(case)
        return Traffic(
            2 * t * k + t * k // 2 + t * k // 32, 4 * t * k, "bf16 in, MXFP4 out (scales unpadded)"
        )
