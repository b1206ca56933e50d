"""`generate_draft_decode_kv_indices`: the KV indices of every EAGLE/NextN draft step, built once per
decode step for the FlashInfer MLA backend.

SGLang 0.5.16's `FlashInferMLAMultiStepDraftBackend.common_template` launches
`generate_draft_decode_kv_indices[(num_steps, B, topk)](req_pool_indices, req_to_token, seq_lens,
kv_indices, kv_indptr, positions, pool_len, kv_indices.shape[1], kv_indptr.shape[1], next_power_of_2(B),
next_power_of_2(num_steps), next_power_of_2(B * topk), page_size)` (sglang/kernels/ops/speculative/
cache_locs.py). For draft step i (i + 1 draft tokens so far) row i of `kv_indices` lists, branch after
branch (request b, top-k branch k), the request's `seq_len` cached slots `req_to_token[row, :seq_len]`
followed by its i + 1 draft slots `req_to_token[row, seq_len + k * num_steps :][: i + 1]`; row i of
`kv_indptr` gets the running sums of those lengths (entry 0, always 0, is left as it is). With DeepSeek's
top-k 1 the draft slots follow the prefix directly (the page-size branch of the kernel serves top-k > 1 on
pages > 1 only, which the reference does not model).

In place: the launcher returns both buffers, checked exactly against the reference's concatenations.
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


def draft_dims(case: Case) -> tuple[int, int, int, int, int]:
    """(requests, context length of each, top-k, draft steps, page size)."""
    d = case.dims
    return int(d["B"]), int(d["kv_len"]), int(d["topk"]), int(d["num_steps"]), int(d["page"])


def draft_kv_reference(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of kv_indices [num_steps, W] and kv_indptr [num_steps, B * topk + 1] with each step's
    branch-after-branch concatenation of prefix and draft slots and its running lengths written."""
    indices, indptr = kv_indices.clone(), kv_indptr.clone()
    rows, lens = req_pool_indices.cpu().tolist(), seq_lens.cpu().tolist()
    for i in range(num_steps):
        parts, sizes = [], []
        for row, n in zip(rows, lens, strict=True):
            for k in range(topk):
                draft = req_to_token[row, n + k * num_steps : n + k * num_steps + i + 1]
                parts += [req_to_token[row, :n], draft]
                sizes.append(n + i + 1)
        flat = torch.cat(parts).to(indices.dtype)
        indices[i, : flat.numel()] = flat
        indptr[i, 1 : len(sizes) + 1] = torch.tensor(sizes).cumsum(0).to(indptr.device, indptr.dtype)
    return indices, indptr


def _bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    b, _, topk, steps, page = draft_dims(case)
    table, rows, lens = inputs["req_to_token"], inputs["req_pool_indices"], inputs["seq_lens"]
    indices, indptr, pos = inputs["kv_indices"], inputs["kv_indptr"], inputs["positions"]

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn[(steps, b, topk)](
            rows,
            table,
            lens,
            indices,
            indptr,
            pos,
            table.shape[1],
            indices.shape[1],
            indptr.shape[1],
            next_pow2(b),
            next_pow2(steps),
            next_pow2(b * topk),
            page,
        )
        return indices, indptr

    return launch


@register
class DraftDecodeKVIndicesAdapter(Adapter):
    kernel = "generate_draft_decode_kv_indices"
    role = "spec"
    ops = ("eagle.draft_decode_kv_indices",)
    description = "EAGLE/NextN draft decode: every draft step's KV indices (FlashInfer MLA backend)"
    backends = [
        Backend(
            "triton",
            "sglang.kernels.ops.speculative.cache_locs:generate_draft_decode_kv_indices",
            "sglang",
            "triton",
            _bind,
            label="what SGLang 0.5.16 runs once per decode step (FlashInfer MLA draft backend)",
            note="FlashInferMLAMultiStepDraftBackend.common_template's launch: grid (num_steps, B, topk)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        b, kv_len, topk, steps, _ = draft_dims(case)
        gen = generator(seed)
        pool_rows = 2 * b + 1
        rows = torch.randperm(pool_rows - 1, generator=gen)[:b] + 1
        width = kv_len + topk * steps  # each row holds the prefix and every branch's draft slots
        table = randint(1, 1 << 22, (pool_rows, width), gen, device)
        lens = torch.full((b,), kv_len, dtype=torch.int64)
        return {
            "req_to_token": table,
            "req_pool_indices": rows.to(device),
            "seq_lens": lens.to(device),
            # the draft tokens' positions: each branch at its request's length
            "positions": lens.repeat_interleave(topk).to(device),
            "kv_indices": torch.zeros(
                (steps, (b * kv_len + b * steps) * topk), dtype=torch.int32, device=device
            ),
            "kv_indptr": torch.zeros((steps, b * topk + 1), dtype=torch.int32, device=device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        _, _, topk, steps, page = draft_dims(case)
        if topk > 1 and page > 1:
            raise ValueError("the reference models top-k 1 or pages of 1 only")
        return draft_kv_reference(
            inputs["req_to_token"],
            inputs["req_pool_indices"],
            inputs["seq_lens"],
            topk,
            steps,
            inputs["kv_indices"],
            inputs["kv_indptr"],
        )

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return exact_check(tuple(out), tuple(ref), ("kv_indices", "kv_indptr"))

    def traffic(self, case: Case) -> Traffic:
        b, kv_len, topk, steps, _ = draft_dims(case)
        copied = steps * b * topk * kv_len + b * topk * steps * (steps + 1) // 2
        return Traffic(
            bytes=2 * nbytes(copied, torch.int32) + nbytes(steps * b * topk, torch.int32),
            flops=0,
            note="each step reads and writes every branch's prefix and draft slots (int32), and writes "
            "kv_indptr; seq_lens, positions and req_pool_indices reads left out",
        )
