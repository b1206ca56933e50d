"""MoE adapters' binders with CPU stand-ins that take the real kernels' arguments: each bind must pass
what SGLang passes, and the stand-in's output must pass the adapter's own check."""

from __future__ import annotations

import pytest

from dskbench.adapters import get_adapter
from dskbench.adapters.common import fp8
from dskbench.adapters.moe.align import moe_align_reference
from dskbench.adapters.moe.cutlass_grouped import CUTLASS_FP8_WORKSPACE_BYTES
from dskbench.adapters.moe.cutlass_prepare import prepare_reference
from dskbench.adapters.moe.inputs import ExpertWeights, unpack_int4
from dskbench.adapters.moe.trtllm import moe_layer_reference
from tests.test_adapters_moe import moe_case


def _fake_align(ids, n_buckets, bs, sorted_ids, expert_ids, n_post, cumsum, pad, *ignore_invalid):
    assert pad is True and n_buckets == 257 and cumsum.numel() == n_buckets + 1
    s, e, p = moe_align_reference(ids, n_buckets - 1, bs)
    sorted_ids.copy_(s)
    expert_ids[: e.numel()] = e
    n_post.copy_(p)
    return len(ignore_invalid)


def test_align_binds_pass_sglangs_arguments():
    a = get_adapter("moe_align_block_size")
    c = moe_case("moe_align_block_size", 16)
    x = a.make_inputs(c, "cpu", 0)
    seen = []
    for b in a.backends:

        def fake(*args, _seen=seen):
            _seen.append(_fake_align(*args))

        assert a.check(b.bind(fake, x, c)(), a.reference(x, c), c).ok
    assert seen == [1, 0, 0]  # only the AOT op takes ignore_invalid_expert


def test_bookkeeping_binds_with_cpu_standins():
    p = get_adapter("prepare_moe_input")
    c = moe_case("prepare_moe_input", 16)
    x = p.make_inputs(c, "cpu", 0)

    def prepare(ids, offsets, blockscale, ps1, ps2, in_perm, out_perm, e, n, k):
        assert blockscale is None and (e, n, k) == (256, 2048, 7168)
        for dst, src in zip(
            (offsets, ps1, ps2, in_perm, out_perm), prepare_reference(ids, e, n, k), strict=False
        ):
            dst.copy_(src)

    assert p.check(p.backends[0].bind(prepare, x, c)(), p.reference(x, c), c).ok

    w = get_adapter("get_cutlass_w4a8_moe_mm_data")

    def w4a8_data(ids, offsets, ps1, ps2, in_perm, out_perm, e, n, k):
        for dst, src in zip((offsets, ps1, ps2), prepare_reference(ids, e, n, k, swapped=True), strict=False):
            dst.copy_(src)

    assert w.check(w.backends[0].bind(w4a8_data, x, c)(), w.reference(x, c), c).ok

    s = get_adapter("shuffle_rows")
    xs = s.make_inputs(c, "cpu", 0)
    out = s.backends[0].bind(lambda inp, m, o: o.copy_(inp[m.long()]), xs, c)()
    assert s.check(out, s.reference(xs, c), c).ok

    m = get_adapter("apply_shuffle_mul_sum")
    xm = m.make_inputs(c, "cpu", 0)

    def shuffle_mul_sum(inp, o, perm, factors):
        rows = inp.float()[perm.long()].view(o.shape[0], -1, o.shape[1])
        o.copy_((rows * factors.float().unsqueeze(-1)).sum(1))

    assert m.check(m.backends[0].bind(shuffle_mul_sum, xm, c)(), m.reference(xm, c), c).ok

    r = get_adapter("moe_sum_reduce")
    xr = r.make_inputs(c, "cpu", 0)
    for b in r.backends:
        out = b.bind(lambda inp, o, f: o.copy_(inp.float().sum(1) * f), xr, c)()
        assert r.check(out, r.reference(xr, c), c).ok


def _grouped_rows(offsets, sizes, n_col):
    """Rows and M of each expert from offsets and (M, N, K) / (N, M, K) problem sizes."""
    for e in range(sizes.shape[0]):
        m = int(sizes[e, n_col])
        if m:
            yield e, int(offsets[e]), m


def test_cutlass_fp8_grouped_binds_with_cpu_standin():
    def grouped(out, a, b, sa, sb, stride_a, stride_b, stride_c, sizes, offsets):
        assert b.shape[1] == a.shape[1] and sb.shape[1] == a.shape[1] // 128  # b is [E, K, N]
        assert int(stride_a[0]) == a.shape[1] and int(stride_c[0]) == out.shape[1]
        for e, r0, m in _grouped_rows(offsets, sizes, 0):
            assert tuple(sizes[e].tolist()) == (m, out.shape[1], a.shape[1])
            wt = b[e].float() * sb[e].float().repeat_interleave(128, 0).repeat_interleave(128, 1)  # [K, N]
            aa = a[r0 : r0 + m].float() * sa[r0 : r0 + m].repeat_interleave(128, 1)
            out[r0 : r0 + m] = (aa @ wt).to(out.dtype)

    for kernel, variant in (
        ("fp8_blockwise_scaled_grouped_mm", "gate_up.fp8"),
        ("es_fp8_blockwise_scaled_grouped_mm", "down.fp8"),
    ):
        g = get_adapter(kernel)
        c = moe_case(
            kernel, 1, variant, tp=8
        )  # TP 8 keeps the CPU stand-in's per-expert dequantisation small
        x = g.make_inputs(c, "cpu", 0)

        def fake(*args, _es=kernel.startswith("es")):
            if _es:
                out, a, b, sa, sb, st_a, st_b, st_d, sizes, offsets, ws = args
            else:
                out, *ptrs, a, b, sa, sb, st_a, st_b, st_d, lay_a, lay_b, sizes, offsets, ws = args
                assert len(ptrs) == 5 and lay_a.shape == (256, 5)
            assert offsets.numel() == 256 and ws.numel() == CUTLASS_FP8_WORKSPACE_BYTES
            assert b.stride(1) == 1  # [E, K, N] with K contiguous: the [E, N, K] weight, transposed
            grouped(out, a, b, sa, sb, st_a, st_b, st_d, sizes, offsets)

        out = g.backends[0].bind(fake, x, c)()
        assert g.check(out, g.reference(x, c), c).ok, kernel


@pytest.mark.parametrize("variant", ["gate_up.w4a8", "down.w4a8"])  # K/128 = 56 (interleaved by 4) and 2
def test_w4a8_bind_with_cpu_standin(variant):
    g = get_adapter("cutlass_w4a8_moe_mm")
    c = moe_case("cutlass_w4a8_moe_mm", 1, variant, tp=8)
    x = g.make_inputs(c, "cpu", 0)

    def w4a8(d, a, b, a_scale, b_scale, offsets, sizes, a_str, b_str, d_str, s_str, chunk, topk):
        e_n, n, k = b.shape[0], b.shape[1], a.shape[1]
        assert (chunk, topk) == (128, 8) and a_str.shape == (e_n, 3) and int(d_str[0, 0]) == n
        g4 = k // 128
        al = 4 if g4 % 4 == 0 else 1
        plain = b_scale.view(e_n, g4 // al, n, al).permute(0, 2, 1, 3).reshape(e_n, n, g4)  # undo interleave
        for e, r0, m in _grouped_rows(offsets, sizes, 1):  # sizes are (N, M, K)
            assert tuple(sizes[e].tolist()) == (n, m, k)
            w = unpack_int4(b[e]).float() * plain[e].float().repeat_interleave(128, 1)
            d[r0 : r0 + m] = ((a[r0 : r0 + m].float() * a_scale) @ w.t()).to(d.dtype)

    assert g.check(g.backends[0].bind(w4a8, x, c)(), g.reference(x, c), c).ok


def test_trtllm_fp8_bind_passes_transposed_activation_scales():
    a = get_adapter("trtllm_fp8_block_scale_moe")
    c = moe_case("trtllm_fp8_block_scale_moe", 1, tp=8)
    x = a.make_inputs(c, "cpu", 0)
    seen = {}

    def fake(**kw):
        seen.update(kw)
        hs = fp8.dequant_per_token_group(kw["hidden_states"], kw["hidden_states_scale"].t(), 128)
        w13 = ExpertWeights("fp8_block", kw["gemm1_weights"], kw["gemm1_weights_scale"])
        w2 = ExpertWeights("fp8_block", kw["gemm2_weights"], kw["gemm2_weights_scale"])
        routing = (kw["top_k"], kw["n_group"], kw["topk_group"], kw["routed_scaling_factor"])
        out = moe_layer_reference(hs, w13, w2, kw["routing_logits"], kw["routing_bias"], routing, True)
        kw["output"].copy_(out)

    out = a.backends[0].bind(fake, x, c)()
    assert a.check(out, a.reference(x, c), c).ok
    assert seen["hidden_states_scale"].shape == (56, 1) and seen["routing_method_type"] == 2
    assert seen["weight_layout"] == 0 and not seen["use_shuffled_weight"] and seen["local_num_experts"] == 256
    assert seen["intermediate_size"] == 256 and seen["tune_max_num_tokens"] == 1
