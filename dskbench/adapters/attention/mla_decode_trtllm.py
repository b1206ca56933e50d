"""TRT-LLM-gen MLA decode (sm100) and XQA MLA decode (SM120/121): the same call on 64-token pages, as
SGLang's trtllm_mla backend makes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.attention.mla import TRTLLM_MLA_WORKSPACE_BYTES, case_softmax_scale, shared_workspace
from dskbench.adapters.attention.mla_decode import MlaDecode, sub_pages
from dskbench.adapters.backends import SM100, Backend, Requirement
from dskbench.shapes.cases import Case

TRTLLM_PAGE = 64  # SGLang's trtllm_mla / XQA page size
SM120 = Requirement(sm=(120, 121))


def _trtllm_decode_args(inputs: dict[str, Any], case: Case) -> dict[str, Any]:
    q, kv = inputs["q"], inputs["kv_cache"]
    d = case.dims
    return {
        "query": q.unsqueeze(1),  # [B, q_len=1, Nh, 576]
        "kv_cache": kv.view(-1, TRTLLM_PAGE, kv.shape[1]).unsqueeze(1),  # [pages, 1, 64, 576]
        "workspace_buffer": shared_workspace("trtllm_mla", TRTLLM_MLA_WORKSPACE_BYTES, q.device, zeroed=True),
        "qk_nope_head_dim": int(d["Dn"]) if "Dn" in d else int(case.model["Dn"]),
        "kv_lora_rank": int(d["Lkv"]),
        "qk_rope_head_dim": int(d["Dr"]),
        "block_tables": sub_pages(inputs["page_table"], TRTLLM_PAGE),
        "seq_lens": inputs["seq_lens"],
        "max_seq_len": int(d["kv_len"]),
        "bmm1_scale": case_softmax_scale(case),  # q_scale * k_scale * layer.scaling with bf16 q/KV
    }


def _bind_trtllm_decode(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    args = _trtllm_decode_args(inputs, case)
    b, nh, _ = inputs["q"].shape
    lkv = int(case.dims["Lkv"])

    def launch() -> torch.Tensor:
        return fn(**args).view(b, nh, lkv)

    return launch


@register
class TrtllmBatchDecodeWithKvCacheMla(MlaDecode):
    kernel = "trtllm_batch_decode_with_kv_cache_mla"
    description = "TRT-LLM-gen MLA decode (sm100), page 64, as SGLang's trtllm_mla backend calls it"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.mla:trtllm_batch_decode_with_kv_cache_mla",
            None,
            "cubin",
            _bind_trtllm_decode,
            requires=SM100,
            fallbacks=("flashinfer.decode:trtllm_batch_decode_with_kv_cache_mla",),
            label="backend auto (trtllm-gen on sm100); zeroed 150 MB workspace",
        )
    ]


@register
class XqaBatchDecodeWithKvCacheMla(MlaDecode):
    kernel = "xqa_batch_decode_with_kv_cache_mla"
    description = "XQA MLA decode for SM120/121 (bf16, q_len 1), page 64"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.mla:xqa_batch_decode_with_kv_cache_mla",
            None,
            "jit",
            _bind_trtllm_decode,
            requires=SM120,
            fallbacks=("flashinfer.decode:xqa_batch_decode_with_kv_cache_mla",),
            label="SM120/121 only (not H100/B200)",
        )
    ]
