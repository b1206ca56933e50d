"""The per-token-group 8-bit quantisers `sgl_per_token_group_quant_fp8` / `_8bit` / `_int8`
(one kernel behind three names), each measured at its own op.

None of these runs for DeepSeek-R1-NVFP4 by default (its linears are BF16 or NVFP4/Marlin); they run for
FP8 / INT8 checkpoints of DeepSeek. What SGLang 0.5.16 calls on sm90 in those cases:
* block-FP8 linears, DeepGEMM on Hopper (`deepgemm_w8a8_block_fp8_linear_with_fallback`):
  `sglang_per_token_group_quant_fp8(x, 128, column_major_scales=True, scale_tma_aligned=True,
  scale_ue8m0=False)` -> JIT `sglang.jit_kernel.per_token_group_quant_8bit_v2` (backend "sglang_jit",
  labelled). UE8M0 scales are Blackwell-only in SGLang (DEEPGEMM_SCALE_UE8M0 = DEEPGEMM_BLACKWELL), so
  they are not measured. This is the `sgl_per_token_group_quant_fp8` adapter: e4m3, fp32 scales
  column-major with M padded to 4 (TMA-aligned).
* the same call with row-major scales (cutlass / flashinfer-cutlass groupwise paths, Triton fallback):
  the `sgl_per_token_group_quant_8bit` adapter (e4m3, row-major fp32 scales) — 0.5.16 calls the sgl-kernel
  name `sgl_per_token_group_quant_8bit` for FP8 too.
* block-INT8 linears (`int8_utils.apply_w8a8_block_int8_linear`): the Triton
  `sglang.kernels.ops.quantization.int8_kernel.per_token_group_quant_int8` (backend "sglang_triton",
  labelled): the `sgl_per_token_group_quant_int8` adapter (int8, row-major scales).
Every group kernel is also measured as the sgl-kernel AOT v2 op (what the `sgl_kernel` wrapper picks for
group 128), the AOT v1 op, the JIT v1 kernel (opt-in SGLANG_OPT_USE_JIT_PER_TOKEN_GROUP_QUANT) and the
Triton kernel. No flashinfer implementation exists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common.inputs import FP8, FP8_MAX, SGLANG_SM90, generator, nbytes
from dskbench.adapters.quant.rounding import (
    DTYPE,
    EPS,
    GROUP,
    INT8_MAX,
    INT8_MIN,
    activations,
    check_quant,
    dims,
    own_op,
    quantize_ref_with_ties,
)
from dskbench.shapes.cases import Case

# -- binders -----------------------------------------------------------------------------------------


def _scales_buffer(m: int, k: int, group: int, layout: str, device: Any) -> torch.Tensor:
    """fp32 [M, K/group]; 'col_tma' = column-major with M padded to 4, as DeepGEMM on Hopper wants."""
    if layout == "col_tma":
        return torch.empty((k // group, (m + 3) // 4 * 4), dtype=torch.float32, device=device).t()[:m]
    return torch.empty((m, k // group), dtype=torch.float32, device=device)


def _outputs(inputs: dict[str, Any], spec: type[_GroupQuant]) -> tuple[torch.Tensor, torch.Tensor]:
    x = inputs["x"]
    m, k = x.shape
    q = torch.empty((m, k), dtype=spec.out_dtype, device=x.device)
    return q, _scales_buffer(m, k, GROUP, spec.scale_layout, x.device)


def _limits(spec: type[_GroupQuant]) -> tuple[float, float]:
    return (-FP8_MAX, FP8_MAX) if spec.out_dtype == FP8 else (INT8_MIN, INT8_MAX)


def _group_binder(extra_args: tuple[Any, ...]) -> Callable[[Any, dict[str, Any], Case], Callable[[], Any]]:
    """(input, q, s, group, eps, min, max, *extra_args): the AOT v1/v2 and JIT v1/v2 signatures."""

    def bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        spec = _SPECS[case.kernel]
        x = inputs["x"]
        q, s = _outputs(inputs, spec)
        lo, hi = _limits(spec)

        def launch() -> tuple[torch.Tensor, torch.Tensor]:
            fn(x, q, s, GROUP, EPS, lo, hi, *extra_args)
            return q, s

        return launch

    return bind


_bind_v2 = _group_binder((False, False, None))  # scale_ue8m0, fuse_silu_and_mul, masked_m
_bind_v1 = _group_binder((False,))  # scale_ue8m0


def _bind_triton_fp8(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # _per_token_group_quant_8bit_raw(x, group_size, eps, dtype, column_major_scales, scale_tma_aligned)
    col = _SPECS[case.kernel].scale_layout == "col_tma"
    x = inputs["x"]
    return lambda: fn(x, GROUP, EPS, FP8, col, col)


def _bind_triton_int8(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # per_token_group_quant_int8(x, group_size, eps, dtype) -> (q, s)
    x = inputs["x"]
    return lambda: fn(x, GROUP, EPS, torch.int8)


def _group_backends(triton: Backend, sglang_default: str) -> list[Backend]:
    """The five implementations of the group quantiser; `sglang_default` names the one SGLang calls."""
    backends = [
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.sgl_per_token_group_quant_8bit_v2.default",
            None,
            "aot",
            _bind_v2,
            preload=("sgl_kernel",),
            note="v2 op: what the sgl_kernel wrapper picks for group 128",
        ),
        Backend(
            "sgl_kernel.v1",
            "torch.ops.sgl_kernel.sgl_per_token_group_quant_8bit.default",
            None,
            "aot",
            _bind_v1,
            preload=("sgl_kernel",),
        ),
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.per_token_group_quant_8bit_v2:per_token_group_quant_8bit_v2",
            None,
            "jit",
            _bind_v2,
        ),
        Backend(
            "sglang_jit.v1",
            "sglang.jit_kernel.per_token_group_quant_8bit:per_token_group_quant_8bit",
            None,
            "jit",
            _bind_v1,
            note="opt-in in SGLang (SGLANG_OPT_USE_JIT_PER_TOKEN_GROUP_QUANT)",
        ),
        triton,
    ]
    return [replace(b, label=SGLANG_SM90) if b.name == sglang_default else b for b in backends]


_TRITON_FP8 = Backend(
    "sglang_triton",
    "sglang.kernels.ops.quantization.fp8_kernel:_per_token_group_quant_8bit_raw",
    None,
    "triton",
    _bind_triton_fp8,
    note="allocates its outputs per call (SGLang's non-CUDA path)",
)
_TRITON_INT8 = Backend(
    "sglang_triton",
    "sglang.kernels.ops.quantization.int8_kernel:per_token_group_quant_int8",
    None,
    "triton",
    _bind_triton_int8,
    note="allocates its outputs per call",
)


class _GroupQuant(Adapter):
    """One 1x128-group quantiser. Subclasses fix the output dtype and the scale layout."""

    role = "quant"
    out_dtype: ClassVar[torch.dtype] = FP8
    scale_layout: ClassVar[str] = "row"

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        m, k = dims(case)
        return {"x": activations(m, k, generator(seed), device)}

    def reference(
        self, inputs: dict[str, Any], case: Case
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return quantize_ref_with_ties(inputs["x"], GROUP, self.out_dtype)

    def applies(self, case: Case) -> bool:
        return own_op(self, case)

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return check_quant(out, ref, case)

    def skip_reason(self, case: Case) -> str | None:
        k = dims(case)[1]
        return None if k % GROUP == 0 else f"K={k} is not a multiple of the group size {GROUP}"

    def traffic(self, case: Case) -> Traffic:
        m, k = dims(case)
        return Traffic(
            bytes=nbytes(m * k, DTYPE)
            + nbytes(m * k, self.out_dtype)
            + nbytes(m * k // GROUP, torch.float32),
            flops=3 * m * k,
            note="read bf16, write 8-bit codes + one fp32 scale per 128",
        )


@register
class PerTokenGroupQuantFp8Adapter(_GroupQuant):
    kernel = "sgl_per_token_group_quant_fp8"
    ops = ("per_token_group_quant_fp8",)
    description = "1x128 FP8 quant, column-major TMA-aligned fp32 scales (DeepGEMM on Hopper)"
    out_dtype = FP8
    scale_layout = "col_tma"
    backends = _group_backends(_TRITON_FP8, sglang_default="sglang_jit")


@register
class PerTokenGroupQuant8bitAdapter(_GroupQuant):
    kernel = "sgl_per_token_group_quant_8bit"
    ops = ("per_token_group_quant_8bit",)
    description = "1x128 FP8 quant, row-major fp32 scales (cutlass / Triton block-FP8 paths)"
    out_dtype = FP8
    scale_layout = "row"
    backends = _group_backends(_TRITON_FP8, sglang_default="sglang_jit")


@register
class PerTokenGroupQuantInt8Adapter(_GroupQuant):
    kernel = "sgl_per_token_group_quant_int8"
    ops = ("per_token_group_quant_int8",)
    description = "1x128 INT8 quant, row-major fp32 scales (block-INT8 linears)"
    out_dtype = torch.int8
    scale_layout = "row"
    backends = _group_backends(_TRITON_INT8, sglang_default="sglang_triton")


_SPECS: dict[str, type[_GroupQuant]] = {
    c.kernel: c
    for c in (PerTokenGroupQuantFp8Adapter, PerTokenGroupQuant8bitAdapter, PerTokenGroupQuantInt8Adapter)
}
