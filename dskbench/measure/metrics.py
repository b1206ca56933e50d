"""Derived metrics from a latency, computed one way for every front end.

Bandwidth counts the minimum traffic (each input read once, each output written once) over the
measured latency; FLOP/s likewise. "% of measured" compares with this run's ceilings (ceilings.py),
"% of datasheet" with peaks.py. The floor is METHOD.md's "two numbers": the larger of bytes over
bandwidth and FLOPs over the compute rate (measured ceilings preferred, datasheet otherwise), and
`pct_of_floor` is floor / latency (100% = at the roofline).
"""

from __future__ import annotations

from typing import Any

COMPUTE_KINDS = ("bf16", "fp8", "fp4")


def _pct(x: float | None, peak: float | None) -> float | None:
    if x is None or not peak:
        return None
    return 100.0 * x / peak


def metrics(
    latency_us: float,
    bytes: int | float | None = None,
    flops: int | float | None = None,
    ceilings: dict[str, Any] | None = None,
    peaks: dict[str, Any] | None = None,
    *,
    compute: str = "bf16",
) -> dict[str, Any]:
    """GB/s, TFLOP/s and their share of measured and datasheet peaks. `compute` picks which tensor
    rate the FLOPs are compared with ("bf16", "fp8" or "fp4")."""
    if compute not in COMPUTE_KINDS:
        raise ValueError(f"compute must be one of {COMPUTE_KINDS}, got {compute!r}")
    ceilings = ceilings or {}
    peaks = peaks or {}
    ok = latency_us is not None and latency_us > 0
    seconds = latency_us * 1e-6 if ok else None
    gbps = bytes / seconds / 1e9 if ok and bytes else None
    tflops = flops / seconds / 1e12 if ok and flops else None

    bw_meas = ceilings.get("bandwidth_gbps")
    bw_sheet = peaks.get("hbm_gbps")
    fl_meas = ceilings.get(f"{compute}_tflops")
    fl_sheet = peaks.get(f"{compute}_tflops")

    bw = bw_meas or bw_sheet
    fl = fl_meas or fl_sheet
    t_mem = bytes / (bw * 1e9) * 1e6 if bytes and bw else None
    t_comp = flops / (fl * 1e12) * 1e6 if flops and fl else None
    parts = [t for t in (t_mem, t_comp) if t is not None]
    floor_us = max(parts) if parts else None
    bound = None
    if t_mem is not None or t_comp is not None:
        bound = "memory" if (t_mem or 0.0) >= (t_comp or 0.0) else "compute"
    return {
        "latency_us": latency_us,
        "gbps": gbps,
        "tflops": tflops,
        "compute": compute,
        "pct_bw_measured": _pct(gbps, bw_meas),
        "pct_compute_measured": _pct(tflops, fl_meas),
        "pct_bw_datasheet": _pct(gbps, bw_sheet),
        "pct_compute_datasheet": _pct(tflops, fl_sheet),
        "floor_us": floor_us,
        "bound": bound,
        "pct_of_floor": _pct(floor_us, latency_us) if ok else None,
    }
