"""`assign_req_to_token_pool`: the draft tokens' KV slots into the request-to-token table, every
EAGLE/NextN decode step.

SGLang 0.5.16's `alloc_for_spec_decode` (sglang/srt/mem_cache/allocation.py, called by
eagle_prepare_for_decode) allocates each request's new KV slots `out_cache_loc` (int64, request after
request) and records them with `assign_req_to_token_pool_func(req_pool_indices, req_to_token, cur_kv_lens,
nxt_kv_lens, out_cache_loc, B)`, which launches `assign_req_to_token_pool[(B,)](..., pool_len,
next_power_of_2(B))`: request b's row `req_to_token[req_pool_indices[b]]` gets, at positions
cur_kv_lens[b] to nxt_kv_lens[b], the next nxt - cur slots of out_cache_loc (int32 table).

In place: the launcher returns the whole table, checked exactly against the reference's copy with those
entries written (every other entry as it was).
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


def assign_dims(case: Case) -> tuple[int, int, int]:
    """(requests, new slots per request, req_to_token row width)."""
    d = case.dims
    return int(d["B"]), int(d["new"]), int(d["pool_len"])


def assign_reference(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    start: torch.Tensor,
    end: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> torch.Tensor:
    """A copy of the table with row req_pool_indices[b], columns start[b]:end[b], set to the next
    end[b] - start[b] entries of out_cache_loc (requests in batch order)."""
    out = req_to_token.clone()
    rows, s, e = (t.cpu().tolist() for t in (req_pool_indices, start, end))
    locs = out_cache_loc.to(out.device, out.dtype)
    cursor = 0
    for row, a, b in zip(rows, s, e, strict=True):
        out[row, a:b] = locs[cursor : cursor + (b - a)]
        cursor += b - a
    return out


def _bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    table, rows = inputs["req_to_token"], inputs["req_pool_indices"]
    start, end, locs = inputs["start_offset"], inputs["end_offset"], inputs["out_cache_loc"]
    b = rows.shape[0]

    def launch() -> torch.Tensor:
        fn[(b,)](rows, table, start, end, locs, table.shape[1], next_pow2(b))
        return table

    return launch


@register
class AssignReqToTokenPoolAdapter(Adapter):
    kernel = "assign_req_to_token_pool"
    role = "kv_alloc"
    ops = ("eagle.alloc_for_spec_decode",)
    description = "EAGLE/NextN decode step: each request's new KV slots into its req_to_token row"
    backends = [
        Backend(
            "triton",
            "sglang.srt.mem_cache.allocation:assign_req_to_token_pool",
            "sglang",
            "triton",
            _bind,
            label="what SGLang 0.5.16 runs every speculative decode step",
            note="assign_req_to_token_pool_func's launch: one program per request",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        b, new, pool_len = assign_dims(case)
        gen = generator(seed)
        pool_rows = 2 * b + 1  # the request pool holds more rows than the batch uses
        rows = torch.randperm(pool_rows - 1, generator=gen)[:b] + 1
        start = torch.randint(0, pool_len - new + 1, (b,), generator=gen, dtype=torch.int32)
        n = b * new
        locs = torch.randperm(max(4 * n, 1024), generator=gen)[:n] + 1  # unique KV slots, 0 is padding
        table = randint(0, 1 << 20, (pool_rows, pool_len), gen, device)
        return {
            "req_to_token": table,
            "req_pool_indices": rows.to(device),
            "start_offset": start.to(device),
            "end_offset": (start + new).to(device),
            "out_cache_loc": locs.to(device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return assign_reference(
            inputs["req_to_token"],
            inputs["req_pool_indices"],
            inputs["start_offset"],
            inputs["end_offset"],
            inputs["out_cache_loc"],
        )

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return exact_check((out,), (ref,), ("req_to_token",))

    def traffic(self, case: Case) -> Traffic:
        b, new, _ = assign_dims(case)
        return Traffic(
            bytes=nbytes(b, torch.int64)
            + nbytes(2 * b, torch.int32)
            + nbytes(b * new, torch.int64)
            + nbytes(b * new, torch.int32),
            flops=0,
            note="read req_pool_indices, the start/end offsets and out_cache_loc; write B x new int32 table "
            "entries (each program also rereads the offsets before it for its prefix sum)",
        )
