"""pdl_gap_probe.py and moe_align_probe.py on a machine without a GPU: their cases are cases of the shapes
file, what they print is read right, and without a GPU each says so in one line."""

from __future__ import annotations

import types

import pytest

from tests.evidence_support import assert_cases_exist, load_script


def test_pdl_gap_probe_cases_are_cases_of_the_shapes_file():
    assert_cases_exist(load_script("pdl_gap_probe").CASES)


def test_pdl_gap_probe_line_shows_the_gap_and_its_note_or_why_a_timer_did_not_time():
    probe = load_script("pdl_gap_probe")
    per_case = types.SimpleNamespace(
        median_us=2.51,
        raw_median_us=2.51,
        launch_gap_us=0.0,
        notes=["x", "launched while ... programmatic ..."],
    )
    batched = types.SimpleNamespace(median_us=2.70)
    got = probe.line("rmsnorm/input_layernorm/decode/T=1", "sgl_kernel", per_case, batched)
    assert "per-case    2.51 raw    2.51 gap 0.000 | batched    2.70 | launched while" in got
    assert probe.line("c", "b", "graph capture failed: X", batched).endswith("graph capture failed: X")


def test_moe_align_probe_reads_the_last_replays_kernels_from_the_activity_lines():
    probe = load_script("moe_align_probe")
    lines = [
        "   flush    27.87 us",
        "       0.29 +   27.04 us  void moe_align_block_size_kernel<int>(int const*, int*)",
        "      28.00 +   18.66 us  void count_and_sort_expert_tokens_kernel<int>(int const*)",
        "   flush    27.94 us",
        "       0.26 +   26.75 us  void moe_align_block_size_kernel<int>(int const*, int*)",
        "      27.49 +   10.66 us  void count_and_sort_expert_tokens_kernel<int>(int const*)",
    ]
    assert probe.kernel_durations(lines) == "moe_align_block_size_ker 26.75, count_and_sort_expert_to 10.66"


@pytest.mark.parametrize("name", ["pdl_gap_probe", "moe_align_probe"])
def test_each_probe_needs_a_gpu_and_says_so_in_one_line(name, capsys, monkeypatch):
    if __import__("torch").cuda.is_available():
        pytest.skip("checks the message a machine without a GPU gets")
    probe = load_script(name)
    monkeypatch.setattr("sys.argv", [f"{name}.py"])
    assert probe.main() == 2
    assert capsys.readouterr().err.strip() == f"{name}.py: needs a CUDA GPU"
