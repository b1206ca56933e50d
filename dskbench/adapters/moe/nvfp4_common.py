"""What the NVFP4 MoE adapters share: the routed-expert inputs as SGLang feeds them (bf16 hidden states and
their NVFP4 form, DeepSeek routing, checkpoint-format expert weights), their references, and their traffic.

MoE weights are filled only for the experts the routing selects; the other experts' storage is allocated
but never read.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import torch

from dskbench.adapters.common import nvfp4 as fp4
from dskbench.adapters.common.inputs import generator, randn
from dskbench.adapters.common.matmul_precision import exact_fp32_matmul
from dskbench.adapters.common.nvfp4_adapter import NumericsAdapter, Refs
from dskbench.adapters.common.nvfp4_inputs import nvfp4_weight, quantized_activation, weight_scale_2
from dskbench.adapters.common.routing import BIAS_STD, POPULARITY_STD, fuse_shared_experts, grouped_topk
from dskbench.device.info import DeviceInfo
from dskbench.shapes.cases import Case

# A CPU reference run skips the NVFP4 routed experts: their fp32 oracle decodes the NVFP4 weights of each
# routed expert, seconds a call on a CPU, and a timed case calls it four times (reference, first launch,
# warm-up, a sample), which ran past the case limit on a two-core box.
CPU_TOO_SLOW = (
    "too slow for a CPU reference run: measured on a GPU (the fp32 reference decodes the NVFP4 weights "
    "of each expert the tokens route to, seconds a call on a CPU)"
)


def expected_active_experts(t: int, e: int, k: int) -> float:
    """Distinct experts hit by t tokens choosing k of e, under uniform routing (an upper bound on the
    biased DeepSeek routing the inputs use)."""
    return e * (1.0 - (1.0 - k / e) ** t)


@functools.lru_cache(maxsize=256)
def _routed_experts(t: int, e: int, k: int, n_group: int, topk_group: int, s: int, rsf: float) -> int:
    c = {"T": t, "E": e, "K": k, "S": s, "n_group": n_group, "topk_group": topk_group, "rsf": rsf}
    ids = routing(c, generator(0), "cpu")[2]
    return int(torch.unique(ids.long()).numel())


def routed_active_experts(c: dict[str, Any]) -> int:
    """Distinct experts the seed-0 routing of these inputs (drawn on the CPU) touches: what traffic counts
    (a fused shared expert included).

    Uneven expert popularity makes the inputs hit fewer experts than uniform routing would, so the
    uniform expectation overstates the bytes (and % of peak); other seeds hit within a few experts of this.
    """
    s = c.get("S", 0)
    return _routed_experts(c["T"], c["E"], c["K"], c["n_group"], c["topk_group"], s, c["rsf"] if s else 1.0)


def expert_weight_bytes(h: int, i: int) -> int:
    """One routed expert's NVFP4 gate_up [2I, H] + down [H, I] (24,772,608 B at I=2048, H=7168)."""
    return fp4.nvfp4_bytes(2 * i * h) + fp4.nvfp4_bytes(h * i)


def _symbol(case: Case, name: str) -> Any:
    """A model symbol (n_group, ...), unless the case's dims override it."""
    return case.dims[name] if name in case.dims else case.model[name]


def moe_config(case: Case) -> dict[str, Any]:
    """The MoE sizes of a case (T, H, I, E, K; S: fused shared experts, among E and K) and DeepSeek's
    routing constants."""
    d = case.dims
    return {
        "T": int(d["T"]),
        "H": int(d["H"]),
        "I": int(d["I"]),
        "E": int(d["E"]),
        "K": int(d["K"]),
        "S": int(d.get("shared", 0)),
        "n_group": int(_symbol(case, "n_group")),
        "topk_group": int(_symbol(case, "topk_group")),
        "rsf": float(_symbol(case, "routed_scaling_factor")),
    }


def routing(
    c: dict[str, Any], gen: torch.Generator, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Router logits (fp32) with a per-expert popularity term so loads are uneven, the correction bias in
    bf16 (as SGLang hands it to trtllm), and the DeepSeek grouped top-k they give -> (logits, bias, ids
    int32, weights fp32 renormalised, routed_scaling_factor not applied). The popularity and bias spreads
    are the ones every MoE adapter's routing uses (common/routing.py), so the NVFP4 paths and the BF16/FP8
    paths the pick compares them with see the same load: as many distinct experts at each T. With S fused
    shared experts the logits cover the E - S routed experts and the last S slots are the shared expert's
    (common.routing.fuse_shared_experts)."""
    s = c.get("S", 0)
    t, e = c["T"], c["E"] - s
    popularity = randn((e,), gen, device, torch.float32, POPULARITY_STD)
    logits = randn((t, e), gen, device, torch.float32) + popularity
    bias = randn((e,), gen, device, torch.float32, BIAS_STD).to(torch.bfloat16)
    weights, ids = grouped_topk(logits, bias, c["K"] - s, c["n_group"], c["topk_group"])
    if s:
        weights, ids = fuse_shared_experts(weights, ids, e, s, c["rsf"])
    return logits, bias, ids, weights


def _expert_weights(
    e: int, rows: int, k: int, active: torch.Tensor, gen: torch.Generator, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[E, rows, k] NVFP4 expert weights; only the active experts are filled (the rest is never read)."""
    packed = torch.empty((e, rows, k // 2), dtype=torch.uint8, device=device)
    scales = torch.empty((e, rows, k // fp4.NVFP4_BLOCK), dtype=torch.float8_e4m3fn, device=device)
    p, s, _ = nvfp4_weight((active.numel(), rows, k), gen, device)
    packed[active] = p
    scales.view(torch.uint8)[active] = s.view(torch.uint8)
    return packed, scales, weight_scale_2((e,), gen, device)


def _calibrate_a2(x: torch.Tensor, ids: torch.Tensor, w13: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The down-projection input_scale: amax of the SwiGLU output, estimated on up to 64 tokens of one
    expert with a 2x margin (a calibrated scale; rare outliers saturate the e4m3 block scale, identically
    in kernel and reference)."""
    e = int(ids.reshape(-1)[0])
    tok = (ids == e).any(dim=1).nonzero().squeeze(1)[:64]
    w1 = fp4.dequantize_nvfp4(w13[0][e], w13[1][e], 1.0 / w13[2][e])
    with exact_fp32_matmul():
        act = fp4.silu_and_mul(x[tok].float() @ w1.T)
    return (2.0 * act.abs().amax().clamp_min(1e-12) / (fp4.E4M3_MAX * fp4.FP4_MAX)).float()


def make_moe_inputs(case: Case, device: str, seed: int) -> dict[str, Any]:
    """Routed-expert inputs as SGLang feeds the NVFP4 MoE: bf16 hidden states (and their NVFP4 form),
    DeepSeek routing from fp32 logits + bf16 correction bias, checkpoint-format expert weights."""
    c = moe_config(case)
    t, h, i, e = c["T"], c["H"], c["I"], c["E"]
    gen = generator(seed)
    logits, bias, ids, weights = routing(c, gen, device)
    x = randn((t, h), gen, device)
    active = torch.unique(ids.long())
    w13, w13_sf, w13_ws2 = _expert_weights(e, 2 * i, h, active, gen, device)
    w2, w2_sf, w2_ws2 = _expert_weights(e, h, i, active, gen, device)
    x_fp4, x_sf, a1_scale, _ = quantized_activation(x)
    a2_scale = _calibrate_a2(x, ids, (w13, w13_sf, w13_ws2))
    return {
        "x": x,
        "x_fp4": x_fp4,
        "x_sf": x_sf,
        "routing_logits": logits,
        "routing_bias": bias,
        "topk_ids": ids,
        "topk_weights": weights,
        "w13": w13,
        "w13_sf": w13_sf,
        "w13_ws2": w13_ws2,
        "w2": w2,
        "w2_sf": w2_sf,
        "w2_ws2": w2_ws2,
        "a1_scale": a1_scale,
        "a2_scale": a2_scale,
        "routed_scaling_factor": c["rsf"],
        "n_group": c["n_group"],
        "topk_group": c["topk_group"],
    }


def moe_refs(inputs: dict[str, Any], primary: str = "w4a4", both: bool = False) -> Refs:
    """The W4A4 and W4A16 references. `both`: computed together at the first request, in one pass over
    the experts (each routed expert's NVFP4 weights decoded once), for an adapter whose backends check
    against both numerics."""
    w13 = (inputs["w13"], inputs["w13_sf"], inputs["w13_ws2"])
    w2 = (inputs["w2"], inputs["w2_sf"], inputs["w2_ws2"])
    common = (inputs["x"], inputs["topk_ids"], inputs["topk_weights"], w13, w2)
    rsf = inputs["routed_scaling_factor"]
    gs = (1.0 / inputs["a1_scale"], 1.0 / inputs["a2_scale"])
    if both:
        pair = functools.cache(lambda: fp4.moe_references(*common, [gs, None], routed_scaling_factor=rsf))
        return Refs(primary, {"w4a4": lambda: pair()[0], "w4a16": lambda: pair()[1]})
    return Refs(
        primary,
        {
            "w4a4": lambda: fp4.moe_reference(*common, act_global_scales=gs, routed_scaling_factor=rsf),
            "w4a16": lambda: fp4.moe_reference(*common, act_global_scales=None, routed_scaling_factor=rsf),
        },
    )


class Nvfp4Moe(NumericsAdapter):
    """The routed experts of an NVFP4 MoE layer, [T, H] -> [T, H], checked by numerics."""

    role = "moe"
    ops = ("experts",)
    # W4A4: kernels may round the gate_up output to bf16 before re-quantising it to NVFP4, which flips a
    # few percent of intermediate codes relative to the fp32 oracle; 5e-2 still catches any layout error.
    tolerances: ClassVar[dict[str, float]] = {"w4a4": 5e-2, "w4a16": 2e-2}

    def applies(self, case: Case) -> bool:
        return case.dims.get("weight") == "nvfp4"

    def cpu_skip_reason(self, case: Case) -> str | None:
        return CPU_TOO_SLOW

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return make_moe_inputs(case, device, seed)

    def reference(self, inputs: dict[str, Any], case: Case) -> Refs:
        here = self.numerics_here(inputs["x"].device)
        if here == {"w4a16"}:  # a GPU that runs Marlin alone (Hopper): the W4A4 oracle would go unread
            return moe_refs(inputs, "w4a16")
        w4a16 = "w4a16" in here  # Marlin rows check W4A16
        return moe_refs(inputs, self.primary, both=w4a16)

    def numerics_here(self, device: torch.device) -> set[str]:
        """The numerics of the backends this device can run (all of them on a CPU, where the torch
        reference is what is timed). The reference computes those first, and another only if asked."""
        every = {b.extra.get("numerics", self.primary) for b in self.backends}
        if device.type != "cuda":
            return every
        major, minor = torch.cuda.get_device_capability(device)
        here = DeviceInfo("cuda", "", major * 10 + minor, torch.cuda.device_count())
        runs = {
            b.extra.get("numerics", self.primary) for b in self.backends if not b.requires.reason_unmet(here)
        }
        return runs or every

    def weights_and_flops(self, case: Case) -> tuple[int, int, float]:
        """(NVFP4 weight bytes of the active experts, FLOPs, active experts)."""
        c = moe_config(case)
        n_act = routed_active_experts(c)
        flops = 2 * c["T"] * c["K"] * 3 * c["I"] * c["H"]
        return int(round(n_act * expert_weight_bytes(c["H"], c["I"]))), flops, n_act
