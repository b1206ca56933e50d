"""moe_align_block_size: sort (token, slot) pairs by expert, padded per expert to the MoE
block, with the block-size rule and buffer length SGLang uses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.moe.inputs import routing, topk
from dskbench.adapters.moe.reference import check_segments, torch_op
from dskbench.shapes.cases import Case


def marlin_block_size_m(num_tokens: int, top_k: int, num_experts: int) -> int:
    """moe_align block size of SGLang's Marlin MoE (fused_marlin_moe.py), what sm90 runs for NVFP4."""
    for bs in (8, 16, 32, 48, 64):
        if num_tokens * top_k / num_experts / bs < 0.9:
            return bs
    return 64


def align_max_padded(numel: int, num_buckets: int, block_size: int) -> int:
    """Length of sorted_token_ids SGLang allocates (moe_align_block_size.py; buckets = E + 1)."""
    if numel < num_buckets:
        return numel * block_size
    return numel + num_buckets * (block_size - 1)


def moe_align_reference(
    topk_ids: torch.Tensor, num_experts: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Canonical (sorted_token_ids, expert_ids of the used blocks, num_tokens_post_pad), returned on the CPU.

    Tokens of expert e fill its block-padded segment in ascending flat index (the kernel's order inside a
    segment is arbitrary), padding slots and the tail hold numel; ids are real experts (no -1 bucket used).
    Computed where the ids live (one stable sort, a scatter-add and two cumsums, no host sync) and copied
    back once: on a GPU box the CPU is shared with compilers, and torch's multi-threaded CPU sort and
    scatter over 32k+ ids were slowed there to seconds.
    """
    dev = topk_ids.device
    flat = topk_ids.flatten().long()
    numel = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount would sync to size its output
    padded = (counts + block_size - 1) // block_size * block_size
    seg_start = torch.cumsum(padded, 0) - padded
    first_row = torch.cumsum(counts, 0) - counts  # expert e's first row in the stable sort
    experts, order = torch.sort(flat, stable=True)
    slot = seg_start[experts] + torch.arange(numel, device=dev) - first_row[experts]
    max_pad = align_max_padded(numel, num_experts + 1, block_size)
    sorted_ids = torch.full((max_pad,), numel, dtype=torch.int32, device=dev)
    sorted_ids[slot] = order.to(torch.int32)
    sorted_ids, padded = sorted_ids.cpu(), padded.cpu()
    expert_ids = torch.repeat_interleave(torch.arange(num_experts, dtype=torch.int32), padded // block_size)
    return sorted_ids, expert_ids, padded.sum().reshape(1).to(torch.int32)


def _align_buffers(topk_ids: torch.Tensor, num_experts: int, block_size: int) -> list[torch.Tensor]:
    max_pad = align_max_padded(topk_ids.numel(), num_experts + 1, block_size)
    dev = topk_ids.device
    return [
        torch.empty(max_pad, dtype=torch.int32, device=dev),
        torch.empty(-(-max_pad // block_size), dtype=torch.int32, device=dev),
        torch.empty(1, dtype=torch.int32, device=dev),
        torch.empty(num_experts + 2, dtype=torch.int32, device=dev),
    ]


def _align_binder(with_ignore_flag: bool) -> Callable[[Any, dict[str, Any], Case], Callable[[], Any]]:
    def bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        ids, e, bs = inputs["topk_ids"], int(case.dims["E"]), MoeAlignBlockSize.block_size(case)
        sorted_ids, expert_ids, n_post, cumsum = _align_buffers(ids, e, bs)
        extra = (False,) if with_ignore_flag else ()

        def launch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            # num_experts + 1 and pad_sorted_token_ids=True, as SGLang's moe_align_block_size helper
            fn(ids, e + 1, bs, sorted_ids, expert_ids, n_post, cumsum, True, *extra)
            return sorted_ids, expert_ids, n_post

        return launch

    return bind


@register
class MoeAlignBlockSize(Adapter):
    kernel = "moe_align_block_size"
    role = "moe"
    ops = ("experts",)
    description = (
        "Sort (token, slot) pairs by expert, padded per expert to the MoE block (Marlin's block size)"
    )
    backends = [
        Backend(
            "sgl_kernel",
            torch_op("moe_align_block_size"),
            None,
            "aot",
            _align_binder(True),
            preload=("sgl_kernel",),
        ),
        Backend(
            "sglang.ops",
            "sglang.kernels.ops.moe:moe_align_block_size",
            None,
            "aot",
            _align_binder(False),
            dispatches_to="sgl_kernel:moe_align_block_size",
            label="what SGLang 0.5.16 calls (kernel registry -> sgl-kernel AOT)",
        ),
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.moe_align:moe_align_block_size",
            None,
            "jit",
            _align_binder(False),
            label="JIT twin (SGLang uses it only with its LoRA align flag)",
        ),
    ]

    @staticmethod
    def block_size(case: Case) -> int:
        return marlin_block_size_m(int(case.dims["T"]), topk(case), int(case.dims["E"]))

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return {"topk_ids": routing(case, device, seed).topk_ids}

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, ...]:
        return moe_align_reference(inputs["topk_ids"], int(case.dims["E"]), self.block_size(case))

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        o_sorted, o_eids, o_post = (x.cpu() for x in out)
        r_sorted, r_eids, r_post = ref
        bs = self.block_size(case)
        if not torch.equal(o_post, r_post):
            return Check(False, 1.0, 0.0, f"num_tokens_post_pad {o_post.item()} != {r_post.item()}")
        n_blocks = r_eids.numel()
        if not torch.equal(o_eids[:n_blocks], r_eids):
            wrong = int((o_eids[:n_blocks] != r_eids).sum())
            return Check(False, wrong / max(n_blocks, 1), 0.0, f"{wrong}/{n_blocks} expert_ids differ")
        runs = torch.unique_consecutive(r_eids, return_counts=True)[1].tolist()
        bounds, start = [], 0
        for c in runs:
            bounds.append((start * bs, (start + c) * bs))
            start += c
        total = int(r_post.item())
        bounds.append((total, r_sorted.numel()))  # the tail: all padding
        bad = check_segments(o_sorted, r_sorted, bounds)
        detail = (
            f"{len(bad)}/{len(bounds)} expert segments differ" if bad else "exact up to order in segments"
        )
        return Check(not bad, len(bad) / len(bounds), 0.0, detail)

    def traffic(self, case: Case) -> Traffic:
        t, e, k, bs = int(case.dims["T"]), int(case.dims["E"]), topk(case), self.block_size(case)
        max_pad = align_max_padded(t * k, e + 1, bs)
        b = 4 * (t * k + max_pad + -(-max_pad // bs) + 1 + (e + 2))
        return Traffic(b, 0, f"block_size {bs} (Marlin MoE rule); integer scan/scatter")
