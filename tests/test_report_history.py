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
