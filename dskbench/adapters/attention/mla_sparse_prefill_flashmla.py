"""sgl-kernel's FlashMLA sparse prefill (`sgl_kernel.flash_mla.flash_mla_sparse_fwd`), as DeepSeek-V3.2's dsa
backend runs an extend with `flashmla_sparse` (the Hopper default prefill with a bf16 KV cache).

T tokens of `reqs` equal requests (no cached prefix), absorbed MLA: q [T, Nh, 576] bf16, the latent cache
kv [rows, 1, 576] bf16 (the requests' tokens at scattered slots), indices [T, 1, topk] int32: each token's
min(position + 1, topk) indexer-chosen tokens of its own request, causal (random among positions <= its
own), -1 after them. q is zero-padded to a multiple of 64 heads, as SGLang pads it on Hopper (128 on
Blackwell); the output is trimmed back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.attention.mla import case_softmax_scale
from dskbench.adapters.attention.mla_decode_flashmla import (
    FLASHMLA_EXTENSION,
    SM90_OR_SM100,
    sparse_reference,
)
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import device_generator, generator, normal
from dskbench.shapes.cases import Case


def prefill_layout(case: Case) -> tuple[int, int, int]:
    """(tokens T, requests, tokens per request)."""
    t, reqs = int(case.dims["T"]), int(case.dims["reqs"])
    if t % reqs:
        raise ValueError(f"{t} tokens do not split into {reqs} equal requests")
    return t, reqs, t // reqs


PREFILL_KEYS = 1 << 26  # random keys drawn at once by prefill_indices (256 MiB of fp32)


def prefill_indices(slots: torch.Tensor, reqs: int, topk: int, gen: torch.Generator) -> torch.Tensor:
    """[T, 1, topk] int32: token i of a request keeps min(i + 1, topk) distinct slots among its request's
    tokens 0..i (its own always included), -1 after them. `slots` [T] are the tokens' cache rows.

    Built on `slots`' device without a loop over tokens: a request's first topk tokens keep all of
    0..i in order; a later token keeps itself, then the tokens of its topk - 1 largest random keys among
    its earlier ones (keys drawn for a chunk of token positions of every request at once)."""
    t, dev = slots.numel(), slots.device
    local = t // reqs
    own = slots.view(reqs, local).to(torch.int32)
    out = torch.full((reqs, local, topk), -1, dtype=torch.int32, device=dev)
    head = min(topk, local)
    col = torch.arange(head, device=dev)
    earlier = col.unsqueeze(0) <= col.unsqueeze(1)  # [i, j]: j <= i
    out[:, :head, :head] = torch.where(earlier, own[:, None, :head], -1)
    g = device_generator(gen, str(dev))
    step = max(1, PREFILL_KEYS // (reqs * local))
    for s in range(head, local, step):
        n = min(step, local - s)
        i = torch.arange(s, s + n, device=dev)
        keys = torch.rand((reqs, n, s + n), generator=g, device=dev)
        keys.masked_fill_(torch.arange(s + n, device=dev) >= i.unsqueeze(1), -1.0)  # only j < i
        pos = keys.topk(topk - 1, dim=-1).indices  # every one valid: i >= topk earlier tokens
        out[:, s : s + n, 0] = own[:, s : s + n]
        out[:, s : s + n, 1:] = own.gather(1, pos.flatten(1)).view(reqs, n, topk - 1)
    return out.view(t, 1, topk)


def padded_heads_prefill(nh: int, multiple: int = 64) -> int:
    return -(-nh // multiple) * multiple


def _bind_sparse_prefill(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    q = inputs["q"]
    t, nh, dqk = q.shape
    heads = padded_heads_prefill(nh, 128 if torch.cuda.get_device_capability(q.device)[0] >= 10 else 64)
    if heads != nh:
        qp = q.new_zeros(t, heads, dqk)
        qp[:, :nh] = q
    else:
        qp = q
    kv = inputs["kv"].unsqueeze(1)  # [rows, 1, 576]
    kw = {"sm_scale": case_softmax_scale(case), "d_v": int(case.dims["Lkv"])}

    def launch() -> torch.Tensor:
        out, _, _ = fn(q=qp, kv=kv, indices=inputs["indices"], **kw)
        return out[:, :nh]

    return launch


@register
class FlashMlaSparseFwd(Adapter):
    kernel = "flash_mla_sparse_fwd"
    role = "mla_prefill"
    ops = ("nsa_backend.forward_extend",)
    description = (
        "FlashMLA sparse prefill (sgl_kernel.flash_mla), bf16, index_topk tokens per query (DeepSeek-V3.2)"
    )
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.flash_mla:flash_mla_sparse_fwd",
            None,
            "aot",
            _bind_sparse_prefill,
            requires=SM90_OR_SM100,
            preload=(FLASHMLA_EXTENSION,),
            label="bf16 q/KV, indices [T, 1, topk], q padded to 64 heads (sm90) / 128 (sm100)",
        )
    ]

    def cpu_skip_reason(self, case: Case) -> str | None:
        t = int(case.dims["T"])
        return None if t <= 256 else f"{t} tokens x {case.dims['topk']} gathered rows: too slow for a CPU"

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        d = case.dims
        t, reqs, _ = prefill_layout(case)
        nh, dqk, topk = int(d["Nh"]), int(d["Lkv"]) + int(d["Dr"]), int(d["topk"])
        gen = generator(seed)
        rows = 2 * t  # the cache holds other requests' tokens too: the extend's tokens sit at scattered slots
        slots = torch.randperm(rows, generator=gen)[:t]
        return {
            "q": normal((t, nh, dqk), gen, device),
            "kv": normal((rows, dqk), gen, device),
            "indices": prefill_indices(slots.to(device), reqs, topk, gen),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        kv = inputs["kv"]
        return sparse_reference(
            inputs["q"],
            lambda idx: kv[idx].float(),
            inputs["indices"][:, 0],
            case_softmax_scale(case),
            int(case.dims["Lkv"]),
        )

    def traffic(self, case: Case) -> Traffic:
        d = case.dims
        t, _, local = prefill_layout(case)
        nh, lkv, dr, topk = int(d["Nh"]), int(d["Lkv"]), int(d["Dr"]), int(d["topk"])
        dqk = lkv + dr
        kept = sum(min(i + 1, topk) for i in range(local)) * (t // local)  # attended (query, token) pairs
        # The queries of a request gather overlapping rows of its own T/reqs tokens: HBM serves each row
        # once and L2 the repeats, so the compulsory traffic is every token's row once, not once per
        # attending query (that count read 104% of an H200's bandwidth at T=2048).
        byts = t * dqk * 2 + t * topk * 4 + t * nh * (dqk + lkv) * 2
        flops = 2 * nh * kept * (dqk + lkv)
        return Traffic(byts, flops, "the request's KV rows once + the int32 index rows + q + out")
