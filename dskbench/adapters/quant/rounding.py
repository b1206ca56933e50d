"""What the 8-bit activation quantisers share: the kernels' scale formula and rounding, their inputs, and
the code-level check.

Rounding, read from the kernels: scale = max(amax, eps) / qmax; q = x * (qmax / amax) clamped, then cast —
round-to-nearest-even with saturation for e4m3, truncation toward zero for int8 (a C++/Triton
float->int8 cast). The check compares scales to that formula and codes to the emulated cast: a code whose value lies at a
rounding boundary (a tie) may land on either neighbour, and a one-step difference is allowed on a few
other elements (scale reciprocal computed by multiply vs divide).

Ties are not rare. The inputs are bf16 (8 significant bits) and so is amax, so x * (qmax / amax) often
lands exactly on an e4m3 midpoint: about 0.5% of the codes of random rows, and 6% of a row whose amax
makes qmax / amax a power of two. The reference rounds those to even; a kernel that divides by the
rounded scale instead lands a few ulps off the midpoint and rounds the other way. Counted against the
1% limit, such codes can make a right kernel read wrong on a short row.
"""

from __future__ import annotations

from typing import Any

import torch

from dskbench.adapters.base import Adapter, Check, rel_error
from dskbench.adapters.common.inputs import FP8, FP8_MAX, randn
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
# How close to a rounding boundary a value is a tie: a few fp32 ulps, more than the kernels' multiply vs
# divide vs reciprocal approximation differ by
TIE_REL = 2.0**-20


def own_op(adapter: Adapter, case: Case) -> bool:
    """The registry gives every quantiser name the whole "input quantization" op group (same K values);
    each name is measured at its own op only, so the four names do not repeat each other's cases."""
    return case.op in adapter.ops


def dims(case: Case) -> tuple[int, int]:
    return int(case.dims["T"]), int(case.dims["K"])


def activations(m: int, k: int, gen: torch.Generator, device: str) -> torch.Tensor:
    """Activations with a few outlier channels, so group scales differ (LLM activations do)."""
    gain = torch.where(torch.rand(k, generator=gen) < 0.01, 20.0, 1.0).to(device)
    return (randn((m, k), gen, device, torch.float32) * gain).to(DTYPE)


def _scaled(
    x: torch.Tensor, group: int, out_dtype: torch.dtype, eps: float
) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """(x * (qmax / amax) per group [M, K/group, group] before the cast, scales [M, K/group] fp32, the
    cast to the output's codes as floats)."""
    m, k = x.shape
    xg = x.float().view(m, k // group, group)
    amax = xg.abs().amax(-1).clamp_min(eps)
    qmax = FP8_MAX if out_dtype == FP8 else INT8_MAX
    qmin = -FP8_MAX if out_dtype == FP8 else INT8_MIN

    def cast(v: torch.Tensor) -> torch.Tensor:
        v = v.clamp(qmin, qmax)
        return v.to(FP8).float() if out_dtype == FP8 else v.trunc()

    return xg * (qmax / amax)[..., None], amax / qmax, cast


def quantize_ref(
    x: torch.Tensor, group: int, out_dtype: torch.dtype, eps: float = EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scales [M, K/group] fp32) with the kernels' formula and rounding."""
    y, scales, cast = _scaled(x, group, out_dtype, eps)
    return cast(y).to(out_dtype).view(x.shape), scales


def quantize_ref_with_ties(
    x: torch.Tensor, group: int, out_dtype: torch.dtype, eps: float = EPS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """quantize_ref's (q, scales) and a bool [M, K] of the codes at a tie (within TIE_REL of a rounding
    boundary: a kernel may round them either way)."""
    y, scales, cast = _scaled(x, group, out_dtype, eps)
    ties = cast(y * (1 - TIE_REL)) != cast(y * (1 + TIE_REL))
    return cast(y).to(out_dtype).view(x.shape), scales, ties.view(x.shape)


def fp8_step(v: torch.Tensor) -> torch.Tensor:
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
    step = fp8_step(torch.maximum(qf.abs(), qr.abs())) if q.dtype == FP8 else torch.ones_like(qr)
    off = diff > 0
    ties = ref[2].to(dev) if len(ref) > 2 else torch.zeros_like(off)  # a reference without them: none
    at_ties = int((off & ties).sum())
    mismatch = float((off & ~ties).float().mean())  # a tie may round either way: not counted
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
        f"scales:{scale_err:.1e} codes off:{mismatch:.1e} (at ties: {at_ties}; >1 step: {beyond_one_step}) "
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
