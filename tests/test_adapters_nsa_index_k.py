"""DeepSeek-V3.2's index K cache accessors (dskbench.adapters.nsa.index_k_set / index_k_get) on CPU: each
reference against a small page worked by hand, the input builders, the exact checks, traffic, and the
binders against the kernels' launches (a fake kernel redoes the kernel's address arithmetic)."""

from __future__ import annotations

import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.nsa import index_k_get as G
from dskbench.adapters.nsa import index_k_set as S
from dskbench.shapes.cases import Case, default_shapes

SHAPES = default_shapes()


def _cases(kernel: str, phase: str) -> list[Case]:
    a = get_adapter(kernel)
    return SHAPES.cases(a.kernel, list(a.ops), a.role, phase, profile="cpu")


class FakeKernel:
    """Records `fn[grid](*args, **kw)` and runs `body(*args, **kw)` in its place."""

    def __init__(self, body):
        self.body, self.grid, self.args, self.kw = body, None, None, None

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.grid, self.args, self.kw = grid, args, kw
            self.body(*args, **kw)

        return run


# -- _set_k_and_s_triton_kernel -------------------------------------------------------------------


def test_set_k_and_s_reference_by_hand():
    # pages of 2 tokens, 2-byte keys: a page row is [k slot 0 | k slot 1 | scale slot 0 | scale slot 1]
    buf = torch.zeros((3, 12), dtype=torch.uint8)
    k = torch.tensor([[1, 2], [3, 4]], dtype=torch.uint8).view(S.FP8)
    scale = torch.tensor([[1.0], [2.0]])  # little-endian fp32: 00 00 80 3f and 00 00 00 40
    out = S.set_k_and_s_reference(buf, torch.tensor([5, 2]), k, scale, 2)
    assert out[2].tolist() == [0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 128, 63]  # loc 5: page 2, slot 1
    assert out[1].tolist() == [3, 4, 0, 0, 0, 0, 0, 64, 0, 0, 0, 0]  # loc 2: page 1, slot 0
    assert not out[0].any() and not buf.any()


def test_set_k_and_s_cases_inputs_check_and_launch():
    a = get_adapter("_set_k_and_s_triton_kernel")
    assert _cases(a.kernel, "decode") and _cases(a.kernel, "prefill")
    c = _cases(a.kernel, "decode")[-1]
    t, dim, page, pages = S.index_dims(c)
    assert (dim, page) == (128, 64)
    inp = a.make_inputs(c, "cpu", 1)
    buf, loc = inp["buf"], inp["loc"]
    assert buf.shape == (pages, 64 * 132) and buf.dtype == torch.uint8
    assert loc.dtype == torch.int64 and len(set(loc.tolist())) == t and int(loc.min()) >= page
    assert inp["index_k"].dtype == S.FP8 and inp["index_k_scale"].shape == (t, 1)
    ref = a.reference(inp, c)
    assert a.check(ref.clone(), ref, c).ok
    bad = ref.clone()
    bad[int(loc[0]) // page, 64 * 128 + int(loc[0]) % page * 4] ^= 1  # one scale bit
    assert not a.check(bad, ref, c).ok
    assert a.traffic(c).bytes == 2 * t * 132 + 8 * t

    def kernel(
        b8,
        b32,
        loc_,
        k,
        s,
        k_stride,
        PAGE_SIZE,
        BUF_NUMEL_PER_PAGE,
        NUM_K_ELEMS_PER_TOKEN,
        S_OFFSET_NBYTES_IN_PAGE,
    ):
        f8, f32, kf = b8.view(-1), b32.view(-1), k.view(-1)
        for tid in range(loc_.shape[0]):
            p, o = int(loc_[tid]) // PAGE_SIZE, int(loc_[tid]) % PAGE_SIZE
            at = p * BUF_NUMEL_PER_PAGE + o * NUM_K_ELEMS_PER_TOKEN
            f8[at : at + NUM_K_ELEMS_PER_TOKEN] = kf[tid * k_stride : tid * k_stride + NUM_K_ELEMS_PER_TOKEN]
            f32[p * BUF_NUMEL_PER_PAGE // 4 + S_OFFSET_NBYTES_IN_PAGE // 4 + o] = s.view(-1)[tid]

    fake = FakeKernel(kernel)
    out = a.backends[0].bind(fake, inp, c)()
    assert fake.grid == (t,) and fake.args[2] is loc and fake.args[5] == 128
    assert fake.kw == {
        "PAGE_SIZE": 64,
        "BUF_NUMEL_PER_PAGE": 64 * 132,
        "NUM_K_ELEMS_PER_TOKEN": 128,
        "S_OFFSET_NBYTES_IN_PAGE": 64 * 128,
    }
    assert out is buf and torch.equal(out, ref)


# -- _get_k_and_s_triton_kernel -------------------------------------------------------------------


def test_get_k_and_s_reference_by_hand():
    buf = torch.arange(36, dtype=torch.uint8).view(3, 12)  # pages of 2 tokens, 2-byte keys
    table = torch.tensor([[2, 0], [1, 7]], dtype=torch.int32)
    k, s = G.get_k_and_s_reference(buf, table, torch.tensor([3, 1]), 2, 2)
    assert k.tolist() == [[24, 25], [26, 27], [0, 1], [12, 13]]
    assert s.tolist() == [[28, 29, 30, 31], [32, 33, 34, 35], [4, 5, 6, 7], [16, 17, 18, 19]]


def test_get_k_and_s_is_a_prefill_kernel():
    a = get_adapter("_get_k_and_s_triton_kernel")
    assert not any(a.applies(c) for c in _cases(a.kernel, "decode"))
    assert all(a.applies(c) for c in _cases(a.kernel, "prefill"))


def test_get_k_and_s_cases_inputs_check_and_launch():
    a = get_adapter("_get_k_and_s_triton_kernel")
    c = _cases(a.kernel, "prefill")[0]
    reqs, seq, dim, page, pages = G.get_dims(c)
    assert (reqs, dim, page) == (2, 128, 64) and reqs * seq == c.point["T"]
    inp = a.make_inputs(c, "cpu", 2)
    table = inp["page_table"]
    assert table.shape == (reqs, -(-seq // 64)) and len(set(table.flatten().tolist())) == table.numel()
    assert int(table.min()) >= 1 and int(table.max()) < pages
    ref = a.reference(inp, c)
    assert ref[0].shape == (reqs * seq, 128) and ref[1].shape == (reqs * seq, 4)
    assert a.check(tuple(r.clone() for r in ref), ref, c).ok and not a.check((ref[0], ref[1] ^ 1), ref, c).ok

    def kernel(**kw):  # the kernel's addresses, token by token
        buf, tbl, lens = kw["buf_ptr"].view(-1), kw["page_indices_ptr"], kw["seq_len_ptr"]
        pg, per, d, s_off = (
            kw["page_size"],
            kw["buf_numel_per_page"],
            kw["index_head_dim"],
            kw["s_offset_in_page"],
        )
        for r in range(lens.shape[0]):
            before = int(lens[:r].sum())
            for j in range(int(lens[r])):
                p = int(tbl.view(-1)[r * kw["page_indice_batch_offset"] + j // pg])
                at = p * per + (j % pg) * d
                kw["k_out_ptr"].view(-1)[(before + j) * d : (before + j + 1) * d] = buf[at : at + d]
                at = p * per + s_off + (j % pg) * 4
                kw["s_out_ptr"].view(-1)[(before + j) * 4 : (before + j + 1) * 4] = buf[at : at + 4]

    fake = FakeKernel(kernel)
    out = a.backends[0].bind(fake, inp, c)()
    assert fake.grid == (reqs, -(-seq // 256), 1)
    assert fake.kw["seq_len_num_pow"] == 2 and fake.kw["BLOCK_SIZE"] == 256 and fake.kw["BLOCK_SIZE_K"] == 128
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert a.traffic(c).bytes == 2 * reqs * seq * 132 + 4 * table.numel()
