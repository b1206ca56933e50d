"""What several MoE adapters share besides their inputs: fp32 references, the order-tolerant check of
the integer bookkeeping kernels, and the target name of an sgl-kernel op."""

from __future__ import annotations

from collections.abc import Callable

import torch

from dskbench.adapters.common import fp8
from dskbench.adapters.moe.inputs import GROUP, ExpertWeights


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


def moe_gemm_reference(
    a: torch.Tensor,
    weights: ExpertWeights,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor | None,
    gate_up: bool,
) -> torch.Tensor:
    """The Triton MoE GEMM in fp32. gate_up: C[t*K+j] = A[t] @ W[e]^T -> [T*K, N].

    down: C[t, j] = w[t, j] * (A[t*K+j] @ W[e]^T) -> [T, K, N] (A is the [T*K, I] intermediate).
    """
    t, k = topk_ids.shape
    flat = topk_ids.flatten().long()
    out = torch.zeros(t * k, weights.n, dtype=torch.float32, device=a.device)
    cache: dict[tuple[int, int], torch.Tensor] = {}
    for experts in share_groups(torch.unique(flat).tolist(), weights):
        slots = torch.isin(flat, torch.tensor(experts, device=flat.device)).nonzero().squeeze(1)
        rows = slots // k if gate_up else slots
        out[slots] = a[rows] @ weights.dequant(experts[0], cache).t()
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
    out = torch.zeros(t, w2.n, dtype=torch.float32, device=x.device)
    # one group per storage: each expert is dequantised once and freed after its group (on a GPU, keeping
    # all 256 fp32 experts would take ~45 GB at BF16 sizes)
    for experts in share_groups(torch.unique(ids).tolist(), w13, w2):
        tok, slot = torch.isin(ids, torch.tensor(experts, device=ids.device)).nonzero(as_tuple=True)
        h = x[tok] @ w13.dequant(experts[0], {}).t()
        act = torch.nn.functional.silu(h[:, inter:]) * h[:, :inter]
        if act_quant is not None:
            act = act_quant(act)
        out.index_add_(0, tok, (act @ w2.dequant(experts[0], {}).t()) * weights[tok, slot].unsqueeze(1))
    return out


def grouped_gemm_reference(a: torch.Tensor, offsets: torch.Tensor, weights: ExpertWeights) -> torch.Tensor:
    """Expert-ordered grouped GEMM in fp32: rows offsets[e]:offsets[e+1] of `a` times W[e]^T."""
    out = torch.zeros(a.shape[0], weights.n, dtype=torch.float32, device=a.device)
    cache: dict[tuple[int, int], torch.Tensor] = {}
    off = offsets.tolist()
    used = [e for e in range(len(off) - 1) if off[e + 1] > off[e]]
    for experts in share_groups(used, weights):
        rows = torch.cat([torch.arange(off[e], off[e + 1]) for e in experts]).to(a.device)
        out[rows] = a[rows] @ weights.dequant(experts[0], cache).t()
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
