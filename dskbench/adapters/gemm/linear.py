"""What the dense GEMM adapters share: the quantisable projections, weight bytes by format,
FLOPs, the M/N/K of a case, and the what-if base class.

The NVFP4-v2 checkpoint runs its BF16 projections through cuBLAS and its NVFP4 ones through Marlin on
Hopper, so the INT8/FP8/W4A8 kernels are measured as a *what-if*: "this projection, at this shape, in this
format" — every linear of the model except the router (which SGLang never quantises).

Byte counts are the minimum traffic: each operand read once, output written once, scales counted.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from dskbench.adapters.backends import Requirement
from dskbench.adapters.base import Adapter
from dskbench.shapes.cases import Case

# Linear projections of DeepSeek-R1 that a quantised checkpoint quantises (the router `gate` stays BF16).
LINEAR_OPS = (
    "fused_qkv_a_proj_with_mqa",
    "q_b_proj",
    "kv_b_proj",
    "o_proj",
    "gate_up_proj",
    "down_proj",
    "shared_experts",
    "eh_proj",  # the NextN layer's projection (BF16 nn.Linear; cuBLAS is fp8_scaled_mm's torch.mm.bf16)
)
NEVER_QUANTISED = frozenset({"gate"})  # sglang's MoEGate is a plain nn.Module in every checkpoint

# Bytes per element of a stored weight, by format (NVFP4 counts its e4m3 scale per 16 elements).
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "int8": 1.0, "nvfp4": 0.5625, "int4": 0.5}
OUT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

BF16_OUT = torch.bfloat16
WEIGHT_STD = 0.02  # typical trained-weight spread; activations are unit normal
SM100_FAMILY = Requirement(sm=(100, 103, 110, 120, 121))
SM120 = Requirement(sm=(120, 121))


def weight_bytes(k: int, n: int, fmt: str) -> int:
    """Stored bytes of an [N, K] weight in `fmt`."""
    return int(k * n * WEIGHT_BYTES[fmt])


def gemm_flops(m: int, n: int, k: int, batch: int = 1) -> int:
    return 2 * batch * m * n * k


def mnk(case: Case) -> tuple[int, int, int]:
    d = case.dims
    return int(d["M"]), int(d["N"]), int(d["K"])


def takes(fn: Any, name: str) -> bool:
    """Whether `fn` has a parameter `name` (tells a current signature from a retired one)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class WhatIfLinear(Adapter):
    """A quantised GEMM measured at every quantisable linear projection of the model."""

    role = "gemm"
    ops = LINEAR_OPS
    fmt = ""  # what-if weight format, for the traffic note

    def applies(self, case: Case) -> bool:
        return case.op not in NEVER_QUANTISED and "weight" in case.dims and case.dims.get("out") is None

    def what_if_note(self, case: Case) -> str:
        return f"what-if {self.fmt} at {case.op} (checkpoint stores it as {case.dims.get('weight')})"
