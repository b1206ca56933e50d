"""Inputs peculiar to the MoE adapters: DeepSeek routing for a case and expert weights in each format.

Every adapter routes tokens with ``dskbench.adapters.common.routing`` (DeepSeek's biased grouped top-k,
uneven expert loads), so the rows per expert, the number of touched experts and the block padding are what
DeepSeek-R1 produces. Weight tensors are full-size on the GPU ([256, 4096, 7168] bf16 is 15 GB); on the
CPU, where only the torch reference runs, every expert shares one random slab (a stride-0 view over E), so
a CPU case allocates one expert's weights and the reference dequantises them once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dskbench.adapters.common import fp8
from dskbench.adapters.common.inputs import device_generator, normal, uniform
from dskbench.adapters.common.routing import Routing, active_experts, deepseek_routing, fuse_shared_experts
from dskbench.shapes.cases import Case

BF16 = torch.bfloat16
GROUP = fp8.GROUP  # 128: activation group and weight block edge
FP8_WEIGHT_STD = 112.0  # spread of random e4m3 weight values (|q| up to ~448)
INT4_STD = 4.6  # std of a uniform int in [-8, 7]


# -- the case's routing ---------------------------------------------------------------------------------


def topk(case: Case) -> int:
    """Experts per token: the `topk` dim of moe_gemm cases, `K` elsewhere."""
    return int(case.dims["topk"] if "topk" in case.dims else case.dims["K"])


def shared(case: Case) -> int:
    """Shared experts fused into the case's MoE (op experts_fused_shared): the last E and top-k slots."""
    return int(case.dims.get("shared", 0))


ROUTING_SEED = 0  # every run and backend of a case routes its tokens alike (see routing)


def routing(case: Case, device: str, seed: int) -> Routing:
    """DeepSeek routing of the case's T tokens over its E experts (groups from the model); with fused
    shared experts, the first K - s slots route over the E - s routed experts and the last s slots hold
    the shared one (common.routing.fuse_shared_experts).

    The routing is the case's own, whatever `seed` draws the activations and weights: which experts a
    batch touches sets how many expert weights a MoE kernel reads, so a fresh routing per run moved a
    decode case's work by a few experts (3% at T=64), put its bytes above what the traffic model
    (n_active, from this same routing) counts, and added that to the run-to-run spread."""
    s = shared(case)
    e = int(case.dims["E"]) - s
    r = deepseek_routing(
        int(case.dims["T"]),
        e,
        topk(case) - s,
        int(case.model["n_group"]),
        int(case.model["topk_group"]),
        seed=ROUTING_SEED,
        device=device,
    )
    if not s:
        return r
    w, ids = fuse_shared_experts(r.topk_weights, r.topk_ids, e, s, float(case.model["routed_scaling_factor"]))
    return Routing(r.logits, r.bias, ids, w)


def n_active(case: Case) -> int:
    """Experts the case's routing touches (the fused shared ones always): traffic counts their weights."""
    s = shared(case)
    return s + active_experts(
        int(case.dims["T"]),
        int(case.dims["E"]) - s,
        topk(case) - s,
        int(case.model["n_group"]),
        int(case.model["topk_group"]),
    )


def fused_sum(case: Case) -> bool:
    """A `down_sum.*` moe_gemm case: the down GEMM with the top-k sum fused in (Triton only)."""
    return (case.variant or "").startswith("down_sum")


def moe_gemm_dims(case: Case) -> tuple[int, int, int, int, int, bool]:
    """(T, E, topk, N, K, gate_up) of a moe_gemm case."""
    d = case.dims
    gate_up = (case.variant or "").startswith("gate_up")
    return int(d["T"]), int(d["E"]), topk(case), int(d["N"]), int(d["K"]), gate_up


# -- weight values -----------------------------------------------------------------------------------------


def fp8_values(shape: tuple[int, ...], gen: torch.Generator, device: str) -> torch.Tensor:
    """Random e4m3 values spread like a block-quantised weight (|q| up to ~448, std 112), drawn in bf16
    (no fp32 draw: expert weights are billions of values)."""
    x = normal(shape, gen, device, BF16, FP8_WEIGHT_STD)
    return x.clamp_(-fp8.FP8_MAX, fp8.FP8_MAX).to(fp8.FP8_DTYPE)


def int4_packed(shape: tuple[int, ...], gen: torch.Generator, device: str) -> torch.Tensor:
    """Random signed int4 [..., K] packed two per int8 byte, even k in the low nibble -> int8 [..., K/2].

    A uniform random byte is two independent uniform int4 nibbles in [-8, 7], so the bytes are drawn
    directly (one kernel, no unpacked values)."""
    g = device_generator(gen, device)
    packed = (*shape[:-1], shape[-1] // 2)
    return torch.randint(-128, 128, packed, generator=g, device=device, dtype=torch.int8)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7], [..., K] -> int8 [..., K/2] (low nibble = even index, as sgl-kernel's W4A8)."""
    lo, hi = q[..., 0::2], q[..., 1::2]
    return ((hi << 4) | (lo & 0x0F)).to(torch.int8)


def unpack_int4(p: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_int4 -> int8 [..., 2 * K/2] with sign extension."""
    lo = (p & 0x0F).to(torch.int16)
    lo = torch.where(lo >= 8, lo - 16, lo).to(torch.int8)
    hi = p >> 4  # arithmetic shift keeps the sign of the high nibble
    return torch.stack((lo, hi), dim=-1).flatten(-2)


def interleave_w4a8_scales(scales: torch.Tensor) -> torch.Tensor:
    """[E, N, K/128] -> [E, K/128/a, N*a] with a = 4 when K/128 % 4 == 0 (sglang w4afp8.interleave_scales)."""
    e, n, g = scales.shape
    a = 4 if g % 4 == 0 else 1
    return scales.reshape(e, n, g // a, a).permute(0, 2, 1, 3).reshape(e, g // a, n * a).contiguous()


def per_expert(
    make: Callable[[int], torch.Tensor], num_experts: int, device: str, chunk: int = 8
) -> torch.Tensor:
    """Stack E per-expert tensors made `chunk` experts at a time (peak memory: the result plus one chunk);
    on the CPU one expert is made and broadcast (stride 0) over E."""
    if device == "cpu":
        one = make(1)
        return one.expand(num_experts, *one.shape[1:])
    first = make(min(chunk, num_experts))
    out = torch.empty((num_experts, *first.shape[1:]), dtype=first.dtype, device=first.device)
    out[: first.shape[0]] = first
    for e0 in range(first.shape[0], num_experts, chunk):
        m = min(chunk, num_experts - e0)
        out[e0 : e0 + m] = make(m)
    return out


# -- expert weights ----------------------------------------------------------------------------------------


@dataclass
class ExpertWeights:
    """One grouped-GEMM weight [E, N, K] in one format, with its dequantisation for the reference."""

    fmt: str  # bf16 | fp8_block | w4a8
    w: torch.Tensor  # bf16 [E,N,K] | e4m3 [E,N,K] | int8 [E,N,K/2] (two int4)
    scale: torch.Tensor | None = None  # fp8: fp32 [E,N/128,K/128]; w4a8: bf16 [E,N,K/128]

    @property
    def n(self) -> int:
        return int(self.w.shape[1])

    def key(self, e: int) -> tuple[int, int]:
        """Storage identity of expert e: experts sharing it (the CPU slab) have equal keys."""
        se = self.scale[e].data_ptr() if self.scale is not None else 0
        return (self.w[e].data_ptr(), se)

    def decode(self, w: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        """fp32 values of stored weights [..., N, K] (one expert or a stack of them): every format's decode
        is elementwise, so an expert decodes to the same bits alone or inside a stack."""
        if self.fmt == "bf16":
            return w.float()
        assert scale is not None
        if self.fmt == "fp8_block":
            return fp8.dequant_block(w, scale)
        return unpack_int4(w).float() * scale.float().repeat_interleave(GROUP, dim=-1)

    def dequant(self, e: int, cache: dict[tuple[int, int], torch.Tensor]) -> torch.Tensor:
        """Expert e as fp32 [N, K], dequantised once per distinct storage."""
        key = self.key(e)
        if key not in cache:
            cache[key] = self.decode(self.w[e], self.scale[e] if self.scale is not None else None)
        return cache[key]

    def dequant_many(self, experts: torch.Tensor) -> torch.Tensor:
        """Experts `experts` (int64 on the weights' device) as fp32 [len(experts), N, K]: one gather and
        one decode for all of them, instead of a launch sequence per expert."""
        return self.decode(self.w[experts], self.scale[experts] if self.scale is not None else None)


def make_expert_weights(
    num_experts: int, n: int, k: int, fmt: str, device: str, gen: torch.Generator
) -> ExpertWeights:
    """Random expert weights whose dequantised values have std ~ 1/sqrt(K) (outputs stay O(1))."""
    std = 1.0 / math.sqrt(k)
    if fmt == "bf16":
        return ExpertWeights(
            fmt, per_expert(lambda m: normal((m, n, k), gen, device, BF16, std), num_experts, device)
        )
    if fmt == "fp8_block":
        w = per_expert(lambda m: fp8_values((m, n, k), gen, device), num_experts, device)
        nb, kb = math.ceil(n / GROUP), math.ceil(k / GROUP)
        lo, hi = 0.75 * std / FP8_WEIGHT_STD, 1.25 * std / FP8_WEIGHT_STD
        s = per_expert(lambda m: uniform((m, nb, kb), gen, device, lo, hi), num_experts, device)
        return ExpertWeights(fmt, w, s)
    if fmt == "w4a8":
        w = per_expert(lambda m: int4_packed((m, n, k), gen, device), num_experts, device)
        lo, hi = 0.75 * std / INT4_STD, 1.25 * std / INT4_STD
        s = per_expert(lambda m: uniform((m, n, k // GROUP), gen, device, lo, hi, BF16), num_experts, device)
        return ExpertWeights(fmt, w, s)
    raise ValueError(f"unknown MoE weight format {fmt!r}")


def weight_bytes(n: int, k: int, fmt: str) -> int:
    """Bytes of one expert's [N, K] weight and its scales."""
    if fmt == "bf16":
        return n * k * 2
    if fmt == "fp8_block":
        return n * k + math.ceil(n / GROUP) * math.ceil(k / GROUP) * 4
    if fmt == "w4a8":
        return n * k // 2 + n * (k // GROUP) * 2
    raise ValueError(f"unknown MoE weight format {fmt!r}")


def weights_inputs(w: ExpertWeights) -> dict[str, torch.Tensor]:
    """An adapter's inputs `w` (and `w_scale`) for one expert weight."""
    out = {"w": w.w}
    if w.scale is not None:
        out["w_scale"] = w.scale
    return out


def weights_of(inputs: dict[str, Any], fmt: str) -> ExpertWeights:
    """The expert weight back from inputs (`w_scale_plain`: W4A8's scales before interleaving)."""
    scale = inputs.get("w_scale_plain", inputs.get("w_scale"))
    return ExpertWeights(fmt, inputs["w"], scale)
