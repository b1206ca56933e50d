"""Speculative-decoding adapters (dskbench.adapters.speculative) on CPU: the simulated EAGLE draft,
hand-built trees, the greedy and sampling walks, checks, traffic, and binders."""

from __future__ import annotations

import re

import pytest
import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.backends import KINDS
from dskbench.adapters.common.inputs import SGLANG_SM90, generator
from dskbench.adapters.speculative import tree as TREE
from dskbench.adapters.speculative import tree_sampling as TS
from dskbench.adapters.speculative import verify_greedy as VG
from dskbench.shapes.cases import Case, default_shapes

SHAPES = default_shapes()
TARGET = re.compile(r"^(torch\.ops(\.\w+){3}|[A-Za-z_]\w*(\.\w+)*:\w+(\.\w+)*)$")
KERNELS = (
    "fast_topk",
    "build_tree_kernel_efficient",
    "verify_tree_greedy",
    "tree_speculative_sampling_target_only",
)


def _case(kernel: str, b: int = 4) -> Case:
    a = get_adapter(kernel)
    return next(
        c for c in SHAPES.cases(kernel, list(a.ops), "spec", "decode", profile="cpu") if c.point["B"] == b
    )


def _custom(kernel: str, b: int, topk: int, steps: int, draft: int, v: int = 1000) -> Case:
    a = get_adapter(kernel)
    dims = {"B": b, "V": v, "topk": topk, "num_steps": steps, "num_draft": draft}
    return Case(kernel, a.ops[0], "decode", {"B": b}, dims)


def test_cases_use_sglang_mtp_defaults():
    sd = TREE.spec_dims(_case("verify_tree_greedy"))
    assert (sd.topk, sd.steps, sd.draft, sd.spec_tokens, sd.parent_width) == (1, 3, 4, 4, 3)


def test_duplicate_registry_op_is_measured_once():
    for kernel in ("verify_tree_greedy", "tree_speculative_sampling_target_only"):
        a = get_adapter(kernel)
        dup = SHAPES.cases(kernel, ["eagle_worker.forward"], "spec", "decode", profile="cpu")[0]
        assert not a.applies(dup) and a.applies(_case(kernel))


def test_simulated_draft_for_topk_1_is_a_chain():
    parent_list, selected = TREE.simulate_draft(TREE.SpecDims(3, 100, 1, 3, 4), generator(0))
    assert parent_list.tolist() == [[-1, 0, 1]] * 3 and selected.tolist() == [[0, 1, 2]] * 3


def test_simulated_draft_for_topk_2_is_a_valid_tree():
    sd = TREE.SpecDims(8, 100, 2, 3, 6)
    parent_list, selected = TREE.simulate_draft(sd, generator(1))
    assert parent_list.shape == (8, sd.parent_width) and selected.shape == (8, 5)
    for pl, sel in zip(parent_list.tolist(), selected.tolist(), strict=True):
        assert sel == sorted(sel)
        for i in range(1, 6):  # every selected node's parent is the root or selected itself
            tb = sel[i - 1] // 2
            assert tb == 0 or pl[tb] in sel


def test_build_tree_reference_on_a_chain():
    pl = torch.tensor([[-1, 0, 1], [-1, 0, 1]])
    sel = torch.tensor([[0, 1, 2], [0, 1, 2]])
    mask, pos, idx, nxt, sib = TREE.build_tree_ref(pl, sel, torch.tensor([5, 3]), 1, 4)
    assert pos.tolist() == [5, 6, 7, 8, 3, 4, 5, 6]
    assert idx.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert nxt.tolist() == [[1, 2, 3, -1]] * 2 and sib.tolist() == [[-1] * 4] * 2
    assert mask.numel() == (5 + 3) * 4 + 2 * 16
    first = mask[: 4 * 9].view(4, 9)
    assert bool(first[:, :5].all())  # the prefix: every draft token sees the whole context
    assert first[:, 5:].tolist() == [[i <= r for i in range(4)] for r in range(4)]  # lower-triangular chain
    second = mask[36:].view(4, 7)
    assert second[:, 3:].tolist() == first[:, 5:].tolist()


def test_build_tree_reference_with_siblings():
    # topk 2, 2 steps: nodes 1 and 2 are the root's children, node 3 (score index 2) hangs from node 1
    mask, pos, _, nxt, sib = TREE.build_tree_ref(
        torch.tensor([[-1, 0, 1]]), torch.tensor([[0, 1, 2]]), torch.tensor([2]), 2, 4
    )
    assert nxt.tolist() == [[1, 3, -1, -1]] and sib.tolist() == [[-1, 2, -1, -1]]
    assert pos.tolist() == [2, 3, 3, 4]
    rows = mask.view(4, 6)[:, 2:].tolist()
    assert rows == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]


def test_verify_greedy_reference_by_hand():
    r = TREE.build_tree_ref(torch.tensor([[-1, 0, 1]]), torch.tensor([[0, 1, 2]]), torch.tensor([9]), 1, 4)
    idx, nxt, sib = r[2:]
    pred, acc, num = VG.verify_greedy_ref(
        torch.tensor([[10, 11, 12, 13]]), idx, nxt, sib, torch.tensor([[11, 12, 99, 7]]), 4
    )
    assert pred.tolist() == [11, 12, 99, 0] and acc.tolist() == [[0, 1, 2, -1]] and num.tolist() == [2]
    r = TREE.build_tree_ref(torch.tensor([[-1, 0, 1]]), torch.tensor([[0, 1, 2]]), torch.tensor([9]), 2, 4)
    idx, nxt, sib = r[2:]
    pred, acc, num = VG.verify_greedy_ref(
        torch.tensor([[10, 20, 21, 30]]), idx, nxt, sib, torch.tensor([[21, 30, 5, 6]]), 3
    )
    # root's target 21: child 1 (20) rejected, its sibling 2 (21) accepted; node 2 is a leaf
    assert pred.tolist() == [21, 0, 5, 0] and acc.tolist() == [[0, 2, -1]] and num.tolist() == [1]


def _sampling_inputs(
    target: torch.Tensor, cand: list[list[int]], coins: list[list[float]], topk: int
) -> dict:
    b, d, _ = target.shape
    sel = torch.tensor([[0, 1, 2]] * b)
    _, _, idx, nxt, sib = TREE.build_tree_ref(
        torch.tensor([[-1, 0, 1]] * b), sel, torch.full((b,), 7), topk, d
    )
    return {
        "candidates": torch.tensor(cand),
        "retrive_index": idx,
        "retrive_next_token": nxt,
        "retrive_next_sibling": sib,
        "uniform_samples": torch.tensor(coins),
        "uniform_samples_final": torch.tensor([0.5] * b),
        "target_probs": target,
        "draft_probs": torch.zeros_like(target),
    }


def test_tree_sampling_reference_by_hand():
    target = torch.tensor(
        [[[0.1, 0.6, 0.3, 0.0], [0.2, 0.2, 0.1, 0.5], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 1.0, 0.0]]]
    )
    # chain root -> 1 -> 2 -> 3; node 1 (token 1, p 0.6 >= coin 0.5) accepted; node 2 (token 2, p 0.1 <
    # coin 0.7) rejected: the bonus comes from row 1 without token 2
    inp = _sampling_inputs(target, [[3, 1, 2, 0]], [[0.5, 0.7, 0.0, 0.0]], 1)
    ref = TS.tree_sampling_ref(inp, 4)
    assert ref.accept_index.tolist() == [[0, 1, -1, -1]] and ref.accept_token_num.tolist() == [1]
    assert ref.predicts[0] == 1 and ref.bonus_pos.tolist() == [1]
    assert ref.allowed[0].tolist() == [True, True, False, True]
    assert int(ref.predicts[1]) in (0, 1, 3)
    assert torch.equal(inp["draft_probs"], torch.zeros_like(target))  # reference leaves inputs alone


def test_tree_sampling_accumulates_sibling_mass():
    # root children 1 (token 0, p 0.3) and 2 (token 1, p 0.3); coin 0.5: first rejected, then 0.6 >= 0.5
    target = torch.tensor(
        [[[0.3, 0.3, 0.4, 0.0], [0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0], [1.0, 0, 0, 0]]]
    )
    inp = _sampling_inputs(target, [[2, 0, 1, 3]], [[0.5, 0.9, 0.9, 0.9]], 2)
    ref = TS.tree_sampling_ref(inp, 3)
    assert ref.accept_index.tolist() == [[0, 2, -1]] and ref.predicts[0] == 1
    assert ref.allowed[0].tolist() == [False, False, False, True]  # node 2 is a leaf: bonus from its row


def test_tree_sampling_check():
    a = get_adapter("tree_speculative_sampling_target_only")
    case = _case(a.kernel)
    inp = a.make_inputs(case, "cpu", 0)
    ref = a.reference(inp, case)
    assert a.check(ref, ref, case).ok
    out = (ref.predicts.clone(), ref.accept_index.clone(), ref.accept_token_num.clone())
    assert a.check(out, ref, case).ok
    wrong_num = (out[0], out[1], out[2] + 1)
    assert not a.check(wrong_num, ref, case).ok
    bonus = out[0].clone()
    forbidden = int((~ref.allowed[0]).nonzero()[0])
    bonus[ref.bonus_pos[0]] = forbidden
    assert not a.check((bonus, out[1], out[2]), ref, case).ok


def test_exact_checks_reject_a_wrong_link_or_acceptance():
    a = get_adapter("build_tree_kernel_efficient")
    case = _case(a.kernel)
    ref = a.reference(a.make_inputs(case, "cpu", 0), case)
    assert a.check(ref, ref, case).ok
    bad = [t.clone() for t in ref]
    bad[3][0, 0] = 2
    assert not a.check(tuple(bad), ref, case).ok
    v = get_adapter("verify_tree_greedy")
    vcase = _case(v.kernel)
    vref = v.reference(v.make_inputs(vcase, "cpu", 0), vcase)
    assert v.check(vref, vref, vcase).ok
    assert not v.check((vref[0], vref[1], vref[2] + 1), vref, vcase).ok


def test_generated_inputs_exercise_every_acceptance_length():
    for kernel in ("verify_tree_greedy", "tree_speculative_sampling_target_only"):
        a = get_adapter(kernel)
        case = _custom(kernel, 64, 1, 3, 4, v=8192)
        inp = a.make_inputs(case, "cpu", 3)
        ref = a.reference(inp, case)
        num = ref[2] if isinstance(ref, tuple) else ref.accept_token_num
        assert set(num.tolist()) == {0, 1, 2, 3}, kernel
        assert inp["candidates"].dtype == inp["retrive_index"].dtype == torch.int64


def test_traffic():
    b, d, v = 64, 4, 129280
    case = _custom("build_tree_kernel_efficient", b, 1, 3, d, v)
    assert (
        get_adapter("build_tree_kernel_efficient").traffic(case).bytes
        == 8 * (b * 3 + b * 3 + b) + b * 16 + 8 * b * 16
    )
    assert get_adapter("verify_tree_greedy").traffic(case).bytes == 40 * b * d + 4 * b * (d + 4 + 1)
    tr = get_adapter("tree_speculative_sampling_target_only").traffic(case)
    assert tr.bytes == 8 * b * v + 40 * b * d + 4 * b * d + 4 * b + 4 * b * (d + 4 + 1)
    assert get_adapter("fast_topk").traffic(case).bytes == 4 * b * v + 12 * b


# -- binders -------------------------------------------------------------------------------------------


def build_aot(parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
              retrive_next_token, retrive_next_sibling, topk, depth, draft_token_num, tree_mask_mode):  # fmt: skip
    assert (
        tree_mask_mode == TREE.FULL_MASK and bool(tree_mask.all()) and bool((retrive_next_token == -1).all())
    )
    assert verified_seq_len.dtype == torch.int64 and parent_list.shape[1] == topk * (depth - 1) + 1
    outs = TREE.build_tree_ref(parent_list, selected_index, verified_seq_len, topk, draft_token_num)
    for dst, src in zip(
        (tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling), outs, strict=True
    ):
        dst.copy_(src)


class _TritonKernel:
    """Stands in for a @triton.jit function: kernel[grid](*args, **constexprs)."""

    def __init__(self, body):
        self.body = body

    def __getitem__(self, grid):
        assert isinstance(grid, tuple)
        return self.body


def build_triton(parent_list, selected_index, verified_seq_len, seq_len_prefix_sum, tree_mask, positions,
                 retrieve_index, retrieve_next_token, retrieve_next_sibling, *, topk, depth, draft_token_num,
                 tree_mask_mode, batch_size, parent_list_stride, selected_index_stride):  # fmt: skip
    assert seq_len_prefix_sum.tolist() == (torch.cumsum(verified_seq_len, 0) - verified_seq_len).tolist()
    build_aot(parent_list, selected_index, verified_seq_len, tree_mask, positions, retrieve_index,
              retrieve_next_token, retrieve_next_sibling, topk, depth, draft_token_num, tree_mask_mode)  # fmt: skip


def verify_aot(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
               retrive_next_sibling, target_predict):  # fmt: skip
    assert predicts.dtype == accept_index.dtype == accept_token_num.dtype == torch.int32
    outs = VG.verify_greedy_ref(candidates, retrive_index, retrive_next_token, retrive_next_sibling,
                                target_predict, accept_index.shape[1])  # fmt: skip
    for dst, src in zip((predicts, accept_index, accept_token_num), outs, strict=True):
        dst.copy_(src)


def verify_triton(predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
                  retrieve_next_sibling, target_predict, *, batch_size, num_speculative_tokens, num_draft_tokens):  # fmt: skip
    assert num_speculative_tokens == accept_index.shape[1] and num_draft_tokens == candidates.shape[1]
    verify_aot(predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
               retrieve_next_sibling, target_predict)  # fmt: skip


def sampling_aot(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                 retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                 draft_probs, threshold_single=1.0, threshold_acc=1.0, deterministic=True):  # fmt: skip
    inputs = {
        "candidates": candidates,
        "retrive_index": retrive_index,
        "retrive_next_token": retrive_next_token,
        "retrive_next_sibling": retrive_next_sibling,
        "uniform_samples": uniform_samples,
        "target_probs": target_probs,
    }
    ref = TS.tree_sampling_ref(inputs, accept_index.shape[1], threshold_single, threshold_acc)
    for dst, src in zip(
        (predicts, accept_index, accept_token_num),
        (ref.predicts, ref.accept_index, ref.accept_token_num),
        strict=True,
    ):
        dst.copy_(src)


FAKES = {
    ("build_tree_kernel_efficient", "sgl_kernel"): build_aot,
    ("build_tree_kernel_efficient", "sglang_triton"): _TritonKernel(build_triton),
    ("verify_tree_greedy", "sgl_kernel"): verify_aot,
    ("verify_tree_greedy", "sglang_triton"): _TritonKernel(verify_triton),
    ("tree_speculative_sampling_target_only", "sgl_kernel"): sampling_aot,
}


@pytest.mark.parametrize("kernel", KERNELS[1:])
@pytest.mark.parametrize("topk", [1, 2])
def test_binders_follow_kernel_signatures(kernel, topk):
    a = get_adapter(kernel)
    case = _case(kernel) if topk == 1 else _custom(kernel, 3, 2, 3, 6)
    for b in a.backends:
        inp = a.make_inputs(case, "cpu", 5)
        ref = a.reference(inp, case)
        out = b.bind(FAKES[(kernel, b.name)], inp, case)()
        assert a.check(out, ref, case).ok, (kernel, b.name, a.check(out, ref, case).detail)


def test_fast_topk_binders():
    a = get_adapter("fast_topk")
    case = _case(a.kernel)

    def sgl_fast_topk(values, topk, dim):  # sgl_kernel.top_k.fast_topk, verbatim semantics
        return torch.max(values, dim=dim, keepdim=True) if topk == 1 else torch.topk(values, topk, dim=dim)

    def topk1(next_token_logits, positions, draft_tokens=None, draft_token_column=0):
        positions.add_(1)
        idx = next_token_logits.argmax(-1, keepdim=True)
        return torch.ones(idx.shape), idx

    inp = a.make_inputs(case, "cpu", 0)
    ref = a.reference(inp, case)
    pos0 = inp["positions"].clone()
    for b, fn in zip(a.backends, (sgl_fast_topk, topk1), strict=True):
        out = b.bind(fn, inp, case)()
        assert a.check(out, ref, case).ok, b.name
    assert torch.equal(inp["positions"], pos0 + 1)
    wrong = ref[1].clone()
    wrong[0, 0] = (wrong[0, 0] + 1) % 129280
    assert not a.check(wrong, ref, case).ok
    two = _custom(a.kernel, 2, 2, 3, 4)
    with pytest.raises(ValueError, match="topk == 1"):
        a.backends[1].bind(topk1, a.make_inputs(two, "cpu", 0), two)
    ref2 = a.reference(a.make_inputs(two, "cpu", 0), two)
    assert a.check((ref2[0], ref2[1].flip(-1)), ref2, two).ok  # the top-k indices compare as sets


@pytest.mark.parametrize("kernel", KERNELS)
def test_backends_are_well_formed(kernel):
    a = get_adapter(kernel)
    assert len({b.name for b in a.backends}) == len(a.backends)
    for b in a.backends:
        assert TARGET.match(b.target) and b.kind in KINDS and b.requires.sm is None
        if b.target.startswith("torch.ops."):
            assert b.preload == ("sgl_kernel",)
    assert len([b for b in a.backends if b.label == SGLANG_SM90]) == 1
    if kernel == "fast_topk":
        sgl = a.backends[0]
        assert sgl.kind == "torch" and "torch.max" in sgl.dispatches_to
        assert sgl.label.startswith("plain PyTorch") and "torch.topk" in sgl.label  # shown with results
