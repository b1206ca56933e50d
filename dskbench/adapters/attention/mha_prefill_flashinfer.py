"""FlashInfer's prefill wrappers at DeepSeek's MHA prefill shapes (q/k 192, v 128, causal, no prefix).

`BatchPrefillWithRaggedKVCacheWrapper` is what SGLang's flashinfer_mla backend runs for a prefix-free
prefill (backend "auto", fa3 on sm90; "cutlass" on sm100). The paged wrapper and the holistic
`BatchAttention` read the same k/v through a page table of page size 1 (SGLang's default), the tokens in
order, so all three compute the same attention.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.attention.mha_prefill import MhaPrefill, ragged_meta
from dskbench.adapters.attention.mla import (
    FLASHINFER_MLA_WORKSPACE_BYTES,
    case_softmax_scale,
    shared_workspace,
)
from dskbench.adapters.backends import SM100, Backend
from dskbench.shapes.cases import Case


def _dims(inputs: dict[str, Any]) -> tuple[int, int, int, int]:
    """(tokens, heads, q/k head dim, v head dim) of the prefill inputs."""
    q, v = inputs["q"], inputs["v"]
    return q.shape[0], q.shape[1], q.shape[2], v.shape[2]


def _ragged_binder(backend: str) -> Callable[[Any, dict[str, Any], Case], Callable[[], Any]]:
    def bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        """SGLang's flashinfer_mla ragged prefill: kv_indptr = qo_indptr, causal, plan() here, run() timed."""
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        t, nh, dq, dv = _dims(inputs)
        cu32 = ragged_meta(case, q.device)[0].to(torch.int32)
        workspace = shared_workspace("flashinfer_mla", FLASHINFER_MLA_WORKSPACE_BYTES, q.device)
        wrapper = fn(workspace, "NHD", backend=backend)
        wrapper.plan(
            cu32,
            cu32,
            num_qo_heads=nh,
            num_kv_heads=nh,
            head_dim_qk=dq,
            head_dim_vo=dv,
            causal=True,
            sm_scale=case_softmax_scale(case),
            q_data_type=q.dtype,
        )
        out = torch.empty(t, nh, dv, dtype=q.dtype, device=q.device)

        def launch() -> torch.Tensor:
            wrapper.run(q, k, v, out=out)
            return out

        return launch

    return bind


def _page_table(case: Case, device: torch.device) -> dict[str, torch.Tensor]:
    """Page size 1: qo_indptr = kv_indptr (int32), token indices in order, last-page lengths 1."""
    cu32, lens = ragged_meta(case, device)
    cu32 = cu32.to(torch.int32)
    t = int(cu32[-1])
    return {
        "qo_indptr": cu32,
        "kv_indptr": cu32,
        "kv_indices": torch.arange(t, dtype=torch.int32, device=device),
        "last_page_len": torch.ones(len(lens), dtype=torch.int32, device=device),
        "kv_lens": torch.tensor(lens, dtype=torch.int32, device=device),
    }


def _bind_paged(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """Planned as SGLang's flashinfer (MHA) backend plans it: page size 1, NHD, causal. FlashInfer's sm90
    paged kernel has no q/k 192, v 128 instance (its run fails with "operation not supported"), so the
    FA2 kernel is asked for: the one this wrapper runs at DeepSeek's head dims."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    t, nh, dq, dv = _dims(inputs)
    pt = _page_table(case, q.device)
    workspace = shared_workspace("flashinfer_mla", FLASHINFER_MLA_WORKSPACE_BYTES, q.device)
    wrapper = fn(workspace, "NHD", backend="fa2")
    wrapper.plan(
        pt["qo_indptr"],
        pt["kv_indptr"],
        pt["kv_indices"],
        pt["last_page_len"],
        nh,
        nh,
        dq,
        1,
        head_dim_vo=dv,
        causal=True,
        sm_scale=case_softmax_scale(case),
        q_data_type=q.dtype,
        kv_data_type=k.dtype,
    )
    out = torch.empty(t, nh, dv, dtype=q.dtype, device=q.device)
    cache = (k.view(t, 1, nh, dq), _same_page_stride(v, dq).view(t, 1, nh, -1)[..., :dv])

    def launch() -> torch.Tensor:
        wrapper.run(q, cache, out=out)
        return out

    return launch


def _same_page_stride(v: torch.Tensor, width: int) -> torch.Tensor:
    """v [T, H, Dv] copied into rows of `width` (q/k's head dim): the paged kernel reads k and v with one
    page stride, so a V cache of a narrower head dim lives in K-wide rows (the slice is what is read)."""
    t, nh, dv = v.shape
    padded = torch.zeros(t, nh, width, dtype=v.dtype, device=v.device)
    padded[..., :dv] = v
    return padded


_OVERFLOW = re.compile(r"allocating memory for (\w+) with size (\d+)")


def _plan_with_room(wrapper: Any, plan: Callable[[], None], device: torch.device) -> None:
    """plan(), growing the float workspace when the holistic scheduler asks for more than it has.

    BatchAttention's plan sizes its partial outputs by the work split, which at long causal prefills
    exceeds the wrapper's 384 MB default; the error names the size it needs. The grown workspace is
    shared by every bind of that size. A need beyond half the free GPU memory is an error that says so.
    """
    for _ in range(4):
        try:
            plan()
            return
        except RuntimeError as e:
            hit = _OVERFLOW.search(str(e))
            if not hit or "Increase the workspace" not in str(e):
                raise
            need = wrapper.float_workspace_buffer.numel() + int(hit.group(2))
            free = torch.cuda.mem_get_info(device)[0]
            if need > free // 2:
                raise RuntimeError(
                    f"BatchAttention.plan needs {need / 2**30:.1f} GiB of float workspace ({hit.group(1)}) "
                    f"at this shape: more than half the free GPU memory ({free / 2**30:.1f} GiB)"
                ) from None
            wrapper.float_workspace_buffer = shared_workspace("flashinfer_holistic", need, device)
    plan()


def _bind_batch_attention(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """The holistic wrapper owns a 384 MB float workspace; it is swapped for a shared one (runs are
    sequential), so rotated input sets do not each hold one, and grown when the plan needs more."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    t, nh, dq, dv = _dims(inputs)
    pt = _page_table(case, q.device)
    wrapper = fn(kv_layout="NHD", device=str(q.device))
    wrapper.float_workspace_buffer = shared_workspace(
        "flashinfer_mla", FLASHINFER_MLA_WORKSPACE_BYTES, q.device
    )
    _plan_with_room(
        wrapper,
        lambda: wrapper.plan(
            pt["qo_indptr"],
            pt["kv_indptr"],
            pt["kv_indices"],
            pt["kv_lens"],
            nh,
            nh,
            dq,
            dv,
            1,
            causal=True,
            sm_scale=case_softmax_scale(case),
            q_data_type=q.dtype,
            kv_data_type=k.dtype,
        ),
        q.device,
    )
    # the holistic kernel reads v with k's page stride (it does not check, unlike the paged wrapper)
    cache = (k.view(t, 1, nh, dq), _same_page_stride(v, dq).view(t, 1, nh, -1)[..., :dv])
    out = torch.empty(t, nh, dv, dtype=q.dtype, device=q.device)
    lse = torch.empty(t, nh, dtype=torch.float32, device=q.device)  # run() always writes it

    def launch() -> torch.Tensor:
        wrapper.run(q, cache, out=out, lse=lse)
        return out

    return launch


@register
class BatchPrefillWithRaggedKVCacheWrapperAdapter(MhaPrefill):
    kernel = "BatchPrefillWithRaggedKVCacheWrapper"
    description = "FlashInfer ragged prefill, as SGLang's flashinfer_mla backend runs DeepSeek's MHA prefill"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.prefill:BatchPrefillWithRaggedKVCacheWrapper",
            None,
            "jit",
            _ragged_binder("auto"),
            fallbacks=("flashinfer:BatchPrefillWithRaggedKVCacheWrapper",),
            label="backend='auto' (SGLang's choice below sm100: fa3 on sm90); plan() in bind",
        ),
        Backend(
            "flashinfer.cutlass",
            "flashinfer.prefill:BatchPrefillWithRaggedKVCacheWrapper",
            None,
            "jit",
            _ragged_binder("cutlass"),
            requires=SM100,
            label="backend='cutlass' (SGLang's choice on sm100); plan() in bind",
        ),
    ]


@register
class BatchPrefillWithPagedKVCacheWrapperAdapter(MhaPrefill):
    kernel = "BatchPrefillWithPagedKVCacheWrapper"
    description = "FlashInfer paged prefill at DeepSeek's MHA prefill shapes: page size 1, tokens in order"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.prefill:BatchPrefillWithPagedKVCacheWrapper",
            None,
            "jit",
            _bind_paged,
            fallbacks=("flashinfer:BatchPrefillWithPagedKVCacheWrapper",),
            label="backend='fa2' (no sm90 paged kernel at q/k 192, v 128), page size 1; plan() in bind",
        )
    ]


@register
class BatchAttentionAdapter(MhaPrefill):
    kernel = "BatchAttention"
    description = "FlashInfer holistic (persistent) attention at DeepSeek's MHA prefill shapes, page size 1"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.attention:BatchAttention",
            None,
            "jit",
            _bind_batch_attention,
            fallbacks=("flashinfer:BatchAttention",),
            label="holistic persistent kernel (head dims <= 256: not the absorbed MLA decode); page size 1",
        )
    ]
