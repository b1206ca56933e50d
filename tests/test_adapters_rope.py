"""RoPE adapters (dskbench.adapters.rope) on CPU: SGLang's strided views, the interleaved rotation,
FP8 outputs of mla_rope_quantize_fp8, traffic, and binders against the library signatures."""

from __future__ import annotations

import math
import re

import pytest
import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.backends import KINDS
from dskbench.adapters.common.inputs import FP8, SGLANG_SM90
from dskbench.adapters.rope import rotation as R
from dskbench.shapes.cases import Case, default_shapes

SHAPES = default_shapes()
TARGET = re.compile(r"^(torch\.ops(\.\w+){3}|[A-Za-z_]\w*(\.\w+)*:\w+(\.\w+)*)$")
INPLACE = ("apply_rope_with_cos_sin_cache_inplace", "rotary_embedding")


def _case(kernel: str, t: int = 16) -> Case:
    return next(
        c for c in SHAPES.cases(kernel, ["rotary_emb"], "rope", "decode", profile="cpu") if c.point["T"] == t
    )


def test_cache_is_cos_then_sin_of_deepseek_shape():
    cache = R.cos_sin_cache(163840, 64, "cpu")
    assert cache.shape == (163840, 64) and cache.dtype == torch.float32
    p = 1234
    inv = [10000.0 ** (-2 * i / 64) for i in range(32)]
    assert math.isclose(float(cache[p, 5]), math.cos(p * inv[5]), abs_tol=1e-6)
    assert math.isclose(float(cache[p, 32 + 5]), math.sin(p * inv[5]), abs_tol=1e-6)


@pytest.mark.parametrize("kernel", INPLACE)
def test_inputs_are_the_views_sglang_passes(kernel):
    a = get_adapter(kernel)
    inp = a.make_inputs(_case(kernel), "cpu", 0)
    q, k = inp["q_pe"], inp["k_pe"]
    assert q.shape == (16, 128, 64) and q.stride() == (128 * 192, 192, 1) and q.storage_offset() == 128
    assert k.shape == (16, 1, 64) and k.stride()[0] == 2112 and k.storage_offset() == 2048
    assert q.dtype == k.dtype == torch.bfloat16
    cache, pos = inp["cos_sin_cache"], inp["positions"]
    assert cache.shape == (163840, 64)
    assert cache.dtype == (torch.bfloat16 if kernel == "rotary_embedding" else torch.float32)
    assert pos.dtype == torch.int64 and pos.shape == (16,) and 0 <= int(pos.min()) and int(pos.max()) < 163840


def test_rotation_is_interleaved_gptj():
    cache = R.cos_sin_cache(8, 4, "cpu")
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])  # [T=1, H=1, R=4]
    p = 5
    out = R.rope_gptj(x, cache, torch.tensor([p]))
    a0, a1 = p * 1.0, p * 10000.0 ** (-2 / 4)
    expected = [
        1 * math.cos(a0) - 2 * math.sin(a0),
        2 * math.cos(a0) + 1 * math.sin(a0),
        3 * math.cos(a1) - 4 * math.sin(a1),
        4 * math.cos(a1) + 3 * math.sin(a1),
    ]
    assert torch.allclose(out.double().flatten(), torch.tensor(expected, dtype=torch.float64), atol=1e-6)


def test_references_keep_inputs_and_shapes():
    a = get_adapter("apply_rope_with_cos_sin_cache_inplace")
    case = _case(a.kernel)
    inp = a.make_inputs(case, "cpu", 1)
    q0 = inp["q_pe"].clone()
    q, k = a.reference(inp, case)
    assert q.shape == (16, 128, 64) and k.shape == (16, 1, 64) and q.dtype == torch.float32
    assert torch.equal(inp["q_pe"], q0)
    m = get_adapter("mla_rope_quantize_fp8")
    minp = m.make_inputs(_case(m.kernel), "cpu", 1)
    assert minp["q_nope"].shape == (16, 128, 512) and not minp["q_nope"].is_contiguous()
    assert (
        minp["k_nope"].shape == (16, 512)
        and minp["k_pe"].shape == (16, 64)
        and minp["k_pe"].stride(0) == 2112
    )
    q_ref, kn_ref, kr_ref = m.reference(minp, _case(m.kernel))
    assert q_ref.shape == (16, 128, 576) and kn_ref.shape == (16, 512) and kr_ref.shape == (16, 64)
    assert torch.equal(q_ref[..., :512], minp["q_nope"].float())


def test_traffic_is_the_minimum_traffic():
    t = 16
    for kernel in ("apply_rope_with_cos_sin_cache_inplace", "rotary_embedding"):
        tr = get_adapter(kernel).traffic(_case(kernel, t))
        assert tr.flops == 24768 * t
    assert get_adapter(INPLACE[0]).traffic(_case(INPLACE[0], t)).bytes == 33280 * t
    mla = get_adapter("mla_rope_quantize_fp8").traffic(_case("mla_rope_quantize_fp8", t))
    assert mla.bytes == 223168 * t
    assert mla.flops == 3 * t * 129 * 64 + t * 74304


# -- binders -------------------------------------------------------------------------------------------


def _rotate_in_place(q, k, cache, pos):
    q.copy_(R.rope_gptj(q, cache, pos))
    k.copy_(R.rope_gptj(k, cache, pos))


def jit_apply(q, k, cos_sin_cache, positions, *, is_neox, rope_dim=0, fused_args=None):
    assert is_neox is False and cos_sin_cache.dtype == torch.float32
    _rotate_in_place(q, k, cos_sin_cache, positions)


def old_order(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    """flashinfer's apply_rope_with_cos_sin_cache_inplace, sgl-kernel 0.3.x's, and rotary_embedding."""
    assert is_neox is False and head_size == query.shape[-1] == 64
    _rotate_in_place(query, key, cos_sin_cache, positions)


def test_rope_binders_follow_library_signatures():
    for kernel in INPLACE:
        a = get_adapter(kernel)
        case = _case(kernel)
        for b in a.backends:
            inp = a.make_inputs(case, "cpu", 2)
            ref = a.reference(inp, case)
            fn = jit_apply if b.name == "sglang_jit" and kernel == INPLACE[0] else old_order
            q, k = b.bind(fn, inp, case)()
            assert q is inp["q_pe"] and k is inp["k_pe"]  # in place on SGLang's views
            assert a.check((q, k), ref, case).ok, (kernel, b.name)


def test_fallback_to_the_old_sgl_kernel_home_uses_the_old_argument_order():
    a = get_adapter(INPLACE[0])
    b = next(b for b in a.backends if b.name == "sglang_jit")
    assert b.fallbacks == ("sgl_kernel.elementwise:apply_rope_with_cos_sin_cache_inplace",)

    def legacy(positions, query, key, head_size, cos_sin_cache, is_neox=True, fused_set_kv_buffer_arg=None):
        old_order(positions, query, key, head_size, cos_sin_cache, is_neox)

    legacy.__module__ = "sgl_kernel.elementwise"
    case = _case(a.kernel)
    inp = a.make_inputs(case, "cpu", 3)
    ref = a.reference(inp, case)
    assert a.check(b.bind(legacy, inp, case)(), ref, case).ok


def test_check_rejects_neox_style():
    a = get_adapter(INPLACE[0])
    case = _case(a.kernel)
    inp = a.make_inputs(case, "cpu", 4)
    ref = a.reference(inp, case)
    cos, sin = inp["cos_sin_cache"][inp["positions"]].chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]

    def neox(x):
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    assert not a.check((neox(inp["q_pe"]), neox(inp["k_pe"])), ref, case).ok


def mla_flashinfer(
    q_rope,
    k_rope,
    q_nope,
    k_nope,
    cos_sin_cache,
    pos_ids,
    is_neox=True,
    quantize_dtype=None,
    quant_scale_q=1.0,
    quant_scale_kv=1.0,
    q_rope_out=None,
    k_rope_out=None,
    q_nope_out=None,
    k_nope_out=None,
    enable_pdl=False,
):
    assert is_neox is False and quantize_dtype == FP8 and quant_scale_q == quant_scale_kv == 1.0
    q_rope_out.copy_(R.rope_gptj(q_rope, cos_sin_cache, pos_ids).to(FP8))
    k_rope_out.copy_(R.rope_gptj(k_rope.unsqueeze(1), cos_sin_cache, pos_ids).squeeze(1).to(FP8))
    q_nope_out.copy_(q_nope.float().to(FP8))
    k_nope_out.copy_(k_nope.float().to(FP8))
    return q_rope_out, k_rope_out, q_nope_out, k_nope_out


def mla_sglang(
    q_nope, q_rope, k_nope, k_rope, pos_ids, cos_sin_cache, is_neox, kv_lora_rank, qk_rope_head_dim
):
    t, nh = q_rope.shape[:2]
    q = torch.empty((t, nh, kv_lora_rank + qk_rope_head_dim), dtype=FP8)
    kr, kn = torch.empty(k_rope.shape, dtype=FP8), torch.empty(k_nope.shape, dtype=FP8)
    mla_flashinfer(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, FP8, 1.0, 1.0,
                   q[..., kv_lora_rank:], kr, q[..., :kv_lora_rank], kn)  # fmt: skip
    return q, kn, kr


def test_mla_binders_write_one_merged_fp8_q():
    a = get_adapter("mla_rope_quantize_fp8")
    case = _case(a.kernel)
    for b, fn in zip(a.backends, (mla_flashinfer, mla_sglang), strict=True):
        inp = a.make_inputs(case, "cpu", 5)
        ref = a.reference(inp, case)
        out = b.bind(fn, inp, case)()
        assert [o.dtype for o in out] == [FP8] * 3 and out[0].shape == (16, 128, 576)
        chk = a.check(out, ref, case)
        assert chk.ok and chk.error > 0, (b.name, chk)  # e4m3 rounding: small but nonzero
        bad = (out[0].float() * 1.5).to(FP8), out[1], out[2]
        assert not a.check(bad, ref, case).ok


@pytest.mark.parametrize("kernel", [*INPLACE, "mla_rope_quantize_fp8"])
def test_backends_are_well_formed(kernel):
    a = get_adapter(kernel)
    assert len({b.name for b in a.backends}) == len(a.backends)
    for b in a.backends:
        assert TARGET.match(b.target) and b.kind in KINDS and b.requires.sm is None
        assert all(TARGET.match(f) for f in b.fallbacks)
        if b.target.startswith("torch.ops."):
            assert b.preload == ("sgl_kernel",)
    labelled = [b.name for b in a.backends if b.label == SGLANG_SM90]
    assert labelled == (["sglang_jit"] if kernel == INPLACE[0] else [])
