"""The sm100-only NVFP4 kernels of nvidia/DeepSeek-R1-NVFP4-v2, and the Hopper path SGLang 0.5.16 runs instead.

Blackwell (sm100) runs the checkpoint W4A4: activations are NVFP4-quantised (``fp4_quantize``) and
multiplied with NVFP4 weights (``mm_fp4`` for dense projections; ``cutlass_fused_moe`` or
``trtllm_fp4_block_scale_moe`` for the routed experts). Hopper has no FP4 tensor cores: SGLang 0.5.16 runs
the same weights W4A16 through Marlin (``gptq_marlin_gemm`` / ``moe_wna16_marlin_gemm`` with
``b_q_type=float4_e2m1f``), activations staying BF16. Those Hopper backends sit on the same adapters, so every
NVFP4 op has a Hopper row; they carry ``label="Hopper path: ..."`` and ``extra["numerics"] = "w4a16"`` and
their launchers return ``Tagged(out, "w4a16")`` so that ``check`` compares them with the W4A16 reference
(unquantised activations) instead of the W4A4 one.

Inputs: the activation is quantised in ``make_inputs`` by ``dskbench.adapters.common.nvfp4`` (the same arithmetic as the
flashinfer kernel, so kernel and oracle read identical bytes); ``bind`` only converts layouts the way SGLang
does at load time (128x4 swizzle, trtllm shuffles, Marlin repack). MoE weights are filled only for the
experts the routing selects; the other experts' storage is allocated but never read.

Nothing here has been run on a Blackwell GPU; what could not be checked without one is listed in the report.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import SM100, Backend, Requirement
from dskbench.adapters.base import Adapter, Check, Traffic, memo, rel_error
from dskbench.adapters.common import nvfp4 as fp4
from dskbench.shapes.cases import Case, default_shapes

# flashinfer's declared lists: mm_fp4 cutlass/cudnn `@supported_compute_capability([100, 103, 110, 120, 121])`;
# fp4_quantize builds an sm90 module but its quantize body is compiled only for __CUDA_ARCH__ >= 1000.
FI_FP4 = Requirement(sm=(100, 103, 110, 120, 121))
MARLIN = Requirement(min_sm=80)  # Marlin kernels: sm80+ (what SGLang picks for sm80..sm90)
SM90_PLUS = Requirement(min_sm=90)  # flashinfer builds fp4 modules for sm90 and newer only

HOPPER_GEMM = (
    "Hopper path: Marlin W4A16 gptq_marlin_gemm (b_q_type=float4_e2m1f), weights prepared as "
    "prepare_nvfp4_layer_for_marlin; activations stay BF16"
)
HOPPER_MOE = (
    "Hopper path: Marlin MoE, whole sequence moe_align_block_size + moe_wna16_marlin_gemm (gate_up) + "
    "silu_and_mul + moe_wna16_marlin_gemm (down, x topk weight) + moe_sum_reduce; W4A16"
)


# -- numerics: which reference a backend is checked against ----------------------------------------


@dataclass(frozen=True)
class Tagged:
    """A launcher output that names the numerics (and, for quantisers, the layout) that produced it."""

    value: Any
    numerics: str = "w4a4"
    layout: str | None = None


class Refs:
    """References by numerics. The adapter's own numerics is computed at once (torch-ref times it);
    the others only when a backend needs them."""

    def __init__(
        self, primary: str, makers: dict[str, Callable[[], Any]], meta: dict[str, Any] | None = None
    ):
        self.primary = primary
        self.meta = meta or {}
        self._makers = makers
        self._done: dict[str, Any] = {}
        self.get(primary)

    def get(self, numerics: str) -> Any:
        if numerics not in self._done:
            if numerics not in self._makers:
                raise KeyError(f"no {numerics!r} reference (have {', '.join(self._makers)})")
            self._done[numerics] = self._makers[numerics]()
        return self._done[numerics]


def _untag(out: Any, primary: str) -> tuple[Any, str, str | None]:
    """(value, numerics, layout) of a launcher output; the torch-ref backend returns the Refs themselves
    (layout "linear": quantisers' references keep the checkpoint's linear scale layout)."""
    if isinstance(out, Tagged):
        return out.value, out.numerics, out.layout
    if isinstance(out, Refs):
        return out.get(primary), primary, "linear"
    return out, primary, None


class _NumericsAdapter(Adapter):
    """Checks a tensor output against the reference of the numerics its backend declares."""

    primary: ClassVar[str] = "w4a4"
    tolerances: ClassVar[dict[str, float]] = {"w4a4": 2e-2, "w4a16": 2e-2}

    def traffic_w4a16(self, case: Case) -> Traffic:
        """The Hopper (Marlin) row's traffic: bf16 activations, bf16 tensor-core rate."""
        raise NotImplementedError

    def traffic_for(self, backend: str, case: Case) -> Traffic:
        """Per-backend traffic: traffic(case) is the W4A4 kernel's (FP4 rate); a W4A16 backend moves bf16
        activations and runs at the bf16 rate."""
        b = {x.name: x for x in self.all_backends()}[backend]
        return self.traffic_w4a16(case) if b.extra.get("numerics") == "w4a16" else self.traffic(case)

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        value, numerics, _ = _untag(out, self.primary)
        r = ref.get(numerics) if isinstance(ref, Refs) else ref
        err = rel_error(value, r)
        tol = self.tolerances[numerics]
        return Check(err <= tol, err, tol, f"{numerics} reference: rel err {err:.2e} / {tol:.0e}")


# -- input generation -------------------------------------------------------------------------------


def _generator(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _randn(shape: tuple[int, ...], gen: torch.Generator, device: str, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)


def _uniform(shape: tuple[int, ...], lo: float, hi: float, gen: torch.Generator, device: str) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(shape, generator=gen, device=device)


# ModelOpt block scales are 448 * amax(block) / amax(tensor): mostly between ~32 and 448 (log-uniform
# here). With uniformly random e2m1 codes (rms 2.93) and block scales of rms ~194, weight_scale_2 ~3.5e-5
# gives dequantised weights of rms ~0.02, the magnitude of DeepSeek's 7168-wide projections.
_WEIGHT_SCALE_2 = 3.5e-5


def nvfp4_weight(
    shape: tuple[int, ...], gen: torch.Generator, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A checkpoint NVFP4 weight [..., N, K]: (uint8 [..., N, K/2], e4m3 [..., N, K/16], weight_scale_2).

    weight_scale_2 is one fp32 per leading index (a scalar for a 2-D weight)."""
    *lead, n, k = shape
    packed = torch.randint(0, 256, (*lead, n, k // 2), generator=gen, device=device, dtype=torch.uint8)
    log_sf = _uniform((*lead, n, k // fp4.NVFP4_BLOCK), 5.0, math.log2(fp4.E4M3_MAX), gen, device)
    scales = fp4.to_e4m3(torch.exp2(log_sf))
    ws2 = _WEIGHT_SCALE_2 * _uniform(tuple(lead), 0.8, 1.25, gen, device)
    return packed, scales, ws2.float()


def quantized_activation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_fp4, linear scales, input_scale, global scale) with a perfectly calibrated input_scale = amax / 2688."""
    input_scale = (x.float().abs().amax().clamp_min(1e-12) / (fp4.E4M3_MAX * fp4.FP4_MAX)).float()
    gs = (1.0 / input_scale).float()
    x_fp4, x_sf = fp4.quantize_nvfp4(x, gs)
    return x_fp4, x_sf, input_scale, gs


def _is_nvfp4_op(op: str) -> bool:
    return default_shapes().weight_format(op) == "nvfp4"


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 0 else 1


def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


# -- traffic ----------------------------------------------------------------------------------------


def gemm_traffic_w4a4(m: int, n: int, k: int) -> int:
    """Bytes of an NVFP4 W4A4 GEMM: both operands at 0.5625 B/elem (0.5 packed + 1/16 e4m3 scale), bf16 out.

    Scales are counted unpadded: the 128-row / 4-column swizzle padding is not traffic the op needs
    (catalogue 0.6), although at M < 128 the kernels do read the padded activation-scale tile."""
    return fp4.nvfp4_bytes(m * k) + fp4.nvfp4_bytes(n * k) + 2 * m * n


def gemm_traffic_w4a16(m: int, n: int, k: int) -> int:
    """Bytes of the Marlin W4A16 GEMM: NVFP4 weight, bf16 activation in and out (catalogue 4.4)."""
    return fp4.nvfp4_bytes(n * k) + 2 * m * k + 2 * m * n


def expected_active_experts(t: int, e: int, k: int) -> float:
    """Distinct experts hit by t tokens choosing k of e, under uniform routing (an upper bound on the
    biased DeepSeek routing the inputs use)."""
    return e * (1.0 - (1.0 - k / e) ** t)


def expert_weight_bytes(h: int, i: int) -> int:
    """One routed expert's NVFP4 gate_up [2I, H] + down [H, I] (24,772,608 B at I=2048, H=7168)."""
    return fp4.nvfp4_bytes(2 * i * h) + fp4.nvfp4_bytes(h * i)


# -- routing (DeepSeek-V3 grouped top-k, as trtllm RoutingMethodType.DeepSeekV3 computes it) ------------


def deepseek_routing(
    logits: torch.Tensor, bias: torch.Tensor, top_k: int, n_group: int, topk_group: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """sigmoid -> +bias -> top-2 sum per group -> top groups -> top-k experts; weights = sigmoid (no bias)
    renormalised over the k (routed_scaling_factor not applied). Returns (ids int32, weights fp32)."""
    t, e = logits.shape
    scores = torch.sigmoid(logits.float())
    biased = scores + bias.float()
    group = biased.view(t, n_group, e // n_group).topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros_like(group, dtype=torch.bool).scatter_(1, group.topk(topk_group, dim=-1).indices, True)
    keep = keep.unsqueeze(-1).expand(t, n_group, e // n_group).reshape(t, e)
    ids = biased.masked_fill(~keep, float("-inf")).topk(top_k, dim=-1).indices
    w = scores.gather(1, ids)
    return ids.to(torch.int32), w / w.sum(-1, keepdim=True)


def _moe_config(case: Case) -> dict[str, Any]:
    cfg = default_shapes().config
    d = case.dims
    return {
        "T": int(d["T"]),
        "H": int(d["H"]),
        "I": int(d["I"]),
        "E": int(d["E"]),
        "K": int(d["K"]),
        "n_group": int(d.get("n_group", cfg["n_group"])),
        "topk_group": int(d.get("topk_group", cfg["topk_group"])),
        "rsf": float(d.get("routed_scaling_factor", cfg["routed_scaling_factor"])),
    }


def _routing(
    c: dict[str, Any], gen: torch.Generator, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Router logits (fp32) with a per-expert popularity term so loads are uneven, the correction bias in
    bf16 (as SGLang hands it to trtllm), and the DeepSeek top-k they give."""
    t, e = c["T"], c["E"]
    popularity = 0.8 * torch.randn((e,), generator=gen, device=device)
    logits = torch.randn((t, e), generator=gen, device=device) + popularity
    bias = (0.1 * torch.randn((e,), generator=gen, device=device)).to(torch.bfloat16)
    ids, weights = deepseek_routing(logits, bias, c["K"], c["n_group"], c["topk_group"])
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
    ws2 = (_WEIGHT_SCALE_2 * _uniform((e,), 0.8, 1.25, gen, device)).float()
    return packed, scales, ws2


def make_moe_inputs(case: Case, device: str, seed: int) -> dict[str, Any]:
    """Routed-expert inputs as SGLang feeds the NVFP4 MoE: bf16 hidden states (and their NVFP4 form),
    DeepSeek routing from fp32 logits + bf16 correction bias, checkpoint-format expert weights."""
    c = _moe_config(case)
    t, h, i, e = c["T"], c["H"], c["I"], c["E"]
    gen = _generator(device, seed)
    logits, bias, ids, weights = _routing(c, gen, device)
    x = _randn((t, h), gen, device)
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


def _calibrate_a2(x: torch.Tensor, ids: torch.Tensor, w13: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The down-projection input_scale: amax of the SwiGLU output, estimated on up to 64 tokens of one
    expert with a 2x margin (a calibrated scale; rare outliers saturate the e4m3 block scale, identically
    in kernel and reference)."""
    e = int(ids.reshape(-1)[0])
    tok = (ids == e).any(dim=1).nonzero().squeeze(1)[:64]
    w1 = fp4.dequantize_nvfp4(w13[0][e], w13[1][e], 1.0 / w13[2][e])
    with fp4.exact_fp32_matmul():
        act = fp4.silu_and_mul(x[tok].float() @ w1.T)
    return (2.0 * act.abs().amax().clamp_min(1e-12) / (fp4.E4M3_MAX * fp4.FP4_MAX)).float()


def moe_refs(inputs: dict[str, Any], primary: str = "w4a4") -> Refs:
    w13 = (inputs["w13"], inputs["w13_sf"], inputs["w13_ws2"])
    w2 = (inputs["w2"], inputs["w2_sf"], inputs["w2_ws2"])
    common = (inputs["x"], inputs["topk_ids"], inputs["topk_weights"], w13, w2)
    rsf = inputs["routed_scaling_factor"]
    gs = (1.0 / inputs["a1_scale"], 1.0 / inputs["a2_scale"])
    return Refs(
        primary,
        {
            "w4a4": lambda: fp4.moe_reference(*common, act_global_scales=gs, routed_scaling_factor=rsf),
            "w4a16": lambda: fp4.moe_reference(*common, act_global_scales=None, routed_scaling_factor=rsf),
        },
    )


# -- Marlin weight preparation (copied from sglang 0.5.16 marlin_utils.py / marlin_utils_fp4.py) --------

_SCALE_PERM = [i + 8 * j for i in range(8) for j in range(8)]
_SCALE_PERM_SINGLE = [2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)]


def marlin_permute_scales(s: torch.Tensor, size_k: int, size_n: int, group_size: int) -> torch.Tensor:
    """sglang.srt.layers.quantization.marlin_utils.marlin_permute_scales."""
    if group_size < size_k and group_size != -1:
        s = s.reshape((-1, len(_SCALE_PERM)))[:, _SCALE_PERM]
    else:
        s = s.reshape((-1, len(_SCALE_PERM_SINGLE)))[:, _SCALE_PERM_SINGLE]
    return s.reshape((-1, size_n)).contiguous()


def nvfp4_marlin_process_scales(marlin_scales: torch.Tensor) -> torch.Tensor:
    """marlin_utils_fp4.nvfp4_marlin_process_scales (without its host-syncing sign warning)."""
    s = marlin_scales.to(torch.half)
    s = s.view(-1, 4)[:, [0, 2, 1, 3]].view(s.size(0), -1)
    s = (s * (2**7)).view(torch.int16) << 1
    s = s.view(torch.float8_e4m3fn)
    return s[:, 1::2].contiguous()


def nvfp4_marlin_process_global_scale(global_scale: torch.Tensor) -> torch.Tensor:
    """marlin_utils_fp4.nvfp4_marlin_process_global_scale for bf16 (exponent bias 2**7 - 2**1 = 126)."""
    if global_scale.dtype == torch.half:
        target_exponent = 5
    elif global_scale.dtype == torch.bfloat16:
        target_exponent = 8
    else:
        raise TypeError(f"global scale must be fp16 or bf16, got {global_scale.dtype}")
    exponent_bias = 2 ** (target_exponent - 1) - 2 ** (2 - 1)
    out = global_scale * (2.0 ** (exponent_bias - 7))
    return out.reshape(1) if out.dim() == 0 else out


def should_use_atomic_add_reduce(m: int, n: int, k: int, sm: int, dtype: torch.dtype) -> bool:
    """marlin_utils.should_use_atomic_add_reduce (its env switch is hard-wired on in 0.5.16)."""
    if n >= 2048 or k < 2048:
        return False
    return not (sm < 90 and dtype == torch.bfloat16)


def marlin_prepare_weight(
    packed: torch.Tensor, scales: torch.Tensor, weight_scale_2: torch.Tensor, repack: Callable[..., Any]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """prepare_nvfp4_layer_for_marlin for one [N, K] weight: (int32 repacked, e4m3 Marlin scales, bf16 gs)."""
    n, k = packed.shape[0], packed.shape[1] * 2
    if n % 64:
        raise ValueError(f"NVFP4 Marlin needs N % 64 == 0, got N={n}")
    perm = torch.empty(0, dtype=torch.int, device=packed.device)
    qweight = packed.view(torch.int32).T.contiguous()
    marlin_q = repack(b_q_weight=qweight, perm=perm, size_k=k, size_n=n, num_bits=4)
    s = scales.T.contiguous().to(torch.bfloat16)
    s = nvfp4_marlin_process_scales(marlin_permute_scales(s, k, n, 16))
    gs = nvfp4_marlin_process_global_scale(weight_scale_2.to(torch.bfloat16))
    return marlin_q, s, gs


# == dense NVFP4 GEMM ================================================================================


def _gemm_dims(case: Case) -> tuple[int, int, int]:
    d = case.dims
    return int(d["M"]), int(d["N"]), int(d["K"])


def _bind_mm_fp4(backend: str) -> Callable[[Any, dict[str, Any], Case], Callable[[], Any]]:
    """flashinfer.mm_fp4 as SGLang's ModelOptFp4LinearMethod.apply calls it (fp4_gemm)."""

    def bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        x_fp4, w = inputs["x_fp4"], inputs["w"]
        m, n = x_fp4.shape[0], w.shape[0]
        x_sf = fp4.swizzle_scales(inputs["x_sf"]).view(torch.uint8)  # fp4_quantize's swizzled uint8 view
        if backend == "trtllm":
            # process_weights_after_loading, flashinfer_trtllm branch (N % 128 and K/16 % 4 hold here)
            from flashinfer import shuffle_matrix_a, shuffle_matrix_sf_a

            if n % 128 or inputs["w_sf"].shape[1] % 4:
                raise ValueError(f"trtllm mm_fp4 path expects N % 128 == 0 and K/16 % 4 == 0 (N={n})")
            w = shuffle_matrix_a(w.view(torch.uint8), 128)
            w_sf = (
                shuffle_matrix_sf_a(inputs["w_sf"].view(torch.uint8), 128)
                .reshape(inputs["w_sf"].shape)
                .view(torch.float8_e4m3fn)
            )
        else:
            w_sf = fp4.swizzle_scales(inputs["w_sf"])  # weight_scale_interleaved, e4m3 [Np, Kp]
        out = torch.empty((m, n), dtype=torch.bfloat16, device=x_fp4.device)
        alpha = inputs["alpha"]
        b, b_sf = w.T, w_sf.T
        return lambda: fn(x_fp4, b, x_sf, b_sf, alpha, torch.bfloat16, out, backend=backend)

    return bind


def _bind_aot_fp4_mm(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """sgl-kernel <= 0.3.21 cutlass_scaled_fp4_mm(a [M,K/2], b [N,K/2], sf_a, sf_b swizzled e4m3, alpha, dtype)."""
    x_fp4, w = inputs["x_fp4"], inputs["w"]
    x_sf = fp4.swizzle_scales(inputs["x_sf"])
    w_sf = fp4.swizzle_scales(inputs["w_sf"])
    alpha = inputs["alpha"]
    return lambda: fn(x_fp4, w, x_sf, w_sf, alpha, torch.bfloat16)


def _bind_marlin_gemm(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """apply_fp4_marlin_linear after prepare_nvfp4_layer_for_marlin (SGLang 0.5.16, fp4 gemm backend marlin)."""
    from sgl_kernel.scalar_type import scalar_types
    from sglang.jit_kernel.gptq_marlin_repack import gptq_marlin_repack

    x, w = inputs["x"], inputs["w"]
    m, k = x.shape
    n = w.shape[0]
    q, s, gs = marlin_prepare_weight(w, inputs["w_sf"], inputs["weight_scale_2"], gptq_marlin_repack)
    workspace = torch.zeros(_sms(x.device), dtype=torch.int, device=x.device)  # marlin_make_workspace
    major, minor = torch.cuda.get_device_capability(x.device)
    atomic = should_use_atomic_add_reduce(m, n, k, major * 10 + minor, x.dtype)
    b_q_type = scalar_types.float4_e2m1f

    def launch() -> Tagged:
        out = fn(
            a=x,
            c=None,
            b_q_weight=q,
            b_scales=s,
            global_scale=gs,
            b_zeros=None,
            g_idx=None,
            perm=None,
            workspace=workspace,
            b_q_type=b_q_type,
            size_m=m,
            size_n=n,
            size_k=k,
            is_k_full=True,
            use_atomic_add=atomic,
            use_fp32_reduce=True,
        )
        return Tagged(out, "w4a16")

    return launch


# flashinfer.mm_fp4, one backend per implementation (SGLang 0.5.16 --fp4-gemm-backend flashinfer_*).
MM_FP4_BACKENDS: list[Backend] = [
    Backend(
        "flashinfer.cute-dsl",
        "flashinfer.gemm:mm_fp4",
        "flashinfer-python",
        "cutedsl",
        _bind_mm_fp4("cute-dsl"),
        requires=SM100,
        fallbacks=("flashinfer:mm_fp4",),
        note="SGLang 0.5.16 default on sm100 (--fp4-gemm-backend auto -> flashinfer_cutedsl)",
    ),
    Backend(
        "flashinfer.cutlass",
        "flashinfer.gemm:mm_fp4",
        "flashinfer-python",
        "jit",
        _bind_mm_fp4("cutlass"),
        requires=FI_FP4,
        fallbacks=("flashinfer:mm_fp4",),
    ),
    Backend(
        "flashinfer.cudnn",
        "flashinfer.gemm:mm_fp4",
        "flashinfer-python",
        "aot",
        _bind_mm_fp4("cudnn"),
        requires=FI_FP4,
        preload=("cudnn",),
        fallbacks=("flashinfer:mm_fp4",),
        note="cuDNN engine (needs the cudnn python frontend)",
    ),
    Backend(
        "flashinfer.trtllm",
        "flashinfer.gemm:mm_fp4",
        "flashinfer-python",
        "cubin",
        _bind_mm_fp4("trtllm"),
        requires=SM100,
        fallbacks=("flashinfer:mm_fp4",),
        note="weights shuffled (shuffle_matrix_a / shuffle_matrix_sf_a, epilogue tile 128) in bind",
    ),
]


@register
class CutlassScaledFp4Mm(_NumericsAdapter):
    """NVFP4 W4A4 dense GEMM (o_proj, dense gate_up/down, shared expert). sgl-kernel's CUTLASS kernel is
    gone in 0.4.5; SGLang 0.5.16 calls flashinfer.mm_fp4 (cute-dsl by default on sm100) and, on sm80-90,
    Marlin W4A16 at the same shapes."""

    kernel = "cutlass_scaled_fp4_mm"
    role = "gemm"
    ops = ("o_proj", "gate_up_proj", "down_proj", "shared_experts")
    description = "NVFP4 x NVFP4 GEMM, out = (deq(x) @ deq(W).T) * alpha, bf16"
    backends: ClassVar[list[Backend]] = [
        *MM_FP4_BACKENDS,
        Backend(
            "sgl_kernel",
            "sgl_kernel:cutlass_scaled_fp4_mm",
            "sglang-kernel",
            "aot",
            _bind_aot_fp4_mm,
            requires=SM100,
            fallbacks=("sgl_kernel.gemm:cutlass_scaled_fp4_mm",),
            note="the traced kernel; removed from sglang-kernel 0.4.5 (present up to 0.3.21)",
        ),
        Backend(
            "sglang_jit.marlin",
            "sglang.jit_kernel.gptq_marlin:gptq_marlin_gemm",
            "sglang",
            "jit",
            _bind_marlin_gemm,
            requires=MARLIN,
            label=HOPPER_GEMM,
            extra={"numerics": "w4a16"},
        ),
    ]

    def applies(self, case: Case) -> bool:
        return case.dims.get("weight") == "nvfp4"

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        m, n, k = _gemm_dims(case)
        gen = _generator(device, seed)
        x = _randn((m, k), gen, device)
        x_fp4, x_sf, input_scale, _ = quantized_activation(x)
        w, w_sf, ws2 = nvfp4_weight((n, k), gen, device)
        return {
            "x": x,
            "x_fp4": x_fp4,
            "x_sf": x_sf,
            "input_scale": input_scale,
            "w": w,
            "w_sf": w_sf,
            "weight_scale_2": ws2,
            "alpha": (input_scale * ws2).float(),  # ModelOptFp4LinearMethod: input_scale_2 * weight_scale_2
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> Refs:
        def w4a4() -> torch.Tensor:
            a = fp4.dequantize_nvfp4(inputs["x_fp4"], inputs["x_sf"])
            w = memo(
                inputs, "w_deq", lambda: fp4.dequantize_nvfp4(inputs["w"], inputs["w_sf"]), ("w", "w_sf")
            )
            with fp4.exact_fp32_matmul():
                out = a @ w.T
            return out * torch.as_tensor(inputs["alpha"], dtype=torch.float32, device=out.device)

        def w4a16() -> torch.Tensor:
            w = memo(
                inputs,
                "w_deq16",
                lambda: fp4.dequantize_nvfp4(inputs["w"], inputs["w_sf"], 1.0 / inputs["weight_scale_2"]),
                ("w", "w_sf", "weight_scale_2"),
            )
            with fp4.exact_fp32_matmul():
                return inputs["x"].float() @ w.T

        return Refs("w4a4", {"w4a4": w4a4, "w4a16": w4a16})

    def traffic(self, case: Case) -> Traffic:
        m, n, k = _gemm_dims(case)
        return Traffic(
            gemm_traffic_w4a4(m, n, k),
            2 * m * n * k,
            f"W4A4: NVFP4 x and W at 0.5625 B/elem (scale padding not counted), bf16 out; "
            f"the Hopper Marlin W4A16 row moves {gemm_traffic_w4a16(m, n, k)} B (bf16 x)",
            compute="fp4",
        )

    def traffic_w4a16(self, case: Case) -> Traffic:
        m, n, k = _gemm_dims(case)
        return Traffic(gemm_traffic_w4a16(m, n, k), 2 * m * n * k, "W4A16: NVFP4 W, bf16 x and out")


@register
class MmFp4(CutlassScaledFp4Mm):
    """flashinfer.mm_fp4 (trace 001), the current home of cutlass_scaled_fp4_mm: same op, shapes and
    checks; the Hopper Marlin row lives on cutlass_scaled_fp4_mm."""

    kernel = "mm_fp4"
    description = "flashinfer NVFP4 x NVFP4 GEMM (cute-dsl / cutlass / cudnn / trtllm), bf16 out"
    backends: ClassVar[list[Backend]] = list(MM_FP4_BACKENDS)


# == NVFP4 / MXFP4 activation quantisation ===========================================================


def _quant_dims(case: Case) -> tuple[int, int]:
    return int(case.dims["T"]), int(case.dims["K"])


def _bind_fi_fp4_quantize(backend: str) -> Callable[[Any, dict[str, Any], Case], Callable[[], Any]]:
    """flashinfer.fp4_quantize(x, input_scale_inv) with SGLang's defaults (sf 16, e4m3, 128x4 swizzled)."""

    def bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        x, gs = inputs["x"], inputs["global_scale"]
        return lambda: fn(x, gs, 16, False, True, backend=backend)

    return bind


def _bind_aot_scaled_fp4_quant(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """sgl-kernel <= 0.3.21 scaled_fp4_quant(input, input_global_scale) -> (uint8, swizzled e4m3 scales)."""
    x, gs = inputs["x"], inputs["global_scale"]
    return lambda: fn(x, gs)


class _QuantBase(Adapter):
    """NVFP4 activation quantisation of the NVFP4 linears' inputs ([T, K] bf16 -> packed + swizzled scales)."""

    role = "quant"
    ops = ("o_proj", "gate_up_proj", "down_proj", "shared_experts")
    tolerance_value: ClassVar[float] = 1e-2

    def applies(self, case: Case) -> bool:
        return _is_nvfp4_op(case.op)

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, k = _quant_dims(case)
        x = _randn((t, k), _generator(device, seed), device)
        input_scale = (x.float().abs().amax().clamp_min(1e-12) / (fp4.E4M3_MAX * fp4.FP4_MAX)).float()
        return {"x": x, "global_scale": (1.0 / input_scale).reshape(1).float()}

    def reference(self, inputs: dict[str, Any], case: Case) -> Refs:
        x, gs = inputs["x"], inputs["global_scale"]
        return Refs("w4a4", {"w4a4": lambda: fp4.quantize_nvfp4(x, gs)})

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        value, _, layout = _untag(out, "w4a4")
        rows, k = _quant_dims(case)
        packed = value[0].view(torch.uint8).reshape(rows, k // 2)
        sf = value[1] if layout == "linear" else fp4.unswizzle_scales(value[1], rows, k // fp4.NVFP4_BLOCK)
        ref_packed, ref_sf = ref.get("w4a4")
        got = fp4.dequantize_nvfp4(packed.cpu(), sf.cpu())
        want = fp4.dequantize_nvfp4(ref_packed.cpu(), ref_sf.cpu())
        err = rel_error(got, want)
        differ = (packed.cpu() != ref_packed.cpu()).float().mean().item()
        sf_differ = (sf.cpu().view(torch.uint8) != ref_sf.cpu().view(torch.uint8)).float().mean().item()
        tol = self.tolerance_value
        detail = f"dequantised rel err {err:.2e}; bytes differing: data {differ:.2%}, scales {sf_differ:.2%}"
        return Check(err <= tol, err, tol, detail)

    def traffic(self, case: Case) -> Traffic:
        t, k = _quant_dims(case)
        return Traffic(2 * t * k + fp4.nvfp4_bytes(t * k), 4 * t * k, "bf16 in, NVFP4 out (scales unpadded)")


@register
class ScaledFp4Quant(_QuantBase):
    """The W4A4 linears' activation quantiser (sgl-kernel scaled_fp4_quant; SGLang 0.5.16 calls
    flashinfer.fp4_quantize, CuTe-DSL backend on sm100). No Hopper equivalent: Marlin keeps BF16 inputs."""

    kernel = "scaled_fp4_quant"
    description = "bf16 [T, K] -> NVFP4 (uint8 [T, K/2] + 128x4-swizzled e4m3 scales)"
    backends: ClassVar[list[Backend]] = [
        Backend(
            "flashinfer.cute-dsl",
            "flashinfer:fp4_quantize",
            "flashinfer-python",
            "cutedsl",
            _bind_fi_fp4_quantize("cute-dsl"),
            requires=FI_FP4,
            fallbacks=("flashinfer.quantization.fp4_quantization:fp4_quantize",),
            note="what sglang.srt.layers.quantization.fp4_utils.fp4_quantize runs on sm100",
        ),
        Backend(
            "flashinfer.cuda",
            "flashinfer:fp4_quantize",
            "flashinfer-python",
            "jit",
            _bind_fi_fp4_quantize("cuda"),
            requires=FI_FP4,
            fallbacks=("flashinfer.quantization.fp4_quantization:fp4_quantize",),
        ),
        Backend(
            "sgl_kernel",
            "sgl_kernel:scaled_fp4_quant",
            "sglang-kernel",
            "aot",
            _bind_aot_scaled_fp4_quant,
            requires=SM100,
            fallbacks=("sgl_kernel.gemm:scaled_fp4_quant",),
            note="the traced kernel; removed from sglang-kernel 0.4.5",
        ),
    ]


@register
class Fp4Quantize(_QuantBase):
    """flashinfer.fp4_quantize itself (trace 001), at the NVFP4 linears' input shapes."""

    kernel = "fp4_quantize"
    description = "flashinfer NVFP4 quantisation, sf_vec_size 16, e4m3 scales, 128x4 swizzled"
    backends: ClassVar[list[Backend]] = [
        Backend(
            "flashinfer.cuda",
            "flashinfer:fp4_quantize",
            "flashinfer-python",
            "jit",
            _bind_fi_fp4_quantize("cuda"),
            requires=FI_FP4,
            fallbacks=("flashinfer.quantization.fp4_quantization:fp4_quantize",),
        ),
        Backend(
            "flashinfer.cute-dsl",
            "flashinfer:fp4_quantize",
            "flashinfer-python",
            "cutedsl",
            _bind_fi_fp4_quantize("cute-dsl"),
            requires=FI_FP4,
            fallbacks=("flashinfer.quantization.fp4_quantization:fp4_quantize",),
        ),
    ]


def _bind_fi_mxfp4_quantize(backend: str) -> Callable[[Any, dict[str, Any], Case], Callable[[], Any]]:
    def bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        x = inputs["x"]
        return lambda: fn(x, backend=backend)

    return bind


@register
class Mxfp4Quantize(_QuantBase):
    """flashinfer.mxfp4_quantize (trace 001: SGLang's MXFP4 path for GPT-OSS-style checkpoints). Not on
    DeepSeek-R1-NVFP4's path; measured at the NVFP4 linears' input shapes."""

    kernel = "mxfp4_quantize"
    description = "bf16 [T, K] -> MXFP4 (uint8 [T, K/2] + 128x4-swizzled UE8M0 scales, one per 32)"
    backends: ClassVar[list[Backend]] = [
        Backend(
            "flashinfer.cuda",
            "flashinfer:mxfp4_quantize",
            "flashinfer-python",
            "jit",
            _bind_fi_mxfp4_quantize("cuda"),
            requires=FI_FP4,
            fallbacks=("flashinfer.quantization.fp4_quantization:mxfp4_quantize",),
        ),
        Backend(
            "flashinfer.cute-dsl",
            "flashinfer:mxfp4_quantize",
            "flashinfer-python",
            "cutedsl",
            _bind_fi_mxfp4_quantize("cute-dsl"),
            requires=FI_FP4,
            fallbacks=("flashinfer.quantization.fp4_quantization:mxfp4_quantize",),
        ),
    ]

    def reference(self, inputs: dict[str, Any], case: Case) -> Refs:
        x = inputs["x"]
        return Refs("w4a4", {"w4a4": lambda: fp4.quantize_mxfp4(x)})

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        value, _, layout = _untag(out, "w4a4")
        rows, k = _quant_dims(case)
        packed = value[0].view(torch.uint8).reshape(rows, k // 2).cpu()
        sf = value[1] if layout == "linear" else fp4.unswizzle_scales(value[1], rows, k // fp4.MXFP4_BLOCK)
        ref_packed, ref_sf = ref.get("w4a4")
        got = fp4.dequantize_mxfp4(packed, sf.view(torch.uint8).cpu())
        want = fp4.dequantize_mxfp4(ref_packed.cpu(), ref_sf.cpu())
        err = rel_error(got, want)
        differ = (packed != ref_packed.cpu()).float().mean().item()
        tol = self.tolerance_value
        return Check(
            err <= tol, err, tol, f"dequantised rel err {err:.2e}; data bytes differing {differ:.2%}"
        )

    def traffic(self, case: Case) -> Traffic:
        t, k = _quant_dims(case)
        return Traffic(
            2 * t * k + t * k // 2 + t * k // 32, 4 * t * k, "bf16 in, MXFP4 out (scales unpadded)"
        )


# == weight-scale interleave (weight prep, runs on sm90) =============================================


def _bind_block_scale_interleave(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    sf = inputs["w_sf"]
    return lambda: fn(sf)


@register
class Nvfp4BlockScaleInterleave(Adapter):
    """flashinfer.nvfp4_block_scale_interleave: the load-time 128x4 swizzle of NVFP4 weight scales (trace
    001). A plain index kernel, so it runs on sm90. Weight prep does not depend on T: measured once per
    weight, at the decode T=1 case."""

    kernel = "nvfp4_block_scale_interleave"
    role = "gemm"
    ops = ("o_proj", "gate_up_proj", "down_proj", "shared_experts")
    description = "e4m3 weight scales [N, K/16] (uint8) -> flat 128x4-swizzled buffer, zero padded"
    backends: ClassVar[list[Backend]] = [
        Backend(
            "flashinfer",
            "flashinfer:nvfp4_block_scale_interleave",
            "flashinfer-python",
            "jit",
            _bind_block_scale_interleave,
            requires=SM90_PLUS,
            fallbacks=("flashinfer.quantization.fp4_quantization:block_scale_interleave",),
        )
    ]

    def applies(self, case: Case) -> bool:
        return (
            case.dims.get("weight") == "nvfp4"
            and case.phase.startswith("decode")
            and case.point.get("T") == 1
        )

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        _, n, k = _gemm_dims(case)
        _, sf, _ = nvfp4_weight((n, k), _generator(device, seed), device)
        return {"w_sf": sf.view(torch.uint8)}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return fp4.swizzle_scales(inputs["w_sf"]).flatten()

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        got = out.view(torch.uint8).flatten().cpu()
        want = ref.cpu()
        if got.shape != want.shape:
            return Check(False, float("inf"), 0.0, f"shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        wrong = (got != want).float().mean().item()
        return Check(wrong == 0.0, wrong, 0.0, f"fraction of bytes misplaced {wrong:.2%} (must be exact)")

    def traffic(self, case: Case) -> Traffic:
        _, n, k = _gemm_dims(case)
        rp, cp = fp4.swizzled_shape(n, k // 16)
        return Traffic(n * (k // 16) + rp * cp, 0, "reads the scales, writes the padded swizzled buffer")


# == MoE: grouped activation quantisation ============================================================


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
        c = _moe_config(case)
        gen = _generator(device, seed)
        _, _, ids, _ = _routing(c, gen, device)
        x = _randn((c["T"], c["H"]), gen, device)
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
        value, _, layout = _untag(out, "w4a4")
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
        c = _moe_config(case)
        n = c["T"] * c["K"] * c["H"]
        return Traffic(2 * n + fp4.nvfp4_bytes(n), 4 * n, "bf16 [T*K, H] in, NVFP4 out (scales unpadded)")


# == MoE: routed experts =============================================================================


def _swap_halves(t: torch.Tensor) -> torch.Tensor:
    """[E, 2I, ...] gate-first -> up-first (flashinfer CUTLASS MoE loads w3 before w1)."""
    b = t.view(torch.uint8)  # index ops on uint8: float8 kernels are not implemented for every op
    e, r = b.shape[0], b.shape[1]
    return b.reshape(e, 2, r // 2, *b.shape[2:]).flip(1).reshape(b.shape).contiguous().view(t.dtype)


def _bind_cutlass_fused_moe(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """flashinfer cutlass_fused_moe as SGLang's flashinfer_cutlass MoE runner calls it for NVFP4
    (ModelOptNvFp4FusedMoEMethod: w13 up-first, 128x4-swizzled block scales viewed as int32)."""
    from flashinfer.fused_moe import ActivationType

    x, ids = inputs["x"], inputs["topk_ids"]
    w13 = _swap_halves(inputs["w13"]).view(torch.long)
    w13_sf = fp4.swizzle_scales(_swap_halves(inputs["w13_sf"])).view(torch.int32)
    w2 = inputs["w2"].view(torch.long)
    w2_sf = fp4.swizzle_scales(inputs["w2_sf"]).view(torch.int32)
    a1, a2 = inputs["a1_scale"], inputs["a2_scale"]
    quant_scales = [
        (1.0 / a1).float(),  # w13_input_scale_quant
        w13_sf,
        (a1 * inputs["w13_ws2"]).float(),  # g1_alphas
        (1.0 / a2).float(),  # w2_input_scale_quant
        w2_sf,
        (a2 * inputs["w2_ws2"]).float(),  # g2_alphas
    ]
    # SGLang applies routed_scaling_factor outside this kernel for NVFP4; folded into the weights here so
    # the output matches the other backends.
    scales = (inputs["topk_weights"] * inputs["routed_scaling_factor"]).float()
    out = torch.empty_like(x)
    tune = _next_pow2(x.shape[0])

    def launch() -> torch.Tensor:
        return fn(
            input=x,
            token_selected_experts=ids,
            token_final_scales=scales,
            fc1_expert_weights=w13,
            fc2_expert_weights=w2,
            output_dtype=torch.bfloat16,
            quant_scales=quant_scales,
            input_sf=None,
            output=out,
            tune_max_num_tokens=tune,
            activation_type=ActivationType.Swiglu,
        )[0]

    return launch


def _marlin_moe_weights(inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """prepare_moe_nvfp4_layer_for_marlin (gated, group 16, bf16 params): per-expert repack and scales."""
    from sglang.jit_kernel.gptq_marlin_repack import gptq_marlin_repack

    out: dict[str, torch.Tensor] = {}
    for name in ("w13", "w2"):
        packed, sf, ws2 = inputs[name], inputs[f"{name}_sf"], inputs[f"{name}_ws2"]
        qs, ss = [], []
        for e in range(packed.shape[0]):
            q, s, _ = marlin_prepare_weight(packed[e], sf[e], ws2[e], gptq_marlin_repack)
            qs.append(q)
            ss.append(s)
        out[name] = torch.stack(qs)
        out[f"{name}_scale"] = torch.stack([x.view(torch.uint8) for x in ss]).view(torch.float8_e4m3fn)
        out[f"{name}_gs"] = nvfp4_marlin_process_global_scale(ws2.to(torch.bfloat16))
    return out


def _marlin_block_size(m: int, topk: int, e: int) -> int:
    """fused_marlin_moe's M-block choice."""
    for block in (8, 16, 32, 48, 64):
        if m * topk / e / block < 0.9:
            return block
    return 64


def _bind_marlin_moe(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """The Marlin MoE sequence of sglang 0.5.16 fused_marlin_moe (NVFP4, gated SiLU, no EP), kernel by kernel."""
    from sgl_kernel.moe import moe_align_block_size, moe_sum_reduce
    from sgl_kernel.scalar_type import scalar_types
    from sglang.jit_kernel.activation import silu_and_mul

    w = _marlin_moe_weights(inputs)
    x, ids, weights = inputs["x"], inputs["topk_ids"], inputs["topk_weights"]
    m, h = x.shape
    e, topk = inputs["w13"].shape[0], ids.shape[1]
    n = inputs["w2"].shape[2] * 2  # intermediate size I
    block = _marlin_block_size(m, topk, e)
    numel = ids.numel()
    max_pad = numel * block if numel < e + 1 else numel + (e + 1) * (block - 1)
    dev = x.device
    sms = _sms(dev)
    atomic = torch.cuda.get_device_capability(dev)[0] >= 9  # bf16 activations
    fp4_type = scalar_types.float4_e2m1f
    rsf = inputs["routed_scaling_factor"]

    def launch() -> Tagged:
        sorted_ids = torch.empty((max_pad,), dtype=torch.int32, device=dev)
        expert_ids = torch.empty((-(-max_pad // block),), dtype=torch.int32, device=dev)
        num_post = torch.empty((1,), dtype=torch.int32, device=dev)
        cumsum = torch.empty((e + 2,), dtype=torch.int32, device=dev)
        moe_align_block_size(ids, e + 1, block, sorted_ids, expert_ids, num_post, cumsum, True, False)
        workspace = torch.zeros(sms * 4, dtype=torch.int, device=dev)  # per call, as the Marlin runner does
        cache2 = torch.empty((m * topk, n), dtype=x.dtype, device=dev)
        cache13 = torch.zeros((m * topk * max(2 * n, h),), dtype=x.dtype, device=dev)
        cache1 = cache13[: m * topk * 2 * n].view(-1, 2 * n)
        cache3 = cache13[: m * topk * h].view(-1, h)
        common = dict(
            workspace=workspace,
            sorted_token_ids=sorted_ids,
            expert_ids=expert_ids,
            num_tokens_post_padded=num_post,
            topk_weights=weights,
            moe_block_size=block,
            is_ep=False,
            b_q_type=fp4_type,
            is_k_full=True,
            use_atomic_add=atomic,
            use_fp32_reduce=True,
            is_zp_float=False,
        )
        cache1 = fn(
            x,
            cache1,
            w["w13"],
            None,
            w["w13_scale"],
            w["w13_gs"],
            None,
            None,
            None,
            top_k=topk,
            mul_topk_weights=False,
            size_m=m,
            size_n=2 * n,
            size_k=h,
            **common,
        )
        silu_and_mul(cache1.view(-1, 2 * n), cache2)
        cache3 = fn(
            cache2,
            cache3,
            w["w2"],
            None,
            w["w2_scale"],
            w["w2_gs"],
            None,
            None,
            None,
            top_k=1,
            mul_topk_weights=True,
            size_m=m * topk,
            size_n=h,
            size_k=n,
            **common,
        ).view(-1, topk, h)
        out = torch.empty_like(x)
        moe_sum_reduce(cache3, out, rsf)
        return Tagged(out, "w4a16")

    return launch


def _bind_fused_marlin_moe(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """sglang's own driver, called as the Marlin MoE runner (fused_experts_none_to_marlin) calls it."""
    w = _marlin_moe_weights(inputs)
    x = inputs["x"]
    sms = _sms(x.device)

    def launch() -> Tagged:
        out = fn(
            hidden_states=x,
            w1=w["w13"],
            w2=w["w2"],
            w1_scale=w["w13_scale"],
            w2_scale=w["w2_scale"],
            gating_output=inputs["routing_logits"],
            topk_weights=inputs["topk_weights"],
            topk_ids=inputs["topk_ids"],
            global_num_experts=inputs["w13"].shape[0],
            expert_map=None,
            w1_global_scale=w["w13_gs"],
            w2_global_scale=w["w2_gs"],
            workspace=torch.zeros(sms * 4, dtype=torch.int, device=x.device),
            num_bits=4,
            is_k_full=True,
            inplace=False,
            routed_scaling_factor=inputs["routed_scaling_factor"],
        )
        return Tagged(out, "w4a16")

    return launch


class _MoeBase(_NumericsAdapter):
    role = "moe"
    ops = ("experts",)
    # W4A4: kernels may round the gate_up output to bf16 before re-quantising it to NVFP4, which flips a
    # few percent of intermediate codes relative to the fp32 oracle; 5e-2 still catches any layout error.
    tolerances: ClassVar[dict[str, float]] = {"w4a4": 5e-2, "w4a16": 2e-2}

    def applies(self, case: Case) -> bool:
        return case.dims.get("weight") == "nvfp4"

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return make_moe_inputs(case, device, seed)

    def reference(self, inputs: dict[str, Any], case: Case) -> Refs:
        return moe_refs(inputs, self.primary)

    def _weights_and_flops(self, case: Case) -> tuple[int, int, float]:
        c = _moe_config(case)
        n_act = expected_active_experts(c["T"], c["E"], c["K"])
        flops = 2 * c["T"] * c["K"] * 3 * c["I"] * c["H"]
        return int(round(n_act * expert_weight_bytes(c["H"], c["I"]))), flops, n_act


@register
class CutlassFp4GroupMm(_MoeBase):
    """The routed experts of an NVFP4 MoE layer. The traced sgl-kernel grouped GEMM (one of the two GEMMs
    of the removed cutlass_moe_fp4 path) has no standalone successor: flashinfer's cutlass_fused_moe does
    permute + act quant + both grouped GEMMs + SwiGLU + finalize in one call, so the unit measured here is
    the whole routed-expert computation [T, H] -> [T, H] from precomputed top-k ids and weights."""

    kernel = "cutlass_fp4_group_mm"
    description = "routed experts, out = 2.5 * sum_k w_k * down_e(silu(gate_e x) * up_e x), NVFP4 weights"
    backends: ClassVar[list[Backend]] = [
        Backend(
            "flashinfer.cutlass_fused_moe",
            "flashinfer.fused_moe:cutlass_fused_moe",
            "flashinfer-python",
            "jit",
            _bind_cutlass_fused_moe,
            requires=SM100,
            fallbacks=("flashinfer:cutlass_fused_moe",),
            label="fused MoE (replaces scaled_fp4_experts_quant + 2x cutlass_fp4_group_mm)",
            note="SGLang --moe-runner-backend flashinfer_cutlass",
        ),
        Backend(
            "sglang_jit.marlin_moe",
            "sglang.jit_kernel.moe_wna16_marlin:moe_wna16_marlin_gemm",
            "sglang",
            "jit",
            _bind_marlin_moe,
            requires=MARLIN,
            label=HOPPER_MOE,
            extra={"numerics": "w4a16", "unit": "whole path"},
        ),
        Backend(
            "sglang.fused_marlin_moe",
            "sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe:fused_marlin_moe",
            "sglang",
            "jit",
            _bind_fused_marlin_moe,
            requires=MARLIN,
            label=HOPPER_MOE + " (sglang's fused_marlin_moe driver)",
            extra={"numerics": "w4a16", "unit": "whole path"},
        ),
    ]

    def traffic(self, case: Case) -> Traffic:
        c = _moe_config(case)
        wbytes, flops, n_act = self._weights_and_flops(case)
        t, h, k = c["T"], c["H"], c["K"]
        acts = 2 * t * h + 2 * t * h + t * k * (4 + 4)
        return Traffic(
            wbytes + acts,
            flops,
            f"NVFP4 weights of ~{n_act:.1f} active experts (uniform-routing expectation) + bf16 x in/out + "
            "top-k ids/weights; intermediates not counted (same minimum for W4A4 and the W4A16 Hopper row)",
            compute="fp4",
        )

    def traffic_w4a16(self, case: Case) -> Traffic:
        return dataclasses.replace(self.traffic(case), compute="bf16")


def _bind_trtllm_fp4_moe(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """flashinfer trtllm_fp4_block_scale_moe as SGLang's flashinfer_trtllm FP4 runner calls it, with weights
    prepared as align_fp4_moe_weights_for_flashinfer_trtllm / prepare_static_weights_for_trtllm_fp4_moe."""
    from flashinfer import nvfp4_block_scale_interleave
    from flashinfer.fused_moe.core import (
        _maybe_get_cached_w3_w1_permute_indices,
        get_w2_permute_indices_with_cache,
    )

    e, h = inputs["w13"].shape[0], inputs["w13"].shape[2] * 2
    i = inputs["w2"].shape[2] * 2
    if i % 16:
        raise ValueError(f"trtllm FP4 MoE needs intermediate size % 16 == 0, got {i}")
    cache: dict[Any, torch.Tensor] = {}

    def shuffle(
        weights: torch.Tensor, scales: torch.Tensor, gated: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        w8, s8 = weights.view(torch.uint8), scales.view(torch.uint8)
        w_out = torch.empty_like(w8)
        s_out = torch.empty((e, s8[0].numel()), dtype=torch.uint8, device=w8.device)
        for j in range(e):
            if gated:
                pw = _maybe_get_cached_w3_w1_permute_indices(cache, w8[j], 128, is_gated_act_gemm=True)
                ps = _maybe_get_cached_w3_w1_permute_indices(
                    cache, s8[j], 128, num_elts_per_sf=16, is_gated_act_gemm=True
                )
            else:
                pw = get_w2_permute_indices_with_cache(cache, w8[j], 128)
                ps = get_w2_permute_indices_with_cache(cache, s8[j], 128, num_elts_per_sf=16)
            w_out[j] = w8[j][pw.to(w8.device)]
            s_out[j] = nvfp4_block_scale_interleave(s8[j][ps.to(s8.device)].contiguous())
        return w_out, s_out.view(torch.float8_e4m3fn).reshape(scales.shape)

    g1_w, g1_s = shuffle(inputs["w13"], inputs["w13_sf"], gated=True)
    g2_w, g2_s = shuffle(inputs["w2"], inputs["w2_sf"], gated=False)
    a1, a2 = inputs["a1_scale"], inputs["a2_scale"]
    g1_alphas = (a1 * inputs["w13_ws2"]).float()
    g1_scale_c = ((1.0 / a2) * g1_alphas).float()  # w2_input_scale_quant * g1_alphas_up
    g2_alphas = (a2 * inputs["w2_ws2"]).float()
    x_fp4, x_sf = inputs["x_fp4"], inputs["x_sf"]  # linear scales [T, H/16] (quantize_hidden_states_fp4)
    t = x_fp4.shape[0]
    out = torch.empty((t, h), dtype=torch.bfloat16, device=x_fp4.device)
    top_k = inputs["topk_ids"].shape[1]

    def launch() -> torch.Tensor:
        return fn(
            routing_logits=inputs["routing_logits"],
            routing_bias=inputs["routing_bias"],
            hidden_states=x_fp4,
            hidden_states_scale=x_sf,
            gemm1_weights=g1_w,
            gemm1_weights_scale=g1_s,
            gemm1_bias=None,
            gemm1_alpha=None,
            gemm1_beta=None,
            gemm1_clamp_limit=None,
            gemm2_weights=g2_w,
            gemm2_weights_scale=g2_s,
            gemm2_bias=None,
            output1_scale_scalar=g1_scale_c,
            output1_scale_gate_scalar=g1_alphas,
            output2_scale_scalar=g2_alphas,
            num_experts=e,
            top_k=top_k,
            n_group=inputs["n_group"],
            topk_group=inputs["topk_group"],
            intermediate_size=i,
            local_expert_offset=0,
            local_num_experts=e,
            routed_scaling_factor=inputs["routed_scaling_factor"],
            routing_method_type=2,  # RoutingMethodType.DeepSeekV3
            do_finalize=True,
            activation_type=3,  # ActivationType.Swiglu
            tune_max_num_tokens=_next_pow2(t),
            output=out,
        )[0]

    return launch


@register
class TrtllmFp4BlockScaleMoe(_MoeBase):
    """flashinfer's trtllm-gen fused NVFP4 MoE (SGLang --moe-runner-backend flashinfer_trtllm, the sm100
    default for this checkpoint): DeepSeek-V3 routing from the router logits + both GEMMs + SwiGLU +
    finalize. The Hopper row for the experts op is on cutlass_fp4_group_mm (Marlin takes top-k ids)."""

    kernel = "trtllm_fp4_block_scale_moe"
    description = "routing (DeepSeekV3) + routed experts, NVFP4 hidden states in, bf16 out"
    backends: ClassVar[list[Backend]] = [
        Backend(
            "flashinfer",
            "flashinfer.fused_moe:trtllm_fp4_block_scale_moe",
            "flashinfer-python",
            "cubin",
            _bind_trtllm_fp4_moe,
            requires=SM100,
            fallbacks=("flashinfer:trtllm_fp4_block_scale_moe",),
            note="trtllm-gen cubins must be available offline (flashinfer-cubin or FLASHINFER_CUBIN_DIR)",
        )
    ]

    def traffic(self, case: Case) -> Traffic:
        c = _moe_config(case)
        wbytes, flops, n_act = self._weights_and_flops(case)
        t, h, e = c["T"], c["H"], c["E"]
        acts = fp4.nvfp4_bytes(t * h) + 4 * t * e + 2 * e + 2 * t * h
        return Traffic(
            wbytes + acts,
            flops,
            f"NVFP4 weights of ~{n_act:.1f} active experts (uniform-routing expectation) + NVFP4 x + fp32 "
            "logits + bf16 out; intermediates not counted",
            compute="fp4",
        )
