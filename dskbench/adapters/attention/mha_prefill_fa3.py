"""sgl-kernel's FlashAttention-3 varlen prefill (`sgl_kernel.flash_attn.flash_attn_varlen_func`), as SGLang's
fa3 backend (the default attention backend for DeepSeek on Hopper) runs the prefix-free MHA prefill:
ragged q = kv, causal.

sgl_kernel/flash_attn.py imports the `sgl_kernel.flash_ops` extension and raises ImportError without it;
the backend preloads that extension, so an install without it resolves to "not available in this install"
naming the missing module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.attention.mha_prefill import MhaPrefill, ragged_meta
from dskbench.adapters.attention.mla import case_softmax_scale
from dskbench.adapters.backends import SM90_ONLY, Backend
from dskbench.shapes.cases import Case

FA3_EXTENSION = "sgl_kernel.flash_ops"  # the compiled FA3 module sgl_kernel/flash_attn.py imports


def _bind_varlen(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """forward_extend, MLA without a cached prefix: cu_seqlens_k = cu_seqlens_q (int32), causal."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    cu, lens = ragged_meta(case, q.device)
    cu32 = cu.to(torch.int32)
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
    kw = {
        "cu_seqlens_q": cu32,
        "cu_seqlens_k": cu32,
        "max_seqlen_q": max(lens),
        "max_seqlen_k": max(lens),
        "softmax_scale": case_softmax_scale(case),
        "causal": True,
        "return_softmax_lse": False,
        "out": out,
    }

    def launch() -> torch.Tensor:
        fn(q=q, k=k, v=v, **kw)
        return out

    return launch


@register
class FlashAttnVarlenFunc(MhaPrefill):
    kernel = "flash_attn_varlen_func"
    description = (
        "FA3 varlen prefill (sgl_kernel.flash_attn), as SGLang's fa3 backend runs DeepSeek's MHA prefill"
    )
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.flash_attn:flash_attn_varlen_func",
            None,
            "aot",
            _bind_varlen,
            requires=SM90_ONLY,
            preload=(FA3_EXTENSION,),
            label="fa3, ragged q = kv, causal, out= buffer",
        )
    ]
