"""DeepSeek-V3.2 sparse-attention adapters (dskbench.adapters.nsa) on CPU: the Hadamard reference against
the closed form H[i, j] = (-1)^popcount(i & j), the check, traffic, and the binder against the library
signature."""

from __future__ import annotations

import math

import pytest
import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.nsa import hadamard as NSA
from dskbench.shapes.cases import Case, default_shapes

SHAPES = default_shapes()


def hadamard(d: int) -> torch.Tensor:
    """The Sylvester-ordered Hadamard matrix from its closed form (not the doubling the adapter uses)."""
    i = torch.arange(d)
    bits = (i[:, None] & i[None, :]).tolist()
    return torch.tensor([[(-1.0) ** bin(b).count("1") for b in row] for row in bits], dtype=torch.float64)


def _case(variant: str, t: int = 16, phase: str = "decode") -> Case:
    a = get_adapter("hadamard_transform")
    cases = SHAPES.cases(a.kernel, list(a.ops), a.role, phase, profile="cpu")
    return next(c for c in cases if c.point["T"] == t and c.variant == variant)


def test_cases_are_the_v32_indexer_q_and_k():
    assert SHAPES.ops["nsa_indexer.forward"].models == ("deepseek-v3.2",)
    q, k = _case("q"), _case("k")
    assert q.dims == {"T": 16, "heads": 64, "D": 128} and k.dims == {"T": 16, "heads": 1, "D": 128}
    a = get_adapter("hadamard_transform")
    xq, xk = a.make_inputs(q, "cpu", 0)["x"], a.make_inputs(k, "cpu", 0)["x"]
    assert xq.shape == (16, 64, 128) and xk.shape == (16, 128)
    assert xq.dtype == xk.dtype == torch.bfloat16 and xq.is_contiguous() and xk.is_contiguous()


@pytest.mark.parametrize("d", [1, 2, 8, 128])
def test_sylvester_matrix_is_the_closed_form(d):
    assert torch.equal(NSA.sylvester(d), hadamard(d).float())


def test_sylvester_refuses_other_sizes():
    with pytest.raises(ValueError, match="not a power of two"):
        NSA.sylvester(96)


@pytest.mark.parametrize("variant", ["q", "k"])
def test_reference_is_x_times_hadamard_times_scale(variant):
    a = get_adapter("hadamard_transform")
    case = _case(variant)
    inp = a.make_inputs(case, "cpu", 1)
    x = inp["x"]
    ref = a.reference(inp, case)
    h = hadamard(128)
    expected = (x.double().reshape(-1, 128) @ h / math.sqrt(128)).reshape(x.shape)
    assert ref.dtype == torch.float32 and ref.shape == x.shape
    assert torch.allclose(ref.double(), expected, rtol=1e-5, atol=1e-5)
    # an orthonormal rotation keeps each row's norm
    norms = x.double().reshape(-1, 128).norm(dim=-1)
    assert torch.allclose(ref.double().reshape(-1, 128).norm(dim=-1), norms, rtol=1e-5)


def test_check_accepts_bf16_output_and_rejects_wrong_ones():
    a = get_adapter("hadamard_transform")
    case = _case("q")
    inp = a.make_inputs(case, "cpu", 2)
    ref = a.reference(inp, case)
    assert a.check(ref.to(torch.bfloat16), ref, case).ok  # one bf16 rounding per element
    assert not a.check((ref * 1.05).to(torch.bfloat16), ref, case).ok  # a 5% scale error
    unscaled = (ref * math.sqrt(128)).to(torch.bfloat16)
    assert not a.check(unscaled, ref, case).ok  # scale 1.0 instead of 128^-0.5
    # the Walsh (sequency) order is another Hadamard matrix: a kernel using it is wrong here
    h = hadamard(128).float()
    walsh = h[torch.argsort((h[:, 1:] != h[:, :-1]).sum(1))]
    other = (inp["x"].float().reshape(-1, 128) @ walsh / math.sqrt(128)).reshape(ref.shape)
    assert not a.check(other.to(torch.bfloat16), ref, case).ok


def test_traffic_is_the_minimum_traffic():
    a = get_adapter("hadamard_transform")
    for variant, n in (("q", 16 * 64 * 128), ("k", 16 * 128)):
        t = a.traffic(_case(variant))
        assert (t.bytes, t.flops) == (2 * n * 2, n * 7)  # 2 * numel * bf16 bytes; numel * log2(128)


def test_binder_follows_the_sglang_jit_signature():
    calls = []

    def hadamard_transform(x, scale=1.0):  # sglang.jit_kernel.hadamard, 0.5.16
        calls.append((x, scale))
        assert x.dtype == torch.bfloat16
        h = hadamard(x.shape[-1]).float()
        return (x.float().reshape(-1, x.shape[-1]) @ h * scale).reshape(x.shape).to(x.dtype)

    a = get_adapter("hadamard_transform")
    (b,) = a.backends
    assert (b.name, b.kind, b.target) == (
        "sglang_jit",
        "jit",
        "sglang.jit_kernel.hadamard:hadamard_transform",
    )
    assert b.requires.sm is None and b.requires.min_sm is None
    for variant in ("q", "k"):
        case = _case(variant, 64, "prefill")
        inp = a.make_inputs(case, "cpu", 3)
        out = b.bind(hadamard_transform, inp, case)()
        x, scale = calls[-1]
        assert x is inp["x"] and scale == 128**-0.5  # rotate_activation's scale, hidden_size ** -0.5
        assert a.check(out, a.reference(inp, case), case).ok


# -- _quantize_k_cache_fast_kernel (the FP8 sparse-attention KV cache) -----------------------------


def test_quant_k_cache_reference_by_hand():
    from dskbench.adapters.nsa import quant_k_cache as Q

    # one token, latent of 2 tiles of 4: tile 0 amax 2 -> scale 2/448; tile 1 amax 448 -> scale 1
    nope = torch.tensor([[[1.0, -2.0, 0.5, 0.0, 448.0, 3.0, -1.0, 0.25]]], dtype=torch.bfloat16)
    rope = torch.tensor([[[1.5, -3.0]]], dtype=torch.bfloat16)
    n, r = Q.quant_k_cache_reference(nope, rope, 4)
    assert n.shape == (1, 1, 8 + 2 * 4) and r.shape == (1, 1, 4) and n.dtype == r.dtype == torch.uint8
    q, s = Q.unpack(n, 8, 4)
    assert s.tolist() == [[torch.tensor(2.0 / 448.0, dtype=torch.float32).item(), 1.0]]
    assert q.float().tolist() == [
        [224.0, -448.0, 112.0, 0.0, 448.0, 3.0, -1.0, 0.25]
    ]  # x / scale, all exact in e4m3
    assert r.reshape(-1).view(torch.bfloat16).tolist() == [1.5, -3.0]


def test_quant_k_cache_case_inputs_and_check():
    a = get_adapter("_quantize_k_cache_fast_kernel")
    c = SHAPES.cases(a.kernel, list(a.ops), a.role, "decode", profile="cpu")[-1]
    assert SHAPES.ops["dsa_kv_cache_store"].models == ("deepseek-v3.2",)
    assert (c.dims["Lkv"], c.dims["Dr"], c.dims["tile"]) == (512, 64, 128)
    inp = a.make_inputs(c, "cpu", 0)
    t = c.point["T"]
    assert inp["k_nope"].shape == (t, 1, 512) and inp["k_rope"].shape == (t, 1, 64)
    ref = a.reference(inp, c)
    assert ref[0].shape == (t, 1, 528) and ref[1].shape == (t, 1, 128)
    assert a.check(tuple(x.clone() for x in ref), ref, c).ok
    bad = ref[0].clone()
    bad[0, 0, 512] ^= 1  # one bit of the first scale
    assert not a.check((bad, ref[1]), ref, c).ok
    called = []
    a.backends[0].bind(lambda *xs: called.append(xs), inp, c)()
    assert called[0][2] == 128
    assert a.traffic(c).bytes == t * 576 * 2 + t * (512 + 16 + 128)
