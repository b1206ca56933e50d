"""DeepSeek routing (dskbench.adapters.common.routing), the one implementation the MoE and routing adapters
share: the seeded generator against a naive loop, load shape, layouts, tie margins, and its building blocks."""

from __future__ import annotations

import math

import pytest
import torch

from dskbench.adapters.common.routing import (
    active_experts,
    deepseek_routing,
    expert_counts,
    group_scores,
    grouped_choice,
    grouped_topk,
    routing_margin,
    select_experts,
    sorted_by_expert,
)


def _naive_routing(logits, bias, k, n_group, topk_group):
    ids_out, w_out = [], []
    for row in logits.double().tolist():
        s = [1.0 / (1.0 + math.exp(-x)) for x in row]
        b = [si + bi for si, bi in zip(s, bias.double().tolist(), strict=True)]
        per = len(b) // n_group
        gs = [sum(sorted(b[g * per : (g + 1) * per], reverse=True)[:2]) for g in range(n_group)]
        keep = sorted(range(n_group), key=lambda g: -gs[g])[:topk_group]
        ids = sorted((e for g in keep for e in range(g * per, (g + 1) * per)), key=lambda e: -b[e])[:k]
        tot = sum(s[e] for e in ids)
        ids_out.append(ids)
        w_out.append([s[e] / tot for e in ids])
    return ids_out, w_out


def test_grouped_topk_matches_naive_routing():
    r = deepseek_routing(5, 32, 4, n_group=4, topk_group=2, seed=7)
    ids, w = _naive_routing(r.logits, r.bias, 4, 4, 2)
    for t in range(5):
        got = dict(zip(r.topk_ids[t].tolist(), r.topk_weights[t].tolist(), strict=True))
        want = dict(zip(ids[t], w[t], strict=True))
        assert got.keys() == want.keys()
        assert all(abs(got[e] - want[e]) < 1e-6 for e in want)
    w2, ids2 = grouped_topk(r.logits, r.bias, 4, 4, 2, routed_scaling_factor=2.5)
    assert torch.equal(ids2, r.topk_ids) and torch.allclose(w2, r.topk_weights * 2.5)


def test_routing_is_deepseek_shaped_and_uneven():
    r = deepseek_routing(4096, seed=0)
    assert r.topk_ids.shape == (4096, 8) and r.topk_ids.dtype == torch.int32
    assert r.topk_weights.dtype == torch.float32 and torch.allclose(r.topk_weights.sum(1), torch.ones(4096))
    groups = (r.topk_ids // 32).long()
    n_groups = torch.zeros(4096, 8, dtype=torch.long).scatter_(1, groups, 1).sum(1)
    assert int(n_groups.max()) <= 4  # topk_group = 4 of n_group = 8
    assert all(len(set(row)) == 8 for row in r.topk_ids.tolist())
    counts = expert_counts(r.topk_ids, 256).float()
    assert counts.max() > 2.5 * counts.mean()  # some experts are hot
    assert torch.equal(r.bias, r.bias.to(torch.bfloat16).float())  # exact in bf16 for the trtllm kernels
    again = deepseek_routing(4096, seed=0)
    assert torch.equal(again.topk_ids, r.topk_ids)
    assert not torch.equal(deepseek_routing(4096, seed=1).topk_ids, r.topk_ids)


def test_active_experts_and_sorted_layout():
    assert active_experts(1) == 8
    assert 8 < active_experts(16) <= 128
    assert active_experts(16384) >= 250
    ids = torch.tensor([[0, 1], [1, 3], [0, 3]], dtype=torch.int32)
    order, offsets = sorted_by_expert(ids, 4)
    assert order.tolist() == [0, 4, 1, 2, 3, 5] and offsets.tolist() == [0, 2, 4, 4, 6]


def test_routing_margin_by_hand():
    logits = torch.zeros(1, 4)  # every score 0.5: the bias decides
    far = routing_margin(logits, torch.tensor([0.1, 0.0, 0.05, 0.3]), 1, 2, 1)
    assert far.item() == pytest.approx(0.25)  # group gap 1.35 - 1.1, expert gap 0.8 - 0.55
    near = routing_margin(logits, torch.tensor([0.1, 0.0, 0.29, 0.3]), 1, 2, 1)
    assert near.item() == pytest.approx(0.01, abs=1e-6)


def test_grouped_choice_masks_all_but_the_best_groups():
    # 2 groups of 3; biased scores sum to 1.2 / 1.4 over each group's top 2: group 1 is kept
    logits = torch.zeros(1, 6)
    bias = torch.tensor([0.2, 0.1, 0.0, 0.3, 0.1, -0.5])
    scores, choice, masked = grouped_choice(logits, bias, 2, 1, torch.float64)
    assert scores.dtype == choice.dtype == masked.dtype == torch.float64
    assert torch.allclose(scores, torch.full((1, 6), 0.5, dtype=torch.float64))
    assert torch.allclose(group_scores(choice, 2), torch.tensor([[1.3, 1.4]], dtype=torch.float64))
    assert torch.isinf(masked[0, :3]).all() and torch.equal(masked[0, 3:], choice[0, 3:])
    assert grouped_choice(logits, bias, 2, 1)[0].dtype == torch.float32
    with pytest.raises(ValueError, match="do not split"):
        grouped_choice(torch.zeros(1, 5), torch.zeros(5), 2, 1)


def test_select_experts_renormalises_scales_and_sorts():
    scores = torch.tensor([[0.1, 0.4, 0.2, 0.3]], dtype=torch.float64)
    choice = torch.tensor([[0.0, 1.0, 3.0, 2.0]], dtype=torch.float64)
    w, ids = select_experts(scores, choice, 2, scale=2.5, sorted=True)
    assert ids.tolist() == [[2, 3]] and ids.dtype == torch.int32 and w.dtype == torch.float32
    assert torch.allclose(w, torch.tensor([[0.2 / 0.5 * 2.5, 0.3 / 0.5 * 2.5]]))
    w_raw, _ = select_experts(scores, choice, 2, renormalize=False)
    assert sorted(w_raw[0].tolist()) == pytest.approx([0.2, 0.3])


def test_deepseek_routing_is_drawn_once_but_each_call_gets_its_own_tensors():
    a = deepseek_routing(64, 256, 8, 8, 4, seed=3)
    a.topk_ids.zero_()  # a caller writing into its inputs leaves the next call's routing alone
    b = deepseek_routing(64, 256, 8, 8, 4, seed=3)
    assert b.topk_ids.any() and not torch.equal(a.topk_ids, b.topk_ids)
    assert torch.equal(b.topk_ids, deepseek_routing(64, 256, 8, 8, 4, seed=3).topk_ids)
    assert not torch.equal(b.topk_ids, deepseek_routing(64, 256, 8, 8, 4, seed=4).topk_ids)
