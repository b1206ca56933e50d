"""FlashMLA (sgl_kernel.flash_mla) on CPU: the dense and sparse decode and the sparse prefill adapters'
references against plain float64 loops, their inputs' invariants (block table, FP8 cache, indices), the
shapes at the DeepSeek points, the registry entries, the gating, and the binders' arguments through CPU
stand-ins with FlashMLA's signatures."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from dskbench.adapters import adapters, get_adapter
from dskbench.adapters.attention import mla_decode_flashmla as FM
from dskbench.adapters.attention import mla_sparse_prefill_flashmla as FP
from dskbench.adapters.attention.mla import case_softmax_scale
from dskbench.adapters.attention.mla_decode import sub_pages, token_slots
from dskbench.adapters.backends import SM90_ONLY
from dskbench.device.info import DeviceInfo
from dskbench.pick.deployment import load_deployment
from dskbench.registry.load import load_registry
from dskbench.shapes.cases import Case, default_shapes

SHAPES = default_shapes()
CPU = DeviceInfo("cpu", "cpu", 0, 0)
H100 = DeviceInfo("cuda", "NVIDIA H100", 90, 1)
B200 = DeviceInfo("cuda", "NVIDIA B200", 100, 1)
A100 = DeviceInfo("cuda", "NVIDIA A100", 80, 1)


def _decode_case(sparse: bool, b=3, nh=4, kv_len=300, topk=256) -> Case:
    dims = {"B": b, "Nh": nh, "Lkv": 512, "Dr": 64, "kv_len": kv_len}
    if sparse:
        dims["topk"] = topk
    op = "nsa_backend.forward_decode" if sparse else "attn_mqa"
    return Case("flash_mla_with_kvcache", op, "decode", {"B": b}, dims, model=SHAPES.config)


def _prefill_case(t=40, reqs=2, nh=4, topk=8) -> Case:
    dims = {"T": t, "reqs": reqs, "Nh": nh, "Lkv": 512, "Dr": 64, "topk": topk}
    return Case(
        "flash_mla_sparse_fwd", "nsa_backend.forward_extend", "prefill", {"T": t}, dims, model=SHAPES.config
    )


def _attend(q, rows, scale) -> torch.Tensor:
    """One query token's heads against some cache rows, float64, one head at a time."""
    out = torch.empty(q.shape[0], 512, dtype=torch.float64)
    for h in range(q.shape[0]):
        s = torch.tensor([float(q[h].double() @ r.double()) * scale for r in rows], dtype=torch.float64)
        p = torch.exp(s - s.max())
        out[h] = (p / p.sum()) @ rows[:, :512].double()
    return out


# -- references against loops ---------------------------------------------------------------------------


def test_dense_reference_is_attention_over_the_block_table():
    c = _decode_case(False)
    a = get_adapter("flash_mla_with_kvcache")
    x = a.make_inputs(c, "cpu", 1)
    ref = a.reference(x, c)
    bt = sub_pages(x["page_table"], 64)
    for i, n in enumerate(x["seq_lens"].tolist()):
        slots = [
            int(bt[i, j // 64]) * 64 + j % 64 for j in range(n)
        ]  # page-64 walk, independent of token_slots
        want = _attend(x["q"][i], x["kv_cache"][slots], case_softmax_scale(c))
        assert torch.allclose(ref[i].double(), want, rtol=1e-4, atol=1e-4)
    assert ref.shape == (3, 4, 512) and ref.dtype == torch.float32


def test_fp8_cache_layout_round_trips_within_e4m3():
    g = torch.Generator().manual_seed(0)
    rows = (torch.randn(70, 576, generator=g) * 3).to(torch.bfloat16)
    q = FM.quantize_fp8_rows(rows, 512)
    assert q.shape == (70, 656) and q.dtype == torch.float8_e4m3fn
    b = q.view(torch.uint8)
    scales = b[:, 512:528].contiguous().view(torch.float32)  # 4 fp32 scales, max|x| / 448 per 128 values
    want = rows[:, :512].float().view(70, 4, 128).abs().amax(-1) / 448.0
    assert torch.allclose(scales, want)
    assert torch.equal(b[:, 528:].contiguous().view(torch.bfloat16), rows[:, 512:])  # rope kept in bf16
    back = FM.dequantize_fp8_rows(q, 512)
    err = (back[:, :512] - rows[:, :512].float()).abs() / scales.repeat_interleave(128, dim=1)
    assert (
        err.max() <= 16.0 + 1e-3
    )  # e4m3: 3 mantissa bits -> at most half a step (32 at 448) of the scaled value
    assert torch.equal(back[:, 512:], rows[:, 512:].float())


def test_sparse_decode_inputs_and_reference():
    c = _decode_case(True, kv_len=300, topk=256)
    short = _decode_case(True, kv_len=100, topk=256)
    a = get_adapter("flash_mla_with_kvcache")
    for case in (c, short):
        x = a.make_inputs(case, "cpu", 2)
        kv_len = int(case.dims["kv_len"])
        k = min(kv_len, 256)
        assert x["kv_cache"].dtype == torch.float8_e4m3fn and x["kv_cache"].shape[1] == 656
        assert x["kv_cache"].shape[0] % 64 == 0
        assert x["indices"].shape == (3, 1, 256) and x["indices"].dtype == torch.int32
        assert torch.equal(x["cache_seqlens"], torch.full((3,), k, dtype=torch.int32))
        ref = a.reference(x, case)
        for i in range(3):
            idx = x["indices"][i, 0]
            valid = idx[:k]
            assert (idx[k:] == -1).all() and (valid >= 0).all()
            assert len(set(valid.tolist())) == k  # distinct tokens
            own = set(token_slots(x["page_table"][i], kv_len).tolist())
            assert set(valid.tolist()) <= own  # only the request's own tokens
            rows = FM.dequantize_fp8_rows(x["kv_cache"][valid.long()], 512)
            want = _attend(x["q"][i], rows, case_softmax_scale(case))
            assert torch.allclose(ref[i].double(), want, rtol=1e-4, atol=1e-4)


def test_sparse_indices_with_uneven_lengths_are_distinct_own_tokens_and_seeded():
    """Requests shorter than, equal to and longer than topk, in one batch (positions past a request's length
    never chosen)."""
    lens = torch.tensor([5, 128, 300, 256, 1], dtype=torch.int32)
    pt = torch.randperm(5 * 3, generator=torch.Generator().manual_seed(0)).view(5, 3).to(torch.int32)
    idx = FM.sparse_indices(pt, lens, 256, torch.Generator().manual_seed(7))
    assert idx.shape == (5, 1, 256) and idx.dtype == torch.int32
    for i, n in enumerate(lens.tolist()):
        k = min(n, 256)
        row = idx[i, 0]
        assert (row[k:] == -1).all() and (row[:k] >= 0).all()
        assert len(set(row[:k].tolist())) == k
        assert set(row[:k].tolist()) <= set(token_slots(pt[i], n).tolist())
    assert torch.equal(idx, FM.sparse_indices(pt, lens, 256, torch.Generator().manual_seed(7)))
    assert not torch.equal(idx, FM.sparse_indices(pt, lens, 256, torch.Generator().manual_seed(8)))


def test_sparse_decode_inputs_are_seeded_and_every_chunk_quantised(monkeypatch):
    monkeypatch.setattr(FM, "FP8_DRAW_ROWS", 100)  # 1152 cache rows: 12 chunks, the last one short
    c = _decode_case(True, kv_len=300, topk=256)
    a = get_adapter("flash_mla_with_kvcache")
    x, y = a.make_inputs(c, "cpu", 2), a.make_inputs(c, "cpu", 2)
    for name in ("q", "page_table", "indices", "cache_seqlens"):
        assert torch.equal(x[name], y[name]), name
    assert torch.equal(x["kv_cache"].view(torch.uint8), y["kv_cache"].view(torch.uint8))
    assert x["kv_cache"].shape[0] == x["page_table"].numel() * 128 == 1152
    nope = x["kv_cache"][:, :512].float().view(-1, 4, 128)
    assert (nope.abs().amax(-1) == 448.0).all()  # each tile's largest value scales to e4m3's max


def test_sparse_prefill_indices_are_causal_and_within_the_request():
    c = _prefill_case(t=40, reqs=2, topk=8)
    a = get_adapter("flash_mla_sparse_fwd")
    x = a.make_inputs(c, "cpu", 3)
    idx = x["indices"][:, 0]
    assert idx.shape == (40, 8) and idx.dtype == torch.int32
    # recover each token's own slot: token i of a request always keeps itself (the row's last valid entry
    # while i < topk, the first one after)
    own = [int(idx[r, r % 20]) if r % 20 < 8 else int(idx[r, 0]) for r in range(40)]
    for r in range(40):
        req, i = divmod(r, 20)
        k = min(i + 1, 8)
        assert (idx[r, k:] == -1).all() and (idx[r, :k] >= 0).all()
        allowed = set(own[req * 20 : req * 20 + i + 1])
        assert set(idx[r, :k].tolist()) <= allowed and len(set(idx[r, :k].tolist())) == k
    ref = a.reference(x, c)
    for r in (0, 5, 19, 33):
        valid = idx[r][idx[r] >= 0].long()
        want = _attend(x["q"][r], x["kv"][valid], case_softmax_scale(c))
        assert torch.allclose(ref[r].double(), want, rtol=1e-4, atol=1e-4)


def test_prefill_indices_in_key_chunks_are_causal_distinct_and_seeded(monkeypatch):
    monkeypatch.setattr(FP, "PREFILL_KEYS", 200)  # key chunks of a few token positions
    slots = torch.randperm(200, generator=torch.Generator().manual_seed(1))[:90]
    idx = FP.prefill_indices(slots, 3, 6, torch.Generator().manual_seed(2))
    assert idx.shape == (90, 1, 6) and idx.dtype == torch.int32
    for r in range(90):
        req, i = divmod(r, 30)
        k, row = min(i + 1, 6), idx[r, 0]
        assert (row[k:] == -1).all() and len(set(row[:k].tolist())) == k
        assert set(row[:k].tolist()) <= set(slots[req * 30 : req * 30 + i + 1].tolist())
        assert int(row[k - 1 if i < 6 else 0]) == int(slots[r])  # its own token
    assert torch.equal(idx, FP.prefill_indices(slots, 3, 6, torch.Generator().manual_seed(2)))
    short = FP.prefill_indices(slots[:8], 2, 6, torch.Generator().manual_seed(2))  # topk > 4 tokens a request
    assert torch.equal(short[5, 0], torch.tensor([*slots[4:6].tolist(), -1, -1, -1, -1], dtype=torch.int32))


def test_sparse_reference_chunks_equal_a_per_query_loop(monkeypatch):
    """Chunked queries (several chunks, padded columns, a query with no valid index) match one query at a
    time over its valid rows."""
    g = torch.Generator().manual_seed(4)
    n, h, topk = 11, 3, 6
    q = torch.randn(n, h, 576, generator=g).to(torch.bfloat16)
    kv = torch.randn(30, 576, generator=g).to(torch.bfloat16)
    idx = torch.full((n, topk), -1, dtype=torch.int32)
    for i in range(n):
        k = i % (topk + 1)  # 0..topk valid entries; row 0 and row 7 have none
        idx[i, :k] = torch.randperm(30, generator=g)[:k].to(torch.int32)
    idx[3, 1], idx[3, 4] = -1, 17  # a hole: validity is per entry, not a prefix
    monkeypatch.setitem(FM.SPARSE_GATHER_ELEMS, "cpu", 4 * topk * 576)  # chunks of 4 queries
    out = FM.sparse_reference(q, lambda i: kv[i].float(), idx, 0.07, 512)
    for i in range(n):
        valid = idx[i][idx[i] >= 0].long()
        if valid.numel() == 0:
            assert (out[i] == 0).all()
            continue
        want = _attend(q[i], kv[valid], 0.07)
        assert torch.allclose(out[i].double(), want, rtol=1e-5, atol=1e-5)


# -- binders through CPU stand-ins ----------------------------------------------------------------------


@pytest.fixture
def fake_flash_mla(monkeypatch):
    """sgl_kernel.flash_mla with its signatures, computing with loops (the sparse decode from the FP8 bytes)."""
    mod = types.ModuleType("sgl_kernel.flash_mla")
    seen = {}

    def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=None,
                         is_fp8_kvcache=False, topk=None):  # fmt: skip
        seen["meta"] = (num_q_tokens_per_head_k, num_heads_k, num_heads_q, is_fp8_kvcache, topk)
        return torch.zeros(4, 8, dtype=torch.int32), torch.zeros(cache_seqlens.numel() + 1, dtype=torch.int32)

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                               num_splits, softmax_scale=None, causal=False, is_fp8_kvcache=False,
                               indices=None):  # fmt: skip
        b, s_q, h, _ = q.shape
        page = k_cache.shape[1]
        flat = k_cache.reshape(-1, k_cache.shape[-1])
        out = torch.empty(b, s_q, h, head_dim_v, dtype=torch.bfloat16)
        for i in range(b):
            if indices is None:
                n = int(cache_seqlens[i])
                slots = [int(block_table[i, j // page]) * page + j % page for j in range(n)]
                rows = flat[slots].float()
            else:
                assert is_fp8_kvcache and not causal and block_table.shape == (b, 0)
                ii = indices[i, 0]
                rows = FM.dequantize_fp8_rows(flat[ii[ii >= 0].long()], head_dim_v)
            out[i, 0] = _attend(q[i, 0], rows, softmax_scale).to(torch.bfloat16)
        return out, None

    mod.get_mla_metadata = get_mla_metadata
    mod.flash_mla_with_kvcache = flash_mla_with_kvcache
    monkeypatch.setitem(sys.modules, "sgl_kernel.flash_mla", mod)
    flash_mla_with_kvcache.__module__ = "sgl_kernel.flash_mla"
    return mod, seen


@pytest.mark.parametrize("sparse", [False, True])
def test_decode_bind_passes_sglangs_arguments(sparse, fake_flash_mla):
    mod, seen = fake_flash_mla
    c = _decode_case(sparse, nh=4)
    a = get_adapter("flash_mla_with_kvcache")
    x = a.make_inputs(c, "cpu", 4)
    out = FM._bind(mod.flash_mla_with_kvcache, x, c)()
    assert out.shape == (3, 4, 512) and out.dtype == torch.bfloat16
    assert a.check(out, a.reference(x, c), c).ok
    if sparse:
        assert seen["meta"] == (64, 1, 64, True, 256)  # 4 heads padded to 64, as SGLang pads them
    else:
        assert seen["meta"][:2] == (4, 1)


# -- shapes, registry, gating, pick ---------------------------------------------------------------------


def test_shapes_resolve_at_the_deepseek_points():
    dense = list(SHAPES.cases("flash_mla_with_kvcache", ["attn_mqa"], "mla_decode", "decode", "full", [1, 8]))
    assert {(c.dims["Nh"], c.dims["Lkv"], c.dims["Dr"]) for c in dense} == {(128, 512, 64), (16, 512, 64)}
    assert {c.dims["B"] for c in dense} == {1, 2, 4, 8, 16, 32, 64, 128, 256, 512}
    assert {c.dims["kv_len"] for c in dense} >= {4096, 131072}
    sparse = list(
        SHAPES.cases(
            "flash_mla_with_kvcache", ["nsa_backend.forward_decode"], "mla_decode", "decode", "full", [1]
        )
    )
    assert sparse and all(c.dims["topk"] == 2048 and c.dims["Nh"] == 128 for c in sparse)
    pre = list(
        SHAPES.cases(
            "flash_mla_sparse_fwd", ["nsa_backend.forward_extend"], "mla_prefill", "prefill", "full", [8]
        )
    )
    assert pre and all(c.dims["topk"] == 2048 and c.dims["Nh"] == 16 and c.dims["reqs"] == 2 for c in pre)


def test_registry_entries():
    reg = load_registry()
    dense = reg["flash_mla_with_kvcache"]
    assert dense.status == "benchmark" and dense.source == "sgl-kernel"
    assert {"attn_mqa", "nsa_backend.forward_decode"} <= set(dense.op_names)
    pre = reg["flash_mla_sparse_fwd"]
    assert pre.status == "benchmark" and "nsa_backend.forward_extend" in pre.op_names


def test_gating_and_cpu_skip():
    dense = adapters()["flash_mla_with_kvcache"].backends[0]
    pre = adapters()["flash_mla_sparse_fwd"].backends[0]
    assert dense.requires == SM90_ONLY and dense.preload == ("sgl_kernel.flashmla_ops",)
    assert dense.requires.reason_unmet(CPU) == "needs sm90 (found no CUDA GPU)"
    assert dense.requires.reason_unmet(H100) is None
    assert dense.requires.reason_unmet(B200) == "needs sm90 (found sm100)"
    assert pre.requires.reason_unmet(CPU) == "needs sm90 (found no CUDA GPU)"
    assert pre.requires.reason_unmet(H100) is None and pre.requires.reason_unmet(B200) is None
    assert pre.requires.reason_unmet(A100) == "needs sm90/sm100-103 (found sm80)"


def test_traffic_models():
    a = get_adapter("flash_mla_with_kvcache")
    t = a.traffic(_decode_case(True, b=2, nh=128, kv_len=4096, topk=2048))
    assert t.flops == 2 * 2 * 128 * 2048 * (576 + 512)
    assert t.bytes == 2 * 2048 * (656 + 4) + 2 * 128 * (576 + 512) * 2 + 8
    d = a.traffic(_decode_case(False, b=64, nh=128, kv_len=4096))
    assert d.flops == 64 * 2 * 128 * 4096 * (576 + 512)
    p = get_adapter("flash_mla_sparse_fwd").traffic(_prefill_case(t=8, reqs=2, nh=4, topk=2))
    kept = 2 * (1 + 2 + 2 + 2)
    assert p.flops == 2 * 4 * kept * (576 + 512)
    # each of the 8 tokens' KV rows once (not once per attending query), the index rows, q and out
    assert p.bytes == 8 * 576 * 2 + 8 * 2 * 4 + 8 * 4 * (576 + 512) * 2


def test_pick_weighs_flashmla_beside_the_other_mla_decode_backends():
    dep = load_deployment(SHAPES)
    decode = next(r for r in dep.rows["decode"] if r.op == "attn_mqa")
    paths = {p.name: p for p in decode.paths}
    assert {"flashmla", "cutlass_mla", "fa3", "flashinfer", "triton"} <= set(paths)
    fm = paths["flashmla"]
    assert fm.flags == {"--decode-attention-backend": "flashmla"}
    assert len(fm.parts) == 1 and fm.parts[0].matches("flash_mla_with_kvcache", "sgl_kernel")
    assert not fm.parts[0].matches("flash_attn_with_kvcache", "sgl_kernel")


def test_q_head_padding_follows_sglang():
    assert [FM.padded_heads(n) for n in (16, 32, 64, 128)] == [64, 64, 64, 128]
    assert [FP.padded_heads_prefill(n) for n in (16, 64, 128)] == [64, 64, 128]
    assert FP.padded_heads_prefill(16, 128) == 128
