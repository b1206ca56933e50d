"""EAGLE / NextN (MTP) speculative-decoding adapters (catalogue 11.x): `fast_topk`,
`build_tree_kernel_efficient`, `verify_tree_greedy`, `tree_speculative_sampling_target_only`.

What SGLang 0.5.16 runs for DeepSeek-R1 MTP on sm90 (only the V2 EAGLE worker exists; defaults topk 1,
num_steps 3, num_draft_tokens 4):
* draft top-k: for topk == 1 on CUDA, `eagle_worker_v2.draft_forward` calls the Triton
  `sglang.kernels.ops.speculative.topk1.draft_topk1_postprocess` (backend "sglang_triton.topk1",
  labelled), not `fast_topk`. `sgl_kernel.fast_topk` (what the trace names) is plain PyTorch —
  `torch.max` for topk 1, `torch.topk` otherwise — with no custom kernel (backend "sgl_kernel",
  kind torch); SGLang calls it in the decode draft loop for topk > 1 and, for any topk, once after a
  prefill (`_draft_extend_for_prefill`).
* tree building: `eagle_utils.build_tree_kernel_efficient` -> sgl-kernel AOT
  `build_tree_kernel_efficient` with FULL_MASK (labelled); the Triton twin
  `spec_tree.sgl_build_tree_kernel_efficient_triton` is the XPU path.
* greedy verify (all-greedy batches): `verify_tree_greedy_func` -> sgl-kernel AOT `verify_tree_greedy`
  (labelled); Triton twin `verify_tree_greedy_kernel_triton` (XPU path).
* sampling verify: `eagle_sample` -> sgl-kernel AOT `tree_speculative_sampling_target_only` (labelled)
  with draft_probs = zeros and thresholds 1.0 (server defaults). `chain_speculative_sampling_triton` is a
  different algorithm (classic rejection sampling with real draft probs) and is not a backend here.

Inputs are built the way SGLang builds them: the draft tree comes from a simulation of
`select_top_k_tokens` + `organize_draft_results` (random draft probabilities, so it works for any topk),
the retrieve links from the python reference of the tree builder, candidates are drawn mostly from the
target distribution (tempered, top-p 0.95 renormalised, with confident rows) so every acceptance length
occurs. Sequence lengths (for the FULL_MASK tree mask) are drawn
in [1024, 8192). References mirror the CUDA kernels' control flow and are compared exactly; the final
token of the sampling verify is checked for membership in the residual distribution's support.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import TOLERANCES, Adapter, Check, Traffic, rel_error
from dskbench.adapters.common.inputs import SGLANG_SM90, device_generator, exact_check, generator
from dskbench.adapters.sampling import make_probs, top_p_sets
from dskbench.shapes.cases import Case

SEQ_LENS = (1024, 8192)
FULL_MASK = 0
DRAFT_HIT = 0.8  # chance a draft token is drawn from the target distribution (else uniform)
TOP_P = 0.95  # target probs are top-p renormalised, as eagle_sample does


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


def _children(r_next: list[int], r_sib: list[int], node: int) -> list[int]:
    out, c = [], r_next[node]
    while c != -1:
        out.append(c)
        c = r_sib[c]
    return out


# -- build_tree_kernel_efficient -----------------------------------------------------------------------


def _tree_outputs(inputs: dict[str, Any], sd: SpecDims) -> tuple[torch.Tensor, ...]:
    dev = inputs["seq_lens"].device
    mask = torch.ones(inputs["mask_numel"], dtype=torch.bool, device=dev)
    positions = torch.empty(sd.b * sd.draft, dtype=torch.int64, device=dev)
    links = torch.full((3, sd.b, sd.draft), -1, dtype=torch.int64, device=dev)
    return mask, positions, links[0], links[1], links[2]


def _bind_build_aot(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """Outputs are initialised once here (SGLang re-fills them per call); later launches find the links
    already set, do the same work, and leave self-referencing sibling links: the first launch is checked."""
    sd = spec_dims(case)
    outs = _tree_outputs(inputs, sd)
    pl, si, sl = inputs["parent_list"], inputs["selected_index"], inputs["seq_lens"]

    def launch() -> tuple[torch.Tensor, ...]:
        fn(pl, si, sl, *outs, sd.topk, sd.steps, sd.draft, FULL_MASK)
        return outs

    return launch


def _bind_build_triton(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    sd = spec_dims(case)
    outs = _tree_outputs(inputs, sd)
    pl, si, sl = inputs["parent_list"], inputs["selected_index"], inputs["seq_lens"]
    prefix = torch.cumsum(sl, dim=0) - sl

    def launch() -> tuple[torch.Tensor, ...]:
        fn[(sd.b,)](
            pl,
            si,
            sl,
            prefix,
            *outs,
            topk=sd.topk,
            depth=sd.steps,
            draft_token_num=sd.draft,
            tree_mask_mode=FULL_MASK,
            batch_size=sd.b,
            parent_list_stride=pl.stride(0),
            selected_index_stride=si.stride(0),
        )
        return outs

    return launch


def _tree_inputs(case: Case, gen: torch.Generator, device: str) -> dict[str, Any]:
    sd = spec_dims(case)
    parent_list, selected = simulate_draft(sd, gen)
    seq_lens = torch.randint(SEQ_LENS[0], SEQ_LENS[1], (sd.b,), generator=gen, dtype=torch.int64)
    return {
        "parent_list": parent_list.to(device),
        "selected_index": selected.to(device),
        "seq_lens": seq_lens.to(device),
        "mask_numel": int(seq_lens.sum()) * sd.draft + sd.b * sd.draft * sd.draft,
    }


@register
class BuildTreeAdapter(Adapter):
    kernel = "build_tree_kernel_efficient"
    role = "spec"
    ops = ("eagle_worker.forward",)
    description = "EAGLE draft tree: FULL_MASK tree mask, positions and retrieve links"
    backends = [
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.build_tree_kernel_efficient.default",
            None,
            "aot",
            _bind_build_aot,
            preload=("sgl_kernel",),
            label=SGLANG_SM90,
        ),
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.speculative.spec_tree:sgl_build_tree_kernel_efficient_triton",
            None,
            "triton",
            _bind_build_triton,
            note="SGLang's XPU path",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return _tree_inputs(case, generator(seed), device)

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, ...]:
        sd = spec_dims(case)
        return build_tree_ref(
            inputs["parent_list"], inputs["selected_index"], inputs["seq_lens"], sd.topk, sd.draft
        )

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return exact_check(
            tuple(out), tuple(ref), ("tree_mask", "positions", "index", "next_token", "next_sibling")
        )

    def traffic(self, case: Case) -> Traffic:
        sd = spec_dims(case)
        b, d = sd.b, sd.draft
        read = 8 * (b * sd.parent_width + b * (d - 1) + b)
        written = b * d * d + 8 * b * d * 4  # draft block of the mask (prefix is not written) + int64 outputs
        return Traffic(bytes=read + written, note="tree-mask prefix columns are left as initialised")


# -- verify inputs shared by the two verify kernels ----------------------------------------------------


def _verify_tree(case: Case, gen: torch.Generator) -> tuple[SpecDims, tuple[torch.Tensor, ...]]:
    sd = spec_dims(case)
    parent_list, selected = simulate_draft(sd, gen)
    seq_lens = torch.full((sd.b,), SEQ_LENS[0], dtype=torch.int64)
    _, _, r_index, r_next, r_sib = build_tree_ref(parent_list, selected, seq_lens, sd.topk, sd.draft)
    return sd, (r_index, r_next, r_sib)


def _draft_tokens(
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
            for c, child in enumerate(_children(nxt[bi], sib[bi], node)):
                if hits[bi][child]:
                    cand[bi, child] = prop[bi][node][c]
    return cand


def _verify_outputs(sd: SpecDims, device: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    predicts = torch.zeros(sd.b * sd.draft, dtype=torch.int32, device=device)
    accept_index = torch.full((sd.b, sd.spec_tokens), -1, dtype=torch.int32, device=device)
    accept_num = torch.zeros(sd.b, dtype=torch.int32, device=device)
    return predicts, accept_index, accept_num


# -- verify_tree_greedy --------------------------------------------------------------------------------


def verify_greedy_ref(
    candidates: torch.Tensor,
    r_index: torch.Tensor,
    r_next: torch.Tensor,
    r_sib: torch.Tensor,
    target_predict: torch.Tensor,
    spec_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """VerifyTreeGreedy's walk: follow first-child/sibling links, accept while the draft token equals the
    target's argmax at the last accepted node; the bonus token is the target's choice there."""
    cand, idx, nxt, sib = (t.cpu().tolist() for t in (candidates, r_index, r_next, r_sib))
    tgt = target_predict.cpu().flatten().tolist()
    b, d = len(cand), len(cand[0])
    predicts = torch.zeros(b * d, dtype=torch.int32)
    accept_index = torch.full((b, spec_tokens), -1, dtype=torch.int32)
    accept_num = torch.zeros(b, dtype=torch.int32)
    for bi in range(b):
        last = idx[bi][0]
        accept_index[bi, 0] = last
        n, cur = 0, 0
        for _ in range(1, spec_tokens):
            cur = nxt[bi][cur]
            while cur != -1:
                if cand[bi][cur] == tgt[last]:
                    predicts[last] = tgt[last]
                    n += 1
                    accept_index[bi, n] = idx[bi][cur]
                    last = idx[bi][cur]
                    break
                cur = sib[bi][cur]
            if cur == -1:
                break
        accept_num[bi] = n
        predicts[last] = tgt[last]
    return predicts, accept_index, accept_num


def _bind_verify_aot(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    outs = _verify_outputs(spec_dims(case), inputs["candidates"].device)
    args = [inputs[k] for k in ("candidates", "retrive_index", "retrive_next_token", "retrive_next_sibling")]
    tgt = inputs["target_predict"]

    def launch() -> tuple[torch.Tensor, ...]:
        fn(*outs, *args, tgt)
        return outs

    return launch


def _bind_verify_triton(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    sd = spec_dims(case)
    outs = _verify_outputs(sd, inputs["candidates"].device)
    args = [inputs[k] for k in ("candidates", "retrive_index", "retrive_next_token", "retrive_next_sibling")]
    tgt = inputs["target_predict"]

    def launch() -> tuple[torch.Tensor, ...]:
        fn[(sd.b,)](
            *outs,
            *args,
            tgt,
            batch_size=sd.b,
            num_speculative_tokens=sd.spec_tokens,
            num_draft_tokens=sd.draft,
        )
        return outs

    return launch


@register
class VerifyTreeGreedyAdapter(Adapter):
    kernel = "verify_tree_greedy"
    role = "spec"
    ops = ("eagle_utils.verify_tree",)
    description = "greedy acceptance walk over the draft tree"
    backends = [
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.verify_tree_greedy.default",
            None,
            "aot",
            _bind_verify_aot,
            preload=("sgl_kernel",),
            label=SGLANG_SM90,
        ),
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.speculative.spec_tree:verify_tree_greedy_kernel_triton",
            None,
            "triton",
            _bind_verify_triton,
            note="SGLang's XPU path",
        ),
    ]

    def applies(self, case: Case) -> bool:
        # The registry also lists eagle_worker.forward, whose spec dims are identical: measure once.
        return case.op in self.ops

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        gen = generator(seed)
        sd, (r_index, r_next, r_sib) = _verify_tree(case, gen)
        # The target's argmax at each node: one of its children's tokens most of the time.
        target = torch.randint(0, sd.v, (sd.b, sd.draft), generator=gen, dtype=torch.int64)
        proposals = target[:, :, None].expand(sd.b, sd.draft, sd.draft)
        cand = _draft_tokens(sd, r_next, r_sib, proposals, gen)
        return {
            "candidates": cand.to(device),
            "retrive_index": r_index.to(device),
            "retrive_next_token": r_next.to(device),
            "retrive_next_sibling": r_sib.to(device),
            "target_predict": target.to(device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, ...]:
        keys = ("candidates", "retrive_index", "retrive_next_token", "retrive_next_sibling", "target_predict")
        return verify_greedy_ref(*(inputs[k] for k in keys), spec_dims(case).spec_tokens)

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return exact_check(tuple(out), tuple(ref), ("predicts", "accept_index", "accept_token_num"))

    def traffic(self, case: Case) -> Traffic:
        sd = spec_dims(case)
        return Traffic(bytes=5 * 8 * sd.b * sd.draft + 4 * sd.b * (sd.draft + sd.spec_tokens + 1))


# -- tree_speculative_sampling_target_only -------------------------------------------------------------


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


@dataclass(frozen=True)
class SpecSampleRef:
    """Exact walk results plus, per request, the node whose residual the bonus token is drawn from."""

    predicts: torch.Tensor
    accept_index: torch.Tensor
    accept_token_num: torch.Tensor
    bonus_pos: torch.Tensor  # [B] position in predicts of the sampled bonus token
    allowed: torch.Tensor  # bool [B, V]: support of relu(target - draft) at the final node


def tree_sampling_ref(
    inputs: dict[str, Any], spec_tokens: int, threshold_single: float = 1.0, threshold_acc: float = 1.0
) -> SpecSampleRef:
    """TreeSpeculativeSamplingTargetOnly's walk (fp32 accumulation), then the residual's support."""
    tp = inputs["target_probs"]
    cand_t = inputs["candidates"]
    b, d, v = tp.shape
    # p[b, r, i] = target_probs[b, r, candidates[b, i]]: all the walk reads besides the final row.
    pcand = tp.gather(2, cand_t[:, None, :].expand(b, d, d)).cpu().tolist()
    cand, idx, nxt, sib = (
        inputs[k].cpu().tolist()
        for k in ("candidates", "retrive_index", "retrive_next_token", "retrive_next_sibling")
    )
    coins = inputs["uniform_samples"].cpu().tolist()
    predicts = torch.zeros(b * d, dtype=torch.int32)
    accept_index = torch.full((b, spec_tokens), -1, dtype=torch.int32)
    accept_num = torch.zeros(b, dtype=torch.int32)
    final_row, bonus_pos, rejected = [], [], []
    for bi in range(b):
        acc, row, coin = 0.0, 0, coins[bi][0]
        last = idx[bi][0]
        accept_index[bi, 0] = last
        n, cur, rej = 0, 0, []
        for _ in range(1, spec_tokens):
            cur = nxt[bi][cur]
            while cur != -1:
                p = pcand[bi][row][cur]
                acc = _f32(acc + p)
                if coin <= _f32(acc / threshold_acc) or p >= threshold_single:
                    acc, row, coin, rej = 0.0, cur, coins[bi][cur], []
                    predicts[last] = cand[bi][cur]
                    n += 1
                    accept_index[bi, n] = idx[bi][cur]
                    last = idx[bi][cur]
                    break
                rej.append(cand[bi][cur])  # the kernel writes target into draft_probs: no residual mass
                cur = sib[bi][cur]
            if cur == -1:
                break
        accept_num[bi] = n
        final_row.append(row)
        bonus_pos.append(last)
        rejected.append(rej if n != spec_tokens - 1 else [])
    rows = torch.tensor(final_row, dtype=torch.int64, device=tp.device)
    allowed = tp[torch.arange(b, device=tp.device), rows] > 0
    for bi, rej in enumerate(rejected):
        if rej:
            allowed[bi, torch.tensor(rej, device=tp.device)] = False
    bonus = torch.multinomial(allowed.float() * tp[torch.arange(b, device=tp.device), rows], 1).squeeze(1)
    predicts[torch.tensor(bonus_pos)] = bonus.cpu().to(torch.int32)
    return SpecSampleRef(predicts, accept_index, accept_num, torch.tensor(bonus_pos), allowed)


def check_tree_sampling(out: Any, ref: SpecSampleRef) -> Check:
    if isinstance(out, SpecSampleRef):
        out = (out.predicts, out.accept_index, out.accept_token_num)
    predicts, accept_index, accept_num = (t.detach().cpu() for t in out)
    walk = exact_check((accept_index, accept_num), (ref.accept_index, ref.accept_token_num), ("index", "num"))
    if tuple(predicts.shape) != tuple(ref.predicts.shape):
        return Check(False, float("inf"), 0.0, f"predicts shape {tuple(predicts.shape)}")
    not_bonus = torch.ones(predicts.numel(), dtype=torch.bool)
    not_bonus[ref.bonus_pos] = False
    drafts_bad = int((predicts[not_bonus].long() != ref.predicts[not_bonus].long()).sum())
    bonus = predicts[ref.bonus_pos].long()
    v = ref.allowed.shape[1]
    in_range = (bonus >= 0) & (bonus < v)
    ok_bonus = ref.allowed.cpu().gather(1, bonus.clamp(0, v - 1)[:, None]).squeeze(1) & in_range
    bonus_bad = int((~ok_bonus).sum())
    ok = walk.ok and drafts_bad == 0 and bonus_bad == 0
    detail = f"{walk.detail} accepted-token mismatches:{drafts_bad} bonus outside residual:{bonus_bad}"
    return Check(ok, max(walk.error, bonus_bad / max(1, len(bonus))), 0.0, detail)


def _bind_tree_sampling(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """draft_probs is written by the kernel (target mass of rejected tokens); repeated launches reject
    the same tokens and write the same values, so every launch does the same work."""
    outs = _verify_outputs(spec_dims(case), inputs["candidates"].device)
    keys = (
        "candidates",
        "retrive_index",
        "retrive_next_token",
        "retrive_next_sibling",
        "uniform_samples",
        "uniform_samples_final",
        "target_probs",
        "draft_probs",
    )
    args = [inputs[k] for k in keys]

    def launch() -> tuple[torch.Tensor, ...]:
        fn(*outs, *args, 1.0, 1.0, True)
        return outs

    return launch


@register
class TreeSpeculativeSamplingAdapter(Adapter):
    kernel = "tree_speculative_sampling_target_only"
    role = "spec"
    ops = ("eagle_info.tree_speculative_sampling",)
    description = "non-greedy tree verify: accept by target mass, sample the bonus from the residual"
    backends = [
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.tree_speculative_sampling_target_only.default",
            None,
            "aot",
            _bind_tree_sampling,
            preload=("sgl_kernel",),
            label=SGLANG_SM90,
        ),
    ]

    def applies(self, case: Case) -> bool:
        # The registry also lists eagle_worker.forward, whose spec dims are identical: measure once.
        return case.op in self.ops

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        gen = generator(seed)
        sd, (r_index, r_next, r_sib) = _verify_tree(case, gen)
        # Target distributions: tempered softmax, top-p renormalised (eagle_sample), sparse.
        rows = sd.b * sd.draft
        probs = make_probs(rows, sd.v, gen, device, lead=(2.0, 10.0))
        nominal, _, _ = top_p_sets(probs, torch.full((rows,), TOP_P, device=device))
        kept = probs * nominal
        target = (kept / kept.sum(-1, keepdim=True)).view(sd.b, sd.draft, sd.v)
        # children of node j are drawn from the target row of j (one independent draw per child slot)
        draws = torch.multinomial(kept, sd.draft, replacement=True, generator=device_generator(gen, device))
        cand = _draft_tokens(sd, r_next, r_sib, draws.view(sd.b, sd.draft, sd.draft), gen)
        return {
            "candidates": cand.to(device),
            "retrive_index": r_index.to(device),
            "retrive_next_token": r_next.to(device),
            "retrive_next_sibling": r_sib.to(device),
            "uniform_samples": torch.rand((sd.b, sd.draft), generator=gen).to(device),
            "uniform_samples_final": torch.rand((sd.b,), generator=gen).to(device),
            "target_probs": target.to(device),
            "draft_probs": torch.zeros((sd.b, sd.draft, sd.v), dtype=torch.float32, device=device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> SpecSampleRef:
        return tree_sampling_ref(inputs, spec_dims(case).spec_tokens)

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return check_tree_sampling(out, ref)

    def traffic(self, case: Case) -> Traffic:
        sd = spec_dims(case)
        b, d = sd.b, sd.draft
        touched = 2 * 4 * b * sd.v  # the final node's target row and draft row, per request
        small = 5 * 8 * b * d + 4 * b * d + 4 * b + 4 * b * (d + sd.spec_tokens + 1)
        return Traffic(
            bytes=touched + small, note="reads one target and one draft row per request, not all of them"
        )


# -- fast_topk -----------------------------------------------------------------------------------------


def _bind_fast_topk(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    probs, k = inputs["probs"], spec_dims(case).topk
    return lambda: tuple(fn(probs, k, -1))


def _bind_topk1(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # draft_topk1_postprocess(next_token_logits, positions) -> (topk_p = 1.0, topk_index); it also
    # advances positions by one per call. topk_p is constant by design: only the indices are checked.
    if spec_dims(case).topk != 1:
        raise ValueError("draft_topk1_postprocess is SGLang's topk == 1 path only")
    probs, positions = inputs["probs"], inputs["positions"]
    return lambda: fn(probs, positions)[1]


@register
class FastTopkAdapter(Adapter):
    kernel = "fast_topk"
    role = "spec"
    ops = ("eagle_worker.forward",)
    description = "top-k of the draft distribution [B*topk, V] (torch.max for topk 1)"
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.top_k:fast_topk",
            None,
            "torch",
            _bind_fast_topk,
            dispatches_to="torch.max (topk == 1) / torch.topk",
            label="plain PyTorch (torch.max / torch.topk): sgl-kernel has no custom kernel for it",
            note="pure PyTorch in sgl-kernel: no custom kernel",
        ),
        Backend(
            "sglang_triton.topk1",
            "sglang.kernels.ops.speculative.topk1:draft_topk1_postprocess",
            None,
            "triton",
            _bind_topk1,
            label=SGLANG_SM90,
            note="split-vocab argmax SGLang uses instead of fast_topk when topk == 1",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        sd = spec_dims(case)
        rows = sd.b * sd.topk
        gen = generator(seed)
        return {
            "probs": make_probs(rows, sd.v, gen, device),
            "positions": torch.randint(SEQ_LENS[0], SEQ_LENS[1], (rows,), generator=gen).to(device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = torch.topk(inputs["probs"].float(), spec_dims(case).topk, dim=-1)
        return values, indices

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        values, indices = (None, out) if isinstance(out, torch.Tensor) else (out[0], out[1])
        ref_values, ref_indices = ref
        if tuple(indices.shape) != tuple(ref_indices.shape):
            return Check(False, float("inf"), 0.0, f"indices shape {tuple(indices.shape)}")
        same = torch.equal(indices.cpu().long().sort(-1).values, ref_indices.cpu().long().sort(-1).values)
        tol = TOLERANCES["float32"]
        err = 0.0 if values is None else rel_error(values, ref_values)
        detail = ("indices match" if same else "indices differ") + (
            " (values not returned)" if values is None else ""
        )
        return Check(same and err <= tol, err, tol, detail)

    def traffic(self, case: Case) -> Traffic:
        sd = spec_dims(case)
        rows = sd.b * sd.topk
        return Traffic(
            bytes=4 * rows * sd.v + 12 * rows * sd.topk, note="read probs, write values + int64 ids"
        )
