"""FlashInfer MLA decode (`BatchMLAPagedAttentionWrapper`), planned as SGLang's flashinfer_mla backend
plans it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.attention.mla import (
    FLASHINFER_MLA_WORKSPACE_BYTES,
    case_softmax_scale,
    shared_workspace,
)
from dskbench.adapters.attention.mla_decode import MlaDecode, token_indices
from dskbench.adapters.backends import Backend
from dskbench.shapes.cases import Case


def _bind_flashinfer_mla(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """SGLang's flashinfer_mla decode: page size 1 with token indices, plan() here, run() timed.

    The wrapper is the CUDA-graph kind SGLang captures decode with (fixed index buffers).
    """
    q, kv = inputs["q"], inputs["kv_cache"]
    b, nh, _ = q.shape
    lkv = int(case.dims["Lkv"])
    workspace = shared_workspace("flashinfer_mla", FLASHINFER_MLA_WORKSPACE_BYTES, q.device)
    kv_indptr, kv_indices = token_indices(inputs, torch.int32)
    qo_indptr = torch.arange(b + 1, dtype=torch.int32, device=q.device)
    buffers = {
        "qo_indptr": torch.empty_like(qo_indptr),
        "kv_indptr": torch.empty_like(kv_indptr),
        "kv_indices": torch.empty_like(kv_indices),
        "kv_len_arr": torch.empty_like(inputs["seq_lens"]),
    }
    wrapper = fn(workspace, use_cuda_graph=True, backend="auto", **buffers)
    wrapper.plan(
        qo_indptr,
        kv_indptr,
        kv_indices,
        inputs["seq_lens"],
        nh,
        lkv,
        int(case.dims["Dr"]),
        1,
        False,
        case_softmax_scale(case),
        q.dtype,
        kv.dtype,
    )
    k3 = kv.view(kv.shape[0], 1, kv.shape[1])
    q_nope, q_pe = q[..., :lkv], q[..., lkv:]
    out = torch.empty(b, nh, lkv, dtype=q.dtype, device=q.device)

    def launch() -> torch.Tensor:
        wrapper.run(q_nope, q_pe, k3[:, :, :lkv], k3[:, :, lkv:], out=out)
        return out

    return launch


@register
class BatchMLAPagedAttentionWrapperAdapter(MlaDecode):
    kernel = "BatchMLAPagedAttentionWrapper"
    description = (
        "FlashInfer MLA decode (fa3 on sm90, fa2 elsewhere), as SGLang's flashinfer_mla backend plans it"
    )
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.mla:BatchMLAPagedAttentionWrapper",
            None,
            "jit",
            _bind_flashinfer_mla,
            fallbacks=("flashinfer:BatchMLAPagedAttentionWrapper",),
            label="backend='auto', page size 1, use_cuda_graph wrapper; plan() in bind",
        )
    ]
