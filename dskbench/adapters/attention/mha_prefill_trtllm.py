"""TRT-LLM-gen ragged MHA prefill for DeepSeek (`trtllm_ragged_attention_deepseek`, sm100), as SGLang's
trtllm_mla backend calls it without a prefix."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.attention.mha_prefill import MhaPrefill, ragged_meta
from dskbench.adapters.attention.mla import TRTLLM_MLA_WORKSPACE_BYTES, case_softmax_scale, shared_workspace
from dskbench.adapters.backends import SM100, Backend
from dskbench.shapes.cases import Case


def _bind_trtllm_ragged(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """SGLang's trtllm_mla prefill without prefix: ragged q = kv, causal, o_sf_scale 1."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    dev = q.device
    cu, lens = ragged_meta(case, dev)
    cu32 = cu.to(torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    workspace = shared_workspace("trtllm_mla", TRTLLM_MLA_WORKSPACE_BYTES, dev, zeroed=True)
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=dev)
    kw = {
        "query": q,
        "key": k,
        "value": v,
        "workspace_buffer": workspace,
        "seq_lens": seq_lens,
        "max_q_len": max(lens),
        "max_kv_len": max(lens),
        "bmm1_scale": case_softmax_scale(case),
        "bmm2_scale": 1.0,
        "o_sf_scale": 1.0,
        "batch_size": len(lens),
        "window_left": -1,
        "cum_seq_lens_q": cu32,
        "cum_seq_lens_kv": cu32,
        "enable_pdl": False,
        "is_causal": True,
        "return_lse": False,
        "out": out,
    }

    def launch() -> torch.Tensor:
        fn(**kw)
        return out

    return launch


@register
class TrtllmRaggedAttentionDeepseek(MhaPrefill):
    kernel = "trtllm_ragged_attention_deepseek"
    description = "TRT-LLM-gen ragged MHA prefill for DeepSeek (q/k 192, v 128), sm100"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.prefill:trtllm_ragged_attention_deepseek",
            None,
            "cubin",
            _bind_trtllm_ragged,
            requires=SM100,
            label="backend trtllm-gen; zeroed 150 MB workspace",
        )
    ]
