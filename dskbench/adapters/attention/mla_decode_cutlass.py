"""CUTLASS SM100 MLA decode (`cutlass_mla_decode`), as SGLang's cutlass_mla backend calls it, and a check of
its host-side workspace sizing.

`cutlass_mla_get_workspace_size` (`sgl_kernel.attention`) is a host function sizing the
workspace of the sm100-only `cutlass_mla_decode` (registry status `host-only`, no adapter). SGLang 0.5.16
calls it only from the cutlass_mla attention backend, which sm90 never selects (Hopper's MLA default is fa3).
`cutlass_mla_workspace_size` resolves it (or takes one) for GPU tests and raises ValueError when the result
is wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.attention.mla import case_softmax_scale
from dskbench.adapters.attention.mla_decode import PAGE, MlaDecode
from dskbench.adapters.backends import SM100, Backend, import_target
from dskbench.shapes.cases import Case

CUTLASS_MLA_HEADS = 128  # cutlass_mla_decode's fixed head count (MAX_HEADS in sgl_kernel's wrapper)
WORKSPACE_TARGET = "sgl_kernel.attention:cutlass_mla_get_workspace_size"


def _bind_cutlass_mla(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """SGLang's cutlass_mla backend: 128-token pages, workspace from cutlass_mla_get_workspace_size."""
    import sgl_kernel

    q, kv, pt, lens = inputs["q"], inputs["kv_cache"], inputs["page_table"], inputs["seq_lens"]
    b, nh, _ = q.shape
    lkv = int(case.dims["Lkv"])
    size = sgl_kernel.cutlass_mla_get_workspace_size(pt.shape[1] * PAGE, b, num_kv_splits=1)
    workspace = torch.empty(size, dtype=torch.uint8, device=q.device)
    # The kernel always runs 128 heads: sgl_kernel's wrapper pads fewer heads (attention TP > 1) per call.
    q_pad = torch.zeros(b, CUTLASS_MLA_HEADS, q.shape[2], dtype=q.dtype, device=q.device)
    q_pad[:, :nh] = q
    q_nope, q_pe = q_pad[..., :lkv].contiguous(), q_pad[..., lkv:].contiguous()
    cache = kv.view(-1, PAGE, kv.shape[1])
    out = torch.empty(b, CUTLASS_MLA_HEADS, lkv, dtype=q.dtype, device=q.device)
    scale = case_softmax_scale(case)

    def launch() -> torch.Tensor:
        fn(out, q_nope, q_pe, cache, lens, pt, workspace, scale, 1)
        return out[:, :nh]

    return launch


@register
class CutlassMlaDecode(MlaDecode):
    kernel = "cutlass_mla_decode"
    description = "CUTLASS SM100 MLA decode (128 heads, page 128), as SGLang's cutlass_mla backend calls it"
    backends = [
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.cutlass_mla_decode.default",
            None,
            "aot",
            _bind_cutlass_mla,
            requires=SM100,
            preload=("sgl_kernel",),
            label="num_kv_splits=1 (SGLang's value); workspace and head padding to 128 in bind",
        )
    ]

    def skip_reason(self, case: Case) -> str | None:
        if int(case.dims["Nh"]) > CUTLASS_MLA_HEADS:
            return f"cutlass_mla_decode handles at most {CUTLASS_MLA_HEADS} heads"
        return super().skip_reason(case)


def cutlass_mla_workspace_size(
    max_seq_len: int = 163840,
    num_batches: int = 64,
    sm_count: int = 0,
    num_kv_splits: int = 1,
    fn: Any = None,
) -> int:
    """Workspace bytes for cutlass_mla_decode at DeepSeek's context length; must be a positive int."""
    fn = fn if fn is not None else import_target(WORKSPACE_TARGET, ("sgl_kernel",))
    size = fn(max_seq_len, num_batches, sm_count, num_kv_splits)
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"cutlass_mla_get_workspace_size returned {size!r}, expected a positive int")
    return size
