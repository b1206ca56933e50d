"""Gated-activation adapters (dskbench.adapters.activation) on CPU."""

from __future__ import annotations

import math
import re

import pytest
import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.backends import KINDS
from dskbench.adapters.common.inputs import SGLANG_SM90
from dskbench.shapes.cases import Case, default_shapes

SHAPES = default_shapes()
KERNELS = ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")
TARGET = re.compile(r"^(torch\.ops(\.\w+){3}|[A-Za-z_]\w*(\.\w+)*:\w+(\.\w+)*)$")


def _case(kernel: str, op: str, t: int = 16) -> Case:
    return next(c for c in SHAPES.cases(kernel, [op], "act", "decode", profile="full") if c.point["T"] == t)


def _silu(x: float) -> float:
    return x / (1 + math.exp(-x))


def _gelu(x: float) -> float:
    return 0.5 * x * (1 + math.erf(x / math.sqrt(2)))


def _gelu_tanh(x: float) -> float:
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize(
    ("op", "rows", "d"), [("act_fn", 16, 18432), ("shared_experts", 16, 2048), ("experts", 128, 2048)]
)
def test_inputs_are_gate_up_concatenations(op, rows, d):
    case = _case("silu_and_mul", op)
    x = get_adapter("silu_and_mul").make_inputs(case, "cpu", 0)["x"]
    assert x.shape == (rows, 2 * d) and x.dtype == torch.bfloat16 and x.is_contiguous()
    assert x.shape[-1] * x.element_size() % 16 == 0  # the AOT wrapper's alignment rule


@pytest.mark.parametrize(
    ("kernel", "fn"), [("silu_and_mul", _silu), ("gelu_and_mul", _gelu), ("gelu_tanh_and_mul", _gelu_tanh)]
)
def test_reference_matches_the_formula(kernel, fn):
    gate, up = [0.5, -1.0, 2.5], [2.0, 3.0, -0.25]
    x = torch.tensor([gate + up], dtype=torch.bfloat16)
    case = Case(kernel, "act_fn", "decode", {"T": 1}, {"T": 1, "D": 3})
    ref = get_adapter(kernel).reference({"x": x}, case)
    expected = torch.tensor([[fn(g) * u for g, u in zip(gate, up, strict=True)]], dtype=torch.float64)
    assert ref.shape == (1, 3) and ref.dtype == torch.float32
    assert torch.allclose(ref.double(), expected, rtol=1e-6, atol=1e-7)


def test_traffic_is_the_minimum_traffic():
    dense = get_adapter("silu_and_mul").traffic(_case("silu_and_mul", "act_fn"))
    assert (dense.bytes, dense.flops) == (3 * 16 * 18432 * 2, 5 * 16 * 18432)
    routed = get_adapter("silu_and_mul").traffic(_case("silu_and_mul", "experts"))
    assert routed.bytes == 3 * (16 * 8) * 2048 * 2


# -- binders -------------------------------------------------------------------------------------------


def _fakes(kernel: str) -> dict:
    a = get_adapter(kernel)

    def compute(x: torch.Tensor) -> torch.Tensor:
        return a.reference({"x": x}, None).to(x.dtype)

    def aot(out, input):  # torch.ops.sgl_kernel.<act>.default(Tensor! out, Tensor input)
        out.copy_(compute(input))

    def jit(input, out=None, expert_ids=None, expert_step=1):
        out.copy_(compute(input))
        return out

    def flashinfer(input, out=None, enable_pdl=None):
        assert isinstance(enable_pdl, bool)
        out.copy_(compute(input))
        return out

    def triton(hidden_states, scales=None, quantize=None, out=None):
        assert scales is None and quantize is None
        out.copy_(compute(hidden_states))
        return out, None

    return {"sgl_kernel": aot, "sglang_jit": jit, "flashinfer": flashinfer, "sglang_triton": triton}


@pytest.mark.parametrize("kernel", KERNELS)
def test_binders_follow_library_signatures(kernel):
    a = get_adapter(kernel)
    case = _case(kernel, "shared_experts")
    fakes = _fakes(kernel)
    for b in a.backends:
        inp = a.make_inputs(case, "cpu", 1)
        ref = a.reference(inp, case)
        out = b.bind(fakes[b.name], inp, case)()
        assert out.shape == (16, 2048) and out.dtype == torch.bfloat16
        assert a.check(out, ref, case).ok, b.name


def test_check_rejects_the_wrong_activation():
    silu, gelu = get_adapter("silu_and_mul"), get_adapter("gelu_and_mul")
    case = _case("silu_and_mul", "act_fn")
    inp = silu.make_inputs(case, "cpu", 2)
    assert not silu.check(gelu.reference(inp, case).to(torch.bfloat16), silu.reference(inp, case), case).ok


@pytest.mark.parametrize("kernel", KERNELS)
def test_backends_are_well_formed(kernel):
    a = get_adapter(kernel)
    names = [b.name for b in a.backends]
    assert len(names) == len(set(names))
    assert ("sglang_triton" in names) == (kernel != "gelu_tanh_and_mul")  # no Triton tanh variant exists
    for b in a.backends:
        assert TARGET.match(b.target) and b.kind in KINDS and b.requires.sm is None
        if b.target.startswith("torch.ops."):
            assert b.preload == ("sgl_kernel",)
    labelled = [b.name for b in a.backends if b.label == SGLANG_SM90]
    assert labelled == (["sglang_jit"] if kernel == "silu_and_mul" else [])
