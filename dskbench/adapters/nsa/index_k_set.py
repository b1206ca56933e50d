"""`_set_k_and_s_triton_kernel`: DeepSeek-V3.2's indexer keys and scales into the index K cache, every layer
of every step.

SGLang 0.5.16's DSA indexer stores each new token's FP8 key (`index_k` [T, 128] float8_e4m3fn) and its
fp32 scale (`index_k_scale` [T, 1]) with `DSATokenToKVPool.set_index_k_scale_buffer` ->
`index_buf_accessor.SetKAndS` (sglang/kernels/ops/attention/dsa/index_buf_accessor.py), which launches
`_set_k_and_s_triton_kernel[(T,)](buf.view(fp8), buf.view(fp32), loc, index_k, index_k_scale, 128,
PAGE_SIZE=64, BUF_NUMEL_PER_PAGE=64 * 132, NUM_K_ELEMS_PER_TOKEN=128, S_OFFSET_NBYTES_IN_PAGE=64 * 128)`.
The cache `buf` is uint8 [pages, 64 * (128 + 4)]: a page holds its 64 tokens' 128-byte keys, then their
64 fp32 scales. Token t goes to page loc[t] // 64, slot loc[t] % 64.

In place: the launcher returns the whole cache, checked exactly against the reference's copy of it with
those bytes written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common.inputs import exact_check, generator, nbytes, randint, randn
from dskbench.shapes.cases import Case

FP8 = torch.float8_e4m3fn
SCALE_BYTES = 4  # one fp32 scale per token


def index_dims(case: Case) -> tuple[int, int, int, int]:
    """(tokens, key bytes per token, page size, cache pages)."""
    d = case.dims
    t, dim, page = int(d["T"]), int(d["D"]), int(d["page"])
    return t, dim, page, max(int(d["pool"]) // page, 2 * t // page + 2)


def set_k_and_s_reference(
    buf: torch.Tensor, loc: torch.Tensor, index_k: torch.Tensor, index_k_scale: torch.Tensor, page: int
) -> torch.Tensor:
    """A copy of the cache with token t's key bytes at [page, slot * D:] and its scale's 4 bytes at
    [page, page_size * D + slot * 4:], (page, slot) = divmod(loc[t], page_size)."""
    out = buf.clone()
    t, dim = index_k.shape
    loc = loc.long()
    pages, slots = (loc // page).unsqueeze(1), (loc % page).unsqueeze(1)
    k_cols = slots * dim + torch.arange(dim, device=buf.device)
    s_cols = page * dim + slots * SCALE_BYTES + torch.arange(SCALE_BYTES, device=buf.device)
    out[pages, k_cols] = index_k.view(torch.uint8)
    out[pages, s_cols] = index_k_scale.reshape(t, 1).contiguous().view(torch.uint8)
    return out


def _bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # SetKAndS.triton's launch
    buf, loc, k, s = inputs["buf"], inputs["loc"], inputs["index_k"], inputs["index_k_scale"]
    t, dim, page, _ = index_dims(case)
    buf_fp8, buf_fp32 = buf.view(FP8), buf.view(torch.float32)

    def launch() -> torch.Tensor:
        fn[(t,)](
            buf_fp8,
            buf_fp32,
            loc,
            k,
            s,
            k.stride(0),
            PAGE_SIZE=page,
            BUF_NUMEL_PER_PAGE=buf.shape[1],
            NUM_K_ELEMS_PER_TOKEN=dim,
            S_OFFSET_NBYTES_IN_PAGE=page * dim,
        )
        return buf

    return launch


@register
class SetKAndSAdapter(Adapter):
    kernel = "_set_k_and_s_triton_kernel"
    role = "kv_write"
    ops = ("nsa_indexer.forward",)
    description = "DSA indexer: each token's FP8 key [128] and fp32 scale into the paged index K cache"
    backends = [
        Backend(
            "triton",
            "sglang.kernels.ops.attention.dsa.index_buf_accessor:_set_k_and_s_triton_kernel",
            "sglang",
            "triton",
            _bind,
            label="what SGLang 0.5.16 runs on NVIDIA GPUs",
            note="SetKAndS.triton's launch: one program per token, pages of 64",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, dim, page, pages = index_dims(case)
        gen = generator(seed)
        loc = torch.randperm(pages * page - page, generator=gen)[:t] + page  # page 0 holds the padding slot
        buf = randint(0, 256, (pages, page * (dim + SCALE_BYTES)), gen, device, torch.uint8)
        k = randn((t, dim), gen, "cpu", FP8)
        scale = torch.rand((t, 1), generator=gen, dtype=torch.float32) + 0.01
        return {
            "buf": buf,
            "loc": loc.to(device),
            "index_k": k.to(device),
            "index_k_scale": scale.to(device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        page = int(case.dims["page"])
        return set_k_and_s_reference(
            inputs["buf"], inputs["loc"], inputs["index_k"], inputs["index_k_scale"], page
        )

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return exact_check((out,), (ref,), ("index_k_cache",))

    def traffic(self, case: Case) -> Traffic:
        t, dim, _, _ = index_dims(case)
        return Traffic(
            bytes=2 * t * (dim + SCALE_BYTES) + nbytes(t, torch.int64),
            flops=0,
            note="read index_k, index_k_scale and loc; write T keys and scales into the cache",
        )
