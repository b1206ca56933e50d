"""scripts/plan_stats.py: a plan's size per profile, after twins, and what a GPU of each architecture runs."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

os.environ.setdefault("DSKBENCH_EXTRA_ADAPTERS", "tests.fake_adapters")

import tests.fake_adapters  # noqa: E402,F401 - registers the fakes here whatever the variable held
from dskbench.shapes.cases import default_shapes  # noqa: E402
from tests.fake_adapters import registry_entry as _entry  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
N = len(default_shapes().values("decode_tokens", "cpu")) + len(
    default_shapes().values("prefill_tokens", "cpu")
)


def _load():
    spec = importlib.util.spec_from_file_location("plan_stats", ROOT / "scripts" / "plan_stats.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rows_count_items_twins_and_what_each_architecture_runs():
    stats = _load()
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
    stats = _load()
    assert stats.main(["--gpu", "hopper"]) == 2
    assert capsys.readouterr().err.strip() == "plan_stats: --gpu 'hopper': expected SM[:GIB], e.g. 90:80"
    assert stats.main(["--tp", "1,x"]) == 2
    assert capsys.readouterr().err.strip() == "plan_stats: --tp '1,x': expected degrees like 1,4,8"
