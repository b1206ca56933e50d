"""`alloc_extend_kernel`: the paged allocator's slots for a prefill (extend) batch's new tokens.

SGLang 0.5.16's `PagedTokenToKVPoolAllocator.alloc_extend(prefix_lens, ..., seq_lens, ..., last_loc,
extend_num_tokens)` (page_size > 1) launches `alloc_extend_kernel[(bs,)](prefix_lens, seq_lens,
last_loc, free_pages, out, next_power_of_2(bs), page_size)`: each request fills the rest of its last
partial page, then whole new pages, then a last partial page, new pages taken from `free_pages` in
batch order. The case's T new tokens are split at random over B requests, each after a cached prefix
of 0 to `max_len` tokens (one fresh request, one whose prefix ends on a page boundary). The reference is
paged_alloc.py's token-by-token walk; outputs are compared exactly.
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


def _bind_alloc_extend(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    pre, seq, last, free = inputs["prefix_lens"], inputs["seq_lens"], inputs["last_loc"], inputs["free_pages"]
    bs, page = seq.shape[0], int(case.dims["page"])
    out = torch.empty((int(case.dims["T"]),), dtype=torch.int64, device=seq.device)

    def launch() -> torch.Tensor:
        fn[(bs,)](pre, seq, last, free, out, next_pow2(bs), page)
        return out

    return launch


@register
class AllocExtendAdapter(Adapter):
    kernel = "alloc_extend_kernel"
    role = "kv_alloc"
    ops = ("alloc_extend",)
    description = "paged KV allocator, prefill: the slots of T new tokens over B requests (pages of 64)"
    backends = [
        Backend(
            "triton",
            "sglang.kernels.ops.memory.allocator:alloc_extend_kernel",
            "sglang",
            "triton",
            _bind_alloc_extend,
            label="what SGLang 0.5.16 runs when page_size > 1",
            note="PagedTokenToKVPoolAllocator.alloc_extend's launch",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        reqs, t, page, max_len = alloc_dims(case)
        return alloc_inputs(reqs, t, page, max_len, False, device, seed)

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return reference_of(inputs, int(case.dims["page"]))

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return exact_check((out,), (ref,), ("out_indices",))

    def traffic(self, case: Case) -> Traffic:
        reqs, t, page, _ = alloc_dims(case)
        pages = t // page + 2 * reqs  # the new pages' entries of the free list, at most
        return Traffic(
            bytes=nbytes(3 * reqs + pages + t, torch.int64),
            flops=0,
            note="read prefix_lens, seq_lens, last_loc and the free pages used; write one int64 slot per token",
        )
