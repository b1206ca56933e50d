"""`create_flashinfer_kv_indices_triton`: the flat KV-index list the FlashInfer MLA backend plans its
decode attention over, every decode step.

SGLang 0.5.16's `FlashInferMLAIndicesUpdaterDecode.call_begin_forward` (flashinfer_mla_backend.py) sets
`kv_indptr[1:] = cumsum(seq_lens)` and launches `create_flashinfer_kv_indices_triton[(B,)](req_to_token,
req_pool_indices, seq_lens, kv_indptr, None, kv_indices, req_to_token.shape[1])`
(sglang/kernels/ops/kvcache/kv_indices.py): request b's cached slots `req_to_token[req_pool_indices[b],
:seq_lens[b]]` go to `kv_indices[kv_indptr[b]:]`, so kv_indices is every request's slots, request after
request (int32). The reference concatenates the same rows with torch; outputs are compared exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common.inputs import exact_check, generator, nbytes, randint
from dskbench.shapes.cases import Case


def indices_dims(case: Case) -> tuple[int, int]:
    """(requests, context length of each)."""
    return int(case.dims["B"]), int(case.dims["kv_len"])


def kv_indices_reference(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
) -> torch.Tensor:
    """Every request's first seq_lens[b] entries of its req_to_token row, request after request (int32)."""
    rows, lens = req_pool_indices.cpu().tolist(), seq_lens.cpu().tolist()
    parts = [req_to_token[row, :n] for row, n in zip(rows, lens, strict=True)]
    return torch.cat(parts).to(torch.int32)


def _bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    table, rows, lens, indptr = (
        inputs[k] for k in ("req_to_token", "req_pool_indices", "seq_lens", "kv_indptr")
    )
    b, kv_len = indices_dims(case)
    out = torch.zeros((b * kv_len,), dtype=torch.int32, device=table.device)

    def launch() -> torch.Tensor:
        fn[(b,)](table, rows, lens, indptr, None, out, table.shape[1])
        return out

    return launch


@register
class FlashInferKVIndicesAdapter(Adapter):
    kernel = "create_flashinfer_kv_indices_triton"
    role = "kv_indices"
    ops = ("flashinfer_mla.kv_indices",)
    description = "FlashInfer MLA decode planning: every request's KV slots as one flat index list"
    backends = [
        Backend(
            "triton",
            "sglang.kernels.ops.kvcache.kv_indices:create_flashinfer_kv_indices_triton",
            "sglang",
            "triton",
            _bind,
            label="what SGLang 0.5.16's FlashInfer MLA backend runs every decode step",
            note="call_begin_forward's launch: one program per request, no start offsets",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        b, kv_len = indices_dims(case)
        gen = generator(seed)
        pool_rows = 2 * b + 1
        rows = torch.randperm(pool_rows - 1, generator=gen)[:b] + 1
        table = randint(1, 1 << 22, (pool_rows, kv_len), gen, device)
        lens = torch.full((b,), kv_len, dtype=torch.int64)
        indptr = torch.zeros((b + 1,), dtype=torch.int32)
        indptr[1:] = lens.cumsum(0)
        return {
            "req_to_token": table,
            "req_pool_indices": rows.to(device),
            "seq_lens": lens.to(device),
            "kv_indptr": indptr.to(device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return kv_indices_reference(inputs["req_to_token"], inputs["req_pool_indices"], inputs["seq_lens"])

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return exact_check((out,), (ref,), ("kv_indices",))

    def traffic(self, case: Case) -> Traffic:
        b, kv_len = indices_dims(case)
        return Traffic(
            bytes=2 * nbytes(b * kv_len, torch.int32) + nbytes(2 * b, torch.int64) + nbytes(b, torch.int32),
            flops=0,
            note="read each request's kv_len req_to_token entries and write them to kv_indices (int32); "
            "read req_pool_indices, seq_lens and kv_indptr",
        )
