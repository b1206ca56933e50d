"""MoE routing adapters (dskbench.adapters.routing) on CPU: inputs, references, tie-tolerant checks, traffic."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from dskbench.adapters import adapters, get_adapter
from dskbench.adapters.common.routing import (
    deepseek_routing,
    grouped_choice,
    routing_margin,
    select_experts,
)
from dskbench.shapes.cases import Case, default_shapes

KERNELS = ("moe_fused_gate", "topk_softmax", "topk_sigmoid")
TARGET = re.compile(r"^(torch\.ops(\.\w+){3}|[A-Za-z_]\w*(\.\w+)*:\w+(\.\w+)*)$")
SHAPES = default_shapes()


def _case(kernel: str, t: int, phase: str = "decode") -> Case:
    cases = SHAPES.cases(kernel, ["topk"], "topk", phase, profile="full")
    return next(c for c in cases if c.point["T"] == t)


def _grouped_topk_f64(logits, bias, k, n_group, topk_group, scale=None):
    """The float64 grouped top-k the moe_fused_gate reference computes."""
    scores, _, masked = grouped_choice(logits, bias, n_group, topk_group, torch.float64)
    return select_experts(scores, masked, k, scale=scale, sorted=True)


def _naive_grouped_topk(logits, bias, k, n_group, topk_group, scale):
    """Row-by-row Python version of DeepSeek's routing (independent of the tensor code)."""
    out_w, out_ids = [], []
    for lg in logits.double().tolist():
        s = [1 / (1 + math.exp(-x)) for x in lg]
        b = [si + bi for si, bi in zip(s, bias.double().tolist(), strict=True)]
        per = len(b) // n_group
        gscore = [sum(sorted(b[g * per : (g + 1) * per], reverse=True)[:2]) for g in range(n_group)]
        keep = sorted(range(n_group), key=lambda g: -gscore[g])[:topk_group]
        cand = [e for g in keep for e in range(g * per, (g + 1) * per)]
        ids = sorted(cand, key=lambda e: -b[e])[:k]
        tot = sum(s[e] for e in ids)
        out_ids.append(ids)
        out_w.append([s[e] / tot * scale for e in ids])
    return torch.tensor(out_w), torch.tensor(out_ids)


def test_registered():
    reg = adapters()
    for k in KERNELS:
        a = reg[k]()
        assert a.role == "topk" and a.ops == ("topk",)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("t", [1, 64])
def test_inputs_and_reference_shapes(kernel, t):
    a = get_adapter(kernel)
    c = _case(kernel, t)
    assert c.dims == {"T": t, "E": 256, "K": 8, "n_group": 8, "topk_group": 4}
    x = a.make_inputs(c, "cpu", 0)
    assert x["gating_output"].shape == (t, 256) and x["gating_output"].dtype == torch.float32
    if kernel != "topk_softmax":
        assert x["correction_bias"].shape == (256,) and x["correction_bias"].dtype == torch.float32
    before = {k: v.clone() for k, v in x.items()}
    w, ids, choice = a.reference(x, c)
    assert all(torch.equal(before[k], x[k]) for k in x)  # reference must not mutate inputs
    assert w.shape == ids.shape == (t, 8) and w.dtype == torch.float32 and ids.dtype == torch.int32
    assert choice.shape == (t, 256)
    assert a.check((w, ids), (w, ids, choice), c).ok


def test_moe_fused_gate_reference_matches_naive_loop():
    r = deepseek_routing(6, seed=3)
    logits, bias = r.logits, r.bias
    w, ids = _grouped_topk_f64(logits, bias, 8, 8, 4, 2.5)
    nw, nids = _naive_grouped_topk(logits, bias, 8, 8, 4, 2.5)
    for r in range(6):
        assert sorted(ids[r].tolist()) == sorted(nids[r].tolist())
        got = dict(zip(ids[r].tolist(), w[r].tolist(), strict=True))
        for e, want in zip(nids[r].tolist(), nw[r].tolist(), strict=True):
            assert got[e] == pytest.approx(want, rel=1e-6)
    assert torch.allclose(w.double().sum(-1), torch.full((6,), 2.5, dtype=torch.float64))


def test_grouped_routing_hand_example():
    # 4 groups of 4; group scores (top-2 sums) rank groups 3, 1 first; top-3 experts come from them only,
    # although expert 0 (group 0) alone outscores most of them.
    lg = torch.full((1, 16), -4.0)
    lg[0, 0] = 3.0  # group 0: one strong expert, weak partner
    lg[0, [4, 5]] = torch.tensor([2.0, 1.5])  # group 1
    lg[0, [12, 13]] = torch.tensor([2.5, 2.4])  # group 3
    w, ids = _grouped_topk_f64(lg, torch.zeros(16), 3, 4, 2)
    assert ids.tolist() == [[12, 13, 4]]
    s = torch.sigmoid(torch.tensor([2.5, 2.4, 2.0], dtype=torch.float64))
    assert torch.allclose(w.double(), (s / s.sum()).unsqueeze(0), rtol=1e-6)


def test_topk_softmax_and_sigmoid_references():
    sm, sg = get_adapter("topk_softmax"), get_adapter("topk_sigmoid")
    c = Case(
        "topk_softmax", "topk", "decode", {"T": 1}, {"T": 1, "E": 4, "K": 2, "n_group": 1, "topk_group": 1}
    )
    lg = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    w, ids, _ = sm.reference({"gating_output": lg}, c)
    assert ids.tolist() == [[1, 2]]
    e = torch.exp(torch.tensor([2.0, 1.0], dtype=torch.float64))
    assert torch.allclose(w.double(), (e / e.sum()).unsqueeze(0))
    # the bias ranks expert 3 first (0.27 + 0.9) and drops expert 2; weights stay the unbiased sigmoids
    w, ids, _ = sg.reference({"gating_output": lg, "correction_bias": torch.tensor([0.0, 0.0, 0.0, 0.9])}, c)
    assert ids.tolist() == [[3, 1]]
    s = torch.sigmoid(torch.tensor([-1.0, 2.0], dtype=torch.float64))
    assert torch.allclose(w.double(), (s / s.sum()).unsqueeze(0))


def test_inputs_route_unevenly():
    a = get_adapter("moe_fused_gate")
    c = Case(
        "moe_fused_gate",
        "topk",
        "decode",
        {"T": 4096},
        {"T": 4096, "E": 256, "K": 8, "n_group": 8, "topk_group": 4},
        model=SHAPES.config,  # routed_scaling_factor
    )
    _, ids, _ = a.reference(a.make_inputs(c, "cpu", 0), c)
    cnt = torch.bincount(ids.flatten().long(), minlength=256).float()
    assert float(cnt.max() / cnt.mean()) > 1.5  # hot experts exist, as with a trained router


# -- the tie-tolerant check ----------------------------------------------------------------------------


def _gate_ref(t=32, seed=0):
    a = get_adapter("moe_fused_gate")
    c = Case(
        "moe_fused_gate",
        "topk",
        "decode",
        {"T": t},
        {"T": t, "E": 256, "K": 8, "n_group": 8, "topk_group": 4},
        model=SHAPES.config,  # routed_scaling_factor
    )
    x = a.make_inputs(c, "cpu", seed)
    return a, c, x, a.reference(x, c)


def test_check_passes_fp32_kernel_emulation():
    a, c, x, ref = _gate_ref(t=512)
    s = x["gating_output"].sigmoid()  # fp32 all the way, as the CUDA/Triton kernels
    b = s + x["correction_bias"]
    g = b.view(512, 8, 32).topk(2, -1).values.sum(-1).topk(4, -1).indices
    keep = torch.zeros(512, 8, dtype=torch.bool).scatter_(1, g, True).repeat_interleave(32, 1)
    ids = b.masked_fill(~keep, float("-inf")).topk(8, -1).indices
    w = s.gather(1, ids)
    w = w / w.sum(-1, keepdim=True) * 2.5
    shuffled = torch.randperm(8, generator=torch.Generator().manual_seed(0))  # order within a row is free
    chk = a.check((w[:, shuffled], ids[:, shuffled].int()), ref, c)
    assert chk.ok, chk.detail


def test_check_allows_ties_and_rejects_wrong_sets():
    a, c, x, ref = _gate_ref()
    w, ids, choice = ref
    # a tie: make row 0's 8th expert and an unchosen expert of a kept group score the same
    ids0 = ids[0].long()
    group = int(ids0[-1]) // 32
    other = next(e for e in range(group * 32, group * 32 + 32) if e not in ids0.tolist())
    choice = choice.clone()
    choice[0, other] = choice[0, ids0[-1]]
    swapped = ids.clone()
    swapped[0, -1] = other
    assert a.check((w, swapped), (w, ids, choice), c).ok
    # the tied expert brings its own weight (its score without the bias differs): that row's weights are
    # not compared, and the check says why; the same weights on a row with the reference's experts fail
    w_tie = w.clone()
    w_tie[0, -1] *= 1.01
    chk = a.check((w_tie, swapped), (w, ids, choice), c)
    assert chk.ok and "1 rows chose another of two near-tied experts" in chk.detail
    assert not a.check((w_tie, ids), (w, ids, choice), c).ok
    # without the tie the same swap is a wrong expert set
    assert not a.check((w, swapped), ref, c).ok
    dup = ids.clone()
    dup[1, 1] = dup[1, 0]
    assert "1/32 rows" in a.check((w, dup), ref, c).detail
    assert not a.check((w * 1.01, ids), ref, c).ok  # weights off by 1%
    assert not a.check((w[:, :7], ids[:, :7]), ref, c).ok


def test_check_rejects_experts_from_too_many_groups():
    a, c, x, ref = _gate_ref()
    w, ids, choice = ref
    # flat top-8 over the biased scores ignores the group restriction; where it differs it must fail,
    # even though its selected scores are higher
    flat = choice.topk(8, -1).indices.int()
    differs = (flat.sort(-1).values != ids.sort(-1).values).any(-1)
    assert differs.any()
    assert not a.check((w, flat), ref, c).ok


def _swap_fourth_and_fifth_group(choice: torch.Tensor, ids: torch.Tensor, gap: float):
    """Row 0 re-scored so that the 5th-best group trails the 4th by `gap` (relative), and the ids a
    kernel gets when it ranks those two the other way round."""
    choice = choice.clone()
    row = choice[0].view(8, 32)
    gs = row.topk(2, -1).values.sum(-1)
    order = gs.argsort(descending=True)
    g4, g5 = int(order[3]), int(order[4])
    top = int(row[g5].argmax())
    row[g5, top] += gs[g4] * (1 - gap) - gs[g5]  # the 5th group's sum now just under the 4th's
    keep = torch.zeros(8, dtype=torch.bool)
    keep[order[:3]] = True
    keep[g5] = True
    swapped = ids.clone()
    swapped[0] = choice[0].masked_fill(~keep.repeat_interleave(32), float("-inf")).topk(8).indices.int()
    return choice, swapped


def test_check_accepts_a_near_tie_between_groups_only():
    a, c, x, ref = _gate_ref()
    w, ids, choice = ref
    near, swapped = _swap_fourth_and_fifth_group(choice, ids, 1e-9)
    assert not torch.equal(swapped[0].sort().values, ids[0].sort().values)  # other experts
    wrong_w = w.clone()
    wrong_w[0] = w[0].flip(0) * 0.5  # that row's weights are not compared: other experts, other weights
    chk = a.check((wrong_w, swapped), (w, ids, near), c)
    assert chk.ok and "1 rows chose another of two near-tied expert groups" in chk.detail
    assert not a.check((w * 1.01, swapped), (w, ids, near), c).ok  # the other rows' weights still count
    far, swapped_far = _swap_fourth_and_fifth_group(choice, ids, 1e-2)
    assert not a.check((w, swapped_far), (w, ids, far), c).ok  # a 1% gap is a wrong group


# -- traffic and backends ------------------------------------------------------------------------------


def test_traffic_counts():
    c = _case("moe_fused_gate", 64)
    t = get_adapter("moe_fused_gate").traffic(c)
    assert t.bytes == 64 * 256 * 4 + 256 * 4 + 64 * 8 * 8 and t.flops == 64 * 256 * 6
    t = get_adapter("topk_softmax").traffic(c)
    assert t.bytes == 64 * 256 * 4 + 64 * 8 * 8 and t.flops == 64 * 256 * 4
    assert get_adapter("topk_sigmoid").traffic(c).bytes == 64 * 256 * 4 + 256 * 4 + 64 * 8 * 8


@pytest.mark.parametrize("kernel", KERNELS)
def test_backends_well_formed(kernel):
    a = get_adapter(kernel)
    names = [b.name for b in a.all_backends()]
    assert len(names) == len(set(names))
    for b in a.backends:
        for target in (b.target, *b.fallbacks):
            assert TARGET.match(target), target


def test_gate_backends_follow_sglang():
    be = {b.name: b for b in get_adapter("moe_fused_gate").backends}
    assert be["flashinfer"].target == "flashinfer.fused_moe:fused_topk_deepseek"
    assert 90 in be["flashinfer"].requires.sm  # sm89..121, so it runs on Hopper
    assert be["sglang_triton"].fallbacks == ("sgl_kernel.moe:moe_fused_gate",)


def test_gate_binders_call_each_signature():
    a = get_adapter("moe_fused_gate")
    c = _case("moe_fused_gate", 16)
    x = a.make_inputs(c, "cpu", 0)
    seen = []

    def flashinfer_like(
        scores, bias, n_group, topk_group, topk, scale, values, indices, launch_with_pdl=True
    ):
        seen.append(("fi", n_group, topk_group, topk, scale, tuple(values.shape), indices.dtype))

    def triton_like(scores, bias, topk, scoring_func="sigmoid", **kw):
        seen.append(
            (
                "triton",
                topk,
                scoring_func,
                kw["num_expert_group"],
                kw["topk_group"],
                kw["routed_scaling_factor"],
            )
        )
        return None, None

    def retired_aot(
        input_tensor, bias, num_expert_group, topk_group, topk, shared=0, scale=0.0, on_out=False
    ):
        seen.append(("aot", num_expert_group, topk_group, topk, scale, on_out))
        return None, None

    be = {b.name: b for b in a.backends}
    w, ids = be["flashinfer"].bind(flashinfer_like, x, c)()
    assert w.shape == (16, 8) and ids.dtype == torch.int32
    be["sglang_triton"].bind(triton_like, x, c)()
    be["sglang_triton"].bind(retired_aot, x, c)()
    assert seen == [
        ("fi", 8, 4, 8, 2.5, (16, 8), torch.int32),
        ("triton", 8, "sigmoid", 8, 4, 2.5),
        ("aot", 8, 4, 8, 2.5, True),
    ]


def test_gate_scale_comes_from_the_case_model():
    a = get_adapter("moe_fused_gate")
    c = _case("moe_fused_gate", 16)
    x = a.make_inputs(c, "cpu", 0)
    w, ids, _ = a.reference(x, c)
    unscaled = dataclasses.replace(c, model={**c.model, "routed_scaling_factor": 1.0})
    w1, ids1, _ = a.reference(x, unscaled)
    assert torch.equal(ids, ids1) and torch.allclose(w, w1 * 2.5)
    seen = []
    be = {b.name: b for b in a.backends}
    be["sglang_triton"].bind(lambda *args, **kw: seen.append(kw["routed_scaling_factor"]), x, unscaled)()
    assert seen == [1.0]


def test_gate_reference_is_the_moe_routing_in_float64():
    """The routing adapters and the MoE adapters route with one implementation (common.routing)."""
    r = deepseek_routing(512, seed=4)
    w, ids = _grouped_topk_f64(r.logits, r.bias, 8, 8, 4)
    clear = routing_margin(r.logits, r.bias, 8, 8, 4) > 1e-5  # fp32 and float64 may split near-ties
    assert int(clear.sum()) > 500
    assert torch.equal(ids[clear].sort(-1).values, r.topk_ids[clear].sort(-1).values)
    assert torch.allclose(w[clear].sort(-1).values, r.topk_weights[clear].sort(-1).values, rtol=1e-5)
