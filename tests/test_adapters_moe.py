"""MoE compute adapters (dskbench.adapters.moe) on CPU: inputs, references against naive loops, the integer
checks, traffic against hand-counted numbers, backend declarations (binders: test_adapters_moe_binds)."""

from __future__ import annotations

import re

import pytest
import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.common import fp8
from dskbench.adapters.common.routing import (
    deepseek_routing,
    expert_counts,
)
from dskbench.adapters.moe.align import align_max_padded, marlin_block_size_m, moe_align_reference
from dskbench.adapters.moe.cutlass_prepare import prepare_reference
from dskbench.adapters.moe.inputs import (
    ExpertWeights,
    interleave_w4a8_scales,
    make_expert_weights,
    pack_int4,
    unpack_int4,
)
from dskbench.adapters.moe.reference import (
    expert_order,
    group_rows,
    grouped_gemm_reference,
    moe_gemm_reference,
    quant_dequant_groups,
    used_experts,
)
from dskbench.adapters.moe.trtllm import moe_layer_reference
from dskbench.shapes.cases import Case, default_shapes

SHAPES = default_shapes()
TARGET = re.compile(r"^(torch\.ops(\.\w+){3}|[A-Za-z_]\w*(\.\w+)*:\w+(\.\w+)*)$")
GEMM_KERNELS = (
    "fused_moe_kernel",
    "fp8_blockwise_scaled_grouped_mm",
    "es_fp8_blockwise_scaled_grouped_mm",
    "cutlass_w4a8_moe_mm",
)
LAYER_KERNELS = ("trtllm_bf16_moe", "trtllm_fp8_block_scale_moe")
BOOK_KERNELS = (
    "moe_align_block_size",
    "moe_sum_reduce",
    "prepare_moe_input",
    "get_cutlass_w4a8_moe_mm_data",
    "shuffle_rows",
    "apply_shuffle_mul_sum",
)
ALL = GEMM_KERNELS + LAYER_KERNELS + BOOK_KERNELS
PER_EXPERT_BF16 = 88_080_384  # gate_up + down of one expert, BF16: 3 x 7168 x 2048 x 2 B
LAYER_FLOPS_PER_TOKEN = 704_643_072  # both GEMMs of the 8 routed experts, per token


def moe_case(kernel: str, t: int = 1, variant: str | None = None, tp: int = 1) -> Case:
    a = get_adapter(kernel)
    phase = "decode" if t <= 512 else "prefill"
    for c in SHAPES.cases(kernel, ["experts"], a.role, phase, profile="full", tp=[tp]):
        if c.point["T"] == t and (variant is None or c.variant == variant):
            return c
    raise LookupError(f"no {kernel} case T={t} {variant}")


# -- helpers ---------------------------------------------------------------------------------------------


def test_int4_packing_roundtrip_and_nibble_order():
    q = torch.tensor([[1, -2, -8, 7]], dtype=torch.int8)
    p = pack_int4(q)
    assert p.tolist() == [[(-2 << 4) | 1, (7 << 4) | 8]]  # even index in the low nibble
    assert torch.equal(unpack_int4(p), q)
    r = torch.randint(-8, 8, (5, 64), dtype=torch.int8)
    assert torch.equal(unpack_int4(pack_int4(r)), r)


def test_int4_packed_bytes_are_uniform_int4_pairs_and_seeded():
    from dskbench.adapters.moe.inputs import int4_packed

    p = int4_packed((3, 64, 256), torch.Generator().manual_seed(1), "cpu")
    assert p.shape == (3, 64, 128) and p.dtype == torch.int8
    q = unpack_int4(p)
    assert q.shape == (3, 64, 256) and int(q.min()) == -8 and int(q.max()) == 7
    counts = torch.bincount((q.flatten() + 8).long(), minlength=16).float()
    assert (counts / counts.mean() - 1).abs().max() < 0.1  # every nibble value about equally often
    for nibbles in (q[..., 0::2], q[..., 1::2]):  # low and high nibbles alike (INT4_STD)
        assert abs(float(nibbles.float().std()) - 4.6) < 0.1
    assert torch.equal(p, int4_packed((3, 64, 256), torch.Generator().manual_seed(1), "cpu"))


def test_w4a8_scale_interleave_matches_sglang_layout():
    s = torch.arange(2 * 3 * 8, dtype=torch.float32).view(2, 3, 8)  # [E, N, K/128] with K/128 = 8
    il = interleave_w4a8_scales(s)
    assert il.shape == (2, 2, 12)
    for e in range(2):
        for n in range(3):
            for g in range(8):
                assert il[e, g // 4, n * 4 + g % 4] == s[e, n, g]
    assert interleave_w4a8_scales(torch.zeros(1, 3, 2)).shape == (1, 2, 3)  # K/128 = 2: no interleave


def test_marlin_block_size_and_padding():
    assert marlin_block_size_m(1, 8, 256) == 8
    assert marlin_block_size_m(512, 8, 256) == 32  # 16 rows/expert: first bs with 16/bs < 0.9
    assert marlin_block_size_m(16384, 8, 256) == 64
    assert align_max_padded(8, 257, 16) == 8 * 16
    assert align_max_padded(4096, 257, 32) == 4096 + 257 * 31


# -- references against naive loops ----------------------------------------------------------------------


def _tiny_weights(fmt: str, e: int = 3, n: int = 256, k: int = 256) -> ExpertWeights:
    gen = torch.Generator().manual_seed(3)
    if fmt == "bf16":
        return ExpertWeights(fmt, torch.randn(e, n, k, generator=gen).to(torch.bfloat16))
    if fmt == "fp8_block":
        w, s = fp8.block_quant(torch.randn(e, n, k, generator=gen))
        return ExpertWeights(fmt, w, s)
    q = torch.randint(-8, 8, (e, n, k), generator=gen, dtype=torch.int8)
    s = (torch.rand(e, n, k // 128, generator=gen) + 0.5).to(torch.bfloat16)
    return ExpertWeights(fmt, pack_int4(q), s)


def _naive_weight(w: ExpertWeights, e: int) -> torch.Tensor:
    if w.fmt == "bf16":
        return w.w[e].double()
    if w.fmt == "fp8_block":
        full = torch.empty(w.w.shape[1:], dtype=torch.float64)
        for i in range(full.shape[0]):
            for j0 in range(0, full.shape[1], 128):
                full[i, j0 : j0 + 128] = w.w[e, i, j0 : j0 + 128].double() * float(
                    w.scale[e, i // 128, j0 // 128]
                )
        return full
    q = unpack_int4(w.w[e]).double()
    return q * w.scale[e].double().repeat_interleave(128, dim=1)


@pytest.mark.parametrize("fmt", ["bf16", "fp8_block", "w4a8"])
def test_moe_gemm_reference_against_loops(fmt):
    w = _tiny_weights(fmt)
    ids = torch.tensor([[0, 2], [2, 1], [0, 1]], dtype=torch.int32)
    tw = torch.tensor([[0.25, 0.75], [0.5, 0.5], [0.9, 0.1]])
    a = torch.randn(3, 256, generator=torch.Generator().manual_seed(1))
    up = moe_gemm_reference(a, w, ids, None, gate_up=True)
    a2 = torch.randn(6, 256, generator=torch.Generator().manual_seed(2))
    down = moe_gemm_reference(a2, w, ids, tw, gate_up=False)
    assert up.shape == (6, 256) and down.shape == (3, 2, 256)
    for t in range(3):
        for j in range(2):
            e = int(ids[t, j])
            want_up = a[t].double() @ _naive_weight(w, e).t()
            want_down = float(tw[t, j]) * (a2[t * 2 + j].double() @ _naive_weight(w, e).t())
            assert torch.allclose(up[t * 2 + j].double(), want_up, rtol=1e-4, atol=1e-3)
            assert torch.allclose(down[t, j].double(), want_down, rtol=1e-4, atol=1e-3)


def test_grouped_gemm_reference_uses_expert_row_ranges():
    w = _tiny_weights("fp8_block")
    a = torch.randn(5, 256, generator=torch.Generator().manual_seed(4))
    out = grouped_gemm_reference(a, torch.tensor([0, 2, 2, 5]), w)
    for r, e in enumerate([0, 0, 2, 2, 2]):
        assert torch.allclose(out[r].double(), a[r].double() @ _naive_weight(w, e).t(), rtol=1e-4, atol=1e-3)


def test_expert_order_and_group_rows():
    ids = torch.tensor([[3, 0], [0, 2], [3, 3]])
    order, off = expert_order(ids.flatten(), 5)
    assert off == [0, 2, 2, 3, 6, 6] and used_experts(off) == [0, 2, 3]
    assert order.tolist() == [1, 2, 3, 0, 4, 5]  # stable: flat positions ascending inside an expert
    assert group_rows(order, off, [0, 2]).tolist() == [1, 2, 3]  # adjacent ranges: one slice
    assert group_rows(order, off, [0, 3]).tolist() == [1, 2, 0, 4, 5]  # apart: concatenated


@pytest.mark.parametrize("fmt", ["bf16", "fp8_block", "w4a8"])
def test_moe_references_alike_with_one_storage_per_expert_and_a_shared_slab(fmt):
    """The CPU slab (every expert one storage, computed as one group) and a GPU's one storage per expert
    (one group each) give the same outputs."""
    own = _tiny_weights(fmt)
    slab = ExpertWeights(
        fmt,
        own.w[:1].expand(own.w.shape),
        None if own.scale is None else own.scale[:1].expand(own.scale.shape),
    )
    same = ExpertWeights(
        fmt, own.w[:1].repeat(3, 1, 1), None if own.scale is None else own.scale[:1].repeat(3, 1, 1)
    )
    ids = torch.tensor([[0, 2], [2, 1], [0, 1], [2, 0]], dtype=torch.int32)
    tw = torch.rand(4, 2, generator=torch.Generator().manual_seed(8))
    a = torch.randn(4, 256, generator=torch.Generator().manual_seed(9))
    a2 = torch.randn(8, 256, generator=torch.Generator().manual_seed(10))
    for got, want in (
        (moe_gemm_reference(a, slab, ids, None, True), moe_gemm_reference(a, same, ids, None, True)),
        (moe_gemm_reference(a2, slab, ids, tw, False), moe_gemm_reference(a2, same, ids, tw, False)),
        (grouped_gemm_reference(a2, torch.tensor([0, 3, 3, 8]), slab),
         grouped_gemm_reference(a2, torch.tensor([0, 3, 3, 8]), same)),
    ):  # fmt: skip
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_moe_layer_reference_against_loop():
    e, h, inter = 8, 128, 128
    gen = torch.Generator().manual_seed(5)
    w13 = ExpertWeights("bf16", torch.randn(e, 2 * inter, h, generator=gen).to(torch.bfloat16) * 0.1)
    w2 = ExpertWeights("bf16", torch.randn(e, h, inter, generator=gen).to(torch.bfloat16) * 0.1)
    r = deepseek_routing(3, e, 2, n_group=4, topk_group=2, seed=2)
    x = torch.randn(3, h, generator=gen)
    out = moe_layer_reference(x, w13, w2, r.logits, r.bias, (2, 4, 2, 2.5))
    for t in range(3):
        want = torch.zeros(h, dtype=torch.float64)
        for j in range(2):
            ex = int(r.topk_ids[t, j])
            hh = x[t].double() @ w13.w[ex].double().t()
            act = torch.nn.functional.silu(hh[inter:]) * hh[:inter]  # rows are [up; gate]
            want += float(r.topk_weights[t, j]) * 2.5 * (act @ w2.w[ex].double().t())
        assert torch.allclose(out[t].double(), want, rtol=1e-4, atol=1e-4)


# -- integer bookkeeping: references and tolerant checks ---------------------------------------------------


def test_moe_align_reference_by_hand():
    ids = torch.tensor([[0, 1], [1, 3], [0, 3]], dtype=torch.int32)
    sorted_ids, expert_ids, n_post = moe_align_reference(ids, 4, 2)
    assert n_post.tolist() == [6]
    assert expert_ids.tolist() == [0, 1, 3]
    assert sorted_ids.tolist() == [0, 4, 1, 2, 3, 5] + [6] * 5  # numel 6 + (4+1)*(2-1) slots


def _align_by_loops(ids: torch.Tensor, num_experts: int, bs: int) -> tuple[torch.Tensor, ...]:
    """moe_align's canonical layout written out expert by expert (the oracle of the vectorised one)."""
    flat = ids.flatten().tolist()
    numel = len(flat)
    sorted_ids = [numel] * align_max_padded(numel, num_experts + 1, bs)
    expert_ids, pos = [], 0
    for e in range(num_experts):
        rows = [i for i, x in enumerate(flat) if x == e]
        sorted_ids[pos : pos + len(rows)] = rows
        blocks = -(-len(rows) // bs)
        expert_ids += [e] * blocks
        pos += blocks * bs
    i32 = torch.int32
    return (
        torch.tensor(sorted_ids, dtype=i32),
        torch.tensor(expert_ids, dtype=i32),
        torch.tensor([pos], dtype=i32),
    )


@pytest.mark.parametrize(("t", "tp"), [(1, 1), (64, 1), (512, 8), (2048, 4)])
def test_moe_align_reference_matches_a_loop_over_experts(t: int, tp: int):
    a = get_adapter("moe_align_block_size")
    c = moe_case("moe_align_block_size", t=t, tp=tp)
    ids, e, bs = a.make_inputs(c, "cpu", 0)["topk_ids"], int(c.dims["E"]), a.block_size(c)
    got, want = moe_align_reference(ids, e, bs), _align_by_loops(ids, e, bs)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and torch.equal(g, w)
    odd = torch.tensor([[3, 0], [3, 3], [1, 0], [3, 1]], dtype=torch.int32)  # an unused expert, a full block
    for g, w in zip(moe_align_reference(odd, 5, 2), _align_by_loops(odd, 5, 2), strict=True):
        assert torch.equal(g, w)


def test_moe_align_check_accepts_any_order_in_a_segment_and_rejects_errors():
    a = get_adapter("moe_align_block_size")
    c = moe_case("moe_align_block_size", t=64)
    x = a.make_inputs(c, "cpu", 0)
    assert x["topk_ids"].shape == (64, 8) and x["topk_ids"].dtype == torch.int32
    ref = a.reference(x, c)
    bs = a.block_size(c)
    assert bs == 8 and ref[0].numel() == align_max_padded(512, 257, 8)
    s, eids, post = (t.clone() for t in ref)
    s[:bs] = s[:bs].flip(0)  # a block belongs to one expert: any order inside it is valid
    out_eids = torch.cat([eids, torch.full((7,), -7, dtype=torch.int32)])  # garbage beyond the used blocks
    assert a.check((s, out_eids, post), ref, c).ok
    bad = s.clone()
    tok = int((bad < 512).nonzero()[0])
    bad[tok], bad[-1] = bad[-1].clone(), bad[tok].clone()  # a token moved into the padding tail
    assert not a.check((bad, out_eids, post), ref, c).ok
    wrong = out_eids.clone()
    wrong[0] += 1
    assert not a.check((s, wrong, post), ref, c).ok
    assert not a.check((s, out_eids, post + bs), ref, c).ok


def test_prepare_moe_input_reference_and_check():
    ids = torch.tensor([[0, 1], [1, 3], [0, 3]], dtype=torch.int32)
    off, ps1, ps2, in_perm, out_perm, flat = prepare_reference(ids, 4, n=2048, k=7168)
    assert off.tolist() == [0, 2, 4, 4, 6]
    assert ps1.tolist() == [[2, 4096, 7168], [2, 4096, 7168], [0, 4096, 7168], [2, 4096, 7168]]
    assert ps2[3].tolist() == [2, 7168, 2048]
    assert in_perm.tolist() == [0, 2, 0, 1, 1, 2] and out_perm.tolist() == [0, 2, 3, 4, 1, 5]
    sw = prepare_reference(ids, 4, n=2048, k=7168, swapped=True)
    assert sw[1][0].tolist() == [4096, 2, 7168] and sw[2][0].tolist() == [7168, 2, 2048]

    a = get_adapter("prepare_moe_input")
    c = moe_case("prepare_moe_input", t=16)
    x = a.make_inputs(c, "cpu", 1)
    ref = a.reference(x, c)
    # a kernel may order rows inside an expert differently: swap two rows of one expert consistently
    e = int(torch.argmax(ref[0][1:] - ref[0][:-1]))
    r0, r1 = int(ref[0][e]), int(ref[0][e]) + 1
    ip, op = ref[3].clone(), ref[4].clone()
    ip[[r0, r1]] = ip[[r1, r0]]
    i0, i1 = (op == r0).nonzero().item(), (op == r1).nonzero().item()
    op[i0], op[i1] = r1, r0
    assert a.check((ref[0], ref[1], ref[2], ip, op), ref, c).ok
    op_bad = op.clone()
    op_bad[[0, 1]] = op[[1, 0]]  # token 0's two slots sent to each other's expert rows
    assert not a.check((ref[0], ref[1], ref[2], ip, op_bad), ref, c).ok
    assert not a.check((ref[0] + 1, ref[1], ref[2], ip, op), ref, c).ok


def test_get_cutlass_w4a8_data_problem_sizes_are_n_m_k():
    a = get_adapter("get_cutlass_w4a8_moe_mm_data")
    c = moe_case("get_cutlass_w4a8_moe_mm_data", t=16)
    x = a.make_inputs(c, "cpu", 0)
    off, ps1, ps2 = a.reference(x, c)
    counts = expert_counts(x["topk_ids"], 256)
    assert ps1[:, 1].tolist() == counts.tolist() and set(ps1[:, 0].tolist()) == {4096}
    assert set(ps2[:, 0].tolist()) == {7168} and set(ps2[:, 2].tolist()) == {2048}
    assert a.check((off, ps1, ps2), (off, ps1, ps2), c).ok
    assert not a.check((off, ps1.roll(1, 0), ps2), (off, ps1, ps2), c).ok


def test_shuffle_rows_and_combine_references():
    a = get_adapter("shuffle_rows")
    c = moe_case("shuffle_rows", t=16)
    x = a.make_inputs(c, "cpu", 0)
    assert x["x"].dtype == torch.float8_e4m3fn and x["x"].shape == (16, 7168)
    assert x["dst2src_map"].shape == (128,) and x["dst2src_map"].dtype == torch.int32
    ref = a.reference(x, c)
    assert ref.shape == (128, 7168) and a.check(ref.clone(), ref, c).ok
    broken = ref.clone().view(torch.uint8)
    broken[3, 5] ^= 1
    assert not a.check(broken.view(torch.float8_e4m3fn), ref, c).ok

    b = get_adapter("apply_shuffle_mul_sum")
    cb = moe_case("apply_shuffle_mul_sum", t=16)
    y = b.make_inputs(cb, "cpu", 0)
    assert y["c2"].shape == (128, 7168) and y["factors"].dtype == torch.bfloat16
    out = b.reference(y, cb)
    t = 5
    want = sum(
        y["c2"][int(y["permutation"][t * 8 + j])].double() * float(y["factors"][t, j]) for j in range(8)
    )
    assert out.shape == (16, 7168) and torch.allclose(out[t].double(), want, rtol=1e-5, atol=1e-5)


def test_moe_sum_reduce_reference():
    a = get_adapter("moe_sum_reduce")
    c = moe_case("moe_sum_reduce", t=16)
    x = a.make_inputs(c, "cpu", 0)
    assert x["x"].shape == (16, 8, 7168) and x["x"].dtype == torch.bfloat16
    ref = a.reference(x, c)
    assert torch.allclose(ref[3, 100].double(), x["x"][3, :, 100].double().sum() * 2.5)
    assert a.check(ref.to(torch.bfloat16), ref, c).ok
    assert not a.check((ref * 1.1).to(torch.bfloat16), ref, c).ok


# -- every adapter at a CPU-profile case -----------------------------------------------------------------

EXPECTED_INPUTS = {
    "fused_moe_kernel": {"a": ((1, 7168), torch.bfloat16), "w": ((256, 4096, 7168), torch.bfloat16)},
    "fp8_blockwise_scaled_grouped_mm": {
        "a": ((8, 7168), torch.float8_e4m3fn),
        "a_scale": ((8, 56), torch.float32),
        "w": ((256, 4096, 7168), torch.float8_e4m3fn),
        "w_scale": ((256, 32, 56), torch.float32),
        "problem_sizes": ((256, 3), torch.int32),
        "expert_offsets": ((257,), torch.int32),
    },
    "cutlass_w4a8_moe_mm": {
        "a": ((8, 7168), torch.float8_e4m3fn),
        "a_scale": ((1,), torch.float32),
        "w": ((256, 4096, 3584), torch.int8),
        "w_scale": ((256, 14, 16384), torch.bfloat16),
        "problem_sizes": ((256, 3), torch.int32),
    },
    "trtllm_bf16_moe": {
        "routing_logits": ((1, 256), torch.float32),
        "routing_bias": ((256,), torch.bfloat16),
        "hidden_states": ((1, 7168), torch.bfloat16),
        "w13": ((256, 4096, 7168), torch.bfloat16),
        "w2": ((256, 7168, 2048), torch.bfloat16),
    },
    "trtllm_fp8_block_scale_moe": {
        "hidden_states": ((1, 7168), torch.float8_e4m3fn),
        "hidden_states_scale": ((1, 56), torch.float32),
        "w13_scale": ((256, 32, 56), torch.float32),
        "w2": ((256, 7168, 2048), torch.float8_e4m3fn),
    },
}
VARIANT = {
    "fused_moe_kernel": "gate_up.bf16",
    "fp8_blockwise_scaled_grouped_mm": "gate_up.fp8",
    "es_fp8_blockwise_scaled_grouped_mm": "down.fp8",
    "cutlass_w4a8_moe_mm": "gate_up.w4a8",
}
OUT_SHAPE = {
    "fused_moe_kernel": (8, 4096),
    "fp8_blockwise_scaled_grouped_mm": (8, 4096),
    "es_fp8_blockwise_scaled_grouped_mm": (8, 7168),
    "cutlass_w4a8_moe_mm": (8, 4096),
    "trtllm_bf16_moe": (1, 7168),
    "trtllm_fp8_block_scale_moe": (1, 7168),
}


def _snapshot(v: torch.Tensor) -> torch.Tensor:
    """A copy of what a CPU input stores: one expert for the stride-0 weight slab (cloning it all is 15 GB)."""
    return v[0].clone() if v.dim() and v.stride(0) == 0 else v.clone()


@pytest.mark.parametrize("kernel", GEMM_KERNELS + LAYER_KERNELS)
def test_inputs_reference_and_self_check(kernel):
    """A GEMM returns one tensor; a fused layer also the tokens clear of routing ties."""
    a = get_adapter(kernel)
    c = moe_case(kernel, 1, VARIANT.get(kernel))
    x = a.make_inputs(c, "cpu", 0)
    for name, (shape, dtype) in EXPECTED_INPUTS.get(kernel, {}).items():
        assert tuple(x[name].shape) == shape and x[name].dtype == dtype, name
    before = {k: _snapshot(v) for k, v in x.items()}
    full = a.reference(x, c)
    assert all(torch.equal(before[k], _snapshot(x[k])) for k in x), "reference modified its inputs"
    ref, pack = (full[0], lambda r: (r, full[1])) if kernel in LAYER_KERNELS else (full, lambda r: r)
    assert ref.dtype == torch.float32 and tuple(ref.shape) == OUT_SHAPE[kernel]
    assert torch.isfinite(ref).all() and 0.05 < float(ref.std()) < 20.0  # O(1) outputs, no overflow
    assert a.check(ref.to(torch.bfloat16), pack(ref), c).ok
    assert not a.check((ref + ref.std()).to(torch.bfloat16), pack(ref), c).ok


@pytest.mark.parametrize("kernel", LAYER_KERNELS)
def test_fused_layer_check_skips_only_near_tie_tokens(kernel):
    a = get_adapter(kernel)
    c = moe_case(kernel, 16, tp=8)
    out, clear = a.reference(a.make_inputs(c, "cpu", 2), c)
    assert clear.shape == (16,) and clear.dtype == torch.bool
    tied = clear.clone()
    tied[0] = False  # token 0 treated as a near-tie: its row may differ arbitrarily
    garbled = out.clone()
    garbled[0] = -garbled[0]
    assert a.check(garbled.to(torch.bfloat16), (out, tied), c).ok
    assert not a.check(garbled.to(torch.bfloat16), (out, clear | ~tied), c).ok


def test_fused_moe_down_variant_and_fp8_reference_quantises_activations():
    a = get_adapter("fused_moe_kernel")
    c = moe_case("fused_moe_kernel", 1, "down.fp8")
    x = a.make_inputs(c, "cpu", 0)
    assert (
        x["a"].shape == (8, 2048)
        and x["w"].shape == (256, 7168, 2048)
        and x["w_scale"].shape == (256, 56, 16)
    )
    ref = a.reference(x, c)
    assert ref.shape == (1, 8, 7168)
    w = ExpertWeights("fp8_block", x["w"], x["w_scale"])
    e = int(x["topk_ids"][0, 3])
    deq = quant_dequant_groups(x["a"])
    want = float(x["topk_weights"][0, 3]) * (deq[3] @ w.dequant(e, {}).t())
    assert torch.allclose(ref[0, 3], want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(deq, x["a"].float())  # the FP8 input quantisation is really applied


def test_cpu_weights_share_one_slab():
    w = make_expert_weights(256, 512, 256, "fp8_block", "cpu", torch.Generator().manual_seed(0))
    assert w.w.stride(0) == 0 and w.scale.stride(0) == 0 and w.key(0) == w.key(255)
    deq = w.dequant(7, {})
    assert 0.5 / 16 < float(deq.std()) < 2.0 / 16  # std ~ 1/sqrt(K)


def test_applies_filters_weight_formats():
    fused, grouped, w4 = (
        get_adapter(k) for k in ("fused_moe_kernel", "fp8_blockwise_scaled_grouped_mm", "cutlass_w4a8_moe_mm")
    )
    cases = SHAPES.cases("x", ["experts"], "moe_gemm", "decode", profile="full", tp=[1])
    assert {c.dims["weight"] for c in cases if fused.applies(c)} == {"bf16", "fp8_block"}
    assert {c.dims["weight"] for c in cases if grouped.applies(c)} == {"fp8_block"}
    assert {c.dims["weight"] for c in cases if w4.applies(c)} == {"w4a8"}
