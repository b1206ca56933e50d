"""MoE routing (top-k gating) kernels (catalogue §6) at the `topk` op: [T, 256] router logits -> top-8.

DeepSeek-V3/R1 routes with sigmoid scores + e_score_correction_bias, 8 groups of 32 experts, the best
4 groups by the sum of their top-2 biased scores, then the top 8 experts of those groups; weights are
the *unbiased* sigmoid scores of the chosen experts, renormalised and (NVFP4 MoE:
``should_fuse_routed_scaling_factor_in_topk``) multiplied by routed_scaling_factor 2.5.
topk_softmax / topk_sigmoid are the flat gates of other MoE models, measured at the same shapes.
Router logits and bias come from dskbench.adapters.common.routing, the generator the MoE adapters route with.

Checks tolerate ties: an expert set passes when its selection scores, sorted, match the reference's
(so swapping two equal-scored experts is not a failure); weights are compared as sorted vectors.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend, Requirement
from dskbench.adapters.base import TOLERANCES, Adapter, Check, Traffic, rel_error
from dskbench.adapters.common.routing import deepseek_routing
from dskbench.shapes.cases import Case, default_shapes

TOPK_OPS = ("topk",)
SELECT_RTOL = 1e-5  # fp32 kernels vs the float64 reference, on selection scores
SELECT_ATOL = 1e-6
FLASHINFER_DSV3_ROUTING = Requirement(sm=(89, 90, 100, 103, 120, 121))  # fused_routing_dsv3 cc list


def routed_scaling_factor() -> float:
    return float(default_shapes().config["routed_scaling_factor"])


def _router_inputs(case: Case, device: str, seed: int) -> dict[str, Any]:
    """fp32 logits [T, E] and e_score_correction_bias [E] with uneven expert popularity — the same
    generator (dskbench.adapters.common.routing) the MoE adapters route with, so both see one routing."""
    d = case.dims
    r = deepseek_routing(
        int(d["T"]),
        int(d["E"]),
        int(d["K"]),
        int(d["n_group"]),
        int(d["topk_group"]),
        seed=seed,
        device=device,
    )
    return {"gating_output": r.logits, "correction_bias": r.bias}


# -- reference math, in float64 ------------------------------------------------------------------------


def grouped_choice_scores(
    logits: torch.Tensor, bias: torch.Tensor, n_group: int, topk_group: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sglang biased_grouped_topk_impl up to the expert choice, in float64.

    Returns (sigmoid scores, biased scores, biased scores with the experts of unchosen groups at -inf).
    """
    scores = logits.double().sigmoid()
    biased = scores + bias.double().unsqueeze(0)
    t, e = biased.shape
    group_scores = biased.view(t, n_group, -1).topk(2, dim=-1).values.sum(dim=-1)  # [T, n_group]
    group_idx = group_scores.topk(topk_group, dim=-1, sorted=False).indices
    group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_idx, True)
    expert_mask = group_mask.unsqueeze(-1).expand(t, n_group, e // n_group).reshape(t, e)
    return scores, biased, biased.masked_fill(~expert_mask, float("-inf"))


def biased_grouped_topk_ref(
    logits: torch.Tensor,
    bias: torch.Tensor,
    topk: int,
    n_group: int,
    topk_group: int,
    renormalize: bool = True,
    scaling: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's grouped top-k (sglang biased_grouped_topk_impl, no fused shared expert).

    Returns (weights fp32 [T, topk], ids int32 [T, topk]); weights * `scaling` when renormalised
    (apply_routed_scaling_factor_on_output).
    """
    scores, _, masked = grouped_choice_scores(logits, bias, n_group, topk_group)
    return _select(scores, masked, topk, renormalize, scaling)


def _select(
    scores: torch.Tensor, choice: torch.Tensor, topk: int, renormalize: bool, scaling: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """ids = top-k of `choice`; weights = `scores` at ids, optionally renormalised and scaled."""
    ids = choice.topk(topk, dim=-1).indices
    w = scores.gather(1, ids)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True) * scaling
    return w.float(), ids.to(torch.int32)


def _valid_grouped_choice(choice: torch.Tensor, ids: torch.Tensor, n_group: int, topk_group: int) -> bool:
    """Whether one row's ids are a grouped top-k that fp32 arithmetic may have chosen: the top-k experts
    of some set of topk_group groups that all score (sum of their top-2) within SELECT_RTOL/ATOL of the
    topk_group-th best group. Why: when two groups nearly tie, a kernel's fp32 group sums can rank them
    the other way round than the float64 reference, and every expert of the swapped group differs (seen
    with FlashInfer's fused_topk_deepseek on a row or two of the largest batches)."""
    from itertools import combinations

    e, k = choice.numel(), ids.numel()
    if len(set(ids.tolist())) != k or int(ids.min()) < 0 or int(ids.max()) >= e:
        return False
    per_group = choice.view(n_group, e // n_group)
    gscore = per_group.topk(2, dim=-1).values.sum(dim=-1)
    kth = gscore.sort(descending=True).values[topk_group - 1]
    slack = SELECT_RTOL * abs(float(kth)) + SELECT_ATOL
    sure = [g for g in range(n_group) if gscore[g] > kth + slack]  # in every valid choice
    near = [g for g in range(n_group) if abs(float(gscore[g] - kth)) <= slack]
    got = choice[ids].sort().values
    for extra in combinations(near, topk_group - len(sure)):
        allowed = torch.zeros(n_group, dtype=torch.bool)
        allowed[list(sure) + list(extra)] = True
        if not allowed[ids // (e // n_group)].all():
            continue
        masked = choice.masked_fill(~allowed.repeat_interleave(e // n_group), float("-inf"))
        want = masked.topk(k).values.sort().values
        if torch.isclose(got, want, rtol=SELECT_RTOL, atol=SELECT_ATOL).all():
            return True
    return False


def check_topk(
    out: Any, ref: Any, choice: torch.Tensor, tolerance: float, max_groups: tuple[int, int] | None = None
) -> Check:
    """Compare a kernel's (weights, ids) with the reference's, allowing ties.

    `choice` [T, E] float64 holds the scores the selection maximises (unmasked). A row passes when its ids
    are distinct, in range, and their sorted choice scores equal the reference's; with `max_groups`
    = (n_group, topk_group), its experts must also come from at most topk_group groups.
    """
    w, ids = out[0], out[1]
    wr, idr = ref[0], ref[1]
    if tuple(ids.shape) != tuple(idr.shape) or tuple(w.shape) != tuple(wr.shape):
        return Check(False, float("inf"), tolerance, f"shape {tuple(ids.shape)} vs {tuple(idr.shape)}")
    ids = ids.detach().to("cpu", torch.int64)
    idr = idr.detach().to("cpu", torch.int64)
    choice = choice.detach().to("cpu", torch.float64)
    t, e = choice.shape
    if ids.numel() and (ids.min() < 0 or ids.max() >= e):
        return Check(False, float("inf"), tolerance, "expert id out of range")
    srt = ids.sort(dim=-1).values
    bad = (srt[:, 1:] == srt[:, :-1]).any(dim=-1)
    got = choice.gather(1, ids).sort(dim=-1).values
    want = choice.gather(1, idr).sort(dim=-1).values
    bad |= ~torch.isclose(got, want, rtol=SELECT_RTOL, atol=SELECT_ATOL).all(dim=-1)
    group_ties: list[int] = []
    if max_groups is not None:
        n_group, topk_group = max_groups
        groups = torch.zeros(t, n_group, dtype=torch.bool).scatter_(1, ids // (e // n_group), True)
        bad |= groups.sum(dim=-1) > topk_group
        for row in bad.nonzero().flatten().tolist():  # a near-tie between groups is not an error
            if _valid_grouped_choice(choice[row], ids[row], n_group, topk_group):
                bad[row] = False
                group_ties.append(row)
    n_bad = int(bad.sum())
    same = torch.ones(t, dtype=torch.bool)
    same[group_ties] = False  # other experts, so other weights: compared where the choice is the same
    w_err = rel_error(
        w.float()[same.to(w.device)].sort(dim=-1).values, wr.float()[same.to(wr.device)].sort(dim=-1).values
    )
    ok = n_bad == 0 and w_err <= tolerance
    detail = f"ids: {n_bad}/{t} rows differ; weights {w_err:.2e}/{tolerance:.0e}"
    if group_ties:
        detail += f"; {len(group_ties)} rows chose another of two near-tied expert groups"
    return Check(ok, w_err if n_bad == 0 else float("inf"), tolerance, detail)


def _routing_traffic(case: Case, has_bias: bool, flops_per_score: int) -> Traffic:
    """Logits read once (+ bias), fp32 weights and int32 ids written once; FLOPs nominal."""
    t, e, k = int(case.dims["T"]), int(case.dims["E"]), int(case.dims["K"])
    nbytes = 4 * t * e + (4 * e if has_bias else 0) + t * k * (4 + 4)
    return Traffic(nbytes, flops_per_score * t * e, "nominal FLOPs (elementwise + selection)")


def _outputs(inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    logits = inputs["gating_output"]
    t, k = logits.shape[0], int(case.dims["K"])
    return (
        torch.empty(t, k, dtype=torch.float32, device=logits.device),
        torch.empty(t, k, dtype=torch.int32, device=logits.device),
    )


class _TopK(Adapter):
    role = "topk"
    ops = TOPK_OPS

    def tolerance(self, out: Any, case: Case) -> float:
        return TOLERANCES["float32"]


# -- moe_fused_gate: DeepSeek biased grouped top-k ---------------------------------------------------


def _bind_fused_topk_deepseek(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """flashinfer fused_topk_deepseek(scores, bias, n_group, topk_group, topk, scale, values, indices).

    It always renormalises and multiplies by its scale; sglang passes routed_scaling_factor when the MoE
    fuses it into top-k (NVFP4 MoE), else 1.0.
    """
    logits, bias, d = inputs["gating_output"], inputs["correction_bias"], case.dims
    w, ids = _outputs(inputs, case)
    args = (
        logits,
        bias,
        int(d["n_group"]),
        int(d["topk_group"]),
        int(d["K"]),
        routed_scaling_factor(),
        w,
        ids,
    )

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn(*args, launch_with_pdl=True)
        return w, ids

    return launch


def _bind_grouped_router(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """sglang's Triton router moe_fused_gate(scores, bias, topk, ...) -> (weights, ids); or the retired
    AOT moe_fused_gate(input_tensor, bias, num_expert_group, topk_group, topk, ...)."""
    logits, bias, d = inputs["gating_output"], inputs["correction_bias"], case.dims
    k, n_group, topk_group, scale = (
        int(d["K"]),
        int(d["n_group"]),
        int(d["topk_group"]),
        routed_scaling_factor(),
    )
    if _takes_first(fn, "input_tensor"):  # sgl-kernel <= 0.3.x signature
        return lambda: fn(logits, bias, n_group, topk_group, k, 0, scale, True)
    return lambda: fn(
        logits,
        bias,
        k,
        scoring_func="sigmoid",
        renormalize=True,
        routed_scaling_factor=scale,
        apply_routed_scaling_factor_on_output=True,
        num_expert_group=n_group,
        topk_group=topk_group,
    )


def _takes_first(fn: Any, name: str) -> bool:
    """Whether `fn`'s first parameter is `name` (tells the retired AOT signature from the current one)."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0] == name


@register
class MoeFusedGate(_TopK):
    kernel = "moe_fused_gate"
    description = "DeepSeek biased grouped top-k: sigmoid + bias, 4 of 8 groups, top-8 of 256, x2.5"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.fused_moe:fused_topk_deepseek",
            None,
            "jit",
            _bind_fused_topk_deepseek,
            requires=FLASHINFER_DSV3_ROUTING,
            label="sglang 0.5.16 default for DeepSeek on sm89+ (biased_grouped_topk_gpu)",
        ),
        Backend(
            "sglang_triton",
            "sglang.jit_kernel.moe_fused_gate:moe_fused_gate",
            None,
            "triton",
            _bind_grouped_router,
            fallbacks=("sgl_kernel.moe:moe_fused_gate",),
            label="unified Triton router: sglang's fallback / SGLANG_OPT_USE_JIT_KERNEL_GROUPED_TOPK",
            note="replaces the AOT moe_fused_gate retired from sgl-kernel 0.4.5 (kept as fallback target)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return _router_inputs(case, device, seed)

    def reference(
        self, inputs: dict[str, Any], case: Case
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(weights fp32, ids int32, biased scores float64 — what check() compares selections by)."""
        d = case.dims
        scores, biased, masked = grouped_choice_scores(
            inputs["gating_output"], inputs["correction_bias"], int(d["n_group"]), int(d["topk_group"])
        )
        w, ids = _select(scores, masked, int(d["K"]), True, routed_scaling_factor())
        return w, ids, biased

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        groups = (int(case.dims["n_group"]), int(case.dims["topk_group"]))
        return check_topk(out, ref, ref[2], self.tolerance(out, case), groups)

    def traffic(self, case: Case) -> Traffic:
        return _routing_traffic(case, True, 6)


# -- topk_softmax / topk_sigmoid: flat gates of other MoE models --------------------------------------


def _bind_topk_inplace(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """topk_softmax / topk_sigmoid(topk_weights, topk_ids, gating_output, renormalize[, correction_bias])."""
    logits, bias = inputs["gating_output"], inputs.get("correction_bias")
    w, ids = _outputs(inputs, case)
    args = (w, ids, logits, True) if bias is None else (w, ids, logits, True, bias)

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn(*args)
        return w, ids

    return launch


def _bind_flat_router(fn: Any, inputs: dict[str, Any], case: Case, scoring: str) -> Callable[[], Any]:
    """Triton moe_fused_gate / CUDA moe_fused_gate_jit, ungrouped: (scores, bias, topk, scoring_func, ...)."""
    logits, k = inputs["gating_output"], int(case.dims["K"])
    bias = inputs.get("correction_bias")
    if bias is None:  # sglang passes zeros for softmax gates
        bias = torch.zeros(logits.shape[1], dtype=torch.float32, device=logits.device)
    return lambda: fn(logits, bias, k, scoring_func=scoring, renormalize=True)


@register
class TopkSoftmax(_TopK):
    kernel = "topk_softmax"
    description = "softmax top-8 of 256 with renormalisation (not used by DeepSeek; Mixtral-style gate)"
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.moe:topk_softmax",
            None,
            "aot",
            _bind_topk_inplace,
            label="what sglang 0.5.16 runs for softmax gates (via sglang.kernels.ops.moe:topk_softmax)",
        ),
        Backend(
            "sglang_triton",
            "sglang.jit_kernel.moe_fused_gate:moe_fused_gate",
            None,
            "triton",
            functools.partial(_bind_flat_router, scoring="softmax"),
            label="unified Triton router (SGLANG_OPT_USE_JIT_KERNEL_FUSED_TOPK)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return {"gating_output": _router_inputs(case, device, seed)["gating_output"]}

    def reference(
        self, inputs: dict[str, Any], case: Case
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        probs = inputs["gating_output"].double().softmax(dim=-1)
        w, ids = _select(probs, probs, int(case.dims["K"]), renormalize=True)
        return w, ids, probs

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return check_topk(out, ref, ref[2], self.tolerance(out, case))

    def traffic(self, case: Case) -> Traffic:
        return _routing_traffic(case, False, 4)


@register
class TopkSigmoid(_TopK):
    kernel = "topk_sigmoid"
    description = "flat sigmoid top-8 of 256 with correction bias (no groups; not DeepSeek's routing)"
    backends = [
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.moe_topk_sigmoid:topk_sigmoid",
            None,
            "jit",
            _bind_topk_inplace,
            label="what sglang 0.5.16 runs for sigmoid gates on CUDA",
        ),
        Backend("sgl_kernel", "sgl_kernel.moe:topk_sigmoid", None, "aot", _bind_topk_inplace),
        Backend(
            "sglang_triton",
            "sglang.jit_kernel.moe_fused_gate:moe_fused_gate",
            None,
            "triton",
            functools.partial(_bind_flat_router, scoring="sigmoid"),
            label="unified Triton router (SGLANG_OPT_USE_JIT_KERNEL_FUSED_TOPK)",
        ),
        Backend(
            "sglang_jit.fused_gate",
            "sglang.jit_kernel.moe_fused_gate:moe_fused_gate_jit",
            None,
            "jit",
            functools.partial(_bind_flat_router, scoring="sigmoid"),
            label="CUDA flat router (present in sglang 0.5.16, not called by it)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return _router_inputs(case, device, seed)

    def reference(
        self, inputs: dict[str, Any], case: Case
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        scores = inputs["gating_output"].double().sigmoid()
        biased = scores + inputs["correction_bias"].double().unsqueeze(0)
        w, ids = _select(scores, biased, int(case.dims["K"]), renormalize=True)
        return w, ids, biased

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return check_topk(out, ref, ref[2], self.tolerance(out, case))

    def traffic(self, case: Case) -> Traffic:
        return _routing_traffic(case, True, 4)
