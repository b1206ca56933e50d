"""`dskbench asv-history`: runs at two releases of a library become an asv history of two points, which
asv publishes; bad input is a one-line error that leaves the folder alone."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dskbench.frontends.cli import main
from dskbench.results.io import ResultsWriter, environment_record, result_record

CASES = {
    "silu_and_mul/act_fn/decode/T=1,tp=1": (3.6, 5.9),
    "silu_and_mul/act_fn/prefill/T=2048,tp=1": (60.0, 40.0),
}


def _run(path: Path, run_id: str, fi: str, created: str, side: int) -> Path:
    with ResultsWriter(path) as w:
        env = environment_record(
            run_id,
            created=created,
            device={"name": "NVIDIA H200", "kind": "cuda", "count": 1},
            versions={"flashinfer-python": fi, "python": "3.12.3"},
        )
        env["host"] = "box"
        w.write(env)
        for case, us in CASES.items():
            t = us[side]
            timing = {"median_us": t, "samples_us": [t * 0.99, t, t * 1.01]}
            w.write(
                result_record(
                    run_id,
                    "ok",
                    kernel="silu_and_mul",
                    case_id=case,
                    backend={"name": "flashinfer"},
                    timing=timing,
                )
            )
        w.write(
            result_record(
                run_id, "skipped", kernel="silu_and_mul", case_id="x", backend={"name": "b"}, reason="r"
            )
        )
    return path


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    d = tmp_path / "runs"
    _run(d / "B-1.jsonl", "b1", "0.7.2.post1", "2026-11-27T10:05:00+00:00", 1)
    _run(d / "A-1.jsonl", "a1", "0.6.14", "2026-11-27T10:00:00+00:00", 0)
    _run(d / "A-2.jsonl", "a2", "0.6.14", "2026-11-27T10:10:00+00:00", 0)
    return d


def test_two_releases_make_two_points_oldest_first_and_asv_publishes_them(runs, tmp_path, capsys):
    pytest.importorskip("asv")
    out = tmp_path / "hist"
    assert main(["asv-history", str(runs), "--by", "flashinfer-python", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert (
        "flashinfer-python 0.6.14: 2 run(s), 4 ok results" in said and "0.7.2.post1: 1 run(s), 2 ok" in said
    )
    log = subprocess.run(
        ["git", "-C", str(out / "repo"), "log", "--format=%s", "main"], capture_output=True, text=True
    )
    assert log.stdout.split("\n")[:2] == ["flashinfer-python 0.7.2.post1", "flashinfer-python 0.6.14"]
    bench = json.loads((out / "results" / "benchmarks.json").read_text())
    b = bench["bench_kernels.silu_and_mul.track_latency"]
    assert b["params"] == [[repr(c + "|flashinfer") for c in sorted(CASES)]] and b["unit"] == "seconds"
    (old,) = [
        p
        for p in (out / "results" / "nvidia-h200_box").glob("*.json")
        if p.name != "machine.json"
        and json.loads(p.read_text())["requirements"] == {"flashinfer-python": "0.6.14"}
    ]
    values = json.loads(old.read_text())["results"]["bench_kernels.silu_and_mul.track_latency"][0]
    assert values == pytest.approx([3.6e-6, 60e-6])  # the median of both runs' pooled samples, in seconds
    index = json.loads((out / "html" / "index.json").read_text())
    assert index["tags"] == {"0.6.14": 0, "0.7.2.post1": 1}
    assert "bench_kernels.silu_and_mul.track_latency" in index["benchmarks"]
    assert "https://" not in (out / "html" / "index.html").read_text().split("<body")[0]  # offline
    # writing again into its own folder replaces it
    assert (
        main(
            [
                "asv-history",
                str(runs / "A-1.jsonl"),
                "--by",
                "flashinfer-python",
                "--out",
                str(out),
                "--no-publish",
            ]
        )
        == 0
    )
    assert not (out / "html").exists()


def test_bad_input_is_one_line_and_leaves_other_folders_alone(runs, tmp_path, capsys):
    pytest.importorskip("asv")
    out = tmp_path / "hist"
    assert main(["asv-history", str(runs), "--by", "sglang", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "records no version of 'sglang'" in err and len(err.strip().splitlines()) == 1
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert main(["asv-history", str(runs), "--by", "flashinfer-python", "--out", str(mine)]) == 2
    assert "a folder with other files in it" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_without_asv_it_says_so_in_one_line(runs, tmp_path, capsys, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_asv(name, *args, **kwargs):
        if name == "asv" or name.startswith("asv."):
            raise ImportError("no asv")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_asv)
    out = tmp_path / "hist"
    assert main(["asv-history", str(runs), "--by", "flashinfer-python", "--out", str(out)]) == 2
    assert "asv is not installed (pip install asv==0.6.6)" in capsys.readouterr().err
    assert not out.exists()


def test_points_order_by_version_else_by_first_run():
    """0.10 comes after 0.9 (not as text); names that are no versions keep the order of their first run."""
    from dskbench.frontends.asv.history import Point, by_version

    def pt(name: str, created: str) -> Point:
        class R:
            environment = {"created": created}

        return Point(name, [R()])

    assert [p.name for p in by_version([pt("0.10.0", "1"), pt("0.9.1", "2")])] == ["0.9.1", "0.10.0"]
    assert [p.name for p in by_version([pt("main-b", "1"), pt("main-a", "2")])] == ["main-b", "main-a"]
