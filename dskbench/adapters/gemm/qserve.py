"""QServe/QoQ W4A8 GEMMs (INT8 activations x INT4 weights; per-channel and per-group), measured as what-ifs
at every quantisable projection (SGLang 0.5.16 no longer has a QoQ path).

Packing from sgl-project/sglang sgl-kernel/tests/test_qserve_w4a8_per_{chn,group}_gemm.py (adapted from
omniserve's w4a8_linear.py): 32x32 tiles, nibbles interleaved for the kernel's ldmatrix/mma.m16n8k32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend, Requirement
from dskbench.adapters.base import Traffic, memo
from dskbench.adapters.common import fp8
from dskbench.adapters.common.inputs import generator, randn
from dskbench.adapters.gemm.linear import WEIGHT_STD, WhatIfLinear, gemm_flops, mnk, weight_bytes
from dskbench.shapes.cases import Case

_QSERVE_TILE = (0, 4, 3, 6, 1, 5, 2, 7)  # [N/32,2,2,8,K/32,2,4,4] -> tile-major
_QSERVE_PAIR = (0, 1, 2, 3, 5, 6, 7, 4)  # move the nibble-pair axis last


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.argsort(torch.tensor(perm)))


def qserve_pack_w4(q: torch.Tensor) -> torch.Tensor:
    """int4 values [N, K] (0..15) -> QServe-packed int8 [N, K/2]."""
    n, k = q.shape
    if n % 32 or k % 32:
        raise ValueError(f"QServe packing needs N and K multiples of 32, got {n}x{k}")
    t = q.to(torch.int16).reshape(n // 32, 2, 2, 8, k // 32, 2, 4, 4).permute(_QSERVE_TILE)
    t = t.permute(_QSERVE_PAIR).contiguous()
    packed = (t[..., 1] << 4) | t[..., 0]
    return packed.to(torch.uint8).reshape(n, k // 2).view(torch.int8)


def qserve_unpack_w4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of qserve_pack_w4: QServe-packed int8 [N, K/2] -> int4 values [N, K] as int8."""
    n, k = packed.shape[0], packed.shape[1] * 2
    p = packed.view(torch.uint8).to(torch.int16).reshape(n // 32, k // 32, 8, 4, 2, 2, 4)
    t = torch.stack([p & 0xF, (p >> 4) & 0xF], dim=-1)
    t = t.permute(_inverse(_QSERVE_PAIR)).permute(_inverse(_QSERVE_TILE))
    return t.reshape(n, k).to(torch.int8)


def qserve_pack_group_param(t: torch.Tensor) -> torch.Tensor:
    """Per-group int8 zeros/scales [N, K/128] -> the kernel's [K/128, N] with 0,8,16,24,1,9,... order."""
    n, groups = t.shape
    return t.t().reshape(groups, n // 32, 4, 8).transpose(-2, -1).reshape(groups, n).contiguous()


def qserve_unpack_group_param(t: torch.Tensor) -> torch.Tensor:
    groups, n = t.shape
    return t.reshape(groups, n // 32, 8, 4).transpose(-2, -1).reshape(groups, n).t().contiguous()


def _qserve_activations(m: int, k: int, g: torch.Generator, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-token INT8 activations and their fp16 scales [M] (QServe's ascales)."""
    x = randn((m, k), g, device, torch.float32)
    s = (x.abs().amax(dim=-1) / fp8.INT8_MAX).to(torch.float16)
    a = torch.round(x / s.float().unsqueeze(1)).clamp(-128, 127).to(torch.int8)
    return a, s


def _qserve_skip(case: Case, tile_n: int) -> str | None:
    n, k = int(case.dims["N"]), int(case.dims["K"])
    if n % tile_n:
        return f"QServe kernel tiles N by {tile_n} with no tail (N={n})"
    if k % 128:
        return f"QServe kernel needs K % 128 == 0 (K={k})"
    return None


def _bind_qserve_chn(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x = inputs
    out = torch.empty(
        x["in_feats"].shape[0], x["kernel"].shape[0], dtype=torch.float16, device=x["kernel"].device
    )
    args = (x["in_feats"], x["kernel"], x["wscales"], x["ascales"], x["w_szs"], x["a_ssums"], out)
    return lambda: fn(*args)


def _bind_qserve_group(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    x = inputs
    out = torch.empty(
        x["in_feats"].shape[0], x["kernel"].shape[0], dtype=torch.float16, device=x["kernel"].device
    )
    args = (x["in_feats"], x["kernel"], x["zeros"], x["scales_i8"], x["wscales"], x["ascales"], out)
    return lambda: fn(*args)


def _qserve_traffic(case: Case, group_params: bool, note: str) -> Traffic:
    m, n, k = mnk(case)
    nbytes = m * k + weight_bytes(k, n, "int4") + 2 * n + 2 * m + 2 * m * n  # in, W, wscales, ascales, out
    nbytes += 2 * n * (k // 128) if group_params else 2 * n + 2 * m  # int8 zeros+scales | w_szs + a_ssums
    return Traffic(nbytes, gemm_flops(m, n, k), note, compute="int8")  # int8 MMA on the unpacked weights


_QSERVE_NOTE = (
    "packing reproduced from sgl-kernel's own tests (sgl-kernel/tests/test_qserve_w4a8_*); "
    "not yet run against the 0.4.5 binary"
)


@register
class QServeW4A8PerChn(WhatIfLinear):
    kernel = "qserve_w4a8_per_chn_gemm"
    fmt = "QServe W4A8 per-channel"
    description = "QServe/QoQ W4A8 GEMM: INT8 activations x asymmetric INT4 weights, per-channel scales"
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.gemm:qserve_w4a8_per_chn_gemm",
            None,
            "aot",
            _bind_qserve_chn,
            requires=Requirement(min_sm=80),
            label="what-if: this projection in QServe W4A8 (sglang 0.5.16 no longer has a QoQ path)",
            note=_QSERVE_NOTE,
        ),
    ]

    def skip_reason(self, case: Case) -> str | None:
        return _qserve_skip(case, 128 if int(case.dims["M"]) > 256 else 64)

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        """Asymmetric 4-bit per output channel (scale s, zero z); w_szs = z*s, a_ssums = ascale*sum(a_q)."""
        m, n, k = mnk(case)
        g = generator(seed)
        a, ascale = _qserve_activations(m, k, g, device)
        w = randn((n, k), g, device, torch.float32, WEIGHT_STD)
        lo, hi = w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True)
        s = ((hi - lo) / 15).clamp_min(1e-8)
        z = torch.round(-lo / s)
        q = (torch.round(w / s) + z).clamp(0, 15)
        return {
            "in_feats": a,
            "kernel": qserve_pack_w4(q),
            "wscales": s.squeeze(1).to(torch.float16),
            "ascales": ascale,
            "w_szs": (z * s).squeeze(1).to(torch.float16),
            "a_ssums": (ascale.float() * a.float().sum(dim=-1)).to(torch.float16),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        """The kernel's epilogue: (a_q . q) * wscale[n] * ascale[m] - w_szs[n] * a_ssums[m]."""
        q = memo(inputs, "q", lambda: qserve_unpack_w4(inputs["kernel"]).float(), ("kernel",))
        acc = (inputs["in_feats"].float() @ q.t()).double()
        ws, wsz = inputs["wscales"].double(), inputs["w_szs"].double()
        asc, ass = inputs["ascales"].double(), inputs["a_ssums"].double()
        return (acc * ws[None, :] * asc[:, None] - wsz[None, :] * ass[:, None]).float()

    def traffic(self, case: Case) -> Traffic:
        return _qserve_traffic(case, False, self.what_if_note(case))


@register
class QServeW4A8PerGroup(WhatIfLinear):
    kernel = "qserve_w4a8_per_group_gemm"
    fmt = "QServe W4A8 per-group (g128)"
    description = "QServe/QoQ W4A8 GEMM with progressive group quantisation (INT8 per channel, INT4 per 128)"
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.gemm:qserve_w4a8_per_group_gemm",
            None,
            "aot",
            _bind_qserve_group,
            requires=Requirement(min_sm=80),
            label="what-if: this projection in QServe W4A8 g128 (sglang 0.5.16 no longer has a QoQ path)",
            note=_QSERVE_NOTE,
        ),
    ]

    def skip_reason(self, case: Case) -> str | None:
        return _qserve_skip(case, 64)

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        """Progressive quantisation as sgl-kernel's test: INT8 per channel (range 119), then INT4 per 128."""
        m, n, k = mnk(case)
        g = generator(seed)
        a, ascale = _qserve_activations(m, k, g, device)
        w = randn((n, k), g, device, torch.float32, WEIGHT_STD)
        chn = w.abs().amax(dim=-1, keepdim=True) / 119
        wi8 = torch.round(w / chn).clamp(-119, 119).reshape(n, k // 128, 128)
        lo, hi = wi8.amin(dim=-1, keepdim=True), wi8.amax(dim=-1, keepdim=True)
        s = torch.round((hi - lo) / 15).clamp_min(1)
        z = -torch.round(lo / s)
        q = (torch.round(wi8 / s) + z).clamp(0, 15).reshape(n, k)
        s8, z8 = s.squeeze(-1).to(torch.int8), z.squeeze(-1).to(torch.int8)
        return {
            "in_feats": a,
            "kernel": qserve_pack_w4(q),
            "zeros": qserve_pack_group_param((-z8.to(torch.int16) * s8.to(torch.int16)).to(torch.int8)),
            "scales_i8": qserve_pack_group_param(s8),
            "wscales": chn.squeeze(1).to(torch.float16),
            "ascales": ascale,
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        """w[n,k] = q*s + zero (= (q - z)*s) per 128-group; out = (a_q . w) * ascale[m] * wscale[n]."""

        def weight() -> torch.Tensor:
            q = qserve_unpack_w4(inputs["kernel"]).float()
            s = qserve_unpack_group_param(inputs["scales_i8"]).float().repeat_interleave(128, dim=1)
            zs = qserve_unpack_group_param(inputs["zeros"]).float().repeat_interleave(128, dim=1)
            return q * s + zs

        acc = inputs["in_feats"].float() @ memo(inputs, "w", weight, ("kernel", "scales_i8", "zeros")).t()
        return acc * inputs["ascales"].float()[:, None] * inputs["wscales"].float()[None, :]

    def traffic(self, case: Case) -> Traffic:
        return _qserve_traffic(case, True, self.what_if_note(case))
