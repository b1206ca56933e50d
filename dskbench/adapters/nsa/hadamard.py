"""DeepSeek-V3.2 sparse-attention (NSA/DSA) indexer: `hadamard_transform`.

DeepSeek-R1 has no indexer; these kernels run at the `nsa_indexer.forward` op, which the shapes file
marks `models: [deepseek-v3.2]`.

`hadamard_transform` is the indexer's `rotate_activation` (sglang/srt/layers/attention/dsa/dsa_indexer.py):
x @ H(d) * d^-0.5 over the last dim, with H(d) the Sylvester-ordered Hadamard matrix (entries +-1,
H(2n) = [[H, H], [H, -H]]), on q [T, 64, 128] and k [T, 128] in bf16. sgl-kernel 0.4.5 no longer has it;
SGLang 0.5.16 imports `sglang.jit_kernel.hadamard.hadamard_transform(x, scale)` on CUDA (the vendored
fast-hadamard-transform, JIT-built). SGLang skips the rotation when its fused indexer path is on
(`use_dsa_indexer_fusion`: CUDA, an interleaved indexer RoPE, SGLANG_DISABLE_DSA_INDEXER_FUSION unset);
which path a checkpoint takes depends on its config, so the backend carries no "what SGLang runs" label.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import generator, nbytes, randn
from dskbench.shapes.cases import Case

DTYPE = torch.bfloat16


def _shape(case: Case) -> tuple[int, ...]:
    """q [T, heads, D]; k (heads 1) [T, D], as the indexer passes them."""
    t, heads, d = int(case.dims["T"]), int(case.dims["heads"]), int(case.dims["D"])
    return (t, d) if heads == 1 else (t, heads, d)


def hadamard_scale(d: int) -> float:
    """rotate_activation's scale: an orthonormal transform."""
    return d**-0.5


@lru_cache(maxsize=8)
def sylvester(d: int) -> torch.Tensor:
    """The d x d Hadamard matrix in Sylvester (natural) order, fp32 on the CPU; d a power of two."""
    if d < 1 or d & (d - 1):
        raise ValueError(f"Hadamard size {d} is not a power of two")
    h = torch.ones((1, 1))
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def _bind_hadamard(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # hadamard_transform(x, scale=1.0) -> new tensor shaped like x
    x = inputs["x"]
    scale = hadamard_scale(x.shape[-1])
    return lambda: fn(x, scale)


@register
class HadamardTransformAdapter(Adapter):
    kernel = "hadamard_transform"
    role = "hadamard"
    ops = ("nsa_indexer.forward",)
    description = "scaled Hadamard rotation of DeepSeek-V3.2's indexer q/k over the 128-wide head dim"
    backends = [
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.hadamard:hadamard_transform",
            None,
            "jit",
            _bind_hadamard,
            note="DeepSeek-V3.2 only: the NSA indexer's rotate_activation (not in sgl-kernel 0.4.5)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return {"x": randn(_shape(case), generator(seed), device, DTYPE)}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        x = inputs["x"]
        d = x.shape[-1]
        h = sylvester(d).to(x.device)
        return (x.float().reshape(-1, d) @ h * hadamard_scale(d)).reshape(x.shape)

    def traffic(self, case: Case) -> Traffic:
        n = 1
        for s in _shape(case):
            n *= s
        d = int(case.dims["D"])
        return Traffic(
            bytes=nbytes(2 * n, DTYPE),
            flops=n * (d.bit_length() - 1),
            note="read x, write y (bf16); FLOPs numel * log2(D) (the fast transform's butterflies)",
        )
