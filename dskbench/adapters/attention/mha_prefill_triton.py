"""SGLang's Triton attention kernels at DeepSeek's MHA prefill shapes: `extend_attention_kernel` (what
SGLang's triton backend runs for prefix-free extends) and `prefill_attention_kernel` (context attention)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.attention.mha_prefill import MhaPrefill, ragged_meta
from dskbench.adapters.attention.mla import case_softmax_scale
from dskbench.adapters.backends import Backend
from dskbench.shapes.cases import Case


def _bind_triton_extend(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """SGLang's Triton backend, MHA extend without prefix (DeepSeek prefill): empty prefix, causal."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    dev = q.device
    cu, lens = ragged_meta(case, dev)
    b = len(lens)
    kv_indptr = torch.zeros(b + 1, dtype=torch.int32, device=dev)
    kv_indices = torch.zeros(1, dtype=torch.int64, device=dev)  # no prefix token is read
    width = int(case.model["Dkv"])
    k_buffer = torch.zeros(1, 1, width, dtype=q.dtype, device=dev)  # the MLA pool's shape; unread
    v_buffer = k_buffer[..., : int(case.model["Lkv"])]
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=dev)
    scale = case_softmax_scale(case)

    def launch() -> torch.Tensor:
        fn(
            q,
            k,
            v,
            out,
            k_buffer,
            v_buffer,
            cu,
            kv_indptr,
            kv_indices,
            None,
            True,
            None,
            max(lens),
            1.0,
            1.0,
            scale,
        )
        return out

    return launch


@register
class ExtendAttentionKernel(MhaPrefill):
    kernel = "extend_attention_kernel"
    description = "Triton extend attention (_fwd_kernel) on DeepSeek's MHA prefill: q/k 192, v 128, causal"
    backends = [
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.attention.extend_attention:extend_attention_fwd",
            None,
            "triton",
            _bind_triton_extend,
            fallbacks=("sglang.srt.layers.attention.triton_ops.extend_attention:extend_attention_fwd",),
            label="no prefix (SGLang's triton backend uses MHA only for prefix-free extends)",
        )
    ]


def _bind_triton_prefill(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """context_attention_fwd needs one head dim for q/k/v/o: V and O are zero-padded to 192 in bind."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    dev = q.device
    cu, lens = ragged_meta(case, dev)
    v_pad = torch.zeros(q.shape, dtype=v.dtype, device=dev)
    v_pad[..., : v.shape[-1]] = v
    o_pad = torch.empty(q.shape, dtype=q.dtype, device=dev)
    starts = cu[:-1].to(torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    scale = case_softmax_scale(case)
    dv = v.shape[-1]

    def launch() -> torch.Tensor:
        fn(q, k, v_pad, o_pad, starts, seq_lens, max(lens), True, scale)
        return o_pad[..., :dv]

    return launch


@register
class PrefillAttentionKernel(MhaPrefill):
    kernel = "prefill_attention_kernel"
    description = "Triton context attention (prefill_attention.py) at the MHA prefill shapes, V padded to 192"
    backends = [
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.attention.prefill_attention:context_attention_fwd",
            None,
            "triton",
            _bind_triton_prefill,
            fallbacks=("sglang.srt.layers.attention.triton_ops.prefill_attention:context_attention_fwd",),
            label="kernel needs Lq == Lv: V/O zero-padded 128 -> 192 (padding is read and written)",
        )
    ]
