"""`_get_k_and_s_triton_kernel`: DeepSeek-V3.2's indexer keys and scales read back from the paged index K
cache, every layer of a prefill.

SGLang 0.5.16's DSA indexer, on a prefill (extend) batch (`_get_topk_ragged`), gathers every request's
FP8 keys and scales with `DSATokenToKVPool.get_index_k_scale_buffer(layer, seq_lens, page_table_64,
seq_len_sum, max_seq_len)` -> `index_buf_accessor.GetKAndS` (sglang/kernels/ops/attention/dsa/
index_buf_accessor.py), which launches `_get_k_and_s_triton_kernel[(reqs, cdiv(max_seq_len, 256), 1)]`
with BLOCK_SIZE 256 and BLOCK_SIZE_K 128: token j of request r lies on page `page_table[r, j // 64]`,
slot j % 64, of the cache `buf` (uint8 [pages, 64 * (128 + 4)]: 64 keys of 128 bytes, then 64 fp32
scales), and goes to row (tokens of the requests before r) + j of `k_out` (uint8 [sum, 128]) and `s_out`
(uint8 [sum, 4]). The reference gathers the same bytes with torch; outputs are compared exactly.

Cases: the prefill's T tokens over `reqs` requests without a cached prefix (T / reqs tokens each).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common.inputs import exact_check, generator, nbytes, randint
from dskbench.adapters.memory.paged_alloc import next_pow2
from dskbench.shapes.cases import Case

SCALE_BYTES = 4  # one fp32 scale per token
BLOCK_SIZE, BLOCK_SIZE_K = 256, 128  # _get_k_and_s_triton's


def get_dims(case: Case) -> tuple[int, int, int, int, int]:
    """(requests, tokens of each, key bytes per token, page size, cache pages)."""
    d = case.dims
    reqs, dim, page = int(d["reqs"]), int(d["D"]), int(d["page"])
    seq = max(1, int(d["T"]) // reqs)
    used = reqs * -(-seq // page)
    return reqs, seq, dim, page, max(int(d["pool"]) // page, 2 * used + 2)


def get_k_and_s_reference(
    buf: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor, dim: int, page: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_out uint8 [sum, D], s_out uint8 [sum, 4]): each request's tokens in order, request after request."""
    ks, ss = [], []
    for r, n in enumerate(seq_lens.cpu().tolist()):
        j = torch.arange(n, device=buf.device)
        pages = page_table[r].long()[j // page].unsqueeze(1)
        slots = (j % page).unsqueeze(1)
        ks.append(buf[pages, slots * dim + torch.arange(dim, device=buf.device)])
        ss.append(buf[pages, page * dim + slots * SCALE_BYTES + torch.arange(SCALE_BYTES, device=buf.device)])
    return torch.cat(ks), torch.cat(ss)


def _bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # GetKAndS.triton -> _get_k_and_s_triton's launch
    buf, table, lens = inputs["buf"], inputs["page_table"], inputs["seq_lens"]
    reqs, seq, dim, page, _ = get_dims(case)
    k_out = torch.empty((reqs * seq, dim), dtype=torch.uint8, device=buf.device)
    s_out = torch.empty((reqs * seq, SCALE_BYTES), dtype=torch.uint8, device=buf.device)
    grid = (reqs, -(-seq // BLOCK_SIZE), -(-dim // BLOCK_SIZE_K))

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn[grid](
            buf_ptr=buf,
            page_indices_ptr=table,
            k_out_ptr=k_out,
            s_out_ptr=s_out,
            seq_len_ptr=lens,
            seq_len_num_pow=next_pow2(reqs),
            page_size=page,
            buf_numel_per_page=buf.shape[1],
            index_head_dim=dim,
            s_offset_in_page=page * dim,
            page_indice_batch_offset=table.shape[1],
            BLOCK_SIZE=BLOCK_SIZE,
            BLOCK_SIZE_K=BLOCK_SIZE_K,
        )
        return k_out, s_out

    return launch


@register
class GetKAndSAdapter(Adapter):
    kernel = "_get_k_and_s_triton_kernel"
    role = "kv_read"
    ops = ("nsa_indexer.forward",)
    description = (
        "DSA indexer, prefill: every request's FP8 keys [128] and fp32 scales out of the paged index K cache"
    )
    backends = [
        Backend(
            "triton",
            "sglang.kernels.ops.attention.dsa.index_buf_accessor:_get_k_and_s_triton_kernel",
            "sglang",
            "triton",
            _bind,
            label="what SGLang 0.5.16 runs on NVIDIA GPUs",
            note="GetKAndS.triton's launch: grid (requests, token blocks of 256, 1), pages of 64",
        ),
    ]

    def applies(self, case: Case) -> bool:
        # only the prefill (ragged) path gathers the keys; decode reads the paged cache in place
        return case.phase == "prefill"

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        reqs, seq, dim, page, pages = get_dims(case)
        gen = generator(seed)
        per_req = -(-seq // page)
        table = (torch.randperm(pages - 1, generator=gen)[: reqs * per_req] + 1).view(reqs, per_req)
        buf = randint(0, 256, (pages, page * (dim + SCALE_BYTES)), gen, device, torch.uint8)
        return {
            "buf": buf,
            "page_table": table.to(torch.int32).to(device),
            "seq_lens": torch.full((reqs,), seq, dtype=torch.int64, device=device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        d = case.dims
        return get_k_and_s_reference(
            inputs["buf"], inputs["page_table"], inputs["seq_lens"], int(d["D"]), int(d["page"])
        )

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return exact_check(tuple(out), tuple(ref), ("k_out", "s_out"))

    def traffic(self, case: Case) -> Traffic:
        reqs, seq, dim, page, _ = get_dims(case)
        t = reqs * seq
        return Traffic(
            bytes=2 * t * (dim + SCALE_BYTES) + nbytes(reqs * -(-seq // page), torch.int32),
            flops=0,
            note="read each token's key and scale bytes (and the page table); write k_out and s_out",
        )
