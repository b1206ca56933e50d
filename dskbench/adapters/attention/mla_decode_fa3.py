"""sgl-kernel's FlashAttention-3 paged decode (`sgl_kernel.flash_attn.flash_attn_with_kvcache`), as SGLang's
fa3 backend (the default attention backend for DeepSeek on Hopper) runs the absorbed MLA decode: q_rope
against the k_rope cache, q_nope as `qv` against the c_kv cache, page size 1 (a token page table).

Like the varlen prefill, the backend preloads the `sgl_kernel.flash_ops` extension, so an install without
it resolves to "not available in this install".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.attention.mha_prefill_fa3 import FA3_EXTENSION
from dskbench.adapters.attention.mla import case_softmax_scale
from dskbench.adapters.attention.mla_decode import MlaDecode, token_slots
from dskbench.adapters.backends import SM90_ONLY, Backend
from dskbench.shapes.cases import Case


def page_size_one_table(inputs: dict[str, Any]) -> torch.Tensor:
    """[B, kv_len] int32 token rows of each request: the page table of page size 1 that fa3 reads."""
    pt, lens = inputs["page_table"], inputs["seq_lens"].tolist()
    width = max(lens)
    table = torch.zeros(len(lens), width, dtype=torch.int32, device=pt.device)
    for i, n in enumerate(lens):
        table[i, :n] = token_slots(pt[i], n).to(torch.int32)
    return table


def _bind_with_kvcache(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """forward_decode, absorbed MLA: k_cache/v_cache are [rows, 1, 1, 64] / [rows, 1, 1, 512] views of the
    one latent cache (page size 1), q_rope as q, q_nope as qv, one query token per request."""
    q, kv = inputs["q"], inputs["kv_cache"]
    b, nh, _ = q.shape
    lkv = int(case.dims["Lkv"])
    rows = kv.shape[0]
    kv4 = kv.view(rows, 1, 1, kv.shape[1])
    seq_lens = inputs["seq_lens"]
    cu_k = torch.zeros(b + 1, dtype=torch.int32, device=q.device)
    cu_k[1:] = torch.cumsum(seq_lens, 0)
    out = torch.empty(b, nh, lkv, dtype=q.dtype, device=q.device)
    kw = {
        "k_cache": kv4[..., lkv:],
        "v_cache": kv4[..., :lkv],
        "qv": q[..., :lkv],
        "page_table": page_size_one_table(inputs),
        "cache_seqlens": seq_lens,
        "cu_seqlens_q": torch.arange(b + 1, dtype=torch.int32, device=q.device),
        "cu_seqlens_k_new": cu_k,
        "max_seqlen_q": 1,
        "softmax_scale": case_softmax_scale(case),
        "causal": True,
        "softcap": 0.0,
        "return_softmax_lse": False,
        "num_splits": 0,
        "out": out,
    }
    q_rope = q[..., lkv:]

    def launch() -> torch.Tensor:
        fn(q=q_rope, **kw)
        return out

    return launch


@register
class FlashAttnWithKvcache(MlaDecode):
    kernel = "flash_attn_with_kvcache"
    description = "FA3 paged MLA decode (sgl_kernel.flash_attn), as SGLang's fa3 backend runs DeepSeek decode"
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.flash_attn:flash_attn_with_kvcache",
            None,
            "aot",
            _bind_with_kvcache,
            requires=SM90_ONLY,
            preload=(FA3_EXTENSION,),
            label="fa3, q_rope + qv = q_nope, page size 1 (token page table), out= buffer",
        )
    ]
