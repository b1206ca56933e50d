"""`rmsnorm`, and the RMSNorm reference, weights and eps the norm kernels share.

What SGLang 0.5.16 runs for DeepSeek-R1-NVFP4 on sm90 (`srt/layers/layernorm.py`, `RMSNorm.forward_cuda`)
for `rmsnorm` (first input_layernorm, q_a/kv_a_layernorm, NextN enorm/hnorm/final norm): the Python
wrapper `sgl_kernel.rmsnorm`, which forwards bf16 input to `flashinfer.norm.rmsnorm` (CuTe-DSL kernel).
Backend "sgl_kernel.wrapper" (labelled); "flashinfer" is the same kernel called directly. The sgl-kernel
AOT kernel is reached only through `torch.ops.sgl_kernel.rmsnorm` (backend "sgl_kernel").
`sglang.kernels.ops.layernorm.rmsnorm` dispatches to the same wrapper, so it is not a separate backend.

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
from dskbench.adapters.common.inputs import SGLANG_SM90, enable_pdl, generator, nbytes, randn
from dskbench.shapes.cases import Case

DTYPE = torch.bfloat16


def rms_eps(case: Case) -> float:
    """The model's rms_norm_eps."""
    return float(case.model["rms_norm_eps"])


def _column_offset(case: Case) -> int:
    """Where the normed slice starts in a fused_qkv_a row: q at 0, k_nope after the q_lora_rank columns."""
    return int(case.model["Lq"]) if case.op.startswith("kv_a") else 0


def norm_weight(d: int, gen: torch.Generator, device: str) -> torch.Tensor:
    """Trained RMSNorm gains sit around 1 with spread; never zero."""
    return (1.0 + 0.2 * torch.randn(d, generator=gen)).to(DTYPE).to(device)


def rms_reference(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) * w in fp32."""
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w.float()


# -- rmsnorm binders ---------------------------------------------------------------------------------


def _out_like(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _bind_rms_aot(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x, w, eps = inputs["x"], inputs["weight"], rms_eps(case)
    out, pdl = _out_like(x), enable_pdl(x)

    def launch() -> torch.Tensor:
        fn(out, x, w, eps, pdl)
        return out

    return launch


def _bind_rms_flashinfer(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # flashinfer.norm.rmsnorm and the sgl_kernel wrapper share (input, weight, eps, out, enable_pdl).
    x, w, eps = inputs["x"], inputs["weight"], rms_eps(case)
    out, pdl = _out_like(x), enable_pdl(x)
    return lambda: fn(x, w, eps, out, pdl)


def _bind_rms_jit(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # sglang.jit_kernel.norm.rmsnorm(input, weight, out, eps): out before eps; in place if out is None.
    x, w, eps = inputs["x"], inputs["weight"], rms_eps(case)
    out = _out_like(x)

    def launch() -> torch.Tensor:
        fn(x, w, out, eps)
        return out

    return launch


def _bind_rms_triton(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # fused_rmsnorm(x, weight, eps, autotune=False, inplace=False) indexes rows as pid * hidden: packed only.
    x, w, eps = inputs["x"].contiguous(), inputs["weight"], rms_eps(case)
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
        return {"x": x, "weight": norm_weight(d, gen, device)}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return rms_reference(inputs["x"], inputs["weight"], rms_eps(case))

    def traffic(self, case: Case) -> Traffic:
        t, d = int(case.dims["T"]), int(case.dims["D"])
        return Traffic(bytes=nbytes(2 * t * d + d, DTYPE), flops=4 * t * d, note="read x, write y, read w")
