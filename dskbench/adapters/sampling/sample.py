"""`min_p_sampling_from_probs` and `top_k_top_p_sampling_from_probs`: one token per row.

What SGLang 0.5.16 runs on sm90 (`srt/layers/sampler.py`, sampling_backend "flashinfer", once per step):
without min_p, `flashinfer.sampling.top_k_top_p_sampling_from_probs(probs, top_ks, top_ps,
filter_apply_order="joint")`; with min_p, the two renorm kernels then
`flashinfer.sampling.min_p_sampling_from_probs` (both backends "flashinfer", labelled). min_p and
top-k/top-p sampling have no CUDA sgl-kernel export in 0.4.5 (MUSA only): flashinfer only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Check
from dskbench.adapters.common.inputs import SGLANG_SM90
from dskbench.adapters.sampling.filters import (
    FilterRef,
    SamplingAdapter,
    check_samples,
    min_p_sets,
    sample_kept,
    top_k_sets,
    top_p_sets,
)
from dskbench.shapes.cases import Case


def _bind_min_p(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # Explicit seed/offset: no host-side generator state access, so the call can be graph-captured.
    probs, min_p, seed = inputs["probs"], inputs["min_p"], inputs["seed"]
    return lambda: fn(probs, min_p, deterministic=True, seed=seed, offset=0)


@register
class MinPSamplingAdapter(SamplingAdapter):
    kernel = "min_p_sampling_from_probs"
    description = "sample one token per row among p >= min_p * max(p)"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.sampling:min_p_sampling_from_probs",
            None,
            "jit",
            _bind_min_p,
            label=SGLANG_SM90,
            note="fed raw softmax probs (SGLang feeds top-k/top-p renormalised ones)",
        ),
    ]

    def reference(self, inputs: dict[str, Any], case: Case) -> FilterRef:
        p = inputs["probs"]
        may = min_p_sets(p, inputs["min_p"])
        return FilterRef(sample_kept(p, may), may)

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return check_samples(out, ref)


def _bind_top_k_top_p(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    probs, k, p, seed = inputs["probs"], inputs["top_k"], inputs["top_p"], inputs["seed"]
    return lambda: fn(probs, k, p, filter_apply_order="joint", deterministic=True, seed=seed, offset=0)


@register
class TopKTopPSamplingAdapter(SamplingAdapter):
    kernel = "top_k_top_p_sampling_from_probs"
    description = "sample one token per row from the joint top-k and top-p set"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.sampling:top_k_top_p_sampling_from_probs",
            None,
            "jit",
            _bind_top_k_top_p,
            label=SGLANG_SM90,
            note='filter_apply_order="joint" with per-request top_k/top_p tensors, as SGLang calls it',
        ),
    ]

    def reference(self, inputs: dict[str, Any], case: Case) -> FilterRef:
        p = inputs["probs"]
        k_nom, _, k_may = top_k_sets(p, inputs["top_k"])
        p_nom, _, p_may = top_p_sets(p, inputs["top_p"])
        # joint: both filters on the original probs (top_k_first would give a subset of this)
        return FilterRef(sample_kept(p, k_nom & p_nom), k_may & p_may)

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return check_samples(out, ref)
