"""MLA decode (absorbed): the inputs, reference and traffic every MLA decode kernel shares.

q = [q_nope_absorbed | q_pe] is [B, Nh, 576]; the cache holds one latent row [c_kv (512) | k_pe (64)] per
token; attention is softmax(q . row * sm_scale) @ row[:512]. Inputs build one bf16 cache [pages * 128, 576]
and a page table of 128-token pages (scattered, as a page allocator leaves them), so every backend reads the
same storage: page size 1 (FlashInfer MLA and Triton, token indices, as SGLang's backends plan them), 64
(TRT-LLM / XQA) and 128 (CUTLASS MLA) are views of it.
"""

from __future__ import annotations

from typing import Any

import torch

from dskbench.adapters.attention.mla import case_softmax_scale
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import generator, normal
from dskbench.adapters.common.matmul_precision import exact_in_tf32, fp32_matmul, matmul_split_tf32
from dskbench.shapes.cases import Case

PAGE = 128  # page granularity of the shared decode cache (lcm of the backends' page sizes 1, 64, 128)
KV_CACHE_BUDGET_BYTES = 40 * 10**9  # decode cases whose KV cache is larger are skipped
REFERENCE_ROWS = 1 << 19  # cache rows the reference gathers at once (1.2 GB in fp32)


def mla_decode_reference(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    rope_dim: int,
) -> torch.Tensor:
    """softmax(q . rows^T * scale) @ rows[:, :512] per request, fp32 -> [B, Nh, 512] (576 - `rope_dim`).

    Requests of one length are computed together, REFERENCE_ROWS cache rows at a time: one at a time, 512
    requests of 1,024 tokens spent their time in launches. BF16 q and rows are exact in TF32: q . rows^T
    then runs on TF32 tensor cores with exact products, and the fp32 probabilities times the rows as two
    such matmuls (matmul_split_tf32); other types in IEEE fp32."""
    b, nh, dqk = q.shape
    dv = dqk - rope_dim
    out = torch.empty(b, nh, dv, dtype=torch.float32, device=q.device)
    tf32 = exact_in_tf32(q, kv_cache)
    lens = seq_lens.tolist()
    for length in sorted(set(lens)):
        same = [i for i, n in enumerate(lens) if n == length]
        step = max(1, REFERENCE_ROWS // max(1, length))
        for c in range(0, len(same), step):
            reqs = torch.tensor(same[c : c + step], dtype=torch.long, device=q.device)
            rows = kv_cache[token_slots(page_table[reqs], length)].float()  # [requests, L, 576]
            with fp32_matmul(tf32):
                p = torch.softmax((q[reqs].float() @ rows.transpose(1, 2)) * scale, dim=-1)
            out[reqs] = matmul_split_tf32(p, rows[..., :dv]) if tf32 else p @ rows[..., :dv]
    return out


def token_slots(pages: torch.Tensor, length: int, page: int = PAGE) -> torch.Tensor:
    """Cache rows of a request's first `length` tokens from its page ids (int64); for a [requests, pages]
    table, each request's, [requests, length]."""
    n = -(-length // page)
    slots = pages[..., :n].long().unsqueeze(-1) * page + torch.arange(page, device=pages.device)
    return slots.flatten(-2)[..., :length]


def sub_pages(page_table: torch.Tensor, sub: int) -> torch.Tensor:
    """Page table of 128-token pages -> the same cache seen as pages of `sub` tokens (int32)."""
    r = PAGE // sub
    pt = page_table.long().unsqueeze(-1) * r + torch.arange(r, device=page_table.device)
    return pt.flatten(1).to(torch.int32).contiguous()


def token_indices(inputs: dict[str, Any], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv_indptr int32 [B+1], kv_indices [sum L]) for page size 1, as SGLang builds them."""
    pt, lens = inputs["page_table"], inputs["seq_lens"]
    n = lens.tolist()
    if len(set(n)) == 1:  # every request of one length (the sweep's): one gather, not one per request
        idx = token_slots(pt, n[0]).flatten().to(dtype)
    else:
        idx = torch.cat([token_slots(pt[i], k) for i, k in enumerate(n)]).to(dtype)
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=lens.device)
    indptr[1:] = torch.cumsum(lens, 0)
    return indptr, idx


def kv_cache_bytes(case: Case) -> int:
    d = case.dims
    return int(d["B"]) * int(d["kv_len"]) * (int(d["Lkv"]) + int(d["Dr"])) * 2


class MlaDecode(Adapter):
    """Shared inputs, reference and traffic of the MLA decode kernels (role mla_decode of attn_mqa)."""

    role = "mla_decode"
    ops = ("attn_mqa",)

    def skip_reason(self, case: Case) -> str | None:
        need = kv_cache_bytes(case)
        if need > KV_CACHE_BUDGET_BYTES:
            return f"KV cache of {need / 1e9:.1f} GB exceeds the {KV_CACHE_BUDGET_BYTES / 1e9:.0f} GB budget"
        return None

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        d = case.dims
        b, nh, kv_len = int(d["B"]), int(d["Nh"]), int(d["kv_len"])
        dqk = int(d["Lkv"]) + int(d["Dr"])
        pages_per_req = -(-kv_len // PAGE)
        gen = generator(seed)
        perm = torch.randperm(b * pages_per_req, generator=gen)
        return {
            "q": normal((b, nh, dqk), gen, device),
            "kv_cache": self.kv_cache(b * pages_per_req * PAGE, case, gen, device),
            "page_table": perm.view(b, pages_per_req).to(torch.int32).to(device),
            "seq_lens": torch.full((b,), kv_len, dtype=torch.int32, device=device),
        }

    def kv_cache(self, tokens: int, case: Case, gen: torch.Generator, device: str) -> torch.Tensor:
        """The latent cache, [tokens, 576] bf16 normal rows (drawn in bf16: it is up to 40 GB)."""
        return normal((tokens, int(case.dims["Lkv"]) + int(case.dims["Dr"])), gen, device)

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return mla_decode_reference(
            inputs["q"],
            inputs["kv_cache"],
            inputs["page_table"],
            inputs["seq_lens"],
            case_softmax_scale(case),
            int(case.model["Dr"]),
        )

    def traffic(self, case: Case) -> Traffic:
        d = case.dims
        b, nh, kv_len, lkv = int(d["B"]), int(d["Nh"]), int(d["kv_len"]), int(d["Lkv"])
        dqk = lkv + int(d["Dr"])
        byts = kv_cache_bytes(case) + b * nh * (dqk + lkv) * 2 + 4 * b
        flops = b * 2 * nh * kv_len * (dqk + lkv)
        return Traffic(byts, flops, "KV rows + q + out; page-table bytes (backend page size) excluded")
