"""DeepSeek-V3.2 indexer FP8 quantisation: `act_quant` (the Triton kernel `_act_quant_kernel`, traced as
`nsa_triton_kernel`).

SGLang 0.5.16's indexer (sglang/srt/layers/attention/dsa/dsa_indexer.py, CUDA) imports
`sglang.kernels.ops.attention.dsa.triton_kernel.act_quant` and calls `act_quant(x, block_size=128,
scale_fmt="ue8m0")` on q [T, 64, 128] and k [T, 128] (bf16): per 1 x 128 block, amax (floored at 1e-4)
-> scale = 2^ceil(log2(amax / 448)) -> q = clamp(x / scale, +-448) in float8_e4m3fn; returns (q, scale fp32
[..., D/128]).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic, rel_error
from dskbench.adapters.common.fp8 import FP8_DTYPE, per_token_group_quant
from dskbench.adapters.common.inputs import generator, nbytes, randn
from dskbench.shapes.cases import Case

DTYPE = torch.bfloat16
AMAX_FLOOR = 1e-4  # the kernel's tl.maximum(amax, 1e-4)
SCALE_FMT = "ue8m0"  # DeepSeek-V3.2's Indexer(scale_fmt="ue8m0")
DEQUANT_TOL = 1e-3  # same scales: q may differ by one e4m3 rounding at a tie


def _shape(case: Case) -> tuple[int, ...]:
    t, heads, d = int(case.dims["T"]), int(case.dims["heads"]), int(case.dims["D"])
    return (t, d) if heads == 1 else (t, heads, d)


def _bind_act_quant(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # act_quant(x, block_size=128, scale_fmt=None) -> (y float8_e4m3fn like x, s fp32 [..., N/block])
    x, block = inputs["x"], int(case.dims["block"])
    return lambda: fn(x, block, SCALE_FMT)


def dequantise(q: torch.Tensor, s: torch.Tensor, block: int) -> torch.Tensor:
    return (q.float().unflatten(-1, (s.shape[-1], block)) * s.float().unsqueeze(-1)).flatten(-2)


@register
class ActQuantAdapter(Adapter):
    kernel = "act_quant"
    role = "act_quant"
    ops = ("nsa_indexer.forward",)
    description = "FP8 1x128 block quantisation with power-of-two (ue8m0) scales of the V3.2 indexer q/k"
    backends = [
        Backend(
            "triton",
            "sglang.kernels.ops.attention.dsa.triton_kernel:act_quant",
            None,
            "triton",
            _bind_act_quant,
            note="DeepSeek-V3.2 only: the NSA indexer's q/k quantisation on CUDA",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return {"x": randn(_shape(case), generator(seed), device, DTYPE)}

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        x = inputs["x"]
        return per_token_group_quant(x.float(), int(case.dims["block"]), FP8_DTYPE, AMAX_FLOOR, ue8m0=True)

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        (q, s), (rq, rs) = out, ref
        if tuple(q.shape) != tuple(rq.shape) or tuple(s.shape) != tuple(rs.shape):
            return Check(False, float("inf"), 0.0, f"shapes q{tuple(q.shape)} s{tuple(s.shape)}")
        if q.dtype != FP8_DTYPE or s.dtype != torch.float32:
            return Check(False, float("inf"), 0.0, f"dtypes {q.dtype}, {s.dtype}")
        s_bad = int((s.float().cpu() != rs.float().cpu()).sum())
        block = int(case.dims["block"])
        deq, rdeq = dequantise(q, s, block), dequantise(rq, rs, block).to(q.device)
        err = rel_error(deq, rdeq)
        ok = s_bad == 0 and err <= DEQUANT_TOL
        return Check(ok, err, DEQUANT_TOL, f"scales:{s_bad} differ dequant:{err:.2e}/{DEQUANT_TOL:.0e}")

    def traffic(self, case: Case) -> Traffic:
        n = 1
        for d in _shape(case):
            n *= d
        block = int(case.dims["block"])
        return Traffic(
            bytes=nbytes(n, DTYPE) + nbytes(n, FP8_DTYPE) + nbytes(n // block, torch.float32),
            flops=2 * n,
            note="read x (bf16), write q (fp8) and one fp32 scale per 128 values",
        )
