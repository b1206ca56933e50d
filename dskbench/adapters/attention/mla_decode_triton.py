"""Triton split-KV MLA decode (`decode_attention_kernel`), as SGLang's triton backend calls it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.attention.mla import case_softmax_scale
from dskbench.adapters.attention.mla_decode import MlaDecode, token_indices
from dskbench.adapters.backends import Backend
from dskbench.shapes.cases import Case

TRITON_MLA_BASE_KV_SPLITS = 8  # server_args.triton_attention_num_kv_splits default
# The memory gate's SM count: the split cap rounds SMs up to a power of two, 256 for any GPU of 129 to 256
# SMs (Hopper's 132 among them), so the scratch it sizes is at most this large on such a GPU.
GATE_SM_COUNT = 256


def mla_decode_kv_splits_cap(base: int, sm_count: int, max_context_len: int) -> int:
    """SGLang's _mla_decode_kv_splits_cap (triton_backend.py): attn_logits' split dimension for MLA."""
    if sm_count <= 0:
        return base
    sm_cap = 1 << (sm_count - 1).bit_length()
    ctx_cap = 1 << (-(-max_context_len // 32) - 1).bit_length()
    return max(base, min(sm_cap, ctx_cap))


def logits_bytes(case: Case, sm_count: int) -> int:
    """attn_logits and its lse, fp32 [B, Nh, splits, Lkv] and [B, Nh, splits], as the backend sizes them:
    32 GiB at B=512 and 128 heads, beside the 36 GiB cache of 65,536 tokens a request."""
    d = case.dims
    b, nh, lkv = int(d["B"]), int(d["Nh"]), int(d["Lkv"])
    splits = mla_decode_kv_splits_cap(TRITON_MLA_BASE_KV_SPLITS, sm_count, int(case.model["max_position"]))
    return 4 * b * nh * splits * (lkv + 1)


def _bind_triton_mla_decode(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """SGLang's Triton backend for MLA decode: num_kv_splits from its scheduling kernel, fp32 scratch."""
    from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton

    q, kv, lens = inputs["q"], inputs["kv_cache"], inputs["seq_lens"]
    b, nh, _ = q.shape
    lkv = int(case.dims["Lkv"])
    props = torch.cuda.get_device_properties(q.device)
    sm_count = props.multi_processor_count
    max_context = int(case.model["max_position"])
    max_splits = mla_decode_kv_splits_cap(TRITON_MLA_BASE_KV_SPLITS, sm_count, max_context)
    num_kv_splits = torch.empty(b, dtype=torch.int32, device=q.device)
    get_num_kv_splits_triton[(1,)](
        num_kv_splits,
        lens,
        b,
        1,
        nh,
        1,
        max_splits,
        sm_count,
        MAX_NUM_SEQ=max(256, 1 << (b - 1).bit_length()),
    )
    kv_indptr, kv_indices = token_indices(inputs, torch.int64)
    k_buffer = kv.view(kv.shape[0], 1, kv.shape[1])
    v_buffer = k_buffer[..., :lkv]
    logits = torch.empty(b, nh, max_splits, lkv, dtype=torch.float32, device=q.device)
    lse = torch.empty(b, nh, max_splits, dtype=torch.float32, device=q.device)
    out = torch.empty(b, nh, lkv, dtype=q.dtype, device=q.device)
    use_pdl = props.major >= 9

    def launch() -> torch.Tensor:
        fn(
            q,
            k_buffer,
            v_buffer,
            out,
            kv_indptr,
            kv_indices,
            logits,
            lse,
            num_kv_splits,
            max_splits,
            case_softmax_scale(case),
            1.0,
            1.0,
            has_mla=True,
            use_pdl=use_pdl,
            page_size=1,
        )
        return out

    return launch


@register
class DecodeAttentionKernel(MlaDecode):
    kernel = "decode_attention_kernel"
    description = "Triton split-KV MLA decode (grouped stage 1 + reduce), as SGLang's triton backend calls it"
    backends = [
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.attention.decode_attention:decode_attention_fwd",
            None,
            "triton",
            _bind_triton_mla_decode,
            fallbacks=("sglang.srt.layers.attention.triton_ops.decode_attention:decode_attention_fwd",),
            label="page size 1; max_kv_splits = SGLang's MLA cap; attn_logits/lse fp32 scratch in bind",
        )
    ]

    def scratch_bytes(self, backend: str, case: Case) -> int:
        return logits_bytes(case, GATE_SM_COUNT)
