"""`apply_rope_with_cos_sin_cache_inplace`: DeepSeek's rope on q_pe / k_pe in place.

What SGLang 0.5.16 runs for DeepSeek-R1-NVFP4 on sm90: `RotaryEmbedding.forward_cuda`
(`srt/layers/rotary_embedding/base.py`, inherited by `DeepseekScalingRotaryEmbedding`) calls
`sglang.jit_kernel.rope.apply_rope_with_cos_sin_cache_inplace(q, k, cos_sin_cache, positions,
is_neox=False)` on q_pe [T, Nh, 64] and k_pe [T, 1, 64] (backend "sglang_jit", labelled). The kernel
moved there from sgl_kernel (gone in 0.4.5) with a new argument order; flashinfer keeps the old
(positions, query, key, head_size, cache, is_neox) order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.common.inputs import SGLANG_SM90
from dskbench.adapters.rope.rotation import InplaceRope, bind_positions_qk
from dskbench.shapes.cases import Case


def _bind_rope_jit(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    q, k, cache, pos = inputs["q_pe"], inputs["k_pe"], inputs["cos_sin_cache"], inputs["positions"]
    if getattr(fn, "__module__", "").startswith("sgl_kernel"):
        # Old home (sgl-kernel <= 0.3.x): (positions, query, key, head_size, cache, is_neox, ...).
        head = q.shape[-1]

        def launch_old() -> tuple[torch.Tensor, torch.Tensor]:
            fn(pos, q, k, head, cache, False)
            return q, k

        return launch_old

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn(q, k, cache, pos, is_neox=False)
        return q, k

    return launch


@register
class ApplyRopeAdapter(InplaceRope):
    kernel = "apply_rope_with_cos_sin_cache_inplace"
    description = "DeepSeek rope (interleaved, dim 64) on q_pe/k_pe in place, fp32 cos|sin cache"
    backends = [
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.rope:apply_rope_with_cos_sin_cache_inplace",
            None,
            "jit",
            _bind_rope_jit,
            fallbacks=("sgl_kernel.elementwise:apply_rope_with_cos_sin_cache_inplace",),
            label=SGLANG_SM90,
        ),
        Backend(
            "flashinfer",
            "flashinfer.rope:apply_rope_with_cos_sin_cache_inplace",
            None,
            "jit",
            bind_positions_qk,
        ),
    ]
