"""Merges of two partial attention states: FlashInfer's `merge_state` (base-2 LSE) and sgl-kernel's
`merge_state_v2` with its Triton twin (natural-log LSE), at the chunked-prefix MHA prefill shapes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import generator, randn, uniform
from dskbench.shapes.cases import Case


def merge_state_reference(
    v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor, base2: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention states in fp32; LSEs in base 2 (FlashInfer) or natural log (sgl/Triton)."""
    sa, sb = s_a.float(), s_b.float()
    m = torch.maximum(sa, sb)
    if base2:
        wa, wb = torch.exp2(sa - m), torch.exp2(sb - m)
        s = m + torch.log2(wa + wb)
    else:
        wa, wb = torch.exp(sa - m), torch.exp(sb - m)
        s = m + torch.log(wa + wb)
    v = (v_a.float() * wa.unsqueeze(-1) + v_b.float() * wb.unsqueeze(-1)) / (wa + wb).unsqueeze(-1)
    return v, s


def flashinfer_merge_state_max_heads(head_dim: int, element_size: int) -> int:
    """Heads FlashInfer's MergeState launches in one block before exceeding 1024 threads (SGLang's guard)."""
    vec = max(16 // element_size, head_dim // 32)
    bdx = head_dim // vec
    return 1024 // bdx if bdx > 0 else 1024


class _MergeState(Adapter):
    role = "merge_state"
    ops = ("attn_mha", "_chunked_prefix_attn_mha")
    base2 = False

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        d = case.dims
        t, nh, hd = int(d["T"]), int(d["Nh"]), int(d["D"])
        gen = generator(seed)

        def lse() -> torch.Tensor:  # log-sum-exp of a chunk's logits: a few units, spread across rows
            return uniform((t, nh), gen, device, 4.0, 10.0)

        return {
            "v_a": randn((t, nh, hd), gen, device),
            "s_a": lse(),
            "v_b": randn((t, nh, hd), gen, device),
            "s_b": lse(),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        return merge_state_reference(inputs["v_a"], inputs["s_a"], inputs["v_b"], inputs["s_b"], self.base2)

    def traffic(self, case: Case) -> Traffic:
        d = case.dims
        t, nh, hd = int(d["T"]), int(d["Nh"]), int(d["D"])
        return Traffic(3 * t * nh * hd * 2 + 3 * t * nh * 4, t * nh * (3 * hd + 10))


def _bind_merge_out_of_place(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    args = (inputs["v_a"], inputs["s_a"], inputs["v_b"], inputs["s_b"])
    return lambda: fn(*args)


def _bind_merge_into(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    args = (inputs["v_a"], inputs["s_a"], inputs["v_b"], inputs["s_b"])
    v, s = torch.empty_like(inputs["v_a"]), torch.empty_like(inputs["s_a"])

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn(*args, v, s)
        return v, s

    return launch


def _flashinfer_merge_state_skip(case: Case) -> str | None:
    nh, hd = int(case.dims["Nh"]), int(case.dims["D"])
    cap = flashinfer_merge_state_max_heads(hd, 2)
    if nh > cap:
        return (
            f"FlashInfer MergeState puts all {nh} heads in one block (> 1024 threads above {cap} heads); "
            "SGLang falls back to merge_state_triton there (benchmarked under merge_state_v2)"
        )
    return None


@register
class MergeState(_MergeState):
    kernel = "merge_state"
    description = "FlashInfer cascade merge of two attention states (base-2 LSE)"
    base2 = True
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.cascade:merge_state",
            None,
            "jit",
            _bind_merge_out_of_place,
            fallbacks=("flashinfer:merge_state",),
            label="base-2 LSE; sgl-kernel 0.4.5 dropped its merge_state",
            skip=_flashinfer_merge_state_skip,
        )
    ]


@register
class MergeStateV2(_MergeState):
    kernel = "merge_state_v2"
    description = "sgl-kernel merge of two attention states (natural-log LSE), and its Triton twin"
    backends = [
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.merge_state_v2.default",
            None,
            "aot",
            _bind_merge_into,
            preload=("sgl_kernel",),
        ),
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.attention.merge_state:merge_state_triton",
            None,
            "triton",
            _bind_merge_into,
            label="SGLang's fallback (fp8, odd head dims; FlashInfer backend above 64 heads)",
        ),
    ]
