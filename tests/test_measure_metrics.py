"""Derived metrics (the datasheet denominator, the measured ceilings beside it) and the datasheet lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from dskbench.measure import datasheet_peaks, metrics
from dskbench.measure.ceilings import usable_ceilings
from dskbench.measure.peaks import PeaksError, load_peaks

H200 = {
    "hbm_gbps": 4800.0,
    "bf16_tflops": 989.5,
    "fp8_tflops": 1979.0,
    "fp4_tflops": None,
    "int8_tflops": 1979.0,
}
GOOD = {"converged": True, "throttled": False, "throttle_reasons": []}


def ceilings(bw=4000.0, bf16=700.0, fp8=1300.0, **details) -> dict:
    """Measured ceilings in measure_ceilings' layout; `details` override a measurement's detail."""
    out = {"bandwidth_gbps": bw, "bf16_tflops": bf16, "fp8_tflops": fp8}
    for name, flat in (("copy", "gbps"), ("bf16_matmul", "tflops"), ("fp8_matmul", "tflops")):
        out[name] = {**GOOD, flat: 0.0, **details.get(name, {})}
    return out


def test_percent_is_of_the_datasheet_and_of_usable_ceilings_beside_it() -> None:
    # 40 MB in 10 us = 4000 GB/s; 7 GFLOP in 10 us = 700 TFLOP/s
    m = metrics(10.0, bytes=40_000_000, flops=7_000_000_000, ceilings=ceilings(), peaks=H200)
    assert m["gbps"] == pytest.approx(4000.0) and m["tflops"] == pytest.approx(700.0)
    assert m["pct_bw_datasheet"] == pytest.approx(100.0 * 4000 / 4800)
    assert m["pct_compute_datasheet"] == pytest.approx(100.0 * 700 / 989.5)
    assert m["pct_bw_measured"] == pytest.approx(100.0) and m["pct_compute_measured"] == pytest.approx(100.0)
    assert "ceilings_unused" not in m


def test_floor_is_taken_at_the_datasheet_peaks() -> None:
    # memory: 9.6 MB / 4800 GB/s = 2 us; compute: 1.979 GFLOP / 989.5 TFLOP/s = 2 us -> tie = memory
    m = metrics(4.0, bytes=9_600_000, flops=1_979_000_000, ceilings=ceilings(), peaks=H200)
    assert m["floor_us"] == pytest.approx(2.0) and m["bound"] == "memory" and m["floor_peaks"] == "datasheet"
    assert m["pct_of_floor"] == pytest.approx(50.0)
    m = metrics(4.0, bytes=4_000_000, flops=1_979_000_000, ceilings=ceilings(), peaks=H200)
    assert m["bound"] == "compute" and m["floor_us"] == pytest.approx(2.0)
    m = metrics(4.0, bytes=1_000, flops=3_958_000_000, peaks=H200, compute="fp8")  # fp8: the fp8 rate
    assert m["floor_us"] == pytest.approx(2.0) and m["pct_compute_datasheet"] == pytest.approx(50.0)
    m = metrics(4.0, flops=3_958_000_000, peaks=H200, compute="int8")
    assert m["pct_compute_datasheet"] == pytest.approx(50.0)


def test_throttled_or_unconverged_ceilings_are_not_used_and_say_why() -> None:
    bad = ceilings(
        bf16=738.0,
        bf16_matmul={"throttled": True, "throttle_reasons": ["sw_power_cap"], "converged": False},
        copy={"converged": False},
    )
    m = metrics(10.0, bytes=40_000_000, flops=8_050_000_000, ceilings=bad, peaks=H200)
    assert m["pct_bw_measured"] is None and m["pct_compute_measured"] is None
    assert m["ceilings_unused"] == {
        "bandwidth_gbps": "not converged",
        "bf16_tflops": "throttled (sw_power_cap); not converged",
    }
    # the % of peak does not move: 805 TFLOP/s is 81% of the datasheet, whatever the ceiling said
    assert m["pct_compute_datasheet"] == pytest.approx(100.0 * 805 / 989.5)
    # only the ceilings a record compares with are named: an fp8 record without bytes names fp8 alone
    fp8 = metrics(
        10.0, flops=1e10, ceilings=ceilings(fp8_matmul={"throttled": None}), peaks=H200, compute="fp8"
    )
    assert fp8["ceilings_unused"] == {"fp8_tflops": "throttling unknown"}
    used, unused = usable_ceilings({"bandwidth_gbps": 4000.0})  # a bare number cannot be judged
    assert used == {} and unused == {"bandwidth_gbps": "no measurement detail to judge it by"}


def test_no_datasheet_entry_floors_at_usable_ceilings() -> None:
    m = metrics(1.0, bytes=4_000_000, ceilings=ceilings(), peaks=None)
    assert m["pct_bw_datasheet"] is None and m["pct_bw_measured"] == pytest.approx(100.0)
    assert m["floor_us"] == pytest.approx(1.0) and m["floor_peaks"] == "measured"
    m = metrics(1.0, flops=10**9, ceilings=ceilings(), peaks=H200, compute="fp4")
    assert m["tflops"] == pytest.approx(1000.0)
    assert m["pct_compute_measured"] is None and m["pct_compute_datasheet"] is None  # Hopper has no FP4
    m = metrics(1.0)
    assert m["gbps"] is None and m["tflops"] is None and m["floor_us"] is None and m["bound"] is None
    assert "floor_peaks" not in m
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
        ("nvidia  h200 ", "H200 SXM", 4800, 989.5, 1979, None),
        ("NVIDIA H200 NVL", "H200 NVL", 4800, 835.5, 1670.5, None),
        ("NVIDIA H20", "H20", 4000, 148, 296, None),
        ("NVIDIA B200", "B200", 8000, 2250, 4500, 9000),
        ("NVIDIA B300 SXM6 AC", "B300", 8000, 2250, 4500, 13500),
        ("NVIDIA GB200", "GB200", 8000, 2500, 5000, 10000),
    ],
)
def test_datasheet_lookup(name, peak_name, hbm, bf16, fp8, fp4) -> None:
    p = datasheet_peaks(name)
    assert p is not None and p["name"] == peak_name
    assert (p["hbm_gbps"], p["bf16_tflops"], p["fp8_tflops"], p["fp4_tflops"]) == (hbm, bf16, fp8, fp4)
    assert p["fp16_tflops"] == p["bf16_tflops"] and p["source"].startswith("NVIDIA")


def test_every_rate_is_listed() -> None:
    p = datasheet_peaks("NVIDIA H100 80GB HBM3")
    assert p is not None
    assert (p["fp64_tflops"], p["tf32_tflops"], p["int8_tflops"]) == (67, 494.5, 1979)


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA GH200 480GB",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA H100",  # SXM or PCIe? not guessed
        "NVIDIA H100 80GB HBM3 MIG 1g.10gb",  # a slice has no datasheet
        "NVIDIA H20-3e",  # another memory, another bandwidth
        "cpu",
        "",
        None,
    ],
)
def test_datasheet_unknown(name) -> None:
    assert datasheet_peaks(name) is None


def test_bad_peaks_file_is_a_one_line_error(tmp_path: Path) -> None:
    f = tmp_path / "peaks.yaml"
    f.write_text(
        "gpus:\n  - name: X1\n    match: ['x1']\n    source: s\n    hbm_gbps: fast\n    tflops: {}\n"
    )
    with pytest.raises(
        PeaksError, match=r"peaks.yaml: gpus\[0\] \(X1\): 'hbm_gbps' must be a positive number"
    ):
        load_peaks(f)
    f.write_text(
        "gpus:\n  - name: X1\n    match: ['x1']\n    source: s\n    hbm_gbps: 1\n    tflops: {bf17: 1}\n"
    )
    with pytest.raises(PeaksError, match="'tflops' keys must be among"):
        load_peaks(f)
    f.write_text("gpus: []\n")
    with pytest.raises(PeaksError, match="non-empty list under 'gpus'"):
        load_peaks(f)
