"""`_quantize_k_cache_fast_kernel`: DeepSeek-V3.2's FP8 sparse-attention KV cache, quantised on the way in.

With its FP8 KV cache (`dsa_kv_cache_store_fp8`), SGLang 0.5.16's `MLATokenToKVPool._write_mla_kv_buffer`
calls `quantize_k_cache_separate(k_nope, k_rope)` (sglang/kernels/ops/attention/dsa/quant_k_cache.py)
for every layer's new tokens, then writes the two byte rows with set_mla_kv_buffer_triton. The Triton
kernel `_quantize_k_cache_fast_kernel` does, per token: the 512-dim latent in 4 tiles of 128, scale =
amax / 448 (fp32, no floor), q = clamp(x * (1 / scale), +-448) in float8_e4m3fn -> 528 bytes
[q (512) | 4 fp32 scales]; the 64-dim rope key copied as bf16 -> 128 bytes. The check: scales and rope
bytes exactly, the dequantised latent within one e4m3 rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic, rel_error
from dskbench.adapters.common.inputs import generator, nbytes, randn
from dskbench.shapes.cases import Case

DTYPE = torch.bfloat16
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
DEQUANT_TOL = 1e-3  # same scales: a value may round to the other e4m3 neighbour at a tie


def _dims(case: Case) -> tuple[int, int, int, int]:
    d = case.dims
    return int(d["T"]), int(d["Lkv"]), int(d["Dr"]), int(d["tile"])


def _bind_separate(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # quantize_k_cache_separate(k_nope, k_rope, tile_size=128) -> (nope u8 [T, 1, 528], rope u8 [T, 1, 128])
    nope, rope, tile = inputs["k_nope"], inputs["k_rope"], _dims(case)[3]
    return lambda: fn(nope, rope, tile)


def quant_k_cache_reference(
    k_nope: torch.Tensor, k_rope: torch.Tensor, tile: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two byte rows per token: [fp8 latent | fp32 tile scales] and [bf16 rope], as uint8 [T, 1, n]."""
    t, lkv = k_nope.shape[0], k_nope.shape[-1]
    x = k_nope.reshape(t, lkv // tile, tile).float()
    scale = x.abs().amax(dim=-1) / FP8_MAX  # fp32 [T, tiles]
    q = (x * (1.0 / scale).unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8).reshape(t, lkv)
    nope = torch.cat([q.view(torch.uint8), scale.contiguous().view(torch.uint8)], dim=-1)
    rope = k_rope.reshape(t, -1).to(DTYPE).contiguous().view(torch.uint8)
    return nope.unsqueeze(1), rope.unsqueeze(1)


def unpack(nope_u8: torch.Tensor, lkv: int, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 latent [T, lkv], fp32 scales [T, lkv / tile]) of a packed nope row."""
    rows = nope_u8.reshape(nope_u8.shape[0], -1)
    return rows[:, :lkv].contiguous().view(FP8), rows[:, lkv:].contiguous().view(torch.float32)


@register
class QuantKCacheAdapter(Adapter):
    kernel = "_quantize_k_cache_fast_kernel"
    role = "kv_quant"
    ops = ("dsa_kv_cache_store",)
    description = "V3.2 FP8 KV-cache store: latent to FP8 in tiles of 128 with fp32 scales, rope kept bf16"
    backends = [
        Backend(
            "triton",
            "sglang.kernels.ops.attention.dsa.quant_k_cache:quantize_k_cache_separate",
            "sglang",
            "triton",
            _bind_separate,
            note="DeepSeek-V3.2 only: quantize_k_cache_separate, one launch of _quantize_k_cache_fast_kernel",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, lkv, dr, _ = _dims(case)
        gen = generator(seed)
        return {
            "k_nope": randn((t, 1, lkv), gen, device, DTYPE),
            "k_rope": randn((t, 1, dr), gen, device, DTYPE),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        return quant_k_cache_reference(inputs["k_nope"], inputs["k_rope"], _dims(case)[3])

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        (nope, rope), (rnope, rrope) = out, ref
        if tuple(nope.shape) != tuple(rnope.shape) or tuple(rope.shape) != tuple(rrope.shape):
            return Check(False, float("inf"), 0.0, f"shapes {tuple(nope.shape)}, {tuple(rope.shape)}")
        _, lkv, _, tile = _dims(case)
        q, s = unpack(nope, lkv, tile)
        rq, rs = unpack(rnope.to(nope.device), lkv, tile)
        s_bad = int((s != rs).sum())
        rope_bad = int((rope != rrope.to(rope.device)).sum())
        deq = (q.float().unflatten(-1, (-1, tile)) * s.unsqueeze(-1)).flatten(-2)
        rdeq = (rq.float().unflatten(-1, (-1, tile)) * rs.unsqueeze(-1)).flatten(-2)
        err = rel_error(deq, rdeq)
        ok = s_bad == 0 and rope_bad == 0 and err <= DEQUANT_TOL
        return Check(
            ok, err, DEQUANT_TOL, f"scales:{s_bad} rope:{rope_bad} differ dequant:{err:.2e}/{DEQUANT_TOL:.0e}"
        )

    def traffic(self, case: Case) -> Traffic:
        t, lkv, dr, tile = _dims(case)
        return Traffic(
            bytes=nbytes(t * (lkv + dr), DTYPE) + t * (lkv + 4 * (lkv // tile) + 2 * dr),
            flops=2 * t * lkv,
            note="read the bf16 latent and rope; write fp8 latent, fp32 tile scales and the bf16 rope bytes",
        )
