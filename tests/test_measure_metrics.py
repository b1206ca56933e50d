"""Derived metrics and datasheet lookup."""

from __future__ import annotations

import pytest

from dskbench.measure import datasheet_peaks, metrics

H200 = {"hbm_gbps": 4800.0, "bf16_tflops": 989.5, "fp8_tflops": 1979.0, "fp4_tflops": None}
CEIL = {"bandwidth_gbps": 4000.0, "bf16_tflops": 700.0, "fp8_tflops": 1300.0}


def test_bandwidth_and_flops() -> None:
    # 40 MB in 10 us = 4000 GB/s; 7 GFLOP in 10 us = 700 TFLOP/s
    m = metrics(10.0, bytes=40_000_000, flops=7_000_000_000, ceilings=CEIL, peaks=H200)
    assert m["gbps"] == pytest.approx(4000.0)
    assert m["tflops"] == pytest.approx(700.0)
    assert m["pct_bw_measured"] == pytest.approx(100.0)
    assert m["pct_compute_measured"] == pytest.approx(100.0)
    assert m["pct_bw_datasheet"] == pytest.approx(100.0 * 4000 / 4800)
    assert m["pct_compute_datasheet"] == pytest.approx(100.0 * 700 / 989.5)


def test_floor_and_bound() -> None:
    # memory term: 8 MB / 4000 GB/s = 2 us; compute term: 1.4 GFLOP / 700 TFLOP/s = 2 us -> tie = memory
    m = metrics(4.0, bytes=8_000_000, flops=1_400_000_000, ceilings=CEIL, peaks=H200)
    assert m["floor_us"] == pytest.approx(2.0) and m["bound"] == "memory"
    assert m["pct_of_floor"] == pytest.approx(50.0)
    m = metrics(4.0, bytes=4_000_000, flops=1_400_000_000, ceilings=CEIL, peaks=H200)
    assert m["bound"] == "compute" and m["floor_us"] == pytest.approx(2.0)
    # fp8 compares with the fp8 rate
    m = metrics(4.0, bytes=1_000, flops=2_600_000_000, ceilings=CEIL, peaks=H200, compute="fp8")
    assert m["pct_compute_measured"] == pytest.approx(50.0) and m["floor_us"] == pytest.approx(2.0)


def test_datasheet_used_when_no_ceiling_and_missing_values() -> None:
    m = metrics(1.0, bytes=4_800_000, peaks=H200)
    assert m["pct_bw_measured"] is None and m["pct_bw_datasheet"] == pytest.approx(100.0)
    assert m["floor_us"] == pytest.approx(1.0)
    m = metrics(1.0, flops=10**9, ceilings=CEIL, peaks=H200, compute="fp4")
    assert m["tflops"] == pytest.approx(1000.0)
    assert m["pct_compute_measured"] is None and m["pct_compute_datasheet"] is None  # Hopper has no FP4
    m = metrics(1.0)
    assert m["gbps"] is None and m["tflops"] is None and m["floor_us"] is None and m["bound"] is None
    with pytest.raises(ValueError):
        metrics(1.0, compute="int4")


@pytest.mark.parametrize(
    ("name", "peak_name", "hbm", "bf16", "fp8", "fp4"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 3350, 989.5, 1979, None),
        ("NVIDIA H100 SXM5 80GB", "H100 SXM", 3350, 989.5, 1979, None),
        ("NVIDIA H100 PCIe", "H100 PCIe", 2000, 756.5, 1513, None),
        ("NVIDIA H100 NVL", "H100 NVL", 3900, 835.5, 1670.5, None),
        ("NVIDIA H200", "H200 SXM", 4800, 989.5, 1979, None),
        ("NVIDIA H200 NVL", "H200 NVL", 4800, 835.5, 1670.5, None),
        ("NVIDIA B200", "B200", 8000, 2250, 4500, 9000),
        ("NVIDIA GB200", "GB200", 8000, 2500, 5000, 10000),
    ],
)
def test_datasheet_lookup(name, peak_name, hbm, bf16, fp8, fp4) -> None:
    p = datasheet_peaks(name)
    assert p is not None and p["name"] == peak_name
    assert (p["hbm_gbps"], p["bf16_tflops"], p["fp8_tflops"], p["fp4_tflops"]) == (hbm, bf16, fp8, fp4)


@pytest.mark.parametrize("name", ["NVIDIA GH200 480GB", "NVIDIA A100-SXM4-80GB", "cpu", "", None])
def test_datasheet_unknown(name) -> None:
    assert datasheet_peaks(name) is None
