"""`fp8_quantize`: a static BF16 -> FP8 e4m3 cast, not a quantiser with computed scales.

`sglang.jit_kernel.fp8_quantize` (a Triton kernel; flashinfer has no function of that name) computes
out = fp8(x * scale_inv) with round-to-nearest-even and saturation to +-448. SGLang 0.5.16 calls it with
scale_inv 1.0 in the tokenspeed_mla backend (Blackwell) before its FP8 MLA prefill, on the normed latent
kv_a [T, 512] and on v, a column slice of the kv_b_proj output [T, Nh, 256][..., 128:]; the kernel itself
runs on any GPU Triton has FP8 casts for (sm89+), so it is measured on Hopper too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend, Requirement
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common.inputs import FP8, FP8_MAX, enable_pdl, generator, nbytes, randn
from dskbench.adapters.quant.rounding import DTYPE
from dskbench.shapes.cases import Case

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
