"""`mla_rope_quantize_fp8`: MLA rope on q_pe / k_pe fused with the FP8 quantisation of
all four q/k parts.

SGLang calls it only from the trtllm_mla backend with an FP8 KV cache (sm100); on sm90 it is not on
SGLang's path, but the kernel runs there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import FP8, enable_pdl, generator, nbytes, randn
from dskbench.adapters.rope.rotation import (
    DTYPE,
    cos_sin_cache,
    q_and_k_pe,
    random_positions,
    rope_dims,
    rope_gptj,
)
from dskbench.shapes.cases import Case


def _bind_mla_flashinfer(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    q_nope, q_pe, k_nope, k_pe = inputs["q_nope"], inputs["q_pe"], inputs["k_nope"], inputs["k_pe"]
    lkv = q_nope.shape[-1]
    # SGLang writes both q parts into one merged [T, Nh, Lkv + Dr] FP8 buffer.
    q_out = torch.empty((*q_nope.shape[:-1], lkv + q_pe.shape[-1]), dtype=FP8, device=q_nope.device)
    k_nope_out = torch.empty(k_nope.shape, dtype=FP8, device=k_nope.device)
    k_pe_out = torch.empty(k_pe.shape, dtype=FP8, device=k_pe.device)
    cache, pos, pdl = inputs["cos_sin_cache"], inputs["positions"], enable_pdl(q_pe)

    def launch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        fn(
            q_pe,
            k_pe,
            q_nope,
            k_nope,
            cache,
            pos,
            is_neox=False,
            quantize_dtype=FP8,
            quant_scale_q=1.0,
            quant_scale_kv=1.0,
            q_rope_out=q_out[..., lkv:],
            k_rope_out=k_pe_out,
            q_nope_out=q_out[..., :lkv],
            k_nope_out=k_nope_out,
            enable_pdl=pdl,
        )
        return q_out, k_nope_out, k_pe_out

    return launch


def _bind_mla_sglang(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # mla_quantize_and_rope_for_fp8(q_nope, q_rope, k_nope, k_rope, pos_ids, cache, is_neox,
    #   kv_lora_rank, qk_rope_head_dim) -> (merged q, k_nope, k_rope); allocates its outputs per call.
    q_nope, q_pe, k_nope, k_pe = inputs["q_nope"], inputs["q_pe"], inputs["k_nope"], inputs["k_pe"]
    cache, pos = inputs["cos_sin_cache"], inputs["positions"]
    lkv, dr = q_nope.shape[-1], q_pe.shape[-1]
    return lambda: fn(q_nope, q_pe, k_nope, k_pe, pos, cache, False, lkv, dr)


@register
class MlaRopeQuantizeFp8Adapter(Adapter):
    kernel = "mla_rope_quantize_fp8"
    role = "rope"
    ops = ("rotary_emb",)
    description = "MLA rope on q_pe/k_pe + FP8 quantisation of all four q/k parts (trtllm_mla FP8 KV)"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.rope:mla_rope_quantize_fp8",
            None,
            "jit",
            _bind_mla_flashinfer,
            note="outputs written into one merged q buffer, as SGLang does",
        ),
        Backend(
            "sglang.wrapper",
            "sglang.kernels.ops.attention.utils:mla_quantize_and_rope_for_fp8",
            None,
            "jit",
            _bind_mla_sglang,
            dispatches_to="flashinfer.rope.mla_rope_quantize_fp8",
            note="SGLang's call site (trtllm_mla, sm100 only in SGLang); allocates outputs per call",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, nh, dr, _ = rope_dims(case)
        lkv = int(case.dims["Lkv"])
        gen = generator(seed)
        q_pe, k_pe3 = q_and_k_pe(case, gen, device)
        # q_nope is the absorbed bmm output: [Nh, T, Lkv] transposed to [T, Nh, Lkv] (not contiguous).
        q_nope = randn((nh, t, lkv), gen, device, DTYPE).transpose(0, 1)
        return {
            "q_nope": q_nope,
            "q_pe": q_pe,
            "k_nope": randn((t, lkv), gen, device, DTYPE),  # kv_a_layernorm output, contiguous
            "k_pe": k_pe3.squeeze(1),  # [T, Dr] view, row stride 2112
            "cos_sin_cache": cos_sin_cache(int(case.dims["max_position"]), dr, device),
            "positions": random_positions(case, gen, device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, ...]:
        cache, pos = inputs["cos_sin_cache"], inputs["positions"]
        q_rot = rope_gptj(inputs["q_pe"], cache, pos)
        k_rot = rope_gptj(inputs["k_pe"].unsqueeze(1), cache, pos).squeeze(1)
        # quant scales are 1.0: the exact fp32 values are the oracle for the FP8 outputs.
        return torch.cat((inputs["q_nope"].float(), q_rot), dim=-1), inputs["k_nope"].float(), k_rot

    def traffic(self, case: Case) -> Traffic:
        t, nh, dr, _ = rope_dims(case)
        lkv = int(case.dims["Lkv"])
        elems = t * (nh + 1) * (lkv + dr)
        return Traffic(
            bytes=nbytes(elems, DTYPE) + nbytes(elems, FP8) + nbytes(t * dr, torch.float32),
            flops=3 * t * (nh + 1) * dr + elems,
            note="bf16 in, e4m3 out, fp32 cache row; FLOPs: rope + one scale per element",
        )
