"""What the RoPE kernels share: the cos|sin cache, the interleaved rotation (the reference), SGLang's strided
q_pe / k_pe views, positions, and the in-place rope adapter.

Inputs follow `forward_absorb_prepare`: q_pe is the rope part of q [T, Nh, 192] (row stride Nh*192,
head stride 192), k_pe the last 64 columns of the fused_qkv_a output [T, 2112]. The cache is a standard
base-10000 cos|sin table of DeepSeek's shape [163840, 64] fp32 (YaRN changes the values, not the
work); positions are random in range, int64 as in ForwardBatch.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch

from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import generator, nbytes, randn
from dskbench.shapes.cases import Case

DTYPE = torch.bfloat16
ROPE_BASE = 10000.0


@lru_cache(maxsize=2)
def _cpu_cos_sin_cache(max_position: int, rope_dim: int) -> torch.Tensor:
    """[max_position, rope_dim] fp32: cos in the first half, sin in the second (SGLang's layout)."""
    inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim)
    freqs = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).float()


def cos_sin_cache(
    max_position: int, rope_dim: int, device: str, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The cos|sin cache [max_position, rope_dim] in `dtype` on `device`."""
    return _cpu_cos_sin_cache(max_position, rope_dim).to(dtype).to(device)


def rope_gptj(x: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Interleaved (is_neox=False) rotation in fp32: pairs (x[2i], x[2i+1]) rotated by angle i.

    x [..., N, H, R] with the token axis first; cache [max_pos, R]; positions [N].
    """
    cos, sin = cache.float()[positions.long()].chunk(2, dim=-1)  # [N, R/2] each
    cos, sin = cos[:, None, :], sin[:, None, :]
    x = x.float()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x2 * cos + x1 * sin
    return out


def rope_dims(case: Case) -> tuple[int, int, int, int]:
    """(T, Nh, Dr, Dn) of a rope case."""
    d = case.dims
    return int(d["T"]), int(d["Nh"]), int(d["Dr"]), int(d["Dn"])


def q_and_k_pe(case: Case, gen: torch.Generator, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """q_pe / k_pe as the strided views SGLang passes (views into q [T,Nh,Dn+Dr] and qkv_a [T,2112])."""
    t, nh, dr, dn = rope_dims(case)
    row = int(case.model["Lq"]) + int(case.dims.get("Lkv", case.model["Lkv"])) + dr
    q = randn((t, nh, dn + dr), gen, device, DTYPE)
    qkv = randn((t, row), gen, device, DTYPE)
    return q[..., dn:], qkv[:, row - dr :].unsqueeze(1)


def random_positions(case: Case, gen: torch.Generator, device: str) -> torch.Tensor:
    """One int64 position per token, uniform in [0, max_position)."""
    t, maxp = int(case.dims["T"]), int(case.dims["max_position"])
    return torch.randint(0, maxp, (t,), generator=gen, dtype=torch.int64).to(device)


def rope_traffic(case: Case) -> Traffic:
    # Minimum traffic: q_pe and k_pe read and written once (bf16) plus one fp32 cache row per token.
    t, nh, dr, _ = rope_dims(case)
    return Traffic(
        bytes=nbytes(2 * t * (nh + 1) * dr, DTYPE) + nbytes(t * dr, torch.float32),
        flops=3 * t * (nh + 1) * dr,
        note="positions (8 B/token) not counted",
    )


class InplaceRope(Adapter):
    """In place on the q_pe / k_pe views; the launcher returns (q_pe, k_pe). Rotations keep norms, so
    repeated launches stay finite; the runner checks the first one."""

    role = "rope"
    ops = ("rotary_emb",)
    cache_dtype = torch.float32

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        gen = generator(seed)
        q_pe, k_pe = q_and_k_pe(case, gen, device)
        dr = int(case.dims["Dr"])
        return {
            "q_pe": q_pe,
            "k_pe": k_pe,
            "cos_sin_cache": cos_sin_cache(int(case.dims["max_position"]), dr, device, self.cache_dtype),
            "positions": random_positions(case, gen, device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        cache, pos = inputs["cos_sin_cache"], inputs["positions"]
        return rope_gptj(inputs["q_pe"], cache, pos), rope_gptj(inputs["k_pe"], cache, pos)

    def traffic(self, case: Case) -> Traffic:
        return rope_traffic(case)


def bind_positions_qk(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """The in-place rope call shared by flashinfer and sgl_kernel: (positions, query, key, head_size,
    cos_sin_cache, is_neox=False); returns the rotated q_pe, k_pe."""
    q, k, cache, pos = inputs["q_pe"], inputs["k_pe"], inputs["cos_sin_cache"], inputs["positions"]
    head = q.shape[-1]

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        fn(pos, q, k, head, cache, False)
        return q, k

    return launch
