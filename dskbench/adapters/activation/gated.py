"""Gated activations `act(x[..., :d]) * x[..., d:]`: `silu_and_mul`, `gelu_and_mul`, `gelu_tanh_and_mul`.
Input [T, 2D] bf16 (gate | up), output [T, D].

What SGLang 0.5.16 runs for DeepSeek-R1-NVFP4 on sm90: `sglang.jit_kernel.activation.silu_and_mul`
(backend "sglang_jit", labelled) — imported on CUDA by `srt/layers/activation.py` (dense MLP act_fn,
shared expert) and by the Marlin MoE runner `fused_marlin_moe.py` (routed experts, [T*8, 2*I]).
DeepSeek's hidden_act is silu: the two GELU variants are never called for this model and are measured
at the same shapes only for completeness.

Other implementations: the sgl-kernel AOT op `torch.ops.sgl_kernel.<name>.default(out, input)`,
`flashinfer.activation.<name>`, and the Triton `silu_and_mul_triton` / `gelu_and_mul_triton` in
`sglang.kernels.ops.layernorm.elementwise` (used by other models). `sglang.kernels.ops.activation.*`
dispatches to the JIT kernel on CUDA, so it is not a separate backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import SGLANG_SM90, enable_pdl, generator, nbytes, randn
from dskbench.shapes.cases import Case

DTYPE = torch.bfloat16


def _out(x: torch.Tensor) -> torch.Tensor:
    return torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)


def _bind_aot(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x = inputs["x"]
    out = _out(x)

    def launch() -> torch.Tensor:
        fn(out, x)
        return out

    return launch


def _bind_jit(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x = inputs["x"]
    out = _out(x)
    return lambda: fn(x, out)


def _bind_flashinfer(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x = inputs["x"]
    out, pdl = _out(x), enable_pdl(x)
    return lambda: fn(x, out, pdl)


def _bind_triton(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # *_and_mul_triton(hidden_states, scales=None, quantize=None, out=None) -> (out, None)
    x = inputs["x"]
    out = _out(x)
    return lambda: fn(x, None, None, out)[0]


def _backends(name: str, triton_fn: str | None, sglang_default: bool) -> list[Backend]:
    out = [
        Backend(
            "sgl_kernel",
            f"torch.ops.sgl_kernel.{name}.default",
            None,
            "aot",
            _bind_aot,
            preload=("sgl_kernel",),
        ),
        Backend(
            "sglang_jit",
            f"sglang.jit_kernel.activation:{name}",
            None,
            "jit",
            _bind_jit,
            label=SGLANG_SM90 if sglang_default else None,
            note="--use_fast_math on sm90",
        ),
        Backend("flashinfer", f"flashinfer.activation:{name}", None, "jit", _bind_flashinfer),
    ]
    if triton_fn:
        out.append(
            Backend(
                "sglang_triton",
                f"sglang.kernels.ops.layernorm.elementwise:{triton_fn}",
                None,
                "triton",
                _bind_triton,
                note="rounds act(gate) to bf16 before the multiply",
            )
        )
    return out


class _GatedActivation(Adapter):
    role = "act"
    ops = ("act_fn", "shared_experts", "experts")
    gate: ClassVar[Callable[[torch.Tensor], torch.Tensor]]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, d = int(case.dims["T"]), int(case.dims["D"])
        # gate_up projection outputs: O(1) magnitudes, both signs.
        return {"x": randn((t, 2 * d), generator(seed), device, DTYPE, scale=2.0)}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        x = inputs["x"].float()
        d = x.shape[-1] // 2
        return type(self).gate(x[..., :d]) * x[..., d:]

    def traffic(self, case: Case) -> Traffic:
        t, d = int(case.dims["T"]), int(case.dims["D"])
        return Traffic(
            bytes=nbytes(3 * t * d, DTYPE), flops=5 * t * d, note="read 2d, write d; FLOPs nominal"
        )


@register
class SiluAndMulAdapter(_GatedActivation):
    kernel = "silu_and_mul"
    description = "SwiGLU gate: silu(gate) * up"
    gate = staticmethod(F.silu)
    backends = _backends("silu_and_mul", "silu_and_mul_triton", sglang_default=True)


@register
class GeluAndMulAdapter(_GatedActivation):
    kernel = "gelu_and_mul"
    description = "gelu(gate) * up (erf form); not called by DeepSeek"
    gate = staticmethod(lambda g: F.gelu(g, approximate="none"))
    backends = _backends("gelu_and_mul", "gelu_and_mul_triton", sglang_default=False)


@register
class GeluTanhAndMulAdapter(_GatedActivation):
    kernel = "gelu_tanh_and_mul"
    description = "gelu(gate, tanh approximation) * up; not called by DeepSeek"
    gate = staticmethod(lambda g: F.gelu(g, approximate="tanh"))
    backends = _backends("gelu_tanh_and_mul", None, sglang_default=False)
