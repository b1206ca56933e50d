"""The paged token allocator's inputs and reference, shared by `alloc_decode_kernel` and
`alloc_extend_kernel` (sglang/kernels/ops/memory/allocator.py, launched by
sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator when page_size > 1).

A batch of requests, request i holding `prefix_lens[i]` tokens whose last sits in KV slot
`last_loc[i]` (-1 when it holds none), grows to `seq_lens[i]` tokens. Each new token gets a slot: the
rest of the request's last partial page first (slots last_loc + 1, + 2, ...), then whole new pages
taken in order from `free_pages` (the requests in batch order, each taking what it needs), slot =
page * page_size + offset. `out` lists the new tokens' slots, request after request.
"""

from __future__ import annotations

from typing import Any

import torch

from dskbench.adapters.common.inputs import generator
from dskbench.shapes.cases import Case

SPARE_PAGES = 1024  # free pages beyond what the batch needs (the allocator's free list is long)


def next_pow2(n: int) -> int:
    """triton.next_power_of_2 (the launches' bs_upper)."""
    return 1 << max(0, n - 1).bit_length()


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def paged_alloc_reference(
    prefix_lens: list[int], seq_lens: list[int], last_loc: list[int], free_pages: list[int], page: int
) -> torch.Tensor:
    """The slots of every new token, token by token (int64 [sum(seq_lens - prefix_lens)])."""
    out: list[int] = []
    cursor = 0  # next unused entry of free_pages
    for p, s, last in zip(prefix_lens, seq_lens, last_loc, strict=True):
        first_new_page = _ceil_div(p, page)  # page index (within the request) of its first new page
        for j in range(p, s):
            if j < first_new_page * page:  # in the partial page the prefix ends in
                out.append(last + 1 + (j - p))
            else:
                out.append(free_pages[cursor + j // page - first_new_page] * page + j % page)
        cursor += _ceil_div(s, page) - first_new_page
    return torch.tensor(out, dtype=torch.int64)


def alloc_dims(case: Case) -> tuple[int, int, int, int]:
    """(requests, new tokens, page size, longest prefix) of a case; decode: one new token per request."""
    d = case.dims
    t, page, max_len = int(d["T"]), int(d["page"]), int(d["max_len"])
    return min(int(d["B"]), t), t, page, max_len


def alloc_inputs(
    reqs: int, tokens: int, page: int, max_len: int, decode: bool, device: str, seed: int
) -> dict[str, Any]:
    """A consistent allocator state: requests' prefixes in pages of their own, a shuffled free list."""
    gen = generator(seed)
    if decode:
        prefix = torch.randint(1, max_len, (reqs,), generator=gen)
        extend = torch.ones(reqs, dtype=torch.int64)
    else:
        prefix = torch.randint(0, max_len + 1, (reqs,), generator=gen)
        prefix[0] = 0  # a fresh request, and one whose prefix fills its pages exactly
        if reqs > 1:
            prefix[1] = (prefix[1] // page) * page
        cuts = torch.randperm(tokens - 1, generator=gen)[: reqs - 1].sort().values + 1
        bounds = torch.cat([torch.tensor([0]), cuts, torch.tensor([tokens])])
        extend = bounds[1:] - bounds[:-1]  # a random split of the tokens, >= 1 each
    seq = prefix + extend
    # each request's held pages, disjoint from each other and from the free list
    held = [_ceil_div(int(p), page) for p in prefix]
    pages = torch.randperm(sum(held) + sum(_ceil_div(int(s), page) for s in seq) + SPARE_PAGES, generator=gen)
    pages = pages + 1  # page 0 holds sglang's padding slot
    last = []
    at = 0
    for p, h in zip(prefix.tolist(), held, strict=True):
        last.append(int(pages[at + h - 1]) * page + (p - 1) % page if p else -1)
        at += h
    free = pages[at:]
    return {
        "prefix_lens": prefix.to(torch.int64).to(device),
        "seq_lens": seq.to(torch.int64).to(device),
        "last_loc": torch.tensor(last, dtype=torch.int64).to(device),
        "free_pages": free.to(torch.int64).to(device),
    }


def reference_of(inputs: dict[str, Any], page: int) -> torch.Tensor:
    return paged_alloc_reference(
        inputs["prefix_lens"].tolist(),
        inputs["seq_lens"].tolist(),
        inputs["last_loc"].tolist(),
        inputs["free_pages"].tolist(),
        page,
    )
