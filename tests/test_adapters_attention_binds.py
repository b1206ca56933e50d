"""The attention adapters' bind plumbing, with CPU stand-ins that take the real kernels' arguments."""

from __future__ import annotations

import sys

import pytest
import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.attention import merge_state as MS
from dskbench.adapters.attention import mha_prefill as MP
from dskbench.shapes.cases import Case
from tests.test_adapters_attention import SHAPES, _cases

# -- bind plumbing, with CPU stand-ins that take the real kernels' arguments ------------------------------


def _attend(q: torch.Tensor, rows: torch.Tensor, scale: float, dv: int) -> torch.Tensor:
    p = torch.softmax((q.float() @ rows.float().t()) * scale, dim=-1)
    return p @ rows.float()[:, :dv]


class _FakeMlaWrapper:
    """BatchMLAPagedAttentionWrapper's plan/run contract on the CPU (page size 1, token indices)."""

    def __init__(
        self,
        workspace,
        use_cuda_graph=False,
        qo_indptr=None,
        kv_indptr=None,
        kv_indices=None,
        kv_len_arr=None,
        backend="auto",
    ):
        assert workspace.dtype == torch.uint8 and backend == "auto" and use_cuda_graph
        self.buffers = (qo_indptr, kv_indptr, kv_indices, kv_len_arr)

    def plan(
        self,
        qo_indptr,
        kv_indptr,
        kv_indices,
        kv_len_arr,
        num_heads,
        ckv_dim,
        kpe_dim,
        page_size,
        causal,
        sm_scale,
        q_dtype,
        kv_dtype,
    ):
        assert page_size == 1 and not causal and (ckv_dim, kpe_dim) == (512, 64)
        assert kv_indices.dtype == torch.int32 and qo_indptr.tolist() == list(range(len(kv_len_arr) + 1))
        for buf, x in zip(self.buffers, (qo_indptr, kv_indptr, kv_indices, kv_len_arr), strict=True):
            assert buf.shape == x.shape and buf.dtype == x.dtype and buf.data_ptr() != x.data_ptr()
            buf.copy_(x)  # what plan() does with CUDA-graph buffers
        self.kv_indptr, self.kv_indices, self.scale = self.buffers[1], self.buffers[2], sm_scale

    def run(self, q_nope, q_pe, ckv, kpe, out=None):
        q = torch.cat([q_nope, q_pe], dim=-1)
        for b in range(q.shape[0]):
            idx = self.kv_indices[self.kv_indptr[b] : self.kv_indptr[b + 1]].long()
            rows = torch.cat([ckv[idx, 0], kpe[idx, 0]], dim=-1)
            out[b] = _attend(q[b], rows, self.scale, ckv.shape[-1]).to(out.dtype)
        return out


def _fake_trtllm_decode(
    *,
    query,
    kv_cache,
    workspace_buffer,
    qk_nope_head_dim,
    kv_lora_rank,
    qk_rope_head_dim,
    block_tables,
    seq_lens,
    max_seq_len,
    bmm1_scale,
):
    """trtllm_batch_decode_with_kv_cache_mla's keyword contract (page 64, 4-D cache) on the CPU."""
    assert kv_cache.dim() == 4 and kv_cache.shape[1] == 1 and kv_cache.shape[2] == 64
    assert workspace_buffer.dtype == torch.int8 and not workspace_buffer.any()
    b, q_len, nh, _ = query.shape
    out = torch.empty(b, q_len, nh, kv_lora_rank, dtype=query.dtype)
    for i, length in enumerate(seq_lens.tolist()):
        pages = block_tables[i, : -(-length // 64)].long()
        rows = kv_cache[pages, 0].reshape(-1, kv_cache.shape[-1])[:length]
        out[i, 0] = _attend(query[i, 0], rows, bmm1_scale, kv_lora_rank).to(out.dtype)
    return out


@pytest.mark.parametrize(
    "kernel, fake",
    [
        ("BatchMLAPagedAttentionWrapper", _FakeMlaWrapper),
        ("trtllm_batch_decode_with_kv_cache_mla", _fake_trtllm_decode),
    ],
)
def test_decode_binds_address_the_right_rows(kernel, fake):
    a = get_adapter(kernel)
    c = _cases(kernel)[1]
    x = a.make_inputs(c, "cpu", 5)
    launch = a.backends[0].bind(fake, x, c)
    out = launch()
    assert out.shape == (4, 128, 512)
    assert a.check(out, a.reference(x, c), c).ok


def test_prefill_binds_with_cpu_standins():
    def context_attention_fwd(
        q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal=True, sm_scale=None
    ):
        assert v.shape[-1] == q.shape[-1] == o.shape[-1] == 192 and is_causal  # V/O padded to Lq
        lens = b_seq_len.tolist()
        assert b_start_loc.tolist() == [sum(lens[:i]) for i in range(len(lens))] and max_input_len == max(
            lens
        )
        o.copy_(MP.mha_causal_reference(q, k, v, lens, sm_scale).to(o.dtype))

    def extend_attention_fwd(
        q,
        k,
        v,
        o,
        k_buffer,
        v_buffer,
        qo_indptr,
        kv_indptr,
        kv_indices,
        custom_mask,
        is_causal,
        mask_indptr,
        max_len_extend,
        k_scale,
        v_scale,
        sm_scale,
    ):
        assert not kv_indptr.any() and custom_mask is None and is_causal and (k_scale, v_scale) == (1.0, 1.0)
        lens = (qo_indptr[1:] - qo_indptr[:-1]).tolist()
        o.copy_(MP.mha_causal_reference(q, k, v, lens, sm_scale).to(o.dtype))

    def ragged(
        *,
        query,
        key,
        value,
        workspace_buffer,
        seq_lens,
        max_q_len,
        max_kv_len,
        bmm1_scale,
        bmm2_scale,
        o_sf_scale,
        batch_size,
        window_left,
        cum_seq_lens_q,
        cum_seq_lens_kv,
        enable_pdl,
        is_causal,
        return_lse,
        out,
    ):
        assert torch.equal(cum_seq_lens_q, cum_seq_lens_kv) and batch_size == len(seq_lens) and is_causal
        out.copy_(MP.mha_causal_reference(query, key, value, seq_lens.tolist(), bmm1_scale).to(out.dtype))

    fakes = {
        "prefill_attention_kernel": context_attention_fwd,
        "extend_attention_kernel": extend_attention_fwd,
        "trtllm_ragged_attention_deepseek": ragged,
    }
    for kernel, fake in fakes.items():
        a = get_adapter(kernel)
        dims = {"T": 4100, "Nh": 2, "Dq": 192, "Dv": 128}
        c = Case(kernel, "attn_mha", "prefill", {"T": 4100}, dims, model=SHAPES.config)
        x = a.make_inputs(c, "cpu", 0)
        out = a.backends[0].bind(fake, x, c)()
        assert out.shape == (4100, 2, 128), kernel
        assert a.check(out, a.reference(x, c), c).ok, kernel


def test_merge_and_concat_binds_with_cpu_standins():
    m = get_adapter("merge_state_v2")
    c = _cases("merge_state_v2")[0]
    x = m.make_inputs(c, "cpu", 0)

    def merge_into(v_a, s_a, v_b, s_b, v_out, s_out):
        v, s = MS.merge_state_reference(v_a, s_a, v_b, s_b, base2=False)
        v_out.copy_(v)
        s_out.copy_(s)

    for b in m.backends:
        assert m.check(b.bind(merge_into, x, c)(), m.reference(x, c), c).ok
    k = get_adapter("concat_mla_k")
    ck = _cases("concat_mla_k")[0]
    xk = k.make_inputs(ck, "cpu", 0)

    def concat_k(out, k_nope, k_rope):
        out[..., :128] = k_nope
        out[..., 128:] = k_rope

    for b in k.backends:
        assert k.check(b.bind(concat_k, xk, ck)(), k.reference(xk, ck), ck).ok
    q = get_adapter("concat_mla_absorb_q")
    cq = _cases("concat_mla_absorb_q")[1]
    xq = q.make_inputs(cq, "cpu", 0)
    new, into = q.backends  # the JIT wrapper returns a new tensor; the AOT op writes `out`
    assert q.check(new.bind(lambda a, b: torch.cat([a, b], -1), xq, cq)(), q.reference(xq, cq), cq).ok
    assert q.check(
        into.bind(lambda a, b, o: o.copy_(torch.cat([a, b], -1)), xq, cq)(), q.reference(xq, cq), cq
    ).ok


def test_cutlass_mla_bind_pads_heads_to_128(monkeypatch):
    import types

    sizes = []

    def workspace_size(max_seq_len, num_batches, sm_count=0, num_kv_splits=1):
        sizes.append((max_seq_len, num_batches, num_kv_splits))
        return 4096

    monkeypatch.setitem(
        sys.modules, "sgl_kernel", types.SimpleNamespace(cutlass_mla_get_workspace_size=workspace_size)
    )

    def cutlass_mla_decode(
        out, q_nope, q_pe, cache, seq_lens, page_table, workspace, sm_scale, num_kv_splits
    ):
        assert q_nope.shape[1] == q_pe.shape[1] == out.shape[1] == 128 and cache.shape[1] == 128
        assert page_table.dtype == seq_lens.dtype == torch.int32 and num_kv_splits == 1
        q = torch.cat([q_nope, q_pe], dim=-1)
        for b, length in enumerate(seq_lens.tolist()):
            rows = cache[page_table[b, : -(-length // 128)].long()].reshape(-1, cache.shape[-1])[:length]
            out[b] = _attend(q[b], rows, sm_scale, 512).to(out.dtype)

    a = get_adapter("cutlass_mla_decode")
    dims = {"B": 2, "Nh": 16, "Lkv": 512, "Dr": 64, "kv_len": 300}  # attention TP 8: 16 local heads
    c = Case(
        "cutlass_mla_decode",
        "attn_mqa",
        "decode",
        {"B": 2, "kv_len": 300, "tp": 8},
        dims,
        model=SHAPES.config,
    )
    x = a.make_inputs(c, "cpu", 0)
    out = a.backends[0].bind(cutlass_mla_decode, x, c)()
    assert out.shape == (2, 16, 512) and sizes == [(3 * 128, 2, 1)]
    assert a.check(out, a.reference(x, c), c).ok
