"""NVFP4 adapters (sm100 kernels and their Hopper Marlin rows), on CPU: inputs, references, checks,
traffic, arch gating, and what each bind hands the kernel (GPU libraries replaced by recording stubs)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from dskbench.adapters import adapters, get_adapter
from dskbench.adapters.common import nvfp4 as fp4
from dskbench.adapters.common.nvfp4_adapter import Refs, Tagged
from dskbench.adapters.common.routing import grouped_topk
from dskbench.adapters.moe import nvfp4_common, nvfp4_group_mm
from dskbench.device.info import DeviceInfo
from dskbench.shapes.cases import Case, default_shapes

KERNELS = (
    "cutlass_scaled_fp4_mm",
    "mm_fp4",
    "scaled_fp4_quant",
    "fp4_quantize",
    "mxfp4_quantize",
    "nvfp4_block_scale_interleave",
    "scaled_fp4_experts_quant",
    "cutlass_fp4_group_mm",
    "trtllm_fp4_block_scale_moe",
)
NVFP4_OPS = ("o_proj", "gate_up_proj", "down_proj", "shared_experts", "experts")
H100 = DeviceInfo("cuda", "NVIDIA H100", 90, 1)
B200 = DeviceInfo("cuda", "NVIDIA B200", 100, 1)
TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
# The only backends of these kernels that run on Hopper: Marlin (the Hopper path) and a weight-prep kernel.
RUNS_ON_SM90 = {
    ("cutlass_scaled_fp4_mm", "sglang_jit.marlin"),
    ("cutlass_fp4_group_mm", "sglang_jit.marlin_moe"),
    ("cutlass_fp4_group_mm", "sglang.fused_marlin_moe"),
    ("nvfp4_block_scale_interleave", "flashinfer"),
}


MODEL = dict(default_shapes().config)  # the model symbols a planned case carries (n_group, ...)


def small_moe_case(kernel: str, t: int = 5) -> Case:
    dims = {"T": t, "H": 128, "I": 64, "E": 16, "K": 8, "weight": "nvfp4"}
    return Case(kernel, "experts", "decode", {"T": t}, dims, model=MODEL)


def small_gemm_case(kernel: str, m: int = 3, n: int = 128, k: int = 64) -> Case:
    return Case(kernel, "o_proj", "decode", {"T": m}, {"M": m, "K": k, "N": n, "weight": "nvfp4"})


def cpu_cases(kernel: str, op: str, phase: str = "decode") -> list[Case]:
    a = get_adapter(kernel)
    return [c for c in default_shapes().cases(kernel, [op], a.role, phase, profile="cpu") if a.applies(c)]


# -- registration, targets, gating ------------------------------------------------------------------


# each kernel lives in its family's folder: GEMMs, quantisers, MoE
MODULES = {
    "cutlass_scaled_fp4_mm": "gemm.nvfp4_gemm",
    "mm_fp4": "gemm.nvfp4_gemm",
    "nvfp4_block_scale_interleave": "gemm.nvfp4_scale_interleave",
    "scaled_fp4_quant": "quant.nvfp4_quant",
    "fp4_quantize": "quant.nvfp4_quant",
    "mxfp4_quantize": "quant.nvfp4_quant",
    "scaled_fp4_experts_quant": "moe.nvfp4_experts_quant",
    "cutlass_fp4_group_mm": "moe.nvfp4_group_mm",
    "trtllm_fp4_block_scale_moe": "moe.nvfp4_trtllm",
}


def test_every_kernel_has_its_adapter() -> None:
    reg = adapters()
    assert set(MODULES) == set(KERNELS)
    for k in KERNELS:
        assert k in reg and reg[k].__module__ == f"dskbench.adapters.{MODULES[k]}"


@pytest.mark.parametrize("kernel", KERNELS)
def test_backend_targets_are_well_formed(kernel: str) -> None:
    backends = get_adapter(kernel).backends
    assert len({b.name for b in backends}) == len(backends)
    for b in backends:
        for t in (b.target, *b.fallbacks):
            assert TARGET.match(t), t
        assert b.package in {"flashinfer-python", "sglang-kernel", "sglang"}


@pytest.mark.parametrize("kernel", KERNELS)
def test_sm100_backends_are_gated_on_hopper(kernel: str) -> None:
    for b in get_adapter(kernel).backends:
        if (kernel, b.name) in RUNS_ON_SM90:
            assert b.requires.reason_unmet(H100) is None
            continue
        reason = b.requires.reason_unmet(H100)
        assert reason is not None and reason.startswith("needs sm100") and reason.endswith("(found sm90)")
        assert b.requires.reason_unmet(B200) is None
        assert b.requires.reason_unmet(DeviceInfo("cpu")) is not None


def test_every_nvfp4_op_has_a_hopper_row() -> None:
    covered = set()
    for k in KERNELS:
        a = get_adapter(k)
        hopper = [b for b in a.backends if (b.label or "").startswith("Hopper path:")]
        for b in hopper:
            assert b.extra.get("numerics") == "w4a16" and (k, b.name) in RUNS_ON_SM90
        if hopper:
            covered.update(a.ops)
    assert covered >= set(NVFP4_OPS)


def test_gemm_applies_only_to_nvfp4_projections() -> None:
    a = get_adapter("cutlass_scaled_fp4_mm")
    s = default_shapes()
    ops = ["o_proj", "q_b_proj", "fused_qkv_a_proj_with_mqa", "gate", "shared_experts", "down_proj"]
    kept = {c.op for c in s.cases(a.kernel, ops, "gemm", "decode", profile="cpu") if a.applies(c)}
    assert kept == {"o_proj", "shared_experts", "down_proj"}
    quant = get_adapter("scaled_fp4_quant")
    kept = {c.op for c in s.cases(quant.kernel, ops, "quant", "decode", profile="cpu") if quant.applies(c)}
    assert kept == {"o_proj", "shared_experts", "down_proj"}


def test_block_scale_interleave_runs_once_per_weight() -> None:
    a = get_adapter("nvfp4_block_scale_interleave")
    s = default_shapes()
    cases = [c for c in s.cases(a.kernel, list(a.ops), "gemm", "decode", profile="cpu") if a.applies(c)]
    assert sorted((c.op, c.variant) for c in cases) == sorted(
        [("o_proj", None), ("gate_up_proj", None), ("down_proj", None), ("shared_experts", "gate_up"),
         ("shared_experts", "down")]
    )  # fmt: skip
    assert not [c for c in s.cases(a.kernel, list(a.ops), "gemm", "prefill", profile="cpu") if a.applies(c)]


# -- inputs at DeepSeek shapes ------------------------------------------------------------------------


def test_gemm_inputs_at_o_proj() -> None:
    a = get_adapter("cutlass_scaled_fp4_mm")
    case = cpu_cases(a.kernel, "o_proj")[0]  # T = 1, K = 16384, N = 7168
    x = a.make_inputs(case, "cpu", 0)
    assert x["x"].dtype == torch.bfloat16 and x["x"].shape == (1, 16384)
    assert x["x_fp4"].dtype == torch.uint8 and x["x_fp4"].shape == (1, 8192)
    assert x["x_sf"].dtype == torch.float8_e4m3fn and x["x_sf"].shape == (1, 1024)
    assert x["w"].dtype == torch.uint8 and x["w"].shape == (7168, 8192)
    assert x["w_sf"].dtype == torch.float8_e4m3fn and x["w_sf"].shape == (7168, 1024)
    for name in ("weight_scale_2", "input_scale", "alpha"):
        assert x[name].dtype == torch.float32 and x[name].numel() == 1
    assert torch.allclose(x["alpha"], x["input_scale"] * x["weight_scale_2"])
    assert torch.isclose(x["input_scale"] * 448 * 6, x["x"].float().abs().max())
    assert x["w_sf"].float().min() > 0 and x["w_sf"].float().max() <= 448


def test_quant_inputs_cover_the_shared_expert_down_input() -> None:
    a = get_adapter("scaled_fp4_quant")
    cases = {c.variant: c for c in cpu_cases(a.kernel, "shared_experts") if c.point["T"] == 1}
    assert cases["down"].dims["K"] == 2048 and cases["gate_up"].dims["K"] == 7168
    x = a.make_inputs(cases["down"], "cpu", 0)
    assert x["x"].dtype == torch.bfloat16 and x["x"].shape == (1, 2048)
    assert x["global_scale"].dtype == torch.float32 and x["global_scale"].shape == (1,)


def test_moe_inputs_at_deepseek_shape() -> None:
    a = get_adapter("trtllm_fp4_block_scale_moe")
    case = cpu_cases(a.kernel, "experts")[0]  # T = 1, H = 7168, I = 2048, E = 256, K = 8
    x = a.make_inputs(case, "cpu", 0)
    assert x["routing_logits"].dtype == torch.float32 and x["routing_logits"].shape == (1, 256)
    assert x["routing_bias"].dtype == torch.bfloat16 and x["routing_bias"].shape == (256,)
    assert x["x_fp4"].shape == (1, 3584) and x["x_sf"].shape == (1, 448)
    assert x["x_sf"].dtype == torch.float8_e4m3fn
    assert x["w13"].dtype == torch.uint8 and x["w13"].shape == (256, 4096, 3584)
    assert x["w13_sf"].dtype == torch.float8_e4m3fn and x["w13_sf"].shape == (256, 4096, 448)
    assert x["w2"].shape == (256, 7168, 1024) and x["w2_sf"].shape == (256, 7168, 128)
    assert x["w13_ws2"].shape == (256,) and x["w2_ws2"].dtype == torch.float32
    assert x["topk_ids"].dtype == torch.int32 and x["topk_ids"].shape == (1, 8)
    assert x["a2_scale"].dtype == torch.float32 and x["a2_scale"] > 0
    del x


def test_deepseek_routing_matches_a_brute_force_selection() -> None:
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 256, generator=g)
    bias = (0.1 * torch.randn(256, generator=g)).to(torch.bfloat16)
    w, ids = grouped_topk(logits, bias, 8, 8, 4)
    for t in range(4):
        s = torch.sigmoid(logits[t]) + bias.float()
        group_score = [sorted(s[g * 32 : (g + 1) * 32].tolist())[-2:] for g in range(8)]
        groups = sorted(range(8), key=lambda g: -sum(group_score[g]))[:4]
        cand = [e for g in groups for e in range(g * 32, (g + 1) * 32)]
        want = sorted(cand, key=lambda e: -float(s[e]))[:8]
        assert sorted(ids[t].tolist()) == sorted(want)
        sig = torch.sigmoid(logits[t])[ids[t].long()]
        assert torch.allclose(w[t], sig / sig.sum())


def test_moe_inputs_route_with_the_shared_grouped_topk_and_the_cases_model() -> None:
    a = get_adapter("trtllm_fp4_block_scale_moe")
    case = small_moe_case(a.kernel, t=7)
    x = a.make_inputs(case, "cpu", 3)
    w, ids = grouped_topk(x["routing_logits"], x["routing_bias"], 8, MODEL["n_group"], MODEL["topk_group"])
    assert torch.equal(x["topk_ids"], ids) and torch.equal(x["topk_weights"], w)
    # the routing constants are the case's model symbols, not the shapes file's
    model = {**MODEL, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 1.5}
    y = a.make_inputs(Case(a.kernel, "experts", "decode", {"T": 7}, case.dims, model=model), "cpu", 3)
    assert (y["n_group"], y["topk_group"], y["routed_scaling_factor"]) == (4, 2, 1.5)
    assert torch.equal(y["topk_ids"], grouped_topk(y["routing_logits"], y["routing_bias"], 8, 4, 2)[1])


def test_routing_loads_are_uneven() -> None:
    x = get_adapter("scaled_fp4_experts_quant").make_inputs(
        Case("scaled_fp4_experts_quant", "experts", "prefill", {"T": 512}, {"T": 512, "H": 64, "I": 64, "E": 256, "K": 8}, model=MODEL),
        "cpu",
        0,
    )  # fmt: skip
    counts = x["expert_counts"]
    assert int(counts.sum()) == 512 * 8 and int(counts.max()) > 3 * 16  # mean load is 16 per expert


# -- references on hand-checkable inputs -----------------------------------------------------------


def _deq64(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return fp4.dequantize_nvfp4(packed, scales).double()


def test_gemm_references_against_float64() -> None:
    a = get_adapter("cutlass_scaled_fp4_mm")
    case = small_gemm_case(a.kernel)
    x = a.make_inputs(case, "cpu", 7)
    ref = a.reference(x, case)
    w4a4 = (_deq64(x["x_fp4"], x["x_sf"]) @ _deq64(x["w"], x["w_sf"]).T) * float(x["alpha"])
    w4a16 = x["x"].double() @ (_deq64(x["w"], x["w_sf"]) * float(x["weight_scale_2"])).T
    assert ref.get("w4a4").shape == (3, 128) and ref.get("w4a4").dtype == torch.float32
    assert ((ref.get("w4a4").double() - w4a4).norm() / w4a4.norm()) < 1e-6
    assert ((ref.get("w4a16").double() - w4a16).norm() / w4a16.norm()) < 1e-6
    # the two numerics differ by the activation quantisation error (~10 %): a check must tell them apart
    assert ((w4a4 - w4a16).norm() / w4a16.norm()) > 0.03


def test_check_uses_the_backends_numerics() -> None:
    a = get_adapter("cutlass_scaled_fp4_mm")
    case = small_gemm_case(a.kernel)
    x = a.make_inputs(case, "cpu", 8)
    ref = a.reference(x, case)
    w4a4, w4a16 = ref.get("w4a4").bfloat16(), ref.get("w4a16").bfloat16()
    assert a.check(w4a4, ref, case).ok
    assert a.check(Tagged(w4a16, "w4a16"), ref, case).ok
    assert not a.check(w4a16, ref, case).ok  # a Marlin result is not a W4A4 result
    assert not a.check(Tagged(w4a4, "w4a16"), ref, case).ok
    assert a.check(a.reference_backend().bind(None, x, case)(), ref, case).ok  # torch-ref


def test_refs_compute_only_what_is_asked() -> None:
    calls: list[str] = []
    r = Refs("a", {"a": lambda: calls.append("a") or 1, "b": lambda: calls.append("b") or 2})
    assert calls == ["a"]
    assert r.get("b") == 2 and r.get("b") == 2 and calls == ["a", "b"]


@pytest.mark.parametrize("kernel", ["cutlass_fp4_group_mm", "trtllm_fp4_block_scale_moe"])
def test_moe_reference_against_a_naive_loop(kernel: str) -> None:
    a = get_adapter(kernel)
    case = small_moe_case(kernel)
    x = a.make_inputs(case, "cpu", 9)
    ref = a.reference(x, case)
    e_used = torch.unique(x["topk_ids"].long()).tolist()
    gs1, gs2 = 1 / x["a1_scale"], 1 / x["a2_scale"]
    for numerics, quant in (("w4a4", True), ("w4a16", False)):
        want = torch.zeros(5, 128, dtype=torch.float64)
        for t in range(5):
            xt = x["x"][t : t + 1].float()
            if quant:
                xt = fp4.dequantize_nvfp4(*fp4.quantize_nvfp4(xt, gs1), gs1)
            for j in range(8):
                e = int(x["topk_ids"][t, j])
                assert e in e_used
                w1 = _deq64(x["w13"][e], x["w13_sf"][e]) * float(x["w13_ws2"][e])
                w2 = _deq64(x["w2"][e], x["w2_sf"][e]) * float(x["w2_ws2"][e])
                h = xt.double() @ w1.T
                act = torch.nn.functional.silu(h[:, :64]) * h[:, 64:]
                if quant:
                    act = fp4.dequantize_nvfp4(*fp4.quantize_nvfp4(act.float(), gs2), gs2).double()
                want[t] += float(x["topk_weights"][t, j]) * (act @ w2.T)[0]
        want *= 2.5
        got = ref.get(numerics)
        assert got.shape == (5, 128) and ((got.double() - want).norm() / want.norm()) < 1e-5, numerics


def test_moe_check_tolerances() -> None:
    a = get_adapter("cutlass_fp4_group_mm")
    case = small_moe_case(a.kernel)
    x = a.make_inputs(case, "cpu", 10)
    ref = a.reference(x, case)
    assert a.check(ref.get("w4a4").bfloat16(), ref, case).ok
    assert a.check(Tagged(ref.get("w4a16").bfloat16(), "w4a16"), ref, case).ok
    swap = nvfp4_group_mm._swap_halves
    swapped = nvfp4_common.moe_refs({**x, "w13": swap(x["w13"]), "w13_sf": swap(x["w13_sf"])})
    assert not a.check(swapped.get("w4a4").bfloat16(), ref, case).ok  # gate/up order matters


def test_quant_reference_and_check() -> None:
    a = get_adapter("scaled_fp4_quant")
    case = Case(a.kernel, "o_proj", "decode", {"T": 3}, {"T": 3, "K": 64})
    x = a.make_inputs(case, "cpu", 11)
    ref = a.reference(x, case)
    packed, sf = ref.get("w4a4")
    assert packed.shape == (3, 32) and sf.shape == (3, 4) and sf.dtype == torch.float8_e4m3fn
    # what flashinfer returns: uint8 data + the 128x4-swizzled scales as a [128, 4] uint8 matrix
    good = (packed.clone(), fp4.swizzle_scales(sf).view(torch.uint8))
    assert a.check(good, ref, case).ok
    wrong_layout = (packed.clone(), torch.nn.functional.pad(sf.view(torch.uint8), (0, 0, 0, 125)))
    assert not a.check(wrong_layout, ref, case).ok
    flipped = (packed ^ 0x11, good[1])  # every value's magnitude code changes
    assert not a.check(flipped, ref, case).ok


def test_mxfp4_check_reads_swizzled_ue8m0_scales() -> None:
    a = get_adapter("mxfp4_quantize")
    case = Case(a.kernel, "o_proj", "decode", {"T": 2}, {"T": 2, "K": 128})
    x = a.make_inputs(case, "cpu", 12)
    ref = a.reference(x, case)
    packed, sf = ref.get("w4a4")
    assert sf.dtype == torch.uint8 and sf.shape == (2, 4)
    assert a.check((packed, fp4.swizzle_scales(sf)), ref, case).ok
    assert not a.check((packed, fp4.swizzle_scales(sf + 1)), ref, case).ok


def test_block_scale_interleave_reference_is_exact() -> None:
    a = get_adapter("nvfp4_block_scale_interleave")
    case = small_gemm_case(a.kernel, m=1, n=200, k=96)  # N not a multiple of 128, K/16 = 6
    x = a.make_inputs(case, "cpu", 13)
    ref = a.reference(x, case)
    assert x["w_sf"].dtype == torch.uint8 and ref.shape == (256 * 8,)
    assert torch.equal(fp4.unswizzle_scales(ref, 200, 6), x["w_sf"])
    assert a.check(ref.clone(), ref, case).ok
    assert not a.check(torch.roll(ref, 1), ref, case).ok


def _flashinfer_masked_layout(packed: torch.Tensor, sf: torch.Tensor, counts: torch.Tensor, k: int):
    """Lay a reference out exactly as scaled_fp4_grouped_quant_sm100 returns it."""
    e, max_m = counts.numel(), int(counts.max())
    mp, kp = fp4.swizzled_shape(max_m, k // 16)
    out = torch.zeros(e, max_m, k // 2, dtype=torch.uint8)
    scales = torch.zeros(e, mp, kp, dtype=torch.uint8)
    start = 0
    for i, n in enumerate(counts.tolist()):
        out[i, :n] = packed[start : start + n]
        lin = torch.zeros(max_m, k // 16, dtype=torch.uint8)
        lin[:n] = sf[start : start + n].view(torch.uint8)
        scales[i] = fp4.swizzle_scales(lin)
        start += n
    physical = scales.view(torch.float8_e4m3fn).view(e, mp // 128, kp // 4, 32, 4, 4)
    logical_sf = physical.permute(3, 4, 1, 5, 2, 0)
    return out.permute(1, 2, 0), logical_sf


def test_experts_quant_decodes_both_layouts() -> None:
    a = get_adapter("scaled_fp4_experts_quant")
    case = small_moe_case(a.kernel, t=20)
    x = a.make_inputs(case, "cpu", 14)
    assert x["a_sorted"].shape == (160, 128) and x["a_gs"].shape == (16,)
    assert x["expert_offsets"].dtype == torch.int32 and int(x["expert_offsets"][-1]) == 160
    assert (x["blockscale_offsets"] % 128 == 0).all()
    ids = x["topk_ids"].reshape(-1).long()
    expert_of_row = torch.repeat_interleave(torch.arange(16), x["expert_counts"].long())
    assert torch.equal(expert_of_row, torch.sort(ids).values)  # rows grouped by expert
    ref = a.reference(x, case)
    packed, sf = ref.get("w4a4")
    masked = _flashinfer_masked_layout(packed, sf, x["expert_counts"], 128)
    assert a.check(Tagged(masked, layout="masked"), ref, case).ok
    # the old AOT layout: expert e's swizzled scales start at row blockscale_offsets[e]
    total = int(x["blockscale_offsets"][-1])
    aot_sf = torch.zeros(total, 8, dtype=torch.uint8)
    for e in range(16):
        lo, hi = int(x["expert_offsets"][e]), int(x["expert_offsets"][e + 1])
        if hi > lo:
            blk = fp4.swizzle_scales(sf[lo:hi].view(torch.uint8))
            b0 = int(x["blockscale_offsets"][e])
            aot_sf[b0 : b0 + blk.shape[0]] = blk
    assert a.check(Tagged((packed, aot_sf.view(torch.float8_e4m3fn)), layout="aot"), ref, case).ok
    assert not a.check(Tagged((packed, torch.roll(aot_sf, 1, 0)), layout="aot"), ref, case).ok


# -- traffic ---------------------------------------------------------------------------------------


def test_gemm_traffic_at_o_proj() -> None:
    a = get_adapter("cutlass_scaled_fp4_mm")
    case = cpu_cases(a.kernel, "o_proj")[0]
    tr = a.traffic(case)
    # 0.5625 (MK + KN) + 2 MN bytes; o_proj weight 66,060,288 B, FLOPs 234,881,024 T
    assert tr.bytes == 66_060_288 + 9216 + 2 * 7168 and tr.flops == 234_881_024
    assert tr.compute == "fp4"
    marlin = a.traffic_for("sglang_jit.marlin", case)
    assert marlin.bytes == 66_060_288 + 2 * 16384 + 2 * 7168  # W4A16: bf16 activation
    assert marlin.compute == "bf16" and marlin.flops == tr.flops
    assert a.traffic_for("flashinfer.cutlass", case) == tr


def test_moe_traffic_at_decode() -> None:
    a = get_adapter("cutlass_fp4_group_mm")
    case = cpu_cases(a.kernel, "experts")[0]  # T = 1: exactly 8 experts
    tr = a.traffic(case)
    # gate, up and down: 3 x 7168 x 2048 x 0.5625 B
    assert nvfp4_common.expert_weight_bytes(7168, 2048) == 24_772_608
    assert tr.flops == 704_643_072  # 8 experts x 3 GEMMs x 2 x 7168 x 2048 per token
    assert tr.bytes == 8 * 24_772_608 + 4 * 7168 + 8 * 8 and tr.compute == "fp4"
    hopper = a.traffic_for("sglang_jit.marlin_moe", case)
    assert hopper.bytes == tr.bytes and hopper.compute == "bf16"
    t = get_adapter("trtllm_fp4_block_scale_moe").traffic(case)
    assert t.bytes == 8 * 24_772_608 + fp4.nvfp4_bytes(7168) + 4 * 256 + 2 * 256 + 2 * 7168
    assert math.isclose(nvfp4_common.expected_active_experts(10**6, 256, 8), 256)


def test_quant_traffic() -> None:
    a = get_adapter("scaled_fp4_quant")
    case = cpu_cases(a.kernel, "o_proj")[0]
    assert a.traffic(case).bytes == 2 * 16384 + 8192 + 1024


def test_dequantize_nvfp4_weights_is_dequantize_nvfp4_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(13)
    packed = torch.randint(0, 256, (3, 32, 64), generator=g, dtype=torch.uint8)
    sf = torch.arange(256, dtype=torch.uint8).repeat(3).reshape(3, 32, 8)  # every e4m3 byte, NaNs too
    gs = torch.tensor([2.6e4, 3.1e4, 1.0])
    got = fp4.dequantize_nvfp4_weights(packed, sf.view(torch.float8_e4m3fn), gs)
    want = torch.stack(
        [fp4.dequantize_nvfp4(packed[i], sf[i].view(torch.float8_e4m3fn), gs[i]) for i in range(3)]
    )
    assert got.shape == (3, 32, 128) and torch.equal(got.view(torch.int32), want.view(torch.int32))
    one = fp4.dequantize_nvfp4_weights(packed[1], sf[1], gs[1])  # a single weight, uint8 scales
    assert torch.equal(one.view(torch.int32), want[1].view(torch.int32))


def _moe_by_expert(x: dict, gs: tuple | None) -> torch.Tensor:
    """moe_reference's sum written expert by expert, each weight decoded with dequantize_nvfp4."""
    xf = x["x"].float() if gs is None else fp4.dequantize_nvfp4(*fp4.quantize_nvfp4(x["x"], gs[0]), gs[0])
    out = torch.zeros(xf.shape)
    flat = x["topk_ids"].reshape(-1).long()
    for e in sorted(set(flat.tolist())):
        rows = (flat == e).nonzero().squeeze(1)
        tok, w = rows // x["topk_ids"].shape[1], x["topk_weights"].reshape(-1)[rows].unsqueeze(1)
        w1 = fp4.dequantize_nvfp4(x["w13"][e], x["w13_sf"][e], 1.0 / x["w13_ws2"][e].float())
        w2 = fp4.dequantize_nvfp4(x["w2"][e], x["w2_sf"][e], 1.0 / x["w2_ws2"][e].float())
        act = fp4.silu_and_mul(xf[tok] @ w1.T)
        if gs is not None:
            act = fp4.dequantize_nvfp4(*fp4.quantize_nvfp4(act, gs[1]), gs[1])
        out.index_add_(0, tok, (act @ w2.T) * w)
    return out * x["routed_scaling_factor"]


@pytest.mark.parametrize(("t", "chunk"), [(5, 8), (16, 3)])
def test_moe_references_decode_in_chunks_without_changing_the_result(
    t: int, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fp4, "MOE_DEQUANT_CHUNK", chunk)
    a = get_adapter("cutlass_fp4_group_mm")
    case = small_moe_case(a.kernel, t)
    x = a.make_inputs(case, "cpu", 21)
    assert torch.unique(x["topk_ids"]).numel() > chunk  # several chunks, the last one short
    ref = a.reference(x, case)
    gs = (1.0 / x["a1_scale"], 1.0 / x["a2_scale"])
    assert torch.equal(ref.get("w4a4"), _moe_by_expert(x, gs))
    assert torch.equal(ref.get("w4a16"), _moe_by_expert(x, None))


def test_moe_reference_computes_only_the_numerics_this_gpu_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """On Hopper only the Marlin (W4A16) backends run: the W4A4 oracle, half the reference's time there,
    is computed only if something asks for it. On a CPU (and on sm100) both are computed in one pass."""
    from types import SimpleNamespace

    a = get_adapter("cutlass_fp4_group_mm")
    gpu = SimpleNamespace(type="cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda _d=None: (9, 0))
    assert a.numerics_here(gpu) == {"w4a16"}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda _d=None: (10, 0))
    assert a.numerics_here(gpu) == {"w4a4", "w4a16"}
    assert a.numerics_here(torch.device("cpu")) == {"w4a4", "w4a16"}
    case = small_moe_case(a.kernel)
    x, asked, real = a.make_inputs(case, "cpu", 9), [], fp4.moe_references
    monkeypatch.setattr(
        fp4, "moe_references", lambda *args, **kw: asked.append(len(args[5])) or real(*args, **kw)
    )
    both = a.reference(x, case)
    assert asked == [2]  # a CPU: both numerics in one pass
    monkeypatch.setattr(type(a), "numerics_here", lambda self, device: {"w4a16"})
    asked.clear()
    hopper = a.reference(x, case)
    assert asked == [1]  # W4A16 alone
    assert torch.equal(hopper.get("w4a16"), both.get("w4a16"))
    assert torch.equal(hopper.get("w4a4"), both.get("w4a4")) and asked == [1, 1]  # asked for: computed then
