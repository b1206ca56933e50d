"""MLA concatenations: `concat_mla_k` (MHA K = [k_nope | k_rope broadcast over heads], prefill) and
`concat_mla_absorb_q` (q = [q_nope_absorbed | q_pe], MLA decode)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import generator, randn
from dskbench.shapes.cases import Case


def _needs_128_heads(case: Case) -> str | None:
    if int(case.dims["Nh"]) != 128:
        return (
            "this concat_mla_k needs 128 local heads (attention TP 1); SGLang uses the Triton one otherwise"
        )
    return None


def _bind_concat_k(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    k_nope, k_rope = inputs["k_nope"], inputs["k_rope"]
    t, nh, dn = k_nope.shape
    k = torch.empty(t, nh, dn + k_rope.shape[-1], dtype=k_nope.dtype, device=k_nope.device)

    def launch() -> torch.Tensor:
        fn(k, k_nope, k_rope)
        return k

    return launch


@register
class ConcatMlaK(Adapter):
    kernel = "concat_mla_k"
    role = "concat_k"
    ops = ("_concat_and_cast_mha_k",)
    description = "Build MHA K = [k_nope | k_rope broadcast over heads] for DeepSeek prefill (128 heads)"
    backends = [
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.concat_mla:concat_mla_k",
            None,
            "jit",
            _bind_concat_k,
            label="what SGLang 0.5.16 calls on CUDA (128 local heads)",
            skip=_needs_128_heads,
        ),
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.concat_mla_k.default",
            None,
            "aot",
            _bind_concat_k,
            preload=("sgl_kernel",),
            skip=_needs_128_heads,
        ),
        Backend(
            "flashinfer",
            "flashinfer.concat_ops:concat_mla_k",
            None,
            "jit",
            _bind_concat_k,
            skip=_needs_128_heads,
        ),
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.kvcache.cache_ops:concat_and_cast_mha_k_triton",
            None,
            "triton",
            _bind_concat_k,
            label="SGLang's generic path (used when local heads != 128)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        """k_nope and k_rope are the strided views SGLang passes (kv_b_proj output, fused qkv_a output)."""
        d = case.dims
        cfg = case.model
        t, nh, dn, dr = int(d["T"]), int(d["Nh"]), int(d["Dn"]), int(d["Dr"])
        gen = generator(seed)
        kv = randn((t, nh, dn + int(cfg["Dv"])), gen, device)  # [T, Nh, 256] = [k_nope | v]
        qkv_a = randn((t, int(cfg["Lq"]) + int(cfg["Lkv"]) + dr), gen, device)  # [T, 2112]
        rope_at = int(cfg["Lq"]) + int(cfg["Lkv"])
        return {"k_nope": kv[..., :dn], "k_rope": qkv_a[:, rope_at:].unsqueeze(1)}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        k_nope, k_rope = inputs["k_nope"], inputs["k_rope"]
        return torch.cat([k_nope.float(), k_rope.float().expand(-1, k_nope.shape[1], -1)], dim=-1)

    def traffic(self, case: Case) -> Traffic:
        d = case.dims
        t, nh, dn, dr = int(d["T"]), int(d["Nh"]), int(d["Dn"]), int(d["Dr"])
        return Traffic(t * (nh * dn + dr + nh * (dn + dr)) * 2, 0)


def _bind_absorb_q_new(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    a, b = inputs["a"], inputs["b"]
    return lambda: fn(a, b)


def _bind_absorb_q_into(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    a, b = inputs["a"], inputs["b"]
    out = torch.empty(*a.shape[:-1], a.shape[-1] + b.shape[-1], dtype=a.dtype, device=a.device)

    def launch() -> torch.Tensor:
        fn(a, b, out)
        return out

    return launch


@register
class ConcatMlaAbsorbQ(Adapter):
    kernel = "concat_mla_absorb_q"
    role = "concat_q"
    ops = ("_merge_q",)
    description = "q = [q_nope_absorbed (512) | q_pe (64)] for the TRT-LLM / FlashInfer MLA decode"
    backends = [
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.concat_mla:concat_mla_absorb_q",
            None,
            "jit",
            _bind_absorb_q_new,
            label="what SGLang 0.5.16 calls (concat_mla_absorb_q_general); allocates the output",
        ),
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.concat_mla_absorb_q.default",
            None,
            "aot",
            _bind_absorb_q_into,
            preload=("sgl_kernel",),
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        d = case.dims
        t, nh = int(d["T"]), int(d["Nh"])
        gen = generator(seed)
        return {
            "a": randn((t, nh, int(d["Lkv"])), gen, device),
            "b": randn((t, nh, int(d["Dr"])), gen, device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return torch.cat([inputs["a"].float(), inputs["b"].float()], dim=-1)

    def traffic(self, case: Case) -> Traffic:
        d = case.dims
        t, nh, w = int(d["T"]), int(d["Nh"]), int(d["Lkv"]) + int(d["Dr"])
        return Traffic(2 * t * nh * w * 2, 0)
