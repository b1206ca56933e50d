"""Clocks, temperature, power and clock-event (throttle) reasons through NVML, for every measurement.

pynvml (from nvidia-ml-py) is imported lazily; without it, without a driver, or on any NVML error the
functions return None and the measurement says "unknown" rather than failing.

Which reasons mean a case was throttled: thermal and hardware slowdowns, the power brake, and the
software power cap while the GPU is busy. Not counted: GPU idle (clocks drop when there is no work),
application-clock and display-clock settings (configuration, not a slowdown), sync boost, and the
software power cap when it is reported together with "idle" (drivers raise it on an idle board too).
A busy SM clock under 75% of its maximum (nvbench's threshold) also counts.
"""

from __future__ import annotations

import sys
from typing import Any

from dskbench.device.visible import visible_devices

# NVML clock-event reason bits (nvml.h nvmlClocksEventReason*, formerly nvmlClocksThrottleReason*)
REASON_BITS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}
THROTTLING = frozenset(
    {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
)
LOW_CLOCK_FRACTION = 0.75

_lib: Any = None
_lib_tried = False
_handles: dict[tuple[int, int], Any] = {}


def _load() -> Any:
    """The initialised pynvml module, or None."""
    global _lib, _lib_tried
    if _lib_tried:
        return _lib
    _lib_tried = True
    try:
        import pynvml

        pynvml.nvmlInit()
        _lib = pynvml
    except Exception:  # ImportError, NVMLError (no driver), OSError (no libnvidia-ml)
        _lib = None
    return _lib


def _str(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _torch_uuid(index: int) -> str | None:
    """The CUDA device's UUID from torch, only if torch is already imported (never imports it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        u = str(torch.cuda.get_device_properties(index).uuid)
    except Exception:
        return None
    return u if u.startswith(("GPU-", "MIG-")) else f"GPU-{u}"


def _handle(lib: Any, index: int) -> Any:
    """NVML handle of CUDA device `index`: by UUID when known (CUDA and NVML can number devices
    differently), else through CUDA_VISIBLE_DEVICES, else by index."""
    key = (id(lib), index)
    if key in _handles:
        return _handles[key]
    h = None
    uuid = _torch_uuid(index)
    if uuid is not None:
        try:
            h = lib.nvmlDeviceGetHandleByUUID(uuid)
        except Exception:
            h = None
    if h is None:
        visible = visible_devices() or []
        target = visible[index] if index < len(visible) else str(index)
        if target.isdigit():
            h = lib.nvmlDeviceGetHandleByIndex(int(target))
        else:
            h = lib.nvmlDeviceGetHandleByUUID(target)
    _handles[key] = h
    return h


def library() -> Any:
    """The initialised pynvml module, or None (nvidia-ml-py not installed, no driver)."""
    return _load()


def device_handle(lib: Any, index: int) -> Any:
    """NVML handle of CUDA device `index` (raises what NVML raises); see _handle."""
    return _handle(lib, index)


def decode_reasons(mask: int) -> list[str]:
    """Names of the set reason bits, in bit order; unknown bits as hex."""
    names = [name for bit, name in REASON_BITS.items() if mask & bit]
    rest = mask & ~sum(REASON_BITS)
    if rest:
        names.append(f"unknown_0x{rest:x}")
    return names


def active_throttling(reasons: list[str]) -> list[str]:
    """The reasons that mean the clocks were held down by heat or power while working."""
    idle = "gpu_idle" in reasons
    return [r for r in reasons if r in THROTTLING and not (idle and r == "sw_power_cap")]


def _reasons_mask(lib: Any, h: Any) -> int:
    fn = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if fn is None:  # nvidia-ml-py before the rename
        fn = lib.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(fn(h))


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def read_clocks(index: int = 0, *, lib: Any = None) -> dict[str, Any] | None:
    """SM/memory clocks (current, max; MHz), temperature (C), power and limit (W), clock-event reasons."""
    lib = lib if lib is not None else _load()
    if lib is None:
        return None
    try:
        h = _handle(lib, index)
        mask = _reasons_mask(lib, h)
    except Exception:
        return None
    power_mw = _try(lib.nvmlDeviceGetPowerUsage, h)
    limit_mw = _try(lib.nvmlDeviceGetEnforcedPowerLimit, h)
    reasons = decode_reasons(mask)
    return {
        "sm_mhz": _try(lib.nvmlDeviceGetClockInfo, h, lib.NVML_CLOCK_SM),
        "sm_max_mhz": _try(lib.nvmlDeviceGetMaxClockInfo, h, lib.NVML_CLOCK_SM),
        "mem_mhz": _try(lib.nvmlDeviceGetClockInfo, h, lib.NVML_CLOCK_MEM),
        "mem_max_mhz": _try(lib.nvmlDeviceGetMaxClockInfo, h, lib.NVML_CLOCK_MEM),
        "temp_c": _try(lib.nvmlDeviceGetTemperature, h, lib.NVML_TEMPERATURE_GPU),
        "power_w": power_mw / 1000.0 if power_mw is not None else None,
        "power_limit_w": limit_mw / 1000.0 if limit_mw is not None else None,
        "reasons_mask": mask,
        "reasons": reasons,
        "throttling": active_throttling(reasons),
    }


def judge(busy_reads: list[dict[str, Any]]) -> tuple[bool | None, list[str], dict[str, Any] | None]:
    """(throttled, reasons, summary) from NVML reads taken while the GPU was working.

    Reads that show the GPU idle are ignored for the clock test (the batch had already drained).
    """
    reads = [r for r in busy_reads if r is not None]
    if not reads:
        return None, [], None
    reasons: list[str] = []
    for r in reads:
        for name in r.get("throttling", []):
            if name not in reasons:
                reasons.append(name)
    working = [r for r in reads if "gpu_idle" not in r.get("reasons", [])]
    clocks = [r["sm_mhz"] for r in working if r.get("sm_mhz")]
    max_clock = next((r["sm_max_mhz"] for r in reads if r.get("sm_max_mhz")), None)
    if clocks and max_clock and min(clocks) < LOW_CLOCK_FRACTION * max_clock:
        reasons.append(f"sm_clock_low({min(clocks)}/{max_clock} MHz)")
    temps = [r["temp_c"] for r in reads if r.get("temp_c") is not None]
    powers = [r["power_w"] for r in reads if r.get("power_w") is not None]
    summary = {
        "reads": len(reads),
        "busy_reads": len(working),
        "sm_mhz_min": min(clocks) if clocks else None,
        "sm_mhz_max": max(clocks) if clocks else None,
        "sm_max_mhz": max_clock,
        "temp_c_max": max(temps) if temps else None,
        "power_w_max": max(powers) if powers else None,
    }
    return bool(reasons), reasons, summary


def gpu_identity(index: int = 0, *, lib: Any = None) -> dict[str, Any] | None:
    """Name, UUID, driver and CUDA driver versions, memory, power limit and max clocks of one GPU."""
    lib = lib if lib is not None else _load()
    if lib is None:
        return None
    try:
        h = _handle(lib, index)
        name = _str(lib.nvmlDeviceGetName(h))
    except Exception:
        return None
    cuda_drv = _try(lib.nvmlSystemGetCudaDriverVersion)
    mem = _try(lib.nvmlDeviceGetMemoryInfo, h)
    limit_mw = _try(lib.nvmlDeviceGetEnforcedPowerLimit, h)
    uuid = _try(lib.nvmlDeviceGetUUID, h)
    driver = _try(lib.nvmlSystemGetDriverVersion)
    return {
        "name": name,
        "uuid": _str(uuid) if uuid is not None else None,
        "driver_version": _str(driver) if driver is not None else None,
        "cuda_driver_version": f"{cuda_drv // 1000}.{cuda_drv % 1000 // 10}" if cuda_drv else None,
        "memory_total_gb": round(mem.total / 1e9, 1) if mem is not None else None,
        "power_limit_w": limit_mw / 1000.0 if limit_mw is not None else None,
        "sm_max_mhz": _try(lib.nvmlDeviceGetMaxClockInfo, h, lib.NVML_CLOCK_SM),
        "mem_max_mhz": _try(lib.nvmlDeviceGetMaxClockInfo, h, lib.NVML_CLOCK_MEM),
    }
