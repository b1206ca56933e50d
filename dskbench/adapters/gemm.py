"""Dense GEMM kernels DeepSeek-R1 can call under SGLang (catalogue §4): quantised linears, the absorbed
MLA bmm, and the two min-latency DeepSeek GEMMs (fused QKV-A, router).

The NVFP4-v2 checkpoint runs its BF16 projections through cuBLAS and its NVFP4 ones through Marlin on
Hopper, so the INT8/FP8/W4A8 kernels here are measured as a *what-if*: "this projection, at this shape,
in this format" — every linear of the model except the router (which SGLang never quantises). The
dsv3_* kernels run only where SGLang calls them (fused_qkv_a_proj / gate, T <= 16).

Byte counts follow catalogue §0.6: each operand read once, output written once, scales counted.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import ANY_CUDA, SM90_ONLY, Backend, Requirement
from dskbench.adapters.base import Adapter, Traffic, memo
from dskbench.adapters.common import fp8
from dskbench.shapes.cases import Case

# Linear projections of DeepSeek-R1 that a quantised checkpoint quantises (the router `gate` stays BF16).
LINEAR_OPS = (
    "fused_qkv_a_proj_with_mqa",
    "q_b_proj",
    "kv_b_proj",
    "o_proj",
    "gate_up_proj",
    "down_proj",
    "shared_experts",
)
NEVER_QUANTISED = frozenset({"gate"})  # sglang's MoEGate is a plain nn.Module in every checkpoint

# Bytes per element of a stored weight, by format (catalogue §0.1; NVFP4 counts its e4m3 block scales).
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "int8": 1.0, "nvfp4": 0.5625, "int4": 0.5}
OUT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

BF16_OUT = torch.bfloat16
WEIGHT_STD = 0.02  # typical trained-weight spread; activations are unit normal
SM100_FAMILY = Requirement(sm=(100, 103, 110, 120, 121))
SM120 = Requirement(sm=(120, 121))
FUSED_A_MAX_T = 16  # linear_with_fused_a_gemm: 1 <= T <= 16
ROUTER_MAX_T = 16  # DeepseekV2MoEGate: dsv3_router_gemm for T <= 16 on sm90 (4 on sm100/103)


# -- shared helpers ---------------------------------------------------------------------------------


def weight_bytes(k: int, n: int, fmt: str) -> int:
    """Stored bytes of an [N, K] weight in `fmt` (catalogue §4 table column 'weight bytes')."""
    return int(k * n * WEIGHT_BYTES[fmt])


def gemm_flops(m: int, n: int, k: int, batch: int = 1) -> int:
    return 2 * batch * m * n * k


def _gen(device: str, seed: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _randn(
    shape: tuple[int, ...],
    g: torch.Generator,
    device: str,
    std: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    return torch.randn(shape, generator=g, device=device, dtype=dtype).mul_(std)


def _mnk(case: Case) -> tuple[int, int, int]:
    d = case.dims
    return int(d["M"]), int(d["N"]), int(d["K"])


def _takes(fn: Any, name: str) -> bool:
    """Whether `fn` has a parameter `name` (tells a current signature from a retired one)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class _WhatIfLinear(Adapter):
    """A quantised GEMM measured at every quantisable linear projection of the model."""

    role = "gemm"
    ops = LINEAR_OPS
    fmt = ""  # what-if weight format, for the traffic note

    def applies(self, case: Case) -> bool:
        return case.op not in NEVER_QUANTISED and "weight" in case.dims and case.dims.get("out") is None

    def _note(self, case: Case) -> str:
        return f"what-if {self.fmt} at {case.op} (checkpoint stores it as {case.dims.get('weight')})"


# -- INT8 / FP8 per-token x per-channel --------------------------------------------------------------


def _scaled_mm_inputs(case: Case, device: str, seed: int, dtype: torch.dtype) -> dict[str, Any]:
    """mat_a [M,K] row-major, mat_b = W.t() [K,N] column-major, scales [M,1] / [N,1] fp32 (sglang)."""
    m, n, k = _mnk(case)
    g = _gen(device, seed)
    x = _randn((m, k), g, device, dtype=torch.bfloat16)
    w = _randn((n, k), g, device, WEIGHT_STD, torch.bfloat16)
    a, sa = fp8.per_token_quant(x, dtype)
    wq, sw = fp8.per_token_quant(w, dtype)
    return {"mat_a": a, "mat_b": wq.t(), "scales_a": sa, "scales_b": sw}


def _scaled_mm_reference(inputs: dict[str, Any]) -> torch.Tensor:
    a, b = inputs["mat_a"].float(), memo(inputs, "b", lambda: inputs["mat_b"].float(), ("mat_b",))
    return (a @ b) * inputs["scales_a"].float().view(-1, 1) * inputs["scales_b"].float().view(1, -1)


def _scaled_mm_traffic(case: Case, fmt: str, note: str) -> Traffic:
    m, n, k = _mnk(case)
    nbytes = m * k + weight_bytes(k, n, fmt) + 4 * (m + n) + m * n * OUT_BYTES["bf16"]
    return Traffic(nbytes, gemm_flops(m, n, k), note, compute=fmt)  # int8 / fp8 tensor cores


def _bind_scaled_mm(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """sgl_kernel int8_scaled_mm / fp8_scaled_mm(mat_a, mat_b, scales_a, scales_b, out_dtype)."""
    a, b, sa, sb = inputs["mat_a"], inputs["mat_b"], inputs["scales_a"], inputs["scales_b"]
    return lambda: fn(a, b, sa, sb, BF16_OUT)


def _bind_triton_scaled_mm(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """triton_scaled_mm(input [M,K], weight [K,N], scale_a [M,1], scale_b [N,1], out_dtype)."""
    a, b, sa, sb = inputs["mat_a"], inputs["mat_b"], inputs["scales_a"], inputs["scales_b"]
    return lambda: fn(a, b, sa, sb, BF16_OUT)


def _bind_torch_mm_bf16(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """torch.mm in BF16 (cuBLAS) on the dequantised operands: what a BF16 projection of the checkpoint
    runs (UnquantizedLinearMethod -> F.linear), at the same shapes as the FP8 rows."""
    x = (inputs["mat_a"].float() * inputs["scales_a"].float().view(-1, 1)).to(torch.bfloat16)
    wt = (inputs["mat_b"].float() * inputs["scales_b"].float().view(1, -1)).to(
        torch.bfloat16
    )  # [K,N] col-major
    out = torch.empty(x.shape[0], wt.shape[1], dtype=torch.bfloat16, device=x.device)
    return lambda: fn(x, wt, out=out)


def _bf16_linear_traffic(case: Case) -> Traffic:
    m, n, k = _mnk(case)
    nbytes = 2 * m * k + weight_bytes(k, n, "bf16") + m * n * OUT_BYTES["bf16"]
    return Traffic(nbytes, gemm_flops(m, n, k), f"BF16 {case.op} (cuBLAS): BF16 activations, weight, output")


_TRITON_SCALED_MM = "sglang.kernels.ops.quantization.fp8_kernel:triton_scaled_mm"


@register
class Int8ScaledMM(_WhatIfLinear):
    kernel = "int8_scaled_mm"
    fmt = "W8A8-INT8"
    description = "W8A8 INT8 GEMM, per-token x per-channel scales (--quantization w8a8_int8)"
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.gemm:int8_scaled_mm",
            None,
            "aot",
            _bind_scaled_mm,
            label="what-if: this projection in W8A8-INT8 (CUTLASS, what sglang's w8a8_int8 runs)",
        ),
        Backend(
            "sglang_triton",
            _TRITON_SCALED_MM,
            None,
            "triton",
            _bind_triton_scaled_mm,
            label="what-if W8A8-INT8 through sglang's Triton scaled_mm (int32 accumulate; not sglang's INT8 path)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return _scaled_mm_inputs(case, device, seed, torch.int8)

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return _scaled_mm_reference(inputs)

    def traffic(self, case: Case) -> Traffic:
        return _scaled_mm_traffic(case, "int8", self._note(case))


@register
class Fp8ScaledMM(_WhatIfLinear):
    kernel = "fp8_scaled_mm"
    fmt = "W8A8-FP8 (per-token x per-channel)"
    description = "FP8 e4m3 GEMM, per-token activation x per-channel weight scales"
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.gemm:fp8_scaled_mm",
            None,
            "aot",
            _bind_scaled_mm,
            label="what-if: this projection in per-channel FP8 (CUTLASS; sglang's apply_fp8_linear path)",
            note="sglang.kernels.ops.gemm:fp8_scaled_mm is a registry wrapper over this same AOT kernel",
        ),
        Backend(
            "sglang_triton",
            _TRITON_SCALED_MM,
            None,
            "triton",
            _bind_triton_scaled_mm,
            label="what-if per-channel FP8 via Triton scaled_mm (sglang's fallback without CUTLASS FP8)",
        ),
        Backend(
            "torch.mm.bf16",
            "torch:mm",
            "torch",
            "torch",
            _bind_torch_mm_bf16,
            requires=ANY_CUDA,
            label="BF16 cuBLAS: what NVFP4-v2 runs at its BF16 projections (q_b_proj, kv_b_proj, ...)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return _scaled_mm_inputs(case, device, seed, fp8.FP8_DTYPE)

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return _scaled_mm_reference(inputs)

    def traffic(self, case: Case) -> Traffic:
        return _scaled_mm_traffic(case, "fp8", self._note(case))

    def traffic_for(self, backend: str, case: Case) -> Traffic:
        return _bf16_linear_traffic(case) if backend == "torch.mm.bf16" else self.traffic(case)


# -- FP8 block-scaled (DeepSeek FP8: 1x128 activations, 128x128 weights) ----------------------------


def _bind_cutlass_blockwise(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """(mat_a [M,K], mat_b = W.t() col-major, scales_a [M,K/128] col-major, scales_b = Ws.t(), out_dtype).

    The sm120 JIT and the retired sm90/sm100 AOT share this signature.
    """
    a, w = inputs["a"], inputs["w"]
    sa = fp8.scale_layout(inputs["a_scale"], "col")
    sb = inputs["w_scale"].t()  # [K/128, N/128] with stride(0) == 1
    return lambda: fn(a, w.t(), sa, sb, BF16_OUT)


def _bind_fi_blockscale_sm90(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """flashinfer fp8_blockscale_gemm_sm90(input BF16 [M,K], weight e4m3 [N,K], None, weight_scale
    [N/128, K/128]) as sglang's `--fp8-gemm-backend flashinfer_deepgemm` calls it: the kernel quantizes
    the activations itself (1x128 groups), so the reference (dequantized 1x128 FP8 activations) holds.

    Its FP8-input form (input_scale [M, K/128]) is not what sglang runs, and it came out far off the
    dequantized reference, while this BF16-input form was close to the unquantized product
    (scripts/probe_fi_blockscale.py; results/h200-2026-11-21/README.md gives the errors)."""
    x, w, sw = inputs["x"], inputs["w"], inputs["w_scale"]
    out = torch.empty(x.shape[0], w.shape[0], dtype=BF16_OUT, device=x.device)
    return lambda: fn(x, w, None, sw, out=out, out_dtype=BF16_OUT)


def _bind_triton_blockwise(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """w8a8_block_fp8_matmul_triton(A [M,K], B [N,K], As [M,K/128] row-major, Bs, [128,128], out dtype)."""
    a, w, sa, sw = inputs["a"], inputs["w"], inputs["a_scale"], inputs["w_scale"]
    return lambda: fn(a, w, sa, sw, [fp8.GROUP, fp8.GROUP], BF16_OUT)


def _bind_deep_gemm(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """deep_gemm.fp8_gemm_nt((A, As col-major TMA-aligned), (B [N,K], Bs), out), as sglang calls it."""
    a, w, sw = inputs["a"], inputs["w"], inputs["w_scale"]
    sa = fp8.scale_layout(inputs["a_scale"], "col_tma")
    out = torch.empty(a.shape[0], w.shape[0], dtype=BF16_OUT, device=a.device)

    def launch() -> torch.Tensor:
        fn((a, sa), (w, sw), out)
        return out

    return launch


@register
class Fp8BlockwiseScaledMM(_WhatIfLinear):
    kernel = "fp8_blockwise_scaled_mm"
    fmt = "block-FP8 (DeepSeek FP8 checkpoint format)"
    description = "FP8 GEMM with 1x128 activation and 128x128 weight scales (DeepSeek-V3/R1 FP8 checkpoint)"
    backends = [
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.fp8_blockwise_gemm:fp8_blockwise_scaled_mm",
            None,
            "jit",
            _bind_cutlass_blockwise,
            requires=SM120,
            label="traced kernel's current home (CUTLASS, raises unless SM120)",
        ),
        Backend(
            "sgl_kernel",
            "sgl_kernel.gemm:fp8_blockwise_scaled_mm",
            None,
            "aot",
            _bind_cutlass_blockwise,
            label="the traced AOT kernel (sgl-kernel <= 0.3.x; removed in 0.4.5)",
        ),
        Backend(
            "deep_gemm",
            "deep_gemm:fp8_gemm_nt",
            "sgl-deep-gemm",
            "jit",
            _bind_deep_gemm,
            requires=Requirement(min_sm=90),
            label="what sglang 0.5.16 auto-selects for block-FP8 linears on Hopper when DeepGEMM is installed",
        ),
        Backend(
            "flashinfer",
            "flashinfer.gemm:fp8_blockscale_gemm_sm90",
            None,
            "jit",
            _bind_fi_blockscale_sm90,
            requires=SM90_ONLY,
            label="--fp8-gemm-backend flashinfer_deepgemm (BF16 activations, quantized in-kernel, as sglang passes them)",
        ),
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.quantization.fp8_kernel:w8a8_block_fp8_matmul_triton",
            None,
            "triton",
            _bind_triton_blockwise,
            label="sglang's Hopper fallback without DeepGEMM (triton_w8a8_block_fp8_linear)",
            note="w8a8_block_fp8_matmul (the 'universal entry') forwards to DeepGEMM when enabled; this is "
            "its Triton branch",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        """a [M,K] e4m3 + a_scale [M,K/128] (row-major); w [N,K] e4m3 + w_scale [ceil(N/128), K/128]."""
        m, n, k = _mnk(case)
        g = _gen(device, seed)
        x = _randn((m, k), g, device, dtype=torch.bfloat16)
        w = _randn((n, k), g, device, WEIGHT_STD, torch.bfloat16)
        a, sa = fp8.per_token_group_quant(x)
        wq, sw = fp8.block_quant(w)
        # x: the BF16 activations, for backends that quantize them in-kernel (flashinfer's sm90 one)
        return {"a": a, "a_scale": sa, "w": wq, "w_scale": sw, "x": x}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        a = fp8.dequant_per_token_group(inputs["a"], inputs["a_scale"])
        w = memo(inputs, "w", lambda: fp8.dequant_block(inputs["w"], inputs["w_scale"]), ("w", "w_scale"))
        return a @ w.t()

    def traffic(self, case: Case) -> Traffic:
        m, n, k = _mnk(case)
        scales = 4 * m * (k // fp8.GROUP) + 4 * math.ceil(n / fp8.GROUP) * math.ceil(k / fp8.GROUP)
        nbytes = m * k + weight_bytes(k, n, "fp8") + scales + m * n * OUT_BYTES["bf16"]
        return Traffic(nbytes, gemm_flops(m, n, k), self._note(case), compute="fp8")

    def traffic_for(self, backend: str, case: Case) -> Traffic:
        if backend != "flashinfer":
            return self.traffic(case)
        m, n, k = _mnk(case)  # BF16 activations in, no activation scales
        nbytes = (
            2 * m * k + weight_bytes(k, n, "fp8") + 4 * math.ceil(n / fp8.GROUP) * math.ceil(k / fp8.GROUP)
        )
        nbytes += m * n * OUT_BYTES["bf16"]
        return Traffic(
            nbytes,
            gemm_flops(m, n, k),
            self._note(case) + "; BF16 activations, quantized in-kernel",
            compute="fp8",
        )


# -- QServe W4A8 ---------------------------------------------------------------------------------------
# Packing from sgl-project/sglang sgl-kernel/tests/test_qserve_w4a8_per_{chn,group}_gemm.py (adapted from
# omniserve's w4a8_linear.py): 32x32 tiles, nibbles interleaved for the kernel's ldmatrix/mma.m16n8k32.

_QSERVE_TILE = (0, 4, 3, 6, 1, 5, 2, 7)  # [N/32,2,2,8,K/32,2,4,4] -> tile-major
_QSERVE_PAIR = (0, 1, 2, 3, 5, 6, 7, 4)  # move the nibble-pair axis last


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.argsort(torch.tensor(perm)))


def qserve_pack_w4(q: torch.Tensor) -> torch.Tensor:
    """int4 values [N, K] (0..15) -> QServe-packed int8 [N, K/2]."""
    n, k = q.shape
    if n % 32 or k % 32:
        raise ValueError(f"QServe packing needs N and K multiples of 32, got {n}x{k}")
    t = q.to(torch.int16).reshape(n // 32, 2, 2, 8, k // 32, 2, 4, 4).permute(_QSERVE_TILE)
    t = t.permute(_QSERVE_PAIR).contiguous()
    packed = (t[..., 1] << 4) | t[..., 0]
    return packed.to(torch.uint8).reshape(n, k // 2).view(torch.int8)


def qserve_unpack_w4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of qserve_pack_w4: QServe-packed int8 [N, K/2] -> int4 values [N, K] as int8."""
    n, k = packed.shape[0], packed.shape[1] * 2
    p = packed.view(torch.uint8).to(torch.int16).reshape(n // 32, k // 32, 8, 4, 2, 2, 4)
    t = torch.stack([p & 0xF, (p >> 4) & 0xF], dim=-1)
    t = t.permute(_inverse(_QSERVE_PAIR)).permute(_inverse(_QSERVE_TILE))
    return t.reshape(n, k).to(torch.int8)


def qserve_pack_group_param(t: torch.Tensor) -> torch.Tensor:
    """Per-group int8 zeros/scales [N, K/128] -> the kernel's [K/128, N] with 0,8,16,24,1,9,... order."""
    n, groups = t.shape
    return t.t().reshape(groups, n // 32, 4, 8).transpose(-2, -1).reshape(groups, n).contiguous()


def qserve_unpack_group_param(t: torch.Tensor) -> torch.Tensor:
    groups, n = t.shape
    return t.reshape(groups, n // 32, 8, 4).transpose(-2, -1).reshape(groups, n).t().contiguous()


def _qserve_activations(m: int, k: int, g: torch.Generator, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-token INT8 activations and their fp16 scales [M] (QServe's ascales)."""
    x = _randn((m, k), g, device)
    s = (x.abs().amax(dim=-1) / fp8.INT8_MAX).to(torch.float16)
    a = torch.round(x / s.float().unsqueeze(1)).clamp(-128, 127).to(torch.int8)
    return a, s


def _qserve_skip(case: Case, tile_n: int) -> str | None:
    n, k = int(case.dims["N"]), int(case.dims["K"])
    if n % tile_n:
        return f"QServe kernel tiles N by {tile_n} with no tail (N={n})"
    if k % 128:
        return f"QServe kernel needs K % 128 == 0 (K={k})"
    return None


def _bind_qserve_chn(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x = inputs
    out = torch.empty(
        x["in_feats"].shape[0], x["kernel"].shape[0], dtype=torch.float16, device=x["kernel"].device
    )
    args = (x["in_feats"], x["kernel"], x["wscales"], x["ascales"], x["w_szs"], x["a_ssums"], out)
    return lambda: fn(*args)


def _bind_qserve_group(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x = inputs
    out = torch.empty(
        x["in_feats"].shape[0], x["kernel"].shape[0], dtype=torch.float16, device=x["kernel"].device
    )
    args = (x["in_feats"], x["kernel"], x["zeros"], x["scales_i8"], x["wscales"], x["ascales"], out)
    return lambda: fn(*args)


def _qserve_traffic(case: Case, group_params: bool, note: str) -> Traffic:
    m, n, k = _mnk(case)
    nbytes = m * k + weight_bytes(k, n, "int4") + 2 * n + 2 * m + 2 * m * n  # in, W, wscales, ascales, out
    nbytes += 2 * n * (k // 128) if group_params else 2 * n + 2 * m  # int8 zeros+scales | w_szs + a_ssums
    return Traffic(nbytes, gemm_flops(m, n, k), note, compute="int8")  # int8 MMA on the unpacked weights


_QSERVE_NOTE = (
    "packing reproduced from sgl-kernel's own tests (sgl-kernel/tests/test_qserve_w4a8_*); "
    "not yet run against the 0.4.5 binary"
)


@register
class QServeW4A8PerChn(_WhatIfLinear):
    kernel = "qserve_w4a8_per_chn_gemm"
    fmt = "QServe W4A8 per-channel"
    description = "QServe/QoQ W4A8 GEMM: INT8 activations x asymmetric INT4 weights, per-channel scales"
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.gemm:qserve_w4a8_per_chn_gemm",
            None,
            "aot",
            _bind_qserve_chn,
            requires=Requirement(min_sm=80),
            label="what-if: this projection in QServe W4A8 (sglang 0.5.16 no longer has a QoQ path)",
            note=_QSERVE_NOTE,
        ),
    ]

    def skip_reason(self, case: Case) -> str | None:
        return _qserve_skip(case, 128 if int(case.dims["M"]) > 256 else 64)

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        """Asymmetric 4-bit per output channel (scale s, zero z); w_szs = z*s, a_ssums = ascale*sum(a_q)."""
        m, n, k = _mnk(case)
        g = _gen(device, seed)
        a, ascale = _qserve_activations(m, k, g, device)
        w = _randn((n, k), g, device, WEIGHT_STD)
        lo, hi = w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True)
        s = ((hi - lo) / 15).clamp_min(1e-8)
        z = torch.round(-lo / s)
        q = (torch.round(w / s) + z).clamp(0, 15)
        return {
            "in_feats": a,
            "kernel": qserve_pack_w4(q),
            "wscales": s.squeeze(1).to(torch.float16),
            "ascales": ascale,
            "w_szs": (z * s).squeeze(1).to(torch.float16),
            "a_ssums": (ascale.float() * a.float().sum(dim=-1)).to(torch.float16),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        """The kernel's epilogue: (a_q . q) * wscale[n] * ascale[m] - w_szs[n] * a_ssums[m]."""
        q = memo(inputs, "q", lambda: qserve_unpack_w4(inputs["kernel"]).float(), ("kernel",))
        acc = (inputs["in_feats"].float() @ q.t()).double()
        ws, wsz = inputs["wscales"].double(), inputs["w_szs"].double()
        asc, ass = inputs["ascales"].double(), inputs["a_ssums"].double()
        return (acc * ws[None, :] * asc[:, None] - wsz[None, :] * ass[:, None]).float()

    def traffic(self, case: Case) -> Traffic:
        return _qserve_traffic(case, False, self._note(case))


@register
class QServeW4A8PerGroup(_WhatIfLinear):
    kernel = "qserve_w4a8_per_group_gemm"
    fmt = "QServe W4A8 per-group (g128)"
    description = "QServe/QoQ W4A8 GEMM with progressive group quantisation (INT8 per channel, INT4 per 128)"
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.gemm:qserve_w4a8_per_group_gemm",
            None,
            "aot",
            _bind_qserve_group,
            requires=Requirement(min_sm=80),
            label="what-if: this projection in QServe W4A8 g128 (sglang 0.5.16 no longer has a QoQ path)",
            note=_QSERVE_NOTE,
        ),
    ]

    def skip_reason(self, case: Case) -> str | None:
        return _qserve_skip(case, 64)

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        """Progressive quantisation as sgl-kernel's test: INT8 per channel (range 119), then INT4 per 128."""
        m, n, k = _mnk(case)
        g = _gen(device, seed)
        a, ascale = _qserve_activations(m, k, g, device)
        w = _randn((n, k), g, device, WEIGHT_STD)
        chn = w.abs().amax(dim=-1, keepdim=True) / 119
        wi8 = torch.round(w / chn).clamp(-119, 119).reshape(n, k // 128, 128)
        lo, hi = wi8.amin(dim=-1, keepdim=True), wi8.amax(dim=-1, keepdim=True)
        s = torch.round((hi - lo) / 15).clamp_min(1)
        z = -torch.round(lo / s)
        q = (torch.round(wi8 / s) + z).clamp(0, 15).reshape(n, k)
        s8, z8 = s.squeeze(-1).to(torch.int8), z.squeeze(-1).to(torch.int8)
        return {
            "in_feats": a,
            "kernel": qserve_pack_w4(q),
            "zeros": qserve_pack_group_param((-z8.to(torch.int16) * s8.to(torch.int16)).to(torch.int8)),
            "scales_i8": qserve_pack_group_param(s8),
            "wscales": chn.squeeze(1).to(torch.float16),
            "ascales": ascale,
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        """w[n,k] = q*s + zero (= (q - z)*s) per 128-group; out = (a_q . w) * ascale[m] * wscale[n]."""

        def weight() -> torch.Tensor:
            q = qserve_unpack_w4(inputs["kernel"]).float()
            s = qserve_unpack_group_param(inputs["scales_i8"]).float().repeat_interleave(128, dim=1)
            zs = qserve_unpack_group_param(inputs["zeros"]).float().repeat_interleave(128, dim=1)
            return q * s + zs

        acc = inputs["in_feats"].float() @ memo(inputs, "w", weight, ("kernel", "scales_i8", "zeros")).t()
        return acc * inputs["ascales"].float()[:, None] * inputs["wscales"].float()[None, :]

    def traffic(self, case: Case) -> Traffic:
        return _qserve_traffic(case, True, self._note(case))


# -- bmm_fp8: absorbed MLA (q_nope x w_kc, attn x w_vc) -----------------------------------------------


def _bind_sgl_bmm_fp8(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """sgl_kernel.bmm_fp8(A, B, A_scale, B_scale, dtype, out) (cuBLASLt, cached 32 MiB workspace)."""
    a, b = inputs["A"], inputs["B"]
    out = torch.empty(a.shape[0], a.shape[1], b.shape[2], dtype=BF16_OUT, device=a.device)
    sa, sb = inputs["A_scale"], inputs["B_scale"]
    return lambda: fn(a, b, sa, sb, BF16_OUT, out)


def _bind_fi_bmm_fp8(fn: Any, inputs: dict[str, Any], case: Case, backend: str) -> Callable[[], Any]:
    a, b = inputs["A"], inputs["B"]
    out = torch.empty(a.shape[0], a.shape[1], b.shape[2], dtype=BF16_OUT, device=a.device)
    sa, sb = inputs["A_scale"], inputs["B_scale"]
    return lambda: fn(a, b, sa, sb, BF16_OUT, out=out, backend=backend)


def _bind_torch_bmm_bf16(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """torch.bmm in BF16 as sglang runs it for the NVFP4-v2 checkpoint (BF16 w_kc / w_vc).

    A is the transposed view of the [T, heads, K] activation, B keeps the column-major weight.
    """
    a = (
        fp8.dequant(inputs["A"], inputs["A_scale"])
        .to(torch.bfloat16)
        .transpose(0, 1)
        .contiguous()
        .transpose(0, 1)
    )
    b = fp8.dequant(inputs["B"], inputs["B_scale"]).to(torch.bfloat16)
    b = b.transpose(-2, -1).contiguous().transpose(-2, -1)
    return lambda: fn(a, b)


@register
class BmmFp8(Adapter):
    kernel = "bmm_fp8"
    role = "bmm"
    ops = ("forward_absorb_prepare", "forward_absorb_core")
    description = "FP8 batched GEMM of MLA weight absorption (per-tensor scales; FP8 checkpoints only)"
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.gemm:bmm_fp8",
            None,
            "aot",
            _bind_sgl_bmm_fp8,
            label="what FP8 DeepSeek checkpoints run (forward_mla.py)",
        ),
        Backend(
            "flashinfer.cublas",
            "flashinfer.gemm:bmm_fp8",
            None,
            "jit",
            functools.partial(_bind_fi_bmm_fp8, backend="cublas"),
            requires=Requirement(min_sm=89),
        ),
        Backend(
            "flashinfer.cudnn",
            "flashinfer.gemm:bmm_fp8",
            None,
            "jit",
            functools.partial(_bind_fi_bmm_fp8, backend="cudnn"),
            requires=Requirement(min_sm=89),
            preload=("cudnn",),  # flashinfer raises at call time without it; say so at resolve time
            note="needs the cudnn Python package (nvidia-cudnn-frontend)",
        ),
        Backend(
            "flashinfer.cutlass",
            "flashinfer.gemm:bmm_fp8",
            None,
            "jit",
            functools.partial(_bind_fi_bmm_fp8, backend="cutlass"),
            requires=SM100_FAMILY,
        ),
        Backend(
            "torch.bmm.bf16",
            "torch:bmm",
            "torch",
            "torch",
            _bind_torch_bmm_bf16,
            requires=ANY_CUDA,
            label="what NVFP4-v2 runs here: torch.bmm in BF16 (kv_b_proj is BF16)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        """A [b,M,K] e4m3 contiguous, B [b,K,N] e4m3 column-major in the last two dims, fp32 [1] scales."""
        d = case.dims
        b, m, k, n = int(d["b"]), int(d["M"]), int(d["K"]), int(d["N"])
        g = _gen(device, seed)
        x = _randn((m, b, k), g, device, dtype=torch.bfloat16).transpose(0, 1)  # q_nope.transpose(0, 1)
        w = _randn((b, n, k), g, device, WEIGHT_STD, torch.bfloat16)
        a, sa = fp8.per_tensor_quant(x.contiguous())
        wq, sw = fp8.per_tensor_quant(w)
        return {"A": a, "B": wq.transpose(-2, -1), "A_scale": sa, "B_scale": sw}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        a = fp8.dequant(inputs["A"], inputs["A_scale"])
        b = fp8.dequant(inputs["B"], inputs["B_scale"])
        return torch.bmm(a, b)

    def traffic(self, case: Case) -> Traffic:
        d = case.dims
        b, m, k, n = int(d["b"]), int(d["M"]), int(d["K"]), int(d["N"])
        nbytes = b * m * k + b * k * n + 2 * 4 + b * m * n * OUT_BYTES["bf16"]
        return Traffic(nbytes, gemm_flops(m, n, k, b), "per-tensor FP8 A and B; BF16 out", compute="fp8")

    def traffic_for(self, backend: str, case: Case) -> Traffic:
        if backend != "torch.bmm.bf16":
            return self.traffic(case)
        d = case.dims
        b, m, k, n = int(d["b"]), int(d["M"]), int(d["K"]), int(d["N"])
        nbytes = 2 * (b * m * k + b * k * n) + b * m * n * OUT_BYTES["bf16"]
        return Traffic(nbytes, gemm_flops(m, n, k, b), "BF16 A and B (torch.bmm); BF16 out")


# -- dsv3_fused_a_gemm: fused_qkv_a_proj_with_mqa for T <= 16 ----------------------------------------


def _fused_a_t(case: Case) -> str | None:
    m = int(case.dims["M"])
    if not 1 <= m <= FUSED_A_MAX_T:
        return f"sglang calls dsv3_fused_a_gemm only for 1 <= T <= {FUSED_A_MAX_T} (T={m})"
    return None


def _router_t(case: Case) -> str | None:
    m = int(case.dims["M"])
    if not 1 <= m <= ROUTER_MAX_T:
        return f"sglang calls dsv3_router_gemm only for 1 <= T <= {ROUTER_MAX_T} on sm90 (T={m})"
    return None


def _bind_fused_a(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """(mat_a [M,K] bf16 row-major, mat_b = weight.t() [K,N] column-major) -> [M,N] bf16."""
    a, b = inputs["mat_a"], inputs["mat_b"]
    if _takes(fn, "backend"):  # the 0.5.16 dispatcher: let it choose as sglang does (auto)
        return lambda: fn(a, b, backend="auto")
    return lambda: fn(a, b)


def _bind_linear(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """torch.nn.functional.linear(x, weight [N,K]) -> cuBLAS BF16 GEMM."""
    a, w = inputs["mat_a"], inputs["mat_b"].t()
    return lambda: fn(a, w)


@register
class Dsv3FusedAGemm(Adapter):
    kernel = "dsv3_fused_a_gemm"
    role = "gemm"
    ops = ("fused_qkv_a_proj_with_mqa",)
    description = "min-latency BF16 GEMM for fused_qkv_a_proj_with_mqa ([T<=16, 7168] x [7168, 2112])"
    backends = [
        Backend(
            "sglang.fused_a_gemm",
            "sglang.jit_kernel.fused_a_gemm:dsv3_fused_a_gemm",
            None,
            "jit",
            _bind_fused_a,
            requires=Requirement(min_sm=90),
            skip=_fused_a_t,
            dispatches_to="sglang.jit_kernel.dsv3_fused_a_gemm (auto below SM120; CuTe-DSL on SM120+)",
            label="what sglang 0.5.16 calls (linear_with_fused_a_gemm)",
        ),
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.dsv3_fused_a_gemm:dsv3_fused_a_gemm",
            None,
            "jit",
            _bind_fused_a,
            requires=Requirement(min_sm=90),
            skip=_fused_a_t,
        ),
        Backend(
            "sgl_kernel",
            "sgl_kernel.gemm:dsv3_fused_a_gemm",
            None,
            "aot",
            _bind_fused_a,
            requires=Requirement(min_sm=90),
            skip=_fused_a_t,
        ),
        Backend(
            "sglang_cutedsl",
            "sglang.jit_kernel.cutedsl_dsv3_fused_a_gemm:dsv3_fused_a_gemm",
            None,
            "cutedsl",
            _bind_fused_a,
            requires=Requirement(min_sm=90),
            skip=_fused_a_t,
            label="CuTe-DSL variant (sglang auto-selects it only on SM120+; its source accepts SM90+)",
            note="needs nvidia-cutlass-dsl; N in {2112, 6144}, K % 1024 == 0",
        ),
        Backend(
            "torch.linear",
            "torch.nn.functional:linear",
            "torch",
            "torch",
            _bind_linear,
            label="cuBLAS BF16 F.linear: what sglang runs for this projection when T > 16",
        ),
    ]

    def applies(self, case: Case) -> bool:
        return case.op == "fused_qkv_a_proj_with_mqa"

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        m, n, k = _mnk(case)
        g = _gen(device, seed)
        x = _randn((m, k), g, device, dtype=torch.bfloat16)
        w = _randn((n, k), g, device, WEIGHT_STD, torch.bfloat16)
        return {"mat_a": x, "mat_b": w.t()}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return (inputs["mat_a"].double() @ inputs["mat_b"].double()).float()

    def traffic(self, case: Case) -> Traffic:
        m, n, k = _mnk(case)
        nbytes = weight_bytes(k, n, "bf16") + 2 * m * k + 2 * m * n
        return Traffic(nbytes, gemm_flops(m, n, k), "BF16 weight")


# -- dsv3_router_gemm: MoE gate logits for T <= 16 ----------------------------------------------------


def _bind_router_jit(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """dsv3_router_gemm(hidden [T,K], weight [E,K], out_dtype=float32[, output]) as 0.5.16 calls it."""
    h, w = inputs["hidden_states"], inputs["router_weights"]
    if _takes(fn, "output"):
        out = torch.empty(h.shape[0], w.shape[0], dtype=torch.float32, device=h.device)
        return lambda: fn(h, w, torch.float32, out)
    return lambda: fn(h, w, torch.float32)  # the retired AOT (sgl-kernel 0.3.x) had no `output`


def _bind_router_flashinfer(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """mm_M1_16_K7168_N256(mat_a [T,7168], mat_b [7168,256] column-major, out fp32)."""
    h, w = inputs["hidden_states"], inputs["router_weights"]
    out = torch.empty(h.shape[0], w.shape[0], dtype=torch.float32, device=h.device)

    def launch() -> torch.Tensor:
        fn(h, w.t(), out, launch_with_pdl=True)
        return out

    return launch


def _bind_router_cublas(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """linear_bf16_fp32(x [T,K], y [E,K]) = torch.mm(x, y.t(), out_dtype=float32)."""
    h, w = inputs["hidden_states"], inputs["router_weights"]
    return lambda: fn(h, w)


@register
class Dsv3RouterGemm(Adapter):
    kernel = "dsv3_router_gemm"
    role = "gemm"
    ops = ("gate",)
    description = "router logits [T<=16, 7168] x [256, 7168]^T -> fp32 (DeepSeek MoE gate)"
    backends = [
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.dsv3_router_gemm:dsv3_router_gemm",
            None,
            "jit",
            _bind_router_jit,
            requires=Requirement(min_sm=90),
            skip=_router_t,
            fallbacks=("sgl_kernel.gemm:dsv3_router_gemm",),
            label="what sglang 0.5.16 calls for T <= 16 (out_dtype=float32)",
            note="sglang.kernels.ops.gemm:dsv3_router_gemm is a registry wrapper over this JIT kernel",
        ),
        Backend(
            "flashinfer",
            "flashinfer.gemm:mm_M1_16_K7168_N256",
            None,
            "jit",
            _bind_router_flashinfer,
            requires=Requirement(sm=(100, 103)),
            skip=_router_t,
        ),
        Backend(
            "cublas",
            "sglang.jit_kernel.dsv4.gemm:linear_bf16_fp32",
            None,
            "torch",
            _bind_router_cublas,
            label="cuBLAS bf16->fp32 (torch.mm out_dtype): sglang's router GEMM for T > 16",
        ),
    ]

    def applies(self, case: Case) -> bool:
        return case.op == "gate"

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        m, n, k = _mnk(case)
        g = _gen(device, seed)
        h = _randn((m, k), g, device, dtype=torch.bfloat16)
        w = _randn((n, k), g, device, WEIGHT_STD, torch.bfloat16)
        return {"hidden_states": h, "router_weights": w}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        """In float64: the fp32 output's tolerance (1e-4) must hold even if TF32 matmul is enabled."""
        return (inputs["hidden_states"].double() @ inputs["router_weights"].double().t()).float()

    def traffic(self, case: Case) -> Traffic:
        m, n, k = _mnk(case)
        nbytes = weight_bytes(k, n, "bf16") + 2 * m * k + OUT_BYTES["fp32"] * m * n
        return Traffic(nbytes, gemm_flops(m, n, k), "BF16 weight, fp32 logits")
