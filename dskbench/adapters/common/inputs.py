"""The input builders every adapter shares: seeded generators, random tensors, byte counts, exact checks.

Inputs come from a seeded CPU generator (small draws) and device generators seeded from it (large
tensors), so a seed gives the same inputs on a given device and `make_inputs` works without a GPU.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dskbench.adapters.base import Check

# Backend label for the implementation SGLang 0.5.16 itself calls for DeepSeek-R1-NVFP4 on sm90.
SGLANG_SM90 = "what SGLang 0.5.16 runs on sm90"

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
DRAW_CHUNK = 1 << 28  # elements drawn in fp32 at once by randn (1 GiB)


def generator(seed: int) -> torch.Generator:
    """CPU generator for small host-side draws (indices, parameters)."""
    return torch.Generator(device="cpu").manual_seed(int(seed))


def device_generator(gen: torch.Generator, device: str) -> torch.Generator:
    """A generator on `device` seeded from `gen`: large tensors are drawn where they live (drawing
    hundreds of MB on the host would dominate a GPU sweep). A GPU generator already on `device` is returned."""
    if gen.device.type != "cpu" and gen.device.type == torch.device(device).type:
        return gen
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    return torch.Generator(device=device).manual_seed(seed)


def randn(
    shape: tuple[int, ...] | list[int],
    gen: torch.Generator,
    device: str,
    dtype: torch.dtype = torch.bfloat16,
    scale: float = 1.0,
) -> torch.Tensor:
    """Normal values times `scale` (never all zero), drawn in fp32 on `device` then cast. A tensor over
    DRAW_CHUNK elements is drawn chunk by chunk into its output, so its fp32 draw never needs twice its
    own size again (an 18 GiB bf16 KV cache drawn whole peaked at 72 GiB)."""
    shape, g = tuple(shape), device_generator(gen, device)
    n = math.prod(shape)
    if n <= DRAW_CHUNK:
        x = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
        return (x.mul_(scale) if scale != 1.0 else x).to(dtype)
    out = torch.empty(shape, dtype=dtype, device=device)
    flat = out.view(-1)
    for start in range(0, n, DRAW_CHUNK):
        x = torch.randn(min(DRAW_CHUNK, n - start), generator=g, device=device, dtype=torch.float32)
        flat[start : start + x.numel()].copy_(x.mul_(scale) if scale != 1.0 else x)
    return out


def randint(
    lo: int,
    hi: int,
    shape: tuple[int, ...] | list[int],
    gen: torch.Generator,
    device: str,
    dtype: torch.dtype = torch.int32,
) -> torch.Tensor:
    """Integers in [lo, hi) drawn where they live, from a device generator seeded from `gen`: a request
    pool's token table at 512 requests of 65,536 tokens is 67 M entries, seconds to draw on the host."""
    return torch.randint(
        lo, hi, tuple(shape), generator=device_generator(gen, device), dtype=dtype, device=device
    )


def normal(
    shape: tuple[int, ...] | list[int],
    gen: torch.Generator,
    device: str,
    dtype: torch.dtype = torch.bfloat16,
    scale: float = 1.0,
) -> torch.Tensor:
    """Normal values times `scale`, drawn straight into a `dtype` tensor on `device` (float dtypes only).

    One kernel and no fp32 copy: `randn`'s fp32 draw and cast move 5x the bytes of a bf16 result, which
    made drawing a 40 GB KV cache the largest part of building a decode case."""
    out = torch.empty(tuple(shape), dtype=dtype, device=device)
    return out.normal_(0.0, scale, generator=device_generator(gen, device))


def uniform(
    shape: tuple[int, ...] | list[int],
    gen: torch.Generator,
    device: str,
    lo: float,
    hi: float,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Uniform values in [lo, hi), drawn in fp32 on `device` then cast."""
    x = torch.rand(tuple(shape), generator=device_generator(gen, device), device=device, dtype=torch.float32)
    return x.mul_(hi - lo).add_(lo).to(dtype)


def enable_pdl(t: torch.Tensor) -> bool:
    """SGLang's is_arch_support_pdl(): programmatic dependent launch on sm90 and newer."""
    if t.device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(t.device)[0] >= 9


def nbytes(numel: int | float, dtype: torch.dtype) -> int:
    return int(numel * torch.empty((), dtype=dtype).element_size())


def exact_check(outs: tuple[Any, ...], refs: tuple[Any, ...], names: tuple[str, ...]) -> Check:
    """Integer outputs must equal the reference exactly; `error` is the fraction of differing elements."""
    if len(outs) != len(refs):
        return Check(False, float("inf"), 0.0, f"{len(outs)} outputs, reference has {len(refs)}")
    details, worst, ok = [], 0.0, True
    for name, o, r in zip(names, outs, refs, strict=True):
        if o.shape != r.shape:
            return Check(False, float("inf"), 0.0, f"{name}: shape {tuple(o.shape)} != {tuple(r.shape)}")
        # on the output's device, in the output's dtype when both agree: an int64 copy on the CPU of a
        # [T*K, 7168] byte tensor took most of such a case's time
        o, r = o.detach(), r.detach().to(o.device)
        if o.dtype != r.dtype:
            o, r = o.to(torch.int64), r.to(torch.int64)
        bad = int((o != r).sum())
        frac = bad / max(1, o.numel())
        worst = max(worst, frac)
        ok = ok and bad == 0
        details.append(f"{name}:{bad} differ")
    return Check(ok, worst, 0.0, " ".join(details))
