"""The per-step KV bookkeeping kernels of decode (EAGLE/NextN speculative decoding, FlashInfer MLA's KV
indices) on CPU: each reference against a
small example worked by hand, the input builders, the exact checks, traffic, and the binders against the
kernels' launches (a fake kernel records the grid and arguments)."""

from __future__ import annotations

import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.attention import flashinfer_kv_indices as FK
from dskbench.adapters.speculative import assign_req_to_token_pool as AR
from dskbench.adapters.speculative import draft_decode_kv_indices as DK
from dskbench.adapters.speculative import fill_bonus_tokens as FB
from dskbench.shapes.cases import Case, default_shapes

SHAPES = default_shapes()


def _case(kernel: str, phase: str = "decode") -> Case:
    a = get_adapter(kernel)
    return SHAPES.cases(a.kernel, list(a.ops), a.role, phase, profile="cpu")[-1]


class FakeKernel:
    """Records `fn[grid](*args, **kw)` and runs `body(*args)` in its place."""

    def __init__(self, body=None):
        self.body, self.grid, self.args, self.kw = body, None, None, None

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.grid, self.args, self.kw = grid, args, kw
            if self.body is not None:
                self.body(*args)

        return run


# -- fill_bonus_tokens ----------------------------------------------------------------------------


def test_bonus_reference_by_hand():
    # three requests, rows of num_steps + 1 = 4 tokens; accepted 1, 4 and 2 (bonus included)
    tokens = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]], dtype=torch.int32)
    lens = torch.tensor([1, 4, 2], dtype=torch.int32)
    out = FB.bonus_reference(tokens, lens)
    assert out.dtype == torch.int32 and out.tolist() == [10, 23, 31]


def test_bonus_case_inputs_check_and_launch():
    a = get_adapter("fill_bonus_tokens")
    c = _case(a.kernel)
    assert c.dims["num_steps"] == 3 and c.dims["V"] == 129280
    inp = a.make_inputs(c, "cpu", 2)
    b = c.point["B"]
    tokens, lens = inp["accept_tokens"], inp["accept_lens"]
    assert tokens.shape == (b, 4) and tokens.dtype == torch.int32 and lens.dtype == torch.int32
    assert int(lens.min()) >= 1 and int(lens.max()) <= 4
    ref = a.reference(inp, c)
    assert a.check(ref.clone(), ref, c).ok and not a.check(ref + 1, ref, c).ok
    assert a.traffic(c).bytes == 12 * b

    def kernel(tok, ln, out, stride):  # the Triton kernel's arithmetic on the flat buffer
        flat = tok.flatten()
        for pid in range(ln.shape[0]):
            out[pid] = flat[stride * pid + ln[pid] - 1]

    fake = FakeKernel(kernel)
    out = a.backends[0].bind(fake, inp, c)()
    assert fake.grid == (b,) and fake.args[3] == 4 and fake.args[0] is tokens and fake.args[1] is lens
    assert torch.equal(out, ref)


# -- assign_req_to_token_pool ---------------------------------------------------------------------


def test_assign_reference_by_hand():
    # a 3-row table of width 6; request 0 (row 2) gets columns 1..2, request 1 (row 0) columns 4..5
    table = torch.arange(18, dtype=torch.int32).view(3, 6)
    rows, start, end = torch.tensor([2, 0]), torch.tensor([1, 4]), torch.tensor([3, 6])
    locs = torch.tensor([100, 101, 200, 201])
    out = AR.assign_reference(table, rows, start, end, locs)
    assert out.tolist() == [[0, 1, 2, 3, 200, 201], [6, 7, 8, 9, 10, 11], [12, 100, 101, 15, 16, 17]]
    assert torch.equal(table, torch.arange(18, dtype=torch.int32).view(3, 6))  # not modified


def test_assign_case_inputs_check_and_launch():
    a = get_adapter("assign_req_to_token_pool")
    c = _case(a.kernel)
    b, new, pool_len = AR.assign_dims(c)
    assert new == 4
    inp = a.make_inputs(c, "cpu", 4)
    table, rows = inp["req_to_token"], inp["req_pool_indices"]
    start, end, locs = inp["start_offset"], inp["end_offset"], inp["out_cache_loc"]
    assert table.dtype == torch.int32 and table.shape[1] == pool_len and rows.dtype == torch.int64
    assert len(set(rows.tolist())) == b and int(rows.min()) >= 1
    assert bool((end - start == new).all()) and int(end.max()) <= pool_len
    assert locs.dtype == torch.int64 and len(set(locs.tolist())) == b * new
    ref = a.reference(inp, c)
    assert a.check(ref.clone(), ref, c).ok
    bad = ref.clone()
    bad[int(rows[-1]), int(end[-1]) - 1] += 1
    assert not a.check(bad, ref, c).ok
    assert a.traffic(c).bytes == b * (8 + 8 + 12 * new)

    def kernel(rows_, table_, start_, end_, locs_, pool_len_, bs_upper):  # the kernel, program by program
        flat = table_.view(-1)
        for pid in range(rows_.shape[0]):
            off = int((end_[:pid] - start_[:pid]).sum())
            for j in range(int(start_[pid]), int(end_[pid])):
                flat[int(rows_[pid]) * pool_len_ + j] = locs_[off + j - int(start_[pid])]

    fake = FakeKernel(kernel)
    out = a.backends[0].bind(fake, inp, c)()
    assert fake.grid == (b,) and fake.args[-2:] == (pool_len, 1 << (b - 1).bit_length())
    assert out is table and torch.equal(out, ref)


# -- generate_draft_decode_kv_indices -------------------------------------------------------------


def _draft_kernel(steps, b, topk):
    """generate_draft_decode_kv_indices' arithmetic, program (step, request, branch) by program."""

    def run(rows, table, lens, indices, indptr, pos, pool_len, ind_stride, ptr_stride, *uppers_and_page):
        flat_table, flat_ind, flat_ptr = table.view(-1), indices.view(-1), indptr.view(-1)
        for it in range(steps):
            iters = it + 1
            for bid in range(b):
                n = int(lens[bid])
                cum = int(lens[:bid].sum())
                for k in range(topk):
                    base = ind_stride * it + cum * topk + bid * iters * topk + k * (n + iters)
                    row0 = int(rows[bid]) * pool_len
                    flat_ind[base : base + n] = flat_table[row0 : row0 + n]
                    extend = flat_table[row0 + n + k * steps : row0 + n + k * steps + iters]
                    flat_ind[base + n : base + n + iters] = extend
                    zid = bid * topk + k or b * topk
                    flat_ptr[ptr_stride * it + zid] = int(pos[:zid].sum()) + zid * iters

    return run


def test_draft_kv_reference_by_hand():
    # two requests (rows 1 and 0, 2 and 1 cached tokens), top-k 1, 2 draft steps
    table = torch.tensor([[0, 1, 2, 3], [10, 11, 12, 13]], dtype=torch.int32)
    rows, lens = torch.tensor([1, 0]), torch.tensor([2, 1])
    ind, ptr = torch.zeros((2, 7), dtype=torch.int32), torch.zeros((2, 3), dtype=torch.int32)
    out_ind, out_ptr = DK.draft_kv_reference(table, rows, lens, 1, 2, ind, ptr)
    assert out_ind.tolist() == [[10, 11, 12, 0, 1, 0, 0], [10, 11, 12, 13, 0, 1, 2]]
    assert out_ptr.tolist() == [[0, 3, 5], [0, 4, 7]]
    assert not ind.any() and not ptr.any()  # not modified
    # top-k 2 on pages of 1: branch k's draft slots start at seq_len + k * num_steps
    table = torch.arange(10, 20, dtype=torch.int32).view(1, 10)
    ind, ptr = torch.zeros((2, 10), dtype=torch.int32), torch.zeros((2, 3), dtype=torch.int32)
    out_ind, out_ptr = DK.draft_kv_reference(table, torch.tensor([0]), torch.tensor([3]), 2, 2, ind, ptr)
    assert out_ind.tolist() == [
        [10, 11, 12, 13, 10, 11, 12, 15, 0, 0],
        [10, 11, 12, 13, 14, 10, 11, 12, 15, 16],
    ]
    assert out_ptr.tolist() == [[0, 4, 8], [0, 5, 10]]


def test_draft_kv_reference_matches_the_kernels_arithmetic_at_uneven_lengths():
    table = torch.randint(0, 1000, (5, 40), dtype=torch.int32)
    rows, lens, steps, topk = torch.tensor([3, 1, 4]), torch.tensor([7, 1, 20]), 3, 2
    width = (int(lens.sum()) + 3 * steps) * topk
    ind, ptr = torch.zeros((steps, width), dtype=torch.int32), torch.zeros((steps, 7), dtype=torch.int32)
    ref = DK.draft_kv_reference(table, rows, lens, topk, steps, ind, ptr)
    _draft_kernel(steps, 3, topk)(rows, table, lens, ind, ptr, lens.repeat_interleave(topk), 40, width, 7)
    assert torch.equal(ind, ref[0]) and torch.equal(ptr, ref[1])


def test_draft_kv_case_inputs_check_and_launch():
    a = get_adapter("generate_draft_decode_kv_indices")
    c = _case(a.kernel)
    b, kv_len, topk, steps, page = DK.draft_dims(c)
    assert (topk, steps, page) == (1, 3, 1)
    inp = a.make_inputs(c, "cpu", 6)
    assert inp["kv_indices"].shape == (3, b * (kv_len + 3)) and inp["kv_indptr"].shape == (3, b + 1)
    assert inp["req_to_token"].shape[1] == kv_len + 3 and len(set(inp["req_pool_indices"].tolist())) == b
    ref = a.reference(inp, c)
    assert a.check(tuple(r.clone() for r in ref), ref, c).ok
    assert not a.check((ref[0], ref[1] + 1), ref, c).ok
    assert int(ref[1][2, -1]) == b * (kv_len + 3) and ref[0].shape == inp["kv_indices"].shape
    fake = FakeKernel(_draft_kernel(steps, b, topk))
    out = a.backends[0].bind(fake, inp, c)()
    assert fake.grid == (3, b, 1) and fake.args[6:] == (kv_len + 3, b * (kv_len + 3), b + 1) + (
        1 << (b - 1).bit_length(),
        4,
        1 << (b - 1).bit_length(),
        1,
    )
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert a.traffic(c).bytes == 2 * 4 * (3 * b * kv_len + 6 * b) + 4 * 3 * b


# -- create_flashinfer_kv_indices_triton ----------------------------------------------------------


def test_flashinfer_kv_indices_reference_by_hand():
    table = torch.tensor([[0, 1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23]], dtype=torch.int32)
    out = FK.kv_indices_reference(table, torch.tensor([2, 0, 1]), torch.tensor([1, 3, 2]))
    assert out.dtype == torch.int32 and out.tolist() == [20, 0, 1, 2, 10, 11]


def test_flashinfer_kv_indices_case_inputs_check_and_launch():
    a = get_adapter("create_flashinfer_kv_indices_triton")
    c = _case(a.kernel)
    b, kv_len = FK.indices_dims(c)
    inp = a.make_inputs(c, "cpu", 8)
    assert inp["kv_indptr"].tolist() == [i * kv_len for i in range(b + 1)]
    ref = a.reference(inp, c)
    assert ref.shape == (b * kv_len,) and a.check(ref.clone(), ref, c).ok and not a.check(ref - 1, ref, c).ok

    def kernel(table, rows, lens, indptr, start, out, stride):  # the kernel, program by program
        assert start is None
        flat = table.view(-1)
        for pid in range(rows.shape[0]):
            n, at = int(lens[pid]), int(indptr[pid])
            out[at : at + n] = flat[int(rows[pid]) * stride : int(rows[pid]) * stride + n]

    fake = FakeKernel(kernel)
    out = a.backends[0].bind(fake, inp, c)()
    assert fake.grid == (b,) and fake.args[-1] == kv_len and fake.args[0] is inp["req_to_token"]
    assert torch.equal(out, ref)
    assert a.traffic(c).bytes == 8 * b * kv_len + 20 * b
