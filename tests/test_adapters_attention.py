"""Attention adapters (dskbench.adapters.attention) on CPU: inputs, references against float64 loops,
page-table views, skips, traffic against hand-counted numbers, backend declarations."""

from __future__ import annotations

import math
import re

import pytest
import torch

from dskbench.adapters import adapters, get_adapter
from dskbench.adapters.attention import merge_state as MS
from dskbench.adapters.attention import mha_prefill as MP
from dskbench.adapters.attention import mla as MLA
from dskbench.adapters.attention import mla_decode as MD
from dskbench.adapters.attention import mla_decode_triton as MDT
from dskbench.adapters.backends import SM100
from dskbench.shapes.cases import Case, default_shapes

SHAPES = default_shapes()
TARGET = re.compile(r"^(torch\.ops(\.\w+){3}|[A-Za-z_]\w*(\.\w+)*:\w+(\.\w+)*)$")
DECODE = (
    "BatchMLAPagedAttentionWrapper",
    "decode_attention_kernel",
    "cutlass_mla_decode",
    "trtllm_batch_decode_with_kv_cache_mla",
    "xqa_batch_decode_with_kv_cache_mla",
)
PREFILL = ("extend_attention_kernel", "prefill_attention_kernel", "trtllm_ragged_attention_deepseek")
OTHER = ("merge_state", "merge_state_v2", "concat_mla_k", "concat_mla_absorb_q")
SM100_ONLY = (
    "cutlass_mla_decode",
    "trtllm_batch_decode_with_kv_cache_mla",
    "trtllm_ragged_attention_deepseek",
)


def _cases(kernel: str, profile: str = "cpu", tp: int = 1) -> list[Case]:
    a = get_adapter(kernel)
    phase = "prefill" if a.role in ("mha_prefill", "merge_state", "concat_k") else "decode"
    return SHAPES.cases(kernel, list(a.ops), a.role, phase, profile=profile, tp=[tp])


def test_softmax_scale_is_sglang_deepseek_scaling():
    mscale = 0.1 * math.log(40) + 1
    assert MLA.mla_softmax_scale(192) == pytest.approx(mscale**2 / math.sqrt(192))
    assert MLA.mla_softmax_scale(192) == pytest.approx(0.13523, abs=1e-5)
    case = _cases("decode_attention_kernel")[0]
    assert MLA.case_softmax_scale(case) == MLA.mla_softmax_scale(int(SHAPES.config["Dq"]))  # the case's model


# -- MLA decode ------------------------------------------------------------------------------------------


def test_page_views_address_the_same_rows():
    pages = torch.tensor([3, 0], dtype=torch.int32)
    slots = MD.token_slots(pages, 130)
    assert slots[:128].tolist() == list(range(384, 512)) and slots[128:].tolist() == [0, 1]
    sub = MD.sub_pages(pages.unsqueeze(0), 64)
    assert sub.tolist() == [[6, 7, 0, 1]] and sub.dtype == torch.int32
    via64 = (sub[0].long().unsqueeze(1) * 64 + torch.arange(64)).flatten()[:130]
    assert torch.equal(via64, slots)
    assert torch.equal(MD.sub_pages(pages.unsqueeze(0), 1)[0].long()[:130], slots)


def test_token_indices_concatenate_requests():
    inputs = {"page_table": torch.tensor([[1], [0]], dtype=torch.int32), "seq_lens": torch.tensor([3, 2])}
    indptr, idx = MD.token_indices(inputs, torch.int64)
    assert indptr.tolist() == [0, 3, 5] and idx.tolist() == [128, 129, 130, 0, 1]


def test_mla_decode_reference_against_float64_loop():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 576, generator=gen).to(torch.bfloat16)
    kv = torch.randn(3 * 128, 576, generator=gen).to(torch.bfloat16)
    pt = torch.tensor([[2, 0], [1, 2]], dtype=torch.int32)
    lens = torch.tensor([130, 5], dtype=torch.int32)
    out = MD.mla_decode_reference(q, kv, pt, lens, 0.05, 64)
    assert out.shape == (2, 3, 512) and out.dtype == torch.float32
    for b, length in enumerate(lens.tolist()):
        rows = [int(pt[b, i // 128]) * 128 + i % 128 for i in range(length)]
        kvb = kv[rows].double()
        for h in range(3):
            s = [float(q[b, h].double() @ kvb[j]) * 0.05 for j in range(length)]
            m = max(s)
            w = torch.tensor([math.exp(x - m) for x in s], dtype=torch.float64)
            want = (w / w.sum()) @ kvb[:, :512]
            assert torch.allclose(out[b, h].double(), want, rtol=1e-5, atol=1e-6)


def test_kv_splits_cap_is_sglangs():
    assert MDT.mla_decode_kv_splits_cap(8, 132, 163840) == 256  # H100: next_pow2(132 SMs)
    assert MDT.mla_decode_kv_splits_cap(8, 0, 163840) == 8
    assert MDT.mla_decode_kv_splits_cap(8, 132, 100) == 8  # a short context caps below the base


@pytest.mark.parametrize("kernel", DECODE)
def test_decode_inputs_and_reference(kernel):
    a = get_adapter(kernel)
    cases = _cases(kernel)
    assert [c.point["B"] for c in cases] == [1, 4] and all(c.dims["kv_len"] == 1024 for c in cases)
    c = cases[1]
    x = a.make_inputs(c, "cpu", 3)
    assert x["q"].shape == (4, 128, 576) and x["q"].dtype == torch.bfloat16
    assert x["kv_cache"].shape == (4 * 8 * 128, 576) and x["kv_cache"].dtype == torch.bfloat16
    assert x["page_table"].shape == (4, 8) and x["page_table"].dtype == torch.int32
    assert sorted(x["page_table"].flatten().tolist()) == list(range(32))  # every page used once
    assert x["seq_lens"].tolist() == [1024] * 4 and x["seq_lens"].dtype == torch.int32
    before = {k: v.clone() for k, v in x.items()}
    ref = a.reference(x, c)
    assert all(torch.equal(before[k], x[k]) for k in x)
    assert ref.shape == (4, 128, 512) and ref.dtype == torch.float32
    assert a.check(ref.to(torch.bfloat16), ref, c).ok
    assert not a.check(ref.roll(1, 0).to(torch.bfloat16), ref, c).ok  # requests swapped
    assert a.skip_reason(c) is None


def test_decode_kv_budget_skip_and_traffic():
    a = get_adapter("decode_attention_kernel")
    dims = {"B": 256, "Nh": 128, "Lkv": 512, "Dr": 64, "kv_len": 131072}
    largest = Case("decode_attention_kernel", "attn_mqa", "decode", {"B": 256, "kv_len": 131072}, dims)
    assert a.skip_reason(largest) is None  # 38.7 GB fits the 40 GB budget
    bigger = Case("decode_attention_kernel", "attn_mqa", "decode", {}, {**dims, "B": 512})
    assert "exceeds" in a.skip_reason(bigger)
    tr = a.traffic(largest)
    total_len = 256 * 131072
    # 2 x Nh x (576 + 512) per KV position: QK over 576, PV over 512
    assert tr.flops == 278_528 * total_len
    assert tr.bytes == total_len * 576 * 2 + 256 * 128 * (576 + 512) * 2 + 4 * 256
    tp8 = Case("x", "attn_mqa", "decode", {}, {**dims, "Nh": 16})
    assert a.traffic(tp8).flops == 278_528 * total_len // 8


def test_triton_decode_is_gated_by_its_split_scratch_on_an_80_gb_gpu():
    """Seen on an H100: B=512 at 65,536 tokens a request asks for a 36 GiB cache and 32 GiB of fp32
    attn_logits; it ran out of memory after everything else had been tried. The gate now counts the
    scratch, so the case is skipped there with the memory it needs, and still runs on a 141 GB GPU."""
    from dskbench.device.info import DeviceInfo
    from dskbench.execution.gate import why_not

    a = get_adapter("decode_attention_kernel")
    dims = {"B": 512, "Nh": 128, "Lkv": 512, "Dr": 64, "kv_len": 65536}
    model = {"max_position": 163840}
    tp1 = Case("decode_attention_kernel", "attn_mqa", "decode", {"B": 512, "tp": 1}, dims, None, model)
    tp4 = Case(
        "decode_attention_kernel", "attn_mqa", "decode", {"B": 512, "tp": 4}, {**dims, "Nh": 32}, None, model
    )
    assert MDT.logits_bytes(tp1, 132) == 4 * 512 * 128 * 256 * 513  # 256 splits on 132 SMs
    assert a.scratch_bytes("sglang_triton", tp1) == MDT.logits_bytes(tp1, 132)
    h100 = DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", 90, 1, int(79.18 * 2**30))
    h200 = DeviceInfo("cuda", "NVIDIA H200", 90, 1, int(139.8 * 2**30))
    backend = a.backends[0]
    assert why_not(a, backend, tp1, h100).startswith("needs at least 68.2 GiB of GPU memory")
    assert why_not(a, backend, tp1, h200) is None and why_not(a, backend, tp4, h100) is None
    flashinfer = get_adapter("BatchMLAPagedAttentionWrapper")  # no such scratch: the cache alone fits
    assert why_not(flashinfer, flashinfer.backends[0], tp1, h100) is None


# -- MHA prefill -----------------------------------------------------------------------------------------


def test_prefill_request_split():
    assert MP.prefill_seq_lens(512) == [512]
    assert MP.prefill_seq_lens(16384) == [4096] * 4
    assert MP.prefill_seq_lens(5000) == [4096, 904]


def test_mha_causal_reference_against_float64_loop():
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(5, 2, 8, generator=gen).to(torch.bfloat16) for _ in range(2))
    v = torch.randn(5, 2, 4, generator=gen).to(torch.bfloat16)
    out = MP.mha_causal_reference(q, k, v, [3, 2], 0.3)
    assert out.shape == (5, 2, 4) and out.dtype == torch.float32
    for start, length in ((0, 3), (3, 2)):
        for i in range(length):
            for h in range(2):
                t = start + i
                s = torch.tensor(
                    [float(q[t, h].double() @ k[start + j, h].double()) * 0.3 for j in range(i + 1)]
                )
                w = torch.softmax(s.double(), 0)
                want = sum(w[j] * v[start + j, h].double() for j in range(i + 1))
                assert torch.allclose(out[t, h].double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kernel", PREFILL)
def test_prefill_inputs_reference_and_traffic(kernel):
    a = get_adapter(kernel)
    (c,) = _cases(kernel)
    t = c.point["T"]
    assert c.dims == {"T": t, "Nh": 128, "Dq": 192, "Dv": 128}
    x = a.make_inputs(c, "cpu", 0)
    assert x["q"].shape == x["k"].shape == (t, 128, 192) and x["v"].shape == (t, 128, 128)
    assert all(v.dtype == torch.bfloat16 for v in x.values())
    ref = a.reference(x, c)
    assert ref.shape == (t, 128, 128) and ref.dtype == torch.float32
    assert a.check(ref.to(torch.bfloat16), ref, c).ok
    tr = a.traffic(c)
    # 2 x Nh x (192 + 128) per causal (q, k) pair (one request)
    assert tr.flops == 81_920 * t * (t + 1) // 2
    assert tr.bytes == t * 128 * (192 + 128) * 2 * 2
    big = next(c for c in _cases(kernel, "full") if c.point["T"] == 16384)
    assert a.traffic(big).flops == 81_920 * 4 * 4096 * 4097 // 2


# -- merge_state -----------------------------------------------------------------------------------------


def test_merge_state_reference_by_hand_both_bases():
    va, vb = torch.tensor([[[1.0]]]), torch.tensor([[[3.0]]])
    sa, sb = torch.tensor([[0.0]]), torch.tensor([[1.0]])
    v2, s2 = MS.merge_state_reference(va, sa, vb, sb, base2=True)
    assert v2.item() == pytest.approx(7 / 3) and s2.item() == pytest.approx(1 + math.log2(1.5))
    ve, se = MS.merge_state_reference(va, sa, vb, sb, base2=False)
    e = math.exp(-1)
    assert ve.item() == pytest.approx((e + 3) / (e + 1)) and se.item() == pytest.approx(1 + math.log(1 + e))


def test_merging_two_halves_equals_full_softmax():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(10, generator=gen, dtype=torch.float64)
    vals = torch.randn(10, 4, generator=gen, dtype=torch.float64)

    def part(sl):
        w = torch.softmax(logits[sl], 0)
        return (w @ vals[sl]).view(1, 1, 4), torch.logsumexp(logits[sl], 0).view(1, 1)

    (va, sa), (vb, sb) = part(slice(0, 6)), part(slice(6, 10))
    v, s = MS.merge_state_reference(va, sa, vb, sb, base2=False)
    assert torch.allclose(v.view(4).double(), torch.softmax(logits, 0) @ vals, atol=1e-6)
    assert s.item() == pytest.approx(float(torch.logsumexp(logits, 0)), abs=1e-5)


@pytest.mark.parametrize("kernel", ["merge_state", "merge_state_v2"])
def test_merge_inputs_reference_traffic(kernel):
    a = get_adapter(kernel)
    c = _cases(kernel)[0]
    t = c.point["T"]
    x = a.make_inputs(c, "cpu", 0)
    assert x["v_a"].shape == x["v_b"].shape == (t, 128, 128) and x["v_a"].dtype == torch.bfloat16
    assert x["s_a"].shape == (t, 128) and x["s_a"].dtype == torch.float32
    v, s = a.reference(x, c)
    assert v.shape == (t, 128, 128) and s.shape == (t, 128)
    assert a.check((v.to(torch.bfloat16), s.clone()), (v, s), c).ok
    assert not a.check((v.to(torch.bfloat16), s + 0.01), (v, s), c).ok
    assert a.traffic(c).bytes == 3 * t * 128 * 128 * 2 + 3 * t * 128 * 4


def test_merge_state_flashinfer_head_limit():
    assert MS.flashinfer_merge_state_max_heads(128, 2) == 64
    (fi,) = get_adapter("merge_state").backends
    assert "1024 threads" in fi.skip(_cases("merge_state")[0])  # 128 heads
    assert fi.skip(_cases("merge_state", "quick", tp=8)[0]) is None  # 16 heads
    a = get_adapter("merge_state")
    assert a.skip_reason(_cases("merge_state")[0]) is None  # the torch reference still runs
    assert get_adapter("merge_state_v2").skip_reason(_cases("merge_state_v2")[0]) is None
    assert a.base2 and not get_adapter("merge_state_v2").base2


# -- concat_mla_k / concat_mla_absorb_q --------------------------------------------------------------------


def test_concat_mla_k_strided_inputs_and_reference():
    a = get_adapter("concat_mla_k")
    (c,) = _cases("concat_mla_k")
    t = c.point["T"]
    x = a.make_inputs(c, "cpu", 0)
    kn, kr = x["k_nope"], x["k_rope"]
    assert kn.shape == (t, 128, 128) and kn.stride() == (128 * 256, 256, 1)  # view of kv [T, 128, 256]
    assert kr.shape == (t, 1, 64) and kr.stride(0) == 2112  # view of the fused qkv_a output
    ref = a.reference(x, c)
    assert ref.shape == (t, 128, 192)
    assert torch.equal(ref[7, 5, :128], kn[7, 5].float()) and torch.equal(ref[7, 99, 128:], kr[7, 0].float())
    assert a.check(ref.to(torch.bfloat16), ref, c).ok
    # k_nope [128, 128] + k_rope [64] read, k [128, 192] written, bf16
    assert a.traffic(c).bytes == 82_048 * t
    tp8 = _cases("concat_mla_k", "quick", tp=8)[0]
    assert tp8.dims["Nh"] == 16
    skips = {b.name: b.skip(tp8) if b.skip else None for b in a.backends}
    assert all("128 local heads" in skips[n] for n in ("sglang_jit", "sgl_kernel", "flashinfer"))
    assert skips["sglang_triton"] is None  # SGLang's path at attention TP > 1
    assert a.skip_reason(c) is None and all(b.skip is None or b.skip(c) is None for b in a.backends)


def test_concat_mla_absorb_q():
    a = get_adapter("concat_mla_absorb_q")
    c = _cases("concat_mla_absorb_q")[1]
    x = a.make_inputs(c, "cpu", 0)
    assert x["a"].shape == (4, 128, 512) and x["b"].shape == (4, 128, 64)
    ref = a.reference(x, c)
    assert torch.equal(ref[..., 512:], x["b"].float()) and torch.equal(ref[..., :512], x["a"].float())
    # a [128, 512] + b [128, 64] read, [128, 576] written, bf16
    assert a.traffic(c).bytes == 294_912 * 4


# -- backends --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", DECODE + PREFILL + OTHER)
def test_backends_declared(kernel):
    cls = adapters()[kernel]
    names = [b.name for b in cls.backends]
    assert names and len(names) == len(set(names))
    for b in cls.backends:
        for t in (b.target, *b.fallbacks):
            assert TARGET.match(t), t
        if b.target.startswith("torch.ops."):
            assert b.preload == ("sgl_kernel",)
    if kernel in SM100_ONLY:
        assert all(b.requires == SM100 for b in cls.backends)
    if kernel == "xqa_batch_decode_with_kv_cache_mla":
        assert cls.backends[0].requires.sm == (120, 121)
    assert cls.ops and all(SHAPES.ops[op].roles.get(cls.role) for op in cls.ops)


def test_mla_decode_reference_batches_requests_of_one_length_without_changing_them(monkeypatch):
    """Requests are computed together by length, in chunks of cache rows; each still attends over its
    own pages only: the result is the one-request-at-a-time formula's."""
    from dskbench.adapters.attention import mla_decode

    gen = torch.Generator().manual_seed(5)
    q = torch.randn(5, 4, 576, generator=gen).to(torch.bfloat16)
    kv = torch.randn(6 * 128, 576, generator=gen).to(torch.bfloat16)
    pages = torch.tensor([[0, 3], [1, 5], [2, 4], [5, 0], [4, 1]], dtype=torch.int32)
    lens = torch.tensor([200, 130, 200, 7, 200], dtype=torch.int32)  # three of one length, two others
    monkeypatch.setattr(mla_decode, "REFERENCE_ROWS", 450)  # chunks of two 200-token requests
    got = mla_decode.mla_decode_reference(q, kv, pages, lens, 0.07, 64)
    for i, n in enumerate(lens.tolist()):
        rows = kv[mla_decode.token_slots(pages[i], n)].double()
        p = torch.softmax((q[i].double() @ rows.T) * 0.07, dim=-1)
        assert torch.allclose(got[i].double(), p @ rows[:, :512], rtol=1e-5, atol=1e-6), i


def test_token_indices_of_equal_and_unequal_lengths_are_each_request_s_slots_in_order():
    from dskbench.adapters.attention.mla_decode import token_indices, token_slots

    pages = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    for lens in ([200, 200], [200, 7]):
        seq = torch.tensor(lens, dtype=torch.int32)
        indptr, idx = token_indices({"page_table": pages, "seq_lens": seq}, torch.int32)
        want = torch.cat([token_slots(pages[i], n) for i, n in enumerate(lens)]).to(torch.int32)
        assert torch.equal(idx, want) and indptr.tolist() == [0, lens[0], sum(lens)]
