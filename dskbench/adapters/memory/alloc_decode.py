"""`alloc_decode_kernel`: the paged allocator's slot for each request's new token, every decode step.

SGLang 0.5.16's `PagedTokenToKVPoolAllocator.alloc_decode(seq_lens, seq_lens_cpu, last_loc)` (page_size
> 1: the trtllm_mla, cutlass_mla and flashmla backends DeepSeek runs on pages of 64 or 128) launches
`alloc_decode_kernel[(bs,)](seq_lens, last_loc, free_pages, out, next_power_of_2(bs), page_size)`: a
request whose last page has room gets last_loc + 1, one whose last page is full the first slot of the
next free page (requests taking free pages in batch order). The reference is paged_alloc.py's
token-by-token walk; outputs are compared exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common.inputs import exact_check, nbytes
from dskbench.adapters.memory.paged_alloc import alloc_dims, alloc_inputs, next_pow2, reference_of
from dskbench.shapes.cases import Case


def _bind_alloc_decode(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    seq, last, free = inputs["seq_lens"], inputs["last_loc"], inputs["free_pages"]
    bs, page = seq.shape[0], int(case.dims["page"])
    out = torch.empty((bs,), dtype=torch.int64, device=seq.device)

    def launch() -> torch.Tensor:
        fn[(bs,)](seq, last, free, out, next_pow2(bs), page)
        return out

    return launch


@register
class AllocDecodeAdapter(Adapter):
    kernel = "alloc_decode_kernel"
    role = "kv_alloc"
    ops = ("alloc_decode",)
    description = "paged KV allocator, decode: one new slot per request (pages of 64)"
    backends = [
        Backend(
            "triton",
            "sglang.kernels.ops.memory.allocator:alloc_decode_kernel",
            "sglang",
            "triton",
            _bind_alloc_decode,
            label="what SGLang 0.5.16 runs when page_size > 1",
            note="PagedTokenToKVPoolAllocator.alloc_decode's launch",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        _, t, page, max_len = alloc_dims(case)
        return alloc_inputs(t, t, page, max_len, True, device, seed)

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return reference_of(inputs, int(case.dims["page"]))

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return exact_check((out,), (ref,), ("out_indices",))

    def traffic(self, case: Case) -> Traffic:
        _, t, _, _ = alloc_dims(case)
        return Traffic(
            bytes=nbytes(3 * t, torch.int64),
            flops=0,
            note="read seq_lens, last_loc; write one int64 slot per request (free pages read: at most B)",
        )
