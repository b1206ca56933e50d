"""`set_mla_kv_buffer_kernel`: the MLA KV-cache write of every layer, every decode and prefill step.

SGLang 0.5.16's MLA attention backends (flashinfer_mla, trtllm_mla, cutlass_mla, fa3) call
`MLATokenToKVPool.set_mla_kv_buffer(layer, loc, k_nope, k_rope)`, which writes each new token's
512-dim latent (`k_nope` [T, 1, Lkv]) and 64-dim rope key (`k_rope` [T, 1, Dr]), bf16, into row
`loc[t]` of that layer's cache `kv_buffer` [slots, 1, Lkv + Dr]. `set_mla_kv_buffer_triton`
(sglang/kernels/ops/kvcache/mla_buffer.py) launches the Triton kernel `set_mla_kv_buffer_kernel`
below 768 tokens (one program per token, BLOCK = next_pow2(576)), and the TMA JIT kernel
`sglang.jit_kernel.set_mla_kv_buffer` at 768 tokens and more on sm90+. Both are backends here.

In place: the launcher returns the whole cache, checked exactly (a copy must not change a bit) against
the reference's copy of it with the rows written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend, Requirement
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common.inputs import enable_pdl, exact_check, generator, nbytes, randn
from dskbench.shapes.cases import Case

DTYPE = torch.bfloat16
TMA_MIN_LOCS = 768  # set_mla_kv_buffer_triton's _TMA_BULK_STORE_MIN_LOCS
SM90_UP = Requirement(min_sm=90)  # is_arch_support_pdl(): the TMA path's condition


def mla_dims(case: Case) -> tuple[int, int, int, int]:
    d = case.dims
    return int(d["T"]), int(d["Lkv"]), int(d["Dr"]), int(d["pool"])


def mla_cache_rows(case: Case, device: str, gen: torch.Generator) -> dict[str, Any]:
    """The MLA KV cache (`pool` rows of Lkv + Dr bf16 values) and `loc`, T distinct rows of it: slot 0 is
    sglang's padding slot, and no two tokens share a row (no write race)."""
    t, lkv, dr, pool = mla_dims(case)
    slots = max(pool, t + 1)
    loc = (torch.randperm(slots - 1, generator=gen)[:t] + 1).to(torch.int64)
    return {"kv_buffer": randn((slots, 1, lkv + dr), gen, device, DTYPE), "loc": loc.to(device)}


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _bind_triton(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # set_mla_kv_buffer_triton's fallback launch, without DCP (rank 0 of 1)
    kv, loc, nope, rope = inputs["kv_buffer"], inputs["loc"], inputs["k_nope"], inputs["k_rope"]
    n, lkv, dr = nope.shape[0], nope.shape[-1], rope.shape[-1]
    pdl = {"USE_GDC": True, "launch_pdl": True} if enable_pdl(kv) else {}

    def launch() -> torch.Tensor:
        fn[(n, 1)](
            kv,
            nope,
            rope,
            loc,
            kv.stride(0),
            nope.stride(0),
            rope.stride(0),
            lkv,
            dr,
            BLOCK=_next_pow2(lkv + dr),
            DCP_RANK=0,
            DCP_WORLD_SIZE=1,
            **pdl,
        )
        return kv

    return launch


def _bind_jit(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # sglang.jit_kernel.set_mla_kv_buffer.set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope)
    kv, loc, nope, rope = inputs["kv_buffer"], inputs["loc"], inputs["k_nope"], inputs["k_rope"]

    def launch() -> torch.Tensor:
        fn(kv, loc, nope, rope)
        return kv

    return launch


def set_mla_kv_reference(
    kv_buffer: torch.Tensor, loc: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor
) -> torch.Tensor:
    """A copy of the cache with row loc[t] = [k_nope[t] | k_rope[t]]; every other row as it was."""
    out = kv_buffer.clone()
    rows = torch.cat([k_nope.reshape(k_nope.shape[0], -1), k_rope.reshape(k_rope.shape[0], -1)], dim=-1)
    out.view(out.shape[0], -1)[loc.long()] = rows.to(out.dtype)
    return out


@register
class SetMLAKVBufferAdapter(Adapter):
    kernel = "set_mla_kv_buffer_kernel"
    role = "kv_write"
    ops = ("set_mla_kv_buffer",)
    description = "MLA KV-cache write: each token's bf16 latent [512] + rope key [64] into its cache row"
    backends = [
        Backend(
            "triton",
            "sglang.kernels.ops.kvcache.mla_buffer:set_mla_kv_buffer_kernel",
            "sglang",
            "triton",
            _bind_triton,
            label="what SGLang 0.5.16 runs below 768 tokens",
            note="set_mla_kv_buffer_triton's Triton path: one program per token, BLOCK 1024",
        ),
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.set_mla_kv_buffer:set_mla_kv_buffer",
            "sglang",
            "jit",
            _bind_jit,
            requires=SM90_UP,
            label="what SGLang 0.5.16 runs at 768 tokens and more (sm90+)",
            note="the TMA bulk-store JIT kernel set_mla_kv_buffer_triton dispatches to",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, lkv, dr, pool = mla_dims(case)
        gen = generator(seed)
        return {
            **mla_cache_rows(case, device, gen),
            "k_nope": randn((t, 1, lkv), gen, device, DTYPE),
            "k_rope": randn((t, 1, dr), gen, device, DTYPE),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return set_mla_kv_reference(inputs["kv_buffer"], inputs["loc"], inputs["k_nope"], inputs["k_rope"])

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return exact_check((out.view(torch.int16),), (ref.view(torch.int16),), ("kv_buffer",))

    def traffic(self, case: Case) -> Traffic:
        t, lkv, dr, _ = mla_dims(case)
        return Traffic(
            bytes=2 * nbytes(t * (lkv + dr), DTYPE) + nbytes(t, torch.int64),
            flops=0,
            note="read k_nope, k_rope and loc; write T cache rows (the rest of the cache untouched)",
        )
