"""Derived metrics from a latency, computed one way for every front end.

Bandwidth counts the minimum traffic (each input read once, each output written once) over the
measured latency; FLOP/s likewise. The % of peak is taken against the GPU's datasheet (peaks.py): a
fixed denominator, so 100% is a hard limit and a record above it is a traffic-model bug, not a fast
kernel. The run's measured ceilings (ceilings.py) are compared with as well ("% of measured"), but only
those that converged unthrottled (ceilings.usable_ceilings); the others are named with the reason they
were left out. The floor is the roofline's: the larger of bytes over bandwidth and FLOPs over
the compute rate, at the datasheet peaks (a measured ceiling stands in where the datasheet has none),
and `pct_of_floor` is floor / latency (100% = at the roofline).
"""

from __future__ import annotations

from typing import Any

from dskbench.measure.ceilings import usable_ceilings

COMPUTE_KINDS = ("bf16", "fp8", "fp4", "int8", "tf32", "fp16", "fp64")


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
    """GB/s, TFLOP/s and their share of the datasheet and (usable) measured peaks. `compute` picks
    which tensor rate the FLOPs are compared with (one of COMPUTE_KINDS)."""
    if compute not in COMPUTE_KINDS:
        raise ValueError(f"compute must be one of {COMPUTE_KINDS}, got {compute!r}")
    peaks = peaks or {}
    usable, unusable = usable_ceilings(ceilings)
    ok = latency_us is not None and latency_us > 0
    seconds = latency_us * 1e-6 if ok else None
    gbps = bytes / seconds / 1e9 if ok and bytes else None
    tflops = flops / seconds / 1e12 if ok and flops else None

    bw_key, fl_key = "bandwidth_gbps", f"{compute}_tflops"
    bw_meas, fl_meas = usable.get(bw_key), usable.get(fl_key)
    bw_sheet, fl_sheet = peaks.get("hbm_gbps"), peaks.get(fl_key)

    bw, fl = bw_sheet or bw_meas, fl_sheet or fl_meas
    t_mem = bytes / (bw * 1e9) * 1e6 if bytes and bw else None
    t_comp = flops / (fl * 1e12) * 1e6 if flops and fl else None
    parts = [t for t in (t_mem, t_comp) if t is not None]
    floor_us = max(parts) if parts else None
    bound = None
    if t_mem is not None or t_comp is not None:
        bound = "memory" if (t_mem or 0.0) >= (t_comp or 0.0) else "compute"
    basis = {
        "datasheet" if sheet else "measured" for sheet, t in ((bw_sheet, t_mem), (fl_sheet, t_comp)) if t
    }
    out: dict[str, Any] = {
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
    if basis:
        out["floor_peaks"] = "datasheet" if basis == {"datasheet"} else "+".join(sorted(basis))
    relevant = ([bw_key] if bytes else []) + ([fl_key] if flops else [])
    unused = {k: unusable[k] for k in relevant if k in unusable}
    if unused:
        out["ceilings_unused"] = unused
    return out
