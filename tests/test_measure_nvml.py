"""NVML clocks and throttle-reason decoding, against a fake pynvml module."""

from __future__ import annotations

import pytest

from dskbench.measure import nvml


class FakeNVML:
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, reasons: int = 0, sm: int = 1980, power_mw: int = 650_000) -> None:
        self.reasons = reasons
        self.sm = sm
        self.power_mw = power_mw
        self.by_index: list[int] = []
        self.by_uuid: list[str] = []

    def nvmlDeviceGetHandleByIndex(self, i: int):
        self.by_index.append(i)
        return ("h", i)

    def nvmlDeviceGetHandleByUUID(self, u: str):
        self.by_uuid.append(u)
        return ("h", u)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h) -> int:
        return self.reasons

    def nvmlDeviceGetClockInfo(self, h, kind: int) -> int:
        return self.sm if kind == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetMaxClockInfo(self, h, kind: int) -> int:
        return 1980 if kind == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetTemperature(self, h, sensor: int) -> int:
        return 61

    def nvmlDeviceGetPowerUsage(self, h) -> int:
        return self.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h) -> int:
        return 700_000

    def nvmlDeviceGetName(self, h) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetUUID(self, h) -> str:
        return "GPU-1234"

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.95.05"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def nvmlDeviceGetMemoryInfo(self, h):
        class M:
            total = 150_754_820_096

        return M()


class OldNVML(FakeNVML):
    """nvidia-ml-py before the Throttle -> Event rename."""

    nvmlDeviceGetCurrentClocksEventReasons = None  # type: ignore[assignment]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h) -> int:
        return self.reasons


@pytest.fixture(autouse=True)
def _fresh_handles(monkeypatch):
    monkeypatch.setattr(nvml, "_handles", {})
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_decode_reasons() -> None:
    assert nvml.decode_reasons(0) == []
    assert nvml.decode_reasons(0x1) == ["gpu_idle"]
    assert nvml.decode_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert nvml.decode_reasons(0x8 | 0x20 | 0x80) == [
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_power_brake_slowdown",
    ]
    assert nvml.decode_reasons(0x1000) == ["unknown_0x1000"]


def test_idle_and_settings_are_not_throttling() -> None:
    assert nvml.active_throttling(nvml.decode_reasons(0x1 | 0x2 | 0x100 | 0x10)) == []
    # drivers report the SW power cap on an idle board too: only counts while busy
    assert nvml.active_throttling(["gpu_idle", "sw_power_cap"]) == []
    assert nvml.active_throttling(["sw_power_cap"]) == ["sw_power_cap"]
    assert nvml.active_throttling(["gpu_idle", "hw_thermal_slowdown"]) == ["hw_thermal_slowdown"]


def test_read_clocks_with_fake_nvml() -> None:
    lib = FakeNVML(reasons=0x4)
    r = nvml.read_clocks(0, lib=lib)
    assert r is not None
    assert r["sm_mhz"] == 1980 and r["sm_max_mhz"] == 1980 and r["mem_max_mhz"] == 2619
    assert r["temp_c"] == 61 and r["power_w"] == 650.0 and r["power_limit_w"] == 700.0
    assert r["reasons"] == ["sw_power_cap"] and r["throttling"] == ["sw_power_cap"]
    assert lib.by_index == [0]


def test_read_clocks_old_binding_name() -> None:
    r = nvml.read_clocks(0, lib=OldNVML(reasons=0x20))
    assert r is not None and r["throttling"] == ["sw_thermal_slowdown"]


def test_handle_follows_cuda_visible_devices(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    lib = FakeNVML()
    nvml.read_clocks(1, lib=lib)
    assert lib.by_index == [5]
    monkeypatch.setattr(nvml, "_handles", {})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb")
    lib = FakeNVML()
    nvml.read_clocks(0, lib=lib)
    assert lib.by_uuid == ["GPU-aaaa"]


def test_no_nvml_degrades_to_none(monkeypatch) -> None:
    monkeypatch.setattr(nvml, "_lib", None)
    monkeypatch.setattr(nvml, "_lib_tried", True)
    assert nvml.read_clocks(0) is None
    assert nvml.gpu_identity(0) is None


def test_judge_busy_reads() -> None:
    cool = nvml.read_clocks(0, lib=FakeNVML(reasons=0))
    assert nvml.judge([cool, cool])[:2] == (False, [])
    hot = nvml.read_clocks(0, lib=FakeNVML(reasons=0x40, sm=1500))
    throttled, reasons, summary = nvml.judge([cool, hot])
    assert throttled and reasons == ["hw_thermal_slowdown"]
    assert summary is not None and summary["sm_mhz_min"] == 1500 and summary["temp_c_max"] == 61
    slow = nvml.read_clocks(0, lib=FakeNVML(reasons=0, sm=1200))  # 1200 < 0.75 * 1980
    throttled, reasons, _ = nvml.judge([slow])
    assert throttled and reasons[0].startswith("sm_clock_low(1200/1980")
    idle_slow = nvml.read_clocks(0, lib=FakeNVML(reasons=0x1 | 0x4, sm=345))  # drained batch: ignored
    assert nvml.judge([idle_slow])[:2] == (False, [])
    assert nvml.judge([]) == (None, [], None)


def test_gpu_identity_with_fake_nvml() -> None:
    ident = nvml.gpu_identity(0, lib=FakeNVML())
    assert ident == {
        "name": "NVIDIA H200",
        "uuid": "GPU-1234",
        "driver_version": "580.95.05",
        "cuda_driver_version": "13.0",
        "memory_total_gb": 150.8,
        "power_limit_w": 700.0,
        "sm_max_mhz": 1980,
        "mem_max_mhz": 2619,
    }


def test_real_pynvml_never_raises() -> None:
    # on a machine without a GPU driver this is None; with one, a dict: never an exception
    r = nvml.read_clocks(0)
    assert r is None or "sm_mhz" in r
