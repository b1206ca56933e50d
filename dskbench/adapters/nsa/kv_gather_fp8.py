"""`_gather_dequant_requant_fp8_paged_kernel`: DeepSeek-V3.2's FP8 KV cache gathered for its FP8 sparse
prefill over a cached prefix, every layer of such a prefill.

With the FP8 KV cache and `--dsa-prefill-backend flashmla_sparse_q8` (SM90), SGLang 0.5.16's DSA backend
(`forward_extend`, ragged top-k) hands a prefill that extends a cached prefix to
`_forward_flashmla_sparse_q8kv8`, which calls `gather_dequant_requant_fp8_paged(kv_cache,
page_table_1_flattened, extra_rows=topk)` (sglang/kernels/ops/attention/dsa/dequant_k_cache.py).
`page_table_1_flattened` (int32) lists, request after request, the cache slot of each of its kv_len =
prefix + new tokens; the cache is fp8 [slots, 1, 656], a slot's 656 bytes being [512 FP8 latent | 4 fp32
scales, one per tile of 128 | 64 bf16 rope] (as `_quantize_k_cache_fast_kernel` writes them). The launcher
allocates a zeroed fp8 output [N + topk, 1, 576] (the topk zero rows are landing pads the attention
kernel reads for masked indices) and launches the kernel on a grid (N, 5): row i of the output takes slot
`page_table_1_flattened[i]`, its latent tiles dequantised (fp8 * fp32 scale) and requantised to FP8 with
scale 1, its rope cast from bf16 to FP8. The reference does the same in torch; the check takes every byte
equal or one e4m3 step off (a rounding either way), none NaN, and the pad rows zero.

Cases: the prefill's T new tokens over `reqs` requests, each after a cached prefix of `prefix` tokens
(N = reqs * prefix + T rows gathered); the cache's slots of a prefix and its new tokens scattered over a
pool of `pool` slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common.inputs import generator, nbytes, randn
from dskbench.adapters.nsa.quant_k_cache import quant_k_cache_reference
from dskbench.shapes.cases import Case

FP8 = torch.float8_e4m3fn
TILE = 128  # the per-tile scales' group size (gather_dequant_requant_fp8_paged's group_size)
SCALE_BYTES = 4  # fp32


def gather_dims(case: Case) -> tuple[int, int, int, int, int]:
    """(rows gathered N, latent dim, rope dim, pad rows = topk, cache slots)."""
    d = case.dims
    n = int(d["reqs"]) * int(d["prefix"]) + int(d["T"])
    return n, int(d["Lkv"]), int(d["Dr"]), int(d["topk"]), max(int(d["pool"]), 2 * n + 2)


def slot_bytes(lkv: int, dr: int) -> int:
    """Bytes of one cache slot: FP8 latent, fp32 tile scales, bf16 rope (656 for DeepSeek-V3.2)."""
    return lkv + SCALE_BYTES * (lkv // TILE) + 2 * dr


def gather_dequant_requant_reference(
    cache: torch.Tensor, slots: torch.Tensor, lkv: int, dr: int, pad_rows: int
) -> torch.Tensor:
    """fp8 [N + pad_rows, 1, lkv + dr]: each listed slot's latent dequantised with its tile scales and
    requantised to FP8 (scale 1), then its rope cast to FP8; the pad rows zero."""
    rows = cache.reshape(cache.shape[0], -1).view(torch.uint8)[slots.long()]
    n, tiles = rows.shape[0], lkv // TILE
    q = rows[:, :lkv].contiguous().view(FP8).float().view(n, tiles, TILE)
    scale = rows[:, lkv : lkv + SCALE_BYTES * tiles].contiguous().view(torch.float32)
    rope = rows[:, lkv + SCALE_BYTES * tiles :].contiguous().view(torch.bfloat16)
    out = torch.zeros((n + pad_rows, lkv + dr), dtype=FP8, device=cache.device)
    out[:n, :lkv] = (q * scale.unsqueeze(-1)).view(n, lkv).to(FP8)
    out[:n, lkv:] = rope.to(FP8)
    return out.unsqueeze(1)


def fp8_step_check(out: torch.Tensor, ref: torch.Tensor, rows: int) -> Check:
    """Every byte equal to the reference's or one e4m3 step from it (same sign), none NaN, and the rows
    past `rows` zero. `error`: the fraction of bytes one step off."""
    if tuple(out.shape) != tuple(ref.shape) or out.dtype != ref.dtype:
        return Check(False, float("inf"), 0.0, f"shape {tuple(out.shape)} {out.dtype}")
    o = out.detach().reshape(out.shape[0], -1).view(torch.uint8).to(torch.int16)
    r = ref.detach().to(out.device).reshape(ref.shape[0], -1).view(torch.uint8).to(torch.int16)
    same = (o == r) | (((o & 0x7F) == 0) & ((r & 0x7F) == 0))  # +0 and -0
    step = ~same & (((o ^ r) & 0x80) == 0) & ((o - r).abs() == 1)
    nan = (o & 0x7F) == 0x7F
    bad = int((~same & ~step).sum()) + int(nan.sum())
    pad = int((o[rows:] != 0).sum())
    stepped = int(step.sum())
    frac = stepped / max(1, o.numel())
    return Check(
        bad == 0 and pad == 0,
        frac,
        0.0,
        f"{bad} bytes differ (NaN or more than one e4m3 step), {stepped} one step off, pad rows: {pad} nonzero",
    )


def _bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # gather_dequant_requant_fp8_paged(quant_k_cache, page_table_1_flattened, group_size=128, extra_rows)
    cache, slots, pad = inputs["kv_cache"], inputs["page_table_1_flattened"], gather_dims(case)[3]
    return lambda: fn(cache, slots, TILE, pad)


@register
class GatherDequantRequantFp8Adapter(Adapter):
    kernel = "_gather_dequant_requant_fp8_paged_kernel"
    role = "kv_read"
    ops = ("nsa_backend.forward_extend",)
    description = (
        "V3.2 FP8 sparse prefill over a cached prefix: the KV rows of every request gathered from the paged "
        "FP8 cache, dequantised per tile and requantised to per-tensor FP8"
    )
    backends = [
        Backend(
            "triton",
            "sglang.kernels.ops.attention.dsa.dequant_k_cache:gather_dequant_requant_fp8_paged",
            "sglang",
            "triton",
            _bind,
            note="DeepSeek-V3.2 only (--dsa-prefill-backend flashmla_sparse_q8, SM90): "
            "gather_dequant_requant_fp8_paged, a zeroed output then one launch of the kernel",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        n, lkv, dr, _, pool = gather_dims(case)
        gen = generator(seed)
        # the rows as _quantize_k_cache_fast_kernel wrote them, in N distinct slots of the pool (slot 0 unused)
        slots = (torch.randperm(pool - 1, generator=gen)[:n] + 1).to(device)
        nope, rope = quant_k_cache_reference(
            randn((n, 1, lkv), gen, device, torch.bfloat16),
            randn((n, 1, dr), gen, device, torch.bfloat16),
            TILE,
        )
        cache = torch.zeros((pool, slot_bytes(lkv, dr)), dtype=torch.uint8, device=device)
        cache[slots] = torch.cat([nope, rope], dim=-1).view(n, -1)
        return {"kv_cache": cache.view(FP8).unsqueeze(1), "page_table_1_flattened": slots.to(torch.int32)}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        _, lkv, dr, pad, _ = gather_dims(case)
        return gather_dequant_requant_reference(
            inputs["kv_cache"], inputs["page_table_1_flattened"], lkv, dr, pad
        )

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return fp8_step_check(out, ref, gather_dims(case)[0])

    def traffic(self, case: Case) -> Traffic:
        n, lkv, dr, pad, _ = gather_dims(case)
        return Traffic(
            bytes=n * slot_bytes(lkv, dr) + nbytes(n, torch.int32) + (n + pad) * (lkv + dr),
            flops=n * lkv,
            note="read each listed slot's 656 bytes and its int32 index; write the fp8 rows [576] and the "
            "zero pad rows once (the launcher's zero fill writes them all a first time)",
        )
