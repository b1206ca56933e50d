"""What a box remembers of its builds (`run --build-ahead` starts builders only for the others), and
when it forgets: caches empty, a cache folder that lost files, an unreadable file."""

from __future__ import annotations

import os

EXTRA = "tests.fake_adapters,tests.fake_build_adapters"
os.environ.setdefault("DSKBENCH_EXTRA_ADAPTERS", EXTRA)

import tests.fake_adapters  # noqa: E402,F401
from dskbench.execution import build_ahead, build_memory  # noqa: E402
from dskbench.execution.build_memory import BuildMemory  # noqa: E402
from dskbench.execution.runner import SweepOptions  # noqa: E402
from tests.test_shard import _item  # noqa: E402


def _caches(root):
    dirs = {"triton": root / "triton", "flashinfer": root / "flashinfer"}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return dirs


def _put(folder, name):
    (folder / name).write_bytes(b"x")


def test_builds_are_remembered_with_the_caches_they_filled(tmp_path):
    dirs = _caches(tmp_path / "c")
    path = tmp_path / "m" / "sm90-abc.json"
    first = BuildMemory(path, dirs)
    assert first.keys == set() and first.why_forgotten is None  # empty caches: nothing to remember yet
    _put(dirs["triton"], "k1.cubin")
    first.add("k · triton · T=1", "ok")
    first.add("k · fi · -", "ok")
    first.add("k · gone · -", "skipped")  # not installed here: maybe next time
    first.add("k · bad · -", "error")  # tried again next time
    first.save()
    again = BuildMemory(path, dirs)
    assert again.keys == {"k · triton · T=1", "k · fi · -"}
    assert again.known(["k · fi · -", "other"]) == {"k · fi · -"}
    _put(dirs["flashinfer"], "norm.so")  # caches that grew still hold what was remembered
    assert BuildMemory(path, dirs).keys == again.keys


def test_a_cleared_cache_forgets_every_build(tmp_path):
    dirs = _caches(tmp_path / "c")
    path = tmp_path / "m.json"
    _put(dirs["triton"], "a")
    _put(dirs["flashinfer"], "b")
    mem = BuildMemory(path, dirs)
    mem.add("key", "ok")
    mem.save()
    (dirs["triton"] / "a").unlink()  # one cache cleared, the other still there
    gone = BuildMemory(path, dirs)
    assert gone.keys == set() and "triton cache holds fewer files" in gone.why_forgotten
    (dirs["flashinfer"] / "b").unlink()  # every cache empty: a fresh box, nothing known, nothing said
    fresh = BuildMemory(path, dirs)
    assert fresh.keys == set() and fresh.why_forgotten is None
    _put(dirs["triton"], "a")
    path.write_text("{not json")
    assert BuildMemory(path, dirs).keys == set()
    assert "unreadable" in BuildMemory(path, dirs).why_forgotten


def test_one_memory_per_gpu_architecture_and_stack(tmp_path, monkeypatch):
    a = build_memory.memory_path("9.0", {"flashinfer-python": "0.6.14"}, tmp_path)
    b = build_memory.memory_path("9.0", {"flashinfer-python": "0.7.0"}, tmp_path)
    c = build_memory.memory_path("10.0", {"flashinfer-python": "0.6.14"}, tmp_path)
    assert len({a, b, c}) == 3 and a.name.startswith("sm90-") and c.name.startswith("sm100-")
    monkeypatch.setenv("DSKBENCH_BUILD_MEMORY", str(tmp_path / "x"))
    assert build_memory.memory_dir() == tmp_path / "x"
    assert build_memory.memory_dir({"XDG_CACHE_HOME": "/c"}) == build_memory.Path("/c/dskbench/builds")


def test_a_builder_starts_only_the_builds_this_box_has_not_done(tmp_path):
    dirs = _caches(tmp_path / "c")
    _put(dirs["triton"], "a")
    mem = BuildMemory(tmp_path / "m.json", dirs)
    items = [_item(0, "k", 1, "a"), _item(1, "k", 8, "a"), _item(2, "k", 1, "b")]
    opts = SweepOptions(device="cpu")
    first = build_ahead.Builder(items, opts, None, jobs=2, build_s={}, memory=mem)
    try:
        assert [it.index for it in first.picked] == [0, 2]
        for it in first.picked:
            mem.add(it.build or "", "ok")  # as the builders' results would
    finally:
        first.stop()  # saves what was built
    known = BuildMemory(tmp_path / "m.json", dirs)
    second = build_ahead.Builder(items, opts, None, jobs=2, build_s={}, memory=known)
    try:
        assert second.picked == [] and second.already == 2
        ready = build_ahead.ReadyFile(second.ready_path)
        ready.refresh()
        assert all(ready.ready(it.build) for it in second.items)  # every case may go at once
        second.start()  # nothing to build: no pool, every build marked done
        ready.refresh()
        assert ready.ready("a build nobody named")
        assert second.summary() == "built ahead: nothing to build; 2 built before on this box"
    finally:
        second.stop()
