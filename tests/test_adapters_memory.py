"""KV-cache bookkeeping adapters (dskbench.adapters.memory) on CPU: the MLA KV-cache write and the paged
allocator, each reference against a small computation done by hand, their input builders (consistent
allocator state, unique slots), the exact checks, and the binders against the kernels' signatures."""

from __future__ import annotations

import pytest
import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.memory import get_mla_kv_buffer as G
from dskbench.adapters.memory import paged_alloc as P
from dskbench.adapters.memory import set_mla_kv_buffer as S
from dskbench.shapes.cases import Case, default_shapes

SHAPES = default_shapes()


def _case(kernel: str, phase: str) -> Case:
    a = get_adapter(kernel)
    return SHAPES.cases(a.kernel, list(a.ops), a.role, phase, profile="cpu")[-1]


# -- set_mla_kv_buffer_kernel ---------------------------------------------------------------------


def test_kv_write_cases_are_deepseeks_latent_and_rope():
    c = _case("set_mla_kv_buffer_kernel", "decode")
    assert (c.dims["Lkv"], c.dims["Dr"]) == (512, 64)
    assert {
        c.point["T"]
        for c in SHAPES.cases(
            "set_mla_kv_buffer_kernel", ["set_mla_kv_buffer"], "kv_write", "prefill", profile="cpu"
        )
    }


def test_kv_write_reference_by_hand():
    kv = torch.arange(5 * 1 * 6, dtype=torch.float32).view(5, 1, 6).to(torch.bfloat16)
    nope = torch.tensor([[[-1.0, -2.0, -3.0, -4.0]], [[-5.0, -6.0, -7.0, -8.0]]]).to(torch.bfloat16)
    rope = torch.tensor([[[10.0, 11.0]], [[12.0, 13.0]]]).to(torch.bfloat16)
    loc = torch.tensor([3, 1])
    out = S.set_mla_kv_reference(kv, loc, nope, rope)
    want = kv.clone()
    want[3, 0] = torch.tensor([-1.0, -2.0, -3.0, -4.0, 10.0, 11.0])
    want[1, 0] = torch.tensor([-5.0, -6.0, -7.0, -8.0, 12.0, 13.0])
    assert torch.equal(out, want)
    assert torch.equal(
        kv, torch.arange(30, dtype=torch.float32).view(5, 1, 6).to(torch.bfloat16)
    )  # not modified


def test_kv_write_inputs_and_check():
    a = get_adapter("set_mla_kv_buffer_kernel")
    c = _case(a.kernel, "decode")
    inp = a.make_inputs(c, "cpu", 3)
    t = c.point["T"]
    assert inp["kv_buffer"].shape == (c.dims["pool"], 1, 576) and inp["kv_buffer"].dtype == torch.bfloat16
    assert inp["k_nope"].shape == (t, 1, 512) and inp["k_rope"].shape == (t, 1, 64)
    loc = inp["loc"]
    assert loc.dtype == torch.int64 and len(set(loc.tolist())) == t and int(loc.min()) >= 1  # slot 0: padding
    ref = a.reference(inp, c)
    assert a.check(ref.clone(), ref, c).ok
    assert torch.equal(ref[loc, 0, :512], inp["k_nope"][:, 0]) and torch.equal(
        ref[loc, 0, 512:], inp["k_rope"][:, 0]
    )
    bad = ref.clone()
    bad[int(loc[0]), 0, 600 - 25] += 1  # one bf16 off in the rope part
    assert not a.check(bad, ref, c).ok
    assert a.traffic(c).bytes == 2 * t * 576 * 2 + 8 * t


def test_kv_write_binders_launch_like_sglang():
    a = get_adapter("set_mla_kv_buffer_kernel")
    c = _case(a.kernel, "decode")
    inp = a.make_inputs(c, "cpu", 0)
    seen = {}

    class FakeKernel:
        def __getitem__(self, grid):
            def run(*args, **kw):
                seen["grid"], seen["args"], seen["kw"] = grid, args, kw
                S.set_mla_kv_reference(args[0], args[3], args[1], args[2])

            return run

    out = S._bind_triton(FakeKernel(), inp, c)()
    assert out is inp["kv_buffer"] and seen["grid"] == (c.point["T"], 1)
    assert seen["args"][4:] == (576, 512, 64, 512, 64)
    assert seen["kw"] == {"BLOCK": 1024, "DCP_RANK": 0, "DCP_WORLD_SIZE": 1}  # no PDL off CUDA
    called = []
    S._bind_jit(lambda *xs: called.append(xs), inp, c)()
    assert called and called[0][1] is inp["loc"]


# -- the paged allocator --------------------------------------------------------------------------


def test_paged_alloc_reference_by_hand():
    # page 4. Request 0 holds 2 tokens (slots 40, 41 of page 10) and grows to 7: 42, 43 finish page 10,
    # then free page 7 -> 28, 29, 30. Request 1 is new with 5 tokens: page 3 -> 12..15, page 9 -> 36.
    out = P.paged_alloc_reference([2, 0], [7, 5], [41, -1], [7, 3, 9, 5], 4)
    assert out.tolist() == [42, 43, 28, 29, 30, 12, 13, 14, 15, 36]
    # decode: a request with room in its page (prefix 5, last slot 21) and one whose page is full
    # (prefix 8, last slot 35): 22, then the first slot of free page 6
    assert P.paged_alloc_reference([5, 8], [6, 9], [21, 35], [6, 2], 4).tolist() == [22, 24]


@pytest.mark.parametrize("decode", [True, False])
@pytest.mark.parametrize("page", [1, 4, 64])
def test_alloc_inputs_are_a_consistent_allocator_state(decode, page):
    reqs, t = (8, 8) if decode else (8, 100)
    inp = P.alloc_inputs(reqs, t, page, 300, decode, "cpu", 5)
    pre, seq, last, free = (inp[k] for k in ("prefix_lens", "seq_lens", "last_loc", "free_pages"))
    assert int((seq - pre).sum()) == t and bool((seq > pre).all())
    assert bool(((last + 1) % page == pre % page).all())  # the allocator's own debug-mode invariant
    assert bool((last[pre == 0] == -1).all())
    held = {int(x) // page for x in last[pre > 0]}
    assert not held & set(free.tolist()) and 0 not in set(free.tolist())
    out = P.reference_of(inp, page)
    assert out.shape == (t,) and len(set(out.tolist())) == t  # every new token its own slot
    if decode:
        assert bool((pre == seq - 1).all())


@pytest.mark.parametrize("kernel", ["alloc_decode_kernel", "alloc_extend_kernel"])
def test_alloc_adapters_check_exactly_and_bind_the_launch(kernel):
    a = get_adapter(kernel)
    c = _case(kernel, "decode" if "decode" in kernel else "prefill")
    assert c.dims["page"] == 64
    inp = a.make_inputs(c, "cpu", 1)
    ref = a.reference(inp, c)
    assert ref.shape == (c.point["T"],)
    assert a.check(ref.clone(), ref, c).ok and not a.check(ref + 1, ref, c).ok
    seen = {}

    class FakeKernel:
        def __getitem__(self, grid):
            def run(*args):
                seen["grid"], seen["args"] = grid, args
                args[-3].copy_(ref)

            return run

    bind = a.backends[0].bind
    out = bind(FakeKernel(), inp, c)()
    bs = inp["seq_lens"].shape[0]
    assert seen["grid"] == (bs,) and seen["args"][-2:] == (1 << (bs - 1).bit_length(), 64)
    assert torch.equal(out, ref) and a.traffic(c).bytes > 0


# -- get_mla_kv_buffer_kernel ---------------------------------------------------------------------


def test_kv_read_reference_by_hand():
    kv = torch.arange(4 * 1 * 5, dtype=torch.float32).view(4, 1, 5).to(torch.bfloat16)
    nope, rope = G.get_mla_kv_reference(kv, torch.tensor([2, 0]), 3)
    assert nope.tolist() == [[[10.0, 11.0, 12.0]], [[0.0, 1.0, 2.0]]]
    assert rope.tolist() == [[[13.0, 14.0]], [[3.0, 4.0]]]


def test_kv_read_inputs_check_and_launch():
    a = get_adapter("get_mla_kv_buffer_kernel")
    c = _case(a.kernel, "prefill")
    t = c.point["T"]
    assert (c.dims["Lkv"], c.dims["Dr"]) == (512, 64)
    inp = a.make_inputs(c, "cpu", 3)
    kv, loc = inp["kv_buffer"], inp["loc"]
    assert kv.shape == (c.dims["pool"], 1, 576) and kv.dtype == torch.bfloat16
    assert len(set(loc.tolist())) == t and int(loc.min()) >= 1
    ref = a.reference(inp, c)
    assert ref[0].shape == (t, 1, 512) and ref[1].shape == (t, 1, 64)
    assert a.check(tuple(r.clone() for r in ref), ref, c).ok
    bad = ref[1].clone()
    bad[-1, 0, -1] += 1
    assert not a.check((ref[0], bad), ref, c).ok

    def kernel(kv_, nope, rope, loc_, stride, nope_stride, rope_stride, lkv, dr):  # program by program
        flat = kv_.view(-1)
        for pid in range(loc_.shape[0]):
            row = flat[int(loc_[pid]) * stride :]
            nope.view(-1)[pid * nope_stride : pid * nope_stride + lkv] = row[:lkv]
            rope.view(-1)[pid * rope_stride : pid * rope_stride + dr] = row[lkv : lkv + dr]

    seen = {}

    class FakeKernel:
        def __getitem__(self, grid):
            seen["grid"] = grid

            def run(*args):
                seen["args"] = args
                kernel(*args)

            return run

    out = a.backends[0].bind(FakeKernel(), inp, c)()
    assert seen["grid"] == (t,) and seen["args"][4:] == (576, 512, 64, 512, 64)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert a.traffic(c).bytes == 2 * t * 576 * 2 + 8 * t
