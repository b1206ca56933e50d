"""The fp32 matmul precision a torch reference computes with, set for one block and restored after.

TF32 keeps 10 mantissa bits of each fp32 operand, multiplies them exactly and accumulates in fp32. An
operand that came from FP8 (e4m3: 3 mantissa bits), INT8 (integers up to 127) or BF16 (7 bits), cast to
fp32 and not yet scaled, loses nothing in it: the matmul then differs from an IEEE fp32 one by summation
order only, and runs on the tensor cores at several times the fp32 rate (tf32_for_exact_operands). A
reference that scales its operands before the matmul must not round them so (exact_fp32_matmul).
An fp32 left operand times an exact right one (attention's probabilities times BF16 values) is two such
matmuls: its TF32 part and the remainder (matmul_split_tf32).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch


@contextmanager
def _cuda_fp32_matmul(tf32: bool) -> Iterator[None]:
    """CUDA fp32 matmuls on TF32 tensor cores (True) or in IEEE fp32 (False) for the duration; a CPU
    matmul is unaffected."""
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):
        old = m.fp32_precision
        m.fp32_precision = "tf32" if tf32 else "ieee"
        try:
            yield
        finally:
            m.fp32_precision = old
    else:  # older torch
        old_tf32 = m.allow_tf32
        m.allow_tf32 = tf32
        try:
            yield
        finally:
            m.allow_tf32 = old_tf32


def tf32_for_exact_operands() -> AbstractContextManager[None]:
    """TF32 matmuls, for operands exact in TF32 (unscaled FP8, INT8, BF16 values)."""
    return _cuda_fp32_matmul(True)


def exact_fp32_matmul() -> AbstractContextManager[None]:
    """IEEE fp32 matmuls: a reference must not be computed with 10-bit mantissas."""
    return _cuda_fp32_matmul(False)


def fp32_matmul(tf32: bool) -> AbstractContextManager[None]:
    """tf32_for_exact_operands when the operands are exact in TF32 (`tf32`, exact_in_tf32's answer), else
    exact_fp32_matmul."""
    return _cuda_fp32_matmul(tf32)


# Types whose every value TF32 holds exactly (at most 10 explicit mantissa bits; INT8's integers to 127).
_EXACT_IN_TF32 = {torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2, torch.int8}


def exact_in_tf32(*tensors: torch.Tensor) -> bool:
    """Whether every tensor's type holds values TF32 represents exactly (cast to fp32, not yet scaled)."""
    return all(t.dtype in _EXACT_IN_TF32 for t in tensors)


_TF32_MASK = -(1 << 13)  # an fp32's sign, exponent and top 10 mantissa bits: the part TF32 keeps


def split_tf32(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 x = hi + lo exactly: hi is x with the 13 mantissa bits TF32 drops cleared (exact in TF32), lo
    the remainder (at most 2^-10 of x)."""
    hi = (x.view(torch.int32) & _TF32_MASK).view(torch.float32)
    return hi, x - hi


def matmul_split_tf32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for fp32 `a` and `b` exact in TF32 (BF16 values cast to fp32), as two TF32 matmuls: hi @ b is
    exact in its products, and lo @ b loses at most 2^-10 of lo, about 2^-20 of a, near fp32's own
    rounding of a long sum. On a CPU, which has no TF32, it is one plain fp32 matmul."""
    if a.device.type != "cuda":
        return a.float() @ b
    hi, lo = split_tf32(a.float())
    with tf32_for_exact_operands():
        return hi @ b + lo @ b
