"""Activation quantisation: `sgl_per_token_quant_fp8` (catalogue 8.1) and the per-token-group kernels
`sgl_per_token_group_quant_fp8` / `_8bit` / `_int8` (8.2-8.4; one kernel behind three names).

None of these runs for DeepSeek-R1-NVFP4 by default (its linears are BF16 or NVFP4/Marlin); they run for
FP8 / INT8 checkpoints of DeepSeek (and for NVFP4 with SGLANG_NVFP4_CKPT_FP8_GEMM_IN_ATTN). What SGLang
0.5.16 calls on sm90 in those cases:
* per-token FP8 (`fp8_utils.apply_fp8_linear`, dynamic per-token scales): `sglang_per_token_quant_fp8`
  -> the sgl-kernel AOT op `sgl_per_token_quant_fp8` (backend "sgl_kernel", labelled).
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

`fp8_quantize` is a static cast, not a quantiser with computed scales: `sglang.jit_kernel.fp8_quantize`
(a Triton kernel; flashinfer has no function of that name) computes out = fp8(x * scale_inv) with
round-to-nearest-even and saturation to +-448. SGLang 0.5.16 calls it with scale_inv 1.0 in the
tokenspeed_mla backend (Blackwell) before its FP8 MLA prefill, on the normed latent kv_a [T, 512] and on
v, a column slice of the kv_b_proj output [T, Nh, 256][..., 128:]; the kernel itself runs on any GPU
Triton has FP8 casts for (sm89+), so it is measured on Hopper too.

Rounding, read from the kernels: scale = max(amax, eps) / qmax; q = x * (qmax / amax) clamped, then cast —
round-to-nearest-even with saturation for e4m3, truncation toward zero for int8 (a C++/Triton
float->int8 cast). The check compares scales to that formula and codes to the emulated cast, allowing a
one-step difference on a few elements (scale reciprocal computed by multiply vs divide).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend, Requirement
from dskbench.adapters.base import Adapter, Check, Traffic, rel_error
from dskbench.adapters.common.inputs import FP8, FP8_MAX, SGLANG_SM90, enable_pdl, generator, nbytes, randn
from dskbench.shapes.cases import Case

DTYPE = torch.bfloat16
EPS = 1e-10  # SGLang's default eps for the group quantisers
DEQUANT_TOL = 5e-3  # dequantised output vs the reference's, beyond what allowed one-step codes explain
GROUP = 128  # DeepSeek's block size
INT8_MIN, INT8_MAX = -128.0, 127.0
# Fraction of codes allowed exactly one step off the emulated cast. Kernels round x * (qmax / amax)
# or x / (amax / qmax), in fp32 or with a reciprocal approximation: a tie can land on either neighbour.
# sgl_kernel v1, sglang_jit v1 and the Triton kernel differ from the emulation on a few codes per
# thousand, never by more than one step (results/h200x2-2026-11-21/README.md).
MAX_MISMATCH = 1e-2


def _own_op(adapter: Adapter, case: Case) -> bool:
    """The registry gives every quantiser name the whole "input quantization" op group (same K values);
    each name is measured at its own op only, so the four names do not repeat each other's cases."""
    return case.op in adapter.ops


def _dims(case: Case) -> tuple[int, int]:
    return int(case.dims["T"]), int(case.dims["K"])


def _activations(m: int, k: int, gen: torch.Generator, device: str) -> torch.Tensor:
    """Activations with a few outlier channels, so group scales differ (LLM activations do)."""
    gain = torch.where(torch.rand(k, generator=gen) < 0.01, 20.0, 1.0).to(device)
    return (randn((m, k), gen, device, torch.float32) * gain).to(DTYPE)


def quantize_ref(
    x: torch.Tensor, group: int, out_dtype: torch.dtype, eps: float = EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scales [M, K/group] fp32) with the kernels' formula and rounding."""
    m, k = x.shape
    xg = x.float().view(m, k // group, group)
    amax = xg.abs().amax(-1).clamp_min(eps)
    qmax = FP8_MAX if out_dtype == FP8 else INT8_MAX
    qmin = -FP8_MAX if out_dtype == FP8 else INT8_MIN
    scales = amax / qmax
    y = (xg * (qmax / amax)[..., None]).clamp(qmin, qmax)
    q = y.to(FP8) if out_dtype == FP8 else y.trunc().to(torch.int8)
    return q.view(m, k), scales


def _fp8_step(v: torch.Tensor) -> torch.Tensor:
    """Spacing of e4m3 codes at |v| (3 mantissa bits; subnormal spacing 2^-9)."""
    e = torch.floor(torch.log2(v.abs().clamp_min(2.0**-6)))
    return torch.exp2(e - 3)


def check_quant(out: Any, ref: Any, case: Case) -> Check:
    q, s = out[0], out[1]
    q_ref, s_ref = ref[0], ref[1]
    if tuple(q.shape) != tuple(q_ref.shape) or tuple(s.shape) != tuple(s_ref.shape):
        return Check(False, float("inf"), 0.0, f"shapes q{tuple(q.shape)} s{tuple(s.shape)}")
    if q.dtype != q_ref.dtype:
        return Check(False, float("inf"), 0.0, f"q dtype {q.dtype}, expected {q_ref.dtype}")
    # on the output's device: on the CPU this check of a [8192, 16384] output takes a large share of a
    # GPU sweep's time; the GPU does it in milliseconds
    dev = q.device
    s64, sr64 = s.detach().double(), s_ref.detach().to(dev).double()
    scale_err = float(((s64 - sr64).abs() / sr64).max())
    qf, qr = q.detach().float(), q_ref.detach().to(dev).float()
    diff = (qf - qr).abs()
    step = _fp8_step(torch.maximum(qf.abs(), qr.abs())) if q.dtype == FP8 else torch.ones_like(qr)
    mismatch = float((diff > 0).float().mean())
    beyond_one_step = int((diff > step * 1.001).sum())
    group = qf.shape[1] // sr64.shape[1]
    scale = sr64.float().repeat_interleave(group, dim=1)
    deq = qf * s64.float().repeat_interleave(group, dim=1)
    deq_ref = qr * scale
    err = rel_error(deq, deq_ref)
    # The dequantised error the allowed codes explain (those one step off), on top of 5e-3: on a short
    # row (T=1, K=1536) a few one-step codes alone can exceed 5e-3
    explained = rel_error(qr * scale + (qf - qr) * (diff <= step * 1.001) * scale, deq_ref)
    tol = DEQUANT_TOL + explained
    ok = scale_err <= 1e-5 and mismatch <= MAX_MISMATCH and beyond_one_step == 0 and err <= tol
    detail = (
        f"scales:{scale_err:.1e} codes off:{mismatch:.1e} (>1 step: {beyond_one_step}) "
        f"dequant:{err:.1e} (one-step codes explain {explained:.1e})"
    )
    if not ok:
        failed = [
            f"scale error {scale_err:.1e} > 1e-5" if scale_err > 1e-5 else "",
            f"{mismatch:.1e} of the codes off > {MAX_MISMATCH:g}" if mismatch > MAX_MISMATCH else "",
            f"{beyond_one_step} codes more than one step off" if beyond_one_step else "",
        ]
        detail = "; ".join(f for f in failed if f) + (" — " if any(failed) else "") + detail
    return Check(ok, err, tol, detail)


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
        m, k = _dims(case)
        return {"x": _activations(m, k, generator(seed), device)}

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_ref(inputs["x"], GROUP, self.out_dtype)

    def applies(self, case: Case) -> bool:
        return _own_op(self, case)

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return check_quant(out, ref, case)

    def skip_reason(self, case: Case) -> str | None:
        k = _dims(case)[1]
        return None if k % GROUP == 0 else f"K={k} is not a multiple of the group size {GROUP}"

    def traffic(self, case: Case) -> Traffic:
        m, k = _dims(case)
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


# -- per-token FP8 -----------------------------------------------------------------------------------


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
        m, k = _dims(case)
        return {"x": _activations(m, k, generator(seed), device)}

    def applies(self, case: Case) -> bool:
        return _own_op(self, case)

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        x = inputs["x"]
        return quantize_ref(x, x.shape[1], FP8)

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return check_quant(out, ref, case)

    def traffic(self, case: Case) -> Traffic:
        m, k = _dims(case)
        return Traffic(
            bytes=nbytes(m * k, DTYPE) + nbytes(m * k, FP8) + nbytes(m, torch.float32),
            flops=3 * m * k,
            note="read bf16, write e4m3 + one fp32 scale per row",
        )


# -- fp8_quantize (static BF16 -> FP8 cast) -----------------------------------------------------------

SCALE_INV = 1.0  # what SGLang passes (the default): a plain saturating cast


def cast_fp8_ref(x: torch.Tensor, scale_inv: float = SCALE_INV) -> torch.Tensor:
    """fp8(x * scale_inv): the fp32 product, clamped to +-448 (the kernel's saturating cvt; explicit, so
    the reference does not rest on how a torch build casts out-of-range values), rounded to nearest even."""
    return (x.float() * scale_inv).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def _bind_fp8_quantize(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # fp8_quantize(x, scale_inv=1.0, out=None, fp8_dtype=e4m3, enable_pdl=False) -> out; SGLang passes
    # no `out`, so the output is allocated per call as there.
    x = inputs["x"]
    pdl = enable_pdl(x)
    return lambda: fn(x, scale_inv=SCALE_INV, fp8_dtype=FP8, enable_pdl=pdl)


@register
class Fp8QuantizeAdapter(Adapter):
    """The v variant is a strided view (row stride Dn + Dv) the kernel reads in place; kv_a is packed."""

    kernel = "fp8_quantize"
    role = "fp8_cast"
    ops = ("attn_mha",)
    description = "static BF16 -> FP8 e4m3 cast of kv_a and v before an FP8 MLA prefill (scale_inv 1.0)"
    backends = [
        Backend(
            "sglang_triton",
            "sglang.jit_kernel.fp8_quantize:fp8_quantize",
            None,
            "triton",
            _bind_fp8_quantize,
            requires=Requirement(min_sm=89),  # Triton's fp8e4nv casts need sm89+
            note="SGLang calls it in the tokenspeed_mla backend (sm100); allocates its output per call",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, heads, d, stride = (int(case.dims[k]) for k in ("T", "heads", "D", "stride"))
        rows = randn((t, heads, stride), generator(seed), device, DTYPE)
        x = rows[..., stride - d :]  # v = kv[..., Dn:]; kv_a: the whole (packed) row
        return {"x": x[:, 0] if heads == 1 else x}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return cast_fp8_ref(inputs["x"])

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        """Exact: one correctly rounded cast per element has one right answer (no tolerance to justify)."""
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref.shape) or out.dtype != FP8:
            got = f"{getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}"
            return Check(False, float("inf"), 0.0, f"output {got}, expected {FP8} {tuple(ref.shape)}")
        o, r = out.detach().float(), ref.detach().to(out.device).float()
        bad = int((o != r).sum())  # NaN != NaN: a NaN code counts as wrong
        return Check(bad == 0, bad / max(1, r.numel()), 0.0, f"{bad} of {r.numel()} codes differ")

    def traffic(self, case: Case) -> Traffic:
        n = int(case.dims["T"]) * int(case.dims["heads"]) * int(case.dims["D"])
        return Traffic(
            bytes=nbytes(n, DTYPE) + nbytes(n, FP8),
            flops=n,
            note="read bf16, write e4m3; FLOPs nominal: one scale multiply per element",
        )
