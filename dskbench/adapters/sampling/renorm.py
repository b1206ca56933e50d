"""`top_k_renorm_prob` and `top_p_renorm_prob`: filter probs [B, V] and renormalise.

What SGLang 0.5.16 runs on sm90 with min_p (`srt/layers/sampler.py`, sampling_backend "flashinfer"):
`sgl_kernel.top_k_renorm_prob` -> `sgl_kernel.top_p_renorm_prob` (then min-p sampling). The two sgl_kernel
wrappers forward to `flashinfer.sampling.top_{k,p}_renorm_probs` (backends "sgl_kernel.wrapper",
labelled); the AOT ops `torch.ops.sgl_kernel.top_{k,p}_renorm_probs.default` are measured as "sgl_kernel".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Check, Traffic
from dskbench.adapters.common.inputs import SGLANG_SM90
from dskbench.adapters.sampling.filters import (
    FilterRef,
    SamplingAdapter,
    check_renorm,
    renorm,
    top_k_sets,
    top_p_sets,
)
from dskbench.shapes.cases import Case


class _RenormAdapter(SamplingAdapter):
    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return check_renorm(out, ref)

    def traffic(self, case: Case) -> Traffic:
        b, v = int(case.dims["B"]), int(case.dims["V"])
        return Traffic(bytes=8 * b * v + 4 * b, note="read probs once, write renormalised probs once")


def _bind_renorm_aot(fn: Any, inputs: dict[str, Any], case: Case, key: str) -> Callable[[], Any]:
    # AOT op (probs, renorm_probs, maybe_arr, scalar): per-request tensor, scalar unused.
    probs, arr = inputs["probs"], inputs[key]
    out = torch.empty_like(probs)
    unused = 0 if key == "top_k" else 0.0

    def launch() -> torch.Tensor:
        fn(probs, out, arr, unused)
        return out

    return launch


def _bind_renorm_call(fn: Any, inputs: dict[str, Any], case: Case, key: str) -> Callable[[], Any]:
    probs, arr = inputs["probs"], inputs[key]
    return lambda: fn(probs, arr)


def _renorm_backends(op: str, key: str) -> list[Backend]:
    def aot(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        return _bind_renorm_aot(fn, inputs, case, key)

    def call(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        return _bind_renorm_call(fn, inputs, case, key)

    return [
        Backend(
            "sgl_kernel", f"torch.ops.sgl_kernel.{op}.default", None, "aot", aot, preload=("sgl_kernel",)
        ),
        Backend(
            "sgl_kernel.wrapper",
            f"sgl_kernel.sampling:{op}",
            None,
            "jit",
            call,
            dispatches_to=f"flashinfer.sampling.{op}",
            label=SGLANG_SM90,
        ),
        Backend("flashinfer", f"flashinfer.sampling:{op}", None, "jit", call),
    ]


@register
class TopKRenormAdapter(_RenormAdapter):
    kernel = "top_k_renorm_prob"
    description = "keep the top-k probabilities per row and renormalise"
    backends = _renorm_backends("top_k_renorm_probs", "top_k")

    def reference(self, inputs: dict[str, Any], case: Case) -> FilterRef:
        p = inputs["probs"]
        nominal, must, may = top_k_sets(p, inputs["top_k"])
        return FilterRef(renorm(p, nominal), may, must, (p.double() * may).float())


@register
class TopPRenormAdapter(_RenormAdapter):
    kernel = "top_p_renorm_prob"
    description = "keep the smallest head of mass >= top_p per row and renormalise"
    backends = _renorm_backends("top_p_renorm_probs", "top_p")

    def reference(self, inputs: dict[str, Any], case: Case) -> FilterRef:
        p = inputs["probs"]
        nominal, must, may = top_p_sets(p, inputs["top_p"])
        return FilterRef(renorm(p, nominal), may, must, (p.double() * may).float())
