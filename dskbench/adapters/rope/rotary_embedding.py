"""`rotary_embedding`: the vLLM-style rope, SGLang's fallback for head sizes outside
{64, 128, 256, 512}. DeepSeek (rope head 64) never takes it; measured at the same shapes."""

from __future__ import annotations

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Traffic
from dskbench.adapters.common.inputs import nbytes
from dskbench.adapters.rope.rotation import DTYPE, InplaceRope, bind_positions_qk, rope_dims
from dskbench.shapes.cases import Case


@register
class RotaryEmbeddingAdapter(InplaceRope):
    kernel = "rotary_embedding"
    description = "vLLM-style rotary_embedding (SGLang's fallback; cos|sin cache in bf16)"
    cache_dtype = DTYPE  # SGLang casts the cache to the query dtype for the fallback kernel
    backends = [
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.rotary_embedding.default",
            None,
            "aot",
            bind_positions_qk,
            preload=("sgl_kernel",),
        ),
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.rope:rotary_embedding",
            None,
            "jit",
            bind_positions_qk,
            note="SGLang's CUDA fallback; DeepSeek (rope head 64) never takes it",
        ),
    ]

    def traffic(self, case: Case) -> Traffic:
        t, nh, dr, _ = rope_dims(case)
        return Traffic(
            bytes=nbytes(2 * t * (nh + 1) * dr + t * dr, DTYPE),
            flops=3 * t * (nh + 1) * dr,
            note="bf16 cache row per token; positions not counted",
        )
