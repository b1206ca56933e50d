"""dskbench compare: the rule (dskbench.analysis.verdict), the noise model (dskbench.analysis.noise), once-per-measurement
counting, several runs per side, our results and asv's, the CLI contract and bad input."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from fake_results import COMMIT_A, COMMIT_B, fake_runs, write_runs

from dskbench import paths
from dskbench.analysis.compare import Stat, compare, judge, mann_whitney_p
from dskbench.analysis.noise import (
    Band,
    PairChanges,
    Prior,
    PriorError,
    fit_prior,
    floor_for,
    load_prior,
)
from dskbench.frontends.cli import main as cli_main
from dskbench.frontends.cli.compare import cli_compare
from dskbench.results.io import Run, environment_record, result_record

REPO = paths.REPO_ROOT
H200X4 = REPO / "results" / "h200x4-2026-11-21"

# A prior of round numbers, so the rule's tests do not move when the shipped prior is refitted.
PRIOR = Prior(
    bands=(
        Band(0.0, 5.0, median_floor=0.25, p10_floor=0.08, cases=100, p10_spread_factor=0.6),
        Band(5.0, float("inf"), median_floor=0.03, p10_floor=0.03, cases=100),
    ),
    abs_floor_us=0.03,
    measured_on=("NVIDIA H200",),
)


def ok(value: float, p10: float | None = None, p90: float | None = None, **kw) -> Stat:
    """A measured side: median, p10 (default 2% below), p90 (2% above)."""
    p10 = value * 0.98 if p10 is None else p10
    p90 = value * 1.02 if p90 is None else p90
    return Stat(value=value, lo=p10, hi=p90, spread="p10-p90", p10=p10, p90=p90, **kw)


def samples(center: float, n: int = 60, width: float = 0.02, seed: int = 0) -> tuple[float, ...]:
    rng = random.Random(seed)
    return tuple(center * (1 + rng.uniform(-width, width)) for _ in range(n))


# -- the rule ----------------------------------------------------------------------------------------------


def test_slower_needs_the_threshold_and_the_noise_floor():
    v = judge(ok(10.0), ok(12.0), prior=PRIOR)  # +20%: beyond the 3% floor of its band
    assert v.verdict == "slower" and v.change == pytest.approx(0.2) and v.shift == pytest.approx(0.2)
    assert v.statistic == "p10" and v.floor.source == "band prior" and v.floor.rel == pytest.approx(0.03)
    assert v.interval == pytest.approx((0.17, 0.23))
    assert judge(ok(10.0), ok(10.3), prior=PRIOR).verdict == "same"  # under the 5% threshold
    verdict = judge(ok(10.0), ok(12.0), threshold=0.25, prior=PRIOR)
    assert verdict.verdict == "same" and verdict.change == pytest.approx(0.2)
    assert judge(ok(10.0), ok(8.0), prior=PRIOR).verdict == "faster"


def test_a_small_kernels_median_flip_is_not_a_regression():
    """Below 5 us the median jumps between two modes from run to run while the p10 stays: +20% of the
    median with the p10 unmoved is inside the noise; the same +20% moving the p10 too is a slowdown."""
    flip = judge(ok(2.3, p10=2.1), ok(2.76, p10=2.12), prior=PRIOR)
    assert flip.verdict == "~slower" and "inside the noise floor" in flip.note
    assert flip.shift == pytest.approx(0.02 / 2.1)  # the p10 moved 0.02 us, relative to the old p10
    real = judge(ok(2.3, p10=2.1), ok(2.76, p10=2.52), prior=PRIOR)
    assert real.verdict == "slower" and real.floor.rel == pytest.approx(0.08)


def test_the_rank_test_is_a_second_condition_not_the_only_one():
    # beyond the floor, but the samples do not separate: ~slower
    same_samples = samples(10.0, seed=1)
    v = judge(ok(10.0, samples=same_samples), ok(12.0, samples=samples(10.0, seed=2)), prior=PRIOR)
    assert v.verdict == "~slower" and "U test p=" in v.note and v.p > 0.001
    # samples far apart, but the median change is inside a wide floor: still ~slower
    wide = Prior((Band(0.0, float("inf"), 0.5, 0.5, 100),), 0.03)
    v = judge(ok(10.0, samples=samples(10.0)), ok(12.0, samples=samples(12.0)), prior=wide)
    assert v.verdict == "~slower" and v.p < 1e-10
    v = judge(ok(10.0, samples=samples(10.0)), ok(12.0, samples=samples(12.0)), prior=PRIOR)
    assert v.verdict == "slower" and v.p < 1e-10


def test_a_launch_gap_calibration_difference_is_not_a_change():
    """Each run subtracts its own calibrated gap; the same raw time with gaps 0.30 vs 0.20 us is the
    same kernel, not +5%."""
    old, new = ok(2.0, p10=1.9, gap_us=0.30), ok(2.1, p10=2.0, gap_us=0.20)
    v = judge(old, new, threshold=0.0, prior=PRIOR)
    assert v.change == pytest.approx(0.0) and v.shift == pytest.approx(0.0)
    assert judge(ok(2.0, gap_us=0.3), ok(2.6, gap_us=0.3), prior=PRIOR).change == pytest.approx(0.3)


def test_floor_sources_band_prior_spread_absolute_and_history():
    f = floor_for(2.0, "p10", PRIOR)
    assert (f.rel, f.source) == (pytest.approx(0.08), "band prior") and "0-5 us" in f.detail
    wide = floor_for(2.0, "p10", PRIOR, spread=0.2)  # 0.6 x a 20% half-spread beats the band's 8%
    assert wide.rel == pytest.approx(0.12) and "within-run half-spread 20.0%" in wide.detail
    tiny = floor_for(0.5, "p10", PRIOR)  # 0.03 us of 0.5 us = 6%: under the band's 8%
    assert tiny.source == "band prior"
    assert floor_for(0.2, "p10", PRIOR).source == "absolute"  # 0.03/0.2 = 15% > 8%
    assert floor_for(None, "median", PRIOR).rel == pytest.approx(0.25)  # not a time: the widest band
    # history: the case's own run-to-run steps, blended with the prior (weight 2 runs)
    steady = floor_for(2.0, "p10", PRIOR, history=[[2.0, 2.001, 2.0, 2.001, 2.0, 2.001]])
    assert steady.source == "history" and steady.rel < 0.08
    few = floor_for(2.0, "p10", PRIOR, history=[[2.0, 2.001]])  # one step: the prior still outweighs it
    assert few.source == "band prior" and steady.rel < few.rel < 0.08
    noisy = floor_for(2.0, "p10", PRIOR, history=[[2.0, 2.4, 2.0, 2.4, 2.0]])
    assert noisy.source == "history" and noisy.rel > 0.08
    # a step in the history (a real change at some commit) counts once, not as spread of every run
    step = floor_for(2.0, "p10", PRIOR, history=[[2.0] * 6 + [2.4] * 6])
    spread = floor_for(2.0, "p10", PRIOR, history=[[2.0, 2.4] * 6])
    assert step.rel < spread.rel


def test_history_given_to_judge_sets_the_floor():
    old, new = ok(20.0), ok(21.6)  # +8% in a band whose prior floor is 3%
    assert judge(old, new, prior=PRIOR).verdict == "slower"
    noisy = [ok(v) for v in (20.0, 22.0, 19.0, 22.5, 20.5, 18.5)]
    v = judge(old, new, prior=PRIOR, history=noisy)
    assert v.verdict == "~slower" and v.floor.source == "history"


def test_mann_whitney_matches_scipy():
    # scipy.stats.mannwhitneyu(..., alternative="two-sided", method="asymptotic") gives these p-values
    assert mann_whitney_p([1, 2, 3], [4, 5, 6]) == pytest.approx(0.08085559837005224, rel=1e-9)
    assert mann_whitney_p([1, 2, 2, 3, 5], [2, 4, 5, 6, 7, 7]) == pytest.approx(0.06414661873440437, rel=1e-9)
    assert mann_whitney_p([1.0] * 10, [1.0] * 10) == 1.0


def test_status_changes():
    err = Stat(status="error", reason="illegal memory access")
    wrong = Stat(status="wrong", reason="relative error 0.3")
    skip = Stat(status="skipped", reason="needs sm100")
    assert judge(ok(1.0), wrong).verdict == "broke"
    assert judge(ok(1.0), err).verdict == "broke" and judge(ok(1.0), err).is_regression
    assert judge(err, ok(1.0)).verdict == "fixed"
    assert judge(wrong, err).verdict == "still failing"
    assert judge(ok(1.0), skip).verdict == "now skipped"
    assert judge(skip, skip).verdict == "skipped"
    assert judge(skip, err).verdict == "now failing"
    assert judge(skip, ok(1.0)).verdict == "now measured"
    assert not any(judge(skip, x).is_regression for x in (err, wrong, ok(1.0)))
    assert judge(None, ok(1.0)).verdict == "added"
    assert judge(ok(1.0), None).verdict == "missing"


def test_higher_is_better_units_are_judged_on_medians_against_the_widest_band():
    gbps = Stat(value=100.0, unit="GB/s", higher_is_better=True)
    v = judge(gbps, Stat(value=60.0, unit="GB/s", higher_is_better=True), prior=PRIOR)
    assert v.verdict == "slower" and v.statistic == "median" and v.floor.rel == pytest.approx(0.25)
    assert judge(gbps, Stat(value=140.0, unit="GB/s", higher_is_better=True), prior=PRIOR).verdict == "faster"
    assert judge(gbps, Stat(value=80.0, unit="GB/s", higher_is_better=True), prior=PRIOR).verdict == "~slower"


# -- the prior ---------------------------------------------------------------------------------------------


def test_fit_prior_takes_band_quantiles_inherits_thin_bands_and_measures_the_spread_factor():
    pc = PairChanges("synthetic")
    # 0-2 us: 100 cases moving 0..9.9% (p10), spread 10%; the widest also spread 20%
    for i in range(100):
        pc.rows.append((1.5, 0.3 * i / 100, 0.1 * i / 100, 0.2 if i >= 90 else 0.05))
    # 10-20 us: 50 cases moving up to 1%, spread 0.5% (none as wide as the floor: no spread factor)
    for i in range(50):
        pc.rows.append((15.0, 0.01 * i / 50, 0.01 * i / 50, 0.005))
    pc.rows.append((500.0, 0.5, 0.5, 0.01))  # one case in 100-1000 us: too few to fit
    pc.launches = [16] * 151
    doc = fit_prior([pc], quantile=1.0)
    bands = {(b["lo_us"], b["hi_us"]): b for b in doc["bands"]}
    small, mid, big = bands[(0.0, 2.0)], bands[(10.0, 20.0)], bands[(100.0, 1000.0)]
    assert small["p10_floor"] == pytest.approx(0.099) and small["median_floor"] == pytest.approx(0.297)
    assert small["p10_spread_factor"] == pytest.approx(0.099 / 0.2, rel=1e-3)  # only the 20% ones are wide
    assert mid["p10_floor"] == pytest.approx(0.0098) and mid["p10_spread_factor"] == 0.0
    assert big["cases"] == 1 and big["from_band"] == "10-20 us" and big["p10_floor"] == mid["p10_floor"]
    assert doc["abs_floor_us"] == pytest.approx(0.5 / 16)
    with pytest.raises(PriorError, match="nothing to fit"):
        fit_prior([PairChanges("empty")])


def test_shipped_prior_is_what_dskbench_noise_prior_writes(tmp_path: Path):
    """dskbench/analysis/noise_prior.json is data derived from the committed pairs, not hand-typed numbers."""
    from dskbench.frontends.cli import main

    out = tmp_path / "prior.json"
    assert main(["noise-prior", "--out", str(out)]) == 0
    fresh, shipped = (
        json.loads(out.read_text()),
        json.loads((REPO / "dskbench" / "analysis" / "noise_prior.json").read_text()),
    )
    assert fresh["bands"] == shipped["bands"] and fresh["pairs"] == shipped["pairs"]
    assert load_prior().bands[0].median_floor == shipped["bands"][0]["median_floor"]


def test_asv_regression_threshold_follows_the_prior():
    """asv's Regressions page judges medians with one threshold: it must clear the widest median floor
    of the prior, and not by more than 5 points."""
    from asv import util

    conf = util.load_json(str(REPO / "asv.conf.json"), js_comments=True)
    threshold = conf["regressions_thresholds"][r".*\.track_latency.*"]
    widest = max(b.median_floor for b in load_prior().bands)
    assert widest <= threshold < widest + 0.05


def test_bad_prior_files_are_one_line_errors(tmp_path: Path, capsys):
    bad = tmp_path / "prior.json"
    bad.write_text("{}")
    with pytest.raises(PriorError, match="not a noise prior"):
        load_prior(bad)
    bad.write_text("nope")
    with pytest.raises(PriorError, match="not JSON"):
        load_prior(bad)
    r1, r2, *_ = fake_runs()
    old, new = write_runs([r1], tmp_path / "old.jsonl"), write_runs([r2], tmp_path / "new.jsonl")
    assert cli_compare([old], [new], prior_path=bad) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dskbench compare: ") and "prior.json" in err[0]


# -- our results: twins, several runs, settings ----------------------------------------------------------


def env(
    run_id: str,
    commit: str = COMMIT_A,
    created: str = "2026-01-01T00:00:00+00:00",
    gpu: str = "NVIDIA H200",
    **settings,
):
    return environment_record(
        run_id,
        created=created,
        device={"kind": "cuda", "name": gpu},
        versions={},
        git={"commit": commit},
        settings={"mode": "cold", "flush": "write", "seed": 7, **settings},
    )


def rec(
    run_id: str, case: str, median: float, p10: float | None = None, gap: float = 0.3, seed: int = 0, **extra
):
    kernel = case.split("/")[0]
    xs = sorted(samples(median, n=40, width=0.01, seed=seed))
    p10 = median * 0.99 if p10 is None else p10
    timing = {
        "median_us": median,
        "p10_us": p10,
        "p90_us": median * 1.01,
        "samples_us": xs,
        "raw_median_us": median + gap,
        "launch_gap_us": gap,
    }
    return result_record(
        run_id, "ok", kernel=kernel, case_id=case, backend={"name": "b"}, timing=timing, **extra
    )


def run(run_id: str, values: dict[str, float], twins: dict[str, str] | None = None, **env_kw) -> Run:
    recs = [rec(run_id, c, v, seed=i) for i, (c, v) in enumerate(values.items())]
    for twin, primary in (twins or {}).items():
        src = next(r for r in recs if r["case_id"] == primary)
        recs.append({**src, "case_id": twin, "shared_with": primary})
    return Run(env(run_id, **env_kw), recs)


def test_a_twin_is_not_a_second_regression():
    cases = {"k/op_a/decode/T=1": 10.0, "k/op_c/decode/T=1": 20.0}
    twins = {"k/op_b/decode/T=1": "k/op_a/decode/T=1"}
    old = run("o", cases, twins)
    new = run("n", {**cases, "k/op_a/decode/T=1": 13.0}, twins)
    c = compare([old], [new], prior=PRIOR)
    assert [ch.key.case for ch in c.regressions] == ["k/op_a/decode/T=1"]
    twin = next(ch for ch in c.changes if ch.key.case == "k/op_b/decode/T=1")
    assert twin.verdict == "slower" and not twin.is_regression and twin.twin_of.case == "k/op_a/decode/T=1"
    assert len(c.measured) == 2 and c.counts()["slower"] == 1
    assert "(1 twin rows not counted again)" in c.summary()
    assert c.by_kernel() == ["  k: 1 slower (of 2 measured, 1 twins)"]
    assert "op_b" not in c.format_table() and "twin of op_a/decode/T=1" in c.format_table(verbose=True)


def test_a_cross_kernel_twin_stays_its_own_kernels_case_and_is_not_counted_again():
    cases = {"k/op/decode/T=1": 10.0, "k/op/decode/T=2": 20.0}

    def side(run_id: str, values: dict[str, float]) -> Run:
        r = run(run_id, values)
        src = next(x for x in r.results if x["case_id"] == "k/op/decode/T=1")
        copy = {**src, "kernel": "k2", "case_id": "k2/op/decode/T=1", "shared_with": src["case_id"]}
        return Run(r.environment, [*r.results, copy])

    c = compare([side("o", cases)], [side("n", {**cases, "k/op/decode/T=1": 13.0})], prior=PRIOR)
    copy = next(ch for ch in c.changes if ch.key.case == "k2/op/decode/T=1")
    assert copy.key.kernel == "k2" and copy.verdict == "slower"  # shown under its own kernel, not lost
    assert (copy.twin_of.kernel, copy.twin_of.case) == ("k", "k/op/decode/T=1") and not copy.is_regression
    assert [ch.key.case for ch in c.regressions] == ["k/op/decode/T=1"]  # one measurement, one change
    assert len(c.measured) == 2 and "(1 twin rows not counted again)" in c.summary()


def test_several_runs_per_side_use_run_level_medians_and_their_own_spread():
    case = "k/op/decode/T=1"
    olds = [
        run(f"o{i}", {case: v}, created=f"2026-01-01T0{i}:00:00+00:00")
        for i, v in enumerate((20.0, 20.1, 19.9))
    ]
    news = [
        run(f"n{i}", {case: v}, created=f"2026-01-02T0{i}:00:00+00:00")
        for i, v in enumerate((21.7, 21.6, 30.0))
    ]
    c = compare(olds, news, prior=PRIOR)
    ch = c.changes[0]
    assert ch.new.value == pytest.approx(21.7) and ch.new.n_runs == 3  # the 30 us run does not decide
    assert ch.judged.floor.source == "history" and "run-to-run steps" in ch.judged.floor.detail
    assert ch.change == pytest.approx(0.085)
    # one run per side: the band prior
    one = compare(olds[:1], news[:1], prior=PRIOR).changes[0]
    assert one.judged.floor.source == "band prior" and one.verdict == "slower"


def test_within_a_side_the_latest_commit_wins():
    case = "k/op/decode/T=1"
    older = run("a", {case: 10.0}, commit=COMMIT_A, created="2026-01-01T00:00:00+00:00")
    newer = run("b", {case: 14.0}, commit=COMMIT_B, created="2026-01-02T00:00:00+00:00")
    stats = compare([older, newer], [older], prior=PRIOR).changes[0]
    assert stats.old.value == 14.0 and stats.old.n_runs == 1


def test_cli_two_runs_a_side_settings_notes_and_history(tmp_path: Path, capsys):
    case = "k/op/decode/T=1"
    files = []
    for i, v in enumerate((20.0, 20.1, 26.0, 26.2)):
        r = run(
            f"r{i}", {case: v}, created=f"2026-01-0{i + 1}T00:00:00+00:00", flush="write" if i < 2 else "read"
        )
        files.append(str(write_runs([r], tmp_path / f"r{i}.jsonl")))
    assert cli_main(["compare", files[0], files[1], "--", files[2], files[3], "--no-fail"]) == 0
    out = capsys.readouterr().out
    assert "old: 2 runs on NVIDIA H200" in out and "new: 2 runs on NVIDIA H200" in out
    assert "different settings (flush write vs read)" in out
    assert "the band prior was measured with flush write, these runs used flush read" in out
    assert "2 old and 2 new runs: verdicts use run-level medians" in out
    assert re.search(r"k\s+op/decode/T=1\s+b\s+20\.\d+ .*\(2 runs\)", out)
    assert cli_main(["compare", files[0], files[1], "--", files[2], files[3]]) == 1
    capsys.readouterr()
    # one run per side: the band prior, said so; --history brings the case's own floor
    assert cli_main(["compare", files[0], files[1], "--no-fail"]) == 0
    assert "one run per side, so each case's floor is the band prior" in capsys.readouterr().out
    assert cli_main(["compare", files[0], files[1], "--history", files[0], "--no-fail"]) == 0
    assert "--history runs" in capsys.readouterr().out


def test_cli_bad_input_is_one_line(tmp_path: Path, capsys):
    r1, r2, r3, _ = fake_runs()
    old, new = write_runs([r1], tmp_path / "old.jsonl"), write_runs([r2], tmp_path / "new.jsonl")
    b200 = write_runs([r3], tmp_path / "b200.jsonl")
    cases = [
        (["compare", str(old)], "give OLD NEW"),
        (["compare", str(old), str(new), str(new)], "give OLD NEW"),
        (["compare", "--", str(new)], "no old results before --"),
        (["compare", str(old), str(b200)], "different machines (old: NVIDIA H200; new: NVIDIA B200)"),
        (["compare", str(tmp_path / "nope.jsonl"), str(new)], "no such file or folder"),
        (["compare", str(old), str(new), "--threshold", "50"], "is not a fraction"),
    ]
    for argv, msg in cases:
        assert cli_main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("dskbench") and msg in err[0], err
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n{}\n")
    assert cli_compare([garbage], [new]) == 2


def test_compare_fake_scenario_and_exit_codes(tmp_path: Path, capsys):
    r1, r2, *_ = fake_runs()
    c = compare([r1], [r2])
    by = {}
    for ch in c.changes:
        by.setdefault((ch.key.kernel, ch.key.backend), set()).add(ch.verdict)
    assert by[("rmsnorm", "sgl_kernel")] == {"slower"}  # +25% at ~2-8 us: beyond every floor
    assert by[("silu_and_mul", "flashinfer")] == {"faster"}
    assert by[("silu_and_mul", "sglang_jit")] == {"broke"}
    assert by[("cutlass_scaled_fp4_mm", "sgl_kernel")] == {"skipped"}
    old, new = write_runs([r1], tmp_path / "old.jsonl"), write_runs([r2], tmp_path / "new.jsonl")
    assert cli_compare([old], [new]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("old: 1 run on NVIDIA H200")
    assert "-- rmsnorm on NVIDIA H200" in lines and "by kernel (each measurement once):" in lines
    header = next(line for line in lines if line.startswith("kernel"))
    assert header.split() == [
        "kernel",
        "case",
        "backend",
        "old",
        "new",
        "change",
        "shift",
        "±floor",
        "verdict",
    ]
    assert cli_compare([old], [new], fail_on_regression=False) == 0
    assert cli_compare([old], [old]) == 0
    assert cli_compare([new], [old]) == 1  # the improvement reversed is a regression
    assert cli_compare([old], [new], 0.5) == 1  # status changes fail whatever the threshold


def test_unchanged_h200_sweeps_give_no_regression(capsys):
    """The target on the committed pair: two identical full sweeps, 0 regressions, exit 0."""
    a, b = H200X4 / "sweep-a.jsonl.gz", H200X4 / "sweep-b.jsonl.gz"
    assert cli_compare([a], [b]) == 0
    out = capsys.readouterr().out
    summary = out.strip().splitlines()[-1]
    assert "724 twin rows not counted again" in summary and " slower" not in summary.replace("~slower", "")


# -- a device the prior was not measured on ---------------------------------------------------------------


def test_a_prior_covers_only_the_device_it_was_measured_on():
    assert PRIOR.covers("NVIDIA H200") and PRIOR.covers("H200") and PRIOR.covers("nvidia  h200")
    assert not PRIOR.covers("CPU vm") and not PRIOR.covers("NVIDIA H100 80GB HBM3")
    assert Prior(PRIOR.bands, 0.03).covers("CPU vm")  # a prior naming no device: the caller's choice


def test_without_a_prior_of_its_own_a_case_needs_its_own_history():
    assert floor_for(2.0, "p10", PRIOR, own_prior=False) is None  # one run per side: no floor at all
    own = floor_for(20.0, "p10", PRIOR, history=[[20.0, 20.2], [20.0, 20.2]], own_prior=False)
    assert own.source == "history" and "no band prior" in own.detail
    assert own.rel == pytest.approx(3.29 * 0.01 / 2**0.5 * 2**0.5)  # steps of 1%, one run a side
    v = judge(ok(10.0), ok(13.0), prior=PRIOR, own_prior=False)
    assert v.verdict == "not judged" and not v.is_regression and v.floor is None
    assert "one run per side" in v.note and v.change == pytest.approx(0.3)
    assert judge(ok(10.0), ok(10.2), prior=PRIOR, own_prior=False).verdict == "same"  # inside the threshold
    assert judge(ok(10.0), Stat(status="error", reason="boom"), own_prior=False).verdict == "broke"


def test_cli_two_unchanged_cpu_runs_call_no_regression_from_a_gpu_prior(tmp_path: Path, capsys):
    """CPU reference timings move by tens of percent between runs; the shipped H200 prior says nothing
    about that: one run per side, every change beyond the threshold is 'not judged', exit 0."""
    cases = {f"k/op/decode/T={t}": 100.0 * t for t in (1, 2, 4, 8)}
    moved = {c: v * (1.3 if i % 2 else 0.8) for i, (c, v) in enumerate(cases.items())}
    old = write_runs([run("o", cases, gpu="CPU vm")], tmp_path / "old.jsonl")
    new = write_runs([run("n", moved, gpu="CPU vm")], tmp_path / "new.jsonl")
    assert cli_main(["compare", str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "noise floors on CPU vm: the band prior was measured on NVIDIA H200, not on this device" in out
    assert "give two or more runs per side (OLD1 OLD2 -- NEW1 NEW2) or --history" in out
    assert "one run per side, so each case's floor is the band prior" not in out
    assert out.strip().splitlines()[-1].endswith("4 not judged")
    assert " slower" not in out and " faster" not in out
    # two runs a side: each case's own spread decides, and a real slowdown is called
    more = [
        write_runs([run(f"r{i}", vals, gpu="CPU vm", created=f"2026-01-0{i + 1}T00:00:00+00:00")], tmp_path / f"r{i}.jsonl")
        for i, vals in enumerate((cases, {c: v * 1.01 for c, v in cases.items()}, {**cases, "k/op/decode/T=1": 150.0},
                                  {**{c: v * 1.01 for c, v in cases.items()}, "k/op/decode/T=1": 151.5}))
    ]  # fmt: skip
    assert cli_main(["compare", str(more[0]), str(more[1]), "--", str(more[2]), str(more[3])]) == 1
    out = capsys.readouterr().out
    assert "each case's floor is its own run-to-run spread" in out
    assert re.search(r"op/decode/T=1\s+b\s.*slower", out) and "1 slower" in out.splitlines()[-1]
