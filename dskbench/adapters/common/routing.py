"""Realistic DeepSeek-V3/R1 MoE routing for benchmark inputs: biased grouped top-k over 256 experts.

Every MoE kernel's cost depends on how tokens spread over experts (rows per expert, how many experts are
touched, padding per expert block), so all MoE adapters build their ``topk_ids`` / ``topk_weights`` here,
the way SGLang's ``biased_grouped_topk_impl`` does for DeepSeek: ``s = sigmoid(logits)``; choose with
``s + e_score_correction_bias``; keep the ``topk_group`` best of ``n_group`` groups (a group scores the
sum of its top-2); take the top ``K`` experts of those groups; weights are ``s`` (without the bias) of
the chosen experts, renormalised to sum 1 (``routed_scaling_factor`` is applied later, by the combine).
This is dskbench's one implementation of that routing: the routing adapters' float64 references
(``grouped_choice`` + ``select_experts``) and the fused-MoE references (``grouped_topk``) call it too.

Loads are uneven on purpose: each expert has a fixed "popularity" added to its logits (and a small
random correction bias), so some experts receive several times the mean load, as in a real model.
Everything is generated on the CPU from ``seed`` (identical on any machine), then moved to ``device``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

# Spread of the per-expert popularity offset added to the router logits (in logit units). With logits of
# unit spread the hottest expert gets about 4x the mean load and the coldest a few percent of it.
POPULARITY_STD = 0.3
BIAS_STD = 0.02  # e_score_correction_bias: small, stored in bf16 by the trtllm kernels


@dataclass(frozen=True)
class Routing:
    """One routing decision for T tokens."""

    logits: torch.Tensor  # [T, E] fp32 router logits (what the gate GEMM produces)
    bias: torch.Tensor  # [E] fp32 e_score_correction_bias, values exactly representable in bf16
    topk_ids: torch.Tensor  # [T, K] int32 expert ids
    topk_weights: torch.Tensor  # [T, K] fp32, renormalised (rows sum to 1)

    @property
    def num_experts(self) -> int:
        return int(self.logits.shape[1])

    def to(self, device: str | torch.device) -> Routing:
        return Routing(
            self.logits.to(device),
            self.bias.to(device),
            self.topk_ids.to(device),
            self.topk_weights.to(device),
        )


def group_scores(choice: torch.Tensor, n_group: int) -> torch.Tensor:
    """A group's score is the sum of its two best choice scores: [T, E] -> [T, n_group]."""
    return choice.view(choice.shape[0], n_group, -1).topk(2, dim=-1).values.sum(dim=-1)


def grouped_choice(
    logits: torch.Tensor,
    bias: torch.Tensor,
    n_group: int,
    topk_group: int,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek's grouped routing up to the expert choice, computed in `dtype`.

    Returns (sigmoid scores, biased choice scores, the choice scores with the experts of every group but
    the `topk_group` best at -inf). The fused kernels work in fp32; the routing adapters' references use
    float64 so that a kernel's rounding, not the reference's, decides near-ties.
    """
    t, e = logits.shape
    if e % n_group:
        raise ValueError(f"{e} experts do not split into {n_group} groups")
    scores = logits.to(dtype).sigmoid()
    choice = scores + bias.to(dtype).unsqueeze(0)
    groups = group_scores(choice, n_group)  # [T, n_group]
    group_idx = groups.topk(topk_group, dim=-1, sorted=False).indices
    group_mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, group_idx, True)
    expert_mask = group_mask.unsqueeze(-1).expand(t, n_group, e // n_group).reshape(t, e)
    return scores, choice, choice.masked_fill(~expert_mask, float("-inf"))


def select_experts(
    scores: torch.Tensor,
    choice: torch.Tensor,
    top_k: int,
    renormalize: bool = True,
    scale: float | None = None,
    sorted: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ids = the top-k of `choice`; weights = `scores` at ids, optionally renormalised, then times `scale`.

    -> (weights fp32 [T, K], ids int32 [T, K]); `sorted` orders each row's ids by falling choice score.
    """
    ids = choice.topk(top_k, dim=-1, sorted=sorted).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if scale is not None:
        weights = weights * scale
    return weights.float(), ids.to(torch.int32)


def grouped_topk(
    logits: torch.Tensor,
    bias: torch.Tensor,
    top_k: int,
    n_group: int,
    topk_group: int,
    renormalize: bool = True,
    routed_scaling_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's biased grouped top-k (``biased_grouped_topk_impl``) in fp32 -> (weights fp32, ids int32).

    Also the reference of the fused routing kernels (trtllm MoE with ``RoutingMethodType.DeepSeekV3``,
    where ``routed_scaling_factor`` multiplies the renormalised weights).
    """
    scores, _, masked = grouped_choice(logits, bias, n_group, topk_group)
    return select_experts(scores, masked, top_k, renormalize, routed_scaling_factor)


def fuse_shared_experts(
    weights: torch.Tensor,
    ids: torch.Tensor,
    num_routed: int,
    n_shared: int,
    routed_scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's shared experts fusion on a routed top-k: `n_shared` slots appended to every token, id
    `num_routed` (expert 256 for DeepSeek: the shared expert is loaded after the routed ones) and weight
    sum(routed weights) / routed_scaling_factor, as sglang 0.5.16 ``biased_grouped_topk_gpu`` pads them
    (layers/moe/topk.py). The combine's routed_scaling_factor then gives the shared expert weight 1 when
    the routed weights are renormalised to 1. -> (weights fp32 [T, K + n], ids int32 [T, K + n])."""
    t = ids.shape[0]
    shared_ids = torch.full((t, n_shared), num_routed, dtype=ids.dtype, device=ids.device)
    shared_w = (weights.sum(dim=-1, keepdim=True) / routed_scaling_factor).expand(t, n_shared)
    return torch.cat([weights, shared_w], dim=1).float(), torch.cat([ids, shared_ids], dim=1)


def deepseek_routing(
    num_tokens: int,
    num_experts: int = 256,
    top_k: int = 8,
    n_group: int = 8,
    topk_group: int = 4,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> Routing:
    """Random but realistic routing for `num_tokens` tokens (deterministic in `seed`). Drawn once per
    arguments on the CPU (a case's every input set and backend routes alike); each call gets its own copy."""
    r = _cpu_routing(num_tokens, num_experts, top_k, n_group, topk_group, seed)
    return Routing(*(x.to(device, copy=True) for x in (r.logits, r.bias, r.topk_ids, r.topk_weights)))


@lru_cache(maxsize=16)  # entries grow with num_tokens: 16 MB of logits at 16k tokens
def _cpu_routing(
    num_tokens: int, num_experts: int, top_k: int, n_group: int, topk_group: int, seed: int
) -> Routing:
    gen = torch.Generator().manual_seed(seed)
    # The popularity pattern is a property of the "model": drawn from its own stream so it does not
    # change with num_tokens.
    pop_gen = torch.Generator().manual_seed(seed * 7919 + 17)
    popularity = torch.randn(num_experts, generator=pop_gen) * POPULARITY_STD
    bias = (torch.randn(num_experts, generator=pop_gen) * BIAS_STD).to(torch.bfloat16).float()
    logits = torch.randn(num_tokens, num_experts, generator=gen) + popularity
    weights, ids = grouped_topk(logits, bias, top_k, n_group, topk_group)
    return Routing(logits, bias, ids, weights)


def expert_counts(topk_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Rows each expert receives, int64 [E] (on the CPU)."""
    return torch.bincount(topk_ids.flatten().long().cpu(), minlength=num_experts)[:num_experts]


def sorted_by_expert(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable sort of the flat (token, slot) pairs by expert -> (order int64 [T*K], offsets int64 [E+1]).

    ``order[r]`` is the flat index ``t * K + j`` of the r-th row in expert order; expert e owns rows
    ``offsets[e]:offsets[e + 1]``. This is the canonical layout of the CUTLASS MoE path
    (``prepare_moe_input``): the kernels may order rows inside one expert differently.
    """
    flat = topk_ids.flatten().long().cpu()
    order = torch.sort(flat, stable=True).indices
    offsets = torch.zeros(num_experts + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(expert_counts(topk_ids, num_experts), 0)
    return order, offsets


@lru_cache(maxsize=256)
def active_experts(
    num_tokens: int, num_experts: int = 256, top_k: int = 8, n_group: int = 8, topk_group: int = 4
) -> int:
    """Distinct experts the seed-0 routing of `num_tokens` tokens touches (traffic counts their weights).

    Exact for seed 0 and within a few experts for any other seed (it saturates at E from a few hundred
    tokens on).
    """
    r = deepseek_routing(num_tokens, num_experts, top_k, n_group, topk_group, seed=0)
    return int((expert_counts(r.topk_ids, num_experts) > 0).sum())


def routing_margin(
    logits: torch.Tensor, bias: torch.Tensor, top_k: int, n_group: int, topk_group: int
) -> torch.Tensor:
    """Per token, how close its grouped top-k choice is to a tie (fp32 [T]).

    The smaller of the gap between the last kept and the first dropped group score, and between the
    k-th and (k+1)-th expert score of the kept groups. A kernel that rounds its scores differently may
    pick another expert where this is tiny; checks leave such tokens out.
    """
    t, e = logits.shape
    choice = logits.float().sigmoid() + bias.float().unsqueeze(0)
    groups = group_scores(choice, n_group)
    gs = groups.sort(dim=-1, descending=True).values
    group_gap = (
        gs[:, topk_group - 1] - gs[:, topk_group] if topk_group < n_group else torch.full_like(gs[:, 0], 1.0)
    )
    keep = groups.topk(topk_group, dim=-1).indices
    mask = torch.zeros_like(groups).scatter_(1, keep, 1.0)
    mask = mask.unsqueeze(-1).expand(t, n_group, e // n_group).reshape(t, e)
    ranked = choice.masked_fill(mask == 0, float("-inf")).sort(dim=-1, descending=True).values
    expert_gap = ranked[:, top_k - 1] - ranked[:, top_k]
    return torch.minimum(group_gap, expert_gap)
