"""The machine's measured ceilings, once per run, through the same `measure()` as every kernel.

- copy: a 256 MiB device-to-device copy; bandwidth counts bytes read plus bytes written.
- bf16 matmul: 8192^3 torch.mm on random data (a GPU multiplies zeros faster than real data: less
  switching power, higher clocks).
- fp8 e4m3 matmul: 8192^3 torch._scaled_mm with tensor-wise scales and fast accumulation (the
  Hopper/Blackwell peak path), random data; skipped below sm89.
All hot mode: the operands are far larger than L2, so flushing would change nothing but the cost.
- launch_gap: calibrate.calibrate_launch_gap(), measured first (small ops, before the big GEMMs heat
  the GPU) and stored here so it is recorded once per run; the runner passes it to every case through
  settings_with_gap(), and the ceilings themselves are timed with it (it is < 0.1% of them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dskbench.measure.calibrate import calibrate_launch_gap, settings_with_gap
from dskbench.measure.core import measure
from dskbench.measure.settings import MeasureSettings

# 256 MiB: over 4x the L2 of an H100/H200, so DRAM-bound, and not larger: a 1 GiB copy_ measured well
# below what 256 MiB did on the same GPU (results/h200-2026-11-21/README.md), so it is not the ceiling.
COPY_BYTES = 256 * 2**20
MM_SIZE = 8192


def _settings(settings: MeasureSettings | None) -> MeasureSettings:
    return settings or MeasureSettings(target_noise=0.005, min_time_s=0.2, max_time_s=1.0, band_noise=())


def _summary(m: Any) -> dict[str, Any]:
    return {
        "latency_us": m.median_us,
        "raw_latency_us": m.raw_median_us,
        "launch_gap_us": m.launch_gap_us,
        "method": m.method,
        "mode": m.mode,
        "n_samples": m.n_samples,
        "noise": m.noise,
        "converged": m.converged,
        "throttled": m.throttled,
        "throttle_reasons": m.throttle_reasons,
    }


def _copy(device: str, s: MeasureSettings, gen: Any) -> dict[str, Any]:
    import torch

    src = torch.randn(COPY_BYTES // 4, device=device, generator=gen)
    dst = torch.empty_like(src)
    m = measure([lambda: dst.copy_(src)], device=device, mode="hot", settings=s)
    moved = 2 * COPY_BYTES
    gbps = moved / (m.median_us * 1e-6) / 1e9
    return {
        "gbps": gbps,
        "bytes_each": COPY_BYTES,
        "bytes_moved": moved,
        "op": "Tensor.copy_ fp32",
        **_summary(m),
    }


def _bf16_mm(device: str, s: MeasureSettings, gen: Any) -> dict[str, Any]:
    import torch

    a, b = (torch.randn(MM_SIZE, MM_SIZE, device=device, dtype=torch.bfloat16, generator=gen) for _ in "ab")
    c = torch.empty(MM_SIZE, MM_SIZE, device=device, dtype=torch.bfloat16)
    m = measure([lambda: torch.mm(a, b, out=c)], device=device, mode="hot", settings=s)
    flops = 2 * MM_SIZE**3
    tflops = flops / (m.median_us * 1e-6) / 1e12
    return {
        "tflops": tflops,
        "m": MM_SIZE,
        "n": MM_SIZE,
        "k": MM_SIZE,
        "flops": flops,
        "op": "torch.mm bf16",
        **_summary(m),
    }


def _fp8_mm(device: str, s: MeasureSettings, gen: Any) -> dict[str, Any]:
    """Row-major A, column-major B (as cuBLASLt wants), tensor-wise fp32 scales, bf16 out."""
    import torch

    a8, b8 = (
        torch.randn(MM_SIZE, MM_SIZE, device=device, generator=gen).to(torch.float8_e4m3fn) for _ in "ab"
    )
    one = torch.ones((), device=device, dtype=torch.float32)

    def fp8_mm() -> Any:
        return torch._scaled_mm(a8, b8.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True)

    m = measure([fp8_mm], device=device, mode="hot", settings=s)
    flops = 2 * MM_SIZE**3
    tflops = flops / (m.median_us * 1e-6) / 1e12
    op = "torch._scaled_mm e4m3 x e4m3 -> bf16, use_fast_accum=True"
    return {
        "tflops": tflops,
        "m": MM_SIZE,
        "n": MM_SIZE,
        "k": MM_SIZE,
        "flops": flops,
        "op": op,
        **_summary(m),
    }


# flat ceiling -> the detail dict of the measurement behind it
DETAILS = {"bandwidth_gbps": "copy", "bf16_tflops": "bf16_matmul", "fp8_tflops": "fp8_matmul"}


def usable_ceilings(ceilings: Mapping[str, Any] | None) -> tuple[dict[str, float], dict[str, str]]:
    """({flat key: value} of the ceilings fit to compare with, {flat key: why not} of the others).

    A ceiling is used only when its measurement converged and was not throttled: a copy or a matmul
    slowed by heat, power or another process on the GPU is not the machine's ceiling, and kernels then
    land "above 100%" of it. A ceiling without its detail cannot be judged and is not used either."""
    used: dict[str, float] = {}
    unused: dict[str, str] = {}
    for flat, name in DETAILS.items():
        v = (ceilings or {}).get(flat)
        if not isinstance(v, int | float) or isinstance(v, bool) or v <= 0:
            continue
        why = unfit_reason((ceilings or {}).get(name))
        if why:
            unused[flat] = why
        else:
            used[flat] = float(v)
    return used, unused


def unfit_reason(detail: Any) -> str | None:
    """Why a measured ceiling (its detail dict) must not be a denominator; None when it may."""
    if not isinstance(detail, Mapping):
        return "no measurement detail to judge it by"
    reasons = []
    if detail.get("throttled") is not False:
        named = ", ".join(str(r) for r in detail.get("throttle_reasons") or [])
        known = detail.get("throttled") is True
        reasons.append(
            f"throttled ({named})" if known and named else "throttled" if known else "throttling unknown"
        )
    if detail.get("converged") is not True:
        reasons.append("not converged")
    return "; ".join(reasons) or None


def measure_ceilings(device: str = "cuda", settings: MeasureSettings | None = None) -> dict[str, Any]:
    """{"bandwidth_gbps", "bf16_tflops", "fp8_tflops", "gpu", "sm", "copy" / "bf16_matmul" / "fp8_matmul"
    detail dicts, "launch_gap" (calibrate_launch_gap's dict)}. A ceiling that cannot be measured is
    None, its error in the detail; a failed calibration is {"error": ...} and corrects nothing."""
    import torch

    s = _settings(settings)
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    device = str(dev)
    major, minor = torch.cuda.get_device_capability(dev)
    sm = major * 10 + minor
    out: dict[str, Any] = {"gpu": torch.cuda.get_device_name(dev), "sm": sm}
    try:
        out["launch_gap"] = calibrate_launch_gap(dev.index)
    except Exception as e:  # the ceilings do not need it
        out["launch_gap"] = {"error": f"{type(e).__name__}: {e}"}
    torch.cuda.empty_cache()
    s = settings_with_gap(s, out)
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    jobs = [("copy", "bandwidth_gbps", "gbps", _copy), ("bf16_matmul", "bf16_tflops", "tflops", _bf16_mm)]
    jobs.append(("fp8_matmul", "fp8_tflops", "tflops", _fp8_mm))
    for key, flat, field, fn in jobs:
        out[flat] = None
        if key == "fp8_matmul" and sm < 89:
            out[key] = {"error": f"needs sm89+ (found sm{sm})"}
            continue
        try:
            out[key] = fn(device, s, gen)
            out[flat] = out[key][field]
        except Exception as e:  # one missing ceiling must not lose the others
            out[key] = {"error": f"{type(e).__name__}: {e}"}
        torch.cuda.empty_cache()
    return out
