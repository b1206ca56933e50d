"""scaled_fp4_experts_quant: NVFP4 quantisation of the routed, expert-sorted hidden states before the grouped
gate_up GEMM of the cutlass FP4 MoE path, and flashinfer's grouped quantiser on the masked per-expert layout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import SM100, Backend
from dskbench.adapters.base import Adapter, Check, Traffic, rel_error
from dskbench.adapters.common import nvfp4 as fp4
from dskbench.adapters.common.inputs import generator, randn
from dskbench.adapters.common.nvfp4_adapter import FI_FP4, Refs, Tagged, untag
from dskbench.adapters.common.nvfp4_inputs import quantized_activation
from dskbench.adapters.moe.nvfp4_common import moe_config, routing
from dskbench.shapes.cases import Case


def _sorted_rows(ids: torch.Tensor, x: torch.Tensor, e: int) -> dict[str, torch.Tensor]:
    """Expert-sorted expansion of the routed tokens, as prepare_moe_input + shuffle_rows produce it."""
    flat = ids.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices
    token = order // ids.shape[1]
    counts = torch.bincount(flat, minlength=e)
    offsets = torch.zeros(e + 1, dtype=torch.int32, device=x.device)
    offsets[1:] = torch.cumsum(counts, 0)
    padded = (counts + 127) // 128 * 128
    bs_offsets = torch.zeros(e + 1, dtype=torch.int32, device=x.device)
    bs_offsets[1:] = torch.cumsum(padded, 0)
    return {
        "a": x[token].contiguous(),
        "counts": counts.to(torch.int32),
        "offsets": offsets,
        "bs_offsets": bs_offsets,
    }


def _bind_aot_experts_quant(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """sgl-kernel <= 0.3.21 scaled_fp4_experts_quant(a_sorted, gs [E], expert_offsets, blockscale_offsets, topk)."""
    a, gs, off, bso = (
        inputs["a_sorted"],
        inputs["a_gs"],
        inputs["expert_offsets"],
        inputs["blockscale_offsets"],
    )
    topk = inputs["topk_ids"].shape[1]

    def launch() -> Tagged:
        return Tagged(fn(a, gs, off, bso, topk), layout="aot")

    return launch


def _bind_fi_grouped_quant(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """flashinfer.scaled_fp4_grouped_quantize on the masked [E, max_m, H] layout (DeepEP low-latency form,
    SGLang's CuteDSL v1 MoE path); the masked buffer is built here, outside the timing."""
    counts, off = inputs["expert_counts"], inputs["expert_offsets"]
    a = inputs["a_sorted"]
    e = counts.numel()
    max_m = max(int(counts.max()), 1)
    masked = torch.zeros((e, max_m, a.shape[1]), dtype=a.dtype, device=a.device)
    expert = torch.repeat_interleave(torch.arange(e, device=a.device), counts.long())
    local = torch.arange(a.shape[0], device=a.device) - off[:-1].long()[expert]
    masked[expert, local] = a
    gs = inputs["a_gs"]

    def launch() -> Tagged:
        return Tagged(fn(masked, counts, gs), layout="masked")

    return launch


@register
class ScaledFp4ExpertsQuant(Adapter):
    """NVFP4 quantisation of the routed, expert-sorted hidden states before the grouped gate_up GEMM
    (the cutlass FP4 MoE path). Removed from sgl-kernel 0.4.5; flashinfer's grouped quantiser takes the
    masked per-expert layout instead. Only the GEMM1 input ([T*8, H]) is measured."""

    kernel = "scaled_fp4_experts_quant"
    role = "moe"
    ops = ("experts",)
    description = "bf16 [T*K, H] expert-sorted -> NVFP4 with per-expert 128x4 swizzled scales"
    backends: ClassVar[list[Backend]] = [
        Backend(
            "flashinfer.grouped",
            "flashinfer:scaled_fp4_grouped_quantize",
            "flashinfer-python",
            "jit",
            _bind_fi_grouped_quant,
            requires=FI_FP4,
            fallbacks=("flashinfer.quantization.fp4_quantization:scaled_fp4_grouped_quantize",),
            note="masked [E, max_tokens, H] input (DeepEP low-latency layout)",
        ),
        Backend(
            "sgl_kernel",
            "sgl_kernel:scaled_fp4_experts_quant",
            "sglang-kernel",
            "aot",
            _bind_aot_experts_quant,
            requires=SM100,
            fallbacks=("sgl_kernel.gemm:scaled_fp4_experts_quant",),
            note="the traced kernel; removed from sglang-kernel 0.4.5",
        ),
    ]

    def applies(self, case: Case) -> bool:
        return case.dims.get("weight") == "nvfp4"

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        c = moe_config(case)
        gen = generator(seed)
        _, _, ids, _ = routing(c, gen, device)
        x = randn((c["T"], c["H"]), gen, device)
        e = c["E"]
        _, _, _, gs = quantized_activation(x)
        rows = _sorted_rows(ids, x, e)
        return {
            "topk_ids": ids,
            "a_sorted": rows["a"],
            "expert_counts": rows["counts"],
            "expert_offsets": rows["offsets"],
            "blockscale_offsets": rows["bs_offsets"],
            "a_gs": gs.reshape(1).expand(e).contiguous(),  # one global scale per expert, all equal
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> Refs:
        a, gs = inputs["a_sorted"], inputs["a_gs"][0]
        meta = {
            "counts": inputs["expert_counts"].cpu(),
            "offsets": inputs["expert_offsets"].cpu(),
            "bs_offsets": inputs["blockscale_offsets"].cpu(),
        }
        return Refs("w4a4", {"w4a4": lambda: fp4.quantize_nvfp4(a, gs)}, meta)

    def _decode(
        self, value: Any, layout: str | None, meta: dict[str, Any], h: int
    ) -> tuple[torch.Tensor, ...]:
        counts = meta["counts"].long()
        k16 = h // 16
        if layout == "linear":  # the torch reference itself
            return value[0].cpu(), value[1].cpu()
        if layout == "masked":  # x_q logical [m, H/2, E]; scales logical (32, 4, rm, 4, rk, E)
            x_q = value[0].permute(2, 0, 1).cpu()  # [E, max_m, H/2]
            e, max_m = x_q.shape[0], x_q.shape[1]
            sf = value[1].permute(5, 2, 4, 0, 1, 3).contiguous().view(torch.uint8).reshape(e, -1).cpu()
            sf = fp4.unswizzle_scales(sf, max_m, k16)  # [E, max_m, H/16]
            keep = torch.arange(max_m).unsqueeze(0) < counts.unsqueeze(1)
            return x_q[keep], sf[keep]
        # "aot": rows already sorted; expert e's scales start at row blockscale_offsets[e] (unverified)
        x_q = value[0].view(torch.uint8).cpu()
        cp = fp4.swizzled_shape(1, k16)[1]
        flat = value[1].contiguous().view(torch.uint8).flatten().cpu()
        parts = []
        for e, n in enumerate(counts.tolist()):
            if n:
                start = int(meta["bs_offsets"][e]) * cp
                block = flat[start : start + fp4.round_up(n, 128) * cp]
                parts.append(fp4.unswizzle_scales(block, n, k16))
        return x_q, torch.cat(parts)

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        value, _, layout = untag(out, "w4a4")
        ref_packed, ref_sf = ref.get("w4a4")
        h = ref_packed.shape[1] * 2
        packed, sf = self._decode(value, layout, ref.meta, h)
        if packed.shape != ref_packed.shape:
            return Check(
                False, float("inf"), 0.0, f"decoded {tuple(packed.shape)}, expected {tuple(ref_packed.shape)}"
            )
        got = fp4.dequantize_nvfp4(packed, sf)
        want = fp4.dequantize_nvfp4(ref_packed.cpu(), ref_sf.cpu())
        err = rel_error(got, want)
        differ = (packed != ref_packed.cpu()).float().mean().item()
        return Check(
            err <= 1e-2, err, 1e-2, f"dequantised rel err {err:.2e}; data bytes differing {differ:.2%}"
        )

    def traffic(self, case: Case) -> Traffic:
        c = moe_config(case)
        n = c["T"] * c["K"] * c["H"]
        return Traffic(2 * n + fp4.nvfp4_bytes(n), 4 * n, "bf16 [T*K, H] in, NVFP4 out (scales unpadded)")
