"""The EAGLE draft tree the speculative kernels read, built as SGLang 0.5.16 builds it for DeepSeek-R1 MTP
(only the V2 EAGLE worker exists; defaults topk 1, num_steps 3, num_draft_tokens 4).

The draft tree comes from a simulation of `select_top_k_tokens` + `organize_draft_results` (random draft
probabilities, so it works for any topk), the retrieve links from the python reference of the tree builder
(`build_tree_ref`, which mirrors the CUDA kernel's control flow). Candidates for the verify kernels are
drawn mostly from the target's choice (probability DRAFT_HIT), so every acceptance length occurs.
Sequence lengths (for the FULL_MASK tree mask) are drawn in [1024, 8192).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dskbench.shapes.cases import Case

SEQ_LENS = (1024, 8192)
FULL_MASK = 0
DRAFT_HIT = 0.8  # chance a draft token is drawn from the target distribution (else uniform)


@dataclass(frozen=True)
class SpecDims:
    b: int
    v: int
    topk: int
    steps: int
    draft: int

    @property
    def spec_tokens(self) -> int:  # accept_index width: max_tree_depth = num_steps + 1
        return self.steps + 1

    @property
    def parent_width(self) -> int:
        return self.topk * (self.steps - 1) + 1


def spec_dims(case: Case) -> SpecDims:
    d = case.dims
    return SpecDims(int(d["B"]), int(d["V"]), int(d["topk"]), int(d["num_steps"]), int(d["num_draft"]))


# -- draft tree simulation (eagle_utils / spec_utils semantics, CPU) -----------------------------------


def _desc_probs(rows: int, k: int, gen: torch.Generator) -> torch.Tensor:
    p = torch.rand((rows, k), generator=gen) + 1e-3
    return (p / (p.sum(-1, keepdim=True) * 1.25)).sort(-1, descending=True).values


def simulate_draft(sd: SpecDims, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(parent_list [B, topk*(steps-1)+1], selected_index [B, D-1]) as EAGLE's draft loop leaves them."""
    b, k = sd.b, sd.topk
    scores = _desc_probs(b, k, gen)
    score_list = [scores.unsqueeze(1)]
    parents = [torch.arange(-1, k, dtype=torch.int64).expand(b, -1)]
    for i in range(1, sd.steps):
        expand = scores.unsqueeze(2) * _desc_probs(b * k, k, gen).view(b, k, k)
        scores, cs_index = torch.topk(expand.flatten(1), k, dim=-1)
        score_list.append(expand)
        parents.append(cs_index + (k * k * (i - 1) + k))
    flat = torch.cat(score_list, dim=1).flatten(1)
    selected = torch.sort(torch.topk(flat, sd.draft - 1, dim=-1).indices).values
    parent_list = (
        torch.cat(parents[:-1], dim=1) if len(parents) > 1 else torch.empty((b, 0), dtype=torch.int64)
    )
    return parent_list.contiguous(), selected.contiguous()


def _parent_node(sel: list[int], par: list[int], i: int, topk: int) -> int:
    """Tree node (0 = root, j = selected_index[j-1]) that draft node i hangs from."""
    tb = sel[i - 1] // topk
    return 0 if tb == 0 else 1 + sel.index(par[tb])


def build_tree_ref(
    parent_list: torch.Tensor, selected_index: torch.Tensor, seq_lens: torch.Tensor, topk: int, draft: int
) -> tuple[torch.Tensor, ...]:
    """(tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling) on the CPU.

    Mirrors sgl-kernel's build_tree_efficient in FULL_MASK mode, with the buffers initialised as
    SGLang does (mask all True, retrieve links -1).
    """
    pl, si, sl = parent_list.cpu().tolist(), selected_index.cpu().tolist(), seq_lens.cpu().tolist()
    b = len(sl)
    r_index = torch.full((b, draft), -1, dtype=torch.int64)
    r_next = torch.full((b, draft), -1, dtype=torch.int64)
    r_sib = torch.full((b, draft), -1, dtype=torch.int64)
    positions = torch.empty(b * draft, dtype=torch.int64)
    mask = torch.ones(sum(sl) * draft + b * draft * draft, dtype=torch.bool)
    start = 0
    for bi in range(b):
        parent = [0] + [_parent_node(si[bi], pl[bi], i, topk) for i in range(1, draft)]
        for i in range(draft - 1, 0, -1):
            r_index[bi, i] = bi * draft + i
            p = parent[i]
            if r_next[bi, p] != -1:
                r_sib[bi, i] = r_next[bi, p]
            r_next[bi, p] = i
        r_index[bi, 0] = bi * draft
        anc = torch.zeros((draft, draft), dtype=torch.bool)
        for tid in range(draft):
            node, depth = tid, 0
            anc[tid, 0] = True
            while node != 0:
                anc[tid, node] = True
                node, depth = parent[node], depth + 1
            positions[bi * draft + tid] = sl[bi] + depth
        width = sl[bi] + draft
        mask[start : start + draft * width].view(draft, width)[:, sl[bi] :] = anc
        start += draft * width
    return mask, positions, r_index, r_next, r_sib


def children(r_next: list[int], r_sib: list[int], node: int) -> list[int]:
    """Children of `node`, following its first-child link then the sibling links."""
    out, c = [], r_next[node]
    while c != -1:
        out.append(c)
        c = r_sib[c]
    return out


# -- verify inputs shared by the two verify kernels ----------------------------------------------------


def verify_tree(case: Case, gen: torch.Generator) -> tuple[SpecDims, tuple[torch.Tensor, ...]]:
    """A simulated draft tree's retrieve links (index, next token, next sibling) on the CPU."""
    sd = spec_dims(case)
    parent_list, selected = simulate_draft(sd, gen)
    seq_lens = torch.full((sd.b,), SEQ_LENS[0], dtype=torch.int64)
    _, _, r_index, r_next, r_sib = build_tree_ref(parent_list, selected, seq_lens, sd.topk, sd.draft)
    return sd, (r_index, r_next, r_sib)


def draft_tokens(
    sd: SpecDims, r_next: torch.Tensor, r_sib: torch.Tensor, proposals: torch.Tensor, gen: torch.Generator
) -> torch.Tensor:
    """candidates [B, D]: root = bonus token; the c-th child of node j is proposals[b, j, c] with
    probability DRAFT_HIT (a good draft model), else a uniform token."""
    cand = torch.randint(0, sd.v, (sd.b, sd.draft), generator=gen, dtype=torch.int64)
    prop = proposals.cpu().tolist()
    nxt, sib = r_next.tolist(), r_sib.tolist()
    hits = (torch.rand((sd.b, sd.draft), generator=gen) < DRAFT_HIT).tolist()
    for bi in range(sd.b):
        for node in range(sd.draft):
            for c, child in enumerate(children(nxt[bi], sib[bi], node)):
                if hits[bi][child]:
                    cand[bi, child] = prop[bi][node][c]
    return cand


def verify_outputs(sd: SpecDims, device: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(predicts, accept_index, accept_token_num) initialised as SGLang allocates them."""
    predicts = torch.zeros(sd.b * sd.draft, dtype=torch.int32, device=device)
    accept_index = torch.full((sd.b, sd.spec_tokens), -1, dtype=torch.int32, device=device)
    accept_num = torch.zeros(sd.b, dtype=torch.int32, device=device)
    return predicts, accept_index, accept_num
