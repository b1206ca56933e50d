"""Attention kernels (catalogue §1): MLA decode, MHA prefill, attention-state merges, MLA concatenations.

MLA decode (absorbed): q = [q_nope_absorbed | q_pe] is [B, Nh, 576]; the cache holds one latent row
[c_kv (512) | k_pe (64)] per token; attention is softmax(q . row * sm_scale) @ row[:512]. Inputs build one
bf16 cache [pages * 128, 576] and a page table of 128-token pages (scattered, as a page allocator leaves
them), so every backend reads the same storage: page size 1 (FlashInfer MLA and Triton, token indices, as
SGLang's backends plan them), 64 (TRT-LLM / XQA) and 128 (CUTLASS MLA) are views of it.

MHA prefill (the non-absorbed prefill path): q/k [T, Nh, 192], v [T, Nh, 128], causal, no prefix; a prefill
step's T tokens are split into requests of at most ``PREFILL_SEQ_LEN`` tokens.

Softmax scale: SGLang's ``layer.scaling`` for DeepSeek-R1, 192^-0.5 times the YaRN mscale^2
(``compute_mla_mscale_scaling``: factor 40, mscale_all_dim 1 -> (0.1 ln 40 + 1)^2 = 1.874), 0.1352.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import SM100, Backend, Requirement
from dskbench.adapters.base import Adapter, Traffic
from dskbench.shapes.cases import Case, default_shapes

BF16 = torch.bfloat16
ROPE_SCALING_FACTOR = 40.0  # DeepSeek-R1 config.json rope_scaling (yarn): factor 40, mscale_all_dim 1.0
MSCALE_ALL_DIM = 1.0
PAGE = 128  # page granularity of the shared decode cache (lcm of the backends' page sizes 1, 64, 128)
TRTLLM_PAGE = 64  # SGLang's trtllm_mla / XQA page size
CUTLASS_MLA_HEADS = 128  # cutlass_mla_decode's fixed head count (MAX_HEADS in sgl_kernel's wrapper)
KV_CACHE_BUDGET_BYTES = 40 * 10**9  # decode cases whose KV cache is larger are skipped
PREFILL_SEQ_LEN = 4096  # longest request in a prefill step
FLASHINFER_MLA_WORKSPACE_BYTES = 384 * 1024 * 1024  # SGLANG_FLASHINFER_WORKSPACE_SIZE default
TRTLLM_MLA_WORKSPACE_BYTES = 150 * 1024 * 1024  # trtllm_mla_backend DEFAULT_WORKSPACE_SIZE_MB
TRITON_MLA_BASE_KV_SPLITS = 8  # server_args.triton_attention_num_kv_splits default
SM120 = Requirement(sm=(120, 121))


def _config() -> dict[str, Any]:
    return default_shapes().config


def mla_softmax_scale() -> float:
    """DeepSeek-R1's attention scale as SGLang computes it (model_config.scaling)."""
    cfg = _config()
    mscale = 0.1 * MSCALE_ALL_DIM * math.log(ROPE_SCALING_FACTOR) + 1.0
    return float(cfg["Dq"]) ** -0.5 * mscale * mscale


_WORKSPACES: dict[tuple[str, str, int], torch.Tensor] = {}


def shared_workspace(name: str, nbytes: int, device: torch.device, zeroed: bool = False) -> torch.Tensor:
    """One workspace per (name, device), shared by every bind, as SGLang shares one across its wrappers.

    Rotated input sets each bind a launcher; they run one after another, so sharing is safe and keeps
    64 sets from holding 64 x 384 MB.
    """
    key = (name, str(device), nbytes)
    if key not in _WORKSPACES:
        alloc = torch.zeros if zeroed else torch.empty
        _WORKSPACES[key] = alloc(nbytes, dtype=torch.uint8 if not zeroed else torch.int8, device=device)
    return _WORKSPACES[key]


def _generator(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _randn(shape: tuple[int, ...], gen: torch.Generator, device: str, std: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen, device=device, dtype=BF16).mul_(std)


# -- MLA decode ------------------------------------------------------------------------------------------


def mla_decode_reference(
    q: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor, scale: float
) -> torch.Tensor:
    """softmax(q . rows^T * scale) @ rows[:, :512] per request, fp32 -> [B, Nh, 512]."""
    b, nh, dqk = q.shape
    dv = dqk - int(_config()["Dr"])
    out = torch.empty(b, nh, dv, dtype=torch.float32, device=q.device)
    for i, length in enumerate(seq_lens.tolist()):
        rows = kv_cache[token_slots(page_table[i], length)].float()  # [L, 576]
        p = torch.softmax((q[i].float() @ rows.t()) * scale, dim=-1)
        out[i] = p @ rows[:, :dv]
    return out


def token_slots(pages: torch.Tensor, length: int, page: int = PAGE) -> torch.Tensor:
    """Cache rows of a request's first `length` tokens from its page ids (int64)."""
    n = -(-length // page)
    slots = pages[:n].long().unsqueeze(1) * page + torch.arange(page, device=pages.device)
    return slots.flatten()[:length]


def _sub_pages(page_table: torch.Tensor, sub: int) -> torch.Tensor:
    """Page table of 128-token pages -> the same cache seen as pages of `sub` tokens (int32)."""
    r = PAGE // sub
    pt = page_table.long().unsqueeze(-1) * r + torch.arange(r, device=page_table.device)
    return pt.flatten(1).to(torch.int32).contiguous()


def _token_indices(inputs: dict[str, Any], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv_indptr int32 [B+1], kv_indices [sum L]) for page size 1, as SGLang builds them."""
    pt, lens = inputs["page_table"], inputs["seq_lens"]
    idx = torch.cat([token_slots(pt[i], n) for i, n in enumerate(lens.tolist())]).to(dtype)
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=lens.device)
    indptr[1:] = torch.cumsum(lens, 0)
    return indptr, idx


class _MlaDecode(Adapter):
    """Shared inputs, reference and traffic of the MLA decode kernels (role mla_decode of attn_mqa)."""

    role = "mla_decode"
    ops = ("attn_mqa",)

    def skip_reason(self, case: Case) -> str | None:
        need = _kv_cache_bytes(case)
        if need > KV_CACHE_BUDGET_BYTES:
            return f"KV cache of {need / 1e9:.1f} GB exceeds the {KV_CACHE_BUDGET_BYTES / 1e9:.0f} GB budget"
        return None

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        d = case.dims
        b, nh, kv_len = int(d["B"]), int(d["Nh"]), int(d["kv_len"])
        dqk = int(d["Lkv"]) + int(d["Dr"])
        pages_per_req = -(-kv_len // PAGE)
        gen = _generator(device, seed)
        perm = torch.randperm(b * pages_per_req, generator=torch.Generator().manual_seed(seed))
        return {
            "q": _randn((b, nh, dqk), gen, device),
            "kv_cache": _randn((b * pages_per_req * PAGE, dqk), gen, device),
            "page_table": perm.view(b, pages_per_req).to(torch.int32).to(device),
            "seq_lens": torch.full((b,), kv_len, dtype=torch.int32, device=device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return mla_decode_reference(
            inputs["q"], inputs["kv_cache"], inputs["page_table"], inputs["seq_lens"], mla_softmax_scale()
        )

    def traffic(self, case: Case) -> Traffic:
        d = case.dims
        b, nh, kv_len, lkv = int(d["B"]), int(d["Nh"]), int(d["kv_len"]), int(d["Lkv"])
        dqk = lkv + int(d["Dr"])
        byts = _kv_cache_bytes(case) + b * nh * (dqk + lkv) * 2 + 4 * b
        flops = b * 2 * nh * kv_len * (dqk + lkv)
        return Traffic(byts, flops, "KV rows + q + out; page-table bytes (backend page size) excluded")


def _kv_cache_bytes(case: Case) -> int:
    d = case.dims
    return int(d["B"]) * int(d["kv_len"]) * (int(d["Lkv"]) + int(d["Dr"])) * 2


def _bind_flashinfer_mla(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """SGLang's flashinfer_mla decode: page size 1 with token indices, plan() here, run() timed.

    The wrapper is the CUDA-graph kind SGLang captures decode with (fixed index buffers).
    """
    q, kv = inputs["q"], inputs["kv_cache"]
    b, nh, _ = q.shape
    lkv = int(case.dims["Lkv"])
    workspace = shared_workspace("flashinfer_mla", FLASHINFER_MLA_WORKSPACE_BYTES, q.device)
    kv_indptr, kv_indices = _token_indices(inputs, torch.int32)
    qo_indptr = torch.arange(b + 1, dtype=torch.int32, device=q.device)
    buffers = {
        "qo_indptr": torch.empty_like(qo_indptr),
        "kv_indptr": torch.empty_like(kv_indptr),
        "kv_indices": torch.empty_like(kv_indices),
        "kv_len_arr": torch.empty_like(inputs["seq_lens"]),
    }
    wrapper = fn(workspace, use_cuda_graph=True, backend="auto", **buffers)
    wrapper.plan(
        qo_indptr,
        kv_indptr,
        kv_indices,
        inputs["seq_lens"],
        nh,
        lkv,
        int(case.dims["Dr"]),
        1,
        False,
        mla_softmax_scale(),
        q.dtype,
        kv.dtype,
    )
    k3 = kv.view(kv.shape[0], 1, kv.shape[1])
    q_nope, q_pe = q[..., :lkv], q[..., lkv:]
    out = torch.empty(b, nh, lkv, dtype=q.dtype, device=q.device)

    def launch() -> torch.Tensor:
        wrapper.run(q_nope, q_pe, k3[:, :, :lkv], k3[:, :, lkv:], out=out)
        return out

    return launch


@register
class BatchMLAPagedAttentionWrapperAdapter(_MlaDecode):
    kernel = "BatchMLAPagedAttentionWrapper"
    description = (
        "FlashInfer MLA decode (fa3 on sm90, fa2 elsewhere), as SGLang's flashinfer_mla backend plans it"
    )
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.mla:BatchMLAPagedAttentionWrapper",
            None,
            "jit",
            _bind_flashinfer_mla,
            fallbacks=("flashinfer:BatchMLAPagedAttentionWrapper",),
            label="backend='auto', page size 1, use_cuda_graph wrapper; plan() in bind",
        )
    ]


def mla_decode_kv_splits_cap(base: int, sm_count: int, max_context_len: int) -> int:
    """SGLang's _mla_decode_kv_splits_cap (triton_backend.py): attn_logits' split dimension for MLA."""
    if sm_count <= 0:
        return base
    sm_cap = 1 << (sm_count - 1).bit_length()
    ctx_cap = 1 << (-(-max_context_len // 32) - 1).bit_length()
    return max(base, min(sm_cap, ctx_cap))


def _bind_triton_mla_decode(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """SGLang's Triton backend for MLA decode: num_kv_splits from its scheduling kernel, fp32 scratch."""
    from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton

    q, kv, lens = inputs["q"], inputs["kv_cache"], inputs["seq_lens"]
    b, nh, _ = q.shape
    lkv = int(case.dims["Lkv"])
    props = torch.cuda.get_device_properties(q.device)
    sm_count = props.multi_processor_count
    max_splits = mla_decode_kv_splits_cap(TRITON_MLA_BASE_KV_SPLITS, sm_count, int(_config()["max_position"]))
    num_kv_splits = torch.empty(b, dtype=torch.int32, device=q.device)
    get_num_kv_splits_triton[(1,)](
        num_kv_splits,
        lens,
        b,
        1,
        nh,
        1,
        max_splits,
        sm_count,
        MAX_NUM_SEQ=max(256, 1 << (b - 1).bit_length()),
    )
    kv_indptr, kv_indices = _token_indices(inputs, torch.int64)
    k_buffer = kv.view(kv.shape[0], 1, kv.shape[1])
    v_buffer = k_buffer[..., :lkv]
    logits = torch.empty(b, nh, max_splits, lkv, dtype=torch.float32, device=q.device)
    lse = torch.empty(b, nh, max_splits, dtype=torch.float32, device=q.device)
    out = torch.empty(b, nh, lkv, dtype=q.dtype, device=q.device)
    use_pdl = props.major >= 9

    def launch() -> torch.Tensor:
        fn(
            q,
            k_buffer,
            v_buffer,
            out,
            kv_indptr,
            kv_indices,
            logits,
            lse,
            num_kv_splits,
            max_splits,
            mla_softmax_scale(),
            1.0,
            1.0,
            has_mla=True,
            use_pdl=use_pdl,
            page_size=1,
        )
        return out

    return launch


@register
class DecodeAttentionKernel(_MlaDecode):
    kernel = "decode_attention_kernel"
    description = "Triton split-KV MLA decode (grouped stage 1 + reduce), as SGLang's triton backend calls it"
    backends = [
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.attention.decode_attention:decode_attention_fwd",
            None,
            "triton",
            _bind_triton_mla_decode,
            fallbacks=("sglang.srt.layers.attention.triton_ops.decode_attention:decode_attention_fwd",),
            label="page size 1; max_kv_splits = SGLang's MLA cap; attn_logits/lse fp32 scratch in bind",
        )
    ]


def _bind_cutlass_mla(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """SGLang's cutlass_mla backend: 128-token pages, workspace from cutlass_mla_get_workspace_size."""
    import sgl_kernel

    q, kv, pt, lens = inputs["q"], inputs["kv_cache"], inputs["page_table"], inputs["seq_lens"]
    b, nh, _ = q.shape
    lkv = int(case.dims["Lkv"])
    size = sgl_kernel.cutlass_mla_get_workspace_size(pt.shape[1] * PAGE, b, num_kv_splits=1)
    workspace = torch.empty(size, dtype=torch.uint8, device=q.device)
    # The kernel always runs 128 heads: sgl_kernel's wrapper pads fewer heads (attention TP > 1) per call.
    q_pad = torch.zeros(b, CUTLASS_MLA_HEADS, q.shape[2], dtype=q.dtype, device=q.device)
    q_pad[:, :nh] = q
    q_nope, q_pe = q_pad[..., :lkv].contiguous(), q_pad[..., lkv:].contiguous()
    cache = kv.view(-1, PAGE, kv.shape[1])
    out = torch.empty(b, CUTLASS_MLA_HEADS, lkv, dtype=q.dtype, device=q.device)
    scale = mla_softmax_scale()

    def launch() -> torch.Tensor:
        fn(out, q_nope, q_pe, cache, lens, pt, workspace, scale, 1)
        return out[:, :nh]

    return launch


@register
class CutlassMlaDecode(_MlaDecode):
    kernel = "cutlass_mla_decode"
    description = "CUTLASS SM100 MLA decode (128 heads, page 128), as SGLang's cutlass_mla backend calls it"
    backends = [
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.cutlass_mla_decode.default",
            None,
            "aot",
            _bind_cutlass_mla,
            requires=SM100,
            preload=("sgl_kernel",),
            label="num_kv_splits=1 (SGLang's value); workspace and head padding to 128 in bind",
        )
    ]

    def skip_reason(self, case: Case) -> str | None:
        if int(case.dims["Nh"]) > CUTLASS_MLA_HEADS:
            return f"cutlass_mla_decode handles at most {CUTLASS_MLA_HEADS} heads"
        return super().skip_reason(case)


def _trtllm_decode_args(inputs: dict[str, Any], case: Case) -> dict[str, Any]:
    q, kv = inputs["q"], inputs["kv_cache"]
    d = case.dims
    return {
        "query": q.unsqueeze(1),  # [B, q_len=1, Nh, 576]
        "kv_cache": kv.view(-1, TRTLLM_PAGE, kv.shape[1]).unsqueeze(1),  # [pages, 1, 64, 576]
        "workspace_buffer": shared_workspace("trtllm_mla", TRTLLM_MLA_WORKSPACE_BYTES, q.device, zeroed=True),
        "qk_nope_head_dim": int(d["Dn"]) if "Dn" in d else int(_config()["Dn"]),
        "kv_lora_rank": int(d["Lkv"]),
        "qk_rope_head_dim": int(d["Dr"]),
        "block_tables": _sub_pages(inputs["page_table"], TRTLLM_PAGE),
        "seq_lens": inputs["seq_lens"],
        "max_seq_len": int(d["kv_len"]),
        "bmm1_scale": mla_softmax_scale(),  # q_scale * k_scale * layer.scaling with bf16 q/KV
    }


def _bind_trtllm_decode(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    args = _trtllm_decode_args(inputs, case)
    b, nh, _ = inputs["q"].shape
    lkv = int(case.dims["Lkv"])

    def launch() -> torch.Tensor:
        return fn(**args).view(b, nh, lkv)

    return launch


@register
class TrtllmBatchDecodeWithKvCacheMla(_MlaDecode):
    kernel = "trtllm_batch_decode_with_kv_cache_mla"
    description = "TRT-LLM-gen MLA decode (sm100), page 64, as SGLang's trtllm_mla backend calls it"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.mla:trtllm_batch_decode_with_kv_cache_mla",
            None,
            "cubin",
            _bind_trtllm_decode,
            requires=SM100,
            fallbacks=("flashinfer.decode:trtllm_batch_decode_with_kv_cache_mla",),
            label="backend auto (trtllm-gen on sm100); zeroed 150 MB workspace",
        )
    ]


@register
class XqaBatchDecodeWithKvCacheMla(_MlaDecode):
    kernel = "xqa_batch_decode_with_kv_cache_mla"
    description = "XQA MLA decode for SM120/121 (bf16, q_len 1), page 64"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.mla:xqa_batch_decode_with_kv_cache_mla",
            None,
            "jit",
            _bind_trtllm_decode,
            requires=SM120,
            fallbacks=("flashinfer.decode:xqa_batch_decode_with_kv_cache_mla",),
            label="SM120/121 only (not H100/B200)",
        )
    ]


# -- MHA prefill (q/k 192, v 128, causal) ----------------------------------------------------------------


def prefill_seq_lens(num_tokens: int) -> list[int]:
    """Requests of a prefill step: PREFILL_SEQ_LEN-token prompts, the remainder as one shorter prompt."""
    full, rest = divmod(num_tokens, PREFILL_SEQ_LEN)
    return [PREFILL_SEQ_LEN] * full + ([rest] if rest else [])


def mha_causal_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int], scale: float
) -> torch.Tensor:
    """Causal attention per request in fp32 (heads in chunks to bound the score matrix) -> [T, Nh, Dv]."""
    t, nh, _ = q.shape
    out = torch.empty(t, nh, v.shape[-1], dtype=torch.float32, device=q.device)
    start = 0
    for s in seq_lens:
        sl = slice(start, start + s)
        hc = max(1, min(nh, (1 << 26) // (s * s)))
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        for h0 in range(0, nh, hc):
            hs = slice(h0, min(nh, h0 + hc))
            qh, kh, vh = (x[sl, hs].float().transpose(0, 1) for x in (q, k, v))
            scores = (qh @ kh.transpose(1, 2)) * scale
            p = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
            out[sl, hs] = (p @ vh).transpose(0, 1)
        start += s
    return out


class _MhaPrefill(Adapter):
    """Shared inputs, reference and traffic of the MHA prefill kernels (role mha_prefill of attn_mha)."""

    role = "mha_prefill"
    ops = ("attn_mha",)

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        d = case.dims
        t, nh, dq, dv = int(d["T"]), int(d["Nh"]), int(d["Dq"]), int(d["Dv"])
        gen = _generator(device, seed)
        return {
            "q": _randn((t, nh, dq), gen, device),
            "k": _randn((t, nh, dq), gen, device),
            "v": _randn((t, nh, dv), gen, device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        lens = prefill_seq_lens(int(case.dims["T"]))
        return mha_causal_reference(inputs["q"], inputs["k"], inputs["v"], lens, mla_softmax_scale())

    def traffic(self, case: Case) -> Traffic:
        d = case.dims
        t, nh, dq, dv = int(d["T"]), int(d["Nh"]), int(d["Dq"]), int(d["Dv"])
        pairs = sum(s * (s + 1) // 2 for s in prefill_seq_lens(t))
        return Traffic(
            t * nh * (2 * dq + 2 * dv) * 2,
            2 * nh * (dq + dv) * pairs,
            f"causal, no prefix; requests of {PREFILL_SEQ_LEN} tokens",
        )


def _ragged_meta(case: Case, device: torch.device) -> tuple[torch.Tensor, list[int]]:
    lens = prefill_seq_lens(int(case.dims["T"]))
    cu = torch.zeros(len(lens) + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(torch.tensor(lens), 0)
    return cu.to(device), lens


def _bind_triton_extend(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """SGLang's Triton backend, MHA extend without prefix (DeepSeek prefill): empty prefix, causal."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    dev = q.device
    cu, lens = _ragged_meta(case, dev)
    b = len(lens)
    kv_indptr = torch.zeros(b + 1, dtype=torch.int32, device=dev)
    kv_indices = torch.zeros(1, dtype=torch.int64, device=dev)  # no prefix token is read
    width = int(_config()["Dkv"])
    k_buffer = torch.zeros(1, 1, width, dtype=q.dtype, device=dev)  # the MLA pool's shape; unread
    v_buffer = k_buffer[..., : int(_config()["Lkv"])]
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=dev)
    scale = mla_softmax_scale()

    def launch() -> torch.Tensor:
        fn(
            q,
            k,
            v,
            out,
            k_buffer,
            v_buffer,
            cu,
            kv_indptr,
            kv_indices,
            None,
            True,
            None,
            max(lens),
            1.0,
            1.0,
            scale,
        )
        return out

    return launch


@register
class ExtendAttentionKernel(_MhaPrefill):
    kernel = "extend_attention_kernel"
    description = "Triton extend attention (_fwd_kernel) on DeepSeek's MHA prefill: q/k 192, v 128, causal"
    backends = [
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.attention.extend_attention:extend_attention_fwd",
            None,
            "triton",
            _bind_triton_extend,
            fallbacks=("sglang.srt.layers.attention.triton_ops.extend_attention:extend_attention_fwd",),
            label="no prefix (SGLang's triton backend uses MHA only for prefix-free extends)",
        )
    ]


def _bind_triton_prefill(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """context_attention_fwd needs one head dim for q/k/v/o: V and O are zero-padded to 192 in bind."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    dev = q.device
    cu, lens = _ragged_meta(case, dev)
    v_pad = torch.zeros(q.shape, dtype=v.dtype, device=dev)
    v_pad[..., : v.shape[-1]] = v
    o_pad = torch.empty(q.shape, dtype=q.dtype, device=dev)
    starts = cu[:-1].to(torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    scale = mla_softmax_scale()
    dv = v.shape[-1]

    def launch() -> torch.Tensor:
        fn(q, k, v_pad, o_pad, starts, seq_lens, max(lens), True, scale)
        return o_pad[..., :dv]

    return launch


@register
class PrefillAttentionKernel(_MhaPrefill):
    kernel = "prefill_attention_kernel"
    description = "Triton context attention (prefill_attention.py) at the MHA prefill shapes, V padded to 192"
    backends = [
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.attention.prefill_attention:context_attention_fwd",
            None,
            "triton",
            _bind_triton_prefill,
            fallbacks=("sglang.srt.layers.attention.triton_ops.prefill_attention:context_attention_fwd",),
            label="kernel needs Lq == Lv: V/O zero-padded 128 -> 192 (padding is read and written)",
        )
    ]


def _bind_trtllm_ragged(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """SGLang's trtllm_mla prefill without prefix: ragged q = kv, causal, o_sf_scale 1."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    dev = q.device
    cu, lens = _ragged_meta(case, dev)
    cu32 = cu.to(torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    workspace = shared_workspace("trtllm_mla", TRTLLM_MLA_WORKSPACE_BYTES, dev, zeroed=True)
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=dev)
    kw = {
        "query": q,
        "key": k,
        "value": v,
        "workspace_buffer": workspace,
        "seq_lens": seq_lens,
        "max_q_len": max(lens),
        "max_kv_len": max(lens),
        "bmm1_scale": mla_softmax_scale(),
        "bmm2_scale": 1.0,
        "o_sf_scale": 1.0,
        "batch_size": len(lens),
        "window_left": -1,
        "cum_seq_lens_q": cu32,
        "cum_seq_lens_kv": cu32,
        "enable_pdl": False,
        "is_causal": True,
        "return_lse": False,
        "out": out,
    }

    def launch() -> torch.Tensor:
        fn(**kw)
        return out

    return launch


@register
class TrtllmRaggedAttentionDeepseek(_MhaPrefill):
    kernel = "trtllm_ragged_attention_deepseek"
    description = "TRT-LLM-gen ragged MHA prefill for DeepSeek (q/k 192, v 128), sm100"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.prefill:trtllm_ragged_attention_deepseek",
            None,
            "cubin",
            _bind_trtllm_ragged,
            requires=SM100,
            label="backend trtllm-gen; zeroed 150 MB workspace",
        )
    ]


# -- merge_state / merge_state_v2 ------------------------------------------------------------------------


def merge_state_reference(
    v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor, base2: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention states in fp32; LSEs in base 2 (FlashInfer) or natural log (sgl/Triton)."""
    sa, sb = s_a.float(), s_b.float()
    m = torch.maximum(sa, sb)
    if base2:
        wa, wb = torch.exp2(sa - m), torch.exp2(sb - m)
        s = m + torch.log2(wa + wb)
    else:
        wa, wb = torch.exp(sa - m), torch.exp(sb - m)
        s = m + torch.log(wa + wb)
    v = (v_a.float() * wa.unsqueeze(-1) + v_b.float() * wb.unsqueeze(-1)) / (wa + wb).unsqueeze(-1)
    return v, s


def flashinfer_merge_state_max_heads(head_dim: int, element_size: int) -> int:
    """Heads FlashInfer's MergeState launches in one block before exceeding 1024 threads (SGLang's guard)."""
    vec = max(16 // element_size, head_dim // 32)
    bdx = head_dim // vec
    return 1024 // bdx if bdx > 0 else 1024


class _MergeState(Adapter):
    role = "merge_state"
    ops = ("attn_mha", "_chunked_prefix_attn_mha")
    base2 = False

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        d = case.dims
        t, nh, hd = int(d["T"]), int(d["Nh"]), int(d["D"])
        gen = _generator(device, seed)

        def lse() -> torch.Tensor:  # log-sum-exp of a chunk's logits: a few units, spread across rows
            return torch.rand((t, nh), generator=gen, device=device).mul_(6.0).add_(4.0)

        return {
            "v_a": _randn((t, nh, hd), gen, device),
            "s_a": lse(),
            "v_b": _randn((t, nh, hd), gen, device),
            "s_b": lse(),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        return merge_state_reference(inputs["v_a"], inputs["s_a"], inputs["v_b"], inputs["s_b"], self.base2)

    def traffic(self, case: Case) -> Traffic:
        d = case.dims
        t, nh, hd = int(d["T"]), int(d["Nh"]), int(d["D"])
        return Traffic(3 * t * nh * hd * 2 + 3 * t * nh * 4, t * nh * (3 * hd + 10))


def _bind_merge_out_of_place(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    args = (inputs["v_a"], inputs["s_a"], inputs["v_b"], inputs["s_b"])
    return lambda: fn(*args)


def _bind_merge_into(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    args = (inputs["v_a"], inputs["s_a"], inputs["v_b"], inputs["s_b"])
    v, s = torch.empty_like(inputs["v_a"]), torch.empty_like(inputs["s_a"])

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn(*args, v, s)
        return v, s

    return launch


def _flashinfer_merge_state_skip(case: Case) -> str | None:
    nh, hd = int(case.dims["Nh"]), int(case.dims["D"])
    cap = flashinfer_merge_state_max_heads(hd, 2)
    if nh > cap:
        return (
            f"FlashInfer MergeState puts all {nh} heads in one block (> 1024 threads above {cap} heads); "
            "SGLang falls back to merge_state_triton there (benchmarked under merge_state_v2)"
        )
    return None


@register
class MergeState(_MergeState):
    kernel = "merge_state"
    description = "FlashInfer cascade merge of two attention states (base-2 LSE)"
    base2 = True
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.cascade:merge_state",
            None,
            "jit",
            _bind_merge_out_of_place,
            fallbacks=("flashinfer:merge_state",),
            label="base-2 LSE; sgl-kernel 0.4.5 dropped its merge_state",
            skip=_flashinfer_merge_state_skip,
        )
    ]


@register
class MergeStateV2(_MergeState):
    kernel = "merge_state_v2"
    description = "sgl-kernel merge of two attention states (natural-log LSE), and its Triton twin"
    backends = [
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.merge_state_v2.default",
            None,
            "aot",
            _bind_merge_into,
            preload=("sgl_kernel",),
        ),
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.attention.merge_state:merge_state_triton",
            None,
            "triton",
            _bind_merge_into,
            label="SGLang's fallback (fp8, odd head dims; FlashInfer backend above 64 heads)",
        ),
    ]


# -- concat_mla_k / concat_mla_absorb_q ------------------------------------------------------------------


def _needs_128_heads(case: Case) -> str | None:
    if int(case.dims["Nh"]) != 128:
        return (
            "this concat_mla_k needs 128 local heads (attention TP 1); SGLang uses the Triton one otherwise"
        )
    return None


def _bind_concat_k(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    k_nope, k_rope = inputs["k_nope"], inputs["k_rope"]
    t, nh, dn = k_nope.shape
    k = torch.empty(t, nh, dn + k_rope.shape[-1], dtype=k_nope.dtype, device=k_nope.device)

    def launch() -> torch.Tensor:
        fn(k, k_nope, k_rope)
        return k

    return launch


@register
class ConcatMlaK(Adapter):
    kernel = "concat_mla_k"
    role = "concat_k"
    ops = ("_concat_and_cast_mha_k",)
    description = "Build MHA K = [k_nope | k_rope broadcast over heads] for DeepSeek prefill (128 heads)"
    backends = [
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.concat_mla:concat_mla_k",
            None,
            "jit",
            _bind_concat_k,
            label="what SGLang 0.5.16 calls on CUDA (128 local heads)",
            skip=_needs_128_heads,
        ),
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.concat_mla_k.default",
            None,
            "aot",
            _bind_concat_k,
            preload=("sgl_kernel",),
            skip=_needs_128_heads,
        ),
        Backend(
            "flashinfer",
            "flashinfer.concat_ops:concat_mla_k",
            None,
            "jit",
            _bind_concat_k,
            skip=_needs_128_heads,
        ),
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.kvcache.cache_ops:concat_and_cast_mha_k_triton",
            None,
            "triton",
            _bind_concat_k,
            label="SGLang's generic path (used when local heads != 128)",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        """k_nope and k_rope are the strided views SGLang passes (kv_b_proj output, fused qkv_a output)."""
        d = case.dims
        cfg = _config()
        t, nh, dn, dr = int(d["T"]), int(d["Nh"]), int(d["Dn"]), int(d["Dr"])
        gen = _generator(device, seed)
        kv = _randn((t, nh, dn + int(cfg["Dv"])), gen, device)  # [T, Nh, 256] = [k_nope | v]
        qkv_a = _randn((t, int(cfg["Lq"]) + int(cfg["Lkv"]) + dr), gen, device)  # [T, 2112]
        rope_at = int(cfg["Lq"]) + int(cfg["Lkv"])
        return {"k_nope": kv[..., :dn], "k_rope": qkv_a[:, rope_at:].unsqueeze(1)}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        k_nope, k_rope = inputs["k_nope"], inputs["k_rope"]
        return torch.cat([k_nope.float(), k_rope.float().expand(-1, k_nope.shape[1], -1)], dim=-1)

    def traffic(self, case: Case) -> Traffic:
        d = case.dims
        t, nh, dn, dr = int(d["T"]), int(d["Nh"]), int(d["Dn"]), int(d["Dr"])
        return Traffic(t * (nh * dn + dr + nh * (dn + dr)) * 2, 0)


def _bind_absorb_q_new(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    a, b = inputs["a"], inputs["b"]
    return lambda: fn(a, b)


def _bind_absorb_q_into(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    a, b = inputs["a"], inputs["b"]
    out = torch.empty(*a.shape[:-1], a.shape[-1] + b.shape[-1], dtype=a.dtype, device=a.device)

    def launch() -> torch.Tensor:
        fn(a, b, out)
        return out

    return launch


@register
class ConcatMlaAbsorbQ(Adapter):
    kernel = "concat_mla_absorb_q"
    role = "concat_q"
    ops = ("_merge_q",)
    description = "q = [q_nope_absorbed (512) | q_pe (64)] for the TRT-LLM / FlashInfer MLA decode"
    backends = [
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.concat_mla:concat_mla_absorb_q",
            None,
            "jit",
            _bind_absorb_q_new,
            label="what SGLang 0.5.16 calls (concat_mla_absorb_q_general); allocates the output",
        ),
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.concat_mla_absorb_q.default",
            None,
            "aot",
            _bind_absorb_q_into,
            preload=("sgl_kernel",),
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        d = case.dims
        t, nh = int(d["T"]), int(d["Nh"])
        gen = _generator(device, seed)
        return {
            "a": _randn((t, nh, int(d["Lkv"])), gen, device),
            "b": _randn((t, nh, int(d["Dr"])), gen, device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return torch.cat([inputs["a"].float(), inputs["b"].float()], dim=-1)

    def traffic(self, case: Case) -> Traffic:
        d = case.dims
        t, nh, w = int(d["T"]), int(d["Nh"]), int(d["Lkv"]) + int(d["Dr"])
        return Traffic(2 * t * nh * w * 2, 0)
