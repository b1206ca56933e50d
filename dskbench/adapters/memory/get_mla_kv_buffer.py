"""`get_mla_kv_buffer_kernel`: the MLA KV cache read back, for DeepSeek's MHA prefill over a cached prefix.

SGLang 0.5.16's DeepSeek MHA prefill over a cached prefix (forward_mha._get_mla_kv_buffer) calls
`MLATokenToKVPool.get_mla_kv_buffer(layer, loc)`, which allocates `cache_k_nope` [T, 1, Lkv] and
`cache_k_rope` [T, 1, Dr] (bf16, the cache's dtype) and launches, through `get_mla_kv_buffer_triton`
(sglang/kernels/ops/kvcache/mla_buffer.py), `get_mla_kv_buffer_kernel[(T,)](kv_buffer, cache_k_nope,
cache_k_rope, loc, strides, Lkv, Dr)`: token t's cache row `kv_buffer[loc[t]]` [1, Lkv + Dr] split into its
512-dim latent and 64-dim rope key. The reference indexes the same rows with torch; outputs are compared
exactly (a copy must not change a bit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common.inputs import exact_check, generator, nbytes
from dskbench.adapters.memory.set_mla_kv_buffer import DTYPE, mla_cache_rows, mla_dims
from dskbench.shapes.cases import Case


def get_mla_kv_reference(
    kv_buffer: torch.Tensor, loc: torch.Tensor, lkv: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_nope [T, 1, Lkv], k_rope [T, 1, Dr]): cache row loc[t] split after its first Lkv values."""
    rows = kv_buffer[loc.long()]  # [T, 1, Lkv + Dr]
    return rows[..., :lkv].contiguous(), rows[..., lkv:].contiguous()


def _bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # get_mla_kv_buffer's outputs and get_mla_kv_buffer_triton's launch
    kv, loc = inputs["kv_buffer"], inputs["loc"]
    t, lkv, dr, _ = mla_dims(case)
    nope = torch.empty((t, 1, lkv), dtype=kv.dtype, device=kv.device)
    rope = torch.empty((t, 1, dr), dtype=kv.dtype, device=kv.device)

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn[(t,)](kv, nope, rope, loc, kv.stride(0), nope.stride(0), rope.stride(0), lkv, dr)
        return nope, rope

    return launch


@register
class GetMLAKVBufferAdapter(Adapter):
    kernel = "get_mla_kv_buffer_kernel"
    role = "kv_read"
    ops = ("get_mla_kv_buffer",)
    description = "MLA KV-cache read: each cached token's bf16 latent [512] + rope key [64] out of its row"
    backends = [
        Backend(
            "triton",
            "sglang.kernels.ops.kvcache.mla_buffer:get_mla_kv_buffer_kernel",
            "sglang",
            "triton",
            _bind,
            label="what SGLang 0.5.16 runs for an MHA prefill over a cached prefix",
            note="get_mla_kv_buffer_triton's launch: one program per token",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return mla_cache_rows(case, device, generator(seed))

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        return get_mla_kv_reference(inputs["kv_buffer"], inputs["loc"], int(case.dims["Lkv"]))

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return exact_check(
            tuple(o.view(torch.int16) for o in out),
            tuple(r.view(torch.int16) for r in ref),
            ("k_nope", "k_rope"),
        )

    def traffic(self, case: Case) -> Traffic:
        t, lkv, dr, _ = mla_dims(case)
        return Traffic(
            bytes=2 * nbytes(t * (lkv + dr), DTYPE) + nbytes(t, torch.int64),
            flops=0,
            note="read loc and T cache rows; write k_nope and k_rope",
        )
