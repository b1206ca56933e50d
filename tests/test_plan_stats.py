"""`dskbench plan-stats`: a plan's size per profile, after twins, and what a GPU of each architecture runs."""

from __future__ import annotations

import json
import os

os.environ.setdefault("DSKBENCH_EXTRA_ADAPTERS", "tests.fake_adapters")

import tests.fake_adapters  # noqa: E402,F401 - registers the fakes here whatever the variable held
from dskbench.execution import plan_stats as stats  # noqa: E402
from dskbench.frontends.cli import EXIT_USAGE, main  # noqa: E402
from dskbench.shapes.cases import default_shapes  # noqa: E402
from tests.fake_adapters import registry_entry as _entry  # noqa: E402

N = len(default_shapes().values("decode_tokens", "cpu")) + len(
    default_shapes().values("prefill_tokens", "cpu")
)


def test_rows_count_items_twins_and_what_each_architecture_runs():
    registry = {k: _entry(k) for k in ("fake_ok", "fake_twin_a", "fake_twin_b")}
    gpus = dict(stats.parse_gpu(s) for s in ("90", "100:180"))
    assert gpus["sm100"].memory_bytes == 180 * 2**30 and gpus["sm90"].memory_bytes is None
    (row,) = stats.plan_rows(registry, default_shapes(), ["cpu"], (1,), gpus)
    # fake_ok: a CPU backend and an sm100 one; the twins: one CPU backend each, measured once
    assert row["items"] == 4 * N and row["measured"] == 3 * N
    assert row["runs_on"] == {"sm90": 2 * N, "sm100": 3 * N}
    assert stats.line(row).startswith(
        f"cpu tp 1: {4 * N} items, {3 * N} measured ({N} copy a twin); sm90 runs"
    )


def test_bad_options_are_one_line_errors(capsys):
    assert main(["plan-stats", "--gpu", "hopper"]) == EXIT_USAGE
    assert capsys.readouterr().err.strip() == (
        "dskbench: argument --gpu: expected SM[:GIB], e.g. 90:80, got 'hopper' (see `dskbench plan-stats --help`)"
    )
    assert main(["plan-stats", "--tp", "1,x"]) == EXIT_USAGE
    assert capsys.readouterr().err.strip() == (
        "dskbench: argument --tp: expected comma-separated positive integers, got '1,x' "
        "(see `dskbench plan-stats --help`)"
    )


def test_the_command_prints_a_line_per_profile_and_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan-stats", "--profile", "cpu", "--tp", "1", "--gpu", "90:80", "--json", str(out)]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("cpu tp 1: ") and "; sm90 runs " in line
    (row,) = json.loads(out.read_text())
    assert row["profile"] == "cpu" and row["tp"] == [1] and list(row["runs_on"]) == ["sm90"]
    assert line == stats.line(row) and 0 < row["runs_on"]["sm90"] <= row["measured"] <= row["items"]
