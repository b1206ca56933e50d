"""fused_moe_kernel: SGLang's Triton grouped MoE GEMM, gate_up or down.

Weight formats benchmarked (``moe_gemm`` role variants): BF16 and FP8 128x128-block. The NVFP4 checkpoint
itself has no Triton path: on sm90 SGLang runs its routed experts with the Marlin W4A16 MoE
(sglang python/sglang/srt/layers/moe/fused_moe_triton/fused_marlin_moe.py). Expert weights are counted
in ``traffic`` for the experts the seed-0 routing activates.

``down_sum.*`` variants run the down GEMM in its FUSE_SUM_ALL_REDUCE mode (SGLang
``--enable-fused-moe-sum-all-reduce``, top_k > 2): each (token, slot) row is atomically added into a zeroed
[T, H] output, so the top-k sum needs no moe_sum_reduce kernel; the zeroing is part of the timed call, as
fused_experts does it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import generator, normal
from dskbench.adapters.moe.inputs import (
    BF16,
    GROUP,
    fused_sum,
    make_expert_weights,
    moe_gemm_dims,
    n_active,
    routing,
    weight_bytes,
    weights_inputs,
    weights_of,
)
from dskbench.adapters.moe.reference import moe_gemm_reference, quant_dequant_groups
from dskbench.shapes.cases import Case

NVFP4_NOTE = "BF16/FP8-block weights: the NVFP4 checkpoint has no Triton path (sm90 runs Marlin W4A16 MoE)"


def _ensure_sglang_server_args() -> None:
    """SGLang's MoE config lookup reads the process-wide ServerArgs; publish its test default if unset."""
    from sglang.srt.runtime_context import get_context

    ctx = get_context()
    try:
        ctx.server_args  # noqa: B018 - raises ValueError when unset
    except ValueError:
        ctx.override_server_args().install()


def _bind_fused_moe(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """Config lookup (tuned JSON, else SGLang's default config), alignment and C, as fused_experts does."""
    import triton.language as tl
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import (
        get_config_dtype_str,
        try_get_optimal_moe_config,
    )
    from sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size import moe_align_block_size

    _ensure_sglang_server_args()
    t, e, topk, n, k, gate_up = moe_gemm_dims(case)
    use_fp8 = case.dims["weight"] == "fp8_block"
    inter, hidden = (n // 2, k) if gate_up else (k, n)
    block_shape = [GROUP, GROUP] if use_fp8 else None
    dtype_str = get_config_dtype_str(BF16, use_fp8_w8a8=use_fp8)
    config, (down_config, _) = try_get_optimal_moe_config(
        (e, 2 * inter, hidden),
        (e, hidden, inter),
        topk,
        dtype_str,
        t,
        block_shape=block_shape,
        return_down_config=True,
    )
    cfg = dict(config if gate_up or down_config is None else down_config)
    cfg.pop("USE_TMA", None)  # the TMA down path (tuned *_down.json) is not benchmarked
    topk_ids, topk_weights = inputs["topk_ids"], inputs["topk_weights"]
    sorted_ids, expert_ids, n_post = moe_align_block_size(topk_ids, config["BLOCK_SIZE_M"], e)
    summed = fused_sum(case)
    shape = (t * topk, n) if gate_up else ((t, n) if summed else (t, topk, n))
    c = torch.empty(shape, dtype=BF16, device=inputs["a"].device)
    a, w, w_scale = inputs["a"], inputs["w"], inputs.get("w_scale")

    def launch() -> torch.Tensor:
        if summed:
            c.zero_()  # the atomic adds accumulate into it
        fn(
            a,
            w,
            None,
            c,
            None,
            w_scale,
            None,
            topk_weights,
            topk_ids,
            sorted_ids,
            expert_ids,
            n_post,
            not gate_up,  # mul_routed_weight: the down GEMM applies the routing weight
            topk if gate_up else 1,
            cfg,
            compute_type=tl.bfloat16,
            use_fp8_w8a8=use_fp8,
            use_int8_w8a8=False,
            use_int8_w8a16=False,
            use_int4_w4a16=False,
            per_channel_quant=False,
            block_shape=block_shape,
            filter_expert=False,  # EP = 1: every expert is local
            fuse_sum_all_reduce=summed,
            router_topk=1 if gate_up else topk,
        )
        return c

    return launch


@register
class FusedMoeKernel(Adapter):
    kernel = "fused_moe_kernel"
    role = "moe_gemm"
    ops = ("experts",)
    description = (
        "Triton grouped MoE GEMM as invoke_fused_moe_kernel runs it: gate_up (A=hidden, top_k=K) or down "
        "(A=intermediate, x routing weight; down_sum: top-k sum fused in); FP8 variant quantises A per "
        "1x128 group inside the call."
    )
    backends = [
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.moe.fused_moe_triton_kernels:invoke_fused_moe_kernel",
            None,
            "triton",
            _bind_fused_moe,
            fallbacks=(
                "sglang.srt.layers.moe.fused_moe_triton.fused_moe_triton_kernels:invoke_fused_moe_kernel",
            ),
            label=NVFP4_NOTE,
        )
    ]

    def applies(self, case: Case) -> bool:
        return case.dims.get("weight") in ("bf16", "fp8_block")

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, e, topk, n, k, gate_up = moe_gemm_dims(case)
        route = routing(case, device, seed)
        gen = generator(seed)
        rows = t if gate_up else t * topk
        return {
            "a": normal((rows, k), gen, device),
            **weights_inputs(make_expert_weights(e, n, k, case.dims["weight"], device, gen)),
            "topk_ids": route.topk_ids,
            "topk_weights": route.topk_weights,
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        *_, gate_up = moe_gemm_dims(case)
        fmt = case.dims["weight"]
        a = quant_dequant_groups(inputs["a"]) if fmt == "fp8_block" else inputs["a"].float()
        w, ids = weights_of(inputs, fmt), inputs["topk_ids"]
        # BF16 activations and weights are exact in TF32; FP8's are scaled, so they stay IEEE fp32
        out = moe_gemm_reference(a, w, ids, inputs["topk_weights"], gate_up, tf32=fmt == "bf16")
        return out.sum(dim=1) if fused_sum(case) else out

    def traffic(self, case: Case) -> Traffic:
        """FLOPs 2·T·topk·N·K: one [K] x [K, N] product per routed (token, slot) row, nothing for the
        rows moe_align_block_size pads each expert's block with (the kernel computes them; they are not
        work), nothing for experts no token routes to. Bytes: the A rows (T for gate_up, T·topk for
        down) in BF16, the weights (and block scales) of the experts the routing touches, the output
        rows (T when the top-k sum is fused in), topk_ids and for down the fp32 routing weights."""
        t, _e, topk, n, k, gate_up = moe_gemm_dims(case)
        fmt = case.dims["weight"]
        a_rows = t if gate_up else t * topk
        weights = n_active(case) * weight_bytes(n, k, fmt)
        routing_bytes = t * topk * 4 * (1 if gate_up else 2)  # topk_ids (+ fp32 weights for down)
        out_rows = t if fused_sum(case) else t * topk
        b = a_rows * k * 2 + weights + out_rows * n * 2 + routing_bytes
        return Traffic(
            b,
            2 * t * topk * n * k,
            f"weights of {n_active(case)} active experts (seed-0 routing); sorted-id metadata excluded",
            compute="fp8" if fmt == "fp8_block" else "bf16",
        )
