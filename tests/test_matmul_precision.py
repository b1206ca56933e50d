"""A reference matmul on TF32 tensor cores only where its operands are exact in TF32, and only for its
duration."""

from __future__ import annotations

import pytest
import torch

from dskbench.adapters.common.matmul_precision import (
    exact_fp32_matmul,
    exact_in_tf32,
    matmul_split_tf32,
    split_tf32,
    tf32_for_exact_operands,
)


def _tf32_on() -> bool:
    m = torch.backends.cuda.matmul
    return m.fp32_precision == "tf32" if hasattr(m, "fp32_precision") else bool(m.allow_tf32)


def test_tf32_is_on_inside_and_restored_after_even_on_an_error():
    before = _tf32_on()
    with tf32_for_exact_operands():
        assert _tf32_on()
    assert _tf32_on() == before
    try:
        with tf32_for_exact_operands():
            raise ValueError("a reference that fails")
    except ValueError:
        pass
    assert _tf32_on() == before
    with tf32_for_exact_operands(), exact_fp32_matmul():  # the inner one wins, and both restore
        assert not _tf32_on()
    assert _tf32_on() == before


def test_fp8_and_int8_values_survive_tf32s_ten_bit_mantissa():
    """Why the product is exact in its operands: rounding to TF32 (10 mantissa bits) changes no FP8 e4m3
    value, no INT8 value and no BF16 value."""

    def to_tf32(x: torch.Tensor) -> torch.Tensor:  # keep the top 10 of fp32's 23 mantissa bits
        bits = x.float().view(torch.int32)
        return (bits & ~((1 << 13) - 1)).view(torch.float32)

    fp8 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    fp8 = fp8[torch.isfinite(fp8)]
    ints = torch.arange(-128, 128, dtype=torch.float32)
    bf16 = torch.randn(4096).to(torch.bfloat16).float()
    for x in (fp8, ints, bf16):
        assert torch.equal(to_tf32(x), x)
    assert not torch.equal(to_tf32(torch.tensor([1 + 2**-12])), torch.tensor([1 + 2**-12]))  # fp32 is not


def _to_tf32(x: torch.Tensor) -> torch.Tensor:
    """What a TF32 tensor core reads of an fp32 operand (its top 10 mantissa bits), emulated."""
    return (x.float().view(torch.int32) & ~((1 << 13) - 1)).view(torch.float32)


def test_a_split_fp32_operand_times_an_exact_one_is_fp32_accurate_on_tf32():
    """Attention's fp32 probabilities times BF16 values: as one TF32 matmul the probabilities lose up to
    2^-10 each; split into the part TF32 keeps and the remainder, the two TF32 matmuls (emulated here in
    float64 on what TF32 reads) come within 2^-19 of the exact product."""
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(16, 512, generator=gen) * 4, dim=-1)
    v = torch.randn(512, 64, generator=gen).to(torch.bfloat16).float()
    hi, lo = split_tf32(p)
    assert torch.equal(hi + lo, p) and torch.equal(_to_tf32(hi), hi)  # exact split, hi kept whole by TF32
    assert bool((lo.abs() <= p.abs() * 2**-10).all())
    exact = p.double() @ v.double()
    one = _to_tf32(p).double() @ _to_tf32(v).double()
    two = _to_tf32(hi).double() @ _to_tf32(v).double() + _to_tf32(lo).double() @ _to_tf32(v).double()

    def err(x: torch.Tensor) -> float:
        return float((x - exact).norm() / exact.norm())

    assert err(two) < 2**-19 < 2**-13 < err(one)
    assert torch.equal(matmul_split_tf32(p, v), p @ v)  # a CPU has no TF32: one plain fp32 matmul


def test_which_types_are_exact_in_tf32():
    bf16, fp8 = torch.zeros(2, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.float8_e4m3fn)
    assert exact_in_tf32(bf16, fp8, torch.zeros(2, dtype=torch.int8))
    assert not exact_in_tf32(bf16, torch.zeros(2))  # an fp32 operand may use all 23 mantissa bits


def test_the_references_use_tf32_only_where_their_operands_are_bf16(monkeypatch):
    """MLA decode, MHA prefill and the Triton MoE GEMM: TF32 for BF16 inputs; FP8 MoE operands are scaled
    before the matmul and fp32 attention inputs use every mantissa bit, so those stay IEEE fp32."""
    from contextlib import nullcontext

    from dskbench.adapters import get_adapter
    from dskbench.adapters.attention import mha_prefill, mla_decode
    from dskbench.adapters.moe import reference
    from tests.test_adapters_moe import moe_case

    used: list[str] = []
    for module in (mha_prefill, mla_decode, reference):
        monkeypatch.setattr(
            module, "fp32_matmul", lambda tf32: used.append("tf32" if tf32 else "ieee") or nullcontext()
        )
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.bfloat16, torch.float32):
        q = torch.randn(1, 2, 576, generator=gen).to(dtype)
        kv = torch.randn(128, 576, generator=gen).to(dtype)
        lens = torch.tensor([5], dtype=torch.int32)
        mla_decode.mla_decode_reference(q, kv, torch.zeros(1, 1, dtype=torch.int32), lens, 0.1, 64)
        qkv = [torch.randn(6, 2, 8, generator=gen).to(dtype) for _ in range(3)]
        mha_prefill.mha_causal_reference(*qkv, [6], 0.3)
    assert used == ["tf32", "tf32", "ieee", "ieee"]
    used.clear()
    a = get_adapter("fused_moe_kernel")
    for variant in ("down.bf16", "down.fp8"):
        c = moe_case("fused_moe_kernel", 1, variant)
        a.reference(a.make_inputs(c, "cpu", 0), c)
        assert set(used) == {"tf32" if variant == "down.bf16" else "ieee"}, variant
        used.clear()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 tensor cores need a CUDA GPU")
def test_on_a_gpu_the_split_matmul_is_fp32_accurate_where_one_tf32_matmul_is_not():
    gen = torch.Generator(device="cuda").manual_seed(0)
    p = torch.softmax(torch.randn(64, 4096, generator=gen, device="cuda") * 4, dim=-1)
    v = torch.randn(4096, 512, generator=gen, device="cuda").to(torch.bfloat16).float()
    exact = p.double() @ v.double()
    with tf32_for_exact_operands():
        one = p @ v

    def err(x: torch.Tensor) -> float:
        return float((x.double() - exact).norm() / exact.norm())

    assert err(matmul_split_tf32(p, v)) < 2**-19 < err(one)
