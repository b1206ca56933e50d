"""TF32 tensor cores for a reference matmul whose operands they represent exactly.

TF32 keeps 10 mantissa bits of each fp32 operand, multiplies them exactly and accumulates in fp32. An
operand that came from FP8 (e4m3: 3 mantissa bits), INT8 (integers up to 127) or BF16 (7 bits), cast to
fp32 and not yet scaled, loses nothing in it: the matmul then differs from an IEEE fp32 one by summation
order only, and runs on the tensor cores at several times the fp32 rate. A reference that scales its
operands before the matmul must not use it (see nvfp4.exact_fp32_matmul).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def tf32_for_exact_operands() -> Iterator[None]:
    """TF32 matmuls on CUDA for the duration (a CPU matmul is unaffected)."""
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):
        old = m.fp32_precision
        m.fp32_precision = "tf32"
        try:
            yield
        finally:
            m.fp32_precision = old
    else:  # older torch
        old_tf32 = m.allow_tf32
        m.allow_tf32 = True
        try:
            yield
        finally:
            m.allow_tf32 = old_tf32
