"""FP8/INT8 quantisation helpers with the scale layouts SGLang's kernels read, and their inverses.

Every scale here is a *dequantisation* scale (``x ≈ q * s``), fp32, as SGLang stores it
(``weight_scale_inv`` in DeepSeek's FP8 checkpoint, ``x_scale`` from ``per_token_group_quant_fp8``).
Granularities: per-tensor, per-token (one scale per row; per-channel for an [N, K] weight),
per-token-group (1 x g along the last dim, DeepSeek g = 128) and block (128 x 128 on the last two dims,
any leading batch dims, e.g. MoE experts [E, N, K]). Everything runs on CPU and CUDA, so adapters
build real inputs on either device and references dequantise with the same code.
"""

from __future__ import annotations

import math

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
INT8_MAX = 127.0
DEFAULT_EPS = 1e-10  # sglang's per_token_group_quant_fp8 default
GROUP = 128  # DeepSeek activation group and weight block edge
SCALE_LAYOUTS = ("row", "col", "col_tma")


def qmax(dtype: torch.dtype) -> float:
    """Largest magnitude the quantised dtype represents (the divisor of amax in the scale)."""
    if dtype == FP8_DTYPE:
        return FP8_MAX
    if dtype == torch.int8:
        return INT8_MAX
    raise ValueError(f"unsupported quantised dtype {dtype}")


def ceil_ue8m0(s: torch.Tensor) -> torch.Tensor:
    """Round scales up to a power of two (DeepGEMM's UE8M0 scales on Blackwell)."""
    return torch.exp2(torch.ceil(torch.log2(s)))


def quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = FP8_DTYPE) -> torch.Tensor:
    """q = saturate(x / scale) in `dtype`; `scale` broadcasts against `x`. INT8 rounds half to even."""
    return _saturate(x.to(torch.float32, copy=True).div_(scale), dtype)


def _saturate(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round (INT8) and clamp an fp32 tensor in place, then cast: one fp32 temporary at most."""
    m = qmax(dtype)
    if dtype == torch.int8:
        return y.round_().clamp_(-128.0, m).to(torch.int8)
    return y.clamp_(-m, m).to(dtype)


def _absmax(x: torch.Tensor, dim: int | tuple[int, ...] | None = None, keepdim: bool = False) -> torch.Tensor:
    """max |x| without materialising |x| (weights can be a GB)."""
    if dim is None:
        return torch.maximum(x.max(), -x.min()).reshape(1)
    return torch.maximum(x.amax(dim=dim, keepdim=keepdim), -x.amin(dim=dim, keepdim=keepdim))


def _scale_from_amax(amax: torch.Tensor, dtype: torch.dtype, eps: float, ue8m0: bool) -> torch.Tensor:
    s = amax.float().clamp_min(eps) / qmax(dtype)
    return ceil_ue8m0(s) if ue8m0 else s


def per_tensor_quant(
    x: torch.Tensor, dtype: torch.dtype = FP8_DTYPE, eps: float = DEFAULT_EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale for the whole tensor -> (q, scale fp32 [1])."""
    s = _scale_from_amax(_absmax(x), dtype, eps, False)
    return quantize(x, s, dtype), s


def per_token_quant(
    x: torch.Tensor, dtype: torch.dtype = FP8_DTYPE, eps: float = DEFAULT_EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row of the last dim -> (q, scale fp32 [..., 1]).

    Per-token for activations [M, K]; per-output-channel for a weight [N, K].
    """
    s = _scale_from_amax(_absmax(x, -1, keepdim=True), dtype, eps, False)
    return quantize(x, s, dtype), s


def per_token_group_quant(
    x: torch.Tensor,
    group: int = GROUP,
    dtype: torch.dtype = FP8_DTYPE,
    eps: float = DEFAULT_EPS,
    ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """1 x `group` groups along the last dim -> (q, scale fp32 [..., K/group], row-major)."""
    k = x.shape[-1]
    if k % group:
        raise ValueError(f"last dim {k} is not a multiple of the group size {group}")
    xg = x.unflatten(-1, (k // group, group))
    s = _scale_from_amax(_absmax(xg, -1), dtype, eps, ue8m0)
    q = quantize(xg, s.unsqueeze(-1), dtype).flatten(-2)
    return q, s


def block_quant(
    w: torch.Tensor,
    block: tuple[int, int] = (GROUP, GROUP),
    dtype: torch.dtype = FP8_DTYPE,
    eps: float = DEFAULT_EPS,
    ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block scales on the last two dims -> (q, scale fp32 [..., ceil(N/bn), ceil(K/bk)]).

    A partial last block (e.g. N = 2112 = 16.5 x 128) gets its own scale, as in DeepSeek's checkpoint.
    """
    bn, bk = block
    *lead, n, k = w.shape
    nb, kb = math.ceil(n / bn), math.ceil(k / bk)
    wp = torch.zeros(*lead, nb * bn, kb * bk, dtype=torch.float32, device=w.device)
    wp[..., :n, :k] = w
    blocks = wp.unflatten(-1, (kb, bk)).unflatten(-3, (nb, bn))  # a view: [..., nb, bn, kb, bk]
    s = _scale_from_amax(_absmax(blocks, (-3, -1)), dtype, eps, ue8m0)  # [..., nb, kb]
    blocks.div_(s.unsqueeze(-1).unsqueeze(-3))
    return _saturate(wp, dtype)[..., :n, :k].contiguous(), s


def expand_block_scale(s: torch.Tensor, block: tuple[int, int], n: int, k: int) -> torch.Tensor:
    """Block scales [..., nb, kb] -> one scale per element [..., n, k]."""
    bn, bk = block
    return s.repeat_interleave(bn, dim=-2)[..., :n, :].repeat_interleave(bk, dim=-1)[..., :k]


def dequant(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q * scale in fp32 for per-tensor and per-token scales (anything that broadcasts)."""
    return q.float() * scale.float()


def dequant_per_token_group(q: torch.Tensor, scale: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """Inverse of per_token_group_quant (accepts the scale in any memory layout)."""
    return q.float() * scale.float().repeat_interleave(group, dim=-1)


def dequant_block(
    q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] = (GROUP, GROUP)
) -> torch.Tensor:
    """Inverse of block_quant. Whole blocks multiply through a broadcast view of the scales (the same
    products, without materialising one fp32 scale per element)."""
    n, k = q.shape[-2:]
    bn, bk = block
    if n % bn or k % bk:
        return q.float() * expand_block_scale(scale.float(), block, n, k)
    blocks = q.float().unflatten(-1, (k // bk, bk)).unflatten(-3, (n // bn, bn))  # [..., nb, bn, kb, bk]
    return blocks.mul_(scale.float().unsqueeze(-1).unsqueeze(-3)).flatten(-2).flatten(-3, -2)


def scale_layout(s: torch.Tensor, layout: str) -> torch.Tensor:
    """The same [M, G] scale values in the memory layout a kernel reads.

    row: contiguous [M, G] (Triton w8a8_block_fp8_matmul, flashinfer fp8_blockscale_gemm_sm90).
    col: column-major, stride (1, M) (the CUTLASS block-FP8 GEMMs: ``scales_a`` with stride(0) == 1).
    col_tma: column-major with M padded to a multiple of 4, stride (1, ceil4(M)) — what sglang's
    ``per_token_group_quant_fp8(column_major_scales=True, scale_tma_aligned=True)`` writes for DeepGEMM.
    """
    if layout not in SCALE_LAYOUTS:
        raise ValueError(f"unknown scale layout {layout!r} (choose from {', '.join(SCALE_LAYOUTS)})")
    if s.dim() != 2:
        raise ValueError(f"expected a 2-D [M, groups] scale, got shape {tuple(s.shape)}")
    m, g = s.shape
    if layout == "row":
        return s.contiguous()
    if layout == "col":
        return s.t().contiguous().t()
    aligned = (m + 3) // 4 * 4
    buf = torch.zeros(g, aligned, dtype=s.dtype, device=s.device)
    buf[:, :m] = s.t()
    return buf.t()[:m]
