"""NVFP4 (and MXFP4) in pure torch: the format every sm100-only kernel of this checkpoint reads and writes.

Why a CPU implementation: the checkpoint's weights, the activations SGLang quantises, and the correctness
oracle of every NVFP4 kernel must exist on machines without Blackwell (or without a GPU).

Format, as FlashInfer 0.6.14 / TensorRT-LLM and SGLang 0.5.16 implement it:

* e2m1 ("FP4"): 4-bit code, bit 3 = sign, bits 2..0 index the magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}
  (``flashinfer/quantization/fp4_quantization.py: _E2M1_VALUES``). Two codes per byte, the **even**
  element in the **low** nibble (PTX ``cvt.rn.satfinite.e2m1x2.f32 d, hi, lo`` is called with
  ``array[1], array[0]``; FlashInfer's CPU dequant unpacks ``[:, 0::2] = byte & 0xF``).
  Conversion is round-to-nearest-even with saturation to +-6.
* One float8_e4m3fn block scale per 16 consecutive elements along K.
* A float32 global scale per tensor. Quantisation takes ``global_scale = 448 * 6 / amax`` (what
  ``flashinfer.fp4_quantize`` receives; SGLang passes ``input_scale_inv = 1 / input_scale``). The
  checkpoint stores the inverse, the dequantisation scale: ``input_scale`` and ``weight_scale_2``
  (``amax / (448 * 6)``); a W4A4 GEMM multiplies by ``alpha = input_scale * weight_scale_2``.
* Per block (quantization_utils.cuh ``cvt_warp_fp16_to_fp4``): ``sf = e4m3(gs * (amax16 * (1/6)))``,
  ``q = e2m1(x * 1 / (float(sf) * (1 / gs)))``; dequantised ``x = e2m1 * float(sf) / gs``.
* Scale layouts: *linear* ``[rows, K/16]`` (the checkpoint, trtllm MoE hidden states) or *swizzled 128x4*
  (CUTLASS/cuDNN/trtllm GEMMs): rows padded to 128 and K/16 to 4, then tiles of 128 rows x 4 columns,
  each tile stored as [32][4][4] with ``offset = ((r // 128) * ceil(C/4) + c // 4) * 512 + (r % 32) * 16 +
  ((r % 128) // 32) * 4 + c % 4`` (``get_sf_out_offset_128x4``; SGLang's ``swizzle_blockscale`` is the same
  reshape/permute). Padding entries are zero.
* MXFP4: one UE8M0 scale (a power of two, byte = exponent + 127) per 32 elements,
  ``scale = 2 ** ceil(log2(amax32 / 6))``; no global scale.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from dskbench.adapters.common.matmul_precision import exact_fp32_matmul

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_MAX = 6.0
E4M3_MAX = 448.0
NVFP4_BLOCK = 16
MXFP4_BLOCK = 32
SWIZZLE_ROWS = 128
SWIZZLE_COLS = 4
# Routed experts whose fp32 weights an NVFP4 MoE reference holds at once: 8 x 176 MB at DeepSeek's
# I=2048, H=7168 (a GPU holds that beside the inputs; the launches per expert shrink eightfold).
MOE_DEQUANT_CHUNK = 8

# Round-to-nearest-even on the e2m1 grid: the code is the number of midpoints below the magnitude.
# At a midpoint the even code wins (codes 0, 2, 4, 6 have mantissa bit 0), so for midpoints whose lower
# neighbour has an odd code a tie must round *up*: those boundaries move one ulp down.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


@functools.lru_cache(maxsize=16)
def _boundaries(device: torch.device) -> torch.Tensor:
    """The rounding boundaries on `device`, built once per device (not one host copy per call)."""
    b = torch.tensor(_MIDPOINTS, dtype=torch.float32, device=device)
    odd = torch.tensor([i % 2 == 1 for i in range(len(_MIDPOINTS))], device=device)
    return torch.where(odd, torch.nextafter(b, torch.zeros_like(b)), b)


def e2m1_values(device: torch.device | str = "cpu") -> torch.Tensor:
    """The 16 code values (float32), index = code."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """float -> e2m1 codes (uint8, 0..15): round to nearest even, saturate to +-6, sign kept for -0."""
    xf = x.float()
    mag = torch.bucketize(xf.abs(), _boundaries(xf.device), right=False).to(torch.uint8)
    sign = torch.signbit(xf).to(torch.uint8) << 3
    return mag | sign


@functools.lru_cache(maxsize=16)
def _e2m1_table(device: torch.device) -> torch.Tensor:
    """e2m1_values on `device`, built once per device."""
    return e2m1_values(device)


@functools.lru_cache(maxsize=16)
def _e2m1_byte_table(device: torch.device) -> torch.Tensor:
    """[256, 2] float32: the values of a packed byte's (low, high) codes, built once per device."""
    b = torch.arange(256, device=device)
    return _e2m1_table(device)[torch.stack([b & 0x0F, b >> 4], dim=-1)]


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8) -> float32 values."""
    return _e2m1_table(codes.device)[codes.long()]


def decode_packed_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] packed bytes -> float32 [..., K] values: decode_e2m1(unpack_e2m1(packed)) in one lookup."""
    p = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    return _e2m1_byte_table(p.device)[p.long()].flatten(-2)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes -> [..., K/2] bytes; element 2i in the low nibble, 2i+1 in the high nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"last dimension must be even, got {codes.shape[-1]}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes -> [..., K] codes."""
    p = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    return torch.stack([p & 0x0F, p >> 4], dim=-1).flatten(-2)


def global_scale_for(amax: torch.Tensor | float) -> torch.Tensor:
    """The quantisation global scale ``448 * 6 / amax`` (float32); its inverse is input_scale/weight_scale_2."""
    a = torch.as_tensor(amax, dtype=torch.float32)
    return (E4M3_MAX * FP4_MAX) / a


def nvfp4_bytes(n_elems: int) -> int:
    """Storage of n NVFP4 elements: 0.5 B packed + one e4m3 scale byte per 16 = 0.5625 B/elem (unpadded)."""
    return n_elems // 2 + n_elems // NVFP4_BLOCK


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """float -> float8_e4m3fn with saturation to 448 (``__NV_SATFINITE``), round to nearest even."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    if x.shape[-1] % block:
        raise ValueError(f"last dimension {x.shape[-1]} is not a multiple of {block}")
    return x.float().reshape(*x.shape[:-1], x.shape[-1] // block, block)


def quantize_nvfp4(x: torch.Tensor, global_scale: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (packed uint8 [..., K/2], block scales float8_e4m3fn [..., K/16], linear layout).

    ``global_scale`` = 448*6/amax (flashinfer's ``global_scale``; SGLang's ``input_scale_inv``). The
    arithmetic follows the CUDA kernel's order so that results match it bit for bit away from ties.
    """
    gs = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device)
    xb = _blocks(x, NVFP4_BLOCK)
    amax = xb.abs().amax(dim=-1)
    inv6 = torch.tensor(1.0 / FP4_MAX, dtype=torch.float32)
    sf = to_e4m3(gs * (amax * inv6))
    sf_f = sf.float()
    denom = sf_f * (1.0 / gs)
    out_scale = torch.where(denom > 0, 1.0 / torch.where(denom > 0, denom, 1.0), torch.zeros_like(denom))
    codes = encode_e2m1(xb * out_scale.unsqueeze(-1))
    return pack_e2m1(codes.flatten(-2)), sf


def dequantize_nvfp4(
    packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor | float = 1.0
) -> torch.Tensor:
    """(packed [..., K/2], linear e4m3 scales [..., K/16]) -> float32 [..., K] = e2m1 * scale / global_scale.

    Pass ``global_scale=1`` to get the operand a W4A4 GEMM multiplies before ``alpha``; for weights pass
    ``1 / weight_scale_2``.
    """
    vals = decode_packed_e2m1(packed)
    sf = scales.view(torch.float8_e4m3fn).float() if scales.dtype == torch.uint8 else scales.float()
    blocks = vals.reshape(*vals.shape[:-1], sf.shape[-1], NVFP4_BLOCK) * sf.unsqueeze(-1)
    gs = torch.as_tensor(global_scale, dtype=torch.float32, device=packed.device)
    return blocks.flatten(-2) / gs


@functools.lru_cache(maxsize=16)
def _e4m3_byte_values(device: torch.device) -> torch.Tensor:
    """float32 [256]: the value of every float8_e4m3fn byte (NaN bytes included), built once per device."""
    return torch.arange(256, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn).float()


def dequantize_nvfp4_weights(
    packed: torch.Tensor, scales: torch.Tensor, global_scales: torch.Tensor | float = 1.0
) -> torch.Tensor:
    """dequantize_nvfp4 of W weights at once, each [N, K] with its own global scale, bit for bit:
    packed [*W, N, K/2], scales [*W, N, K/16], global_scales [*W] (W: no dims, or one) -> float32 [*W, N, K].

    Every (scale byte, packed byte) pair's two values are tabulated per weight with dequantize_nvfp4's own
    ops (e2m1 * scale, then / global scale): a weight then costs one int32 index pass and one 8-byte
    gather instead of an int64 index, a lookup, a scale multiply and a division over the fp32 result (an NVFP4
    MoE reference decodes every routed expert's weights and spent most of its time there).
    """
    p = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    sf = scales.view(torch.uint8) if scales.dtype != torch.uint8 else scales
    lead = p.shape[:-2]
    gs = torch.as_tensor(global_scales, dtype=torch.float32, device=p.device)
    if len(lead) > 1 or tuple(gs.shape) != tuple(lead):
        raise ValueError(f"global scales {tuple(gs.shape)} do not match weights {tuple(p.shape)}")
    table = _e2m1_byte_table(p.device).unsqueeze(0) * _e4m3_byte_values(p.device)[:, None, None]
    table = table / gs.reshape(-1, 1, 1, 1)  # [W or 1, scale byte, packed byte, (low, high)]
    blocks = p.reshape(*p.shape[:-1], sf.shape[-1], NVFP4_BLOCK // 2)  # packed bytes per block scale
    base = sf.to(torch.int32) * 256  # table row of a block: (weight, scale byte), then its packed bytes
    if lead:
        base += (torch.arange(lead[0], dtype=torch.int32, device=p.device) * (256 * 256)).reshape(-1, 1, 1)
    idx = blocks.to(torch.int32).add_(base.unsqueeze(-1))
    pairs = table.reshape(-1, 2).view(torch.int64).reshape(-1)  # a byte's two values as one 8-byte word
    vals = pairs.index_select(0, idx.reshape(-1)).view(torch.float32)
    return vals.reshape(*p.shape[:-1], p.shape[-1] * 2)


# -- MXFP4 (UE8M0 scales, 32 per block) ---------------------------------------------------------------


def quantize_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (packed uint8 [..., K/2], UE8M0 scale bytes uint8 [..., K/32], linear layout).

    As ``fp4_quantize(..., sf_vec_size=32, sf_use_ue8m0=True)``: ``v = amax * (1/6)`` rounded *up* to a
    power of two (``cudaRoundPosInf``), byte = exponent + 127; the global scale is not used on this path.
    """
    xb = _blocks(x, MXFP4_BLOCK)
    v = xb.abs().amax(dim=-1) * torch.tensor(1.0 / FP4_MAX, dtype=torch.float32)
    mant, exp = torch.frexp(v)  # v = mant * 2**exp, mant in [0.5, 1)
    e = torch.where(mant == 0.5, exp - 1, exp)  # exact powers of two stay
    byte = torch.where(v > 0, (e + 127).clamp(0, 254), torch.zeros_like(e)).to(torch.uint8)
    out_scale = torch.where(v > 0, torch.exp2(127.0 - byte.float()), torch.zeros_like(v))
    codes = encode_e2m1(xb * out_scale.unsqueeze(-1))
    return pack_e2m1(codes.flatten(-2)), byte


def dequantize_mxfp4(packed: torch.Tensor, scale_bytes: torch.Tensor) -> torch.Tensor:
    vals = decode_packed_e2m1(packed)
    sf = torch.exp2(scale_bytes.float() - 127.0)
    return (vals.reshape(*vals.shape[:-1], sf.shape[-1], MXFP4_BLOCK) * sf.unsqueeze(-1)).flatten(-2)


# -- the 128x4 swizzled scale layout ------------------------------------------------------------------


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def swizzled_shape(rows: int, cols: int) -> tuple[int, int]:
    return round_up(rows, SWIZZLE_ROWS), round_up(cols, SWIZZLE_COLS)


def swizzled_offset(row: int, col: int, cols: int) -> int:
    """Flat position of scale (row, col) in the 128x4 layout of a [rows, cols] scale matrix."""
    tiles_k = -(-cols // SWIZZLE_COLS)
    return ((row // 128) * tiles_k + col // 4) * 512 + (row % 32) * 16 + ((row % 128) // 32) * 4 + col % 4


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.uint8 and t.element_size() == 1 else t


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """[..., rows, cols] linear -> [..., Rp, Cp] whose bytes are in 128x4 order (zero padded), same dtype.

    The 2-D shape is SGLang's ``weight_scale_interleaved`` / flashinfer's ``fp4_quantize`` view; ``.flatten()``
    gives ``block_scale_interleave``'s 1-D buffer (per leading index, concatenated).
    """
    dtype = scales.dtype
    s = _as_bytes(scales)
    lead, (rows, cols) = s.shape[:-2], s.shape[-2:]
    rp, cp = swizzled_shape(rows, cols)
    s3 = s.reshape(-1, rows, cols)
    padded = torch.zeros((s3.shape[0], rp, cp), dtype=s.dtype, device=s.device)
    padded[:, :rows, :cols] = s3
    out = padded.reshape(-1, rp // 128, 4, 32, cp // 4, 4).permute(0, 1, 4, 3, 2, 5).contiguous()
    out = out.reshape(*lead, rp, cp)
    return out.view(dtype) if dtype != out.dtype else out


def unswizzle_scales(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of swizzle_scales: a [..., Rp, Cp] (or flat [..., Rp*Cp]) swizzled buffer -> [..., rows, cols]."""
    dtype = swizzled.dtype
    s = _as_bytes(swizzled)
    rp, cp = swizzled_shape(rows, cols)
    n = s.numel() // (rp * cp)
    if n * rp * cp != s.numel():
        raise ValueError(f"{tuple(s.shape)} is not a whole number of swizzled [{rp}, {cp}] blocks")
    t = s.reshape(n, rp // 128, cp // 4, 32, 4, 4).permute(0, 1, 4, 3, 2, 5).reshape(n, rp, cp)
    if s.dim() >= 2 and tuple(s.shape[-2:]) == (rp, cp):
        lead = tuple(s.shape[:-2])
    elif s.dim() >= 2:
        lead = tuple(s.shape[:-1])
    else:
        lead = () if n == 1 else (n,)
    out = t[:, :rows, :cols].reshape(*lead, rows, cols).contiguous()
    return out.view(dtype) if dtype != out.dtype else out


# -- references ---------------------------------------------------------------------------------------


def fp4_gemm_reference(
    a_packed: torch.Tensor,
    a_scales: torch.Tensor,
    b_packed: torch.Tensor,
    b_scales: torch.Tensor,
    alpha: torch.Tensor | float,
) -> torch.Tensor:
    """W4A4 GEMM oracle: ``(deq(a) @ deq(b).T) * alpha`` in float32; a [M, K/2], b [N, K/2], linear scales."""
    a = dequantize_nvfp4(a_packed, a_scales)
    b = dequantize_nvfp4(b_packed, b_scales)
    with exact_fp32_matmul():
        out = a @ b.T
    return out * torch.as_tensor(alpha, dtype=torch.float32, device=out.device)


def silu_and_mul(h: torch.Tensor) -> torch.Tensor:
    """SwiGLU on [..., 2I] with the gate in the first half (SGLang / Marlin / trtllm order)."""
    gate, up = h.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def moe_reference(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    w2: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    act_global_scales: tuple[torch.Tensor | float, torch.Tensor | float] | None = None,
    routed_scaling_factor: float = 1.0,
) -> torch.Tensor:
    """Routed-expert oracle: ``out[t] = rsf * sum_k w[t,k] * down_e(silu(gate_e x) * up_e x)``, float32.

    w13 = (packed [E, 2I, H/2], e4m3 scales [E, 2I, H/16], weight_scale_2 [E]) with gate rows first;
    w2 = (packed [E, H, I/2], scales [E, H, I/16], weight_scale_2 [E]). ``act_global_scales`` =
    (gs1, gs2) gives W4A4 numerics: x and the SwiGLU output are NVFP4-quantised with those global scales
    before each GEMM (what the sm100 kernels do); None gives W4A16 (Marlin: activations stay high precision).
    Only experts that some token selects are dequantised.
    """
    return moe_references(x, topk_ids, topk_weights, w13, w2, [act_global_scales], routed_scaling_factor)[0]


def moe_references(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    w2: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    numerics: Sequence[tuple[torch.Tensor | float, torch.Tensor | float] | None],
    routed_scaling_factor: float = 1.0,
) -> list[torch.Tensor]:
    """moe_reference for several activation numerics (one ``act_global_scales`` each) in one pass over
    the experts: each routed expert's weights are dequantised once for all of them. The (token, slot) rows
    are sorted by expert once (one host sync); experts and their rows are visited in ascending order, as
    one nonzero per expert would give them. The routed experts' weights are decoded MOE_DEQUANT_CHUNK
    experts at a time (one gather from packed storage and one table decode per chunk, not a launch
    sequence per expert); each expert's GEMMs stay its own, so the result does not change."""
    k = topk_ids.shape[-1]
    flat = topk_ids.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices
    offsets = [0, *torch.cumsum(torch.bincount(flat), 0).tolist()]
    tok_sorted = order // k
    w_sorted = topk_weights.reshape(-1).float()[order]
    inv_ws2 = (1.0 / w13[2].float(), 1.0 / w2[2].float())
    xs = [x.float() if gs is None else dequantize_nvfp4(*quantize_nvfp4(x, gs[0]), gs[0]) for gs in numerics]
    outs = [torch.zeros(xf.shape, dtype=torch.float32, device=x.device) for xf in xs]
    used = [e for e in range(len(offsets) - 1) if offsets[e + 1] > offsets[e]]
    for c0 in range(0, len(used), MOE_DEQUANT_CHUNK):
        chunk = used[c0 : c0 + MOE_DEQUANT_CHUNK]
        sel = torch.tensor(chunk, dtype=torch.long, device=w13[0].device)
        w1s = dequantize_nvfp4_weights(w13[0][sel], w13[1][sel], inv_ws2[0][sel])
        w2s = dequantize_nvfp4_weights(w2[0][sel], w2[1][sel], inv_ws2[1][sel])
        for j, e in enumerate(chunk):
            lo, hi = offsets[e], offsets[e + 1]
            tok, w = tok_sorted[lo:hi], w_sorted[lo:hi].unsqueeze(1)
            for xf, gs, out in zip(xs, numerics, outs, strict=True):
                with exact_fp32_matmul():
                    act = silu_and_mul(xf[tok] @ w1s[j].T)
                    if gs is not None:
                        act = dequantize_nvfp4(*quantize_nvfp4(act, gs[1]), gs[1])
                    y = act @ w2s[j].T
                out.index_add_(0, tok, y * w)
        del w1s, w2s
    return [out * routed_scaling_factor for out in outs]
