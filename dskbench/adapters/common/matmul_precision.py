"""The fp32 matmul precision a torch reference computes with, set for one block and restored after.

TF32 keeps 10 mantissa bits of each fp32 operand, multiplies them exactly and accumulates in fp32. An
operand that came from FP8 (e4m3: 3 mantissa bits), INT8 (integers up to 127) or BF16 (7 bits), cast to
fp32 and not yet scaled, loses nothing in it: the matmul then differs from an IEEE fp32 one by summation
order only, and runs on the tensor cores at several times the fp32 rate (tf32_for_exact_operands). A
reference that scales its operands before the matmul must not round them so (exact_fp32_matmul).
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
