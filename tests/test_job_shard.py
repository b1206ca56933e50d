"""`dskbench run --shard K/N`: one host's part of a job array's sweep, and reading the parts' folder."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DSKBENCH_EXTRA_ADAPTERS", "tests.fake_adapters,tests.fake_shard_adapters")

from dskbench.execution.job_shard import ShardSpecError, parse_shard, take_part  # noqa: E402
from dskbench.results.io import read_runs  # noqa: E402
from tests import cli_with_fakes  # noqa: E402
from tests.fake_results import make_run, write_runs  # noqa: E402
from tests.test_shard import _item  # noqa: E402


def _plan():
    items, i = [], 0
    for kernel, n in (("big", 12), ("mid", 5), ("small", 2), ("tiny", 1)):
        for t in range(n):
            for backend in ("a", "b"):
                items.append(_item(i, kernel, 2**t, backend))
                i += 1
    return items


def cost(it):
    return {"big": 9.0, "mid": 3.0, "small": 1.0, "tiny": 0.5}[it.kernel]


def test_k_of_n_accepts_only_parts_that_exist():
    assert parse_shard("2/8") == (2, 8) and parse_shard(" 1 / 1 ") == (1, 1)
    for bad in ("0/4", "5/4", "2", "a/b", "1/0", ""):
        with pytest.raises(ShardSpecError, match=r"--shard .*: "):
            parse_shard(bad)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_the_parts_cover_the_plan_once_and_every_host_cuts_it_alike(n):
    items = _plan()
    skips = [{"kernel": "gone", "reason": "absent"}]
    parts = [take_part(items, skips, k, n, cost) for k in range(1, n + 1)]
    indices = [it.index for got, _ in parts for it in got]
    assert sorted(indices) == [it.index for it in items]  # all of it, nothing twice
    assert [s for _, s in parts] == [skips] + [[]] * (n - 1)  # planning skips recorded once
    again = [take_part(list(reversed(items)), skips, k, n, cost)[0] for k in range(1, n + 1)]
    assert [[it.index for it in g] for g in again] == [[it.index for it in g] for g, _ in parts]
    if n > 1:
        loads = [sum(cost(it) for it in got) for got, _ in parts]
        assert max(loads) - min(loads) <= 9.0 * 2  # a heavy kernel split per case: parts stay even


def test_run_measures_only_its_part(capsys, monkeypatch):
    from dskbench.frontends import cli
    from dskbench.frontends.cli import common
    from dskbench.shapes.cases import default_shapes
    from tests.fake_adapters import registry_entry

    registry = {k: registry_entry(k) for k in cli_with_fakes.FAKES}
    monkeypatch.setattr(common, "registry_and_shapes", lambda: (registry, default_shapes()))
    args = ["run", "--device", "cpu", "--kernel", "fake_ok", "--kernel", "fake_wrong", "--dry-run"]
    assert cli.main(args) == 0
    whole = capsys.readouterr().out
    total = int(whole.strip().splitlines()[-1].split()[0])
    counts = []
    for k in (1, 2):
        assert cli.main([*args, "--shard", f"{k}/2"]) == 0
        counts.append(int(capsys.readouterr().out.strip().splitlines()[-1].split()[0]))
    assert sum(counts) == total and all(counts)
    assert cli.main([*args, "--shard", "3/2"]) == 2
    assert capsys.readouterr().err.strip() == "dskbench: --shard '3/2': K must be between 1 and N (N >= 1)"


def test_a_folder_of_parts_reads_as_its_files(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    write_runs([make_run("r1", "h200", "abc", "2026-11-27T00:00:00+00:00")], parts / "part-1.jsonl")
    write_runs([make_run("r2", "h200", "abc", "2026-11-27T00:01:00+00:00", seed=1)], parts / "part-2.jsonl")
    (parts / "notes.txt").write_text("not results")
    runs = read_runs([parts])
    assert [r.run_id for r in runs] == ["r1", "r2"]
    assert sum(len(r.results) for r in runs) == sum(
        len(r.results) for r in read_runs(sorted(parts.glob("*.jsonl")))
    )
