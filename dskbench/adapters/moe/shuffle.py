"""The CUTLASS MoE gather and combine: shuffle_rows puts FP8 token rows in expert order;
apply_shuffle_mul_sum sums each token's K expert rows times its routing weights."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common import fp8
from dskbench.adapters.common.inputs import exact_check, generator, normal, randn
from dskbench.adapters.common.routing import sorted_by_expert
from dskbench.adapters.moe.cutlass_prepare import prepare_reference
from dskbench.adapters.moe.inputs import BF16, GROUP, routing, topk
from dskbench.adapters.moe.reference import torch_op
from dskbench.shapes.cases import Case


def _bind_shuffle_rows(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x, dst2src = inputs["x"], inputs["dst2src_map"]
    out = torch.empty(dst2src.numel(), x.shape[1], dtype=x.dtype, device=x.device)

    def launch() -> torch.Tensor:
        fn(x, dst2src, out)
        return out

    return launch


@register
class ShuffleRows(Adapter):
    kernel = "shuffle_rows"
    role = "moe"
    ops = ("experts",)
    description = "Gather FP8 token rows into expert order ([T, 7168] -> [T*K, 7168]) for the CUTLASS MoE"
    backends = [
        Backend(
            "sgl_kernel", torch_op("shuffle_rows"), None, "aot", _bind_shuffle_rows, preload=("sgl_kernel",)
        )
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        d = case.dims
        order, _ = sorted_by_expert(routing(case, device, seed).topk_ids, int(d["E"]))
        x, _s = fp8.per_token_group_quant(randn((int(d["T"]), int(d["H"])), generator(seed), device), GROUP)
        return {"x": x, "dst2src_map": (order // topk(case)).to(torch.int32).to(device)}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return inputs["x"][inputs["dst2src_map"].long()]

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return exact_check((out.view(torch.uint8),), (ref.view(torch.uint8),), ("rows",))

    def traffic(self, case: Case) -> Traffic:
        t, h, k = int(case.dims["T"]), int(case.dims["H"]), topk(case)
        return Traffic(t * h + t * k * h + 4 * t * k, 0, "fp8 rows; each source row counted once")


def _bind_shuffle_mul_sum(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    c2, perm, factors = inputs["c2"], inputs["permutation"], inputs["factors"]
    out = torch.empty(factors.shape[0], c2.shape[1], dtype=c2.dtype, device=c2.device)

    def launch() -> torch.Tensor:
        fn(c2, out, perm, factors)
        return out

    return launch


@register
class ApplyShuffleMulSum(Adapter):
    kernel = "apply_shuffle_mul_sum"
    role = "moe"
    ops = ("experts",)
    description = "CUTLASS MoE combine: out[t] = sum_j c2[perm[t*K+j]] * w[t, j] (bf16 accumulate)"
    backends = [
        Backend(
            "sgl_kernel",
            torch_op("apply_shuffle_mul_sum"),
            None,
            "aot",
            _bind_shuffle_mul_sum,
            preload=("sgl_kernel",),
        )
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        d = case.dims
        t, k = int(d["T"]), topk(case)
        route = routing(case, "cpu", seed)  # the permutation is built on the host: no round trip
        out_perm = prepare_reference(route.topk_ids, int(d["E"]), int(d["I"]), int(d["H"]))[4]
        return {
            "c2": normal((t * k, int(d["H"])), generator(seed), device),
            "permutation": out_perm.to(device),
            "factors": route.topk_weights.to(device, BF16),  # the caller casts to the output dtype
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        k = topk(case)
        rows = inputs["c2"].float()[inputs["permutation"].long()]  # [T*K, H], token-major
        return (rows.view(-1, k, rows.shape[1]) * inputs["factors"].float().unsqueeze(-1)).sum(dim=1)

    def traffic(self, case: Case) -> Traffic:
        t, h, k = int(case.dims["T"]), int(case.dims["H"]), topk(case)
        return Traffic(2 * t * k * h + 2 * t * h + 4 * t * k + 2 * t * k, 2 * t * k * h)
