"""NVFP4 inputs as the checkpoint stores them: random weights with ModelOpt-like block scales, and
activations quantised with a perfectly calibrated input scale (the same arithmetic as the flashinfer
kernel, so kernel and oracle read identical bytes)."""

from __future__ import annotations

import math

import torch

from dskbench.adapters.common import nvfp4 as fp4
from dskbench.adapters.common.inputs import device_generator, uniform

# ModelOpt block scales are 448 * amax(block) / amax(tensor): mostly between ~32 and 448 (log-uniform
# here). With uniformly random e2m1 codes (rms 2.93) and block scales of rms ~194, weight_scale_2 ~3.5e-5
# gives dequantised weights of rms ~0.02, the magnitude of DeepSeek's 7168-wide projections.
WEIGHT_SCALE_2 = 3.5e-5


def weight_scale_2(shape: tuple[int, ...], gen: torch.Generator, device: str) -> torch.Tensor:
    """fp32 weight_scale_2 values around WEIGHT_SCALE_2 (x0.8 .. x1.25), one per leading index."""
    return (WEIGHT_SCALE_2 * uniform(shape, gen, device, 0.8, 1.25)).float()


def nvfp4_weight(
    shape: tuple[int, ...], gen: torch.Generator, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A checkpoint NVFP4 weight [..., N, K]: (uint8 [..., N, K/2], e4m3 [..., N, K/16], weight_scale_2).

    weight_scale_2 is one fp32 per leading index (a scalar for a 2-D weight)."""
    *lead, n, k = shape
    packed = torch.randint(
        0, 256, (*lead, n, k // 2), generator=device_generator(gen, device), device=device, dtype=torch.uint8
    )
    log_sf = uniform((*lead, n, k // fp4.NVFP4_BLOCK), gen, device, 5.0, math.log2(fp4.E4M3_MAX))
    scales = fp4.to_e4m3(torch.exp2(log_sf))
    return packed, scales, weight_scale_2(tuple(lead), gen, device)


def calibrated_input_scale(x: torch.Tensor) -> torch.Tensor:
    """input_scale = amax / (448 * 6): the activation's dequantisation scale, perfectly calibrated."""
    return (x.float().abs().amax().clamp_min(1e-12) / (fp4.E4M3_MAX * fp4.FP4_MAX)).float()


def quantized_activation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_fp4, linear scales, input_scale, global scale) with a perfectly calibrated input_scale = amax / 2688."""
    input_scale = calibrated_input_scale(x)
    gs = (1.0 / input_scale).float()
    x_fp4, x_sf = fp4.quantize_nvfp4(x, gs)
    return x_fp4, x_sf, input_scale, gs
