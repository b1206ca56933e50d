"""Attention kernels the DeepSeek deployment runs beyond the traces (FlashInfer's ragged prefill, sgl-kernel
FA3) and FlashInfer's paged prefill / BatchAttention, on CPU: registry entries, backend declarations, the
FA3 "not available in this install" resolution, and each binder's arguments through CPU stand-ins that
compute attention with plain per-token loops, checked against the adapters' fp32 references."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from dskbench.adapters import adapters, get_adapter
from dskbench.adapters.attention import mha_prefill as MP
from dskbench.adapters.attention import mla as MLA
from dskbench.adapters.attention.mla_decode_fa3 import page_size_one_table
from dskbench.adapters.backends import SM90_ONLY, SM100, Unavailable, resolve
from dskbench.pick.deployment import load_deployment
from dskbench.registry.load import load_registry
from dskbench.shapes.cases import Case, default_shapes

SHAPES = default_shapes()
PREFILL = (
    "BatchPrefillWithRaggedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchAttention",
    "flash_attn_varlen_func",
)
DEPLOYED = {
    "BatchPrefillWithRaggedKVCacheWrapper": "attn_mha",
    "flash_attn_varlen_func": "attn_mha",
    "flash_attn_with_kvcache": "attn_mqa",
}


# -- independent computations: one query token at a time, float64 ---------------------------------------


def _loop_causal(q, k, v, cu: list[int], scale: float) -> torch.Tensor:
    """Causal attention, token by token within each request of the ragged batch."""
    out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float64)
    for r in range(len(cu) - 1):
        s0, s1 = cu[r], cu[r + 1]
        for i in range(s0, s1):
            keys, vals = k[s0 : i + 1].double(), v[s0 : i + 1].double()  # [n, H, D]
            scores = torch.einsum("hd,nhd->hn", q[i].double(), keys) * scale
            out[i] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), vals)
    return out


def _prefill_case(kernel: str, monkeypatch) -> tuple[Case, dict]:
    """Three requests (48, 48, 4 tokens): the split is patched small so the loops stay fast."""
    monkeypatch.setattr(MP, "PREFILL_SEQ_LEN", 48)
    dims = {"T": 100, "Nh": 2, "Dq": 192, "Dv": 128}
    c = Case(kernel, "attn_mha", "prefill", {"T": 100}, dims, model=SHAPES.config)
    return c, get_adapter(kernel).make_inputs(c, "cpu", 3)


# -- CPU stand-ins with the libraries' signatures --------------------------------------------------------


class _FakeRagged:
    """BatchPrefillWithRaggedKVCacheWrapper's constructor / plan / run contract."""

    def __init__(self, workspace, kv_layout="NHD", backend="auto"):
        assert workspace.dtype == torch.uint8 and kv_layout == "NHD" and backend in ("auto", "cutlass")

    def plan(self, qo_indptr, kv_indptr, *, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, causal,
             sm_scale, q_data_type):  # fmt: skip
        assert torch.equal(qo_indptr, kv_indptr) and qo_indptr.dtype == torch.int32 and causal
        assert num_qo_heads == num_kv_heads and (head_dim_qk, head_dim_vo) == (192, 128)
        self.cu, self.scale = qo_indptr.tolist(), sm_scale

    def run(self, q, k, v, out=None):
        out.copy_(_loop_causal(q, k, v, self.cu, self.scale))
        return out


def _gather_pages(cache, indptr: list[int], indices: torch.Tensor, page: int) -> torch.Tensor:
    """Rows of a page-size-`page` NHD cache in the order the page table lists them, per request."""
    assert page == 1 and cache.shape[1] == 1
    return torch.cat([cache[indices[indptr[r] : indptr[r + 1]].long(), 0] for r in range(len(indptr) - 1)])


class _FakePaged:
    """BatchPrefillWithPagedKVCacheWrapper: plan(qo, kv_indptr, kv_indices, last_page_len, ...), run(q, (k, v))."""

    def __init__(self, workspace, kv_layout="NHD", backend="auto"):
        assert workspace.dtype == torch.uint8 and kv_layout == "NHD"

    def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, nqo, nkv, dqk, page_size, *, head_dim_vo,
             causal, sm_scale, q_data_type, kv_data_type):  # fmt: skip
        assert causal and nqo == nkv and (dqk, head_dim_vo) == (192, 128) and bool((last_page_len == 1).all())
        assert kv_indices.dtype == torch.int32
        self.cu, self.kv = qo_indptr.tolist(), (kv_indptr.tolist(), kv_indices, page_size)
        self.scale = sm_scale

    def run(self, q, kv_cache, out=None):
        k, v = (_gather_pages(c, *self.kv) for c in kv_cache)
        out.copy_(_loop_causal(q, k, v, self.cu, self.scale))
        return out


class _FakeBatchAttention:
    """flashinfer.attention.BatchAttention: owns its workspaces, plan(..., kv_len_arr, ...), run -> (out, lse)."""

    def __init__(self, kv_layout="NHD", device="cuda"):
        self.float_workspace_buffer = torch.empty(8, dtype=torch.uint8)

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, nqo, nkv, dqk, dvo, page_size, *, causal,
             sm_scale, q_data_type, kv_data_type):  # fmt: skip
        assert self.float_workspace_buffer.numel() == MLA.FLASHINFER_MLA_WORKSPACE_BYTES  # the shared one
        assert causal and (dqk, dvo) == (192, 128)
        assert kv_len_arr.tolist() == (kv_indptr[1:] - kv_indptr[:-1]).tolist()
        self.cu, self.kv = qo_indptr.tolist(), (kv_indptr.tolist(), kv_indices, page_size)
        self.scale = sm_scale

    def run(self, q, kv_cache, out=None, lse=None):
        assert lse.shape == q.shape[:2] and lse.dtype == torch.float32
        k, v = (_gather_pages(c, *self.kv) for c in kv_cache)
        out.copy_(_loop_causal(q, k, v, self.cu, self.scale))
        return out, lse


def _fake_varlen(*, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                 return_softmax_lse, out):  # fmt: skip
    """sgl_kernel.flash_attn.flash_attn_varlen_func's keywords as SGLang's fa3 backend passes them."""
    assert torch.equal(cu_seqlens_q, cu_seqlens_k) and cu_seqlens_q.dtype == torch.int32 and causal
    lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).tolist()
    assert max_seqlen_q == max_seqlen_k == max(lens) and not return_softmax_lse
    out.copy_(_loop_causal(q, k, v, cu_seqlens_q.tolist(), softmax_scale))
    return out


@pytest.mark.parametrize(
    "kernel, fake, backend",
    [
        ("BatchPrefillWithRaggedKVCacheWrapper", _FakeRagged, 0),
        ("BatchPrefillWithRaggedKVCacheWrapper", _FakeRagged, 1),
        ("BatchPrefillWithPagedKVCacheWrapper", _FakePaged, 0),
        ("BatchAttention", _FakeBatchAttention, 0),
        ("flash_attn_varlen_func", _fake_varlen, 0),
    ],
)
def test_prefill_binds_match_a_per_token_loop(kernel, fake, backend, monkeypatch):
    a = get_adapter(kernel)
    c, x = _prefill_case(kernel, monkeypatch)
    assert MP.prefill_seq_lens(100) == [48, 48, 4]
    out = a.backends[backend].bind(fake, x, c)()
    assert out.shape == (100, 2, 128) and out.dtype == x["q"].dtype
    ref = a.reference(x, c)
    assert a.check(out, ref, c).ok
    loop = _loop_causal(x["q"], x["k"], x["v"], [0, 48, 96, 100], MLA.case_softmax_scale(c))
    assert torch.allclose(ref.double(), loop, atol=1e-4, rtol=1e-4)  # the fp32 reference itself


def _fake_with_kvcache(*, q, k_cache, v_cache, qv, page_table, cache_seqlens, cu_seqlens_q, cu_seqlens_k_new,
                       max_seqlen_q, softmax_scale, causal, softcap, return_softmax_lse, num_splits, out):  # fmt: skip
    """sgl_kernel.flash_attn.flash_attn_with_kvcache as SGLang's fa3 MLA decode calls it, head by head."""
    assert k_cache.shape[1:3] == (1, 1) and v_cache.shape[1:3] == (1, 1)  # page size 1, one latent head
    assert k_cache.data_ptr() == v_cache.data_ptr() + 512 * v_cache.element_size()  # one cache, two views
    assert max_seqlen_q == 1 and cu_seqlens_q.tolist() == list(range(q.shape[0] + 1)) and causal
    assert cu_seqlens_k_new[1:].tolist() == torch.cumsum(cache_seqlens, 0).tolist() and softcap == 0.0
    assert page_table.dtype == cache_seqlens.dtype == torch.int32
    for b, n in enumerate(cache_seqlens.tolist()):
        rows = page_table[b, :n].long()
        k_pe, c_kv = k_cache[rows, 0, 0].double(), v_cache[rows, 0, 0].double()
        for h in range(q.shape[1]):
            s = (k_pe @ q[b, h].double() + c_kv @ qv[b, h].double()) * softmax_scale
            out[b, h] = torch.softmax(s, dim=0) @ c_kv
    return out


def test_fa3_decode_bind_reads_the_shared_cache(monkeypatch):
    a = get_adapter("flash_attn_with_kvcache")
    ph = "decode"
    c = SHAPES.cases("flash_attn_with_kvcache", list(a.ops), a.role, ph, profile="cpu", tp=[1])[1]
    x = a.make_inputs(c, "cpu", 5)
    table = page_size_one_table(x)
    assert table.shape == (4, 1024) and len(set(table.flatten().tolist())) == table.numel()
    out = a.backends[0].bind(_fake_with_kvcache, x, c)()
    assert out.shape == (4, 128, 512)
    assert a.check(out, a.reference(x, c), c).ok


# -- declarations, registry, resolution, the pick --------------------------------------------------------


@pytest.mark.parametrize("kernel", (*PREFILL, "flash_attn_with_kvcache"))
def test_backends_declared(kernel):
    cls = adapters()[kernel]
    names = [b.name for b in cls.backends]
    assert names and len(names) == len(set(names))
    assert cls.ops and all(SHAPES.ops[op].roles.get(cls.role) for op in cls.ops)
    for b in cls.backends:
        if kernel.startswith("flash_attn"):
            assert b.target.startswith("sgl_kernel.flash_attn:") and b.requires == SM90_ONLY
            assert b.preload == ("sgl_kernel.flash_ops",)
        else:
            assert b.target.startswith("flashinfer.")
            assert (b.requires == SM100) == (b.name == "flashinfer.cutlass")


def test_registry_entries_are_benchmarks_at_their_ops():
    reg = load_registry()
    for kernel, op in DEPLOYED.items():
        assert reg[kernel].status == "benchmark" and reg[kernel].op_names == (op,), kernel
        assert adapters()[kernel].ops == (op,)
    for kernel in ("BatchAttention", "BatchPrefillWithPagedKVCacheWrapper"):
        assert reg[kernel].status == "benchmark"


@pytest.fixture
def fake_sgl_kernel(tmp_path, monkeypatch):
    """An sgl_kernel package whose flash_attn.py is the pinned one's import guard, without flash_ops."""
    pkg = tmp_path / "sgl_kernel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "flash_attn.py").write_text(
        "try:\n    from sgl_kernel import flash_ops\nexcept:\n"
        "    raise ImportError('Can not import FA3 in sgl_kernel. Please check your installation.')\n"
        "def flash_attn_varlen_func(*a, **k): pass\ndef flash_attn_with_kvcache(*a, **k): pass\n"
    )
    for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    return pkg


@pytest.mark.parametrize("kernel", ["flash_attn_varlen_func", "flash_attn_with_kvcache"])
def test_fa3_without_its_extension_is_not_available(kernel, fake_sgl_kernel):
    backend = adapters()[kernel].backends[0]
    with pytest.raises(Unavailable, match=r"^not available in this install: .*sgl_kernel\.flash_ops"):
        resolve(backend)
    # with the extension present, the same backend resolves to the module's function
    (fake_sgl_kernel / "flash_ops.py").write_text("")
    sys.modules.pop("sgl_kernel.flash_attn", None)
    assert isinstance(resolve(backend).fn, types.FunctionType)


def test_pick_compares_the_deployed_attention_backends():
    dep = load_deployment(SHAPES)
    prefill = next(r for r in dep.rows["prefill"] if r.op == "attn_mha")
    paths = {p.name: p for p in prefill.paths}
    assert paths["flashinfer"].flags == {"--prefill-attention-backend": "flashinfer"}
    assert paths["flashinfer"].parts[0].matches("BatchPrefillWithRaggedKVCacheWrapper", "flashinfer.cutlass")
    assert paths["fa3"].parts[0].matches("flash_attn_varlen_func", "sgl_kernel")
    assert prefill.classify("BatchAttention", "flashinfer")[0] == "what_if"
    assert prefill.classify("BatchPrefillWithPagedKVCacheWrapper", "flashinfer")[0] == "what_if"
    decode = next(r for r in dep.rows["decode"] if r.op == "attn_mqa")
    fa3 = next(p for p in decode.paths if p.name == "fa3")
    assert fa3.flags == {"--decode-attention-backend": "fa3"}
    assert fa3.parts[0].matches("flash_attn_with_kvcache", "sgl_kernel")


def test_batch_attention_plan_grows_the_float_workspace_it_is_asked_for(monkeypatch):
    """flashinfer's holistic plan raises with the bytes it needs; the binder re-plans with that much more
    (a shared buffer), and refuses a need beyond half the free GPU memory with a message naming it."""
    import torch

    from dskbench.adapters.attention import mha_prefill_flashinfer as m

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10_000, 20_000))

    class Wrapper:
        float_workspace_buffer = torch.empty(100, dtype=torch.uint8)

    w, calls = Wrapper(), []

    def plan() -> None:
        calls.append(w.float_workspace_buffer.numel())
        if w.float_workspace_buffer.numel() < 1000:
            raise RuntimeError(
                "Error in function 'aligned_alloc': Buffer overflow when allocating memory for "
                "holistic_partial_o with size 900 and alignment 16, but only 100 bytes available in "
                "AlignedAllocator. Increase the workspace buffer size."
            )

    m._plan_with_room(w, plan, torch.device("cpu"))
    assert calls == [100, 1000]

    w.float_workspace_buffer = torch.empty(100, dtype=torch.uint8)
    calls.clear()

    def greedy() -> None:
        raise RuntimeError(
            "Buffer overflow when allocating memory for holistic_partial_o with size 9000000 and alignment "
            "16, but only 100 bytes available. Increase the workspace buffer size."
        )

    with pytest.raises(RuntimeError, match=r"needs .* GiB of float workspace \(holistic_partial_o\)"):
        m._plan_with_room(w, greedy, torch.device("cpu"))

    def other() -> None:
        raise RuntimeError("Check failed: something else")

    with pytest.raises(RuntimeError, match="something else"):
        m._plan_with_room(w, other, torch.device("cpu"))


def test_paged_prefill_v_cache_has_k_page_stride_and_v_values():
    import torch

    from dskbench.adapters.attention import mha_prefill_flashinfer as m

    t, nh, dq, dv = 5, 3, 192, 128
    k, v = torch.randn(t, nh, dq), torch.randn(t, nh, dv)
    vc = m._same_page_stride(v, dq).view(t, 1, nh, -1)[..., :dv]
    kc = k.view(t, 1, nh, dq)
    assert vc.stride(0) == kc.stride(0) and vc.stride(2) == kc.stride(2)
    assert vc.shape == (t, 1, nh, dv) and torch.equal(vc.reshape(t, nh, dv), v)
