"""Two sides timed by different timers meet on kernel times: a raw time holds more than the kernel, what
it holds differs between the timers, and each timer's launch gap is calibrated for its own."""

from __future__ import annotations

import random

from fake_results import DEVICES

from dskbench.analysis.compare import compare
from dskbench.analysis.compare_inputs import load_side
from dskbench.results.io import ResultsWriter, environment_record, result_record

CASES = ("rmsnorm/input_layernorm/decode/T=1", "rmsnorm/input_layernorm/decode/T=16")


def _write(path, run_id, batched, values, seed):
    """One H200 run of rmsnorm's two cases: `values` maps case -> (kernel time, gap subtracted or None)."""
    rng = random.Random(seed)
    settings = {"device": "cuda", "mode": "cold", "flush": "write", "seed": 7, "batch": batched}
    env = environment_record(
        run_id, created=f"2026-11-28T0{seed}:00:00+00:00", device=dict(DEVICES["h200"]), versions={},
        git={"commit": "c" * 40, "dirty": False}, settings=settings,
    )  # fmt: skip
    with ResultsWriter(path) as w:
        w.write(env)
        for case_id, (value, gap) in values.items():
            samples = sorted(value * (1 + rng.uniform(-0.01, 0.01)) for _ in range(200))
            timing = {
                "median_us": samples[100], "p10_us": samples[20], "p90_us": samples[180],
                "samples_us": samples, "n_samples": 200, "method": "cupti-graph" if batched else "cuda-graph",
                "mode": "cold", "launch_gap_us": gap, "raw_median_us": None if gap is None else samples[100] + gap,
            }  # fmt: skip
            w.write(
                result_record(run_id, "ok", kernel="rmsnorm", case_id=case_id, backend={"name": "sgl_kernel"},
                              seed=7, timing=timing)
            )  # fmt: skip
    return path


def test_sides_of_two_timers_are_compared_on_kernel_times(tmp_path):
    # case 0: the per-case side subtracted no gap (none calibrated); case 1: both subtracted their own
    per_case = {CASES[0]: (2.0, None), CASES[1]: (3.0, 0.36)}
    batched = {CASES[0]: (2.0, 0.6), CASES[1]: (3.0, 0.35)}
    a = _write(tmp_path / "per-case.jsonl", "p", False, per_case, 1)
    b = _write(tmp_path / "batched.jsonl", "b", True, batched, 2)
    result = compare(load_side([a]), load_side([b]))
    assert {c.key.case: c.verdict for c in result.measured} == {CASES[0]: "same", CASES[1]: "same"}
    assert all(abs(c.change) < 0.02 for c in result.measured)
    # one timer on both sides: raw times, as ever (the gap added back): 2.6 against 2.0 is slower
    c = _write(tmp_path / "batched-again.jsonl", "c", True, {CASES[0]: (2.0, 0.0), CASES[1]: (3.0, 0.35)}, 3)
    same_timer = {x.key.case: x for x in compare(load_side([b]), load_side([c])).measured}
    assert same_timer[CASES[0]].change < -0.2 and same_timer[CASES[1]].verdict == "same"


def test_across_timers_a_difference_within_their_fidelity_target_is_no_verdict(tmp_path):
    """0.25 us more at 1 us is a slowdown to one timer, but not between two timers, each held only within
    0.3 us of CUPTI below 5 us; 0.5 us more at 2 us is a slowdown either way."""
    old = {CASES[0]: (1.0, 0.35), CASES[1]: (2.0, 0.35)}
    new = {CASES[0]: (1.25, 0.35), CASES[1]: (2.5, 0.35)}
    per_case = _write(tmp_path / "per-case.jsonl", "p", False, old, 1)
    batched = _write(tmp_path / "batched.jsonl", "b", True, new, 2)
    apart = {c.key.case: c for c in compare(load_side([per_case]), load_side([batched])).measured}
    assert apart[CASES[0]].verdict == "~slower" and apart[CASES[1]].verdict == "slower"
    assert apart[CASES[0]].judged.floor.source == "timers" and "0.3 us" in apart[CASES[0]].note
    batched_old = _write(tmp_path / "batched-old.jsonl", "o", True, old, 3)
    same = {c.key.case: c for c in compare(load_side([batched_old]), load_side([batched])).measured}
    assert same[CASES[0]].verdict == "slower" and same[CASES[1]].verdict == "slower"
    assert same[CASES[0]].judged.floor.source != "timers"
