"""RMSNorm adapters: `rmsnorm` (catalogue 3.1) and `fused_add_rmsnorm` (3.2).

What SGLang 0.5.16 runs for DeepSeek-R1-NVFP4 on sm90 (`srt/layers/layernorm.py`, `RMSNorm.forward_cuda`):
* `rmsnorm` (first input_layernorm, q_a/kv_a_layernorm, NextN enorm/hnorm/final norm): the Python
  wrapper `sgl_kernel.rmsnorm`, which forwards bf16 input to `flashinfer.norm.rmsnorm` (CuTe-DSL kernel).
  Backend "sgl_kernel.wrapper" (labelled); "flashinfer" is the same kernel called directly.
* `fused_add_rmsnorm` (input/post_attention_layernorm with residual): `sgl_kernel.fused_add_rmsnorm`,
  which forwards to `flashinfer.norm.fused_add_rmsnorm`. `sglang.jit_kernel.norm.fused_add_rmsnorm` is
  used only for `cast_x_before_out_mul` (not DeepSeek).
The sgl-kernel AOT kernels are reached only through `torch.ops.sgl_kernel.{rmsnorm,fused_add_rmsnorm}`
(backend "sgl_kernel"). `sglang.kernels.ops.layernorm.rmsnorm` dispatches to the same wrapper, so it is
not a separate backend.

`layernorm` (flashinfer.norm.layernorm) is DeepSeek-V3.2's: the NSA indexer's `k_norm` is
LayerNorm(128) with fp32 gamma/beta over the bf16 key [T, 128]; SGLang's `LayerNorm.forward_cuda` calls
flashinfer for bf16 input with fp32 parameters (`flashinfer.norm.layernorm(input, gemma, beta, eps)`,
a CuTe-DSL kernel unless FLASHINFER_USE_CUDA_NORM=1). DeepSeek-R1 has no LayerNorm.

q_a_layernorm / kv_a_layernorm read column slices of the fused_qkv_a output (row stride 2112): the
inputs are built that way and passed strided to every kernel that takes a row stride (all but the
Triton kernel, which assumes packed rows and gets a contiguous copy made in bind).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import SGLANG_SM90, enable_pdl, generator, model_config, nbytes, randn
from dskbench.shapes.cases import Case

DTYPE = torch.bfloat16


def _eps() -> float:
    return float(model_config()["rms_norm_eps"])


def _column_offset(case: Case) -> int:
    """Where the normed slice starts in a fused_qkv_a row: q at 0, k_nope after the q_lora_rank columns."""
    return int(model_config()["Lq"]) if case.op.startswith("kv_a") else 0


def _weight(d: int, gen: torch.Generator, device: str) -> torch.Tensor:
    # Trained RMSNorm gains sit around 1 with spread; never zero.
    return (1.0 + 0.2 * torch.randn(d, generator=gen)).to(DTYPE).to(device)


def _rms_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w.float()


# -- rmsnorm binders ---------------------------------------------------------------------------------


def _out_like(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _bind_rms_aot(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x, w, eps = inputs["x"], inputs["weight"], _eps()
    out, pdl = _out_like(x), enable_pdl(x)

    def launch() -> torch.Tensor:
        fn(out, x, w, eps, pdl)
        return out

    return launch


def _bind_rms_flashinfer(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # flashinfer.norm.rmsnorm and the sgl_kernel wrapper share (input, weight, eps, out, enable_pdl).
    x, w, eps = inputs["x"], inputs["weight"], _eps()
    out, pdl = _out_like(x), enable_pdl(x)
    return lambda: fn(x, w, eps, out, pdl)


def _bind_rms_jit(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # sglang.jit_kernel.norm.rmsnorm(input, weight, out, eps): out before eps; in place if out is None.
    x, w, eps = inputs["x"], inputs["weight"], _eps()
    out = _out_like(x)

    def launch() -> torch.Tensor:
        fn(x, w, out, eps)
        return out

    return launch


def _bind_rms_triton(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # fused_rmsnorm(x, weight, eps, autotune=False, inplace=False) indexes rows as pid * hidden: packed only.
    x, w, eps = inputs["x"].contiguous(), inputs["weight"], _eps()
    return lambda: fn(x, w, eps)


@register
class RMSNormAdapter(Adapter):
    kernel = "rmsnorm"
    role = "norm"
    ops = ("input_layernorm", "q_a_layernorm", "kv_a_layernorm", "enorm", "hnorm", "shared_head.norm")
    description = "RMSNorm over the hidden/latent dim (bf16, eps from the model config)"
    backends = [
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.rmsnorm.default",
            None,
            "aot",
            _bind_rms_aot,
            preload=("sgl_kernel",),
            note="the AOT kernel itself (the Python wrapper would forward to flashinfer)",
        ),
        Backend(
            "sgl_kernel.wrapper",
            "sgl_kernel.elementwise:rmsnorm",
            None,
            "cutedsl",
            _bind_rms_flashinfer,
            dispatches_to="flashinfer.norm.rmsnorm",
            label=SGLANG_SM90,
        ),
        Backend("flashinfer", "flashinfer.norm:rmsnorm", None, "cutedsl", _bind_rms_flashinfer),
        Backend("sglang_jit", "sglang.jit_kernel.norm:rmsnorm", None, "jit", _bind_rms_jit),
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.layernorm.elementwise:fused_rmsnorm",
            None,
            "triton",
            _bind_rms_triton,
            note="packed rows only: strided q_a/kv_a inputs are copied to contiguous in bind",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, d = int(case.dims["T"]), int(case.dims["D"])
        gen = generator(seed)
        stride = int(case.dims.get("stride", d))
        if stride != d:
            # A column slice of the fused_qkv_a output [T, 2112], as SGLang feeds q/k_nope.
            off = _column_offset(case)
            x = randn((t, stride), gen, device, DTYPE)[:, off : off + d]
        else:
            x = randn((t, d), gen, device, DTYPE)
        return {"x": x, "weight": _weight(d, gen, device)}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return _rms_ref(inputs["x"], inputs["weight"], _eps())

    def traffic(self, case: Case) -> Traffic:
        t, d = int(case.dims["T"]), int(case.dims["D"])
        return Traffic(bytes=nbytes(2 * t * d + d, DTYPE), flops=4 * t * d, note="read x, write y, read w")


# -- fused_add_rmsnorm -------------------------------------------------------------------------------


def _bind_fadd_aot(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x, r, w, eps = inputs["x"], inputs["residual"], inputs["weight"], _eps()
    pdl = enable_pdl(x)

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn(x, r, w, eps, pdl)
        return x, r

    return launch


def _bind_fadd_jit(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x, r, w, eps = inputs["x"], inputs["residual"], inputs["weight"], _eps()

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn(x, r, w, eps, cast_x_before_out_mul=False)
        return x, r

    return launch


@register
class FusedAddRMSNormAdapter(Adapter):
    """In place: residual += x; x = rmsnorm(residual) * w. The launcher returns (x, residual).

    Repeated launches keep adding the normalised output into the residual (it grows linearly, no
    overflow); the runner checks the first launch.
    """

    kernel = "fused_add_rmsnorm"
    role = "norm"
    ops = ("input_layernorm", "post_attention_layernorm")
    description = "residual add + RMSNorm, in place on the hidden states and the residual"
    backends = [
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.fused_add_rmsnorm.default",
            None,
            "aot",
            _bind_fadd_aot,
            preload=("sgl_kernel",),
            note="the AOT kernel itself (the Python wrapper would forward to flashinfer)",
        ),
        Backend(
            "sgl_kernel.wrapper",
            "sgl_kernel.elementwise:fused_add_rmsnorm",
            None,
            "cutedsl",
            _bind_fadd_aot,
            dispatches_to="flashinfer.norm.fused_add_rmsnorm",
            label=SGLANG_SM90,
        ),
        Backend("flashinfer", "flashinfer.norm:fused_add_rmsnorm", None, "cutedsl", _bind_fadd_aot),
        Backend("sglang_jit", "sglang.jit_kernel.norm:fused_add_rmsnorm", None, "jit", _bind_fadd_jit),
    ]

    def applies(self, case: Case) -> bool:
        # The q/kv latent norms (strided slices) never carry a residual.
        return "stride" not in case.dims

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, d = int(case.dims["T"]), int(case.dims["D"])
        gen = generator(seed)
        return {
            "x": randn((t, d), gen, device, DTYPE),
            "residual": randn((t, d), gen, device, DTYPE),
            "weight": _weight(d, gen, device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        # FusedOp.forward_native: normalise the fp32 sum, not the bf16-rounded residual.
        acc = inputs["x"].float() + inputs["residual"].float()
        return _rms_ref(acc, inputs["weight"], _eps()), acc

    def traffic(self, case: Case) -> Traffic:
        t, d = int(case.dims["T"]), int(case.dims["D"])
        return Traffic(
            bytes=nbytes(4 * t * d + d, DTYPE), flops=5 * t * d, note="read x, r; write x, r; read w"
        )


# -- layernorm (DeepSeek-V3.2 indexer k_norm) --------------------------------------------------------

LAYERNORM_EPS = 1e-6  # sglang.srt.layers.layernorm.LayerNorm's default, which the indexer keeps


def _bind_layernorm(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # flashinfer.norm.layernorm(input bf16, gemma fp32, beta fp32, eps) -> new bf16 output
    x, g, b = inputs["x"], inputs["gamma"], inputs["beta"]
    return lambda: fn(x, g, b, LAYERNORM_EPS)


@register
class LayerNormAdapter(Adapter):
    kernel = "layernorm"
    role = "norm"
    ops = ("nsa_indexer.forward",)
    description = "LayerNorm of DeepSeek-V3.2's indexer key [T, 128] (bf16 in/out, fp32 gamma and beta)"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.norm:layernorm",
            None,
            "cutedsl",
            _bind_layernorm,
            label=SGLANG_SM90,
            note="DeepSeek-V3.2 only: the NSA indexer's k_norm (LayerNorm.forward_cuda)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, d = int(case.dims["T"]), int(case.dims["D"])
        gen = generator(seed)
        # A projected key has a per-row offset LayerNorm removes: a mean error shows in the check.
        x = randn((t, d), gen, device, torch.float32) + randn((t, 1), gen, device, torch.float32, 2.0)
        return {
            "x": x.to(DTYPE),
            "gamma": (1.0 + 0.2 * torch.randn(d, generator=gen)).to(device),
            "beta": (0.1 * torch.randn(d, generator=gen)).to(device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        # LayerNorm.forward_native: fp32 F.layer_norm with the fp32 parameters
        x = inputs["x"].float()
        return torch.nn.functional.layer_norm(
            x, (x.shape[-1],), inputs["gamma"].float(), inputs["beta"].float(), LAYERNORM_EPS
        )

    def traffic(self, case: Case) -> Traffic:
        t, d = int(case.dims["T"]), int(case.dims["D"])
        return Traffic(
            bytes=nbytes(2 * t * d, DTYPE) + nbytes(2 * d, torch.float32),
            flops=7 * t * d,
            note="read x, write y (bf16); read fp32 gamma, beta. FLOPs nominal: mean, variance, affine",
        )
