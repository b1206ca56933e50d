"""The validity rule (dskbench.measure.validity): which timings no kernel can have, on a Measurement, a
Timing and a record's timing dict alike."""

from __future__ import annotations

import math

import pytest

from dskbench.measure import Measurement
from dskbench.measure.validity import (
    MAX_CLAMPED_FRACTION,
    RAW_MEDIAN_FLOOR_US,
    clamped_count,
    problem,
    problems,
)
from dskbench.results.records import Timing


def timing(**over) -> dict:
    """A possible timing: 40 samples around 10 us, 2 clamped by a 1.5 us launch gap."""
    t = {
        "median_us": 10.0,
        "p10_us": 9.0,
        "p90_us": 11.0,
        "noise": 0.01,
        "n_samples": 40,
        "raw_median_us": 11.5,
        "launch_gap_us": 1.5,
        "clamped": 2,
        "converged": True,
        "notes": ["2 samples shorter than the launch gap (1.500 us), clamped at 0"],
    }
    return {**t, **over}


def test_a_possible_timing_has_no_problem():
    assert problems(timing()) == [] and problem(timing()) is None


def test_the_observed_shared_gpu_record_is_impossible_for_every_reason_it_has():
    """A cold measurement on a shared GPU: raw median -138 us, samples alternating 9.8 and 0 us."""
    samples = [9.8, 0.0] * 55 + [0.0]
    bad = timing(
        median_us=0.0,
        p10_us=0.0,
        p90_us=9.8,
        noise=math.inf,
        n_samples=len(samples),
        raw_median_us=-138.0,
        clamped=None,  # a file written before the count was a field: the note gives it
        notes=["56 samples shorter than the launch gap (2.100 us), clamped at 0"],
        converged=False,
    )
    found = problems(bad)
    assert [p.split()[0] for p in found] == ["median", "raw", "56", "noise"]
    why = problem(bad)
    assert why.startswith("impossible measurement: median 0 us") and "\n" not in why
    assert "raw median -138 us" in why and "56 of 111 samples" in why and "noise inf" in why


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"median_us": 0.0}, "median 0 us"),
        ({"median_us": -3.0}, "median -3 us"),
        ({"median_us": math.nan}, "median nan (not a finite number)"),
        ({"median_us": math.inf}, "median inf (not a finite number)"),
        ({"median_us": None}, "median None (not a finite number)"),
        ({"p10_us": math.nan}, "p10 nan"),
        ({"p90_us": math.inf}, "p90 inf"),
        ({"p10_us": -1.0}, "p10 -1 us"),
        ({"raw_median_us": RAW_MEDIAN_FLOOR_US - 0.01}, "raw median -0.51 us"),
        ({"clamped": int(40 * MAX_CLAMPED_FRACTION)}, "20 of 40 samples clamped at 0"),
        ({"noise": math.inf}, "noise inf over 40 samples"),
        ({"noise": math.nan, "n_samples": 3}, "noise nan over 3 samples"),
    ],
)
def test_each_impossible_value_is_named(over, says):
    why = problem(timing(**over))
    assert why is not None and says in why


@pytest.mark.parametrize(
    "over",
    [
        {"raw_median_us": RAW_MEDIAN_FLOOR_US + 0.01},  # within the event timer's resolution
        {"raw_median_us": None, "launch_gap_us": None, "clamped": None, "notes": []},  # no gap subtracted
        {"clamped": int(40 * MAX_CLAMPED_FRACTION) - 1},  # a minority clamped: the median stands
        {
            "noise": math.inf,
            "n_samples": 4,
            "clamped": 0,
        },  # too few samples for an interval: inf by definition
        {"noise": None, "p10_us": None, "p90_us": None},  # not recorded
    ],
)
def test_what_is_only_rough_or_unrecorded_is_not_impossible(over):
    assert problem(timing(**over)) is None


def test_clamped_count_reads_the_field_else_the_note():
    assert clamped_count(timing(clamped=7)) == 7
    assert clamped_count(timing(clamped=None)) == 2  # from the note
    assert clamped_count({"median_us": 1.0}) is None


def test_a_measurement_a_timing_and_a_dict_get_the_same_answer():
    d = timing(median_us=0.0, clamped=30)
    m = Measurement(
        **{k: d[k] for k in ("median_us", "p10_us", "p90_us", "noise", "n_samples", "converged")},
        mean_us=5.0,
        min_us=0.0,
        max_us=9.0,
        cv=0.9,
        launches_per_sample=4,
        wall_s=0.1,
        method="cuda-graph",
        mode="cold",
        device="cuda",
        n_sets=1,
        raw_median_us=d["raw_median_us"],
        launch_gap_us=d["launch_gap_us"],
        clamped=d["clamped"],
        notes=d["notes"],
    )
    t = Timing.from_json(d)
    assert problem(m) == problem(t) == problem(d) is not None
    assert "30 of 40 samples" in problem(m)
