"""A kernel that began during its flush (programmatic dependent launch) on one side of a comparison only
reads in another regime there: the verdict says so, read from the records' own notes."""

from __future__ import annotations

from dskbench.analysis.compare import Stat, judge
from dskbench.analysis.compare_inputs import stat_from_record
from dskbench.analysis.noise import Band, Prior
from dskbench.measure.batch_spans import EARLY_NOTE, early_starts
from dskbench.results.io import result_record

PRIOR = Prior(
    bands=(Band(0.0, float("inf"), median_floor=0.03, p10_floor=0.03, cases=100),), abs_floor_us=0.03
)


def side(value: float, early: int = 0) -> Stat:
    return Stat(
        value=value, lo=value * 0.98, hi=value * 1.02, spread="p10-p90", p10=value * 0.98, early=early
    )


def test_the_note_a_batch_writes_is_the_count_compare_reads():
    assert early_starts([EARLY_NOTE.format(n=29)]) == 29
    assert early_starts(["sampled in a batch of 48 cases (batch 1 of this worker, case 3)"]) == 0
    assert early_starts([]) == 0


def test_a_verdict_names_the_side_whose_kernel_began_during_its_flush():
    v = judge(side(46.1), side(38.1, early=29), prior=PRIOR)
    assert v.verdict == "faster" and "started during its flush in the new run only" in v.note
    v = judge(side(38.1, early=12), side(46.1), prior=PRIOR)
    assert "in the old run only" in v.note
    both = judge(side(38.1, early=12), side(46.1, early=3), prior=PRIOR)  # the same regime on both sides
    assert "during its flush" not in both.note


def test_a_record_gives_its_early_starts_to_its_side():
    timing = {"median_us": 38.1, "samples_us": [38.0, 38.2], "notes": ["x", EARLY_NOTE.format(n=7)]}
    rec = result_record(
        "r", "ok", kernel="k", case_id="k/op/decode/T=1", backend={"name": "b"}, timing=timing
    )
    assert stat_from_record(rec).early == 7
    rec["timing"]["notes"] = ["x"]
    assert stat_from_record(rec).early == 0
