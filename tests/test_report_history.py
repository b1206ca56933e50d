"""The report's history when the points are library releases (one commit run at two versions of a
library) rather than commits."""

from __future__ import annotations

from pathlib import Path

from fake_results import COMMIT_A, make_run

from dskbench.report import write_report
from dskbench.report.model import history, machines, run_points
from dskbench.results.io import Run


def test_history_points_are_releases_where_one_commit_ran_two_library_versions(tmp_path: Path):
    """Runs of one commit at two FlashInfer releases, interleaved A, B, A, B: two points, named by the
    release; the second release's change is judged like a commit's. Where commits differ too, both are
    named; where only commits differ, only the commit."""

    def at(run_id: str, created: str, fi: str, second: bool, commit: str = COMMIT_A) -> Run:
        run = make_run(run_id, "h200", commit, created, second=second, seed=1)
        run.environment["versions"] = {**run.environment.get("versions", {}), "flashinfer-python": fi}
        return run

    runs = [
        at("a1", "2026-01-10T10:00:00+00:00", "0.6.14", False),
        at("b1", "2026-01-10T10:05:00+00:00", "0.7.2.post1", True),
        at("a2", "2026-01-10T10:10:00+00:00", "0.6.14", False),
        at("b2", "2026-01-10T10:15:00+00:00", "0.7.2.post1", True),
    ]
    (h200,) = [m for m in machines(runs) if m.name == "NVIDIA H200"]
    h = history(h200, "silu_and_mul")
    assert [c[1] for c in h.commits] == ["flashinfer-python 0.6.14", "flashinfer-python 0.7.2.post1"]
    verdicts = {(case, b): v for case, b, v, *_ in h.changes()}
    assert verdicts[("silu_and_mul/mlp.act_fn/decode/T=1", "flashinfer")] == "faster"
    other = at("c1", "2026-01-11T10:00:00+00:00", "0.7.2.post1", True, commit="c" * 40)
    labels = [label for _, label in run_points([runs[0], other])]
    assert labels == [
        f"{COMMIT_A[:8]} · flashinfer-python 0.6.14",
        "cccccccc · flashinfer-python 0.7.2.post1",
    ]
    assert [label for _, label in run_points([runs[1], other])] == [COMMIT_A[:8], "cccccccc"]
    md = write_report(runs, tmp_path, categories={})[1].read_text()
    assert "Runs (oldest first): flashinfer-python 0.6.14 → flashinfer-python 0.7.2.post1 → " in md
    assert "Changed at flashinfer-python 0.7.2.post1: " in md


def test_a_history_step_between_two_timers_is_judged_as_compare_judges_it(tmp_path: Path):
    """Two commits, the first timed per case and the second batched: the dashboard's change between them
    is judged on kernel times with the timers' floor, as `dskbench compare` judges such sides. A raw time
    holding a different launch gap is no change; 0.25 us more on a 1 us kernel is within what two timers
    can tell apart (`~slower`); 0.5 us more on a 2 us kernel is `slower`."""
    import random

    from fake_results import DEVICES

    from dskbench.results.io import ResultsWriter, environment_record, read_runs, result_record

    cases = {
        "rmsnorm/input_layernorm/decode/T=1": ((1.0, 0.6), (1.25, 0.35)),
        "rmsnorm/input_layernorm/decode/T=16": ((2.0, 0.35), (2.5, 0.35)),
        "rmsnorm/input_layernorm/decode/T=64": ((3.0, 0.6), (3.0, 0.1)),
    }

    def write(path: Path, run_id: str, commit: str, side: int, batched: bool, seed: int) -> Path:
        rng = random.Random(seed)
        settings = {"device": "cuda", "mode": "cold", "flush": "write", "seed": 7, "batch": batched}
        env = environment_record(
            run_id, created=f"2026-11-2{seed}T00:00:00+00:00", device=dict(DEVICES["h200"]), versions={},
            git={"commit": commit, "dirty": False}, settings=settings,
        )  # fmt: skip
        with ResultsWriter(path) as w:
            w.write(env)
            for case_id, sides in cases.items():
                value, gap = sides[side]
                samples = sorted(value * (1 + rng.uniform(-0.01, 0.01)) for _ in range(200))
                timing = {
                    "median_us": samples[100], "p10_us": samples[20], "p90_us": samples[180],
                    "samples_us": samples, "n_samples": 200, "mode": "cold", "launch_gap_us": gap,
                    "method": "cupti-graph" if batched else "cuda-graph", "raw_median_us": samples[100] + gap,
                }  # fmt: skip
                w.write(
                    result_record(run_id, "ok", kernel="rmsnorm", case_id=case_id,
                                  backend={"name": "sgl_kernel"}, seed=7, timing=timing)
                )  # fmt: skip
        return path

    old = write(tmp_path / "old.jsonl", "o", "a" * 40, 0, False, 1)
    new = write(tmp_path / "new.jsonl", "n", "b" * 40, 1, True, 2)
    (h200,) = machines(read_runs([old, new]))
    verdicts = {case.split("/")[-1]: v for case, _, v, *_ in history(h200, "rmsnorm").changes()}
    assert verdicts == {"T=1": "~slower", "T=16": "slower"}  # T=64: the same kernel time, no change
    same_timer = write(tmp_path / "same.jsonl", "s", "b" * 40, 1, False, 3)
    (h200,) = machines(read_runs([old, same_timer]))
    verdicts = {case.split("/")[-1]: v for case, _, v, *_ in history(h200, "rmsnorm").changes()}
    assert verdicts == {"T=16": "slower", "T=64": "faster"}  # one timer: raw times, 1.6 = 1.6, 3.6 -> 3.1
