"""DeepSeek-V3.2 sparse-attention (NSA/DSA) top-k: `fast_topk_v2`, `fast_topk_transform_fused`,
`fast_topk_transform_ragged_fused` (sgl_kernel/top_k.py).

The indexer scores every KV position for each query token (fp32 logits); these kernels keep the
`index_topk` (2048) best positions of each row's valid section [row_start, row_start + length). SGLang
0.5.16 calls them from DSATopKBackend (sglang/srt/layers/attention/dsa/dsa_topk_backend.py):
- `fast_topk_v2(score, lengths, topk, row_starts)`: the unfused path; row-local indices.
- `fast_topk_transform_fused(score, lengths, page_table_size_1, cu_seqlens_q, topk, row_starts)`: the
  PAGED transform; each chosen position is mapped through its request's page-size-1 page table.
- `fast_topk_transform_ragged_fused(score, lengths, topk_indices_offset, topk, row_starts)`: the RAGGED
  transform of an extend; position + the request's offset in the ragged KV (cu_seqlens_k[b]).
Rows with fewer valid positions than topk are padded with -1.

Decode: one query row per request, score [B, kv_len], lengths spread from kv_len down to kv_len/2, no
row_starts. Prefill (extend without prefix): `reqs` requests of T/reqs tokens each; the score is
[T, T] (the requests' KV laid end to end, as fp8_mqa_logits writes it), row_starts = the request's KV
start, lengths = causal position + 1.

The check allows ties: a row is right when it holds min(length, topk) distinct valid positions, every
position scoring above the k-th score is among them, and none scores below it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common.inputs import device_generator, generator, randn
from dskbench.shapes.cases import Case

PAGED, RAGGED, PLAIN = "paged", "ragged", "plain"


def layout(case: Case) -> tuple[int, int, int, int]:
    """(rows T, requests, score width, request-local width) of a case."""
    t, reqs, width = int(case.dims["T"]), int(case.dims["reqs"]), int(case.dims["max_len"])
    if t % reqs:
        raise ValueError(f"{t} tokens do not split into {reqs} equal requests")
    return t, reqs, width, width if reqs == t else t // reqs


def row_lengths(case: Case) -> list[int]:
    """Valid positions per row: decode spreads kv_len .. kv_len/2; prefill is causal (position + 1)."""
    t, reqs, _, local = layout(case)
    if reqs == t:
        return [local - (i * local) // (2 * t) for i in range(t)]
    return [i % local + 1 for i in range(t)]


def make_topk_inputs(case: Case, device: str, seed: int) -> dict[str, Any]:
    t, reqs, width, local = layout(case)
    gen = generator(seed)
    rows = torch.arange(t)
    batch = rows if reqs == t else rows // local
    starts = torch.zeros(t, dtype=torch.int32) if reqs == t else (batch * local).to(torch.int32)
    perm = torch.randperm(reqs * local, generator=device_generator(gen, device), device=device)
    inputs = {
        "score": randn((t, width), gen, device, torch.float32),
        "lengths": torch.tensor(row_lengths(case), dtype=torch.int32, device=device),
        # SGLang passes row_starts (ks) in an extend; decode rows start at 0 and pass None
        "row_starts": None if reqs == t else starts.to(device),
        # page_table_1 [requests, local]: distinct KV slots (page size 1)
        "page_table": perm.to(torch.int32).view(reqs, local),
        "cu_seqlens_q": torch.arange(0, t + 1, t // reqs, dtype=torch.int32, device=device),
        "offsets": starts.to(device),  # topk_indices_offset: cu_seqlens_k[b] repeated per token
        "batch": batch.to(device),
        "topk": int(case.dims["topk"]),
    }
    return inputs


def masked_topk(inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Row-local top-k of each row's valid section: indices (-1 padded), the k-th score, local scores."""
    score, lengths, k = inputs["score"], inputs["lengths"].long(), inputs["topk"]
    local = inputs["page_table"].shape[1]
    t = score.shape[0]
    starts = inputs["row_starts"]
    col = torch.arange(local, device=score.device)
    src = col[None, :].expand(t, local) + (starts.long()[:, None] if starts is not None else 0)
    vals = score.float().gather(1, src.clamp_max(score.shape[1] - 1))
    vals = vals.masked_fill(col[None, :] >= lengths[:, None], float("-inf"))
    kk = min(k, local)
    top, idx = torch.topk(vals, kk, dim=1)
    idx = idx.masked_fill(top == float("-inf"), -1).to(torch.int32)
    out = torch.full((t, k), -1, dtype=torch.int32, device=score.device)
    out[:, :kk] = idx
    kth = torch.where(lengths > k, top[:, -1], torch.full_like(top[:, -1], float("-inf")))
    return {"local": out, "kth": kth, "scores": vals, "lengths": lengths.to(torch.int32)}


def transform(local: torch.Tensor, inputs: dict[str, Any], method: str) -> torch.Tensor:
    """What the kernel writes for row-local indices: the same, a page-table entry, or index + offset."""
    valid = local >= 0
    if method == PLAIN:
        return local
    if method == RAGGED:
        return torch.where(valid, local + inputs["offsets"][:, None], local)
    pt = inputs["page_table"].long()
    slots = pt[inputs["batch"][:, None], local.long().clamp_min(0)].to(torch.int32)
    return torch.where(valid, slots, local)


def to_local(out: torch.Tensor, ref: dict[str, Any], method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-local positions of a kernel's output, and a mask of entries that map to no position of the row."""
    o = out.long()
    valid = o >= 0
    if method == PLAIN:
        return o, torch.zeros_like(valid)
    if method == RAGGED:
        return o - ref["offsets"].long()[:, None], torch.zeros_like(valid)
    inv, width = ref["inverse"], ref["local_width"]
    flat = inv[o.clamp(0, inv.numel() - 1)]
    foreign = valid & ((o >= inv.numel()) | (flat // width != ref["batch"].long()[:, None]))
    return flat % width, foreign


def check_topk(out: Any, ref: dict[str, Any], method: str) -> Check:
    """Index sets with ties allowed; `error` is the fraction of wrong rows."""
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref["out"].shape):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return Check(False, float("inf"), 0.0, f"output {shape}, expected {tuple(ref['out'].shape)}")
    out = out.to(ref["out"].device)
    k = out.shape[1]
    valid = out >= 0
    local, foreign = to_local(out, ref, method)
    lengths, kth, scores = ref["lengths"].long(), ref["kth"], ref["scores"]
    in_row = valid & (local >= 0) & (local < lengths[:, None]) & ~foreign
    safe = torch.where(in_row, local, 0)
    got = scores.gather(1, safe)
    count_ok = valid.sum(1) == lengths.clamp_max(k)
    range_ok = (in_row == valid).all(1)
    key = torch.where(in_row, local, scores.shape[1] + torch.arange(k, device=out.device)[None, :])
    srt = key.sort(1).values
    unique_ok = (srt[:, 1:] != srt[:, :-1]).all(1)
    above_ok = (~in_row | (got >= kth[:, None])).all(1)
    n_greater = (scores > kth[:, None]).sum(1)
    greater_ok = (in_row & (got > kth[:, None])).sum(1) == n_greater
    rows = count_ok & range_ok & unique_ok & above_ok & greater_ok
    bad = int((~rows).sum())
    err = bad / max(1, out.shape[0])
    parts = {
        "count": count_ok,
        "range/page": range_ok,
        "duplicate": unique_ok,
        "below-kth": above_ok,
        "missing": greater_ok,
    }
    detail = " ".join(f"{n}:{int((~m).sum())}" for n, m in parts.items() if not bool(m.all()))
    return Check(bad == 0, err, 0.0, f"{bad}/{out.shape[0]} rows wrong" + (f" ({detail})" if detail else ""))


def _row_starts(inputs: dict[str, Any]) -> Any:
    return inputs["row_starts"]


def _bind_v2(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # fast_topk_v2(score, lengths, topk, row_starts=None) -> int32 [T, topk]
    s, n, k, rs = inputs["score"], inputs["lengths"], inputs["topk"], _row_starts(inputs)
    return lambda: fn(s, n, k, row_starts=rs)


def _bind_paged(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # fast_topk_transform_fused(score, lengths, page_table_size_1, cu_seqlens_q, topk, row_starts=None)
    s, n, pt, cu, k = (inputs[x] for x in ("score", "lengths", "page_table", "cu_seqlens_q", "topk"))
    rs = _row_starts(inputs)
    return lambda: fn(score=s, lengths=n, page_table_size_1=pt, cu_seqlens_q=cu, topk=k, row_starts=rs)


def _bind_ragged(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # fast_topk_transform_ragged_fused(score, lengths, topk_indices_offset, topk, row_starts=None)
    s, n, off, k, rs = (inputs[x] for x in ("score", "lengths", "offsets", "topk", "row_starts"))
    return lambda: fn(score=s, lengths=n, topk_indices_offset=off, topk=k, row_starts=rs)


def _bind_fi_paged(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # flashinfer.top_k_page_table_transform(input, src_page_table, lengths, k, row_to_batch=None, ...),
    # as SGLang's flashinfer DSA top-k backend calls it for a decode (one row per request)
    s, pt, n, k = inputs["score"], inputs["page_table"], inputs["lengths"], inputs["topk"]
    return lambda: fn(s, pt, n, k, row_to_batch=None, deterministic=False, tie_break=0, dsa_graph_safe=True)


def _bind_fi_ragged(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # flashinfer.top_k_ragged_transform(input, offsets, lengths, k, ..., row_starts=None)
    s, off, n, k, rs = (inputs[x] for x in ("score", "offsets", "lengths", "topk", "row_starts"))
    return lambda: fn(s, off, n, k, deterministic=False, tie_break=0, dsa_graph_safe=True, row_starts=rs)


def _decode_only(case: Case) -> str | None:
    t, reqs, _, _ = layout(case)
    if reqs != t:
        return "flashinfer's page-table transform indexes the page table from row_starts; measured at decode"
    return None


class _TopkBase(Adapter):
    """Shared inputs, reference, check and traffic of the three top-k kernels."""

    role = "dsa_topk"
    method = PLAIN

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return make_topk_inputs(case, device, seed)

    def reference(self, inputs: dict[str, Any], case: Case) -> dict[str, Any]:
        ref: dict[str, Any] = masked_topk(inputs)
        ref["out"] = transform(ref["local"], inputs, self.method)
        ref.update(
            offsets=inputs["offsets"], batch=inputs["batch"], local_width=inputs["page_table"].shape[1]
        )
        if self.method == PAGED:
            flat = inputs["page_table"].flatten().long()
            inv = torch.empty_like(flat)
            inv[flat] = torch.arange(flat.numel(), device=flat.device)
            ref["inverse"] = inv
        return ref

    def reference_output(self, ref: Any) -> Any:
        return ref["out"]

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return check_topk(out, ref, self.method)

    def traffic(self, case: Case) -> Traffic:
        """Minimum bytes of one call; the kernels do no FLOP worth counting.

        A row with at most `topk` valid positions needs no score: its answer is every valid position,
        written without a read (the kernels take such rows on a separate path that only writes indices).
        So scores are read only for rows longer than `topk`, each such row's valid section once (fp32).
        Every row reads its length, and its row start where one is given (an extend); the RAGGED
        transform reads the row's offset, the PAGED one the query offsets and one page-table entry per
        chosen position (min(length, topk) of them). Every row writes `topk` int32 indices (-1 padded).
        """
        t, reqs, _, _ = layout(case)
        k = int(case.dims["topk"])
        lengths = row_lengths(case)
        scores = 4 * sum(n for n in lengths if n > k)
        per_row = 1 + (reqs != t) + (self.method == RAGGED)  # length, row start, offset (int32 each)
        meta = 4 * t * per_row + (4 * (reqs + 1) if self.method == PAGED else 0)
        gather = 4 * sum(min(n, k) for n in lengths) if self.method == PAGED else 0
        note = "read the valid scores of rows longer than topk (shorter rows need none), lengths"
        note += " and row starts" if reqs != t else ""
        note += {RAGGED: " and offsets", PAGED: "; gather one page-table entry per chosen index"}.get(
            self.method, ""
        )
        return Traffic(bytes=scores + meta + gather + 4 * t * k, note=note + "; write topk int32 indices")


@register
class FastTopkV2Adapter(_TopkBase):
    kernel = "fast_topk_v2"
    ops = ("nsa_backend.forward_decode",)
    description = "DeepSeek-V3.2 indexer top-2048 of each row's valid scores (row-local indices)"
    backends = [Backend("sgl_kernel", "sgl_kernel:fast_topk_v2", None, "aot", _bind_v2)]


@register
class FastTopkTransformFusedAdapter(_TopkBase):
    kernel = "fast_topk_transform_fused"
    ops = ("nsa_backend.forward_decode",)
    method = PAGED
    description = "DeepSeek-V3.2 top-2048 mapped through the page-size-1 page table (PAGED transform)"
    backends = [
        Backend("sgl_kernel", "sgl_kernel:fast_topk_transform_fused", None, "aot", _bind_paged),
        Backend(
            "flashinfer",
            "flashinfer:top_k_page_table_transform",
            None,
            "jit",
            _bind_fi_paged,
            skip=_decode_only,
            note="SGLang's flashinfer DSA top-k backend (--dsa-topk-backend flashinfer)",
        ),
    ]


@register
class FastTopkTransformRaggedFusedAdapter(_TopkBase):
    kernel = "fast_topk_transform_ragged_fused"
    ops = ("nsa_backend.forward_extend",)
    method = RAGGED
    description = "DeepSeek-V3.2 top-2048 as indices into the extend's ragged KV (RAGGED transform)"
    backends = [
        Backend("sgl_kernel", "sgl_kernel:fast_topk_transform_ragged_fused", None, "aot", _bind_ragged),
        Backend(
            "flashinfer",
            "flashinfer:top_k_ragged_transform",
            None,
            "jit",
            _bind_fi_ragged,
            note="SGLang's flashinfer DSA top-k backend (--dsa-topk-backend flashinfer)",
        ),
    ]

    def applies(self, case: Case) -> bool:
        # SGLang uses the RAGGED transform only in an extend (topk_indices_offset is extend metadata)
        t, reqs, _, _ = layout(case)
        return reqs != t
