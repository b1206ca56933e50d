"""MoE compute kernels (catalogue §5): grouped expert GEMMs, routing bookkeeping, combine, fused MoE.

All adapters route tokens with ``dskbench.adapters.common.routing`` (DeepSeek's biased grouped top-k, uneven expert
loads), so the rows per expert, the number of touched experts and the block padding are what DeepSeek-R1
produces. Weight tensors are full-size on the GPU ([256, 4096, 7168] bf16 is 15 GB); on the CPU, where only
the torch reference runs, every expert shares one random slab (a stride-0 view over E), so a CPU case
allocates one expert's weights and the reference dequantises them once. Expert weights are counted in
``traffic`` for the experts the seed-0 routing activates (``routing_inputs.active_experts``).

Weight formats benchmarked (``moe_gemm`` role variants): BF16 and FP8 128x128-block for the Triton and
CUTLASS-FP8 paths, INT4-in-INT8 with FP8 activations for W4A8. The NVFP4 checkpoint itself has no Triton or
CUTLASS-FP8 path: on sm90 SGLang runs its routed experts with the Marlin W4A16 MoE (catalogue 5.16).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import SM90_ONLY, SM100, Backend, Requirement
from dskbench.adapters.base import Adapter, Check, Traffic, rel_error
from dskbench.adapters.common import fp8
from dskbench.adapters.common.routing import (
    Routing,
    active_experts,
    deepseek_routing,
    expert_counts,
    grouped_topk,
    routing_margin,
    sorted_by_expert,
)
from dskbench.shapes.cases import Case, default_shapes

BF16 = torch.bfloat16
GROUP = fp8.GROUP  # 128: activation group and weight block edge
CUTLASS_FP8_WORKSPACE_BYTES = 90000  # sglang Fp8MoEMethod._ensure_cutlass_buffers_initialized
TRTLLM_DEEPSEEK_ROUTING = 2  # flashinfer.tllm_enums.RoutingMethodType.DeepSeekV3
ROUTING_TIE_MARGIN = 1e-4  # fused-routing checks skip tokens whose expert choice is closer to a tie
SM90_OR_SM100 = Requirement(sm=(90, 100, 103))  # sgl-kernel's CUTLASS grouped GEMM has sm90 and sm100 paths
NVFP4_NOTE = "BF16/FP8-block weights: the NVFP4 checkpoint has no Triton path (sm90 runs Marlin W4A16 MoE)"


# -- shared helpers ------------------------------------------------------------------------------------


def _config() -> dict[str, Any]:
    return default_shapes().config


def _topk(case: Case) -> int:
    return int(case.dims["topk"] if "topk" in case.dims else case.dims["K"])


def _routing(case: Case, device: str, seed: int) -> Routing:
    cfg = _config()
    return deepseek_routing(
        int(case.dims["T"]),
        int(case.dims["E"]),
        _topk(case),
        int(cfg["n_group"]),
        int(cfg["topk_group"]),
        seed=seed,
        device=device,
    )


def _n_active(case: Case) -> int:
    cfg = _config()
    return active_experts(
        int(case.dims["T"]), int(case.dims["E"]), _topk(case), int(cfg["n_group"]), int(cfg["topk_group"])
    )


def _generator(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _randn(shape: tuple[int, ...], gen: torch.Generator, device: str, std: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen, device=device, dtype=BF16).mul_(std)


def _uniform(shape: tuple[int, ...], gen: torch.Generator, device: str, lo: float, hi: float) -> torch.Tensor:
    return torch.rand(shape, generator=gen, device=device, dtype=torch.float32).mul_(hi - lo).add_(lo)


def _fp8_values(shape: tuple[int, ...], gen: torch.Generator, device: str) -> torch.Tensor:
    """Random e4m3 values spread like a block-quantised weight (|q| up to ~448, std 112)."""
    return _randn(shape, gen, device, 112.0).clamp_(-fp8.FP8_MAX, fp8.FP8_MAX).to(fp8.FP8_DTYPE)


def _int4_packed(shape: tuple[int, int], gen: torch.Generator, device: str) -> torch.Tensor:
    """Random signed int4 [N, K] packed two per int8 byte, even k in the low nibble -> int8 [N, K/2]."""
    q = torch.randint(-8, 8, shape, generator=gen, device=device, dtype=torch.int8)
    return pack_int4(q)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7], [..., K] -> int8 [..., K/2] (low nibble = even index, as sgl-kernel's W4A8)."""
    lo, hi = q[..., 0::2], q[..., 1::2]
    return ((hi << 4) | (lo & 0x0F)).to(torch.int8)


def unpack_int4(p: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_int4 -> int8 [..., 2 * K/2] with sign extension."""
    lo = (p & 0x0F).to(torch.int16)
    lo = torch.where(lo >= 8, lo - 16, lo).to(torch.int8)
    hi = p >> 4  # arithmetic shift keeps the sign of the high nibble
    return torch.stack((lo, hi), dim=-1).flatten(-2)


def interleave_w4a8_scales(scales: torch.Tensor) -> torch.Tensor:
    """[E, N, K/128] -> [E, K/128/a, N*a] with a = 4 when K/128 % 4 == 0 (sglang w4afp8.interleave_scales)."""
    e, n, g = scales.shape
    a = 4 if g % 4 == 0 else 1
    return scales.reshape(e, n, g // a, a).permute(0, 2, 1, 3).reshape(e, g // a, n * a).contiguous()


def _per_expert(
    make: Callable[[int], torch.Tensor], num_experts: int, device: str, chunk: int = 8
) -> torch.Tensor:
    """Stack E per-expert tensors made `chunk` experts at a time (peak memory: the result plus one chunk);
    on the CPU one expert is made and broadcast (stride 0) over E."""
    if device == "cpu":
        one = make(1)
        return one.expand(num_experts, *one.shape[1:])
    first = make(min(chunk, num_experts))
    out = torch.empty((num_experts, *first.shape[1:]), dtype=first.dtype, device=first.device)
    out[: first.shape[0]] = first
    for e0 in range(first.shape[0], num_experts, chunk):
        m = min(chunk, num_experts - e0)
        out[e0 : e0 + m] = make(m)
    return out


@dataclass
class ExpertWeights:
    """One grouped-GEMM weight [E, N, K] in one format, with its dequantisation for the reference."""

    fmt: str  # bf16 | fp8_block | w4a8
    w: torch.Tensor  # bf16 [E,N,K] | e4m3 [E,N,K] | int8 [E,N,K/2] (two int4)
    scale: torch.Tensor | None = None  # fp8: fp32 [E,N/128,K/128]; w4a8: bf16 [E,N,K/128]

    @property
    def n(self) -> int:
        return int(self.w.shape[1])

    def key(self, e: int) -> tuple[int, int]:
        """Storage identity of expert e: experts sharing it (the CPU slab) have equal keys."""
        se = self.scale[e].data_ptr() if self.scale is not None else 0
        return (self.w[e].data_ptr(), se)

    def dequant(self, e: int, cache: dict[tuple[int, int], torch.Tensor]) -> torch.Tensor:
        """Expert e as fp32 [N, K], dequantised once per distinct storage."""
        we = self.w[e]
        se = self.scale[e] if self.scale is not None else None
        key = self.key(e)
        if key not in cache:
            if self.fmt == "bf16":
                cache[key] = we.float()
            elif self.fmt == "fp8_block":
                cache[key] = fp8.dequant_block(we, se)
            else:
                cache[key] = unpack_int4(we).float() * se.float().repeat_interleave(GROUP, dim=-1)
        return cache[key]


def make_expert_weights(
    num_experts: int, n: int, k: int, fmt: str, device: str, gen: torch.Generator
) -> ExpertWeights:
    """Random expert weights whose dequantised values have std ~ 1/sqrt(K) (outputs stay O(1))."""
    std = 1.0 / math.sqrt(k)
    if fmt == "bf16":
        return ExpertWeights(
            fmt, _per_expert(lambda m: _randn((m, n, k), gen, device, std), num_experts, device)
        )
    if fmt == "fp8_block":
        w = _per_expert(lambda m: _fp8_values((m, n, k), gen, device), num_experts, device)
        nb, kb = math.ceil(n / GROUP), math.ceil(k / GROUP)
        s = _per_expert(
            lambda m: _uniform((m, nb, kb), gen, device, 0.75 * std / 112.0, 1.25 * std / 112.0),
            num_experts,
            device,
        )
        return ExpertWeights(fmt, w, s)
    if fmt == "w4a8":
        w = _per_expert(
            lambda m: torch.stack([_int4_packed((n, k), gen, device) for _ in range(m)]), num_experts, device
        )
        int4_std = 4.6  # std of a uniform int in [-8, 7]
        s = _per_expert(
            lambda m: _uniform(
                (m, n, k // GROUP), gen, device, 0.75 * std / int4_std, 1.25 * std / int4_std
            ).to(BF16),
            num_experts,
            device,
        )
        return ExpertWeights(fmt, w, s)
    raise ValueError(f"unknown MoE weight format {fmt!r}")


def weight_bytes(n: int, k: int, fmt: str) -> int:
    """Bytes of one expert's [N, K] weight and its scales."""
    if fmt == "bf16":
        return n * k * 2
    if fmt == "fp8_block":
        return n * k + math.ceil(n / GROUP) * math.ceil(k / GROUP) * 4
    if fmt == "w4a8":
        return n * k // 2 + n * (k // GROUP) * 2
    raise ValueError(f"unknown MoE weight format {fmt!r}")


def _quant_dequant_groups(x: torch.Tensor) -> torch.Tensor:
    """What an FP8 1x128 activation quantisation leaves of x (fp32): the reference's view of FP8 inputs."""
    q, s = fp8.per_token_group_quant(x, GROUP)
    return fp8.dequant_per_token_group(q, s, GROUP)


def _ensure_sglang_server_args() -> None:
    """SGLang's MoE config lookup reads the process-wide ServerArgs; publish its test default if unset."""
    from sglang.srt.runtime_context import get_context

    ctx = get_context()
    try:
        ctx.server_args  # noqa: B018 - raises ValueError when unset
    except ValueError:
        ctx.override_server_args().install()


def marlin_block_size_m(num_tokens: int, top_k: int, num_experts: int) -> int:
    """moe_align block size of SGLang's Marlin MoE (fused_marlin_moe.py), what sm90 runs for NVFP4."""
    for bs in (8, 16, 32, 48, 64):
        if num_tokens * top_k / num_experts / bs < 0.9:
            return bs
    return 64


def align_max_padded(numel: int, num_buckets: int, block_size: int) -> int:
    """Length of sorted_token_ids SGLang allocates (moe_align_block_size.py; buckets = E + 1)."""
    if numel < num_buckets:
        return numel * block_size
    return numel + num_buckets * (block_size - 1)


def moe_gemm_reference(
    a: torch.Tensor,
    weights: ExpertWeights,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor | None,
    gate_up: bool,
) -> torch.Tensor:
    """The Triton MoE GEMM in fp32. gate_up: C[t*K+j] = A[t] @ W[e]^T -> [T*K, N].

    down: C[t, j] = w[t, j] * (A[t*K+j] @ W[e]^T) -> [T, K, N] (A is the [T*K, I] intermediate).
    """
    t, k = topk_ids.shape
    flat = topk_ids.flatten().long()
    out = torch.zeros(t * k, weights.n, dtype=torch.float32, device=a.device)
    cache: dict[tuple[int, int], torch.Tensor] = {}
    for experts in _share_groups(torch.unique(flat).tolist(), weights):
        slots = torch.isin(flat, torch.tensor(experts, device=flat.device)).nonzero().squeeze(1)
        rows = slots // k if gate_up else slots
        out[slots] = a[rows] @ weights.dequant(experts[0], cache).t()
    if gate_up:
        return out
    assert topk_weights is not None
    return (out * topk_weights.flatten().float().unsqueeze(1)).view(t, k, weights.n)


def grouped_gemm_reference(a: torch.Tensor, offsets: torch.Tensor, weights: ExpertWeights) -> torch.Tensor:
    """Expert-ordered grouped GEMM in fp32: rows offsets[e]:offsets[e+1] of `a` times W[e]^T."""
    out = torch.zeros(a.shape[0], weights.n, dtype=torch.float32, device=a.device)
    cache: dict[tuple[int, int], torch.Tensor] = {}
    off = offsets.tolist()
    used = [e for e in range(len(off) - 1) if off[e + 1] > off[e]]
    for experts in _share_groups(used, weights):
        rows = torch.cat([torch.arange(off[e], off[e + 1]) for e in experts]).to(a.device)
        out[rows] = a[rows] @ weights.dequant(experts[0], cache).t()
    return out


def _share_groups(experts: list[int], *weights: ExpertWeights) -> list[list[int]]:
    """Experts grouped by shared weight storage (one group per expert on a GPU, one on the CPU slab)."""
    groups: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for e in experts:
        groups.setdefault(tuple(w.key(e) for w in weights), []).append(e)
    return list(groups.values())


def _exact_check(
    outs: tuple[torch.Tensor, ...], refs: tuple[torch.Tensor, ...], names: tuple[str, ...]
) -> Check:
    bad = [n for o, r, n in zip(outs, refs, names, strict=True) if not torch.equal(o.cpu(), r.cpu())]
    return Check(not bad, float(len(bad)), 0.0, "mismatch: " + ", ".join(bad) if bad else "exact")


def _check_segments(
    values: torch.Tensor, ref_values: torch.Tensor, bounds: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Segments [a, b) whose multisets of values differ (order inside a segment is the kernel's own)."""
    bad = []
    for a, b in bounds:
        if not torch.equal(torch.sort(values[a:b]).values, torch.sort(ref_values[a:b]).values):
            bad.append((a, b))
    return bad


def _torch_op(name: str) -> str:
    return f"torch.ops.sgl_kernel.{name}.default"


# -- fused_moe_kernel (Triton) ---------------------------------------------------------------------------


def _moe_gemm_dims(case: Case) -> tuple[int, int, int, int, int, bool]:
    """(T, E, topk, N, K, gate_up) of a moe_gemm case."""
    d = case.dims
    gate_up = (case.variant or "").startswith("gate_up")
    return int(d["T"]), int(d["E"]), _topk(case), int(d["N"]), int(d["K"]), gate_up


def _bind_fused_moe(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """Config lookup (tuned JSON, else SGLang's default config), alignment and C, as fused_experts does."""
    import triton.language as tl
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import (
        get_config_dtype_str,
        try_get_optimal_moe_config,
    )
    from sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size import moe_align_block_size

    _ensure_sglang_server_args()
    t, e, topk, n, k, gate_up = _moe_gemm_dims(case)
    use_fp8 = case.dims["weight"] == "fp8_block"
    inter, hidden = (n // 2, k) if gate_up else (k, n)
    block_shape = [GROUP, GROUP] if use_fp8 else None
    dtype_str = get_config_dtype_str(BF16, use_fp8_w8a8=use_fp8)
    config, (down_config, _) = try_get_optimal_moe_config(
        (e, 2 * inter, hidden),
        (e, hidden, inter),
        topk,
        dtype_str,
        t,
        block_shape=block_shape,
        return_down_config=True,
    )
    cfg = dict(config if gate_up or down_config is None else down_config)
    cfg.pop("USE_TMA", None)  # the TMA down path (tuned *_down.json) is not benchmarked
    topk_ids, topk_weights = inputs["topk_ids"], inputs["topk_weights"]
    sorted_ids, expert_ids, n_post = moe_align_block_size(topk_ids, config["BLOCK_SIZE_M"], e)
    shape = (t * topk, n) if gate_up else (t, topk, n)
    c = torch.empty(shape, dtype=BF16, device=inputs["a"].device)
    a, w, w_scale = inputs["a"], inputs["w"], inputs.get("w_scale")

    def launch() -> torch.Tensor:
        fn(
            a,
            w,
            None,
            c,
            None,
            w_scale,
            None,
            topk_weights,
            topk_ids,
            sorted_ids,
            expert_ids,
            n_post,
            not gate_up,  # mul_routed_weight: the down GEMM applies the routing weight
            topk if gate_up else 1,
            cfg,
            compute_type=tl.bfloat16,
            use_fp8_w8a8=use_fp8,
            use_int8_w8a8=False,
            use_int8_w8a16=False,
            use_int4_w4a16=False,
            per_channel_quant=False,
            block_shape=block_shape,
            filter_expert=False,  # EP = 1: every expert is local
            router_topk=1 if gate_up else topk,
        )
        return c

    return launch


@register
class FusedMoeKernel(Adapter):
    kernel = "fused_moe_kernel"
    role = "moe_gemm"
    ops = ("experts",)
    description = (
        "Triton grouped MoE GEMM as invoke_fused_moe_kernel runs it: gate_up (A=hidden, top_k=K) or down "
        "(A=intermediate, x routing weight); FP8 variant quantises A per 1x128 group inside the call."
    )
    backends = [
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.moe.fused_moe_triton_kernels:invoke_fused_moe_kernel",
            None,
            "triton",
            _bind_fused_moe,
            fallbacks=(
                "sglang.srt.layers.moe.fused_moe_triton.fused_moe_triton_kernels:invoke_fused_moe_kernel",
            ),
            label=NVFP4_NOTE,
        )
    ]

    def applies(self, case: Case) -> bool:
        return case.dims.get("weight") in ("bf16", "fp8_block")

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, e, topk, n, k, gate_up = _moe_gemm_dims(case)
        routing = _routing(case, device, seed)
        gen = _generator(device, seed)
        rows = t if gate_up else t * topk
        return {
            "a": _randn((rows, k), gen, device),
            **_weights_inputs(make_expert_weights(e, n, k, case.dims["weight"], device, gen)),
            "topk_ids": routing.topk_ids,
            "topk_weights": routing.topk_weights,
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        *_, gate_up = _moe_gemm_dims(case)
        fmt = case.dims["weight"]
        a = _quant_dequant_groups(inputs["a"]) if fmt == "fp8_block" else inputs["a"].float()
        return moe_gemm_reference(
            a, _weights_of(inputs, fmt), inputs["topk_ids"], inputs["topk_weights"], gate_up
        )

    def traffic(self, case: Case) -> Traffic:
        t, _e, topk, n, k, gate_up = _moe_gemm_dims(case)
        fmt = case.dims["weight"]
        a_rows = t if gate_up else t * topk
        weights = _n_active(case) * weight_bytes(n, k, fmt)
        routing = t * topk * 4 * (1 if gate_up else 2)  # topk_ids (+ fp32 weights for down)
        b = a_rows * k * 2 + weights + t * topk * n * 2 + routing
        return Traffic(
            b,
            2 * t * topk * n * k,
            f"weights of {_n_active(case)} active experts (seed-0 routing); sorted-id metadata excluded",
            compute="fp8" if fmt == "fp8_block" else "bf16",
        )


def _weights_inputs(w: ExpertWeights) -> dict[str, torch.Tensor]:
    out = {"w": w.w}
    if w.scale is not None:
        out["w_scale"] = w.scale
    return out


def _weights_of(inputs: dict[str, Any], fmt: str) -> ExpertWeights:
    scale = inputs.get("w_scale_plain", inputs.get("w_scale"))
    return ExpertWeights(fmt, inputs["w"], scale)


# -- moe_align_block_size --------------------------------------------------------------------------------


def moe_align_reference(
    topk_ids: torch.Tensor, num_experts: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Canonical (sorted_token_ids, expert_ids of the used blocks, num_tokens_post_pad) on the CPU.

    Tokens of expert e fill its block-padded segment in ascending flat index (the kernel's order inside a
    segment is arbitrary), padding slots and the tail hold numel; ids are real experts (no -1 bucket used).
    """
    flat = topk_ids.flatten().long().cpu()
    numel = flat.numel()
    counts = expert_counts(topk_ids, num_experts)
    padded = (counts + block_size - 1) // block_size * block_size
    seg_start = torch.cumsum(padded, 0) - padded
    order, offsets = sorted_by_expert(topk_ids, num_experts)
    rank = torch.arange(numel) - offsets[:-1][flat[order]]
    max_pad = align_max_padded(numel, num_experts + 1, block_size)
    sorted_ids = torch.full((max_pad,), numel, dtype=torch.int32)
    sorted_ids[seg_start[flat[order]] + rank] = order.to(torch.int32)
    expert_ids = torch.repeat_interleave(torch.arange(num_experts, dtype=torch.int32), padded // block_size)
    return sorted_ids, expert_ids, padded.sum().reshape(1).to(torch.int32)


def _align_buffers(topk_ids: torch.Tensor, num_experts: int, block_size: int) -> list[torch.Tensor]:
    max_pad = align_max_padded(topk_ids.numel(), num_experts + 1, block_size)
    dev = topk_ids.device
    return [
        torch.empty(max_pad, dtype=torch.int32, device=dev),
        torch.empty(-(-max_pad // block_size), dtype=torch.int32, device=dev),
        torch.empty(1, dtype=torch.int32, device=dev),
        torch.empty(num_experts + 2, dtype=torch.int32, device=dev),
    ]


def _align_binder(with_ignore_flag: bool) -> Callable[[Any, dict[str, Any], Case], Callable[[], Any]]:
    def bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        ids, e, bs = inputs["topk_ids"], int(case.dims["E"]), MoeAlignBlockSize.block_size(case)
        sorted_ids, expert_ids, n_post, cumsum = _align_buffers(ids, e, bs)
        extra = (False,) if with_ignore_flag else ()

        def launch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            # num_experts + 1 and pad_sorted_token_ids=True, as SGLang's moe_align_block_size helper
            fn(ids, e + 1, bs, sorted_ids, expert_ids, n_post, cumsum, True, *extra)
            return sorted_ids, expert_ids, n_post

        return launch

    return bind


@register
class MoeAlignBlockSize(Adapter):
    kernel = "moe_align_block_size"
    role = "moe"
    ops = ("experts",)
    description = (
        "Sort (token, slot) pairs by expert, padded per expert to the MoE block (Marlin's block size)"
    )
    backends = [
        Backend(
            "sgl_kernel",
            _torch_op("moe_align_block_size"),
            None,
            "aot",
            _align_binder(True),
            preload=("sgl_kernel",),
        ),
        Backend(
            "sglang.ops",
            "sglang.kernels.ops.moe:moe_align_block_size",
            None,
            "aot",
            _align_binder(False),
            dispatches_to="sgl_kernel:moe_align_block_size",
            label="what SGLang 0.5.16 calls (kernel registry -> sgl-kernel AOT)",
        ),
        Backend(
            "sglang_jit",
            "sglang.jit_kernel.moe_align:moe_align_block_size",
            None,
            "jit",
            _align_binder(False),
            label="JIT twin (SGLang uses it only with its LoRA align flag)",
        ),
    ]

    @staticmethod
    def block_size(case: Case) -> int:
        return marlin_block_size_m(int(case.dims["T"]), _topk(case), int(case.dims["E"]))

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return {"topk_ids": _routing(case, device, seed).topk_ids}

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, ...]:
        return moe_align_reference(inputs["topk_ids"], int(case.dims["E"]), self.block_size(case))

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        o_sorted, o_eids, o_post = (x.cpu() for x in out)
        r_sorted, r_eids, r_post = ref
        bs = self.block_size(case)
        if not torch.equal(o_post, r_post):
            return Check(False, 1.0, 0.0, f"num_tokens_post_pad {o_post.item()} != {r_post.item()}")
        n_blocks = r_eids.numel()
        if not torch.equal(o_eids[:n_blocks], r_eids):
            wrong = int((o_eids[:n_blocks] != r_eids).sum())
            return Check(False, wrong / max(n_blocks, 1), 0.0, f"{wrong}/{n_blocks} expert_ids differ")
        runs = torch.unique_consecutive(r_eids, return_counts=True)[1].tolist()
        bounds, start = [], 0
        for c in runs:
            bounds.append((start * bs, (start + c) * bs))
            start += c
        total = int(r_post.item())
        bounds.append((total, r_sorted.numel()))  # the tail: all padding
        bad = _check_segments(o_sorted, r_sorted, bounds)
        detail = (
            f"{len(bad)}/{len(bounds)} expert segments differ" if bad else "exact up to order in segments"
        )
        return Check(not bad, len(bad) / len(bounds), 0.0, detail)

    def traffic(self, case: Case) -> Traffic:
        t, e, k, bs = int(case.dims["T"]), int(case.dims["E"]), _topk(case), self.block_size(case)
        max_pad = align_max_padded(t * k, e + 1, bs)
        b = 4 * (t * k + max_pad + -(-max_pad // bs) + 1 + (e + 2))
        return Traffic(b, 0, f"block_size {bs} (Marlin MoE rule); integer scan/scatter")


# -- moe_sum_reduce --------------------------------------------------------------------------------------


def _bind_sum_reduce(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x = inputs["x"]
    out = torch.empty(x.shape[0], x.shape[2], dtype=x.dtype, device=x.device)
    factor = float(_config()["routed_scaling_factor"])

    def launch() -> torch.Tensor:
        fn(x, out, factor)
        return out

    return launch


@register
class MoeSumReduce(Adapter):
    kernel = "moe_sum_reduce"
    role = "moe"
    ops = ("experts",)
    description = "Sum the K expert outputs of each token, times routed_scaling_factor (2.5)"
    backends = [
        Backend(
            "sgl_kernel", _torch_op("moe_sum_reduce"), None, "aot", _bind_sum_reduce, preload=("sgl_kernel",)
        ),
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.moe.fused_moe_triton_kernels:moe_sum_reduce_triton",
            None,
            "triton",
            _bind_sum_reduce,
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        d = case.dims
        gen = _generator(device, seed)
        return {"x": _randn((int(d["T"]), _topk(case), int(d["H"])), gen, device)}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return inputs["x"].float().sum(dim=1) * float(_config()["routed_scaling_factor"])

    def traffic(self, case: Case) -> Traffic:
        t, h, k = int(case.dims["T"]), int(case.dims["H"]), _topk(case)
        return Traffic(2 * t * k * h + 2 * t * h, t * k * h)


# -- CUTLASS MoE bookkeeping: prepare_moe_input, get_cutlass_w4a8_moe_mm_data ----------------------------


def _prepare_outputs(t: int, k: int, e: int, device: torch.device) -> list[torch.Tensor]:
    i32 = torch.int32
    return [
        torch.empty(e + 1, dtype=i32, device=device),
        torch.empty(e, 3, dtype=i32, device=device),
        torch.empty(e, 3, dtype=i32, device=device),
        torch.empty(t * k, dtype=i32, device=device),
        torch.empty(t * k, dtype=i32, device=device),
    ]


def _bind_prepare(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    ids = inputs["topk_ids"]
    t, k = ids.shape
    e, n, hk = int(case.dims["E"]), int(case.dims["I"]), int(case.dims["H"])
    offsets, ps1, ps2, a_map, c_map = _prepare_outputs(t, k, e, ids.device)

    def launch() -> tuple[torch.Tensor, ...]:
        fn(ids, offsets, None, ps1, ps2, a_map, c_map, e, n, hk)
        return offsets, ps1, ps2, a_map, c_map

    return launch


def prepare_reference(
    topk_ids: torch.Tensor, num_experts: int, n: int, k: int, swapped: bool = False
) -> tuple[torch.Tensor, ...]:
    """Canonical (expert_offsets [E+1], problem_sizes1/2 [E,3], input_permutation, output_permutation,
    flat expert id of each (token, slot) [T*K], the last for checks).

    Problem sizes are (m_e, 2n, k) / (m_e, k, n); ``swapped`` gives the W4A8 kernels' (2n, m_e, k) /
    (k, m_e, n). input_permutation[r] = token of row r (expert order), output_permutation = its inverse map
    from flat (token, slot) to row.
    """
    counts = expert_counts(topk_ids, num_experts).to(torch.int32)
    order, offsets = sorted_by_expert(topk_ids, num_experts)
    kk = topk_ids.shape[1]
    ps1 = torch.stack([counts, torch.full_like(counts, 2 * n), torch.full_like(counts, k)], dim=1)
    ps2 = torch.stack([counts, torch.full_like(counts, k), torch.full_like(counts, n)], dim=1)
    if swapped:
        ps1, ps2 = ps1[:, [1, 0, 2]], ps2[:, [1, 0, 2]]
    in_perm = (order // kk).to(torch.int32)
    out_perm = torch.empty_like(in_perm)
    out_perm[order] = torch.arange(order.numel(), dtype=torch.int32)
    flat_ids = topk_ids.flatten().long().cpu()
    return offsets.to(torch.int32), ps1.contiguous(), ps2.contiguous(), in_perm, out_perm, flat_ids


@register
class PrepareMoeInput(Adapter):
    kernel = "prepare_moe_input"
    role = "moe"
    ops = ("experts",)
    description = "CUTLASS MoE bookkeeping: expert offsets, problem sizes, gather/scatter permutations"
    backends = [
        Backend(
            "sgl_kernel", _torch_op("prepare_moe_input"), None, "aot", _bind_prepare, preload=("sgl_kernel",)
        )
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return {"topk_ids": _routing(case, device, seed).topk_ids}

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, ...]:
        d = case.dims
        return prepare_reference(inputs["topk_ids"], int(d["E"]), int(d["I"]), int(d["H"]))

    def reference_output(self, ref: Any) -> Any:
        return ref[:5]  # the kernel's five outputs (the sixth is for the check)

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        offsets, ps1, ps2, in_perm, out_perm = (x.cpu() for x in out)
        r_off, r_ps1, r_ps2, r_in = ref[:4]
        exact = _exact_check((offsets, ps1, ps2), (r_off, r_ps1, r_ps2), ("offsets", "ps1", "ps2"))
        if not exact.ok:
            return exact
        off = r_off.tolist()
        bad = _check_segments(in_perm, r_in, [(off[e], off[e + 1]) for e in range(len(off) - 1)])
        if bad:
            return Check(
                False, len(bad) / (len(off) - 1), 0.0, f"{len(bad)} expert segments of input_permutation"
            )
        return _check_output_permutation(out_perm, in_perm, r_off, ref[5], case)

    def traffic(self, case: Case) -> Traffic:
        t, e, k = int(case.dims["T"]), int(case.dims["E"]), _topk(case)
        return Traffic(4 * (3 * t * k + (e + 1) + 6 * e), 0)


def _check_output_permutation(
    out_perm: torch.Tensor, in_perm: torch.Tensor, offsets: torch.Tensor, flat_ids: torch.Tensor, case: Case
) -> Check:
    """output_permutation must send flat (t, j) to a row of expert topk_ids[t, j] that gathers token t."""
    k = _topk(case)
    n = out_perm.numel()
    rows = out_perm.long()
    if not torch.equal(torch.sort(rows).values, torch.arange(n)):
        return Check(False, 1.0, 0.0, "output_permutation is not a permutation")
    off = offsets.long()
    outside = (rows < off[flat_ids]) | (rows >= off[flat_ids + 1])
    if bool(outside.any()):
        return Check(False, float(outside.float().mean()), 0.0, "output_permutation leaves its expert's rows")
    if not torch.equal(in_perm.long()[rows], torch.arange(n) // k):
        return Check(False, 1.0, 0.0, "input_permutation[output_permutation[i]] != i // topk")
    return Check(True, 0.0, 0.0, "offsets/problem sizes exact; permutations consistent")


def _bind_w4a8_data(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    ids = inputs["topk_ids"]
    t, k = ids.shape
    e, n, hk = int(case.dims["E"]), int(case.dims["I"]), int(case.dims["H"])
    offsets, ps1, ps2, a_map, c_map = _prepare_outputs(t, k, e, ids.device)

    def launch() -> tuple[torch.Tensor, ...]:
        fn(ids, offsets, ps1, ps2, a_map, c_map, e, n, hk)
        return offsets, ps1, ps2

    return launch


@register
class GetCutlassW4a8MoeMmData(Adapter):
    kernel = "get_cutlass_w4a8_moe_mm_data"
    role = "moe"
    ops = ("experts",)
    description = "W4A8 MoE bookkeeping: expert offsets and (N, M, K) problem sizes (permutations unused)"
    backends = [
        Backend(
            "sgl_kernel",
            _torch_op("get_cutlass_w4a8_moe_mm_data"),
            None,
            "aot",
            _bind_w4a8_data,
            preload=("sgl_kernel",),
        )
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return {"topk_ids": _routing(case, device, seed).topk_ids}

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, ...]:
        d = case.dims
        return prepare_reference(inputs["topk_ids"], int(d["E"]), int(d["I"]), int(d["H"]), swapped=True)[:3]

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        # sglang's cutlass_w4a8_moe notes a_map / c_map are not written by this kernel: not compared.
        return _exact_check(tuple(out), tuple(ref), ("expert_offsets", "problem_sizes1", "problem_sizes2"))

    def traffic(self, case: Case) -> Traffic:
        t, e, k = int(case.dims["T"]), int(case.dims["E"]), _topk(case)
        return Traffic(4 * (t * k + (e + 1) + 6 * e), 0)


# -- shuffle_rows / apply_shuffle_mul_sum ----------------------------------------------------------------


def _bind_shuffle_rows(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x, dst2src = inputs["x"], inputs["dst2src_map"]
    out = torch.empty(dst2src.numel(), x.shape[1], dtype=x.dtype, device=x.device)

    def launch() -> torch.Tensor:
        fn(x, dst2src, out)
        return out

    return launch


@register
class ShuffleRows(Adapter):
    kernel = "shuffle_rows"
    role = "moe"
    ops = ("experts",)
    description = "Gather FP8 token rows into expert order ([T, 7168] -> [T*K, 7168]) for the CUTLASS MoE"
    backends = [
        Backend(
            "sgl_kernel", _torch_op("shuffle_rows"), None, "aot", _bind_shuffle_rows, preload=("sgl_kernel",)
        )
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        d = case.dims
        routing = _routing(case, device, seed)
        order, _ = sorted_by_expert(routing.topk_ids, int(d["E"]))
        gen = _generator(device, seed)
        x, _s = fp8.per_token_group_quant(_randn((int(d["T"]), int(d["H"])), gen, device), GROUP)
        return {"x": x, "dst2src_map": (order // _topk(case)).to(torch.int32).to(device)}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return inputs["x"][inputs["dst2src_map"].long()]

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return _exact_check((out.view(torch.uint8),), (ref.view(torch.uint8),), ("rows",))

    def traffic(self, case: Case) -> Traffic:
        t, h, k = int(case.dims["T"]), int(case.dims["H"]), _topk(case)
        return Traffic(t * h + t * k * h + 4 * t * k, 0, "fp8 rows; each source row counted once")


def _bind_shuffle_mul_sum(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    c2, perm, factors = inputs["c2"], inputs["permutation"], inputs["factors"]
    out = torch.empty(factors.shape[0], c2.shape[1], dtype=c2.dtype, device=c2.device)

    def launch() -> torch.Tensor:
        fn(c2, out, perm, factors)
        return out

    return launch


@register
class ApplyShuffleMulSum(Adapter):
    kernel = "apply_shuffle_mul_sum"
    role = "moe"
    ops = ("experts",)
    description = "CUTLASS MoE combine: out[t] = sum_j c2[perm[t*K+j]] * w[t, j] (bf16 accumulate)"
    backends = [
        Backend(
            "sgl_kernel",
            _torch_op("apply_shuffle_mul_sum"),
            None,
            "aot",
            _bind_shuffle_mul_sum,
            preload=("sgl_kernel",),
        )
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        d = case.dims
        t, k = int(d["T"]), _topk(case)
        routing = _routing(case, device, seed)
        out_perm = prepare_reference(routing.topk_ids, int(d["E"]), int(d["I"]), int(d["H"]))[4]
        gen = _generator(device, seed)
        return {
            "c2": _randn((t * k, int(d["H"])), gen, device),
            "permutation": out_perm.to(device),
            "factors": routing.topk_weights.to(BF16),  # the caller casts to the output dtype
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        k = _topk(case)
        rows = inputs["c2"].float()[inputs["permutation"].long()]  # [T*K, H], token-major
        return (rows.view(-1, k, rows.shape[1]) * inputs["factors"].float().unsqueeze(-1)).sum(dim=1)

    def traffic(self, case: Case) -> Traffic:
        t, h, k = int(case.dims["T"]), int(case.dims["H"]), _topk(case)
        return Traffic(2 * t * k * h + 2 * t * h + 4 * t * k + 2 * t * k, 2 * t * k * h)


# -- CUTLASS grouped GEMMs: fp8_blockwise_scaled_grouped_mm, es_..., cutlass_w4a8_moe_mm --------------------


def _grouped_problem(case: Case, device: str, seed: int, swapped: bool) -> dict[str, Any]:
    """Expert-ordered rows and the routing bookkeeping prepare_moe_input would produce for this case."""
    t, e, topk, n, k, _gate_up = _moe_gemm_dims(case)
    routing = _routing(case, "cpu", seed)
    counts = expert_counts(routing.topk_ids, e).to(torch.int32)
    _, offsets = sorted_by_expert(routing.topk_ids, e)
    cols = (torch.full_like(counts, n), counts) if swapped else (counts, torch.full_like(counts, n))
    sizes = torch.stack([*cols, torch.full_like(counts, k)], dim=1).contiguous()
    return {
        "problem_sizes": sizes.to(device),
        "expert_offsets": offsets.to(torch.int32).to(device),
        "rows": t * topk,
    }


def _bind_fp8_grouped(expert_specialised: bool) -> Callable[[Any, dict[str, Any], Case], Callable[[], Any]]:
    def bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        a, scales_a, w, w_scale = inputs["a"], inputs["a_scale"], inputs["w"], inputs["w_scale"]
        e, n, k = w.shape
        dev = a.device
        b = w.transpose(1, 2)  # [E, K, N], column-major per expert, as cutlass_fused_experts_fp8 passes
        scales_b = w_scale.transpose(1, 2)
        stride_a = torch.full((e,), k, dtype=torch.int64, device=dev)
        stride_c = torch.full((e,), n, dtype=torch.int64, device=dev)
        offsets = inputs["expert_offsets"][:-1]
        sizes = inputs["problem_sizes"]
        workspace = torch.empty(CUTLASS_FP8_WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        out = torch.empty(a.shape[0], n, dtype=BF16, device=dev)
        if expert_specialised:

            def launch() -> torch.Tensor:
                fn(out, a, b, scales_a, scales_b, stride_a, stride_a, stride_c, sizes, offsets, workspace)
                return out

            return launch
        ptrs = [torch.empty(e, dtype=torch.int64, device=dev) for _ in range(5)]
        layouts = [torch.empty(e, 5, dtype=torch.int32, device=dev) for _ in range(2)]

        def launch_ptr_array() -> torch.Tensor:
            fn(
                out,
                *ptrs,
                a,
                b,
                scales_a,
                scales_b,
                stride_a,
                stride_a,
                stride_c,
                *layouts,
                sizes,
                offsets,
                workspace,
            )
            return out

        return launch_ptr_array

    return bind


class _Fp8GroupedMm(Adapter):
    """Shared by the CUTLASS block-FP8 grouped GEMMs: expert-ordered FP8 rows x [E, N, K] FP8 weights."""

    role = "moe_gemm"
    ops = ("experts",)

    def applies(self, case: Case) -> bool:
        return case.dims.get("weight") == "fp8_block"

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        _t, e, _topk_, n, k, _ = _moe_gemm_dims(case)
        prob = _grouped_problem(case, device, seed, swapped=False)
        gen = _generator(device, seed)
        a, a_scale = fp8.per_token_group_quant(_randn((prob.pop("rows"), k), gen, device), GROUP)
        return {
            "a": a,
            "a_scale": a_scale,
            **_weights_inputs(make_expert_weights(e, n, k, "fp8_block", device, gen)),
            **prob,
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        a = fp8.dequant_per_token_group(inputs["a"], inputs["a_scale"], GROUP)
        return grouped_gemm_reference(a, inputs["expert_offsets"].cpu(), _weights_of(inputs, "fp8_block"))

    def traffic(self, case: Case) -> Traffic:
        t, e, topk, n, k, _ = _moe_gemm_dims(case)
        rows = t * topk
        a = rows * k + rows * (k // GROUP) * 4
        b = a + _n_active(case) * weight_bytes(n, k, "fp8_block") + rows * n * 2 + 4 * (4 * e + 1)
        note = f"weights of {_n_active(case)} active experts (seed-0 routing)"
        return Traffic(b, 2 * rows * n * k, note, compute="fp8")


@register
class Fp8BlockwiseScaledGroupedMm(_Fp8GroupedMm):
    kernel = "fp8_blockwise_scaled_grouped_mm"
    description = "CUTLASS ptr-array grouped GEMM, FP8 1x128 activations x FP8 128x128-block weights"
    backends = [
        Backend(
            "sgl_kernel",
            _torch_op("fp8_blockwise_scaled_grouped_mm"),
            None,
            "aot",
            _bind_fp8_grouped(False),
            requires=SM90_OR_SM100,
            preload=("sgl_kernel",),
            label="FP8-block DeepSeek checkpoints (--moe-runner-backend cutlass); not this NVFP4 checkpoint",
        )
    ]


@register
class EsFp8BlockwiseScaledGroupedMm(_Fp8GroupedMm):
    kernel = "es_fp8_blockwise_scaled_grouped_mm"
    description = (
        "Expert-specialised CUTLASS grouped GEMM (sm90), same problem as fp8_blockwise_scaled_grouped_mm"
    )
    backends = [
        Backend(
            "sgl_kernel",
            _torch_op("es_fp8_blockwise_scaled_grouped_mm"),
            None,
            "aot",
            _bind_fp8_grouped(True),
            requires=SM90_ONLY,
            preload=("sgl_kernel",),
            label="FP8-block DeepSeek checkpoints (cutlass runner, enable_es on sm90)",
        )
    ]


def _bind_w4a8(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    a, w = inputs["a"], inputs["w"]
    e, n, _half_k = w.shape
    k, dev = a.shape[1], a.device
    a_strides = torch.full((e, 3), k, dtype=torch.int64, device=dev)  # sglang W4AFp8MoEMethod.create_weights
    d_strides = torch.full((e, 3), n, dtype=torch.int64, device=dev)
    offsets, sizes = inputs["expert_offsets"][:-1], inputs["problem_sizes"]
    out = torch.empty(a.shape[0], n, dtype=BF16, device=dev)
    topk = _topk(case)

    def launch() -> torch.Tensor:
        fn(
            out,
            a,
            w,
            inputs["a_scale"],
            inputs["w_scale"],
            offsets,
            sizes,
            a_strides,
            a_strides,
            d_strides,
            d_strides,
            128,
            topk,
        )
        return out

    return launch


@register
class CutlassW4a8MoeMm(Adapter):
    kernel = "cutlass_w4a8_moe_mm"
    role = "moe_gemm"
    ops = ("experts",)
    description = (
        "Hopper mixed-input grouped GEMM: per-tensor FP8 activations x signed INT4 weights (two per byte, "
        "low nibble first) with bf16 group-128 scales interleaved by 4; problem sizes (N, M, K)"
    )
    backends = [
        Backend(
            "sgl_kernel",
            _torch_op("cutlass_w4a8_moe_mm"),
            None,
            "aot",
            _bind_w4a8,
            requires=SM90_ONLY,
            preload=("sgl_kernel",),
            label="W4A8 checkpoints (DeepSeek-W4AFP8); not this NVFP4 checkpoint",
        )
    ]

    def applies(self, case: Case) -> bool:
        return case.dims.get("weight") == "w4a8"

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        _t, e, _topk_, n, k, _ = _moe_gemm_dims(case)
        prob = _grouped_problem(case, device, seed, swapped=True)
        gen = _generator(device, seed)
        a, a_scale = fp8.per_tensor_quant(_randn((prob.pop("rows"), k), gen, device))
        w = make_expert_weights(e, n, k, "w4a8", device, gen)
        assert w.scale is not None
        return {
            "a": a,
            "a_scale": a_scale,
            "w": w.w,
            "w_scale": interleave_w4a8_scales(w.scale),
            "w_scale_plain": w.scale,  # reference only: [E, N, K/128] before interleaving
            **prob,
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        a = fp8.dequant(inputs["a"], inputs["a_scale"])
        return grouped_gemm_reference(a, inputs["expert_offsets"].cpu(), _weights_of(inputs, "w4a8"))

    def traffic(self, case: Case) -> Traffic:
        t, e, topk, n, k, _ = _moe_gemm_dims(case)
        rows = t * topk
        b = rows * k + 4 + _n_active(case) * weight_bytes(n, k, "w4a8") + rows * n * 2 + 4 * (4 * e + 1)
        note = f"weights of {_n_active(case)} active experts (seed-0 routing)"
        return Traffic(b, 2 * rows * n * k, note, compute="fp8")  # int4 weights run as FP8 MMAs


# -- flashinfer TRT-LLM fused MoE (sm100): trtllm_bf16_moe, trtllm_fp8_block_scale_moe ---------------------


def _moe_layer_dims(case: Case) -> tuple[int, int, int, int, int]:
    d = case.dims
    return int(d["T"]), int(d["H"]), int(d["I"]), int(d["E"]), _topk(case)


def _layer_common_inputs(case: Case, device: str, seed: int) -> tuple[dict[str, Any], torch.Generator]:
    routing = _routing(case, device, seed)
    return {"routing_logits": routing.logits, "routing_bias": routing.bias.to(BF16)}, _generator(device, seed)


def moe_layer_reference(
    x: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
    logits: torch.Tensor,
    bias: torch.Tensor,
    routing: tuple[int, int, int, float],
    fp8_intermediate: bool = False,
) -> torch.Tensor:
    """DeepSeek routed-expert layer in fp32, TRT-LLM convention: GEMM1 rows are [up; gate].

    ``routing`` = (top_k, n_group, topk_group, routed_scaling_factor).

    out[t] = sum_j w[t, j] * down_e(silu(x W1_gate^T) * (x W1_up^T)), w = renormalised sigmoid scores x
    routed_scaling_factor; ``fp8_intermediate`` passes the activation through a 1x128 FP8 quantisation
    (DeepSeek-FP8 GEMM2 input).
    """
    top_k, n_group, topk_group, scale = routing
    weights, ids = grouped_topk(logits, bias, top_k, n_group, topk_group, True, scale)
    t, inter = x.shape[0], w13.n // 2
    out = torch.zeros(t, w2.n, dtype=torch.float32, device=x.device)
    c13: dict[tuple[int, int], torch.Tensor] = {}
    c2: dict[tuple[int, int], torch.Tensor] = {}
    for experts in _share_groups(torch.unique(ids).tolist(), w13, w2):
        tok, slot = torch.isin(ids, torch.tensor(experts, device=ids.device)).nonzero(as_tuple=True)
        h = x[tok] @ w13.dequant(experts[0], c13).t()
        act = torch.nn.functional.silu(h[:, inter:]) * h[:, :inter]
        if fp8_intermediate:
            act = _quant_dequant_groups(act)
        out.index_add_(0, tok, (act @ w2.dequant(experts[0], c2).t()) * weights[tok, slot].unsqueeze(1))
    return out


def _layer_routing(case: Case) -> tuple[int, int, int, float]:
    cfg = _config()
    return _topk(case), int(cfg["n_group"]), int(cfg["topk_group"]), float(cfg["routed_scaling_factor"])


def _trtllm_kwargs(case: Case) -> dict[str, Any]:
    t, _h, inter, e, k = _moe_layer_dims(case)
    cfg = _config()
    return {
        "num_experts": e,
        "top_k": k,
        "n_group": int(cfg["n_group"]),
        "topk_group": int(cfg["topk_group"]),
        "intermediate_size": inter,
        "local_expert_offset": 0,
        "local_num_experts": e,
        "routed_scaling_factor": float(cfg["routed_scaling_factor"]),
        "routing_method_type": TRTLLM_DEEPSEEK_ROUTING,
        "tune_max_num_tokens": 1 << max(t - 1, 0).bit_length(),  # next_power_of_2(T), as sglang passes
    }


class _FusedMoeLayer(Adapter):
    """A whole routed-expert layer from router logits (the kernel routes itself): reference and check."""

    role = "moe"
    ops = ("experts",)
    fmt = "bf16"

    def _layer_reference(
        self, x: torch.Tensor, w13: ExpertWeights, w2: ExpertWeights, inputs: dict[str, Any], case: Case
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(output fp32 [T, H], tokens whose routing is clear of ties [T] bool)."""
        routing = _layer_routing(case)
        logits, bias = inputs["routing_logits"], inputs["routing_bias"]
        out = moe_layer_reference(x, w13, w2, logits, bias, routing, fp8_intermediate=self.fmt != "bf16")
        return out, routing_margin(logits, bias, *routing[:3]) >= ROUTING_TIE_MARGIN

    def reference_output(self, ref: Any) -> Any:
        return ref[0]  # the MoE output (the near-tie mask is for the check)

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        ref_out, clear = ref
        clear = clear.to(out.device)
        tol = self.tolerance(out, case)
        err = rel_error(out[clear], ref_out[clear])
        skipped = int((~clear).sum())
        detail = f"{skipped}/{clear.numel()} tokens with a routing near-tie (< {ROUTING_TIE_MARGIN:g}) not compared"
        return Check(err <= tol, err, tol, detail)

    def traffic(self, case: Case) -> Traffic:
        return _moe_layer_traffic(case, self.fmt, act_bytes=2 if self.fmt == "bf16" else 1)


def _bind_trtllm_bf16(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """Shuffle the weights into the BlockMajorK layout as SGLang's unquantised MoE method does (copies)."""
    from flashinfer.fused_moe.core import (
        _maybe_get_cached_w3_w1_permute_indices,
        convert_to_block_layout,
        get_w2_permute_indices_with_cache,
    )

    cache: dict[Any, torch.Tensor] = {}

    def shuffle(w: torch.Tensor, gated: bool) -> torch.Tensor:
        out: torch.Tensor | None = None
        for i in range(w.shape[0]):
            u8 = w[i].view(torch.uint8)
            if gated:
                perm = _maybe_get_cached_w3_w1_permute_indices(cache, u8, 128, is_gated_act_gemm=True)
            else:
                perm = get_w2_permute_indices_with_cache(cache, u8, 128)
            blocked = convert_to_block_layout(u8[perm.to(u8.device)].contiguous(), 128).view(BF16)
            if out is None:  # filled expert by expert: one extra copy of the weights, not two
                out = torch.empty((w.shape[0], *blocked.shape), dtype=BF16, device=w.device)
            out[i] = blocked
        assert out is not None
        return out

    g1, g2 = shuffle(inputs["w13"], True), shuffle(inputs["w2"], False)
    kw = _trtllm_kwargs(case)

    def launch() -> torch.Tensor:
        return fn(
            routing_logits=inputs["routing_logits"],
            routing_bias=inputs["routing_bias"],
            hidden_states=inputs["hidden_states"],
            gemm1_weights=g1,
            gemm2_weights=g2,
            **kw,
        )

    return launch


@register
class TrtllmBf16Moe(_FusedMoeLayer):
    kernel = "trtllm_bf16_moe"
    description = "TRT-LLM fused MoE, BF16: DeepSeekV3 routing + GEMM1 + SwiGLU + GEMM2 + finalize (sm100)"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.fused_moe:trtllm_bf16_moe",
            None,
            "cubin",
            _bind_trtllm_bf16,
            requires=SM100,
            label="BF16 experts (unquantised checkpoints); weights shuffled to BlockMajorK in bind",
        )
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, h, inter, e, _k = _moe_layer_dims(case)
        common, gen = _layer_common_inputs(case, device, seed)
        return {
            **common,
            "hidden_states": _randn((t, h), gen, device),
            "w13": make_expert_weights(e, 2 * inter, h, "bf16", device, gen).w,  # rows [up; gate]
            "w2": make_expert_weights(e, h, inter, "bf16", device, gen).w,
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        w13, w2 = ExpertWeights("bf16", inputs["w13"]), ExpertWeights("bf16", inputs["w2"])
        return self._layer_reference(inputs["hidden_states"].float(), w13, w2, inputs, case)


def _moe_layer_traffic(case: Case, fmt: str, act_bytes: int) -> Traffic:
    t, h, inter, e, k = _moe_layer_dims(case)
    n_act = _n_active(case)
    weights = n_act * (weight_bytes(2 * inter, h, fmt) + weight_bytes(h, inter, fmt))
    x = t * h * act_bytes + (t * (h // GROUP) * 4 if act_bytes == 1 else 0)
    b = t * e * 4 + e * 2 + x + weights + t * h * 2
    flops = 2 * t * k * (2 * inter * h + inter * h)
    note = f"weights of {n_act} active experts (seed-0 routing); routing FLOPs excluded"
    return Traffic(b, flops, note, compute="fp8" if act_bytes == 1 else "bf16")


def _bind_trtllm_fp8(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """DeepSeek-FP8 block path as SGLang calls it: MajorK weights, no shuffle, scales [H/128, T]."""
    kw = _trtllm_kwargs(case)
    x_scale_t = inputs["hidden_states_scale"].t().contiguous()
    out = torch.empty(inputs["hidden_states"].shape, dtype=BF16, device=inputs["hidden_states"].device)

    def launch() -> torch.Tensor:
        fn(
            routing_logits=inputs["routing_logits"],
            routing_bias=inputs["routing_bias"],
            hidden_states=inputs["hidden_states"],
            hidden_states_scale=x_scale_t,
            gemm1_weights=inputs["w13"],
            gemm1_weights_scale=inputs["w13_scale"],
            gemm2_weights=inputs["w2"],
            gemm2_weights_scale=inputs["w2_scale"],
            use_shuffled_weight=False,
            weight_layout=0,  # MajorK
            output=out,
            **kw,
        )
        return out

    return launch


@register
class TrtllmFp8BlockScaleMoe(_FusedMoeLayer):
    kernel = "trtllm_fp8_block_scale_moe"
    fmt = "fp8_block"
    description = "TRT-LLM fused MoE, DeepSeek FP8 (1x128 activations, 128x128 weight blocks) (sm100)"
    backends = [
        Backend(
            "flashinfer",
            "flashinfer.fused_moe:trtllm_fp8_block_scale_moe",
            None,
            "cubin",
            _bind_trtllm_fp8,
            requires=SM100,
            label="FP8-block DeepSeek checkpoints; not this NVFP4 checkpoint",
        )
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, h, inter, e, _k = _moe_layer_dims(case)
        common, gen = _layer_common_inputs(case, device, seed)
        x, x_scale = fp8.per_token_group_quant(_randn((t, h), gen, device), GROUP)  # scale [T, H/128]
        w13 = make_expert_weights(e, 2 * inter, h, "fp8_block", device, gen)
        w2 = make_expert_weights(e, h, inter, "fp8_block", device, gen)
        return {
            **common,
            "hidden_states": x,
            "hidden_states_scale": x_scale,  # bind passes it transposed, [H/128, T]
            "w13": w13.w,
            "w13_scale": w13.scale,
            "w2": w2.w,
            "w2_scale": w2.scale,
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        x = fp8.dequant_per_token_group(inputs["hidden_states"], inputs["hidden_states_scale"], GROUP)
        w13 = ExpertWeights("fp8_block", inputs["w13"], inputs["w13_scale"])
        w2 = ExpertWeights("fp8_block", inputs["w2"], inputs["w2_scale"])
        return self._layer_reference(x, w13, w2, inputs, case)

    def tolerance(self, out: Any, case: Case) -> float:
        return 3e-2  # the kernel re-quantises the SwiGLU output to FP8; rounding ties may land differently
