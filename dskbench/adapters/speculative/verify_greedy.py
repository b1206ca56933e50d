"""`verify_tree_greedy`: the greedy acceptance walk over the draft tree.

SGLang 0.5.16 on sm90 (all-greedy batches): `verify_tree_greedy_func` -> sgl-kernel AOT
`verify_tree_greedy` (labelled); the Triton twin `verify_tree_greedy_kernel_triton` is the XPU path.
The reference mirrors the CUDA kernel's walk and is compared exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common.inputs import SGLANG_SM90, exact_check, generator
from dskbench.adapters.speculative.tree import draft_tokens, spec_dims, verify_outputs, verify_tree
from dskbench.shapes.cases import Case


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
    outs = verify_outputs(spec_dims(case), inputs["candidates"].device)
    args = [inputs[k] for k in ("candidates", "retrive_index", "retrive_next_token", "retrive_next_sibling")]
    tgt = inputs["target_predict"]

    def launch() -> tuple[torch.Tensor, ...]:
        fn(*outs, *args, tgt)
        return outs

    return launch


def _bind_verify_triton(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    sd = spec_dims(case)
    outs = verify_outputs(sd, inputs["candidates"].device)
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
        sd, (r_index, r_next, r_sib) = verify_tree(case, gen)
        # The target's argmax at each node: one of its children's tokens most of the time.
        target = torch.randint(0, sd.v, (sd.b, sd.draft), generator=gen, dtype=torch.int64)
        proposals = target[:, :, None].expand(sd.b, sd.draft, sd.draft)
        cand = draft_tokens(sd, r_next, r_sib, proposals, gen)
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
