"""The NVFP4 adapters' binds on the CPU: what each hands the kernels, checked against the libraries' own
argument checks with stand-ins."""

from __future__ import annotations

import enum
import sys
import types
from typing import Any

import pytest
import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.common import marlin
from dskbench.adapters.common import nvfp4 as fp4
from dskbench.adapters.common.nvfp4_adapter import Tagged
from dskbench.adapters.gemm import nvfp4_gemm
from dskbench.adapters.moe import nvfp4_common, nvfp4_experts_quant, nvfp4_group_mm, nvfp4_trtllm
from dskbench.adapters.quant import nvfp4_quant
from dskbench.shapes.cases import Case
from tests.test_adapters_nvfp4 import small_gemm_case, small_moe_case

# -- what the binds hand the kernels (GPU libraries stubbed) ----------------------------------------


def is_(t: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> bool:
    return t.dtype == dtype and tuple(t.shape) == shape


class Recorder:
    def __init__(self, result: Any = None):
        self.calls: list[tuple[tuple, dict]] = []
        self.result = result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        return self.result(*args, **kwargs) if callable(self.result) else self.result


def test_mm_fp4_bind_matches_flashinfer_checks() -> None:
    a = get_adapter("cutlass_scaled_fp4_mm")
    case = small_gemm_case(a.kernel, m=3, n=256, k=128)
    x = a.make_inputs(case, "cpu", 15)
    fn = Recorder()
    nvfp4_gemm._bind_mm_fp4("cutlass")(fn, x, case)()
    (a_, b, a_sf, b_sf, alpha, dtype, out), kw = fn.calls[0]
    # flashinfer gemm_base._check_mm_fp4_problem_size + the cutlass backend's layout
    assert a_.ndim == b.ndim == 2 and a_.shape[1] == b.shape[0] == 64
    assert a_.dtype == b.dtype == torch.uint8
    assert b.shape == (64, 256) and b.stride() == (1, 64)  # column-major view of the [N, K/2] weight
    assert a_sf.dtype == torch.uint8 and a_sf.shape == (128, 8)
    assert b_sf.dtype == torch.float8_e4m3fn and b_sf.shape == (8, 256)
    assert torch.equal(fp4.unswizzle_scales(b_sf.T, 256, 8), x["w_sf"])
    assert alpha.dtype == torch.float32 and alpha.numel() == 1
    assert dtype == torch.bfloat16 and out.shape == (3, 256) and out.dtype == torch.bfloat16
    assert kw == {"backend": "cutlass"}


def test_aot_and_quant_binds() -> None:
    a = get_adapter("cutlass_scaled_fp4_mm")
    case = small_gemm_case(a.kernel)
    x = a.make_inputs(case, "cpu", 16)
    fn = Recorder()
    nvfp4_gemm._bind_aot_fp4_mm(fn, x, case)()
    (a_, b, a_sf, b_sf, alpha, dtype), _ = fn.calls[0]
    assert b.shape == (128, 32) and a_sf.shape == (128, 4) and a_sf.dtype == torch.float8_e4m3fn
    q = get_adapter("fp4_quantize")
    qc = Case(q.kernel, "o_proj", "decode", {"T": 2}, {"T": 2, "K": 64})
    qx = q.make_inputs(qc, "cpu", 0)
    fn = Recorder()
    nvfp4_quant._bind_fi_fp4_quantize("cute-dsl")(fn, qx, qc)()
    (inp, gs, vec, ue8m0, swizzled), kw = fn.calls[0]
    assert inp.dtype == torch.bfloat16 and gs.dtype == torch.float32 and gs.shape == (1,)
    assert (vec, ue8m0, swizzled, kw) == (16, False, True, {"backend": "cute-dsl"})


def test_grouped_quant_bind_builds_the_masked_layout() -> None:
    a = get_adapter("scaled_fp4_experts_quant")
    case = small_moe_case(a.kernel, t=12)
    x = a.make_inputs(case, "cpu", 17)
    fn = Recorder()
    nvfp4_experts_quant._bind_fi_grouped_quant(fn, x, case)()
    (masked, mask, gs), _ = fn.calls[0]
    counts = x["expert_counts"]
    assert masked.shape == (16, int(counts.max()), 128) and masked.dtype == torch.bfloat16
    assert mask.dtype == torch.int32 and torch.equal(mask, counts) and gs.shape == (16,)
    start = 0
    for e, n in enumerate(counts.tolist()):
        assert torch.equal(masked[e, :n], x["a_sorted"][start : start + n])
        start += n


@pytest.fixture
def fake_gpu_libs(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Stand-ins for flashinfer / sgl_kernel / sglang.jit_kernel with the real functions' output shapes."""

    class ActivationType(enum.IntEnum):
        Swiglu = 3

    def repack(b_q_weight, perm, size_k, size_n, num_bits):  # gptq_marlin_repack's allocation
        assert b_q_weight.dtype == torch.int32 and b_q_weight.shape == (size_k // 8, size_n) and num_bits == 4
        return torch.zeros((size_k // 16, size_n * 16 // 8), dtype=torch.int32)

    mods = {
        "flashinfer": {
            "nvfp4_block_scale_interleave": lambda t: fp4.swizzle_scales(t).flatten(),
            "shuffle_matrix_a": lambda t, tile: t,
            "shuffle_matrix_sf_a": lambda t, tile: fp4.swizzle_scales(t).flatten(),
        },
        "flashinfer.fused_moe": {"ActivationType": ActivationType},
        "flashinfer.fused_moe.core": {
            "_maybe_get_cached_w3_w1_permute_indices": lambda c, w, tile, num_elts_per_sf=None, is_gated_act_gemm=True: torch.arange(w.shape[0]),
            "get_w2_permute_indices_with_cache": lambda c, w, tile, num_elts_per_sf=None: torch.arange(w.shape[0]),
        },
        "sgl_kernel": {},
        "sgl_kernel.scalar_type": {"scalar_types": types.SimpleNamespace(float4_e2m1f="float4_e2m1f")},
        "sgl_kernel.moe": {"moe_align_block_size": Recorder(), "moe_sum_reduce": Recorder()},
        "sglang": {},
        "sglang.jit_kernel": {},
        "sglang.jit_kernel.gptq_marlin_repack": {"gptq_marlin_repack": repack},
        "sglang.jit_kernel.activation": {"silu_and_mul": Recorder()},
    }  # fmt: skip
    for name, attrs in mods.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))
    monkeypatch.setattr(marlin, "sms", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    return {n: types.SimpleNamespace(**m) for n, m in mods.items()}


def test_marlin_gemm_bind(fake_gpu_libs: dict[str, Any]) -> None:
    a = get_adapter("cutlass_scaled_fp4_mm")
    case = small_gemm_case(a.kernel, m=4, n=128, k=256)
    x = a.make_inputs(case, "cpu", 18)
    fn = Recorder(torch.zeros(4, 128, dtype=torch.bfloat16))
    out = nvfp4_gemm._bind_marlin_gemm(fn, x, case)()
    assert isinstance(out, Tagged) and out.numerics == "w4a16"
    _, kw = fn.calls[0]
    assert kw["a"] is x["x"] and kw["c"] is None
    assert kw["b_q_weight"].shape == (256 // 16, 128 * 2) and kw["b_q_weight"].dtype == torch.int32
    assert kw["b_scales"].dtype == torch.float8_e4m3fn and kw["b_scales"].shape == (256 // 16, 128)
    gs = kw["global_scale"]
    assert gs.dtype == torch.bfloat16 and gs.shape == (1,)
    assert float(gs) == float(x["weight_scale_2"].bfloat16()) * 2.0**119
    assert (kw["size_m"], kw["size_n"], kw["size_k"]) == (4, 128, 256)
    assert kw["b_q_type"] == "float4_e2m1f" and kw["use_fp32_reduce"] and kw["is_k_full"]
    assert kw["use_atomic_add"] is False  # k < 2048


def test_marlin_moe_bind_follows_fused_marlin_moe(fake_gpu_libs: dict[str, Any]) -> None:
    a = get_adapter("cutlass_fp4_group_mm")
    case = small_moe_case(a.kernel, t=6)
    x = a.make_inputs(case, "cpu", 19)
    fn = Recorder(lambda *args, **kw: args[1])
    out = nvfp4_group_mm._bind_marlin_moe(fn, x, case)()
    assert isinstance(out, Tagged) and out.numerics == "w4a16" and out.value.shape == (6, 128)
    (g1, g1kw), (g2, g2kw) = fn.calls
    # fused_marlin_moe's asserts: H == w1.shape[1] * 16, H == w2.shape[2] // 2, N = w2.shape[1] * 16
    assert g1[2].shape == (16, 128 // 16, 2 * 64 * 2) and g2[2].shape == (16, 64 // 16, 128 * 2)
    assert g1[4].dtype == torch.float8_e4m3fn and g1[4].shape == (16, 128 // 16, 128)
    assert g1[5].dtype == torch.bfloat16 and g1[5].shape == (16,)
    assert (g1kw["size_m"], g1kw["size_n"], g1kw["size_k"], g1kw["top_k"]) == (6, 128, 128, 8)
    assert (g2kw["size_m"], g2kw["size_n"], g2kw["size_k"], g2kw["top_k"]) == (48, 128, 64, 1)
    assert g2kw["mul_topk_weights"] and not g1kw["mul_topk_weights"]
    assert g1kw["moe_block_size"] == 8 and g1kw["use_atomic_add"]  # 6*8/16/8 < 0.9; sm90 bf16
    (align_args, _) = fake_gpu_libs["sgl_kernel.moe"].moe_align_block_size.calls[0]
    assert align_args[1] == 17 and align_args[2] == 8 and align_args[7] is True  # E + 1, pad ids
    (sum_args, _) = fake_gpu_libs["sgl_kernel.moe"].moe_sum_reduce.calls[0]
    assert sum_args[0].shape == (6, 8, 128) and sum_args[2] == 2.5


def test_cutlass_fused_moe_bind_matches_flashinfer_checks(fake_gpu_libs: dict[str, Any]) -> None:
    a = get_adapter("cutlass_fp4_group_mm")
    case = small_moe_case(a.kernel)
    x = a.make_inputs(case, "cpu", 20)
    fn = Recorder([torch.zeros(5, 128, dtype=torch.bfloat16)])
    nvfp4_group_mm.bind_cutlass_fused_moe_nvfp4(fn, x, case)()
    _, kw = fn.calls[0]
    assert is_(kw["fc1_expert_weights"], torch.long, (16, 128, 128 // 16))
    assert kw["fc2_expert_weights"].shape == (16, 128, 64 // 16)
    # the w13 halves are swapped to up-first (load_up_proj_weight_first)
    assert torch.equal(kw["fc1_expert_weights"].view(torch.uint8)[:, :64], x["w13"][:, 64:])
    qs = kw["quant_scales"]
    assert [t.dtype for t in qs] == [torch.float32, torch.int32, torch.float32] * 2
    assert qs[0].ndim == 0 and qs[3].ndim == 0 and qs[2].shape == qs[5].shape == (16,)
    # binding: fc1 block (E, align(I)*2, align(H)/16/4), fc2 block (E, align(H), align(I)/16/4)
    assert qs[1].shape == (16, 128, 128 // 64) and qs[4].shape == (16, 128, 1)
    assert torch.allclose(kw["token_final_scales"], x["topk_weights"] * 2.5)
    assert kw["token_selected_experts"].dtype == torch.int32 and kw["input"].dtype == torch.bfloat16
    assert kw["activation_type"] == 3 and kw["output"].shape == (5, 128)


def test_trtllm_bind_matches_launcher_checks(fake_gpu_libs: dict[str, Any]) -> None:
    a = get_adapter("trtllm_fp4_block_scale_moe")
    case = small_moe_case(a.kernel)
    x = a.make_inputs(case, "cpu", 21)
    fn = Recorder([torch.zeros(5, 128, dtype=torch.bfloat16)])
    nvfp4_trtllm._bind_trtllm_fp4_moe(fn, x, case)()
    _, kw = fn.calls[0]
    assert kw["routing_logits"].dtype == torch.float32 and kw["routing_logits"].shape == (5, 16)
    assert kw["routing_bias"].dtype == torch.bfloat16 and kw["routing_bias"].shape == (16,)
    assert kw["hidden_states"].dtype == torch.uint8 and kw["hidden_states"].shape == (5, 64)
    assert is_(kw["hidden_states_scale"], torch.float8_e4m3fn, (5, 8))
    assert kw["gemm1_weights"].dtype == torch.uint8 and kw["gemm1_weights"].shape == (16, 128, 64)
    assert is_(kw["gemm1_weights_scale"], torch.float8_e4m3fn, (16, 128, 8))
    assert kw["gemm2_weights"].shape == (16, 128, 32) and kw["gemm2_weights_scale"].shape == (16, 128, 4)
    for name in ("output1_scale_scalar", "output1_scale_gate_scalar", "output2_scale_scalar"):
        assert kw[name].dtype == torch.float32 and kw[name].shape == (16,)
    assert torch.allclose(kw["output1_scale_scalar"], kw["output1_scale_gate_scalar"] / x["a2_scale"])
    assert (kw["num_experts"], kw["top_k"], kw["n_group"], kw["topk_group"]) == (16, 8, 8, 4)
    assert (kw["intermediate_size"], kw["routing_method_type"], kw["routed_scaling_factor"]) == (64, 2, 2.5)


def test_marlin_helpers_by_hand() -> None:
    s = torch.arange(128, dtype=torch.float32).reshape(2, 64)
    p = marlin.marlin_permute_scales(s, size_k=32, size_n=64, group_size=16)
    assert p[0, :9].tolist() == [0, 8, 16, 24, 32, 40, 48, 56, 1]
    single = marlin.marlin_permute_scales(s[:1], size_k=16, size_n=64, group_size=16)
    assert single[0, :8].tolist() == [0, 1, 8, 9, 16, 17, 24, 25]
    # columns are taken in groups of four as [0, 2, 1, 3]; then half(v) * 2^7, << 1, high byte:
    # 1.0 -> 0x5800 -> 0xB0; 2.0 -> 0x5C00 -> 0xB8; 448 -> 0x7B00 -> 0xF6; 0.5 -> 0x5400 -> 0xA8
    scales = torch.tensor([[1.0, 448.0, 2.0, 0.5]], dtype=torch.bfloat16)
    out = marlin.nvfp4_marlin_process_scales(scales)
    assert out.dtype == torch.float8_e4m3fn and out.view(torch.uint8).tolist() == [[0xB0, 0xB8, 0xF6, 0xA8]]
    g = marlin.nvfp4_marlin_process_global_scale(torch.tensor(3.5e-5).bfloat16())
    assert g.shape == (1,) and float(g) == float(torch.tensor(3.5e-5).bfloat16()) * 2.0**119
    assert not marlin.should_use_atomic_add_reduce(1, 7168, 16384, 90, torch.bfloat16)  # n >= 2048
    assert marlin.should_use_atomic_add_reduce(1, 512, 7168, 90, torch.bfloat16)  # shared gate_up at tp 8
    assert not marlin.should_use_atomic_add_reduce(1, 512, 7168, 80, torch.bfloat16)
    block = nvfp4_group_mm._marlin_block_size
    assert [block(m, 8, 256) for m in (1, 64, 256, 1024, 4096)] == [8, 8, 16, 48, 64]


def test_marlin_scales_of_a_stack_of_experts_equal_one_weight_at_a_time() -> None:
    """marlin_weight_scales on [E, N, K/16] gives each expert what prepare_nvfp4_layer_for_marlin's steps
    (transpose, bf16, permute, process) give that expert's scales alone."""
    g = torch.Generator().manual_seed(11)
    sf = fp4.to_e4m3(torch.rand(3, 128, 32, generator=g) * 400 + 1)  # E=3, N=128, K=512
    stacked = marlin.marlin_weight_scales(sf)
    assert stacked.shape == (3, 32, 128) and stacked.dtype == torch.float8_e4m3fn
    for e in range(3):
        one = sf[e].T.contiguous().to(torch.bfloat16)
        want = marlin.nvfp4_marlin_process_scales(marlin.marlin_permute_scales(one, 512, 128, 16))
        assert torch.equal(stacked[e].view(torch.uint8), want.view(torch.uint8))


def test_nvfp4_moe_inputs_route_like_every_other_moe_adapter_and_traffic_counts_their_experts():
    """The NVFP4 MoE inputs use the common routing's popularity spread (so the pick compares NVFP4 and
    BF16/FP8 MoE paths under the same load), and traffic counts the experts they hit, never more than
    exist or than uniform routing would hit."""
    from dskbench.adapters.common.routing import active_experts

    for t in (1, 16, 64, 256, 2048):
        c = {"T": t, "E": 256, "K": 8, "n_group": 8, "topk_group": 4}
        n = nvfp4_common.routed_active_experts(c)
        assert n <= min(256, t * 8) and n <= nvfp4_common.expected_active_experts(t, 256, 8) + 1e-9
        assert abs(n - active_experts(t)) <= max(2, 0.15 * active_experts(t))
