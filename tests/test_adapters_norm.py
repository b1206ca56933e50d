"""RMSNorm adapters (dskbench.adapters.norm) on CPU: layouts, references, checks, traffic, binders."""

from __future__ import annotations

import math
import re

import pytest
import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.backends import KINDS
from dskbench.adapters.common.inputs import SGLANG_SM90
from dskbench.adapters.norm import layernorm as LN
from dskbench.adapters.norm import rmsnorm as N
from dskbench.shapes.cases import Case, default_shapes

SHAPES = default_shapes()
TARGET = re.compile(r"^(torch\.ops(\.\w+){3}|[A-Za-z_]\w*(\.\w+)*:\w+(\.\w+)*)$")
EPS = 1e-6


def _case(kernel: str, op: str, t: int = 16) -> Case:
    a = get_adapter(kernel)
    return next(c for c in SHAPES.cases(kernel, [op], a.role, "decode", profile="cpu") if c.point["T"] == t)


def _tiny(kernel: str, d: int) -> Case:
    return Case(kernel, "input_layernorm", "decode", {"T": 1}, {"T": 1, "D": d}, model=SHAPES.config)


def test_eps_comes_from_the_model_config():
    assert N.rms_eps(_case("rmsnorm", "input_layernorm")) == EPS
    other = {**SHAPES.config, "rms_norm_eps": 1e-5}  # a case of another model carries its own eps
    case = Case("rmsnorm", "input_layernorm", "decode", {"T": 1}, {"T": 1, "D": 4}, model=other)
    assert N.rms_eps(case) == 1e-5


@pytest.mark.parametrize(
    ("op", "d", "offset"),
    [("input_layernorm", 7168, None), ("q_a_layernorm", 1536, 0), ("kv_a_layernorm", 512, 1536)],
)
def test_rmsnorm_inputs_are_sglang_layouts(op, d, offset):
    a = get_adapter("rmsnorm")
    inp = a.make_inputs(_case("rmsnorm", op), "cpu", 0)
    x, w = inp["x"], inp["weight"]
    assert x.shape == (16, d) and x.dtype == torch.bfloat16 and w.shape == (d,) and w.dtype == torch.bfloat16
    if offset is None:
        assert x.is_contiguous()
    else:  # a column slice of the fused_qkv_a output [T, 2112]
        assert x.stride() == (2112, 1) and x.storage_offset() == offset
    assert bool((w != 0).all()) and bool(x.float().abs().sum() > 0)


def test_rmsnorm_reference_matches_the_formula():
    a = get_adapter("rmsnorm")
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.bfloat16)
    w = torch.tensor([1.0, 1.0, 1.0, 2.0], dtype=torch.bfloat16)
    ref = a.reference({"x": x, "weight": w}, _tiny("rmsnorm", 4))
    rms = math.sqrt((1 + 4 + 9 + 16) / 4 + EPS)
    expected = torch.tensor([[1 / rms, 2 / rms, 3 / rms, 8 / rms]], dtype=torch.float64)
    assert ref.dtype == torch.float32 and ref.shape == (1, 4)
    assert torch.allclose(ref.double(), expected, rtol=1e-6)


def test_fused_add_reference_normalises_the_fp32_sum():
    a = get_adapter("fused_add_rmsnorm")
    x = torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.bfloat16)
    r = torch.tensor([[1.0, 2.0, -1.0, 0.0]], dtype=torch.bfloat16)
    w = torch.full((4,), 0.5, dtype=torch.bfloat16)
    inputs = {"x": x, "residual": r, "weight": w}
    out, res = a.reference(inputs, _tiny("fused_add_rmsnorm", 4))
    acc = torch.tensor([[2.0, 2.0, -1.0, 1.0]], dtype=torch.float64)
    assert torch.equal(res.double(), acc)
    assert torch.allclose(out.double(), acc / math.sqrt(10 / 4 + EPS) * 0.5, rtol=1e-6)
    assert torch.equal(inputs["x"], x) and torch.equal(inputs["residual"], r)  # not mutated


def test_reference_shapes_on_cpu_cases():
    for kernel in ("rmsnorm", "fused_add_rmsnorm"):
        a = get_adapter(kernel)
        for case in SHAPES.cases(kernel, list(a.ops), "norm", "decode", profile="cpu")[:4]:
            if not a.applies(case):
                continue
            inp = a.make_inputs(case, "cpu", 1)
            ref = a.reference(inp, case)
            refs = ref if isinstance(ref, tuple) else (ref,)
            assert all(r.shape == (case.dims["T"], case.dims["D"]) for r in refs)


def test_fused_add_only_at_norms_with_a_residual():
    a = get_adapter("fused_add_rmsnorm")
    q_a = next(iter(SHAPES.cases("fused_add_rmsnorm", ["q_a_layernorm"], "norm", "decode", profile="cpu")))
    assert not a.applies(q_a)
    assert a.applies(_case("fused_add_rmsnorm", "post_attention_layernorm"))


def test_traffic_is_the_minimum_traffic():
    t, h = 16, 7168
    rms = get_adapter("rmsnorm").traffic(_case("rmsnorm", "input_layernorm", t))
    assert (rms.bytes, rms.flops) == (2 * t * h * 2 + h * 2, 4 * t * h)
    fadd = get_adapter("fused_add_rmsnorm").traffic(_case("fused_add_rmsnorm", "input_layernorm", t))
    assert (fadd.bytes, fadd.flops) == (4 * t * h * 2 + h * 2, 5 * t * h)
    q_a = get_adapter("rmsnorm").traffic(_case("rmsnorm", "q_a_layernorm", t))
    assert q_a.bytes == 2 * t * 1536 * 2 + 1536 * 2  # the slice only, not the 2112-wide rows


# -- binders against the library signatures ------------------------------------------------------------


def _normed(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return N.rms_reference(x, w, eps).to(x.dtype)


def aot_rmsnorm(out, input, weight, eps, enable_pdl):  # torch.ops.sgl_kernel.rmsnorm.default
    assert isinstance(enable_pdl, bool)
    out.copy_(_normed(input, weight, eps))


def fi_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):  # flashinfer / sgl_kernel wrapper
    out.copy_(_normed(input, weight, eps))
    return out


def jit_rmsnorm(input, weight, out=None, eps=1e-6):  # sglang.jit_kernel.norm.rmsnorm
    (input if out is None else out).copy_(_normed(input, weight, eps))


def triton_rmsnorm(x, weight, eps, autotune=False, inplace=False):  # elementwise.fused_rmsnorm
    assert x.is_contiguous(), "the Triton kernel indexes rows as pid * hidden"
    return _normed(x, weight, eps)


RMS_FAKES = {
    "sgl_kernel": aot_rmsnorm,
    "sgl_kernel.wrapper": fi_rmsnorm,
    "flashinfer": fi_rmsnorm,
    "sglang_jit": jit_rmsnorm,
    "sglang_triton": triton_rmsnorm,
}


@pytest.mark.parametrize("op", ["input_layernorm", "kv_a_layernorm"])
def test_rmsnorm_binders_follow_library_signatures(op):
    a = get_adapter("rmsnorm")
    case = _case("rmsnorm", op)
    assert {b.name for b in a.backends} == set(RMS_FAKES)
    for b in a.backends:
        inp = a.make_inputs(case, "cpu", 2)
        ref = a.reference(inp, case)
        out = b.bind(RMS_FAKES[b.name], inp, case)()
        assert a.check(out, ref, case).ok, b.name
        assert torch.equal(inp["x"], a.make_inputs(case, "cpu", 2)["x"]), f"{b.name} overwrote its input"


def fadd_flashinfer(input, residual, weight, eps=1e-6, enable_pdl=None):  # also AOT op and wrapper
    acc = input.float() + residual.float()
    residual.copy_(acc)
    input.copy_(_normed(acc, weight, eps))


def fadd_jit(input, residual, weight, eps=1e-6, *, cast_x_before_out_mul=False):
    assert cast_x_before_out_mul is False
    fadd_flashinfer(input, residual, weight, eps)


def test_fused_add_binders_follow_library_signatures():
    a = get_adapter("fused_add_rmsnorm")
    case = _case("fused_add_rmsnorm", "post_attention_layernorm")
    for b in a.backends:
        inp = a.make_inputs(case, "cpu", 3)
        ref = a.reference(inp, case)
        out = b.bind(fadd_jit if b.name == "sglang_jit" else fadd_flashinfer, inp, case)()
        assert out[0] is inp["x"] and out[1] is inp["residual"]  # in place, the mutated tensors returned
        assert a.check(out, ref, case).ok, b.name


def test_checks_reject_wrong_outputs():
    a = get_adapter("rmsnorm")
    case = _case("rmsnorm", "input_layernorm")
    ref = a.reference(a.make_inputs(case, "cpu", 4), case)
    assert a.check(ref.to(torch.bfloat16), ref, case).ok
    assert not a.check((ref * 1.05).to(torch.bfloat16), ref, case).ok  # a 5% gain error
    f = get_adapter("fused_add_rmsnorm")
    fcase = _case("fused_add_rmsnorm", "input_layernorm")
    inp = f.make_inputs(fcase, "cpu", 4)
    out, res = f.reference(inp, fcase)
    assert not f.check((out, inp["residual"]), (out, res), fcase).ok  # residual not updated


@pytest.mark.parametrize("kernel", ["rmsnorm", "fused_add_rmsnorm"])
def test_backends_are_well_formed(kernel):
    a = get_adapter(kernel)
    names = [b.name for b in a.backends]
    assert len(names) == len(set(names))
    for b in a.backends:
        assert TARGET.match(b.target), b.target
        assert b.kind in KINDS
        assert b.requires.sm is None  # every norm kernel runs on sm90
        if b.target.startswith("torch.ops.sgl_kernel."):
            assert b.preload == ("sgl_kernel",)
    labelled = [b for b in a.backends if b.label == SGLANG_SM90]
    assert [b.name for b in labelled] == ["sgl_kernel.wrapper"]
    assert labelled[0].dispatches_to.startswith("flashinfer.norm.")


# -- layernorm (DeepSeek-V3.2 indexer k_norm) ---------------------------------------------------------


def _ln_case(t: int = 16, phase: str = "decode") -> Case:
    a = get_adapter("layernorm")
    cases = SHAPES.cases("layernorm", list(a.ops), "norm", phase, profile="cpu")
    return next(c for c in cases if c.point["T"] == t)


def test_layernorm_runs_at_the_v32_indexer_key():
    a = get_adapter("layernorm")
    case = _ln_case()
    assert case.op == "nsa_indexer.forward" and case.dims == {"T": 16, "D": 128}
    assert SHAPES.ops["nsa_indexer.forward"].models == ("deepseek-v3.2",)
    inp = a.make_inputs(case, "cpu", 0)
    x, g, b = inp["x"], inp["gamma"], inp["beta"]
    assert x.shape == (16, 128) and x.dtype == torch.bfloat16 and x.is_contiguous()
    assert g.shape == b.shape == (128,) and g.dtype == b.dtype == torch.float32  # SGLang's fp32 params
    assert bool((g != 0).all()) and bool((b != 0).any())
    # rows carry an offset (a mean for LayerNorm to remove), unlike the RMSNorm inputs
    assert float(x.float().mean(-1).abs().max()) > 0.5


def test_layernorm_reference_matches_the_formula():
    a = get_adapter("layernorm")
    x = torch.tensor([[1.0, 2.0, 3.0, 6.0]], dtype=torch.bfloat16)
    g = torch.tensor([1.0, 2.0, 1.0, 0.5])
    b = torch.tensor([0.0, 0.5, -1.0, 0.0])
    ref = a.reference(
        {"x": x, "gamma": g, "beta": b}, Case("layernorm", "op", "decode", {"T": 1}, {"T": 1, "D": 4})
    )
    mean, var = 3.0, (4 + 1 + 0 + 9) / 4  # biased variance, as LayerNorm uses
    xhat = [(v - mean) / math.sqrt(var + LN.LAYERNORM_EPS) for v in (1.0, 2.0, 3.0, 6.0)]
    expected = torch.tensor([[xhat[0], 2 * xhat[1] + 0.5, xhat[2] - 1.0, 0.5 * xhat[3]]], dtype=torch.float64)
    assert ref.dtype == torch.float32 and torch.allclose(ref.double(), expected, rtol=1e-6, atol=1e-6)


def test_layernorm_check_accepts_bf16_output_and_rejects_errors():
    a = get_adapter("layernorm")
    case = _ln_case(16)
    inp = a.make_inputs(case, "cpu", 1)
    ref = a.reference(inp, case)
    assert a.check(ref.to(torch.bfloat16), ref, case).ok  # one bf16 rounding: within 1.6e-2
    no_beta = a.reference({**inp, "beta": torch.zeros(128)}, case)
    assert not a.check(no_beta.to(torch.bfloat16), ref, case).ok  # the bias left out
    rms = N.rms_reference(inp["x"], inp["gamma"], LN.LAYERNORM_EPS) + inp["beta"]
    assert not a.check(rms.to(torch.bfloat16), ref, case).ok  # RMSNorm instead: the mean not removed


def test_layernorm_traffic():
    t = 16
    tr = get_adapter("layernorm").traffic(_ln_case(t))
    assert (tr.bytes, tr.flops) == (2 * t * 128 * 2 + 2 * 128 * 4, 7 * t * 128)


def test_layernorm_binder_follows_flashinfer_signature():
    calls = []

    def fi_layernorm(input, gemma, beta, eps=1e-6):  # flashinfer.norm.layernorm, 0.6.14
        calls.append((input, gemma, beta, eps))
        assert input.dtype == torch.bfloat16 and gemma.dtype == beta.dtype == torch.float32
        return torch.nn.functional.layer_norm(input.float(), input.shape[-1:], gemma, beta, eps).to(
            input.dtype
        )

    a = get_adapter("layernorm")
    (b,) = a.backends
    assert (b.name, b.target, b.kind, b.label) == (
        "flashinfer",
        "flashinfer.norm:layernorm",
        "cutedsl",
        SGLANG_SM90,
    )
    assert b.requires.sm is None and b.requires.min_sm is None  # CuTe-DSL LayerNorm runs on sm90
    case = _ln_case(64, "prefill")
    inp = a.make_inputs(case, "cpu", 2)
    out = b.bind(fi_layernorm, inp, case)()
    ((x, g, beta, eps),) = calls
    assert x is inp["x"] and g is inp["gamma"] and beta is inp["beta"] and eps == 1e-6
    assert a.check(out, a.reference(inp, case), case).ok
