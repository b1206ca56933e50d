"""sgl-kernel's FlashMLA decode (`sgl_kernel.flash_mla.flash_mla_with_kvcache`), two ways:

- dense (op attn_mqa, DeepSeek-V3/R1): SGLang's flashmla attention backend on Hopper. q [B, 1, Nh, 576]
  bf16 against the bf16 latent cache seen as [pages, 64, 1, 576] (page size 64), a block table of 64-token
  pages, cache_seqlens, head_dim_v 512, causal, the scheduler metadata of `get_mla_metadata(seq_lens,
  Nh, 1)`. SGLang computes that metadata once per batch and reuses it in every layer, so the bind computes
  it once and the launch times the attention kernel alone.
- sparse (op nsa_backend.forward_decode, DeepSeek-V3.2): the dsa backend's `flashmla_kv` decode, the
  Hopper default with an FP8 KV cache. Each request attends to the `topk` (2048) tokens its indexer chose,
  given as token slots of the paged cache (`indices` [B, 1, topk], -1 where a request has fewer tokens).
  The cache is FlashMLA's FP8 layout, 656 bytes a token: 512 e4m3 values of c_kv, 4 fp32 scales (one per
  128 values), 64 bf16 k_pe values. q is zero-padded to 64 or 128 heads, as SGLang pads it.

Both share the MLA decode inputs (mla_decode.py): one cache of scattered 128-token pages, seen here as
64-token pages. The FlashMLA module preloads `sgl_kernel.flashmla_ops`, so an install without that
extension resolves to "not available in this install".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.attention.mla import case_softmax_scale
from dskbench.adapters.attention.mla_decode import PAGE, MlaDecode, sub_pages
from dskbench.adapters.backends import SM90_ONLY, Backend, Requirement
from dskbench.adapters.base import Traffic
from dskbench.adapters.common.inputs import device_generator, generator, normal
from dskbench.shapes.cases import Case

FLASHMLA_PAGE = 64  # SGLang's flashmla / dsa page size
FLASHMLA_EXTENSION = "sgl_kernel.flashmla_ops"  # the compiled module sgl_kernel/flash_mla.py imports
FP8_TILE = 128  # values of c_kv per fp32 scale in FlashMLA's FP8 cache
FP8_MAX = 448.0
FP8_DRAW_ROWS = 1 << 20  # tokens of the FP8 cache drawn and quantised at once
SM90_OR_SM100 = Requirement(windows=((90, 90), (100, 103)))  # FlashMLA's sparse kernels: sm90 and sm100


def fp8_row_bytes(lkv: int, rope: int) -> int:
    """Bytes of one token in FlashMLA's FP8 cache: e4m3 c_kv, one fp32 scale per 128 values, bf16 k_pe."""
    return lkv + 4 * (lkv // FP8_TILE) + 2 * rope


def is_sparse(case: Case) -> bool:
    return "topk" in case.dims


def padded_heads(nh: int) -> int:
    """Heads SGLang's flashmla_kv decode pads q to (flashmla_kv_num_q_heads)."""
    return 64 if nh <= 64 else 128 if nh <= 128 else nh


# -- FP8 cache ------------------------------------------------------------------------------------------


def quantize_fp8_rows(rows: torch.Tensor, lkv: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """[n, lkv + rope] bf16 -> [n, 656] float8_e4m3fn bytes in FlashMLA's layout (sglang's quantize_k_cache:
    scale = max|x| / 448 per 128-value tile, e4m3 = x / scale; k_pe kept in bf16), written into `out` when
    given. The tile maxima and the scaled e4m3 values are computed from the bf16 rows without an fp32 copy
    of them (a GPU casts inside the division)."""
    n, d = rows.shape
    tiles = lkv // FP8_TILE
    if out is None:
        out = torch.empty(n, fp8_row_bytes(lkv, d - lkv), dtype=torch.float8_e4m3fn, device=rows.device)
    b = out.view(torch.uint8)
    nope = rows[:, :lkv].view(n, tiles, FP8_TILE)
    scale = nope.abs().amax(dim=-1).float().clamp_min_(1e-30).div_(FP8_MAX)  # [n, tiles]; bf16 max is exact
    torch.div(nope, scale.unsqueeze(-1), out=out[:, :lkv].view(n, tiles, FP8_TILE))
    b[:, lkv : lkv + 4 * tiles] = scale.view(torch.uint8)
    b[:, lkv + 4 * tiles :] = rows[:, lkv:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return out


def dequantize_fp8_rows(cache: torch.Tensor, lkv: int) -> torch.Tensor:
    """[n, 656] FlashMLA FP8 rows -> [n, lkv + rope] fp32 (what the kernel computes with)."""
    b = cache.view(torch.uint8)
    n = b.shape[0]
    tiles = lkv // FP8_TILE
    nope = b[:, :lkv].contiguous().view(torch.float8_e4m3fn).float().view(n, tiles, FP8_TILE)
    scale = b[:, lkv : lkv + 4 * tiles].contiguous().view(torch.float32)
    rope = b[:, lkv + 4 * tiles :].contiguous().view(torch.bfloat16).float()
    return torch.cat([(nope * scale.unsqueeze(-1)).view(n, lkv), rope], dim=1)


def sparse_indices(
    page_table: torch.Tensor, seq_lens: torch.Tensor, topk: int, gen: torch.Generator
) -> torch.Tensor:
    """[B, 1, topk] int32 token slots: min(len, topk) distinct tokens of each request (random, as an
    indexer's choice), -1 after them.

    Drawn on the page table's device without a host loop: each token position gets a random key (positions
    past the request's length key below any draw), a request keeps the positions of its top-k keys and
    maps them through its page table."""
    b, dev = seq_lens.numel(), seq_lens.device
    n_max = page_table.shape[1] * PAGE
    k = min(topk, n_max)
    keys = torch.rand((b, n_max), generator=device_generator(gen, str(dev)), device=dev)
    keys.masked_fill_(torch.arange(n_max, device=dev) >= seq_lens.unsqueeze(1), -1.0)
    pos = keys.topk(k, dim=1).indices  # [B, k]: the valid positions first, in random order
    slots = page_table.long().gather(1, pos // PAGE) * PAGE + pos % PAGE
    valid = torch.arange(k, device=dev) < seq_lens.clamp(max=topk).unsqueeze(1)
    out = torch.full((b, 1, topk), -1, dtype=torch.int32, device=dev)
    out[:, 0, :k] = slots.masked_fill_(~valid, -1).to(torch.int32)
    return out


# fp32 elements of gathered cache rows per chunk of queries: a GPU amortises its launches over 256 MiB
# chunks; a CPU computes no faster in chunks larger than its caches
SPARSE_GATHER_ELEMS = {"cuda": 1 << 26, "cpu": 1 << 22}


def sparse_reference(
    q: torch.Tensor,
    rows_fp32: Callable[[torch.Tensor], torch.Tensor],
    indices: torch.Tensor,
    scale: float,
    dv: int,
) -> torch.Tensor:
    """softmax(q . rows^T * scale) @ rows[:, :dv] over each query's valid indices (>= 0), fp32.
    q [N, H, 576], indices [N, topk] -> [N, H, dv]; `rows_fp32` maps slots to fp32 cache rows.

    Queries go in chunks (one launch sequence per chunk, not per query): each gathers its [topk] rows,
    invalid ones as row 0 with a -inf score (softmax weight exactly 0), and columns no query of the chunk
    uses are dropped. A query without any valid index gets zeros."""
    n, h, d = q.shape
    out = torch.empty(n, h, dv, dtype=torch.float32, device=q.device)
    budget = SPARSE_GATHER_ELEMS.get(q.device.type, SPARSE_GATHER_ELEMS["cuda"])
    step = max(1, budget // (indices.shape[1] * d))
    for s in range(0, n, step):
        idx = indices[s : s + step]
        valid = idx >= 0
        used = valid.any(0).nonzero()
        if used.numel() == 0:
            out[s : s + step] = 0.0
            continue
        width = int(used[-1]) + 1
        idx, valid = idx[:, :width], valid[:, :width]
        c = idx.shape[0]
        rows = rows_fp32(idx.clamp_min(0).long().flatten()).view(c, width, -1)  # [c, width, 576]
        scores = torch.bmm(q[s : s + c].float(), rows.transpose(1, 2)) * scale  # [c, H, width]
        scores.masked_fill_(~valid.unsqueeze(1), float("-inf"))
        p = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # all -inf (no valid index) -> zeros
        out[s : s + c] = torch.bmm(p, rows[..., :dv])
    return out


# -- backends -------------------------------------------------------------------------------------------


def _flash_mla_module(fn: Any) -> Any:
    """The module `fn` came from (get_mla_metadata lives beside flash_mla_with_kvcache)."""
    import importlib

    return importlib.import_module(fn.__module__)


def _bind_dense(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """FlashMLABackend.forward_decode, bf16: metadata once, then one flash_mla_with_kvcache per launch."""
    q, kv = inputs["q"], inputs["kv_cache"]
    b, nh, dqk = q.shape
    lkv = int(case.dims["Lkv"])
    seq_lens = inputs["seq_lens"]
    meta, splits = _flash_mla_module(fn).get_mla_metadata(seq_lens, nh, 1)
    kw = {
        "q": q.view(b, 1, nh, dqk),
        "k_cache": kv.view(-1, FLASHMLA_PAGE, 1, dqk),
        "block_table": sub_pages(inputs["page_table"], FLASHMLA_PAGE),
        "cache_seqlens": seq_lens,
        "head_dim_v": lkv,
        "tile_scheduler_metadata": meta,
        "num_splits": splits,
        "softmax_scale": case_softmax_scale(case),
        "causal": True,
    }

    def launch() -> torch.Tensor:
        out, _ = fn(**kw)
        return out.view(b, nh, lkv)

    return launch


def sparse_decode_args(inputs: dict[str, Any], case: Case) -> dict[str, Any]:
    """flash_mla_with_kvcache's arguments in _forward_flashmla_kv (metadata excluded)."""
    q, kv = inputs["q"], inputs["kv_cache"]
    b, nh, dqk = q.shape
    heads = padded_heads(nh)
    qp = q.new_zeros(b, 1, heads, dqk)
    qp[:, 0, :nh] = q
    return {
        "q": qp,
        "k_cache": kv.view(-1, FLASHMLA_PAGE, 1, kv.shape[-1]),
        "block_table": torch.empty(b, 0, dtype=torch.int32, device=q.device),
        "cache_seqlens": inputs["cache_seqlens"],
        "head_dim_v": int(case.dims["Lkv"]),
        "softmax_scale": case_softmax_scale(case),
        "indices": inputs["indices"],
        "is_fp8_kvcache": True,
    }


def _bind_sparse(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    kw = sparse_decode_args(inputs, case)
    b, nh, _ = inputs["q"].shape
    heads, topk = kw["q"].shape[2], int(case.dims["topk"])
    meta, splits = _flash_mla_module(fn).get_mla_metadata(
        cache_seqlens=kw["cache_seqlens"],
        num_q_tokens_per_head_k=heads,
        num_heads_k=1,
        num_heads_q=heads,
        is_fp8_kvcache=True,
        topk=topk,
    )

    def launch() -> torch.Tensor:
        out, _ = fn(tile_scheduler_metadata=meta, num_splits=splits, **kw)
        return out[:, 0, :nh]

    return launch


def _bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    return (_bind_sparse if is_sparse(case) else _bind_dense)(fn, inputs, case)


@register
class FlashMlaWithKvcache(MlaDecode):
    kernel = "flash_mla_with_kvcache"
    description = (
        "FlashMLA decode (sgl_kernel.flash_mla): dense bf16, page 64, as SGLang's flashmla backend runs "
        "DeepSeek-V3/R1; sparse FP8-KV at index_topk, as the dsa backend's flashmla_kv runs DeepSeek-V3.2"
    )
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.flash_mla:flash_mla_with_kvcache",
            None,
            "aot",
            _bind,
            requires=SM90_ONLY,
            preload=(FLASHMLA_EXTENSION,),
            label="dense: bf16 q/KV, page 64, causal; sparse: FP8 KV (656 B/token), indices [B, 1, topk]; "
            "get_mla_metadata once per input set (untimed, as SGLang shares it across layers)",
        )
    ]

    def skip_reason(self, case: Case) -> str | None:
        if is_sparse(case) and int(case.dims["Nh"]) > 128:
            return f"FlashMLA sparse decode pads q to 64 or 128 heads; {case.dims['Nh']} heads"
        return super().skip_reason(case)

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        inputs = super().make_inputs(case, device, seed)
        if not is_sparse(case):
            return inputs
        topk, gen = int(case.dims["topk"]), generator(seed + 1)
        inputs["indices"] = sparse_indices(inputs["page_table"], inputs["seq_lens"], topk, gen)
        inputs["cache_seqlens"] = inputs["seq_lens"].clamp(max=topk)  # compute_dsa_seqlens
        return inputs

    def kv_cache(self, tokens: int, case: Case, gen: torch.Generator, device: str) -> torch.Tensor:
        """Sparse: FlashMLA's FP8 cache, quantised from bf16 rows drawn FP8_DRAW_ROWS tokens at a time
        (no full bf16 cache beside it)."""
        if not is_sparse(case):
            return super().kv_cache(tokens, case, gen, device)
        lkv, dr = int(case.dims["Lkv"]), int(case.dims["Dr"])
        out = torch.empty(tokens, fp8_row_bytes(lkv, dr), dtype=torch.float8_e4m3fn, device=device)
        for s in range(0, tokens, FP8_DRAW_ROWS):
            n = min(FP8_DRAW_ROWS, tokens - s)
            quantize_fp8_rows(normal((n, lkv + dr), gen, device), lkv, out[s : s + n])
        return out

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        if not is_sparse(case):
            return super().reference(inputs, case)
        lkv = int(case.dims["Lkv"])
        cache = inputs["kv_cache"]
        return sparse_reference(
            inputs["q"],
            lambda idx: dequantize_fp8_rows(cache[idx], lkv),
            inputs["indices"][:, 0],
            case_softmax_scale(case),
            lkv,
        )

    def traffic(self, case: Case) -> Traffic:
        if not is_sparse(case):
            return super().traffic(case)
        d = case.dims
        b, nh, kv_len, lkv, dr = int(d["B"]), int(d["Nh"]), int(d["kv_len"]), int(d["Lkv"]), int(d["Dr"])
        k = min(kv_len, int(d["topk"]))
        dqk = lkv + dr
        byts = b * k * (fp8_row_bytes(lkv, dr) + 4) + b * nh * (dqk + lkv) * 2 + 4 * b
        flops = b * 2 * nh * k * (dqk + lkv)
        return Traffic(byts, flops, "gathered FP8 KV rows (656 B) + their int32 indices + q + out")
