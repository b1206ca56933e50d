"""What several MoE adapters share besides their inputs: fp32 references, the order-tolerant check of
the integer bookkeeping kernels, and the target name of an sgl-kernel op."""

from __future__ import annotations

from collections.abc import Callable

import torch

from dskbench.adapters.common import fp8
from dskbench.adapters.common.matmul_precision import fp32_matmul
from dskbench.adapters.moe.inputs import GROUP, ExpertWeights

# Storage groups (one expert each on a GPU) whose fp32 weights grouped_gemm_reference holds at once:
# 8 x 117 MB at N=4096, K=7168, which a GPU holds beside the inputs.
GROUPED_DEQUANT_CHUNK = 8


def quant_dequant_groups(x: torch.Tensor) -> torch.Tensor:
    """What an FP8 1x128 activation quantisation leaves of x (fp32): the reference's view of FP8 inputs."""
    q, s = fp8.per_token_group_quant(x, GROUP)
    return fp8.dequant_per_token_group(q, s, GROUP)


def share_groups(experts: list[int], *weights: ExpertWeights) -> list[list[int]]:
    """Experts grouped by shared weight storage (one group per expert on a GPU, one on the CPU slab)."""
    groups: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for e in experts:
        groups.setdefault(tuple(w.key(e) for w in weights), []).append(e)
    return list(groups.values())


def expert_order(flat_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, list[int]]:
    """Flat (token, slot) positions sorted by expert (stable) and each expert's range in that order:
    expert e owns order[offsets[e]:offsets[e + 1]]. One host sync, instead of one per expert."""
    flat = flat_ids.long()
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=num_experts)
    return order, [0, *torch.cumsum(counts, 0).tolist()]


def used_experts(offsets: list[int]) -> list[int]:
    """Experts with at least one row."""
    return [e for e in range(len(offsets) - 1) if offsets[e + 1] > offsets[e]]


def group_rows(order: torch.Tensor, offsets: list[int], experts: list[int]) -> torch.Tensor:
    """The entries of `order` that belong to a group of used experts (ascending ids): one slice when
    their ranges are adjacent (a single expert; the CPU slab's group of every routed expert)."""
    lo, hi = offsets[experts[0]], offsets[experts[-1] + 1]
    if sum(offsets[e + 1] - offsets[e] for e in experts) == hi - lo:
        return order[lo:hi]
    return torch.cat([order[offsets[e] : offsets[e + 1]] for e in experts])


def moe_gemm_reference(
    a: torch.Tensor,
    weights: ExpertWeights,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor | None,
    gate_up: bool,
    tf32: bool = False,
) -> torch.Tensor:
    """The Triton MoE GEMM in fp32. gate_up: C[t*K+j] = A[t] @ W[e]^T -> [T*K, N]. `tf32`: A and the
    weights hold BF16 values, exact in TF32, so the products run on TF32 tensor cores (exact products,
    fp32 sums); otherwise IEEE fp32.

    down: C[t, j] = w[t, j] * (A[t*K+j] @ W[e]^T) -> [T, K, N] (A is the [T*K, I] intermediate).
    Each storage group's weight is dequantised, used and freed before the next (256 fp32 experts would
    not fit a GPU beside the inputs).
    """
    t, k = topk_ids.shape
    order, offsets = expert_order(topk_ids.flatten(), int(weights.w.shape[0]))
    out = torch.empty(t * k, weights.n, dtype=torch.float32, device=a.device)
    for experts in share_groups(used_experts(offsets), weights):
        slots = group_rows(order, offsets, experts)
        rows = slots // k if gate_up else slots
        with fp32_matmul(tf32):
            out[slots] = a[rows] @ weights.dequant(experts[0], {}).t()
    if gate_up:
        return out
    assert topk_weights is not None
    return (out * topk_weights.flatten().float().unsqueeze(1)).view(t, k, weights.n)


def routed_experts_reference(
    x: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
    ids: torch.Tensor,
    weights: torch.Tensor,
    act_quant: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Routed experts in fp32 from top-k ids/weights; GEMM1 rows are [up; gate] (TRT-LLM/CUTLASS order).

    out[t] = sum_j w[t, j] * down_e(silu(x W1_gate^T) * (x W1_up^T)); ``act_quant`` is what the kernel's
    quantisation of the GEMM2 input leaves of it (e.g. quant_dequant_groups for DeepSeek FP8).
    """
    t, inter = x.shape[0], w13.n // 2
    k = ids.shape[1]
    out = torch.zeros(t, w2.n, dtype=torch.float32, device=x.device)
    order, offsets = expert_order(ids.flatten(), int(w13.w.shape[0]))
    flat_w = weights.flatten()
    # one group per storage: each expert is dequantised once and freed after its group (on a GPU, keeping
    # all 256 fp32 experts would take ~45 GB at BF16 sizes)
    for experts in share_groups(used_experts(offsets), w13, w2):
        slots = group_rows(order, offsets, experts)
        tok = slots // k
        h = x[tok] @ w13.dequant(experts[0], {}).t()
        act = torch.nn.functional.silu(h[:, inter:]) * h[:, :inter]
        if act_quant is not None:
            act = act_quant(act)
        out.index_add_(0, tok, (act @ w2.dequant(experts[0], {}).t()) * flat_w[slots].unsqueeze(1))
    return out


def grouped_gemm_reference(a: torch.Tensor, offsets: torch.Tensor, weights: ExpertWeights) -> torch.Tensor:
    """Expert-ordered grouped GEMM in fp32: rows offsets[e]:offsets[e+1] of `a` times W[e]^T (a group
    of experts whose rows are adjacent computes in place, without a gather or a scatter).

    The offsets are read to the host once; the storage groups' weights are decoded GROUPED_DEQUANT_CHUNK
    at a time (one gather and one decode per chunk, not a launch sequence per expert), while each group
    keeps its own GEMM, so the result does not depend on the chunking."""
    out = torch.zeros(a.shape[0], weights.n, dtype=torch.float32, device=a.device)
    off = offsets.tolist()
    groups = share_groups(used_experts(off), weights)
    firsts = torch.tensor([g[0] for g in groups], dtype=torch.long).to(weights.w.device)
    for c0 in range(0, len(groups), GROUPED_DEQUANT_CHUNK):
        decoded = weights.dequant_many(firsts[c0 : c0 + GROUPED_DEQUANT_CHUNK])
        for experts, we in zip(groups[c0 : c0 + GROUPED_DEQUANT_CHUNK], decoded, strict=True):
            w = we.t()
            lo, hi = off[experts[0]], off[experts[-1] + 1]
            if sum(off[e + 1] - off[e] for e in experts) == hi - lo:
                torch.mm(a[lo:hi], w, out=out[lo:hi])
            else:
                rows = torch.cat([torch.arange(off[e], off[e + 1]) for e in experts]).to(a.device)
                out[rows] = a[rows] @ w
        del decoded
    return out


def check_segments(
    values: torch.Tensor, ref_values: torch.Tensor, bounds: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Segments [a, b) whose multisets of values differ (order inside a segment is the kernel's own)."""
    bad = []
    for a, b in bounds:
        if not torch.equal(torch.sort(values[a:b]).values, torch.sort(ref_values[a:b]).values):
            bad.append((a, b))
    return bad


def torch_op(name: str) -> str:
    """The target of an sgl-kernel AOT op: `torch.ops.sgl_kernel.<name>.default`."""
    return f"torch.ops.sgl_kernel.{name}.default"
