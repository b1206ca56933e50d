"""`tree_speculative_sampling_target_only`: the non-greedy tree verify.

SGLang 0.5.16 on sm90: `eagle_sample` -> sgl-kernel AOT `tree_speculative_sampling_target_only`
(labelled) with draft_probs = zeros and thresholds 1.0 (server defaults). `chain_speculative_sampling_triton`
is a different algorithm (classic rejection sampling with real draft probs) and is not a backend here.

Candidates are drawn from the target distribution (tempered, top-p 0.95 renormalised, with confident
rows). The walk is compared exactly; the final token is checked for membership in the residual
distribution's support.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common.inputs import SGLANG_SM90, device_generator, exact_check, generator
from dskbench.adapters.sampling.filters import make_probs, top_p_sets
from dskbench.adapters.speculative.tree import draft_tokens, spec_dims, verify_outputs, verify_tree
from dskbench.shapes.cases import Case

TOP_P = 0.95  # target probs are top-p renormalised, as eagle_sample does


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
    outs = verify_outputs(spec_dims(case), inputs["candidates"].device)
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
        sd, (r_index, r_next, r_sib) = verify_tree(case, gen)
        # Target distributions: tempered softmax, top-p renormalised (eagle_sample), sparse.
        rows = sd.b * sd.draft
        probs = make_probs(rows, sd.v, gen, device, lead=(2.0, 10.0))
        nominal, _, _ = top_p_sets(probs, torch.full((rows,), TOP_P, device=device))
        kept = probs * nominal
        target = (kept / kept.sum(-1, keepdim=True)).view(sd.b, sd.draft, sd.v)
        # children of node j are drawn from the target row of j (one independent draw per child slot)
        draws = torch.multinomial(kept, sd.draft, replacement=True, generator=device_generator(gen, device))
        cand = draft_tokens(sd, r_next, r_sib, draws.view(sd.b, sd.draft, sd.draft), gen)
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
