"""`layernorm` (flashinfer.norm.layernorm), DeepSeek-V3.2's: the NSA indexer's `k_norm` is LayerNorm(128)
with fp32 gamma/beta over the bf16 key [T, 128].

SGLang's `LayerNorm.forward_cuda` calls flashinfer for bf16 input with fp32 parameters
(`flashinfer.norm.layernorm(input, gemma, beta, eps)`, a CuTe-DSL kernel unless FLASHINFER_USE_CUDA_NORM=1).
DeepSeek-R1 has no LayerNorm.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import SGLANG_SM90, generator, nbytes, randn
from dskbench.shapes.cases import Case

DTYPE = torch.bfloat16
LAYERNORM_EPS = 1e-6  # sglang.srt.layers.layernorm.LayerNorm's default, which the indexer keeps


def _bind_layernorm(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # flashinfer.norm.layernorm(input bf16, gemma fp32, beta fp32, eps) -> new bf16 output
    x, g, b = inputs["x"], inputs["gamma"], inputs["beta"]
    return lambda: fn(x, g, b, LAYERNORM_EPS)


@register
class LayerNormAdapter(Adapter):
    kernel = "layernorm"
    role = "norm"
    ops = ("nsa_indexer.forward",)
    description = "LayerNorm of DeepSeek-V3.2's indexer key [T, 128] (bf16 in/out, fp32 gamma and beta)"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.norm:layernorm",
            None,
            "cutedsl",
            _bind_layernorm,
            label=SGLANG_SM90,
            note="DeepSeek-V3.2 only: the NSA indexer's k_norm (LayerNorm.forward_cuda)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, d = int(case.dims["T"]), int(case.dims["D"])
        gen = generator(seed)
        # A projected key has a per-row offset LayerNorm removes: a mean error shows in the check.
        x = randn((t, d), gen, device, torch.float32) + randn((t, 1), gen, device, torch.float32, 2.0)
        return {
            "x": x.to(DTYPE),
            "gamma": (1.0 + 0.2 * torch.randn(d, generator=gen)).to(device),
            "beta": (0.1 * torch.randn(d, generator=gen)).to(device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        # LayerNorm.forward_native: fp32 F.layer_norm with the fp32 parameters
        x = inputs["x"].float()
        return torch.nn.functional.layer_norm(
            x, (x.shape[-1],), inputs["gamma"].float(), inputs["beta"].float(), LAYERNORM_EPS
        )

    def traffic(self, case: Case) -> Traffic:
        t, d = int(case.dims["T"]), int(case.dims["D"])
        return Traffic(
            bytes=nbytes(2 * t * d, DTYPE) + nbytes(2 * d, torch.float32),
            flops=7 * t * d,
            note="read x, write y (bf16); read fp32 gamma, beta. FLOPs nominal: mean, variance, affine",
        )
