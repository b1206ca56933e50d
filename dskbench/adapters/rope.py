"""RoPE adapters: `apply_rope_with_cos_sin_cache_inplace` (catalogue 7.1), `rotary_embedding` (7.2) and
`mla_rope_quantize_fp8` (1.12).

What SGLang 0.5.16 runs for DeepSeek-R1-NVFP4 on sm90: `RotaryEmbedding.forward_cuda`
(`srt/layers/rotary_embedding/base.py`, inherited by `DeepseekScalingRotaryEmbedding`) calls
`sglang.jit_kernel.rope.apply_rope_with_cos_sin_cache_inplace(q, k, cos_sin_cache, positions,
is_neox=False)` on q_pe [T, Nh, 64] and k_pe [T, 1, 64] (backend "sglang_jit", labelled). The kernel
moved there from sgl_kernel (gone in 0.4.5) with a new argument order; flashinfer keeps the old
(positions, query, key, head_size, cache, is_neox) order.
`rotary_embedding` is SGLang's fallback for head sizes outside {64, 128, 256, 512}: never taken by
DeepSeek (rope head 64); measured at the same shapes. `mla_rope_quantize_fp8` (flashinfer) is called
by SGLang only from the trtllm_mla backend with an FP8 KV cache (sm100); on sm90 it is not on SGLang's
path, but the kernel runs there.

Inputs follow `forward_absorb_prepare`: q_pe is the rope part of q [T, Nh, 192] (row stride Nh*192,
head stride 192), k_pe the last 64 columns of the fused_qkv_a output [T, 2112]. The cache is a standard
base-10000 cos|sin table of DeepSeek's shape [163840, 64] fp32 (YaRN changes the values, not the
work); positions are random in range, int64 as in ForwardBatch.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import (
    FP8,
    SGLANG_SM90,
    enable_pdl,
    generator,
    model_config,
    nbytes,
    randn,
)
from dskbench.shapes.cases import Case

DTYPE = torch.bfloat16
ROPE_BASE = 10000.0


@lru_cache(maxsize=2)
def _cpu_cos_sin_cache(max_position: int, rope_dim: int) -> torch.Tensor:
    """[max_position, rope_dim] fp32: cos in the first half, sin in the second (SGLang's layout)."""
    inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim)
    freqs = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).float()


def cos_sin_cache(
    max_position: int, rope_dim: int, device: str, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    return _cpu_cos_sin_cache(max_position, rope_dim).to(dtype).to(device)


def rope_gptj(x: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Interleaved (is_neox=False) rotation in fp32: pairs (x[2i], x[2i+1]) rotated by angle i.

    x [..., N, H, R] with the token axis first; cache [max_pos, R]; positions [N].
    """
    cos, sin = cache.float()[positions.long()].chunk(2, dim=-1)  # [N, R/2] each
    cos, sin = cos[:, None, :], sin[:, None, :]
    x = x.float()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x2 * cos + x1 * sin
    return out


def _rope_dims(case: Case) -> tuple[int, int, int, int]:
    d = case.dims
    return int(d["T"]), int(d["Nh"]), int(d["Dr"]), int(d["Dn"])


def _q_and_k_pe(case: Case, gen: torch.Generator, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """q_pe / k_pe as the strided views SGLang passes (views into q [T,Nh,Dn+Dr] and qkv_a [T,2112])."""
    t, nh, dr, dn = _rope_dims(case)
    cfg = model_config()
    row = int(cfg["Lq"]) + int(case.dims.get("Lkv", cfg["Lkv"])) + dr
    q = randn((t, nh, dn + dr), gen, device, DTYPE)
    qkv = randn((t, row), gen, device, DTYPE)
    return q[..., dn:], qkv[:, row - dr :].unsqueeze(1)


def _positions(case: Case, gen: torch.Generator, device: str) -> torch.Tensor:
    t, maxp = int(case.dims["T"]), int(case.dims["max_position"])
    return torch.randint(0, maxp, (t,), generator=gen, dtype=torch.int64).to(device)


def _rope_traffic(case: Case) -> Traffic:
    # Catalogue 7.1: q_pe and k_pe read and written once (bf16) plus one fp32 cache row per token.
    t, nh, dr, _ = _rope_dims(case)
    return Traffic(
        bytes=nbytes(2 * t * (nh + 1) * dr, DTYPE) + nbytes(t * dr, torch.float32),
        flops=3 * t * (nh + 1) * dr,
        note="positions (8 B/token) not counted, as in the catalogue",
    )


# -- apply_rope_with_cos_sin_cache_inplace ----------------------------------------------------------


def _bind_rope_jit(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    q, k, cache, pos = inputs["q_pe"], inputs["k_pe"], inputs["cos_sin_cache"], inputs["positions"]
    if getattr(fn, "__module__", "").startswith("sgl_kernel"):
        # Old home (sgl-kernel <= 0.3.x): (positions, query, key, head_size, cache, is_neox, ...).
        head = q.shape[-1]

        def launch_old() -> tuple[torch.Tensor, torch.Tensor]:
            fn(pos, q, k, head, cache, False)
            return q, k

        return launch_old

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn(q, k, cache, pos, is_neox=False)
        return q, k

    return launch


def _bind_rope_flashinfer(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    q, k, cache, pos = inputs["q_pe"], inputs["k_pe"], inputs["cos_sin_cache"], inputs["positions"]
    head = q.shape[-1]

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn(pos, q, k, head, cache, False)
        return q, k

    return launch


class _InplaceRope(Adapter):
    """In place on the q_pe / k_pe views; the launcher returns (q_pe, k_pe). Rotations keep norms, so
    repeated launches stay finite; the runner checks the first one."""

    role = "rope"
    ops = ("rotary_emb",)
    cache_dtype = torch.float32

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        gen = generator(seed)
        q_pe, k_pe = _q_and_k_pe(case, gen, device)
        dr = int(case.dims["Dr"])
        return {
            "q_pe": q_pe,
            "k_pe": k_pe,
            "cos_sin_cache": cos_sin_cache(int(case.dims["max_position"]), dr, device, self.cache_dtype),
            "positions": _positions(case, gen, device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        cache, pos = inputs["cos_sin_cache"], inputs["positions"]
        return rope_gptj(inputs["q_pe"], cache, pos), rope_gptj(inputs["k_pe"], cache, pos)

    def traffic(self, case: Case) -> Traffic:
        return _rope_traffic(case)


@register
class ApplyRopeAdapter(_InplaceRope):
    kernel = "apply_rope_with_cos_sin_cache_inplace"
    description = "DeepSeek rope (interleaved, dim 64) on q_pe/k_pe in place, fp32 cos|sin cache"
    backends = [
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.rope:apply_rope_with_cos_sin_cache_inplace",
            None,
            "jit",
            _bind_rope_jit,
            fallbacks=("sgl_kernel.elementwise:apply_rope_with_cos_sin_cache_inplace",),
            label=SGLANG_SM90,
        ),
        Backend(
            "flashinfer",
            "flashinfer.rope:apply_rope_with_cos_sin_cache_inplace",
            None,
            "jit",
            _bind_rope_flashinfer,
        ),
    ]


# -- rotary_embedding (vLLM-style fallback) ----------------------------------------------------------


def _bind_rotary(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # (positions, query, key, head_size, cos_sin_cache, is_neox); cache in the query dtype.
    q, k, cache, pos = inputs["q_pe"], inputs["k_pe"], inputs["cos_sin_cache"], inputs["positions"]
    head = q.shape[-1]

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn(pos, q, k, head, cache, False)
        return q, k

    return launch


@register
class RotaryEmbeddingAdapter(_InplaceRope):
    kernel = "rotary_embedding"
    description = "vLLM-style rotary_embedding (SGLang's fallback; cos|sin cache in bf16)"
    cache_dtype = DTYPE  # SGLang casts the cache to the query dtype for the fallback kernel
    backends = [
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.rotary_embedding.default",
            None,
            "aot",
            _bind_rotary,
            preload=("sgl_kernel",),
        ),
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.rope:rotary_embedding",
            None,
            "jit",
            _bind_rotary,
            note="SGLang's CUDA fallback; DeepSeek (rope head 64) never takes it",
        ),
    ]

    def traffic(self, case: Case) -> Traffic:
        t, nh, dr, _ = _rope_dims(case)
        return Traffic(
            bytes=nbytes(2 * t * (nh + 1) * dr + t * dr, DTYPE),
            flops=3 * t * (nh + 1) * dr,
            note="bf16 cache row per token; positions not counted",
        )


# -- mla_rope_quantize_fp8 ---------------------------------------------------------------------------


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
        t, nh, dr, _ = _rope_dims(case)
        lkv = int(case.dims["Lkv"])
        gen = generator(seed)
        q_pe, k_pe3 = _q_and_k_pe(case, gen, device)
        # q_nope is the absorbed bmm output: [Nh, T, Lkv] transposed to [T, Nh, Lkv] (not contiguous).
        q_nope = randn((nh, t, lkv), gen, device, DTYPE).transpose(0, 1)
        return {
            "q_nope": q_nope,
            "q_pe": q_pe,
            "k_nope": randn((t, lkv), gen, device, DTYPE),  # kv_a_layernorm output, contiguous
            "k_pe": k_pe3.squeeze(1),  # [T, Dr] view, row stride 2112
            "cos_sin_cache": cos_sin_cache(int(case.dims["max_position"]), dr, device),
            "positions": _positions(case, gen, device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, ...]:
        cache, pos = inputs["cos_sin_cache"], inputs["positions"]
        q_rot = rope_gptj(inputs["q_pe"], cache, pos)
        k_rot = rope_gptj(inputs["k_pe"].unsqueeze(1), cache, pos).squeeze(1)
        # quant scales are 1.0: the exact fp32 values are the oracle for the FP8 outputs.
        return torch.cat((inputs["q_nope"].float(), q_rot), dim=-1), inputs["k_nope"].float(), k_rot

    def traffic(self, case: Case) -> Traffic:
        t, nh, dr, _ = _rope_dims(case)
        lkv = int(case.dims["Lkv"])
        elems = t * (nh + 1) * (lkv + dr)
        return Traffic(
            bytes=nbytes(elems, DTYPE) + nbytes(elems, FP8) + nbytes(t * dr, torch.float32),
            flops=3 * t * (nh + 1) * dr + elems,
            note="bf16 in, e4m3 out, fp32 cache row; FLOPs: rope + one scale per element",
        )
