"""The tie-tolerant check of the routing kernels: an expert set passes when a rounding of its scores could
have chosen it.

Selections are compared by their scores, not their ids: a row passes when its selection scores, sorted,
match the reference's (so swapping two equal-scored experts is not a failure); weights are compared as
sorted vectors on the rows whose experts are the reference's (a near-tied expert brings its own weight).
With groups, a near-tie between two groups may send a row to the other group's experts.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import torch

from dskbench.adapters.base import Check, rel_error

SELECT_RTOL = 1e-5  # fp32 kernels vs the float64 reference, on selection scores
SELECT_ATOL = 1e-6


def valid_grouped_choice(choice: torch.Tensor, ids: torch.Tensor, n_group: int, topk_group: int) -> bool:
    """Whether one row's ids are a grouped top-k that fp32 arithmetic may have chosen: the top-k experts
    of some set of topk_group groups that all score (sum of their top-2) within SELECT_RTOL/ATOL of the
    topk_group-th best group. Why: when two groups nearly tie, a kernel's fp32 group sums can rank them
    the other way round than the float64 reference, and every expert of the swapped group differs (seen
    with FlashInfer's fused_topk_deepseek on a row or two of the largest batches)."""
    e, k = choice.numel(), ids.numel()
    if len(set(ids.tolist())) != k or int(ids.min()) < 0 or int(ids.max()) >= e:
        return False
    per_group = choice.view(n_group, e // n_group)
    gscore = per_group.topk(2, dim=-1).values.sum(dim=-1)
    kth = gscore.sort(descending=True).values[topk_group - 1]
    slack = SELECT_RTOL * abs(float(kth)) + SELECT_ATOL
    sure = [g for g in range(n_group) if gscore[g] > kth + slack]  # in every valid choice
    near = [g for g in range(n_group) if abs(float(gscore[g] - kth)) <= slack]
    got = choice[ids].sort().values
    for extra in combinations(near, topk_group - len(sure)):
        allowed = torch.zeros(n_group, dtype=torch.bool)
        allowed[list(sure) + list(extra)] = True
        if not allowed[ids // (e // n_group)].all():
            continue
        masked = choice.masked_fill(~allowed.repeat_interleave(e // n_group), float("-inf"))
        want = masked.topk(k).values.sort().values
        if torch.isclose(got, want, rtol=SELECT_RTOL, atol=SELECT_ATOL).all():
            return True
    return False


def check_topk(
    out: Any, ref: Any, choice: torch.Tensor, tolerance: float, max_groups: tuple[int, int] | None = None
) -> Check:
    """Compare a kernel's (weights, ids) with the reference's, allowing ties.

    `choice` [T, E] float64 holds the scores the selection maximises (unmasked). A row passes when its ids
    are distinct, in range, and their sorted choice scores equal the reference's; with `max_groups`
    = (n_group, topk_group), its experts must also come from at most topk_group groups.
    """
    w, ids = out[0], out[1]
    wr, idr = ref[0], ref[1]
    if tuple(ids.shape) != tuple(idr.shape) or tuple(w.shape) != tuple(wr.shape):
        return Check(False, float("inf"), tolerance, f"shape {tuple(ids.shape)} vs {tuple(idr.shape)}")
    ids = ids.detach().to("cpu", torch.int64)
    idr = idr.detach().to("cpu", torch.int64)
    choice = choice.detach().to("cpu", torch.float64)
    t, e = choice.shape
    if ids.numel() and (ids.min() < 0 or ids.max() >= e):
        return Check(False, float("inf"), tolerance, "expert id out of range")
    srt = ids.sort(dim=-1).values
    bad = (srt[:, 1:] == srt[:, :-1]).any(dim=-1)
    got = choice.gather(1, ids).sort(dim=-1).values
    want = choice.gather(1, idr).sort(dim=-1).values
    bad |= ~torch.isclose(got, want, rtol=SELECT_RTOL, atol=SELECT_ATOL).all(dim=-1)
    group_ties: list[int] = []
    if max_groups is not None:
        n_group, topk_group = max_groups
        groups = torch.zeros(t, n_group, dtype=torch.bool).scatter_(1, ids // (e // n_group), True)
        bad |= groups.sum(dim=-1) > topk_group
        for row in bad.nonzero().flatten().tolist():  # a near-tie between groups is not an error
            if valid_grouped_choice(choice[row], ids[row], n_group, topk_group):
                bad[row] = False
                group_ties.append(row)
    n_bad = int(bad.sum())
    # a row that took another of two near-tied experts (or groups) has other experts, so other weights:
    # weights are compared on the rows whose experts are the reference's
    same = (srt == idr.sort(dim=-1).values).all(dim=-1)
    expert_ties = int((~same & ~bad).sum()) - len(group_ties)
    w_err = (
        rel_error(
            w.float()[same.to(w.device)].sort(dim=-1).values,
            wr.float()[same.to(wr.device)].sort(dim=-1).values,
        )
        if same.any()
        else 0.0
    )
    ok = n_bad == 0 and w_err <= tolerance
    detail = f"ids: {n_bad}/{t} rows differ; weights {w_err:.2e}/{tolerance:.0e}"
    if group_ties:
        detail += f"; {len(group_ties)} rows chose another of two near-tied expert groups"
    if expert_ties:
        detail += f"; {expert_ties} rows chose another of two near-tied experts"
    return Check(ok, w_err if n_bad == 0 else float("inf"), tolerance, detail)
