"""Sampling adapters (dskbench.adapters.sampling) on CPU: filter sets, boundary tolerance, checks,
traffic, and binders against the library signatures."""

from __future__ import annotations

import re

import pytest
import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.backends import KINDS
from dskbench.adapters.common.inputs import SGLANG_SM90
from dskbench.adapters.sampling import filters as S
from dskbench.shapes.cases import Case, default_shapes

SHAPES = default_shapes()
TARGET = re.compile(r"^(torch\.ops(\.\w+){3}|[A-Za-z_]\w*(\.\w+)*:\w+(\.\w+)*)$")
KERNELS = (
    "min_p_sampling_from_probs",
    "top_k_renorm_prob",
    "top_p_renorm_prob",
    "top_k_top_p_sampling_from_probs",
)
P = torch.tensor([[0.5, 0.3, 0.15, 0.05]])


def _case(kernel: str, b: int = 4) -> Case:
    cases = SHAPES.cases(kernel, ["sampler.forward"], "sampling", "decode", profile="cpu")
    return next(c for c in cases if c.point["B"] == b)


def test_inputs_are_vocab_wide_probs_with_per_request_parameters():
    a = get_adapter("top_k_top_p_sampling_from_probs")
    inp = a.make_inputs(_case(a.kernel), "cpu", 0)
    p = inp["probs"]
    assert p.shape == (4, 129280) and p.dtype == torch.float32
    assert torch.allclose(p.sum(-1), torch.ones(4), atol=1e-4) and bool((p > 0).all())
    assert inp["top_k"].dtype == torch.int32 and inp["top_k"].tolist() == [20, 40, 50, 100]
    assert inp["top_p"].dtype == torch.float32 and inp["min_p"].shape == (4,)
    top1 = p.amax(-1)
    assert 0.01 < float(top1.min()) and float(top1.max()) <= 1.0  # peaked and flat rows, never one-hot


def test_filter_sets_on_a_hand_example():
    nominal, must, may = S.top_k_sets(P, torch.tensor([2]))
    assert nominal.tolist() == must.tolist() == may.tolist() == [[True, True, False, False]]
    nominal, _, _ = S.top_p_sets(P, torch.tensor([0.7]))
    assert nominal.tolist() == [[True, True, False, False]]  # 0.5 < 0.7, then 0.5 + 0.3 reaches it
    nominal, _, _ = S.top_p_sets(P, torch.tensor([0.5]))
    assert nominal.tolist() == [[True, False, False, False]]
    assert S.min_p_sets(P, torch.tensor([0.5])).tolist() == [[True, True, False, False]]  # p >= 0.25


def test_top_p_boundary_token_may_go_either_way():
    # the mass before token 1 is 0.5: with top_p within BAND of it, keeping or dropping token 1 is right
    nominal, must, may = S.top_p_sets(P, torch.tensor([0.5 + S.BAND / 2]))
    assert must.tolist() == [[True, False, False, False]]
    assert may.tolist() == [[True, True, False, False]]
    assert nominal.tolist() == [[True, True, False, False]]


def test_top_k_ties_with_the_kth_value_may_be_kept():
    p = torch.tensor([[0.4, 0.2, 0.2, 0.2]])
    _, must, may = S.top_k_sets(p, torch.tensor([2]))
    assert must.tolist() == [[True, False, False, False]] and may.tolist() == [[True, True, True, True]]


def test_renorm_reference_and_check():
    a = get_adapter("top_p_renorm_prob")
    case = Case(a.kernel, "sampler.forward", "decode", {"B": 1}, {"B": 1, "V": 4})
    ref = a.reference({"probs": P, "top_p": torch.tensor([0.7])}, case)
    assert torch.allclose(ref.value, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert a.check(ref, ref, case).ok and a.check(ref.value, ref, case).ok
    assert not a.check(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), ref, case).ok  # dropped a kept token
    assert not a.check(P / P.sum(), ref, case).ok  # kept filtered tokens
    assert not a.check(torch.tensor([[0.6, 0.4, 0.0, 0.0]]), ref, case).ok  # wrong renormalisation


def test_renorm_check_accepts_either_side_of_the_boundary():
    a = get_adapter("top_p_renorm_prob")
    case = Case(a.kernel, "sampler.forward", "decode", {"B": 1}, {"B": 1, "V": 4})
    ref = a.reference({"probs": P, "top_p": torch.tensor([0.5 + S.BAND / 2])}, case)
    assert a.check(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), ref, case).ok
    assert a.check(torch.tensor([[0.625, 0.375, 0.0, 0.0]]), ref, case).ok


def test_sampler_references_and_checks():
    for kernel, expected in (
        ("min_p_sampling_from_probs", {0, 1}),
        ("top_k_top_p_sampling_from_probs", {0, 1}),
    ):
        a = get_adapter(kernel)
        case = Case(kernel, "sampler.forward", "decode", {"B": 1}, {"B": 1, "V": 4})
        inp = {
            "probs": P,
            "min_p": torch.tensor([0.5]),
            "top_k": torch.tensor([3]),
            "top_p": torch.tensor([0.7]),
        }
        ref = a.reference(inp, case)
        assert {int(i) for i in range(4) if ref.may[0, i]} == expected
        assert ref.value.dtype == torch.int32 and int(ref.value[0]) in expected
        assert a.check(ref, ref, case).ok
        assert a.check(torch.tensor([1], dtype=torch.int32), ref, case).ok
        assert not a.check(torch.tensor([2], dtype=torch.int32), ref, case).ok
        assert not a.check(torch.tensor([7], dtype=torch.int32), ref, case).ok  # out of the vocabulary


def test_references_run_at_deepseek_vocab():
    for kernel in KERNELS:
        a = get_adapter(kernel)
        case = _case(kernel)
        ref = a.reference(a.make_inputs(case, "cpu", 1), case)
        assert ref.may.shape == (4, 129280)
        assert ref.value.shape == ((4, 129280) if "renorm" in kernel else (4,))
        assert a.check(ref, ref, case).ok


def test_traffic():
    b, v = 64, 129280
    case = Case("x", "sampler.forward", "decode", {"B": b}, {"B": b, "V": v})
    assert get_adapter("min_p_sampling_from_probs").traffic(case).bytes == 4 * b * v + 12 * b
    assert get_adapter("top_k_renorm_prob").traffic(case).bytes == 8 * b * v + 4 * b


# -- binders -------------------------------------------------------------------------------------------


def _renorm_with(kernel: str):
    sets = S.top_k_sets if "top_k" in kernel else S.top_p_sets
    return lambda probs, arr: S.renorm(probs, sets(probs, arr)[0])


@pytest.mark.parametrize("kernel", ["top_k_renorm_prob", "top_p_renorm_prob"])
def test_renorm_binders_follow_library_signatures(kernel):
    a = get_adapter(kernel)
    case = _case(kernel)
    inp = a.make_inputs(case, "cpu", 2)
    ref = a.reference(inp, case)
    compute = _renorm_with(kernel)

    def aot(probs, renorm_probs, maybe_arr, scalar):  # torch.ops.sgl_kernel.top_{k,p}_renorm_probs
        assert isinstance(scalar, int if "top_k" in kernel else float)
        renorm_probs.copy_(compute(probs, maybe_arr))

    def call(probs, top):  # flashinfer.sampling / sgl_kernel.sampling wrapper
        assert isinstance(top, torch.Tensor)
        return compute(probs, top)

    for b in a.backends:
        out = b.bind(aot if b.name == "sgl_kernel" else call, inp, case)()
        assert a.check(out, ref, case).ok, b.name


def test_sampler_binders_pass_seeds_and_sglang_arguments():
    seen = {}

    def min_p(probs, min_p, indices=None, deterministic=True, generator=None, check_nan=False, seed=None,
              offset=None, return_valid=False):  # fmt: skip
        seen["min_p"] = (seed, offset, generator)
        return S.sample_kept(probs, S.min_p_sets(probs, min_p))

    def top_k_top_p(probs, top_k, top_p, indices=None, filter_apply_order="top_k_first", deterministic=True,
                    generator=None, check_nan=False, seed=None, offset=None, return_valid=False):  # fmt: skip
        seen["joint"] = (filter_apply_order, top_k.dtype, top_p.dtype, seed, offset)
        keep = S.top_k_sets(probs, top_k)[0] & S.top_p_sets(probs, top_p)[0]
        return S.sample_kept(probs, keep)

    for kernel, fn in (
        ("min_p_sampling_from_probs", min_p),
        ("top_k_top_p_sampling_from_probs", top_k_top_p),
    ):
        a = get_adapter(kernel)
        case = _case(kernel)
        inp = a.make_inputs(case, "cpu", 7)
        out = a.backends[0].bind(fn, inp, case)()
        assert a.check(out, a.reference(inp, case), case).ok
    assert seen["min_p"] == (7, 0, None)  # explicit seed/offset: no generator state read during capture
    assert seen["joint"] == ("joint", torch.int32, torch.float32, 7, 0)


@pytest.mark.parametrize("kernel", KERNELS)
def test_backends_are_well_formed(kernel):
    a = get_adapter(kernel)
    assert len({b.name for b in a.backends}) == len(a.backends)
    for b in a.backends:
        assert TARGET.match(b.target) and b.kind in KINDS and b.requires.sm is None
        if b.target.startswith("torch.ops."):
            assert b.preload == ("sgl_kernel",)
    labelled = [b for b in a.backends if b.label == SGLANG_SM90]
    assert len(labelled) == 1
    if "renorm" in kernel:
        assert labelled[0].name == "sgl_kernel.wrapper"
        assert labelled[0].dispatches_to.startswith("flashinfer.sampling.")
