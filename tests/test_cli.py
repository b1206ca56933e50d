"""The command line's error paths and its CPU behaviour (no GPU here)."""

from __future__ import annotations

import pytest

from dskbench import cli


def test_unknown_kernel_exits_2_with_a_hint(capsys):
    assert cli.main(["run", "--device", "cpu", "--kernel", "rmsnorn", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "unknown kernel 'rmsnorn'" in err and "rmsnorm" in err


def test_cuda_requested_without_a_gpu_explains(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--device", "cuda", "--kernel", "rmsnorm", "--dry-run"])
    assert "no CUDA GPU is visible" in str(e.value) and "--device cpu" in str(e.value)


def test_no_device_falls_back_to_cpu_references(capsys):
    assert cli.main(["run", "--kernel", "rmsnorm", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "no CUDA GPU found: timing the torch reference" in err
    assert "torch-ref" in out and "sgl_kernel" not in out


def test_malformed_trace_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.md"
    bad.write_text("# Traces\n\n| Kernel | Source |\n|---|---|\n| a | b | c |\n")
    assert cli.main(["registry", "generate", "--traces", str(bad), "--out", str(tmp_path / "reg")]) == 2
    captured = capsys.readouterr()
    assert "bad.md:5" in captured.err + captured.out  # the file and the line


def test_list_shows_every_kernel(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "cutlass_scaled_fp4_mm" in out and "85 kernels" in out
