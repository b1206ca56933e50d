"""DeepSeek-V3.2 top-k and act_quant adapters on CPU: the masked top-k reference against a per-row sort,
the tie-tolerant set check, the page-table/ragged transforms, and act_quant's ue8m0 block quantisation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.nsa import topk as TK
from dskbench.shapes.cases import Case, default_shapes

SHAPES = default_shapes()


def _case(kernel: str, t: int, reqs: int, max_len: int, topk: int = 8) -> Case:
    a = get_adapter(kernel)
    phase = "decode" if reqs == t else "prefill"
    op = a.ops[0]
    dims = {"T": t, "reqs": reqs, "max_len": max_len, "topk": topk}
    return Case(kernel, op, phase, {"T": t}, dims)


KERNELS = ["fast_topk_v2", "fast_topk_transform_fused", "fast_topk_transform_ragged_fused"]


def test_v32_cases_come_from_the_shapes_file():
    a = get_adapter("fast_topk_v2")
    cases = SHAPES.cases(a.kernel, list(a.ops), a.role, "decode", profile="cpu")
    assert cases and all(c.dims["topk"] == 2048 and c.dims["reqs"] == c.dims["T"] for c in cases)
    e = get_adapter("fast_topk_transform_ragged_fused")
    pre = SHAPES.cases(e.kernel, ["nsa_backend.forward_extend"], e.role, "prefill", profile="cpu")
    assert pre and all(c.dims["max_len"] == c.dims["T"] and c.dims["reqs"] == 2 for c in pre)
    q = get_adapter("act_quant")
    qc = SHAPES.cases(q.kernel, list(q.ops), q.role, "decode", profile="cpu")
    assert {c.variant for c in qc} == {"q", "k"} and all(c.dims["block"] == 128 for c in qc)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("t,reqs,max_len", [(4, 4, 20), (4, 4, 6), (12, 2, 12)])
def test_reference_is_a_per_row_sort_and_passes_its_check(kernel, t, reqs, max_len):
    a = get_adapter(kernel)
    case = _case(kernel, t, reqs, max_len)
    inp = a.make_inputs(case, "cpu", 3)
    ref = a.reference(inp, case)
    out = a.reference_output(ref)
    assert out.shape == (t, 8) and out.dtype == torch.int32
    local = TK.layout(case)[3]
    for i, n in enumerate(TK.row_lengths(case)):
        start = 0 if inp["row_starts"] is None else int(inp["row_starts"][i])
        row = inp["score"][i, start : start + n]
        want = set(torch.argsort(row, descending=True)[: min(8, n)].tolist())
        got = out[i][out[i] >= 0].tolist()
        if kernel == "fast_topk_transform_ragged_fused":
            got = [g - int(inp["offsets"][i]) for g in got]
        if kernel == "fast_topk_transform_fused":
            b = int(inp["batch"][i])
            pt = inp["page_table"][b].tolist()
            got = [pt.index(g) for g in got]
            assert all(0 <= x < local for x in got)
        assert set(got) == want and len(got) == min(8, n)
    assert a.check(out, ref, case).ok
    # a shuffled row order within each row is still right
    assert a.check(out[:, torch.randperm(8)], ref, case).ok


@pytest.mark.parametrize("kernel", KERNELS)
def test_check_rejects_wrong_sets(kernel):
    a = get_adapter(kernel)
    case = _case(kernel, 12, 2, 12) if "ragged" in kernel else _case(kernel, 4, 4, 20)
    inp = a.make_inputs(case, "cpu", 4)
    ref = a.reference(inp, case)
    out = a.reference_output(ref).clone()
    dup = out.clone()
    dup[0, 1] = dup[0, 0]
    assert not a.check(dup, ref, case).ok
    short = out.clone()
    short[-1, 0] = -1
    assert not a.check(short, ref, case).ok
    if kernel != "fast_topk_transform_ragged_fused":
        # a real position outside the top-k set (the worst one in row 0)
        s = ref["scores"][0]
        worst = int(torch.argmin(torch.where(torch.isinf(s), torch.inf, s)))
        bad = TK.transform(torch.tensor([[worst]], dtype=torch.int32), inp, a.method)
        wrong = out.clone()
        wrong[0, 0] = bad[0, 0] if kernel == "fast_topk_transform_fused" else worst
        if kernel == "fast_topk_transform_fused":
            wrong[0, 0] = inp["page_table"][0, worst]
        assert not a.check(wrong, ref, case).ok
    if kernel == "fast_topk_transform_fused":
        other = out.clone()
        other[0, 0] = inp["page_table"][1, 0]  # another request's slot
        assert not a.check(other, ref, case).ok


def test_ties_at_the_kth_score_are_allowed():
    a = get_adapter("fast_topk_v2")
    case = _case("fast_topk_v2", 1, 1, 6, topk=2)
    inp = a.make_inputs(case, "cpu", 0)
    inp["score"] = torch.tensor([[5.0, 3.0, 3.0, 3.0, 1.0, 0.0]])
    inp["lengths"] = torch.tensor([6], dtype=torch.int32)
    ref = a.reference(inp, case)
    for second in (1, 2, 3):
        assert a.check(torch.tensor([[0, second]], dtype=torch.int32), ref, case).ok
    assert not a.check(torch.tensor([[1, 2]], dtype=torch.int32), ref, case).ok  # misses the 5.0


def test_act_quant_reference_is_ue8m0_block_quantisation():
    a = get_adapter("act_quant")
    case = Case(
        "act_quant", "nsa_indexer.forward", "decode", {"T": 3}, {"T": 3, "heads": 4, "D": 256, "block": 128}
    )
    x = a.make_inputs(case, "cpu", 5)["x"]
    q, s = a.reference({"x": x}, case)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (3, 4, 2) and s.dtype == torch.float32
    blocks = x.float().view(3, 4, 2, 128)
    amax = blocks.abs().amax(-1).clamp_min(1e-4)
    want = torch.tensor(2.0) ** torch.ceil(torch.log2(amax / 448.0))
    assert torch.equal(s, want)
    deq = (q.float().view(3, 4, 2, 128) * s[..., None]).view_as(x)
    assert ((deq - x.float()).norm() / x.float().norm()) < 0.05
    assert a.check((q, s), (q, s), case).ok
    assert not a.check((q, s * 2), (q, s), case).ok
    assert not a.check((q, s.to(torch.bfloat16)), (q, s), case).ok


def test_binders_call_the_library_signatures():
    calls = {}

    def fake(*args, **kw):
        calls["args"], calls["kw"] = args, kw

    a = get_adapter("fast_topk_transform_fused")
    case = _case(a.kernel, 4, 4, 20)
    inp = a.make_inputs(case, "cpu", 0)
    next(b for b in a.backends if b.name == "sgl_kernel").bind(fake, inp, case)()
    assert set(calls["kw"]) == {"score", "lengths", "page_table_size_1", "cu_seqlens_q", "topk", "row_starts"}
    assert calls["kw"]["cu_seqlens_q"].tolist() == [0, 1, 2, 3, 4] and calls["kw"]["row_starts"] is None
    fi = next(b for b in a.backends if b.name == "flashinfer")
    assert fi.skip(dataclasses.replace(case, dims={**case.dims, "reqs": 2})) is not None
    assert fi.skip(case) is None


def test_traffic_reads_no_score_of_a_row_within_topk():
    # 12 tokens, 2 requests of 6: causal lengths 1..6 twice; topk 8 > every length: no score is needed
    short = _case("fast_topk_transform_ragged_fused", 12, 2, 12, topk=8)
    meta = 4 * 12 * 3  # length, row start, offset per row
    assert get_adapter("fast_topk_transform_ragged_fused").traffic(short).bytes == meta + 4 * 12 * 8
    # topk 4: rows of length 5 and 6 read their valid scores, the others none
    longer = dataclasses.replace(short, dims={**short.dims, "topk": 4})
    scores = 4 * (5 + 6) * 2
    assert get_adapter("fast_topk_transform_ragged_fused").traffic(longer).bytes == scores + meta + 4 * 12 * 4


def test_paged_traffic_gathers_one_entry_per_chosen_position():
    # decode, 4 rows of lengths 20, 18, 15, 13 (kv_len 20 down to half), topk 16
    case = _case("fast_topk_transform_fused", 4, 4, 20, topk=16)
    lengths = TK.row_lengths(case)
    scores = 4 * sum(n for n in lengths if n > 16)
    gather = 4 * sum(min(n, 16) for n in lengths)
    meta = 4 * 4 + 4 * 5  # lengths, cu_seqlens_q
    assert get_adapter("fast_topk_transform_fused").traffic(case).bytes == scores + gather + meta + 4 * 4 * 16
    plain = get_adapter("fast_topk_v2").traffic(case).bytes
    assert plain == scores + 4 * 4 + 4 * 4 * 16
