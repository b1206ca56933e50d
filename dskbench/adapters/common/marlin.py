"""NVFP4 weights in Marlin's layout, as SGLang 0.5.16 prepares them for its Hopper (W4A16) path.

Copied from sglang 0.5.16 marlin_utils.py / marlin_utils_fp4.py, so the dense and MoE Marlin backends
hand the kernels exactly what SGLang's prepare_nvfp4_layer_for_marlin would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_SCALE_PERM = [i + 8 * j for i in range(8) for j in range(8)]
_SCALE_PERM_SINGLE = [2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)]


def sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (Marlin sizes its workspace by them)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def marlin_permute_scales(s: torch.Tensor, size_k: int, size_n: int, group_size: int) -> torch.Tensor:
    """sglang.srt.layers.quantization.marlin_utils.marlin_permute_scales."""
    if group_size < size_k and group_size != -1:
        s = s.reshape((-1, len(_SCALE_PERM)))[:, _SCALE_PERM]
    else:
        s = s.reshape((-1, len(_SCALE_PERM_SINGLE)))[:, _SCALE_PERM_SINGLE]
    return s.reshape((-1, size_n)).contiguous()


def nvfp4_marlin_process_scales(marlin_scales: torch.Tensor) -> torch.Tensor:
    """marlin_utils_fp4.nvfp4_marlin_process_scales (without its host-syncing sign warning)."""
    s = marlin_scales.to(torch.half)
    s = s.view(-1, 4)[:, [0, 2, 1, 3]].view(s.size(0), -1)
    s = (s * (2**7)).view(torch.int16) << 1
    s = s.view(torch.float8_e4m3fn)
    return s[:, 1::2].contiguous()


def nvfp4_marlin_process_global_scale(global_scale: torch.Tensor) -> torch.Tensor:
    """marlin_utils_fp4.nvfp4_marlin_process_global_scale for bf16 (exponent bias 2**7 - 2**1 = 126)."""
    if global_scale.dtype == torch.half:
        target_exponent = 5
    elif global_scale.dtype == torch.bfloat16:
        target_exponent = 8
    else:
        raise TypeError(f"global scale must be fp16 or bf16, got {global_scale.dtype}")
    exponent_bias = 2 ** (target_exponent - 1) - 2 ** (2 - 1)
    out = global_scale * (2.0 ** (exponent_bias - 7))
    return out.reshape(1) if out.dim() == 0 else out


def should_use_atomic_add_reduce(m: int, n: int, k: int, sm: int, dtype: torch.dtype) -> bool:
    """marlin_utils.should_use_atomic_add_reduce (its env switch is hard-wired on in 0.5.16)."""
    if n >= 2048 or k < 2048:
        return False
    return not (sm < 90 and dtype == torch.bfloat16)


def marlin_repack_weight(packed: torch.Tensor, repack: Callable[..., Any]) -> torch.Tensor:
    """One [N, K/2] NVFP4 weight in Marlin's int32 tile layout (gptq_marlin_repack)."""
    n, k = packed.shape[0], packed.shape[1] * 2
    if n % 64:
        raise ValueError(f"NVFP4 Marlin needs N % 64 == 0, got N={n}")
    perm = torch.empty(0, dtype=torch.int, device=packed.device)
    qweight = packed.view(torch.int32).T.contiguous()
    return repack(b_q_weight=qweight, perm=perm, size_k=k, size_n=n, num_bits=4)


def marlin_weight_scales(scales: torch.Tensor) -> torch.Tensor:
    """e4m3 block scales [..., N, K/16] -> Marlin's e4m3 [..., K/16, N], for one weight or a stack of
    experts at once: the permutations act on runs of 64 (N % 64 == 0), which never cross a weight."""
    *lead, n, groups = scales.shape
    if n % 64:
        raise ValueError(f"NVFP4 Marlin needs N % 64 == 0, got N={n}")
    s = scales.transpose(-1, -2).contiguous().to(torch.bfloat16).reshape(-1, n)
    s = nvfp4_marlin_process_scales(marlin_permute_scales(s, groups * 16, n, 16))
    return s.reshape(*lead, groups, n)


def marlin_prepare_weight(
    packed: torch.Tensor, scales: torch.Tensor, weight_scale_2: torch.Tensor, repack: Callable[..., Any]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """prepare_nvfp4_layer_for_marlin for one [N, K] weight: (int32 repacked, e4m3 Marlin scales, bf16 gs)."""
    marlin_q = marlin_repack_weight(packed, repack)
    gs = nvfp4_marlin_process_global_scale(weight_scale_2.to(torch.bfloat16))
    return marlin_q, marlin_weight_scales(scales), gs
