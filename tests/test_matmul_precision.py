"""A reference matmul on TF32 tensor cores only where its operands are exact in TF32, and only for its
duration."""

from __future__ import annotations

import torch

from dskbench.adapters.common.matmul_precision import exact_fp32_matmul, tf32_for_exact_operands


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
