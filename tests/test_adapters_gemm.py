"""Dense GEMM adapters (dskbench.adapters.gemm.*) on CPU: inputs, references, checks, traffic, backends."""

from __future__ import annotations

import re

import pytest
import torch

from dskbench.adapters import adapters, get_adapter
from dskbench.adapters.gemm import dsv3, fp8_blockwise, linear, qserve
from dskbench.shapes.cases import Case, default_shapes

KERNELS = (
    "int8_scaled_mm",
    "fp8_scaled_mm",
    "fp8_blockwise_scaled_mm",
    "qserve_w4a8_per_chn_gemm",
    "qserve_w4a8_per_group_gemm",
    "bmm_fp8",
    "dsv3_fused_a_gemm",
    "dsv3_router_gemm",
)
WHAT_IF = KERNELS[:5]
TARGET = re.compile(r"^(torch\.ops(\.\w+){3}|[A-Za-z_]\w*(\.\w+)*:\w+(\.\w+)*)$")
SHAPES = default_shapes()


def _case(kernel: str, op: str, phase: str = "decode", t: int = 1, variant: str | None = None) -> Case:
    a = get_adapter(kernel)
    cases = SHAPES.cases(kernel, [op], a.role, phase, profile="full")
    return next(c for c in cases if c.point["T"] == t and c.variant == variant)


def _tiny(kernel: str, m: int, n: int, k: int) -> Case:
    return Case(kernel, "q_b_proj", "decode", {"T": m}, {"M": m, "N": n, "K": k, "weight": "bf16"})


# -- registry, ops and applicability -------------------------------------------------------------------


def test_all_kernels_registered_with_roles():
    reg = adapters()
    for k in KERNELS:
        assert k in reg, k
        a = reg[k]()
        assert a.role == ("bmm" if k == "bmm_fp8" else "gemm")
        assert a.ops and all(op in SHAPES.ops for op in a.ops)


@pytest.mark.parametrize("kernel", WHAT_IF)
def test_what_if_kernels_cover_every_linear_but_the_router(kernel):
    a = get_adapter(kernel)
    ops = [op for op in SHAPES.op_groups["linear"] if SHAPES.ops[op].executed]
    cases = [c for ph in ("decode", "prefill") for c in SHAPES.cases(kernel, ops, "gemm", ph, profile="cpu")]
    covered = {c.op for c in cases if a.applies(c)}
    assert covered == set(SHAPES.op_groups["linear"]) - {"gate"}
    assert set(a.ops) == covered
    note = a.traffic(_case(kernel, "q_b_proj")).note
    assert "what-if" in note and "bf16" in note


def test_dsv3_kernels_apply_only_at_their_op_and_small_t():
    fa, rg = get_adapter("dsv3_fused_a_gemm"), get_adapter("dsv3_router_gemm")
    qb = _case("int8_scaled_mm", "q_b_proj")
    assert not fa.applies(qb) and not rg.applies(qb)
    assert fa.applies(_case("dsv3_fused_a_gemm", "fused_qkv_a_proj_with_mqa"))
    assert rg.applies(_case("dsv3_router_gemm", "gate"))
    fab = {b.name: b for b in fa.backends}
    rgb = {b.name: b for b in rg.backends}
    small_a = _case("dsv3_fused_a_gemm", "fused_qkv_a_proj_with_mqa", t=16)
    big_a = _case("dsv3_fused_a_gemm", "fused_qkv_a_proj_with_mqa", t=64)
    assert fab["sglang_jit"].skip(small_a) is None
    assert "T <= 16" in fab["sglang_jit"].skip(big_a)
    assert fab["torch.linear"].skip is None  # cuBLAS is what sglang runs above T = 16: timed at every T
    assert rgb["sglang_jit"].skip(_case("dsv3_router_gemm", "gate", t=16)) is None
    assert "T <= 16" in rgb["sglang_jit"].skip(_case("dsv3_router_gemm", "gate", "prefill", t=512))
    assert rgb["cublas"].skip is None


def test_qserve_skips_n_without_full_tiles():
    chn, grp = get_adapter("qserve_w4a8_per_chn_gemm"), get_adapter("qserve_w4a8_per_group_gemm")
    # fused_qkv_a N = 2112 = 16.5 x 128: per-channel uses CTA_N = 128 above M = 256 and drops the tail.
    big = _case("qserve_w4a8_per_chn_gemm", "fused_qkv_a_proj_with_mqa", "prefill", t=512)
    small = _case("qserve_w4a8_per_chn_gemm", "fused_qkv_a_proj_with_mqa", t=64)
    assert "N by 128" in chn.skip_reason(big)
    assert chn.skip_reason(small) is None and grp.skip_reason(big) is None


# -- inputs as the kernels take them -------------------------------------------------------------------


@pytest.mark.parametrize(
    "kernel,dtype", [("int8_scaled_mm", torch.int8), ("fp8_scaled_mm", torch.float8_e4m3fn)]
)
def test_scaled_mm_inputs(kernel, dtype):
    a = get_adapter(kernel)
    c = _case(kernel, "shared_experts", variant="down", t=16)  # M 16, K 2048, N 7168
    x = a.make_inputs(c, "cpu", 0)
    assert x["mat_a"].shape == (16, 2048) and x["mat_a"].dtype == dtype and x["mat_a"].stride(1) == 1
    assert x["mat_b"].shape == (2048, 7168) and x["mat_b"].dtype == dtype and x["mat_b"].stride(0) == 1
    assert x["scales_a"].shape == (16, 1) and x["scales_b"].shape == (7168, 1)
    assert x["scales_a"].dtype == x["scales_b"].dtype == torch.float32
    assert x["mat_a"].float().abs().max() > 0 and x["mat_b"].float().abs().max() > 0
    ref = a.reference(x, c)
    assert ref.shape == (16, 7168) and ref.dtype == torch.float32
    assert a.check(ref.to(torch.bfloat16), ref, c).ok  # what a correct kernel returns: the bf16 rounding


def test_blockwise_inputs_and_partial_weight_block():
    a = get_adapter("fp8_blockwise_scaled_mm")
    c = _case("fp8_blockwise_scaled_mm", "fused_qkv_a_proj_with_mqa")  # N = 2112 -> 17 scale rows
    x = a.make_inputs(c, "cpu", 0)
    assert x["a"].shape == (1, 7168) and x["a"].dtype == torch.float8_e4m3fn
    assert x["a_scale"].shape == (1, 56) and x["a_scale"].dtype == torch.float32
    assert x["w"].shape == (2112, 7168) and x["w"].dtype == torch.float8_e4m3fn
    assert x["w_scale"].shape == (17, 56)
    ref = a.reference(x, c)
    assert ref.shape == (1, 2112) and ref.dtype == torch.float32
    assert a.check(ref.to(torch.bfloat16), ref, c).ok


def test_blockwise_check_catches_misread_scales():
    """A kernel applying one weight-block scale to the wrong rows must fail the check."""
    a = get_adapter("fp8_blockwise_scaled_mm")
    c = _tiny("fp8_blockwise_scaled_mm", 4, 384, 256)
    x = a.make_inputs(c, "cpu", 0)
    x["w_scale"] = x["w_scale"] * torch.tensor([[1.0], [4.0], [0.25]])  # uneven blocks: layout matters
    ref = a.reference(x, c)
    wrong = dict(x, w_scale=x["w_scale"].flip(0))
    assert not a.check(a.reference(wrong, c).to(torch.bfloat16), ref, c).ok


def test_blockwise_binders_give_kernel_layouts():
    a = get_adapter("fp8_blockwise_scaled_mm")
    c = _tiny("fp8_blockwise_scaled_mm", 6, 256, 384)
    x = a.make_inputs(c, "cpu", 0)
    seen = {}

    def fake(*args, **kw):
        seen["args"], seen["kw"] = args, kw

    fp8_blockwise._bind_cutlass_blockwise(fake, x, c)()
    mat_a, mat_b, sa, sb, out_dtype = seen["args"]
    assert mat_b.shape == (384, 256) and mat_b.stride(0) == 1
    assert sa.shape == (6, 3) and sa.stride(0) == 1 and torch.equal(sa, x["a_scale"])
    assert sb.shape == (3, 2) and sb.stride(0) == 1 and out_dtype == torch.bfloat16
    fp8_blockwise._bind_deep_gemm(fake, x, c)()
    (_, sa_tma), (w, sw), out = seen["args"]
    assert sa_tma.stride() == (1, 8) and w.shape == (256, 384) and out.shape == (6, 256)
    # sglang's call: BF16 activations, no activation scales
    fp8_blockwise._bind_fi_blockscale_sm90(fake, x, c)()
    (inp, w, in_scale, w_scale), kw = seen["args"], seen["kw"]
    assert inp.dtype == torch.bfloat16 and inp is x["x"] and in_scale is None and w_scale is x["w_scale"]
    assert kw["out"].shape == (6, 256) and kw["out_dtype"] == torch.bfloat16
    fi, other = (a.traffic_for(b, c).bytes for b in ("flashinfer", "sglang_triton"))
    assert fi - other == 6 * 384 - 4 * 6 * 3  # BF16 activations in (one more byte each), no activation scales


def test_bmm_inputs_match_absorbed_mla():
    a = get_adapter("bmm_fp8")
    for variant, op, k, n in (
        ("q_nope_w_kc", "forward_absorb_prepare", 128, 512),
        ("attn_w_vc", "forward_absorb_core", 512, 128),
    ):
        c = _case("bmm_fp8", op, t=16, variant=variant)
        x = a.make_inputs(c, "cpu", 0)
        assert x["A"].shape == (128, 16, k) and x["A"].is_contiguous() and x["A"].dtype == torch.float8_e4m3fn
        assert x["B"].shape == (128, k, n) and x["B"].stride()[1:] == (1, k)  # column-major last two dims
        assert x["A_scale"].shape == x["B_scale"].shape == (1,)
        ref = a.reference(x, c)
        assert ref.shape == (128, 16, n) and ref.dtype == torch.float32
        assert a.check(ref.to(torch.bfloat16), ref, c).ok


def test_torch_bmm_backend_uses_sglang_layouts():
    a = get_adapter("bmm_fp8")
    c = _case("bmm_fp8", "forward_absorb_prepare", t=16, variant="q_nope_w_kc")
    x = a.make_inputs(c, "cpu", 0)
    be = next(b for b in a.backends if b.name == "torch.bmm.bf16")
    out = be.bind(torch.bmm, x, c)()
    assert out.dtype == torch.bfloat16 and a.check(out, a.reference(x, c), c).ok


def test_bf16_cublas_row_of_the_bf16_projections():
    a = get_adapter("fp8_scaled_mm")
    c = _tiny("fp8_scaled_mm", 16, 384, 256)
    x = a.make_inputs(c, "cpu", 0)
    be = next(b for b in a.backends if b.name == "torch.mm.bf16")
    out = be.bind(torch.mm, x, c)()
    assert out.dtype == torch.bfloat16 and out.shape == (16, 384) and a.check(out, a.reference(x, c), c).ok
    t = a.traffic_for("torch.mm.bf16", c)
    assert t.compute == "bf16" and t.bytes == 2 * 16 * 256 + 2 * 256 * 384 + 2 * 16 * 384


def test_quantised_gemms_compare_with_their_own_tensor_core_rate():
    # an H200 sweep (2026-11-21) put FP8/INT8 GEMMs at 172% of the (BF16) compute peak
    c = _tiny("fp8_scaled_mm", 16, 384, 256)
    assert get_adapter("fp8_scaled_mm").traffic_for("sgl_kernel", c).compute == "fp8"
    assert get_adapter("int8_scaled_mm").traffic_for("sgl_kernel", c).compute == "int8"
    fb = get_adapter("fp8_blockwise_scaled_mm")
    assert {fb.traffic_for(b, c).compute for b in ("sglang_triton", "flashinfer")} == {"fp8"}
    assert get_adapter("qserve_w4a8_per_chn_gemm").traffic_for("sgl_kernel", c).compute == "int8"
    bmm = get_adapter("bmm_fp8")
    bc = _case("bmm_fp8", "forward_absorb_prepare", t=16, variant="q_nope_w_kc")
    assert bmm.traffic_for("sgl_kernel", bc).compute == "fp8"
    bf16 = bmm.traffic_for("torch.bmm.bf16", bc)
    assert bf16.compute == "bf16" and bf16.bytes > bmm.traffic_for("sgl_kernel", bc).bytes  # 2-byte operands


def test_fused_a_and_router_inputs():
    fa = get_adapter("dsv3_fused_a_gemm")
    c = _case("dsv3_fused_a_gemm", "fused_qkv_a_proj_with_mqa", t=16)
    x = fa.make_inputs(c, "cpu", 0)
    assert x["mat_a"].shape == (16, 7168) and x["mat_a"].dtype == torch.bfloat16
    assert x["mat_b"].shape == (7168, 2112) and x["mat_b"].stride(0) == 1  # weight.T
    assert fa.reference(x, c).shape == (16, 2112)
    out = next(b for b in fa.backends if b.name == "torch.linear").bind(torch.nn.functional.linear, x, c)()
    assert fa.check(out, fa.reference(x, c), c).ok
    rg = get_adapter("dsv3_router_gemm")
    c = _case("dsv3_router_gemm", "gate", t=16)
    x = rg.make_inputs(c, "cpu", 0)
    assert x["hidden_states"].shape == (16, 7168) and x["router_weights"].shape == (256, 7168)
    assert x["router_weights"].is_contiguous() and x["router_weights"].dtype == torch.bfloat16
    ref = rg.reference(x, c)
    assert ref.shape == (16, 256) and ref.dtype == torch.float32


def test_router_binder_follows_signature():
    rg = get_adapter("dsv3_router_gemm")
    c = _case("dsv3_router_gemm", "gate", t=1)
    x = rg.make_inputs(c, "cpu", 0)
    calls = []

    def jit(hidden_states, router_weights, out_dtype=torch.bfloat16, output=None):
        calls.append((out_dtype, output is not None))

    def retired_aot(hidden_states, router_weights, out_dtype=torch.bfloat16):
        calls.append((out_dtype, False))

    dsv3._bind_router_jit(jit, x, c)()
    dsv3._bind_router_jit(retired_aot, x, c)()
    assert calls == [(torch.float32, True), (torch.float32, False)]


# -- references against hand formulas -----------------------------------------------------------------


@pytest.mark.parametrize("kernel", ["int8_scaled_mm", "fp8_scaled_mm"])
def test_scaled_mm_reference_naive_loop(kernel):
    a = get_adapter(kernel)
    c = _tiny(kernel, 3, 16, 32)
    x = a.make_inputs(c, "cpu", 1)
    ref = a.reference(x, c)
    A, B = x["mat_a"].double(), x["mat_b"].double()
    for i in range(3):
        for j in range(16):
            want = sum(A[i, kk] * B[kk, j] for kk in range(32)) * x["scales_a"][i, 0] * x["scales_b"][j, 0]
            assert ref[i, j].item() == pytest.approx(want.item(), rel=1e-5, abs=1e-7)


def test_blockwise_reference_matches_explicit_block_loop():
    a = get_adapter("fp8_blockwise_scaled_mm")
    c = _tiny("fp8_blockwise_scaled_mm", 2, 192, 256)  # 2 weight row-blocks (the second partial)
    x = a.make_inputs(c, "cpu", 2)
    ref = a.reference(x, c).double()
    A, W = x["a"].double(), x["w"].double()
    want = torch.zeros(2, 192, dtype=torch.float64)
    for kb in range(2):
        ks = slice(128 * kb, 128 * kb + 128)
        part = A[:, ks] @ W[:, ks].t()  # [2, 192]
        sw = x["w_scale"][:, kb].double().repeat_interleave(128)[:192]
        want += part * x["a_scale"][:, kb : kb + 1].double() * sw[None, :]
    assert torch.allclose(ref, want, rtol=1e-5, atol=1e-6)


def test_bmm_reference_hand():
    a = get_adapter("bmm_fp8")
    A = torch.tensor([[[1.0, 2.0]], [[0.5, -1.0]]]).to(torch.float8_e4m3fn)  # [2, 1, 2]
    B = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[2.0, 1.0], [4.0, 1.0]]]).to(torch.float8_e4m3fn)
    x = {"A": A, "B": B, "A_scale": torch.tensor([2.0]), "B_scale": torch.tensor([0.5])}
    c = Case("bmm_fp8", "forward_absorb_prepare", "decode", {"T": 1}, {"b": 2, "M": 1, "K": 2, "N": 2})
    assert a.reference(x, c).tolist() == [[[1.0, 2.0]], [[-3.0, -0.5]]]


def test_router_and_fused_a_reference_hand():
    rg = get_adapter("dsv3_router_gemm")
    x = {
        "hidden_states": torch.tensor([[1.0, 2.0]]).bfloat16(),
        "router_weights": torch.tensor([[3.0, 4.0], [1.0, -1.0]]).bfloat16(),
    }
    assert rg.reference(x, None).tolist() == [[11.0, -1.0]]
    fa = get_adapter("dsv3_fused_a_gemm")
    x = {
        "mat_a": torch.tensor([[1.0, 2.0]]).bfloat16(),
        "mat_b": torch.tensor([[3.0, 1.0], [4.0, -1.0]]).bfloat16(),
    }
    assert fa.reference(x, None).tolist() == [[11.0, -1.0]]


# -- QServe packing ------------------------------------------------------------------------------------


def test_qserve_pack_roundtrip_and_layout():
    g = torch.Generator().manual_seed(0)
    q8 = torch.randint(0, 16, (64, 96), generator=g, dtype=torch.int8)
    p = qserve.qserve_pack_w4(q8)
    assert p.shape == (64, 48) and p.dtype == torch.int8
    assert torch.equal(qserve.qserve_unpack_w4(p), q8)
    b, q = p.view(torch.uint8).int().flatten(), q8.int()
    # Memory is [N/32][K/32][512-byte tile]; in a tile the byte order is (row%8, k/4%4, k/16, row/8%2, k%4)
    # and a byte holds rows r (low nibble) and r+16 (high nibble) at the same k.
    assert b[0] == q[0, 0] + 16 * q[16, 0]
    assert b[1] == q[0, 1] + 16 * q[16, 1]
    assert b[4] == q[8, 0] + 16 * q[24, 0]
    assert b[8] == q[0, 16] + 16 * q[16, 16]
    assert b[16] == q[0, 4] + 16 * q[16, 4]
    assert b[64] == q[1, 0] + 16 * q[17, 0]
    assert b[512] == q[0, 32] + 16 * q[16, 32]  # next K tile
    assert b[512 * 3] == q[32, 0] + 16 * q[48, 0]  # next N tile (K/32 = 3 tiles per row of tiles)
    with pytest.raises(ValueError):
        qserve.qserve_pack_w4(torch.zeros(48, 64, dtype=torch.int8))


def test_qserve_group_param_interleave():
    t = torch.arange(64 * 2, dtype=torch.int16).view(64, 2).to(torch.int8)  # [N, groups]
    p = qserve.qserve_pack_group_param(t)
    assert p.shape == (2, 64)
    assert p[0, :5].tolist() == [t[0, 0], t[8, 0], t[16, 0], t[24, 0], t[1, 0]]  # 0, 8, 16, 24, 1, ...
    assert torch.equal(qserve.qserve_unpack_group_param(p), t)


def test_qserve_references_match_logical_formulas():
    chn, grp = get_adapter("qserve_w4a8_per_chn_gemm"), get_adapter("qserve_w4a8_per_group_gemm")
    c = _tiny("qserve_w4a8_per_chn_gemm", 3, 64, 256)
    x = chn.make_inputs(c, "cpu", 0)
    q = qserve.qserve_unpack_w4(x["kernel"]).double()
    assert q.min() >= 0 and q.max() <= 15
    s, zs = x["wscales"].double(), x["w_szs"].double()
    a, asc = x["in_feats"].double(), x["ascales"].double()
    assert torch.allclose(x["a_ssums"].double(), asc * a.sum(-1), rtol=1e-3)
    # out = ascale * wscale * (a_q . (q - z)): the asymmetric-dequant GEMM the epilogue computes
    want = (a @ (q - (zs / s)[:, None]).t()) * asc[:, None] * s[None, :]
    ref = chn.reference(x, c)
    assert ref.shape == (3, 64) and ref.dtype == torch.float32
    assert float((ref.double() - want).norm() / want.norm()) < 2e-3  # a_ssums/w_szs are fp16-rounded
    assert chn.check(ref.half(), ref, c).ok

    x = grp.make_inputs(c, "cpu", 0)
    assert x["zeros"].shape == x["scales_i8"].shape == (2, 64) and x["wscales"].dtype == torch.float16
    q = qserve.qserve_unpack_w4(x["kernel"]).double()
    s = qserve.qserve_unpack_group_param(x["scales_i8"]).double()
    z = -qserve.qserve_unpack_group_param(x["zeros"]).double() / s
    w = (q.view(64, 2, 128) - z[..., None]) * s[..., None]
    assert w.abs().max() <= 127
    want = (
        (x["in_feats"].double() @ w.view(64, 256).t())
        * x["ascales"].double()[:, None]
        * x["wscales"].double()
    )
    ref = grp.reference(x, c)
    assert torch.allclose(ref.double(), want, rtol=1e-5, atol=1e-6)
    assert grp.check(ref.half(), ref, c).ok


def test_qserve_inputs_at_a_model_shape():
    a = get_adapter("qserve_w4a8_per_group_gemm")
    c = _case("qserve_w4a8_per_group_gemm", "shared_experts", variant="down")  # K 2048, N 7168
    x = a.make_inputs(c, "cpu", 0)
    assert x["in_feats"].shape == (1, 2048) and x["in_feats"].dtype == torch.int8
    assert x["kernel"].shape == (7168, 1024) and x["kernel"].dtype == torch.int8
    assert x["zeros"].shape == (16, 7168) and x["ascales"].shape == (1,)
    assert a.reference(x, c).shape == (1, 7168)


# -- traffic: hand-counted numbers -----------------------------------------------------------------------

# op[:variant] -> (K, N, weight format, weight bytes, FLOPs per token), counted by hand from the model config.
TABLE = {
    "fused_qkv_a_proj_with_mqa": (7168, 2112, "bf16", 30_277_632, 30_277_632),
    "q_b_proj": (1536, 24576, "bf16", 75_497_472, 75_497_472),
    "kv_b_proj": (512, 32768, "bf16", 33_554_432, 33_554_432),
    "o_proj": (16384, 7168, "nvfp4", 66_060_288, 234_881_024),
    "gate_up_proj": (7168, 36864, "nvfp4", 148_635_648, 528_482_304),
    "down_proj": (18432, 7168, "nvfp4", 74_317_824, 264_241_152),
    "shared_experts:gate_up": (7168, 4096, "nvfp4", 16_515_072, 58_720_256),
    "shared_experts:down": (2048, 7168, "nvfp4", 8_257_536, 29_360_128),
    "gate": (7168, 256, "bf16", 3_670_016, 3_670_016),
    "eh_proj": (14336, 7168, "bf16", 205_520_896, 205_520_896),  # NextN: [T, 2H] -> [T, H], replicated
}


def test_gemm_table_from_shapes():
    seen = set()
    for phase in ("decode", "prefill"):
        for op in SHAPES.op_groups["linear"]:
            for c in SHAPES.cases("x", [op], "gemm", phase, profile="cpu"):
                key = f"{c.op}:{c.variant}" if c.variant else c.op
                k, n, fmt, wbytes, flops = TABLE[key]
                assert (c.dims["K"], c.dims["N"], c.dims["weight"]) == (k, n, fmt)
                assert linear.weight_bytes(k, n, fmt) == wbytes
                assert linear.gemm_flops(1, n, k) == flops
                seen.add(key)
    assert seen == set(TABLE)


def test_traffic_numbers():
    t = get_adapter("dsv3_fused_a_gemm").traffic(
        _case("dsv3_fused_a_gemm", "fused_qkv_a_proj_with_mqa", t=16)
    )
    assert t.bytes == 30_277_632 + 16 * (14_336 + 4_224) and t.flops == 16 * 30_277_632
    t = get_adapter("dsv3_router_gemm").traffic(_case("dsv3_router_gemm", "gate", t=16))
    assert t.bytes == 3_670_016 + 16 * (14_336 + 1_024) and t.flops == 16 * 3_670_016
    # W8A8 at q_b_proj, T=1: M*K + K*N + 4(M+N) + 2*M*N
    for kernel in ("int8_scaled_mm", "fp8_scaled_mm"):
        t = get_adapter(kernel).traffic(_case(kernel, "q_b_proj"))
        assert t.bytes == 1536 + 37_748_736 + 4 * (1 + 24576) + 2 * 24576 and t.flops == 75_497_472
    # block FP8 at fused_qkv_a, T=1: + 4*M*K/128 + 4*ceil(N/128)*K/128
    t = get_adapter("fp8_blockwise_scaled_mm").traffic(
        _case("fp8_blockwise_scaled_mm", "fused_qkv_a_proj_with_mqa")
    )
    assert t.bytes == 7168 + 15_138_816 + 4 * 56 + 4 * 17 * 56 + 2 * 2112
    # QServe per-channel at o_proj, T=1: M*K + N*K/2 + 2(2N + 2M) + 2*M*N
    t = get_adapter("qserve_w4a8_per_chn_gemm").traffic(_case("qserve_w4a8_per_chn_gemm", "o_proj"))
    assert t.bytes == 16384 + 16384 * 7168 // 2 + 2 * (2 * 7168 + 2) + 2 * 7168
    # bmm_fp8: w_kc = 16,384T + 8,388,608 + 131,072T; w_vc = 65,536T + 8,388,608 + 32,768T
    bmm = get_adapter("bmm_fp8")
    t = bmm.traffic(_case("bmm_fp8", "forward_absorb_prepare", t=16, variant="q_nope_w_kc"))
    assert t.bytes == 16 * 16_384 + 8_388_608 + 16 * 131_072 + 8 and t.flops == 16 * 16_777_216
    t = bmm.traffic(_case("bmm_fp8", "forward_absorb_core", t=16, variant="attn_w_vc"))
    assert t.bytes == 16 * 65_536 + 8_388_608 + 16 * 32_768 + 8 and t.flops == 16 * 16_777_216


# -- backends -------------------------------------------------------------------------------------------

SM100_ONLY = {("bmm_fp8", "flashinfer.cutlass"), ("dsv3_router_gemm", "flashinfer")}


@pytest.mark.parametrize("kernel", KERNELS)
def test_backends_well_formed(kernel):
    a = get_adapter(kernel)
    names = [b.name for b in a.all_backends()]
    assert len(names) == len(set(names)) and "torch-ref" in names
    for b in a.backends:
        for target in (b.target, *b.fallbacks):
            assert TARGET.match(target), target
        if (kernel, b.name) in SM100_ONLY:
            assert b.requires.sm is not None and 100 in b.requires.sm and 90 not in b.requires.sm


def test_backend_requirements_follow_sources():
    blk = {b.name: b for b in get_adapter("fp8_blockwise_scaled_mm").backends}
    assert blk["sglang_jit"].requires.sm == (120, 121)  # "requires SM120 (Blackwell)"
    assert blk["flashinfer"].requires.sm == (90,)  # fp8_blockscale_gemm_sm90: SM90 only
    assert blk["deep_gemm"].package == "sgl-deep-gemm"
    rg = {b.name: b for b in get_adapter("dsv3_router_gemm").backends}
    assert rg["sglang_jit"].fallbacks == ("sgl_kernel.gemm:dsv3_router_gemm",)
    fa = {b.name: b for b in get_adapter("dsv3_fused_a_gemm").backends}
    assert fa["sglang.fused_a_gemm"].dispatches_to and fa["torch.linear"].label
    assert "T > 16" in fa["torch.linear"].label
